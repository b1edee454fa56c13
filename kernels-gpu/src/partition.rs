//! Length-aware split of the requests into chunks, computed on the device by every CTA.
//!
//! The host fixes only `num_chunks`, the items per head block the partition may use; the lengths
//! live on the device, so every CTA derives the same partition from the page table (the
//! arithmetic is in [`crate::chunking`]):
//! - the chunk size `C` is a multiple of 16 tokens, at least `min_chunk`, `ceil(longest /
//!   MAX_CHUNKS_PER_REQUEST)`, a wave's share `total / balance_items` (when set) and
//!   `preferred_chunk` (unless that leaves fewer than half the items busy), near the smallest for
//!   which `Σ_b n_b ≤ num_chunks`;
//! - request `b` owns the consecutive items `[first_b, first_b + n_b)`, `n_b = max(1,
//!   ceil(len_b / C))` (an empty request still owns one item, which writes its empty output),
//!   or `n_b = 1` when `len_b ≤ unsplit_max_tokens` (two tiles: its merge would cost more than
//!   it saves);
//! - CTA `x` along the grid's chunk dimension (see [`cta_coords`]) takes item `x`: tokens
//!   `[(x - first_b)·C, …)` of request `b`, the last item to the request's end; CTAs past the
//!   last item do no work and exit after `griddepcontrol.wait`. The host launches only as many
//!   as the page table's slots can fill ([`crate::chunking::max_items`]), and when a corrupt
//!   `indptr` claims more tokens than that, every CTA exits.
//!
//! Long requests thus get more chunks than short ones, so the longest request no longer sets
//! the kernel's time; with equal lengths `L` and `num_chunks = batch · s`, every request gets
//! `s` chunks of `ceil(L / s)` tokens rounded up to 16 (fewer when those would be shorter than
//! `preferred_chunk`). The partition reads only `indptr` and `last_page_len`, so it runs before
//! `griddepcontrol.wait` when the caller promised that the previous kernel does not write them
//! ([`wait_unless_page_table_stable`]); without the promise, the guessing entries run it before
//! the wait as a guess and confirm it after ([`find_chunk_guessing`]).
//!
//! With a sliding window (`p.window_left`), a request's length in all of the above is the tokens
//! it attends to ([`attended`]) and its chunks start at its window's first token
//! ([`window_start`]), so tokens before the window are neither partitioned nor read.
//!
//! Every warp computes the whole partition on its own (lanes own contiguous runs of
//! `ceil(batch / 32)` requests, held in registers up to `LENS_PER_LANE`), with shuffles only:
//! no shared memory and no barrier. When no request is longer than the lower bound on `C`, item
//! `x` is request `x` and the search is skipped: one pass over the page table. When none is
//! longer than `min_chunk` or `unsplit_max_tokens`, the bounds on `C` (64-bit divisions) are
//! skipped too: a batch of short requests finds its items in the time of the pass and the
//! shuffles. A batch of one request needs neither search nor shuffles.

use crate::chunking::{chunk_bounds, chunk_size, request_chunks, round16};
use crate::intrinsics::*;
use crate::params::{DecodeParams, PARTITION_CACHED_BATCH};
use crate::variant::{attended, window_start};

/// Requests whose page-table entries a lane keeps in registers, all loaded at once; larger
/// batches re-read them on every pass.
const LENS_PER_LANE: usize = (PARTITION_CACHED_BATCH / 32) as usize;
/// The same in a guessed partition ([`find_chunk_guessing`]), which must read every entry once
/// to be confirmed: the per-CTA partition's batches of up to 64 requests
/// (`PER_CTA_PARTITION_MAX_BATCH`). sm_90 only, where no code bound is near.
const GUESS_LENS_PER_LANE: usize = 2;
const _: () = assert!(LENS_PER_LANE <= GUESS_LENS_PER_LANE);

