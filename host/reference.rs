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
use crate::fp8::{Fp8Layout, f32_to_fp8, fp8_to_f32};
use crate::page_table::{PageTableRules, append_slots, validate_page_table};
use crate::types::{
    BatchPagedDecodeDescriptor, Element, ElementKind, PagedKvAppendDescriptor, PagedKvCacheDescriptor,
};

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

/// Checks the K/V store descriptor against the store's element type and the store slices.
fn check_kv<T: Element>(kv: &PagedKvCacheDescriptor, k_len: usize, v_len: usize) -> Result<KvGeometry> {
    check_store(kv, T::KIND, k_len, v_len)
}

/// [`check_kv`] for a store of element kind `element`.
fn check_store(
    kv: &PagedKvCacheDescriptor,
    element: ElementKind,
    k_len: usize,
    v_len: usize,
) -> Result<KvGeometry> {
    if kv.element != element {
        return Err(invalid(format!("paged_kv.element is {:?} but the data is {:?}", kv.element, element)));
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
    decode_variant(desc, AttentionVariant::default(), q, k_data, v_data, table)
}

/// Attention variants of [`decode_variant`]; the default is plain softmax attention.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct AttentionVariant<'a> {
    /// Logits soft-cap (Gemma 2): every scaled logit `s` becomes `cap · tanh(s / cap)` before the
    /// softmax (and in `lse`). Finite and positive.
    pub logits_soft_cap: Option<f32>,
    /// Sliding window: a request of `len` tokens attends to its last `window_left + 1` tokens,
    /// `t ≥ len - 1 - window_left` (the query is the token at `len - 1`); `None` attends to all.
    pub window_left: Option<u32>,
    /// Attention sinks (gpt-oss), `[num_qo_heads]`: a learned logit per query head, in the scaled
    /// logits' domain, that joins the softmax's denominator with no value: `o = Σ_t e^{s_t} v_t /
    /// (Σ_t e^{s_t} + e^{sink})` and `lse = log2(Σ_t e^{s_t} + e^{sink})`, so a request with no
    /// token (or none in its window) gets `o = 0` and `lse = sink · log2(e)`. `-inf` is no sink;
    /// NaN is refused.
    pub sinks: Option<&'a [f32]>,
}

impl AttentionVariant<'_> {
    fn check(&self, qo_heads: usize) -> Result<()> {
        if let Some(cap) = self.logits_soft_cap
            && !(cap.is_finite() && cap > 0.0)
        {
            return Err(invalid(format!("logits_soft_cap = {cap} must be finite and positive")));
        }
        if let Some(sinks) = self.sinks {
            check_len("sinks", sinks.len(), qo_heads, "[num_qo_heads]")?;
            if let Some(h) = sinks.iter().position(|&s| !(s.is_finite() || s == f32::NEG_INFINITY)) {
                return Err(invalid(format!("sinks[{h}] = {} must be finite or -inf", sinks[h])));
            }
        }
        Ok(())
    }
}

/// [`decode`] with an [`AttentionVariant`]: logits soft-cap, sliding window and attention
/// sinks, alone or combined (the cap applies to the tokens' logits, not to the sinks). The
/// requirements are those of [`decode`], plus a finite positive cap and one non-NaN sink per
/// query head.
pub fn decode_variant<T: Element>(
    desc: &BatchPagedDecodeDescriptor,
    variant: AttentionVariant<'_>,
    q: &[T],
    k_data: &[T],
    v_data: &[T],
    table: PageTable<'_>,
) -> Result<DecodeOutput> {
    check_kv::<T>(&desc.paged_kv, k_data.len(), v_data.len())?;
    let (k, v) = (KvView::hnd(k_data, &desc.paged_kv), KvView::hnd(v_data, &desc.paged_kv));
    decode_strided(desc, variant, q, k, v, table)
}

/// A paged K or V store with any strides, in elements, on its page, KV head and token axes; each
/// row of `head_dim` elements is contiguous. Row `(page, head, slot)` starts at `offset + page ·
/// page_stride + head · head_stride + slot · token_stride`. This covers HND, NHD
/// (`[pages, page_size, kv_heads, D]`), K and V interleaved per page (vLLM's `[blocks, 2,
/// block_size, kv_heads, D]`, or FlashInfer's `[pages, 2, …]` tensor: one view per half, the V
/// one offset by a half page) and page pools shared between layers (a larger page stride).
#[derive(Clone, Copy, Debug)]
pub struct KvView<'a, T> {
    /// The elements the view reads from.
    pub data: &'a [T],
    /// Element offset of row (0, 0, 0).
    pub offset: usize,
    /// Elements between consecutive pages.
    pub page_stride: usize,
    /// Elements between consecutive KV heads of a page.
    pub head_stride: usize,
    /// Elements between consecutive tokens of a page.
    pub token_stride: usize,
}

