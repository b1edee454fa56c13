//! The float64 CPU reference through the public API: hand-computed and naive-softmax results,
//! invariances, element types, append/decode consistency, ragged batches, and typed errors for
//! inconsistent input and page tables.

use std::f64::consts::LN_2;

use half::{bf16, f16};
use paged_decode::fp8::{f32_to_fp8, fp8_to_f32};
use paged_decode::page_table::{PageTableRules, validate_page_table};
use paged_decode::reference::{
    AttentionVariant, DecodeOutput, KvScales, KvView, PageTable, append, append_fp8, decode, decode_fp8,
    decode_strided, decode_variant,
};
use paged_decode::{
    BatchPagedDecodeDescriptor, Element, ElementKind, Error, PagedKvAppendDescriptor, PagedKvCacheDescriptor,
    Result,
};
use rand::rngs::SmallRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};

/// `n` values uniform in `[-amplitude, amplitude)`.
fn random_values<T: Element>(rng: &mut SmallRng, n: usize, amplitude: f64) -> Vec<T> {
    (0..n).map(|_| T::from_f64(amplitude * rng.random_range(-1.0..1.0))).collect()
}

/// Element offset of the row of `slot` in `page` for KV head `h` in an HND store.
fn store_row(kv: &PagedKvCacheDescriptor, page: usize, h: usize, slot: usize) -> usize {
    let (kv_heads, page_size, head_dim) =
        (kv.num_kv_heads as usize, kv.page_size as usize, kv.head_dim as usize);
    ((page * kv_heads + h) * page_size + slot) * head_dim
}

// One decode problem with random data over a shuffled store.

fn kv_desc(element: ElementKind, ps: usize, pages: usize, hkv: usize, d: usize) -> PagedKvCacheDescriptor {
    PagedKvCacheDescriptor {
        page_size: ps as i32,
        num_total_pages: pages as i32,
        num_kv_heads: hkv as i32,
        head_dim: d as i32,
        element,
    }
}

/// A decode problem with owned data.
struct Case<T> {
    desc: BatchPagedDecodeDescriptor,
    q: Vec<T>,
    k: Vec<T>,
    v: Vec<T>,
    indptr: Vec<i32>,
    indices: Vec<i32>,
    last: Vec<i32>,
}

impl<T: Element> Case<T> {
    fn table(&self) -> PageTable<'_> {
        PageTable { indptr: &self.indptr, indices: &self.indices, last_page_len: &self.last }
    }
    fn decode(&self) -> DecodeOutput {
        decode(&self.desc, &self.q, &self.k, &self.v, self.table()).unwrap()
    }
    fn kv(&self) -> PagedKvCacheDescriptor {
        self.desc.paged_kv
    }
    fn d(&self) -> usize {
        self.kv().head_dim as usize
    }
    fn hq(&self) -> usize {
        self.desc.num_qo_heads as usize
    }
    fn group(&self) -> usize {
        self.hq() / self.kv().num_kv_heads as usize
    }
    /// The K and V rows of request `b`, KV head `h`, token `t`.
    fn kv_row(&self, b: usize, h: usize, t: usize) -> (&[T], &[T]) {
        let (kv, d) = (self.kv(), self.d());
        let ps = kv.page_size as usize;
        let page = self.indices[self.indptr[b] as usize + t / ps] as usize;
        let r = store_row(&kv, page, h, t % ps);
        (&self.k[r..r + d], &self.v[r..r + d])
    }
    fn logit(&self, b: usize, qh: usize, t: usize) -> f64 {
        let d = self.d();
        let q = &self.q[(b * self.hq() + qh) * d..][..d];
        let (k, _) = self.kv_row(b, qh / self.group(), t);
        f64::from(self.desc.sm_scale) * q.iter().zip(k).map(|(x, y)| x.to_f64() * y.to_f64()).sum::<f64>()
    }
}

/// Random data for requests of the given lengths; pages are spread over a shuffled store
/// with `spare` unused pages.
fn random_case<T: Element>(
    rng: &mut SmallRng,
    lens: &[usize],
    hq: usize,
    hkv: usize,
    d: usize,
    ps: usize,
    spare: usize,
) -> Case<T> {
    let pages_per: Vec<usize> = lens.iter().map(|&l| l.div_ceil(ps)).collect();
    let used: usize = pages_per.iter().sum();
    let total = used + spare;
    let mut ids: Vec<i32> = (0..total as i32).collect();
    ids.shuffle(rng);
    let mut indptr = vec![0];
    let mut last = Vec::new();
    for (&l, &n) in lens.iter().zip(&pages_per) {
        indptr.push(indptr.last().unwrap() + n as i32);
        last.push(if n == 0 { 0 } else { (l - (n - 1) * ps) as i32 });
    }
    ids.truncate(used);
    let batch = lens.len();
    let store = total * hkv * ps * d;
    Case {
        desc: BatchPagedDecodeDescriptor {
            batch_size: batch as i32,
            num_qo_heads: hq as i32,
            sm_scale: 1.0 / (d as f32).sqrt(),
            paged_kv: kv_desc(T::KIND, ps, total, hkv, d),
        },
        q: random_values(rng, batch * hq * d, 2.0),
        k: random_values(rng, store, 2.0),
        v: random_values(rng, store, 1.0),
        indptr,
        indices: ids,
        last,
    }
}

fn close(a: f64, b: f64, tol: f64) -> bool {
    (a - b).abs() <= tol * (1.0 + b.abs())
}

#[test]
fn hand_computed_two_tokens() {
    // D = 64, q = 1/8, sm_scale = 1/8: k0 = 1 gives s0 = 1, k1 = 0 gives s1 = 0.
    // v0[i] = i, v1[i] = -i  =>  o[i] = i (e - 1) / (e + 1), lse = log2(e + 1).
    fn run<T: Element>() {
        let d = 64;
        let ps = 4;
        let mut k = vec![T::from_f64(0.0); 2 * ps * d];
        let mut v = k.clone();
        // The request uses page 1 of a 2-page store.
        for i in 0..d {
            k[ps * d + i] = T::from_f64(1.0);
            v[ps * d + i] = T::from_f64(i as f64);
            v[(ps + 1) * d + i] = T::from_f64(-(i as f64));
        }
        let desc = BatchPagedDecodeDescriptor {
            batch_size: 1,
            num_qo_heads: 1,
            sm_scale: 0.125,
            paged_kv: kv_desc(T::KIND, ps, 2, 1, d),
        };
        let q = vec![T::from_f64(0.125); d];
        let table = PageTable { indptr: &[0, 1], indices: &[1], last_page_len: &[2] };
        let out = decode(&desc, &q, &k, &v, table).unwrap();
        let e = std::f64::consts::E;
        for (i, &o) in out.o.iter().enumerate() {
            let want = i as f64 * (e - 1.0) / (e + 1.0);
            assert!((o - want).abs() < 1e-12, "o[{i}] = {o}, want {want}");
        }
        assert!((out.lse[0] - (e + 1.0).log2()).abs() < 1e-12, "lse = {}", out.lse[0]);
    }
    run::<f32>();
    run::<f16>();
    run::<bf16>();
}

