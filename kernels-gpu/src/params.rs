//! Kernel parameter blocks, shared verbatim by the device crate and the host crate
//! (the host includes this file), so both sides agree on the layout by construction.
//! Pointers are device addresses; all tensors are contiguous row-major, except the K/V stores,
//! whose page, head and token strides are parameters.

/// Parameters of the decode kernels and of the split-KV merge.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct DecodeParams {
    /// `[batch, num_qo_heads, head_dim]`, element type T.
    pub q: u64,
    /// `[pages, num_kv_heads, page_size, head_dim]` views of T with the strides below (HND
    /// when contiguous).
    pub k_data: u64,
    pub v_data: u64,
    /// Page ids, `[num_indices]` i32.
    pub indices: u64,
    /// `[batch + 1]` i32: request `b` owns `indices[indptr[b]..indptr[b+1]]`.
    pub indptr: u64,
    /// `[batch]` i32: tokens used in the request's last page.
    pub last_page_len: u64,
    /// `[batch, num_qo_heads, head_dim]`, T.
    pub o: u64,
    /// `[batch, num_qo_heads]` f32, base-2 log-sum-exp of the scaled logits.
    pub lse: u64,
    /// Split-KV partial outputs `[num_chunks, num_qo_heads, head_dim]` f32 (workspace), one row
    /// block per item (chunk of a request).
    pub partial_o: u64,
    /// Split-KV partial log-sum-exps `[num_chunks, num_qo_heads]` f32 (workspace).
    pub partial_lse: u64,
    /// Split-KV arrival counters, a `[ticket, done]` pair of u32 per (request, head block)
    /// (`2 × batch × num_kv_heads × head_blocks`), zero between launches (the merging CTA resets
    /// its pair).
    pub counters: u64,
    /// Item map of the split partition (workspace), written by the schedule kernel before the
    /// decode of a large batch (see `schedule`); 0: every CTA derives the partition itself.
    pub item_map: u64,
    pub batch: u32,
    pub num_qo_heads: u32,
    pub num_kv_heads: u32,
    pub page_size: u32,
    pub num_total_pages: u32,
    pub num_indices: u32,
    /// Items the requests are partitioned into: `batch` for the unsplit kernels (one per
    /// request), `≥ batch` for the split ones (see `partition`), whose grid has at most this many
    /// CTAs per head block along its chunk dimension.
    pub num_chunks: u32,
    /// Smallest chunk, in tokens, a split may take.
    pub min_chunk: u32,
    /// Chunk size (tokens) the partition grows shorter chunks to, as long as at least half of
    /// the `num_chunks` items keep a chunk.
    pub preferred_chunk: u32,
    /// Items one wave of CTAs holds; chunks are then at least `total tokens / balance_items`, so
    /// that a long request among many short ones is split to about a wave's share while equal
    /// lengths stay whole. 0: no such bound (the splits fill the grid).
    pub balance_items: u32,
    /// Split kernels: 1 puts the head blocks along grid x (consecutive CTAs share a chunk),
    /// 0 the items (as the unsplit kernels, whose grid x is the requests).
    pub heads_along_x: u32,
    /// `log2(page_size)` when it is a power of two, else `u32::MAX`.
    pub page_shift: u32,
    /// `sm_scale * log2(e)`: logits are kept in the base-2 domain.
    pub scale_log2: f32,
    /// CTAs (in launch order) that prefetch their first K/V tiles into L2 while they wait for the
    /// previous kernel (programmatic dependent launch); 0 disables the prefetch.
    pub prefetch_ctas: u32,
    /// 8-bit caches: dequantization scales, `k = k_scale · code` and `v = v_scale · code` (the
    /// 16-bit kernels ignore them).
    pub k_scale: f32,
    pub v_scale: f32,
    /// K/V store strides in 16-byte units, shared by `k_data` and `v_data` (each the address of
    /// its view's row (0, 0, 0)): row (page, KV head, slot) starts `page · kv_page_stride +
    /// head · kv_head_stride + slot · kv_token_stride` units in. HND: `Hkv·P·D`, `P·D`, `D` in
    /// elements.
    pub kv_page_stride: u32,
    pub kv_head_stride: u32,
    pub kv_token_stride: u32,
    /// Sliding window: the last `window_left + 1` tokens of each request; `u32::MAX`: off.
    pub window_left: u32,
    /// Logits soft-cap entries (`decode_*_softcap_*`): `sm_scale / cap` and `cap · log2(e)`.
    pub soft_cap_scale: f32,
    pub soft_cap_log2: f32,
    /// Attention sinks, `[num_qo_heads]` f32 (natural-log domain, as the scaled logits); 0: none.
    pub sinks: u64,
    /// Tilings that stack KV heads ([`MmaTiling::stacks_heads`]): each CTA covers
    /// `1 << stack_shift` consecutive KV heads of its request (grid y `num_kv_heads >>
    /// stack_shift`, which it divides), their `group << stack_shift ≤ 16` query heads in one
    /// query tile. 0: one KV head per CTA. Only the 8-bit cache's lean entries read it: each
    /// 16-bit lean entry (`decode_mma_lean_x{k}_*`) has its shift as a constant and is launched
    /// only with that shift; the other tilings, the lean split and the guessing entries run
    /// unstacked.
    pub stack_shift: u32,
    /// Programmatic dependent launch: 1 lets a CTA read the page table (`indptr`, `indices`,
    /// `last_page_len`) before `griddepcontrol.wait`, as the caller promised that the kernel
    /// before this launch does not write it; 0 has every CTA wait first (see
    /// [`crate::partition::wait_unless_page_table_stable`]).
    pub early_page_table: u32,
    /// `ceil(1024 / group)` (`group = num_qo_heads / num_kv_heads`): the lean kernels find the
    /// stacked KV head of query row `r < 32` as `r · group_reciprocal >> 10`
    /// ([`stacked_head_of_row`]), exact for every group, without a division on a CTA's start.
    pub group_reciprocal: u32,
    /// Requests of at most this many attended tokens take one chunk whatever the chunk size
    /// ([`crate::chunking::request_chunks`]); 0: none.
    pub unsplit_max_tokens: u32,
}