impl<'a, T> KvView<'a, T> {
    /// `data` as a contiguous `[pages, kv_heads, page_size, head_dim]` (HND) store.
    pub fn hnd(data: &'a [T], kv: &PagedKvCacheDescriptor) -> Self {
        let (heads, ps, d) =
            (kv.num_kv_heads.max(0) as usize, kv.page_size.max(0) as usize, kv.head_dim.max(0) as usize);
        let (page, row) = (heads.saturating_mul(ps).saturating_mul(d), ps.saturating_mul(d));
        Self { data, offset: 0, page_stride: page, head_stride: row, token_stride: d }
    }

    /// `data` as a contiguous `[pages, page_size, kv_heads, head_dim]` (NHD) store.
    pub fn nhd(data: &'a [T], kv: &PagedKvCacheDescriptor) -> Self {
        let (heads, ps, d) =
            (kv.num_kv_heads.max(0) as usize, kv.page_size.max(0) as usize, kv.head_dim.max(0) as usize);
        let (page, token) = (ps.saturating_mul(heads).saturating_mul(d), heads.saturating_mul(d));
        Self { data, offset: 0, page_stride: page, head_stride: d, token_stride: token }
    }

    /// Element offset of row `(page, head, slot)`.
    fn row(&self, page: usize, head: usize, slot: usize) -> usize {
        self.offset + page * self.page_stride + head * self.head_stride + slot * self.token_stride
    }

    /// Checks that every row of the store `g` describes, `pages` pages, lies inside `data`.
    fn check(&self, name: &str, g: KvGeometry, pages: usize) -> Result<()> {
        if pages == 0 {
            return Ok(());
        }
        let far = [
            (pages - 1, self.page_stride),
            (g.kv_heads - 1, self.head_stride),
            (g.page_size - 1, self.token_stride),
        ]
        .iter()
        .try_fold(self.offset, |acc, &(n, stride)| n.checked_mul(stride).and_then(|x| acc.checked_add(x)))
        .and_then(|last| last.checked_add(g.head_dim));
        match far {
            Some(end) if end <= self.data.len() => Ok(()),
            _ => Err(invalid(format!(
                "{name}: the view (offset {}, strides {} / {} / {}) reaches past its {} elements",
                self.offset,
                self.page_stride,
                self.head_stride,
                self.token_stride,
                self.data.len()
            ))),
        }
    }
}

/// [`decode_variant`] over K and V stores of any strides ([`KvView`]). The requirements are those
/// of [`decode_variant`], except that each view must keep every row of the descriptor's
/// `num_total_pages` pages inside its data (instead of an exact length).
pub fn decode_strided<T: Element>(
    desc: &BatchPagedDecodeDescriptor,
    variant: AttentionVariant<'_>,
    q: &[T],
    k: KvView<'_, T>,
    v: KvView<'_, T>,
    table: PageTable<'_>,
) -> Result<DecodeOutput> {
    let kv = &desc.paged_kv;
    if kv.element != T::KIND {
        return Err(invalid(format!("paged_kv.element is {:?} but the data is {:?}", kv.element, T::KIND)));
    }
    let g = KvGeometry {
        page_size: extent("paged_kv.page_size", kv.page_size, 1)?,
        kv_heads: extent("paged_kv.num_kv_heads", kv.num_kv_heads, 1)?,
        head_dim: extent("paged_kv.head_dim", kv.head_dim, 1)?,
    };
    let pages = extent("paged_kv.num_total_pages", kv.num_total_pages, 0)?;
    k.check("k_data", g, pages)?;
    v.check("v_data", g, pages)?;
    let widen = |view: &KvView<'_, T>, page: usize, h: usize, slot: usize, row: &mut [f64]| {
        let r = view.row(page, h, slot);
        let n = row.len();
        for (dst, src) in row.iter_mut().zip(&view.data[r..r + n]) {
            *dst = src.to_f64();
        }
    };
    let k_row = |page, h, slot, row: &mut [f64]| widen(&k, page, h, slot, row);
    let v_row = |page, h, slot, row: &mut [f64]| widen(&v, page, h, slot, row);
    decode_store(desc, &variant, q, g, k_row, v_row, table)
}

