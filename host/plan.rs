//! Plans: validate once on the host (`select`), then launch without allocating or synchronizing
//! (`run`), so `run` can be captured into a CUDA graph.

use std::marker::PhantomData;
use std::sync::Arc;

use cudarc::driver::{
    CudaContext, CudaFunction, CudaStream, DevicePtr, DevicePtrMut, LaunchConfig, PushKernelArg,
};

use crate::device::{self, DeviceProps};
use crate::error::{Error, Result, invalid};
use crate::guard;
use crate::params::{self, AppendParams, DecodeParams, PageTableCheckParams};
use crate::ptx;
use crate::tensor::{TensorLayout, TensorMut, TensorRef, Workspace};
use crate::types::*;

/// Head dimensions with compiled kernels.
pub const SUPPORTED_HEAD_DIMS: [i32; 3] = [64, 128, 256];
/// Upper bound on KV splits per request.
pub const MAX_SPLITS: u32 = params::MAX_CHUNKS_PER_REQUEST;
/// Preferred chunk, in pipeline tiles: one with fewer tiles is mostly fixed latency.
const PREFERRED_CHUNK_TILES: u32 = 4;
/// Grid y limit: the split kernels' chunks run along y.
const MAX_GRID_Y: u32 = 65535;
/// Fraction of the last wave of CTAs that must be busy before splitting stops.
const WAVE_EFFICIENCY: f64 = 0.85;
/// Default bound of [`PlanPreference::lean_max_avg_tokens`]: page tables holding at most this
/// many tokens per request run the lean kernel when the batch fills more than a wave.
pub const LEAN_MAX_AVG_TOKENS: u32 = 256;

// SAFETY: the parameter blocks are `#[repr(C)]` plain data (u64 device addresses, u32 and f32),
// passed to the kernels by value with the layout both sides compile from `params.rs`.
unsafe impl cudarc::driver::DeviceRepr for DecodeParams {}
unsafe impl cudarc::driver::DeviceRepr for AppendParams {}
unsafe impl cudarc::driver::DeviceRepr for PageTableCheckParams {}

/// Arguments of [`BatchPagedDecodePlan::run`].
#[derive(Debug)]
pub struct BatchPagedDecodeArgs<'a, T> {
    /// `[batch, num_qo_heads, head_dim]`.
    pub q: TensorRef<'a, T, 3>,
    /// `[num_total_pages, num_kv_heads, page_size, head_dim]` (HND).
    pub k_data: TensorRef<'a, T, 4>,
    /// `[num_total_pages, num_kv_heads, page_size, head_dim]` (HND).
    pub v_data: TensorRef<'a, T, 4>,
    /// `[total_used_pages]`: page ids of all requests, concatenated.
    pub indices: TensorRef<'a, i32, 1>,
    /// `[batch + 1]`: request `b` owns `indices[indptr[b]..indptr[b + 1]]`.
    pub indptr: TensorRef<'a, i32, 1>,
    /// `[batch]`: tokens used in each request's last page, in `[0, page_size]`.
    pub last_page_len: TensorRef<'a, i32, 1>,
    /// `[batch, num_qo_heads, head_dim]`.
    pub o: TensorMut<'a, T, 3>,
    /// `[batch, num_qo_heads]`: base-2 log-sum-exp of the scaled logits (`-inf` for empty requests).
    pub lse: TensorMut<'a, f32, 2>,
}

/// The shapes, strides and storage sizes of [`BatchPagedDecodeArgs`] (checkable without a GPU).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BatchPagedDecodeArgsLayout {
    /// Layout of `q`.
    pub q: TensorLayout<3>,
    /// Layout of `k_data`.
    pub k_data: TensorLayout<4>,
    /// Layout of `v_data`.
    pub v_data: TensorLayout<4>,
    /// Layout of `indices`.
    pub indices: TensorLayout<1>,
    /// Layout of `indptr`.
    pub indptr: TensorLayout<1>,
    /// Layout of `last_page_len`.
    pub last_page_len: TensorLayout<1>,
    /// Layout of `o`.
    pub o: TensorLayout<3>,
    /// Layout of `lse`.
    pub lse: TensorLayout<2>,
}

impl<T> BatchPagedDecodeArgs<'_, T> {
    /// The data-free layouts of these arguments.
    pub fn layout(&self) -> BatchPagedDecodeArgsLayout {
        BatchPagedDecodeArgsLayout {
            q: self.q.layout(),
            k_data: self.k_data.layout(),
            v_data: self.v_data.layout(),
            indices: self.indices.layout(),
            indptr: self.indptr.layout(),
            last_page_len: self.last_page_len.layout(),
            o: self.o.layout(),
            lse: self.lse.layout(),
        }
    }
}

impl BatchPagedDecodeArgsLayout {
    /// Contiguous layouts for `desc` with `num_indices` page ids.
    pub fn contiguous(desc: &BatchPagedDecodeDescriptor, num_indices: i32) -> Self {
        let kv = &desc.paged_kv;
        let (b, hq, d) = (desc.batch_size, desc.num_qo_heads, kv.head_dim);
        let store = [kv.num_total_pages, kv.num_kv_heads, kv.page_size, d];
        Self {
            q: TensorLayout::contiguous([b, hq, d]),
            k_data: TensorLayout::contiguous(store),
            v_data: TensorLayout::contiguous(store),
            indices: TensorLayout::contiguous([num_indices]),
            indptr: TensorLayout::contiguous([b.saturating_add(1)]),
            last_page_len: TensorLayout::contiguous([b]),
            o: TensorLayout::contiguous([b, hq, d]),
            lse: TensorLayout::contiguous([b, hq]),
        }
    }
}

/// Which decode kernel a plan launches.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DecodeKernel {
    /// Tensor-core kernel for f16 / bf16.
    Mma,
    /// CUDA-core kernel (f32).
    Simt,
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
    /// With spare chunks: the items one wave of CTAs holds. The kernel keeps chunks at least
    /// `total tokens / balance_items` long, so a long request is cut to about a wave's share and
    /// equal lengths stay whole. 0 otherwise.
    pub balance_items: u32,
    /// Split kernels: consecutive CTAs cover the KV heads and head blocks of one chunk (true), or
    /// consecutive chunks of one head block (false, as the unsplit kernels).
    pub heads_along_x: bool,
    /// Smallest chunk a split takes, in tokens.
    pub min_chunk: u32,
    /// Chunk size the kernel prefers when half the chunks stay busy (four tiles).
    pub preferred_chunk: u32,
    /// CTAs resident at once on the device (SMs × CTAs per SM): one wave.
    pub wave_ctas: u32,
    /// The lean kernel's launch (16-bit elements, head_dim 64 or 128), which `run` takes for
    /// short requests ([`PlanPreference::lean_max_avg_tokens`]).
    pub lean: Option<LeanLaunch>,
}

