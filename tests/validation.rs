//! Host-side validation without a GPU: every descriptor and layout check, the launch-configuration
//! rules, and opening a device on a machine without a driver.

use half::{bf16, f16};
use paged_decode::device::{DeviceProps, driver_available};
use paged_decode::plan::{DecodeConfig, LEAN_MAX_AVG_TOKENS, MAX_SPLITS, Residency, STACK_MAX_TOKENS};
use paged_decode::{
    AttentionVariantDescriptor, BatchPagedDecodeArgsLayout, BatchPagedDecodeDescriptor, BatchPagedDecodePlan,
    DecodePath, Device, Element, ElementKind, Error, KvLayout, PagedKvAppendArgsLayout,
    PagedKvAppendDescriptor, PagedKvAppendPlan, PagedKvCacheDescriptor, Result, TensorLayout,
};

type F16Decode = BatchPagedDecodePlan<f16>;
type F16Append = PagedKvAppendPlan<f16>;

const H200: DeviceProps = DeviceProps {
    sm_count: 132,
    compute_capability: (9, 0),
    smem_per_sm: 233472,
    smem_per_block_optin: 232448,
};

fn kv(element: ElementKind, page_size: i32, pages: i32, hkv: i32, d: i32) -> PagedKvCacheDescriptor {
    PagedKvCacheDescriptor { page_size, num_total_pages: pages, num_kv_heads: hkv, head_dim: d, element }
}

fn decode_desc(element: ElementKind, b: i32, hq: i32, hkv: i32, d: i32) -> BatchPagedDecodeDescriptor {
    BatchPagedDecodeDescriptor {
        batch_size: b,
        num_qo_heads: hq,
        sm_scale: 1.0 / (d.max(1) as f32).sqrt(),
        paged_kv: kv(element, 16, 32, hkv, d),
    }
}

fn append_desc(element: ElementKind, b: i32, hkv: i32, d: i32) -> PagedKvAppendDescriptor {
    PagedKvAppendDescriptor { batch_size: b, paged_kv: kv(element, 16, 32, hkv, d) }
}

/// A small valid f16 decode problem (b 3, Hq 8, Hkv 2, d 64, 32 pages of 16) with 10 page ids.
fn decode_case() -> (BatchPagedDecodeDescriptor, BatchPagedDecodeArgsLayout) {
    let desc = decode_desc(ElementKind::F16, 3, 8, 2, 64);
    (desc, BatchPagedDecodeArgsLayout::contiguous(&desc, 10))
}

fn append_case() -> (PagedKvAppendDescriptor, PagedKvAppendArgsLayout) {
    let desc = append_desc(ElementKind::F16, 3, 2, 64);
    (desc, PagedKvAppendArgsLayout::contiguous(&desc, 10))
}

/// Asserts `r` is `InvalidProblem` and its message contains every one of `parts`.
#[track_caller]
fn expect_invalid(r: Result<()>, parts: &[&str]) {
    match r {
        Err(Error::InvalidProblem(msg)) => {
            for p in parts {
                assert!(msg.contains(p), "message {msg:?} does not mention {p:?}");
            }
        }
        other => panic!("expected InvalidProblem mentioning {parts:?}, got {other:?}"),
    }
}

#[track_caller]
fn expect_unsupported(r: Result<()>, parts: &[&str]) {
    match r {
        Err(Error::Unsupported(msg)) => {
            for p in parts {
                assert!(msg.contains(p), "message {msg:?} does not mention {p:?}");
            }
        }
        other => panic!("expected Unsupported mentioning {parts:?}, got {other:?}"),
    }
}

/// A layout of the same shape whose storage is one element short.
fn short<const N: usize>(t: TensorLayout<N>) -> TensorLayout<N> {
    TensorLayout { storage_len: t.numel() - 1, ..t }
}

/// The same shape with its first two axes' strides swapped (a transposed view).
fn permuted<const N: usize>(t: TensorLayout<N>) -> TensorLayout<N> {
    let mut stride = t.stride;
    stride.swap(0, 1);
    TensorLayout { stride, ..t }
}

/// The same shape broadcast along its first axis (stride 0).
fn broadcast<const N: usize>(t: TensorLayout<N>) -> TensorLayout<N> {
    let mut stride = t.stride;
    stride[0] = 0;
    TensorLayout { stride, ..t }
}

fn with_shape<const N: usize>(shape: [i32; N]) -> TensorLayout<N> {
    TensorLayout::contiguous(shape)
}

// ---- decode descriptor ----

#[test]
fn valid_descriptors_pass() {
    fn all<T: Element>() {
        for d in [64, 128, 256] {
            let desc = decode_desc(T::KIND, 4, 32, 8, d);
            BatchPagedDecodePlan::<T>::check_descriptor(&desc).unwrap();
            BatchPagedDecodePlan::<T>::check_layout(&desc, &BatchPagedDecodeArgsLayout::contiguous(&desc, 7))
                .unwrap();
            let desc = append_desc(T::KIND, 4, 8, d);
            PagedKvAppendPlan::<T>::check_descriptor(&desc).unwrap();
            PagedKvAppendPlan::<T>::check_layout(&desc, &PagedKvAppendArgsLayout::contiguous(&desc, 7))
                .unwrap();
        }
    }
    all::<f16>();
    all::<bf16>();
    all::<f32>();
}

#[test]
fn every_integer_group_size_is_accepted() {
    fn all<T: Element>() {
        for d in [64, 128, 256] {
            for hkv in [1, 2, 8] {
                for group in 1..=64 {
                    let desc = decode_desc(T::KIND, 2, group * hkv, hkv, d);
                    BatchPagedDecodePlan::<T>::check_descriptor(&desc)
                        .unwrap_or_else(|e| panic!("group {group}, Hkv {hkv}, d {d}: {e}"));
                    let cfg = DecodeConfig::choose(&desc, &H200, usize::MAX)
                        .unwrap_or_else(|e| panic!("group {group}, Hkv {hkv}, d {d}: {e}"));
                    assert!((1..=MAX_SPLITS).contains(&cfg.num_splits));
                }
            }
        }
    }
    all::<f16>();
    all::<bf16>();
    all::<f32>();
}

#[test]
fn large_batches_are_accepted() {
    for b in [1, 1023, 1024, 1025, 4096, 65535, 65536, 1 << 20] {
        let desc = decode_desc(ElementKind::F16, b, 32, 8, 128);
        F16Decode::check_descriptor(&desc).unwrap_or_else(|e| panic!("batch {b}: {e}"));
        F16Decode::check_layout(&desc, &BatchPagedDecodeArgsLayout::contiguous(&desc, b)).unwrap();
        DecodeConfig::choose(&desc, &H200, usize::MAX).unwrap();
        let desc = append_desc(ElementKind::F16, b, 8, 128);
        F16Append::check_descriptor(&desc).unwrap_or_else(|e| panic!("batch {b}: {e}"));
        F16Append::check_layout(&desc, &PagedKvAppendArgsLayout::contiguous(&desc, b)).unwrap();
    }
}

#[test]
fn unsupported_head_dims() {
    for d in [1, 32, 80, 96, 160, 192, 255, 257, 512, 1024] {
        let name = format!("head_dim {d}");
        expect_unsupported(F16Decode::check_descriptor(&decode_desc(ElementKind::F16, 2, 8, 2, d)), &[&name]);
        expect_unsupported(
            BatchPagedDecodePlan::<f32>::check_descriptor(&decode_desc(ElementKind::F32, 2, 8, 2, d)),
            &[&name],
        );
        expect_unsupported(F16Append::check_descriptor(&append_desc(ElementKind::F16, 2, 2, d)), &[&name]);
    }
}

#[test]
fn non_float_elements_are_rejected() {
    for element in [ElementKind::I32, ElementKind::U8] {
        let name = format!("{element:?}");
        for r in [
            F16Decode::check_descriptor(&decode_desc(element, 2, 8, 2, 64)),
            BatchPagedDecodePlan::<f32>::check_descriptor(&decode_desc(element, 2, 8, 2, 64)),
            F16Append::check_descriptor(&append_desc(element, 2, 2, 64)),
        ] {
            match r {
                Err(Error::Unsupported(msg) | Error::InvalidProblem(msg)) => {
                    assert!(msg.contains(&name), "message {msg:?} does not mention {name}")
                }
                other => panic!("expected a rejection of {element:?}, got {other:?}"),
            }
        }
    }
}

#[test]
fn element_must_match_plan_type() {
    for element in [ElementKind::F16, ElementKind::F32] {
        let name = format!("{element:?}");
        let parts = [name.as_str(), "BF16", "does not match"];
        expect_invalid(
            BatchPagedDecodePlan::<bf16>::check_descriptor(&decode_desc(element, 2, 8, 2, 64)),
            &parts,
        );
        expect_invalid(PagedKvAppendPlan::<bf16>::check_descriptor(&append_desc(element, 2, 2, 64)), &parts);
    }
    expect_invalid(
        BatchPagedDecodePlan::<f32>::check_descriptor(&decode_desc(ElementKind::F16, 2, 8, 2, 64)),
        &["F16", "F32", "does not match"],
    );
    expect_invalid(F16Append::check_descriptor(&append_desc(ElementKind::F32, 2, 2, 64)), &["F32", "F16"]);
}

#[test]
fn group_must_be_an_integer() {
    for (hq, hkv) in [(12, 8), (3, 2), (1, 2), (7, 4), (64, 48)] {
        expect_invalid(
            F16Decode::check_descriptor(&decode_desc(ElementKind::F16, 2, hq, hkv, 128)),
            &[&format!("num_qo_heads ({hq})"), &format!("num_kv_heads ({hkv})"), "multiple"],
        );
    }
}