pub use crate::types::KvScales;

/// The 8-bit layout of the store's element kind, or an error naming it.
fn fp8_store(kv: &PagedKvCacheDescriptor) -> Result<Fp8Layout> {
    kv.element.fp8_layout().ok_or_else(|| {
        invalid(format!("paged_kv.element is {:?}, not an 8-bit float (E4M3 or E5M2)", kv.element))
    })
}

/// [`decode`] over an FP8 K/V cache (`paged_kv.element` E4M3 or E5M2, the stores as raw codes):
/// attention in f64 over the dequantized cache, `k = k_scale · fp8(code)` and likewise `v`. `q`
/// and the outputs keep `T`. The scales must be finite and positive; the other requirements are
/// those of [`decode`].
pub fn decode_fp8<T: Element>(
    desc: &BatchPagedDecodeDescriptor,
    q: &[T],
    k_data: &[u8],
    v_data: &[u8],
    scales: KvScales,
    table: PageTable<'_>,
) -> Result<DecodeOutput> {
    let format = fp8_store(&desc.paged_kv)?;
    let g = check_store(&desc.paged_kv, desc.paged_kv.element, k_data.len(), v_data.len())?;
    let scales = scales.check()?;
    let dequantize = |data: &[u8], scale: f32, r: usize, row: &mut [f64]| {
        let n = row.len();
        for (dst, &code) in row.iter_mut().zip(&data[r..r + n]) {
            *dst = f64::from(scale) * f64::from(fp8_to_f32(format, code));
        }
    };
    decode_store(
        desc,
        &AttentionVariant::default(),
        q,
        g,
        |page, h, slot, row| dequantize(k_data, scales.k_scale, g.row(page, h, slot), row),
        |page, h, slot, row| dequantize(v_data, scales.v_scale, g.row(page, h, slot), row),
        table,
    )
}

