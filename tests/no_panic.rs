//! Property tests: every public function that runs without a GPU (validation, configuration,
//! the CPU reference, page-table checks, layouts, PTX helpers) and the test-problem generation
//! returns `Ok` or a typed error on arbitrary input, and never panics. The benchmark's own
//! (shape rows, plotting) are unit tests of the binary (`host/cli/bench.rs`).

#[path = "../host/cli/problem.rs"]
#[allow(dead_code)]
mod problem;

use half::{bf16, f16};
use paged_decode::device::DeviceProps;
use paged_decode::float8::{F8E4M3, F8E5M2};
use paged_decode::page_table::{PageTableRules, validate_append_table, validate_page_table};
use paged_decode::plan::{DecodeConfig, DecodeKernel, DecodePath, LeanLaunch, MAX_SPLITS};
use paged_decode::reference::{self, AttentionVariant, KvScales, KvView, PageTable};
use paged_decode::tensor::row_major_strides;
use paged_decode::{
    AttentionVariantDescriptor, BatchPagedDecodeArgsLayout, BatchPagedDecodeDescriptor, BatchPagedDecodePlan,
    CacheElement, Element, ElementKind, Error, KvLayout, PagedKvAppendArgsLayout, PagedKvAppendDescriptor,
    PagedKvAppendPlan, PagedKvCacheDescriptor, PlanPreference, Result, TensorLayout, ptx,
};
use proptest::prelude::*;
use proptest::sample::select;

use problem::{HostProblem, ProblemCache, ProblemSpec, RANDOM_BLOCK, Rng, random_vec_on, rel_l2, tolerances};

fn config() -> ProptestConfig {
    ProptestConfig { cases: 512, failure_persistence: None, ..ProptestConfig::default() }
}

fn element() -> BoxedStrategy<ElementKind> {
    select(ElementKind::ALL.to_vec()).boxed()
}

const BOUNDARY: [i32; 12] =
    [i32::MIN, i32::MIN + 1, -1, 0, 1, 1023, 1024, 65535, 65536, 1 << 20, i32::MAX - 1, i32::MAX];

/// Any i32, weighted towards small, supported and boundary values.
fn extent() -> BoxedStrategy<i32> {
    prop_oneof![
        4 => -3..=70i32,
        2 => select(vec![64, 128, 256]),
        1 => any::<i32>(),
        1 => Just(i32::MAX),
        2 => select(BOUNDARY.to_vec()),
    ]
    .boxed()
}

fn sm_scale() -> BoxedStrategy<f32> {
    prop_oneof![
        4 => -4.0f32..4.0,
        1 => any::<f32>(),
        2 => select(vec![
            f32::NAN,
            -f32::NAN,
            f32::INFINITY,
            f32::NEG_INFINITY,
            0.0,
            -0.0,
            f32::MAX,
            f32::MIN_POSITIVE
        ]),
    ]
    .boxed()
}

fn kv_desc() -> BoxedStrategy<PagedKvCacheDescriptor> {
    (extent(), extent(), extent(), extent(), element())
        .prop_map(|(page_size, num_total_pages, num_kv_heads, head_dim, element)| PagedKvCacheDescriptor {
            page_size,
            num_total_pages,
            num_kv_heads,
            head_dim,
            element,
        })
        .boxed()
}

/// Fully random descriptors, and descriptors that are mostly valid (integer groups, supported
/// head_dim) so the checks past the first ones are reached too.
fn decode_desc() -> BoxedStrategy<BatchPagedDecodeDescriptor> {
    let random = (extent(), extent(), sm_scale(), kv_desc()).prop_map(
        |(batch_size, num_qo_heads, sm_scale, paged_kv)| BatchPagedDecodeDescriptor {
            batch_size,
            num_qo_heads,
            sm_scale,
            paged_kv,
        },
    );
    let plausible = (
        prop_oneof![3 => 1..=300i32, 1 => Just(i32::MAX), 2 => extent()],
        prop_oneof![1..=70i32, extent()],
        prop_oneof![1..=70i32, 1..=70000i32, extent()],
        select(vec![64, 128, 256]),
        (prop_oneof![1..=1024i32, extent()], prop_oneof![1..=100000i32, extent()]),
        element(),
        sm_scale(),
    )
        .prop_map(
            |(batch_size, group, num_kv_heads, head_dim, (page_size, num_total_pages), element, sm_scale)| {
                BatchPagedDecodeDescriptor {
                    batch_size,
                    num_qo_heads: group.saturating_mul(num_kv_heads),
                    sm_scale,
                    paged_kv: PagedKvCacheDescriptor {
                        page_size,
                        num_total_pages,
                        num_kv_heads,
                        head_dim,
                        element,
                    },
                }
            },
        );
    prop_oneof![random, plausible].boxed()
}

fn append_desc() -> BoxedStrategy<PagedKvAppendDescriptor> {
    decode_desc()
        .prop_map(|d| PagedKvAppendDescriptor { batch_size: d.batch_size, paged_kv: d.paged_kv })
        .boxed()
}

fn device_props() -> BoxedStrategy<DeviceProps> {
    let h200 = DeviceProps {
        sm_count: 132,
        compute_capability: (9, 0),
        smem_per_sm: 233472,
        smem_per_block_optin: 232448,
    };
    let random = (any::<u32>(), (any::<u32>(), any::<u32>()), any::<u32>(), any::<u32>()).prop_map(
        |(sm_count, compute_capability, smem_per_sm, smem_per_block_optin)| DeviceProps {
            sm_count,
            compute_capability,
            smem_per_sm,
            smem_per_block_optin,
        },
    );
    let plausible = (0..=200u32, 0..=300_000u32, 0..=300_000u32).prop_map(|(sm_count, sm, block)| {
        DeviceProps { sm_count, compute_capability: (8, 0), smem_per_sm: sm, smem_per_block_optin: block }
    });
    prop_oneof![Just(h200), random, plausible].boxed()
}

fn workspace_limit() -> BoxedStrategy<usize> {
    prop_oneof![Just(usize::MAX), Just(0usize), any::<usize>(), 0..=1usize << 24].boxed()
}

