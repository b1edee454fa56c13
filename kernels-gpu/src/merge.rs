//! Split-KV merge: combining the partial (O, lse) rows of a request split into several chunks.
//!
//! Each chunk's CTA writes its partial rows to the workspace (`partial_o`, `partial_lse`; row
//! [`partial_row`]). The CTAs of one (request, KV head, head block) share a `[ticket, done]`
//! counter pair: a CTA draws a ticket when its main loop ends ([`draw_ticket`]) and, once its
//! partials are written, either publishes them (`done += 1`) or, holding the last ticket, waits
//! for the others and merges every chunk of the request into `o` and `lse` ([`finish_split`]).
//!
//! # Thread mapping
//! In the merging CTA each warp merges whole output rows (`merge_row`): lane `i` owns columns
//! `[i·VPL, (i + 1)·VPL)` of the row and the lse of chunks `i` and `i + 32`. The merged row
//! takes its attention sink there (`crate::variant::with_sink`), the chunks' partials never do.

use crate::decode::WARPS;
use crate::element::Elem;
use crate::intrinsics::*;
use crate::params::DecodeParams;
use crate::partition::{Chunk, cta_coords};
use crate::variant::with_sink;

/// Workspace row of the partial (O, lse) of query head `head` (of the request) in item `item`.
#[inline(always)]
pub fn partial_row(p: &DecodeParams, item: u32, head: u32) -> usize {
    item as usize * p.num_qo_heads as usize + head as usize
}

/// Arrival counters `[ticket, done]` of this CTA's (request, head block) in `p.counters`.
#[inline(always)]
fn arrival_counters(p: &DecodeParams, chunk: &Chunk) -> *mut u32 {
    let (_, y, head_blocks) = cta_coords::<true>(p);
    let slot = (chunk.request * head_blocks + y) as usize;
    unsafe { (p.counters as *mut u32).add(2 * slot) }
}

/// Split-KV arrival, step 1, as soon as the CTA's main loop ends: thread 0 draws a ticket for
/// its (request, head block); the CTA drawing `request_chunks - 1` will merge. The ticket orders nothing,
/// so its round trip overlaps the epilogue instead of following the partial writes.
#[inline(always)]
pub unsafe fn draw_ticket(p: &DecodeParams, chunk: &Chunk) -> u32 {
    if thread_idx() == 0 && chunk.request_chunks > 1 {
        unsafe { atomic_add_relaxed_u32(arrival_counters(p, chunk), 1) }
    } else {
        0
    }
}

/// Split-KV epilogue, after the CTA has written its partials: the other CTAs of a (request, KV
/// head, head block) publish theirs by a release increment of `done`. In the one holding the
/// last ticket, each warp waits until `done` counts them all (no CTA barrier between the poll
/// and the merge) and combines all chunks of its share of the `heads` query heads from
/// `first_head` (of the request); then the CTA resets both counters to 0 for the next launch.
/// The wait is short and cannot deadlock: every other ticket holder is past its main loop. The
/// chunks are combined in item order whichever CTA merges, so the result is deterministic.
#[inline(always)]
pub unsafe fn finish_split<T: Elem, const D: u32, const VPL: usize, const MERGE_BATCH: usize>(
    p: &DecodeParams,
    chunk: &Chunk,
    ticket: u32,
    first_head: u32,
    heads: u32,
) {
    let ticket_counter = arrival_counters(p, chunk);
    let done = unsafe { ticket_counter.add(1) };
    // The barrier orders every thread's partial writes before thread 0's release, and the merge's
    // reads after its acquire (barriers synchronize with each other, and causality order is
    // transitive): no fence by every thread, as in CUTLASS's semaphore.
    if !sync_threads_or(thread_idx() == 0 && ticket == chunk.request_chunks - 1) {
        if thread_idx() == 0 {
            unsafe { red_add_release_u32(done, 1) };
        }
        return;
    }
    // Each warp waits on its own, and merges its rows as soon as it sees every partial.
    if thread_idx() % 32 == 0 {
        while unsafe { ld_acquire_u32(done) } < chunk.request_chunks - 1 {}
    }
    sync_warp();
    let mut h = first_head + thread_idx() / 32;
    while h < first_head + heads {
        let row = (chunk.request * p.num_qo_heads + h) as usize;
        let first_partial = partial_row(p, chunk.first_item, h);
        unsafe { merge_row::<T, D, VPL, MERGE_BATCH>(p, row, h, first_partial, chunk.request_chunks) };
        h += WARPS;
    }
    // Every warp is past its poll: the counters are free for the next launch.
    sync_threads();
    if thread_idx() == 0 {
        unsafe {
            *ticket_counter = 0;
            *done = 0;
        }
    }
}

