//! Appends one K/V token per request to the paged store.
//!
//! Convention: the caller has already advanced the page table for the new token (a new page
//! allocated when the last one was full, and `last_page_len[b]` incremented), so the token goes
//! to slot `last_page_len[b] - 1` of page `indices[indptr[b + 1] - 1]`. Requests with no page or
//! `last_page_len` outside `[1, page_size]`, or a page id outside the store, are skipped.
//!
//! Grid `(batch, num_kv_heads)`, 32 threads copying 16-byte vectors of the `head_dim` row into
//! the K/V views (any page, head and token strides, as the decode kernels read them).

use crate::element::Elem;
use crate::intrinsics::*;
use crate::params::AppendParams;

/// # Safety
/// `p` is an [`AppendParams`] block as the module documentation and `kernels-gpu`'s safety model
/// describe: tensors of their documented shapes, launched on a grid of `(batch, num_kv_heads)`
/// CTAs of 32 threads.
#[inline(always)]
pub unsafe fn append_token<T: Elem>(p: &AppendParams) {
    let (b, h, _) = block_idx();
    let indptr = p.indptr as *const i32;
    let (start, stop) = unsafe { (ld_nc_i32(indptr.add(b as usize)), ld_nc_i32(indptr.add(b as usize + 1))) };
    if start < 0 || stop <= start || stop as u32 > p.num_indices {
        return;
    }
    let last = unsafe { ld_nc_i32((p.last_page_len as *const i32).add(b as usize)) };
    if last < 1 || last as u32 > p.page_size {
        return;
    }
    let page = unsafe { ld_nc_i32((p.indices as *const i32).add(stop as usize - 1)) };
    if page < 0 || page as u32 >= p.num_total_pages {
        return;
    }
    let d = p.head_dim as usize;
    let dst = store_row_bytes(p, page as u32, h, last as u32 - 1);
    let src_row = (b as usize * p.num_kv_heads as usize + h as usize) * d;
    let vectors = d * core::mem::size_of::<T>() / 16;
    let mut c = thread_idx() as usize;
    while c < vectors {
        unsafe {
            let k = ld_nc_v4(((p.key as *const T).add(src_row) as *const u8).add(16 * c));
            let v = ld_nc_v4(((p.value as *const T).add(src_row) as *const u8).add(16 * c));
            *(((p.k_data as *mut u8).add(dst) as *mut [u32; 4]).add(c)) = k;
            *(((p.v_data as *mut u8).add(dst) as *mut [u32; 4]).add(c)) = v;
        }
        c += 32;
    }
}

/// Byte offset of row (`page`, KV head `h`, `slot`) in the K/V views (their strides).
#[inline(always)]
fn store_row_bytes(p: &AppendParams, page: u32, h: u32, slot: u32) -> usize {
    (page as usize * p.kv_page_stride as usize
        + h as usize * p.kv_head_stride as usize
        + slot as usize * p.kv_token_stride as usize)
        * 16
}