/// Row-major layout of `shape` over exactly enough storage (saturating, so any shape works).
fn contiguous<const N: usize>(shape: [i32; N]) -> TensorLayout<N> {
    let mut stride = [0i64; N];
    let mut acc = 1i64;
    for i in (0..N).rev() {
        stride[i] = acc;
        acc = acc.saturating_mul(shape[i].max(0) as i64);
    }
    let storage_len = shape.iter().fold(1usize, |acc, &d| acc.saturating_mul(d.max(0) as usize));
    TensorLayout { shape, stride, storage_len }
}

fn decode_contiguous(desc: &BatchPagedDecodeDescriptor, n: i32) -> BatchPagedDecodeArgsLayout {
    let kv = &desc.paged_kv;
    let (b, hq, d) = (desc.batch_size, desc.num_qo_heads, kv.head_dim);
    let store = [kv.num_total_pages, kv.num_kv_heads, kv.page_size, d];
    BatchPagedDecodeArgsLayout {
        q: contiguous([b, hq, d]),
        k_data: contiguous(store),
        v_data: contiguous(store),
        indices: contiguous([n]),
        indptr: contiguous([b.saturating_add(1)]),
        last_page_len: contiguous([b]),
        o: contiguous([b, hq, d]),
        lse: contiguous([b, hq]),
    }
}

fn append_contiguous(desc: &PagedKvAppendDescriptor, n: i32) -> PagedKvAppendArgsLayout {
    let kv = &desc.paged_kv;
    let b = desc.batch_size;
    let store = [kv.num_total_pages, kv.num_kv_heads, kv.page_size, kv.head_dim];
    PagedKvAppendArgsLayout {
        key: contiguous([b, kv.num_kv_heads, kv.head_dim]),
        value: contiguous([b, kv.num_kv_heads, kv.head_dim]),
        k_data: contiguous(store),
        v_data: contiguous(store),
        indices: contiguous([n]),
        indptr: contiguous([b.saturating_add(1)]),
        last_page_len: contiguous([b]),
    }
}

/// A random layout: contiguous over a random shape, or random shape, strides and storage.
fn layout<const N: usize>() -> BoxedStrategy<TensorLayout<N>> {
    let stride = prop_oneof![-2..=300i64, any::<i64>(), Just(0i64), Just(i64::MAX), Just(i64::MIN)];
    let storage = prop_oneof![0..=5000usize, any::<usize>(), Just(usize::MAX)];
    let random = (prop::array::uniform::<_, N>(extent()), prop::array::uniform::<_, N>(stride), storage)
        .prop_map(|(shape, stride, storage_len)| TensorLayout { shape, stride, storage_len });
    prop_oneof![prop::array::uniform::<_, N>(extent()).prop_map(contiguous), random].boxed()
}

/// Which tensors to replace: none, one, or any subset.
fn mask() -> BoxedStrategy<u8> {
    prop_oneof![1 => Just(0u8), 2 => (0..8u32).prop_map(|i| 1u8 << i), 2 => any::<u8>()].boxed()
}

/// Contiguous layouts for the descriptor with the tensors selected by `mask` replaced by random ones.
fn decode_layout(desc: BatchPagedDecodeDescriptor) -> BoxedStrategy<BatchPagedDecodeArgsLayout> {
    (
        extent(),
        mask(),
        (layout::<3>(), layout::<4>(), layout::<4>(), layout::<1>()),
        (layout::<1>(), layout::<1>(), layout::<3>(), layout::<2>()),
    )
        .prop_map(move |(n, mask, (q, k, v, indices), (indptr, last, o, lse))| {
            let mut a = decode_contiguous(&desc, n);
            let pick = |i: u32| mask & (1 << i) != 0;
            if pick(0) {
                a.q = q;
            }
            if pick(1) {
                a.k_data = k;
            }
            if pick(2) {
                a.v_data = v;
            }
            if pick(3) {
                a.indices = indices;
            }
            if pick(4) {
                a.indptr = indptr;
            }
            if pick(5) {
                a.last_page_len = last;
            }
            if pick(6) {
                a.o = o;
            }
            if pick(7) {
                a.lse = lse;
            }
            a
        })
        .boxed()
}

fn append_layout(desc: PagedKvAppendDescriptor) -> BoxedStrategy<PagedKvAppendArgsLayout> {
    (
        extent(),
        mask(),
        (layout::<3>(), layout::<3>(), layout::<4>(), layout::<4>()),
        (layout::<1>(), layout::<1>(), layout::<1>()),
    )
        .prop_map(move |(n, mask, (key, value, k, v), (indices, indptr, last))| {
            let mut a = append_contiguous(&desc, n);
            let pick = |i: u32| mask & (1 << i) != 0;
            if pick(0) {
                a.key = key;
            }
            if pick(1) {
                a.value = value;
            }
            if pick(2) {
                a.k_data = k;
            }
            if pick(3) {
                a.v_data = v;
            }
            if pick(4) {
                a.indices = indices;
            }
            if pick(5) {
                a.indptr = indptr;
            }
            if pick(6) {
                a.last_page_len = last;
            }
            a
        })
        .boxed()
}

fn decode_args() -> BoxedStrategy<(BatchPagedDecodeDescriptor, BatchPagedDecodeArgsLayout)> {
    decode_desc().prop_flat_map(|d| (Just(d), decode_layout(d))).boxed()
}

fn append_args() -> BoxedStrategy<(PagedKvAppendDescriptor, PagedKvAppendArgsLayout)> {
    append_desc().prop_flat_map(|d| (Just(d), append_layout(d))).boxed()
}

fn is_typed_rejection<X>(r: &Result<X>) -> bool {
    matches!(r, Ok(_) | Err(Error::InvalidProblem(_) | Error::Unsupported(_)))
}

