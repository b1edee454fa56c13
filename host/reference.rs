//! Float64 CPU reference implementations of paged decode and paged K/V append.
//!
//! These use the kernels' layouts and semantics and serve as the oracle for the GPU tests:
//! - `q`, `o`: `[batch, num_qo_heads, head_dim]`; `lse`: `[batch, num_qo_heads]`.
//! - `k_data`, `v_data`: `[num_total_pages, num_kv_heads, page_size, head_dim]` (HND). Token `t`
//!   of request `b` lives in page `indices[indptr[b] + t / page_size]`, slot `t % page_size`.
//! - Query head `qh` attends with KV head `qh / (num_qo_heads / num_kv_heads)`.
//!
//! Inputs are widened to f64 (exactly) and every step runs in f64. Both functions check the
//! descriptor, the slice lengths and the page table first and return a typed error instead of
//! panicking on inconsistent input.

use std::f64::consts::LN_2;

use crate::error::{Error, Result};
use crate::page_table::{PageTableRules, append_slots, validate_page_table};
use crate::types::{BatchPagedDecodeDescriptor, Element, PagedKvAppendDescriptor, PagedKvCacheDescriptor};

/// The page table both functions read (defined with its rules in [`crate::page_table`]).
pub use crate::page_table::PageTable;

/// Result of [`decode`].
#[derive(Clone, Debug, PartialEq)]
pub struct DecodeOutput {
    /// Attention output, `[batch, num_qo_heads, head_dim]`; all zeros for a request with no token.
    pub o: Vec<f64>,
    /// Base-2 log-sum-exp of the scaled logits, `[batch, num_qo_heads]`:
    /// `log2(Σ_t exp(sm_scale · q·k_t))`; `-inf` for a request with no token.
    pub lse: Vec<f64>,
}

/// Paged K/V store geometry, checked and converted to `usize`.
#[derive(Clone, Copy)]
struct KvGeometry {
    page_size: usize,
    kv_heads: usize,
    head_dim: usize,
}

impl KvGeometry {
    /// Element offset of the row of `slot` in `page` for KV head `h`.
    fn row(&self, page: usize, h: usize, slot: usize) -> usize {
        ((page * self.kv_heads + h) * self.page_size + slot) * self.head_dim
    }
}

fn invalid(msg: String) -> Error {
    Error::InvalidProblem(msg)
}

/// `value` as a `usize`, or an error if it is below `min`.
fn extent(name: &str, value: i32, min: i32) -> Result<usize> {
    if value < min {
        return Err(invalid(format!("{name} = {value} must be at least {min}")));
    }
    Ok(value as usize)
}

fn product(name: &str, dims: &[usize]) -> Result<usize> {
    dims.iter()
        .try_fold(1usize, |acc, &d| acc.checked_mul(d))
        .ok_or_else(|| invalid(format!("{name}: element count {dims:?} overflows usize")))
}

fn check_len(name: &str, got: usize, expected: usize, shape: &str) -> Result<()> {
    if got != expected {
        return Err(invalid(format!("{name} has {got} elements, expected {expected} ({shape})")));
    }
    Ok(())
}

/// Checks the K/V store descriptor against the element type and the store slices.
fn check_kv<T: Element>(kv: &PagedKvCacheDescriptor, k_len: usize, v_len: usize) -> Result<KvGeometry> {
    if kv.element != T::KIND {
        return Err(invalid(format!("paged_kv.element is {:?} but the data is {:?}", kv.element, T::KIND)));
    }
    let page_size = extent("paged_kv.page_size", kv.page_size, 1)?;
    let pages = extent("paged_kv.num_total_pages", kv.num_total_pages, 0)?;
    let kv_heads = extent("paged_kv.num_kv_heads", kv.num_kv_heads, 1)?;
    let head_dim = extent("paged_kv.head_dim", kv.head_dim, 1)?;
    let store = product("k_data", &[pages, kv_heads, page_size, head_dim])?;
    let shape = "[num_total_pages, num_kv_heads, page_size, head_dim]";
    check_len("k_data", k_len, store, shape)?;
    check_len("v_data", v_len, store, shape)?;
    Ok(KvGeometry { page_size, kv_heads, head_dim })
}

fn dot(a: &[f64], b: &[f64]) -> f64 {
    a.iter().zip(b).map(|(x, y)| x * y).sum()
}

