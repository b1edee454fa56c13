//! Random paged decode problems on the host and their device copies: shared by the GPU tests,
//! the CLI's main job and the benchmark.

use std::io::Write;
use std::sync::Arc;

use cudarc::driver::{CudaSlice, CudaStream, CudaView};
use rand::rngs::SmallRng;
use rand::seq::SliceRandom;
use rand::{Rng as _, RngCore, SeedableRng};

use paged_decode::plan::{BatchPagedDecodeArgs, PagedKvAppendArgs};
use paged_decode::reference::PageTable;
use paged_decode::tensor::{TensorMut, TensorRef, Workspace};
use paged_decode::types::*;
use paged_decode::{Error, Result};

/// The generator of the problems' random data: rand's `SmallRng`, reproducible for a given seed
/// (and version of rand).
#[derive(Debug, Clone)]
pub struct Rng(SmallRng);

impl Rng {
    /// A generator seeded with `seed`.
    pub fn new(seed: u64) -> Self {
        Self(SmallRng::seed_from_u64(seed))
    }
    /// Next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0.next_u64()
    }
    /// Uniform in `[0, n)` (0 when `n` is 0).
    pub fn below(&mut self, n: u64) -> u64 {
        if n == 0 { 0 } else { self.0.random_range(0..n) }
    }
    /// Uniform in `[-1, 1)`.
    pub fn symmetric(&mut self) -> f64 {
        self.0.random_range(-1.0..1.0)
    }
    /// Uniform random order.
    pub fn shuffle<X>(&mut self, v: &mut [X]) {
        v.shuffle(&mut self.0);
    }
}

/// Values per independently seeded block of a random buffer ([`random_vec`]).
pub const RANDOM_BLOCK: usize = 1 << 16;

/// `len` values of `draw`, filled on every core of the host: block `i` (of [`RANDOM_BLOCK`]
/// values) comes from a generator of its own, seeded from `seed`, `stream` and `i`, so the
/// contents depend on those alone and not on the number of threads. A multi-GB store takes
/// seconds instead of a minute.
pub fn random_vec<X: Send>(
    len: usize,
    seed: u64,
    stream: u64,
    draw: impl Fn(&mut Rng) -> X + Sync,
) -> Vec<X> {
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    random_vec_on(threads, len, seed, stream, draw)
}

/// [`random_vec`] on at most `threads` threads (at least one).
pub fn random_vec_on<X: Send>(
    threads: usize,
    len: usize,
    seed: u64,
    stream: u64,
    draw: impl Fn(&mut Rng) -> X + Sync,
) -> Vec<X> {
    let blocks = len.div_ceil(RANDOM_BLOCK);
    let threads = threads.clamp(1, blocks.max(1));
    let per_thread = blocks.div_ceil(threads) * RANDOM_BLOCK;
    let fill_blocks = |first_block: usize, part: &mut [std::mem::MaybeUninit<X>]| {
        for (i, block) in part.chunks_mut(RANDOM_BLOCK).enumerate() {
            let mut rng = Rng::new(block_seed(seed, stream, (first_block + i) as u64));
            for slot in block {
                slot.write(draw(&mut rng));
            }
        }
    };
    let mut v = Vec::with_capacity(len);
    let spare = &mut v.spare_capacity_mut()[..len];
    if threads == 1 {
        fill_blocks(0, spare);
    } else {
        std::thread::scope(|scope| {
            for (t, part) in spare.chunks_mut(per_thread).enumerate() {
                let fill_blocks = &fill_blocks;
                scope.spawn(move || fill_blocks(t * per_thread / RANDOM_BLOCK, part));
            }
        });
    }
    // SAFETY: the chunks cover `spare[..len]` and every slot of each was written (a panicking
    // thread propagates out of the scope above before this line).
    unsafe { v.set_len(len) };
    v
}