/// A chunk: the token range `[begin, end)` of request `request` that one CTA processes (per KV
/// head and head block). Its *item* is its index in the partition, `0..num_chunks`.
pub struct Chunk {
    pub request: u32,
    pub begin: u32,
    pub end: u32,
    /// The request's first slot in `indices`, and its page count.
    pub first_index: u32,
    pub num_pages: u32,
    /// The item of the request's first chunk, and the request's number of chunks; 1: this chunk
    /// is the whole request and writes `o` directly.
    pub first_item: u32,
    pub request_chunks: u32,
}

impl Chunk {
    /// No tokens of request 0.
    pub const EMPTY: Chunk = Chunk {
        request: 0,
        begin: 0,
        end: 0,
        first_index: 0,
        num_pages: 0,
        first_item: 0,
        request_chunks: 1,
    };

    /// The chunk of item `item` of request `request` (`pages` as [`request_pages`] gives them),
    /// whose `request_chunks` chunks of `chunk_tokens` tokens (the last one to its end) of its
    /// window are the items from `first_item`.
    #[inline(always)]
    fn of_item(
        p: &DecodeParams,
        request: u32,
        pages: (u32, u32, u32),
        first_item: u32,
        request_chunks: u32,
        chunk_tokens: u32,
        item: u32,
    ) -> Self {
        let (first_index, num_pages, len) = pages;
        let skip = window_start(p, len);
        let begin = ((item - first_item) as u64 * chunk_tokens as u64).min((len - skip) as u64) as u32 + skip;
        // A request's last chunk runs to its end: a request kept whole (`request_chunks`) may be
        // longer than `chunk_tokens`.
        let last = item - first_item + 1 >= request_chunks;
        let end = if last { len } else { begin.saturating_add(chunk_tokens).min(len) };
        Chunk { request, begin, end, first_index, num_pages, first_item, request_chunks }
    }
}

/// Pages of request `b`: (first index slot, page count, tokens). `indptr` and `last_page_len`
/// are clamped into range, so a corrupt page table yields garbage lengths, never a bad access.
#[inline(always)]
pub unsafe fn request_pages(p: &DecodeParams, b: u32) -> (u32, u32, u32) {
    unsafe { request_pages_read::<false>(p, b) }
}

/// A page-table entry, through L2 only (`ld.global.cg`) when `THROUGH_L2`, else read-only
/// (`ld.global.nc`).
#[inline(always)]
unsafe fn load_table_entry<const THROUGH_L2: bool>(ptr: *const i32) -> i32 {
    if THROUGH_L2 { unsafe { ld_cg_i32(ptr) } } else { unsafe { ld_nc_i32(ptr) } }
}

/// [`request_pages`], each entry read by [`load_table_entry`].
#[inline(always)]
unsafe fn request_pages_read<const THROUGH_L2: bool>(p: &DecodeParams, b: u32) -> (u32, u32, u32) {
    let indptr = p.indptr as *const i32;
    let clamp = |v: i32| (v.max(0) as u32).min(p.num_indices);
    let start = clamp(unsafe { load_table_entry::<THROUGH_L2>(indptr.add(b as usize)) });
    let stop = clamp(unsafe { load_table_entry::<THROUGH_L2>(indptr.add(b as usize + 1)) }).max(start);
    let num_pages = stop - start;
    let last = unsafe { load_table_entry::<THROUGH_L2>((p.last_page_len as *const i32).add(b as usize)) };
    let last = (last.max(0) as u32).min(p.page_size);
    let len =
        if num_pages == 0 { 0 } else { (num_pages - 1).saturating_mul(p.page_size).saturating_add(last) };
    (start, num_pages, len)
}

/// Request `b` (its window) as a single chunk (the unsplit kernels: item = request).
#[inline(always)]
pub unsafe fn whole_request(p: &DecodeParams, b: u32) -> Chunk {
    unsafe { whole_request_read::<false>(p, b) }
}

