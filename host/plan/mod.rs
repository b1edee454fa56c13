//! Plans: validate once on the host (`select`), then launch without allocating or synchronizing
//! (`run`), so `run` can be captured into a CUDA graph.
//!
//! - `config`: the launch-configuration rules ([`DecodeConfig`], [`LeanLaunch`], [`DecodePath`])
//!   and the workspace layout, pure functions of the descriptor and the device.
//! - `decode`: [`BatchPagedDecodePlan`] and its arguments.
//! - `append`: [`PagedKvAppendPlan`] and its arguments.
//! - `checks` and `table_check`: descriptor and layout validation on the host, and the page-table
//!   check on the device that [`PlanPreference::checked`](crate::PlanPreference::checked) runs.

mod append;
pub(crate) mod checks;
mod config;
mod decode;
mod table_check;

pub use append::{PagedKvAppendArgs, PagedKvAppendArgsLayout, PagedKvAppendPairedArgs, PagedKvAppendPlan};
pub use config::{
    ChunkPartition, DecodeConfig, DecodeKernel, DecodePath, LEAN_CTA_FIXED_TILES, LEAN_MAX_AVG_TOKENS,
    LEAN_SPLIT_WAVES, LeanLaunch, MAX_SPLITS, MAX_TABLE_TOKENS, Residency, STACK_MAX_TOKENS,
    SUPPORTED_HEAD_DIMS, UNSPLIT_MAX_TILES,
};
pub use decode::{BatchPagedDecodeArgs, BatchPagedDecodeArgsLayout, BatchPagedDecodePlan};

use crate::params::{AppendParams, DecodeParams, PageTableCheckParams};

// SAFETY: the parameter blocks are `#[repr(C)]` plain data (u64 device addresses, u32 and f32),
// passed to the kernels by value with the layout both sides compile from `params.rs`.
unsafe impl cudarc::driver::DeviceRepr for DecodeParams {}
unsafe impl cudarc::driver::DeviceRepr for AppendParams {}
unsafe impl cudarc::driver::DeviceRepr for PageTableCheckParams {}

// Plans hold no device state and may be shared between threads (the crate's safety model): a
// field that is not `Send + Sync` stops the build here.
const _: () = {
    const fn shareable<P: Send + Sync>() {}
    shareable::<BatchPagedDecodePlan<half::f16>>();
    shareable::<BatchPagedDecodePlan<half::bf16, float8::F8E4M3>>();
    shareable::<BatchPagedDecodePlan<f32>>();
    shareable::<PagedKvAppendPlan<half::f16>>();
    shareable::<PagedKvAppendPlan<half::f16, float8::F8E5M2>>();
};