#[test]
fn matches_naive_softmax() {
    let mut rng = SmallRng::seed_from_u64(1);
    let c = random_case::<f32>(&mut rng, &[37, 1, 0, 64, 5], 8, 2, 32, 16, 3);
    let out = c.decode();
    let d = c.d();
    for b in 0..c.indptr.len() - 1 {
        let len = c.table().request_len(b, c.kv().page_size as usize);
        for qh in 0..c.hq() {
            let s: Vec<f64> = (0..len).map(|t| c.logit(b, qh, t)).collect();
            let z: f64 = s.iter().map(|x| x.exp()).sum();
            let lse = out.lse[b * c.hq() + qh];
            if len == 0 {
                assert_eq!(lse, f64::NEG_INFINITY);
            } else {
                assert!(close(lse, z.ln() / LN_2, 1e-12), "lse {lse} vs {}", z.log2());
            }
            for i in 0..d {
                let want: f64 =
                    (0..len).map(|t| s[t].exp() / z * c.kv_row(b, qh / c.group(), t).1[i].to_f64()).sum();
                let got = out.o[(b * c.hq() + qh) * d + i];
                assert!(close(got, want, 1e-12), "o[{b},{qh},{i}] = {got}, want {want}");
            }
        }
    }
}

#[test]
fn output_in_convex_hull_and_lse_bounds() {
    let mut rng = SmallRng::seed_from_u64(2);
    for _ in 0..5 {
        let lens: Vec<usize> = (0..4).map(|_| 1 + rng.random_range(0..90)).collect();
        let c = random_case::<f16>(&mut rng, &lens, 4, 4, 64, 16, 2);
        let out = c.decode();
        let d = c.d();
        for (b, &len) in lens.iter().enumerate() {
            for qh in 0..c.hq() {
                let h = qh / c.group();
                for i in 0..d {
                    let vs = (0..len).map(|t| c.kv_row(b, h, t).1[i].to_f64());
                    let lo = vs.clone().fold(f64::INFINITY, f64::min);
                    let hi = vs.fold(f64::NEG_INFINITY, f64::max);
                    let o = out.o[(b * c.hq() + qh) * d + i];
                    assert!(o >= lo - 1e-12 && o <= hi + 1e-12, "o = {o} outside [{lo}, {hi}]");
                }
                let m = (0..len).map(|t| c.logit(b, qh, t)).fold(f64::NEG_INFINITY, f64::max) / LN_2;
                let lse = out.lse[b * c.hq() + qh];
                assert!(lse >= m - 1e-12 && lse <= m + (len as f64).log2() + 1e-12);
            }
        }
    }
}

#[test]
fn equal_logits_give_mean_and_log2_n() {
    let mut rng = SmallRng::seed_from_u64(3);
    let mut c = random_case::<f32>(&mut rng, &[50, 3], 2, 1, 16, 8, 0);
    // One key row everywhere: every logit of a head is the same s.
    let k0: Vec<f32> = c.k[..16].to_vec();
    for row in c.k.chunks_exact_mut(16) {
        row.copy_from_slice(&k0);
    }
    let out = c.decode();
    for (b, len) in [(0, 50), (1, 3)] {
        for qh in 0..2 {
            let s = c.logit(b, qh, 0);
            let lse = out.lse[b * 2 + qh];
            assert!(close(lse, (len as f64).log2() + s / LN_2, 1e-12));
            for i in 0..16 {
                let mean = (0..len).map(|t| c.kv_row(b, 0, t).1[i].to_f64()).sum::<f64>() / len as f64;
                assert!(close(out.o[(b * 2 + qh) * 16 + i], mean, 1e-12));
            }
        }
    }
    // q = 0: all logits 0, lse = log2(n).
    c.q.iter_mut().for_each(|x| *x = 0.0);
    let out = c.decode();
    assert!(close(out.lse[0], 50f64.log2(), 1e-14));
    assert!(close(out.lse[3], 3f64.log2(), 1e-14));
}

#[test]
fn single_token_returns_its_value() {
    let mut rng = SmallRng::seed_from_u64(4);
    let c = random_case::<bf16>(&mut rng, &[1, 1, 1], 6, 3, 128, 4, 1);
    let out = c.decode();
    for b in 0..3 {
        for qh in 0..6 {
            let (_, v) = c.kv_row(b, qh / 2, 0);
            let o = &out.o[(b * 6 + qh) * 128..][..128];
            assert!(o.iter().zip(v).all(|(o, v)| *o == v.to_f64()));
            // log2(exp(s)) = s / ln 2.
            assert!(close(out.lse[b * 6 + qh], c.logit(b, qh, 0) / LN_2, 1e-14));
        }
    }
}

#[test]
fn zero_length_requests() {
    let mut rng = SmallRng::seed_from_u64(5);
    let mut c = random_case::<f16>(&mut rng, &[0, 9, 0], 2, 2, 64, 4, 1);
    // A request owning one page with last_page_len 0 is also empty.
    c.indptr = vec![0, 1, 4, 4];
    c.indices = vec![3, 0, 2, 1];
    c.last = vec![0, 1, 3];
    let out = c.decode();
    for b in [0, 2] {
        assert!(out.o[b * 2 * 64..(b + 1) * 2 * 64].iter().all(|&x| x == 0.0));
        assert!(out.lse[b * 2..b * 2 + 2].iter().all(|&x| x == f64::NEG_INFINITY));
    }
    assert!(out.lse[2..4].iter().all(|x| x.is_finite()));
    // An empty batch.
    let mut e = random_case::<f16>(&mut rng, &[], 2, 2, 64, 4, 2);
    e.desc.batch_size = 0;
    let out = e.decode();
    assert!(out.o.is_empty() && out.lse.is_empty());
}

#[test]
fn page_permutation_invariance() {
    let mut rng = SmallRng::seed_from_u64(6);
    let c = random_case::<f32>(&mut rng, &[33, 7, 16, 0, 64], 4, 2, 64, 8, 5);
    let total = c.kv().num_total_pages as usize;
    let page_elems = c.k.len() / total;
    let mut perm: Vec<usize> = (0..total).collect();
    perm.shuffle(&mut rng);
    let mut k = c.k.clone();
    let mut v = c.v.clone();
    for (p, &np) in perm.iter().enumerate() {
        k[np * page_elems..(np + 1) * page_elems].copy_from_slice(&c.k[p * page_elems..(p + 1) * page_elems]);
        v[np * page_elems..(np + 1) * page_elems].copy_from_slice(&c.v[p * page_elems..(p + 1) * page_elems]);
    }
    let indices: Vec<i32> = c.indices.iter().map(|&p| perm[p as usize] as i32).collect();
    let permuted =
        Case { k, v, indices, q: c.q.clone(), indptr: c.indptr.clone(), last: c.last.clone(), ..c };
    assert_eq!(c.decode(), permuted.decode());
}

