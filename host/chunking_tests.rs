//! The length-aware split's arithmetic (`kernels-gpu/src/chunking.rs`, shared with the device
//! partition) on the CPU: a serial model of the partition built from the same functions must
//! always fit its grid, cover every token once and stay within the merge's chunk limit.

use proptest::prelude::*;

use crate::chunking::{chunk_bounds, chunk_size, chunks_of, max_items, request_chunks, round16};
use crate::params::MAX_CHUNKS_PER_REQUEST;
use crate::plan::MAX_TABLE_TOKENS;

/// (chunk size, chunks per request) as every CTA of the split kernel computes them, requests of
/// at most `unsplit` tokens kept whole.
fn partition_keeping(
    lens: &[u32],
    num_chunks: u32,
    min_chunk: u32,
    preferred: u32,
    balance: u32,
    unsplit: u32,
) -> (u32, Vec<u32>) {
    let total = lens.iter().map(|&l| l as u64).sum();
    let longest = lens.iter().copied().max().unwrap_or(0);
    let chunks_needed = |c: u32| lens.iter().map(|&l| request_chunks(l, c, unsplit) as u64).sum::<u64>();
    let (lo, hi) = chunk_bounds(total, longest, lens.len() as u32, num_chunks, min_chunk, preferred, balance);
    assert!(lo <= hi && lo.is_multiple_of(16) && hi.is_multiple_of(16), "bounds {lo} {hi}");
    let needed = chunks_needed(hi);
    assert!(needed <= num_chunks as u64, "upper bound {hi} needs {needed} > {num_chunks} chunks");
    let chunk = chunk_size(lo, hi, |c| chunks_needed(c) <= num_chunks as u64);
    // The device skips the search when every request fits one chunk of `lo`, or when the batch
    // is one request: the same result.
    assert!(longest > lo || chunk == lo, "shortcut: lo {lo}, chunk {chunk}");
    // It skips the bounds too when every request is at most `min_chunk` (rounded up to 16, at
    // most `lo`) or kept whole: one chunk each, as the search gives.
    if longest <= round16(min_chunk as u64).max(unsplit) {
        assert!(round16(min_chunk as u64) <= lo, "lo {lo} below min_chunk {min_chunk}");
        assert!(lens.iter().all(|&l| request_chunks(l, chunk, unsplit) == 1), "shortcut: chunk {chunk}");
    }
    assert!(lens.len() != 1 || chunk == lo, "single request: lo {lo}, chunk {chunk}");
    (chunk, lens.iter().map(|&l| request_chunks(l, chunk, unsplit)).collect())
}

/// [`partition_keeping`] without whole requests (the f32 kernel's partition).
fn partition(lens: &[u32], num_chunks: u32, min_chunk: u32, preferred: u32, balance: u32) -> (u32, Vec<u32>) {
    partition_keeping(lens, num_chunks, min_chunk, preferred, balance, 0)
}

/// Whether chunks `[j·C, (j + 1)·C)` for `j < n - 1`, then `[(n - 1)·C, len)`, are all non-empty
/// and, but for a request kept whole (`n = 1`), each at most `C` tokens (an empty request: any
/// `n`).
fn chunks_cover(len: u32, n: u32, chunk: u32) -> bool {
    len == 0
        || ((n - 1) as u64 * (chunk as u64) < len as u64 && (n == 1 || len as u64 <= n as u64 * chunk as u64))
}