/// The seed of block `block` of random stream `stream` under `seed` (SplitMix64's finalizer,
/// so that neighbouring blocks and streams get unrelated generators).
fn block_seed(seed: u64, stream: u64, block: u64) -> u64 {
    let mut z = seed ^ stream.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ block.wrapping_mul(0xD1B5_4A32_D192_ED03);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// Sizes of a decode problem; lengths are per request, pages are allocated in random order.
#[derive(Debug, Clone, PartialEq)]
pub struct ProblemSpec {
    /// K/V length of each request; its length is the batch size.
    pub lens: Vec<usize>,
    /// Query/output heads.
    pub num_qo_heads: usize,
    /// K/V heads.
    pub num_kv_heads: usize,
    /// Head dimension.
    pub head_dim: usize,
    /// Tokens per page.
    pub page_size: usize,
    /// Scale applied to `q·k` before the softmax.
    pub sm_scale: f32,
    /// Multiplies the random queries: larger values give peakier softmaxes.
    pub q_scale: f64,
    /// Unused pages added to the store (so page ids are not dense).
    pub spare_pages: usize,
    /// Unused entries (valid page ids) after the last request's in `indices`: a page-table buffer
    /// larger than the batch needs, as a server sizes it for its largest batch.
    pub indices_slack: usize,
    /// Seed of the random data and page permutation.
    pub seed: u64,
    /// The store's slots that no request reads (the tail of each request's last page, the
    /// spare pages) hold NaN (an 8-bit store: its NaN code) instead of random values, so that a
    /// kernel that loads them and masks their scores fails its check (NaN times a zero weight
    /// is NaN). Off where a test changes the page table after drawing the problem.
    pub poison_unused_slots: bool,
}

impl ProblemSpec {
    /// `batch` requests of `kv_len` tokens, `1/sqrt(d)` scaling. (Like `vec!`, it cannot
    /// allocate `batch` lengths beyond memory.)
    pub fn uniform(batch: usize, kv_len: usize, hq: usize, hkv: usize, d: usize, page: usize) -> Self {
        Self {
            lens: vec![kv_len; batch],
            num_qo_heads: hq,
            num_kv_heads: hkv,
            head_dim: d,
            page_size: page,
            sm_scale: 1.0 / (d as f32).sqrt(),
            q_scale: 1.0,
            spare_pages: 0,
            indices_slack: 0,
            seed: 0x5eed,
            poison_unused_slots: false,
        }
    }

    /// Number of requests.
    pub fn batch(&self) -> usize {
        self.lens.len()
    }

    /// Bytes of K and V read (what FlashInfer's harness counts, plus q); saturating.
    pub fn kv_bytes(&self, element: ElementKind) -> usize {
        self.bytes_moved(element, element, None)
    }

    /// [`Self::kv_bytes`] with a sliding window: only the window's K/V, `min(len, window_left +
    /// 1)` tokens per request (as the anchor harness counts them).
    pub fn kv_bytes_window(&self, element: ElementKind, window_left: Option<u32>) -> usize {
        self.bytes_moved(element, element, window_left)
    }

    /// Bytes of K and V of `cache` elements read (only a sliding window's tokens) plus q and o of
    /// `q` elements (FlashInfer's harness's count: `2 · Σ len · hkv · d · sizeof(cache) + 2 · |q| ·
    /// sizeof(q)`); saturating.
    pub fn bytes_moved(&self, q: ElementKind, cache: ElementKind, window_left: Option<u32>) -> usize {
        let attended = |l: usize| window_left.map_or(l, |w| l.min((w as usize).saturating_add(1)));
        let tokens = self.lens.iter().fold(0usize, |acc, &l| acc.saturating_add(attended(l)));
        let product = |dims: &[usize]| dims.iter().fold(2usize, |acc, &d| acc.saturating_mul(d));
        product(&[tokens, self.num_kv_heads, self.head_dim, cache.size_bytes()]).saturating_add(product(&[
            self.batch(),
            self.num_qo_heads,
            self.head_dim,
            q.size_bytes(),
        ]))
    }

    /// Checks that the sizes describe a problem the descriptors can express: positive heads,
    /// head_dim and page size, every extent and page count within `i32`, q in `isize::MAX` bytes
    /// of `element`, and a K/V store of `cache` elements that the kernels address (at most
    /// 2^32 - 1 rows and 2^32 16-byte units), before anything is allocated.
    fn check(&self, element: ElementKind, cache: ElementKind) -> Result<()> {
        let fits_i32 = |name: &str, v: usize| -> Result<i32> {
            i32::try_from(v).map_err(|_| invalid(format!("{name} = {v} does not fit in i32")))
        };
        for (name, v) in [
            ("num_qo_heads", self.num_qo_heads),
            ("num_kv_heads", self.num_kv_heads),
            ("head_dim", self.head_dim),
            ("page_size", self.page_size),
        ] {
            if fits_i32(name, v)? < 1 {
                return Err(invalid(format!("{name} must be at least 1")));
            }
        }
        fits_i32("batch + 1", self.batch().saturating_add(1))?;
        let pages = self.lens.iter().fold(0usize, |acc, &l| acc.saturating_add(l.div_ceil(self.page_size)));
        fits_i32("total pages", pages.saturating_add(self.spare_pages))?;
        fits_i32("indices", pages.saturating_add(self.indices_slack))?;
        let q = [self.batch(), self.num_qo_heads, self.head_dim];
        let q_limit = isize::MAX as usize / element.size_bytes();
        if q.iter().try_fold(1usize, |acc, &d| acc.checked_mul(d)).is_none_or(|n| n > q_limit) {
            return Err(invalid(format!("q of {q:?} elements does not fit in memory")));
        }
        let rows = [pages.saturating_add(self.spare_pages).max(1), self.num_kv_heads, self.page_size]
            .iter()
            .fold(1u128, |acc, &d| acc.saturating_mul(d as u128));
        let units = rows.saturating_mul((self.head_dim * cache.size_bytes()) as u128) / 16;
        if rows > u32::MAX as u128 || units > u32::MAX as u128 {
            return Err(invalid(format!(
                "a K/V store of {rows} rows of {} bytes: the kernels address at most 2^32 - 1 rows \
                 and 64 GiB per store",
                self.head_dim * cache.size_bytes()
            )));
        }
        Ok(())
    }
}

/// Element types of the problems' K/V stores: q's own type, or 8-bit codes of random values
/// quantized with the problem's scales ([`HostProblem::scales`]).
pub trait ProblemCache: CacheElement {
    /// The stored element for the value `v` of a store with dequantization scale `scale`: `v`
    /// rounded, or the code nearest `v / scale`.
    fn store(v: f64, scale: f32) -> Self;
    /// The value the element stands for under `scale`, exactly.
    fn value(self, scale: f32) -> f64;
    /// The element's bits (8-bit codes; 0 for the other types).
    fn code(self) -> u8;
}

macro_rules! problem_cache_element {
    ($($t:ty),*) => {$(
        impl ProblemCache for $t {
            fn store(v: f64, _: f32) -> Self {
                <$t as Element>::from_f64(v)
            }
            fn value(self, _: f32) -> f64 {
                Element::to_f64(self)
            }
            fn code(self) -> u8 {
                0
            }
        }
    )*};
}
problem_cache_element!(half::f16, half::bf16, f32);

macro_rules! problem_cache_fp8 {
    ($($t:ty),*) => {$(
        impl ProblemCache for $t {
            fn store(v: f64, scale: f32) -> Self {
                let format = Self::CACHE_KIND.fp8_layout().expect("an 8-bit format");
                <$t>::from_bits(paged_decode::fp8::f32_to_fp8(format, v as f32 / scale))
            }
            fn value(self, scale: f32) -> f64 {
                let format = Self::CACHE_KIND.fp8_layout().expect("an 8-bit format");
                f64::from(scale) * f64::from(paged_decode::fp8::fp8_to_f32(format, self.to_bits()))
            }
            fn code(self) -> u8 {
                self.to_bits()
            }
        }
    )*};
}
problem_cache_fp8!(paged_decode::float8::F8E4M3, paged_decode::float8::F8E5M2);

/// Key and value rows of `len` elements for a quantizing append: values up to twice E4M3's range
/// after [`FP8_PROBLEM_SCALES`], and in the key the special values every 5th element from the
/// first (±inf, NaN, -0, 1e-7, 3e4, and at element 30 a NaN of the other sign: the device's
/// arithmetic makes every NaN positive). `len` ≥ 31.
pub fn quantization_tokens<T: Element>(rng: &mut Rng, len: usize) -> (Vec<T>, Vec<T>) {
    let mut key: Vec<T> = (0..len).map(|_| T::from_f64(rng.symmetric() * 4.0)).collect();
    let value: Vec<T> = (0..len).map(|_| T::from_f64(rng.symmetric() * 4.0)).collect();
    let specials = [f64::INFINITY, f64::NEG_INFINITY, f64::NAN, -0.0, 1e-7, 3e4, -f64::NAN];
    for (i, x) in specials.into_iter().enumerate() {
        key[i * 5] = T::from_f64(x);
    }
    (key, value)
}

/// (request, KV head) rows of an append of `desc`: the key and value tokens hold this many
/// `head_dim` rows.
pub fn append_rows(desc: &PagedKvAppendDescriptor) -> usize {
    desc.batch_size.max(0) as usize * desc.paged_kv.num_kv_heads.max(0) as usize
}

/// Dequantization scales of the problems' 8-bit stores: random values in `[-1, 1)` become codes
/// up to ±270 (within E4M3's ±448), and scales that are not powers of two exercise the rounding.
pub const FP8_PROBLEM_SCALES: KvScales = KvScales { k_scale: 0.0042, v_scale: 0.0037 };

/// A decode problem in host memory: q and o of `T`, K and V of `C`.
#[derive(Debug, Clone)]
pub struct HostProblem<T, C = T> {
    /// The sizes this problem was generated from.
    pub spec: ProblemSpec,
    /// The matching decode descriptor.
    pub desc: BatchPagedDecodeDescriptor,
    /// `[batch, num_qo_heads, head_dim]` queries.
    pub q: Vec<T>,
    /// `[num_total_pages, num_kv_heads, page_size, head_dim]` key store.
    pub k_data: Vec<C>,
    /// `[num_total_pages, num_kv_heads, page_size, head_dim]` value store.
    pub v_data: Vec<C>,
    /// Page ids of all requests, concatenated.
    pub indices: Vec<i32>,
    /// `[batch + 1]` offsets into `indices`.
    pub indptr: Vec<i32>,
    /// `[batch]` tokens used in each request's last page.
    pub last_page_len: Vec<i32>,
    /// The store's dequantization scales: [`FP8_PROBLEM_SCALES`] for 8-bit codes, else 1.
    pub scales: KvScales,
}

impl<T: Element, C: ProblemCache> HostProblem<T, C> {
    /// Random q/K/V in `[-1, 1)` and a page table over a random permutation of the pages;
    /// [`Error::InvalidProblem`] for sizes no descriptor can express (a zero head count,
    /// head_dim or page size, extents beyond `i32`, buffers beyond `isize::MAX` bytes).
    pub fn random(spec: &ProblemSpec) -> Result<Self> {
        spec.check(T::KIND, C::CACHE_KIND)?;
        let fp8 = C::CACHE_KIND.fp8_layout().is_some();
        let scales = if fp8 { FP8_PROBLEM_SCALES } else { KvScales::ONE };
        let mut rng = Rng::new(spec.seed);
        let ps = spec.page_size;
        let pages_per: Vec<usize> = spec.lens.iter().map(|&l| l.div_ceil(ps)).collect();
        let used: usize = pages_per.iter().sum();
        let total_pages = (used + spec.spare_pages).max(1);
        let mut perm: Vec<i32> = (0..total_pages as i32).collect();
        rng.shuffle(&mut perm);
        let mut indptr = vec![0i32];
        for &n in &pages_per {
            indptr.push(indptr.last().unwrap() + n as i32);
        }
        let mut indices = perm[..used].to_vec();
        indices.extend((0..spec.indices_slack).map(|i| perm[i % total_pages]));
        let last_page_len = spec
            .lens
            .iter()
            .map(|&l| if l == 0 { 0 } else { (l - (l.div_ceil(ps) - 1) * ps) as i32 })
            .collect();
        let desc = BatchPagedDecodeDescriptor {
            batch_size: spec.batch() as i32,
            num_qo_heads: spec.num_qo_heads as i32,
            sm_scale: spec.sm_scale,
            paged_kv: PagedKvCacheDescriptor {
                page_size: ps as i32,
                num_total_pages: total_pages as i32,
                num_kv_heads: spec.num_kv_heads as i32,
                head_dim: spec.head_dim as i32,
                element: C::CACHE_KIND,
            },
        };
        let q_len = spec.batch() * spec.num_qo_heads * spec.head_dim;
        let q = random_vec(q_len, spec.seed, 1, |rng| T::from_f64(rng.symmetric() * spec.q_scale));
        let store = total_pages * spec.num_kv_heads * ps * spec.head_dim;
        let mut k_data = random_vec(store, spec.seed, 2, |rng| C::store(rng.symmetric(), scales.k_scale));
        let mut v_data = random_vec(store, spec.seed, 3, |rng| C::store(rng.symmetric(), scales.v_scale));
        if spec.poison_unused_slots {
            // Slots a page's requests use: every page holds one request's tokens (a permutation).
            let mut used_slots = vec![0usize; total_pages];
            for (b, &len) in spec.lens.iter().enumerate() {
                for (j, &page) in indices[indptr[b] as usize..indptr[b + 1] as usize].iter().enumerate() {
                    used_slots[page as usize] = (len - j * ps).min(ps);
                }
            }
            let (k_nan, v_nan) = (C::store(f64::NAN, scales.k_scale), C::store(f64::NAN, scales.v_scale));
            let row = ps * spec.head_dim;
            for (page, &used) in used_slots.iter().enumerate() {
                for h in 0..spec.num_kv_heads {
                    let unused = (page * spec.num_kv_heads + h) * row + used * spec.head_dim
                        ..(page * spec.num_kv_heads + h + 1) * row;
                    k_data[unused.clone()].fill(k_nan);
                    v_data[unused].fill(v_nan);
                }
            }
        }
        Ok(Self { spec: spec.clone(), desc, q, k_data, v_data, indices, indptr, last_page_len, scales })
    }

    /// An append problem drawn from `rng`: 7 requests of 3 KV heads (6 query heads) with
    /// head_dim `d` on pages of `page` tokens (3 spare), their tables already advanced for the new
    /// token (the first request's new token fills its last page), and its append descriptor.
    pub fn random_append(
        rng: &mut Rng,
        page: usize,
        d: usize,
        seed: u64,
    ) -> Result<(Self, PagedKvAppendDescriptor)> {
        let lens =
            (0..7).map(|i| if i == 0 { page } else { 1 + rng.below(3 * page as u64) as usize }).collect();
        // 7 × 3 (request, KV head) rows: not a whole number of the append kernel's CTAs.
        let spec = ProblemSpec { lens, spare_pages: 3, seed, ..ProblemSpec::uniform(7, 0, 6, 3, d, page) };
        let host = Self::random(&spec)?;
        let desc = PagedKvAppendDescriptor { batch_size: 7, paged_kv: host.desc.paged_kv };
        Ok((host, desc))
    }

    /// The page table borrowed from this problem.
    pub fn page_table(&self) -> PageTable<'_> {
        PageTable { indptr: &self.indptr, indices: &self.indices, last_page_len: &self.last_page_len }
    }

    /// Float64 reference output of request `b` alone (`o`: `[Hq, D]`, `lse`: `[Hq]`);
    /// [`Error::InvalidProblem`] when `b` or its rows lie outside the problem.
    pub fn reference_request(&self, b: usize) -> Result<paged_decode::reference::DecodeOutput> {
        self.reference_request_variant(b, Default::default(), KvLayout::Hnd)
    }

    /// [`Self::reference_request`] with an attention variant, the stores read as `layout`
    /// (contiguous HND or NHD: the same buffers, another order of the same random data).
    pub fn reference_request_variant(
        &self,
        b: usize,
        variant: paged_decode::reference::AttentionVariant<'_>,
        layout: KvLayout,
    ) -> Result<paged_decode::reference::DecodeOutput> {
        let outside = || invalid(format!("request {b} lies outside this problem"));
        let at = |i: usize| self.indptr.get(i).and_then(|&v| usize::try_from(v).ok());
        let (start, stop) = (at(b).ok_or_else(outside)?, at(b + 1).ok_or_else(outside)?);
        let row = self.spec.num_qo_heads.saturating_mul(self.spec.head_dim);
        let q =
            self.q.get(b.saturating_mul(row)..b.saturating_add(1).saturating_mul(row)).ok_or_else(outside)?;
        let indices = self.indices.get(start..stop).ok_or_else(outside)?;
        let desc = BatchPagedDecodeDescriptor { batch_size: 1, ..self.desc };
        let indptr = [0, indices.len() as i32];
        let last = [*self.last_page_len.get(b).ok_or_else(outside)?];
        let table = PageTable { indptr: &indptr, indices, last_page_len: &last };
        if C::CACHE_KIND.fp8_layout().is_some() {
            // The request's own pages, renumbered from 0 (a page's elements are contiguous in HND
            // and NHD alike), so that no more of the store is converted than the request reads.
            let kv = &desc.paged_kv;
            let page =
                [kv.num_kv_heads, kv.page_size, kv.head_dim].iter().map(|&x| x.max(0) as usize).product();
            let pages = indices.len().max(1);
            let gather = |data: &[C]| -> Result<Vec<C>> {
                let mut out = Vec::with_capacity(pages * page);
                for &id in indices {
                    let first = usize::try_from(id).map_err(|_| outside())?.saturating_mul(page);
                    out.extend_from_slice(data.get(first..first.saturating_add(page)).ok_or_else(outside)?);
                }
                out.resize(pages * page, C::store(0.0, 1.0)); // an empty request: one page of zeros
                Ok(out)
            };
            let (k, v) = (gather(&self.k_data)?, gather(&self.v_data)?);
            let renumbered: Vec<i32> = (0..indices.len() as i32).collect();
            let table = PageTable { indices: &renumbered, ..table };
            let kv = PagedKvCacheDescriptor { num_total_pages: pages as i32, ..*kv };
            let desc = BatchPagedDecodeDescriptor { paged_kv: kv, ..desc };
            if variant == Default::default() && layout == KvLayout::Hnd {
                let codes = |data: &[C]| data.iter().map(|c| c.code()).collect::<Vec<u8>>();
                return paged_decode::reference::decode_fp8(
                    &desc,
                    q,
                    &codes(&k),
                    &codes(&v),
                    self.scales,
                    table,
                );
            }
            // A variant or another layout: the codes' values (scale × code, in f32, within 6e-8
            // of the float64 values) under f32 queries (exact), over f32 stores.
            let values =
                |data: &[C], scale: f32| data.iter().map(|&c| c.value(scale) as f32).collect::<Vec<_>>();
            let (k, v) = (values(&k, self.scales.k_scale), values(&v, self.scales.v_scale));
            let q: Vec<f32> = q.iter().map(|x| x.to_f64() as f32).collect();
            let kv = PagedKvCacheDescriptor { element: ElementKind::F32, ..kv };
            let desc = BatchPagedDecodeDescriptor { paged_kv: kv, ..desc };
            let (k, v) = (kv_view(&k, &kv, layout), kv_view(&v, &kv, layout));
            return paged_decode::reference::decode_strided(&desc, variant, &q, k, v, table);
        }
        let (k, v) = self.store_of_q_type()?;
        let kv = self.desc.paged_kv;
        paged_decode::reference::decode_strided(
            &desc,
            variant,
            q,
            kv_view(k, &kv, layout),
            kv_view(v, &kv, layout),
            table,
        )
    }

    /// Float64 reference output of every request.
    pub fn reference(&self) -> Result<paged_decode::reference::DecodeOutput> {
        self.reference_of(&self.desc, &self.q, self.page_table())
    }

    /// The reference over this problem's store: [`paged_decode::reference::decode_fp8`] over
    /// 8-bit codes, else [`paged_decode::reference::decode`].
    fn reference_of(
        &self,
        desc: &BatchPagedDecodeDescriptor,
        q: &[T],
        table: PageTable<'_>,
    ) -> Result<paged_decode::reference::DecodeOutput> {
        if C::CACHE_KIND.fp8_layout().is_some() {
            let codes = |data: &[C]| data.iter().map(|c| c.code()).collect::<Vec<u8>>();
            let (k, v) = (codes(&self.k_data), codes(&self.v_data));
            paged_decode::reference::decode_fp8(desc, q, &k, &v, self.scales, table)
        } else {
            let (k, v) = self.store_of_q_type()?;
            paged_decode::reference::decode(desc, q, k, v, table)
        }
    }

    /// The K and V stores as elements of q's type, borrowed: a store that is not of 8-bit codes
    /// holds q's type (the plans accept no other).
    fn store_of_q_type(&self) -> Result<(&[T], &[T])> {
        let k = (&self.k_data as &dyn std::any::Any).downcast_ref::<Vec<T>>();
        let v = (&self.v_data as &dyn std::any::Any).downcast_ref::<Vec<T>>();
        match (k, v) {
            (Some(k), Some(v)) => Ok((k, v)),
            _ => Err(invalid(format!("a {:?} store under {:?} queries", C::CACHE_KIND, T::KIND))),
        }
    }
}

