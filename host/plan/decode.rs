//! The decode plan: [`BatchPagedDecodePlan`] selects a configuration and loads its kernels
//! (`select`), then launches them (`run`) on the path the page table's size picks (`path`).

use std::marker::PhantomData;
use std::sync::Arc;

use cudarc::driver::{CudaContext, CudaFunction, CudaStream, DevicePtr, DevicePtrMut, LaunchConfig};

use crate::device::{self, DeviceProps};
use crate::error::{Error, Result, invalid};
use crate::guard;
use crate::params::{self, DecodeParams};
use crate::ptx::{self, entry, entry::DecodeVariant};
use crate::tensor::{TensorLayout, TensorMut, TensorRef, Workspace};
use crate::types::*;

use super::checks::{
    KvStrides, aligned, check_decode_descriptor, expect_kv_view, expect_layout, same_kv_strides,
};
use super::config::{
    DecodeConfig, DecodeKernel, DecodePath, LEAN_MAX_AVG_TOKENS, MAX_TABLE_TOKENS, Residency,
};
use super::table_check::{PageTableView, check_on_device};

/// Arguments of [`BatchPagedDecodePlan::run`]: q and o of type `T`, the K/V store of `C` (`T`
/// itself, or 8-bit codes).
#[derive(Debug)]
pub struct BatchPagedDecodeArgs<'a, T, C = T> {
    /// `[batch, num_qo_heads, head_dim]`.
    pub q: TensorRef<'a, T, 3>,
    /// `[num_total_pages, num_kv_heads, page_size, head_dim]`: HND when contiguous
    /// ([`TensorRef::new`]); any page, head and token strides otherwise (see [`KvLayout`]: NHD, K
    /// and V interleaved per page, pages of a pool shared by layers), `head_dim` contiguous,
    /// strides and address 16-byte aligned, every row inside the view's storage.
    pub k_data: TensorRef<'a, C, 4>,
    /// The values, a view of the same shape and strides as `k_data`.
    pub v_data: TensorRef<'a, C, 4>,
    /// `[total_used_pages]`: page ids of all requests, concatenated; at most
    /// [`MAX_TABLE_TOKENS`](crate::plan::MAX_TABLE_TOKENS) tokens in all (`total_used_pages ×
    /// page_size`).
    pub indices: TensorRef<'a, i32, 1>,
    /// `[batch + 1]`: request `b` owns `indices[indptr[b]..indptr[b + 1]]`.
    pub indptr: TensorRef<'a, i32, 1>,
    /// `[batch]`: tokens used in each request's last page, in `[0, page_size]`.
    pub last_page_len: TensorRef<'a, i32, 1>,
    /// `[batch, num_qo_heads, head_dim]`.
    pub o: TensorMut<'a, T, 3>,
    /// `[batch, num_qo_heads]`: base-2 log-sum-exp of the scaled logits (for an empty request
    /// `-inf`, or `sink · log2(e)` with an attention sink, [`BatchPagedDecodePlan::run_with_sinks`]).
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

impl<T, C> BatchPagedDecodeArgs<'_, T, C> {
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

/// The largest split-path launch that takes the guessing split entry: one and a half waves of
/// `wave_ctas` ([`BatchPagedDecodePlan::guesses_page_lookup`]).
fn split_guess_bound(wave_ctas: u32) -> u32 {
    wave_ctas.saturating_add(wave_ctas / 2)
}

/// The configuration [`BatchPagedDecodePlan::select`] takes: the rule's
/// ([`DecodeConfig::choose_residency`]) with the preference's split and spare-chunk overrides,
/// within its workspace limit, and no lean split over an 8-bit cache or where the portable build
/// loads (its entries are for 16-bit caches, in the sm_90 build only).
fn configure(
    desc: &BatchPagedDecodeDescriptor,
    props: &DeviceProps,
    pref: &PlanPreference,
    residency: Residency,
) -> Result<DecodeConfig> {
    let mut config = DecodeConfig::choose_residency(desc, props, pref.max_workspace_bytes, residency)?;
    if let Some(s) = pref.num_splits {
        config = config.with_num_splits(desc, s)?;
    }
    if let Some(n) = pref.spare_chunks {
        config = config.with_spare_chunks(desc, n)?;
    }
    if let Some(n) = pref.lean_spare_chunks {
        config = config.with_lean_spare_chunks(desc, n)?;
    }
    let sm90 = ptx::build_for_preference(props.compute_capability, pref.allow_sm90a) == ArchSku::Sm90;
    if !sm90 || desc.paged_kv.element.fp8_layout().is_some() {
        // The lean split entries are for 16-bit caches, in the sm_90 build only.
        config = config.with_lean_spare_chunks(desc, 0)?;
    }
    if config.workspace_size(desc) > pref.max_workspace_bytes {
        return Err(Error::Unsupported(format!(
            "the plan needs {} workspace bytes; max_workspace_bytes is {}",
            config.workspace_size(desc),
            pref.max_workspace_bytes
        )));
    }
    Ok(config)
}

/// Names of the entry points [`BatchPagedDecodePlan::select`] loads for a configuration.
#[derive(Debug, Clone, PartialEq, Eq)]
struct DecodeEntries {
    /// The kernel `run` launches on the split and scheduled paths of a split configuration, and
    /// on the whole path otherwise.
    decode: String,
    /// Split configurations: the unsplit kernel, for the whole path.
    whole: Option<String>,
    /// Scheduled configurations ([`DecodeConfig::is_scheduled`]): the schedule kernel.
    schedule: Option<&'static str>,
    /// The lean kernel, when the configuration has a lean launch that the preference leaves on.
    lean: Option<LeanEntries<String>>,
    /// With it, the lean split kernel, when the configuration has a lean scheduled partition.
    lean_split: Option<String>,
    /// Default programmatic launches with plain logits: the entries of the whole kernel, of
    /// the lean one and (split configurations over a 16-bit cache) of the split one that guess
    /// their page lookup ([`entry::decode_guess`]).
    guess_whole: Option<String>,
    guess_lean: Option<String>,
    guess_split: Option<String>,
}

