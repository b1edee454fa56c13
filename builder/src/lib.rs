//! Builds a `#![no_std]` kernel crate to PTX without nvcc, C or C++.
//!
//! Pipeline: a nested `cargo rustc` on the pinned nightly emits the kernel crate's LLVM bitcode
//! (`-Zbuild-std=core`, one `-C target-cpu` for every crate); [`link`] merges it with the bitcode
//! members of `core` and `compiler_builtins`, internalizes everything but the kernel entry points,
//! optimizes, and lowers to PTX with `llc`. All tools come from the toolchain's `llvm-tools`.

mod link;
mod toolchain;

use std::path::{Path, PathBuf};

pub use toolchain::Toolchain;

/// Builder errors carry the exact command or file that failed.
#[derive(Debug)]
pub struct BuildError(pub String);

impl std::fmt::Display for BuildError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for BuildError {}

pub type Result<T> = std::result::Result<T, BuildError>;

/// LLVM's full-unroll budget, raised so the kernels' fixed-trip loops over register arrays
/// unroll completely (a loop left rolled puts its array in local memory).
pub const UNROLL_THRESHOLD: u32 = 4000;

/// What to build and where.
#[derive(Debug, Clone)]
pub struct PtxBuild {
    /// Directory holding the kernel crate's `Cargo.toml`.
    pub crate_dir: PathBuf,
    /// Target directory of the nested build (kept apart from the outer build's lock).
    pub target_dir: PathBuf,
    /// Virtual architecture, e.g. `sm_80`.
    pub arch: String,
    /// PTX ISA feature passed to `llc`, e.g. `ptx78`.
    pub ptx_isa: String,
    /// Register limits: entries whose name starts with the prefix get `.maxnreg N` (what
    /// `__launch_bounds__` or `__maxnreg__` give a CUDA C kernel).
    pub max_registers: Vec<(String, u32)>,
}

impl PtxBuild {
    /// Compiles the kernel crate and returns the PTX text.
    pub fn build(&self, toolchain: &Toolchain) -> Result<String> {
        let bitcode = self.compile_bitcode(toolchain)?;
        let ptx = link::link_to_ptx(toolchain, &bitcode, &self.target_dir, &self.arch, &self.ptx_isa)?;
        Ok(link::limit_registers(&ptx, &self.max_registers))
    }

    fn compile_bitcode(&self, toolchain: &Toolchain) -> Result<link::KernelBitcode> {
        let rustflags = [
            format!("-Ctarget-cpu={}", self.arch),
            "-Cpanic=abort".into(),
            "-Copt-level=3".into(),
            // Register arrays must be indexed by constants: unroll fixed-trip loops fully.
            format!("-Cllvm-args=-unroll-threshold={UNROLL_THRESHOLD}"),
        ];
        let mut cmd = toolchain.cargo();
        cmd.current_dir(&self.crate_dir)
            .args(["rustc", "--release", "--target", link::TARGET, "-Zbuild-std=core"])
            .arg("--target-dir")
            .arg(&self.target_dir)
            .env("CARGO_ENCODED_RUSTFLAGS", rustflags.join("\x1f"))
            .args(["--", "--emit=llvm-bc"]);
        toolchain::run(&mut cmd)?;
        link::KernelBitcode::find(&self.target_dir, &crate_name(&self.crate_dir)?)
    }
}

/// The library name of the crate at `dir` (package name with `-` replaced by `_`).
fn crate_name(dir: &Path) -> Result<String> {
    let manifest = dir.join("Cargo.toml");
    let text = std::fs::read_to_string(&manifest)
        .map_err(|e| BuildError(format!("reading {}: {e}", manifest.display())))?;
    text.lines()
        .map(str::trim)
        .find_map(|l| l.strip_prefix("name"))
        .and_then(|rest| rest.split('"').nth(1))
        .map(|name| name.replace('-', "_"))
        .ok_or_else(|| BuildError(format!("no package name in {}", manifest.display())))
}
