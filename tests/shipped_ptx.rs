//! The PTX shipped in `ptx/` matches the kernel sources, and the library embeds it; the
//! builder's own unit tests (hashing, the record, the link step's output) run here too.

#[path = "../builder/src/lib.rs"]
#[allow(dead_code)]
mod ptx_builder;

use std::path::Path;

use paged_decode::ptx;
use ptx_builder::manifest::{self, Manifest};

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

fn current_sources() -> Manifest {
    Manifest {
        toolchain: ptx_builder::TOOLCHAIN.into(),
        ptx_isa: ptx_builder::PTX_ISA.into(),
        ptx: Vec::new(),
        sources: manifest::source_digests(root()).unwrap(),
    }
}

#[test]
fn shipped_ptx_matches_the_kernel_sources() {
    let shipped = manifest::load_shipped(root(), &current_sources()).unwrap_or_else(|why| {
        panic!("the shipped PTX is stale ({why}): run scripts/ship-ptx and commit ptx/")
    });
    let files: Vec<(&str, &str)> = shipped.iter().map(|(p, _)| (p.file.as_str(), p.arch.as_str())).collect();
    assert_eq!(files, [("kernels.ptx", "sm_80"), ("kernels_sm90.ptx", "sm_90")]);
}

#[test]
fn the_library_embeds_the_shipped_ptx() {
    let knobs = [
        option_env!("PAGED_DECODE_PTX"),
        option_env!("PAGED_DECODE_BUILD_PTX"),
        option_env!("PAGED_DECODE_PTX_ARCH").filter(|arch| *arch != "sm_80"),
    ];
    if knobs.iter().any(Option::is_some) || manifest::load_shipped(root(), &current_sources()).is_err() {
        eprintln!(
            "SKIPPED the_library_embeds_the_shipped_ptx: built from source (a build knob or stale ptx/)"
        );
        return;
    }
    let shipped = |file: &str| std::fs::read_to_string(root().join("ptx").join(file)).unwrap();
    assert!(ptx::PTX == shipped("kernels.ptx"), "the portable PTX is not ptx/kernels.ptx");
    assert!(ptx::PTX_SM90 == shipped("kernels_sm90.ptx"), "the sm_90 PTX is not ptx/kernels_sm90.ptx");
}
