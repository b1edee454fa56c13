//! Batched paged-KV decode attention for CUDA GPUs, in pure Rust.
//!
//! - [`BatchPagedDecodePlan`]: one query row per request against its paged K/V history.
//! - [`PagedKvAppendPlan`]: writes one new K/V token per request into the paged store.
//! - [`reference`](mod@reference): float64 CPU implementations of both, with the same layouts and semantics.
//! - [`page_table`]: host-side validation of `indptr` / `indices` / `last_page_len`.
//!
//! Kernels are Rust (`kernels-gpu/`), compiled to PTX by rustc's NVPTX backend at build time and
//! JIT-compiled by the CUDA driver at load time. See the README for the architecture.
//!
//! # Safety model
//!
//! Nothing reachable from safe code reads or writes freed memory, memory of another device, or
//! memory another launch is using, provided the device's slices are ordered as below.
//!
//! **Who owns what.** A plan owns only plain configuration and its kernels (a module of the
//! context it was selected on, kept alive by an `Arc`). Every byte a launch touches is borrowed
//! from the caller for the duration of the call: the tensors of the arguments (`CudaView` /
//! `CudaViewMut`, so a tensor cannot be written by two calls at once or freed during one) and
//! the workspace (`&mut`, one call at a time). Split-KV state lives in the caller's workspace:
//! zero it once before its first use; every launch leaves it zero again. A plan therefore holds
//! no device state and may be shared between threads (`Send + Sync`); concurrent runs each need
//! their own workspace, which the `&mut` borrow enforces.
//!
//! **What is stream-ordered.** `run` only enqueues work: the kernel reads and writes after `run`
//! returns, in the order of the stream it was given. A buffer stays valid for work already
//! enqueued because cudarc frees a `CudaSlice` on its own stream (stream-ordered), after
//! everything enqueued there before the drop. Work on *other* streams is ordered by cudarc's
//! event tracking, which [`Device::open`] keeps on: each use of a slice waits for the last
//! conflicting use on another stream, and its drop waits for its last reads and writes. With
//! [`Device::open_untracked`] (an `unsafe fn`) the caller takes over that ordering, as its
//! `# Safety` section lists.
//!
//! **Same device.** `run` and `check_page_table` refuse, with [`Error::WrongDevice`], a stream of
//! another context than the plan's and any tensor or workspace of another context than the
//! stream's, before touching the stream: a kernel never dereferences another device's address.
//! The check compares context handles, a few pointer comparisons per call.
//!
//! **Page tables.** The fast path trusts the values of `indptr` / `indices` / `last_page_len`
//! but every access stays inside the given tensors (see `kernels-gpu/src/lib.rs`); a corrupt
//! table gives unspecified output, and for the append a dropped or raced token
//! ([`PagedKvAppendPlan::run`]). [`PlanPreference::checked`] validates the table on the GPU
//! first and returns [`Error::InvalidPageTable`], writing nothing; it synchronizes, so under
//! stream capture it returns [`Error::CheckedUnderCapture`] instead.
//!
//! **Graph capture.** A captured graph holds raw device pointers: replaying it reads and writes
//! the buffers of the captured calls with no borrow tying them to the graph. cudarc's
//! `begin_capture`, `end_capture` and `CudaGraph::launch` are safe functions, so this holds for
//! every buffer any captured work uses, ours included: keep the tensors and the workspace of
//! captured runs alive (and do not give their memory to anything else) until the graph is
//! dropped. Capture needs a device without event tracking ([`Device::open_untracked`]): with
//! tracking, the capturing stream would wait on events recorded before the capture, which
//! invalidates it (`end_capture` returns the driver's error; nothing unsound happens).

#![warn(missing_docs)]

pub mod bench;
pub mod device;
pub mod error;
mod guard;
pub mod page_table;
pub mod plan;
pub mod problem;
pub mod ptx;
pub mod ptxas;
pub mod reference;
pub mod sweep;
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

pub use device::Device;
pub use error::{Error, Result};
pub use plan::{
    BatchPagedDecodeArgs, BatchPagedDecodeArgsLayout, BatchPagedDecodePlan, DecodePath, PagedKvAppendArgs,
    PagedKvAppendArgsLayout, PagedKvAppendPlan,
};
pub use tensor::{TensorLayout, TensorMut, TensorRef, Workspace};
pub use types::*;
