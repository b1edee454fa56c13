//! What both examples need around the library: opening the GPU (or explaining why not), page
//! allocation from a free list as a serving engine does it, the host copy of the page table,
//! test data and the error measure.

#![allow(dead_code)] // each example uses part of this module

#[cfg(feature = "nccl")]
pub mod tensor_parallel;

use std::process::ExitCode;

use paged_decode::cudarc::driver::{CudaSlice, CudaStream};
use paged_decode::half::f16;
use paged_decode::reference::PageTable;
use paged_decode::{Device, Element, ElementKind, Error, PagedKvCacheDescriptor, TensorRef};
use rand::Rng;
use rand::rngs::SmallRng;
use rand::seq::SliceRandom;

/// The model both examples serve: 32 query heads over 8 KV heads of 128, f16, 16-token pages.
pub const PAGE_SIZE: usize = 16;
/// Query (and output) heads.
pub const QO_HEADS: usize = 32;
/// K/V heads.
pub const KV_HEADS: usize = 8;
/// Head dimension.
pub const HEAD_DIM: usize = 128;

/// The model's paged K/V store with `num_pages` pages.
pub fn paged_kv(num_pages: usize) -> PagedKvCacheDescriptor {
    PagedKvCacheDescriptor {
        page_size: PAGE_SIZE as i32,
        num_total_pages: num_pages as i32,
        num_kv_heads: KV_HEADS as i32,
        head_dim: HEAD_DIM as i32,
        element: ElementKind::F16,
    }
}

/// The exit status of an example: failure, after printing the error, when `result` is one.
pub fn exit_code(example: &str, result: Result<(), Box<dyn std::error::Error>>) -> ExitCode {
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("{example}: {e}");
            ExitCode::FAILURE
        }
    }
}

/// The first GPU, or `None` after saying that there is no CUDA driver or GPU (the examples then
/// exit 0).
pub fn open_device(example: &str) -> Result<Option<Device>, Error> {
    opened(example, Device::open(0))
}

/// [`open_device`] without cudarc's cross-stream event tracking, which CUDA graph capture needs
/// (with it, a plan's `run` on a capturing stream is refused: `Error::CaptureWithTracking`).
///
/// # Safety
/// The caller upholds [`Device::open_untracked`]'s contract: it issues all work on the device's
/// one stream, keeps every buffer a captured graph uses alive until the graph is dropped, and
/// neither zeroes a captured workspace again nor lends it to another launch while the graph can
/// replay.
#[allow(dead_code)]
pub unsafe fn open_device_for_capture(example: &str) -> Result<Option<Device>, Error> {
    // SAFETY: forwarded to the caller.
    opened(example, unsafe { Device::open_untracked(0) })
}

fn opened(example: &str, device: Result<Device, Error>) -> Result<Option<Device>, Error> {
    match device {
        Ok(device) => {
            println!("{example}: running on {}", device.name()?);
            Ok(Some(device))
        }
        Err(Error::NoDevice) => {
            println!(
                "{example}: no CUDA driver or GPU on this machine; this example needs an NVIDIA GPU (sm_80+)"
            );
            Ok(None)
        }
        Err(e) => Err(e),
    }
}

/// `n` values uniform in `[-1, 1)`.
pub fn random_values(rng: &mut SmallRng, n: usize) -> Vec<f16> {
    (0..n).map(|_| f16::from_f64(rng.random_range(-1.0..1.0))).collect()
}

/// Pages of the K/V store not owned by any request.
pub struct PagePool {
    free: Vec<i32>,
}

impl PagePool {
    /// All `num_pages` pages free, handed out in a shuffled order (as after a while of serving).
    pub fn new(num_pages: usize, rng: &mut SmallRng) -> Self {
        let mut free: Vec<i32> = (0..num_pages as i32).collect();
        free.shuffle(rng);
        Self { free }
    }
    /// Free pages left.
    pub fn available(&self) -> usize {
        self.free.len()
    }
    /// Returns a request's pages to the pool.
    pub fn release(&mut self, pages: &mut Vec<i32>) {
        self.free.append(pages);
    }
}

/// A request's pages and length, as the engine tracks them on the host.
#[derive(Default)]
pub struct Sequence {
    /// Page ids in token order.
    pub pages: Vec<i32>,
    /// Tokens stored.
    pub len: usize,
}

impl Sequence {
    /// Makes room for one more token *before* it is appended (the library's append convention):
    /// takes a page from `pool` when the last one is full. `false` when the pool is empty.
    pub fn grow(&mut self, pool: &mut PagePool, page_size: usize) -> bool {
        if self.len == self.pages.len() * page_size {
            match pool.free.pop() {
                Some(page) => self.pages.push(page),
                None => return false,
            }
        }
        self.len += 1;
        true
    }
    /// Tokens in the last page, `0` without a page.
    pub fn last_page_len(&self, page_size: usize) -> i32 {
        if self.pages.is_empty() { 0 } else { (self.len - (self.pages.len() - 1) * page_size) as i32 }
    }
}

