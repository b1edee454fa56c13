//! Plain-data descriptions of problems, kernels and their guarantees.

use half::{bf16, f16};

/// Element types of Q, K, V and O.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ElementKind {
    /// IEEE 754 half precision.
    F16,
    /// bfloat16.
    BF16,
    /// IEEE 754 single precision.
    F32,
    /// 32-bit signed integer.
    I32,
    /// 8-bit unsigned integer.
    U8,
    /// 8-bit float E4M3 (`e4m3fn`, [`crate::fp8::E4M3`]): K/V caches, with a dequantization scale.
    E4M3,
    /// 8-bit float E5M2 ([`crate::fp8::E5M2`]): K/V caches, with a dequantization scale.
    E5M2,
}

impl ElementKind {
    /// Every element kind, in declaration order.
    pub const ALL: [ElementKind; 7] = [
        ElementKind::F16,
        ElementKind::BF16,
        ElementKind::F32,
        ElementKind::I32,
        ElementKind::U8,
        ElementKind::E4M3,
        ElementKind::E5M2,
    ];

    /// Size of one element in bytes.
    pub const fn size_bytes(self) -> usize {
        match self {
            ElementKind::F16 | ElementKind::BF16 => 2,
            ElementKind::F32 | ElementKind::I32 => 4,
            ElementKind::U8 | ElementKind::E4M3 | ElementKind::E5M2 => 1,
        }
    }

    /// The bit layout of an 8-bit float kind, `None` for the others.
    pub const fn fp8_layout(self) -> Option<crate::fp8::Fp8Layout> {
        match self {
            ElementKind::E4M3 => Some(crate::fp8::E4M3),
            ElementKind::E5M2 => Some(crate::fp8::E5M2),
            _ => None,
        }
    }
}

/// A floating-point element type the decode kernels accept.
pub trait Element:
    cudarc::driver::DeviceRepr
    + cudarc::driver::ValidAsZeroBits
    + Copy
    + Default
    + Send
    + Sync
    + std::fmt::Debug
    + 'static
{
    /// The matching [`ElementKind`].
    const KIND: ElementKind;
    /// Widens to f64 (exact for every supported type).
    fn to_f64(self) -> f64;
    /// Rounds from f64 to nearest.
    fn from_f64(v: f64) -> Self;
}

impl Element for f16 {
    const KIND: ElementKind = ElementKind::F16;
    fn to_f64(self) -> f64 {
        self.to_f64()
    }
    fn from_f64(v: f64) -> Self {
        f16::from_f64(v)
    }
}

impl Element for bf16 {
    const KIND: ElementKind = ElementKind::BF16;
    fn to_f64(self) -> f64 {
        self.to_f64()
    }
    fn from_f64(v: f64) -> Self {
        bf16::from_f64(v)
    }
}

impl Element for f32 {
    const KIND: ElementKind = ElementKind::F32;
    fn to_f64(self) -> f64 {
        self as f64
    }
    fn from_f64(v: f64) -> Self {
        v as f32
    }
}

/// Dequantization scales of an FP8 K/V cache: a stored key code `c` stands for
/// `k_scale · fp8(c)`, a value code for `v_scale · fp8(c)` (per tensor).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct KvScales {
    /// Scale of the keys.
    pub k_scale: f32,
    /// Scale of the values.
    pub v_scale: f32,
}

impl KvScales {
    /// Scales of 1: the codes are the values.
    pub const ONE: Self = Self { k_scale: 1.0, v_scale: 1.0 };

    /// These scales, or an error naming the one that is not finite and positive.
    pub fn check(self) -> crate::error::Result<Self> {
        for (name, s) in [("k_scale", self.k_scale), ("v_scale", self.v_scale)] {
            if !(s.is_finite() && s > 0.0) {
                return Err(crate::error::invalid(format!("{name} = {s} must be finite and positive")));
            }
        }
        Ok(self)
    }
}

/// An element type of a K/V cache: every [`Element`] (a cache of q's own type), and the 8-bit
/// float codes [`float8::F8E4M3`] and [`float8::F8E5M2`] (the types candle and cudarc's `f8`
/// feature use), read with dequantization scales ([`KvScales`]).
pub trait CacheElement:
    cudarc::driver::DeviceRepr
    + cudarc::driver::ValidAsZeroBits
    + Copy
    + Default
    + Send
    + Sync
    + std::fmt::Debug
    + 'static
{
    /// The matching [`ElementKind`].
    const CACHE_KIND: ElementKind;
}

