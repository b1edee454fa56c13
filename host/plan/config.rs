//! The launch-configuration rules of the decode plan: which kernel, how many chunks per request,
//! the lean kernel's launch and the workspace layout, chosen from the descriptor and the device
//! (never from the lengths, which live on the device).
//!
//! Vocabulary (the kernels'): a *chunk* is a token range of one request that one CTA processes
//! (per KV head and head block); a request that is not split is one chunk. A *chunk index* is a
//! chunk's position in the partition, `0..num_chunks` (the kernels call it an *item*: their
//! `balance_items` and `item_map` are [`DecodeConfig::balance_chunks`] and the chunk map here).

use crate::device::DeviceProps;
use crate::error::{Error, Result};
use crate::params;
use crate::ptx::entry;
use crate::types::*;

use super::checks::check_decode_descriptor;

/// Head dimensions with compiled kernels.
pub const SUPPORTED_HEAD_DIMS: [i32; 3] = [64, 128, 256];
/// Most tokens a decode's page table may hold (`indices.len() × page_size`, 2^32 - 16): the
/// kernels count a request's tokens in u32 and round chunk sizes up to 16 tokens, which must not
/// wrap.
pub const MAX_TABLE_TOKENS: u64 = u32::MAX as u64 - 15;
/// Upper bound on KV splits per request.
pub const MAX_SPLITS: u32 = params::MAX_CHUNKS_PER_REQUEST;
/// Preferred chunk, in pipeline tiles: one with fewer tiles is mostly fixed latency.
const PREFERRED_CHUNK_TILES: u32 = 4;
/// Grid y limit: the split kernels' chunks run along y.
const MAX_GRID_Y: u32 = 65535;
/// Fraction of the last wave of CTAs that must be busy before splitting stops.
const WAVE_EFFICIENCY: f64 = 0.85;
/// Default bound of [`PlanPreference::lean_max_avg_tokens`]: page tables holding at most this
/// many tokens per request run the lean kernel when the batch fills more than a wave, or when
/// they hold at most one lean tile per request ([`DecodeConfig::path`]).
pub const LEAN_MAX_AVG_TOKENS: u32 = 256;
/// Tokens a lean CTA that stacks KV heads may carry at the batch's average length (KV heads ×
/// tokens per request): as many as one lean CTA of the longest average the lean rule allows.
pub const STACK_MAX_TOKENS: u32 = LEAN_MAX_AVG_TOKENS;
/// A lean CTA's fixed cost (page lookups, Q staging, epilogue) in pipeline steps of its chain.
/// On one SM a CTA's time grows by about one step per tile, whether or not the tile was already
/// in flight (batch-1 rows: 2.6 µs for one tile, +0.8 µs per further tile), and the fixed part
/// is about one step more (runs 89–90, [`LeanLaunch::stack_shift`]).
pub const LEAN_CTA_FIXED_TILES: u64 = 1;
/// Tiles of the standard kernel's pipeline up to which a request is never worth splitting: a
/// split's partition and merge cost more than the one tile it would take off the chain (batch 1
/// at 128 tokens: 3.6 µs whole, 4.7 split, run 89).
pub const UNSPLIT_MAX_TILES: u64 = 2;
/// Lean waves of CTAs from which the lean kernel runs over a scheduled partition
/// ([`DecodePath::LeanScheduled`]), and the spare chunks of that partition in lean waves' worth
/// of chunks: a request is cut only when it is longer than a quarter of a lean CTA slot's share
/// of the batch's tokens, so equal lengths stay whole, and a long request's chunks take at most
/// about a quarter of the launch.
pub const LEAN_SPLIT_WAVES: u32 = 4;
/// Largest batch whose spare-chunk partition every CTA of the split kernel derives itself rather
/// than the schedule kernel once ([`DecodeConfig::partitions_in_every_cta`]). A spare-chunk
/// partition is balanced over a wave's chunks: equal lengths stay whole after one pass over the
/// page table, ragged ones take a short search. At up to 64 requests (two page-table entries per
/// lane) that costs a CTA less than the schedule kernel's launch and the wait for it cost the
/// launch: 1–16 % faster on 33–64 requests in the default launch, 0–4 % with the promise, the
/// other rows within ±0.5 % (runs 207–208). Fixed splits cut every request, so every CTA takes
/// all the partition's passes, and again in every wave of their larger grids: 3–7 % slower, so
/// they keep the schedule kernel.
pub const PER_CTA_PARTITION_MAX_BATCH: i32 = 64;
/// Registers of one SM (sm_80 and sm_90).
const REGISTERS_PER_SM: u32 = 65536;
/// Shared memory the driver reserves per resident CTA (sm_80 and sm_90).
const SMEM_RESERVED_PER_CTA: u32 = 1024;

/// CTAs of `smem_bytes` dynamic shared memory each that one SM's shared memory holds.
fn ctas_per_sm_by_smem(props: &DeviceProps, smem_bytes: u32) -> u32 {
    props.smem_per_sm / (smem_bytes + SMEM_RESERVED_PER_CTA)
}

/// Which decode kernel a plan launches.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DecodeKernel {
    /// Tensor-core kernel for f16 / bf16.
    Mma,
    /// CUDA-core kernel (f32).
    Simt,
}

/// CTAs per SM that a plan's decode entries can keep resident, as the driver's occupancy
/// calculator reports them ([`DecodeConfig::choose_residency`]); shared memory may allow more.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Residency {
    /// The split entry (split and scheduled paths, spare chunks).
    pub split: u32,
    /// The unsplit entry (whole path).
    pub whole: u32,
}

impl Residency {
    /// No bound beyond shared memory.
    pub const UNBOUNDED: Self = Self::both(u32::MAX);