/// Descriptor check for every element type; `choose` and the contiguous layout for the ones it
/// accepts.
fn decode_descriptor_case<T: Element, C: CacheElement>(
    desc: &BatchPagedDecodeDescriptor,
    props: &DeviceProps,
    max_ws: usize,
) -> std::result::Result<(), TestCaseError> {
    let r = BatchPagedDecodePlan::<T, C>::check_descriptor(desc);
    prop_assert!(is_typed_rejection(&r), "{r:?}");
    if r.is_err() {
        return Ok(());
    }
    prop_assert_eq!(desc.paged_kv.element, C::CACHE_KIND);
    let cfg = DecodeConfig::choose(desc, props, max_ws);
    match cfg {
        Ok(cfg) => {
            prop_assert!((1..=MAX_SPLITS).contains(&cfg.num_splits), "{cfg:?}");
            let ws = cfg.workspace_size(desc);
            prop_assert!(ws <= max_ws, "workspace {ws} > limit {max_ws}: {cfg:?}");
            prop_assert!(cfg.is_split() || ws == 0);
            // The tuning overrides: a typed refusal or a consistent configuration.
            for n in [0, 1, 7, 65535, u32::MAX] {
                match cfg.with_spare_chunks(desc, n) {
                    Ok(c) => {
                        prop_assert_eq!(c.is_split(), c.num_splits > 1 || n > 0);
                        prop_assert_eq!(c.balance_chunks > 0, n > 0);
                        prop_assert!(!c.is_split() || c.workspace_size(desc) > 0);
                    }
                    Err(Error::Unsupported(_)) => {}
                    Err(e) => return Err(TestCaseError::fail(format!("with_spare_chunks({n}): {e:?}"))),
                }
            }
            for s in [0, 1, 2, MAX_SPLITS, MAX_SPLITS + 1] {
                let r = cfg.with_num_splits(desc, s);
                prop_assert!(matches!(r, Ok(_) | Err(Error::Unsupported(_))), "{r:?}");
            }
        }
        Err(Error::Unsupported(_)) => {}
        Err(e) => return Err(TestCaseError::fail(format!("choose: {e:?}"))),
    }
    for n in [0, 1, 1000] {
        let r = BatchPagedDecodePlan::<T, C>::check_layout(
            desc,
            &BatchPagedDecodeArgsLayout::contiguous(desc, n),
        );
        prop_assert!(r.is_ok(), "contiguous layout rejected: {r:?}");
    }
    Ok(())
}

fn append_descriptor_case<T: CacheElement, C: CacheElement>(
    desc: &PagedKvAppendDescriptor,
) -> std::result::Result<(), TestCaseError> {
    let r = PagedKvAppendPlan::<T, C>::check_descriptor(desc);
    prop_assert!(is_typed_rejection(&r), "{r:?}");
    if r.is_ok() {
        prop_assert_eq!(desc.paged_kv.element, C::CACHE_KIND);
        for n in [0, 1, 1000] {
            let r =
                PagedKvAppendPlan::<T, C>::check_layout(desc, &PagedKvAppendArgsLayout::contiguous(desc, n));
            prop_assert!(r.is_ok(), "contiguous layout rejected: {r:?}");
        }
    }
    Ok(())
}

/// Small decode geometry as (batch, Hq, Hkv, d, page_size, pages), with some non-positive values.
fn small_geometry() -> BoxedStrategy<(i32, i32, i32, i32, i32, i32)> {
    let small = |lo: i32, hi: i32| prop_oneof![16 => lo..=hi, 1 => select(vec![i32::MIN, -1, 0])];
    (small(0, 3), small(0, 3), small(1, 3), small(1, 4), small(1, 4), small(0, 5))
        .prop_map(|(b, group, hkv, d, ps, pages)| (b, group.saturating_mul(hkv), hkv, d, ps, pages))
        .boxed()
}

fn value() -> BoxedStrategy<f32> {
    prop_oneof![8 => -2.0f32..2.0, 1 => any::<f32>()].boxed()
}

fn small_ints(max_len: usize) -> BoxedStrategy<Vec<i32>> {
    prop::collection::vec(prop_oneof![8 => -1..=6i32, 1 => select(vec![i32::MIN, i32::MAX])], 0..=max_len)
        .boxed()
}

/// Element count `dims` asks for, or a random small count.
fn len_for(dims: &[i32], exact: bool, other: usize) -> usize {
    if exact { dims.iter().map(|&d| d.max(0) as usize).product::<usize>().min(4096) } else { other }
}

/// A page table for `batch` requests over `pages` pages of `page_size`: usually well formed
/// (cumulative `indptr`, ids and lengths mostly in range), sometimes random.
fn page_table(batch: usize, pages: i32, page_size: i32) -> BoxedStrategy<(Vec<i32>, Vec<i32>, Vec<i32>)> {
    let id = prop_oneof![8 => 0..pages.max(1), 1 => -1..=pages.max(0).saturating_add(1)];
    let last = prop_oneof![8 => 0..=page_size.max(0), 1 => -1..=page_size.max(0).saturating_add(1)];
    let formed = (
        prop::collection::vec(0..=3i32, batch),
        prop::collection::vec(id, 0..=12),
        prop::collection::vec(last, batch),
    )
        .prop_map(|(counts, mut indices, last)| {
            let mut indptr = vec![0];
            for c in counts {
                indptr.push(indptr.last().unwrap() + c);
            }
            let used = *indptr.last().unwrap() as usize;
            while indices.len() < used {
                indices.push(indices.len() as i32 % 4);
            }
            (indptr, indices, last)
        });
    prop_oneof![4 => formed, 1 => (small_ints(6), small_ints(12), small_ints(5))].boxed()
}

#[derive(Debug, Clone)]
struct RefCase {
    desc: BatchPagedDecodeDescriptor,
    q: Vec<f32>,
    k: Vec<f32>,
    v: Vec<f32>,
    table: (Vec<i32>, Vec<i32>, Vec<i32>),
}

