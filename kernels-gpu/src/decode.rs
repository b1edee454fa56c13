//! Batched paged-KV decode attention.
//!
//! Data layout
//! - `q`, `o`: `[batch, num_qo_heads, D]`; `lse`: `[batch, num_qo_heads]` (base 2).
//! - `k_data`, `v_data`: `[pages, num_kv_heads, page_size, D]` views with the page, head and token
//!   strides of the parameters (HND, NHD, K and V interleaved per page, pages of a shared pool;
//!   see `page_row`). Token `t` of request `b` lives in page `indices[indptr[b] + t / page_size]`,
//!   slot `t % page_size`.
//! - K/V cache formats ([`crate::cache`]): elements of the MMA's 16-bit type, read by `ldmatrix`,
//!   or 8-bit codes (E4M3 / E5M2 with q and o in f16 or bf16), dequantized to f16 in registers
//!   with the fragment layout of [`crate::fp8_operands`]: half the bytes per tile at the same
//!   tokens, four stages, and the dequantization scales on the logits and the output.
//! - Attention variants ([`crate::variant`]): the logits' form is a type parameter ([`Logits`]:
//!   plain or soft-capped), the sliding window shapes the chunks, and attention sinks join the
//!   finished rows.
//! - Request length: `(pages - 1) * page_size + last_page_len[b]`, 0 when it owns no page.
//!
//! Vocabulary: a *chunk* ([`Chunk`]) is a token range of one request that one CTA processes;
//! its *item* is its index in the partition of the batch, `0..num_chunks`.
//!
//! Parallelisation
//! - Grid `(items, num_kv_heads * head_blocks)` (split kernels may swap the two, see
//!   [`cta_coords`]; `batch` items unsplit, at most `num_chunks` split). One CTA of 4 warps owns
//!   one (chunk, KV head, block of ≤ 64 query heads of its GQA group (32 for D = 256)). Unsplit,
//!   item `x` is the whole request `x`; split, every CTA derives the same length-aware partition
//!   of the requests into at most `num_chunks` chunks from the page table
//!   ([`crate::partition`]). Every K/V byte of the chunk is read from HBM once and shared by all
//!   query heads of the block.
//! - Stacked KV heads (lean tilings, very short requests): a CTA may cover `1 << stack_shift`
//!   consecutive KV heads of its request, their query heads packed into one 16-row query tile.
//!   Its tiles hold 16-token segments of several heads (as many as a tile has room for, see
//!   `KvPipeline`) and run token-major; each 16-token block's scores are masked to the rows of
//!   the block's head. So one CTA carries several (request, KV head) pairs through one pipeline
//!   and pays its start-up and epilogue once, and a 16-token request fills its tiles. The
//!   16-bit lean entries have the stack count as a constant (one entry per count, `STACK`).
//! - K/V tiles stream global → shared through a `cp.async` pipeline under an L2 evict-first
//!   policy (each byte is read once): the standard tiling's of 16 KB (8192 / D tokens) in 3
//!   stages (8-bit codes: 8 KB in 4 stages), the lean tiling's of 8 KB (4096 / D tokens; 8-bit:
//!   4 KB) in 3 stages. Page ids of the next tile are resolved one iteration ahead, one thread
//!   per row, into a shared ring (`KvPipeline`); those of the first tiles are all loaded before
//!   any is resolved (but in the 8-bit cache's unguessed entries), so that their loads are one
//!   round trip.
//!   Query heads are packed into 16-row MMA tiles; `S = Q·Kᵀ` and `O += P·V` run on tensor cores
//!   (`mma.m16n8k16`, f32 accumulation) with an online softmax in the exp2 domain.
//! - Warps split the 16-row query tiles, the tile's 16-token blocks and (for D = 256) the output
//!   columns between them; their partial (m, l, O) are combined through shared memory at the end.
//!   In the lean tilings, when all blocks of each query row went to one warp phase (segments of
//!   one 16-token block, or at most one block per head), that phase's warps write the rows from
//!   their fragments instead ([`OwnRows`]).
//! - A request split into several chunks has each CTA write a partial (O, lse) to the workspace,
//!   and the CTA of its (request, KV head, head block) that drew the last arrival ticket at the
//!   end of its main loop combines them once the others have published theirs
//!   ([`finish_split`]); a request in one chunk is written to `o` and `lse` directly. One launch
//!   either way.
//! - Programmatic dependent launch (sm_90 build): a CTA can start while the previous kernel in
//!   the stream finishes. It waits for that kernel (`griddepcontrol.wait`) before any read,
//!   unless the caller promised that kernel does not write the page table
//!   (`p.early_page_table`): then the CTA reads the page table first (chunk bounds, the first
//!   tiles' page rows) and, in the first wave, prefetches its first tiles into L2. Without the
//!   promise, the guessing entries (`GUESS`; the host launches them when the grid has at most
//!   one CTA per SM, split ones up to one and a half waves) read the same lookup before the wait
//!   as a guess, through L2 only. Those of whole requests issue the first copies from it right
//!   after the wait and confirm it by reading it again; a changed lookup restarts the first
//!   tiles from the confirmed values. Those of split chunks (16-bit caches) guess the partition
//!   and confirm it right after the wait by reading its entries again, beside the loads of the
//!   chunk's first page ids, which are parked before the CTA's vote on the guess
//!   ([`crate::partition::find_chunk_guessing`]); their first copies go under the default L2
//!   policy. Q, K/V and every write come after the wait either way. The dependents' launch is
//!   allowed right after the wait. A CTA that finds no chunk also ends only after the wait, so
//!   that its slot is not taken by the next launch while this kernel's CTAs still run, and so
//!   that the grid never completes before the kernel it depends on.
//! - Page ids and `indptr` are clamped into their arrays, so a corrupt page table yields
//!   unspecified values but never an out-of-bounds access.

use core::marker::PhantomData;

use crate::cache::KvCache;
use crate::element::{Elem, MmaElem};
use crate::fp8_operands as fp8;
use crate::intrinsics::*;
use crate::merge::{draw_ticket, finish_split, partial_row};
use crate::params::{
    ANY_STACK_SHIFT, DECODE_THREADS, DecodeParams, LEAN_EPILOGUE_BYTES, MAX_STAGES, MmaTiling,
    STACKED_MAX_HEADS, WarpRoles, fp8_lean_tiling, fp8_tiling, lean_tiling, stacked_head_of_row,
    standard_tiling,
};
use crate::partition::{
    Chunk, cta_coords, find_chunk, find_chunk_guessing, wait_unless_page_table_stable, whole_request,
    whole_request_through_l2,
};
use crate::variant::{Logits, with_sink};

pub(crate) const WARPS: u32 = DECODE_THREADS / 32;

/// A tiling of [`decode_mma`] as a type, so that its numbers are constants of each entry.
pub trait Tiling {
    const T: MmaTiling;

    /// Rows of K/V tile `tile` (of [`MmaTiling::tile_tokens`] rows) inside the tokens
    /// `[begin, end)`. Left to LLVM's inliner (it is not `#[inline(always)]` and is called through
    /// the type), which the shipped PTX depends on.
    fn tile_rows(begin: u32, end: u32, tile: u32) -> u32 {
        let tile_tokens = Self::T.tile_tokens;
        (end - begin).saturating_sub(tile * tile_tokens).min(tile_tokens)
    }
}
/// [`standard_tiling`] for head_dim `D`.
pub struct Standard<const D: u32>;
impl<const D: u32> Tiling for Standard<D> {
    const T: MmaTiling = standard_tiling(D);
}
/// [`lean_tiling`] for head_dim `D`.
pub struct Lean<const D: u32>;
impl<const D: u32> Tiling for Lean<D> {
    const T: MmaTiling = lean_tiling(D);
}
/// [`fp8_lean_tiling`] for head_dim `D`.
pub struct Fp8Lean<const D: u32>;
impl<const D: u32> Tiling for Fp8Lean<D> {
    const T: MmaTiling = fp8_lean_tiling(D);
}
/// [`fp8_tiling`] for head_dim `D`.
pub struct Fp8Standard<const D: u32>;
impl<const D: u32> Tiling for Fp8Standard<D> {
    const T: MmaTiling = fp8_tiling(D);
}

