//! GPU tests of the attention variants (logits soft-cap, sliding window, attention sinks) and of
//! the strided K/V layouts (HND, NHD, vLLM's and FlashInfer's interleaved K/V, pages of a shared
//! pool), decode and append, against the float64 reference (`reference::decode_strided`,
//! `reference::append`). On a machine without a CUDA driver each test prints a skip line and
//! passes.

mod gpu_support;
#[path = "../host/cli/problem.rs"]
#[allow(dead_code)]
mod problem;

use cudarc::driver::CudaSlice;
use gpu_support::{device, fp8_device, prepared_on_workers, two_fp8_pairings};
use half::{bf16, f16};
use paged_decode::reference::{AttentionVariant, DecodeOutput, KvView};
use paged_decode::{
    AttentionVariantDescriptor, BatchPagedDecodeArgs, BatchPagedDecodePlan, DecodePath, Device, Element,
    ElementKind, Error, KvLayout, KvScales, PagedKvAppendArgs, PagedKvAppendPairedArgs, PagedKvAppendPlan,
    PagedKvCacheDescriptor, PlanPreference, TensorMut, TensorRef, Workspace,
};
use problem::{HostProblem, ProblemCache, ProblemSpec, Rng, append_rows, compare_outputs};

/// The K/V store layouts the plans take.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Layout {
    /// Contiguous `[pages, kv_heads, page_size, D]`, separate K and V tensors.
    Hnd,
    /// Contiguous `[pages, page_size, kv_heads, D]`, separate K and V tensors.
    Nhd,
    /// vLLM: one `[blocks, 2, block_size, kv_heads, D]` tensor.
    VllmInterleaved,
    /// FlashInfer's 5-D HND tensor: one `[pages, 2, kv_heads, page_size, D]` tensor.
    HndInterleaved,
    /// Pages of pools shared by 3 layers (HND pages, page stride 3 pages), K at layer 1 of one
    /// pool, V at layer 2 of another.
    SharedPool,
}

const LAYOUTS: [Layout; 5] =
    [Layout::Hnd, Layout::Nhd, Layout::VllmInterleaved, Layout::HndInterleaved, Layout::SharedPool];

/// A K/V store in one of the layouts, on the host: both views' element offsets into their
/// buffers (`v` is `None` when V lives in K's buffer) and the strides they share. Elements
/// outside every row are NaN, so a misaddressed read shows.
struct Store<T> {
    k: Vec<T>,
    v: Option<Vec<T>>,
    k_offset: usize,
    v_offset: usize,
    stride: [i64; 4],
}

impl<T: ProblemCache> Store<T> {
    /// `k_hnd` / `v_hnd` (contiguous HND stores of `kv`) laid out as `layout`.
    fn new(layout: Layout, kv: &PagedKvCacheDescriptor, k_hnd: &[T], v_hnd: &[T]) -> Self {
        let (pages, heads, ps, d) = (
            kv.num_total_pages as usize,
            kv.num_kv_heads as usize,
            kv.page_size as usize,
            kv.head_dim as usize,
        );
        let page = heads * ps * d;
        let (stride, k_offset, v_offset, shared, len) = match layout {
            Layout::Hnd => (KvLayout::Hnd.strides(kv), 0, 0, false, pages * page),
            Layout::Nhd => (KvLayout::Nhd.strides(kv), 0, 0, false, pages * page),
            Layout::VllmInterleaved => {
                let (s, v) = KvLayout::Nhd.interleaved_strides(kv);
                (s, 0, v, true, 2 * pages * page)
            }
            Layout::HndInterleaved => {
                let (s, v) = KvLayout::Hnd.interleaved_strides(kv);
                (s, 0, v, true, 2 * pages * page)
            }
            Layout::SharedPool => {
                let mut s = KvLayout::Hnd.strides(kv);
                s[0] *= 3;
                // A few spare elements past the last page (a 16-byte multiple).
                (s, page, 2 * page, false, 3 * pages * page + 64)
            }
        };
        // NaN: the element's, or an 8-bit format's NaN code.
        let mut k = vec![T::store(f64::NAN, 1.0); len];
        let mut v_buf = vec![T::store(f64::NAN, 1.0); len];
        for p in 0..pages {
            for h in 0..heads {
                for t in 0..ps {
                    let src = ((p * heads + h) * ps + t) * d;
                    let row = p * stride[0] as usize + h * stride[1] as usize + t * stride[2] as usize;
                    k[k_offset + row..k_offset + row + d].copy_from_slice(&k_hnd[src..src + d]);
                    let dst = if shared { &mut k } else { &mut v_buf };
                    dst[v_offset + row..v_offset + row + d].copy_from_slice(&v_hnd[src..src + d]);
                }
            }
        }
        Store { k, v: (!shared).then_some(v_buf), k_offset, v_offset, stride }
    }
}

impl<T: Element> Store<T> {
    fn views(&self) -> (KvView<'_, T>, KvView<'_, T>) {
        let [page_stride, head_stride, token_stride, _] = self.stride.map(|s| s as usize);
        let view = |data, offset| KvView { data, offset, page_stride, head_stride, token_stride };
        (view(&self.k, self.k_offset), view(self.v.as_deref().unwrap_or(&self.k), self.v_offset))
    }
}

/// A store's device buffers.
struct DeviceStore<T> {
    k: CudaSlice<T>,
    v: Option<CudaSlice<T>>,
}

/// A variant problem: its random sizes and data, the variant and the sinks.
struct Case<T> {
    host: HostProblem<T>,
    layout: Layout,
    variant: AttentionVariantDescriptor,
    sinks: Option<Vec<f32>>,
}