/// [`whole_request`], its page table read through L2 only: a read before `griddepcontrol.wait`
/// of lines the previous kernel may write must leave nothing in L1 that a read after the wait
/// could hit.
#[inline(always)]
pub unsafe fn whole_request_through_l2(p: &DecodeParams, b: u32) -> Chunk {
    unsafe { whole_request_read::<true>(p, b) }
}

/// [`whole_request`], each page-table entry read by [`load_table_entry`].
#[inline(always)]
unsafe fn whole_request_read<const THROUGH_L2: bool>(p: &DecodeParams, b: u32) -> Chunk {
    let (first_index, num_pages, len) = unsafe { request_pages_read::<THROUGH_L2>(p, b) };
    let begin = window_start(p, len);
    Chunk { request: b, begin, end: len, first_index, num_pages, first_item: b, request_chunks: 1 }
}

/// [`whole_request_read`], its entries (its end is its length) recorded as the chunk's request's
/// in `inputs`.
#[inline(always)]
unsafe fn whole_request_recorded<const THROUGH_L2: bool>(
    p: &DecodeParams,
    b: u32,
    inputs: &mut PartitionInputs,
) -> Chunk {
    let chunk = unsafe { whole_request_read::<THROUGH_L2>(p, b) };
    inputs.request_pages = (chunk.first_index, chunk.num_pages, chunk.end);
    chunk
}

/// `(item, head block, head blocks)` of this CTA. Items run along grid x and head blocks along y
/// (consecutive CTAs: consecutive chunks of one head block), except for split kernels with
/// `p.heads_along_x`, whose consecutive CTAs cover the head blocks of one chunk.
#[inline(always)]
pub fn cta_coords<const SPLIT: bool>(p: &DecodeParams) -> (u32, u32, u32) {
    let (x, y, _) = block_idx();
    if SPLIT && p.heads_along_x != 0 { (y, x, grid_dim_x()) } else { (x, y, grid_dim_y()) }
}

/// Runs `$body` with `$b` and `$entry = (first index, pages, tokens)` bound for each of this
/// lane's requests, in order (from registers when they fit there, else read again as the
/// caller's `THROUGH_L2` says).
macro_rules! each_request {
    ($ctx:expr, |$b:ident, $entry:pat_param| $body:expr) => {{
        let (p, pages, first, count, cached, lens_per_lane) = $ctx;
        if cached {
            for k in 0..lens_per_lane {
                if (k as u32) < count {
                    let $b = first + k as u32;
                    let $entry = pages[k];
                    $body;
                }
            }
        } else {
            for $b in first..first + count {
                let $entry = unsafe { request_pages_read::<THROUGH_L2>(p, $b) };
                $body;
            }
        }
    }};
}

/// Without the caller's promise that the kernel before this launch leaves the page table alone
/// (`p.early_page_table == 0`), waits for that kernel, so that no read of the page table comes
/// before it. The decode and schedule kernels call this first; their later waits then return at
/// once.
#[inline(always)]
pub fn wait_unless_page_table_stable(p: &DecodeParams) {
    if p.early_page_table == 0 {
        grid_dependency_wait();
    }
}

/// The chunk of item `item` under the partition above, or `None` past the last item (the same
/// in every lane and warp).
#[inline(always)]
pub unsafe fn find_chunk(p: &DecodeParams, item: u32) -> Option<Chunk> {
    let mut unrecorded = PartitionInputs::NONE;
    unsafe { find_chunk_read::<false>(p, item, &mut unrecorded) }
}

/// A partition's page-table entries (first index, pages, tokens), as one lane read them: its
/// own requests' and its chunk's request's. When the partition read each entry once (a batch
/// of one request, or of at most `GUESS_LENS_PER_LANE` requests per lane in a guess), the chunk
/// is a function of the lanes' entries and its request's alone, so that reading them again
/// after `griddepcontrol.wait` confirms a chunk guessed before it.
pub struct PartitionInputs {
    lane_pages: [(u32, u32, u32); GUESS_LENS_PER_LANE],
    request_pages: (u32, u32, u32),
    read_once: bool,
}