impl<T: Element> CacheElement for T {
    const CACHE_KIND: ElementKind = T::KIND;
}
impl CacheElement for float8::F8E4M3 {
    const CACHE_KIND: ElementKind = ElementKind::E4M3;
}
impl CacheElement for float8::F8E5M2 {
    const CACHE_KIND: ElementKind = ElementKind::E5M2;
}

/// GPU architecture a kernel was selected for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ArchSku {
    /// Ampere and later through the PTX JIT (sm_80+).
    Sm80,
    /// Hopper (sm_90).
    Sm90,
}

/// Who implements the kernel.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum BackendKind {
    /// Rust kernels compiled by rustc's NVPTX backend, JIT-compiled by the driver.
    RustPtx,
}

/// Broad kernel family.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum OpCategory {
    /// Attention kernels.
    Attention,
    /// K/V cache maintenance kernels.
    KvCache,
}

/// Attention operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum AttentionKind {
    /// Decode over a paged K/V store (one query row per request).
    PagedAttention,
    /// Appending one token per request to a paged K/V store.
    PagedKvAppend,
}

/// Memory layout of the paged K/V store.
///
/// The plans take K and V as views of shape `[num_total_pages, num_kv_heads, page_size,
/// head_dim]` with any element strides on the page, head and token axes (`head_dim` contiguous;
/// every stride and the view's address 16-byte aligned; K and V with the same strides), which
/// covers each layout below; [`KvLayout::strides`] and [`KvLayout::interleaved_strides`] give
/// the strides of the common ones.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum KvLayout {
    /// `[pages, kv_heads, page_size, head_dim]`.
    Hnd,
    /// `[pages, page_size, kv_heads, head_dim]` (FlashInfer's default).
    Nhd,
    /// Any page, head and token strides (what the plans' kernels take).
    Strided,
}

impl KvLayout {
    /// Element strides, in the plans' `[pages, kv_heads, page_size, head_dim]` axis order, of a
    /// contiguous store of this layout for `kv` ([`KvLayout::Strided`] gives HND's).
    pub fn strides(self, kv: &PagedKvCacheDescriptor) -> [i64; 4] {
        let (heads, ps, d) =
            (kv.num_kv_heads.max(0) as i64, kv.page_size.max(0) as i64, kv.head_dim.max(0) as i64);
        // Saturating: defined for any descriptor (`select` bounds the real ones).
        let page = heads.saturating_mul(ps).saturating_mul(d);
        match self {
            KvLayout::Nhd => [page, d, heads.saturating_mul(d), 1],
            KvLayout::Hnd | KvLayout::Strided => [page, ps.saturating_mul(d), d, 1],
        }
    }

    /// K and V interleaved per page in one allocation, `[pages, 2, …]` with this layout inside
    /// each half (vLLM's `[blocks, 2, block_size, kv_heads, head_dim]` is [`KvLayout::Nhd`],
    /// FlashInfer's 5-D tensor either): the strides of both views, and the element offset of V's
    /// first row from K's.
    pub fn interleaved_strides(self, kv: &PagedKvCacheDescriptor) -> ([i64; 4], usize) {
        let mut stride = self.strides(kv);
        let half = stride[0];
        stride[0] = half.saturating_mul(2);
        (stride, half as usize)
    }
}

/// What is computed after the attention itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Epilogue {
    /// Output rows plus the base-2 log-sum-exp of the scaled logits.
    OutputAndLse,
    /// No epilogue (store-only kernels).
    None,
}

/// Precision of the inner products.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum MathPrecision {
    /// Inputs in their own 16-bit type multiplied on tensor cores (`mma.sync`), f32 accumulation.
    TensorCore16,
    /// f32 multiply-add on CUDA cores.
    Fp32,
    /// No arithmetic (data movement only).
    Exact,
}

/// What a plan promises about its numbers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct PrecisionGuarantee {
    /// Precision of the inner products.
    pub math_precision: MathPrecision,
    /// Accumulator type of the softmax and of `P·V`.
    pub accumulator: ElementKind,
    /// Same inputs on the same GPU give bit-identical outputs.
    pub bit_stable_on_same_hardware: bool,
    /// Results do not depend on scheduling (no float atomics).
    pub deterministic: bool,
}

