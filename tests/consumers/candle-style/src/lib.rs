//! Decode over device buffers a candle CUDA build owns, without copying them.
//!
//! In candle, `CudaStorage::as_cuda_slice::<f16>()` gives a tensor's `&CudaSlice<f16>`,
//! `Layout::start_offset()` where the tensor starts in it, and `CudaDevice::cuda_stream()` the
//! stream. Those are this build's cudarc types, the ones paged-decode's views wrap.

use std::sync::Arc;

use cudarc::driver::{CudaSlice, CudaStream};
use half::f16;
use paged_decode::{
    BatchPagedDecodeArgs, BatchPagedDecodePlan, Error, Result, TensorMut, TensorRef, Workspace,
};

/// A contiguous tensor inside a device slice, as a candle tensor's storage and layout give it.
pub struct Buffer<'a, T> {
    /// The storage's slice (`as_cuda_slice::<T>()`).
    pub slice: &'a CudaSlice<T>,
    /// The tensor's first element in it (`layout.start_offset()`).
    pub start_offset: usize,
}

impl<'a, T> Buffer<'a, T> {
    fn view<const N: usize>(&self, shape: [i32; N]) -> Result<TensorRef<'a, T, N>> {
        Ok(TensorRef::new(self.tail()?, shape))
    }

    /// The slice from the tensor's first element on; an offset past the slice is an error.
    fn tail(&self) -> Result<cudarc::driver::CudaView<'a, T>> {
        self.slice.try_slice(self.start_offset..).ok_or_else(|| {
            Error::InvalidProblem(format!(
                "start offset {} past a slice of {} elements",
                self.start_offset,
                self.slice.len()
            ))
        })
    }
}

/// The paged K/V store and page table of a serving engine built on candle.
pub struct PagedCache<'a> {
    /// `[num_total_pages, num_kv_heads, page_size, head_dim]`.
    pub k: Buffer<'a, f16>,
    /// `[num_total_pages, num_kv_heads, page_size, head_dim]`.
    pub v: Buffer<'a, f16>,
    /// Page ids of the batch's requests, concatenated (at least one element).
    pub indices: Buffer<'a, i32>,
    /// `[batch + 1]` offsets into `indices`.
    pub indptr: Buffer<'a, i32>,
    /// `[batch]` tokens in each request's last page.
    pub last_page_len: Buffer<'a, i32>,
}

/// Runs `plan` on candle's stream: `q` is `[batch, num_qo_heads, head_dim]`; `o` and `lse` are
/// output slices the caller wraps back into candle storage; `workspace` is made once
/// (`Workspace::zeroed` on the same stream) and reused by every decode of this configuration.
pub fn decode(
    plan: &BatchPagedDecodePlan<f16>,
    stream: &Arc<CudaStream>,
    q: &Buffer<'_, f16>,
    cache: &PagedCache<'_>,
    o: &mut CudaSlice<f16>,
    lse: &mut CudaSlice<f32>,
    workspace: &mut Workspace<'_>,
) -> Result<()> {
    let desc = plan.descriptor();
    let kv = desc.paged_kv;
    let (b, hq, d) = (desc.batch_size, desc.num_qo_heads, kv.head_dim);
    let store = [kv.num_total_pages, kv.num_kv_heads, kv.page_size, d];
    let indices = cache.indices.tail()?;
    let num_indices = i32::try_from(indices.len())
        .map_err(|_| Error::InvalidProblem(format!("{} page ids exceed i32", indices.len())))?;
    let mut args = BatchPagedDecodeArgs {
        q: q.view([b, hq, d])?,
        k_data: cache.k.view(store)?,
        v_data: cache.v.view(store)?,
        indices: TensorRef::new(indices, [num_indices]),
        indptr: cache.indptr.view([b + 1])?,
        last_page_len: cache.last_page_len.view([b])?,
        o: TensorMut::new(o.slice_mut(..), [b, hq, d]),
        lse: TensorMut::new(lse.slice_mut(..), [b, hq]),
    };
    plan.run(stream, workspace, &mut args)
}