/// Slot in `indices` of the page holding token `t` of chunk `c`'s request (clamped into the
/// request's pages), and the token's position in that page.
#[inline(always)]
fn page_slot(p: &DecodeParams, c: &Chunk, t: u32) -> (u32, u32) {
    let slot = if p.page_shift != u32::MAX { t >> p.page_shift } else { t / p.page_size };
    (c.first_index + slot.min(c.num_pages - 1), t - slot * p.page_size)
}

/// Offset, in 16-byte units, of the row of position `in_page` of page `page` for KV head `h` in
/// the K/V views (their strides); the page id is clamped into the store.
#[inline(always)]
fn page_row(p: &DecodeParams, page: i32, h: u32, in_page: u32) -> u32 {
    let page = (page.max(0) as u32).min(p.num_total_pages - 1);
    page * p.kv_page_stride + h * p.kv_head_stride + in_page * p.kv_token_stride
}

/// Row offset (16-byte units) of token `t` of chunk `c`'s request for KV head `h`.
#[inline(always)]
unsafe fn token_row(p: &DecodeParams, c: &Chunk, h: u32, t: u32) -> u32 {
    let (idx, in_page) = page_slot(p, c, t);
    page_row(p, unsafe { ld_nc_i32((p.indices as *const i32).add(idx as usize)) }, h, in_page)
}

/// Byte offset of 16-byte column `c` of row `r` in a `[rows][D]` 16-bit tile, XOR-swizzled so
/// that `ldmatrix` over 8 consecutive rows hits 8 distinct bank groups.
#[inline(always)]
fn swizzle<const D: u32>(r: u32, c: u32) -> u32 {
    r * D * 2 + ((c ^ (r & 7)) << 4)
}

/// [`swizzle`] of column `8·high + 2·low + bit` (`low < 4`, `bit < 2`) in row `r`: the XOR
/// changes only the column's low three bits, so every `high` shares the row's four offsets
/// `(2·low ^ bit ^ (r & 7)) << 4`. The lean entries, capped at 128 registers, keep those four
/// live across the loop instead of one per column.
#[inline(always)]
fn swizzle_split<const D: u32>(r: u32, high: u32, low: u32, bit: u32) -> u32 {
    r * D * 2 + high * 128 + (((2 * low) ^ bit ^ (r & 7)) << 4)
}

/// Where a pipeline tile's rows come from: its first token (of the chunk's request), its first
/// stacked KV head, and the valid tokens of its segment (0 for a tile past the chunk). Row `r`
/// is token `first + r % seg` of head `head + r / seg` ([`KvPipeline`]).
struct Segment {
    first: u32,
    head: u32,
    rows: u32,
}

/// The K/V copy pipeline of one chunk, as seen by one thread.
///
/// The chunk's tokens stream global → shared in tiles of `tile_tokens` rows through a ring of
/// `stages` stages, each holding the tile's K then its V (`[tile_tokens][D]` elements of
/// `kv_bytes`, swizzled: [`swizzle`], or [`fp8::swizzle8`] for 8-bit codes). Copies are 16-byte
/// `cp.async` under an L2 evict-first policy (each K/V byte is read once per launch); with
/// `columns` 16-byte chunks per row, thread `t` copies chunk `t % columns` of every
/// `128 / columns`-th row from row `t / columns`.
///
/// Page lookups run one tile ahead: thread `r < tile_tokens` loads the page id of row `r` of a
/// tile one iteration before the tile's copies are issued (the load's latency hides behind a tile
/// of compute), then resolves it into a row of the K/V store, which it parks in a shared ring of
/// `stages` tiles (row 0 past the chunk, never copied) for the threads that copy the row.
///
/// The numbers of the tiling are read where they are used, as in the code this replaced: the
/// shipped PTX is sensitive to the form of these expressions.
///
/// With stacked KV heads ([`DecodeParams::stack_shift`], `1 << head_shift` of them) a tile
/// holds *segments* of `seg = max(16, tile_tokens >> head_shift)` tokens of `tile_tokens / seg`
/// consecutive heads, which share the segment's page ids, and the tiles run token-major:
/// pipeline tile `n` is token segment `n >> group_shift` of head group `n % (1 << group_shift)`.
/// So a request of 16 tokens fills its tiles with the blocks of several heads instead of
/// leaving them half empty: fewer tiles, and every warp of the CTA busy on each.
struct KvPipeline<const D: u32, V: Tiling> {
    tile_tokens: u32,
    tid: u32,
    /// The chunk's tokens `[begin, end)` and its pipeline tiles (token segments × head groups).
    begin: u32,
    end: u32,
    tiles: u32,
    /// log2 of the tokens of a segment and of the head groups per token segment
    /// (`log2(tile_tokens)` and 0 unless the tiling stacks heads); a tile holds
    /// `tile_tokens >> seg_shift` heads.
    seg_shift: u32,
    group_shift: u32,
    /// This thread's 16-byte column of the rows it copies, and the first of those rows.
    column: u32,
    first_row: u32,
    /// Shared addresses of the first stage (the others follow it) and of the page-row ring.
    stages_smem: u32,
    ring: u32,
    /// Global addresses of this thread's column of K and V row 0 of the store.
    k_column: u64,
    v_column: u64,
    /// L2 policy of the copies.
    policy: u64,
    tiling: PhantomData<V>,
}

impl<const D: u32, V: Tiling> KvPipeline<D, V> {
    /// The pipeline of `chunk` for thread `tid`, `1 << head_shift` stacked KV heads (0 unless the
    /// tiling stacks heads), its stages from shared address `stages_smem`.
    #[inline(always)]
    fn new(p: &DecodeParams, chunk: &Chunk, head_shift: u32, stages_smem: u32, tid: u32) -> Self {
        let rows = Self::for_rows(p, chunk, head_shift, stages_smem, tid);
        // K/V are read once per launch: their lines go first when L2 needs room.
        let policy = l2_evict_first_policy();
        KvPipeline { policy, ..rows }
    }

    /// [`Self::new`] without the L2 policy, for the arithmetic of the rows only (no copies).
    #[inline(always)]
    fn for_rows(p: &DecodeParams, chunk: &Chunk, head_shift: u32, stages_smem: u32, tid: u32) -> Self {
        let (tile_tokens, stages) = (V::T.tile_tokens, V::T.stages);
        let columns = D * V::T.kv_bytes / 16;
        let tile_bytes = tile_tokens * D * V::T.kv_bytes;
        let tile_shift = tile_tokens.trailing_zeros();
        let seg_shift = tile_shift.saturating_sub(head_shift).max(4);
        let group_shift = head_shift - (tile_shift - seg_shift);
        let tiles = Self::tiles_of(chunk, seg_shift, group_shift);
        let column = tid % columns;
        let first_row = tid / columns;
        let ring = stages_smem + stages * 2 * tile_bytes;
        let (k_column, v_column) = (p.k_data + (column * 16) as u64, p.v_data + (column * 16) as u64);
        let policy = 0;
        let (begin, end) = (chunk.begin, chunk.end);
        let tiling = PhantomData;
        KvPipeline {
            tile_tokens,
            tid,
            begin,
            end,
            tiles,
            seg_shift,
            group_shift,
            column,
            first_row,
            stages_smem,
            ring,
            k_column,
            v_column,
            policy,
            tiling,
        }
    }

    /// Pipeline tiles of `chunk` (token segments × head groups).
    #[inline(always)]
    fn tiles_of(chunk: &Chunk, seg_shift: u32, group_shift: u32) -> u32 {
        if V::T.stacks_heads {
            (chunk.end - chunk.begin).div_ceil(1 << seg_shift) << group_shift
        } else {
            (chunk.end - chunk.begin).div_ceil(V::T.tile_tokens)
        }
    }

    /// The same pipeline over `chunk` (its L2 policy not created again), for the arithmetic of
    /// its rows only.
    #[inline(always)]
    fn rebound(&self, chunk: &Chunk) -> Self {
        let tiles = Self::tiles_of(chunk, self.seg_shift, self.group_shift);
        KvPipeline { begin: chunk.begin, end: chunk.end, tiles, ..*self }
    }

    /// This pipeline moved to `chunk` (of the same request): its L2 policy is kept, since a
    /// `createpolicy` ptxas sees only on a rarely taken path it may drop, leaving the copies a
    /// descriptor nothing wrote (the check in `tests/ptx.rs`).
    #[inline(always)]
    fn rebind(&mut self, chunk: &Chunk) {
        (self.begin, self.end) = (chunk.begin, chunk.end);
        self.tiles = Self::tiles_of(chunk, self.seg_shift, self.group_shift);
    }