/// The same problem with every value converted to `B` (exact when `B` is wider).
fn convert<A: Element, B: Element>(c: &Case<A>) -> Case<B> {
    let conv = |x: &[A]| -> Vec<B> { x.iter().map(|v| B::from_f64(v.to_f64())).collect() };
    Case {
        desc: BatchPagedDecodeDescriptor {
            paged_kv: PagedKvCacheDescriptor { element: B::KIND, ..c.kv() },
            ..c.desc
        },
        q: conv(&c.q),
        k: conv(&c.k),
        v: conv(&c.v),
        indptr: c.indptr.clone(),
        indices: c.indices.clone(),
        last: c.last.clone(),
    }
}

#[test]
fn element_types_agree_on_equal_values() {
    let mut rng = SmallRng::seed_from_u64(8);
    let c16 = random_case::<f16>(&mut rng, &[20, 3, 0, 41], 8, 4, 64, 16, 1);
    assert_eq!(c16.decode(), convert::<_, f32>(&c16).decode());
    let cb = random_case::<bf16>(&mut rng, &[1, 30, 17], 4, 1, 128, 8, 0);
    assert_eq!(cb.decode(), convert::<_, f32>(&cb).decode());
    // Rounding to a narrower type changes the result only slightly.
    let narrow = convert::<_, f16>(&convert::<_, f32>(&cb)).decode();
    let wide = cb.decode();
    assert!(narrow.o.iter().zip(&wide.o).all(|(a, b)| (a - b).abs() < 1e-2));
}

#[test]
fn decode_rejects_inconsistent_input() {
    let mut rng = SmallRng::seed_from_u64(9);
    let c = random_case::<f16>(&mut rng, &[5, 9], 4, 2, 64, 4, 1);
    let problem = |r: Result<DecodeOutput>| assert!(matches!(r, Err(Error::InvalidProblem(_))), "{r:?}");
    let run = |desc: &BatchPagedDecodeDescriptor| decode(desc, &c.q, &c.k, &c.v, c.table());
    problem(decode(&c.desc, &c.q[1..], &c.k, &c.v, c.table()));
    problem(decode(&c.desc, &c.q, &c.k[1..], &c.v, c.table()));
    problem(decode(&c.desc, &c.q, &c.k, &c.v[1..], c.table()));
    problem(run(&BatchPagedDecodeDescriptor { num_qo_heads: 3, ..c.desc }));
    problem(run(&BatchPagedDecodeDescriptor { num_qo_heads: 0, ..c.desc }));
    problem(run(&BatchPagedDecodeDescriptor { batch_size: -1, ..c.desc }));
    problem(run(&BatchPagedDecodeDescriptor { sm_scale: f32::NAN, ..c.desc }));
    let kv = c.kv();
    for bad in [
        PagedKvCacheDescriptor { element: ElementKind::BF16, ..kv },
        PagedKvCacheDescriptor { page_size: 0, ..kv },
        PagedKvCacheDescriptor { head_dim: 0, ..kv },
        PagedKvCacheDescriptor { num_kv_heads: 0, ..kv },
        PagedKvCacheDescriptor { num_total_pages: -1, ..kv },
        PagedKvCacheDescriptor { num_total_pages: i32::MAX, head_dim: i32::MAX, ..kv },
    ] {
        problem(run(&BatchPagedDecodeDescriptor { paged_kv: bad, ..c.desc }));
    }
    // Sinks are finite or -inf (no sink); NaN and +inf are refused.
    for bad in [f32::NAN, f32::INFINITY] {
        let sinks = [0.5, bad, -1.0, f32::NEG_INFINITY];
        let variant = AttentionVariant { logits_soft_cap: None, window_left: None, sinks: Some(&sinks) };
        problem(decode_variant(&c.desc, variant, &c.q, &c.k, &c.v, c.table()));
    }
    let bad_page = [c.indices[0], 1000, c.indices[2], c.indices[3], c.indices[4]];
    let r = decode(&c.desc, &c.q, &c.k, &c.v, PageTable { indices: &bad_page, ..c.table() });
    assert!(matches!(r, Err(Error::InvalidPageTable(ref m)) if m.contains("indices[1] = 1000")), "{r:?}");
}

#[test]
fn garbage_tables_never_panic() {
    let mut rng = SmallRng::seed_from_u64(10);
    let c = random_case::<f32>(&mut rng, &[5, 9, 2], 2, 1, 8, 4, 2);
    let vals = [i32::MIN, -1, 0, 1, 2, 3, 4, 5, 6, i32::MAX];
    for _ in 0..3000 {
        let mut pick =
            |n: usize| -> Vec<i32> { (0..n).map(|_| vals[rng.random_range(0..vals.len())]).collect() };
        let mut indptr = pick(4);
        indptr[0] = 0;
        let indices = pick(6);
        let last = pick(3);
        let t = PageTable { indptr: &indptr, indices: &indices, last_page_len: &last };
        match decode(&c.desc, &c.q, &c.k, &c.v, t) {
            Ok(out) => assert!(out.lse.iter().all(|x| !x.is_nan())),
            Err(e) => assert!(matches!(e, Error::InvalidPageTable(_))),
        }
        let ad = PagedKvAppendDescriptor { batch_size: 3, paged_kv: c.kv() };
        let (mut k, mut v) = (c.k.clone(), c.v.clone());
        let r = append(&ad, &c.k[..24], &c.v[..24], &mut k, &mut v, t);
        assert!(matches!(r, Ok(()) | Err(Error::InvalidPageTable(_))), "{r:?}");
        if r.is_err() {
            assert!(k == c.k && v == c.v);
        }
    }
}

#[test]
fn append_writes_one_slot_per_request_and_head() {
    fn run<T: Element + PartialEq>(seed: u64) {
        let mut rng = SmallRng::seed_from_u64(seed);
        let (hkv, d, ps, total) = (3, 64, 4, 12);
        // Request 0: 2 pages, new token in slot 2; request 1: fresh page, slot 0;
        // request 2: full last page.
        let indptr = [0, 2, 3, 5];
        let indices = [7, 2, 9, 0, 11];
        let last = [3, 1, 4];
        let table = PageTable { indptr: &indptr, indices: &indices, last_page_len: &last };
        let desc = PagedKvAppendDescriptor { batch_size: 3, paged_kv: kv_desc(T::KIND, ps, total, hkv, d) };
        let store = total * hkv * ps * d;
        let k0: Vec<T> = random_values(&mut rng, store, 1.0);
        let v0: Vec<T> = random_values(&mut rng, store, 1.0);
        let key: Vec<T> = random_values(&mut rng, 3 * hkv * d, 1.0);
        let value: Vec<T> = random_values(&mut rng, 3 * hkv * d, 1.0);
        let (mut k, mut v) = (k0.clone(), v0.clone());
        append(&desc, &key, &value, &mut k, &mut v, table).unwrap();
        let mut expect_k = k0.clone();
        let mut expect_v = v0.clone();
        for (b, (page, slot)) in [(2, 2), (9, 0), (11, 3)].into_iter().enumerate() {
            for h in 0..hkv {
                let r = store_row(&desc.paged_kv, page, h, slot);
                let s = (b * hkv + h) * d;
                expect_k[r..r + d].copy_from_slice(&key[s..s + d]);
                expect_v[r..r + d].copy_from_slice(&value[s..s + d]);
            }
        }
        assert!(k == expect_k && v == expect_v);
        let changed = k.iter().zip(&k0).filter(|(a, b)| a != b).count();
        assert!(changed <= 3 * hkv * d && changed > 3 * hkv * d / 2);
    }
    run::<f16>(11);
    run::<bf16>(12);
    run::<f32>(13);
}