    /// The same bound for both entries.
    pub const fn both(ctas_per_sm: u32) -> Self {
        Self { split: ctas_per_sm, whole: ctas_per_sm }
    }
}

/// Launch configuration chosen by rule from the descriptor and the device (never from lengths,
/// which live on the device).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DecodeConfig {
    /// Which decode kernel is launched.
    pub kernel: DecodeKernel,
    /// CTAs per (request, KV head) along the query heads of the group.
    pub head_blocks: u32,
    /// 16-row query tiles of the fullest head block.
    pub q_tiles: u32,
    /// Dynamic shared memory per CTA.
    pub smem_bytes: u32,
    /// Chunks per request at equal lengths; > 1 adds the merge pass and needs a workspace. The
    /// kernel then partitions `batch × num_splits` chunks by the actual lengths: long requests
    /// get more chunks than short ones.
    pub num_splits: u32,
    /// Chunks beyond `batch × num_splits` that only lengths longer than the batch's average use
    /// (a long request among short ones is split further); > 0 also selects the split kernel.
    pub spare_chunks: u32,
    /// With spare chunks: the chunks one wave of CTAs holds. The kernel keeps chunks at least
    /// `total tokens / balance_chunks` long, so a long request is cut to about a wave's share and
    /// equal lengths stay whole. 0 otherwise.
    pub balance_chunks: u32,
    /// Split kernels: consecutive CTAs cover the KV heads and head blocks of one chunk (true), or
    /// consecutive chunks of one head block (false, as the unsplit kernels).
    pub heads_along_x: bool,
    /// Smallest chunk a split takes, in tokens.
    pub min_chunk: u32,
    /// Chunk size the kernel prefers when half the chunks stay busy (four tiles).
    pub preferred_chunk: u32,
    /// CTAs resident at once on the device (SMs × CTAs per SM): one wave.
    pub wave_ctas: u32,
    /// The lean kernel's launch (16-bit and 8-bit caches, head_dim 64 or 128), which `run` takes for
    /// short requests ([`PlanPreference::lean_max_avg_tokens`]).
    pub lean: Option<LeanLaunch>,
    /// Spare chunks of the lean kernel's scheduled partition ([`DecodePath::LeanScheduled`]),
    /// which also balances over them: a request longer than `total tokens / lean_spare_chunks`
    /// is cut into chunks of about that length. 0: the lean kernel never splits.
    pub lean_spare_chunks: u32,
    /// The plan's sliding window ([`AttentionVariantDescriptor::window_left`]; `choose` leaves
    /// it `None`): no request attends to more than `window_left + 1` tokens, which bounds the
    /// chunks launched and the lean rule's tokens per request ([`Self::attended_tokens`]).
    pub window_left: Option<u32>,
}

/// Which kernel `run` launches for a page table of a given size
/// ([`BatchPagedDecodePlan::path`](super::BatchPagedDecodePlan::path)).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DecodePath {
    /// The standard kernel, one CTA per request (and KV head, head block).
    Whole,
    /// The lean kernel, one CTA per request: short requests ([`DecodeConfig::lean`]).
    Lean,
    /// The split kernel, each CTA deriving the length-aware partition from the page table.
    Split,
    /// The schedule kernel computes the partition once, then the split kernel runs
    /// ([`DecodeConfig::partitions_in_every_cta`]).
    Scheduled,
    /// Short requests over many lean waves: the schedule kernel computes a partition that cuts
    /// only requests much longer than the average ([`DecodeConfig::lean_spare_chunks`]), then
    /// the lean split kernel runs.
    LeanScheduled,
}

impl DecodePath {
    /// Short lowercase name (bench rows, logs).
    pub fn name(self) -> &'static str {
        match self {
            DecodePath::Whole => "whole",
            DecodePath::Lean => "lean",
            DecodePath::Split => "split",
            DecodePath::Scheduled => "scheduled",
            DecodePath::LeanScheduled => "lean-scheduled",
        }
    }

    /// Whether the launch splits requests (partials, a merge and a workspace).
    pub fn splits(self) -> bool {
        matches!(self, DecodePath::Split | DecodePath::Scheduled | DecodePath::LeanScheduled)
    }
}

/// The length-aware partition a splitting launch asks of the kernels (the `num_chunks`,
/// `min_chunk`, `preferred_chunk` and `balance_items` of its parameter block; see
/// `kernels-gpu/src/partition.rs`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ChunkPartition {
    /// Chunks per head block.
    pub num_chunks: u32,
    /// Smallest chunk, in tokens.
    pub min_chunk: u32,
    /// Chunk size preferred while half the chunks stay busy.
    pub preferred_chunk: u32,
    /// Chunks at least `total tokens / balance_chunks` long (0: no such bound).
    pub balance_chunks: u32,
    /// Consecutive CTAs cover the KV heads and head blocks of one chunk (grid x), as
    /// [`DecodeConfig::heads_along_x`].
    pub heads_along_x: bool,
}

impl ChunkPartition {
    /// CTAs per head block along the chunk dimension for `batch` requests of at most `tokens`
    /// tokens together (`max_items` in `kernels-gpu/src/chunking.rs`).
    pub fn launched_chunks(&self, batch: u32, tokens: u64) -> u32 {
        crate::chunking::max_items(
            batch,
            self.num_chunks,
            tokens,
            self.min_chunk,
            self.preferred_chunk,
            self.balance_chunks,
        )
    }
}