    /// The token segment and first stacked head of tile `tile`.
    #[inline(always)]
    fn segment(&self, tile: u32) -> Segment {
        if V::T.stacks_heads {
            let first = self.begin + ((tile >> self.group_shift) << self.seg_shift);
            let heads_per_tile_shift = V::T.tile_tokens.trailing_zeros() - self.seg_shift;
            let head = (tile & ((1 << self.group_shift) - 1)) << heads_per_tile_shift;
            let rows = self.end.saturating_sub(first).min(1 << self.seg_shift);
            Segment { first, head, rows }
        } else {
            let rows = V::tile_rows(self.begin, self.end, tile);
            Segment { first: self.begin + tile * self.tile_tokens, head: 0, rows }
        }
    }

    /// Whether all blocks of each stacked head go to one warp phase of `phases` (phase `ph`
    /// takes blocks `ph, ph + phases, …` of every tile), so that no query row needs the phases
    /// combined: there is one phase, or a segment is one 16-token block (a head then sits at the
    /// same block of each of its tiles), or the chunk (of `chunk_tokens` tokens) holds at most
    /// one block per head.
    #[inline(always)]
    fn rows_in_one_phase(&self, phases: u32, chunk_tokens: u32) -> bool {
        phases == 1 || self.seg_shift == 4 || chunk_tokens <= 16
    }

    /// The warp phase that takes the blocks of stacked head `head` when
    /// [`rows_in_one_phase`](Self::rows_in_one_phase): the head's segment sits at position
    /// `head % heads_per_tile` of its tiles, and its first block at that position times the
    /// blocks of a segment.
    #[inline(always)]
    fn owner_phase(&self, head: u32, phases: u32) -> u32 {
        let heads_per_tile_shift = V::T.tile_tokens.trailing_zeros() - self.seg_shift;
        let position = head & ((1 << heads_per_tile_shift) - 1);
        (position << (self.seg_shift - 4)) % phases
    }

    /// Position of row `row` of a tile in its head's segment.
    #[inline(always)]
    fn segment_row(&self, row: u32) -> u32 {
        if V::T.stacks_heads { row & ((1 << self.seg_shift) - 1) } else { row }
    }

    /// Whether row `row` of the tile of `seg` holds a token of the chunk.
    #[inline(always)]
    fn row_valid(&self, seg: &Segment, row: u32) -> bool {
        self.segment_row(row) < seg.rows
    }

    /// Token of the chunk's request in row `row` of the tile of `seg`.
    #[inline(always)]
    fn row_token(&self, seg: &Segment, row: u32) -> u32 {
        seg.first + self.segment_row(row)
    }

    /// Stacked KV head (`0..1 << head_shift`) of row `row` of the tile of `seg`.
    #[inline(always)]
    fn row_head(&self, seg: &Segment, row: u32) -> u32 {
        if V::T.stacks_heads { seg.head + (row >> self.seg_shift) } else { 0 }
    }

    /// Shared addresses of the K and V tiles of tile `tile`'s stage.
    #[inline(always)]
    fn stage(&self, tile: u32) -> (u32, u32) {
        let (tile_tokens, stages) = (V::T.tile_tokens, V::T.stages);
        let tile_bytes = tile_tokens * D * V::T.kv_bytes;
        let k_tile = self.stages_smem + (tile % stages) * 2 * tile_bytes;
        (k_tile, k_tile + tile_bytes)
    }

    /// Global addresses of this thread's column of the K and V rows at offset `row` (16-byte
    /// units, [`page_row`]).
    #[inline(always)]
    fn kv_addr(&self, row: u32) -> (*const u8, *const u8) {
        (mad_wide_u32(row, 16, self.k_column) as *const u8, mad_wide_u32(row, 16, self.v_column) as *const u8)
    }

    /// Issues the copies of this thread's rows of tile `tile` (rows past the chunk are
    /// zero-filled), from the store rows parked in the ring.
    #[inline(always)]
    unsafe fn issue(&self, tile: u32) {
        unsafe { self.issue_under(tile, Some(self.policy)) }
    }

    /// [`Self::issue`] under L2 policy `policy`, or the default policy (no hint) for `None`.
    #[inline(always)]
    unsafe fn issue_under(&self, tile: u32, policy: Option<u64>) {
        let (tile_tokens, stages) = (V::T.tile_tokens, V::T.stages);
        let columns = D * V::T.kv_bytes / 16;
        let rows_per_thread = tile_tokens * columns / DECODE_THREADS;
        let row_step = DECODE_THREADS / columns;
        let (k_dst, v_dst) = self.stage(tile);
        let seg = self.segment(tile);
        let parked = self.ring + (tile % stages) * tile_tokens * 4;
        for i in 0..rows_per_thread {
            let r = self.first_row + i * row_step;
            let (k, v) = self.kv_addr(unsafe { ld_shared_u32(parked + r * 4) });
            let dst = if V::T.kv_bytes == 1 {
                fp8::swizzle8::<D>(r, self.column)
            } else {
                swizzle::<D>(r, self.column)
            };
            let n = if self.row_valid(&seg, r) { 16 } else { 0 };
            match policy {
                Some(policy) => unsafe {
                    cp_async_16(k_dst + dst, k, n, policy);
                    cp_async_16(v_dst + dst, v, n, policy);
                },
                None => unsafe {
                    cp_async_16_default_policy(k_dst + dst, k, n);
                    cp_async_16_default_policy(v_dst + dst, v, n);
                },
            }
        }
    }

    /// In the first `p.prefetch_ctas` CTAs of the launch, prefetches the rows of the first
    /// `stages - 1` tiles into L2 (one thread per 128 bytes of a row): a hint, which reads
    /// nothing, so it may run while the previous kernel still writes K/V.
    #[inline(always)]
    unsafe fn prefetch_first_tiles(&self, p: &DecodeParams) {
        let (tile_tokens, stages) = (V::T.tile_tokens, V::T.stages);
        let columns = D * V::T.kv_bytes / 16;
        let rows_per_thread = tile_tokens * columns / DECODE_THREADS;
        let row_step = DECODE_THREADS / columns;
        let linear_cta = block_idx().0 as u64 + grid_dim_x() as u64 * block_idx().1 as u64;
        if self.column % 8 == 0 && linear_cta < p.prefetch_ctas as u64 {
            for s in 0..stages - 1 {
                let parked = self.ring + (s % stages) * tile_tokens * 4;
                let seg = self.segment(s);
                for i in 0..rows_per_thread {
                    let r = self.first_row + i * row_step;
                    if self.row_valid(&seg, r) {
                        let (k, v) = self.kv_addr(unsafe { ld_shared_u32(parked + r * 4) });
                        unsafe {
                            prefetch_l2(k);
                            prefetch_l2(v);
                        }
                    }
                }
            }
        }
    }
}

/// A whole request's page lookup read after `griddepcontrol.wait`, to confirm the one guessed
/// before it: the request's bounds and this thread's page ids of the first `stages` tiles (those
/// of the guessed bounds' tiles).
struct Confirmation {
    chunk: Chunk,
    pages: [i32; MAX_STAGES as usize],
}

impl Confirmation {
    /// No confirmation yet.
    const NONE: Confirmation = Confirmation { chunk: Chunk::EMPTY, pages: [0; MAX_STAGES as usize] };

    /// Whether the guess (`chunk`, and `pages` of its first `stages` tiles) was right.
    #[inline(always)]
    fn matches(&self, chunk: &Chunk, pages: &[i32; MAX_STAGES as usize], stages: u32) -> bool {
        let c = &self.chunk;
        let mut same = c.begin == chunk.begin
            && c.end == chunk.end
            && c.first_index == chunk.first_index
            && c.num_pages == chunk.num_pages;
        for s in 0..stages {
            same &= self.pages[s as usize] == pages[s as usize];
        }
        same
    }
}