/// `ceil(1024 / group)`, [`DecodeParams::group_reciprocal`].
pub const fn group_reciprocal(group: u32) -> u32 {
    1024u32.div_ceil(if group == 0 { 1 } else { group })
}

/// `row / group` for `row < 32`, from `group_reciprocal(group)`: `row · ceil(1024 / group)`
/// exceeds `1024 · row / group` by less than `32 / 1024`, too little to reach the next multiple
/// of 1024 whatever the group.
pub const fn stacked_head_of_row(row: u32, group_reciprocal: u32) -> u32 {
    (row * group_reciprocal) >> 10
}

/// `DecodeParams::window_left` without a window.
pub const WINDOW_OFF: u32 = u32::MAX;

/// Parameters of the append kernel.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct AppendParams {
    /// `[batch, num_kv_heads, head_dim]`, T.
    pub key: u64,
    pub value: u64,
    pub k_data: u64,
    pub v_data: u64,
    pub indices: u64,
    pub indptr: u64,
    pub last_page_len: u64,
    pub batch: u32,
    pub num_kv_heads: u32,
    pub page_size: u32,
    pub head_dim: u32,
    pub num_total_pages: u32,
    pub num_indices: u32,
    /// Quantizing appends into an 8-bit store: the scales the tokens are divided by.
    pub k_scale: f32,
    pub v_scale: f32,
    /// K/V store strides in 16-byte units, as [`DecodeParams::kv_page_stride`] and the others.
    pub kv_page_stride: u32,
    pub kv_head_stride: u32,
    pub kv_token_stride: u32,
}

/// Parameters of the device-side page-table check.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct PageTableCheckParams {
    pub indices: u64,
    pub indptr: u64,
    pub last_page_len: u64,
    /// One u64: `min((request << 8) | code)` over all violations; `u64::MAX` if none.
    pub status: u64,
    /// Append mode: `[batch]` u64, each request's append slot as the store row
    /// `page × page_size + last_page_len - 1`, or [`NO_APPEND_SLOT`] for a request without pages
    /// (meaningful only when no violation is reported; the host finds two requests appending to
    /// one slot from it). 0 otherwise.
    pub slots: u64,
    pub batch: u32,
    pub page_size: u32,
    pub num_total_pages: u32,
    pub num_indices: u32,
    /// 1: the append contract (`last_page_len ≥ 1` on a request with pages), and `slots` is
    /// written; 0: the decode contract.
    pub append: u32,
}