/// A contiguous store of `kv`'s geometry viewed as `layout` (HND or NHD).
fn kv_view<'a, E: Element>(
    data: &'a [E],
    kv: &PagedKvCacheDescriptor,
    layout: KvLayout,
) -> paged_decode::reference::KvView<'a, E> {
    use paged_decode::reference::KvView;
    match layout {
        KvLayout::Nhd => KvView::nhd(data, kv),
        _ => KvView::hnd(data, kv),
    }
}

/// Device copies of a [`HostProblem`] plus outputs and a workspace.
#[derive(Debug)]
pub struct DeviceProblem<T, C = T> {
    /// Queries.
    pub q: CudaSlice<T>,
    /// Key store.
    pub k_data: CudaSlice<C>,
    /// Value store.
    pub v_data: CudaSlice<C>,
    /// Page ids (at least one element, so the slice has an address).
    pub indices: CudaSlice<i32>,
    /// Offsets into `indices`.
    pub indptr: CudaSlice<i32>,
    /// Tokens used in each request's last page.
    pub last_page_len: CudaSlice<i32>,
    /// Output rows, `[batch, num_qo_heads, head_dim]`.
    pub o: CudaSlice<T>,
    /// Base-2 log-sum-exp per row, `[batch, num_qo_heads]`.
    pub lse: CudaSlice<f32>,
    /// Workspace bytes (at least one).
    pub workspace: CudaSlice<u8>,
    /// Element strides of the K/V views over `k_data` / `v_data` (contiguous HND from
    /// [`Self::upload`]; [`Self::with_layout`] changes them).
    pub kv_stride: [i64; 4],
    shape: (i32, i32, i32, [i32; 4]),
}