impl<T: Element + ProblemCache> Case<T> {
    fn reference(&self, store: &Store<T>) -> DecodeOutput {
        let (k, v) = store.views();
        let variant = AttentionVariant {
            logits_soft_cap: self.variant.logits_soft_cap,
            window_left: self.variant.window_left,
            sinks: self.sinks.as_deref(),
        };
        paged_decode::reference::decode_strided(
            &self.host.desc,
            variant,
            &self.host.q,
            k,
            v,
            self.host.page_table(),
        )
        .unwrap()
    }
}

/// Runs `case` on the device with NaN-poisoned outputs; returns (o, lse, path).
fn run_case<T: Element + ProblemCache>(
    dev: &Device,
    what: &str,
    case: &Case<T>,
    store: &Store<T>,
    pref: PlanPreference,
) -> (Vec<T>, Vec<f32>, DecodePath) {
    run_store(dev, what, &case.host, store, &case.variant, case.sinks.as_deref(), pref)
}

/// A case ready for the device: its store in the case's layout and its float64 reference (the
/// CPU's share, made on worker threads while the device runs the cases before it).
struct Prepared<T> {
    what: String,
    case: Case<T>,
    store: Store<T>,
    reference: DecodeOutput,
}

impl<T: Element + ProblemCache> Prepared<T> {
    fn new(what: String, case: Case<T>) -> Self {
        let store = Store::new(case.layout, &case.host.desc.paged_kv, &case.host.k_data, &case.host.v_data);
        let reference = case.reference(&store);
        Prepared { what, case, store, reference }
    }

    /// Runs the case under `pref` and checks it against the reference: its error and path.
    fn run(&self, dev: &Device, pref: PlanPreference) -> (f64, DecodePath) {
        let (o, lse, path) = run_case(dev, &self.what, &self.case, &self.store, pref);
        let build = if pref.allow_sm90a { "" } else { " portable" };
        let what = format!("{} [{}{build}]", self.what, path.name());
        (check(&what, &self.case.host.spec, &o, &lse, &self.reference), path)
    }
}

/// Runs the plan of `variant` and `pref` over `host`'s problem with its K/V stores as `store`
/// (elements of `C`: q's type or 8-bit codes, dequantized with `host.scales`), with
/// NaN-poisoned outputs and the sinks if given; returns (o, lse, path).
fn run_store<T: Element + ProblemCache, C: ProblemCache>(
    dev: &Device,
    what: &str,
    h: &HostProblem<T, C>,
    store: &Store<C>,
    variant: &AttentionVariantDescriptor,
    sinks: Option<&[f32]>,
    pref: PlanPreference,
) -> (Vec<T>, Vec<f32>, DecodePath) {
    let s = &dev.stream;
    let plan = BatchPagedDecodePlan::<T, C>::select_variant(s, &h.desc, variant, pref)
        .unwrap_or_else(|e| panic!("{what}: select failed: {e}"));
    let kv = &h.desc.paged_kv;
    let (b, hq, d) = (h.desc.batch_size, h.desc.num_qo_heads, kv.head_dim);
    let shape = [kv.num_total_pages, kv.num_kv_heads, kv.page_size, d];
    let dev_store = DeviceStore {
        k: s.clone_htod(&store.k).unwrap(),
        v: store.v.as_ref().map(|v| s.clone_htod(v).unwrap()),
    };
    let q = s.clone_htod(&h.q).unwrap();
    let indices = s.clone_htod(if h.indices.is_empty() { &[0][..] } else { &h.indices }).unwrap();
    let n = h.indices.len() as i32;
    let indptr = s.clone_htod(&h.indptr).unwrap();
    let last = s.clone_htod(&h.last_page_len).unwrap();
    let mut o = s.clone_htod(&vec![T::from_f64(f64::NAN); h.q.len()]).unwrap();
    let mut lse = s.clone_htod(&vec![f32::NAN; (b * hq) as usize]).unwrap();
    let mut ws_bytes = s.alloc_zeros::<u8>(plan.workspace_size().max(1)).unwrap();
    let mut ws = Workspace::zeroed(s, ws_bytes.slice_mut(..)).unwrap();
    let v_buf = dev_store.v.as_ref().unwrap_or(&dev_store.k);
    let mut args = BatchPagedDecodeArgs {
        q: TensorRef::new(q.slice(..), [b, hq, d]),
        k_data: TensorRef::strided(dev_store.k.slice(store.k_offset..), shape, store.stride),
        v_data: TensorRef::strided(v_buf.slice(store.v_offset..), shape, store.stride),
        indices: TensorRef::new(indices.slice(..), [n]),
        indptr: TensorRef::new(indptr.slice(..), [b + 1]),
        last_page_len: TensorRef::new(last.slice(..), [b]),
        o: TensorMut::new(o.slice_mut(..), [b, hq, d]),
        lse: TensorMut::new(lse.slice_mut(..), [b, hq]),
    };
    match sinks {
        Some(sinks) => {
            let sinks = s.clone_htod(sinks).unwrap();
            let sinks_view = TensorRef::new(sinks.slice(..), [hq]);
            plan.run_scaled_with_sinks(s, &mut ws, &mut args, h.scales, &sinks_view).unwrap();
            s.synchronize().unwrap();
        }
        None => plan.run_scaled(s, &mut ws, &mut args, h.scales).unwrap(),
    }
    // The views borrow `o` and `lse` until here.
    let _ = args;
    (s.clone_dtoh(&o).unwrap(), s.clone_dtoh(&lse).unwrap(), plan.path(h.indices.len()))
}