impl DecodeEntries {
    /// The entries of `config` for `q` of type `q_element` (the cache's element type, or f16 / bf16
    /// over an 8-bit cache); with a logits soft-cap, the soft-cap ones (which have no lean
    /// kernel). `guessing`: a programmatic launch without the page-table promise, which loads
    /// the guessing entries where there are some.
    fn of(
        config: &DecodeConfig,
        desc: &BatchPagedDecodeDescriptor,
        variant: &AttentionVariantDescriptor,
        pref: &PlanPreference,
        q_element: ElementKind,
        guessing: bool,
    ) -> Self {
        let soft_cap = variant.logits_soft_cap.is_some();
        let (cache, d) = (desc.paged_kv.element, desc.paged_kv.head_dim as u32);
        let name = |v| Self::decode_name(config.kernel, desc, variant, q_element, v);
        let split = config.is_split();
        let lean = config.lean.filter(|_| pref.lean_max_avg_tokens != Some(0) && !soft_cap);
        let guess = guessing && config.kernel == DecodeKernel::Mma && !soft_cap;
        Self {
            decode: name(if split { DecodeVariant::Split } else { DecodeVariant::Whole }),
            whole: split.then(|| name(DecodeVariant::Whole)),
            schedule: config.is_scheduled(desc).then_some(entry::SCHEDULE_CHUNKS),
            lean: lean.map(|_| match cache.fp8_layout() {
                Some(_) => LeanEntries::AnyShift(name(DecodeVariant::Lean)),
                None => LeanEntries::PerShift(
                    entry::LEAN_STACKED_HEADS.iter().map(|&k| name(DecodeVariant::LeanHeads(k))).collect(),
                ),
            }),
            lean_split: lean
                .filter(|_| config.has_lean_partition(desc))
                .map(|_| name(DecodeVariant::LeanSplit)),
            guess_whole: guess.then(|| entry::decode_guess(DecodeVariant::Whole, q_element, cache, d)),
            guess_lean: lean
                .filter(|_| guess)
                .map(|_| entry::decode_guess(DecodeVariant::Lean, q_element, cache, d)),
            guess_split: (guess && split && cache.fp8_layout().is_none())
                .then(|| entry::decode_guess(DecodeVariant::Split, q_element, cache, d)),
        }
    }

    /// Every entry named, the page-table check's among them.
    fn names(&self) -> Vec<&str> {
        let lean = self.lean.iter().flat_map(|l| l.iter()).map(String::as_str);
        [Some(self.decode.as_str()), self.whole.as_deref(), self.schedule, Some(entry::CHECK_PAGE_TABLE)]
            .into_iter()
            .chain(
                [&self.lean_split, &self.guess_whole, &self.guess_lean, &self.guess_split]
                    .map(Option::as_deref),
            )
            .flatten()
            .chain(lean)
            .collect()
    }

    /// The decode entry of `kernel` for the descriptor's cache, head_dim and variant.
    fn decode_name(
        kernel: DecodeKernel,
        desc: &BatchPagedDecodeDescriptor,
        variant: &AttentionVariantDescriptor,
        q_element: ElementKind,
        decode_variant: DecodeVariant,
    ) -> String {
        let (cache, d) = (desc.paged_kv.element, desc.paged_kv.head_dim as u32);
        match cache.fp8_layout() {
            Some(_) => entry::decode_fp8(decode_variant, q_element, cache, d),
            None if variant.logits_soft_cap.is_some() => {
                entry::decode_soft_cap(kernel, decode_variant, cache, d)
            }
            None => entry::decode(kernel, decode_variant, cache, d),
        }
    }
}

/// The lean kernel's entries: one per stack shift (16-bit caches, [`entry::LEAN_STACKED_HEADS`],
/// each with its shift a constant), or one that takes any shift (8-bit caches).
#[derive(Debug, Clone, PartialEq, Eq)]
enum LeanEntries<F> {
    PerShift(Vec<F>),
    AnyShift(F),
}

impl<F> LeanEntries<F> {
    /// The entry for a launch of `1 << stack_shift` KV heads per CTA.
    fn for_shift(&self, stack_shift: u32) -> &F {
        match self {
            // The stacking rule's shifts stay below the entries' count (`params::STACKED_MAX_HEADS`).
            Self::PerShift(entries) => &entries[(stack_shift as usize).min(entries.len() - 1)],
            Self::AnyShift(f) => f,
        }
    }

    fn iter(&self) -> impl Iterator<Item = &F> {
        match self {
            Self::PerShift(entries) => entries.iter(),
            Self::AnyShift(f) => core::slice::from_ref(f).iter(),
        }
    }

    fn try_map<G>(&self, mut f: impl FnMut(&F) -> Result<G>) -> Result<LeanEntries<G>> {
        Ok(match self {
            Self::PerShift(entries) => {
                LeanEntries::PerShift(entries.iter().map(&mut f).collect::<Result<_>>()?)
            }
            Self::AnyShift(e) => LeanEntries::AnyShift(f(e)?),
        })
    }
}

/// One decode launch of `run`: its kernel and grid, and whether the kernel guesses its page
/// lookup.
struct Launch<'a> {
    kernel: &'a CudaFunction,
    config: LaunchConfig,
    guessing: bool,
}