impl PartitionInputs {
    /// Nothing recorded (and nothing to confirm).
    const NONE: PartitionInputs = PartitionInputs {
        lane_pages: [(0, 0, 0); GUESS_LENS_PER_LANE],
        request_pages: (0, 0, 0),
        read_once: false,
    };

    /// Whether the page table holds this lane's recorded entries, and those of `chunk`'s request
    /// (the chunk found from these inputs), as this thread reads them now. False when the
    /// partition read some entry more than once.
    #[inline(always)]
    unsafe fn still_hold(&self, p: &DecodeParams, chunk: Option<&Chunk>) -> bool {
        if !self.read_once {
            return false;
        }
        let (first, count) = lane_requests(p);
        let mut same = true;
        for (k, &entry) in self.lane_pages.iter().enumerate() {
            if (k as u32) < count {
                same &= unsafe { request_pages(p, first + k as u32) } == entry;
            }
        }
        // The chunk's request's entries; a batch of one request is every thread's own read, so
        // every thread checks it, found or not.
        if let Some(request) = chunk.map(|c| c.request).or((p.batch == 1).then_some(0)) {
            same &= unsafe { request_pages(p, request) } == self.request_pages;
        }
        same
    }
}

/// [`find_chunk`] in a launch whose previous kernel may still write the page table (no
/// promise): the partition is guessed before `griddepcontrol.wait` from entries read through L2
/// only (so that no line of them stays in L1 for a read after the wait to hit), and after the
/// wait each thread reads the entries it was derived from again. When they all hold (the CTA
/// agrees through a barrier), the guess is the partition of the table the previous kernel left;
/// otherwise the same code runs again on that table. Either way every value the chunk depends on
/// was read after the wait, which has returned.
///
/// The caller's first reads for its chunk go beside the confirming ones: right after the wait,
/// `load` runs on this thread's chunk (its value kept in `staged`), then the confirming loads
/// are issued, then `park` takes the chunk and `load`'s value (to shared memory), and the
/// CTA's vote on the confirmation is also the barrier after `park`. So after the wait one round
/// trip and one barrier are left before the caller's next step, as with the promise; a changed
/// table runs `load` and `park` again for the new chunk (after the vote, so no thread still
/// reads what they replace), then a barrier. A thread with no chunk runs neither.
///
/// # Safety
/// As [`find_chunk`]; every thread of the CTA calls it (it holds barriers). `load` reads the
/// page table only within the chunk's pages as clamped here (`first_index + num_pages ≤
/// p.num_indices`), since a guess's chunk may be of no partition (a table being written), and
/// what it reads is used only by `park`; `park` writes only this thread's shared memory that no
/// thread reads before this function returns; neither holds a barrier.
#[inline(always)]
pub unsafe fn find_chunk_guessing<T: Copy>(
    p: &DecodeParams,
    item: u32,
    staged: &mut T,
    mut load: impl FnMut(&Chunk) -> T,
    mut park: impl FnMut(&Chunk, T),
) -> Option<Chunk> {
    let mut waited = false;
    loop {
        let mut inputs = PartitionInputs::NONE;
        let chunk = unsafe { find_chunk_read::<true>(p, item, &mut inputs) };
        if !waited {
            grid_dependency_wait();
        }
        if let Some(c) = &chunk {
            *staged = load(c);
        }
        // Read after the wait already on a second pass, and with the schedule kernel's map
        // (nothing guessed: `find_chunk_read` waits before it reads the map).
        let holds = waited || p.item_map != 0 || unsafe { inputs.still_hold(p, chunk.as_ref()) };
        if let Some(c) = &chunk {
            park(c, *staged);
        }
        if !sync_threads_or(!holds) {
            return chunk;
        }
        // Opaque, so that LLVM keeps one copy of the partition in the loop rather than two.
        waited = opaque_u32(1) != 0;
    }
}