#[test]
fn non_positive_extents_are_rejected() {
    type Setter = fn(&mut BatchPagedDecodeDescriptor, i32);
    let fields: [(&str, Setter); 6] = [
        ("batch_size", |d, v| d.batch_size = v),
        ("num_qo_heads", |d, v| d.num_qo_heads = v),
        ("page_size", |d, v| d.paged_kv.page_size = v),
        ("num_total_pages", |d, v| d.paged_kv.num_total_pages = v),
        ("num_kv_heads", |d, v| d.paged_kv.num_kv_heads = v),
        ("head_dim", |d, v| d.paged_kv.head_dim = v),
    ];
    for (name, set) in fields {
        for v in [0, -1, -64, i32::MIN] {
            let (mut desc, _) = decode_case();
            set(&mut desc, v);
            let parts = [name, "must be positive", &format!("got {v}")];
            expect_invalid(F16Decode::check_descriptor(&desc), &parts);
            if name != "num_qo_heads" {
                let a = PagedKvAppendDescriptor { batch_size: desc.batch_size, paged_kv: desc.paged_kv };
                expect_invalid(F16Append::check_descriptor(&a), &parts);
            }
        }
    }
}

#[test]
fn sm_scale_must_be_finite() {
    for s in [f32::NAN, f32::INFINITY, f32::NEG_INFINITY] {
        let (mut desc, _) = decode_case();
        desc.sm_scale = s;
        expect_invalid(F16Decode::check_descriptor(&desc), &["sm_scale", "finite", &format!("{s}")]);
    }
}

#[test]
fn grid_and_size_limits() {
    // Hkv × head blocks above the grid's y limit.
    expect_unsupported(
        F16Decode::check_descriptor(&decode_desc(ElementKind::F16, 1, 65536, 65536, 64)),
        &["65536", "65535"],
    );
    F16Decode::check_descriptor(&decode_desc(ElementKind::F16, 1, 65535, 65535, 64)).unwrap();
    expect_unsupported(F16Append::check_descriptor(&append_desc(ElementKind::F16, 1, 65536, 64)), &["65535"]);
    // batch × Hq too large for the split workspace's row indices.
    expect_unsupported(
        F16Decode::check_descriptor(&decode_desc(ElementKind::F16, i32::MAX, 1, 1, 64)),
        &["batch_size × num_qo_heads"],
    );
    // A store with more rows (pages × kv_heads × page_size) than 32-bit row indices address.
    let huge = kv(ElementKind::F16, i32::MAX, i32::MAX, 1 << 16, 256);
    let desc =
        BatchPagedDecodeDescriptor { batch_size: 1, num_qo_heads: 1 << 16, sm_scale: 1.0, paged_kv: huge };
    expect_unsupported(F16Decode::check_descriptor(&desc), &["K/V store", "2^32"]);
    expect_unsupported(
        F16Append::check_descriptor(&PagedKvAppendDescriptor { batch_size: 1, paged_kv: huge }),
        &["K/V store", "2^32"],
    );
    // Rows within 2^32 but more than 64 GiB (2^32 16-byte units, the kernels' u32 offsets).
    let too_large = kv(ElementKind::F16, 1 << 16, 1 << 8, (1 << 8) - 1, 64);
    expect_unsupported(
        F16Append::check_descriptor(&PagedKvAppendDescriptor { batch_size: 1, paged_kv: too_large }),
        &["K/V store", "64 GiB"],
    );
    let just_fits = kv(ElementKind::F16, 1 << 13, 1 << 8, (1 << 8) - 1, 64);
    F16Append::check_descriptor(&PagedKvAppendDescriptor { batch_size: 1, paged_kv: just_fits }).unwrap();
}

// ---- decode layouts ----

#[test]
fn decode_wrong_shapes() {
    let (desc, good) = decode_case();
    F16Decode::check_layout(&desc, &good).unwrap();
    let check = |args: BatchPagedDecodeArgsLayout, name: &str, meaning: &str| {
        expect_invalid(F16Decode::check_layout(&desc, &args), &[&format!("{name}: shape"), meaning]);
    };
    let row = "[batch_size, num_qo_heads, head_dim] = [3, 8, 64]";
    let store = "[num_total_pages, num_kv_heads, page_size, head_dim] = [32, 2, 16, 64]";
    check(BatchPagedDecodeArgsLayout { q: with_shape([3, 8, 128]), ..good }, "q", row);
    check(BatchPagedDecodeArgsLayout { q: with_shape([4, 8, 64]), ..good }, "q", row);
    check(BatchPagedDecodeArgsLayout { q: with_shape([3, 2, 64]), ..good }, "q", row);
    check(BatchPagedDecodeArgsLayout { k_data: with_shape([32, 2, 64, 16]), ..good }, "k_data", store);
    check(BatchPagedDecodeArgsLayout { k_data: with_shape([31, 2, 16, 64]), ..good }, "k_data", store);
    check(BatchPagedDecodeArgsLayout { v_data: with_shape([32, 8, 16, 64]), ..good }, "v_data", store);
    check(BatchPagedDecodeArgsLayout { v_data: with_shape([32, 2, 16, 65]), ..good }, "v_data", store);
    check(BatchPagedDecodeArgsLayout { indptr: with_shape([3]), ..good }, "indptr", "[batch_size + 1] = [4]");
    check(BatchPagedDecodeArgsLayout { indptr: with_shape([5]), ..good }, "indptr", "[batch_size + 1] = [4]");
    check(
        BatchPagedDecodeArgsLayout { last_page_len: with_shape([4]), ..good },
        "last_page_len",
        "[batch_size] = [3]",
    );
    check(BatchPagedDecodeArgsLayout { o: with_shape([3, 8, 63]), ..good }, "o", row);
    check(BatchPagedDecodeArgsLayout { o: with_shape([3, 64, 8]), ..good }, "o", row);
    check(
        BatchPagedDecodeArgsLayout { lse: with_shape([8, 3]), ..good },
        "lse",
        "[batch_size, num_qo_heads] = [3, 8]",
    );
    check(
        BatchPagedDecodeArgsLayout { lse: with_shape([3, 1]), ..good },
        "lse",
        "[batch_size, num_qo_heads]",
    );
    // Any non-negative number of page ids is a valid indices shape, including none.
    for n in [0, 1, 1000] {
        F16Decode::check_layout(&desc, &BatchPagedDecodeArgsLayout { indices: with_shape([n]), ..good })
            .unwrap();
    }
    for n in [-1, i32::MIN] {
        let args = BatchPagedDecodeArgsLayout { indices: with_shape([n]), ..good };
        expect_invalid(F16Decode::check_layout(&desc, &args), &["indices", &format!("extent {n}"), "≥ 0"]);
    }
}

#[test]
fn decode_non_contiguous_views() {
    let (desc, good) = decode_case();
    type Edit = fn(&mut BatchPagedDecodeArgsLayout, bool);
    // (K and V are strided views: `decode_strided_kv_views`.)
    let tensors: [(&str, Edit); 6] = [
        ("q", |a, p| a.q = if p { permuted(a.q) } else { broadcast(a.q) }),
        ("indices", |a, p| a.indices.stride = [if p { 2 } else { 0 }]),
        ("indptr", |a, p| a.indptr.stride = [if p { -1 } else { 0 }]),
        ("last_page_len", |a, p| a.last_page_len.stride = [if p { 3 } else { 0 }]),
        ("o", |a, p| a.o = if p { permuted(a.o) } else { broadcast(a.o) }),
        ("lse", |a, p| a.lse = if p { permuted(a.lse) } else { broadcast(a.lse) }),
    ];
    for (name, edit) in tensors {
        for permute in [true, false] {
            let mut args = good;
            edit(&mut args, permute);
            expect_invalid(
                F16Decode::check_layout(&desc, &args),
                &[&format!("{name}: strides"), "not contiguous"],
            );
        }
    }
    // A row-major stride of an inner axis, padded (e.g. a slice of a wider tensor).
    let mut args = good;
    args.q.stride = [8 * 128, 128, 1];
    args.q.storage_len = 3 * 8 * 128;
    expect_invalid(F16Decode::check_layout(&desc, &args), &["q: strides", "[1024, 128, 1]"]);
}

#[test]
fn decode_storage_too_small() {
    let (desc, good) = decode_case();
    let cases = [
        ("q", BatchPagedDecodeArgsLayout { q: short(good.q), ..good }, good.q.numel()),
        ("k_data", BatchPagedDecodeArgsLayout { k_data: short(good.k_data), ..good }, good.k_data.numel()),
        ("v_data", BatchPagedDecodeArgsLayout { v_data: short(good.v_data), ..good }, good.v_data.numel()),
        ("indices", BatchPagedDecodeArgsLayout { indices: short(good.indices), ..good }, 10),
        ("indptr", BatchPagedDecodeArgsLayout { indptr: short(good.indptr), ..good }, 4),
        ("last_page_len", BatchPagedDecodeArgsLayout { last_page_len: short(good.last_page_len), ..good }, 3),
        ("o", BatchPagedDecodeArgsLayout { o: short(good.o), ..good }, good.o.numel()),
        ("lse", BatchPagedDecodeArgsLayout { lse: short(good.lse), ..good }, 24),
    ];
    for (name, args, needed) in cases {
        expect_invalid(
            F16Decode::check_layout(&desc, &args),
            &[&format!("{name}: storage holds {}", needed - 1), &format!("needs {needed}")],
        );
    }
    // Larger storage than the shape needs is fine (a prefix of a bigger buffer).
    let mut args = good;
    args.k_data.storage_len += 1000;
    args.lse.storage_len = usize::MAX;
    F16Decode::check_layout(&desc, &args).unwrap();
}