fn ref_case() -> BoxedStrategy<RefCase> {
    (
        small_geometry(),
        select(vec![ElementKind::F32, ElementKind::F32, ElementKind::F16, ElementKind::I32]),
        sm_scale(),
    )
        .prop_flat_map(|((b, hq, hkv, d, ps, pages), element, sm_scale)| {
            let desc = BatchPagedDecodeDescriptor {
                batch_size: b,
                num_qo_heads: hq,
                sm_scale,
                paged_kv: PagedKvCacheDescriptor {
                    page_size: ps,
                    num_total_pages: pages,
                    num_kv_heads: hkv,
                    head_dim: d,
                    element,
                },
            };
            let exact = prop::bool::weighted(0.9);
            (
                Just(desc),
                (exact, 0..40usize)
                    .prop_flat_map(move |(e, n)| prop::collection::vec(value(), len_for(&[b, hq, d], e, n))),
                (exact, 0..40usize).prop_flat_map(move |(e, n)| {
                    prop::collection::vec(value(), len_for(&[pages, hkv, ps, d], e, n))
                }),
                (exact, 0..40usize).prop_flat_map(move |(e, n)| {
                    prop::collection::vec(value(), len_for(&[pages, hkv, ps, d], e, n))
                }),
                page_table(b.max(0) as usize, pages, ps),
            )
        })
        .prop_map(|(desc, q, k, v, table)| RefCase { desc, q, k, v, table })
        .boxed()
}

fn convert<T: Element>(x: &[f32]) -> Vec<T> {
    x.iter().map(|&v| T::from_f64(v as f64)).collect()
}

fn reference_decode<T: Element>(c: &RefCase) -> std::result::Result<(), TestCaseError> {
    let mut desc = c.desc;
    if desc.paged_kv.element == ElementKind::F32 {
        desc.paged_kv.element = T::KIND;
    }
    let (indptr, indices, last_page_len) = &c.table;
    let table = PageTable { indptr, indices, last_page_len };
    let r = reference::decode::<T>(&desc, &convert(&c.q), &convert(&c.k), &convert(&c.v), table);
    match &r {
        Ok(out) => {
            let b = desc.batch_size as usize;
            let rows = b * desc.num_qo_heads as usize;
            prop_assert_eq!(out.lse.len(), rows);
            prop_assert_eq!(out.o.len(), rows * desc.paged_kv.head_dim as usize);
        }
        Err(Error::InvalidProblem(_) | Error::InvalidPageTable(_)) => {}
        Err(e) => return Err(TestCaseError::fail(format!("{e:?}"))),
    }
    Ok(())
}

fn reference_append<T: Element>(c: &RefCase) -> std::result::Result<(), TestCaseError> {
    let mut kv = c.desc.paged_kv;
    if kv.element == ElementKind::F32 {
        kv.element = T::KIND;
    }
    let desc = PagedKvAppendDescriptor { batch_size: c.desc.batch_size, paged_kv: kv };
    let (indptr, indices, last_page_len) = &c.table;
    let table = PageTable { indptr, indices, last_page_len };
    // Key and value rows are [batch, Hkv, d]; reuse q's data, truncated or as is.
    let rows = len_for(&[c.desc.batch_size, kv.num_kv_heads, kv.head_dim], true, 0);
    let key: Vec<T> = convert(&c.q[..rows.min(c.q.len())]);
    let (mut k, mut v) = (convert::<T>(&c.k), convert::<T>(&c.v));
    let (k0, v0) = (k.clone(), v.clone());
    let r = reference::append::<T>(&desc, &key, &key, &mut k, &mut v, table);
    match &r {
        Ok(()) => {}
        Err(Error::InvalidProblem(_) | Error::InvalidPageTable(_)) => {
            let same =
                |a: &[T], b: &[T]| a.iter().zip(b).all(|(x, y)| x.to_f64().to_bits() == y.to_f64().to_bits());
            prop_assert!(same(&k, &k0) && same(&v, &v0), "store modified on error");
        }
        Err(e) => return Err(TestCaseError::fail(format!("{e:?}"))),
    }
    Ok(())
}

/// The FP8 reference entry points on the same cases: the store as raw codes (the f32 values'
/// low bytes), the descriptor's element made E4M3 / E5M2 where the case has f32, any scales.
fn reference_fp8(
    c: &RefCase,
    element: ElementKind,
    scales: KvScales,
) -> std::result::Result<(), TestCaseError> {
    let mut desc = c.desc;
    if desc.paged_kv.element == ElementKind::F32 {
        desc.paged_kv.element = element;
    }
    let (indptr, indices, last_page_len) = &c.table;
    let table = PageTable { indptr, indices, last_page_len };
    let codes = |x: &[f32]| -> Vec<u8> { x.iter().map(|v| v.to_bits() as u8).collect() };
    let q: Vec<f16> = convert(&c.q);
    let (mut k, mut v) = (codes(&c.k), codes(&c.v));
    let typed = |r: &paged_decode::Result<()>| {
        matches!(r, Ok(()) | Err(Error::InvalidProblem(_) | Error::InvalidPageTable(_)))
    };
    let r = reference::decode_fp8(&desc, &q, &k, &v, scales, table).map(|_| ());
    prop_assert!(typed(&r), "{r:?}");
    let append_desc = PagedKvAppendDescriptor { batch_size: desc.batch_size, paged_kv: desc.paged_kv };
    let rows = len_for(&[desc.batch_size, desc.paged_kv.num_kv_heads, desc.paged_kv.head_dim], true, 0);
    let key = &q[..rows.min(q.len())];
    let (k0, v0) = (k.clone(), v.clone());
    let r = reference::append_fp8(&append_desc, key, key, &mut k, &mut v, scales, table);
    prop_assert!(typed(&r), "{r:?}");
    prop_assert!(r.is_ok() || (k == k0 && v == v0), "store modified on error");
    Ok(())
}