/// Launch shape of the lean tensor-core kernel (`params::lean_tiling` in `kernels-gpu`): whole
/// requests, at most 32 query heads per CTA; four CTAs per SM on sm_90 for groups of up to 16
/// query heads per KV head, three for larger groups (shared memory). Very short requests stack
/// several KV heads per CTA ([`Self::stack_shift`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LeanLaunch {
    /// CTAs per (request, KV head) along the query heads of the group.
    pub head_blocks: u32,
    /// Dynamic shared memory per CTA.
    pub smem_bytes: u32,
    /// CTAs resident at once on the device (SMs × CTAs per SM by shared memory and the entries'
    /// register cap): one lean wave.
    pub wave_ctas: u32,
    /// K/V tokens per pipeline tile.
    pub tile_tokens: u32,
    /// SMs of the device: stacking never leaves one without a CTA.
    pub sm_count: u32,
}

impl LeanLaunch {
    /// The lean launch for `desc`, when the lean kernel covers its element type and head_dim
    /// and the device has the shared memory.
    fn for_descriptor(desc: &BatchPagedDecodeDescriptor, props: &DeviceProps) -> Option<Self> {
        let kv = &desc.paged_kv;
        let d = kv.head_dim as u32;
        let fp8 = kv.element.fp8_layout().is_some();
        if !(fp8 || matches!(kv.element, ElementKind::F16 | ElementKind::BF16))
            || !entry::LEAN_HEAD_DIMS.contains(&d)
        {
            return None;
        }
        let tiling = if fp8 { params::fp8_lean_tiling(d) } else { params::lean_tiling(d) };
        let group = (desc.num_qo_heads / kv.num_kv_heads.max(1)).max(0) as u32;
        let q_tiles = group.min(tiling.heads_per_cta).div_ceil(16);
        let smem_bytes = params::mma_smem_bytes(tiling, d, q_tiles);
        let head_blocks = group.div_ceil(tiling.heads_per_cta);
        let grid_y = kv.num_kv_heads.max(0) as u64 * head_blocks as u64;
        let by_registers = REGISTERS_PER_SM / (params::LEAN_MAX_REGISTERS * params::DECODE_THREADS);
        let per_sm = ctas_per_sm_by_smem(props, smem_bytes).clamp(1, by_registers);
        let wave_ctas = props.sm_count.max(1).saturating_mul(per_sm);
        (smem_bytes <= props.smem_per_block_optin && grid_y <= MAX_GRID_Y as u64).then_some(Self {
            head_blocks,
            smem_bytes,
            wave_ctas,
            tile_tokens: tiling.tile_tokens,
            sm_count: props.sm_count,
        })
    }

    /// CTAs per request, one KV head each (one per KV head and head block).
    pub fn ctas_per_request(&self, desc: &BatchPagedDecodeDescriptor) -> u64 {
        desc.paged_kv.num_kv_heads.max(0) as u64 * self.head_blocks as u64
    }

    /// log2 of the KV heads each lean CTA covers (`DecodeParams::stack_shift`) when the page
    /// table holds `tokens` attended tokens. The candidates `k`, up to `max_heads`:
    /// - a power of two dividing `num_kv_heads`, whose query heads fit one 16-row query tile
    ///   (`params::STACKED_MAX_HEADS`);
    /// - carrying at most [`STACK_MAX_TOKENS`] tokens per CTA at the batch's average length, so
    ///   that only very short requests stack (and a long request of a ragged batch only when the
    ///   average is that short);
    /// - leaving no SM without a CTA (one KV head per CTA always qualifies).
    ///
    /// Of those, the cheapest by [`Self::stacking_cost`], the most heads among equals. 0 (one KV
    /// head per CTA) when nothing stacks. Total on any descriptor.
    ///
    /// The lean kernel never splits a request, so in a stacked batch a long request among very
    /// short ones takes `k` times its own time in one CTA (its KV heads in turn): the bound on
    /// the average keeps such batches rare, and the scheduled path is the one for ragged batches
    /// whose average is longer.
    pub fn stack_shift(&self, desc: &BatchPagedDecodeDescriptor, tokens: u64, max_heads: u32) -> u32 {
        let kv_heads = desc.paged_kv.num_kv_heads.max(0) as u32;
        let batch = desc.batch_size.max(0) as u64;
        if kv_heads == 0 || batch == 0 || self.head_blocks != 1 {
            return 0;
        }
        let group = (desc.num_qo_heads.max(0) as u32 / kv_heads).max(1);
        let avg_tokens = tokens.div_ceil(batch).max(1);
        let ctas = |shift: u32| batch * (kv_heads >> shift) as u64;
        let allowed = |shift: u32| {
            let heads = 1u32 << shift;
            heads <= max_heads
                && kv_heads.is_multiple_of(heads)
                && group.saturating_mul(heads) <= params::STACKED_MAX_HEADS
                && avg_tokens.saturating_mul(heads as u64) <= STACK_MAX_TOKENS as u64
                && ctas(shift) >= self.sm_count as u64
        };
        let cost = |shift: u32| self.stacking_cost(ctas(shift), avg_tokens, 1 << shift);
        let mut best = 0;
        for shift in 1..=params::STACKED_MAX_HEADS.trailing_zeros() {
            if allowed(shift) && cost(shift) <= cost(best) {
                best = shift;
            }
        }
        best
    }

    /// The time model the stacking rule minimises, in units of one pipeline step of one CTA's
    /// chain times `wave_ctas`: `ctas` CTAs of `heads` KV heads of requests of `tokens` tokens
    /// each run the chain of their fixed cost and their tiles ([`LEAN_CTA_FIXED_TILES`],
    /// [`Self::stacked_tiles`]), once per wave of CTAs, and no faster than one wave takes.
    /// Stacking shortens the launch by fewer waves and lengthens each CTA's chain once its tiles
    /// were already full. Measured in run 90 on 38 batches of 64–16384 requests of 16–128
    /// tokens (groups 1 and 4, head_dim 64 and 128, every allowed `k`): the rule picks the
    /// fastest `k` on 35 and one within 2.1 % of it on the other three (on two of them the token
    /// bound rules out the fastest).
    pub fn stacking_cost(&self, ctas: u64, tokens: u64, heads: u32) -> u128 {
        let chain = LEAN_CTA_FIXED_TILES + self.stacked_tiles(tokens, heads);
        chain as u128 * ctas.max(self.wave_ctas as u64) as u128
    }

