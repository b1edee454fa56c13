//! Batched paged-KV decode attention for CUDA GPUs, in pure Rust.
//!
//! - [`BatchPagedDecodePlan`]: one query row per request against its paged K/V history.
//! - [`PagedKvAppendPlan`]: writes one new K/V token per request into the paged store.
//! - [`reference`](mod@reference): float64 CPU implementations of both, with the same layouts and semantics.
//! - [`page_table`]: the page table (`indptr` / `indices` / `last_page_len`) and its host-side validation.
//!
//! Kernels are Rust (`kernels-gpu/`), compiled to PTX by rustc's NVPTX backend and shipped with
//! the package (`ptx/`), then JIT-compiled by the CUDA driver when a plan first loads them: each
//! entry point is a module of its own, so a plan compiles only its own ([`ptx::EntryModules`]).
//! Device memory is cudarc's: the tensor views wrap [`cudarc::driver::CudaView`]s, so buffers
//! another cudarc user owns (candle, for one) go in without copies. [`cudarc`] and [`half`] are
//! re-exported.
//!
//! # Example
//!
//! One decode step of two requests (9 and 0 tokens) over 4-token pages; `examples/decode.rs` and
//! `examples/serving_loop.rs` are complete programs.
//!
//! ```no_run
//! use paged_decode::half::f16;
//! use paged_decode::*;
//!
//! # fn main() -> Result<()> {
//! let dev = Device::open(0)?; // Err(Error::NoDevice) without a CUDA driver or GPU
//! let s = &dev.stream;
//! let (pages, kv_heads, page_size, head_dim) = (8, 2, 4, 64);
//! let paged_kv = PagedKvCacheDescriptor { page_size, num_total_pages: pages, num_kv_heads: kv_heads, head_dim,
//!                                         element: ElementKind::F16 };
//! let desc = BatchPagedDecodeDescriptor { batch_size: 2, num_qo_heads: 8, sm_scale: 0.125, paged_kv };
//! let plan = BatchPagedDecodePlan::<f16>::select(s, &desc, PlanPreference::default())?;
//!
//! let store = [pages, kv_heads, page_size, head_dim];
//! let numel = (pages * kv_heads * page_size * head_dim) as usize;
//! let (k, v) = (s.alloc_zeros::<f16>(numel)?, s.alloc_zeros::<f16>(numel)?);
//! // Request 0 owns pages 5, 2, 7 with one token in the last (9 tokens); request 1 owns none.
//! let indices = s.clone_htod(&[5, 2, 7])?;
//! let indptr = s.clone_htod(&[0, 3, 3])?;
//! let last_page_len = s.clone_htod(&[1, 0])?;
//! let q = s.alloc_zeros::<f16>(2 * 8 * 64)?;
//! let (mut o, mut lse) = (s.alloc_zeros::<f16>(2 * 8 * 64)?, s.alloc_zeros::<f32>(2 * 8)?);
//! // Zeroed once before its first use; every run leaves it zeroed again.
//! let mut ws_bytes = s.alloc_zeros::<u8>(plan.workspace_size().max(1))?;
//! let mut ws = Workspace::zeroed(s, ws_bytes.slice_mut(..))?;
//!
//! plan.run(s, &mut ws, &mut BatchPagedDecodeArgs {
//!     q: TensorRef::new(q.slice(..), [2, 8, 64]),
//!     k_data: TensorRef::new(k.slice(..), store),
//!     v_data: TensorRef::new(v.slice(..), store),
//!     indices: TensorRef::new(indices.slice(..), [3]),
//!     indptr: TensorRef::new(indptr.slice(..), [3]),
//!     last_page_len: TensorRef::new(last_page_len.slice(..), [2]),
//!     o: TensorMut::new(o.slice_mut(..), [2, 8, 64]),
//!     lse: TensorMut::new(lse.slice_mut(..), [2, 8]),
//! })?;
//! let lse = s.clone_dtoh(&lse)?; // request 1: o = 0, lse = -inf
//! # Ok(())
//! # }
//! ```
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
//! conflicting use on another stream, and its drop waits for its last write and its last
//! recorded read. cudarc (0.19) records one read event per allocation, on the stream of the
//! latest read, so a read on a second stream would hide one still running on a first from a
//! later write or drop: `run` therefore has the home stream of each operand it reads on another
//! stream wait for the launch, and records the read there (work enqueued on that home stream
//! afterwards waits for the launch; reads made through cudarc's own API are the caller's). With
//! [`Device::open_untracked`] (an `unsafe fn`) the caller takes over that ordering, as its
//! `# Safety` section lists.
//!
//! **Same device.** `run` and `check_page_table` refuse, with [`Error::WrongDevice`], a stream of
//! another context than the plan's and any tensor or workspace of another context than the
//! stream's, before touching the stream: a kernel never dereferences another device's address.
//! The check compares context handles, a few pointer comparisons per call. cudarc keeps its
//! event tracking per `CudaContext` object, and two objects can share one driver context (two
//! `CudaContext::new(0)`, or candle's and this crate's [`Device`]): a tensor of another object
//! is taken only when neither object manages stream synchronization, or both do and the launch
//! is on a created stream (which keeps its object managing until the launch is recorded), since
//! cudarc orders a launch after a slice's last write, and the slice's drop after the launch,
//! only when the slice's object does and it records the launch only when the stream's does
//! ([`Error::UnorderedContext`] otherwise; [`Workspace::zeroed`] checks its bytes alike).
//!
//! **Default streams.** cudarc orders a context's streams with events only while the context
//! holds a stream it created (`CudaContext::new_stream`, `CudaStream::fork`): dropping the last
//! one turns the ordering off, for work already enqueued too. A slice keeps alive only the
//! stream it was allocated on. So a tensor allocated on a default stream
//! (`CudaContext::default_stream`, `per_thread_stream`) of a context that orders streams is
//! taken on the legacy default stream alone, which the driver orders with every default stream
//! it can later be used or freed on; on a created or a per-thread stream it is refused
//! ([`Error::UnorderedStream`]): once the context's created streams were dropped, its next use
//! or its free would not wait for the launch. A tensor of a created stream is taken on any
//! stream of its context, since it keeps the ordering on (a stream wrapped by the `unsafe`
//! `CudaContext::wrap_borrowed_stream` counts as created but keeps nothing on: its tensors are
//! that caller's to order). Per-thread default streams of two threads are not ordered with each
//! other, and in a context without created streams cudarc records no events: there, work on
//! one tensor from several threads is the caller's to order (candle's per-thread mode; see the
//! README).
//!
//! **Page tables.** The fast path trusts the values of `indptr` / `indices` / `last_page_len`
//! but every access stays inside the given tensors (see `kernels-gpu/src/lib.rs`); a corrupt
//! table gives unspecified output, and for the append a dropped, raced or overwritten token
//! ([`PagedKvAppendPlan::run`]). [`PlanPreference::checked`] validates the table on the GPU
//! first and returns [`Error::InvalidPageTable`], writing nothing; it synchronizes, so under
//! stream capture it returns [`Error::CheckedUnderCapture`] instead.
//!
//! **Graph capture.** A captured graph holds raw device pointers: replaying it reads and writes
//! the buffers of the captured calls with no borrow tying them to the graph. So a `run` is
//! captured only in a context whose event tracking an `unsafe` call turned off:
//! [`Device::open_untracked`], whose contract makes the caller keep the tensors and the
//! workspace of captured runs alive, and not give them to other work, until the graph is
//! dropped, or `CudaContext::disable_event_tracking`, whose caller takes on the same rules for
//! the runs it captures (cudarc's contract for it does not name graphs; the check can only
//! tell that an `unsafe` call was made). In a context that tracks events (cudarc's default)
//! a `run` on a capturing stream is refused with [`Error::CaptureWithTracking`], before any
//! kernel is enqueued. The status is read before the operands are taken and again right before
//! the launch: taking an operand makes the stream wait for the operand's last cudarc event, and
//! a wait for an event recorded in another stream's capture draws the stream into that capture.
//! That costs two driver queries per run there. (cudarc's own copies and memsets can still be
//! captured by safe code, as can any launch when another thread begins a capture on the same
//! stream between that last check and the launch: that is cudarc's API.)
//!
//! # Contracts
//!
//! - **Workspace.** A decode plan with `workspace_size() > 0` keeps its split-KV scratch and
//!   arrival counters there ([`Workspace`]). [`Workspace::zeroed`] zeroes it once (stream-ordered);
//!   every launch leaves the counters zero again, so it is reused across runs and graph replays
//!   without clearing. Plans of one batch size and head count share it; a plan whose split state
//!   differs gets [`Error::WorkspaceInUse`] rather than reading another plan's partials as
//!   counters. Runs that share one workspace must be ordered on one stream.
//! - **Empty batches.** A request may own no pages (`o = 0`, `lse = -inf`), and so may every
//!   request of a batch; `indices` then still needs one element (any page id), because the CUDA
//!   driver rejects 0-byte allocations. A buffer sized for the largest batch covers this.
//! - **Page table.** See [`page_table`]: the fast path trusts it and stays in bounds either way.
//!
//! # Features
//!
//! - `cli` (default): the `paged-decode` binary (the main job, `inspect`, `bench`, plots) and
//!   the crates only it uses (clap, plotters, rand, serde, serde_json). The library never needs
//!   it.
//! - Linking: the `default` features also load the CUDA driver at run time
//!   (`fallback-dynamic-loading`) and bind CUDA 12.8 (`cuda-12080`). This crate forwards
//!   cudarc's linking modes and CUDA versions under the same names; cudarc allows one of each
//!   per build.
//!
//! A library depending on this crate sets `default-features = false`: it gets the library alone
//! (cudarc, half, float8, thiserror, libloading), and the final build picks cudarc's linking
//! mode and CUDA version.