/// Any launch configuration, including ones no rule produces (the fields are public).
fn decode_config() -> BoxedStrategy<DecodeConfig> {
    let n = || prop_oneof![0..=70u32, any::<u32>(), Just(u32::MAX)];
    ((any::<bool>(), n(), n(), n(), n(), n()), (n(), any::<bool>(), n(), n(), n()))
        .prop_map(
            |(
                (mma, head_blocks, q_tiles, smem_bytes, num_splits, spare_chunks),
                (balance_chunks, heads_along_x, min_chunk, preferred_chunk, wave_ctas),
            )| DecodeConfig {
                kernel: if mma { DecodeKernel::Mma } else { DecodeKernel::Simt },
                head_blocks,
                q_tiles,
                smem_bytes,
                num_splits,
                spare_chunks,
                balance_chunks,
                heads_along_x,
                min_chunk,
                preferred_chunk,
                wave_ctas,
                // Any lean launch too (the rule only makes ones the device holds).
                lean: (mma && num_splits % 2 == 0).then_some(LeanLaunch {
                    head_blocks,
                    smem_bytes,
                    wave_ctas,
                    tile_tokens: min_chunk,
                    sm_count: q_tiles,
                }),
                // Any lean partition and window too.
                lean_spare_chunks: smem_bytes ^ wave_ctas,
                window_left: (min_chunk % 3 == 0).then_some(preferred_chunk),
            },
        )
        .boxed()
}

fn decode_config_case(cfg: DecodeConfig, desc: &BatchPagedDecodeDescriptor, num_indices: usize) {
    let _ = cfg.num_chunks(desc);
    let _ = cfg.launched_chunks(desc, num_indices);
    let tokens = cfg.attended_tokens(desc, num_indices);
    if let Some(lean) = cfg.lean {
        for max_heads in [0, 1, 4, 16, u32::MAX] {
            for tokens in [0, 1, tokens, u64::MAX] {
                let shift = lean.stack_shift(desc, tokens, max_heads);
                assert!(1u32 << shift <= max_heads.max(1) && shift <= 4, "{shift}");
                for heads in [0, 1, 16, u32::MAX] {
                    let _ = lean.stacking_cost(tokens, tokens, heads);
                }
            }
        }
    }
    for lean_bound in [None, Some(0), Some(256), Some(u32::MAX)] {
        let path = cfg.path(desc, num_indices, lean_bound);
        let partition = cfg.partition(desc, path);
        let _ = partition.launched_chunks(desc.batch_size.max(0) as u32, tokens);
        // A bound on the longest request changes at most a split or scheduled path, to whole.
        for max_kv_len in [None, Some(0), Some(1), Some(128), Some(u32::MAX)] {
            let within = cfg.path_within(desc, num_indices, lean_bound, max_kv_len);
            assert!(
                within == path
                    || (within == DecodePath::Whole
                        && matches!(path, DecodePath::Split | DecodePath::Scheduled)),
                "{path:?} under {max_kv_len:?}: {within:?}"
            );
        }
    }
    for n in [0, 1, 7, u32::MAX] {
        let r = cfg.with_lean_spare_chunks(desc, n);
        assert!(matches!(r, Ok(_) | Err(Error::Unsupported(_))), "{r:?}");
    }
    let _ = cfg.unsplit_max_tokens();
    let ws = cfg.workspace_size(desc);
    assert!(cfg.is_split() || ws == 0);
    for n in [0, 1, 7, u32::MAX] {
        let r = cfg.with_spare_chunks(desc, n);
        assert!(matches!(r, Ok(_) | Err(Error::Unsupported(_))), "{r:?}");
        let r = cfg.with_num_splits(desc, n);
        assert!(matches!(r, Ok(_) | Err(Error::Unsupported(_))), "{r:?}");
    }
}

/// Sizes for [`HostProblem::random`]: small and valid, or with a degenerate extent.
fn problem_spec() -> BoxedStrategy<ProblemSpec> {
    let small = |hi: usize| prop_oneof![8 => 1..=hi, 1 => Just(0usize), 1 => Just(usize::MAX), 1 => Just(1usize << 31)];
    (
        prop::collection::vec(prop_oneof![8 => 0..=40usize, 1 => Just(usize::MAX)], 0..=4),
        (small(4), small(2), small(16), small(8)),
        (prop_oneof![0..=3usize, Just(usize::MAX)], prop_oneof![0..=3usize, Just(usize::MAX)], any::<u64>()),
    )
        .prop_map(|(lens, (hq, hkv, d, page), (spare_pages, indices_slack, seed))| ProblemSpec {
            lens,
            spare_pages,
            indices_slack,
            seed,
            poison_unused_slots: seed % 2 == 0,
            ..ProblemSpec::uniform(0, 0, hq, hkv, d, page)
        })
        .boxed()
}

fn host_problem_case<T: Element + ProblemCache>(
    spec: &ProblemSpec,
) -> std::result::Result<(), TestCaseError> {
    let _ = spec.kv_bytes(T::KIND);
    match HostProblem::<T>::random(spec) {
        Ok(h) => {
            for b in [0, 1, spec.batch(), usize::MAX] {
                let r = h.reference_request(b);
                prop_assert!(matches!(r, Ok(_) | Err(Error::InvalidProblem(_))), "{r:?}");
                prop_assert_eq!(
                    r.is_ok(),
                    b < spec.batch() && spec.num_qo_heads.is_multiple_of(spec.num_kv_heads)
                );
            }
            let r = h.reference();
            prop_assert!(matches!(r, Ok(_) | Err(Error::InvalidProblem(_))), "{r:?}");
            let r = validate_page_table(
                &h.desc.paged_kv,
                spec.batch(),
                h.page_table(),
                PageTableRules::default(),
            );
            prop_assert!(r.is_ok(), "random problems have valid page tables: {r:?}");
        }
        Err(Error::InvalidProblem(_)) => {}
        Err(e) => return Err(TestCaseError::fail(format!("{e:?}"))),
    }
    Ok(())
}