/// Compares every request of (o, lse) with the reference; returns the worst relative error.
fn check<T: Element>(what: &str, spec: &ProblemSpec, o: &[T], lse: &[f32], r: &DecodeOutput) -> f64 {
    compare_outputs(spec, o, lse, r).unwrap_or_else(|e| panic!("{what}: {e}"))
}

/// A random variant problem: dtype-independent sizes as the plain sweep draws them, a window
/// (none, 0, shorter or longer than the requests), a soft-cap in [1, 100] or none, sinks or
/// none (some `-inf`), and a layout.
fn random_case<T: Element + ProblemCache>(rng: &mut Rng, seed: u64) -> Case<T> {
    let d = [64, 128, 256][rng.below(3) as usize];
    let group = match rng.below(3) {
        0 => 1 + rng.below(8) as usize,
        1 => [4, 8, 16, 32, 64][rng.below(5) as usize],
        _ => 1 + rng.below(64) as usize,
    };
    let hkv = 1 + rng.below(3) as usize;
    let page = match rng.below(3) {
        0 => [1, 8, 16, 32, 64, 256][rng.below(6) as usize],
        1 => 1 + rng.below(256) as usize,
        _ => 16,
    };
    let wide = rng.below(6) == 0;
    let batch = if wide { 200 + rng.below(400) as usize } else { 1 + rng.below(6) as usize };
    let max_len = if wide { 300 } else { (6000 / (group * hkv).max(1)).clamp(40, 2000) };
    let mut lens: Vec<usize> = (0..batch)
        .map(|_| match rng.below(8) {
            0 => 0,
            1 => 1,
            2 => page * (1 + rng.below(3) as usize),
            _ => rng.below(max_len as u64) as usize,
        })
        .collect();
    // One wide batch in three has 2–6 long requests, which the scheduled partitions cut (and a
    // window shorter than them confines to their last chunks).
    if wide && rng.below(3) == 0 {
        for _ in 0..2 + rng.below(5) {
            let at = rng.below(batch as u64) as usize;
            lens[at] = 2000 + rng.below(10_000) as usize;
        }
    }
    let window_left = match rng.below(6) {
        0 | 1 => None,
        2 => Some(0),
        3 => Some(rng.below(64) as u32),
        4 => Some(rng.below(max_len as u64) as u32),
        _ => Some(max_len as u32 + rng.below(1000) as u32),
    };
    let logits_soft_cap = if rng.below(2) == 0 {
        None
    } else {
        Some([1.0, 2.0, 5.0, 10.0, 30.0, 50.0, 100.0][rng.below(7) as usize])
    };
    let hq = group * hkv;
    let sinks = (rng.below(2) == 0).then(|| {
        (0..hq)
            .map(|_| if rng.below(5) == 0 { f32::NEG_INFINITY } else { (rng.symmetric() * 6.0) as f32 })
            .collect()
    });
    // f32's tolerance (1e-5) leaves no room for very peaky soft-capped logits.
    let q_scale = if T::KIND == ElementKind::F32 {
        [1.0, 2.0][rng.below(2) as usize]
    } else {
        [1.0, 2.0, 4.0][rng.below(3) as usize]
    };
    let spec = ProblemSpec {
        lens,
        num_qo_heads: hq,
        num_kv_heads: hkv,
        head_dim: d,
        page_size: page,
        sm_scale: (0.02 + rng.below(1000) as f32 / 4000.0) * if rng.below(8) == 0 { -1.0 } else { 1.0 },
        q_scale,
        spare_pages: rng.below(5) as usize,
        indices_slack: if rng.below(4) == 0 { rng.below(3000) as usize } else { 0 },
        seed,
        poison_unused_slots: true,
    };
    let layout = LAYOUTS[rng.below(LAYOUTS.len() as u64) as usize];
    Case {
        host: HostProblem::<T>::random(&spec).unwrap(),
        layout,
        variant: AttentionVariantDescriptor { logits_soft_cap, window_left },
        sinks,
    }
}

fn sweep<T: Element + ProblemCache>(
    dev: &Device,
    configs: usize,
    base_seed: u64,
    paths: &mut std::collections::BTreeMap<String, usize>,
) -> f64 {
    let mut worst: f64 = 0.0;
    let random_config = |i: usize| {
        let seed = base_seed.wrapping_add(i as u64);
        let case = random_case::<T>(&mut Rng::new(seed), seed);
        let h = &case.host;
        let what = format!(
            "config {i} (seed {seed}): {:?} {:?} {:?} sinks {} lens {:?} Hq {} Hkv {} D {} page {} scale {}",
            T::KIND,
            case.layout,
            case.variant,
            case.sinks.is_some(),
            h.spec.lens,
            h.spec.num_qo_heads,
            h.spec.num_kv_heads,
            h.spec.head_dim,
            h.spec.page_size,
            h.spec.sm_scale
        );
        Prepared::new(what, case)
    };
    prepared_on_workers(configs, random_config, |i, prepared| {
        let seed = base_seed.wrapping_add(i as u64);
        let spare_chunks = match i % 6 {
            0 => Some(0),
            1 => Some(1 + (seed % 40) as u32),
            _ => None,
        };
        let lean_max_avg_tokens = if i % 4 == 3 { Some(0) } else { None };
        // One in five on the portable build, which an sm_90 device otherwise never runs; one in
        // three with the page-table promise (early page-table reads with every variant and
        // layout).
        let allow_sm90a = i % 5 != 4;
        let stable_page_table = gpu_support::promised(i);
        let pref = PlanPreference {
            spare_chunks,
            lean_max_avg_tokens,
            allow_sm90a,
            stable_page_table,
            ..PlanPreference::default()
        };
        let (err, path) = prepared.run(dev, pref);
        worst = worst.max(err);
        let build = if allow_sm90a { "" } else { " portable" };
        *paths.entry(format!("{:?}/{}{build}", T::KIND, path.name())).or_insert(0) += 1;
    });
    worst
}

