//! The CPU reference through the public API: append/decode consistency, ragged batches and
//! page-table errors.

use std::f64::consts::LN_2;

use half::{bf16, f16};
use paged_decode::page_table::{PageTableRules, validate_page_table};
use paged_decode::reference::{DecodeOutput, PageTable, append, decode};
use paged_decode::{
    BatchPagedDecodeDescriptor, Element, ElementKind, Error, PagedKvAppendDescriptor, PagedKvCacheDescriptor,
};

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
    fn uniform(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 52) as f64 - 1.0
    }
    fn vec<T: Element>(&mut self, n: usize) -> Vec<T> {
        (0..n).map(|_| T::from_f64(2.0 * self.uniform())).collect()
    }
    fn shuffle<X>(&mut self, v: &mut [X]) {
        for i in (1..v.len()).rev() {
            v.swap(i, (self.next_u64() % (i as u64 + 1)) as usize);
        }
    }
}

/// Per-request K and V sequences, each `[tokens, kv_heads, head_dim]`.
struct Sequences<T> {
    kv_heads: usize,
    head_dim: usize,
    k: Vec<Vec<T>>,
    v: Vec<Vec<T>>,
}

impl<T: Element> Sequences<T> {
    fn random(rng: &mut Rng, lens: &[usize], kv_heads: usize, head_dim: usize) -> Self {
        let row = kv_heads * head_dim;
        Self {
            kv_heads,
            head_dim,
            k: lens.iter().map(|&l| rng.vec(l * row)).collect(),
            v: lens.iter().map(|&l| rng.vec(l * row)).collect(),
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
    fn build(rng: &mut Rng, seqs: &Sequences<T>, page_size: usize, spare: usize) -> Self {
        let (h, d) = (seqs.kv_heads, seqs.head_dim);
        let pages: Vec<usize> = (0..seqs.batch()).map(|b| seqs.len(b).div_ceil(page_size)).collect();
        let used: usize = pages.iter().sum();
        let total = used + spare;
        let mut ids: Vec<i32> = (0..total as i32).collect();
        rng.shuffle(&mut ids);
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
                    let dst = ((page * h + hh) * page_size + t % page_size) * d;
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
    let mut rng = Rng(seed);
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
    rng.shuffle(&mut free);

    let append_desc = PagedKvAppendDescriptor { batch_size: lens.len() as i32, paged_kv: cache.kv };
    let q: Vec<T> = rng.vec(lens.len() * hq * d);
    for _ in 0..3 {
        let before = cache.decode(&q, hq);
        assert_same(&before, &Paged::build(&mut rng, &seqs, 5, 3).decode(&q, hq), 1e-12);

        let key: Vec<T> = rng.vec(lens.len() * hkv * d);
        let value: Vec<T> = rng.vec(lens.len() * hkv * d);
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
    let mut rng = Rng(4);
    let (hq, hkv, d) = (8, 2, 128);
    let group = hq / hkv;
    let lens = [0, 1, 0, 7, 1, 33, 16];
    let seqs = Sequences::<bf16>::random(&mut rng, &lens, hkv, d);
    let cache = Paged::build(&mut rng, &seqs, 16, 2);
    let q: Vec<bf16> = rng.vec(lens.len() * hq * d);
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
    let mut rng = Rng(5);
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
    let q0: Vec<f32> = rng.vec(hq * d);
    let q = [q0.clone(), q0].concat();
    let out = cache.decode(&q, hq);
    assert_eq!(out.o[..hq * d], out.o[hq * d..]);
    assert_eq!(out.lse[..hq], out.lse[hq..]);
}

#[test]
fn invalid_tables_are_typed_errors() {
    let mut rng = Rng(6);
    let (hq, hkv, d) = (2, 1, 64);
    let seqs = Sequences::<f16>::random(&mut rng, &[5, 0], hkv, d);
    let cache = Paged::build(&mut rng, &seqs, 4, 1);
    let desc =
        BatchPagedDecodeDescriptor { batch_size: 2, num_qo_heads: hq, sm_scale: 0.125, paged_kv: cache.kv };
    let q: Vec<f16> = rng.vec(2 * hq as usize * d);

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

    // Appending without advancing the table: request 1 owns no page.
    let append_desc = PagedKvAppendDescriptor { batch_size: 2, paged_kv: cache.kv };
    let tok: Vec<f16> = rng.vec(2 * hkv * d);
    let (mut k, mut v) = (cache.k.clone(), cache.v.clone());
    let err = append(&append_desc, &tok, &tok, &mut k, &mut v, cache.table()).unwrap_err();
    assert!(matches!(err, Error::InvalidPageTable(ref m) if m.contains("request 1")), "{err}");
    assert!(k == cache.k && v == cache.v);
}