/// Batched decode over a paged K/V store: q and o of type `T`, K and V of `C` (`T` itself, or
/// the 8-bit codes [`float8::F8E4M3`] / [`float8::F8E5M2`] with [`KvScales`], for f16 or bf16
/// `T` on sm_90 and newer).
#[derive(Debug)]
pub struct BatchPagedDecodePlan<T: Element, C: CacheElement = T> {
    desc: BatchPagedDecodeDescriptor,
    variant: AttentionVariantDescriptor,
    config: DecodeConfig,
    pref: PlanPreference,
    arch: ArchSku,
    decode_fn: CudaFunction,
    /// Split configurations: the unsplit kernel, launched when the page table is too short for
    /// any request to take more than one chunk.
    whole_fn: Option<CudaFunction>,
    /// Split configurations of large batches: the schedule kernel ([`DecodeConfig::is_scheduled`]).
    schedule_fn: Option<CudaFunction>,
    /// The lean kernel, for short requests ([`DecodeConfig::lean`]): its entry for each number
    /// of KV heads per CTA, or its one entry for any.
    lean_fns: Option<LeanEntries<CudaFunction>>,
    /// The lean split kernel, for short requests over a scheduled partition
    /// ([`DecodeConfig::lean_spare_chunks`]).
    lean_split_fn: Option<CudaFunction>,
    /// The whole, lean and split kernels that guess their page lookup before the wait, launched
    /// instead of `whole_fn` (or the unsplit `decode_fn`), the lean kernel and the split
    /// `decode_fn` (on the split path, not the scheduled one) when their grid has at most
    /// `guess_max_ctas` CTAs (the lean one, of one KV head per CTA, only unstacked).
    guess_whole_fn: Option<CudaFunction>,
    guess_lean_fn: Option<CudaFunction>,
    guess_split_fn: Option<CudaFunction>,
    /// The SM count ([`PlanPreference::guess_max_ctas`] for tuning): in a launch of at most one
    /// CTA per SM, every CTA starts under the previous kernel and few CTAs read each page-table
    /// line. Up to two per SM, the whole kernel's guessing entry ran 1–3 % faster on most rows but
    /// 9 % slower on a full wave of short requests, and the lean one 2–6 % slower (runs 155–157,
    /// at 165 registers); at one KV head per CTA (125 registers, four per SM) it ran one row 5 %
    /// faster and another 5 % slower (run 174).
    guess_max_ctas: u32,
    /// The same bound for the split path: one and a half of the split entry's waves
    /// ([`PlanPreference::guess_max_ctas`] sets both). Most of such a launch's CTAs are in its
    /// first wave, which starts under the previous kernel; past it, the CTAs that wait for a
    /// slot pay the confirming reads with nothing to hide them under. In run 214's A/B (no
    /// bound) the split rows of 256–380 CTAs on 264-CTA waves ran 1–11 % faster guessing,
    /// 424–440 CTAs within 1.4 %, and 776 CTAs (b64-L512) 21 % slower.
    guess_split_max_ctas: u32,
    check_fn: CudaFunction,
    /// Launch as a programmatic dependent launch ([`PlanPreference::programmatic_launch`]).
    programmatic: bool,
    /// A programmatic launch whose CTAs read the page table before waiting for the previous
    /// kernel ([`PlanPreference::stable_page_table`]).
    early_page_table: bool,
    /// The caller's bound on the longest request of the coming runs
    /// ([`Self::set_max_kv_len`]).
    max_kv_len: Option<u32>,
    /// The context the kernels were loaded into: `run` launches only on its streams.
    ctx: Arc<CudaContext>,
    _t: PhantomData<(T, C)>,
}

impl<T: Element, C: CacheElement> BatchPagedDecodePlan<T, C> {
    /// Validates `desc` for q of type `T` over a cache of `C` (no GPU needed).
    pub fn check_descriptor(desc: &BatchPagedDecodeDescriptor) -> Result<()> {
        let kv = &desc.paged_kv;
        if kv.element != C::CACHE_KIND {
            return Err(invalid(format!(
                "descriptor element {:?} does not match the plan's cache element type {:?}",
                kv.element,
                C::CACHE_KIND
            )));
        }
        if C::CACHE_KIND.fp8_layout().is_some() {
            if !entry::FP8_Q_ELEMENTS.contains(&T::KIND) {
                return Err(Error::Unsupported(format!(
                    "q of type {:?} over an 8-bit cache (f16 and bf16 are supported)",
                    T::KIND
                )));
            }
        } else if C::CACHE_KIND != T::KIND {
            return Err(invalid(format!(
                "the cache element type {:?} must be q's type {:?} or an 8-bit float",
                C::CACHE_KIND,
                T::KIND
            )));
        }
        check_decode_descriptor(desc)
    }

    /// Checks every argument's shape, contiguity (strides of the K/V views) and storage size
    /// against `desc` (no GPU needed).
    pub fn check_layout(desc: &BatchPagedDecodeDescriptor, args: &BatchPagedDecodeArgsLayout) -> Result<()> {
        Self::kv_strides(desc, args).map(|_| ())
    }

    /// [`Self::check_layout`], returning the K/V views' strides in 16-byte units.
    fn kv_strides(desc: &BatchPagedDecodeDescriptor, args: &BatchPagedDecodeArgsLayout) -> Result<KvStrides> {
        let kv = &desc.paged_kv;
        let (b, hq, d) = (desc.batch_size, desc.num_qo_heads, kv.head_dim);
        let store = [kv.num_total_pages, kv.num_kv_heads, kv.page_size, d];
        expect_layout("q", &args.q, [b, hq, d], "[batch_size, num_qo_heads, head_dim]")?;
        let size = C::CACHE_KIND.size_bytes();
        let k = expect_kv_view("k_data", &args.k_data, store, size)?;
        let strides = same_kv_strides(k, expect_kv_view("v_data", &args.v_data, store, size)?)?;
        if args.indices.shape[0] < 0 {
            return Err(invalid(format!("indices: extent {} must be ≥ 0", args.indices.shape[0])));
        }
        expect_layout("indices", &args.indices, [args.indices.shape[0]], "[total_used_pages]")?;
        let table_tokens = args.indices.shape[0] as u64 * kv.page_size.max(0) as u64;
        if table_tokens > MAX_TABLE_TOKENS {
            return Err(Error::Unsupported(format!(
                "indices: {} page ids of {} tokens hold {table_tokens} tokens; the kernels count a \
                 request's tokens in u32, so at most {MAX_TABLE_TOKENS} are supported",
                args.indices.shape[0], kv.page_size
            )));
        }
        let b1 =
            b.checked_add(1).ok_or_else(|| invalid("batch_size + 1 (the length of indptr) overflows i32"))?;
        expect_layout("indptr", &args.indptr, [b1], "[batch_size + 1]")?;
        expect_layout("last_page_len", &args.last_page_len, [b], "[batch_size]")?;
        expect_layout("o", &args.o, [b, hq, d], "[batch_size, num_qo_heads, head_dim]")?;
        expect_layout("lse", &args.lse, [b, hq], "[batch_size, num_qo_heads]")?;
        Ok(strides)
    }