#[test]
fn append_rejects_unadvanced_or_conflicting_tables() {
    let (hkv, d, ps, total) = (1, 8, 4, 4);
    let desc =
        PagedKvAppendDescriptor { batch_size: 2, paged_kv: kv_desc(ElementKind::F32, ps, total, hkv, d) };
    let k0 = vec![0.5f32; total * hkv * ps * d];
    let tok = vec![1.0f32; 2 * hkv * d];
    let try_append = |indptr: &[i32], indices: &[i32], last: &[i32]| {
        let (mut k, mut v) = (k0.clone(), k0.clone());
        let t = PageTable { indptr, indices, last_page_len: last };
        let r = append(&desc, &tok, &tok, &mut k, &mut v, t);
        assert!(r.is_ok() || (k == k0 && v == k0));
        r
    };
    let table_err = |r: Result<()>, part: &str| match r {
        Err(Error::InvalidPageTable(m)) => assert!(m.contains(part), "{m:?} lacks {part:?}"),
        other => panic!("expected InvalidPageTable, got {other:?}"),
    };
    try_append(&[0, 1, 2], &[0, 1], &[1, 4]).unwrap();
    // A request without pages appends nothing, whatever its last_page_len: request 0's token
    // alone lands (slot 2 of page 3), and request 1's rows are not read.
    let mut nan_tok = tok.clone();
    nan_tok[hkv * d..].fill(f32::NAN);
    let (mut k, mut v) = (k0.clone(), k0.clone());
    let t = PageTable { indptr: &[0, 1, 1], indices: &[3], last_page_len: &[3, 0] };
    append(&desc, &nan_tok, &nan_tok, &mut k, &mut v, t).unwrap();
    let row = (3 * hkv * ps + 2) * d;
    for (i, (&got, &was)) in k.iter().zip(&k0).enumerate() {
        assert_eq!(got, if (row..row + d).contains(&i) { 1.0 } else { was }, "k[{i}]");
    }
    assert!(v == k);
    table_err(try_append(&[0, 1, 2], &[0, 1], &[0, 1]), "last_page_len[0] = 0");
    table_err(try_append(&[0, 1, 2], &[3, 3], &[2, 2]), "slot 1 of page 3");
    // Same page, different slots: request 1 counts slot 0, which request 0 writes.
    table_err(try_append(&[0, 1, 2], &[3, 3], &[1, 2]), "request 0 appends to slot 0 of page 3");
    table_err(try_append(&[0, 1, 2], &[0, 1], &[1, 5]), "last_page_len[1] = 5");
    let mut k = k0.clone();
    let mut v = k0.clone();
    let t = PageTable { indptr: &[0, 1, 2], indices: &[0, 1], last_page_len: &[1, 1] };
    let r = append(&desc, &tok[1..], &tok, &mut k, &mut v, t);
    assert!(matches!(r, Err(Error::InvalidProblem(_))));
    let r = append(&desc, &tok, &tok, &mut k[1..], &mut v, t);
    assert!(matches!(r, Err(Error::InvalidProblem(_))));
    let f16_desc = PagedKvAppendDescriptor {
        paged_kv: PagedKvCacheDescriptor { element: ElementKind::F16, ..desc.paged_kv },
        ..desc
    };
    let r = append(&f16_desc, &tok, &tok, &mut k, &mut v, t);
    assert!(matches!(r, Err(Error::InvalidProblem(_))));
}

#[test]
fn request_len_follows_kernel_reading() {
    let t = PageTable { indptr: &[0, 0, 3, 2, 4], indices: &[], last_page_len: &[5, 7, 1, 99] };
    assert_eq!(t.request_len(0, 16), 0);
    assert_eq!(t.request_len(1, 16), 2 * 16 + 7);
    assert_eq!(t.request_len(2, 16), 0);
    assert_eq!(t.request_len(3, 16), 16 + 16);
}

// Requests as token sequences, laid out in pages and advanced by appends.

/// Per-request K and V sequences, each `[tokens, kv_heads, head_dim]`.
struct Sequences<T> {
    kv_heads: usize,
    head_dim: usize,
    k: Vec<Vec<T>>,
    v: Vec<Vec<T>>,
}

impl<T: Element> Sequences<T> {
    fn random(rng: &mut SmallRng, lens: &[usize], kv_heads: usize, head_dim: usize) -> Self {
        let row = kv_heads * head_dim;
        Self {
            kv_heads,
            head_dim,
            k: lens.iter().map(|&l| random_values(rng, l * row, 2.0)).collect(),
            v: lens.iter().map(|&l| random_values(rng, l * row, 2.0)).collect(),
        }
    }
    fn len(&self, b: usize) -> usize {
        self.k[b].len() / (self.kv_heads * self.head_dim)
    }
    fn batch(&self) -> usize {
        self.k.len()
    }
}

/// A paged store with its page table.
struct Paged<T> {
    kv: PagedKvCacheDescriptor,
    k: Vec<T>,
    v: Vec<T>,
    indptr: Vec<i32>,
    indices: Vec<i32>,
    last: Vec<i32>,
}

impl<T: Element> Paged<T> {
    /// Lays `seqs` out in pages of `page_size`, the pages shuffled over a store with `spare` extra
    /// (zeroed) pages.
    fn build(rng: &mut SmallRng, seqs: &Sequences<T>, page_size: usize, spare: usize) -> Self {
        let (h, d) = (seqs.kv_heads, seqs.head_dim);
        let pages: Vec<usize> = (0..seqs.batch()).map(|b| seqs.len(b).div_ceil(page_size)).collect();
        let used: usize = pages.iter().sum();
        let total = used + spare;
        let mut ids: Vec<i32> = (0..total as i32).collect();
        ids.shuffle(rng);
        ids.truncate(used);
        let mut p = Paged {
            kv: PagedKvCacheDescriptor {
                page_size: page_size as i32,
                num_total_pages: total as i32,
                num_kv_heads: h as i32,
                head_dim: d as i32,
                element: T::KIND,
            },
            k: vec![T::default(); total * h * page_size * d],
            v: vec![T::default(); total * h * page_size * d],
            indptr: vec![0],
            indices: ids,
            last: Vec::new(),
        };
        for (b, &n) in pages.iter().enumerate() {
            let first = *p.indptr.last().unwrap() as usize;
            p.indptr.push((first + n) as i32);
            p.last.push(if n == 0 { 0 } else { (seqs.len(b) - (n - 1) * page_size) as i32 });
            for t in 0..seqs.len(b) {
                let page = p.indices[first + t / page_size] as usize;
                for hh in 0..h {
                    let dst = store_row(&p.kv, page, hh, t % page_size);
                    let src = (t * h + hh) * d;
                    p.k[dst..dst + d].copy_from_slice(&seqs.k[b][src..src + d]);
                    p.v[dst..dst + d].copy_from_slice(&seqs.v[b][src..src + d]);
                }
            }
        }
        p
    }