/// NaN rows of a [`DeviceProblem`]'s output sizes on the device ([`DeviceProblem::output_poison`]).
#[derive(Debug)]
pub struct OutputPoison<T> {
    o: CudaSlice<T>,
    lse: CudaSlice<f32>,
}

impl<T: Element, C: CacheElement> DeviceProblem<T, C> {
    /// Uploads `host` and allocates outputs and `workspace_bytes` of workspace.
    pub fn upload(
        stream: &Arc<CudaStream>,
        host: &HostProblem<T, C>,
        workspace_bytes: usize,
    ) -> Result<Self> {
        let kv = &host.desc.paged_kv;
        let (b, hq, d) = (host.desc.batch_size, host.desc.num_qo_heads, kv.head_dim);
        let n = i32::try_from(host.indices.len()).map_err(|_| invalid("more than i32::MAX page ids"))?;
        // A zero-length slice has no device address; keep at least one element.
        let indices = if host.indices.is_empty() { vec![0] } else { host.indices.clone() };
        Ok(Self {
            q: stream.clone_htod(&host.q)?,
            k_data: stream.clone_htod(&host.k_data)?,
            v_data: stream.clone_htod(&host.v_data)?,
            indices: stream.clone_htod(&indices)?,
            indptr: stream.clone_htod(&host.indptr)?,
            last_page_len: stream.clone_htod(&host.last_page_len)?,
            o: stream.alloc_zeros(host.q.len())?,
            lse: stream.alloc_zeros((b.max(0) as usize).saturating_mul(hq.max(0) as usize))?,
            workspace: stream.alloc_zeros(workspace_bytes.max(1))?,
            kv_stride: KvLayout::Hnd.strides(kv),
            shape: (b, hq, n, [kv.num_total_pages, kv.num_kv_heads, kv.page_size, d]),
        })
    }