    /// Checks an attention variant for `desc` (no GPU needed): a finite, positive soft-cap, and
    /// none over an 8-bit cache (no kernel has both).
    pub fn check_variant(
        desc: &BatchPagedDecodeDescriptor,
        variant: &AttentionVariantDescriptor,
    ) -> Result<()> {
        Self::check_descriptor(desc)?;
        if let Some(cap) = variant.logits_soft_cap
            && !(cap.is_finite() && cap > 0.0)
        {
            return Err(invalid(format!("logits_soft_cap = {cap} must be finite and positive")));
        }
        if C::CACHE_KIND.fp8_layout().is_some() && variant.logits_soft_cap.is_some() {
            return Err(Error::Unsupported("a logits soft-cap over an 8-bit cache".into()));
        }
        Ok(())
    }

    /// Chooses a kernel and launch configuration for `desc` on `stream`'s device (plain
    /// attention: [`Self::select_variant`] with the default variant).
    pub fn select(
        stream: &Arc<CudaStream>,
        desc: &BatchPagedDecodeDescriptor,
        pref: PlanPreference,
    ) -> Result<Self> {
        Self::select_variant(stream, desc, &AttentionVariantDescriptor::default(), pref)
    }

    /// [`Self::select`] for an attention variant: a logits soft-cap selects the soft-cap kernels
    /// (no lean kernel), a sliding window bounds the tokens each request attends to (the chunks
    /// the split launches cover only the windows). Attention sinks need no selection: pass them
    /// to [`Self::run_with_sinks`].
    pub fn select_variant(
        stream: &Arc<CudaStream>,
        desc: &BatchPagedDecodeDescriptor,
        variant: &AttentionVariantDescriptor,
        pref: PlanPreference,
    ) -> Result<Self> {
        Self::check_variant(desc, variant)?;
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
        let configure_within = |residency| -> Result<DecodeConfig> {
            Ok(DecodeConfig {
                window_left: variant.window_left,
                ..configure(desc, &props, &pref, residency)?
            })
        };
        let mut config = configure_within(Residency::UNBOUNDED)?;
        let arch = ptx::build_for_preference(props.compute_capability, pref.allow_sm90a);
        if C::CACHE_KIND.fp8_layout().is_some() && arch != ArchSku::Sm90 {
            return Err(Error::Unsupported(format!(
                "an 8-bit K/V cache on compute capability {}.{}{}; the sm_90 build (sm_90 or newer) is required",
                props.compute_capability.0,
                props.compute_capability.1,
                if pref.allow_sm90a { "" } else { " with allow_sm90a off" }
            )));
        }
        let programmatic = pref.programmatic_launch && arch == ArchSku::Sm90;
        let guessing = programmatic && pref.stable_page_table.is_none();
        // The tensor-core kernel's split and unsplit entries, whose registers may hold fewer CTAs
        // per SM than the shared memory the rule sized the waves by (the two differ for some 8-bit
        // caches): the rule chooses again for the waves that are really resident.
        let residency_entries = (config.kernel == DecodeKernel::Mma).then(|| {
            [DecodeVariant::Split, DecodeVariant::Whole]
                .map(|v| DecodeEntries::decode_name(config.kernel, desc, variant, T::KIND, v))
        });
        // Those and the entries this configuration launches, compiled side by side (the second
        // choice rarely names other entries).
        let launched = DecodeEntries::of(&config, desc, variant, &pref, T::KIND, guessing);
        let mut names = launched.names();
        names.extend(residency_entries.iter().flatten().map(String::as_str));
        device::preload(ctx, arch, &names)?;
        if let Some([split, whole]) = &residency_entries {
            let resident = |name: &str| -> Result<u32> {
                let f = device::function(ctx, arch, name, config.smem_bytes)?;
                let n = f.occupancy_max_active_blocks_per_multiprocessor(
                    params::DECODE_THREADS,
                    config.smem_bytes as usize,
                    None,
                )?;
                Ok(if n > 0 { n } else { u32::MAX })
            };
            let residency = Residency { split: resident(split)?, whole: resident(whole)? };
            config = configure_within(residency)?;
        }
        let entries = DecodeEntries::of(&config, desc, variant, &pref, T::KIND, guessing);
        let decode_fn = device::function(ctx, arch, &entries.decode, config.smem_bytes)?;
        let whole_fn = match &entries.whole {
            Some(name) => Some(device::function(ctx, arch, name, config.smem_bytes)?),
            None => None,
        };
        let schedule_fn = match entries.schedule {
            Some(name) => Some(device::function(ctx, arch, name, params::SCHEDULE_SMEM_BYTES)?),
            None => None,
        };
        let lean_fns = match (config.lean, &entries.lean) {
            (Some(lean), Some(names)) => {
                Some(names.try_map(|name| device::function(ctx, arch, name, lean.smem_bytes))?)
            }
            _ => None,
        };
        let lean_split_fn = match (config.lean, &entries.lean_split) {
            (Some(lean), Some(name)) => Some(device::function(ctx, arch, name, lean.smem_bytes)?),
            _ => None,
        };
        let guess_whole_fn = match &entries.guess_whole {
            Some(name) => Some(device::function(ctx, arch, name, config.smem_bytes)?),
            None => None,
        };
        let guess_lean_fn = match (config.lean, &entries.guess_lean) {
            (Some(lean), Some(name)) => Some(device::function(ctx, arch, name, lean.smem_bytes)?),
            _ => None,
        };
        let guess_split_fn = match &entries.guess_split {
            Some(name) => Some(device::function(ctx, arch, name, config.smem_bytes)?),
            None => None,
        };
        Ok(Self {
            whole_fn,
            schedule_fn,
            lean_fns,
            lean_split_fn,
            guess_whole_fn,
            guess_lean_fn,
            guess_split_fn,
            guess_max_ctas: pref.guess_max_ctas.unwrap_or(props.sm_count),
            guess_split_max_ctas: pref.guess_max_ctas.unwrap_or(split_guess_bound(config.wave_ctas)),
            desc: *desc,
            variant: *variant,
            config,
            pref,
            programmatic,
            early_page_table: programmatic && pref.stable_page_table.is_some(),
            arch,
            decode_fn,
            check_fn: device::function(ctx, arch, entry::CHECK_PAGE_TABLE, 0)?,
            max_kv_len: None,
            ctx: ctx.clone(),
            _t: PhantomData,
        })
    }

