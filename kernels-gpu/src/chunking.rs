//! Chunk-size arithmetic of the length-aware split ([`crate::partition`]): pure integer
//! functions, shared verbatim by the device partition and the host's tests (the host includes
//! this file), so the bounds the partition relies on are checked on the CPU too.

use crate::params::MAX_CHUNKS_PER_REQUEST;

/// Bisection steps between the bounds on the chunk size (each a pass over the lengths).
pub const BISECTION_STEPS: u32 = 3;

/// Chunks of `chunk_tokens` tokens a request of `len` tokens is split into, `max(1, ceil(len /
/// chunk_tokens))`, without an integer division: an f32 estimate, then corrected. The estimate
/// truncates a quotient within a few f32 roundings of `len / chunk_tokens`, so it is within one
/// of the floor while the quotient stays far below 2^21 (the partition never asks for more than
/// [`MAX_CHUNKS_PER_REQUEST`]): the ceiling is at most two above it (a quotient just above an
/// integer estimated just below it: 4 289 146 248 tokens in chunks of 2 144 573 120 give 1) or
/// one below; `chunk_tokens ≥ 1`.
#[inline(always)]
pub fn chunks_of(len: u32, chunk_tokens: u32) -> u32 {
    let covers = |n: u32| n as u64 * chunk_tokens as u64 >= len as u64;
    let mut n = (len as f32 * (1.0 / chunk_tokens as f32)) as u32;
    if !covers(n) {
        n += 1;
        if !covers(n) {
            n += 1;
        }
    } else if n > 0 && covers(n - 1) {
        n -= 1;
    }
    n.max(1)
}

/// Chunks a request of `len` tokens takes with chunk size `chunk_tokens`: one when it holds at
/// most `unsplit_max_tokens` (two pipeline tiles of the tensor-core kernel: a merge would cost
/// it more than the shorter chunks save; 0 for the f32 kernel), else [`chunks_of`]. Never more
/// than `chunks_of`, and non-increasing in `chunk_tokens`, so every bound below still holds.
#[inline(always)]
pub fn request_chunks(len: u32, chunk_tokens: u32, unsplit_max_tokens: u32) -> u32 {
    if len <= unsplit_max_tokens { 1 } else { chunks_of(len, chunk_tokens) }
}

/// `x` rounded up to a multiple of 16 tokens (saturating below `u32::MAX`).
#[inline(always)]
pub fn round16(x: u64) -> u32 {
    x.min(u32::MAX as u64 - 15).next_multiple_of(16) as u32
}

/// Bounds `(lo, hi)` on the chunk size for `batch` requests of `total` tokens, the longest
/// `longest`, split into at most `num_chunks ≥ batch` chunks; both are multiples of 16 and
/// `lo ≤ hi`. `hi` always fits (`Σ max(1, ceil(len / hi)) ≤ num_chunks`); `lo` is at least the
/// average chunk, `min_chunk`, `longest / MAX_CHUNKS_PER_REQUEST`, `total / balance_items` (when
/// `balance_items > 0`: a wave's share, so equal lengths over several waves stay whole) and
/// `preferred_chunk` (the last unless that leaves fewer than half the chunks busy).
#[inline(always)]
pub fn chunk_bounds(
    total: u64,
    longest: u32,
    batch: u32,
    num_chunks: u32,
    min_chunk: u32,
    preferred_chunk: u32,
    balance_items: u32,
) -> (u32, u32) {
    let balanced = if balance_items > 0 { round16(total.div_ceil(balance_items as u64)) } else { 0 };
    let lo = round16(total.div_ceil(num_chunks as u64))
        .max(balanced)
        .max(round16(longest.div_ceil(MAX_CHUNKS_PER_REQUEST) as u64))
        .max(round16(min_chunk as u64))
        .max(round16(preferred_chunk as u64).min(round16(total.div_ceil((num_chunks / 2).max(1) as u64))));
    // `k = num_chunks / batch` chunks for the longest request, so at most `k` for every request.
    let per_request = (num_chunks / batch.max(1)).max(1);
    let mut hi = round16(longest.div_ceil(per_request) as u64);
    if num_chunks > batch {
        // Σ max(1, ceil(len / c)) ≤ total / c + batch ≤ num_chunks for c ≥ total / (num_chunks - batch).
        hi = hi.min(round16(total.div_ceil((num_chunks - batch) as u64)));
    }
    (lo, hi.max(lo))
}

/// The chunk size: `lo` if it fits, else a few bisection steps towards it from `hi` (which
/// fits); `fits(c)` says whether chunk size `c` needs at most `num_chunks` chunks.
#[inline(always)]
pub fn chunk_size(lo: u32, hi: u32, mut fits: impl FnMut(u32) -> bool) -> u32 {
    if fits(lo) {
        lo
    } else {
        let (mut lo, mut hi) = (lo, hi);
        for _ in 0..BISECTION_STEPS {
            if hi - lo <= 16 {
                break;
            }
            let mid = lo + ((hi - lo) / 2) / 16 * 16;
            if fits(mid) {
                hi = mid;
            } else {
                lo = mid;
            }
        }
        hi
    }
}

/// Most items the partition can produce for `batch` requests holding at most `token_capacity`
/// tokens together (the page table's `num_indices × page_size`), with the parameters of
/// [`chunk_bounds`]; at most `num_chunks`. The host launches this many CTAs per head block, so a
/// short batch in a one-wave grid starts no CTA that would only find no chunk.
///
/// Every chunk `C ≥ lo` is at least `min_chunk`, `total / num_chunks`, `total / balance_items`
/// and either `preferred_chunk` or `total / (num_chunks / 2)` (16 tokens in any case), which
/// bounds `total / C` by `q`; then `Σ max(1, ceil(len_b / C)) ≤ batch + floor(q)`, and a single
/// request takes `max(1, ceil(q))`.
pub fn max_items(
    batch: u32,
    num_chunks: u32,
    token_capacity: u64,
    min_chunk: u32,
    preferred_chunk: u32,
    balance_items: u32,
) -> u32 {
    let per = |chunk_tokens: u32| {
        let chunk_tokens = round16(chunk_tokens as u64).max(16) as u64;
        if batch == 1 { token_capacity.div_ceil(chunk_tokens) } else { token_capacity / chunk_tokens }
    };
    let mut q = per(min_chunk).min(per(preferred_chunk).max((num_chunks / 2).max(1) as u64));
    if balance_items > 0 {
        q = q.min(balance_items as u64);
    }
    let items = if batch == 1 { q.max(1) } else { batch as u64 + q };
    items.min(num_chunks as u64) as u32
}