/// Random configurations of variants × layouts × dtypes × head_dims × groups × pages, ragged
/// lengths with empty and 1-token requests, windows shorter and longer than the requests, caps
/// 1–100 and sinks; a fresh seed each run unless `PAGED_DECODE_SEED` gives one, and
/// `PAGED_DECODE_VARIANT_SWEEP` configurations (200) per dtype.
#[test]
fn decode_variant_sweep() {
    let Some(dev) = device("decode_variant_sweep") else { return };
    let base_seed = problem::sweep_seed("decode_variant_sweep");
    let configs: usize = problem::env_number("PAGED_DECODE_VARIANT_SWEEP", 200);
    let mut paths = std::collections::BTreeMap::new();
    let w16 = sweep::<f16>(&dev, configs, base_seed, &mut paths);
    let wb16 = sweep::<bf16>(&dev, configs, base_seed ^ 0x5555, &mut paths);
    let w32 = sweep::<f32>(&dev, configs, base_seed ^ 0xAAAA, &mut paths);
    println!(
        "decode_variant_sweep: 3 × {configs} configurations passed ({paths:?}); worst rel err f16 {w16:.2e}, bf16 {wb16:.2e}, f32 {w32:.2e}"
    );
}

/// One explicit case: fresh random data of `spec` in `layout`, the variant, sinks of every kind
/// (finite and `-inf`) when `sinks`, against the reference; the path it took.
fn one<T: Element + ProblemCache>(
    dev: &Device,
    what: &str,
    spec: &ProblemSpec,
    layout: Layout,
    variant: AttentionVariantDescriptor,
    sinks: bool,
    pref: PlanPreference,
) -> DecodePath {
    explicit_case::<T>(what, spec, layout, variant, sinks).run(dev, pref).1
}

/// [`one`]'s case, prepared.
fn explicit_case<T: Element + ProblemCache>(
    what: &str,
    spec: &ProblemSpec,
    layout: Layout,
    variant: AttentionVariantDescriptor,
    sinks: bool,
) -> Prepared<T> {
    let host = HostProblem::<T>::random(spec).unwrap();
    let sinks =
        sinks.then(|| (0..spec.num_qo_heads).map(|h| [-2.0, 0.5, 3.0, f32::NEG_INFINITY][h % 4]).collect());
    let what = format!("{what}: {:?} {layout:?} {variant:?} sinks {}", T::KIND, sinks.is_some());
    Prepared::new(what, Case { host, layout, variant, sinks })
}

/// A spec of these request lengths, heads, head_dim and page size.
fn spec(lens: Vec<usize>, hq: usize, hkv: usize, d: usize, page: usize) -> ProblemSpec {
    ProblemSpec { lens, ..ProblemSpec::uniform(1, 0, hq, hkv, d, page) }
}