// ---- strided K/V views and attention variants ----

/// `t` with strides `stride` over `storage_len` elements.
fn strided<const N: usize>(t: TensorLayout<N>, stride: [i64; N], storage_len: usize) -> TensorLayout<N> {
    TensorLayout { stride, storage_len, ..t }
}

#[test]
fn kv_layout_strides() {
    let kv = kv(ElementKind::F16, 16, 32, 2, 64);
    assert_eq!(KvLayout::Hnd.strides(&kv), [2 * 16 * 64, 16 * 64, 64, 1]);
    assert_eq!(KvLayout::Nhd.strides(&kv), [16 * 2 * 64, 64, 2 * 64, 1]);
    // vLLM's [blocks, 2, block_size, kv_heads, D]: V half a block after K.
    assert_eq!(KvLayout::Nhd.interleaved_strides(&kv), ([2 * 16 * 2 * 64, 64, 2 * 64, 1], 16 * 2 * 64));
    assert_eq!(KvLayout::Hnd.interleaved_strides(&kv), ([2 * 2 * 16 * 64, 16 * 64, 64, 1], 2 * 16 * 64));
    // The reference's views of the same layouts have the same strides.
    let data = vec![f16::ZERO; 32 * 2 * 16 * 64];
    let nhd = paged_decode::reference::KvView::nhd(&data, &kv);
    assert_eq!(
        [nhd.page_stride, nhd.head_stride, nhd.token_stride, 1],
        KvLayout::Nhd.strides(&kv).map(|s| s as usize)
    );
    let hnd = paged_decode::reference::KvView::hnd(&data, &kv);
    assert_eq!(
        [hnd.page_stride, hnd.head_stride, hnd.token_stride, 1],
        KvLayout::Hnd.strides(&kv).map(|s| s as usize)
    );
}

#[test]
fn decode_strided_kv_views() {
    let (desc, good) = decode_case();
    let kv = desc.paged_kv;
    let numel = good.k_data.numel();
    let with_kv =
        |k: TensorLayout<4>, v: TensorLayout<4>| BatchPagedDecodeArgsLayout { k_data: k, v_data: v, ..good };
    // NHD, interleaved K/V (each view over the allocation from its first row), pages of a pool
    // shared by 3 layers, and a broadcast head (stride 0): accepted.
    let nhd = strided(good.k_data, KvLayout::Nhd.strides(&kv), numel);
    F16Decode::check_layout(&desc, &with_kv(nhd, nhd)).unwrap();
    for layout in [KvLayout::Nhd, KvLayout::Hnd] {
        let (stride, v_offset) = layout.interleaved_strides(&kv);
        let k = strided(good.k_data, stride, 2 * numel);
        let v = strided(good.k_data, stride, 2 * numel - v_offset);
        F16Decode::check_layout(&desc, &with_kv(k, v)).unwrap();
        // A V view over the whole allocation from K's start would be fine too; one element
        // short of the last row is not.
        let short_v = strided(good.k_data, stride, 2 * numel - v_offset - 1);
        expect_invalid(
            F16Decode::check_layout(&desc, &with_kv(k, short_v)),
            &["v_data: storage holds", "needs"],
        );
    }
    let mut pool = KvLayout::Hnd.strides(&kv);
    pool[0] *= 3;
    let pooled = strided(good.k_data, pool, 3 * numel - 2 * numel / 32);
    F16Decode::check_layout(&desc, &with_kv(pooled, pooled)).unwrap();
    let one_head = strided(good.k_data, [16 * 64, 0, 64, 1], 32 * 16 * 64);
    F16Decode::check_layout(&desc, &with_kv(one_head, one_head)).unwrap();

    // Rejected: head_dim not contiguous, a negative stride, strides that are not 16-byte
    // multiples, rows past the storage.
    let bad: [([i64; 4], usize, &[&str]); 5] = [
        ([2048, 1024, 64, 2], 2 * numel, &["head_dim axis must be contiguous"]),
        ([2048, -1024, 64, 1], numel, &["negative"]),
        ([2048, 1024, 68, 1], 2 * numel, &["stride 68 of axis 2", "16 bytes"]),
        ([2052, 1024, 64, 1], 2 * numel, &["stride 2052 of axis 0", "16 bytes"]),
        ([4096, 1024, 64, 1], numel, &["k_data: storage holds", "needs"]),
    ];
    for (stride, storage, parts) in bad {
        let k = strided(good.k_data, stride, storage);
        let v = strided(good.v_data, stride, storage);
        expect_invalid(F16Decode::check_layout(&desc, &with_kv(k, v)), parts);
    }
    // K and V must share their strides; rows beyond 2^32 16-byte units are unsupported.
    expect_unsupported(F16Decode::check_layout(&desc, &with_kv(nhd, good.v_data)), &["different strides"]);
    let far = [1 << 31, 1024, 64, 1];
    let huge = strided(good.k_data, far, usize::MAX);
    expect_unsupported(F16Decode::check_layout(&desc, &with_kv(huge, huge)), &["k_data", "64 GiB"]);
    // f32 elements: strides in multiples of 4 elements.
    let desc32 = decode_desc(ElementKind::F32, 3, 8, 2, 64);
    let good32 = BatchPagedDecodeArgsLayout::contiguous(&desc32, 10);
    let k = strided(good32.k_data, [2048, 1024, 68, 1], 2 * numel);
    BatchPagedDecodePlan::<f32>::check_layout(
        &desc32,
        &BatchPagedDecodeArgsLayout { k_data: k, v_data: k, ..good32 },
    )
    .unwrap();
    let k = strided(good32.k_data, [2048, 1024, 66, 1], 2 * numel);
    expect_invalid(
        BatchPagedDecodePlan::<f32>::check_layout(
            &desc32,
            &BatchPagedDecodeArgsLayout { k_data: k, v_data: k, ..good32 },
        ),
        &["stride 66", "16 bytes"],
    );
}

#[test]
fn append_strided_kv_views() {
    let (desc, good) = append_case();
    let kv = desc.paged_kv;
    let numel = good.k_data.numel();
    let nhd = strided(good.k_data, KvLayout::Nhd.strides(&kv), numel);
    F16Append::check_layout(&desc, &PagedKvAppendArgsLayout { k_data: nhd, v_data: nhd, ..good }).unwrap();
    expect_unsupported(
        F16Append::check_layout(&desc, &PagedKvAppendArgsLayout { k_data: nhd, ..good }),
        &["different strides"],
    );
    // K and V in one allocation: the K view over the whole allocation, V `v_offset` further.
    let (stride, v_offset) = KvLayout::Nhd.interleaved_strides(&kv);
    let paired = PagedKvAppendArgsLayout { k_data: strided(good.k_data, stride, 2 * numel), ..good };
    F16Append::check_paired_layout(&desc, &paired, v_offset).unwrap();
    expect_invalid(F16Append::check_paired_layout(&desc, &paired, v_offset + 1), &["v_offset", "16 bytes"]);
    expect_invalid(F16Append::check_paired_layout(&desc, &paired, v_offset + 8), &["v_data: storage holds"]);
    expect_invalid(
        F16Append::check_paired_layout(&desc, &paired, 2 * numel + 8),
        &["v_offset", "past the storage"],
    );
    let bad = strided(good.k_data, [2048, 1024, 64, 2], 2 * numel);
    expect_invalid(
        F16Append::check_layout(&desc, &PagedKvAppendArgsLayout { k_data: bad, v_data: bad, ..good }),
        &["k_data", "contiguous"],
    );
}

/// The append writes its stores, so no two of a view's elements (nor of a paired store's K and
/// V) may share an address: each would be written by two CTAs at once. The decode only reads
/// its stores and accepts such views.
#[test]
fn append_views_must_not_overlap() {
    let (desc, good) = append_case();
    let kv = desc.paged_kv;
    let numel = good.k_data.numel();
    let with_kv =
        |k: TensorLayout<4>, v: TensorLayout<4>| PagedKvAppendArgsLayout { k_data: k, v_data: v, ..good };
    // A broadcast head, tokens interleaved into each other's rows, pages on top of each other.
    let overlapping: [[i64; 4]; 3] =
        [[16 * 64, 0, 64, 1], [2 * 16 * 64, 64, 32, 1], [16 * 64, 16 * 64, 64, 1]];
    for stride in overlapping {
        let k = strided(good.k_data, stride, numel);
        expect_invalid(F16Append::check_layout(&desc, &with_kv(k, k)), &["k_data", "one address", "overlap"]);
        let (decode, decode_args) = decode_case();
        let d = strided(decode_args.k_data, stride, decode_args.k_data.numel());
        F16Decode::check_layout(&decode, &BatchPagedDecodeArgsLayout { k_data: d, v_data: d, ..decode_args })
            .unwrap();
    }
    // Every nested layout passes: HND, NHD, a pool of 3 layers.
    for stride in [KvLayout::Hnd.strides(&kv), KvLayout::Nhd.strides(&kv)] {
        let k = strided(good.k_data, stride, numel);
        F16Append::check_layout(&desc, &with_kv(k, k)).unwrap();
    }
    let mut pool = KvLayout::Nhd.strides(&kv);
    pool[0] *= 3;
    let pooled = strided(good.k_data, pool, 3 * numel);
    F16Append::check_layout(&desc, &with_kv(pooled, pooled)).unwrap();
    // Paired stores: V must start past K's rows it would otherwise share.
    for layout in [KvLayout::Nhd, KvLayout::Hnd] {
        let (stride, v_offset) = layout.interleaved_strides(&kv);
        let paired = PagedKvAppendArgsLayout { k_data: strided(good.k_data, stride, 2 * numel), ..good };
        F16Append::check_paired_layout(&desc, &paired, v_offset).unwrap();
        for v in [0, v_offset - 8, 64] {
            expect_invalid(
                F16Append::check_paired_layout(&desc, &paired, v),
                &["kv_data", "one address", &format!("V {v} elements after K")],
            );
        }
    }
    // K and V in one allocation, one after the other: disjoint.
    let back_to_back = PagedKvAppendArgsLayout {
        k_data: strided(good.k_data, KvLayout::Hnd.strides(&kv), 2 * numel),
        ..good
    };
    F16Append::check_paired_layout(&desc, &back_to_back, numel).unwrap();
    expect_invalid(F16Append::check_paired_layout(&desc, &back_to_back, numel - 64), &["kv_data", "overlap"]);
}

