//! The pinned nightly: presence check (never an installation) and clean child processes.

use std::path::PathBuf;
use std::process::Command;

use super::{BuildError, Result};

/// Components the NVPTX pipeline needs.
const COMPONENTS: &str = "rust-src,llvm-tools";

/// The command that installs toolchain `name` with the components the pipeline needs.
pub fn install_command(name: &str) -> String {
    format!("rustup toolchain install {name} --profile minimal --component {COMPONENTS}")
}

/// A rustup toolchain with `rust-src` and `llvm-tools`.
#[derive(Debug, Clone)]
pub struct Toolchain {
    pub name: String,
    sysroot: PathBuf,
    host: String,
}

impl Toolchain {
    /// Finds the installed toolchain `name` with its components. It never installs anything: a
    /// missing toolchain or component is an error that names the `rustup` command to run.
    pub fn find(name: &str) -> Result<Self> {
        Self::probe(name).map_err(|e| {
            BuildError(format!(
                "the toolchain {name} with {COMPONENTS} is needed and not installed ({e}); install it with\n    {}",
                install_command(name)
            ))
        })
    }

    fn probe(name: &str) -> Result<Self> {
        let out = clean_command("rustc")
            .arg(format!("+{name}"))
            .args(["--print", "sysroot"])
            .output()
            .map_err(|e| BuildError(format!("running rustc +{name}: {e}")))?;
        if !out.status.success() {
            return Err(BuildError(format!("toolchain {name} is not installed")));
        }
        let sysroot = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
        let version = run(clean_command("rustc").arg(format!("+{name}")).arg("-vV"))?;
        let host = String::from_utf8_lossy(&version)
            .lines()
            .find_map(|l| l.strip_prefix("host: "))
            .map(|h| h.trim().to_string())
            .ok_or_else(|| BuildError(format!("rustc +{name} -vV printed no host triple")))?;
        let tc = Self { name: name.to_string(), sysroot, host };
        for needed in [tc.llvm_tool("llc"), tc.rust_src()] {
            if !needed.exists() {
                return Err(BuildError(format!("{} is missing", needed.display())));
            }
        }
        Ok(tc)
    }

    /// `cargo +<toolchain>` with the outer build's environment removed.
    pub fn cargo(&self) -> Command {
        let mut cmd = clean_command("cargo");
        cmd.arg(format!("+{}", self.name));
        cmd
    }

    /// Path of an `llvm-tools` binary (`llvm-link`, `opt`, `llc`, `llvm-ar`, `llvm-nm`).
    pub fn llvm_tool(&self, tool: &str) -> PathBuf {
        self.sysroot.join("lib/rustlib").join(&self.host).join("bin").join(tool)
    }

    fn rust_src(&self) -> PathBuf {
        self.sysroot.join("lib/rustlib/src/rust/library/core")
    }
}

/// A command that does not inherit the outer cargo's toolchain selection or flags, and that
/// rustup's proxies may not answer by installing a toolchain.
pub fn clean_command(program: &str) -> Command {
    let mut cmd = Command::new(program);
    cmd.env("RUSTUP_AUTO_INSTALL", "0");
    for (key, _) in std::env::vars_os() {
        let key = key.to_string_lossy();
        let inherited = key.starts_with("CARGO")
            || key.starts_with("RUSTC")
            || key.starts_with("RUSTDOC")
            || matches!(
                key.as_ref(),
                "RUSTUP_TOOLCHAIN"
                    | "RUSTFLAGS"
                    | "DEBUG"
                    | "OPT_LEVEL"
                    | "PROFILE"
                    | "TARGET"
                    | "HOST"
                    | "OUT_DIR"
                    | "NUM_JOBS"
            );
        if inherited && key != "CARGO_HOME" {
            cmd.env_remove(key.as_ref());
        }
    }
    cmd
}

/// Runs `cmd`, turning a failure into an error that names the command and shows its stderr.
pub fn run(cmd: &mut Command) -> Result<Vec<u8>> {
    let shown = std::iter::once(cmd.get_program())
        .chain(cmd.get_args())
        .map(|a| a.to_string_lossy())
        .collect::<Vec<_>>()
        .join(" ");
    let out = cmd.output().map_err(|e| BuildError(format!("could not start `{shown}`: {e}")))?;
    if !out.status.success() {
        return Err(BuildError(format!(
            "`{shown}` failed ({}):\n{}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        )));
    }
    Ok(out.stdout)
}
