//! The split partition of large batches, computed once per launch by one CTA.
//!
//! [`crate::partition`] lets every CTA derive the length-aware partition from the page table on
//! its own: no extra launch, but each CTA reads the whole page table, so a launch costs
//! `O(CTAs × batch)`. Past [`crate::params::PARTITION_CACHED_BATCH`] requests (past 64 for a
//! partition of spare chunks alone: the host's `DecodeConfig::partitions_in_every_cta`) the
//! host launches this kernel first instead: it computes the same partition (same bounds, same
//! bisection, same chunk counts; the items in another order) and writes an item map to the
//! workspace, from which each decode CTA reads its item in `O(1)`
//! ([`crate::partition::mapped_chunk`]).
//!
//! Item map (u32 words): `[items, chunk_tokens]`, then one `(request, first item of the request)`
//! pair per item. `chunk_tokens == 0` means item `x` is request `x` (no request is longer than
//! the smallest chunk the partition could take), and no pairs are written; `items == 0` means the
//! page table claims more tokens than its slots hold (a corrupt `indptr`), and every decode CTA
//! exits. Otherwise the chunks of the requests cut into several take the first items and the
//! requests kept whole the rest, each in request order (a request's chunks are consecutive
//! items): the long requests' chunks start in the first wave, wherever those requests are in the
//! batch, instead of ending after every other CTA.
//!
//! # Thread mapping
//! One CTA of [`crate::params::SCHEDULE_THREADS`] threads; thread `t` owns the contiguous
//! requests `[t·n, (t + 1)·n)`, `n = ceil(batch / threads)`, re-reading their page-table
//! entries (from L1) on every pass. Passes: totals, at most `1 + BISECTION_STEPS` chunk-count
//! sums, one exclusive scan of the cut and the whole requests' item counts (packed in one word),
//! then each thread writes its requests' pairs. Block reductions go through `32` words of
//! dynamic shared memory per value.
//!
//! # Ordering
//! The page table is read after `griddepcontrol.wait`, or before it when the caller promised that
//! the preceding kernel does not write it (`p.early_page_table`, as for the decode kernel
//! itself); the map is written after it, and the decode kernel reads it after its own wait,
//! which returns only when this grid, and so the kernel before it, is done.

use crate::chunking::{chunk_bounds, chunk_size, request_chunks};
use crate::intrinsics::*;
use crate::params::{DecodeParams, SCHEDULE_THREADS};
use crate::partition::{request_pages, wait_unless_page_table_stable};
use crate::variant::attended;

const WARPS: u32 = SCHEDULE_THREADS / 32;

/// This thread's run of requests: `[first, first + count)`.
#[inline(always)]
fn my_requests(batch: u32) -> (u32, u32) {
    let per = batch.div_ceil(SCHEDULE_THREADS);
    let first = thread_idx().saturating_mul(per).min(batch);
    (first, first.saturating_add(per).min(batch) - first)
}

/// Sum of `v` over the CTA (every thread gets it). Uses shared words `[0, 32)` of `slot`.
#[inline(always)]
fn block_sum_u64(v: u64, slot: u32) -> u64 {
    let (lo, hi) = (v as u32, (v >> 32) as u32);
    let mut acc = lo as u64 | ((hi as u64) << 32);
    for step in 0..5 {
        let m = 16 >> step;
        let l = shfl_xor_u32(acc as u32, m) as u64;
        let h = shfl_xor_u32((acc >> 32) as u32, m) as u64;
        acc += l | (h << 32);
    }
    let base = smem_base() + slot * WARPS * 8;
    if thread_idx() % 32 == 0 {
        unsafe { st_shared_u64(base + (thread_idx() / 32) * 8, acc) };
    }
    sync_threads();
    let mut total = 0u64;
    for w in 0..WARPS {
        total += unsafe { ld_shared_u64(base + w * 8) };
    }
    total
}

/// Largest `v` over the CTA (every thread gets it). Uses shared slot `slot` as [`block_sum_u64`].
#[inline(always)]
fn block_max_u32(v: u32, slot: u32) -> u32 {
    let mut acc = v;
    for step in 0..5 {
        let m = 16 >> step;
        acc = acc.max(shfl_xor_u32(acc, m));
    }
    let base = smem_base() + slot * WARPS * 8;
    if thread_idx() % 32 == 0 {
        unsafe { st_shared_u64(base + (thread_idx() / 32) * 8, acc as u64) };
    }
    sync_threads();
    let mut most = 0u32;
    for w in 0..WARPS {
        most = most.max(unsafe { ld_shared_u64(base + w * 8) } as u32);
    }
    most
}