/// Batched paged decode attention in f64.
///
/// For every request `b` and query head `qh` (KV head `h = qh / (num_qo_heads / num_kv_heads)`):
/// `s_t = sm_scale · q[b, qh] · k_t`, `p = softmax(s)`, `o[b, qh] = Σ_t p_t v_t` and
/// `lse[b, qh] = log2(Σ_t exp(s_t))` over the request's tokens `t`, whose K/V rows are read
/// through the page table. A request with no token gets `o = 0` and `lse = -inf`.
///
/// Requirements, reported as [`Error::InvalidProblem`]: `paged_kv.element == T::KIND`,
/// `batch_size ≥ 0`, `num_qo_heads` a positive multiple of `num_kv_heads ≥ 1`, `head_dim ≥ 1`,
/// `page_size ≥ 1`, `num_total_pages ≥ 0`, finite `sm_scale`,
/// `q.len() == batch · num_qo_heads · head_dim` and
/// `k_data.len() == v_data.len() == num_total_pages · num_kv_heads · page_size · head_dim`.
/// The page table must pass [`validate_page_table`] with shared pages allowed (decode only reads
/// pages); otherwise [`Error::InvalidPageTable`] is returned.
pub fn decode<T: Element>(
    desc: &BatchPagedDecodeDescriptor,
    q: &[T],
    k_data: &[T],
    v_data: &[T],
    table: PageTable<'_>,
) -> Result<DecodeOutput> {
    let batch = extent("batch_size", desc.batch_size, 0)?;
    let qo_heads = extent("num_qo_heads", desc.num_qo_heads, 1)?;
    let g = check_kv::<T>(&desc.paged_kv, k_data.len(), v_data.len())?;
    if qo_heads % g.kv_heads != 0 {
        return Err(invalid(format!(
            "num_qo_heads = {qo_heads} is not a multiple of num_kv_heads = {}",
            g.kv_heads
        )));
    }
    if !desc.sm_scale.is_finite() {
        return Err(invalid(format!("sm_scale = {} is not finite", desc.sm_scale)));
    }
    let d = g.head_dim;
    let q_len = product("q", &[batch, qo_heads, d])?;
    check_len("q", q.len(), q_len, "[batch_size, num_qo_heads, head_dim]")?;
    validate_page_table(&desc.paged_kv, batch, table, PageTableRules { allow_shared_pages: true })?;

    if batch == 0 {
        return Ok(DecodeOutput { o: Vec::new(), lse: Vec::new() });
    }
    let group = qo_heads / g.kv_heads;
    let scale = f64::from(desc.sm_scale);
    let mut o = vec![0.0; q_len];
    let mut lse = vec![f64::NEG_INFINITY; batch * qo_heads];
    let mut qs = vec![0.0; group * d];
    let mut row = vec![0.0; d];
    let mut p = Vec::new();
    let mut sums = vec![0.0; group];
    for b in 0..batch {
        let len = table.request_len(b, g.page_size);
        if len == 0 {
            continue;
        }
        let p_len = len
            .checked_mul(group)
            .ok_or_else(|| invalid(format!("request {b}: {len} tokens is too many")))?;
        let first = table.indptr[b] as usize;
        let token_row = |h: usize, t: usize| {
            let page = table.indices[first + t / g.page_size] as usize;
            g.row(page, h, t % g.page_size)
        };
        for h in 0..g.kv_heads {
            let heads = b * qo_heads + h * group;
            for (dst, src) in qs.iter_mut().zip(&q[heads * d..(heads + group) * d]) {
                *dst = src.to_f64();
            }
            // Logits, laid out [query head of the group][token].
            p.clear();
            p.resize(p_len, 0.0);
            for t in 0..len {
                let r = token_row(h, t);
                for (dst, src) in row.iter_mut().zip(&k_data[r..r + d]) {
                    *dst = src.to_f64();
                }
                for (j, qrow) in qs.chunks_exact(d).enumerate() {
                    p[j * len + t] = scale * dot(qrow, &row);
                }
            }
            for (j, s) in p.chunks_exact_mut(len).enumerate() {
                let m = s.iter().copied().fold(f64::NEG_INFINITY, f64::max);
                let mut sum = 0.0;
                for x in s.iter_mut() {
                    *x = (*x - m).exp();
                    sum += *x;
                }
                sums[j] = sum;
                lse[heads + j] = m / LN_2 + sum.log2();
            }
            let out = &mut o[heads * d..(heads + group) * d];
            for t in 0..len {
                let r = token_row(h, t);
                for (dst, src) in row.iter_mut().zip(&v_data[r..r + d]) {
                    *dst = src.to_f64();
                }
                for (j, orow) in out.chunks_exact_mut(d).enumerate() {
                    let pt = p[j * len + t];
                    for (oi, vi) in orow.iter_mut().zip(&row) {
                        *oi += pt * vi;
                    }
                }
            }
            for (orow, sum) in out.chunks_exact_mut(d).zip(&sums) {
                for oi in orow {
                    *oi /= sum;
                }
            }
        }
    }
    Ok(DecodeOutput { o, lse })
}