/// The decode of [`decode`] and [`decode_fp8`] over a checked store, whose K and V rows (at an
/// element offset, `head_dim` long) `k_row` / `v_row` write into an f64 row.
fn decode_store<T: Element>(
    desc: &BatchPagedDecodeDescriptor,
    variant: &AttentionVariant<'_>,
    q: &[T],
    g: KvGeometry,
    k_row: impl Fn(usize, usize, usize, &mut [f64]),
    v_row: impl Fn(usize, usize, usize, &mut [f64]),
    table: PageTable<'_>,
) -> Result<DecodeOutput> {
    let batch = extent("batch_size", desc.batch_size, 0)?;
    let qo_heads = extent("num_qo_heads", desc.num_qo_heads, 1)?;
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
    variant.check(qo_heads)?;

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
    let sink = |qh: usize| variant.sinks.map_or(f64::NEG_INFINITY, |s| f64::from(s[qh]));
    let cap = variant.logits_soft_cap.map(f64::from);
    for b in 0..batch {
        let len = table.request_len(b, g.page_size);
        // The attended tokens: the window's, `[first_token, len)`.
        let first_token = variant.window_left.map_or(0, |w| len.saturating_sub(w as usize + 1));
        let n = len - first_token;
        if n == 0 {
            for (qh, l) in lse[b * qo_heads..(b + 1) * qo_heads].iter_mut().enumerate() {
                *l = sink(qh) / LN_2;
            }
            continue;
        }
        let p_len =
            n.checked_mul(group).ok_or_else(|| invalid(format!("request {b}: {len} tokens is too many")))?;
        let first = table.indptr[b] as usize;
        // (page, KV head, slot) of token `t` of this request.
        let token_row =
            |h: usize, t: usize| (table.indices[first + t / g.page_size] as usize, h, t % g.page_size);
        for h in 0..g.kv_heads {
            let heads = b * qo_heads + h * group;
            for (dst, src) in qs.iter_mut().zip(&q[heads * d..(heads + group) * d]) {
                *dst = src.to_f64();
            }
            // Logits, laid out [query head of the group][attended token].
            p.clear();
            p.resize(p_len, 0.0);
            for t in 0..n {
                let (page, h, slot) = token_row(h, first_token + t);
                k_row(page, h, slot, &mut row);
                for (j, qrow) in qs.chunks_exact(d).enumerate() {
                    let s = scale * dot(qrow, &row);
                    p[j * n + t] = cap.map_or(s, |c| c * (s / c).tanh());
                }
            }
            for (j, s) in p.chunks_exact_mut(n).enumerate() {
                let sink = sink(h * group + j);
                let m = s.iter().copied().fold(sink, f64::max);
                let mut sum = (sink - m).exp();
                for x in s.iter_mut() {
                    *x = (*x - m).exp();
                    sum += *x;
                }
                sums[j] = sum;
                lse[heads + j] = m / LN_2 + sum.log2();
            }
            let out = &mut o[heads * d..(heads + group) * d];
            for t in 0..n {
                let (page, h, slot) = token_row(h, first_token + t);
                v_row(page, h, slot, &mut row);
                for (j, orow) in out.chunks_exact_mut(d).enumerate() {
                    let pt = p[j * n + t];
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
/// (reported as [`Error::InvalidPageTable`]): every request with pages has `last_page_len[b] ≥
/// 1`, no two requests write the same slot of the same page, and the page a request writes
/// appears nowhere else in the table. A request without pages appends nothing (its rows of
/// `key` and `value` are not read).
///
/// The unchecked GPU kernel does not fail on such a table: it skips a request with
/// `last_page_len` outside `[1, page_size]`, two requests sharing a slot race for it, and a
/// shared append page is written over a token another reference counts. This reference, like
/// the checked plan, rejects it instead.
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
    let g = check_kv::<T>(&desc.paged_kv, k_data.len(), v_data.len())?;
    for (dst, src) in append_rows(desc, g, key.len(), value.len(), table)? {
        k_data[dst.clone()].copy_from_slice(&key[src.clone()]);
        v_data[dst].copy_from_slice(&value[src]);
    }
    Ok(())
}

/// [`append`] into an FP8 K/V cache (`paged_kv.element` E4M3 or E5M2, the stores as raw codes):
/// each element `x` of `key` is stored as `f32_to_fp8(x / k_scale)`, the quotient rounded to
/// f32 and then to the nearest code, ties to even, saturating to the largest finite code (an
/// infinity too); NaN stays NaN ([`crate::fp8`]). `value` likewise with `v_scale`. This is the
/// quantization an FP8 append must reproduce bit for bit. Requirements and page-table rules are
/// those of [`append`], plus finite, positive scales; on error nothing is written.
pub fn append_fp8<T: Element>(
    desc: &PagedKvAppendDescriptor,
    key: &[T],
    value: &[T],
    k_data: &mut [u8],
    v_data: &mut [u8],
    scales: KvScales,
    table: PageTable<'_>,
) -> Result<()> {
    let format = fp8_store(&desc.paged_kv)?;
    let g = check_store(&desc.paged_kv, desc.paged_kv.element, k_data.len(), v_data.len())?;
    let scales = scales.check()?;
    let quantize = |dst: &mut [u8], src: &[T], scale: f32| {
        for (code, x) in dst.iter_mut().zip(src) {
            *code = f32_to_fp8(format, x.to_f64() as f32 / scale);
        }
    };
    for (dst, src) in append_rows(desc, g, key.len(), value.len(), table)? {
        quantize(&mut k_data[dst.clone()], &key[src.clone()], scales.k_scale);
        quantize(&mut v_data[dst], &value[src], scales.v_scale);
    }
    Ok(())
}

/// The (store range, token range) of every row an append writes, after checking the token
/// lengths and the page table ([`append`]'s rules).
fn append_rows(
    desc: &PagedKvAppendDescriptor,
    g: KvGeometry,
    key_len: usize,
    value_len: usize,
    table: PageTable<'_>,
) -> Result<Vec<(std::ops::Range<usize>, std::ops::Range<usize>)>> {
    let batch = extent("batch_size", desc.batch_size, 0)?;
    let d = g.head_dim;
    let token_len = product("key", &[batch, g.kv_heads, d])?;
    let shape = "[batch_size, num_kv_heads, head_dim]";
    check_len("key", key_len, token_len, shape)?;
    check_len("value", value_len, token_len, shape)?;
    let head_stride = g.page_size * d;
    let mut rows = Vec::with_capacity(batch * g.kv_heads);
    let slots = append_slots(&desc.paged_kv, batch, table)?;
    for (b, (page, slot)) in slots.into_iter().enumerate().filter_map(|(b, s)| Some((b, s?))) {
        let base = g.row(page, 0, slot);
        for h in 0..g.kv_heads {
            let (src, dst) = ((b * g.kv_heads + h) * d, base + h * head_stride);
            rows.push((dst..dst + d, src..src + d));
        }
    }
    Ok(rows)
}