/// Identity of the kernel a plan selected.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct KernelSku {
    /// Broad kernel family.
    pub category: OpCategory,
    /// Operation the kernel performs.
    pub op: AttentionKind,
    /// Type of Q, K, V and O.
    pub element: ElementKind,
    /// Type of the auxiliary output (`lse`: f32) or of the page table (i32).
    pub aux_element: ElementKind,
    /// Layout of the paged K/V store.
    pub layout: KvLayout,
    /// What is computed after the attention.
    pub epilogue: Epilogue,
    /// Architecture the kernel was selected for.
    pub arch: ArchSku,
    /// Who implements the kernel.
    pub backend: BackendKind,
    /// What the kernel promises about its numbers.
    pub precision_guarantee: PrecisionGuarantee,
}

/// Caller's preferences for `select`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PlanPreference {
    /// Largest workspace the caller can provide. The rule only splits requests (or adds spare
    /// chunks) while their partials fit, so 0 selects a plan that needs no workspace; an explicit
    /// `num_splits` / `spare_chunks` needing more is refused.
    pub max_workspace_bytes: usize,
    /// Load the Hopper build on sm_90 and newer (the default): the same kernels compiled for
    /// sm_90, which also take part in programmatic dependent launch and hold the 8-bit cache
    /// kernels. `false` loads the portable (sm_80) build on any device, through the driver's
    /// JIT: no programmatic launch, no 8-bit cache (`select` refuses one). For comparisons and
    /// for testing the portable build on a Hopper GPU.
    pub allow_sm90a: bool,
    /// Restrict selection to one backend.
    pub prefer_backend: Option<BackendKind>,
    /// Validate the page table on the device before each `run` and report violations as
    /// [`crate::Error::InvalidPageTable`]. This synchronizes the stream, so a checked `run`
    /// cannot be captured into a CUDA graph.
    pub checked: bool,
    /// On sm_90 and newer, launch the decode kernel as a programmatic dependent launch (on by
    /// default, as FlashInfer's `enable_pdl`): its CTAs start while the previous kernel in the
    /// stream finishes and wait for it before reading anything, so whatever that kernel writes
    /// (`q`, the K/V store, the page table) is seen complete. Ignored before sm_90 and with
    /// [`Self::allow_sm90a`] off.
    pub programmatic_launch: bool,
    /// With [`Self::programmatic_launch`]: the caller's promise that lets the CTAs read the page
    /// table (and prefetch their first K/V tiles into L2) before waiting for the previous kernel.
    /// On the H200 that takes about 0.5 µs off a one-token launch (2.46 → 1.96 µs, against the
    /// default launch's guessing entries) and 2–3 µs off a 125 µs one: the page lookups'
    /// dependent loads overlap that kernel's tail. See
    /// [`StablePageTable`]. `None` (the default): every read waits.
    pub stable_page_table: Option<StablePageTable>,
    /// Chunks per request at equal lengths (`1..=MAX_SPLITS`) instead of the plan's rule, which
    /// derives it from the SM count and the batch's CTA count. The kernel still partitions
    /// `batch × num_splits` chunks by the actual lengths. For tuning and benchmarks.
    pub num_splits: Option<u32>,
    /// Spare chunks (beyond `batch × num_splits`, taken only by requests longer than a wave's
    /// share) instead of the plan's rule; applied after `num_splits`. The rule gives a wave's
    /// worth to batches of more than one wave, so that a long request does not set the time;
    /// `Some(0)` saves their cost (up to a few percent) on batches known to be uniform.
    pub spare_chunks: Option<u32>,
    /// Short requests: `run` launches the lean kernel (four CTAs per SM) when the page table holds
    /// at most this many tokens per request (`indices.len() × page_size / batch`) and either the
    /// batch's lean CTAs fill more than a wave or the table holds at most one lean tile per
    /// request; over four lean waves or more it may run the lean kernel over a scheduled
    /// partition, which cuts long requests (see [`crate::plan::DecodeConfig::path`]). `None`
    /// takes the plan's bound
    /// ([`crate::plan::LEAN_MAX_AVG_TOKENS`]), `Some(0)` turns the lean kernel off. For tuning.
    pub lean_max_avg_tokens: Option<u32>,
    /// Very short requests on the lean kernel: at most this many KV heads of a request per CTA
    /// (one pipeline, one start-up for all of them) instead of the plan's bound (as many as one
    /// 16-row query tile holds, see [`crate::plan::LeanLaunch::stack_shift`]); `Some(1)` keeps
    /// one KV head per CTA. For tuning.
    pub max_stacked_kv_heads: Option<u32>,
    /// Spare chunks of the lean kernel's scheduled partition (a long request among many short
    /// ones cut into chunks of about `total tokens / spare` tokens) instead of the plan's rule
    /// ([`crate::plan::DecodeConfig::lean_spare_chunks`]); `Some(0)` keeps every request whole on
    /// the lean kernel. For tuning; ignored over an 8-bit cache and by the portable build, which
    /// have no lean split kernel.
    pub lean_spare_chunks: Option<u32>,
    /// Programmatic launches without [`Self::stable_page_table`]: whole-request launches, and
    /// split-path ones over a 16-bit cache, of at most this many CTAs take the entries that guess
    /// their page lookup before the wait
    /// ([`crate::plan::BatchPagedDecodePlan::guesses_page_lookup`]) instead of the plan's bounds
    /// (one CTA per SM; one and a half waves on the split path); `Some(0)` never guesses. For
    /// tuning.
    pub guess_max_ctas: Option<u32>,
}