/// Appends one K/V token per request to the paged store.
///
/// Convention: the caller has already advanced the page table for the new token (allocated a new
/// page when the last one was full and incremented `last_page_len[b]`), so the token of request
/// `b` is written to slot `last_page_len[b] - 1` of page `indices[indptr[b + 1] - 1]`, for every
/// KV head. `key` and `value` are `[batch, num_kv_heads, head_dim]`. Nothing else is written.
///
/// Requirements, reported as [`Error::InvalidProblem`]: `paged_kv.element == T::KIND`,
/// `batch_size ≥ 0`, `num_kv_heads`, `head_dim`, `page_size ≥ 1`, `num_total_pages ≥ 0`,
/// `key.len() == value.len() == batch · num_kv_heads · head_dim` and the store lengths of
/// [`decode`]. The page table must pass [`validate_append_table`](crate::page_table::validate_append_table)
/// (reported as [`Error::InvalidPageTable`]): every request owns at least one page, has
/// `last_page_len[b] ≥ 1`, and no two requests write the same slot of the same page.
///
/// The unchecked GPU kernel does not fail on such a table: it skips a request with no page or
/// with `last_page_len` outside `[1, page_size]`, and two requests sharing a slot race for it.
/// This reference, like the checked plan, rejects it instead.
///
/// All checks run before anything is written, so on error `k_data` and `v_data` are unchanged.
pub fn append<T: Element>(
    desc: &PagedKvAppendDescriptor,
    key: &[T],
    value: &[T],
    k_data: &mut [T],
    v_data: &mut [T],
    table: PageTable<'_>,
) -> Result<()> {
    let batch = extent("batch_size", desc.batch_size, 0)?;
    let g = check_kv::<T>(&desc.paged_kv, k_data.len(), v_data.len())?;
    let d = g.head_dim;
    let token_len = product("key", &[batch, g.kv_heads, d])?;
    let shape = "[batch_size, num_kv_heads, head_dim]";
    check_len("key", key.len(), token_len, shape)?;
    check_len("value", value.len(), token_len, shape)?;
    let targets: Vec<usize> = append_slots(&desc.paged_kv, batch, table)?
        .into_iter()
        .map(|(page, slot)| g.row(page, 0, slot))
        .collect();
    let head_stride = g.page_size * d;
    for (b, &base) in targets.iter().enumerate() {
        for h in 0..g.kv_heads {
            let src = (b * g.kv_heads + h) * d;
            let dst = base + h * head_stride;
            k_data[dst..dst + d].copy_from_slice(&key[src..src + d]);
            v_data[dst..dst + d].copy_from_slice(&value[src..src + d]);
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::ElementKind;
    use half::{bf16, f16};

    /// splitmix64.
    struct Rng(u64);

    impl Rng {
        fn next_u64(&mut self) -> u64 {
            self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
            let mut z = self.0;
            z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
            z ^ (z >> 31)
        }
        /// Uniform in `[-1, 1)`.
        fn uniform(&mut self) -> f64 {
            (self.next_u64() >> 11) as f64 / (1u64 << 52) as f64 - 1.0
        }
        fn below(&mut self, n: usize) -> usize {
            (self.next_u64() % n as u64) as usize
        }
        fn vec<T: Element>(&mut self, n: usize, amplitude: f64) -> Vec<T> {
            (0..n).map(|_| T::from_f64(amplitude * self.uniform())).collect()
        }
        fn shuffle<X>(&mut self, v: &mut [X]) {
            for i in (1..v.len()).rev() {
                v.swap(i, self.below(i + 1));
            }
        }
    }

    fn kv_desc(
        element: ElementKind,
        ps: usize,
        pages: usize,
        hkv: usize,
        d: usize,
    ) -> PagedKvCacheDescriptor {
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
            let kv = self.kv();
            let g = KvGeometry {
                page_size: kv.page_size as usize,
                kv_heads: kv.num_kv_heads as usize,
                head_dim: kv.head_dim as usize,
            };
            let page = self.indices[self.indptr[b] as usize + t / g.page_size] as usize;
            let r = g.row(page, h, t % g.page_size);
            (&self.k[r..r + g.head_dim], &self.v[r..r + g.head_dim])
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
        rng: &mut Rng,
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
        rng.shuffle(&mut ids);
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
            q: rng.vec(batch * hq * d, 2.0),
            k: rng.vec(store, 2.0),
            v: rng.vec(store, 1.0),
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
        let mut rng = Rng(1);
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
        let mut rng = Rng(2);
        for _ in 0..5 {
            let lens: Vec<usize> = (0..4).map(|_| 1 + rng.below(90)).collect();
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
        let mut rng = Rng(3);
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
        let mut rng = Rng(4);
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
        let mut rng = Rng(5);
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
        let mut rng = Rng(6);
        let c = random_case::<f32>(&mut rng, &[33, 7, 16, 0, 64], 4, 2, 64, 8, 5);
        let total = c.kv().num_total_pages as usize;
        let page_elems = c.k.len() / total;
        let mut perm: Vec<usize> = (0..total).collect();
        rng.shuffle(&mut perm);
        let mut k = c.k.clone();
        let mut v = c.v.clone();
        for (p, &np) in perm.iter().enumerate() {
            k[np * page_elems..(np + 1) * page_elems]
                .copy_from_slice(&c.k[p * page_elems..(p + 1) * page_elems]);
            v[np * page_elems..(np + 1) * page_elems]
                .copy_from_slice(&c.v[p * page_elems..(p + 1) * page_elems]);
        }
        let indices: Vec<i32> = c.indices.iter().map(|&p| perm[p as usize] as i32).collect();
        let permuted =
            Case { k, v, indices, q: c.q.clone(), indptr: c.indptr.clone(), last: c.last.clone(), ..c };
        assert_eq!(c.decode(), permuted.decode());
    }

    #[test]
    fn shared_pages_are_read_consistently() {
        let mut rng = Rng(7);
        let mut c = random_case::<f32>(&mut rng, &[24, 24], 2, 1, 32, 8, 0);
        // Both requests read the same three pages and the same query: identical rows.
        c.indices = vec![2, 0, 4, 2, 0, 4];
        let q0 = c.q[..64].to_vec();
        c.q[64..].copy_from_slice(&q0);
        let out = c.decode();
        assert_eq!(out.o[..64], out.o[64..]);
        assert_eq!(out.lse[..2], out.lse[2..]);
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
        let mut rng = Rng(8);
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
        let mut rng = Rng(9);
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
        let bad_page = [c.indices[0], 1000, c.indices[2], c.indices[3], c.indices[4]];
        let r = decode(&c.desc, &c.q, &c.k, &c.v, PageTable { indices: &bad_page, ..c.table() });
        assert!(matches!(r, Err(Error::InvalidPageTable(ref m)) if m.contains("indices[1] = 1000")), "{r:?}");
    }

    #[test]
    fn garbage_tables_never_panic() {
        let mut rng = Rng(10);
        let c = random_case::<f32>(&mut rng, &[5, 9, 2], 2, 1, 8, 4, 2);
        let vals = [i32::MIN, -1, 0, 1, 2, 3, 4, 5, 6, i32::MAX];
        for _ in 0..3000 {
            let mut pick = |n: usize| -> Vec<i32> { (0..n).map(|_| vals[rng.below(vals.len())]).collect() };
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
            let mut rng = Rng(seed);
            let (hkv, d, ps, total) = (3, 64, 4, 12);
            // Request 0: 2 pages, new token in slot 2; request 1: fresh page, slot 0;
            // request 2: full last page.
            let indptr = [0, 2, 3, 5];
            let indices = [7, 2, 9, 0, 11];
            let last = [3, 1, 4];
            let table = PageTable { indptr: &indptr, indices: &indices, last_page_len: &last };
            let desc =
                PagedKvAppendDescriptor { batch_size: 3, paged_kv: kv_desc(T::KIND, ps, total, hkv, d) };
            let store = total * hkv * ps * d;
            let k0: Vec<T> = rng.vec(store, 1.0);
            let v0: Vec<T> = rng.vec(store, 1.0);
            let key: Vec<T> = rng.vec(3 * hkv * d, 1.0);
            let value: Vec<T> = rng.vec(3 * hkv * d, 1.0);
            let (mut k, mut v) = (k0.clone(), v0.clone());
            append(&desc, &key, &value, &mut k, &mut v, table).unwrap();
            let g = KvGeometry { page_size: ps, kv_heads: hkv, head_dim: d };
            let mut expect_k = k0.clone();
            let mut expect_v = v0.clone();
            for (b, (page, slot)) in [(2, 2), (9, 0), (11, 3)].into_iter().enumerate() {
                for h in 0..hkv {
                    let r = g.row(page, h, slot);
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
        table_err(try_append(&[0, 1, 1], &[0], &[1, 1]), "request 1 owns no page");
        table_err(try_append(&[0, 1, 2], &[0, 1], &[0, 1]), "last_page_len[0] = 0");
        table_err(try_append(&[0, 1, 2], &[3, 3], &[2, 2]), "slot 1 of page 3");
        // Same page, different slots: allowed.
        try_append(&[0, 1, 2], &[3, 3], &[1, 2]).unwrap();
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
}