/// A decode's page table holds at most 2^32 - 16 tokens (`indices.len() × page_size`): beyond,
/// one request's length could wrap the kernels' u32 token counts.
#[test]
fn decode_page_table_token_limit() {
    use paged_decode::plan::MAX_TABLE_TOKENS;
    let page = 1 << 16;
    let desc = BatchPagedDecodeDescriptor {
        batch_size: 33,
        num_qo_heads: 1,
        sm_scale: 0.125,
        paged_kv: kv(ElementKind::F16, page, 1, 1, 64),
    };
    let fits = (MAX_TABLE_TOKENS / page as u64) as i32;
    assert_eq!(fits, (1 << 16) - 1);
    F16Decode::check_layout(&desc, &BatchPagedDecodeArgsLayout::contiguous(&desc, fits)).unwrap();
    for n in [fits + 1, 2 * 65537 + 31, i32::MAX] {
        expect_unsupported(
            F16Decode::check_layout(&desc, &BatchPagedDecodeArgsLayout::contiguous(&desc, n)),
            &["indices", "tokens", &MAX_TABLE_TOKENS.to_string()],
        );
    }
    // 16-token pages: 2^28 - 1 page ids are accepted, 2^28 are not.
    let (desc16, good) = decode_case();
    let at = BatchPagedDecodeArgsLayout { indices: with_shape([(1 << 28) - 1]), ..good };
    F16Decode::check_layout(&desc16, &at).unwrap();
    let past = BatchPagedDecodeArgsLayout { indices: with_shape([1 << 28]), ..good };
    expect_unsupported(F16Decode::check_layout(&desc16, &past), &["indices"]);
}

#[test]
fn variants_are_validated() {
    let desc = decode_desc(ElementKind::F16, 4, 32, 8, 128);
    let ok = |logits_soft_cap, window_left| {
        F16Decode::check_variant(&desc, &AttentionVariantDescriptor { logits_soft_cap, window_left }).unwrap()
    };
    ok(None, None);
    for cap in [1e-3, 1.0, 30.0, 50.0, 100.0, 1e6] {
        ok(Some(cap), None);
    }
    for w in [0, 1, 127, 4095, u32::MAX - 1, u32::MAX] {
        ok(None, Some(w));
        ok(Some(30.0), Some(w));
    }
    for cap in [0.0, -1.0, f32::NAN, f32::INFINITY, f32::NEG_INFINITY, -0.0] {
        let variant = AttentionVariantDescriptor { logits_soft_cap: Some(cap), window_left: None };
        expect_invalid(F16Decode::check_variant(&desc, &variant), &["logits_soft_cap"]);
    }
    // The descriptor is checked too.
    let variant = AttentionVariantDescriptor::default();
    expect_invalid(
        F16Decode::check_variant(&decode_desc(ElementKind::F16, 4, 30, 8, 128), &variant),
        &["multiple"],
    );
}

#[test]
fn window_bounds_the_launched_chunks() {
    // One request of a 4096-token page table: split into many chunks without a window, into
    // one with a window of 128 tokens.
    let desc = decode_desc(ElementKind::F16, 1, 32, 8, 128);
    let cfg = DecodeConfig::choose(&desc, &H200, usize::MAX).unwrap();
    assert!(cfg.is_split());
    let pages = 4096 / 16;
    assert_eq!(cfg.attended_tokens(&desc, pages), 4096);
    assert!(cfg.launched_chunks(&desc, pages) > 8, "{cfg:?}");
    for (w, tokens) in [(127, 128), (0, 1), (4095, 4096), (u32::MAX, 4096)] {
        let windowed = DecodeConfig { window_left: Some(w), ..cfg };
        assert_eq!(windowed.attended_tokens(&desc, pages), tokens, "window {w}");
        assert!(windowed.launched_chunks(&desc, pages) <= cfg.launched_chunks(&desc, pages));
    }
    // 128 tokens: two chunks of the smallest size (one 64-token tile each) at most.
    assert_eq!(DecodeConfig { window_left: Some(127), ..cfg }.launched_chunks(&desc, pages), 2);
    // A batch: at most `window_left + 1` tokens per request.
    let desc = decode_desc(ElementKind::F16, 8, 32, 8, 128);
    let cfg =
        DecodeConfig { window_left: Some(1023), ..DecodeConfig::choose(&desc, &H200, usize::MAX).unwrap() };
    assert_eq!(cfg.attended_tokens(&desc, 8 * 512), 8 * 1024);
    assert_eq!(cfg.attended_tokens(&desc, 8 * 4), 8 * 4 * 16);
}

// ---- append layouts ----

#[test]
fn append_wrong_shapes() {
    let (desc, good) = append_case();
    F16Append::check_layout(&desc, &good).unwrap();
    let check = |args: PagedKvAppendArgsLayout, name: &str, meaning: &str| {
        expect_invalid(F16Append::check_layout(&desc, &args), &[&format!("{name}: shape"), meaning]);
    };
    let row = "[batch_size, num_kv_heads, head_dim] = [3, 2, 64]";
    let store = "[num_total_pages, num_kv_heads, page_size, head_dim] = [32, 2, 16, 64]";
    check(PagedKvAppendArgsLayout { key: with_shape([3, 4, 64]), ..good }, "key", row);
    check(PagedKvAppendArgsLayout { key: with_shape([2, 2, 64]), ..good }, "key", row);
    check(PagedKvAppendArgsLayout { value: with_shape([3, 2, 128]), ..good }, "value", row);
    check(PagedKvAppendArgsLayout { k_data: with_shape([32, 16, 2, 64]), ..good }, "k_data", store);
    check(PagedKvAppendArgsLayout { v_data: with_shape([33, 2, 16, 64]), ..good }, "v_data", store);
    check(PagedKvAppendArgsLayout { indptr: with_shape([3]), ..good }, "indptr", "[batch_size + 1] = [4]");
    check(
        PagedKvAppendArgsLayout { last_page_len: with_shape([0]), ..good },
        "last_page_len",
        "[batch_size] = [3]",
    );
    for n in [-1, -100, i32::MIN] {
        let args = PagedKvAppendArgsLayout { indices: with_shape([n]), ..good };
        expect_invalid(F16Append::check_layout(&desc, &args), &["indices", &format!("extent {n}")]);
    }
    F16Append::check_layout(&desc, &PagedKvAppendArgsLayout { indices: with_shape([0]), ..good }).unwrap();
}

#[test]
fn append_non_contiguous_views() {
    let (desc, good) = append_case();
    type Edit = fn(&mut PagedKvAppendArgsLayout, bool);
    let tensors: [(&str, Edit); 5] = [
        ("key", |a, p| a.key = if p { permuted(a.key) } else { broadcast(a.key) }),
        ("value", |a, p| a.value = if p { permuted(a.value) } else { broadcast(a.value) }),
        ("indices", |a, p| a.indices.stride = [if p { 2 } else { 0 }]),
        ("indptr", |a, p| a.indptr.stride = [if p { -1 } else { 0 }]),
        ("last_page_len", |a, p| a.last_page_len.stride = [if p { 3 } else { 0 }]),
    ];
    for (name, edit) in tensors {
        for permute in [true, false] {
            let mut args = good;
            edit(&mut args, permute);
            expect_invalid(
                F16Append::check_layout(&desc, &args),
                &[&format!("{name}: strides"), "not contiguous"],
            );
        }
    }
}

#[test]
fn append_storage_too_small() {
    let (desc, good) = append_case();
    let cases = [
        ("key", PagedKvAppendArgsLayout { key: short(good.key), ..good }, 384),
        ("value", PagedKvAppendArgsLayout { value: short(good.value), ..good }, 384),
        ("k_data", PagedKvAppendArgsLayout { k_data: short(good.k_data), ..good }, good.k_data.numel()),
        ("v_data", PagedKvAppendArgsLayout { v_data: short(good.v_data), ..good }, good.v_data.numel()),
        ("indices", PagedKvAppendArgsLayout { indices: short(good.indices), ..good }, 10),
        ("indptr", PagedKvAppendArgsLayout { indptr: short(good.indptr), ..good }, 4),
        ("last_page_len", PagedKvAppendArgsLayout { last_page_len: short(good.last_page_len), ..good }, 3),
    ];
    for (name, args, needed) in cases {
        expect_invalid(
            F16Append::check_layout(&desc, &args),
            &[&format!("{name}: storage holds {}", needed - 1), &format!("needs {needed}")],
        );
    }
}