    /// The descriptor this plan was selected for.
    pub fn descriptor(&self) -> &BatchPagedDecodeDescriptor {
        &self.desc
    }

    /// The attention variant this plan was selected for.
    pub fn variant(&self) -> &AttentionVariantDescriptor {
        &self.variant
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

    /// Whether `run`'s CTAs read the page table before waiting for the previous kernel (a
    /// programmatic launch with [`PlanPreference::stable_page_table`]).
    pub fn reads_page_table_early(&self) -> bool {
        self.early_page_table
    }

    /// Checks the arguments against the plan's descriptor.
    pub fn can_implement(&self, args: &BatchPagedDecodeArgs<'_, T, C>) -> Result<()> {
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
            element: C::CACHE_KIND,
            aux_element: ElementKind::F32,
            layout: KvLayout::Strided,
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

    /// Launches the decode on `stream`: one decode kernel, after the one-CTA schedule kernel on
    /// the scheduled paths ([`DecodePath::Scheduled`], [`DecodePath::LeanScheduled`]). Never
    /// allocates or synchronizes (graph-capturable), except with [`PlanPreference::checked`],
    /// which first validates the page table on the device and waits for the verdict.
    ///
    /// When requests are split (`workspace_size() > 0`), the split state lives in the workspace
    /// (see [`Workspace`]): the plan itself holds no device memory, so one plan may run on
    /// several streams at once, each with its own workspace.
    ///
    /// The caller guarantees a valid page table (see [`crate::page_table`]); with an invalid one
    /// the output is unspecified but every access stays inside the given tensors.
    ///
    /// Refused before any kernel is enqueued: a stream of another context than the plan's, or a
    /// tensor or workspace of another context than the stream's ([`Error::WrongDevice`]); a
    /// tensor or workspace of another `CudaContext` object whose event tracking does not order it
    /// with the stream ([`Error::UnorderedContext`]); on any stream but the legacy default one, a
    /// tensor or workspace allocated on a default stream of a context that orders streams with
    /// events ([`Error::UnorderedStream`]); a run on a capturing stream in a context
    /// that tracks events ([`Error::CaptureWithTracking`]: capture on
    /// [`Device::open_untracked`](crate::Device::open_untracked)), and a checked run on any
    /// capturing stream ([`Error::CheckedUnderCapture`]).
    ///
    /// An 8-bit cache is read with scales of 1 (its codes are the values); [`Self::run_scaled`]
    /// takes others.
    pub fn run(
        &self,
        stream: &Arc<CudaStream>,
        workspace: &mut Workspace<'_>,
        args: &mut BatchPagedDecodeArgs<'_, T, C>,
    ) -> Result<()> {
        self.launch(stream, workspace, args, None, KvScales::ONE)
    }

    /// [`Self::run`] with attention sinks: `sinks` is `[num_qo_heads]` f32, one logit per query
    /// head in the scaled logits' (natural-log) domain that joins each row's softmax
    /// denominator with no value (gpt-oss; [`reference::AttentionVariant::sinks`](crate::reference::AttentionVariant::sinks)).
    /// `-inf` is no sink; the values are read on the device, so they must be finite or `-inf`.
    /// Applied to the finished rows only, so it costs nothing in the main loop.
    pub fn run_with_sinks(
        &self,
        stream: &Arc<CudaStream>,
        workspace: &mut Workspace<'_>,
        args: &mut BatchPagedDecodeArgs<'_, T, C>,
        sinks: &TensorRef<'_, f32, 1>,
    ) -> Result<()> {
        self.launch(stream, workspace, args, Some(sinks), KvScales::ONE)
    }

    /// [`Self::run`] over an 8-bit cache whose codes stand for `k_scale · code` and
    /// `v_scale · code`: the logits are `sm_scale · k_scale · q·code` (`lse` is their base-2
    /// log-sum-exp) and the output is scaled by `v_scale`. Scales must be finite and positive,
    /// and 1 for a 16-bit or f32 cache.
    pub fn run_scaled(
        &self,
        stream: &Arc<CudaStream>,
        workspace: &mut Workspace<'_>,
        args: &mut BatchPagedDecodeArgs<'_, T, C>,
        scales: KvScales,
    ) -> Result<()> {
        self.launch(stream, workspace, args, None, scales)
    }

    /// [`Self::run_scaled`] with attention sinks ([`Self::run_with_sinks`]).
    pub fn run_scaled_with_sinks(
        &self,
        stream: &Arc<CudaStream>,
        workspace: &mut Workspace<'_>,
        args: &mut BatchPagedDecodeArgs<'_, T, C>,
        scales: KvScales,
        sinks: &TensorRef<'_, f32, 1>,
    ) -> Result<()> {
        self.launch(stream, workspace, args, Some(sinks), scales)
    }

    /// Checks the sinks tensor against the descriptor: `[num_qo_heads]`, contiguous.
    pub fn check_sinks(&self, sinks: &TensorLayout<1>) -> Result<()> {
        expect_layout("sinks", sinks, [self.desc.num_qo_heads], "[num_qo_heads]")
    }

    /// Enqueues the decode ([`Self::enqueue`]), then joins its reads of operands allocated on
    /// other streams into those streams ([`guard::join_reads`]).
    fn launch(
        &self,
        stream: &Arc<CudaStream>,
        workspace: &mut Workspace<'_>,
        args: &mut BatchPagedDecodeArgs<'_, T, C>,
        sinks: Option<&TensorRef<'_, f32, 1>>,
        scales: KvScales,
    ) -> Result<()> {
        if let Some(state_bytes) = self.enqueue(stream, workspace, args, sinks, scales)? {
            workspace.bind_split_state(state_bytes);
        }
        args.join_reads(stream, sinks)
    }

    /// Checks the call and launches the schedule kernel (scheduled paths) and the decode on
    /// `stream`; the operands' guards record the launch as they drop, on return. Returns the
    /// split state's size when the launch splits, which binds the workspace.
    fn enqueue(
        &self,
        stream: &Arc<CudaStream>,
        workspace: &mut Workspace<'_>,
        args: &mut BatchPagedDecodeArgs<'_, T, C>,
        sinks: Option<&TensorRef<'_, f32, 1>>,
        scales: KvScales,
    ) -> Result<Option<usize>> {
        let scales = scales.check()?;
        if C::CACHE_KIND.fp8_layout().is_none() && scales != KvScales::ONE {
            return Err(invalid(format!("{scales:?}: dequantization scales apply to 8-bit caches only")));
        }
        if self.pref.checked {
            guard::refuse_capture(stream)?;
        }
        guard::refuse_tracked_capture(stream)?;
        args.check_launch_context(&self.ctx, stream)?;
        workspace.check_context(stream)?;
        let strides = Self::kv_strides(&self.desc, &args.layout())?;
        if let Some(sinks) = sinks {
            guard::ordered_operand(stream, "sinks", sinks.home_stream())?;
            self.check_sinks(&sinks.layout())?;
        }
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
        let (sinks, _sinks) = match sinks {
            Some(t) => {
                let (ptr, guard) = t.data.device_ptr(stream);
                (ptr, Some(guard))
            }
            None => (0, None),
        };
        let num_indices = args.indices.shape[0].max(0) as u32;
        let path = self.path(num_indices as usize);
        let stack_shift = self.stack_shift(path, num_indices as usize);
        let split = path.splits();
        let layout = self.config.workspace_layout(&self.desc);
        let (ws_base, _w) =
            if split { workspace.split_state_ptr(stream, layout.state_bytes)? } else { (0, None) };
        let at = |offset: usize| if split { ws_base + offset as u64 } else { 0 };
        let scheduled = matches!(path, DecodePath::Scheduled | DecodePath::LeanScheduled);
        let partition = self.config.partition(&self.desc, path);
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
            item_map: match layout.chunk_map {
                Some(offset) if scheduled => at(offset),
                _ => 0,
            },
            batch: self.desc.batch_size as u32,
            num_qo_heads: self.desc.num_qo_heads as u32,
            num_kv_heads: kv.num_kv_heads as u32,
            page_size: kv.page_size as u32,
            num_total_pages: kv.num_total_pages as u32,
            num_indices,
            num_chunks: if split { partition.num_chunks } else { self.desc.batch_size as u32 },
            min_chunk: partition.min_chunk,
            preferred_chunk: partition.preferred_chunk,
            balance_items: partition.balance_chunks,
            heads_along_x: partition.heads_along_x as u32,
            page_shift: if kv.page_size.count_ones() == 1 { kv.page_size.trailing_zeros() } else { u32::MAX },
            scale_log2: self.desc.sm_scale * std::f32::consts::LOG2_E,
            // Only CTAs of the first wave can start before the previous kernel ends, only those
            // that read the page table early know their tiles then, and a scheduled partition is
            // known only after the schedule kernel.
            prefetch_ctas: if self.early_page_table && !scheduled { self.config.wave_ctas } else { 0 },
            k_scale: scales.k_scale,
            v_scale: scales.v_scale,
            kv_page_stride: strides.page,
            kv_head_stride: strides.head,
            kv_token_stride: strides.token,
            window_left: self.variant.window_left.unwrap_or(params::WINDOW_OFF),
            soft_cap_scale: self.variant.logits_soft_cap.map_or(0.0, |cap| self.desc.sm_scale / cap),
            soft_cap_log2: self.variant.logits_soft_cap.map_or(0.0, |cap| cap * std::f32::consts::LOG2_E),
            sinks,
            stack_shift,
            early_page_table: self.early_page_table as u32,
            group_reciprocal: params::group_reciprocal(
                (self.desc.num_qo_heads / kv.num_kv_heads.max(1)).max(1) as u32,
            ),
            unsplit_max_tokens: self.config.unsplit_max_tokens().min(u32::MAX as u64) as u32,
        };
        let Launch { kernel: decode_fn, config: cfg, .. } =
            self.launch_for(path, stack_shift, num_indices as usize);
        // Again now that the operands are taken: a wait for an operand's event recorded in
        // another stream's capture draws this stream into that capture.
        guard::refuse_tracked_capture(stream)?;
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
        // SAFETY: `p` points into tensors whose shapes `can_implement` checked against the
        // descriptor, and the workspace holds `workspace_size()` bytes; `programmatic` implies
        // the sm_90 PTX.
        unsafe { device::launch(stream, decode_fn, cfg, &p, self.programmatic)? };
        Ok(split.then_some(layout.state_bytes))
    }

    /// Whether `run` launches, for a page table of `num_indices` slots, an entry that guesses its
    /// page lookup before waiting for the previous kernel (and confirms it after the wait): a
    /// programmatic launch without [`PlanPreference::stable_page_table`], with plain logits, of
    /// requests in one chunk each, whose grid has at most one CTA per SM, or (a 16-bit cache) on
    /// the split path, whose grid has at most one and a half of the split entry's waves (either
    /// bound [`PlanPreference::guess_max_ctas`] when set).
    pub fn guesses_page_lookup(&self, num_indices: usize) -> bool {
        let path = self.path(num_indices);
        self.launch_for(path, self.stack_shift(path, num_indices), num_indices).guessing
    }

    /// The kernel and grid of `run`'s decode launch on `path`.
    fn launch_for(&self, path: DecodePath, stack_shift: u32, num_indices: usize) -> Launch<'_> {
        let split = path.splits();
        let lean_fn = match path {
            DecodePath::LeanScheduled => self.lean_split_fn.as_ref(),
            _ => self.lean_fns.as_ref().map(|fns| fns.for_shift(stack_shift)),
        };
        // The kernel, its CTAs per (chunk, KV head) and shared memory, and the chunks per head
        // block: one per request unless the requests are split.
        let (kernel, head_blocks, smem_bytes) = match (path, self.config.lean, lean_fn, &self.whole_fn) {
            (DecodePath::Lean | DecodePath::LeanScheduled, Some(lean), Some(lean_fn), _) => {
                (lean_fn, lean.head_blocks, lean.smem_bytes)
            }
            (DecodePath::Whole, _, _, Some(whole)) => {
                (whole, self.config.head_blocks, self.config.smem_bytes)
            }
            _ => (&self.decode_fn, self.config.head_blocks, self.config.smem_bytes),
        };
        let head_blocks = (self.desc.paged_kv.num_kv_heads as u32 * head_blocks) >> stack_shift;
        let chunks = self.grid_chunks(path, num_indices);
        let config = LaunchConfig {
            // Split kernels may put the head blocks along x (consecutive CTAs share a chunk);
            // otherwise x runs over the chunks (the requests, unsplit).
            grid_dim: if split && self.config.partition(&self.desc, path).heads_along_x {
                (head_blocks, chunks, 1)
            } else {
                (chunks, head_blocks, 1)
            },
            block_dim: (params::DECODE_THREADS, 1, 1),
            shared_mem_bytes: smem_bytes,
        };
        // A launch of at most `guess_max_ctas` CTAs (one per SM; on the split path, whose CTAs
        // derive the partition themselves, `guess_split_max_ctas`) takes the entry that guesses
        // its page lookup before the wait, where one is loaded (the lean one unstacked).
        let ctas = config.grid_dim.0 as u64 * config.grid_dim.1 as u64;
        let bound = match path {
            DecodePath::Split => self.guess_split_max_ctas,
            _ => self.guess_max_ctas,
        };
        let guessing_kernel = match path {
            _ if ctas > bound as u64 => None,
            DecodePath::Lean if stack_shift == 0 => self.guess_lean_fn.as_ref(),
            DecodePath::Lean => None,
            DecodePath::Whole => self.guess_whole_fn.as_ref(),
            DecodePath::Split => self.guess_split_fn.as_ref(),
            DecodePath::Scheduled | DecodePath::LeanScheduled => None,
        };
        Launch { kernel: guessing_kernel.unwrap_or(kernel), config, guessing: guessing_kernel.is_some() }
    }