/// One fixed case per (layout, variant) with every kernel path: whole, lean, split, scheduled,
/// lean-scheduled.
#[test]
fn decode_variant_edge_cases() {
    let Some(dev) = device("decode_variant_edge_cases") else { return };
    let cases: Vec<(&str, ProblemSpec, PlanPreference)> = vec![
        (
            "empty, 1-token and full requests",
            spec(vec![0, 1, 16, 33, 0], 32, 8, 128, 16),
            PlanPreference::default(),
        ),
        ("one long request (split)", spec(vec![9000], 32, 8, 128, 16), PlanPreference::default()),
        ("batch 8 of 4k (split)", spec(vec![4096; 8], 32, 8, 128, 16), PlanPreference::default()),
        (
            "batch 40, ragged (split, every CTA's partition)",
            spec((0..40).map(|i| (i * 397) % 3000).collect(), 16, 4, 64, 16),
            PlanPreference { spare_chunks: Some(40), ..PlanPreference::default() },
        ),
        (
            "batch 72, ragged (scheduled)",
            spec((0..72).map(|i| (i * 397) % 3000).collect(), 16, 4, 64, 16),
            PlanPreference { spare_chunks: Some(72), ..PlanPreference::default() },
        ),
        (
            "batch 600, short (lean)",
            spec((0..600).map(|i| i % 200).collect(), 16, 2, 128, 16),
            PlanPreference::default(),
        ),
        (
            // Four lean waves with a heavy tail: the long requests cut into chunks and merged.
            "batch 700, short with long ones (lean-scheduled)",
            spec(
                (0..700).map(|i| if i % 101 == 5 { 5000 } else { (i * 37) % 301 }).collect(),
                32,
                8,
                128,
                16,
            ),
            PlanPreference::default(),
        ),
        (
            // Four KV heads per lean CTA (one CTA per request): windows and sinks on stacked
            // heads, small enough for memcheck.
            "batch 1200, very short (lean, stacked KV heads)",
            spec((0..1200).map(|i| (i * 7) % 23).collect(), 16, 4, 128, 16),
            PlanPreference::default(),
        ),
        (
            "batch 300, whole",
            spec((0..300).map(|i| i % 500).collect(), 8, 2, 256, 8),
            PlanPreference { spare_chunks: Some(0), ..PlanPreference::default() },
        ),
        ("page 1, group 64", spec(vec![300, 5, 0], 64, 1, 64, 1), PlanPreference::default()),
    ];
    let windows = [None, Some(0), Some(127), Some(1023), Some(100_000)];
    let mut runs = Vec::new();
    for c in 0..cases.len() {
        for (i, layout) in LAYOUTS.into_iter().enumerate() {
            let window_left = windows[(c + i) % windows.len()];
            for (cap, sinks) in [(None, false), (None, true), (Some(30.0), false), (Some(1.0), true)] {
                runs.push(EdgeRun {
                    case: c,
                    layout,
                    variant: AttentionVariantDescriptor { logits_soft_cap: cap, window_left },
                    sinks,
                });
            }
        }
    }
    let mut paths = std::collections::BTreeSet::new();
    edge_runs::<f16>(&dev, &cases, &runs, &mut paths);
    edge_runs::<bf16>(&dev, &cases, &runs, &mut paths);
    edge_runs::<f32>(&dev, &cases, &runs, &mut paths);
    // Soft-caps that saturate: logits far beyond the cap (q scaled up, sm_scale 1).
    for cap in [1.0, 5.0, 50.0, 100.0] {
        let spec = ProblemSpec { q_scale: 4.0, sm_scale: 1.0, ..spec(vec![700, 3, 64], 16, 4, 128, 16) };
        let variant = AttentionVariantDescriptor { logits_soft_cap: Some(cap), window_left: None };
        one::<f16>(&dev, "saturating soft-cap", &spec, Layout::Nhd, variant, true, PlanPreference::default());
        one::<bf16>(
            &dev,
            "saturating soft-cap",
            &spec,
            Layout::Hnd,
            variant,
            false,
            PlanPreference::default(),
        );
    }
    let all = [
        DecodePath::Whole,
        DecodePath::Lean,
        DecodePath::Split,
        DecodePath::Scheduled,
        DecodePath::LeanScheduled,
    ];
    for p in all {
        assert!(paths.contains(p.name()), "paths taken: {paths:?}");
    }
    println!("decode_variant_edge_cases: passed on paths {paths:?}");
}

/// One run of [`decode_variant_edge_cases`]: case `case` of its list in this layout and variant.
#[derive(Clone, Copy)]
struct EdgeRun {
    case: usize,
    layout: Layout,
    variant: AttentionVariantDescriptor,
    sinks: bool,
}

/// `runs` over `cases` (name, sizes, plan preference) in element type `T`, their data and
/// references made on worker threads; the paths they took go into `paths`.
fn edge_runs<T: Element + ProblemCache>(
    dev: &Device,
    cases: &[(&str, ProblemSpec, PlanPreference)],
    runs: &[EdgeRun],
    paths: &mut std::collections::BTreeSet<&'static str>,
) {
    let prepare = |r: usize| {
        let EdgeRun { case, layout, variant, sinks } = runs[r];
        explicit_case::<T>(cases[case].0, &cases[case].1, layout, variant, sinks)
    };
    prepared_on_workers(runs.len(), prepare, |r, prepared| {
        paths.insert(prepared.run(dev, cases[runs[r].case].2).1.name());
    });
}

/// 8-bit caches (every pairing of f16 / bf16 q and E4M3 / E5M2 codes, two per case in turn) in
/// every layout, with and without a window
/// and sinks, on the split, whole, lean (one KV head per CTA and stacked) and scheduled paths,
/// against the float64 reference over the same layout of the dequantized values (rounded to
/// f32, within 1e-7).
#[test]
fn fp8_decode_in_every_layout() {
    let test = "fp8_decode_in_every_layout";
    let Some(dev) = fp8_device(test) else { return };
    let spare = |n| PlanPreference { spare_chunks: Some(n), ..PlanPreference::default() };
    let cases = [
        ("ragged", spec(vec![0, 1, 16, 33, 0, 2500], 32, 8, 128, 16), PlanPreference::default()),
        ("whole", spec((0..300).map(|i| i % 500).collect(), 8, 2, 256, 8), spare(0)),
        ("lean", spec((0..600).map(|i| i % 200).collect(), 16, 2, 128, 16), PlanPreference::default()),
        (
            "stacked lean",
            spec((0..1200).map(|i| (i * 7) % 23).collect(), 16, 4, 64, 16),
            PlanPreference::default(),
        ),
        ("scheduled", spec((0..72).map(|i| (i * 397) % 3000).collect(), 16, 4, 64, 16), spare(72)),
    ];
    let mut paths = std::collections::BTreeSet::new();
    // `PAGED_DECODE_FP8_LAYOUT_CASES` runs only the first few (the sanitizers).
    let count: usize = problem::env_number("PAGED_DECODE_FP8_LAYOUT_CASES", cases.len());
    for (c, (name, spec, pref)) in cases.iter().take(count).enumerate() {
        let spec = ProblemSpec { seed: 7500 + c as u64, ..spec.clone() };
        for (i, layout) in LAYOUTS.into_iter().enumerate() {
            let window_left = [None, Some(63)][(c + i) % 2];
            let sinks = (c + i) % 3 == 0;
            // Two pairings of q type and code format per case, in turn (the window alternates
            // over the layouts, so each pairing runs with and without one).
            let (a, b) = two_fp8_pairings!(c, |Q, C| {
                fp8_layout_case::<Q, C>(&dev, name, &spec, layout, window_left, sinks, *pref)
            });
            paths.extend([a, b]);
        }
    }
    println!("{test}: passed on paths {paths:?}");
}