/// Tensor-core decode over a 16-bit or 8-bit K/V cache: one CTA per (chunk, KV head, head
/// block), see the [module docs](self).
///
/// # Safety
/// `p` satisfies the [safety model](crate#safety-model) of `decode_*`; launched with
/// [`DECODE_THREADS`] threads and the dynamic shared memory of
/// [`mma_smem_bytes`](crate::params::mma_smem_bytes) for `V`.
///
/// # Tiling
/// - `V` ([`MmaTiling`]): tokens per K/V tile, pipeline stages, warps sharing a 16-token block
///   (`d_parts`), query heads per CTA, query fragments kept in registers or not.
/// - `QK` = D/16 k-steps of `S = Q·Kᵀ`; `DN` output n-tiles (of 8 columns) per warp.
/// - `SPLIT`: the requests are partitioned into chunks (partials + merge) instead of one CTA per
///   request; `VPL` = D/32 merge columns per lane and `MERGE_BATCH` partial rows per lane in
///   flight in the merge ([`crate::merge`]).
/// - `L`: how scores become logits ([`Logits`]: plain or soft-capped).
/// - `STACK`: log2 of the KV heads the CTA covers, a constant of the entry (the host launches
///   each 16-bit lean entry only with its own shift), so that the head and segment arithmetic
///   of the main loop folds; [`ANY_STACK_SHIFT`]: `p.stack_shift`, read at run time (the 8-bit
///   cache's lean entries). 0 in every entry of a tiling that does not stack heads, and in the
///   lean split and guessing entries.
/// - Shared memory: Q tiles (`[q_tiles·16][D]`, swizzled), then the K/V stages and the page-row
///   ring of `KvPipeline`; after the main loop the stages hold the warps' partials.
///
/// # Thread Mapping
/// - Warp `w` owns query tile `w % q_tiles`, 16-token block phase `(w / q_tiles) % phases` (it
///   takes blocks `phase, phase + phases, …` of each tile) and output columns `d_part` of
///   `d_parts` (D = 256: halves). Its lanes hold `mma` fragments: rows `lane / 4` and
///   `lane / 4 + 8`, column pair `lane % 4`.
/// - K/V copies and page lookups: see `KvPipeline`. Q staging (by `cp.async` in the first tiles'
///   group in the lean 16-bit entries, through registers in the others) and the final combination
///   of the phases: thread `t` takes elements `t, t + 128, …`. Rows written without the combine:
///   see [`OwnRows`].
#[inline(always)]
pub unsafe fn decode_mma<
    C: KvCache,
    const D: u32,
    const QK: usize,
    const DN: usize,
    const VPL: usize,
    V: Tiling,
    const SPLIT: bool,
    const MERGE_BATCH: usize,
    L: Logits,
    const GUESS: bool,
    const STACK: u32,