    /// Pipeline tiles of a CTA stacking `heads` KV heads (a power of two) of a request of
    /// `tokens` tokens: its tiles hold segments of `max(16, tile_tokens / heads)` tokens of
    /// `tile_tokens / segment` heads each (the kernel's `KvPipeline`).
    pub fn stacked_tiles(&self, tokens: u64, heads: u32) -> u64 {
        let tile_tokens = self.tile_tokens.max(16);
        let segment = (tile_tokens / heads.max(1)).max(16);
        tokens.div_ceil(segment as u64).saturating_mul(heads as u64 * segment as u64) / tile_tokens as u64
    }
}

impl DecodeConfig {
    /// Picks the kernel and the split count from the number of (request, KV head, head block)
    /// CTAs: half a wave or less, as many splits as one full wave holds (in whole merge batches
    /// while 90 % of the wave stays busy); up to one poorly filled wave, no split but spare
    /// chunks for long requests; one well-filled wave, no split; more than a wave, no split but
    /// a wave's worth of spare chunks (equal lengths stay whole, a long request is cut to a
    /// wave's share); otherwise enough splits that the last wave is at least 85 % busy. Capped
    /// by [`MAX_SPLITS`], the grid and `max_workspace_bytes`.
    ///
    /// One wave is `sm_count` times the CTAs per SM that shared memory allows; see
    /// [`Self::choose_residency`] for entries whose registers allow fewer.
    ///
    /// A descriptor `select` would reject gets the same typed error here.
    pub fn choose(
        desc: &BatchPagedDecodeDescriptor,
        props: &DeviceProps,
        max_workspace_bytes: usize,
    ) -> Result<Self> {
        Self::choose_residency(desc, props, max_workspace_bytes, Residency::UNBOUNDED)
    }

    /// [`Self::choose`] for a tensor-core kernel of which at most `resident_per_sm` CTAs fit on
    /// an SM, for its split and its unsplit entry alike ([`Self::choose_residency`]).
    pub fn choose_resident(
        desc: &BatchPagedDecodeDescriptor,
        props: &DeviceProps,
        max_workspace_bytes: usize,
        resident_per_sm: u32,
    ) -> Result<Self> {
        Self::choose_residency(desc, props, max_workspace_bytes, Residency::both(resident_per_sm))
    }

    /// [`Self::choose`] for tensor-core entries of which at most `residency` CTAs fit on an SM
    /// (what the driver's occupancy calculator reports for the loaded entries: their register
    /// counts, which the driver's JIT decides, may hold fewer CTAs than shared memory does). A
    /// wave sized by CTAs that cannot be resident would leave a partial second wave.
    ///
    /// Two waves, one per entry. The split count and the spare chunks are sized by the split
    /// entry's (`wave_ctas`, the kernel that runs them); whole requests without spare chunks
    /// need one chunk per request to fill one wave of each entry well (the unsplit kernel runs
    /// them, and equal residencies make this the one-wave rule). They differ where the 8-bit
    /// head_dim-256 entries assemble to different register counts (split three CTAs per SM,
    /// unsplit two): batches of 43–49 requests × 8 KV heads then take one split wave of whole
    /// requests with spare chunks, where one residency for both entries gave two splits sized
    /// by the unsplit wave (0.96–0.98× the time at equal lengths, 1.04–1.06× with one 32k-token
    /// request among 2k ones, run 145).
    /// The f32 CUDA-core kernel's wave stays at 16 CTAs per SM, as `select` asks the driver only
    /// for the tensor-core kernels: its 61 registers hold 8, but counting those measured slower
    /// on some rows (run 147; the kernel is bound by its arithmetic, not its bytes).
    ///
    /// Lean launches of at least [`LEAN_SPLIT_WAVES`] waves of unstacked CTAs take the lean
    /// kernel's scheduled partition ([`Self::lean_spare_chunks`]) where the workspace holds it.
    pub fn choose_residency(
        desc: &BatchPagedDecodeDescriptor,
        props: &DeviceProps,
        max_workspace_bytes: usize,
        residency: Residency,
    ) -> Result<Self> {
        let config = Self::choose_split(desc, props, max_workspace_bytes, residency)?;
        let lean_split = Self { lean_spare_chunks: config.lean_split_spare(desc), ..config };
        Ok(if lean_split.fits(desc, max_workspace_bytes) { lean_split } else { config })
    }

