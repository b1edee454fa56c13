//! The kernels' PTX (shipped in `ptx/`, or built from `kernels-gpu/` when that is stale; see
//! `build.rs`), and its entry points.

use std::sync::LazyLock;

use crate::types::ArchSku;

pub mod entry;

/// PTX text of every kernel for any GPU from sm_80 on (target `PAGED_DECODE_PTX_ARCH`, default
/// sm_80).
pub const PTX: &str = include_str!(concat!(env!("OUT_DIR"), "/kernels.ptx"));

/// The same kernels built for sm_90: the decode kernels also take part in programmatic dependent
/// launch (`griddepcontrol`).
pub const PTX_SM90: &str = include_str!(concat!(env!("OUT_DIR"), "/kernels_sm90.ptx"));

/// The build a device of compute capability `(major, minor)` loads: the sm_90 one from 9.0 on.
pub fn build_for(cc: (u32, u32)) -> ArchSku {
    if cc.0 >= 9 { ArchSku::Sm90 } else { ArchSku::Sm80 }
}

/// The build a plan loads on a device of compute capability `cc`: [`build_for`]`(cc)`, or the
/// portable one where the caller turns the Hopper build off
/// ([`PlanPreference::allow_sm90a`](crate::PlanPreference::allow_sm90a)).
pub fn build_for_preference(cc: (u32, u32), allow_sm90a: bool) -> ArchSku {
    if allow_sm90a { build_for(cc) } else { ArchSku::Sm80 }
}

/// The PTX text of build `arch`.
pub fn of_build(arch: ArchSku) -> &'static str {
    match arch {
        ArchSku::Sm90 => PTX_SM90,
        ArchSku::Sm80 => PTX,
    }
}

/// The PTX text of [`build_for`]`(cc)`.
pub fn for_compute_capability(cc: (u32, u32)) -> &'static str {
    of_build(build_for(cc))
}

/// Whether kernels loaded from [`for_compute_capability`] support programmatic dependent launch
/// (only the sm_90 build has `griddepcontrol`).
pub fn supports_programmatic_launch(cc: (u32, u32)) -> bool {
    build_for(cc) == ArchSku::Sm90
}

/// Names of the `.entry` functions declared in `ptx`, in order of appearance.
pub fn entries(ptx: &str) -> Vec<&str> {
    ptx.lines()
        .filter_map(|l| l.trim_start().strip_prefix(".visible .entry "))
        .map(|rest| rest.split(['(', ' ']).next().unwrap_or(rest).trim())
        .collect()
}

/// Entry points the host launches from the portable build ([`entry::all`]); it must provide all
/// of them, and the sm_90 build these and [`entry::sm90_only`] ([`expected_entries`]).
pub static EXPECTED_ENTRIES: LazyLock<Vec<String>> = LazyLock::new(entry::all);

/// The entry points the build of a device of compute capability `cc` must provide.
pub fn expected_entries(cc: (u32, u32)) -> Vec<String> {
    entry::of_build(cc)
}