#[test]
fn append_batch_at_i32_max_is_rejected_without_panicking() {
    // indptr would need 2^31 entries, which no i32 extent can describe.
    let desc = append_desc(ElementKind::F16, i32::MAX, 1, 64);
    let args = PagedKvAppendArgsLayout::contiguous(&desc, 0);
    let r = F16Append::check_descriptor(&desc).and_then(|()| F16Append::check_layout(&desc, &args));
    assert!(matches!(r, Err(Error::InvalidProblem(_) | Error::Unsupported(_))), "{r:?}");
}

#[test]
fn decode_layout_at_batch_i32_max_does_not_panic() {
    let desc = decode_desc(ElementKind::F16, i32::MAX, 1, 1, 64);
    let args = BatchPagedDecodeArgsLayout::contiguous(&desc, 0);
    assert!(F16Decode::check_layout(&desc, &args).is_err());
}

// ---- launch configuration ----

/// Batches of more than a wave are not split, but get a wave's worth of spare chunks (equal
/// lengths stay whole; a long request is cut to a wave's share); none without the workspace.
#[test]
fn large_batch_is_not_split_but_gets_spare_chunks_past_a_wave() {
    for element in [ElementKind::F16, ElementKind::BF16, ElementKind::F32] {
        for d in [64, 128, 256] {
            let desc = decode_desc(element, 256, 64, 8, d);
            let cfg = DecodeConfig::choose(&desc, &H200, usize::MAX).unwrap();
            assert_eq!(cfg.num_splits, 1, "{element:?} d {d}: {cfg:?}");
            let ctas_per_chunk = 8 * cfg.head_blocks;
            if 256 * ctas_per_chunk > cfg.wave_ctas {
                let wave_chunks = cfg.wave_ctas / ctas_per_chunk;
                assert_eq!(
                    (cfg.spare_chunks, cfg.balance_chunks, cfg.heads_along_x),
                    (wave_chunks, wave_chunks, true),
                    "{element:?} d {d}: {cfg:?}"
                );
            } else {
                assert!(!cfg.is_split(), "{element:?} d {d}: {cfg:?}");
            }
            let tight = DecodeConfig::choose(&desc, &H200, 0).unwrap();
            assert!(!tight.is_split() && tight.workspace_size(&desc) == 0, "{element:?} d {d}: {tight:?}");
        }
    }
}

/// The split grid launches only the chunks the page table's slots can fill; a page table with
/// room for more tokens keeps the whole grid, and unsplit plans launch one CTA per request.
#[test]
fn launched_chunks_follow_the_page_table_capacity() {
    let one = decode_desc(ElementKind::F16, 1, 32, 8, 128);
    let cfg = DecodeConfig::choose(&one, &H200, usize::MAX).unwrap();
    assert_eq!(cfg.num_chunks(&one), 32);
    // 16-token pages: 64 slots hold 1024 tokens, 256 slots 4096 (chunks of 4 tiles), 4096 slots
    // a 64k-token request (all 32 chunks).
    for (slots, want) in [(0, 1), (1, 1), (64, 16), (256, 16), (300, 19), (4096, 32), (1 << 20, 32)] {
        assert_eq!(cfg.launched_chunks(&one, slots), want, "{slots} slots");
    }
    let eight = decode_desc(ElementKind::F16, 8, 32, 8, 128);
    let cfg = DecodeConfig::choose(&eight, &H200, usize::MAX).unwrap();
    assert_eq!(cfg.launched_chunks(&eight, 8 * 256), 32);
    // Eight 1-page requests: one chunk each, plus the bound's slack of 128 tokens / 64-token chunks.
    assert_eq!(cfg.launched_chunks(&eight, 8), 10);
    // Unsplit (one well-filled wave): one CTA per request whatever the page table holds.
    let wave = decode_desc(ElementKind::F16, 32, 32, 8, 128);
    let cfg = DecodeConfig::choose(&wave, &H200, usize::MAX).unwrap();
    assert!(!cfg.is_split());
    assert_eq!((cfg.launched_chunks(&wave, 1), cfg.launched_chunks(&wave, 1 << 20)), (32, 32));
    // Past a wave, the spare chunks launch only when the page table holds a wave's share more.
    let wide = decode_desc(ElementKind::F16, 64, 32, 8, 128);
    let cfg = DecodeConfig::choose(&wide, &H200, usize::MAX).unwrap();
    assert_eq!((cfg.launched_chunks(&wide, 1), cfg.launched_chunks(&wide, 1 << 20)), (64, 97));
}

/// Whole requests with spare chunks within one poorly filled wave: head-major CTA order, but
/// chunk-major (their CTAs first) when they leave a CTA slot free on every SM, which only
/// entries of three or more CTAs per SM allow.
#[test]
fn spare_chunk_order_within_one_wave() {
    let order = |element, b, d| {
        let desc = decode_desc(element, b, 32, 8, d);
        let cfg = DecodeConfig::choose(&desc, &H200, usize::MAX).unwrap();
        assert!(cfg.num_splits == 1 && cfg.spare_chunks > 0, "{element:?} b {b} d {d}: {cfg:?}");
        cfg.heads_along_x
    };
    // Two CTAs per SM: 17–32 requests × 8 KV heads fill more than one slot per SM.
    assert!(!order(ElementKind::F16, 24, 128));
    // Three per SM (8-bit cache, head_dim 64): 26–33 requests leave one free, 34–41 do not.
    for (b, chunk_major) in [(26, true), (33, true), (34, false), (41, false)] {
        assert_eq!(order(ElementKind::E4M3, b, 64), chunk_major, "b {b}");
    }
}

/// Spare chunks on request (`PlanPreference::spare_chunks`): beyond a wave, chunks of a wave's
/// share in chunk-major CTA order; within one wave of unsplit requests, head-major.
#[test]
fn spare_chunks_on_request() {
    let desc = decode_desc(ElementKind::F16, 256, 32, 8, 128);
    let cfg = DecodeConfig::choose(&desc, &H200, usize::MAX).unwrap().with_spare_chunks(&desc, 33).unwrap();
    assert_eq!((cfg.num_chunks(&desc), cfg.balance_chunks, cfg.heads_along_x), (289, 33, true));
    assert!(cfg.is_split() && cfg.workspace_size(&desc) >= 289 * 32 * (128 + 1) * 4);
    let desc = decode_desc(ElementKind::F16, 24, 32, 8, 128);
    let cfg = DecodeConfig::choose(&desc, &H200, usize::MAX).unwrap();
    assert_eq!((cfg.spare_chunks, cfg.balance_chunks, cfg.heads_along_x), (23, 33, false), "{cfg:?}");
    let none = cfg.with_spare_chunks(&desc, 0).unwrap();
    assert!(!none.is_split() && none.workspace_size(&desc) == 0);
    let wide = decode_desc(ElementKind::F16, 60000, 32, 8, 128);
    let cfg = DecodeConfig::choose(&wide, &H200, usize::MAX).unwrap();
    assert!(matches!(cfg.with_spare_chunks(&wide, 6000), Err(Error::Unsupported(_))));
}

#[test]
fn batch_one_is_split() {
    for element in [ElementKind::F16, ElementKind::BF16, ElementKind::F32] {
        for d in [64, 128, 256] {
            let desc = decode_desc(element, 1, 32, 8, d);
            let cfg = DecodeConfig::choose(&desc, &H200, usize::MAX).unwrap();
            assert!(cfg.num_splits > 1 && cfg.num_splits <= MAX_SPLITS, "{element:?} d {d}: {cfg:?}");
            let ws = cfg.workspace_size(&desc);
            // Partial O (f32) and partial lse of every split.
            let rows = cfg.num_splits as usize * 32;
            assert!(ws >= rows * d as usize * 4 + rows * 4, "{ws}");
        }
    }
}

/// Half a wave of CTAs or less: split as far as one wave holds (132 SMs × 2 CTAs for the
/// tensor-core kernel), rounded down to whole merge batches while 90 % of the wave stays busy
/// (batch 1: 32 splits, not 33). Up to one wave: no split at equal lengths, plus spare chunks (fewer than
/// the batch) for long requests. Beyond: the last wave is at least 85 % busy.
#[test]
fn small_batches_fill_one_wave() {
    for (batch, want) in [(1, 32), (2, 16), (4, 8), (8, 4), (16, 2)] {
        let desc = decode_desc(ElementKind::F16, batch, 32, 8, 128);
        let cfg = DecodeConfig::choose(&desc, &H200, usize::MAX).unwrap();
        assert_eq!((cfg.num_splits, cfg.spare_chunks), (want, 0), "batch {batch}: {cfg:?}");
        assert_eq!(cfg.num_chunks(&desc), batch as u32 * want);
        assert_eq!(cfg.wave_ctas, 264);
    }
    let desc = decode_desc(ElementKind::F16, 24, 32, 8, 128);
    let cfg = DecodeConfig::choose(&desc, &H200, usize::MAX).unwrap();
    assert_eq!((cfg.num_splits, cfg.spare_chunks), (1, 23), "{cfg:?}");
    assert!(cfg.is_split() && cfg.workspace_size(&desc) >= 47 * 32 * (128 + 1) * 4);

    let desc = decode_desc(ElementKind::F16, 40, 32, 8, 128);
    let cfg = DecodeConfig::choose(&desc, &H200, usize::MAX).unwrap();
    let ctas = 40 * 8 * cfg.num_splits as u64;
    assert_eq!(cfg.spare_chunks, 0, "{cfg:?}");
    assert!(ctas as f64 / (ctas.div_ceil(264) * 264) as f64 >= 0.85, "{cfg:?}");
}