    /// These buffers with the K/V stores viewed as contiguous `layout` (HND or NHD: the same
    /// number of elements, the host data in another order).
    pub fn with_layout(self, layout: KvLayout, kv: &PagedKvCacheDescriptor) -> Self {
        Self { kv_stride: layout.strides(kv), ..self }
    }

    /// Overwrites `o` and `lse` with NaN on `stream`, so that a row a launch leaves unwritten
    /// fails its check instead of passing on an earlier result.
    pub fn poison_outputs(&mut self, stream: &Arc<CudaStream>) -> Result<()> {
        stream.memcpy_htod(&vec![T::from_f64(f64::NAN); self.o.len()], &mut self.o)?;
        stream.memcpy_htod(&vec![f32::NAN; self.lse.len()], &mut self.lse)?;
        Ok(())
    }

    /// NaN rows the size of `o` and `lse`, for [`Self::poison_outputs_from`].
    pub fn output_poison(&self, stream: &Arc<CudaStream>) -> Result<OutputPoison<T>> {
        Ok(OutputPoison {
            o: stream.clone_htod(&vec![T::from_f64(f64::NAN); self.o.len()])?,
            lse: stream.clone_htod(&vec![f32::NAN; self.lse.len()])?,
        })
    }

    /// As [`Self::poison_outputs`], by device copies from `poison`, so that a captured graph
    /// poisons the outputs before each of its runs (a copy from pageable host memory cannot be
    /// captured).
    pub fn poison_outputs_from(&mut self, stream: &Arc<CudaStream>, poison: &OutputPoison<T>) -> Result<()> {
        stream.memcpy_dtod(&poison.o, &mut self.o)?;
        stream.memcpy_dtod(&poison.lse, &mut self.lse)?;
        Ok(())
    }

