//! Builds `kernels-gpu` to PTX (see `builder/`) twice and hands both to the host code:
//! `$OUT_DIR/kernels.ptx` (portable, runs on sm_80+ through the driver's JIT) and
//! `$OUT_DIR/kernels_sm90.ptx` (Hopper: adds programmatic dependent launch).
//!
//! - `PAGED_DECODE_PTX_ARCH`: target architecture of the portable PTX (default `sm_80`).
//! - `PAGED_DECODE_PTX`: path of a prebuilt portable PTX file to embed instead of building one.

use std::path::PathBuf;

use ptx_builder::{PtxBuild, Toolchain};

#[path = "kernels-gpu/src/params.rs"]
#[allow(dead_code)]
mod params;

const TOOLCHAIN: &str = "nightly-2026-05-20";

fn main() {
    println!("cargo::rerun-if-changed=kernels-gpu");
    println!("cargo::rerun-if-changed=builder");
    println!("cargo::rerun-if-env-changed=PAGED_DECODE_PTX_ARCH");
    println!("cargo::rerun-if-env-changed=PAGED_DECODE_PTX");

    let out_dir = PathBuf::from(std::env::var("OUT_DIR").unwrap());
    let write = |name: &str, ptx: String| {
        let path = out_dir.join(name);
        std::fs::write(&path, ptx).unwrap_or_else(|e| fail(&format!("writing {}: {e}", path.display())));
    };
    let portable = match std::env::var("PAGED_DECODE_PTX") {
        Ok(prebuilt) => {
            println!("cargo::rerun-if-changed={prebuilt}");
            std::fs::read_to_string(&prebuilt)
                .unwrap_or_else(|e| fail(&format!("PAGED_DECODE_PTX={prebuilt}: {e}")))
        }
        Err(_) => {
            let arch = std::env::var("PAGED_DECODE_PTX_ARCH").unwrap_or_else(|_| "sm_80".into());
            if !matches!(arch.as_str(), "sm_80" | "sm_86" | "sm_89" | "sm_90") {
                fail(&format!("PAGED_DECODE_PTX_ARCH={arch}: expected one of sm_80, sm_86, sm_89, sm_90"));
            }
            build_kernels(&out_dir, &arch)
        }
    };
    write("kernels.ptx", portable);
    write("kernels_sm90.ptx", build_kernels(&out_dir, "sm_90"));
}

fn build_kernels(out_dir: &std::path::Path, arch: &str) -> String {
    let root = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").unwrap());
    // `<target>/<profile>/build/<pkg>/out` → `<target>/ptx-build/<arch>`, shared by all profiles.
    let target_dir = out_dir
        .ancestors()
        .nth(4)
        .map(|t| t.join("ptx-build"))
        .unwrap_or_else(|| out_dir.join("ptx-build"))
        .join(arch);
    let toolchain = Toolchain::ensure(TOOLCHAIN, |msg| println!("cargo::warning={msg}"))
        .unwrap_or_else(|e| fail(&e.to_string()));
    let build = PtxBuild {
        crate_dir: root.join("kernels-gpu"),
        target_dir,
        arch: arch.into(),
        ptx_isa: "ptx78".into(),
        max_registers: vec![("decode_mma_lean_".into(), params::LEAN_MAX_REGISTERS)],
    };
    build.build(&toolchain).unwrap_or_else(|e| fail(&e.to_string()))
}

fn fail(msg: &str) -> ! {
    eprintln!("error: building the PTX kernels: {msg}");
    std::process::exit(1);
}