/// This lane's requests: `(first, count)`, lanes owning contiguous runs of `ceil(batch / 32)`.
#[inline(always)]
fn lane_requests(p: &DecodeParams) -> (u32, u32) {
    let lane = thread_idx() % 32;
    let per_lane = p.batch.div_ceil(32);
    let first = lane.saturating_mul(per_lane).min(p.batch);
    (first, first.saturating_add(per_lane).min(p.batch) - first)
}

/// [`find_chunk`], each page-table entry read by [`load_table_entry`] and recorded in `inputs`.
#[inline(always)]
unsafe fn find_chunk_read<const THROUGH_L2: bool>(
    p: &DecodeParams,
    item: u32,
    inputs: &mut PartitionInputs,
) -> Option<Chunk> {
    if p.item_map != 0 {
        // The schedule kernel wrote the map; it is visible once that grid is done.
        grid_dependency_wait();
        return unsafe { mapped_chunk(p, item) };
    }
    if p.batch == 1 {
        let pages = unsafe { request_pages_read::<THROUGH_L2>(p, 0) };
        *inputs = PartitionInputs {
            lane_pages: [pages; GUESS_LENS_PER_LANE],
            request_pages: pages,
            read_once: true,
        };
        return single_request_chunk(p, pages, item);
    }
    let lane = thread_idx() % 32;
    let per_lane = p.batch.div_ceil(32);
    let (first, count) = lane_requests(p);
    // A guess caches more entries per lane, so that it reads each once.
    let lens_per_lane = if THROUGH_L2 { GUESS_LENS_PER_LANE } else { LENS_PER_LANE };
    let cached = per_lane as usize <= lens_per_lane;
    let mut pages = [(0u32, 0u32, 0u32); GUESS_LENS_PER_LANE];
    if cached {
        for (k, entry) in pages.iter_mut().enumerate() {
            if k < lens_per_lane && (k as u32) < count {
                *entry = unsafe { request_pages_read::<THROUGH_L2>(p, first + k as u32) };
            }
        }
    }
    inputs.lane_pages = pages;
    inputs.read_once = cached;
    // Total tokens and the longest request.
    let mut total = 0u64;
    let mut longest = 0u32;
    let lane_requests = (p, &pages, first, count, cached, lens_per_lane);
    each_request!(lane_requests, |_b, (_, _, len)| {
        let len = attended(p, len);
        total += len as u64;
        longest = longest.max(len)
    });
    for step in 0..5 {
        let m = 16 >> step;
        let lo = shfl_xor_u32(total as u32, m) as u64;
        let hi = shfl_xor_u32((total >> 32) as u32, m) as u64;
        total += lo | (hi << 32);
        longest = longest.max(shfl_xor_u32(longest, m));
    }
    if total > p.num_indices as u64 * p.page_size as u64 {
        // Only overlapping requests (a corrupt `indptr`) hold more tokens than the page table
        // has slots; the grid is sized for that capacity ([`crate::chunking::max_items`]), so no
        // CTA takes an item, and no arrival counter is left behind.
        return None;
    }

    // Every request within one chunk of the smallest size (`chunk_bounds`' `lo` is at least
    // `min_chunk`) or kept whole by `request_chunks`: item = request, as the partition below
    // would find, without its divisions.
    if longest <= round16(p.min_chunk as u64).max(p.unsplit_max_tokens) {
        return (item < p.batch).then(|| unsafe { whole_request_recorded::<THROUGH_L2>(p, item, inputs) });
    }

    // Items needed with chunk size `c`.
    let items_with = |c: u32| {
        let mut n = 0u32;
        each_request!(lane_requests, |_b, (_, _, len)| n +=
            request_chunks(attended(p, len), c, p.unsplit_max_tokens));
        warp_sum_u32(n)
    };
    let (lo, hi) =
        chunk_bounds(total, longest, p.batch, p.num_chunks, p.min_chunk, p.preferred_chunk, p.balance_items);
    if longest <= lo {
        // Every request fits one chunk of `lo` (which fits the grid): item = request.
        return (item < p.batch).then(|| unsafe { whole_request_recorded::<THROUGH_L2>(p, item, inputs) });
    }
    let chunk_tokens = chunk_size(lo, hi, |c| items_with(c) <= p.num_chunks);

    // Prefix sum of the items over the lanes' request runs; the lane holding `item` broadcasts it.
    let mut mine = 0u32;
    each_request!(lane_requests, |_b, (_, _, len)| mine +=
        request_chunks(attended(p, len), chunk_tokens, p.unsplit_max_tokens));
    let mut inclusive = mine;
    for step in 0..5 {
        let d = 1 << step;
        let v = shfl_up_u32(inclusive, d);
        if lane >= d {
            inclusive += v;
        }
    }
    if item >= shfl_idx_u32(inclusive, 31) {
        return None;
    }
    let mut before = inclusive - mine;
    let mut found = [0u32; 6];
    each_request!(lane_requests, |b, (first_index, num_pages, len)| {
        let n = request_chunks(attended(p, len), chunk_tokens, p.unsplit_max_tokens);
        if item >= before && item - before < n {
            found = [b, before, n, first_index, num_pages, len];
        }
        before += n
    });
    let src = ballot_sync(inclusive > item && inclusive - mine <= item).trailing_zeros();
    let [request, first_item, request_chunks, first_index, num_pages, len] =
        found.map(|v| shfl_idx_u32(v, src));
    inputs.request_pages = (first_index, num_pages, len);
    Some(Chunk::of_item(
        p,
        request,
        (first_index, num_pages, len),
        first_item,
        request_chunks,
        chunk_tokens,
        item,
    ))
}