    /// Decode arguments viewing these buffers.
    pub fn args(&mut self) -> BatchPagedDecodeArgs<'_, T, C> {
        self.args_and_workspace().0
    }

    /// Decode arguments and the workspace, borrowed together.
    pub fn args_and_workspace(&mut self) -> (BatchPagedDecodeArgs<'_, T, C>, Workspace<'_>) {
        self.args_and_workspace_with_q(None)
    }

    /// As [`Self::args_and_workspace`], with the queries read from `q` (same shape) when given,
    /// e.g. the output of another problem.
    ///
    /// The workspace is the problem's own, allocated zeroed by [`Self::upload`] for one plan:
    /// use a problem with plans of one split state (one batch size and head count), as the
    /// tests and the bench do, or zero `self.workspace` again in between.
    pub fn args_and_workspace_with_q<'a>(
        &'a mut self,
        q: Option<CudaView<'a, T>>,
    ) -> (BatchPagedDecodeArgs<'a, T, C>, Workspace<'a>) {
        let (b, hq, n, store) = self.shape;
        let d = store[3];
        let args = BatchPagedDecodeArgs {
            q: TensorRef::new(q.unwrap_or_else(|| self.q.slice(..)), [b, hq, d]),
            k_data: TensorRef::strided(self.k_data.slice(..), store, self.kv_stride),
            v_data: TensorRef::strided(self.v_data.slice(..), store, self.kv_stride),
            indices: TensorRef::new(self.indices.slice(..), [n]),
            indptr: TensorRef::new(self.indptr.slice(..), [b.saturating_add(1)]),
            last_page_len: TensorRef::new(self.last_page_len.slice(..), [b]),
            o: TensorMut::new(self.o.slice_mut(..), [b, hq, d]),
            lse: TensorMut::new(self.lse.slice_mut(..), [b, hq]),
        };
        // SAFETY: `upload` allocates the workspace zeroed, and the plans that use it (one split
        // state, as documented above) leave their counters zero after every launch.
        (args, unsafe { Workspace::assume_zeroed(self.workspace.slice_mut(..)) })
    }

    /// Append arguments writing `key`/`value` into this problem's store.
    pub fn append_args<'a>(
        &'a mut self,
        key: &'a CudaSlice<T>,
        value: &'a CudaSlice<T>,
    ) -> PagedKvAppendArgs<'a, T, C> {
        let (b, _, n, store) = self.shape;
        let row = [b, store[1], store[3]];
        PagedKvAppendArgs {
            key: TensorRef::new(key.slice(..), row),
            value: TensorRef::new(value.slice(..), row),
            k_data: TensorMut::strided(self.k_data.slice_mut(..), store, self.kv_stride),
            v_data: TensorMut::strided(self.v_data.slice_mut(..), store, self.kv_stride),
            indices: TensorRef::new(self.indices.slice(..), [n]),
            indptr: TensorRef::new(self.indptr.slice(..), [b.saturating_add(1)]),
            last_page_len: TensorRef::new(self.last_page_len.slice(..), [b]),
        }
    }
}