>(
    p: &DecodeParams,
) {
    const { assert!(QK as u32 * 16 == D && DN as u32 * 8 * V::T.d_parts == D) };
    const { assert!((V::T.tile_tokens * D * V::T.kv_bytes / 16) % DECODE_THREADS == 0) };
    const { assert!(V::T.kv_bytes == if C::FP8 { 1 } else { 2 }) };
    // One thread per tile row resolves page lookups.
    const { assert!(V::T.tile_tokens <= DECODE_THREADS) };
    // Without the caller's promise, a CTA waits before any read of the page table, or, in a
    // guessing entry (`GUESS`, sm_90), guesses its partition (split) or page lookup (whole
    // requests) before the wait and confirms it after (below).
    const { assert!(!GUESS || cfg!(target_feature = "sm_90")) };
    const { assert!(STACK == 0 || (V::T.stacks_heads && !SPLIT && !GUESS)) };
    const { assert!(STACK == ANY_STACK_SHIFT || 1 << STACK <= STACKED_MAX_HEADS) };
    // Whether the CTA may cover several KV heads, whose scores it masks to their rows.
    let stacks = STACK != 0;
    // A whole request's page lookup is guessed here; a split entry's guess ends with its chunk.
    let guess = GUESS && !SPLIT;
    if !GUESS {
        wait_unless_page_table_stable(p);
    }
    let (tile_tokens, stages) = (V::T.tile_tokens, V::T.stages);
    let heads_per_cta = V::T.heads_per_cta;
    let d_parts = V::T.d_parts;
    let tid = thread_idx();
    let lane = tid % 32;
    let warp = tid / 32;
    let (item, head_block, _) = cta_coords::<SPLIT>(p);
    let group = p.num_qo_heads / p.num_kv_heads;
    let head_blocks = group.div_ceil(heads_per_cta);
    // Stacked KV heads (one head block each): the CTA's first KV head, and its query heads are
    // those of all its KV heads, consecutive in `q` and `o`.
    let stack_shift = if STACK == ANY_STACK_SHIFT { p.stack_shift } else { STACK };
    let kv_head = (head_block / head_blocks) << stack_shift;
    let first_group_head = (head_block % head_blocks) * heads_per_cta;
    // At most `max_q_tiles()` query tiles: the host stacks at most one tile of heads.
    const { assert!(!V::T.stacks_heads || V::T.max_q_tiles() <= 2) };
    let heads = (group - first_group_head).min(heads_per_cta) << stack_shift;
    let q_tiles = heads.div_ceil(16);
    // Warp roles: query tile `q_tile`, output columns `d_part` of `d_parts`, 16-token block phase
    // `phase` of `phases`.
    let WarpRoles { q_tile, phase, phases, d_part } = V::T.warp_roles(warp, q_tiles);
    let first_qo_head = kv_head * group + first_group_head;

    let columns = D / 8; // 16-byte columns per row
    let q_smem = smem_base();
    let kv_smem = q_smem + q_tiles * 16 * D * 2;
    // Page id of this thread's row of tile `tile` of `chunk` (0 past the chunk), and the same
    // read through L2 only, for a guess.
    let load_page = |kv: &KvPipeline<D, V>, chunk: &Chunk, tile: u32| -> i32 {
        let seg = kv.segment(tile);
        if kv.row_valid(&seg, tid) {
            let (idx, _) = page_slot(p, chunk, kv.row_token(&seg, tid));
            unsafe { ld_nc_i32((p.indices as *const i32).add(idx as usize)) }
        } else {
            0
        }
    };
    let guess_page = |kv: &KvPipeline<D, V>, chunk: &Chunk, tile: u32| -> i32 {
        let seg = kv.segment(tile);
        if kv.row_valid(&seg, tid) {
            let (idx, _) = page_slot(p, chunk, kv.row_token(&seg, tid));
            unsafe { ld_cg_i32((p.indices as *const i32).add(idx as usize)) }
        } else {
            0
        }
    };
    // Resolves `page` into the store row of this thread's row of tile `tile` of `chunk`, parked
    // in the ring.
    let park_row = |kv: &KvPipeline<D, V>, chunk: &Chunk, tile: u32, page: i32| {
        if tid < tile_tokens {
            let seg = kv.segment(tile);
            let row = if kv.row_valid(&seg, tid) {
                let head = kv_head + kv.row_head(&seg, tid);
                page_row(p, page, head, page_slot(p, chunk, kv.row_token(&seg, tid)).1)
            } else {
                0
            };
            unsafe { st_shared_u32(kv.ring + ((tile % stages) * tile_tokens + tid) * 4, row) };
        }
    };
    // The first tiles' page ids, all loaded before any is parked: their loads in flight
    // together, not one round trip per tile; a guess's kept to be compared after the wait. Each
    // through `opaque_u32`, so that LLVM cannot move the use of a page id (its clamp in
    // `page_row`) into the branch of its load, where it would wait for that load before the next
    // one is issued. The 8-bit cache's unguessed entries park each row as it is loaded: with the
    // loads together ptxas gives their split head_dim-128 entries 167 registers instead of 191
    // (three CTAs per SM), whose code ran 17 % slower per CTA (run 149).
    let mut first_pages = [0i32; MAX_STAGES as usize];
    const { assert!(V::T.stages <= MAX_STAGES) };

    // A guessed page lookup is read before the wait through L2 only (so that no line of the
    // page table stays in L1 for a read after the wait to hit), confirmed after the wait by the
    // same loads while the first copies, issued from the guess, are in flight, and redone from
    // the confirming values when the previous kernel changed it. A guessed split partition is
    // confirmed right after the wait, its confirming loads beside those of the chunk's first
    // page ids, which are parked before the CTA's vote on it (the barrier they need anyway).
    let chunk = if SPLIT && GUESS {
        // Only the rows' arithmetic: the copies' pipeline is made once the chunk is confirmed,
        // so that its L2 policy is created after the partition's loop (ptxas may drop a
        // `createpolicy` whose value crosses it: the descriptor check in `tests/ptx.rs`).
        let unbound = KvPipeline::<D, V>::for_rows(p, &Chunk::EMPTY, stack_shift, kv_smem, tid);
        let load_first_pages = |c: &Chunk| {
            let kv = unbound.rebound(c);
            let mut pages = [0i32; MAX_STAGES as usize];
            for s in 0..stages {
                pages[s as usize] = opaque_u32(load_page(&kv, c, s) as u32) as i32;
            }
            pages
        };
        let park_first_rows = |c: &Chunk, pages: [i32; MAX_STAGES as usize]| {
            let kv = unbound.rebound(c);
            for s in 0..stages - 1 {
                park_row(&kv, c, s, pages[s as usize]);
            }
        };
        unsafe { find_chunk_guessing(p, item, &mut first_pages, load_first_pages, park_first_rows) }
    } else if SPLIT {
        unsafe { find_chunk(p, item) }
    } else if guess {
        Some(unsafe { whole_request_through_l2(p, item) })
    } else {
        Some(unsafe { whole_request(p, item) })
    };
    let Some(mut chunk) = chunk else {
        // No chunk: leave at the wait, not before it. A CTA that ends while the previous kernel
        // still runs frees its slot to the next launch's CTAs then, which take the slots the
        // previous kernel leaves free and so crowd its SMs unevenly.
        grid_dependency_wait();
        return;
    };
    let request = chunk.request;

    // The K/V pipeline. Its page-lookup steps are the closures above: the shipped PTX depends
    // on LLVM inlining them late, as closures are.
    let mut kv = KvPipeline::<D, V>::new(p, &chunk, stack_shift, kv_smem, tid);
    let mut n_tiles = kv.tiles;
    let mut pending_page;
    if SPLIT && GUESS {
        // Loaded and parked with the partition's confirmation, a barrier after.
        pending_page = first_pages[(stages - 1) as usize];
    } else if guess || !C::FP8 {
        for s in 0..stages {
            let page = if guess { guess_page(&kv, &chunk, s) } else { load_page(&kv, &chunk, s) };
            first_pages[s as usize] = opaque_u32(page as u32) as i32;
        }
        for s in 0..stages - 1 {
            park_row(&kv, &chunk, s, first_pages[s as usize]);
        }
        pending_page = first_pages[(stages - 1) as usize];
    } else {
        for s in 0..stages - 1 {
            park_row(&kv, &chunk, s, load_page(&kv, &chunk, s));
        }
        pending_page = load_page(&kv, &chunk, stages - 1);
    }
    // The lean entries' epilogue constants, after the page-row ring: in shared memory in the
    // sm_80 build (`LeanEpilogue`), in registers in the sm_90 one. Stored once: the guessing
    // entries, whose chunk may change after the wait, are sm_90 only.
    let lean_epilogue = LeanEpilogue { addr: kv.ring + stages * tile_tokens * 4 };
    let epilogue_in_shared = V::T.stacks_heads && !cfg!(target_feature = "sm_90");
    if epilogue_in_shared && tid == 0 {
        unsafe { lean_epilogue.store(&chunk, q_tiles) };
    }
    if !(SPLIT && GUESS) {
        sync_threads();
    }
    // Everything above reads only the page table; Q and K/V may come from the previous kernel,
    // so until it completes the first tiles are only prefetched into L2 (a hint, no read; the
    // host asks for it only with the early page table).
    unsafe { kv.prefetch_first_tiles(p) };
    grid_dependency_wait();
    allow_dependent_launch();

    // Lean 16-bit entries: Q → shared by `cp.async` in the first tiles' group, which the main
    // loop waits for before its first tile (the other entries load it through registers below).
    let q_async = const { V::T.stacks_heads && !C::FP8 };
    if q_async {
        // A fixed count of copies per thread (those of the most tiles, each predicated on the
        // CTA's), so that no loop set-up lies between the wait and the first copy. Under the
        // default L2 policy: ptxas drops the `createpolicy` of these unrolled copies (see the
        // descriptor check in `tests/ptx.rs`).
        let copies = const { V::T.max_q_tiles() * 16 * (D / 8) / DECODE_THREADS };
        const { assert!(V::T.max_q_tiles() * 16 * (D / 8) % DECODE_THREADS == 0) };
        for i in 0..copies {
            let idx = tid + i * DECODE_THREADS;
            if idx < q_tiles * 16 * columns {
                let (r, c) = (idx / columns, idx % columns);
                let row = request * p.num_qo_heads + first_qo_head + r.min(heads - 1);
                let src = unsafe { (p.q as *const C::Io).add(row as usize * D as usize + (c * 8) as usize) };
                let n = if r < heads { 16 } else { 0 };
                unsafe { cp_async_16_default_policy(q_smem + swizzle::<D>(r, c), src as *const u8, n) };
            }
        }
    }
    // A split guess's first tiles under the default L2 policy: ptxas dropped the `createpolicy`
    // of these copies from some of those entries once their first page ids were loaded before
    // the partition's vote (the descriptor check in `tests/ptx.rs`).
    let first_policy = if SPLIT && GUESS { None } else { Some(kv.policy) };
    for s in 0..stages - 1 {
        if s < n_tiles {
            unsafe { kv.issue_under(s, first_policy) };
        }
        cp_async_commit();
    }
    // The guess's confirmation, loaded once the first copies are issued (so that the loaded
    // values need no registers across them) and compared below.
    let mut confirmed = Confirmation::NONE;
    if guess {
        confirmed.chunk = unsafe { whole_request(p, item) };
        for s in 0..stages {
            confirmed.pages[s as usize] = load_page(&kv, &chunk, s);
        }
    }
    // Q → shared (rows past the group are zero), while the first tiles are in flight. An 8-bit
    // cache also keeps each row's logit factor, after the page-row ring.
    let row_scales = lean_epilogue.addr + V::T.epilogue_bytes();
    if C::FP8 {
        let q_offset = (request * p.num_qo_heads + first_qo_head) as usize * D as usize;
        unsafe { fp8::stage_q::<C, D>(p, q_smem, row_scales, q_offset, heads, q_tiles, swizzle::<D>) };
    } else if !q_async {
        let mut idx = tid;
        while idx < q_tiles * 16 * columns {
            let (r, c) = (idx / columns, idx % columns);
            let v = if r < heads {
                let off =
                    (request * p.num_qo_heads + first_qo_head + r) as usize * D as usize + (c * 8) as usize;
                unsafe { ld_nc_v4((p.q as *const C::Io).add(off) as *const u8) }
            } else {
                [0; 4]
            };
            unsafe { st_shared_v4(q_smem + swizzle::<D>(r, c), v) };
            idx += DECODE_THREADS;
        }
    }
    if guess && sync_threads_or(!confirmed.matches(&chunk, &first_pages, stages)) {
        // The previous kernel changed this request's page lookup: once the copies from the guess
        // have landed (Q's among them), the first tiles again from the values read after the wait.
        // Out of line, so that the code of the usual path runs on without a jump over it.
        core::hint::cold_path();
        cp_async_wait::<0>();
        sync_threads();
        chunk = confirmed.chunk;
        kv.rebind(&chunk);
        n_tiles = kv.tiles;
        for s in 0..stages {
            first_pages[s as usize] = load_page(&kv, &chunk, s);
        }
        for s in 0..stages - 1 {
            park_row(&kv, &chunk, s, first_pages[s as usize]);
        }
        pending_page = first_pages[(stages - 1) as usize];
        sync_threads();
        for s in 0..stages - 1 {
            if s < n_tiles {
                unsafe { kv.issue(s) };
            }
            cp_async_commit();
        }
    }
    if !q_async {
        sync_threads();
    }

    let frag_row = lane / 4; // the lane's fragment rows: frag_row and frag_row + 8
    let frag_col = lane % 4; // the lane's fragment column pair
    let q_fragment = |kk: u32| -> [u32; 4] {
        let r = q_tile * 16 + (lane % 8) + 8 * ((lane / 8) % 2);
        let offset = if V::T.stacks_heads {
            swizzle_split::<D>(r, kk / 4, kk % 4, lane / 16)
        } else {
            swizzle::<D>(r, 2 * kk + lane / 16)
        };
        unsafe { ldmatrix_x4(q_smem + offset) }
    };
    let mut q_regs = [[0u32; 4]; QK];
    if V::T.q_in_regs {
        for kk in 0..QK {
            q_regs[kk] = q_fragment(kk as u32);
        }
    }
    // Logit factor of the lane's rows (8-bit cache; the 16-bit kernels use `p.scale_log2`).
    let mut row_scale = [0f32; 2];
    if C::FP8 {
        for r in 0..2 {
            let row = q_tile * 16 + frag_row + 8 * r as u32;
            row_scale[r] = f32::from_bits(unsafe { ld_shared_u32(row_scales + row * 4) });
        }
    }

    let mut m = [f32::NEG_INFINITY; 2];
    let mut l = [0f32; 2];
    let mut o = [[0f32; 4]; DN];
    let active = d_part < d_parts;
    let col0 = d_part * DN as u32 * 8; // first output column of this warp
    // Stacked KV heads: the stacked head of each of the lane's rows (rows past `heads` match
    // none); a tile's scores count only for the rows of its head.
    let mut row_head = [0u32; 2];
    if stacks {
        for r in 0..2 {
            row_head[r] = stacked_head_of_row(q_tile * 16 + frag_row + 8 * r as u32, p.group_reciprocal);
        }
    }

    // Main loop: per tile, advance the pipeline (resolve the rows of tile `tile + stages - 1`,
    // wait for tile `tile`, issue the copies of tile `tile + stages - 1`, look up the pages of the
    // tile after it); then each warp attends to its 16-token blocks of the tile.
    for tile in 0..n_tiles {
        let next = tile + stages - 1;
        park_row(&kv, &chunk, next, pending_page);
        // Tile `tile` has landed for every thread, every warp is done with tile - 1 (whose
        // stage the next copies overwrite), and the rows of tile `next` are parked.
        cp_async_wait_dyn(stages - 2);
        sync_threads();
        if next < n_tiles {
            unsafe { kv.issue(next) };
        }
        cp_async_commit();
        pending_page = load_page(&kv, &chunk, next + 1);

        let (k_tile, v_tile) = kv.stage(tile);
        let seg = kv.segment(tile);
        let mut block = phase;
        // Attention step per 16-token block: S = Q·Kᵀ, masking and online softmax, O += P·V. A
        // tile of stacked heads may hold a block past the chunk before one inside it.
        while active
            && block < tile_tokens / 16
            && (V::T.stacks_heads || kv.row_token(&seg, block * 16) < chunk.end)
        {
            let row0 = block * 16;
            // The block's first token, and its KV head among the stacked ones.
            let block_begin = kv.row_token(&seg, row0);
            let block_head = kv.row_head(&seg, row0);
            if V::T.stacks_heads && !kv.row_valid(&seg, row0) {
                block += phases;
                continue;
            }
            // S = Q · Kᵀ for 16 tokens (two n-tiles of 8), even and odd k-steps in separate
            // accumulators: two dependent MMA chains of QK / 2 instead of one of QK.
            let mut s = [[0f32; 4]; 2];
            let mut v_words = [[0u32; 4]; 4]; // 8-bit cache: the lane's V bytes of the block
            if C::FP8 {
                let q_frag = |kk: usize| if V::T.q_in_regs { q_regs[kk] } else { q_fragment(kk as u32) };
                s = unsafe { fp8::scores::<C, D, QK>(q_frag, k_tile, row0, lane) };
                v_words = unsafe { fp8::load_v::<D, DN>(v_tile, row0, col0, lane) };
            } else {
                let mut s_odd = [[0f32; 4]; 2];
                for kk in 0..QK {
                    let q_frag_k = if V::T.q_in_regs { q_regs[kk] } else { q_fragment(kk as u32) };
                    let k_row = row0 + (lane % 8) + 8 * (lane / 16);
                    let offset = if V::T.stacks_heads {
                        swizzle_split::<D>(k_row, kk as u32 / 4, kk as u32 % 4, (lane / 8) % 2)
                    } else {
                        swizzle::<D>(k_row, 2 * kk as u32 + (lane / 8) % 2)
                    };
                    let k_frag = unsafe { ldmatrix_x4(k_tile + offset) };
                    let acc = if kk % 2 == 0 { &mut s } else { &mut s_odd };
                    C::Mma::mma(&mut acc[0], q_frag_k, k_frag[0], k_frag[1]);
                    C::Mma::mma(&mut acc[1], q_frag_k, k_frag[2], k_frag[3]);
                }
                for nt in 0..2 {
                    for i in 0..4 {
                        s[nt][i] += s_odd[nt][i];
                    }
                }
            }
            // Scale, mask tokens past the chunk, online softmax (rows frag_row and frag_row + 8).
            let mut row_max = [f32::NEG_INFINITY; 2];
            let partial = block_begin + 16 > chunk.end;
            for nt in 0..2 {
                for i in 0..4 {
                    s[nt][i] = if C::FP8 { s[nt][i] * row_scale[i / 2] } else { L::logit(p, s[nt][i]) };
                    if partial {
                        let column = if C::FP8 {
                            fp8::score_token(nt as u32, frag_col, i as u32 & 1)
                        } else {
                            nt as u32 * 8 + 2 * frag_col + (i as u32 & 1)
                        };
                        let t = block_begin + column;
                        if t >= chunk.end {
                            s[nt][i] = f32::NEG_INFINITY;
                        }
                    }
                    if stacks && row_head[i / 2] != block_head {
                        s[nt][i] = f32::NEG_INFINITY;
                    }
                    row_max[i / 2] = fmax(row_max[i / 2], s[nt][i]);
                }
            }
            let mut scale = [0f32; 2];
            let mut m_exp = [0f32; 2]; // the max the weights are taken against
            for r in 0..2 {
                row_max[r] = fmax(row_max[r], shfl_xor(row_max[r], 1));
                row_max[r] = fmax(row_max[r], shfl_xor(row_max[r], 2));
                let m_new = fmax(m[r], row_max[r]);
                // Stacked KV heads: a row whose head has not come yet has seen only masked
                // scores; it keeps l = 0 and O = 0 (weights exp2(-inf - 0) = 0).
                let unseen = stacks && m_new == f32::NEG_INFINITY;
                scale[r] = if unseen { 1.0 } else { exp2(m[r] - m_new) };
                m_exp[r] = if unseen { 0.0 } else { m_new };
                m[r] = m_new;
                l[r] *= scale[r];
            }
            for nt in 0..2 {
                for i in 0..4 {
                    s[nt][i] = exp2(s[nt][i] - m_exp[i / 2]);
                    l[i / 2] += s[nt][i];
                }
            }
            if any_sync(scale[0] != 1.0 || scale[1] != 1.0) {
                for n in 0..DN {
                    for i in 0..4 {
                        o[n][i] *= scale[i / 2];
                    }
                }
            }
            // O += P · V, P re-packed from the S accumulators as the A operand.
            let p_frag = [
                C::Mma::pack2(s[0][0], s[0][1]),
                C::Mma::pack2(s[0][2], s[0][3]),
                C::Mma::pack2(s[1][0], s[1][1]),
                C::Mma::pack2(s[1][2], s[1][3]),
            ];
            if C::FP8 {
                unsafe { fp8::accumulate_pv::<C, DN>(&mut o, p_frag, v_words) };
            } else {
                for dn in 0..DN / 2 {
                    let v_row = row0 + (lane % 8) + 8 * ((lane / 8) % 2);
                    let offset = if V::T.stacks_heads {
                        swizzle_split::<D>(v_row, col0 / 64 + dn as u32 / 4, dn as u32 % 4, lane / 16)
                    } else {
                        swizzle::<D>(v_row, col0 / 8 + 2 * dn as u32 + lane / 16)
                    };
                    let v_frag = unsafe { ldmatrix_x4_trans(v_tile + offset) };
                    C::Mma::mma(&mut o[2 * dn], p_frag, v_frag[0], v_frag[1]);
                    C::Mma::mma(&mut o[2 * dn + 1], p_frag, v_frag[2], v_frag[3]);
                }
            }
            block += phases;
        }
    }
    // Epilogue: the warps' partials through shared memory, their phases combined, the result
    // (or the chunk's partial, then the split merge) written.
    let ticket = if SPLIT { unsafe { draw_ticket(p, &chunk) } } else { 0 };
    cp_async_wait::<0>();
    // One value of the accumulators after the loop for both epilogues below: without it, LLVM
    // keeps a second copy for the combine and moves the accumulators into it after every tile.
    if V::T.stacks_heads {
        for o_n in o.iter_mut() {
            opaque4(o_n);
        }
    }
    let (chunk_tokens, q_tiles) =
        if epilogue_in_shared { unsafe { lean_epilogue.load() } } else { (kv.end - kv.begin, q_tiles) };
    if V::T.stacks_heads && !SPLIT && kv.rows_in_one_phase(phases, chunk_tokens) {
        // Each row's blocks went to one warp phase, whose warps write it from their fragments.
        // The coordinates are derived again, as for the combine below.
        let tid = thread_idx_reread();
        let (lane, warp) = (tid % 32, tid / 32);
        let (frag_row, frag_col) = (lane / 4, lane % 4);
        let WarpRoles { q_tile, phase, d_part, .. } = V::T.warp_roles(warp, q_tiles);
        let col0 = d_part * DN as u32 * 8;
        let mut own_rows = [None; 2];
        for r in 0..2 {
            l[r] = quad_sum(l[r]);
            let row = q_tile * 16 + frag_row + 8 * r as u32;
            if d_part < d_parts && row < heads && kv.owner_phase(row_head[r], phases) == phase {
                own_rows[r] = Some(row);
            }
        }
        let rows =
            OwnRows { first_qo: request * p.num_qo_heads + first_qo_head, first_qo_head, rows: own_rows };
        unsafe { rows.write::<C, D, DN>(p, col0, frag_col, m, l, &o) };
        return;
    }
    sync_threads();
    // The entries ptxas would otherwise spill in (`tests/ptx.rs`) derive the thread's
    // coordinates again rather than keep them across the main loop: the lean ones (capped at 128
    // registers) and the soft-capped head_dim-256 ones (at 255; these also their phase count,
    // from a copy of `q_tiles` LLVM cannot see through). Not the other head_dim-256 entries,
    // which do not spill and ran up to 7 % slower so (run 136), nor the sm_90 soft-capped split
    // ones, which do not spill either.
    let rederive =
        V::T.stacks_heads || (D == 256 && L::SOFT_CAPPED && !(SPLIT && cfg!(target_feature = "sm_90")));
    let (tid, warp, frag_row, frag_col, q_tile, phases) = if rederive {
        let tid = thread_idx_reread();
        let (lane, warp) = (tid % 32, tid / 32);
        let phases =
            if V::T.stacks_heads { phases } else { V::T.warp_roles(warp, opaque_u32(q_tiles)).phases };
        (tid, warp, lane / 4, lane % 4, warp % q_tiles, phases)
    } else {
        (tid, warp, frag_row, frag_col, q_tile, phases)
    };

    // Per-warp partials → shared (reusing the pipeline buffers): O[16][DW] f32 of the warp's own
    // DW = D / d_parts columns, rows padded to `pitch` words so that a warp's 8-byte stores take
    // two wavefronts, then m[16], l[16]. Rows past the group are not stored (nor read).
    for r in 0..2 {
        l[r] = quad_sum(l[r]);
    }
    let part_cols = D / d_parts;
    let pitch = part_cols + 8;
    let part_bytes = (16 * pitch + 2 * 16) * 4;
    let stats = 16 * pitch * 4; // byte offset of m[16] (l[16] follows)
    let my_part = kv_smem + warp * part_bytes;
    for r in 0..2 {
        let row = frag_row + 8 * r as u32;
        if q_tile * 16 + row < heads {
            for n in 0..DN {
                if C::FP8 {
                    for j in 0..2 {
                        let col = fp8::out_col::<DN>(n as u32, frag_col, j);
                        unsafe {
                            st_shared_u32(
                                my_part + (row * pitch + col) * 4,
                                o[n][2 * r + j as usize].to_bits(),
                            )
                        };
                    }
                } else {
                    let col = n as u32 * 8 + 2 * frag_col;
                    unsafe {
                        st_shared_v2_f32(my_part + (row * pitch + col) * 4, [o[n][2 * r], o[n][2 * r + 1]])
                    };
                }
            }
            if frag_col == 0 {
                unsafe {
                    st_shared_u32(my_part + stats + row * 4, m[r].to_bits());
                    st_shared_u32(my_part + stats + (16 + row) * 4, l[r].to_bits());
                }
            }
        }
    }
    sync_threads();

    // Combine the phases of each query row and write the result (or the split's partial).
    let quads = D / 4;
    let mut idx = tid;
    while idx < heads * quads {
        let (row, d4) = (idx / quads, idx % quads);
        let (row_tile, r) = (row / 16, row % 16);
        let part = d4 * 4 / part_cols;
        let warp_part = |ph: u32| kv_smem + (row_tile + q_tiles * (ph + phases * part)) * part_bytes;
        let stat =
            |ph: u32, k: u32| f32::from_bits(unsafe { ld_shared_u32(warp_part(ph) + stats + (k + r) * 4) });
        let mut m_all = f32::NEG_INFINITY;
        for ph in 0..phases {
            m_all = fmax(m_all, stat(ph, 0));
        }
        let mut l_all = 0f32;
        let mut acc = [0f32; 4];
        if m_all != f32::NEG_INFINITY {
            for ph in 0..phases {
                let w = exp2(stat(ph, 0) - m_all);
                l_all += w * stat(ph, 16);
                let o4 =
                    unsafe { ld_shared_v4_f32(warp_part(ph) + (r * pitch + d4 * 4 - part * part_cols) * 4) };
                for i in 0..4 {
                    acc[i] += w * o4[i];
                }
            }
        }
        let mut inv = if l_all > 0.0 { 1.0 / l_all } else { 0.0 };
        if C::FP8 {
            inv *= p.v_scale;
        }
        let lse = if l_all > 0.0 { m_all + log2(l_all) } else { f32::NEG_INFINITY };
        let qo = (request * p.num_qo_heads + first_qo_head + row) as usize;
        let partial = (chunk.request_chunks > 1).then(|| partial_row(p, item, first_qo_head + row));
        let (inv, lse) =
            if partial.is_none() { with_sink(p, first_qo_head + row, inv, lse) } else { (inv, lse) };
        let v = [acc[0] * inv, acc[1] * inv, acc[2] * inv, acc[3] * inv];
        unsafe { write_row_quad::<C::Io>(p, partial, qo, D, d4, v, lse) };
        idx += DECODE_THREADS;
    }
    if SPLIT && chunk.request_chunks > 1 {
        unsafe { finish_split::<C::Io, D, VPL, MERGE_BATCH>(p, &chunk, ticket, first_qo_head, heads) };
    }
}