    fn table(&self) -> PageTable<'_> {
        PageTable { indptr: &self.indptr, indices: &self.indices, last_page_len: &self.last }
    }

    fn decode(&self, q: &[T], num_qo_heads: usize) -> DecodeOutput {
        let desc = BatchPagedDecodeDescriptor {
            batch_size: self.last.len() as i32,
            num_qo_heads: num_qo_heads as i32,
            sm_scale: 1.0 / (self.kv.head_dim as f32).sqrt(),
            paged_kv: self.kv,
        };
        decode(&desc, q, &self.k, &self.v, self.table()).unwrap()
    }

    /// Advances the page table by one token per request, taking new pages from `free`.
    fn advance(&mut self, free: &mut Vec<i32>) {
        let ps = self.kv.page_size;
        let batch = self.last.len();
        let mut indices = Vec::new();
        let mut indptr = vec![0];
        for b in 0..batch {
            let (start, stop) = (self.indptr[b] as usize, self.indptr[b + 1] as usize);
            indices.extend_from_slice(&self.indices[start..stop]);
            if stop == start || self.last[b] == ps {
                indices.push(free.pop().expect("no free page"));
                self.last[b] = 1;
            } else {
                self.last[b] += 1;
            }
            indptr.push(indices.len() as i32);
        }
        self.indices = indices;
        self.indptr = indptr;
    }
}

fn assert_same(a: &DecodeOutput, b: &DecodeOutput, tol: f64) {
    assert_eq!(a.o.len(), b.o.len());
    assert_eq!(a.lse.len(), b.lse.len());
    for (i, (x, y)) in a.o.iter().zip(&b.o).enumerate() {
        assert!((x - y).abs() <= tol * (1.0 + y.abs()), "o[{i}]: {x} vs {y}");
    }
    for (i, (x, y)) in a.lse.iter().zip(&b.lse).enumerate() {
        assert!(x == y || (x - y).abs() <= tol * (1.0 + y.abs()), "lse[{i}]: {x} vs {y}");
    }
}

/// Decoding after appends equals decoding a store built directly from the longer sequences.
fn decode_append_decode<T: Element>(seed: u64) {
    let mut rng = SmallRng::seed_from_u64(seed);
    let (hq, hkv, d, ps) = (8, 2, 64, 16);
    let lens = [0, 1, 15, 16, 17, 40];
    let mut seqs = Sequences::<T>::random(&mut rng, &lens, hkv, d);
    let mut cache = Paged::build(&mut rng, &seqs, ps, 0);
    // Free pages after the ones `build` used.
    let used = cache.kv.num_total_pages;
    let extra = 8;
    cache.kv.num_total_pages += extra;
    let page_elems = hkv * ps * d;
    cache.k.resize(cache.k.len() + extra as usize * page_elems, T::default());
    cache.v.resize(cache.v.len() + extra as usize * page_elems, T::default());
    let mut free: Vec<i32> = (used..used + extra).collect();
    free.shuffle(&mut rng);

    let append_desc = PagedKvAppendDescriptor { batch_size: lens.len() as i32, paged_kv: cache.kv };
    let q: Vec<T> = random_values(&mut rng, lens.len() * hq * d, 2.0);
    for _ in 0..3 {
        let before = cache.decode(&q, hq);
        assert_same(&before, &Paged::build(&mut rng, &seqs, 5, 3).decode(&q, hq), 1e-12);

        let key: Vec<T> = random_values(&mut rng, lens.len() * hkv * d, 2.0);
        let value: Vec<T> = random_values(&mut rng, lens.len() * hkv * d, 2.0);
        cache.advance(&mut free);
        let t = PageTable { indptr: &cache.indptr, indices: &cache.indices, last_page_len: &cache.last };
        append(&append_desc, &key, &value, &mut cache.k, &mut cache.v, t).unwrap();
        for b in 0..lens.len() {
            seqs.k[b].extend_from_slice(&key[b * hkv * d..(b + 1) * hkv * d]);
            seqs.v[b].extend_from_slice(&value[b * hkv * d..(b + 1) * hkv * d]);
        }

        let after = cache.decode(&q, hq);
        assert_same(&after, &Paged::build(&mut rng, &seqs, 7, 0).decode(&q, hq), 1e-12);
        assert!(after.lse.iter().all(|x| x.is_finite()));
    }
}

#[test]
fn decode_append_decode_f16() {
    decode_append_decode::<f16>(1);
}

#[test]
fn decode_append_decode_bf16() {
    decode_append_decode::<bf16>(2);
}

#[test]
fn decode_append_decode_f32() {
    decode_append_decode::<f32>(3);
}

#[test]
fn ragged_batch_with_empty_and_single_token_requests() {
    let mut rng = SmallRng::seed_from_u64(4);
    let (hq, hkv, d) = (8, 2, 128);
    let group = hq / hkv;
    let lens = [0, 1, 0, 7, 1, 33, 16];
    let seqs = Sequences::<bf16>::random(&mut rng, &lens, hkv, d);
    let cache = Paged::build(&mut rng, &seqs, 16, 2);
    let q: Vec<bf16> = random_values(&mut rng, lens.len() * hq * d, 2.0);
    let out = cache.decode(&q, hq);
    let scale = f64::from(1.0 / (d as f32).sqrt());
    for (b, &len) in lens.iter().enumerate() {
        for qh in 0..hq {
            let row = b * hq + qh;
            let o = &out.o[row * d..(row + 1) * d];
            match len {
                0 => {
                    assert!(o.iter().all(|&x| x == 0.0));
                    assert_eq!(out.lse[row], f64::NEG_INFINITY);
                }
                1 => {
                    let h = qh / group;
                    let k = &seqs.k[b][h * d..(h + 1) * d];
                    let v = &seqs.v[b][h * d..(h + 1) * d];
                    assert!(o.iter().zip(v).all(|(x, y)| *x == y.to_f64()));
                    let qrow = &q[row * d..(row + 1) * d];
                    let s = scale * qrow.iter().zip(k).map(|(a, b)| a.to_f64() * b.to_f64()).sum::<f64>();
                    assert!((out.lse[row] - s / LN_2).abs() < 1e-12, "{} vs {}", out.lse[row], s / LN_2);
                }
                _ => assert!(out.lse[row].is_finite()),
            }
        }
        // Each request alone gives the same rows as in the batch.
        let single =
            Sequences { kv_heads: hkv, head_dim: d, k: vec![seqs.k[b].clone()], v: vec![seqs.v[b].clone()] };
        let alone = Paged::build(&mut rng, &single, 4, 1).decode(&q[b * hq * d..(b + 1) * hq * d], hq);
        let batched = DecodeOutput {
            o: out.o[b * hq * d..(b + 1) * hq * d].to_vec(),
            lse: out.lse[b * hq..(b + 1) * hq].to_vec(),
        };
        assert_same(&alone, &batched, 1e-12);
    }
}