/// Which kernel `run` launches for a page table of a given size
/// ([`BatchPagedDecodePlan::path`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DecodePath {
    /// The standard kernel, one CTA per request (and KV head, head block).
    Whole,
    /// The lean kernel, one CTA per request: short requests ([`DecodeConfig::lean`]).
    Lean,
    /// The split kernel, each CTA deriving the length-aware partition from the page table.
    Split,
    /// The schedule kernel computes the partition once, then the split kernel runs
    /// ([`DecodeConfig::is_scheduled`]).
    Scheduled,
}

impl DecodePath {
    /// Short lowercase name (bench rows, logs).
    pub fn name(self) -> &'static str {
        match self {
            DecodePath::Whole => "whole",
            DecodePath::Lean => "lean",
            DecodePath::Split => "split",
            DecodePath::Scheduled => "scheduled",
        }
    }
}

/// Launch shape of the lean tensor-core kernel (`params::lean_tiling` in `kernels-gpu`): whole
/// requests, at most 32 query heads per CTA; four CTAs per SM on sm_90 for groups of up to 16
/// query heads per KV head, three for larger groups (shared memory).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LeanLaunch {
    /// CTAs per (request, KV head) along the query heads of the group.
    pub head_blocks: u32,
    /// Dynamic shared memory per CTA.
    pub smem_bytes: u32,
}

impl LeanLaunch {
    /// The lean launch for `desc`, when the lean kernel covers its element type and head_dim
    /// and the device has the shared memory.
    fn for_descriptor(desc: &BatchPagedDecodeDescriptor, props: &DeviceProps) -> Option<Self> {
        let kv = &desc.paged_kv;
        let d = kv.head_dim as u32;
        if !matches!(kv.element, ElementKind::F16 | ElementKind::BF16) || !matches!(d, 64 | 128) {
            return None;
        }
        let tiling = params::lean_tiling(d);
        let group = (desc.num_qo_heads / kv.num_kv_heads.max(1)).max(0) as u32;
        let q_tiles = group.min(tiling.heads_per_cta).div_ceil(16);
        let smem_bytes = params::mma_smem_bytes(tiling, d, q_tiles);
        let head_blocks = group.div_ceil(tiling.heads_per_cta);
        let grid_y = kv.num_kv_heads.max(0) as u64 * head_blocks as u64;
        (smem_bytes <= props.smem_per_block_optin && grid_y <= MAX_GRID_Y as u64)
            .then_some(Self { head_blocks, smem_bytes })
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
    /// A descriptor `select` would reject gets the same typed error here.
    pub fn choose(
        desc: &BatchPagedDecodeDescriptor,
        props: &DeviceProps,
        max_workspace_bytes: usize,
    ) -> Result<Self> {
        check_decode_descriptor(desc)?;
        let kv = &desc.paged_kv;
        let group = (desc.num_qo_heads / kv.num_kv_heads) as u32;
        let d = kv.head_dim as u32;
        let (kernel, head_blocks, q_tiles, smem_bytes, ctas_per_sm) = match kv.element {
            ElementKind::F32 => (DecodeKernel::Simt, 1, 0, 0, 16),
            _ => {
                let tiling = params::standard_tiling(d);
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
                let per_sm = (props.smem_per_sm / (smem + 1024)).clamp(1, 16);
                (DecodeKernel::Mma, head_blocks, q_tiles, smem, per_sm)
            }
        };
        let wave = props.sm_count.max(1) as u64 * ctas_per_sm as u64;
        let efficiency = |ctas: u64| ctas as f64 / (ctas.div_ceil(wave) * wave) as f64;
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
            balance_items: 0,
            heads_along_x: true,
            min_chunk,
            preferred_chunk: PREFERRED_CHUNK_TILES * min_chunk,
            wave_ctas: wave.min(u32::MAX as u64) as u32,
            lean: LeanLaunch::for_descriptor(desc, props),
        };
        let base = desc.batch_size.max(0) as u64 * probe.ctas_per_item(desc); // CTAs, unsplit
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
        if efficiency(base) >= WAVE_EFFICIENCY {
            // A well-filled wave, or several: one chunk per request at equal lengths. Past one
            // wave, a wave's worth of spare chunks lets a long request be cut to a wave's share
            // (`total / wave_items` tokens), which then exceeds the average length, so equal
            // lengths stay whole; within one wave it would split them.
            if base > wave {
                let with_spare = probe.with_spare(desc, probe.wave_items(desc));
                if with_spare.fits(desc, max_workspace_bytes) {
                    return Ok(with_spare);
                }
            }
            return Ok(probe);
        }
        if base <= wave {
            // Up to one poorly filled wave: one chunk per request at equal lengths (splitting
            // them measured slower), plus spare chunks (fewer than `batch`, so equal lengths stay
            // whole) for requests longer than a wave's share.
            let spare = probe.wave_items(desc).min(desc.batch_size as u32 - 1);
            let with_spare = probe.with_spare(desc, spare);
            if spare > 0 && with_spare.fits(desc, max_workspace_bytes) {
                return Ok(with_spare);
            }
        }
        // Split until the last wave is busy enough.
        let mut best = (efficiency(base), 1);
        for s in 2..=MAX_SPLITS {
            if !fits(s) {
                break;
            }
            let e = efficiency(base * s as u64);
            if e > best.0 + 1e-9 {
                best = (e, s);
            }
            if e >= WAVE_EFFICIENCY {
                break;
            }
        }
        Ok(Self { num_splits: best.1, ..probe })
    }

    /// CTAs per item (chunk): one per KV head and head block.
    fn ctas_per_item(&self, desc: &BatchPagedDecodeDescriptor) -> u64 {
        desc.paged_kv.num_kv_heads.max(1) as u64 * self.head_blocks.max(1) as u64
    }

    /// Items (chunks of every KV head and head block) that one wave of CTAs holds.
    fn wave_items(&self, desc: &BatchPagedDecodeDescriptor) -> u32 {
        (self.wave_ctas as u64 / self.ctas_per_item(desc)).max(1) as u32
    }

    /// This configuration with `spare_chunks` spare chunks and, with any, the balance bound.
    /// Measured CTA orders: chunk-major for split requests and for grids beyond one wave,
    /// head-major for unsplit requests with spare chunks within one wave.
    fn with_spare(self, desc: &BatchPagedDecodeDescriptor, spare_chunks: u32) -> Self {
        let balance_items = if spare_chunks > 0 { self.wave_items(desc) } else { 0 };
        let beyond_a_wave =
            (desc.batch_size.max(0) as u64).saturating_mul(self.ctas_per_item(desc)) > self.wave_ctas as u64;
        let heads_along_x = self.num_splits > 1 || beyond_a_wave;
        Self { spare_chunks, balance_items, heads_along_x, ..self }
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
        Self { num_splits, spare_chunks: 0, balance_items: 0, heads_along_x: true, ..self }
            .within_grid(desc, "batch_size × num_splits")
    }

    /// Whether the split kernels' chunks fit along grid y.
    fn grid_holds(&self, desc: &BatchPagedDecodeDescriptor) -> bool {
        !self.is_split() || self.num_chunks(desc) <= MAX_GRID_Y
    }