/// Sum of `v` over the threads before this one (exclusive scan). Uses shared slot `slot`.
#[inline(always)]
fn block_exclusive_scan_u64(v: u64, slot: u32) -> u64 {
    let lane = thread_idx() % 32;
    let mut inclusive = v;
    for step in 0..5 {
        let d = 1 << step;
        let lo = shfl_up_u32(inclusive as u32, d) as u64;
        let hi = shfl_up_u32((inclusive >> 32) as u32, d) as u64;
        if lane >= d {
            inclusive += lo | (hi << 32);
        }
    }
    let base = smem_base() + slot * WARPS * 8;
    if lane == 31 {
        unsafe { st_shared_u64(base + (thread_idx() / 32) * 8, inclusive) };
    }
    sync_threads();
    let mut before = inclusive - v;
    for w in 0..thread_idx() / 32 {
        before += unsafe { ld_shared_u64(base + w * 8) };
    }
    before
}

/// Writes the item map of the length-aware partition of `p`'s requests into `p.item_map`.
///
/// # Safety
/// `p` satisfies the [safety model](crate#safety-model) of `decode_*` and `p.item_map` holds
/// [`item_map_bytes`](crate::params::item_map_bytes)`(p.num_chunks)` bytes that no other work
/// uses while the kernel runs; launched as one CTA of [`SCHEDULE_THREADS`] threads with
/// [`SCHEDULE_SMEM_BYTES`](crate::params::SCHEDULE_SMEM_BYTES) bytes of dynamic shared memory.
#[inline(always)]
pub unsafe fn schedule_chunks(p: &DecodeParams) {
    allow_dependent_launch();
    wait_unless_page_table_stable(p);
    let (first, count) = my_requests(p.batch);
    // Tokens each request attends to (its window's).
    let len = |b: u32| attended(p, unsafe { request_pages(p, b) }.2);
    let mut total = 0u64;
    let mut longest = 0u32;
    for b in first..first + count {
        let l = len(b);
        total += l as u64;
        longest = longest.max(l);
    }
    let total = block_sum_u64(total, 0);
    let longest = block_max_u32(longest, 1);
    let map = p.item_map as *mut u32;
    let header = |items: u32, chunk_tokens: u32| {
        if thread_idx() == 0 {
            unsafe {
                *map = items;
                *map.add(1) = chunk_tokens;
            }
        }
    };
    let (lo, hi) =
        chunk_bounds(total, longest, p.batch, p.num_chunks, p.min_chunk, p.preferred_chunk, p.balance_items);
    // Written after the wait: the kernel before this one may still read the workspace.
    if total > p.num_indices as u64 * p.page_size as u64 {
        grid_dependency_wait();
        header(0, 0);
        return;
    }
    if longest <= lo {
        grid_dependency_wait();
        header(p.batch, 0);
        return;
    }
    // Every pass ends in a barrier, so alternating slots 2 and 3 never overwrite a slot that a
    // thread still reads.
    let mut pass = 0u32;
    let chunk_tokens = chunk_size(lo, hi, |c| {
        let mut n = 0u64;
        for b in first..first + count {
            n += request_chunks(len(b), c, p.unsplit_max_tokens) as u64;
        }
        pass += 1;
        block_sum_u64(n, 2 + pass % 2) <= p.num_chunks as u64
    });
    // Cut requests first, then whole ones (the map's order, above).
    let (mut cut_mine, mut whole_mine) = (0u32, 0u32);
    for b in first..first + count {
        let n = request_chunks(len(b), chunk_tokens, p.unsplit_max_tokens);
        if n > 1 {
            cut_mine += n;
        } else {
            whole_mine += n;
        }
    }
    // Both counts in one word for the scan and the sum: each fits 32 bits (at most `num_chunks`
    // items).
    let mine = cut_mine as u64 | (whole_mine as u64) << 32;
    let before = block_exclusive_scan_u64(mine, 4);
    let (mut cut_before, mut whole_before) = (before as u32, (before >> 32) as u32);
    let sums = block_sum_u64(mine, 5);
    let (cut_items, whole_items) = (sums as u32, (sums >> 32) as u32);
    grid_dependency_wait();
    // The pairs stay within the items summed above and the map the host sized for `num_chunks`,
    // also when a broken page-table promise lets the table change across the wait (the counts
    // read again here then differ from the summed ones).
    let capacity = (cut_items + whole_items).min(p.num_chunks);
    for b in first..first + count {
        let n = request_chunks(len(b), chunk_tokens, p.unsplit_max_tokens);
        let at = if n > 1 {
            cut_before += n;
            cut_before - n
        } else {
            whole_before += n;
            cut_items + whole_before - n
        };
        for i in 0..n.min(capacity.saturating_sub(at)) {
            unsafe {
                let pair = map.add(2 + 2 * (at + i) as usize);
                *pair = b;
                *pair.add(1) = at;
            }
        }
    }
    let items = cut_items + whole_items;
    header(items, chunk_tokens);
}