#[test]
fn shared_prefix_pages() {
    let mut rng = SmallRng::seed_from_u64(5);
    let (hq, hkv, d, ps) = (4, 4, 64, 8);
    let seqs = Sequences::<f32>::random(&mut rng, &[24, 3], hkv, d);
    let mut cache = Paged::build(&mut rng, &seqs, ps, 0);
    // Request 1 reuses the three pages of request 0: same tokens, so same output for the same q.
    cache.indptr = vec![0, 3, 6];
    cache.indices = [&cache.indices[..3], &cache.indices[..3]].concat();
    cache.last = vec![8, 8];
    let strict = PageTableRules { allow_shared_pages: false };
    let err = validate_page_table(&cache.kv, 2, cache.table(), strict).unwrap_err();
    assert!(matches!(err, Error::InvalidPageTable(ref m) if m.contains("indices[3]")), "{err}");
    validate_page_table(&cache.kv, 2, cache.table(), PageTableRules { allow_shared_pages: true }).unwrap();
    let q0: Vec<f32> = random_values(&mut rng, hq * d, 2.0);
    let q = [q0.clone(), q0].concat();
    let out = cache.decode(&q, hq);
    assert_eq!(out.o[..hq * d], out.o[hq * d..]);
    assert_eq!(out.lse[..hq], out.lse[hq..]);
}

#[test]
fn invalid_tables_are_typed_errors() {
    let mut rng = SmallRng::seed_from_u64(6);
    let (hq, hkv, d) = (2, 1, 64);
    let seqs = Sequences::<f16>::random(&mut rng, &[5, 0], hkv, d);
    let cache = Paged::build(&mut rng, &seqs, 4, 1);
    let desc =
        BatchPagedDecodeDescriptor { batch_size: 2, num_qo_heads: hq, sm_scale: 0.125, paged_kv: cache.kv };
    let q: Vec<f16> = random_values(&mut rng, 2 * hq as usize * d, 2.0);

    let pages = cache.kv.num_total_pages;
    let bad_indices = [cache.indices[0], pages];
    let t = PageTable { indices: &bad_indices, ..cache.table() };
    let err = decode(&desc, &q, &cache.k, &cache.v, t).unwrap_err();
    assert!(matches!(err, Error::InvalidPageTable(ref m) if m.contains("indices[1]")), "{err}");

    let t = PageTable { last_page_len: &[5, 0], ..cache.table() };
    let err = decode(&desc, &q, &cache.k, &cache.v, t).unwrap_err();
    assert!(matches!(err, Error::InvalidPageTable(ref m) if m.contains("last_page_len[0] = 5")), "{err}");

    let wrong_kind = BatchPagedDecodeDescriptor {
        paged_kv: PagedKvCacheDescriptor { element: ElementKind::BF16, ..cache.kv },
        ..desc
    };
    let err = decode(&wrong_kind, &q, &cache.k, &cache.v, cache.table()).unwrap_err();
    assert!(matches!(err, Error::InvalidProblem(_)), "{err}");

    // Appending to a table that does not count the new token: request 0 has pages and
    // last_page_len 0 (request 1, without pages, would append nothing).
    let append_desc = PagedKvAppendDescriptor { batch_size: 2, paged_kv: cache.kv };
    let tok: Vec<f16> = random_values(&mut rng, 2 * hkv * d, 2.0);
    let (mut k, mut v) = (cache.k.clone(), cache.v.clone());
    let t = PageTable { last_page_len: &[0, 0], ..cache.table() };
    let err = append(&append_desc, &tok, &tok, &mut k, &mut v, t).unwrap_err();
    assert!(matches!(err, Error::InvalidPageTable(ref m) if m.contains("last_page_len[0] = 0")), "{err}");
    assert!(k == cache.k && v == cache.v);
}

// FP8 K/V caches: decode over the dequantized cache, append's quantization.

/// A random case whose K/V stores are FP8 codes of `element` (no NaN, no infinity) and,
/// beside them, the same stores dequantized with `scales` into f32.
fn fp8_case(seed: u64, element: ElementKind, scales: KvScales) -> (Case<f16>, Vec<u8>, Vec<u8>, Case<f32>) {
    let mut rng = SmallRng::seed_from_u64(seed);
    let base = random_case::<f16>(&mut rng, &[0, 1, 17, 40, 100], 8, 2, 64, 16, 3);
    let format = element.fp8_layout().unwrap();
    let finite_codes: Vec<u8> = (0..=255u8).filter(|&c| fp8_to_f32(format, c).is_finite()).collect();
    // Codes of moderate magnitude (|x| ≤ 4), so that the softmax is not one-hot.
    let moderate: Vec<u8> =
        finite_codes.into_iter().filter(|&c| fp8_to_f32(format, c).abs() <= 4.0).collect();
    let codes = |rng: &mut SmallRng| -> Vec<u8> {
        (0..base.k.len()).map(|_| moderate[rng.random_range(0..moderate.len())]).collect()
    };
    let (k, v) = (codes(&mut rng), codes(&mut rng));
    let dequantized = |codes: &[u8], scale: f32| -> Vec<f32> {
        codes.iter().map(|&c| (f64::from(scale) * f64::from(fp8_to_f32(format, c))) as f32).collect()
    };
    let wide = Case {
        desc: BatchPagedDecodeDescriptor {
            paged_kv: PagedKvCacheDescriptor { element: ElementKind::F32, ..base.kv() },
            ..base.desc
        },
        q: base.q.iter().map(|x| x.to_f32()).collect(),
        k: dequantized(&k, scales.k_scale),
        v: dequantized(&v, scales.v_scale),
        indptr: base.indptr.clone(),
        indices: base.indices.clone(),
        last: base.last.clone(),
    };
    let fp8 = Case {
        desc: BatchPagedDecodeDescriptor {
            paged_kv: PagedKvCacheDescriptor { element, ..base.kv() },
            ..base.desc
        },
        ..base
    };
    (fp8, k, v, wide)
}

#[test]
fn fp8_decode_is_decode_over_the_dequantized_cache() {
    for (i, element) in [ElementKind::E4M3, ElementKind::E5M2].into_iter().enumerate() {
        // Power-of-two scales dequantize exactly in f32; 0.37 rounds there.
        for (scales, tol) in [
            (KvScales::ONE, 1e-12),
            (KvScales { k_scale: 0.25, v_scale: 2.0 }, 1e-12),
            (KvScales { k_scale: 0.37, v_scale: 1.3 }, 1e-6),
        ] {
            let (fp8, k, v, wide) = fp8_case(40 + i as u64, element, scales);
            let got = decode_fp8(&fp8.desc, &fp8.q, &k, &v, scales, fp8.table()).unwrap();
            assert_same(&got, &wide.decode(), tol);
            assert!(got.lse[0] == f64::NEG_INFINITY && got.lse.iter().skip(8).all(|x| x.is_finite()));
        }
    }
}