    /// This configuration, or [`Error::Unsupported`] naming its chunk count `what` when the
    /// grid cannot hold it.
    fn within_grid(self, desc: &BatchPagedDecodeDescriptor, what: &str) -> Result<Self> {
        if !self.grid_holds(desc) {
            return Err(Error::Unsupported(format!(
                "{what} = {} exceeds the grid limit {MAX_GRID_Y}",
                self.num_chunks(desc)
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
    /// that it never produces more items than this (`chunking::max_items`). A page-table view
    /// sized to the batch's pages (rather than to the largest batch a server expects) lets short
    /// batches launch fewer CTAs.
    pub fn launched_chunks(&self, desc: &BatchPagedDecodeDescriptor, num_indices: usize) -> u32 {
        let batch = desc.batch_size.max(0) as u32;
        if !self.is_split() {
            return batch;
        }
        let page_size = desc.paged_kv.page_size.max(0) as u64;
        crate::chunking::max_items(
            batch,
            self.num_chunks(desc),
            (num_indices as u64).saturating_mul(page_size),
            self.min_chunk,
            self.preferred_chunk,
            self.balance_items,
        )
    }

    /// Whether requests may be split (the split kernel, a workspace and a merge).
    pub fn is_split(&self) -> bool {
        self.num_splits > 1 || self.spare_chunks > 0
    }

    /// Whether the split partition is computed once per launch by the schedule kernel (batches
    /// of more than `PARTITION_CACHED_BATCH` (32) requests, whose page table every CTA
    /// would otherwise read whole) rather than by every CTA.
    pub fn is_scheduled(&self, desc: &BatchPagedDecodeDescriptor) -> bool {
        self.is_split() && desc.batch_size > params::PARTITION_CACHED_BATCH as i32
    }

    /// Workspace bytes: the split state, partial outputs and log-sum-exps of every chunk, and
    /// the item map of a scheduled partition.
    pub fn workspace_size(&self, desc: &BatchPagedDecodeDescriptor) -> usize {
        if !self.is_split() {
            return 0;
        }
        self.workspace_layout(desc).total
    }

    fn workspace_layout(&self, desc: &BatchPagedDecodeDescriptor) -> WorkspaceLayout {
        let chunks = self.num_chunks(desc);
        // Saturating: total for any configuration (`select` bounds the real ones).
        let round = |bytes: usize| bytes.checked_next_multiple_of(256).unwrap_or(usize::MAX);
        let slots = (desc.batch_size.max(0) as usize).saturating_mul(self.ctas_per_item(desc) as usize);
        let state = round(slots.saturating_mul(8));
        let rows = (chunks as usize).saturating_mul(desc.num_qo_heads.max(0) as usize);
        let o_bytes = round(rows.saturating_mul(desc.paged_kv.head_dim.max(0) as usize).saturating_mul(4));
        let partial_lse = state.saturating_add(o_bytes);
        let lse_bytes = rows.saturating_mul(4);
        if self.is_scheduled(desc) {
            let item_map = partial_lse.saturating_add(round(lse_bytes));
            let total = item_map.saturating_add(params::item_map_bytes(chunks));
            WorkspaceLayout {
                state_bytes: state,
                partial_o: state,
                partial_lse,
                item_map: Some(item_map),
                total,
            }
        } else {
            WorkspaceLayout {
                state_bytes: state,
                partial_o: state,
                partial_lse,
                item_map: None,
                total: partial_lse.saturating_add(lse_bytes),
            }
        }
    }
}

/// Byte offsets of a splitting launch's regions in the workspace: the split state (arrival
/// counters, a `[ticket, done]` pair per (request, KV head, head block)) first, then the
/// partial outputs and log-sum-exps, then the item map of a scheduled partition.
#[derive(Debug, Clone, Copy)]
struct WorkspaceLayout {
    state_bytes: usize,
    partial_o: usize,
    partial_lse: usize,
    item_map: Option<usize>,
    total: usize,
}

/// Batched decode over a paged K/V store.
#[derive(Debug)]
pub struct BatchPagedDecodePlan<T: Element> {
    desc: BatchPagedDecodeDescriptor,
    config: DecodeConfig,
    pref: PlanPreference,
    arch: ArchSku,
    decode_fn: CudaFunction,
    /// Split configurations: the unsplit kernel, launched when the page table is too short for
    /// any request to take more than one chunk.
    whole_fn: Option<CudaFunction>,
    /// Split configurations of large batches: the schedule kernel ([`DecodeConfig::is_scheduled`]).
    schedule_fn: Option<CudaFunction>,
    /// The lean kernel, for short requests ([`DecodeConfig::lean`]).
    lean_fn: Option<CudaFunction>,
    check_fn: CudaFunction,
    /// Launch as a programmatic dependent launch ([`PlanPreference::programmatic_launch`]).
    programmatic: bool,
    /// The context the kernels were loaded into: `run` launches only on its streams.
    ctx: Arc<CudaContext>,
    _t: PhantomData<T>,
}

impl<T: Element> BatchPagedDecodePlan<T> {
    /// Validates `desc` for element `T` (no GPU needed).
    pub fn check_descriptor(desc: &BatchPagedDecodeDescriptor) -> Result<()> {
        let kv = &desc.paged_kv;
        if kv.element != T::KIND {
            return Err(invalid(format!(
                "descriptor element {:?} does not match the plan's element type {:?}",
                kv.element,
                T::KIND
            )));
        }
        check_decode_descriptor(desc)
    }

    /// Checks every argument's shape, contiguity and storage size against `desc` (no GPU needed).
    pub fn check_layout(desc: &BatchPagedDecodeDescriptor, args: &BatchPagedDecodeArgsLayout) -> Result<()> {
        let kv = &desc.paged_kv;
        let (b, hq, d) = (desc.batch_size, desc.num_qo_heads, kv.head_dim);
        let store = [kv.num_total_pages, kv.num_kv_heads, kv.page_size, d];
        expect_layout("q", &args.q, [b, hq, d], "[batch_size, num_qo_heads, head_dim]")?;
        expect_layout("k_data", &args.k_data, store, "[num_total_pages, num_kv_heads, page_size, head_dim]")?;
        expect_layout("v_data", &args.v_data, store, "[num_total_pages, num_kv_heads, page_size, head_dim]")?;
        if args.indices.shape[0] < 0 {
            return Err(invalid(format!("indices: extent {} must be ≥ 0", args.indices.shape[0])));
        }
        expect_layout("indices", &args.indices, [args.indices.shape[0]], "[total_used_pages]")?;
        let b1 =
            b.checked_add(1).ok_or_else(|| invalid("batch_size + 1 (the length of indptr) overflows i32"))?;
        expect_layout("indptr", &args.indptr, [b1], "[batch_size + 1]")?;
        expect_layout("last_page_len", &args.last_page_len, [b], "[batch_size]")?;
        expect_layout("o", &args.o, [b, hq, d], "[batch_size, num_qo_heads, head_dim]")?;
        expect_layout("lse", &args.lse, [b, hq], "[batch_size, num_qo_heads]")?;
        Ok(())
    }

    /// Chooses a kernel and launch configuration for `desc` on `stream`'s device.
    pub fn select(
        stream: &Arc<CudaStream>,
        desc: &BatchPagedDecodeDescriptor,
        pref: PlanPreference,
    ) -> Result<Self> {
        Self::check_descriptor(desc)?;
        if pref.prefer_backend.is_some_and(|b| b != BackendKind::RustPtx) {
            return Err(Error::Unsupported(format!("backend {:?}", pref.prefer_backend)));
        }
        let ctx = stream.context();
        let props = DeviceProps::query(ctx)?;
        if props.compute_capability.0 < 8 {
            return Err(Error::Unsupported(format!(
                "compute capability {}.{}; sm_80 or newer is required",
                props.compute_capability.0, props.compute_capability.1
            )));
        }
        let mut config = DecodeConfig::choose(desc, &props, pref.max_workspace_bytes)?;
        if let Some(s) = pref.num_splits {
            config = config.with_num_splits(desc, s)?;
        }
        if let Some(n) = pref.spare_chunks {
            config = config.with_spare_chunks(desc, n)?;
        }
        if config.workspace_size(desc) > pref.max_workspace_bytes {
            return Err(Error::Unsupported(format!(
                "the plan needs {} workspace bytes; max_workspace_bytes is {}",
                config.workspace_size(desc),
                pref.max_workspace_bytes
            )));
        }
        let d = desc.paged_kv.head_dim;
        let suffix = match T::KIND {
            ElementKind::F16 => "f16",
            ElementKind::BF16 => "bf16",
            _ => "f32",
        };
        let kernel = match config.kernel {
            DecodeKernel::Mma => "mma",
            DecodeKernel::Simt => "simt",
        };
        let whole_name = format!("decode_{kernel}_{suffix}_d{d}");
        let split_name = format!("decode_{kernel}_split_{suffix}_d{d}");
        let arch = ptx::build_for(props.compute_capability);
        let (decode_name, whole_fn) = if config.is_split() {
            (split_name, Some(device::function(ctx, &whole_name, config.smem_bytes)?))
        } else {
            (whole_name, None)
        };
        let schedule_fn = if config.is_scheduled(desc) {
            Some(device::function(ctx, "schedule_chunks", params::SCHEDULE_SMEM_BYTES)?)
        } else {
            None
        };
        let lean_fn = match config.lean {
            Some(lean) if pref.lean_max_avg_tokens != Some(0) => {
                Some(device::function(ctx, &format!("decode_mma_lean_{suffix}_d{d}"), lean.smem_bytes)?)
            }
            _ => None,
        };
        Ok(Self {
            whole_fn,
            schedule_fn,
            lean_fn,
            desc: *desc,
            config,
            pref,
            programmatic: pref.programmatic_launch
                && ptx::supports_programmatic_launch(props.compute_capability),
            arch,
            decode_fn: device::function(ctx, &decode_name, config.smem_bytes)?,
            check_fn: device::function(ctx, "check_page_table", 0)?,
            ctx: ctx.clone(),
            _t: PhantomData,
        })
    }

    /// The descriptor this plan was selected for.
    pub fn descriptor(&self) -> &BatchPagedDecodeDescriptor {
        &self.desc
    }

    /// The launch configuration chosen by `select`.
    pub fn config(&self) -> &DecodeConfig {
        &self.config
    }

    /// Whether `run` launches as a programmatic dependent launch (sm_90+ and
    /// [`PlanPreference::programmatic_launch`]).
    pub fn programmatic_launch(&self) -> bool {
        self.programmatic
    }

    /// Checks the arguments against the plan's descriptor.
    pub fn can_implement(&self, args: &BatchPagedDecodeArgs<'_, T>) -> Result<()> {
        Self::check_layout(&self.desc, &args.layout())
    }

    /// Workspace bytes `run` needs (0 when requests are not split).
    pub fn workspace_size(&self) -> usize {
        self.config.workspace_size(&self.desc)
    }

    /// Identity of the selected kernel.
    pub fn sku(&self) -> KernelSku {
        KernelSku {
            category: OpCategory::Attention,
            op: AttentionKind::PagedAttention,
            element: T::KIND,
            aux_element: ElementKind::F32,
            layout: KvLayout::Hnd,
            epilogue: Epilogue::OutputAndLse,
            arch: self.arch,
            backend: BackendKind::RustPtx,
            precision_guarantee: self.precision_guarantee(),
        }
    }

    /// What this plan promises about its numbers.
    pub fn precision_guarantee(&self) -> PrecisionGuarantee {
        PrecisionGuarantee {
            math_precision: match self.config.kernel {
                DecodeKernel::Mma => MathPrecision::TensorCore16,
                DecodeKernel::Simt => MathPrecision::Fp32,
            },
            accumulator: ElementKind::F32,
            bit_stable_on_same_hardware: true,
            deterministic: true,
        }
    }

    /// Launches the decode on `stream`: one kernel launch. Never allocates or synchronizes
    /// (graph-capturable), except with [`PlanPreference::checked`], which first validates the
    /// page table on the device and waits for the verdict.
    ///
    /// When requests are split (`workspace_size() > 0`), the split state lives in the workspace
    /// (see [`Workspace`]): the plan itself holds no device memory, so one plan may run on
    /// several streams at once, each with its own workspace.
    ///
    /// The caller guarantees a valid page table (see [`crate::page_table`]); with an invalid one
    /// the output is unspecified but every access stays inside the given tensors.
    ///
    /// Refused before anything is enqueued: a stream of another context than the plan's, or a
    /// tensor or workspace of another context than the stream's ([`Error::WrongDevice`]), and a
    /// checked run on a capturing stream ([`Error::CheckedUnderCapture`]).
    pub fn run(
        &self,
        stream: &Arc<CudaStream>,
        workspace: &mut Workspace<'_>,
        args: &mut BatchPagedDecodeArgs<'_, T>,
    ) -> Result<()> {
        if self.pref.checked {
            guard::refuse_capture(stream)?;
        }
        args.check_launch_context(&self.ctx, stream)?;
        workspace.check_context(&self.ctx)?;
        self.can_implement(args)?;
        let needed = self.workspace_size();
        if workspace.len() < needed {
            return Err(Error::WorkspaceTooSmall { needed, got: workspace.len() });
        }
        if self.pref.checked {
            self.check_page_table(stream, args)?;
        }
        let kv = &self.desc.paged_kv;
        let (q, _q) = args.q.data.device_ptr(stream);
        let (k, _k) = args.k_data.data.device_ptr(stream);
        let (v, _v) = args.v_data.data.device_ptr(stream);
        let (indices, _i) = args.indices.data.device_ptr(stream);
        let (indptr, _p) = args.indptr.data.device_ptr(stream);
        let (last, _l) = args.last_page_len.data.device_ptr(stream);
        let (o, _o) = args.o.data.device_ptr_mut(stream);
        let (lse, _s) = args.lse.data.device_ptr_mut(stream);
        for (name, ptr) in [("q", q), ("k_data", k), ("v_data", v), ("o", o)] {
            aligned(name, ptr, 16)?;
        }
        let num_indices = args.indices.shape[0].max(0) as u32;
        let path = self.path(num_indices as usize);
        let lean = self.config.lean.filter(|_| path == DecodePath::Lean);
        let split = matches!(path, DecodePath::Split | DecodePath::Scheduled);
        let chunks = self.config.launched_chunks(&self.desc, num_indices as usize);
        let layout = self.config.workspace_layout(&self.desc);
        if split {
            workspace.bind_split_state(layout.state_bytes)?;
        }
        let (ws_base, _w) = match workspace.bytes_mut() {
            Some(ws) if split => {
                let (base, guard) = ws.device_ptr_mut(stream);
                aligned("workspace", base, 16)?;
                (base, Some(guard))
            }
            _ => (0, None),
        };
        let at = |offset: usize| if split { ws_base + offset as u64 } else { 0 };
        let scheduled = path == DecodePath::Scheduled;
        let heads_along_x = self.config.heads_along_x;
        let p = DecodeParams {
            q,
            k_data: k,
            v_data: v,
            indices,
            indptr,
            last_page_len: last,
            o,
            lse,
            partial_o: at(layout.partial_o),
            partial_lse: at(layout.partial_lse),
            counters: at(0),
            item_map: match layout.item_map {
                Some(offset) if scheduled => at(offset),
                _ => 0,
            },
            batch: self.desc.batch_size as u32,
            num_qo_heads: self.desc.num_qo_heads as u32,
            num_kv_heads: kv.num_kv_heads as u32,
            page_size: kv.page_size as u32,
            num_total_pages: kv.num_total_pages as u32,
            num_indices,
            num_chunks: if split { self.config.num_chunks(&self.desc) } else { self.desc.batch_size as u32 },
            min_chunk: self.config.min_chunk,
            preferred_chunk: self.config.preferred_chunk,
            balance_items: self.config.balance_items,
            heads_along_x: heads_along_x as u32,
            page_shift: if kv.page_size.count_ones() == 1 { kv.page_size.trailing_zeros() } else { u32::MAX },
            scale_log2: self.desc.sm_scale * std::f32::consts::LOG2_E,
            // Only CTAs of the first wave can start before the previous kernel ends, and a
            // scheduled partition is known only after it.
            prefetch_ctas: if self.programmatic && !scheduled { self.config.wave_ctas } else { 0 },
        };
        let (head_blocks, smem_bytes) = match (lean, &self.lean_fn) {
            (Some(l), Some(_)) => (l.head_blocks, l.smem_bytes),
            _ => (self.config.head_blocks, self.config.smem_bytes),
        };
        let head_blocks = kv.num_kv_heads as u32 * head_blocks;
        let chunks = if split { chunks } else { self.desc.batch_size as u32 };
        let cfg = LaunchConfig {
            // Split kernels may put the head blocks along x (consecutive CTAs share a chunk);
            // otherwise x runs over the chunks (the requests, unsplit).
            grid_dim: if split && heads_along_x {
                (head_blocks, chunks, 1)
            } else {
                (chunks, head_blocks, 1)
            },
            block_dim: (params::DECODE_THREADS, 1, 1),
            shared_mem_bytes: smem_bytes,
        };
        if let (true, Some(schedule)) = (scheduled, &self.schedule_fn) {
            let one_cta = LaunchConfig {
                grid_dim: (1, 1, 1),
                block_dim: (params::SCHEDULE_THREADS, 1, 1),
                shared_mem_bytes: params::SCHEDULE_SMEM_BYTES,
            };
            // SAFETY: the schedule kernel reads the page table (clamped into its arrays, as the
            // decode kernel does) and writes `item_map_bytes(num_chunks)` bytes at `item_map`,
            // inside the workspace `workspace_size()` covers.
            unsafe { device::launch(stream, schedule, one_cta, &p, self.programmatic)? };
        }
        let decode_fn = match (&self.lean_fn, &self.whole_fn) {
            (Some(lean_fn), _) if lean.is_some() => lean_fn,
            (_, Some(whole)) if !split => whole,
            _ => &self.decode_fn,
        };
        // SAFETY: `p` points into tensors whose shapes `can_implement` checked against the
        // descriptor, and the workspace holds `workspace_size()` bytes; `programmatic` implies
        // the sm_90 PTX.
        unsafe { device::launch(stream, decode_fn, cfg, &p, self.programmatic) }
    }

    /// The kernel `run` launches for a page table of `num_indices` slots (it reads only that
    /// shape, never the lengths, so the choice holds across graph replays):
    /// - lean, when the lean kernel is loaded, the table holds at most
    ///   [`PlanPreference::lean_max_avg_tokens`] tokens per request, and the batch's lean CTAs
    ///   fill more than one wave of the standard kernel's;
    /// - whole, when the configuration does not split or the table is too short for any request
    ///   to take two chunks (the same work without the partition, the workspace or the merge);
    /// - scheduled or split otherwise ([`DecodeConfig::is_scheduled`]).
    pub fn path(&self, num_indices: usize) -> DecodePath {
        let desc = &self.desc;
        let batch = desc.batch_size.max(0) as u64;
        let tokens = num_indices as u64 * desc.paged_kv.page_size.max(0) as u64;
        if let (Some(lean), Some(_)) = (self.config.lean, &self.lean_fn) {
            let bound = self.pref.lean_max_avg_tokens.unwrap_or(LEAN_MAX_AVG_TOKENS) as u64;
            let ctas = batch * desc.paged_kv.num_kv_heads.max(0) as u64 * lean.head_blocks as u64;
            if tokens <= bound * batch && ctas > self.config.wave_ctas as u64 {
                return DecodePath::Lean;
            }
        }
        if !self.config.is_split() || self.config.launched_chunks(desc, num_indices) as u64 <= batch {
            DecodePath::Whole
        } else if self.config.is_scheduled(desc) {
            DecodePath::Scheduled
        } else {
            DecodePath::Split
        }
    }

    /// Validates the device page table of `args` on the GPU without reading out of bounds,
    /// then synchronizes `stream` and reports the first violation (lowest request) as
    /// [`Error::InvalidPageTable`]. Refused with [`Error::CheckedUnderCapture`] while `stream`
    /// is being captured into a graph.
    pub fn check_page_table(
        &self,
        stream: &Arc<CudaStream>,
        args: &BatchPagedDecodeArgs<'_, T>,
    ) -> Result<()> {
        args.check_launch_context(&self.ctx, stream)?;
        self.can_implement(args)?;
        let table = PageTableView::of(&args.indices, &args.indptr, &args.last_page_len);
        check_on_device(
            stream,
            &self.check_fn,
            table,
            self.desc.batch_size as u32,
            &self.desc.paged_kv,
            false,
        )
    }
}

/// Device page-table arrays, borrowed from a plan's arguments.
struct PageTableView<'r, 'a> {
    indices: &'r TensorRef<'a, i32, 1>,
    indptr: &'r TensorRef<'a, i32, 1>,
    last_page_len: &'r TensorRef<'a, i32, 1>,
}

impl<'r, 'a> PageTableView<'r, 'a> {
    fn of(
        indices: &'r TensorRef<'a, i32, 1>,
        indptr: &'r TensorRef<'a, i32, 1>,
        last_page_len: &'r TensorRef<'a, i32, 1>,
    ) -> Self {
        Self { indices, indptr, last_page_len }
    }
}

/// Runs the check kernel over `table` (the append contract with `append`) and waits for its
/// verdict; [`Error::CheckedUnderCapture`] while `stream` captures. In append mode, a table that passes is then searched for two requests appending to
/// the same slot, from the slots the kernel wrote.
fn check_on_device(
    stream: &Arc<CudaStream>,
    check_fn: &CudaFunction,
    table: PageTableView<'_, '_>,
    batch: u32,
    kv: &PagedKvCacheDescriptor,
    append: bool,
) -> Result<()> {
    guard::refuse_capture(stream)?;
    let mut status = stream.clone_htod(&[u64::MAX])?;
    let mut slots = stream.alloc_zeros::<u64>(if append { batch as usize } else { 1 })?;
    {
        let (indices, _i) = table.indices.data.device_ptr(stream);
        let (indptr, _p) = table.indptr.data.device_ptr(stream);
        let (last, _l) = table.last_page_len.data.device_ptr(stream);
        let (status_ptr, _s) = status.device_ptr_mut(stream);
        let (slots_ptr, _o) = slots.device_ptr_mut(stream);
        let p = PageTableCheckParams {
            indices,
            indptr,
            last_page_len: last,
            status: status_ptr,
            slots: if append { slots_ptr } else { 0 },
            batch,
            page_size: kv.page_size as u32,
            num_total_pages: kv.num_total_pages as u32,
            num_indices: table.indices.shape[0] as u32,
            append: append as u32,
        };
        let warps = params::DECODE_THREADS / 32;
        let cfg = LaunchConfig {
            grid_dim: (batch.div_ceil(warps), 1, 1),
            block_dim: (params::DECODE_THREADS, 1, 1),
            shared_mem_bytes: 0,
        };
        // SAFETY: the kernel reads `batch + 1` indptr, `batch` last_page_len and only the
        // indices inside `[0, num_indices)` (shapes checked by the caller, all in the stream's
        // context), and writes `status` and, in append mode, `slots[..batch]`.
        unsafe { stream.launch_builder(check_fn).arg(&p).launch(cfg)? };
    }
    let found = stream.clone_dtoh(&status)?[0];
    if found == u64::MAX {
        return if append {
            shared_append_slot(&stream.clone_dtoh(&slots)?, kv.page_size as u64)
        } else {
            Ok(())
        };
    }
    let (request, code) = (found >> 8, (found & 0xff) as u32);
    let what = match code {
        params::check_code::INDPTR_OUT_OF_RANGE => format!(
            "indptr[{request}] or indptr[{}] lies outside [0, {}] (the length of indices)",
            request + 1,
            table.indices.shape[0]
        ),
        params::check_code::INDPTR_DECREASING => {
            format!("indptr[{}] < indptr[{request}]: indptr must be non-decreasing", request + 1)
        }
        params::check_code::LAST_PAGE_LEN_OUT_OF_RANGE => {
            format!("last_page_len[{request}] lies outside [0, {}]", kv.page_size)
        }
        params::check_code::PAGE_OUT_OF_RANGE => {
            format!("a page id of request {request} lies outside [0, {})", kv.num_total_pages)
        }
        params::check_code::NO_PAGE => crate::page_table::no_page_message(request),
        params::check_code::LAST_PAGE_EMPTY => crate::page_table::last_page_empty_message(request),
        _ => format!("unknown violation code {code} at request {request}"),
    };
    Err(Error::InvalidPageTable(what))
}

/// [`Error::InvalidPageTable`] naming the first request whose append slot (a store row,
/// `page × page_size + slot`) an earlier request already takes.
fn shared_append_slot(slots: &[u64], page_size: u64) -> Result<()> {
    let mut first_writer = std::collections::HashMap::with_capacity(slots.len());
    for (b, &row) in slots.iter().enumerate() {
        if let Some(a) = first_writer.insert(row, b) {
            let (page, slot) = (row / page_size.max(1), row % page_size.max(1));
            let message = crate::page_table::shared_slot_message(a as u64, b as u64, page, slot);
            return Err(Error::InvalidPageTable(message));
        }
    }
    Ok(())
}

/// Arguments of [`PagedKvAppendPlan::run`].
#[derive(Debug)]
pub struct PagedKvAppendArgs<'a, T> {
    /// `[batch, num_kv_heads, head_dim]`: the new token's keys.
    pub key: TensorRef<'a, T, 3>,
    /// `[batch, num_kv_heads, head_dim]`: the new token's values.
    pub value: TensorRef<'a, T, 3>,
    /// `[num_total_pages, num_kv_heads, page_size, head_dim]` (HND): the key store written to.
    pub k_data: TensorMut<'a, T, 4>,
    /// `[num_total_pages, num_kv_heads, page_size, head_dim]` (HND): the value store written to.
    pub v_data: TensorMut<'a, T, 4>,
    /// `[total_used_pages]`: page ids of all requests, concatenated (including the new token's page).
    pub indices: TensorRef<'a, i32, 1>,
    /// `[batch + 1]`: request `b` owns `indices[indptr[b]..indptr[b + 1]]`.
    pub indptr: TensorRef<'a, i32, 1>,
    /// `[batch]`: tokens in each request's last page, counting the new token (so at least 1).
    pub last_page_len: TensorRef<'a, i32, 1>,
}

/// Layouts of [`PagedKvAppendArgs`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PagedKvAppendArgsLayout {
    /// Layout of `key`.
    pub key: TensorLayout<3>,
    /// Layout of `value`.
    pub value: TensorLayout<3>,
    /// Layout of `k_data`.
    pub k_data: TensorLayout<4>,
    /// Layout of `v_data`.
    pub v_data: TensorLayout<4>,
    /// Layout of `indices`.
    pub indices: TensorLayout<1>,
    /// Layout of `indptr`.
    pub indptr: TensorLayout<1>,
    /// Layout of `last_page_len`.
    pub last_page_len: TensorLayout<1>,
}

impl<T> PagedKvAppendArgs<'_, T> {
    /// The data-free layouts of these arguments.
    pub fn layout(&self) -> PagedKvAppendArgsLayout {
        PagedKvAppendArgsLayout {
            key: self.key.layout(),
            value: self.value.layout(),
            k_data: self.k_data.layout(),
            v_data: self.v_data.layout(),
            indices: self.indices.layout(),
            indptr: self.indptr.layout(),
            last_page_len: self.last_page_len.layout(),
        }
    }
}

impl PagedKvAppendArgsLayout {
    /// Contiguous layouts for `desc` with `num_indices` page ids.
    pub fn contiguous(desc: &PagedKvAppendDescriptor, num_indices: i32) -> Self {
        let kv = &desc.paged_kv;
        let b = desc.batch_size;
        let store = [kv.num_total_pages, kv.num_kv_heads, kv.page_size, kv.head_dim];
        Self {
            key: TensorLayout::contiguous([b, kv.num_kv_heads, kv.head_dim]),
            value: TensorLayout::contiguous([b, kv.num_kv_heads, kv.head_dim]),
            k_data: TensorLayout::contiguous(store),
            v_data: TensorLayout::contiguous(store),
            indices: TensorLayout::contiguous([num_indices]),
            indptr: TensorLayout::contiguous([b.saturating_add(1)]),
            last_page_len: TensorLayout::contiguous([b]),
        }
    }
}

/// Writes one new K/V token per request into the paged store.
///
/// Convention: the caller advances the page table *before* `run` — allocates a new page when
/// the request's last page is full and increments `last_page_len[b]` — so the token lands in
/// slot `last_page_len[b] - 1` of page `indices[indptr[b + 1] - 1]`. Requests with no page or
/// with `last_page_len[b]` outside `[1, page_size]` are left untouched.
#[derive(Debug)]
pub struct PagedKvAppendPlan<T: Element> {
    desc: PagedKvAppendDescriptor,
    pref: PlanPreference,
    arch: ArchSku,
    append_fn: CudaFunction,
    check_fn: CudaFunction,
    /// The context the kernels were loaded into: `run` launches only on its streams.
    ctx: Arc<CudaContext>,
    _t: PhantomData<T>,
}

impl<T: Element> PagedKvAppendPlan<T> {
    /// Validates `desc` for element `T` (no GPU needed).
    pub fn check_descriptor(desc: &PagedKvAppendDescriptor) -> Result<()> {
        if desc.paged_kv.element != T::KIND {
            return Err(invalid(format!(
                "descriptor element {:?} does not match the plan's element type {:?}",
                desc.paged_kv.element,
                T::KIND
            )));
        }
        check_paged_kv(&desc.paged_kv)?;
        positive("batch_size", desc.batch_size)?;
        if desc.batch_size == i32::MAX {
            return Err(invalid("batch_size + 1 (the length of indptr) overflows i32"));
        }
        if desc.paged_kv.num_kv_heads > 65535 {
            return Err(Error::Unsupported("num_kv_heads above 65535".into()));
        }
        Ok(())
    }

    /// Checks every argument's shape, contiguity and storage size (no GPU needed).
    pub fn check_layout(desc: &PagedKvAppendDescriptor, args: &PagedKvAppendArgsLayout) -> Result<()> {
        let kv = &desc.paged_kv;
        let b = desc.batch_size;
        let store = [kv.num_total_pages, kv.num_kv_heads, kv.page_size, kv.head_dim];
        let row = [b, kv.num_kv_heads, kv.head_dim];
        expect_layout("key", &args.key, row, "[batch_size, num_kv_heads, head_dim]")?;
        expect_layout("value", &args.value, row, "[batch_size, num_kv_heads, head_dim]")?;
        expect_layout("k_data", &args.k_data, store, "[num_total_pages, num_kv_heads, page_size, head_dim]")?;
        expect_layout("v_data", &args.v_data, store, "[num_total_pages, num_kv_heads, page_size, head_dim]")?;
        if args.indices.shape[0] < 0 {
            return Err(invalid(format!("indices: extent {} must be ≥ 0", args.indices.shape[0])));
        }
        expect_layout("indices", &args.indices, [args.indices.shape[0]], "[total_used_pages]")?;
        let b1 =
            b.checked_add(1).ok_or_else(|| invalid("batch_size + 1 (the length of indptr) overflows i32"))?;
        expect_layout("indptr", &args.indptr, [b1], "[batch_size + 1]")?;
        expect_layout("last_page_len", &args.last_page_len, [b], "[batch_size]")?;
        Ok(())
    }

    /// Validates `desc` and loads the append kernel for `stream`'s device.
    pub fn select(
        stream: &Arc<CudaStream>,
        desc: &PagedKvAppendDescriptor,
        pref: PlanPreference,
    ) -> Result<Self> {
        Self::check_descriptor(desc)?;
        if pref.prefer_backend.is_some_and(|b| b != BackendKind::RustPtx) {
            return Err(Error::Unsupported(format!("backend {:?}", pref.prefer_backend)));
        }
        let ctx = stream.context();
        let props = DeviceProps::query(ctx)?;
        let name = match T::KIND {
            ElementKind::F16 => "append_f16",
            ElementKind::BF16 => "append_bf16",
            _ => "append_f32",
        };
        Ok(Self {
            desc: *desc,
            pref,
            arch: ptx::build_for(props.compute_capability),
            append_fn: device::function(ctx, name, 0)?,
            check_fn: device::function(ctx, "check_page_table", 0)?,
            ctx: ctx.clone(),
            _t: PhantomData,
        })
    }

    /// Checks the arguments against the plan's descriptor.
    pub fn can_implement(&self, args: &PagedKvAppendArgs<'_, T>) -> Result<()> {
        Self::check_layout(&self.desc, &args.layout())
    }

    /// Always 0: appending needs no scratch memory.
    pub fn workspace_size(&self) -> usize {
        0
    }

    /// Identity of the selected kernel.
    pub fn sku(&self) -> KernelSku {
        KernelSku {
            category: OpCategory::KvCache,
            op: AttentionKind::PagedKvAppend,
            element: T::KIND,
            aux_element: ElementKind::I32,
            layout: KvLayout::Hnd,
            epilogue: Epilogue::None,
            arch: self.arch,
            backend: BackendKind::RustPtx,
            precision_guarantee: self.precision_guarantee(),
        }
    }

    /// What this plan promises about its numbers (exact copies).
    pub fn precision_guarantee(&self) -> PrecisionGuarantee {
        PrecisionGuarantee {
            math_precision: MathPrecision::Exact,
            accumulator: T::KIND,
            bit_stable_on_same_hardware: true,
            deterministic: true,
        }
    }

    /// Validates the device page table of `args` against the append contract (see
    /// [`crate::page_table`]: every request owns a page, `last_page_len ∈ [1, page_size]`, no two
    /// requests append to the same slot) on the GPU, synchronizes `stream` and reports the first
    /// violation as [`Error::InvalidPageTable`]. Refused with [`Error::CheckedUnderCapture`]
    /// while `stream` is being captured into a graph.
    pub fn check_page_table(&self, stream: &Arc<CudaStream>, args: &PagedKvAppendArgs<'_, T>) -> Result<()> {
        args.check_launch_context(&self.ctx, stream)?;
        self.can_implement(args)?;
        let table = PageTableView::of(&args.indices, &args.indptr, &args.last_page_len);
        check_on_device(stream, &self.check_fn, table, self.desc.batch_size as u32, &self.desc.paged_kv, true)
    }

    /// Launches the append on `stream` (no allocation, no synchronization unless
    /// [`PlanPreference::checked`], which first runs [`Self::check_page_table`] and writes
    /// nothing when it fails).
    ///
    /// Unchecked, the kernel trusts the table as far as the append contract goes but never
    /// writes outside the store: it skips a request with no page, with `last_page_len` outside
    /// `[1, page_size]` or with a last page id outside the store (its token is dropped), and two
    /// requests appending to the same slot race for it (the row ends up an unspecified mix of
    /// their tokens' 16-byte pieces).
    ///
    /// As [`BatchPagedDecodePlan::run`], operands of another context are [`Error::WrongDevice`]
    /// and a checked run while `stream` captures is [`Error::CheckedUnderCapture`].
    pub fn run(
        &self,
        stream: &Arc<CudaStream>,
        _workspace: &mut Workspace<'_>,
        args: &mut PagedKvAppendArgs<'_, T>,
    ) -> Result<()> {
        if self.pref.checked {
            self.check_page_table(stream, args)?;
        }
        args.check_launch_context(&self.ctx, stream)?;
        self.can_implement(args)?;
        let kv = &self.desc.paged_kv;
        let (key, _a) = args.key.data.device_ptr(stream);
        let (value, _b) = args.value.data.device_ptr(stream);
        let (indices, _i) = args.indices.data.device_ptr(stream);
        let (indptr, _p) = args.indptr.data.device_ptr(stream);
        let (last, _l) = args.last_page_len.data.device_ptr(stream);
        let (k, _k) = args.k_data.data.device_ptr_mut(stream);
        let (v, _v) = args.v_data.data.device_ptr_mut(stream);
        for (name, ptr) in [("key", key), ("value", value), ("k_data", k), ("v_data", v)] {
            aligned(name, ptr, 16)?;
        }
        let p = AppendParams {
            key,
            value,
            k_data: k,
            v_data: v,
            indices,
            indptr,
            last_page_len: last,
            batch: self.desc.batch_size as u32,
            num_kv_heads: kv.num_kv_heads as u32,
            page_size: kv.page_size as u32,
            head_dim: kv.head_dim as u32,
            num_total_pages: kv.num_total_pages as u32,
            num_indices: args.indices.shape[0] as u32,
        };
        let cfg = LaunchConfig {
            grid_dim: (self.desc.batch_size as u32, kv.num_kv_heads as u32, 1),
            block_dim: (32, 1, 1),
            shared_mem_bytes: 0,
        };
        // SAFETY: every tensor lives in the stream's context, which is the plan's (checked above),
        // and holds its shape (`can_implement`); the kernel bounds-checks the page table before
        // it writes, and the view guards order the launch after earlier uses of the tensors.
        unsafe { stream.launch_builder(&self.append_fn).arg(&p).launch(cfg)? };
        Ok(())
    }
}

/// The decode descriptor checks that do not depend on the plan's element type: element,
/// extents, grouping, scale and the grid and size limits.
fn check_decode_descriptor(desc: &BatchPagedDecodeDescriptor) -> Result<()> {
    let kv = &desc.paged_kv;
    check_paged_kv(kv)?;
    positive("batch_size", desc.batch_size)?;
    positive("num_qo_heads", desc.num_qo_heads)?;
    if desc.num_qo_heads % kv.num_kv_heads != 0 {
        return Err(invalid(format!(
            "num_qo_heads ({}) must be a multiple of num_kv_heads ({})",
            desc.num_qo_heads, kv.num_kv_heads
        )));
    }
    if !desc.sm_scale.is_finite() {
        return Err(invalid(format!("sm_scale must be finite, got {}", desc.sm_scale)));
    }
    let group = desc.num_qo_heads / kv.num_kv_heads;
    let per_cta = params::standard_tiling(kv.head_dim as u32).heads_per_cta as u64;
    let y = kv.num_kv_heads as u64 * (group as u64).div_ceil(per_cta);
    if y > 65535 {
        return Err(Error::Unsupported(format!(
            "num_kv_heads × ceil(group / {per_cta}) = {y} exceeds the grid limit 65535"
        )));
    }
    let rows = desc.batch_size as i64 * desc.num_qo_heads as i64;
    if rows * MAX_SPLITS as i64 > u32::MAX as i64 {
        return Err(Error::Unsupported(format!("batch_size × num_qo_heads = {rows} is too large")));
    }
    Ok(())
}

fn check_paged_kv(kv: &PagedKvCacheDescriptor) -> Result<()> {
    positive("page_size", kv.page_size)?;
    positive("num_total_pages", kv.num_total_pages)?;
    positive("num_kv_heads", kv.num_kv_heads)?;
    positive("head_dim", kv.head_dim)?;
    if !SUPPORTED_HEAD_DIMS.contains(&kv.head_dim) {
        return Err(Error::Unsupported(format!(
            "head_dim {} (supported: {SUPPORTED_HEAD_DIMS:?})",
            kv.head_dim
        )));
    }
    if !matches!(kv.element, ElementKind::F16 | ElementKind::BF16 | ElementKind::F32) {
        return Err(Error::Unsupported(format!("element type {:?}", kv.element)));
    }
    let rows = kv.num_total_pages as u128 * kv.num_kv_heads as u128 * kv.page_size as u128;
    if rows > u32::MAX as u128 {
        return Err(Error::Unsupported(format!(
            "the paged K/V store has {rows} rows (pages × kv_heads × page_size); at most 2^32 - 1 are supported"
        )));
    }
    Ok(())
}

fn positive(name: &str, v: i32) -> Result<()> {
    if v <= 0 {
        return Err(invalid(format!("{name} must be positive, got {v}")));
    }
    Ok(())
}

fn expect_layout<const N: usize>(
    name: &str,
    t: &TensorLayout<N>,
    shape: [i32; N],
    meaning: &str,
) -> Result<()> {
    if t.shape != shape {
        return Err(invalid(format!("{name}: shape {:?} must be {meaning} = {shape:?}", t.shape)));
    }
    if !t.is_contiguous() {
        return Err(invalid(format!(
            "{name}: strides {:?} are not contiguous row-major for shape {:?}",
            t.stride, t.shape
        )));
    }
    if t.storage_len < t.numel() {
        return Err(invalid(format!(
            "{name}: storage holds {} elements, the shape needs {}",
            t.storage_len,
            t.numel()
        )));
    }
    Ok(())
}

fn aligned(name: &'static str, ptr: u64, required: usize) -> Result<()> {
    if !ptr.is_multiple_of(required as u64) {
        return Err(Error::MisalignedOperand { operand: name, required });
    }
    Ok(())
}