/// The two CTA constants a lean CTA's epilogue needs (its chunk's token count and its query-tile
/// count), kept in shared memory across the main loop rather than in registers by the sm_80
/// build: the lean entries are capped at 128 registers, and ptxas spilled these two around the
/// loop there (8 bytes of local memory in the head_dim-128 entries). The sm_90 build keeps them
/// in registers without spilling; there the shared slot measured 1 % slower on the lean rows
/// with the page-table promise and 0.13–0.17 µs slower on one token without it (run 148), so it
/// stays unused. Written by thread 0 before a barrier that precedes the main loop;
/// [`LEAN_EPILOGUE_BYTES`] at `addr`.
#[derive(Clone, Copy)]
struct LeanEpilogue {
    addr: u32,
}

impl LeanEpilogue {
    /// # Safety
    /// `addr` is the 8-byte-aligned slot of [`LEAN_EPILOGUE_BYTES`] in this CTA's shared memory.
    #[inline(always)]
    unsafe fn store(&self, chunk: &Chunk, q_tiles: u32) {
        unsafe { st_shared_v2_u32(self.addr, [chunk.end - chunk.begin, q_tiles]) };
    }

    /// `(chunk tokens, query tiles)` as stored, after a barrier that followed the store.
    ///
    /// # Safety
    /// As for [`store`](Self::store).
    #[inline(always)]
    unsafe fn load(&self) -> (u32, u32) {
        let [chunk_tokens, q_tiles] = unsafe { ld_shared_v2_u32(self.addr) };
        (chunk_tokens, q_tiles)
    }
}