    /// The kernel, split count and spare chunks of [`Self::choose_residency`].
    fn choose_split(
        desc: &BatchPagedDecodeDescriptor,
        props: &DeviceProps,
        max_workspace_bytes: usize,
        residency: Residency,
    ) -> Result<Self> {
        check_decode_descriptor(desc)?;
        let kv = &desc.paged_kv;
        let group = (desc.num_qo_heads / kv.num_kv_heads) as u32;
        let d = kv.head_dim as u32;
        let (kernel, head_blocks, q_tiles, smem_bytes, per_sm) = match kv.element {
            ElementKind::F32 => (DecodeKernel::Simt, 1, 0, 0, Residency::both(16)),
            element => {
                let tiling = if element.fp8_layout().is_some() {
                    params::fp8_tiling(d)
                } else {
                    params::standard_tiling(d)
                };
                let per_cta = tiling.heads_per_cta;
                let head_blocks = group.div_ceil(per_cta);
                let q_tiles = group.min(per_cta).div_ceil(16);
                let smem = params::mma_smem_bytes(tiling, d, q_tiles);
                if smem > props.smem_per_block_optin {
                    return Err(Error::Unsupported(format!(
                        "head_dim {d} needs {smem} bytes of shared memory per block; the device allows {}",
                        props.smem_per_block_optin
                    )));
                }
                let by_smem = ctas_per_sm_by_smem(props, smem);
                let per_sm = |resident: u32| by_smem.min(resident).clamp(1, 16);
                let per_sm = Residency { split: per_sm(residency.split), whole: per_sm(residency.whole) };
                (DecodeKernel::Mma, head_blocks, q_tiles, smem, per_sm)
            }
        };
        let sm_count = props.sm_count.max(1) as u64;
        let wave = sm_count * per_sm.split as u64;
        let whole_wave = sm_count * per_sm.whole as u64;
        let efficiency = |ctas: u64, wave: u64| ctas as f64 / (ctas.div_ceil(wave) * wave) as f64;
        let min_chunk = match kernel {
            DecodeKernel::Mma => params::standard_tiling(d).tile_tokens,
            DecodeKernel::Simt => 64,
        };
        let probe = Self {
            kernel,
            head_blocks,
            q_tiles,
            smem_bytes,
            num_splits: 1,
            spare_chunks: 0,
            balance_chunks: 0,
            heads_along_x: true,
            min_chunk,
            preferred_chunk: PREFERRED_CHUNK_TILES * min_chunk,
            wave_ctas: wave.min(u32::MAX as u64) as u32,
            lean: LeanLaunch::for_descriptor(desc, props),
            lean_spare_chunks: 0,
            window_left: None,
        };
        let base = desc.batch_size.max(0) as u64 * probe.ctas_per_chunk(desc); // CTAs, unsplit
        let fits = |s: u32| Self { num_splits: s, ..probe }.fits(desc, max_workspace_bytes);
        if 2 * base <= wave {
            // Half a wave or less: split as far as one full wave holds (more CTAs in flight,
            // shorter chunks), within MAX_SPLITS and the workspace.
            let mut most = (wave / base.max(1)).min(MAX_SPLITS as u64) as u32;
            if kernel == DecodeKernel::Mma {
                // A split count just past a multiple of the merge's batch costs a whole merge
                // round trip for a few more CTAs: round down while 90 % of the wave stays busy.
                let batch = params::decode_merge_batch(d);
                let down = most / batch * batch;
                if down > 0 && 10 * down as u64 * base >= 9 * wave {
                    most = down;
                }
            }
            let num_splits = (1..=most).rev().find(|&s| s == 1 || fits(s)).unwrap_or(1);
            return Ok(Self { num_splits, ..probe });
        }
        let one_well_filled = |wave: u64| base <= wave && efficiency(base, wave) >= WAVE_EFFICIENCY;
        if one_well_filled(whole_wave) && one_well_filled(wave) {
            // One chunk per request fills one wave of either kernel well: no spare chunks
            // (within one wave they would split equal lengths). Filling the unsplit wave alone
            // is not enough: the unsplit kernel would then run a long request whole (run 144).
            return Ok(probe);
        }
        if base > wave && efficiency(base, wave) >= WAVE_EFFICIENCY {
            // Several well-filled waves: one chunk per request at equal lengths, and a wave's
            // worth of spare chunks that cut a long request to a wave's share (`total /
            // wave_chunks` tokens, which exceeds the average length, so equal lengths stay whole).
            let with_spare = probe.with_spare(desc, probe.wave_chunks(desc));
            if with_spare.fits(desc, max_workspace_bytes) {
                return Ok(with_spare);
            }
            return Ok(probe);
        }
        if base <= wave {
            // Up to one poorly filled wave: one chunk per request at equal lengths (splitting
            // them measured slower), plus spare chunks (fewer than `batch`, so equal lengths stay
            // whole) for requests longer than a wave's share.
            let spare = probe.wave_chunks(desc).min(desc.batch_size as u32 - 1);
            let mut with_spare = probe.with_spare(desc, spare);
            if kernel == DecodeKernel::Mma && base <= wave - sm_count {
                // Whole requests that leave a CTA slot free on every SM (entries of three or
                // more per SM): chunk-major, so that every KV head of a long request's chunks
                // starts in the first wave. Measured on a 32k-token request among 31 of 1k:
                // 0.86–0.90× the time, equal lengths within 1.3 % (run 145); with two per SM,
                // head-major measured faster (run 21).
                with_spare.heads_along_x = true;
            }
            if spare > 0 && with_spare.fits(desc, max_workspace_bytes) {
                return Ok(with_spare);
            }
        }
        // Split until the last wave is busy enough.
        let mut best = (efficiency(base, wave), 1);
        for s in 2..=MAX_SPLITS {
            if !fits(s) {
                break;
            }
            let e = efficiency(base * s as u64, wave);
            if e > best.0 + 1e-9 {
                best = (e, s);
            }
            if e >= WAVE_EFFICIENCY {
                break;
            }
        }
        Ok(Self { num_splits: best.1, ..probe })
    }

    /// CTAs per chunk: one per KV head and head block.
    fn ctas_per_chunk(&self, desc: &BatchPagedDecodeDescriptor) -> u64 {
        desc.paged_kv.num_kv_heads.max(1) as u64 * self.head_blocks.max(1) as u64
    }