/// [`find_chunk`] for a batch of one request (`pages` its entries), without shuffles: `lo` always
/// fits (it is at least `len / num_chunks`), so the chunk size is `lo` and the request owns items
/// `[0, ceil(len / lo))`.
#[inline(always)]
fn single_request_chunk(p: &DecodeParams, pages: (u32, u32, u32), item: u32) -> Option<Chunk> {
    let (first_index, num_pages, len) = pages;
    let n = attended(p, len);
    let (chunk_tokens, _) =
        chunk_bounds(n as u64, n, 1, p.num_chunks, p.min_chunk, p.preferred_chunk, p.balance_items);
    let chunks = request_chunks(n, chunk_tokens, p.unsplit_max_tokens);
    if item >= chunks {
        return None;
    }
    Some(Chunk::of_item(p, 0, (first_index, num_pages, len), 0, chunks, chunk_tokens, item))
}

/// The chunk of item `item` from the item map the schedule kernel wrote ([`crate::schedule`]),
/// or `None` past the last item. The request is clamped into the batch; its chunk count follows
/// from its length exactly as in the schedule kernel, so every CTA of a request agrees on it.
#[inline(always)]
pub unsafe fn mapped_chunk(p: &DecodeParams, item: u32) -> Option<Chunk> {
    let map = p.item_map as *const u32;
    let (items, chunk_tokens) = unsafe { (ld_cg_u32(map), ld_cg_u32(map.add(1))) };
    if item >= items.min(p.num_chunks) {
        return None;
    }
    if chunk_tokens == 0 {
        return (item < p.batch).then(|| unsafe { whole_request(p, item) });
    }
    let pair = unsafe { map.add(2 + 2 * item as usize) };
    let request = unsafe { ld_cg_u32(pair) }.min(p.batch - 1);
    let first_item = unsafe { ld_cg_u32(pair.add(1)) }.min(item);
    let pages = unsafe { request_pages(p, request) };
    // At most the items left: partial rows stay inside the workspace whatever the map holds.
    let chunks = request_chunks(attended(p, pages.2), chunk_tokens, p.unsplit_max_tokens)
        .min(items.min(p.num_chunks) - first_item);
    Some(Chunk::of_item(p, request, pages, first_item, chunks, chunk_tokens, item))
}