    /// CTAs per head block along the chunk dimension of `run`'s decode launch for a page table
    /// of `num_indices` slots: one per request unless the requests are split, then as many as
    /// the path's partition can fill ([`DecodeConfig::partition`]).
    pub fn launched_chunks(&self, num_indices: usize) -> u32 {
        self.grid_chunks(self.path(num_indices), num_indices)
    }

    /// [`Self::launched_chunks`] on `path`.
    fn grid_chunks(&self, path: DecodePath, num_indices: usize) -> u32 {
        let batch = self.desc.batch_size as u32;
        if !path.splits() {
            return batch;
        }
        let tokens = self.config.attended_tokens(&self.desc, num_indices);
        self.config.partition(&self.desc, path).launched_chunks(batch, tokens)
    }

    /// Bounds the longest request of the coming runs: none holds more than `max_kv_len` tokens
    /// (FlashAttention's `max_seqlen_k`; a serving step knows it on the host, as FlashInfer's
    /// plan reads the lengths there). `None` (the default): no bound. `run` then skips the
    /// split path where its partition would not split any request: a bound of at most two
    /// pipeline tiles ([`DecodeConfig::unsplit_max_tokens`]; 128 tokens at head_dim 128) runs
    /// the whole kernel, without the partition, the CTAs left without a chunk and the workspace
    /// (on an H100, 16 requests of 64 tokens: 3.7 µs against 4.4 back to back, 4.4 against 5.7
    /// right after an append; run 262). Only the launch depends on it: a bound below the real
    /// lengths still gives correct results, its longer requests running unsplit. A graph keeps the
    /// launch captured under the bound of its capture.
    pub fn set_max_kv_len(&mut self, max_kv_len: Option<u32>) {
        self.max_kv_len = max_kv_len;
    }

