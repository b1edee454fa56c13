//! Builds the `#![no_std]` kernel sources to PTX without nvcc, C or C++, and keeps the record of
//! which sources a shipped PTX file was built from.
//!
//! Pipeline: a nested `cargo rustc` on the pinned nightly emits the kernel crate's LLVM bitcode
//! (`-Zbuild-std=core`, one `-C target-cpu` for every crate); [`link`] merges it with the bitcode
//! members of `core` and `compiler_builtins`, internalizes everything but the kernel entry points,
//! optimizes, and lowers to PTX with `llc`. All tools come from the toolchain's `llvm-tools`.
//!
//! These files are not a crate of their own: the root package's `build.rs` and its tests include
//! them as a module (`#[path]`), so the published package carries them and needs no extra
//! dependency.

mod link;
pub mod manifest;
pub mod sha256;
mod toolchain;

use std::path::{Path, PathBuf};

pub use toolchain::Toolchain;

/// The nightly that compiles the kernels.
pub const TOOLCHAIN: &str = "nightly-2026-05-20";

/// PTX ISA feature passed to `llc`.
pub const PTX_ISA: &str = "ptx78";

/// Library name of the kernel crate (its bitcode is `<name>-<hash>.bc`).
const KERNEL_CRATE: &str = "kernels_gpu";

/// Builder errors carry the exact command or file that failed.
#[derive(Debug)]
pub struct BuildError(pub String);

impl std::fmt::Display for BuildError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for BuildError {}

/// Result of the builder's steps.
pub type Result<T> = std::result::Result<T, BuildError>;

/// LLVM's full-unroll budget, raised so the kernels' fixed-trip loops over register arrays
/// unroll completely (a loop left rolled puts its array in local memory).
pub const UNROLL_THRESHOLD: u32 = 4000;

/// Set to `1` for line info (`.loc` / `.file`) in the PTX built from source, which
/// `inspect --source` maps back to the Rust source; off by default (the shipped PTX has none).
/// A build script that builds rerun when it changes.
pub const LINE_INFO_ENV: &str = "PAGED_DECODE_PTX_LINEINFO";

fn line_info_requested() -> bool {
    println!("cargo::rerun-if-env-changed={LINE_INFO_ENV}");
    std::env::var(LINE_INFO_ENV).is_ok_and(|v| v == "1")
}

/// What to build and where.
#[derive(Debug, Clone)]
pub struct PtxBuild {
    /// The kernel crate's root module (`kernels-gpu/src/lib.rs`).
    pub crate_root: PathBuf,
    /// Target directory of the nested build (kept apart from the outer build's lock).
    pub target_dir: PathBuf,
    /// Virtual architecture, e.g. `sm_80`.
    pub arch: String,
    /// PTX ISA feature passed to `llc`, e.g. `ptx78`.
    pub ptx_isa: String,
    /// Register limits: entries whose name starts with the prefix get `.maxnreg N` (what
    /// `__launch_bounds__` or `__maxnreg__` give a CUDA C kernel).
    pub max_registers: Vec<(String, u32)>,
    /// Block-size bounds: entries whose name starts with the prefix get `.maxntid N, 1, 1` (what
    /// `__launch_bounds__(N)` gives a CUDA C kernel).
    pub max_threads: Vec<(String, u32)>,
}

impl PtxBuild {
    /// Compiles the kernel crate and returns the PTX text.
    pub fn build(&self, toolchain: &Toolchain) -> Result<String> {
        let bitcode = self.compile_bitcode(toolchain)?;
        let ptx = link::link_to_ptx(toolchain, &bitcode, &self.target_dir, &self.arch, &self.ptx_isa)?;
        let directives =
            self.max_registers.iter().map(|(prefix, n)| (prefix.clone(), format!(".maxnreg {n}")));
        let bounds =
            self.max_threads.iter().map(|(prefix, n)| (prefix.clone(), format!(".maxntid {n}, 1, 1")));
        Ok(link::entry_directives(&ptx, &directives.chain(bounds).collect::<Vec<_>>()))
    }

    fn compile_bitcode(&self, toolchain: &Toolchain) -> Result<link::KernelBitcode> {
        let crate_dir = self.write_kernel_manifest()?;
        let line_info = line_info_requested();
        // Each flavour in a target directory of its own: the bitcode file names of the two
        // differ, and the link takes the newest one it finds.
        let target_dir = if line_info { self.target_dir.join("line-info") } else { self.target_dir.clone() };
        let mut rustflags = vec![
            format!("-Ctarget-cpu={}", self.arch),
            "-Cpanic=abort".into(),
            "-Copt-level=3".into(),
            // Register arrays must be indexed by constants: unroll fixed-trip loops fully.
            format!("-Cllvm-args=-unroll-threshold={UNROLL_THRESHOLD}"),
        ];
        if line_info {
            rustflags.push("-Cdebuginfo=line-directives-only".into());
        }
        let mut cmd = toolchain.cargo();
        cmd.current_dir(&crate_dir)
            .args(["rustc", "--release", "--target", link::TARGET, "-Zbuild-std=core"])
            .arg("--target-dir")
            .arg(&target_dir)
            .env("CARGO_ENCODED_RUSTFLAGS", rustflags.join("\x1f"))
            .args(["--", "--emit=llvm-bc"]);
        toolchain::run(&mut cmd)?;
        link::KernelBitcode::find(&target_dir, KERNEL_CRATE)
    }

    /// Writes the kernel crate's manifest into the nested target directory and returns the
    /// directory. The kernel sources carry no `Cargo.toml` of their own: a directory with one is
    /// a separate package to `cargo package`, which would leave the sources out of this one.
    fn write_kernel_manifest(&self) -> Result<PathBuf> {
        let dir = self.target_dir.join("kernel-crate");
        std::fs::create_dir_all(&dir).map_err(|e| BuildError(format!("creating {}: {e}", dir.display())))?;
        let manifest = dir.join("Cargo.toml");
        std::fs::write(&manifest, kernel_manifest(&self.crate_root))
            .map_err(|e| BuildError(format!("writing {}: {e}", manifest.display())))?;
        Ok(dir)
    }
}

/// The kernel crate's `Cargo.toml`: a standalone workspace whose library is `crate_root`.
fn kernel_manifest(crate_root: &Path) -> String {
    let root = crate_root.display().to_string().replace('\\', "\\\\").replace('"', "\\\"");
    format!(
        r#"[package]
name = "{name}"
version = "0.0.0"
edition = "2024"
publish = false

[lib]
path = "{root}"
crate-type = ["rlib"]

[profile.release]
opt-level = 3
panic = "abort"
codegen-units = 1
debug = false

[workspace]
"#,
        name = KERNEL_CRATE.replace('_', "-"),
    )
}