#[test]
fn num_splits_override_is_checked() {
    let desc = decode_desc(ElementKind::F16, 4, 32, 8, 128);
    let cfg = DecodeConfig::choose(&desc, &H200, usize::MAX).unwrap();
    for s in [0, MAX_SPLITS + 1, u32::MAX] {
        assert!(matches!(cfg.with_num_splits(&desc, s), Err(Error::Unsupported(_))), "{s}");
    }
    let three = cfg.with_num_splits(&desc, 3).unwrap();
    assert_eq!((three.num_chunks(&desc), three.spare_chunks), (12, 0));
    assert!(three.is_split() && three.workspace_size(&desc) >= 12 * 32 * (128 + 1) * 4);
    let one = cfg.with_num_splits(&desc, 1).unwrap();
    assert!(!one.is_split() && one.workspace_size(&desc) == 0);
    // Spare chunks on top of the splits, with the balance bound of one wave (33 chunks of 8 CTAs).
    let spare = three.with_spare_chunks(&desc, 5).unwrap();
    assert_eq!((spare.num_chunks(&desc), spare.balance_chunks), (17, 33));
    let none = spare.with_spare_chunks(&desc, 0).unwrap();
    assert_eq!(none, three);
    // The split kernels run their chunks along grid y (≤ 65535).
    let wide = decode_desc(ElementKind::F16, 2000, 32, 8, 128);
    let cfg = DecodeConfig::choose(&wide, &H200, usize::MAX).unwrap();
    assert!(matches!(cfg.with_num_splits(&wide, 64), Err(Error::Unsupported(_))));
    assert_eq!(cfg.with_num_splits(&wide, 32).unwrap().num_chunks(&wide), 64000);
    assert!(cfg.with_num_splits(&wide, 1).is_ok());
}

#[test]
fn workspace_limit_is_respected() {
    for element in [ElementKind::F16, ElementKind::F32] {
        let desc = decode_desc(element, 1, 32, 8, 128);
        let cfg = DecodeConfig::choose(&desc, &H200, 0).unwrap();
        assert_eq!(cfg.num_splits, 1, "{cfg:?}");
        assert_eq!(cfg.workspace_size(&desc), 0);
        let full = DecodeConfig::choose(&desc, &H200, usize::MAX).unwrap();
        for limit in [1, 1000, full.workspace_size(&desc) / 2, full.workspace_size(&desc) - 1] {
            let cfg = DecodeConfig::choose(&desc, &H200, limit).unwrap();
            assert!(cfg.workspace_size(&desc) <= limit, "limit {limit}: {cfg:?}");
            assert!(cfg.num_splits < full.num_splits);
        }
        let cfg = DecodeConfig::choose(&desc, &H200, full.workspace_size(&desc)).unwrap();
        assert_eq!(cfg, full);
    }
}

#[test]
fn kernel_follows_element_type() {
    use paged_decode::plan::DecodeKernel;
    for (element, kernel) in [
        (ElementKind::F16, DecodeKernel::Mma),
        (ElementKind::BF16, DecodeKernel::Mma),
        (ElementKind::F32, DecodeKernel::Simt),
    ] {
        let cfg = DecodeConfig::choose(&decode_desc(element, 8, 32, 8, 128), &H200, usize::MAX).unwrap();
        assert_eq!(cfg.kernel, kernel);
    }
}

#[test]
fn shared_memory_limit_is_unsupported() {
    let small = DeviceProps { smem_per_block_optin: 48 * 1024, ..H200 };
    let desc = decode_desc(ElementKind::F16, 2, 8, 2, 256);
    match DecodeConfig::choose(&desc, &small, usize::MAX) {
        Err(Error::Unsupported(msg)) => {
            assert!(msg.contains("shared memory") && msg.contains("head_dim 256"))
        }
        other => panic!("expected Unsupported, got {other:?}"),
    }
}

// ---- device ----

#[test]
fn open_without_driver_is_no_device() {
    if driver_available() {
        println!("SKIPPED open_without_driver_is_no_device: this machine has a CUDA driver");
        return;
    }
    assert!(matches!(Device::open(0), Err(Error::NoDevice)));
    assert!(matches!(Device::open(7), Err(Error::NoDevice)));
}

/// 8-bit caches: f16 / bf16 q over E4M3 / E5M2 pass; other q types, a cache element other than
/// q's type or an 8-bit float, and descriptors of the wrong store element are typed errors; the
/// launch rule gives them the tensor-core kernel with 8-bit stages.
#[test]
fn fp8_cache_descriptors() {
    use paged_decode::float8::{F8E4M3, F8E5M2};
    let e4 = decode_desc(ElementKind::E4M3, 4, 32, 8, 128);
    let e5 = decode_desc(ElementKind::E5M2, 4, 32, 8, 128);
    BatchPagedDecodePlan::<f16, F8E4M3>::check_descriptor(&e4).unwrap();
    BatchPagedDecodePlan::<bf16, F8E4M3>::check_descriptor(&e4).unwrap();
    BatchPagedDecodePlan::<f16, F8E5M2>::check_descriptor(&e5).unwrap();
    BatchPagedDecodePlan::<bf16, F8E5M2>::check_descriptor(&e5).unwrap();
    expect_unsupported(BatchPagedDecodePlan::<f32, F8E4M3>::check_descriptor(&e4), &["F32", "8-bit"]);
    expect_invalid(BatchPagedDecodePlan::<f16, F8E4M3>::check_descriptor(&e5), &["E5M2", "E4M3"]);
    // No kernel soft-caps the logits of an 8-bit cache; a sliding window is fine.
    let capped = AttentionVariantDescriptor { logits_soft_cap: Some(30.0), window_left: None };
    expect_unsupported(
        BatchPagedDecodePlan::<f16, F8E4M3>::check_variant(&e4, &capped),
        &["soft-cap", "8-bit"],
    );
    expect_unsupported(
        BatchPagedDecodePlan::<bf16, F8E5M2>::check_variant(&e5, &capped),
        &["soft-cap", "8-bit"],
    );
    let windowed = AttentionVariantDescriptor { logits_soft_cap: None, window_left: Some(127) };
    BatchPagedDecodePlan::<bf16, F8E5M2>::check_variant(&e5, &windowed).unwrap();
    expect_invalid(
        BatchPagedDecodePlan::<f16, bf16>::check_descriptor(&decode_desc(ElementKind::BF16, 2, 8, 2, 64)),
        &["BF16", "F16", "8-bit"],
    );
    for d in [64, 128, 256] {
        let config =
            DecodeConfig::choose(&decode_desc(ElementKind::E4M3, 32, 32, 8, d), &H200, usize::MAX).unwrap();
        assert_eq!(config.kernel, paged_decode::plan::DecodeKernel::Mma);
        assert!(config.smem_bytes <= H200.smem_per_block_optin / 2, "d {d}: two CTAs per SM");
        let lean = config.lean.map(|l| l.smem_bytes);
        assert_eq!(lean.is_some(), d <= 128, "d {d}: lean launch {lean:?}");
    }
    // Shared memory holds three 8-bit-cache CTAs per SM; when the loaded kernel's registers hold
    // only two (what `select` asks the driver), the wave shrinks with them. Batch 32 × 8 KV heads
    // is then one well-filled wave of whole requests instead of 1.3 waves of split chunks.
    let b32 = decode_desc(ElementKind::E4M3, 32, 32, 8, 128);
    let by_smem = DecodeConfig::choose(&b32, &H200, usize::MAX).unwrap();
    assert_eq!((by_smem.wave_ctas, by_smem.ctas_per_sm(&H200)), (3 * 132, 3));
    assert!(by_smem.is_split(), "{by_smem:?}");
    let resident = DecodeConfig::choose_resident(&b32, &H200, usize::MAX, 2).unwrap();
    assert_eq!(resident.wave_ctas, 2 * 132);
    assert!(!resident.is_split(), "{resident:?}");
    // A residency above what shared memory allows changes nothing.
    assert_eq!(DecodeConfig::choose_resident(&b32, &H200, usize::MAX, 5).unwrap(), by_smem);
    // Entries of one cache whose registers hold different waves (the head_dim-256 ones: split
    // three CTAs per SM, unsplit two). The split count and the spare chunks follow the split
    // entry's wave; whole requests without spare chunks need one chunk per request to fill both
    // waves well, which 0.85 × 396 > 264 rules out here.
    let two_waves = |b: i32| {
        let desc = decode_desc(ElementKind::E4M3, b, 32, 8, 256);
        let config =
            DecodeConfig::choose_residency(&desc, &H200, usize::MAX, Residency { split: 3, whole: 2 })
                .unwrap();
        assert_eq!(config.wave_ctas, 3 * 132, "b {b}");
        let split_only = DecodeConfig::choose_resident(&desc, &H200, usize::MAX, 3).unwrap();
        (config, split_only)
    };
    for b in [1, 8, 16, 24, 29, 32, 64, 128] {
        let (config, split_only) = two_waves(b);
        assert_eq!(config, split_only, "b {b}");
    }
    for b in [43, 45, 49] {
        // 344–392 CTAs: one well-filled split wave, 1.3–1.5 unsplit ones. Whole requests with
        // spare chunks, one split wave; neither the unsplit kernel nor a split count sized by
        // the unsplit entry's wave (what one residency for both entries gave).
        let (config, split_only) = two_waves(b);
        assert!(!split_only.is_split(), "b {b}: {split_only:?}");
        assert!(config.num_splits == 1 && config.spare_chunks > 0, "b {b}: {config:?}");
    }
    // Quantizing appends: f16 / bf16 tokens into 8-bit stores, codes into stores of codes.
    let a4 = append_desc(ElementKind::E4M3, 4, 8, 128);
    PagedKvAppendPlan::<f16, F8E4M3>::check_descriptor(&a4).unwrap();
    PagedKvAppendPlan::<bf16, F8E4M3>::check_descriptor(&a4).unwrap();
    PagedKvAppendPlan::<F8E4M3, F8E4M3>::check_descriptor(&a4).unwrap();
    expect_unsupported(PagedKvAppendPlan::<f32, F8E4M3>::check_descriptor(&a4), &["F32", "E4M3"]);
    expect_unsupported(PagedKvAppendPlan::<F8E5M2, F8E4M3>::check_descriptor(&a4), &["E5M2", "E4M3"]);
    expect_invalid(PagedKvAppendPlan::<f16, F8E5M2>::check_descriptor(&a4), &["E4M3", "E5M2"]);
}