proptest! {
    #![proptest_config(config())]

    /// `choose` is public: any descriptor, also one `select` rejects, gets a configuration or a
    /// typed error.
    #[test]
    fn choose_never_panics(
        desc in decode_desc(),
        props in device_props(),
        max_ws in workspace_limit(),
        resident in prop_oneof![0..=20u32, any::<u32>()],
    ) {
        let r = DecodeConfig::choose(&desc, &props, max_ws);
        prop_assert!(is_typed_rejection(&r), "{r:?}");
        let within = DecodeConfig::choose_resident(&desc, &props, max_ws, resident);
        prop_assert!(is_typed_rejection(&within), "{within:?}");
        prop_assert_eq!(within.is_ok(), r.is_ok());
        if let Ok(cfg) = &r {
            prop_assert!(cfg.ctas_per_sm(&props) <= 16);
        }
        if r.is_ok() {
            prop_assert!(BatchPagedDecodePlan::<f16>::check_descriptor(&desc).is_ok()
                || BatchPagedDecodePlan::<bf16>::check_descriptor(&desc).is_ok()
                || BatchPagedDecodePlan::<f32>::check_descriptor(&desc).is_ok()
                || BatchPagedDecodePlan::<f16, F8E4M3>::check_descriptor(&desc).is_ok()
                || BatchPagedDecodePlan::<f16, F8E5M2>::check_descriptor(&desc).is_ok());
        }
    }

    /// Every public method of a launch configuration, on any configuration and descriptor.
    #[test]
    fn decode_config_methods_never_panic(
        cfg in decode_config(),
        desc in decode_desc(),
        num_indices in prop_oneof![0..=5000usize, any::<usize>(), Just(usize::MAX)],
    ) {
        decode_config_case(cfg, &desc, num_indices);
    }

    #[test]
    fn append_table_validation_never_panics(
        kv in kv_desc(),
        batch in 0..6usize,
        (indptr, indices, last) in (small_ints(7), small_ints(10), small_ints(6)),
    ) {
        let table = PageTable { indptr: &indptr, indices: &indices, last_page_len: &last };
        let r = validate_append_table(&kv, batch, table);
        let typed = matches!(r, Ok(()) | Err(Error::InvalidPageTable(_) | Error::InvalidProblem(_)));
        prop_assert!(typed, "{r:?}");
        // The append contract is the decode contract (shared pages allowed) and more.
        if r.is_ok() {
            let shared = PageTableRules { allow_shared_pages: true };
            prop_assert!(validate_page_table(&kv, batch, table, shared).is_ok());
        }
        for b in [0, batch, usize::MAX] {
            let _ = table.request_len(b, kv.page_size.max(0) as usize);
        }
    }

    #[test]
    fn layouts_and_strides_never_panic(t3 in layout::<3>(), t4 in layout::<4>()) {
        let _ = (t3.numel(), t3.is_contiguous(), t4.numel(), t4.is_contiguous());
        let _ = (row_major_strides(t3.shape), row_major_strides(t4.shape));
    }

    #[test]
    fn ptx_helpers_never_panic(text in ".{0,200}", cc in (any::<u32>(), any::<u32>())) {
        let ptx_text = format!(".visible .entry {text}\n{text}\n.visible .entry ");
        let _ = ptx::entries(&ptx_text);
        let _ = ptx::entries(&text);
        let _ = (ptx::build_for(cc), ptx::supports_programmatic_launch(cc));
        prop_assert!(!ptx::for_compute_capability(cc).is_empty());
    }

    #[test]
    fn problem_generation_never_panics(spec in problem_spec()) {
        host_problem_case::<f16>(&spec)?;
        host_problem_case::<f32>(&spec)?;
    }

    #[test]
    fn rng_and_error_measures_never_panic(
        seed in any::<u64>(),
        n in any::<u64>(),
        out in prop::collection::vec(any::<f64>(), 0..6),
        reference in prop::collection::vec(any::<f64>(), 0..6),
        element in element(),
    ) {
        let mut rng = Rng::new(seed);
        prop_assert!(n == 0 || rng.below(n) < n);
        let x = rng.symmetric();
        prop_assert!((-1.0..1.0).contains(&x));
        let mut v: Vec<u8> = (0..(n % 20) as u8).collect();
        rng.shuffle(&mut v);
        let err = rel_l2(out.iter().copied(), &reference);
        prop_assert!(out.len() == reference.len() || err.is_nan());
        let _ = tolerances(element);
        let _ = element.size_bytes();
    }

    #[test]
    fn decode_descriptor_never_panics(
        desc in decode_desc(),
        props in device_props(),
        max_ws in workspace_limit(),
    ) {
        decode_descriptor_case::<f16, f16>(&desc, &props, max_ws)?;
        decode_descriptor_case::<bf16, bf16>(&desc, &props, max_ws)?;
        decode_descriptor_case::<f32, f32>(&desc, &props, max_ws)?;
        decode_descriptor_case::<f16, F8E4M3>(&desc, &props, max_ws)?;
        decode_descriptor_case::<bf16, F8E5M2>(&desc, &props, max_ws)?;
        decode_descriptor_case::<f32, F8E4M3>(&desc, &props, max_ws)?;
    }

    #[test]
    fn attention_variants_never_panic(
        desc in decode_desc(),
        cap in prop::option::of(prop_oneof![any::<f32>(), 0.0f32..200.0]),
        window_left in prop::option::of(prop_oneof![any::<u32>(), 0u32..5000]),
    ) {
        let variant = AttentionVariantDescriptor { logits_soft_cap: cap, window_left };
        let r = BatchPagedDecodePlan::<f16>::check_variant(&desc, &variant);
        prop_assert!(is_typed_rejection(&r), "{r:?}");
        if r.is_ok() {
            prop_assert!(cap.is_none_or(|c| c.is_finite() && c > 0.0));
        }
        for layout in [KvLayout::Hnd, KvLayout::Nhd, KvLayout::Strided] {
            let _ = layout.strides(&desc.paged_kv);
            let _ = layout.interleaved_strides(&desc.paged_kv);
        }
    }

    #[test]
    fn append_descriptor_never_panics(desc in append_desc()) {
        append_descriptor_case::<f16, f16>(&desc)?;
        append_descriptor_case::<bf16, bf16>(&desc)?;
        append_descriptor_case::<f32, f32>(&desc)?;
        append_descriptor_case::<f16, F8E4M3>(&desc)?;
        append_descriptor_case::<bf16, F8E5M2>(&desc)?;
        append_descriptor_case::<F8E4M3, F8E4M3>(&desc)?;
        append_descriptor_case::<f32, F8E5M2>(&desc)?;
    }

    #[test]
    fn decode_layout_never_panics((desc, args) in decode_args()) {
        // K/V views take any strides; some (K and V differing, rows beyond 64 GiB) are
        // unsupported rather than invalid.
        let r = BatchPagedDecodePlan::<f16>::check_layout(&desc, &args);
        prop_assert!(is_typed_rejection(&r), "{r:?}");
        if r.is_ok() {
            prop_assert!(args.q.storage_len >= args.q.numel());
            prop_assert!(args.k_data.stride[3] == 1 && args.k_data.stride == args.v_data.stride);
            prop_assert!(args.o.is_contiguous() && args.lse.is_contiguous());
            prop_assert!(args.indices.shape[0] >= 0);
        }
        let r = BatchPagedDecodePlan::<f32>::check_layout(&desc, &args);
        prop_assert!(is_typed_rejection(&r), "{r:?}");
    }

    #[test]
    fn append_layout_never_panics((desc, args) in append_args()) {
        let r = PagedKvAppendPlan::<bf16>::check_layout(&desc, &args);
        prop_assert!(is_typed_rejection(&r), "{r:?}");
        if r.is_ok() {
            prop_assert!(args.key.is_contiguous() && args.k_data.stride == args.v_data.stride);
        }
        // K and V in one allocation, V at any offset.
        for v_offset in [0, 1, 8, args.k_data.storage_len / 2, usize::MAX] {
            let r = PagedKvAppendPlan::<f32>::check_paired_layout(&desc, &args, v_offset);
            prop_assert!(is_typed_rejection(&r), "{r:?}");
        }
    }

    #[test]
    fn contiguous_layouts_never_panic(
        (s1, s2, s3, s4) in (
            prop::array::uniform::<_, 1>(extent()),
            prop::array::uniform::<_, 2>(extent()),
            prop::array::uniform::<_, 3>(extent()),
            prop::array::uniform::<_, 4>(extent()),
        ),
    ) {
        fn same<const N: usize>(shape: [i32; N]) -> std::result::Result<(), TestCaseError> {
            let t = TensorLayout::contiguous(shape);
            prop_assert_eq!(t, contiguous(shape));
            prop_assert_eq!(t.numel() <= t.storage_len, true);
            Ok(())
        }
        same(s1)?;
        same(s2)?;
        same(s3)?;
        same(s4)?;
    }

    #[test]
    fn args_layout_constructors_never_panic(desc in decode_desc(), n in extent()) {
        prop_assert_eq!(BatchPagedDecodeArgsLayout::contiguous(&desc, n), decode_contiguous(&desc, n));
        let append = PagedKvAppendDescriptor { batch_size: desc.batch_size, paged_kv: desc.paged_kv };
        prop_assert_eq!(PagedKvAppendArgsLayout::contiguous(&append, n), append_contiguous(&append, n));
    }

    #[test]
    fn page_table_validation_never_panics(
        kv in kv_desc(),
        batch in 0..6usize,
        (indptr, indices, last) in (small_ints(7), small_ints(10), small_ints(6)),
        shared in any::<bool>(),
    ) {
        let table = PageTable { indptr: &indptr, indices: &indices, last_page_len: &last };
        let r = validate_page_table(&kv, batch, table, PageTableRules { allow_shared_pages: shared });
        let typed = matches!(r, Ok(()) | Err(Error::InvalidPageTable(_) | Error::InvalidProblem(_)));
        prop_assert!(typed, "{r:?}");
    }

    #[test]
    fn reference_decode_never_panics(c in ref_case()) {
        reference_decode::<f32>(&c)?;
        reference_decode::<f16>(&c)?;
    }

    #[test]
    fn reference_append_never_panics(c in ref_case()) {
        reference_append::<f32>(&c)?;
        reference_append::<bf16>(&c)?;
    }

    #[test]
    fn reference_fp8_never_panics(
        c in ref_case(),
        e4m3 in any::<bool>(),
        k_scale in prop_oneof![Just(1.0f32), any::<f32>()],
        v_scale in prop_oneof![Just(0.5f32), any::<f32>()],
    ) {
        let element = if e4m3 { ElementKind::E4M3 } else { ElementKind::E5M2 };
        reference_fp8(&c, element, KvScales { k_scale, v_scale })?;
    }

    #[test]
    fn reference_variants_never_panic(
        c in ref_case(),
        cap in prop::option::of(any::<f32>()),
        window in prop::option::of(prop_oneof![0..70u32, any::<u32>()]),
        sinks in prop::option::of(prop::collection::vec(any::<f32>(), 0..70)),
    ) {
        let mut desc = c.desc;
        desc.paged_kv.element = ElementKind::F32;
        let (indptr, indices, last_page_len) = &c.table;
        let table = PageTable { indptr, indices, last_page_len };
        let variant = AttentionVariant { logits_soft_cap: cap, window_left: window, sinks: sinks.as_deref() };
        let r = reference::decode_variant::<f32>(&desc, variant, &c.q, &c.k, &c.v, table).map(|_| ());
        let typed = matches!(r, Ok(()) | Err(Error::InvalidProblem(_) | Error::InvalidPageTable(_)));
        prop_assert!(typed, "{r:?}");
    }

    #[test]
    fn reference_strided_never_panics(
        c in ref_case(),
        strides in prop::collection::vec(prop_oneof![0..5000usize, any::<usize>()], 4),
    ) {
        let mut desc = c.desc;
        desc.paged_kv.element = ElementKind::F32;
        let (indptr, indices, last_page_len) = &c.table;
        let table = PageTable { indptr, indices, last_page_len };
        let view = |data| KvView { data, offset: strides[0], page_stride: strides[1], head_stride: strides[2], token_stride: strides[3] };
        let r = reference::decode_strided::<f32>(&desc, AttentionVariant::default(), &c.q, view(&c.k), view(&c.v), table).map(|_| ());
        let typed = matches!(r, Ok(()) | Err(Error::InvalidProblem(_) | Error::InvalidPageTable(_)));
        prop_assert!(typed, "{r:?}");
    }

    #[test]
    fn fp8_conversions_take_any_input(bits in any::<u32>(), code in any::<u8>()) {
        for format in [paged_decode::fp8::E4M3, paged_decode::fp8::E5M2] {
            let q = paged_decode::fp8::f32_to_fp8(format, f32::from_bits(bits));
            let back = paged_decode::fp8::fp8_to_f32(format, q);
            prop_assert!(back.is_nan() == f32::from_bits(bits).is_nan());
            let _ = paged_decode::fp8::fp8_to_f32(format, code);
        }
    }
}