    /// The bound of [`Self::set_max_kv_len`].
    pub fn max_kv_len(&self) -> Option<u32> {
        self.max_kv_len
    }

    /// The kernel `run` launches for a page table of `num_indices` slots
    /// ([`DecodeConfig::path_within`] under [`Self::max_kv_len`], with the lean kernel when it
    /// is loaded): it reads only that shape, never the lengths, so the choice holds across graph
    /// replays.
    pub fn path(&self, num_indices: usize) -> DecodePath {
        let lean_bound =
            self.lean_fns.as_ref().map(|_| self.pref.lean_max_avg_tokens.unwrap_or(LEAN_MAX_AVG_TOKENS));
        match self.config.path_within(&self.desc, num_indices, lean_bound, self.max_kv_len) {
            DecodePath::LeanScheduled if self.lean_split_fn.is_none() => DecodePath::Lean,
            path => path,
        }
    }

    /// KV heads each CTA covers for a page table of `num_indices` slots: more than one only on
    /// the lean path, for very short requests ([`LeanLaunch::stack_shift`](super::LeanLaunch::stack_shift), capped by
    /// [`PlanPreference::max_stacked_kv_heads`]); like [`Self::path`], it reads only the
    /// table's shape.
    pub fn stacked_kv_heads(&self, num_indices: usize) -> u32 {
        1 << self.stack_shift(self.path(num_indices), num_indices)
    }

    /// log2 of [`Self::stacked_kv_heads`] on `path`, the path `run` takes for `num_indices`.
    /// Only the lean path stacks: the lean split entries (lean-scheduled) take the shift as the
    /// constant 0 in the kernel, so this must stay 0 on that path.
    fn stack_shift(&self, path: DecodePath, num_indices: usize) -> u32 {
        match (path, self.config.lean) {
            (DecodePath::Lean, Some(lean)) => {
                let tokens = self.config.attended_tokens(&self.desc, num_indices);
                let max_heads = self.pref.max_stacked_kv_heads.unwrap_or(u32::MAX);
                lean.stack_shift(&self.desc, tokens, max_heads)
            }
            _ => 0,
        }
    }