/// Violation codes written by the page-table check.
pub mod check_code {
    /// `indptr[b]` or `indptr[b+1]` lies outside `[0, num_indices]`.
    pub const INDPTR_OUT_OF_RANGE: u32 = 1;
    /// `indptr[b+1] < indptr[b]`.
    pub const INDPTR_DECREASING: u32 = 2;
    /// `last_page_len[b]` lies outside `[0, page_size]`.
    pub const LAST_PAGE_LEN_OUT_OF_RANGE: u32 = 3;
    /// A page id of the request lies outside `[0, num_total_pages)`.
    pub const PAGE_OUT_OF_RANGE: u32 = 4;
    /// Append: `last_page_len[b]` is 0 on a request with pages (the new token is not counted).
    pub const LAST_PAGE_EMPTY: u32 = 6;
}

/// The append slot the page-table check writes for a request without pages, which appends
/// nothing.
pub const NO_APPEND_SLOT: u64 = u64::MAX;

/// The slots of `indices[start..stop]` that lane `lane` of the page-table check's warp reads:
/// `start + lane`, then every 32nd. In `u32`, so that with `0 ≤ start ≤ stop ≤ i32::MAX` no step
/// wraps (a walk in `i32` wraps within 32 slots of `i32::MAX`, to a negative slot).
#[inline(always)]
pub fn check_lane_slots(start: u32, stop: u32, lane: u32) -> impl Iterator<Item = u32> {
    (start.saturating_add(lane)..stop).step_by(32)
}

/// Threads per CTA of the decode kernels.
pub const DECODE_THREADS: u32 = 128;
/// The deepest pipeline of any [`MmaTiling`] (the 8-bit tilings' four stages).
pub const MAX_STAGES: u32 = 4;
/// Tiling of the tensor-core decode kernel: what one CTA holds and how its warps share it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MmaTiling {
    /// Tokens per pipeline stage.
    pub tile_tokens: u32,
    /// Pipeline depth (K/V tiles in shared memory).
    pub stages: u32,
    /// Warps sharing one 16-token block, each owning `head_dim / d_parts` output columns.
    pub d_parts: u32,
    /// Query heads one CTA covers (16-row MMA tiles of them).
    pub heads_per_cta: u32,
    /// Whether the query fragments stay in registers for the whole loop.
    pub q_in_regs: bool,
    /// Bytes per K/V element in shared memory: 2, or 1 for an 8-bit cache (whose tiles are
    /// dequantized in registers, and whose query rows also keep a logit factor each).
    pub kv_bytes: u32,
    /// Whether a CTA may cover several KV heads of its request ([`DecodeParams::stack_shift`]):
    /// its tiles then hold 16-token segments of several of them and run token-major, so that
    /// one CTA carries the bytes of several short (request, KV head) pairs through one pipeline.
    pub stacks_heads: bool,
}

/// The standard tiling: 16 KB of K and 16 KB of V per stage whatever the head_dim, three stages,
/// up to four 16-row query tiles (two for head_dim 256, whose warps split D in halves to keep
/// the output accumulators in registers). Two CTAs per SM: made for long chunks.
pub const fn standard_tiling(head_dim: u32) -> MmaTiling {
    MmaTiling {
        tile_tokens: 8192 / head_dim,
        stages: 3,
        d_parts: if head_dim > 128 { 2 } else { 1 },
        heads_per_cta: if head_dim > 128 { 32 } else { 64 },
        q_in_regs: head_dim <= 128,
        kv_bytes: 2,
        stacks_heads: false,
    }
}

/// The standard tiling over an 8-bit cache: the same tokens per tile (8 KB of K and of V per
/// stage) and four stages, so that about as many bytes are in flight per CTA as in the 16-bit
/// kernel while shared memory still holds two CTAs per SM.
pub const fn fp8_tiling(head_dim: u32) -> MmaTiling {
    MmaTiling { stages: 4, kv_bytes: 1, ..standard_tiling(head_dim) }
}