/// The contiguous views of any descriptor, however large its extents, build without overflow.
#[test]
fn contiguous_reference_views_of_huge_descriptors() {
    let data = [0f32; 4];
    for extent in [0, 1, 1 << 20, i32::MAX] {
        let kv = PagedKvCacheDescriptor {
            page_size: extent,
            num_total_pages: extent,
            num_kv_heads: extent,
            head_dim: extent,
            element: ElementKind::F32,
        };
        for view in [KvView::hnd(&data, &kv), KvView::nhd(&data, &kv)] {
            assert!(view.page_stride >= view.head_stride.min(view.token_stride));
        }
    }
}

/// An empty batch puts no bound on `num_qo_heads` or `head_dim` through the slice lengths.
#[test]
fn reference_decode_empty_batch_with_huge_heads() {
    let desc = BatchPagedDecodeDescriptor {
        batch_size: 0,
        num_qo_heads: i32::MAX,
        sm_scale: 1.0,
        paged_kv: PagedKvCacheDescriptor {
            page_size: 16,
            num_total_pages: 0,
            num_kv_heads: 1,
            head_dim: i32::MAX,
            element: ElementKind::F32,
        },
    };
    let table = PageTable { indptr: &[0], indices: &[], last_page_len: &[] };
    let r = reference::decode::<f32>(&desc, &[], &[], &[], table);
    assert!(matches!(r, Ok(_) | Err(Error::InvalidProblem(_))), "{r:?}");
}