#[test]
fn fp8_append_quantizes_each_element_as_documented() {
    let specials = [1e6, -1e9, f32::INFINITY, f32::NEG_INFINITY, f32::NAN, 0.0, -0.0, 1e-12, -f32::NAN];
    for element in [ElementKind::E4M3, ElementKind::E5M2] {
        let format = element.fp8_layout().unwrap();
        let (hkv, d, ps, pages) = (2, 64, 4, 6);
        let kv = kv_desc(element, ps, pages, hkv, d);
        let desc = PagedKvAppendDescriptor { batch_size: 2, paged_kv: kv };
        // Request 0 appends into slot 2 of page 5, request 1 into slot 0 of page 1.
        let (indptr, indices, last) = (vec![0, 2, 3], vec![3, 5, 1], vec![3, 1]);
        let table = PageTable { indptr: &indptr, indices: &indices, last_page_len: &last };
        let mut rng = SmallRng::seed_from_u64(9);
        let mut key: Vec<f32> = random_values(&mut rng, 2 * hkv * d, 600.0);
        key[..specials.len()].copy_from_slice(&specials);
        let value: Vec<f32> = random_values(&mut rng, 2 * hkv * d, 3.0);
        let store = pages * hkv * ps * d;
        let (mut k, mut v) = (vec![0xAAu8; store], vec![0xAAu8; store]);
        let scales = KvScales { k_scale: 0.75, v_scale: 0.01 };
        append_fp8(&desc, &key, &value, &mut k, &mut v, scales, table).unwrap();
        let mut written = vec![false; store];
        for (b, (page, slot)) in [(5usize, 2usize), (1, 0)].into_iter().enumerate() {
            for h in 0..hkv {
                let (dst, src) = (store_row(&kv, page, h, slot), (b * hkv + h) * d);
                for i in 0..d {
                    assert_eq!(
                        k[dst + i],
                        f32_to_fp8(format, key[src + i] / 0.75),
                        "{element:?} key {}",
                        src + i
                    );
                    assert_eq!(v[dst + i], f32_to_fp8(format, value[src + i] / 0.01), "{element:?} value");
                    written[dst + i] = true;
                }
            }
        }
        assert!(
            written.iter().zip(&k).all(|(&w, &c)| w || c == 0xAA),
            "{element:?}: a byte outside the slots changed"
        );
        // Out of range saturates to the largest finite code of its sign, NaN stays NaN of its
        // sign.
        let dst = store_row(&kv, 5, 0, 2);
        let max = format.max_finite();
        assert_eq!(&k[dst..dst + 4], &[max, 0x80 | max, max, 0x80 | max]);
        assert!(fp8_to_f32(format, k[dst + 4]).is_nan() && fp8_to_f32(format, k[dst + 8]).is_nan());
        assert_eq!([k[dst + 4], k[dst + 8]], [0x7f, 0xff]);
        assert_eq!(&k[dst + 5..dst + 8], &[0, 0x80, 0]);
    }
}

#[test]
fn fp8_entry_points_reject_other_stores_and_bad_scales() {
    let (fp8, k, v, _) = fp8_case(7, ElementKind::E4M3, KvScales::ONE);
    for scales in [
        KvScales { k_scale: 0.0, v_scale: 1.0 },
        KvScales { k_scale: 1.0, v_scale: -2.0 },
        KvScales { k_scale: f32::NAN, v_scale: 1.0 },
        KvScales { k_scale: 1.0, v_scale: f32::INFINITY },
    ] {
        let r = decode_fp8(&fp8.desc, &fp8.q, &k, &v, scales, fp8.table());
        assert!(matches!(r, Err(Error::InvalidProblem(_))), "{scales:?}: {r:?}");
    }
    let f16_store = BatchPagedDecodeDescriptor {
        paged_kv: PagedKvCacheDescriptor { element: ElementKind::F16, ..fp8.kv() },
        ..fp8.desc
    };
    let r = decode_fp8(&f16_store, &fp8.q, &k, &v, KvScales::ONE, fp8.table());
    assert!(matches!(r, Err(Error::InvalidProblem(_))), "{r:?}");
    let r = decode_fp8(&fp8.desc, &fp8.q, &k[1..], &v, KvScales::ONE, fp8.table());
    assert!(matches!(r, Err(Error::InvalidProblem(_))), "{r:?}");
    // The 16-bit reference refuses an FP8 descriptor.
    let r = decode(&fp8.desc, &fp8.q, &fp8.k, &fp8.v, fp8.table());
    assert!(matches!(r, Err(Error::InvalidProblem(_))), "{r:?}");
}

// Attention variants: logits soft-cap, sliding window, attention sinks.

/// `o` and `lse` of request `b`, query head `qh` computed the naive way for `variant`.
fn naive_variant(c: &Case<f32>, variant: &AttentionVariant<'_>, b: usize, qh: usize) -> (Vec<f64>, f64) {
    let ps = c.kv().page_size as usize;
    let pages = (c.indptr[b + 1] - c.indptr[b]) as usize;
    let len = if pages == 0 { 0 } else { (pages - 1) * ps + c.last[b] as usize };
    let first = variant.window_left.map_or(0, |w| len.saturating_sub(w as usize + 1));
    let logit = |t: usize| {
        let s = c.logit(b, qh, t);
        variant.logits_soft_cap.map_or(s, |cap| f64::from(cap) * (s / f64::from(cap)).tanh())
    };
    let sink = variant.sinks.map_or(f64::NEG_INFINITY, |s| f64::from(s[qh]));
    let weights: Vec<f64> = (first..len).map(|t| logit(t).exp()).collect();
    let denominator = weights.iter().sum::<f64>() + sink.exp();
    let mut o = vec![0.0; c.d()];
    for (t, w) in (first..len).zip(&weights) {
        let (_, v) = c.kv_row(b, qh / c.group(), t);
        for (oi, vi) in o.iter_mut().zip(v) {
            *oi += w * f64::from(*vi) / denominator;
        }
    }
    (o, denominator.ln() / LN_2)
}

fn check_variant(c: &Case<f32>, variant: AttentionVariant<'_>) {
    let got = decode_variant(&c.desc, variant, &c.q, &c.k, &c.v, c.table()).unwrap();
    let (hq, d) = (c.hq(), c.d());
    for b in 0..c.desc.batch_size as usize {
        for qh in 0..hq {
            let (o, lse) = naive_variant(c, &variant, b, qh);
            let row = (b * hq + qh) * d;
            for (i, (x, y)) in got.o[row..row + d].iter().zip(&o).enumerate() {
                assert!(close(*x, *y, 1e-9), "{variant:?} b {b} qh {qh} o[{i}]: {x} vs {y}");
            }
            let l = got.lse[b * hq + qh];
            assert!(l == lse || close(l, lse, 1e-9), "{variant:?} b {b} qh {qh} lse: {l} vs {lse}");
        }
    }
}