    /// The lean kernel's spare chunks by the rule: [`LEAN_SPLIT_WAVES`] lean waves' worth of
    /// chunks, for a scheduled configuration of a 16-bit cache (the 8-bit caches have no lean
    /// split entry) whose batch fills that many lean waves; 0 otherwise.
    fn lean_split_spare(&self, desc: &BatchPagedDecodeDescriptor) -> u32 {
        match self.lean {
            Some(lean) if self.is_scheduled(desc) && desc.paged_kv.element.fp8_layout().is_none() => {
                let per_chunk = lean.ctas_per_request(desc);
                let spare = LEAN_SPLIT_WAVES as u64 * (lean.wave_ctas as u64 / per_chunk.max(1)).max(1);
                let batch = desc.batch_size.max(0) as u64;
                if batch.saturating_mul(per_chunk) >= LEAN_SPLIT_WAVES as u64 * lean.wave_ctas as u64 {
                    spare.min(u32::MAX as u64) as u32
                } else {
                    0
                }
            }
            _ => 0,
        }
    }

    /// This configuration with `lean_spare_chunks` ([`PlanPreference::lean_spare_chunks`]); 0
    /// turns the lean kernel's split off.
    pub fn with_lean_spare_chunks(
        self,
        desc: &BatchPagedDecodeDescriptor,
        lean_spare_chunks: u32,
    ) -> Result<Self> {
        Self { lean_spare_chunks, ..self }.within_grid(desc, "batch_size + lean_spare_chunks")
    }

    /// The partition a splitting launch on `path` asks of the kernels: on
    /// [`DecodePath::LeanScheduled`], `batch + lean_spare_chunks` chunks balanced over the spare
    /// ones, at least a lean tile each, chunk-major (its launches span several waves); otherwise
    /// the configuration's.
    pub fn partition(&self, desc: &BatchPagedDecodeDescriptor, path: DecodePath) -> ChunkPartition {
        match (path, self.lean) {
            (DecodePath::LeanScheduled, Some(lean)) => ChunkPartition {
                num_chunks: (desc.batch_size.max(0) as u64 + self.lean_spare_chunks as u64)
                    .min(u32::MAX as u64) as u32,
                min_chunk: lean.tile_tokens,
                preferred_chunk: PREFERRED_CHUNK_TILES.saturating_mul(lean.tile_tokens),
                balance_chunks: self.lean_spare_chunks,
                heads_along_x: true,
            },
            _ => ChunkPartition {
                num_chunks: self.num_chunks(desc),
                min_chunk: self.min_chunk,
                preferred_chunk: self.preferred_chunk,
                balance_chunks: self.balance_chunks,
                heads_along_x: self.heads_along_x,
            },
        }
    }

    /// CTAs per SM the wave counts (`wave_ctas / sm_count`).
    pub fn ctas_per_sm(&self, props: &DeviceProps) -> u32 {
        self.wave_ctas / props.sm_count.max(1)
    }

    /// Chunks that one wave of CTAs holds (each takes a CTA per KV head and head block).
    fn wave_chunks(&self, desc: &BatchPagedDecodeDescriptor) -> u32 {
        (self.wave_ctas as u64 / self.ctas_per_chunk(desc)).max(1) as u32
    }

    /// This configuration with `spare_chunks` spare chunks and, with any, the balance bound.
    /// Measured CTA orders: chunk-major for split requests and for grids beyond one wave,
    /// head-major for unsplit requests with spare chunks within one wave (the rule makes those
    /// chunk-major too when they leave a CTA slot free on every SM; see `choose_residency`).
    fn with_spare(self, desc: &BatchPagedDecodeDescriptor, spare_chunks: u32) -> Self {
        let balance_chunks = if spare_chunks > 0 { self.wave_chunks(desc) } else { 0 };
        let beyond_a_wave =
            (desc.batch_size.max(0) as u64).saturating_mul(self.ctas_per_chunk(desc)) > self.wave_ctas as u64;
        let heads_along_x = self.num_splits > 1 || beyond_a_wave;
        Self { spare_chunks, balance_chunks, heads_along_x, ..self }
    }

    /// This configuration with `spare_chunks` spare chunks ([`PlanPreference::spare_chunks`]).
    pub fn with_spare_chunks(self, desc: &BatchPagedDecodeDescriptor, spare_chunks: u32) -> Result<Self> {
        self.with_spare(desc, spare_chunks).within_grid(desc, "batch_size × num_splits + spare_chunks")
    }

    /// This configuration with `num_splits` chunks per request at equal lengths and no spare
    /// chunks ([`PlanPreference::num_splits`]).
    pub fn with_num_splits(self, desc: &BatchPagedDecodeDescriptor, num_splits: u32) -> Result<Self> {
        if !(1..=MAX_SPLITS).contains(&num_splits) {
            return Err(Error::Unsupported(format!("num_splits {num_splits} is outside 1..={MAX_SPLITS}")));
        }
        Self { num_splits, spare_chunks: 0, balance_chunks: 0, heads_along_x: true, ..self }
            .within_grid(desc, "batch_size × num_splits")
    }

    /// Whether the split kernels' chunks fit along grid y.
    fn grid_holds(&self, desc: &BatchPagedDecodeDescriptor) -> bool {
        !self.is_split() || self.workspace_chunks(desc) <= MAX_GRID_Y
    }

    /// Chunks the workspace holds partials for: the configuration's, and the lean kernel's
    /// scheduled partition's when it has one.
    fn workspace_chunks(&self, desc: &BatchPagedDecodeDescriptor) -> u32 {
        let chunks = self.num_chunks(desc);
        if self.has_lean_partition(desc) {
            chunks.max(self.partition(desc, DecodePath::LeanScheduled).num_chunks)
        } else {
            chunks
        }
    }

    /// Whether the lean kernel may run over a scheduled partition ([`DecodePath::LeanScheduled`]):
    /// spare chunks for it in a scheduled configuration, whose workspace holds the item map.
    pub fn has_lean_partition(&self, desc: &BatchPagedDecodeDescriptor) -> bool {
        self.lean_spare_chunks > 0 && self.is_scheduled(desc)
    }