/// Dequantization scales must be finite and positive.
#[test]
fn kv_scales_are_checked() {
    use paged_decode::KvScales;
    assert_eq!(KvScales::ONE.check().unwrap(), KvScales::ONE);
    KvScales { k_scale: 0.0042, v_scale: 3.5 }.check().unwrap();
    for (k, v) in [(0.0, 1.0), (1.0, -2.0), (f32::NAN, 1.0), (1.0, f32::INFINITY)] {
        expect_invalid(
            KvScales { k_scale: k, v_scale: v }.check().map(|_| ()),
            &["must be finite and positive"],
        );
    }
}

/// The lean kernel stacks KV heads only for very short requests, as many as its time model finds
/// cheapest, in powers of two that divide the KV heads and fit one 16-row query tile.
#[test]
fn lean_stacks_kv_heads_by_rule() {
    let stack = |b: i32, hq: i32, hkv: i32, d: i32, avg_tokens: u64, max_heads: u32| {
        let desc = decode_desc(ElementKind::F16, b, hq, hkv, d);
        let lean = DecodeConfig::choose(&desc, &H200, usize::MAX).unwrap().lean.unwrap();
        assert_eq!(lean.wave_ctas, 4 * 132, "{desc:?}");
        1u32 << lean.stack_shift(&desc, avg_tokens * b as u64, max_heads)
    };
    let all = u32::MAX;
    // The scale table's short rows (32/8 heads): four KV heads (16 query heads) per CTA.
    assert_eq!(stack(8192, 32, 8, 128, 32, all), 4);
    assert_eq!(stack(1024, 32, 8, 128, 64, all), 4);
    assert_eq!(stack(16384, 32, 8, 128, 64, all), 4);
    // Longer requests stack fewer heads: at most 256 tokens per CTA at the average length.
    assert_eq!(stack(512, 32, 8, 128, 128, all), 2);
    assert_eq!(stack(4096, 32, 8, 128, 256, all), 1);
    assert_eq!(stack(2048, 32, 8, 128, 208, all), 1);
    // The cheapest by the time model: (1 + tiles per CTA) × max(CTAs, a lean wave of 132 × 4),
    // the most heads among equals, never fewer CTAs than SMs.
    // 256 × 64 tokens: four heads (512 CTAs of 8 tiles) beat two (1024 of 4).
    assert_eq!(stack(256, 32, 8, 128, 64, all), 4);
    // 128 × 64 tokens: two heads fill a wave with 512 CTAs; four would double their chains.
    assert_eq!(stack(128, 32, 8, 128, 64, all), 2);
    assert_eq!(stack(300, 32, 8, 128, 40, all), 4);
    assert_eq!(stack(256, 32, 8, 128, 16, all), 4);
    // 16 tokens: two heads share one tile (the chain of one head), four take two tiles.
    assert_eq!(stack(64, 32, 8, 128, 16, all), 2);
    assert_eq!(stack(100, 32, 8, 128, 16, all), 2);
    // A full 32-token tile per head: stacking only lengthens the chains within one wave.
    assert_eq!(stack(64, 32, 8, 128, 32, all), 1);
    assert_eq!(stack(256, 32, 8, 128, 32, all), 4);
    // Never fewer CTAs than SMs: 128 CTAs stay one head each.
    assert_eq!(stack(16, 32, 8, 128, 16, all), 1);
    assert_eq!(stack(16, 32, 32, 128, 16, all), 2);
    // Groups: 1 → 16 heads, 2 → 8, 8 → 2, 16 and more → 1; the count divides the KV heads.
    assert_eq!(stack(1200, 16, 16, 64, 10, all), 16);
    assert_eq!(stack(1500, 16, 8, 128, 30, all), 8);
    assert_eq!(stack(1600, 64, 8, 64, 15, all), 2);
    assert_eq!(stack(4096, 64, 4, 128, 16, all), 1);
    assert_eq!(stack(4096, 12, 6, 128, 16, all), 2);
    assert_eq!(stack(4096, 4, 1, 128, 16, all), 1);
    // The preference caps it.
    assert_eq!(stack(8192, 32, 8, 128, 32, 2), 2);
    assert_eq!(stack(8192, 32, 8, 128, 32, 1), 1);
    assert_eq!(stack(8192, 32, 8, 128, 32, 0), 1);
}

/// The stacking rule against run 90's measurements (`docs/results/stacking-run90-h200.txt`: the
/// lean kernel's time with each KV-head count forced, on an H200): on every measured batch the
/// count the rule picks runs within 1 % of the fastest count the rule allows. A rule change
/// that stops tracking the measured optimum fails here.
#[test]
fn stacking_rule_tracks_run_90() {
    let table = include_str!("../docs/results/stacking-run90-h200.txt");
    let mut columns: Vec<u32> = Vec::new();
    let mut rows = 0;
    for line in table.lines().skip(1) {
        let fields: Vec<&str> = line.split_whitespace().collect();
        if fields.first() == Some(&"shape") {
            // `def` (the rule of the version before), then `k1`, `k2`, ...
            columns = fields[2..].iter().map(|k| k.trim_start_matches('k').parse().unwrap()).collect();
            continue;
        }
        // k-b{batch}-L{len}[-{hq}/{hkv}-d{head_dim}]
        let parts: Vec<&str> = fields[0].split('-').collect();
        let b: i32 = parts[1][1..].parse().unwrap();
        let len: u64 = parts[2][1..].parse().unwrap();
        let (hq, hkv, d) = match parts.get(3) {
            Some(heads) => {
                let (hq, hkv) = heads.split_once('/').unwrap();
                (hq.parse().unwrap(), hkv.parse().unwrap(), parts[4][1..].parse().unwrap())
            }
            None => (32, 8, 128),
        };
        let us: Vec<f64> = fields[2..].iter().map(|t| t.parse().unwrap()).collect();
        let desc = decode_desc(ElementKind::F16, b, hq, hkv, d);
        let lean = DecodeConfig::choose(&desc, &H200, usize::MAX).unwrap().lean.unwrap();
        let tokens = len * b as u64;
        let picked = 1u32 << lean.stack_shift(&desc, tokens, u32::MAX);
        // The counts the rule may choose from: powers of two dividing the KV heads, one query
        // tile of heads, at most 256 tokens per CTA (`STACK_MAX_TOKENS`) and no SM left idle.
        let allowed = |k: u32| {
            (hkv as u32).is_multiple_of(k)
                && (hq / hkv) as u32 * k <= 16
                && len * k as u64 <= STACK_MAX_TOKENS as u64
                && (k == 1 || b as u64 * (hkv as u32 / k) as u64 >= H200.sm_count as u64)
        };
        let time = |k: u32| us[columns.iter().position(|&c| c == k).unwrap()];
        let best = columns.iter().copied().filter(|&k| allowed(k)).map(time).fold(f64::INFINITY, f64::min);
        assert!(
            time(picked) <= 1.01 * best,
            "{}: the rule picks {picked} KV heads ({} µs), the fastest allowed count takes {best} µs",
            fields[0],
            time(picked)
        );
        rows += 1;
    }
    assert_eq!(rows, 38);
}