impl Default for PlanPreference {
    fn default() -> Self {
        Self {
            max_workspace_bytes: usize::MAX,
            allow_sm90a: true,
            prefer_backend: None,
            checked: false,
            programmatic_launch: true,
            stable_page_table: None,
            num_splits: None,
            spare_chunks: None,
            lean_max_avg_tokens: None,
            max_stacked_kv_heads: None,
            lean_spare_chunks: None,
            guess_max_ctas: None,
        }
    }
}

/// A promise, made by `unsafe` code, that no decode launch of the plan it is given to (through
/// [`PlanPreference::stable_page_table`]) follows a kernel that writes that launch's page table
/// (`indices`, `indptr`, `last_page_len`). With it, a programmatic launch reads the page table
/// before waiting for the previous kernel in the stream. A kernel that writes `q` or the K/V
/// store (an append, a RoPE) may come right before; so may the decode itself, replayed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct StablePageTable(());

impl StablePageTable {
    /// Makes the promise.
    ///
    /// # Safety
    /// For every `run` (in any of its forms) of a plan selected with this promise, no kernel that
    /// may still be running when that launch starts writes the page table it reads: not the
    /// kernel right before it in the stream (or in a captured graph), and not a kernel that one
    /// may itself overlap (a programmatic launch that had not waited for its predecessor). A copy
    /// right before `run` is fine: a programmatic launch overlaps only a kernel. Otherwise the
    /// CTAs of one launch can read two versions of the page table and disagree on the partition
    /// of the requests into chunks, and the split merge waits for chunks that never arrive (the
    /// kernel does not finish) or combines partials of different tables into `o`.
    pub const unsafe fn promise() -> Self {
        Self(())
    }
}

/// Geometry of a paged K/V store in HND layout.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PagedKvCacheDescriptor {
    /// Tokens per page.
    pub page_size: i32,
    /// Pages in `k_data` / `v_data`.
    pub num_total_pages: i32,
    /// K/V heads.
    pub num_kv_heads: i32,
    /// Head dimension.
    pub head_dim: i32,
    /// Element type of K and V.
    pub element: ElementKind,
}

/// A batched decode problem.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct BatchPagedDecodeDescriptor {
    /// Number of requests (one query row each).
    pub batch_size: i32,
    /// Query/output heads; a multiple of `paged_kv.num_kv_heads`.
    pub num_qo_heads: i32,
    /// Scale applied to `q·k` before the softmax (commonly `1/sqrt(head_dim)`).
    pub sm_scale: f32,
    /// Geometry of the K/V store read.
    pub paged_kv: PagedKvCacheDescriptor,
}

/// Attention variant of a decode plan
/// ([`BatchPagedDecodePlan::select_variant`](crate::BatchPagedDecodePlan::select_variant)); the
/// default is plain softmax attention. The semantics are those of
/// [`reference::decode_variant`](crate::reference::decode_variant). Attention sinks are a
/// run-time tensor ([`BatchPagedDecodePlan::run_with_sinks`](crate::BatchPagedDecodePlan::run_with_sinks)).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct AttentionVariantDescriptor {
    /// Logits soft-cap (Gemma 2): every scaled logit `s` becomes `cap · tanh(s / cap)` before
    /// the softmax and in `lse`. Finite and positive; selects the soft-cap kernels.
    pub logits_soft_cap: Option<f32>,
    /// Sliding window: a request of `len` tokens attends to its last `window_left + 1` tokens
    /// (from `len - 1 - window_left`); only their pages are read. `None` attends to all.
    pub window_left: Option<u32>,
}

/// Appending one token per request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PagedKvAppendDescriptor {
    /// Number of requests (one token each).
    pub batch_size: i32,
    /// Geometry of the K/V store written.
    pub paged_kv: PagedKvCacheDescriptor,
}