/// Sum over the four lanes of a fragment quad (the lanes holding one row's column pairs).
#[inline(always)]
fn quad_sum(x: f32) -> f32 {
    let x = x + shfl_xor(x, 1);
    x + shfl_xor(x, 2)
}

/// The query rows one warp writes straight from its fragments, in the lean epilogue without a
/// combine ([`KvPipeline::rows_in_one_phase`]): `rows[r]` is the CTA row of the lane's fragment
/// row `r` (`frag_row + 8·r` of its query tile) when the warp's phase owns it, and CTA row `i`
/// is row `first_qo + i` of `o` (query head `first_qo_head + i` of the request).
struct OwnRows {
    first_qo: u32,
    first_qo_head: u32,
    rows: [Option<u32>; 2],
}

impl OwnRows {
    /// Writes the owned rows' output columns `col0 + …` held by this lane (fragment column
    /// pair `frag_col` of the warp's `DN` n-tiles) and, from the warp of the first columns, their
    /// lse: the values of the combine in `decode_mma`, whose other phases add exact zeros.
    #[inline(always)]
    unsafe fn write<C: KvCache, const D: u32, const DN: usize>(
        &self,
        p: &DecodeParams,
        col0: u32,
        frag_col: u32,
        m: [f32; 2],
        l: [f32; 2],
        o: &[[f32; 4]; DN],
    ) {
        for r in 0..2 {
            let Some(row) = self.rows[r] else { continue };
            let mut inv = if l[r] > 0.0 { 1.0 / l[r] } else { 0.0 };
            if C::FP8 {
                inv *= p.v_scale;
            }
            let lse = if l[r] > 0.0 { m[r] + log2(l[r]) } else { f32::NEG_INFINITY };
            let (inv, lse) = with_sink(p, self.first_qo_head + row, inv, lse);
            let qo = (self.first_qo + row) as usize;
            let out = unsafe { (p.o as *mut C::Io).add(qo * D as usize + col0 as usize) };
            if C::FP8 {
                // The lane's columns `DN·(2·frag_col + j) + n` ([`fp8::out_col`]): DN in a row per j.
                for j in 0..2 {
                    let first = DN as u32 * (2 * frag_col + j as u32);
                    for n4 in 0..DN / 4 {
                        let v = [0, 1, 2, 3].map(|i| o[4 * n4 + i][2 * r + j] * inv);
                        unsafe { C::Io::store4(out.add((first + 4 * n4 as u32) as usize), v) };
                    }
                }
            } else {
                for n in 0..DN {
                    let v = [o[n][2 * r] * inv, o[n][2 * r + 1] * inv];
                    unsafe { C::Io::store2(out.add((n as u32 * 8 + 2 * frag_col) as usize), v) };
                }
            }
            if col0 == 0 && frag_col == 0 {
                unsafe { *(p.lse as *mut f32).add(qo) = lse };
            }
        }
    }
}