/// The descriptors of the report: zero KV heads or head_dim, and `i32::MIN / -1`.
#[test]
fn choose_rejects_degenerate_descriptors() {
    let h200 = DeviceProps {
        sm_count: 132,
        compute_capability: (9, 0),
        smem_per_sm: 233472,
        smem_per_block_optin: 232448,
    };
    let base = BatchPagedDecodeDescriptor {
        batch_size: 4,
        num_qo_heads: 32,
        sm_scale: 0.1,
        paged_kv: PagedKvCacheDescriptor {
            page_size: 16,
            num_total_pages: 64,
            num_kv_heads: 8,
            head_dim: 128,
            element: ElementKind::F16,
        },
    };
    let with_kv = |f: fn(&mut PagedKvCacheDescriptor)| {
        let mut d = base;
        f(&mut d.paged_kv);
        d
    };
    let cases = [
        with_kv(|kv| kv.num_kv_heads = 0),
        with_kv(|kv| kv.head_dim = 0),
        with_kv(|kv| kv.num_kv_heads = -1),
        BatchPagedDecodeDescriptor { num_qo_heads: i32::MIN, ..with_kv(|kv| kv.num_kv_heads = -1) },
        BatchPagedDecodeDescriptor { batch_size: 0, ..base },
        with_kv(|kv| kv.element = ElementKind::I32),
    ];
    for desc in cases {
        let r = DecodeConfig::choose(&desc, &h200, usize::MAX);
        assert!(matches!(r, Err(Error::InvalidProblem(_) | Error::Unsupported(_))), "{desc:?}: {r:?}");
    }
    assert!(DecodeConfig::choose(&base, &h200, usize::MAX).is_ok());
}

/// Every error prints (the messages format any values).
#[test]
fn errors_display() {
    let errors = [
        Error::Unsupported("x".into()),
        Error::InvalidProblem("x".into()),
        Error::MisalignedOperand { operand: "q", required: 16 },
        Error::WorkspaceTooSmall { needed: usize::MAX, got: 0 },
        Error::InvalidPageTable("x".into()),
        Error::WorkspaceInUse { bound: 64, requested: 128 },
        Error::WrongDevice { operand: "k_data", expected: 1, found: 0 },
        Error::UnorderedContext { operand: "o" },
        Error::UnorderedStream { operand: "q" },
        Error::CaptureWithTracking,
        Error::CheckedUnderCapture,
        Error::NoDevice,
    ];
    for e in errors {
        assert!(!e.to_string().is_empty());
    }
    assert!(!PlanPreference::default().checked);
}

#[test]
fn contiguous_layout_of_huge_shape() {
    let t = TensorLayout::contiguous([i32::MAX; 4]);
    assert_eq!(t.storage_len, usize::MAX);
    assert!(t.numel() <= t.storage_len);
}

/// The problems' random buffers are the same whichever number of threads fills them, differ
/// between streams and seeds, and stay in `[-1, 1)`.
#[test]
fn random_buffers_do_not_depend_on_the_thread_count() {
    let draw = |rng: &mut Rng| rng.symmetric();
    for len in [0, 1, RANDOM_BLOCK - 1, RANDOM_BLOCK, 3 * RANDOM_BLOCK + 17] {
        let one = random_vec_on(1, len, 7, 2, draw);
        assert_eq!(one.len(), len);
        assert!(one.iter().all(|x| (-1.0..1.0).contains(x)));
        for threads in [2, 3, 8] {
            assert_eq!(random_vec_on(threads, len, 7, 2, draw), one, "len {len}, {threads} threads");
        }
        if len > 0 {
            assert_ne!(random_vec_on(2, len, 7, 3, draw), one, "another stream");
            assert_ne!(random_vec_on(2, len, 8, 2, draw), one, "another seed");
        }
    }
    // Blocks are not copies of each other.
    let v = random_vec_on(2, 2 * RANDOM_BLOCK, 7, 2, draw);
    assert_ne!(v[..RANDOM_BLOCK], v[RANDOM_BLOCK..]);
}