/// Relative L2 error `‖out − ref‖ / ‖ref‖` (NaN in `out` gives NaN; a zero reference compares
/// absolutely; `out` of another length than `reference` gives NaN, which no tolerance passes).
pub fn rel_l2(out: impl IntoIterator<Item = f64>, reference: &[f64]) -> f64 {
    let (mut num, mut den) = (0f64, 0f64);
    let mut out = out.into_iter();
    for r in reference {
        let Some(o) = out.next() else { return f64::NAN };
        num += (o - r) * (o - r);
        den += r * r;
    }
    if out.next().is_some() {
        return f64::NAN;
    }
    if den == 0.0 { num.sqrt() } else { (num / den).sqrt() }
}

/// Compares every request of a decode's `o` and `lse` with the reference `r` at `T`'s
/// tolerances ([`tolerances`]; an empty row's lse must be `-inf`): the worst relative error, or
/// what the first request that misses got wrong.
pub fn compare_outputs<T: Element>(
    spec: &ProblemSpec,
    o: &[T],
    lse: &[f32],
    r: &paged_decode::reference::DecodeOutput,
) -> std::result::Result<f64, String> {
    let (heads, row) = (spec.num_qo_heads, spec.num_qo_heads * spec.head_dim);
    let mut worst: f64 = 0.0;
    for b in 0..spec.batch() {
        let out = o.get(b * row..(b + 1) * row).ok_or("o is shorter than the batch")?;
        let out_lse = lse.get(b * heads..(b + 1) * heads).ok_or("lse is shorter than the batch")?;
        let want_o = r.o.get(b * row..(b + 1) * row).unwrap_or(&[]);
        let want_lse = r.lse.get(b * heads..(b + 1) * heads).unwrap_or(&[]);
        worst = worst.max(compare_request(spec, b, (out, out_lse), (want_o, want_lse))?);
    }
    Ok(worst)
}