    /// This configuration, or [`Error::Unsupported`] naming its chunk count `what` when the
    /// grid cannot hold it.
    fn within_grid(self, desc: &BatchPagedDecodeDescriptor, what: &str) -> Result<Self> {
        if !self.grid_holds(desc) {
            return Err(Error::Unsupported(format!(
                "{what} = {} exceeds the grid limit {MAX_GRID_Y}",
                self.workspace_chunks(desc)
            )));
        }
        Ok(self)
    }

    /// Whether the workspace and the grid hold this configuration.
    fn fits(&self, desc: &BatchPagedDecodeDescriptor, max_workspace_bytes: usize) -> bool {
        self.workspace_size(desc) <= max_workspace_bytes && self.grid_holds(desc)
    }

    /// Chunks per head block, `batch × num_splits + spare_chunks` (grid y of the split kernels,
    /// whose CTAs partition the requests into them by length on the device; grid x = requests
    /// otherwise).
    pub fn num_chunks(&self, desc: &BatchPagedDecodeDescriptor) -> u32 {
        let chunks = desc.batch_size.max(0) as u64 * self.num_splits as u64 + self.spare_chunks as u64;
        chunks.min(u32::MAX as u64) as u32
    }

    /// CTAs per head block the launch has along its chunk dimension for a page table of
    /// `num_indices` slots: one per request unsplit; split, `num_chunks`, or fewer when that many
    /// slots cannot hold enough tokens to use them all (a short request in a one-wave grid). The
    /// kernel's partition stays the one of `num_chunks`; a bound on the chunk size it picks shows
    /// that it never produces more chunks than this (`chunking::max_items`). A page-table view
    /// sized to the batch's pages (rather than to the largest batch a server expects) lets short
    /// batches launch fewer CTAs.
    pub fn launched_chunks(&self, desc: &BatchPagedDecodeDescriptor, num_indices: usize) -> u32 {
        let batch = desc.batch_size.max(0) as u32;
        if !self.is_split() {
            return batch;
        }
        let tokens = self.attended_tokens(desc, num_indices);
        self.partition(desc, DecodePath::Scheduled).launched_chunks(batch, tokens)
    }

    /// Most tokens a batch with a page table of `num_indices` slots attends to: the slots'
    /// tokens, and at most `window_left + 1` per request with a window (the kernels partition
    /// only the windows' tokens).
    pub fn attended_tokens(&self, desc: &BatchPagedDecodeDescriptor, num_indices: usize) -> u64 {
        let capacity = (num_indices as u64).saturating_mul(desc.paged_kv.page_size.max(0) as u64);
        match self.window_left {
            Some(w) => capacity.min((desc.batch_size.max(0) as u64).saturating_mul(w as u64 + 1)),
            None => capacity,
        }
    }

    /// The kernel `run` launches for a page table of `num_indices` slots, when the lean kernel
    /// takes up to `lean_max_avg_tokens` tokens per request (`None`: not loaded):
    /// - lean, when the table holds at most `lean_max_avg_tokens` tokens per request and either
    ///   the batch's lean CTAs fill more than one wave of the standard kernel's, or the table
    ///   holds at most one lean tile of tokens per request (within a wave, the lean CTA's
    ///   shorter chain wins only then: its tiles are half the standard kernel's); lean over a
    ///   scheduled partition when the configuration has one ([`Self::lean_spare_chunks`]), the
    ///   launch has at least [`LEAN_SPLIT_WAVES`] lean waves and the rule stacks no KV heads:
    ///   a long request among short ones then no longer runs whole on one CTA per KV head;
    /// - whole, when the configuration does not split, the table is too short for any request
    ///   to take two chunks, or it holds so few tokens that no request is worth splitting
    ///   ([`Self::unsplit_max_tokens`]): the same work without the partition, the workspace or
    ///   the merge;
    /// - split when every CTA derives the partition ([`Self::partitions_in_every_cta`]), scheduled
    ///   otherwise.
    pub fn path(
        &self,
        desc: &BatchPagedDecodeDescriptor,
        num_indices: usize,
        lean_max_avg_tokens: Option<u32>,
    ) -> DecodePath {
        let batch = desc.batch_size.max(0) as u64;
        let tokens = self.attended_tokens(desc, num_indices);
        if let (Some(lean), Some(bound)) = (self.lean, lean_max_avg_tokens) {
            let ctas = batch.saturating_mul(lean.ctas_per_request(desc));
            let fills =
                ctas > self.wave_ctas as u64 || tokens <= (lean.tile_tokens as u64).saturating_mul(batch);
            if tokens <= (bound as u64).saturating_mul(batch) && fills {
                let split = self.has_lean_partition(desc)
                    && ctas >= (LEAN_SPLIT_WAVES as u64).saturating_mul(lean.wave_ctas as u64)
                    && lean.stack_shift(desc, tokens, u32::MAX) == 0;
                return if split { DecodePath::LeanScheduled } else { DecodePath::Lean };
            }
        }
        if !self.is_split()
            || self.launched_chunks(desc, num_indices) as u64 <= batch
            || tokens <= self.unsplit_max_tokens()
        {
            DecodePath::Whole
        } else if self.partitions_in_every_cta(desc) {
            DecodePath::Split
        } else {
            DecodePath::Scheduled
        }
    }