/// Combines the partials (O, lse) of output row `row` (request × query head `head`) over the request's
/// `live` chunks (≤ 64; chunk `s` in workspace row `first_partial + s · num_qo_heads`) with one
/// warp. The lse values (one per lane) and the first
/// `BATCH` partial rows are loaded together, so the merge costs one round trip to L2 per `BATCH`
/// splits; partials are summed in split order and read through L2 (`ld.global.cg`),
/// since other CTAs of this launch wrote them.
#[inline(always)]
unsafe fn merge_row<T: Elem, const D: u32, const VPL: usize, const BATCH: usize>(
    p: &DecodeParams,
    row: usize,
    head: u32,
    first_partial: usize,
    live: u32,
) {
    let lane = thread_idx() % 32;
    let slot = |s: u32| first_partial + s as usize * p.num_qo_heads as usize;
    let col = (lane * VPL as u32) as usize;
    let lse_of = |s: u32| {
        if s < live {
            unsafe { ld_cg_f32((p.partial_lse as *const f32).add(slot(s))) }
        } else {
            f32::NEG_INFINITY
        }
    };
    let partials = |s0: u32| {
        let mut v = [[0f32; VPL]; BATCH];
        for u in 0..BATCH {
            let s = s0 + u as u32;
            if s < live {
                let src = unsafe { (p.partial_o as *const f32).add(slot(s) * D as usize + col) };
                v[u] = unsafe { ld_cg_row::<VPL>(src) };
            }
        }
        v
    };
    let (lse_lo, lse_hi) = (lse_of(lane), lse_of(lane + 32));
    let mut v = partials(0);
    let m = warp_max(fmax(lse_lo, lse_hi));
    let (w_lo, w_hi) = if m == f32::NEG_INFINITY { (0.0, 0.0) } else { (exp2(lse_lo - m), exp2(lse_hi - m)) };
    let l = warp_sum(w_lo + w_hi);
    let mut acc = [0f32; VPL];
    let mut s0 = 0;
    while s0 < live {
        if s0 > 0 {
            v = partials(s0);
        }
        for u in 0..BATCH {
            let s = s0 + u as u32;
            let from_lo = shfl_idx(w_lo, s % 32);
            let from_hi = shfl_idx(w_hi, s % 32);
            let w = if s < 32 { from_lo } else { from_hi };
            for i in 0..VPL {
                acc[i] += w * v[u][i];
            }
        }
        s0 += BATCH as u32;
    }
    let lse = if l > 0.0 { m + log2(l) } else { f32::NEG_INFINITY };
    let (inv, lse) = with_sink(p, head, if l > 0.0 { 1.0 / l } else { 0.0 }, lse);
    let out = unsafe { (p.o as *mut T).add(row * D as usize + col) };
    if VPL % 4 == 0 {
        for j in 0..VPL / 4 {
            let v = [acc[4 * j] * inv, acc[4 * j + 1] * inv, acc[4 * j + 2] * inv, acc[4 * j + 3] * inv];
            unsafe { T::store4(out.add(4 * j), v) };
        }
    } else {
        for i in 0..VPL {
            unsafe { *out.add(i) = T::from_f32(acc[i] * inv) };
        }
    }
    if lane == 0 {
        unsafe { *(p.lse as *mut f32).add(row) = lse };
    }
}

/// `N` consecutive f32 through L2, in 16-byte loads when `N` is a multiple of 4 (the partial
/// rows are 16-byte aligned: the workspace is, and `D * 4` and `lane * N * 4` are multiples of 16).
#[inline(always)]
unsafe fn ld_cg_row<const N: usize>(src: *const f32) -> [f32; N] {
    let mut v = [0f32; N];
    if N % 4 == 0 {
        for j in 0..N / 4 {
            let q = unsafe { ld_cg_v4_f32(src.add(4 * j)) };
            v[4 * j..4 * j + 4].copy_from_slice(&q);
        }
    } else {
        for i in 0..N {
            v[i] = unsafe { ld_cg_f32(src.add(i)) };
        }
    }
    v
}
