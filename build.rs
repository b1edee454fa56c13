//! Builds `kernels-gpu` to PTX (see `builder/`) and hands it to the host code as `$OUT_DIR/kernels.ptx`.
//!
//! - `PAGED_DECODE_PTX_ARCH`: target architecture of the PTX (default `sm_80`, runs on sm_80+ through
//!   the driver's JIT; `sm_90` for Hopper-only builds).
//! - `PAGED_DECODE_PTX`: path of a prebuilt PTX file to embed instead of building one.

use std::path::PathBuf;

use ptx_builder::{PtxBuild, Toolchain};

const TOOLCHAIN: &str = "nightly-2026-05-20";

fn main() {
    println!("cargo::rerun-if-changed=kernels-gpu");
    println!("cargo::rerun-if-changed=builder");
    println!("cargo::rerun-if-env-changed=PAGED_DECODE_PTX_ARCH");
    println!("cargo::rerun-if-env-changed=PAGED_DECODE_PTX");

    let out = PathBuf::from(std::env::var("OUT_DIR").unwrap()).join("kernels.ptx");
    let ptx = match std::env::var("PAGED_DECODE_PTX") {
        Ok(prebuilt) => {
            println!("cargo::rerun-if-changed={prebuilt}");
            std::fs::read_to_string(&prebuilt)
                .unwrap_or_else(|e| fail(&format!("PAGED_DECODE_PTX={prebuilt}: {e}")))
        }
        Err(_) => build_kernels(),
    };
    std::fs::write(&out, ptx).unwrap_or_else(|e| fail(&format!("writing {}: {e}", out.display())));
}

fn build_kernels() -> String {
    let root = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").unwrap());
    let arch = std::env::var("PAGED_DECODE_PTX_ARCH").unwrap_or_else(|_| "sm_80".into());
    if !matches!(arch.as_str(), "sm_80" | "sm_86" | "sm_89" | "sm_90") {
        fail(&format!("PAGED_DECODE_PTX_ARCH={arch}: expected one of sm_80, sm_86, sm_89, sm_90"));
    }
    // `<target>/<profile>/build/<pkg>/out` → `<target>/ptx-build`, shared by all profiles.
    let out_dir = PathBuf::from(std::env::var("OUT_DIR").unwrap());
    let target_dir =
        out_dir.ancestors().nth(4).map(|t| t.join("ptx-build")).unwrap_or_else(|| out_dir.join("ptx-build"));
    let toolchain = Toolchain::ensure(TOOLCHAIN, |msg| println!("cargo::warning={msg}"))
        .unwrap_or_else(|e| fail(&e.to_string()));
    let build = PtxBuild { crate_dir: root.join("kernels-gpu"), target_dir, arch, ptx_isa: "ptx78".into() };
    build.build(&toolchain).unwrap_or_else(|e| fail(&e.to_string()))
}

fn fail(msg: &str) -> ! {
    eprintln!("error: building the PTX kernels: {msg}");
    std::process::exit(1);
}