#[test]
fn variants_match_the_naive_softmax() {
    let mut rng = SmallRng::seed_from_u64(71);
    let c = random_case::<f32>(&mut rng, &[0, 1, 5, 16, 17, 60], 8, 2, 64, 16, 2);
    let sinks: Vec<f32> = (0..8).map(|h| [-1.0, 0.0, 2.5, f32::NEG_INFINITY][h % 4]).collect();
    for cap in [None, Some(1.0), Some(30.0), Some(100.0)] {
        for window in [None, Some(0), Some(3), Some(15), Some(16), Some(1000)] {
            for sinks in [None, Some(&sinks[..])] {
                check_variant(&c, AttentionVariant { logits_soft_cap: cap, window_left: window, sinks });
            }
        }
    }
}

#[test]
fn variants_reduce_to_plain_attention_at_their_limits() {
    let mut rng = SmallRng::seed_from_u64(72);
    let c = random_case::<f32>(&mut rng, &[3, 40, 0, 17], 4, 1, 64, 8, 1);
    let plain = c.decode();
    let no_sinks = vec![f32::NEG_INFINITY; 4];
    for variant in [
        AttentionVariant::default(),
        AttentionVariant { window_left: Some(40), ..Default::default() },
        AttentionVariant { window_left: Some(u32::MAX), ..Default::default() },
        AttentionVariant { sinks: Some(&no_sinks), ..Default::default() },
    ] {
        assert_eq!(
            decode_variant(&c.desc, variant, &c.q, &c.k, &c.v, c.table()).unwrap(),
            plain,
            "{variant:?}"
        );
    }
    // A cap far above every logit changes them by less than (s/cap)² relatively.
    let capped = AttentionVariant { logits_soft_cap: Some(1e6), ..Default::default() };
    assert_same(&decode_variant(&c.desc, capped, &c.q, &c.k, &c.v, c.table()).unwrap(), &plain, 1e-9);
    // A window of one token returns that token's value; an empty request with a sink gets the
    // sink as its lse.
    let last = AttentionVariant { window_left: Some(0), ..Default::default() };
    let out = decode_variant(&c.desc, last, &c.q, &c.k, &c.v, c.table()).unwrap();
    let (_, v) = c.kv_row(1, 0, 39);
    let d = c.d();
    assert!(out.o[4 * d..5 * d].iter().zip(v).all(|(x, y)| close(*x, f64::from(*y), 1e-12)));
    let sinks = [0.5f32, -2.0, 3.0, 1.0];
    let with_sinks = AttentionVariant { sinks: Some(&sinks), ..Default::default() };
    let out = decode_variant(&c.desc, with_sinks, &c.q, &c.k, &c.v, c.table()).unwrap();
    for (qh, &sink) in sinks.iter().enumerate() {
        assert_eq!(out.lse[2 * 4 + qh], f64::from(sink) / LN_2);
        assert!(out.o[(2 * 4 + qh) * d..(2 * 4 + qh + 1) * d].iter().all(|&x| x == 0.0));
    }
}

#[test]
fn variants_reject_bad_parameters() {
    let mut rng = SmallRng::seed_from_u64(73);
    let c = random_case::<f32>(&mut rng, &[3, 4], 4, 2, 64, 8, 0);
    let short = [0.0f32; 3];
    let nan = [0.0, f32::NAN, 0.0, 0.0];
    for variant in [
        AttentionVariant { logits_soft_cap: Some(0.0), ..Default::default() },
        AttentionVariant { logits_soft_cap: Some(-1.0), ..Default::default() },
        AttentionVariant { logits_soft_cap: Some(f32::INFINITY), ..Default::default() },
        AttentionVariant { sinks: Some(&short), ..Default::default() },
        AttentionVariant { sinks: Some(&nan), ..Default::default() },
    ] {
        let r = decode_variant(&c.desc, variant, &c.q, &c.k, &c.v, c.table());
        assert!(matches!(r, Err(Error::InvalidProblem(_))), "{variant:?}: {r:?}");
    }
}

// Strided K/V stores: NHD, K and V interleaved per page, pools with a page stride.

#[test]
fn strided_stores_decode_as_the_contiguous_one() {
    let mut rng = SmallRng::seed_from_u64(81);
    let c = random_case::<f32>(&mut rng, &[0, 1, 9, 33, 70], 8, 2, 64, 16, 2);
    let kv = c.kv();
    let (pages, heads, ps, d) =
        (kv.num_total_pages as usize, kv.num_kv_heads as usize, kv.page_size as usize, kv.head_dim as usize);
    let variant = AttentionVariant { window_left: Some(20), ..Default::default() };
    let expected = decode_variant(&c.desc, variant, &c.q, &c.k, &c.v, c.table()).unwrap();
    let row = |store: &[f32], p: usize, h: usize, t: usize| {
        let r = store_row(&kv, p, h, t);
        store[r..r + d].to_vec()
    };
    // NHD: [pages, page_size, heads, d].
    let nhd = |store: &[f32]| -> Vec<f32> {
        let mut out = Vec::new();
        for p in 0..pages {
            for t in 0..ps {
                for h in 0..heads {
                    out.extend(row(store, p, h, t));
                }
            }
        }
        out
    };
    let (k_nhd, v_nhd) = (nhd(&c.k), nhd(&c.v));
    let got =
        decode_strided(&c.desc, variant, &c.q, KvView::nhd(&k_nhd, &kv), KvView::nhd(&v_nhd, &kv), c.table());
    assert_eq!(got.unwrap(), expected, "NHD");
    // vLLM: one tensor [blocks, 2, block_size, heads, d], in a pool whose pages are 3 layers apart.
    let layers = 3;
    let page_elems = 2 * ps * heads * d;
    let mut pool = vec![f32::NAN; pages * layers * page_elems];
    for p in 0..pages {
        for t in 0..ps {
            for h in 0..heads {
                let at = (p * layers + 1) * page_elems + (t * heads + h) * d;
                pool[at..at + d].copy_from_slice(&row(&c.k, p, h, t));
                let at = at + ps * heads * d;
                pool[at..at + d].copy_from_slice(&row(&c.v, p, h, t));
            }
        }
    }
    let view = |offset: usize| KvView {
        data: &pool,
        offset,
        page_stride: layers * page_elems,
        head_stride: d,
        token_stride: heads * d,
    };
    let (k, v) = (view(page_elems), view(page_elems + ps * heads * d));
    assert_eq!(
        decode_strided(&c.desc, variant, &c.q, k, v, c.table()).unwrap(),
        expected,
        "interleaved pool"
    );
    // A view that reaches past its data is refused.
    let short = KvView { data: &pool[..pool.len() - 1], ..view(page_elems + (layers - 1) * page_elems) };
    let r = decode_strided(&c.desc, variant, &c.q, k, short, c.table());
    assert!(matches!(r, Err(Error::InvalidProblem(_))), "{r:?}");
    let huge = KvView { page_stride: usize::MAX / 2, ..k };
    let r = decode_strided(&c.desc, variant, &c.q, huge, v, c.table());
    assert!(matches!(r, Err(Error::InvalidProblem(_))), "{r:?}");
}
