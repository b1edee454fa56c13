//! Batched paged-KV decode attention for CUDA GPUs, in pure Rust.
//!
//! - [`BatchPagedDecodePlan`]: one query row per request against its paged K/V history.
//! - [`PagedKvAppendPlan`]: writes one new K/V token per request into the paged store.
//! - [`reference`](mod@reference): float64 CPU implementations of both, with the same layouts and semantics.
//! - [`page_table`]: host-side validation of `indptr` / `indices` / `last_page_len`.
//!
//! Kernels are Rust (`kernels-gpu/`), compiled to PTX by rustc's NVPTX backend at build time and
//! JIT-compiled by the CUDA driver at load time. See the README for the architecture.

#![warn(missing_docs)]

pub mod bench;
pub mod device;
mod driver_library;
pub mod error;
pub mod page_table;
pub mod plan;
pub mod problem;
pub mod ptx;
pub mod ptxas;
pub mod reference;
pub mod tensor;
pub mod types;

#[path = "../kernels-gpu/src/params.rs"]
#[allow(dead_code)]
pub(crate) mod params;

#[path = "../kernels-gpu/src/chunking.rs"]
#[allow(dead_code)]
pub(crate) mod chunking;
#[cfg(test)]
mod chunking_tests;

pub use cudarc;
pub use device::Device;
pub use error::{Error, Result};
pub use half;
pub use plan::{
    BatchPagedDecodeArgs, BatchPagedDecodeArgsLayout, BatchPagedDecodePlan, PagedKvAppendArgs,
    PagedKvAppendArgsLayout, PagedKvAppendPlan,
};
pub use tensor::{TensorLayout, TensorMut, TensorRef, Workspace};
pub use types::*;