/// One case of [`fp8_decode_in_every_layout`]; the path it took.
fn fp8_layout_case<T: Element + ProblemCache, C: ProblemCache>(
    dev: &Device,
    name: &str,
    spec: &ProblemSpec,
    layout: Layout,
    window_left: Option<u32>,
    sinks: bool,
    pref: PlanPreference,
) -> &'static str {
    let host = HostProblem::<T, C>::random(spec).unwrap();
    let kv = host.desc.paged_kv;
    let codes = Store::new(layout, &kv, &host.k_data, &host.v_data);
    let dequantized =
        |data: &[C], scale: f32| data.iter().map(|&c| c.value(scale) as f32).collect::<Vec<_>>();
    let (k, v) =
        (dequantized(&host.k_data, host.scales.k_scale), dequantized(&host.v_data, host.scales.v_scale));
    let values_kv = PagedKvCacheDescriptor { element: ElementKind::F32, ..kv };
    let values = Store::new(layout, &values_kv, &k, &v);
    let sinks: Option<Vec<f32>> =
        sinks.then(|| (0..spec.num_qo_heads).map(|h| [-2.0, 0.5, 3.0, f32::NEG_INFINITY][h % 4]).collect());
    let q: Vec<f32> = host.q.iter().map(|x| x.to_f64() as f32).collect();
    let desc = paged_decode::BatchPagedDecodeDescriptor { paged_kv: values_kv, ..host.desc };
    let (k_view, v_view) = values.views();
    let reference_variant = AttentionVariant { logits_soft_cap: None, window_left, sinks: sinks.as_deref() };
    let r = paged_decode::reference::decode_strided(
        &desc,
        reference_variant,
        &q,
        k_view,
        v_view,
        host.page_table(),
    )
    .unwrap();
    let variant = AttentionVariantDescriptor { logits_soft_cap: None, window_left };
    let what = format!(
        "{name}: {:?}/{:?} {layout:?} window {window_left:?} sinks {}",
        T::KIND,
        C::CACHE_KIND,
        sinks.is_some()
    );
    let (o, lse, path) = run_store(dev, &what, &host, &codes, &variant, sinks.as_deref(), pref);
    check(&format!("{what} [{}]", path.name()), &host.spec, &o, &lse, &r);
    path.name()
}

/// The portable build (`allow_sm90a: false`) with the variants on the entries of its own that
/// the sweeps reach rarely or never: the soft-capped unsplit tensor-core (head_dim 256) and
/// CUDA-core (f32) entries, and a window with sinks on stacked lean CTAs.
#[test]
fn portable_build_variants() {
    let Some(dev) = device("portable_build_variants") else { return };
    let portable = PlanPreference { allow_sm90a: false, ..PlanPreference::default() };
    let whole = PlanPreference { num_splits: Some(1), spare_chunks: Some(0), ..portable };
    let capped = AttentionVariantDescriptor { logits_soft_cap: Some(30.0), window_left: None };
    let windowed = AttentionVariantDescriptor { logits_soft_cap: None, window_left: Some(7) };
    let mut paths = Vec::new();
    let lens = || vec![0, 1, 300, 17];
    let d256 = ProblemSpec { seed: 7400, ..spec(lens(), 16, 4, 256, 16) };
    paths.push(one::<f16>(&dev, "portable, soft-cap, d 256", &d256, Layout::Hnd, capped, true, whole));
    paths.push(one::<bf16>(&dev, "portable, soft-cap, d 256", &d256, Layout::Nhd, capped, false, whole));
    let d128 = ProblemSpec { seed: 7401, ..spec(lens(), 32, 8, 128, 16) };
    paths.push(one::<f32>(&dev, "portable, soft-cap, f32", &d128, Layout::Hnd, capped, true, whole));
    let short = ProblemSpec { seed: 7402, ..spec((0..1200).map(|i| (i * 7) % 23).collect(), 16, 4, 128, 16) };
    paths.push(one::<f16>(&dev, "portable, stacked lean", &short, Layout::Nhd, windowed, true, portable));
    paths.push(one::<bf16>(&dev, "portable, stacked lean", &short, Layout::Hnd, windowed, true, portable));
    let names: Vec<_> = paths.iter().map(|p| p.name()).collect();
    assert_eq!(&names[..3], &["whole"; 3], "paths {names:?}");
    assert_eq!(&names[3..], &["lean"; 2], "paths {names:?}");
    println!("portable_build_variants: passed on paths {names:?}");
}