/// The page table of a batch in host memory (CSR), ready to upload.
#[derive(Debug, Default, Clone)]
pub struct HostPageTable {
    /// `[batch + 1]` offsets into `indices`.
    pub indptr: Vec<i32>,
    /// Page ids of all requests, concatenated.
    pub indices: Vec<i32>,
    /// `[batch]` tokens in each request's last page.
    pub last_page_len: Vec<i32>,
}

impl HostPageTable {
    /// The table of `batch` (an empty slot is a request without pages), with `indices` padded to
    /// `indices_capacity` entries so it fits a device buffer of that size.
    pub fn of<'a>(
        batch: impl IntoIterator<Item = Option<&'a Sequence>>,
        page_size: usize,
        indices_capacity: usize,
    ) -> Self {
        let mut table = Self { indptr: vec![0], ..Self::default() };
        for seq in batch {
            if let Some(seq) = seq {
                table.indices.extend(&seq.pages);
            }
            table.indptr.push(table.indices.len() as i32);
            table.last_page_len.push(seq.map_or(0, |s| s.last_page_len(page_size)));
        }
        table.indices.resize(indices_capacity.max(table.indices.len()), 0);
        table
    }
    /// Borrowed for the CPU reference.
    pub fn view(&self) -> PageTable<'_> {
        PageTable { indptr: &self.indptr, indices: &self.indices, last_page_len: &self.last_page_len }
    }
}

/// Error an f16 decode stays within, relative for `o` and absolute for `lse` (what the GPU
/// tests require).
pub const TOLERANCE: f64 = 1e-3;

/// `Ok` when `worst` is within [`TOLERANCE`] (a NaN is not).
pub fn within_tolerance(worst: f64) -> Result<(), String> {
    if worst <= TOLERANCE { Ok(()) } else { Err(format!("worst error {worst:.2e} exceeds {TOLERANCE:.0e}")) }
}

/// Largest absolute difference of the device `lse` from the reference's, where both `-inf`
/// (an empty request) counts as equal and a NaN as infinitely far.
pub fn lse_err(gpu: &[f32], reference: &[f64]) -> f64 {
    gpu.iter()
        .zip(reference)
        .map(|(&g, &r)| if f64::from(g) == r { 0.0 } else { (f64::from(g) - r).abs() })
        .map(|e| if e.is_nan() { f64::INFINITY } else { e })
        .fold(0.0, f64::max)
}

/// A page table in device memory, in buffers of fixed size that later tables are written into.
pub struct DevicePageTable {
    /// Page ids; its length is the capacity a plan sees.
    pub indices: CudaSlice<i32>,
    /// `[batch + 1]` offsets into `indices`.
    pub indptr: CudaSlice<i32>,
    /// `[batch]` tokens in each request's last page.
    pub last_page_len: CudaSlice<i32>,
}

/// Views of the three page-table arrays, for a plan's arguments.
pub type PageTableViews<'a> = (TensorRef<'a, i32, 1>, TensorRef<'a, i32, 1>, TensorRef<'a, i32, 1>);

impl DevicePageTable {
    /// Device copies of `table`.
    pub fn upload(stream: &std::sync::Arc<CudaStream>, table: &HostPageTable) -> Result<Self, Error> {
        Ok(Self {
            indices: stream.clone_htod(&table.indices)?,
            indptr: stream.clone_htod(&table.indptr)?,
            last_page_len: stream.clone_htod(&table.last_page_len)?,
        })
    }
    /// Writes `table`, which must have this table's sizes, into the buffers (stream-ordered).
    pub fn write(&mut self, stream: &std::sync::Arc<CudaStream>, table: &HostPageTable) -> Result<(), Error> {
        stream.memcpy_htod(&table.indices, &mut self.indices)?;
        stream.memcpy_htod(&table.indptr, &mut self.indptr)?;
        stream.memcpy_htod(&table.last_page_len, &mut self.last_page_len)?;
        Ok(())
    }
    /// `(indices, indptr, last_page_len)` views.
    pub fn views(&self) -> PageTableViews<'_> {
        let batch = self.last_page_len.len() as i32;
        (
            TensorRef::new(self.indices.slice(..), [self.indices.len() as i32]),
            TensorRef::new(self.indptr.slice(..), [batch + 1]),
            TensorRef::new(self.last_page_len.slice(..), [batch]),
        )
    }
}

/// Relative L2 error of `gpu` against the float64 `reference` (absolute when the reference is
/// 0; a NaN anywhere makes it infinite).
pub fn rel_err<T: Element>(gpu: &[T], reference: &[f64]) -> f64 {
    let (mut diff, mut norm) = (0.0, 0.0);
    for (g, r) in gpu.iter().zip(reference) {
        diff += (g.to_f64() - r).powi(2);
        norm += r * r;
    }
    let err = if norm == 0.0 { diff.sqrt() } else { (diff / norm).sqrt() };
    if err.is_nan() { f64::INFINITY } else { err }
}