/// The lean tiling (head_dim 64 and 128): 8 KB of K and of V per stage, at most two 16-row query
/// tiles, warps splitting D for head_dim 128 and the query fragments re-read from shared
/// memory, so that a CTA fits in 128 registers per thread and 52–56 KB of shared memory: four
/// CTAs per SM on sm_90 (three for groups above 16 heads), whose start-up and epilogue overlap
/// each other's copies (short requests). Very short requests stack several KV heads per CTA
/// ([`DecodeParams::stack_shift`]).
pub const fn lean_tiling(head_dim: u32) -> MmaTiling {
    MmaTiling {
        tile_tokens: 4096 / head_dim,
        stages: 3,
        d_parts: if head_dim >= 128 { 2 } else { 1 },
        heads_per_cta: 32,
        q_in_regs: false,
        kv_bytes: 2,
        stacks_heads: true,
    }
}

/// Most query heads a CTA of stacked KV heads covers: one 16-row query tile.
pub const STACKED_MAX_HEADS: u32 = 16;

/// The stack shift of an entry that takes it from [`DecodeParams::stack_shift`] at run time
/// (the 8-bit cache's lean entries); the 16-bit lean entries have one constant shift each.
pub const ANY_STACK_SHIFT: u32 = u32::MAX;

impl MmaTiling {
    /// Most 16-row query tiles a CTA holds: its `heads_per_cta`, or one tile of stacked KV heads
    /// ([`STACKED_MAX_HEADS`]).
    pub const fn max_q_tiles(&self) -> u32 {
        self.heads_per_cta.div_ceil(16)
    }

    /// The roles of warp `warp` of a CTA with `q_tiles` query tiles (`1..=max_q_tiles()`):
    /// query tile `warp % q_tiles`, 16-token block phase `(warp / q_tiles) % phases` and
    /// output-column part `warp / q_tiles / phases`, `phases = 4 / q_tiles / d_parts`. A warp
    /// whose `d_part` is past `d_parts` has no role. The tilings that stack KV heads hold one or
    /// two query tiles: reciprocal multiplies ([`div_small`]), not the division that would
    /// otherwise sit between a lean CTA's wait and its first copies. (The standard tilings
    /// divide: their soft-capped d256 split builds spill with the multiplies.)
    pub const fn warp_roles(&self, warp: u32, q_tiles: u32) -> WarpRoles {
        let warps = DECODE_THREADS / 32;
        if !self.stacks_heads {
            let phases = warps / q_tiles / self.d_parts;
            return WarpRoles {
                q_tile: warp % q_tiles,
                phase: (warp / q_tiles) % phases,
                phases,
                d_part: warp / q_tiles / phases,
            };
        }
        let rest = div_small(warp, q_tiles);
        let phases = div_small(warps, q_tiles) / self.d_parts;
        let d_part = div_small(rest, phases);
        WarpRoles { q_tile: warp - rest * q_tiles, phase: rest - d_part * phases, phases, d_part }
    }
}

/// `n / d` for `n ≤ 8` and `d` in `1..=4`: `n · ceil(128 / d) / 128`, exact in that range.
const fn div_small(n: u32, d: u32) -> u32 {
    const RECIPROCALS: u32 = 128 | (64 << 8) | (43 << 16) | (32 << 24);
    (n * ((RECIPROCALS >> (d.wrapping_sub(1).wrapping_mul(8) & 31)) & 0xff)) >> 7
}

/// A warp's share of a tensor-core decode CTA ([`MmaTiling::warp_roles`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WarpRoles {
    /// The query tile whose 16 rows the warp's fragments hold.
    pub q_tile: u32,
    /// The warp takes 16-token blocks `phase, phase + phases, …` of each tile.
    pub phase: u32,
    pub phases: u32,
    /// The warp's output columns: part `d_part` of `d_parts`.
    pub d_part: u32,
}