#[test]
fn chunks_of_is_ceil_division() {
    // The f32 estimate of 4 289 146 248 / 2 144 573 120 (2.000000004) truncates to 1.
    assert_eq!(chunks_of(4_289_146_248, 2_144_573_120), 3);
    for chunk in (16..=4096).step_by(16).chain([1, 7, 100_000, 1 << 20, u32::MAX - 15]) {
        for len in (0..3000).chain([u32::MAX / 64, u32::MAX / 2, u32::MAX - 1, u32::MAX]) {
            if (len as u64).div_ceil(chunk as u64) <= 1 << 16 {
                assert_eq!(chunks_of(len, chunk), len.div_ceil(chunk).max(1), "len {len} chunk {chunk}");
            }
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 4000, ..ProptestConfig::default() })]
    /// Chunk sizes within a few tokens of `len / q`, where the f32 estimate of the quotient
    /// straddles an integer, over the whole `u32` range of lengths.
    #[test]
    fn chunks_of_is_ceil_division_near_integer_quotients(
        len in any::<u32>(),
        q in 1u32..=MAX_CHUNKS_PER_REQUEST,
        offset in -64i64..=64,
    ) {
        let chunk = (len as i64 / q as i64 + offset).clamp(1, u32::MAX as i64) as u32;
        prop_assume!((len as u64).div_ceil(chunk as u64) <= 1 << 16);
        prop_assert_eq!(chunks_of(len, chunk), len.div_ceil(chunk).max(1), "len {} chunk {}", len, chunk);
    }
}

#[test]
fn equal_lengths_get_num_splits_chunks_each() {
    for (batch, splits, len) in [(1, 33, 32768), (1, 33, 4096), (8, 4, 4096), (4, 8, 8192), (16, 2, 16384)] {
        let lens = vec![len; batch];
        let (chunk, n) = partition(&lens, batch as u32 * splits, 64, 256, 0);
        let want = if len / splits >= 256 { splits } else { len.div_ceil(256) };
        assert!(n.iter().all(|&n| n == want), "batch {batch} × {len}: chunk {chunk}, {n:?}");
    }
    // Spare chunks (fewer than the batch) leave equal lengths unsplit.
    let (chunk, n) = partition(&[1500; 48], 48 + 47, 64, 256, 66);
    assert!(chunk >= 1500 && n.iter().all(|&n| n == 1), "chunk {chunk}");
    // Beyond a wave, a wave's worth of spare chunks with the balance bound: still whole.
    for (batch, len) in [(128, 1024), (256, 512), (64, 8192), (33, 100_000)] {
        let (chunk, n) = partition(&vec![len; batch], batch as u32 + 33, 64, 256, 33);
        assert!(chunk >= len && n.iter().all(|&n| n == 1), "{batch} × {len}: chunk {chunk}");
    }
}

#[test]
fn requests_of_two_tiles_stay_whole() {
    // 8 requests of 128 tokens in 32 chunks of at least 64: two chunks each, unless kept whole.
    assert_eq!(partition(&[128; 8], 32, 64, 256, 0).1, [2; 8]);
    assert_eq!(partition_keeping(&[128; 8], 32, 64, 256, 0, 128).1, [1; 8]);
    // One token more and the request is split as before.
    let kept = partition_keeping(&[129; 8], 32, 64, 256, 0, 128);
    assert_eq!(kept, partition(&[129; 8], 32, 64, 256, 0));
    assert_eq!(kept.1, [2; 8]);
    // A long request among short ones keeps its chunks; the short ones stay whole either way.
    let mut lens = vec![1009];
    lens.extend([1; 15]);
    let (chunk, n) = partition_keeping(&lens, 32, 64, 256, 0, 128);
    assert_eq!((chunk, n[0]), (64, 16));
    assert!(n[1..].iter().all(|&n| n == 1));
    // Requests of 65–128 tokens next to a long one: whole, the long one still split.
    let (_, n) = partition_keeping(&[500, 100, 120, 80], 16, 64, 256, 0, 128);
    assert_eq!((n[0] > 1, &n[1..]), (true, &[1, 1, 1][..]));
}

#[test]
fn a_tight_page_table_launches_only_the_chunks_it_can_use() {
    // One request in a grid of 33 chunks: chunks of at least 4 tiles while half the grid stays busy.
    for (len, used) in [(1024, 16), (4096, 16), (6000, 24), (32768, 33)] {
        let (_, n) = partition(&[len], 33, 64, 256, 0);
        let launched = max_items(1, 33, len as u64, 64, 256, 0);
        assert_eq!((n[0], launched), (used, used), "len {len}");
    }
    // A page table with room for more tokens than the batch holds keeps the whole grid.
    assert_eq!(max_items(1, 33, 1 << 20, 64, 256, 0), 33);
    assert_eq!(max_items(8, 32, 8 * 4096, 64, 256, 0), 32);
    // Empty requests still take one chunk each.
    assert_eq!((max_items(1, 33, 0, 64, 256, 0), max_items(5, 40, 0, 64, 256, 0)), (1, 5));
}