/// Compares request `b`'s output rows (`o`: `[Hq, D]`, `lse`: `[Hq]`) with its reference rows
/// ([`HostProblem::reference_request`]'s, or a batch reference's); returns the relative error of
/// `o`. NaN never passes, a `-inf` reference lse takes exactly `-inf`, and a request with no
/// tokens exactly `o = 0`.
pub fn compare_request<T: Element>(
    spec: &ProblemSpec,
    b: usize,
    (o, lse): (&[T], &[f32]),
    (want_o, want_lse): (&[f64], &[f64]),
) -> std::result::Result<f64, String> {
    let (tol, lse_tol) = tolerances(T::KIND);
    let len = spec.lens.get(b).copied().unwrap_or(0);
    if o.len() != want_o.len() || lse.len() != want_lse.len() {
        return Err(format!("request {b}: output rows of another shape than the reference's"));
    }
    if len == 0 && o.iter().any(|x| x.to_f64() != 0.0) {
        return Err(format!("request {b} (no tokens): o is not 0"));
    }
    let err = rel_l2(o.iter().map(|x| x.to_f64()), want_o);
    if err.is_nan() || err > tol {
        return Err(format!("request {b} (len {len}) rel err {err:.3e} > {tol:.0e}"));
    }
    for (h, (&got, &want)) in lse.iter().zip(want_lse).enumerate() {
        let got = got as f64;
        let ok = if want == f64::NEG_INFINITY { got == want } else { (got - want).abs() <= lse_tol };
        if !ok {
            return Err(format!("request {b} (len {len}) head {h}: lse {got} vs reference {want}"));
        }
    }
    Ok(err)
}

/// Relative-error thresholds per element type (f32 ≤ 1e-5, f16 ≤ 1e-3, bf16 ≤ 8e-3) and the
/// absolute lse threshold.
pub fn tolerances(kind: ElementKind) -> (f64, f64) {
    match kind {
        ElementKind::F32 => (1e-5, 1e-5),
        ElementKind::F16 => (1e-3, 1e-3),
        _ => (8e-3, 1e-3),
    }
}

fn invalid(msg: impl Into<String>) -> Error {
    Error::InvalidProblem(msg.into())
}

/// The base seed of test `test`'s randomized sweep: `PAGED_DECODE_SEED`, or a fresh one from the
/// clock, so that every run draws new inputs. Written to stderr directly (the test harness does
/// not capture it), so that a failing run can be repeated.
pub fn sweep_seed(test: &str) -> u64 {
    let seed = std::env::var("PAGED_DECODE_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or_else(|| {
        let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
        block_seed(now.as_nanos() as u64, u64::from(std::process::id()), 0)
    });
    let _ =
        writeln!(std::io::stderr().lock(), "{test}: seed {seed} (PAGED_DECODE_SEED={seed} repeats this run)");
    seed
}

/// The number in environment variable `name` (the GPU tests' sweep sizes, seeds and replay
/// counts), or `default` when it is unset or not a number.
pub fn env_number<N: std::str::FromStr>(name: &str, default: N) -> N {
    std::env::var(name).ok().and_then(|s| s.parse().ok()).unwrap_or(default)
}