/// A window reads only its pages: pages before every request's window hold NaN, which any read
/// of them would carry into the output.
#[test]
fn window_reads_only_the_window() {
    let Some(dev) = device("window_reads_only_the_window") else { return };
    for (window, lens, pref) in [
        (127u32, vec![4096usize], PlanPreference::default()),
        (1023, vec![8192; 4], PlanPreference::default()),
        (255, (0..64).map(|i| 1000 + 37 * i).collect(), PlanPreference::default()),
        (
            63,
            (0..600).map(|i| 100 + i % 300).collect(),
            PlanPreference { spare_chunks: Some(0), ..PlanPreference::default() },
        ),
    ] {
        let spec = ProblemSpec { lens, ..ProblemSpec::uniform(1, 0, 32, 8, 128, 16) };
        let mut host = HostProblem::<f16>::random(&spec).unwrap();
        let reference = Case {
            host: host.clone(),
            layout: Layout::Hnd,
            variant: AttentionVariantDescriptor { logits_soft_cap: None, window_left: Some(window) },
            sinks: None,
        };
        let store = Store::new(Layout::Hnd, &host.desc.paged_kv, &host.k_data, &host.v_data);
        let r = reference.reference(&store);
        // Poison every whole page before each request's window.
        let (ps, d, heads) = (16usize, 128usize, 8usize);
        for (b, &len) in spec.lens.iter().enumerate() {
            let first = len.saturating_sub(window as usize + 1);
            for slot in host.indptr[b] as usize..host.indptr[b] as usize + first / ps {
                let page = host.indices[slot] as usize;
                for x in &mut host.k_data[page * heads * ps * d..(page + 1) * heads * ps * d] {
                    *x = f16::NAN;
                }
                for x in &mut host.v_data[page * heads * ps * d..(page + 1) * heads * ps * d] {
                    *x = f16::NAN;
                }
            }
        }
        let case = Case { host, ..reference };
        let store = Store::new(Layout::Hnd, &case.host.desc.paged_kv, &case.host.k_data, &case.host.v_data);
        let what = format!("window {window}, {} requests", spec.batch());
        let (o, lse, path) = run_case(&dev, &what, &case, &store, pref);
        check(&format!("{what} [{}]", path.name()), &spec, &o, &lse, &r);
    }
}

fn checksum<T: Element>(v: &[T]) -> Vec<u64> {
    v.iter().map(|x| x.to_f64().to_bits()).collect()
}

/// The append plan writes the new token into every layout exactly where the reference puts it
/// (and nothing else: the NaN between rows stays).
#[test]
fn append_into_every_layout() {
    let Some(dev) = device("append_into_every_layout") else { return };
    fn one<T: Element + ProblemCache>(dev: &Device, layout: Layout, page: usize, d: usize, seed: u64) {
        let s = &dev.stream;
        let mut rng = Rng::new(seed);
        let (host, desc) = HostProblem::<T>::random_append(&mut rng, page, d, seed).unwrap();
        let row = append_rows(&desc) * d;
        let key: Vec<T> = (0..row).map(|_| T::from_f64(rng.symmetric())).collect();
        let value: Vec<T> = (0..row).map(|_| T::from_f64(rng.symmetric())).collect();
        let (mut k_ref, mut v_ref) = (host.k_data.clone(), host.v_data.clone());
        paged_decode::reference::append(&desc, &key, &value, &mut k_ref, &mut v_ref, host.page_table())
            .unwrap();
        let before = Store::new(layout, &desc.paged_kv, &host.k_data, &host.v_data);
        let after = Store::new(layout, &desc.paged_kv, &k_ref, &v_ref);

        let plan = PagedKvAppendPlan::<T>::select(s, &desc, PlanPreference::default()).unwrap();
        let (k, v) = append_into_store(dev, &plan, &host, &key, &value, &before, KvScales::ONE);
        assert_eq!(checksum(&k), checksum(&after.k), "{layout:?}: K store differs (page {page}, d {d})");
        if let (Some(v), Some(v_after)) = (&v, &after.v) {
            assert_eq!(checksum(v), checksum(v_after), "{layout:?}: V store differs (page {page}, d {d})");
        }
    }
    for layout in LAYOUTS {
        for (i, (page, d)) in [(1, 64), (16, 128), (7, 256)].into_iter().enumerate() {
            one::<f16>(&dev, layout, page, d, 10 + i as u64);
            one::<bf16>(&dev, layout, page, d, 20 + i as u64);
            one::<f32>(&dev, layout, page, d, 30 + i as u64);
        }
    }
    println!("append_into_every_layout: 5 layouts × f16/bf16/f32 × 3 geometries match the reference");
}

/// Quantizing appends (f16 and bf16 tokens into E4M3 and E5M2 stores, each pairing in every
/// layout) into every layout, the interleaved
/// ones through `run_paired_scaled`: the store holds the reference's codes (`append_fp8`, with
/// the store's scales) bit for bit, and nothing else changed.
#[test]
fn quantized_append_into_every_layout() {
    let test = "quantized_append_into_every_layout";
    let Some(dev) = fp8_device(test) else { return };
    for (l, layout) in LAYOUTS.into_iter().enumerate() {
        for (i, (page, d)) in [(1, 64), (16, 128), (7, 256)].into_iter().enumerate() {
            // Every pairing of token type and code format in every layout, two per case in turn.
            let seed = 40 + i as u64;
            two_fp8_pairings!(l + i, |Q, C, k| {
                quantized_append::<Q, C>(&dev, layout, page, d, seed + 10 * k, C::from_bits)
            });
        }
    }
    println!(
        "{test}: 5 layouts × 3 geometries × two of the four token/code pairings each match the reference's codes"
    );
}