#[test]
fn long_requests_beyond_a_wave_are_cut_to_a_wave_share() {
    // 60 requests of 200…2500 tokens and 4 of 12000, 33 chunks per wave.
    let mut lens: Vec<u32> = (0..60).map(|i| 200 + (i * 397) % 2300).collect();
    lens.extend([12_000; 4]);
    let total: u32 = lens.iter().sum();
    let (chunk, n) = partition(&lens, 64 + 33, 64, 256, 33);
    assert!(chunk <= (total / 33).next_multiple_of(16) + 16, "chunk {chunk}");
    assert!(n[..60].iter().all(|&n| n == 1) && n[60..].iter().all(|&n| n >= 3), "chunk {chunk}, {n:?}");
}

#[test]
fn a_long_request_gets_the_spare_chunks() {
    let mut lens = vec![300; 23];
    lens.push(20_000);
    let (chunk, n) = partition(&lens, 24 + 23, 64, 256, 33);
    assert!(n[..23].iter().all(|&n| n == 1) && n[23] >= 20, "chunk {chunk}, {n:?}");
}

/// The lean kernel's scheduled partition (`DecodeConfig::lean_spare_chunks`): `batch + S` chunks
/// balanced over the `S` spare ones, `S ≤ batch`. Its least chunk size always fits (no search),
/// equal lengths stay whole, and the zipf-like scale row's longest request is cut to chunks of
/// `total / S` tokens.
#[test]
fn the_lean_partition_takes_its_least_chunk() {
    let lean = |lens: &[u32], spare: u32| {
        let total: u64 = lens.iter().map(|&l| l as u64).sum();
        let (chunk, n) = partition_keeping(lens, lens.len() as u32 + spare, 32, 128, spare, 128);
        let (lo, _) = chunk_bounds(
            total,
            *lens.iter().max().unwrap(),
            lens.len() as u32,
            lens.len() as u32 + spare,
            32,
            128,
            spare,
        );
        assert_eq!(chunk, lo, "the least chunk fits");
        (chunk, n)
    };
    for (batch, len) in [(264u32, 256u32), (1024, 130), (4096, 256), (16384, 200)] {
        let (_, n) = lean(&vec![len; batch as usize], 264);
        assert!(n.iter().all(|&n| n == 1), "{batch} × {len}");
    }
    let mut lens: Vec<u32> = (0..2048).map(|i| (i * 37) % 301).collect();
    lens[5] = 10_540;
    lens[700] = 7_394;
    let total: u32 = lens.iter().sum();
    let (chunk, n) = lean(&lens, 264);
    assert_eq!(chunk, total.div_ceil(264).next_multiple_of(16));
    assert_eq!((n[5], n[700]), (10_540u32.div_ceil(chunk), 7_394u32.div_ceil(chunk)));
    assert!(n.iter().enumerate().all(|(i, &n)| i == 5 || i == 700 || n == 1));
}