/// The kernel path by rule, from the page table's shape: lean below a wave only while the
/// average request fits one lean tile, whole while no request is worth splitting.
#[test]
fn path_by_rule() {
    let path = |b: i32, hq: i32, hkv: i32, d: i32, table_tokens: usize| {
        let desc = decode_desc(ElementKind::F16, b, hq, hkv, d);
        let cfg = DecodeConfig::choose(&desc, &H200, usize::MAX).unwrap();
        cfg.path(&desc, table_tokens / 16, Some(LEAN_MAX_AVG_TOKENS)).name()
    };
    // Batches within a wave of the standard kernel: one lean tile (32 tokens at head_dim 128,
    // 64 at 64) per request on average runs lean, whatever the longest could be.
    assert_eq!(path(1, 32, 8, 128, 16), "lean");
    assert_eq!(path(16, 32, 8, 128, 16 * 16), "lean");
    assert_eq!(path(16, 32, 8, 128, 16 * 32), "lean");
    assert_eq!(path(32, 32, 8, 128, 32 * 16), "lean");
    assert_eq!(path(16, 32, 8, 64, 16 * 64), "lean");
    // Longer: unsplit while the whole table fits two standard tiles (128 tokens at head_dim
    // 128), split beyond.
    assert_eq!(path(1, 32, 8, 128, 64), "whole");
    assert_eq!(path(1, 32, 8, 128, 128), "whole");
    assert_eq!(path(1, 32, 8, 128, 256), "split");
    assert_eq!(path(16, 32, 8, 128, 16 * 48), "split");
    assert_eq!(path(1, 32, 8, 64, 256), "whole");
    assert_eq!(path(1, 32, 8, 64, 512), "split");
    // Without the lean kernel, or with the lean kernel turned off, short batches run whole.
    let desc = decode_desc(ElementKind::F16, 4, 32, 8, 128);
    let cfg = DecodeConfig::choose(&desc, &H200, usize::MAX).unwrap();
    assert_eq!(cfg.path(&desc, 4, None).name(), "whole");
    // f32 has no lean kernel and keeps the chunk rule.
    let desc = decode_desc(ElementKind::F32, 1, 32, 8, 128);
    let cfg = DecodeConfig::choose(&desc, &H200, usize::MAX).unwrap();
    assert_eq!(cfg.unsplit_max_tokens(), 0);
    // Past a wave: lean up to 256 tokens per request, whatever the tile; over the scheduled
    // partition from four lean waves (2112 CTAs at head_dim 128, group 4) when no KV heads stack.
    assert_eq!(path(64, 32, 8, 128, 64 * 256), "lean");
    assert_eq!(path(264, 32, 8, 128, 264 * 256), "lean-scheduled");
    assert_eq!(path(1024, 32, 8, 128, 1024 * 256), "lean-scheduled");
    assert_eq!(path(1024, 32, 8, 128, 1024 * 272), "scheduled");
    // Past 32 requests: every CTA derives a spare-chunk partition up to 64 requests (48 × 1500
    // tokens of 28/4 heads: one split, 47 spare chunks); fixed splits (40 × 1k of 32/8 heads:
    // three per request) and larger batches read the schedule kernel's.
    let split_of = |b: i32, hq: i32, hkv: i32, len: usize| {
        let desc = decode_desc(ElementKind::F16, b, hq, hkv, 128);
        let cfg = DecodeConfig::choose(&desc, &H200, usize::MAX).unwrap();
        (cfg.num_splits, cfg.path(&desc, b as usize * len.div_ceil(16), Some(LEAN_MAX_AVG_TOKENS)).name())
    };
    assert_eq!(split_of(48, 28, 4, 1500), (1, "split"));
    assert_eq!(split_of(64, 32, 8, 512), (1, "split"));
    assert_eq!(split_of(40, 32, 8, 1024), (3, "scheduled"));
    assert_eq!(split_of(96, 32, 4, 1024), (2, "scheduled"));
    assert_eq!(split_of(128, 32, 8, 1024), (1, "scheduled"));
}

/// A bound on the longest request ([`DecodeConfig::path_within`]): the split and scheduled paths
/// become the whole one while the bound keeps every request within two standard tiles (where the
/// partition would not split any), and nothing else changes.
#[test]
fn path_within_a_bound_on_the_longest_request() {
    let within = |b: i32, d: i32, table_tokens: usize, bound: Option<u32>| {
        let desc = decode_desc(ElementKind::F16, b, 32, 8, d);
        let cfg = DecodeConfig::choose(&desc, &H200, usize::MAX).unwrap();
        let unbounded = cfg.path(&desc, table_tokens / 16, Some(LEAN_MAX_AVG_TOKENS));
        assert_eq!(cfg.path_within(&desc, table_tokens / 16, Some(LEAN_MAX_AVG_TOKENS), None), unbounded);
        (unbounded.name(), cfg.path_within(&desc, table_tokens / 16, Some(LEAN_MAX_AVG_TOKENS), bound).name())
    };
    // 16 requests of 64 and 128 tokens at head_dim 128 (tiles of 64): split unbounded, whole
    // under a bound of up to 128 tokens, split above it.
    assert_eq!(within(16, 128, 16 * 64, Some(64)), ("split", "whole"));
    assert_eq!(within(16, 128, 16 * 128, Some(128)), ("split", "whole"));
    assert_eq!(within(16, 128, 16 * 128, Some(129)), ("split", "split"));
    assert_eq!(within(16, 128, 16 * 64, Some(0)), ("split", "whole"));
    // Head_dim 64 (tiles of 128): up to 256 tokens.
    assert_eq!(within(16, 64, 16 * 256, Some(256)), ("split", "whole"));
    assert_eq!(within(16, 64, 16 * 256, Some(257)), ("split", "split"));
    // The scheduled path (40 requests of 1k: three splits) as well; a bound that is too low
    // for the table still only picks the path.
    assert_eq!(within(40, 128, 40 * 1024, Some(100)), ("scheduled", "whole"));
    assert_eq!(within(40, 128, 40 * 1024, Some(1024)), ("scheduled", "scheduled"));
    // The lean, lean-scheduled and whole paths keep theirs.
    assert_eq!(within(16, 128, 16 * 32, Some(32)), ("lean", "lean"));
    assert_eq!(within(264, 128, 264 * 256, Some(100)), ("lean-scheduled", "lean-scheduled"));
    assert_eq!(within(1, 128, 128, Some(128)), ("whole", "whole"));
    // f32 (no tiles to keep whole: `unsplit_max_tokens` is 0) stays split under any bound but 0.
    let desc = decode_desc(ElementKind::F32, 2, 32, 8, 128);
    let cfg = DecodeConfig::choose(&desc, &H200, usize::MAX).unwrap();
    let split = cfg.path(&desc, 2 * 4096 / 16, None);
    assert_eq!(split, DecodePath::Split);
    assert_eq!(cfg.path_within(&desc, 2 * 4096 / 16, None, Some(1)), DecodePath::Split);
    assert_eq!(cfg.path_within(&desc, 2 * 4096 / 16, None, Some(0)), DecodePath::Whole);
}

/// The lean kernel over the scheduled partition: from four lean waves of unstacked CTAs, with
/// four lean waves' worth of spare chunks (at least a quarter of a CTA slot's share of the
/// tokens per chunk, so equal lengths stay whole), within the workspace limit, 16-bit caches only.
#[test]
fn lean_scheduled_by_rule() {
    let choose = |element, b: i32, hq: i32, hkv: i32, d: i32, max_workspace_bytes| {
        let desc = decode_desc(element, b, hq, hkv, d);
        (DecodeConfig::choose(&desc, &H200, max_workspace_bytes).unwrap(), desc)
    };
    let path = |element, b: i32, hq: i32, hkv: i32, d: i32, tokens: usize| {
        let (cfg, desc) = choose(element, b, hq, hkv, d, usize::MAX);
        cfg.path(&desc, tokens / 16, Some(LEAN_MAX_AVG_TOKENS))
    };
    // The ragged scale row (2048 requests averaging 200 tokens, the longest 10 540): four lean
    // waves of 66 chunks (528 CTAs of 8 KV heads) of spare chunks, and a partition whose chunks
    // are at least 410 620 / 264 tokens long.
    let (cfg, desc) = choose(ElementKind::F16, 2048, 32, 8, 128, usize::MAX);
    assert_eq!(cfg.lean_spare_chunks, 4 * 66);
    assert_eq!(cfg.path(&desc, 410_620 / 16 + 2048, Some(LEAN_MAX_AVG_TOKENS)), DecodePath::LeanScheduled);
    let partition = cfg.partition(&desc, DecodePath::LeanScheduled);
    assert_eq!((partition.num_chunks, partition.balance_chunks, partition.min_chunk), (2048 + 264, 264, 32));
    // The standard kernel's partition is the configuration's, whatever the lean one.
    assert_eq!(cfg.partition(&desc, DecodePath::Scheduled).num_chunks, cfg.num_chunks(&desc));
    // The workspace holds the larger partition's partials and the lean launch's split state.
    let without = DecodeConfig { lean_spare_chunks: 0, ..cfg };
    assert!(cfg.workspace_size(&desc) > without.workspace_size(&desc));
    // Too small a workspace for the lean partition: the plain lean kernel.
    let (small, desc) = choose(ElementKind::F16, 2048, 32, 8, 128, without.workspace_size(&desc));
    assert_eq!(small.lean_spare_chunks, 0);
    assert_eq!(small.path(&desc, 2048 * 200 / 16, Some(LEAN_MAX_AVG_TOKENS)), DecodePath::Lean);
    // Below four lean waves, or with stacked KV heads, or over an 8-bit cache: the lean kernel.
    assert_eq!(path(ElementKind::F16, 263, 32, 8, 128, 263 * 200), DecodePath::Lean);
    assert_eq!(path(ElementKind::F16, 264, 32, 8, 128, 264 * 200), DecodePath::LeanScheduled);
    assert_eq!(path(ElementKind::BF16, 4096, 32, 8, 64, 4096 * 200), DecodePath::LeanScheduled);
    assert_eq!(path(ElementKind::F16, 16384, 32, 8, 128, 16384 * 64), DecodePath::Lean);
    assert_eq!(path(ElementKind::E4M3, 4096, 32, 8, 128, 4096 * 200), DecodePath::Lean);
    assert_eq!(choose(ElementKind::E4M3, 4096, 32, 8, 128, usize::MAX).0.lean_spare_chunks, 0);
    // Equal lengths stay whole: the least chunk is at least the average length.
    for (b, len) in [(264u64, 256u64), (1024, 130), (4096, 256), (16384, 200)] {
        let (cfg, desc) = choose(ElementKind::F16, b as i32, 32, 8, 128, usize::MAX);
        let partition = cfg.partition(&desc, DecodePath::LeanScheduled);
        assert!((b * len).div_ceil(partition.balance_chunks as u64) >= len, "{b} × {len}");
    }
}

/// The variant suite's stacked edge case (batch 1200 of ≤ 22 tokens, 16/4 heads) stacks all four
/// KV heads.
#[test]
fn variant_edge_case_stacks() {
    let desc = decode_desc(ElementKind::F16, 1200, 16, 4, 128);
    let lean = DecodeConfig::choose(&desc, &H200, usize::MAX).unwrap().lean.unwrap();
    let tokens: u64 = (0..1200u64).map(|i| ((i * 7) % 23).div_ceil(16) * 16).sum();
    assert_eq!(1u32 << lean.stack_shift(&desc, tokens, u32::MAX), 4);
}