/// Writes 4 consecutive outputs of row `qo` (and its lse, from the `d4 == 0` thread): to `o`/`lse`
/// when the request is in one chunk, else to workspace row `partial`.
#[inline(always)]
unsafe fn write_row_quad<T: Elem>(
    p: &DecodeParams,
    partial: Option<usize>,
    qo: usize,
    head_dim: u32,
    d4: u32,
    v: [f32; 4],
    lse: f32,
) {
    let col = (d4 * 4) as usize;
    unsafe {
        if let Some(slot) = partial {
            f32::store4((p.partial_o as *mut f32).add(slot * head_dim as usize + col), v);
            if d4 == 0 {
                *(p.partial_lse as *mut f32).add(slot) = lse;
            }
        } else {
            T::store4((p.o as *mut T).add(qo * head_dim as usize + col), v);
            if d4 == 0 {
                *(p.lse as *mut f32).add(qo) = lse;
            }
        }
    }
}

/// CUDA-core decode (any element type; used for f32): grid as [`decode_mma`] with one head block
/// per KV head.
///
/// # Safety
/// As [`decode_mma`], without dynamic shared memory.
///
/// # Thread Mapping
/// Warp `w` handles query heads `w, w + 4, …` of the group, one token at a time; lane `i` holds
/// columns `[i·VPL, (i + 1)·VPL)` of the head (`VPL` = D/32).
#[inline(always)]
pub unsafe fn decode_simt<T: Elem, const D: u32, const VPL: usize, const SPLIT: bool, L: Logits>(
    p: &DecodeParams,
) {
    const { assert!(VPL as u32 * 32 == D) };
    wait_unless_page_table_stable(p);
    let tid = thread_idx();
    let lane = tid % 32;
    let warp = tid / 32;
    let (item, kv_head, _) = cta_coords::<SPLIT>(p);
    let group = p.num_qo_heads / p.num_kv_heads;
    let chunk = if SPLIT { unsafe { find_chunk(p, item) } } else { Some(unsafe { whole_request(p, item) }) };
    grid_dependency_wait();
    // A CTA without a chunk ends after the wait too, so that this grid never completes before
    // the kernel it depends on (with the page-table promise it read the table before the wait).
    let Some(chunk) = chunk else { return };
    let b = chunk.request;
    allow_dependent_launch();
    let col = lane * VPL as u32;
    let mut head = warp;
    while head < group {
        let qo = (b * p.num_qo_heads + kv_head * group + head) as usize;
        let mut q = [0f32; VPL];
        for i in 0..VPL {
            q[i] = unsafe { *(p.q as *const T).add(qo * D as usize + col as usize + i) }.to_f32();
        }
        let mut m = f32::NEG_INFINITY;
        let mut l = 0f32;
        let mut o = [0f32; VPL];
        for t in chunk.begin..chunk.end {
            let units = unsafe { token_row(p, &chunk, kv_head, t) } as usize;
            let row = units * (16 / core::mem::size_of::<T>()) + col as usize;
            let k = unsafe { (p.k_data as *const T).add(row) };
            let v = unsafe { (p.v_data as *const T).add(row) };
            let mut dot = 0f32;
            for i in 0..VPL {
                dot += q[i] * unsafe { *k.add(i) }.to_f32();
            }
            let s = L::logit(p, warp_sum(dot));
            let m_new = fmax(m, s);
            let scale = exp2(m - m_new);
            let w = exp2(s - m_new);
            l = l * scale + w;
            for i in 0..VPL {
                o[i] = o[i] * scale + w * unsafe { *v.add(i) }.to_f32();
            }
            m = m_new;
        }
        let inv = if l > 0.0 { 1.0 / l } else { 0.0 };
        let lse = if l > 0.0 { m + log2(l) } else { f32::NEG_INFINITY };
        let partial = (chunk.request_chunks > 1).then(|| partial_row(p, item, kv_head * group + head));
        let (inv, lse) =
            if partial.is_none() { with_sink(p, kv_head * group + head, inv, lse) } else { (inv, lse) };
        for j in 0..VPL / 4 {
            let d4 = lane * (VPL as u32 / 4) + j as u32;
            let v = [o[4 * j] * inv, o[4 * j + 1] * inv, o[4 * j + 2] * inv, o[4 * j + 3] * inv];
            unsafe { write_row_quad::<T>(p, partial, qo, D, d4, v, lse) };
        }
        if VPL < 4 {
            // D = 64: two values per lane; write them as a pair.
            unsafe { write_row_pair::<T>(p, partial, qo, D, lane, [o[0] * inv, o[VPL - 1] * inv], lse) };
        }
        head += WARPS;
    }
    if SPLIT && chunk.request_chunks > 1 {
        // A small merge batch keeps the streaming loop's register count low.
        let ticket = unsafe { draw_ticket(p, &chunk) };
        unsafe { finish_split::<T, D, VPL, 4>(p, &chunk, ticket, kv_head * group, group) };
    }
}

#[inline(always)]
unsafe fn write_row_pair<T: Elem>(
    p: &DecodeParams,
    partial: Option<usize>,
    qo: usize,
    head_dim: u32,
    lane: u32,
    v: [f32; 2],
    lse: f32,
) {
    let col = (lane * 2) as usize;
    unsafe {
        if let Some(slot) = partial {
            let out = (p.partial_o as *mut f32).add(slot * head_dim as usize + col);
            *out = v[0];
            *out.add(1) = v[1];
            if lane == 0 {
                *(p.partial_lse as *mut f32).add(slot) = lse;
            }
        } else {
            let out = (p.o as *mut T).add(qo * head_dim as usize + col);
            *out = T::from_f32(v[0]);
            *out.add(1) = T::from_f32(v[1]);
            if lane == 0 {
                *(p.lse as *mut f32).add(qo) = lse;
            }
        }
    }
}