    /// [`Self::path`] for a page table whose longest request holds at most `max_kv_len` tokens
    /// (the caller's bound, [`BatchPagedDecodePlan::set_max_kv_len`](crate::BatchPagedDecodePlan::set_max_kv_len);
    /// `None`: no bound). A bound of at most [`Self::unsplit_max_tokens`] turns the split and
    /// scheduled paths into the whole one: their partition would keep every request in one
    /// chunk anyway, so the whole kernel does the same work without the partition, the CTAs
    /// left without a chunk and the workspace. Any bound gives correct results; one below the
    /// real lengths only runs the longer requests unsplit.
    pub fn path_within(
        &self,
        desc: &BatchPagedDecodeDescriptor,
        num_indices: usize,
        lean_max_avg_tokens: Option<u32>,
        max_kv_len: Option<u32>,
    ) -> DecodePath {
        match self.path(desc, num_indices, lean_max_avg_tokens) {
            DecodePath::Split | DecodePath::Scheduled
                if max_kv_len.is_some_and(|len| u64::from(len) <= self.unsplit_max_tokens()) =>
            {
                DecodePath::Whole
            }
            path => path,
        }
    }

    /// Whether the split kernel's CTAs derive the partition themselves ([`DecodePath::Split`])
    /// rather than read the schedule kernel's ([`DecodePath::Scheduled`]): batches of up to
    /// `PARTITION_CACHED_BATCH` (32) requests, and spare-chunk partitions (no fixed splits) of
    /// up to `PER_CTA_PARTITION_MAX_BATCH` (64) requests.
    pub fn partitions_in_every_cta(&self, desc: &BatchPagedDecodeDescriptor) -> bool {
        !self.is_scheduled(desc) || (self.num_splits == 1 && desc.batch_size <= PER_CTA_PARTITION_MAX_BATCH)
    }

    /// Most attended tokens a page table may hold for `run` to skip the split kernels even when
    /// the configuration splits: a request of that many tokens fills at most
    /// [`UNSPLIT_MAX_TILES`] pipeline tiles of the tensor-core kernel (`min_chunk` tokens each,
    /// 16-bit and 8-bit caches alike), and a split's partition and merge would cost it more
    /// than they save. 0 for the f32 kernel.
    pub fn unsplit_max_tokens(&self) -> u64 {
        match self.kernel {
            DecodeKernel::Mma => self.min_chunk as u64 * UNSPLIT_MAX_TILES,
            DecodeKernel::Simt => 0,
        }
    }

    /// Whether requests may be split (the split kernel, a workspace and a merge).
    pub fn is_split(&self) -> bool {
        self.num_splits > 1 || self.spare_chunks > 0
    }

    /// Whether the split partition may be computed once per launch by the schedule kernel
    /// (batches of more than `PARTITION_CACHED_BATCH` (32) requests, whose page table every CTA
    /// would otherwise read whole): the plan loads the schedule kernel and the workspace holds
    /// its chunk map. [`Self::path`] says which launches use it.
    pub fn is_scheduled(&self, desc: &BatchPagedDecodeDescriptor) -> bool {
        self.is_split() && desc.batch_size > params::PARTITION_CACHED_BATCH as i32
    }

    /// Workspace bytes: the split state, partial outputs and log-sum-exps of every chunk, and
    /// the chunk map of a scheduled partition.
    pub fn workspace_size(&self, desc: &BatchPagedDecodeDescriptor) -> usize {
        if !self.is_split() {
            return 0;
        }
        self.workspace_layout(desc).total
    }

    pub(super) fn workspace_layout(&self, desc: &BatchPagedDecodeDescriptor) -> WorkspaceLayout {
        let chunks = self.workspace_chunks(desc);
        // Saturating: total for any configuration (`select` bounds the real ones).
        let round = |bytes: usize| bytes.checked_next_multiple_of(256).unwrap_or(usize::MAX);
        let lean_ctas_per_chunk = match self.lean {
            Some(lean) if self.has_lean_partition(desc) => lean.ctas_per_request(desc),
            _ => 0,
        };
        let ctas_per_chunk = self.ctas_per_chunk(desc).max(lean_ctas_per_chunk);
        let slots = (desc.batch_size.max(0) as usize).saturating_mul(ctas_per_chunk as usize);
        let state = round(slots.saturating_mul(8));
        let rows = (chunks as usize).saturating_mul(desc.num_qo_heads.max(0) as usize);
        let o_bytes = round(rows.saturating_mul(desc.paged_kv.head_dim.max(0) as usize).saturating_mul(4));
        let partial_lse = state.saturating_add(o_bytes);
        let lse_bytes = rows.saturating_mul(4);
        if self.is_scheduled(desc) {
            let chunk_map = partial_lse.saturating_add(round(lse_bytes));
            let total = chunk_map.saturating_add(params::item_map_bytes(chunks));
            WorkspaceLayout {
                state_bytes: state,
                partial_o: state,
                partial_lse,
                chunk_map: Some(chunk_map),
                total,
            }
        } else {
            WorkspaceLayout {
                state_bytes: state,
                partial_o: state,
                partial_lse,
                chunk_map: None,
                total: partial_lse.saturating_add(lse_bytes),
            }
        }
    }
}

/// Byte offsets of a splitting launch's regions in the workspace: the split state (arrival
/// counters, a `[ticket, done]` pair per (request, KV head, head block)) first, then the
/// partial outputs and log-sum-exps, then the chunk map of a scheduled partition.
#[derive(Debug, Clone, Copy)]
pub(super) struct WorkspaceLayout {
    /// Bytes of the split state, which starts the workspace.
    pub(super) state_bytes: usize,
    /// Offset of the partial outputs, `[num_chunks, num_qo_heads, head_dim]` f32.
    pub(super) partial_o: usize,
    /// Offset of the partial log-sum-exps, `[num_chunks, num_qo_heads]` f32.
    pub(super) partial_lse: usize,
    /// Offset of the chunk map (each chunk index's request and token range; the kernels'
    /// `item_map`), written by the schedule kernel of a scheduled partition.
    pub(super) chunk_map: Option<usize>,
    /// Bytes of the whole layout.
    total: usize,
}