    /// Validates the device page table of `args` on the GPU without reading out of bounds,
    /// then synchronizes `stream` and reports the first violation (lowest request) as
    /// [`Error::InvalidPageTable`]. Refused with [`Error::CheckedUnderCapture`] while `stream`
    /// is being captured into a graph, and, as [`Self::run`], with [`Error::WrongDevice`],
    /// [`Error::UnorderedContext`] or [`Error::UnorderedStream`] for operands the stream cannot
    /// use.
    pub fn check_page_table(
        &self,
        stream: &Arc<CudaStream>,
        args: &BatchPagedDecodeArgs<'_, T, C>,
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

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use super::*;

    /// Devices of the two PTX builds: an A100 (sm_80) and an H200 (sm_90).
    const DEVICES: [DeviceProps; 2] = [
        DeviceProps {
            sm_count: 108,
            compute_capability: (8, 0),
            smem_per_sm: 167936,
            smem_per_block_optin: 166912,
        },
        DeviceProps {
            sm_count: 132,
            compute_capability: (9, 0),
            smem_per_sm: 233472,
            smem_per_block_optin: 232448,
        },
    ];

    /// Descriptors of every element type and several head dims, batches and groups, supported or
    /// not.
    fn descriptors() -> impl Iterator<Item = BatchPagedDecodeDescriptor> {
        let elements = ElementKind::ALL;
        let shapes = [(1, 1, 1), (3, 8, 4), (64, 8, 8), (1000, 2, 16), (33, 1, 64), (600, 8, 4)];
        elements.into_iter().flat_map(move |element| {
            [32, 64, 96, 128, 256].into_iter().flat_map(move |head_dim| {
                shapes.map(|(batch_size, num_kv_heads, group)| BatchPagedDecodeDescriptor {
                    batch_size,
                    num_qo_heads: num_kv_heads * group,
                    sm_scale: 0.125,
                    paged_kv: PagedKvCacheDescriptor {
                        page_size: 16,
                        num_total_pages: 4096,
                        num_kv_heads,
                        head_dim,
                        element,
                    },
                })
            })
        })
    }

    /// The lean entries per stack shift are each reachable: a batch of many waves of 16-token
    /// requests over 16 KV heads of one query head each stacks as many KV heads as the
    /// preference allows (`tests/gpu.rs` runs each of these counts on the GPU).
    #[test]
    fn lean_stacking_reaches_every_entry() {
        let props = DEVICES[1];
        let elements = [ElementKind::F16, ElementKind::BF16, ElementKind::E4M3, ElementKind::E5M2];
        for (element, head_dim) in elements.into_iter().flat_map(|e| entry::LEAN_HEAD_DIMS.map(|d| (e, d))) {
            let desc = BatchPagedDecodeDescriptor {
                batch_size: 4096,
                num_qo_heads: 16,
                sm_scale: 0.125,
                paged_kv: PagedKvCacheDescriptor {
                    page_size: 16,
                    num_total_pages: 4096,
                    num_kv_heads: 16,
                    head_dim: head_dim as i32,
                    element,
                },
            };
            let config = configure(&desc, &props, &PlanPreference::default(), Residency::UNBOUNDED).unwrap();
            let lean = config.lean.expect("a lean launch");
            for heads in entry::LEAN_STACKED_HEADS {
                let shift = lean.stack_shift(&desc, 4096 * 16, heads);
                assert_eq!(1 << shift, heads, "{element:?} d{head_dim}, at most {heads} KV heads per CTA");
                let entries = LeanEntries::PerShift(entry::LEAN_STACKED_HEADS.to_vec());
                assert_eq!(*entries.for_shift(shift), heads);
            }
        }
    }

    #[test]
    fn every_entry_select_loads_is_in_the_shipped_ptx() {
        let prefs = [
            PlanPreference::default(),
            PlanPreference { lean_max_avg_tokens: Some(0), ..PlanPreference::default() },
            PlanPreference { num_splits: Some(4), ..PlanPreference::default() },
            PlanPreference { spare_chunks: Some(8), ..PlanPreference::default() },
            PlanPreference { lean_spare_chunks: Some(64), ..PlanPreference::default() },
        ];
        let mut loaded = BTreeSet::new();
        for props in DEVICES {
            let shipped = ptx::entries(ptx::for_compute_capability(props.compute_capability));
            let fp8_builds = ptx::build_for(props.compute_capability) == ArchSku::Sm90;
            for desc in descriptors() {
                let fp8 = desc.paged_kv.element.fp8_layout().is_some();
                if fp8 && !fp8_builds {
                    continue; // `select` refuses 8-bit caches before sm_90
                }
                // q over an 8-bit cache: both types it takes.
                let q_elements =
                    if fp8 { entry::FP8_Q_ELEMENTS.to_vec() } else { vec![desc.paged_kv.element] };
                // As the rule chooses, and again for kernels whose registers hold fewer CTAs.
                let residencies = [
                    Residency::UNBOUNDED,
                    Residency::both(2),
                    Residency::both(1),
                    Residency { split: 3, whole: 2 },
                ];
                let choices = prefs.iter().flat_map(|pref| residencies.map(|residency| (pref, residency)));
                for (pref, residency) in choices {
                    let Ok(config) = configure(&desc, &props, pref, residency) else { continue };
                    for &q in &q_elements {
                        for logits_soft_cap in [None, Some(30.0)] {
                            if fp8 && logits_soft_cap.is_some() {
                                continue; // no soft-cap over 8-bit caches
                            }
                            let variant = AttentionVariantDescriptor { logits_soft_cap, window_left: None };
                            // Programmatic launches (the sm_90 build) without the promise
                            // also load the guessing entries.
                            for guessing in [false, fp8_builds] {
                                let e = DecodeEntries::of(&config, &desc, &variant, pref, q, guessing);
                                // The entries whose residency `select` asks the driver for.
                                let probed = [DecodeVariant::Split, DecodeVariant::Whole]
                                    .map(|v| DecodeEntries::decode_name(config.kernel, &desc, &variant, q, v))
                                    .map(|name| (config.kernel == DecodeKernel::Mma).then_some(name));
                                // As `select` preloads them: the launched entries, then the probed.
                                let probed = probed.iter().flatten().map(String::as_str);
                                for name in e.names().into_iter().chain(probed) {
                                    assert!(
                                        shipped.contains(&name),
                                        "{name} ({desc:?}, {pref:?}) is not in the PTX"
                                    );
                                    loaded.insert(name.to_owned());
                                }
                            }
                        }
                    }
                }
            }
        }
        // The descriptors above reach every decode entry the host lists, and the page-table check.
        let listed: BTreeSet<String> = entry::of_build((9, 0))
            .into_iter()
            .filter(|n| {
                n.starts_with("decode_") || n == entry::SCHEDULE_CHUNKS || n == entry::CHECK_PAGE_TABLE
            })
            .collect();
        assert_eq!(loaded, listed);
    }
}