#![warn(missing_docs)]

pub mod device;
mod driver_library;
pub mod error;
mod guard;
pub mod page_table;
pub mod plan;
pub mod ptx;
pub mod reference;
pub mod tensor;
pub mod types;

#[cfg(test)]
mod check_tests;
#[path = "../kernels-gpu/src/params.rs"]
#[allow(dead_code)]
pub(crate) mod params;
#[cfg(test)]
mod tiling_tests;

#[path = "../kernels-gpu/src/chunking.rs"]
#[allow(dead_code)]
pub(crate) mod chunking;
#[cfg(test)]
mod chunking_tests;

/// The 8-bit floating-point formats of a K/V cache (E4M3, E5M2): exact dequantization and
/// round-to-nearest-even, saturating quantization, bit-identical to the device's.
#[path = "../kernels-gpu/src/fp8.rs"]
pub mod fp8;
#[cfg(test)]
mod fp8_tests;

pub use cudarc;
pub use device::Device;
pub use error::{Error, Result};
pub use float8;
pub use half;
pub use plan::{
    BatchPagedDecodeArgs, BatchPagedDecodeArgsLayout, BatchPagedDecodePlan, DecodePath, PagedKvAppendArgs,
    PagedKvAppendArgsLayout, PagedKvAppendPairedArgs, PagedKvAppendPlan,
};
pub use tensor::{TensorLayout, TensorMut, TensorRef, Workspace};
pub use types::*;