/// One case of [`quantized_append_into_every_layout`]; `from_code` makes a store element of a
/// code.
fn quantized_append<T: Element + ProblemCache, C: ProblemCache>(
    dev: &Device,
    layout: Layout,
    page: usize,
    d: usize,
    seed: u64,
    from_code: fn(u8) -> C,
) {
    let s = &dev.stream;
    let mut rng = Rng::new(seed);
    let (host, desc) = HostProblem::<T, C>::random_append(&mut rng, page, d, seed).unwrap();
    let (key, value) = problem::quantization_tokens::<T>(&mut rng, append_rows(&desc) * d);
    let codes = |data: &[C]| data.iter().map(|c| c.code()).collect::<Vec<u8>>();
    let (mut k_ref, mut v_ref) = (codes(&host.k_data), codes(&host.v_data));
    paged_decode::reference::append_fp8(
        &desc,
        &key,
        &value,
        &mut k_ref,
        &mut v_ref,
        host.scales,
        host.page_table(),
    )
    .unwrap();
    let elements = |codes: &[u8]| codes.iter().map(|&c| from_code(c)).collect::<Vec<C>>();
    let before = Store::new(layout, &desc.paged_kv, &host.k_data, &host.v_data);
    let after = Store::new(layout, &desc.paged_kv, &elements(&k_ref), &elements(&v_ref));

    let plan = PagedKvAppendPlan::<T, C>::select(s, &desc, PlanPreference::default()).unwrap();
    let (k, v) = append_into_store(dev, &plan, &host, &key, &value, &before, host.scales);
    let what = format!("{:?} into {:?} {layout:?} (page {page}, d {d})", T::KIND, C::CACHE_KIND);
    assert!(codes(&k) == codes(&after.k), "{what}: K store differs");
    if let (Some(v), Some(v_after)) = (&v, &after.v) {
        assert!(codes(v) == codes(v_after), "{what}: V store differs");
    }
}

/// Appends `key` and `value` (`[batch, num_kv_heads, head_dim]` of `host`'s descriptor) by
/// `host`'s page table into a device copy of `store` with `plan` and `scales` (the interleaved
/// layouts through `run_paired_scaled`); returns the K buffer and, when V has its own, the V
/// buffer after the append.
fn append_into_store<T: Element + ProblemCache, C: ProblemCache>(
    dev: &Device,
    plan: &PagedKvAppendPlan<T, C>,
    host: &HostProblem<T, C>,
    key: &[T],
    value: &[T],
    store: &Store<C>,
    scales: KvScales,
) -> (Vec<C>, Option<Vec<C>>) {
    let s = &dev.stream;
    let kv = &host.desc.paged_kv;
    let d = kv.head_dim;
    let shape = [kv.num_total_pages, kv.num_kv_heads, kv.page_size, d];
    let key_d = s.clone_htod(key).unwrap();
    let value_d = s.clone_htod(value).unwrap();
    let indices = s.clone_htod(&host.indices).unwrap();
    let indptr = s.clone_htod(&host.indptr).unwrap();
    let last = s.clone_htod(&host.last_page_len).unwrap();
    let n = host.indices.len() as i32;
    let mut k_d = s.clone_htod(&store.k).unwrap();
    let mut v_d = store.v.as_ref().map(|v| s.clone_htod(v).unwrap());
    match &mut v_d {
        Some(v_d) => {
            let mut args = PagedKvAppendArgs {
                key: TensorRef::new(key_d.slice(..), [host.desc.batch_size, kv.num_kv_heads, d]),
                value: TensorRef::new(value_d.slice(..), [host.desc.batch_size, kv.num_kv_heads, d]),
                k_data: TensorMut::strided(k_d.slice_mut(store.k_offset..), shape, store.stride),
                v_data: TensorMut::strided(v_d.slice_mut(store.v_offset..), shape, store.stride),
                indices: TensorRef::new(indices.slice(..), [n]),
                indptr: TensorRef::new(indptr.slice(..), [8]),
                last_page_len: TensorRef::new(last.slice(..), [7]),
            };
            plan.run_scaled(s, &mut Workspace::none(), &mut args, scales).unwrap();
        }
        None => {
            let mut args = PagedKvAppendPairedArgs {
                key: TensorRef::new(key_d.slice(..), [host.desc.batch_size, kv.num_kv_heads, d]),
                value: TensorRef::new(value_d.slice(..), [host.desc.batch_size, kv.num_kv_heads, d]),
                kv_data: TensorMut::strided(k_d.slice_mut(store.k_offset..), shape, store.stride),
                v_offset: store.v_offset - store.k_offset,
                indices: TensorRef::new(indices.slice(..), [n]),
                indptr: TensorRef::new(indptr.slice(..), [8]),
                last_page_len: TensorRef::new(last.slice(..), [7]),
            };
            plan.run_paired_scaled(s, &mut Workspace::none(), &mut args, scales).unwrap();
        }
    }
    (s.clone_dtoh(&k_d).unwrap(), v_d.map(|v_d| s.clone_dtoh(&v_d).unwrap()))
}

/// Sinks of another context, or of the wrong shape, are refused before anything runs.
#[test]
fn sinks_are_checked() {
    let Some(dev) = device("sinks_are_checked") else { return };
    let s = &dev.stream;
    let spec = ProblemSpec::uniform(2, 100, 8, 2, 128, 16);
    let host = HostProblem::<f16>::random(&spec).unwrap();
    let plan = BatchPagedDecodePlan::<f16>::select(s, &host.desc, PlanPreference::default()).unwrap();
    let mut buf = problem::DeviceProblem::upload(s, &host, plan.workspace_size()).unwrap();
    let sinks = s.clone_htod(&[0f32; 9]).unwrap();
    let (mut args, mut ws) = buf.args_and_workspace();
    let r = plan.run_with_sinks(s, &mut ws, &mut args, &TensorRef::new(sinks.slice(..), [9]));
    assert!(matches!(r, Err(Error::InvalidProblem(ref m)) if m.contains("sinks")), "{r:?}");
    let r = plan.run_with_sinks(s, &mut ws, &mut args, &TensorRef::new(sinks.slice(..8), [8]));
    assert!(r.is_ok(), "{r:?}");
}