/// The lean tiling over an 8-bit cache (head_dim 64 and 128): the 16-bit lean tiling's tokens
/// per tile (4 KB of K and of V per stage), so that a CTA needs about 33 KB of shared memory and,
/// within 128 registers, four run per SM: short requests over an 8-bit cache.
pub const fn fp8_lean_tiling(head_dim: u32) -> MmaTiling {
    MmaTiling { kv_bytes: 1, ..lean_tiling(head_dim) }
}

/// Registers per thread the lean entries are limited to (ptxas `.maxnreg`): four CTAs per SM.
pub const LEAN_MAX_REGISTERS: u32 = 128;
/// Register limits the PTX build sets (`.maxnreg`), by entry name prefix: kept here, among the
/// kernel sources the shipped manifest hashes, so that a change rebuilds the PTX.
pub const MAX_REGISTERS_BY_PREFIX: [(&str, u32); 1] = [("decode_mma_lean_", LEAN_MAX_REGISTERS)];

/// Dynamic shared memory of the tensor-core kernel with `tiling` for `mma_tiles` 16-row query
/// tiles: Q, the K/V stages, the page rows of each stage, the lean tilings' epilogue constants
/// ([`LEAN_EPILOGUE_BYTES`]) and, over an 8-bit cache, a logit factor per query row.
pub const fn mma_smem_bytes(tiling: MmaTiling, head_dim: u32, mma_tiles: u32) -> u32 {
    let q = mma_tiles * 16 * head_dim * 2;
    let kv = tiling.stages * 2 * tiling.tile_tokens * head_dim * tiling.kv_bytes;
    let page_rows = tiling.stages * tiling.tile_tokens * 4;
    let row_scales = if tiling.kv_bytes == 1 { mma_tiles * 16 * 4 } else { 0 };
    q + kv + page_rows + tiling.epilogue_bytes() + row_scales
}

/// Shared memory of the CTA constants a lean CTA's epilogue reads back after its main loop (the
/// chunk's token count and the query-tile count, 16 bytes to keep what follows aligned): at 128
/// registers, ptxas's sm_80 build would otherwise spill them around the loop.
pub const LEAN_EPILOGUE_BYTES: u32 = 16;

impl MmaTiling {
    /// Bytes of the epilogue constants after the page rows: [`LEAN_EPILOGUE_BYTES`] for the
    /// tilings that stack KV heads (the lean ones), none for the others.
    pub const fn epilogue_bytes(&self) -> u32 {
        if self.stacks_heads { LEAN_EPILOGUE_BYTES } else { 0 }
    }
}
/// Largest batch whose page-table entries the split kernels' partition keeps in registers (one
/// per lane), reading the page table once; larger batches re-read it (from L1) on every pass.
/// The partition runs at every CTA's start, so its code size is what counts: unrolled for 8
/// entries per lane, its instruction-cache misses cost ~2 µs per CTA start.
pub const PARTITION_CACHED_BATCH: u32 = 32;
/// Threads of the schedule kernel's one CTA (see `schedule`).
pub const SCHEDULE_THREADS: u32 = 1024;
/// Block sizes the PTX build declares (`.maxntid`), by entry name prefix: an entry launched with
/// more threads than the 128 of the others carries its bound, so that ptxas (and the driver's
/// JIT) fit its registers to it rather than the launch failing for lack of them.
pub const MAX_THREADS_BY_PREFIX: [(&str, u32); 1] = [("schedule_chunks", SCHEDULE_THREADS)];
/// Dynamic shared memory of the schedule kernel: six reduction slots of one u64 per warp.
pub const SCHEDULE_SMEM_BYTES: u32 = 6 * (SCHEDULE_THREADS / 32) * 8;
/// Bytes of the item map for `num_chunks` items: a two-word header, then two words per item.
pub const fn item_map_bytes(num_chunks: u32) -> usize {
    8 + 8 * num_chunks as usize
}
/// Most chunks one request is split into (the merge combines up to 64 partials per row).
pub const MAX_CHUNKS_PER_REQUEST: u32 = 64;
/// Partial rows each lane of the tensor-core kernels' split merge keeps in flight: one L2 round
/// trip per this many chunks of a request (16 × D/32 f32 registers; 8 at D = 256, whose rows are
/// twice as wide).
pub const fn decode_merge_batch(head_dim: u32) -> u32 {
    if head_dim > 128 { 8 } else { 16 }
}
