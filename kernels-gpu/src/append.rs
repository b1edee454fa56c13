//! Appends one K/V token per request to the paged store.
//!
//! Convention: the caller has already advanced the page table for the new token (a new page
//! allocated when the last one was full, and `last_page_len[b]` incremented), so the token goes
//! to slot `last_page_len[b] - 1` of page `indices[indptr[b + 1] - 1]`. Requests with no page
//! (which append nothing) or `last_page_len` outside `[1, page_size]`, or a page id outside the
//! store, are skipped.
//!
//! Grid `(batch, num_kv_heads)`, 32 threads copying 16-byte vectors of the `head_dim` row into
//! the K/V views (any page, head and token strides, as the decode kernels read them), or
//! quantizing it 8 elements at a time into an 8-bit store. The rows are stored with relaxed
//! GPU-scope stores: two requests of a corrupt table that append to one slot do not race, and
//! each 4-byte word of the slot ends up one of the two tokens'.
//!
//! Programmatic dependent launch (sm_90 build): each CTA allows the next kernel's launch first
//! thing, so that a decode launched programmatically after the append starts its CTAs (up to
//! their `griddepcontrol.wait`, which still waits for the whole append and its writes) as the
//! append's last CTAs run, as it does after the decode before it. The append writes K/V only,
//! never the page table, so a decode reading its page table before the wait reads no value the
//! append changes.

use crate::element::MmaElem;
use crate::fp8::{Fp8Layout, f32_to_fp8};
use crate::intrinsics::*;
use crate::params::AppendParams;

/// Byte offset of the new token's row in the K/V views and first element of the request's row in
/// `key` / `value`, or `None` (nothing to write) when the page table does not give this CTA's request a
/// valid slot.
///
/// # Safety
/// `p` is an [`AppendParams`] block as the module documentation describes.
#[inline(always)]
unsafe fn append_rows(p: &AppendParams) -> Option<(usize, usize)> {
    let (b, h, _) = block_idx();
    let indptr = p.indptr as *const i32;
    let (start, stop) = unsafe { (ld_nc_i32(indptr.add(b as usize)), ld_nc_i32(indptr.add(b as usize + 1))) };
    if start < 0 || stop <= start || stop as u32 > p.num_indices {
        return None;
    }
    let last = unsafe { ld_nc_i32((p.last_page_len as *const i32).add(b as usize)) };
    if last < 1 || last as u32 > p.page_size {
        return None;
    }
    let page = unsafe { ld_nc_i32((p.indices as *const i32).add(stop as usize - 1)) };
    if page < 0 || page as u32 >= p.num_total_pages {
        return None;
    }
    let dst = store_row_bytes(p, page as u32, h, last as u32 - 1);
    let src_row = (b as usize * p.num_kv_heads as usize + h as usize) * p.head_dim as usize;
    Some((dst, src_row))
}

/// Byte offset of row (`page`, KV head `h`, `slot`) in the K/V views (their strides).
#[inline(always)]
fn store_row_bytes(p: &AppendParams, page: u32, h: u32, slot: u32) -> usize {
    (page as usize * p.kv_page_stride as usize
        + h as usize * p.kv_head_stride as usize
        + slot as usize * p.kv_token_stride as usize)
        * 16
}

/// Copies the new token's K and V rows into the store (any element type `T`, 8-bit codes
/// included).
///
/// # Safety
/// `p` is an [`AppendParams`] block as the module documentation and `kernels-gpu`'s safety model
/// describe: tensors of their documented shapes, launched on a grid of `(batch, num_kv_heads)`
/// CTAs of 32 threads.
#[inline(always)]
pub unsafe fn append_token<T: Copy>(p: &AppendParams) {
    allow_dependent_launch();
    let Some((dst, src_row)) = (unsafe { append_rows(p) }) else { return };
    let vectors = p.head_dim as usize * core::mem::size_of::<T>() / 16;
    let mut c = thread_idx() as usize;
    while c < vectors {
        unsafe {
            let k = ld_nc_v4(((p.key as *const T).add(src_row) as *const u8).add(16 * c));
            let v = ld_nc_v4(((p.value as *const T).add(src_row) as *const u8).add(16 * c));
            st_relaxed_v4((p.k_data as *mut u8).add(dst + 16 * c), k);
            st_relaxed_v4((p.v_data as *mut u8).add(dst + 16 * c), v);
        }
        c += 32;
    }
}

/// Quantizes the new token's K and V rows (16-bit `T`) into an 8-bit store of `format`: element
/// `x` of the key is stored as `f32_to_fp8(format, x / k_scale)` (the quotient rounded to f32, then
/// to the nearest code, ties to even, saturating; NaN stays NaN: see [`crate::fp8`]), the value's
/// likewise with `v_scale`, bit for bit what the host's reference computes.
///
/// # Safety
/// As [`append_token`], with the store of 8-bit codes.
#[inline(always)]
pub unsafe fn append_quantized<T: MmaElem>(p: &AppendParams, format: Fp8Layout) {
    allow_dependent_launch();
    let Some((dst, src_row)) = (unsafe { append_rows(p) }) else { return };
    // 8 elements (16 bytes of T, 8 bytes of codes) per step.
    let steps = p.head_dim as usize / 8;
    let mut c = thread_idx() as usize;
    while c < steps {
        unsafe {
            let k = ld_nc_v4(((p.key as *const T).add(src_row) as *const u8).add(16 * c));
            let v = ld_nc_v4(((p.value as *const T).add(src_row) as *const u8).add(16 * c));
            st_relaxed_v2((p.k_data as *mut u8).add(dst + 8 * c), quantize8::<T>(k, p.k_scale, format));
            st_relaxed_v2((p.v_data as *mut u8).add(dst + 8 * c), quantize8::<T>(v, p.v_scale, format));
        }
        c += 32;
    }
}

/// The 8 elements of `T` packed in `x` as 8 codes of `format` (`f32_to_fp8(x / scale)`), byte `i`
/// of the result holding element `i`. A NaN element takes its sign from its own bits: the GPU's
/// arithmetic turns every NaN into one canonical (positive) NaN, where the host keeps the sign.
#[inline(always)]
fn quantize8<T: MmaElem>(x: [u32; 4], scale: f32, format: Fp8Layout) -> [u32; 2] {
    let code = |bits: u32| {
        let q = T::from_bits(bits as u16).to_f32() / scale;
        let q = if q.is_nan() { f32::from_bits((bits & 0x8000) << 16 | 0x7fc0_0000) } else { q };
        f32_to_fp8(format, q) as u32
    };
    let pair = |w: u32| code(w & 0xffff) | code(w >> 16) << 8;
    [pair(x[0]) | pair(x[1]) << 16, pair(x[2]) | pair(x[3]) << 16]
}