/// The decode's page-table bound ([`MAX_TABLE_TOKENS`]) is what keeps the upper bound on the
/// chunk size fitting: a request of that many tokens is one chunk of `round16` of its length,
/// while one token more would need two chunks of the saturated rounding (and a batch allowed
/// one chunk per request would overflow its grid).
#[test]
fn the_table_bound_keeps_one_chunk_per_request_possible() {
    let longest = MAX_TABLE_TOKENS as u32;
    assert_eq!(round16(longest as u64), longest);
    assert_eq!(chunks_of(longest, round16(longest as u64)), 1);
    assert_eq!(chunks_of(longest + 1, round16(longest as u64 + 1)), 2);
    let (_, n) = partition(&[longest - 2, 1, 1], 3, 64, 256, 0);
    assert_eq!(n, [1, 1, 1]);
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 500, ..ProptestConfig::default() })]
    /// Batches of any page table the decode accepts, with one request near the bound, fit their
    /// grid down to one chunk per request and cover every token.
    #[test]
    fn partition_fits_up_to_the_table_bound(
        tokens in (MAX_TABLE_TOKENS - (1 << 24))..=MAX_TABLE_TOKENS,
        short in prop::collection::vec(0u32..5000, 0..40),
        splits in 1u32..=3,
        spare in 0u32..40,
    ) {
        let mut lens = short;
        let rest: u64 = lens.iter().map(|&l| l as u64).sum();
        lens.push((tokens - rest) as u32);
        let batch = lens.len() as u32;
        let num_chunks = batch * splits + spare.min(batch - 1);
        let (chunk, n) = partition(&lens, num_chunks, 64, 256, 0);
        prop_assert!(n.iter().map(|&n| n as u64).sum::<u64>() <= num_chunks as u64);
        for (&len, &n) in lens.iter().zip(&n) {
            prop_assert!(chunks_cover(len, n, chunk), "len {} in {} chunks of {}", len, n, chunk);
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 2000, ..ProptestConfig::default() })]
    #[test]
    fn partition_fits_and_covers_every_token(
        lens in prop_oneof![
            prop::collection::vec(
                prop_oneof![Just(0u32), Just(1u32), 0u32..5000, 0u32..300_000, Just(u32::MAX / 2)],
                1..300,
            ),
            prop::collection::vec(0u32..2_000_000, 1..2),
        ],
        splits in 1u32..=64,
        spare_fraction in 0.0f64..1.0,
        balance in prop_oneof![Just(0u32), 1u32..600],
        tile in prop::sample::select(vec![32u32, 64, 128]),
        capacity_slack in prop_oneof![Just(0u64), 0u64..100, 0u64..1_000_000],
        // Requests kept whole: none, up to two tiles (the rule), or up to any longer bound.
        unsplit_tiles in prop_oneof![Just(0u32), Just(2u32), 0u32..100],
    ) {
        let batch = lens.len() as u32;
        // Spare chunks: fewer than the batch, or a wave's worth with the balance bound.
        let spare = if balance > 0 && spare_fraction < 0.5 {
            balance
        } else {
            ((batch - 1) as f64 * spare_fraction) as u32
        };
        let num_chunks = batch * splits + spare;
        let unsplit = unsplit_tiles * tile;
        let (chunk, n) = partition_keeping(&lens, num_chunks, tile, 4 * tile, balance, unsplit);
        prop_assert!(chunk.is_multiple_of(16) && chunk >= tile);
        let used = n.iter().map(|&n| n as u64).sum::<u64>();
        prop_assert!(used <= num_chunks as u64);
        // The grid the host launches for a page table of at least `total` tokens holds them all.
        let capacity = lens.iter().map(|&l| l as u64).sum::<u64>() + capacity_slack;
        let launched = max_items(batch, num_chunks, capacity, tile, 4 * tile, balance);
        prop_assert!(used <= launched as u64, "{} chunks used, {} launched", used, launched);
        prop_assert!(launched >= batch && launched <= num_chunks);
        for (&len, &n) in lens.iter().zip(&n) {
            prop_assert!(len > unsplit || n == 1, "len {} in {} chunks kept whole below {}", len, n, unsplit);
            prop_assert!((1..=MAX_CHUNKS_PER_REQUEST).contains(&n), "len {} in {} chunks of {}", len, n, chunk);
            prop_assert!(chunks_cover(len, n, chunk), "len {} in {} chunks of {}", len, n, chunk);
        }
    }

    #[test]
    fn round16_rounds_up(x in 0u64..=u64::MAX) {
        let r = round16(x);
        prop_assert!(r.is_multiple_of(16));
        prop_assert!(r as u64 >= x.min(u32::MAX as u64 - 15));
        prop_assert!((r as u64) < x.min(u32::MAX as u64 - 15) + 16);
    }
}
