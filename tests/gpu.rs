//! GPU tests: every kernel against the float64 CPU reference. On a machine without a CUDA
//! driver each test prints a skip line and passes.

mod gpu_support;
#[path = "../host/cli/problem.rs"]
#[allow(dead_code)]
mod problem;

use gpu_support::{
    device, fp8_device, opened, prepared_on_workers, promised, runs_fp8, skipped, two_fp8_pairings,
};
use half::{bf16, f16};
use paged_decode::float8::{F8E4M3, F8E5M2};
use paged_decode::plan::DecodeConfig;
use paged_decode::reference::DecodeOutput;
use paged_decode::{
    BatchPagedDecodePlan, DecodePath, Device, Element, ElementKind, Error, PagedKvAppendDescriptor,
    PagedKvAppendPlan, PlanPreference, StablePageTable, TensorRef, Workspace,
};
use problem::{DeviceProblem, HostProblem, ProblemCache, ProblemSpec, Rng, append_rows, compare_outputs};

/// GPU 0 with event tracking off, for tests that capture graphs.
///
/// Callers issue all work on `Device::stream` and drop every graph before the buffers it uses.
fn capture_device(test: &str) -> Option<Device> {
    // SAFETY: the callers' contract above: one stream orders every use and free of the slices,
    // and captured graphs do not outlive their buffers.
    opened(test, unsafe { Device::open_untracked(0) })
}

/// Runs the plan with NaN-poisoned outputs and returns (o, lse).
fn run_decode<T: Element>(
    dev: &Device,
    plan: &BatchPagedDecodePlan<T>,
    buf: &mut DeviceProblem<T>,
) -> (Vec<T>, Vec<f32>) {
    let s = &dev.stream;
    buf.poison_outputs(s).unwrap();
    let (mut args, mut ws) = buf.args_and_workspace();
    plan.run(s, &mut ws, &mut args).unwrap();
    (s.clone_dtoh(&buf.o).unwrap(), s.clone_dtoh(&buf.lse).unwrap())
}

/// Compares every request of (o, lse) with the reference; returns the worst relative error.
fn check<T: Element>(what: &str, spec: &ProblemSpec, o: &[T], lse: &[f32], r: &DecodeOutput) -> f64 {
    compare_outputs(spec, o, lse, r).unwrap_or_else(|e| panic!("{what}: {e}"))
}

fn random_spec(rng: &mut Rng, seed: u64) -> (ElementKind, ProblemSpec) {
    let kind = [ElementKind::F16, ElementKind::BF16, ElementKind::F32][rng.below(3) as usize];
    let d = [64, 128, 256][rng.below(3) as usize];
    let group = match rng.below(4) {
        0 => 1 + rng.below(8) as usize,
        1 => [4, 8, 16, 32, 64][rng.below(5) as usize],
        2 => 1 + rng.below(64) as usize,
        _ => [1, 2, 3, 5, 6, 7, 12, 17, 33, 48][rng.below(10) as usize],
    };
    let hkv = 1 + rng.below(3) as usize;
    let page = match rng.below(3) {
        0 => [1, 8, 16, 32, 64, 256][rng.below(6) as usize],
        1 => 1 + rng.below(256) as usize,
        _ => 16,
    };
    // Mostly small batches (split-KV); one in six large enough to fill the GPU unsplit.
    let wide = rng.below(6) == 0;
    let batch = if wide { 200 + rng.below(400) as usize } else { 1 + rng.below(6) as usize };
    let max_len = if wide { 48 } else { (6000 / (group * hkv).max(1)).clamp(40, 700) };
    let mut lens: Vec<usize> = (0..batch)
        .map(|_| match rng.below(8) {
            0 => 0,
            1 => 1,
            2 => page * (1 + rng.below(3) as usize), // last page full
            _ => rng.below(max_len as u64) as usize,
        })
        .collect();
    // One wide batch in three has 2–6 long requests among the short ones: the scheduled and
    // lean-scheduled partitions cut them into chunks, partials and merges.
    if wide && rng.below(3) == 0 {
        for _ in 0..2 + rng.below(5) {
            let at = rng.below(batch as u64) as usize;
            lens[at] = 2000 + rng.below(10_000) as usize;
        }
    }
    let spec = ProblemSpec {
        lens,
        num_qo_heads: group * hkv,
        num_kv_heads: hkv,
        head_dim: d,
        page_size: page,
        sm_scale: (0.02 + rng.below(1000) as f32 / 4000.0) * if rng.below(8) == 0 { -1.0 } else { 1.0 },
        q_scale: [1.0, 2.0, 4.0][rng.below(3) as usize],
        spare_pages: rng.below(5) as usize,
        // A page table sized to the batch bounds the split grid; a larger one keeps it whole.
        indices_slack: if rng.below(4) == 0 { rng.below(3000) as usize } else { 0 },
        seed,
        poison_unused_slots: true,
    };
    (kind, spec)
}

enum Prepared {
    F16(HostProblem<f16>, DecodeOutput),
    BF16(HostProblem<bf16>, DecodeOutput),
    F32(HostProblem<f32>, DecodeOutput),
}

fn prepare(kind: ElementKind, spec: &ProblemSpec) -> Prepared {
    fn with<T: Element + ProblemCache>(spec: &ProblemSpec) -> (HostProblem<T>, DecodeOutput) {
        let host = HostProblem::<T>::random(spec).unwrap();
        let r = host.reference().unwrap();
        (host, r)
    }
    match kind {
        ElementKind::F16 => {
            let (h, r) = with::<f16>(spec);
            Prepared::F16(h, r)
        }
        ElementKind::BF16 => {
            let (h, r) = with::<bf16>(spec);
            Prepared::BF16(h, r)
        }
        _ => {
            let (h, r) = with::<f32>(spec);
            Prepared::F32(h, r)
        }
    }
}

fn run_and_check<T: Element>(
    dev: &Device,
    what: &str,
    host: &HostProblem<T>,
    r: &DecodeOutput,
    pref: PlanPreference,
) -> (f64, DecodeConfig, DecodePath) {
    let plan = BatchPagedDecodePlan::<T>::select(&dev.stream, &host.desc, pref)
        .unwrap_or_else(|e| panic!("{what}: select failed: {e}"));
    let mut buf = DeviceProblem::upload(&dev.stream, host, plan.workspace_size()).unwrap();
    let (o, lse) = run_decode(dev, &plan, &mut buf);
    let path = plan.path(host.indices.len());
    (check(&format!("{what} [{}]", path.name()), &host.spec, &o, &lse, r), *plan.config(), path)
}

/// The sweeps' worker pool (no GPU needed): every item reaches `run` once, as prepared, and a
/// failed check in `run` reaches the caller.
#[test]
fn prepared_on_workers_hands_over_every_item_once() {
    let mut seen = vec![0u32; 1000];
    prepared_on_workers(
        1000,
        |i| (i, i * i),
        |i, (j, square)| {
            assert_eq!((i, square), (j, j * j));
            seen[i] += 1;
        },
    );
    assert!(seen.iter().all(|&n| n == 1));
    let failed = std::panic::catch_unwind(|| {
        prepared_on_workers(1000, |i| i, |i, _| assert!(i != 500, "item 500"));
    });
    assert!(failed.is_err());
}

/// ≥ 1000 random configurations over dtypes, head_dims, group sizes 1..64, page sizes 1..256,
/// ragged lengths with empty, 1-token and full-last-page requests, permuted pages, any sm_scale;
/// the store's slots that no request reads hold NaN.
#[test]
fn decode_random_sweep() {
    let Some(dev) = device("decode_random_sweep") else { return };
    let base_seed = problem::sweep_seed("decode_random_sweep");
    let configs: usize = problem::env_number("PAGED_DECODE_SWEEP", 1200);
    let mut worst = [0f64; 3];
    let mut paths = std::collections::BTreeMap::new();
    let mut portable_paths = std::collections::BTreeMap::new();
    let random_config = |i: usize| {
        let seed = base_seed.wrapping_add(i as u64);
        let (kind, spec) = random_spec(&mut Rng::new(seed), seed);
        let prepared = prepare(kind, &spec);
        (kind, spec, prepared)
    };
    prepared_on_workers(configs, random_config, |i, (kind, spec, prepared)| {
        let what = format!(
            "config {i} (seed {}): {kind:?} lens {:?} Hq {} Hkv {} D {} page {} scale {}",
            spec.seed,
            spec.lens,
            spec.num_qo_heads,
            spec.num_kv_heads,
            spec.head_dim,
            spec.page_size,
            spec.sm_scale
        );
        // One configuration in six without spare chunks, one in six with a few (large
        // batches then run the split kernels too); the rest by the plan's rule.
        let spare_chunks = match i % 6 {
            0 => Some(0),
            1 => Some(1 + (spec.seed % 40) as u32),
            _ => None,
        };
        // Large batches of short requests take the lean kernel by the rule; one configuration
        // in four turns it off, so that they run the scheduled split kernels too.
        let lean_max_avg_tokens = if i % 4 == 3 { Some(0) } else { None };
        // One in five on the portable build, which an sm_90 device otherwise never runs.
        let allow_sm90a = i % 5 != 4;
        let stable_page_table = promised(i);
        // One in seven launched without programmatic dependent launch on the sm_90 build.
        let programmatic_launch = i % 7 != 3;
        let pref = PlanPreference {
            spare_chunks,
            lean_max_avg_tokens,
            allow_sm90a,
            stable_page_table,
            programmatic_launch,
            ..PlanPreference::default()
        };
        let (err, _, path) = match &prepared {
            Prepared::F16(h, r) => run_and_check(&dev, &what, h, r, pref),
            Prepared::BF16(h, r) => run_and_check(&dev, &what, h, r, pref),
            Prepared::F32(h, r) => run_and_check(&dev, &what, h, r, pref),
        };
        let k = match kind {
            ElementKind::F16 => 0,
            ElementKind::BF16 => 1,
            _ => 2,
        };
        worst[k] = worst[k].max(err);
        *paths.entry(path.name()).or_insert(0usize) += 1;
        if !allow_sm90a {
            *portable_paths.entry(path.name()).or_insert(0usize) += 1;
        }
    });
    println!(
        "decode_random_sweep: {configs} configurations passed ({paths:?}; on the portable build {portable_paths:?}); worst rel err f16 {:.2e}, bf16 {:.2e}, f32 {:.2e}",
        worst[0], worst[1], worst[2]
    );
    // A full sweep takes every kernel path.
    let all = [DecodePath::Whole, DecodePath::Lean, DecodePath::Split, DecodePath::Scheduled];
    assert!(configs < 200 || all.iter().all(|p| paths.contains_key(p.name())), "paths taken: {paths:?}");
}

/// Requests of lengths `lens` with `hq` / `hkv` heads, head_dim `d` and pages of `page` tokens.
fn with_lens(lens: Vec<usize>, hq: usize, hkv: usize, d: usize, page: usize) -> ProblemSpec {
    ProblemSpec { lens, ..ProblemSpec::uniform(1, 0, hq, hkv, d, page) }
}

/// Explicit edge cases: empty batch members, single tokens, full last pages, page sizes 1 and
/// 256, groups 1 and 64, large batches, long contexts, one long request among short ones (split
/// into many chunks by the length-aware partition).
#[test]
fn decode_edge_cases() {
    let Some(dev) = device("decode_edge_cases") else { return };
    // Requests of 3–4000 tokens over 4 KV heads (group 7, 64-token pages).
    let ragged_over_4_kv_heads = |n: usize| {
        with_lens((0..n).map(|i| [1500, 1792, 4000, 3, 1791, 2600][i % 6]).collect(), 28, 4, 128, 64)
    };
    let cases = vec![
        ("all empty", ProblemSpec { lens: vec![0, 0, 0], ..ProblemSpec::uniform(3, 0, 8, 2, 128, 16) }),
        ("single tokens", ProblemSpec { lens: vec![1, 1], ..ProblemSpec::uniform(2, 0, 32, 8, 128, 16) }),
        (
            "full last pages",
            ProblemSpec { lens: vec![16, 32, 256], ..ProblemSpec::uniform(3, 0, 32, 8, 128, 16) },
        ),
        ("page size 1", ProblemSpec::uniform(3, 300, 32, 8, 128, 1)),
        (
            "page size 256",
            ProblemSpec { lens: vec![255, 256, 257, 3], ..ProblemSpec::uniform(4, 0, 16, 4, 64, 256) },
        ),
        ("group 1", ProblemSpec::uniform(4, 500, 8, 8, 256, 16)),
        ("group 64", ProblemSpec::uniform(2, 300, 128, 2, 128, 16)),
        ("group 65", ProblemSpec::uniform(2, 200, 65, 1, 64, 8)),
        ("long context", ProblemSpec::uniform(1, 20000, 32, 8, 128, 16)),
        // One request in a few dozen chunks: several merge rounds, group 64 and d 256.
        ("one request, group 64, d 64", ProblemSpec::uniform(1, 4000, 64, 1, 64, 16)),
        ("one request, d 256", ProblemSpec::uniform(1, 2000, 16, 2, 256, 16)),
        (
            "one long request among short and empty ones",
            ProblemSpec {
                lens: vec![0, 1, 30000, 0, 5, 17, 2],
                ..ProblemSpec::uniform(7, 0, 32, 8, 128, 16)
            },
        ),
        (
            "one request in 63 chunks",
            ProblemSpec {
                lens: (0..40).map(|i| if i == 17 { 20000 } else { 1 }).collect(),
                ..ProblemSpec::uniform(40, 0, 4, 1, 128, 16)
            },
        ),
        (
            // Requests of 65–128 tokens in 64-token chunks, kept whole (one chunk longer than
            // the chunk size) next to a split one; batch ≤ 32 (split) and 48 (lean for the 16-bit
            // caches, scheduled for f32).
            "two-tile requests kept whole",
            ProblemSpec {
                lens: vec![65, 128, 100, 1000, 1, 127],
                ..ProblemSpec::uniform(6, 0, 32, 8, 128, 16)
            },
        ),
        (
            "two-tile requests kept whole, 48 requests",
            ProblemSpec {
                lens: (0..48).map(|i| [65, 128, 100, 300, 1, 127, 90, 0][i % 8]).collect(),
                ..ProblemSpec::uniform(48, 0, 32, 8, 128, 16)
            },
        ),
        (
            // 0.73 wave of per-request CTAs: spare chunks, head-major CTA order.
            "ragged batch within a wave",
            ProblemSpec {
                lens: (0..24).map(|i| [1, 17, 300, 1000, 2500, 7000][i % 6]).collect(),
                ..ProblemSpec::uniform(24, 0, 32, 8, 128, 16)
            },
        ),
        (
            // 0.73 wave of requests of 0–3584 tokens: spare chunks.
            "ragged lengths within a wave",
            with_lens(
                (0..24).map(|i| [1791, 1792, 1793, 0, 447, 448, 2047, 3584][i % 8]).collect(),
                32,
                8,
                128,
                16,
            ),
        ),
        (
            // 48 requests × 4 KV heads (group 7, 64-token pages): 0.73 wave, spare chunks, every
            // CTA's partition over two page-table entries per lane.
            "ragged lengths within a wave, 48 requests",
            ragged_over_4_kv_heads(48),
        ),
        // The same lengths over 80 requests: the schedule kernel's partition.
        ("ragged lengths, 80 requests, scheduled", ragged_over_4_kv_heads(80)),
        (
            // head_dim 256, 20 requests × 8 KV heads.
            "ragged lengths within a wave, d 256",
            with_lens((0..20).map(|i| [671, 672, 3000, 5, 1100][i % 5]).collect(), 32, 8, 256, 16),
        ),
        (
            "batch 16384",
            ProblemSpec {
                lens: (0..16384).map(|i| i % 37).collect(),
                ..ProblemSpec::uniform(1, 0, 8, 1, 64, 16)
            },
        ),
        (
            // Short contexts at the largest batch: the lean kernel (f16, bf16), 65536 CTAs.
            "batch 65536, short contexts",
            with_lens((0..65536).map(|i| (i * 7) % 61).collect(), 4, 1, 128, 16),
        ),
        (
            // A ragged batch of 16384 with a heavy tail (~160 tokens per request on average, 17
            // requests of 9000+): the lean kernel by the rule (f16, bf16; whole requests), the
            // scheduled split kernel for f32.
            "ragged batch 16384",
            with_lens(
                (0..16384usize)
                    .map(|i| if i % 997 == 3 { 9000 + i % 1500 } else { (i * 13) % 300 })
                    .collect(),
                8,
                2,
                128,
                16,
            ),
        ),
        // Lean kernel: two 16-row query tiles (group 32), and two head blocks (group 64).
        ("lean, group 32", with_lens((0..600).map(|i| i % 130).collect(), 64, 2, 128, 16)),
        ("lean, group 64, d 64, page 1", with_lens((0..700).map(|i| (i * 5) % 90).collect(), 64, 1, 64, 1)),
    ];
    // The plan's rule, except where a case sets the spare chunks.
    let mut cases: Vec<_> = cases.into_iter().map(|(name, spec)| (name, spec, None)).collect();
    cases.push((
        // More than a wave of CTAs with 132 spare chunks: the long requests are cut to a wave's
        // share, the others stay whole.
        "long requests among 250",
        ProblemSpec {
            lens: (0..250).map(|i| if i % 100 == 7 { 20000 } else { i % 50 }).collect(),
            ..ProblemSpec::uniform(250, 0, 8, 2, 128, 16)
        },
        Some(132),
    ));
    for (i, (_, s, _)) in cases.iter_mut().enumerate() {
        s.seed = 1000 + i as u64;
    }
    for (name, spec, spare_chunks) in &cases {
        for kind in [ElementKind::F16, ElementKind::BF16, ElementKind::F32] {
            let what = format!("{name} {kind:?}");
            let pref = PlanPreference { spare_chunks: *spare_chunks, ..PlanPreference::default() };
            let (err, cfg, path) = match prepare(kind, spec) {
                Prepared::F16(h, r) => run_and_check(&dev, &what, &h, &r, pref),
                Prepared::BF16(h, r) => run_and_check(&dev, &what, &h, &r, pref),
                Prepared::F32(h, r) => run_and_check(&dev, &what, &h, &r, pref),
            };
            println!(
                "{what}: rel err {err:.2e}, {} path, {} splits + {} spare chunks",
                path.name(),
                cfg.num_splits,
                cfg.spare_chunks
            );
        }
    }
}

/// Runs `plan` on `host` (outputs poisoned, the problem's K/V scales) and returns (o, lse).
fn run_scaled_poisoned<T: Element + ProblemCache, C: ProblemCache>(
    dev: &Device,
    plan: &BatchPagedDecodePlan<T, C>,
    host: &HostProblem<T, C>,
) -> (Vec<T>, Vec<f32>) {
    let s = &dev.stream;
    let mut buf = DeviceProblem::upload(s, host, plan.workspace_size()).unwrap();
    buf.poison_outputs(s).unwrap();
    {
        let (mut args, mut ws) = buf.args_and_workspace();
        plan.run_scaled(s, &mut ws, &mut args, host.scales).unwrap();
    }
    (s.clone_dtoh(&buf.o).unwrap(), s.clone_dtoh(&buf.lse).unwrap())
}

/// Very short requests in large batches: the lean kernel stacks KV heads, several per CTA. Each
/// case must stack (the test fails if the rule stops doing so; `max_heads` caps the count, which
/// must then be reached exactly) and match the float64 reference.
/// The rows of requests of at most 16 tokens (one 16-token block per head) must also equal, bit
/// for bit, the same plan with one KV head per CTA: a stacked CTA computes such a row as the
/// unstacked one does, and the other heads' blocks add exact zeros. (A longer request's blocks
/// meet in another order: a stacked tile holds 16-token segments of several heads.)
fn stacked_case<T: Element + ProblemCache, C: ProblemCache>(
    dev: &Device,
    name: &str,
    spec: &ProblemSpec,
    max_heads: Option<u32>,
    base: PlanPreference,
) {
    let host = HostProblem::<T, C>::random(spec).unwrap();
    let r = host.reference().unwrap();
    let select = |max_stacked_kv_heads| {
        let pref = PlanPreference { max_stacked_kv_heads, ..base };
        BatchPagedDecodePlan::<T, C>::select(&dev.stream, &host.desc, pref).unwrap()
    };
    let (stacked, single) = (select(max_heads), select(Some(1)));
    let n = host.indices.len();
    let heads = stacked.stacked_kv_heads(n);
    let build = if base.allow_sm90a { "" } else { " (portable build)" };
    let what = format!("{name}{build} {:?}/{:?}: {heads} KV heads per CTA", T::KIND, C::CACHE_KIND);
    assert!(stacked.path(n) == DecodePath::Lean && heads > 1, "{what}: expected stacked lean CTAs");
    if let Some(max) = max_heads {
        assert_eq!(heads, max, "{what}: expected {max} KV heads per CTA");
    }
    assert_eq!(single.stacked_kv_heads(n), 1, "{what}");
    let (o, lse) = run_scaled_poisoned(dev, &stacked, &host);
    let err = check(&what, &host.spec, &o, &lse, &r);
    let (o1, lse1) = run_scaled_poisoned(dev, &single, &host);
    let qo_heads = host.desc.num_qo_heads as usize;
    let row = qo_heads * host.desc.paged_kv.head_dim as usize;
    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    let mut one_block = 0;
    for (b, _) in spec.lens.iter().enumerate().filter(|&(_, &len)| len <= 16) {
        let (o_b, lse_b) = (b * row..(b + 1) * row, b * qo_heads..(b + 1) * qo_heads);
        assert!(checksum(&o[o_b.clone()]) == checksum(&o1[o_b]), "{what}: request {b}'s o differs");
        assert!(bits(&lse[lse_b.clone()]) == bits(&lse1[lse_b]), "{what}: request {b}'s lse differs");
        one_block += 1;
    }
    assert!(one_block > 0, "{what}: no request of at most 16 tokens");
    println!(
        "{what}: rel err {err:.2e}; {one_block} requests of ≤ 16 tokens bit-identical to one KV head per CTA"
    );
}

#[test]
fn decode_stacked_kv_heads() {
    let Some(dev) = device("decode_stacked_kv_heads") else { return };
    // (name, lengths, query heads, KV heads, head_dim, page size): groups 1, 2, 4 and 8, ragged
    // lengths with empty and 1-token requests, page sizes 1, 5 and 16; then each stack count
    // (one lean entry each over a 16-bit cache) forced by the preference, at most that many KV
    // heads per CTA (`lean_stacking_reaches_every_entry` checks the rule picks it on an H200), at
    // head_dim 64 and 128; then groups of 3 and 5 (a row's head through the group reciprocal).
    // The forced stack counts run on the portable build too (`allow_sm90a: false`: its own lean
    // entries, one per count).
    let ragged = |batch: usize, max: usize, step: usize| (0..batch).map(|i| (i * step) % (max + 1)).collect();
    let every_count = |d| with_lens(vec![16; 4096], 16, 16, d, 16);
    // The smallest first: `PAGED_DECODE_STACKED_CASES` runs only the first few (the sanitizers).
    let cases: Vec<(&str, ProblemSpec, Option<u32>)> = vec![
        ("group 4, d 64, L = 16", with_lens(vec![16; 1100], 16, 4, 64, 16), None),
        ("group 4, d 128, L ≤ 40", with_lens(ragged(2048, 40, 7), 32, 8, 128, 16), None),
        ("group 1, d 64, page 1", with_lens(ragged(1200, 20, 3), 16, 16, 64, 1), None),
        ("group 2, d 128, page 5", with_lens(ragged(1500, 60, 11), 16, 8, 128, 5), None),
        ("group 8, d 64", with_lens(ragged(1600, 30, 13), 64, 8, 64, 16), None),
        ("group 1, d 64, 2 heads per CTA", every_count(64), Some(2)),
        ("group 1, d 64, 4 heads per CTA", every_count(64), Some(4)),
        ("group 1, d 64, 8 heads per CTA", every_count(64), Some(8)),
        ("group 1, d 64, 16 heads per CTA", every_count(64), Some(16)),
        ("group 1, d 128, 2 heads per CTA", every_count(128), Some(2)),
        ("group 1, d 128, 4 heads per CTA", every_count(128), Some(4)),
        ("group 1, d 128, 8 heads per CTA", every_count(128), Some(8)),
        ("group 1, d 128, 16 heads per CTA", every_count(128), Some(16)),
        ("group 3, d 128", with_lens(ragged(2048, 20, 7), 24, 8, 128, 16), None),
        ("group 5, d 64", with_lens(ragged(2048, 20, 7), 10, 2, 64, 16), None),
    ];
    let count: usize = problem::env_number("PAGED_DECODE_STACKED_CASES", cases.len());
    let portable = PlanPreference { allow_sm90a: false, ..PlanPreference::default() };
    for (i, (name, spec, max_heads)) in cases.into_iter().take(count).enumerate() {
        let spec = ProblemSpec { seed: 7000 + i as u64, sm_scale: 0.09, ..spec };
        let builds: &[PlanPreference] = if max_heads.is_some() {
            &[PlanPreference::default(), portable]
        } else {
            &[PlanPreference::default()]
        };
        for &base in builds {
            stacked_case::<f16, f16>(&dev, name, &spec, max_heads, base);
            stacked_case::<bf16, bf16>(&dev, name, &spec, max_heads, base);
        }
        if runs_fp8(&dev, "decode_stacked_kv_heads (8-bit caches)") {
            let base = PlanPreference::default();
            two_fp8_pairings!(i, |Q, C| stacked_case::<Q, C>(&dev, name, &spec, max_heads, base));
        }
    }
}

/// The unsplit entry of every element type and head_dim, over launches too large to guess (200
/// ragged requests with empty and 1-token ones over 4 KV heads: 800 CTAs, whole requests forced):
/// f16, bf16 and f32, and the four pairs of q type and 8-bit cache format.
#[test]
fn whole_entries_of_every_element_and_head_dim() {
    let test = "whole_entries_of_every_element_and_head_dim";
    let Some(dev) = device(test) else { return };
    let whole = PlanPreference {
        num_splits: Some(1),
        spare_chunks: Some(0),
        lean_max_avg_tokens: Some(0),
        ..PlanPreference::default()
    };
    let fp8 = runs_fp8(&dev, test);
    // `PAGED_DECODE_WHOLE_HEAD_DIMS` runs only the first few head_dims (racecheck).
    let head_dims: usize = problem::env_number("PAGED_DECODE_WHOLE_HEAD_DIMS", 3);
    for (i, d) in [64, 128, 256].into_iter().take(head_dims).enumerate() {
        let spec = ProblemSpec {
            seed: 7300 + i as u64,
            ..with_lens((0..200).map(|r| (r * 37) % 301).collect(), 16, 4, d, 16)
        };
        let what = format!("whole requests, d {d}");
        let mut paths = vec![];
        fn one<T: Element + ProblemCache>(
            dev: &Device,
            what: &str,
            spec: &ProblemSpec,
            pref: PlanPreference,
        ) -> DecodePath {
            let host = HostProblem::<T>::random(spec).unwrap();
            run_and_check(dev, what, &host, &host.reference().unwrap(), pref).2
        }
        paths.push(one::<f16>(&dev, &what, &spec, whole));
        paths.push(one::<bf16>(&dev, &what, &spec, whole));
        paths.push(one::<f32>(&dev, &what, &spec, whole));
        if fp8 {
            for pair in 0..4 {
                paths.push(match prepare_fp8(pair, &spec) {
                    PreparedFp8::F16E4M3(h, r) => fp8_run_and_check(&dev, &what, &h, &r, whole).1,
                    PreparedFp8::BF16E4M3(h, r) => fp8_run_and_check(&dev, &what, &h, &r, whole).1,
                    PreparedFp8::F16E5M2(h, r) => fp8_run_and_check(&dev, &what, &h, &r, whole).1,
                    PreparedFp8::BF16E5M2(h, r) => fp8_run_and_check(&dev, &what, &h, &r, whole).1,
                });
            }
        }
        assert!(paths.iter().all(|&p| p == DecodePath::Whole), "{what}: paths {paths:?}");
        println!("{what}: {} element types on the whole path", paths.len());
    }
}

/// A bound on the longest request (`set_max_kv_len`) picks the launch, never the results: under a
/// bound of at most two tiles a split configuration runs the whole path, and must match the
/// float64 reference there as on its split path without the bound, also when the bound is below
/// the real lengths (its longer requests then run unsplit).
fn max_kv_len_case<T: Element + ProblemCache, C: ProblemCache>(
    dev: &Device,
    name: &str,
    spec: &ProblemSpec,
    bound: u32,
) {
    max_kv_len_case_with::<T, C>(dev, name, spec, bound, PlanPreference::default())
}

/// [`max_kv_len_case`] for a plan of `pref`.
fn max_kv_len_case_with<T: Element + ProblemCache, C: ProblemCache>(
    dev: &Device,
    name: &str,
    spec: &ProblemSpec,
    bound: u32,
    pref: PlanPreference,
) {
    let host = HostProblem::<T, C>::random(spec).unwrap();
    let r = host.reference().unwrap();
    let mut plan = BatchPagedDecodePlan::<T, C>::select(&dev.stream, &host.desc, pref).unwrap();
    let n = host.indices.len();
    let what = format!("{name} {:?}/{:?}", T::KIND, C::CACHE_KIND);
    let unbounded = plan.path(n);
    assert!(unbounded.splits(), "{what}: expected a split path without the bound, got {}", unbounded.name());
    if pref.num_splits.is_some() {
        assert_eq!(unbounded, DecodePath::Scheduled, "{what}: fixed splits of 33-64 requests");
    }
    let (o, lse) = run_scaled_poisoned(dev, &plan, &host);
    let err = check(&format!("{what}, no bound"), &host.spec, &o, &lse, &r);
    plan.set_max_kv_len(Some(bound));
    assert_eq!(plan.max_kv_len(), Some(bound));
    assert_eq!(plan.path(n), DecodePath::Whole, "{what}: a bound of {bound} tokens");
    let (o, lse) = run_scaled_poisoned(dev, &plan, &host);
    let bounded = check(&format!("{what}, bound {bound}"), &host.spec, &o, &lse, &r);
    let longest = spec.lens.iter().max().copied().unwrap_or(0);
    println!(
        "{what}: {} without the bound (rel err {err:.2e}), whole under {bound} tokens (rel err {bounded:.2e}, longest {longest})",
        unbounded.name()
    );
}

#[test]
fn max_kv_len_picks_the_path_not_the_results() {
    let Some(dev) = device("max_kv_len_picks_the_path_not_the_results") else { return };
    // 16 requests of 64 tokens (one standard tile at head_dim 128): the bound holds.
    let uniform = ProblemSpec::uniform(16, 64, 32, 8, 128, 16);
    max_kv_len_case::<f16, f16>(&dev, "16 x 64 tokens", &uniform, 64);
    max_kv_len_case::<bf16, bf16>(&dev, "16 x 64 tokens", &uniform, 128);
    // Head_dim 64 (tiles of 128 tokens), pages of 5: 12 requests of up to 256 tokens.
    let d64 = with_lens(vec![256, 1, 200, 0, 130, 256, 17, 99, 256, 3, 240, 64], 32, 4, 64, 5);
    max_kv_len_case::<f16, f16>(&dev, "12 requests of up to 256 tokens, d64", &d64, 256);
    // A bound below the real lengths (two requests of 700 and 1500 tokens among short ones): the
    // same outputs, the long requests unsplit.
    let ragged =
        with_lens(vec![0, 1, 17, 64, 128, 700, 3, 90, 1500, 33, 16, 127, 5, 64, 100, 2], 32, 8, 128, 16);
    max_kv_len_case::<f16, f16>(&dev, "ragged, bound below the lengths", &ragged, 128);
    max_kv_len_case::<bf16, bf16>(&dev, "ragged, bound below the lengths", &ragged, 16);
    // 40 requests of up to 128 tokens in two fixed splits with the lean kernel off: the scheduled
    // path (the schedule kernel's partition) without the bound, the whole one under it (both
    // caches, checked on the host for one to four CTAs per SM).
    let scheduled = with_lens((0..40).map(|i| 1 + (i * 37) % 128).collect(), 32, 8, 128, 16);
    let lean_off =
        PlanPreference { lean_max_avg_tokens: Some(0), num_splits: Some(2), ..PlanPreference::default() };
    max_kv_len_case_with::<f16, f16>(&dev, "40 requests, lean off", &scheduled, 128, lean_off);
    if runs_fp8(&dev, "max_kv_len_picks_the_path_not_the_results (8-bit caches)") {
        max_kv_len_case::<f16, F8E4M3>(&dev, "16 x 64 tokens", &uniform, 64);
        max_kv_len_case::<bf16, F8E5M2>(&dev, "ragged, bound below the lengths", &ragged, 100);
        max_kv_len_case_with::<bf16, F8E4M3>(&dev, "40 requests, lean off", &scheduled, 128, lean_off);
    }
}

/// A batch of short requests over at least four lean waves with a heavy tail: the lean kernel
/// over the scheduled partition, which cuts the long requests into chunks (the test fails if the
/// rule stops taking it). Each case must match the float64 reference, and the rows of every
/// request that no partition could cut (at most `total tokens / lean_spare_chunks`, the least
/// chunk size of that partition) must equal, bit for bit, the same plan with the lean kernel
/// unsplit (`lean_spare_chunks: Some(0)`): the split entry computes a whole request as the
/// unsplit one does.
fn lean_scheduled_case<T: Element + ProblemCache>(dev: &Device, name: &str, spec: &ProblemSpec) {
    let host = HostProblem::<T>::random(spec).unwrap();
    let r = host.reference().unwrap();
    let select = |lean_spare_chunks| {
        let pref = PlanPreference { lean_spare_chunks, ..PlanPreference::default() };
        BatchPagedDecodePlan::<T>::select(&dev.stream, &host.desc, pref).unwrap()
    };
    let (split, whole) = (select(None), select(Some(0)));
    let n = host.indices.len();
    let what = format!("{name} {:?}", T::KIND);
    assert_eq!(split.path(n), DecodePath::LeanScheduled, "{what}");
    assert_eq!(whole.path(n), DecodePath::Lean, "{what}");
    let (o, lse) = run_scaled_poisoned(dev, &split, &host);
    let err = check(&what, &host.spec, &o, &lse, &r);
    let (o1, lse1) = run_scaled_poisoned(dev, &whole, &host);
    let err1 = check(&format!("{what}, unsplit"), &host.spec, &o1, &lse1, &r);
    let total: usize = spec.lens.iter().sum();
    let least_chunk = total.div_ceil(split.config().lean_spare_chunks as usize).next_multiple_of(16);
    let longer = spec.lens.iter().filter(|&&len| len > least_chunk).count();
    assert!(longer > 0, "{what}: no request longer than the least chunk ({least_chunk} tokens)");
    let qo_heads = host.desc.num_qo_heads as usize;
    let row = qo_heads * host.desc.paged_kv.head_dim as usize;
    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    let whole = spec.lens.iter().enumerate().filter(|&(_, &len)| len <= least_chunk);
    assert!(whole.clone().count() > 0, "{what}: no request of at most the least chunk to compare");
    for (b, _) in whole {
        let (o_b, lse_b) = (b * row..(b + 1) * row, b * qo_heads..(b + 1) * qo_heads);
        assert!(checksum(&o[o_b.clone()]) == checksum(&o1[o_b]), "{what}: request {b}'s o differs");
        assert!(bits(&lse[lse_b.clone()]) == bits(&lse1[lse_b]), "{what}: request {b}'s lse differs");
    }
    println!(
        "{what}: rel err {err:.2e} (unsplit {err1:.2e}); {longer} requests longer than {least_chunk} tokens, \
         the other {} bit-identical to the unsplit lean kernel",
        spec.lens.len() - longer
    );
}

#[test]
fn decode_lean_scheduled() {
    let Some(dev) = device("decode_lean_scheduled") else { return };
    // Ragged short requests (averaging 150–200 tokens, so no KV heads stack) with a few of
    // thousands of tokens, empty and 1-token ones; groups 1, 4, 8, 32 (two query tiles) and 64
    // (two head blocks of a KV head), head_dim 64 and 128, pages of 1, 5 and 16 tokens.
    let tailed = |batch: usize, max: usize, step: usize, every: usize| {
        (0..batch).map(|i| if i % every == 5 { 3000 + 7 * i } else { (i * step) % (max + 1) }).collect()
    };
    // The smallest first: `PAGED_DECODE_LEAN_SCHEDULED_CASES` runs only the first few (the
    // sanitizers).
    let cases: Vec<(&str, ProblemSpec)> = vec![
        ("group 1, d 64, page 1", with_lens(tailed(400, 350, 29, 131), 8, 8, 64, 1)),
        ("group 4, d 128", with_lens(tailed(600, 300, 37, 97), 32, 8, 128, 16)),
        ("group 8, d 128, page 5", with_lens(tailed(800, 320, 41, 89), 32, 4, 128, 5)),
        ("group 32, d 128", with_lens(tailed(1300, 300, 13, 211), 64, 2, 128, 16)),
        ("group 64, d 64, two head blocks", with_lens(tailed(1200, 300, 13, 151), 128, 2, 64, 16)),
    ];
    let count: usize = problem::env_number("PAGED_DECODE_LEAN_SCHEDULED_CASES", cases.len());
    for (i, (name, spec)) in cases.into_iter().take(count).enumerate() {
        let spec = ProblemSpec { seed: 7100 + i as u64, sm_scale: 0.09, ..spec };
        lean_scheduled_case::<f16>(&dev, name, &spec);
        lean_scheduled_case::<bf16>(&dev, name, &spec);
    }
}

/// Same input twice ⇒ bit-identical output; graph replays equal eager runs bit for bit. Over f16
/// (1000 replays each) split, lean-scheduled, scheduled, whole and lean problems; then, with
/// fewer replays, stacked lean CTAs over bf16, the CUDA-core split kernel over f32 and 8-bit
/// caches on the split, scheduled, lean and whole paths (each case prints the path it took).
#[test]
fn decode_deterministic_and_graph_replay() {
    let Some(dev) = capture_device("decode_deterministic_and_graph_replay") else { return };
    let ragged =
        ProblemSpec { lens: vec![3000, 10, 0, 1200, 1], ..ProblemSpec::uniform(5, 0, 32, 8, 128, 16) };
    // The one-request case launches only the chunks its page table can fill; the last one
    // takes the lean kernel over the scheduled partition.
    let tailed = with_lens(
        (0..600).map(|i| if i % 97 == 5 { 4000 } else { (i * 37) % 301 }).collect(),
        32,
        8,
        128,
        16,
    );
    let replays: usize = problem::env_number("PAGED_DECODE_REPLAYS", 1000);
    for spec in [
        ProblemSpec::uniform(2, 3000, 32, 8, 128, 16),
        ProblemSpec::uniform(64, 700, 32, 8, 128, 16),
        ragged,
        ProblemSpec::uniform(1, 3000, 32, 8, 128, 16),
        tailed,
        ProblemSpec::uniform(96, 300, 32, 8, 128, 16),
        ProblemSpec::uniform(32, 1000, 32, 8, 128, 16),
        ProblemSpec::uniform(16, 16, 32, 8, 128, 16),
    ] {
        replay_case::<f16, f16>(&dev, &spec, replays);
    }
    let few = replays.min(200);
    replay_case::<bf16, bf16>(&dev, &ProblemSpec::uniform(1024, 16, 16, 4, 128, 16), few);
    replay_case::<f32, f32>(&dev, &with_lens(vec![2500, 0, 1, 700], 16, 4, 64, 16), few);
    if runs_fp8(&dev, "decode_deterministic_and_graph_replay (8-bit caches)") {
        replay_case::<f16, F8E4M3>(&dev, &with_lens(vec![3000, 5, 0, 900], 16, 2, 256, 16), few);
        replay_case::<bf16, F8E5M2>(&dev, &ProblemSpec::uniform(96, 300, 32, 8, 128, 16), few);
        replay_case::<f16, F8E5M2>(&dev, &ProblemSpec::uniform(800, 40, 16, 4, 64, 16), few);
        // A page table of at most two tiles: whole whatever the residency.
        replay_case::<bf16, F8E4M3>(&dev, &ProblemSpec::uniform(1, 100, 32, 8, 128, 16), few);
    }
}

/// One problem of [`decode_deterministic_and_graph_replay`]: two eager runs, then `replays`
/// replays of a graph of four runs, each on NaN-poisoned outputs, all bit-identical.
fn replay_case<T: Element + ProblemCache, C: ProblemCache>(dev: &Device, spec: &ProblemSpec, replays: usize) {
    use cudarc::driver::sys::{CUgraphInstantiate_flags, CUstreamCaptureMode};
    let s = &dev.stream;
    let host = HostProblem::<T, C>::random(spec).unwrap();
    let plan = BatchPagedDecodePlan::<T, C>::select(s, &host.desc, PlanPreference::default()).unwrap();
    let what = format!("{:?}/{:?} {} path", T::KIND, C::CACHE_KIND, plan.path(host.indices.len()).name());
    let mut buf = DeviceProblem::upload(s, &host, plan.workspace_size()).unwrap();
    let mut eager = || {
        buf.poison_outputs(s).unwrap();
        let (mut args, mut ws) = buf.args_and_workspace();
        plan.run_scaled(s, &mut ws, &mut args, host.scales).unwrap();
        (s.clone_dtoh(&buf.o).unwrap(), s.clone_dtoh(&buf.lse).unwrap())
    };
    let (o1, l1) = eager();
    check(&format!("{what}, eager run"), spec, &o1, &l1, &host.reference().unwrap());
    let (o2, l2) = eager();
    let same = |o: &[T], l: &[f32]| {
        checksum(o) == checksum(&o1) && l.iter().map(|x| x.to_bits()).eq(l1.iter().map(|x| x.to_bits()))
    };
    assert!(same(&o2, &l2), "{what}: two eager runs differ");

    // Each captured run starts from NaN outputs, so that a replay that leaves a row unwritten
    // fails instead of showing the row an earlier run wrote.
    let poison = buf.output_poison(s).unwrap();
    s.begin_capture(CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL).unwrap();
    for _ in 0..4 {
        buf.poison_outputs_from(s, &poison).unwrap();
        let (mut args, mut ws) = buf.args_and_workspace();
        plan.run_scaled(s, &mut ws, &mut args, host.scales).unwrap();
    }
    let graph = s.end_capture(CUgraphInstantiate_flags(0)).unwrap().unwrap();
    for i in 0..replays {
        graph.launch().unwrap();
        if i % 250 == 249 || i + 1 == replays {
            let (o, l) = (s.clone_dtoh(&buf.o).unwrap(), s.clone_dtoh(&buf.lse).unwrap());
            assert!(same(&o, &l), "{what}: graph replay {i} differs");
        }
    }
    println!(
        "{what}, {} splits: eager ×2 and {replays} graph replays bit-identical",
        plan.config().num_splits
    );
}

/// A decode whose `q` is the output of the decode launched right before it, with and without
/// programmatic dependent launch: the second kernel must see every row the first one wrote
/// (poisoned with NaN beforehand), split and unsplit, eagerly and replayed from a graph.
#[test]
fn chained_decodes_see_the_previous_kernels_output() {
    use cudarc::driver::sys::{CUgraphInstantiate_flags, CUstreamCaptureMode};
    let Some(dev) = capture_device("chained_decodes_see_the_previous_kernels_output") else { return };
    let s = &dev.stream;
    // One request: a grid of only the chunks its page table can fill.
    // The fourth takes the lean kernel over the scheduled partition; then the lean kernel (one KV
    // head per CTA), a whole request, and stacked lean CTAs (four KV heads each).
    // `PAGED_DECODE_CHAINED_CASES` runs only the first few (racecheck).
    let count: usize = problem::env_number("PAGED_DECODE_CHAINED_CASES", 7);
    for (i, spec) in [
        ProblemSpec::uniform(2, 3000, 32, 8, 128, 16),
        ProblemSpec::uniform(96, 500, 32, 8, 128, 16),
        ProblemSpec::uniform(1, 3000, 32, 8, 128, 16),
        with_lens(
            (0..600).map(|i| if i % 97 == 5 { 4000 } else { (i * 37) % 301 }).collect(),
            32,
            8,
            128,
            16,
        ),
        ProblemSpec::uniform(4, 32, 16, 4, 128, 16),
        ProblemSpec::uniform(1, 128, 16, 4, 128, 16),
        with_lens((0..1200).map(|i| (i * 7) % 23).collect(), 16, 4, 128, 16),
    ]
    .into_iter()
    .take(count)
    .enumerate()
    {
        let first = HostProblem::<f16>::random(&spec).unwrap();
        let second =
            HostProblem::<f16>::random(&ProblemSpec { seed: spec.seed + 1, ..spec.clone() }).unwrap();
        // SAFETY: the kernel before each decode of the chain is the other decode, which writes
        // only its `o`, `lse` and workspace, or a copy of NaN over an `o` or `lse`.
        let stable = unsafe { StablePageTable::promise() };
        for (programmatic_launch, stable_page_table) in [(false, None), (true, None), (true, Some(stable))] {
            let pref = PlanPreference { programmatic_launch, stable_page_table, ..PlanPreference::default() };
            let plan = BatchPagedDecodePlan::<f16>::select(s, &first.desc, pref).unwrap();
            let mut a = DeviceProblem::upload(s, &first, plan.workspace_size()).unwrap();
            let mut b = DeviceProblem::upload(s, &second, plan.workspace_size()).unwrap();
            // Decode `a`, then decode `b`'s store with `a.o` as its queries.
            let chain = |a: &mut DeviceProblem<f16>, b: &mut DeviceProblem<f16>| {
                {
                    let (mut args, mut ws) = a.args_and_workspace();
                    plan.run(s, &mut ws, &mut args).unwrap();
                }
                let (mut args, mut ws) = b.args_and_workspace_with_q(Some(a.o.slice(..)));
                plan.run(s, &mut ws, &mut args).unwrap();
            };
            a.poison_outputs(s).unwrap();
            b.poison_outputs(s).unwrap();
            chain(&mut a, &mut b);
            let (o1, l1) = (s.clone_dtoh(&a.o).unwrap(), s.clone_dtoh(&a.lse).unwrap());
            check("first of chain", &spec, &o1, &l1, &first.reference().unwrap());
            let mut fed = second.clone();
            fed.q = o1;
            let want = fed.reference().unwrap();
            let (o2, l2) = (s.clone_dtoh(&b.o).unwrap(), s.clone_dtoh(&b.lse).unwrap());
            check("second of chain", &spec, &o2, &l2, &want);

            // Both decodes' outputs NaN before each captured chain (the first one's `o` is the
            // second one's queries).
            let (poison_a, poison_b) = (a.output_poison(s).unwrap(), b.output_poison(s).unwrap());
            s.begin_capture(CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL).unwrap();
            for _ in 0..3 {
                a.poison_outputs_from(s, &poison_a).unwrap();
                b.poison_outputs_from(s, &poison_b).unwrap();
                chain(&mut a, &mut b);
            }
            let graph = s.end_capture(CUgraphInstantiate_flags(0)).unwrap().unwrap();
            let replays: usize = problem::env_number("PAGED_DECODE_REPLAYS", 50).min(50);
            for _ in 0..replays {
                graph.launch().unwrap();
            }
            let (replayed, replayed_lse) = (s.clone_dtoh(&b.o).unwrap(), s.clone_dtoh(&b.lse).unwrap());
            assert!(
                replayed.iter().zip(&o2).all(|(x, y)| x.to_bits() == y.to_bits())
                    && replayed_lse.iter().zip(&l2).all(|(x, y)| x.to_bits() == y.to_bits()),
                "shape {i}, {pref:?}: graph replay differs from eager"
            );
            println!(
                "chain {i} ({} splits, programmatic launch {}, page table early {}): second decode saw the \
                 first one's output",
                plan.config().num_splits,
                plan.programmatic_launch(),
                plan.reads_page_table_early()
            );
        }
    }
}

/// A decode whose page table the kernel right before it writes, under the default preference
/// (programmatic launch, no [`StablePageTable`] promise). That kernel, a long decode still running
/// when the second one's CTAs start, writes its `lse`, which the second decode reads as its
/// `last_page_len`: a placeholder of 1 before, huge lengths after, which the kernels clamp to full
/// pages. The second decode must give the result of the full pages on every path its shapes take
/// (it prints them): the lean kernel, the small batches' whole-request or split kernels, the
/// split kernel deriving the partition in every CTA, and the schedule kernel's partition. Each
/// shape runs twice: under the plan's guessing bound, and with every whole, lean and split
/// launch guessing (`guess_max_ctas`), so that launches of many CTAs and waves redo their first
/// tiles or their partition.
#[test]
fn page_table_written_by_the_previous_kernel() {
    let Some(dev) = device("page_table_written_by_the_previous_kernel") else { return };
    let mut writer = Writer::new(&dev);
    let mut paths = Vec::new();
    let (mut guessed, mut guessed_by_all) = (0, 0);
    // Split on the H200: (2, 128), (1, 1024), (8, 512), (3, 1008), (6, 704) and (4, 4096) guess
    // their partition under the default bound too (24–256 CTAs, within one and a half waves of
    // 264); the changed lengths change it, so they compute it again after the wait.
    let shapes = [
        (4, 32),
        (1, 128),
        (2, 64),
        (32, 64),
        (2, 128),
        (8, 512),
        (1, 1024),
        (3, 1008),
        (6, 704),
        (4, 4096),
        (64, 2048),
        (64, 64),
    ];
    let all_guess = PlanPreference { guess_max_ctas: Some(u32::MAX), ..PlanPreference::default() };
    for ((batch, len), pref) in
        shapes.into_iter().flat_map(|s| [(s, PlanPreference::default()), (s, all_guess)])
    {
        // Full last pages: the table the writer leaves.
        let spec = ProblemSpec { seed: 91, ..ProblemSpec::uniform(batch, len, 16, 4, 128, 16) };
        let (path, guesses) = writer.then_decode::<f16, f16>(&spec, pref);
        if pref == all_guess {
            let guessing_path = matches!(path, DecodePath::Lean | DecodePath::Whole | DecodePath::Split);
            assert!(
                !writer.programmatic || guesses == guessing_path as usize,
                "{}: guesses {guesses} with no bound",
                path.name()
            );
            guessed_by_all += guesses;
        } else {
            paths.push(path.name());
            guessed += guesses;
        }
    }
    // The schedule kernel's partition of the table the writer changes: 40 requests in two fixed
    // splits (scheduled on the H100 and H200; (64, 2048) and (64, 64) above run whole).
    let spec = ProblemSpec { seed: 92, ..ProblemSpec::uniform(40, 1024, 16, 4, 128, 16) };
    let fixed_splits = PlanPreference { num_splits: Some(2), ..PlanPreference::default() };
    let (path, _) = writer.then_decode::<f16, f16>(&spec, fixed_splits);
    assert_eq!(path, DecodePath::Scheduled, "40 requests in two fixed splits");
    paths.push(path.name());
    // (4, 32) lean, (1, 128) and (2, 64) whole: a few CTAs each, which guess the lookup the
    // writer is still changing (its last pages' lengths), and must redo their first tiles.
    assert!(!writer.programmatic || guessed >= 3, "only {guessed} launches guessed their page lookup");
    println!(
        "paths {paths:?}, programmatic launch {}, {guessed} guessing ({guessed_by_all} with no bound): \
         the table the previous kernel wrote",
        writer.programmatic
    );
}

/// [`page_table_written_by_the_previous_kernel`] with the previous kernel writing the page ids
/// (all of `indices`: page 1 before, the store's last page after) instead of the lengths, so that
/// the guessing launches find a changed page list, not a changed length, when they confirm their
/// guess: whole and lean launches of a few CTAs, and split ones, with 16- and 8-bit caches.
#[test]
fn page_ids_written_by_the_previous_kernel() {
    let test = "page_ids_written_by_the_previous_kernel";
    let Some(dev) = device(test) else { return };
    let fp8 = runs_fp8(&dev, test);
    let mut writer = Writer::new(&dev);
    let (mut guessed, mut paths) = (0, std::collections::BTreeSet::new());
    // At most 64 page-list entries (the writer's 64 lse values): batch × len / 16.
    let shapes = [(4, 32, 128), (1, 128, 128), (2, 64, 64), (2, 128, 128), (1, 1024, 128), (32, 32, 128)];
    let all_guess = PlanPreference { guess_max_ctas: Some(u32::MAX), ..PlanPreference::default() };
    for (i, (batch, len, d)) in shapes.into_iter().enumerate() {
        let spec = ProblemSpec { seed: 97 + i as u64, ..ProblemSpec::uniform(batch, len, 16, 4, d, 16) };
        for pref in [PlanPreference::default(), all_guess] {
            let (path, guesses) = writer.then_decode_written::<f16, f16>(&spec, pref, Written::PageIds);
            paths.insert(path.name());
            guessed += guesses;
            guessed += writer.then_decode_written::<bf16, bf16>(&spec, pref, Written::PageIds).1;
            if fp8 {
                let (a, b) = two_fp8_pairings!(i, |Q, C| writer
                    .then_decode_written::<Q, C>(&spec, pref, Written::PageIds)
                    .1);
                guessed += a + b;
            }
        }
    }
    assert!(
        !writer.programmatic || guessed >= shapes.len(),
        "only {guessed} launches guessed their page lookup"
    );
    println!("{test}: paths {paths:?}, {guessed} launches guessed the page ids the previous kernel wrote");
}

/// [`page_table_written_by_the_previous_kernel`] for the other element types' guessing entries:
/// bf16, and the 8-bit caches' (each pairing of q type and code format, two per shape in turn),
/// lean and whole, at head_dim 64, 128 and 256, each launch guessing the lookup the writer is
/// changing.
#[test]
fn page_table_written_by_the_previous_kernel_every_element() {
    let test = "page_table_written_by_the_previous_kernel_every_element";
    let Some(dev) = device(test) else { return };
    let fp8 = runs_fp8(&dev, test);
    let mut writer = Writer::new(&dev);
    let mut guessed = 0;
    let shapes = [(4, 32, 128), (1, 128, 128), (4, 32, 64), (1, 128, 64), (1, 64, 256)];
    for (i, (batch, len, d)) in shapes.into_iter().enumerate() {
        let spec = ProblemSpec { seed: 93 + i as u64, ..ProblemSpec::uniform(batch, len, 16, 4, d, 16) };
        let pref = PlanPreference::default();
        guessed += writer.then_decode::<bf16, bf16>(&spec, pref).1;
        if fp8 {
            let (a, b) = two_fp8_pairings!(i, |Q, C| writer.then_decode::<Q, C>(&spec, pref).1);
            guessed += a + b;
        }
    }
    assert!(
        !writer.programmatic || guessed >= shapes.len(),
        "only {guessed} launches guessed their page lookup"
    );
    println!("{test}: {guessed} launches guessed the lookup the previous kernel wrote");
}

/// The kernel before the decodes of the two tests above: two long requests, one CTA per
/// (request, KV head), so that it is still running when the next launch's CTAs start; it writes
/// its 64 lse values, which the next decode reads as its `last_page_len`.
/// `PAGED_DECODE_WRITER_TOKENS` shortens them under racecheck, which slows every launch alike
/// (the decodes check that the writer's lse stays positive).
/// Which part of the second decode's page table [`Writer`] writes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Written {
    /// `last_page_len`: lengths of 1 before, clamped to full pages after.
    LastPageLen,
    /// The whole of `indices` (at most 64 entries): page 1 before, and after the writer's
    /// positive lse, as i32 beyond the store, clamped to its last page.
    PageIds,
}

struct Writer<'d> {
    dev: &'d Device,
    plan: BatchPagedDecodePlan<f16>,
    buf: DeviceProblem<f16>,
    placeholder: Vec<f32>,
    programmatic: bool,
}

impl<'d> Writer<'d> {
    fn new(dev: &'d Device) -> Self {
        let s = &dev.stream;
        let writer_tokens: usize = problem::env_number("PAGED_DECODE_WRITER_TOKENS", 32768).max(1024);
        let writer =
            HostProblem::<f16>::random(&ProblemSpec::uniform(2, writer_tokens, 32, 8, 128, 16)).unwrap();
        let pref = PlanPreference { num_splits: Some(1), ..PlanPreference::default() };
        let plan = BatchPagedDecodePlan::<f16>::select(s, &writer.desc, pref).unwrap();
        let buf = DeviceProblem::upload(s, &writer, plan.workspace_size()).unwrap();
        let placeholder = vec![f32::from_bits(1); buf.lse.len()];
        let programmatic = paged_decode::ptx::supports_programmatic_launch(
            paged_decode::device::DeviceProps::query(&dev.ctx).unwrap().compute_capability,
        );
        Self { dev, plan, buf, placeholder, programmatic }
    }

    /// Runs the writer (its lse reset to lengths of 1), then a decode of `spec` (batch ≤ 64, full
    /// last pages) whose `last_page_len` is the writer's lse, and checks it against the
    /// reference of full pages; the path it took and whether it guessed its page lookup.
    fn then_decode<T: Element + ProblemCache, C: ProblemCache>(
        &mut self,
        spec: &ProblemSpec,
        pref: PlanPreference,
    ) -> (DecodePath, usize) {
        self.then_decode_written::<T, C>(spec, pref, Written::LastPageLen)
    }

    /// [`Self::then_decode`] with `written` naming what the writer's lse stands for in the
    /// decode's page table; with [`Written::PageIds`], the reference reads every page-list entry
    /// as the store's last page.
    fn then_decode_written<T: Element + ProblemCache, C: ProblemCache>(
        &mut self,
        spec: &ProblemSpec,
        pref: PlanPreference,
        written: Written,
    ) -> (DecodePath, usize) {
        let s = &self.dev.stream;
        let mut host = HostProblem::<T, C>::random(spec).unwrap();
        let plan = BatchPagedDecodePlan::<T, C>::select(s, &host.desc, pref).unwrap();
        assert!(!plan.reads_page_table_early());
        let path = plan.path(host.indices.len());
        let what = format!("{} {:?}/{:?} d {}", path.name(), T::KIND, C::CACHE_KIND, spec.head_dim);
        // Launches of at most one CTA per SM, split ones of one and a half waves (or all, with
        // `guess_max_ctas`) guess the lookup the writer is changing.
        let guesses = plan.guesses_page_lookup(host.indices.len()) as usize;
        let mut buf = DeviceProblem::upload(s, &host, plan.workspace_size()).unwrap();
        buf.poison_outputs(s).unwrap();
        s.memcpy_htod(&self.placeholder, &mut self.buf.lse).unwrap();
        {
            let (mut args, mut ws) = self.buf.args_and_workspace();
            self.plan.run(s, &mut ws, &mut args).unwrap();
        }
        let batch = spec.batch();
        let entries = host.indices.len();
        {
            let (mut args, mut ws) = buf.args_and_workspace();
            // SAFETY: `lse` holds 64 f32 values, read here as `batch ≤ 64` i32 lengths or at most
            // 64 i32 page ids; one stream orders both launches.
            match written {
                Written::LastPageLen => {
                    let lengths = unsafe { self.buf.lse.transmute::<i32>(batch) }.unwrap();
                    args.last_page_len = TensorRef::new(lengths, [batch as i32]);
                }
                Written::PageIds => {
                    assert!(entries <= self.buf.lse.len(), "{what}: {entries} page-list entries");
                    let ids = unsafe { self.buf.lse.transmute::<i32>(entries) }.unwrap();
                    args.indices = TensorRef::new(ids, [entries as i32]);
                }
            }
            plan.run_scaled(s, &mut ws, &mut args, host.scales).unwrap();
        }
        let writer_lse = s.clone_dtoh(&self.buf.lse).unwrap();
        assert!(writer_lse.iter().all(|&v| v > 0.0), "{what}: the writer's lse must be positive");
        if written == Written::PageIds {
            let last_page = host.desc.paged_kv.num_total_pages - 1;
            assert!(
                writer_lse.iter().all(|&v| v.to_bits() as i32 > last_page),
                "{what}: an lse within the store"
            );
            host.indices.fill(last_page);
        }
        let (o, lse) = (s.clone_dtoh(&buf.o).unwrap(), s.clone_dtoh(&buf.lse).unwrap());
        check(&format!("{what}, {written:?} written"), spec, &o, &lse, &host.reference().unwrap());
        (path, guesses)
    }
}

fn checksum<T: Element>(v: &[T]) -> Vec<u64> {
    v.iter().map(|x| x.to_f64().to_bits()).collect()
}

/// Append writes exactly the new slot of every (request, KV head), matching the reference.
#[test]
fn append_matches_reference_and_touches_nothing_else() {
    let Some(dev) = device("append_matches_reference_and_touches_nothing_else") else { return };
    fn one<T: Element + ProblemCache>(dev: &Device, page: usize, d: usize, seed: u64) {
        let mut rng = Rng::new(seed);
        let (host, desc) = HostProblem::<T>::random_append(&mut rng, page, d, seed).unwrap();
        let row = append_rows(&desc) * d;
        let key: Vec<T> = (0..row).map(|_| T::from_f64(rng.symmetric())).collect();
        let value: Vec<T> = (0..row).map(|_| T::from_f64(rng.symmetric())).collect();
        let (mut k_ref, mut v_ref) = (host.k_data.clone(), host.v_data.clone());
        paged_decode::reference::append(&desc, &key, &value, &mut k_ref, &mut v_ref, host.page_table())
            .unwrap();
        let changed = k_ref.iter().zip(&host.k_data).filter(|(a, b)| a.to_f64() != b.to_f64()).count();
        assert!(changed > 0);

        let plan = PagedKvAppendPlan::<T>::select(&dev.stream, &desc, PlanPreference::default()).unwrap();
        let mut buf = DeviceProblem::upload(&dev.stream, &host, 0).unwrap();
        let key_d = dev.stream.clone_htod(&key).unwrap();
        let value_d = dev.stream.clone_htod(&value).unwrap();
        {
            let mut args = buf.append_args(&key_d, &value_d);
            plan.run(&dev.stream, &mut Workspace::none(), &mut args).unwrap();
        }
        let k = dev.stream.clone_dtoh(&buf.k_data).unwrap();
        let v = dev.stream.clone_dtoh(&buf.v_data).unwrap();
        assert_eq!(
            checksum(&k),
            checksum(&k_ref),
            "K store differs from the reference append (page {page}, d {d})"
        );
        assert_eq!(
            checksum(&v),
            checksum(&v_ref),
            "V store differs from the reference append (page {page}, d {d})"
        );
    }
    for (i, (page, d)) in [(1, 64), (16, 128), (7, 256), (256, 128)].into_iter().enumerate() {
        one::<f16>(&dev, page, d, 10 + i as u64);
        one::<bf16>(&dev, page, d, 20 + i as u64);
        one::<f32>(&dev, page, d, 30 + i as u64);
    }
    println!("append: f16/bf16/f32 × 4 geometries match the reference byte for byte");
}

/// A decode launched right after an append on the same stream, with nothing between them, sees
/// the appended token: the append lets the decode's launch start first thing, and the decode
/// must read K/V only after its wait. Each round appends new rows of a larger magnitude than the
/// store's (a stale read of the old token moves the output far past the tolerance) and checks
/// the decode against the float64 reference of the appended store, in the default launch and
/// with the page-table promise (whose CTAs read the page table, and prefetch their first tiles
/// into L2, before the wait; the append writes K/V only). The cases must take the lean, whole,
/// split and scheduled paths.
#[test]
fn decode_right_after_an_append_sees_the_new_token() {
    let Some(dev) = device("decode_right_after_an_append_sees_the_new_token") else { return };
    fn case<T: Element + ProblemCache>(
        dev: &Device,
        spec: &ProblemSpec,
        pref: PlanPreference,
        seed: u64,
    ) -> DecodePath {
        let s = &dev.stream;
        let mut host = HostProblem::<T>::random(spec).unwrap();
        let plan = BatchPagedDecodePlan::<T>::select(s, &host.desc, pref).unwrap();
        let desc = PagedKvAppendDescriptor { batch_size: host.desc.batch_size, paged_kv: host.desc.paged_kv };
        let append = PagedKvAppendPlan::<T>::select(s, &desc, PlanPreference::default()).unwrap();
        let mut buf = DeviceProblem::upload(s, &host, plan.workspace_size()).unwrap();
        let path = plan.path(host.indices.len());
        let what = format!("{:?} {} requests, {} path", T::KIND, spec.lens.len(), path.name());
        let mut rng = Rng::new(seed);
        let rows = spec.lens.len() * spec.num_kv_heads * spec.head_dim;
        for round in 0..4 {
            let key: Vec<T> = (0..rows).map(|_| T::from_f64(4.0 * rng.symmetric())).collect();
            let value: Vec<T> = (0..rows).map(|_| T::from_f64(4.0 * rng.symmetric())).collect();
            let (mut k, mut v) = (host.k_data.clone(), host.v_data.clone());
            paged_decode::reference::append(&desc, &key, &value, &mut k, &mut v, host.page_table()).unwrap();
            (host.k_data, host.v_data) = (k, v);
            let r = host.reference().unwrap();
            let (key_d, value_d) = (s.clone_htod(&key).unwrap(), s.clone_htod(&value).unwrap());
            buf.poison_outputs(s).unwrap();
            {
                let mut args = buf.append_args(&key_d, &value_d);
                append.run(s, &mut Workspace::none(), &mut args).unwrap();
            }
            {
                let (mut args, mut ws) = buf.args_and_workspace();
                plan.run(s, &mut ws, &mut args).unwrap();
            }
            let (o, lse) = (s.clone_dtoh(&buf.o).unwrap(), s.clone_dtoh(&buf.lse).unwrap());
            check(&format!("{what}, round {round}"), &host.spec, &o, &lse, &r);
        }
        path
    }
    // SAFETY: the only kernel before each decode here is the append, which writes K/V, never
    // the page table.
    let promise = PlanPreference {
        stable_page_table: Some(unsafe { StablePageTable::promise() }),
        ..PlanPreference::default()
    };
    let specs = [
        ProblemSpec::uniform(8, 16, 32, 8, 128, 16),
        ProblemSpec::uniform(1, 100, 32, 8, 128, 16),
        ProblemSpec::uniform(1, 1000, 32, 8, 128, 16),
        ProblemSpec::uniform(16, 64, 32, 8, 128, 16),
        with_lens(vec![0, 1, 17, 2000, 64, 300, 5, 900], 32, 8, 128, 16),
        ProblemSpec::uniform(40, 1000, 32, 8, 128, 16),
    ];
    let mut paths = Vec::new();
    for (i, spec) in specs.iter().enumerate() {
        for pref in [PlanPreference::default(), promise] {
            paths.push(case::<f16>(&dev, spec, pref, 100 + i as u64));
        }
        paths.push(case::<bf16>(&dev, spec, PlanPreference::default(), 200 + i as u64));
    }
    for path in [DecodePath::Lean, DecodePath::Whole, DecodePath::Split, DecodePath::Scheduled] {
        assert!(paths.contains(&path), "no case took the {} path: {paths:?}", path.name());
    }
    paths.dedup();
    println!("a decode right after an append matched the appended store on every path ({paths:?})");
}

/// The checked option reports corrupt page tables as typed errors; the fast path stays in bounds.
#[test]
fn checked_mode_reports_bad_page_tables() {
    let Some(dev) = device("checked_mode_reports_bad_page_tables") else { return };
    let spec = ProblemSpec::uniform(4, 100, 8, 2, 128, 16);
    let good = HostProblem::<f16>::random(&spec).unwrap();
    let pages = good.desc.paged_kv.num_total_pages;
    let checked = PlanPreference { checked: true, ..PlanPreference::default() };
    let plan = BatchPagedDecodePlan::<f16>::select(&dev.stream, &good.desc, checked).unwrap();
    let fast =
        BatchPagedDecodePlan::<f16>::select(&dev.stream, &good.desc, PlanPreference::default()).unwrap();
    let mut corruptions: Vec<(&str, HostProblem<f16>)> = Vec::new();
    let mut h = good.clone();
    h.indices[5] = pages + 7;
    corruptions.push(("page id out of range", h));
    let mut h = good.clone();
    h.indices[0] = -1;
    corruptions.push(("negative page id", h));
    let mut h = good.clone();
    h.indptr[2] = h.indptr[1] - 1;
    corruptions.push(("decreasing indptr", h));
    let mut h = good.clone();
    h.indptr[4] = h.indices.len() as i32 + 50;
    corruptions.push(("indptr past indices", h));
    let mut h = good.clone();
    h.last_page_len[3] = 17;
    corruptions.push(("last_page_len > page_size", h));
    // Two requests own every page: more tokens than the page table holds, for which the split
    // grid (sized by `indices`) has too few CTAs.
    let mut h = good.clone();
    let n = h.indices.len() as i32;
    h.indptr = vec![0, n, 0, n, n];
    corruptions.push(("overlapping requests", h));
    for (name, bad) in &corruptions {
        let mut buf = DeviceProblem::upload(&dev.stream, bad, plan.workspace_size()).unwrap();
        let (mut args, mut ws) = buf.args_and_workspace();
        match plan.run(&dev.stream, &mut ws, &mut args) {
            Err(Error::InvalidPageTable(msg)) => println!("{name}: {msg}"),
            other => panic!("{name}: expected InvalidPageTable, got {other:?}"),
        }
        // Unchecked: runs without faulting (output unspecified).
        fast.run(&dev.stream, &mut ws, &mut args).unwrap();
        dev.stream.synchronize().unwrap();
    }
    let mut buf = DeviceProblem::upload(&dev.stream, &good, plan.workspace_size()).unwrap();
    let (mut args, mut ws) = buf.args_and_workspace();
    plan.run(&dev.stream, &mut ws, &mut args).unwrap();
    // The corrupt runs left no split state behind (arrival counters): the fast path is exact again.
    assert!(fast.config().is_split(), "the fast plan should split these short requests");
    let (o, lse) = run_decode(&dev, &fast, &mut buf);
    check("after corrupt page tables", &spec, &o, &lse, &good.reference().unwrap());
}

/// `run` refuses a missing or short workspace.
#[test]
fn workspace_too_small_is_reported() {
    let Some(dev) = device("workspace_too_small_is_reported") else { return };
    let host = HostProblem::<f16>::random(&ProblemSpec::uniform(1, 4000, 32, 8, 128, 16)).unwrap();
    let plan =
        BatchPagedDecodePlan::<f16>::select(&dev.stream, &host.desc, PlanPreference::default()).unwrap();
    assert!(plan.workspace_size() > 0, "a single long request should be split");
    let mut buf = DeviceProblem::upload(&dev.stream, &host, 0).unwrap();
    let mut args = buf.args();
    match plan.run(&dev.stream, &mut Workspace::none(), &mut args) {
        Err(Error::WorkspaceTooSmall { needed, got: 0 }) => assert_eq!(needed, plan.workspace_size()),
        other => panic!("expected WorkspaceTooSmall, got {other:?}"),
    }
}

/// Plans sharing a kernel entry with different shared-memory needs (the group sets the query
/// tiles per CTA) run in any order: selecting the smaller one after the larger one must not
/// lower the entry's limit under the larger one's launches.
#[test]
fn plans_sharing_an_entry_run_in_any_order() {
    let Some(dev) = device("plans_sharing_an_entry_run_in_any_order") else { return };
    let large = HostProblem::<f16>::random(&ProblemSpec::uniform(1, 3000, 64, 1, 128, 16)).unwrap();
    let small = HostProblem::<f16>::random(&ProblemSpec::uniform(1, 3000, 8, 1, 128, 16)).unwrap();
    let select = |host: &HostProblem<f16>| {
        BatchPagedDecodePlan::<f16>::select(&dev.stream, &host.desc, PlanPreference::default()).unwrap()
    };
    let (large_plan, small_plan) = (select(&large), select(&small));
    for (name, host, plan) in [("group 64", &large, &large_plan), ("group 8", &small, &small_plan)] {
        let mut buf = DeviceProblem::upload(&dev.stream, host, plan.workspace_size()).unwrap();
        let (o, lse) = run_decode(&dev, plan, &mut buf);
        check(name, &host.spec, &o, &lse, &host.reference().unwrap());
    }
}

/// Releasing the cached modules of a context leaves live plans their kernels, lets a later
/// `select` load them again, and lets the context go once nothing else holds it. On a context of
/// its own (not the primary one the other tests share, whose graphs may replay plans they
/// dropped).
#[test]
fn released_modules_load_again() {
    use paged_decode::device::release_cached_modules;
    if device("released_modules_load_again").is_none() {
        return;
    }
    let ctx = cudarc::driver::CudaContext::new_non_primary(0, 0).unwrap();
    let dev = Device { stream: ctx.new_stream().unwrap(), ctx: ctx.clone() };
    let host = HostProblem::<f16>::random(&ProblemSpec::uniform(3, 700, 32, 8, 128, 16)).unwrap();
    let select =
        || BatchPagedDecodePlan::<f16>::select(&dev.stream, &host.desc, PlanPreference::default()).unwrap();
    let kept = select();
    // SAFETY: the context is this test's, and no graph was captured on it.
    assert!(unsafe { release_cached_modules(&ctx) } > 0);
    let again = select();
    for (name, plan) in [("kept", &kept), ("selected again", &again)] {
        let mut buf = DeviceProblem::upload(&dev.stream, &host, plan.workspace_size()).unwrap();
        let (o, lse) = run_decode(&dev, plan, &mut buf);
        check(name, &host.spec, &o, &lse, &host.reference().unwrap());
    }
    drop((kept, again, dev));
    // SAFETY: as above.
    assert!(unsafe { release_cached_modules(&ctx) } > 0);
    assert_eq!(std::sync::Arc::strong_count(&ctx), 1, "the cache still holds the context");
}

/// The split state (arrival counters) lives in the caller's workspace, so neither dropping the
/// plan nor running it on another stream can touch memory the plan owned: a graph replayed
/// after its plan is dropped, and a first `run` on a stream other than `select`'s, give exact
/// results; a workspace holding another configuration's split state is refused.
#[test]
fn split_state_lives_in_the_workspace() {
    use cudarc::driver::CudaStream;
    use cudarc::driver::sys::{CUgraphInstantiate_flags, CUstreamCaptureMode};
    use std::sync::Arc;
    let Some(dev) = capture_device("split_state_lives_in_the_workspace") else { return };
    let spec = ProblemSpec { seed: 77, ..ProblemSpec::uniform(2, 3000, 32, 8, 128, 16) };
    let host = HostProblem::<f16>::random(&spec).unwrap();
    let reference = host.reference().unwrap();
    let select = |s: &Arc<CudaStream>, spare| {
        let pref = PlanPreference { spare_chunks: spare, ..PlanPreference::default() };
        BatchPagedDecodePlan::<f16>::select(s, &host.desc, pref).unwrap()
    };
    let plan = select(&dev.stream, None);
    assert!(plan.config().is_split());
    let mut buf = DeviceProblem::upload(&dev.stream, &host, plan.workspace_size()).unwrap();

    // First run on another stream, right after `select` (which no longer writes anything), on
    // outputs poisoned (and synchronized: the streams are untracked) beforehand.
    buf.poison_outputs(&dev.stream).unwrap();
    dev.stream.synchronize().unwrap();
    let other = dev.ctx.new_stream().unwrap();
    let mut ws_bytes = other.alloc_zeros::<u8>(plan.workspace_size()).unwrap();
    {
        let mut ws = Workspace::zeroed(&other, ws_bytes.slice_mut(..)).unwrap();
        let mut args = buf.args();
        plan.run(&other, &mut ws, &mut args).unwrap();
        other.synchronize().unwrap();
    }
    let (o, lse) = (dev.stream.clone_dtoh(&buf.o).unwrap(), dev.stream.clone_dtoh(&buf.lse).unwrap());
    check("first run on another stream", &spec, &o, &lse, &reference);

    // A graph keeps working after the plan that recorded it is dropped.
    let poison = buf.output_poison(&dev.stream).unwrap();
    let mut ws = Workspace::zeroed(&dev.stream, ws_bytes.slice_mut(..)).unwrap();
    dev.stream.begin_capture(CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL).unwrap();
    for _ in 0..3 {
        buf.poison_outputs_from(&dev.stream, &poison).unwrap();
        let mut args = buf.args();
        plan.run(&dev.stream, &mut ws, &mut args).unwrap();
    }
    let graph = dev.stream.end_capture(CUgraphInstantiate_flags(0)).unwrap().unwrap();
    drop(plan);
    // Whatever the allocator hands out next may reuse what the plan held: nothing, now.
    let _fresh = dev.stream.alloc_zeros::<u32>(1 << 16).unwrap();
    for _ in 0..5 {
        graph.launch().unwrap();
    }
    let (o, lse) = (dev.stream.clone_dtoh(&buf.o).unwrap(), dev.stream.clone_dtoh(&buf.lse).unwrap());
    check("graph replayed after its plan was dropped", &spec, &o, &lse, &reference);

    // Plans of one batch and head count share the split state: a plan with more spare chunks
    // (a larger partial region) runs on the same workspace. A plan of a larger batch has a
    // larger split state: the bound workspace is refused until it is zeroed again.
    let wider = select(&dev.stream, Some(200));
    let mut big = dev.stream.alloc_zeros::<u8>(wider.workspace_size()).unwrap();
    let mut ws = Workspace::zeroed(&dev.stream, big.slice_mut(..)).unwrap();
    for (what, plan) in [("default", &select(&dev.stream, None)), ("wider", &wider)] {
        buf.poison_outputs(&dev.stream).unwrap();
        plan.run(&dev.stream, &mut ws, &mut buf.args()).unwrap();
        let (o, lse) = (dev.stream.clone_dtoh(&buf.o).unwrap(), dev.stream.clone_dtoh(&buf.lse).unwrap());
        check(&format!("two configurations of one split state: {what}"), &spec, &o, &lse, &reference);
    }
    let one = HostProblem::<f16>::random(&ProblemSpec {
        seed: 78,
        ..ProblemSpec::uniform(40, 300, 32, 8, 128, 16)
    })
    .unwrap();
    let single =
        BatchPagedDecodePlan::<f16>::select(&dev.stream, &one.desc, PlanPreference::default()).unwrap();
    assert!(single.config().is_split() && single.workspace_size() <= ws.len());
    let mut one_buf = DeviceProblem::upload(&dev.stream, &one, 0).unwrap();
    one_buf.poison_outputs(&dev.stream).unwrap();
    let mut args = one_buf.args();
    match single.run(&dev.stream, &mut ws, &mut args) {
        Err(Error::WorkspaceInUse { .. }) => {}
        other => panic!("expected WorkspaceInUse, got {other:?}"),
    }
    let mut ws = Workspace::zeroed(&dev.stream, big.slice_mut(..)).unwrap();
    single.run(&dev.stream, &mut ws, &mut args).unwrap();
    let (o, lse) = (dev.stream.clone_dtoh(&one_buf.o).unwrap(), dev.stream.clone_dtoh(&one_buf.lse).unwrap());
    check("re-zeroed workspace, batch 40", &one.spec, &o, &lse, &one.reference().unwrap());
}

/// A plan launches only on its own context's streams, with tensors and workspace of that context:
/// anything else is `WrongDevice` before the stream is touched, and the context stays usable.
/// Another context on the same GPU (a non-primary one) stands in for another device.
#[test]
fn run_refuses_tensors_of_another_context() {
    let Some(dev) = device("run_refuses_tensors_of_another_context") else { return };
    let other_ctx = cudarc::driver::CudaContext::new_non_primary(0, 0).unwrap();
    let other = Device { stream: other_ctx.new_stream().unwrap(), ctx: other_ctx };
    refuses_foreign_operands(&dev, &other);
}

/// As above across two GPUs: a device-1 plan on device 1's stream with device-0 tensors.
#[test]
fn run_refuses_tensors_of_another_gpu() {
    let test = "run_refuses_tensors_of_another_gpu";
    let Some(dev0) = device(test) else { return };
    if cudarc::driver::CudaContext::device_count().unwrap() < 2 {
        return skipped(test, "fewer than two GPUs");
    }
    let dev1 = Device::open(1).unwrap();
    refuses_foreign_operands(&dev1, &dev0);
}

/// Runs `dev`'s plans with operands from `other`, one at a time, expecting `WrongDevice` naming
/// each; then checks a correct run on `dev` still matches the reference.
fn refuses_foreign_operands(dev: &Device, other: &Device) {
    use paged_decode::TensorMut;
    let spec = ProblemSpec::uniform(3, 700, 16, 4, 128, 16);
    let host = HostProblem::<f16>::random(&spec).unwrap();
    let (s, foreign) = (&dev.stream, &other.stream);
    let wrong = |r: paged_decode::Result<()>, operand: &str| match r {
        Err(Error::WrongDevice { operand: o, expected, found }) => {
            assert_eq!(o, operand);
            assert_eq!((expected, found), (dev.ctx.ordinal(), other.ctx.ordinal()));
        }
        other => panic!("{operand} of another context: expected WrongDevice, got {other:?}"),
    };
    for checked in [false, true] {
        let pref = PlanPreference { checked, ..PlanPreference::default() };
        let plan = BatchPagedDecodePlan::<f16>::select(s, &host.desc, pref).unwrap();
        let mut mine = DeviceProblem::upload(s, &host, plan.workspace_size()).unwrap();
        let mut theirs = DeviceProblem::upload(foreign, &host, plan.workspace_size()).unwrap();
        // Every operand of the other context.
        {
            let (mut args, mut ws) = theirs.args_and_workspace();
            wrong(plan.run(s, &mut ws, &mut args), "q");
            // The plan's own context on the other stream.
            wrong(plan.run(foreign, &mut ws, &mut args), "stream");
        }
        // One operand at a time.
        let store = [host.desc.paged_kv.num_total_pages, 4, 16, 128];
        let (b, hq) = (3, 16);
        for operand in ["k_data", "indptr", "lse", "workspace"] {
            let (mut args, mut ws) = mine.args_and_workspace();
            match operand {
                "k_data" => args.k_data = TensorRef::new(theirs.k_data.slice(..), store),
                "indptr" => args.indptr = TensorRef::new(theirs.indptr.slice(..), [b + 1]),
                "lse" => args.lse = TensorMut::new(theirs.lse.slice_mut(..), [b, hq]),
                _ => ws = Workspace::zeroed(foreign, theirs.workspace.slice_mut(..)).unwrap(),
            }
            if operand == "workspace" && plan.workspace_size() == 0 {
                continue;
            }
            wrong(plan.run(s, &mut ws, &mut args), operand);
        }
        if checked {
            let args = theirs.args();
            wrong(plan.check_page_table(s, &args), "q");
        }
        // The context is intact: a correct run matches the reference.
        let (o, lse) = run_decode(dev, &plan, &mut mine);
        check("after refused runs", &spec, &o, &lse, &host.reference().unwrap());
    }
    // Append: a plan of `dev` writing a store of `other`.
    let desc = PagedKvAppendDescriptor { batch_size: 3, paged_kv: host.desc.paged_kv };
    let plan = PagedKvAppendPlan::<f16>::select(s, &desc, PlanPreference::default()).unwrap();
    let mut theirs = DeviceProblem::upload(foreign, &host, 0).unwrap();
    let token = foreign.clone_htod(&vec![f16::ONE; 3 * 4 * 128]).unwrap();
    let mut args = theirs.append_args(&token, &token);
    wrong(plan.run(s, &mut Workspace::none(), &mut args), "key");
    s.synchronize().unwrap();
    foreign.synchronize().unwrap();
    println!(
        "operands of another context refused (ordinal {} vs {})",
        dev.ctx.ordinal(),
        other.ctx.ordinal()
    );
}

/// Two cudarc `CudaContext` objects of one driver context (two `CudaContext::new(0)`): tensors
/// of an object used through its default stream alone (which does not manage stream
/// synchronization) are refused on the stream of a tracking `Device` (which does), and so is a
/// workspace zeroed there; tensors of an object with a stream of its own (managing, as the
/// device) are taken on the device's stream and give the reference's result, and refused on its
/// default stream. A decode and an append captured on the
/// tracking device's stream are refused before anything is enqueued: the capture ends empty.
#[test]
fn run_refuses_unordered_context_objects() {
    use cudarc::driver::CudaContext;
    use cudarc::driver::sys::{CUgraphInstantiate_flags, CUstreamCaptureMode};
    let Some(dev) = device("run_refuses_unordered_context_objects") else { return };
    let s = &dev.stream;
    assert!(dev.ctx.is_managing_stream_synchronization());
    let spec = ProblemSpec::uniform(3, 700, 16, 4, 128, 16);
    let host = HostProblem::<f16>::random(&spec).unwrap();
    let plan = BatchPagedDecodePlan::<f16>::select(s, &host.desc, PlanPreference::default()).unwrap();
    assert!(plan.workspace_size() > 0, "a split plan, so that the workspace is checked");

    let lone = CudaContext::new(0).unwrap();
    let lone_stream = lone.default_stream();
    assert!(!lone.is_managing_stream_synchronization() && lone.cu_ctx() == dev.ctx.cu_ctx());
    let mut theirs = DeviceProblem::upload(&lone_stream, &host, plan.workspace_size()).unwrap();
    let mut mine = DeviceProblem::upload(s, &host, plan.workspace_size()).unwrap();
    lone_stream.synchronize().unwrap();
    let unordered = |r: paged_decode::Result<()>, operand: &str| match r {
        Err(Error::UnorderedContext { operand: o }) => assert_eq!(o, operand),
        other => panic!("{operand} of an unordered context object: expected UnorderedContext, got {other:?}"),
    };
    {
        let (mut args, mut ws) = mine.args_and_workspace();
        args.o = paged_decode::TensorMut::new(theirs.o.slice_mut(..), [3, 16, 128]);
        unordered(plan.run(s, &mut ws, &mut args), "o");
    }
    match Workspace::zeroed(s, theirs.workspace.slice_mut(..)) {
        Err(Error::UnorderedContext { operand: "workspace" }) => {}
        other => panic!("workspace of an unordered context object: expected UnorderedContext, got {other:?}"),
    }

    // An object that manages synchronization too: its tensors are ordered with the launch.
    let tracked = CudaContext::new(0).unwrap();
    let tracked_stream = tracked.new_stream().unwrap();
    assert!(tracked.is_managing_stream_synchronization());
    let mut ordered = DeviceProblem::upload(&tracked_stream, &host, plan.workspace_size()).unwrap();
    ordered.poison_outputs(&tracked_stream).unwrap();
    {
        let mut ws = Workspace::zeroed(s, mine.workspace.slice_mut(..)).unwrap();
        plan.run(s, &mut ws, &mut ordered.args()).unwrap();
    }
    let (o, lse) = (s.clone_dtoh(&ordered.o).unwrap(), s.clone_dtoh(&ordered.lse).unwrap());
    check("tensors of another managing context object", &spec, &o, &lse, &host.reference().unwrap());
    // Not on a default stream of the launch's object, which might stop managing before the launch
    // is recorded.
    {
        let (_, mut ws) = mine.args_and_workspace();
        unordered(plan.run(&dev.ctx.default_stream(), &mut ws, &mut ordered.args()), "q");
    }

    // Capture in a tracking context: the decode and the append are refused, and record nothing.
    let desc = PagedKvAppendDescriptor { batch_size: 3, paged_kv: host.desc.paged_kv };
    let append = PagedKvAppendPlan::<f16>::select(s, &desc, PlanPreference::default()).unwrap();
    let token = s.clone_htod(&vec![f16::ONE; 3 * 4 * 128]).unwrap();
    s.begin_capture(CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL).unwrap();
    let decode_refused = {
        let (mut args, mut ws) = mine.args_and_workspace();
        plan.run(s, &mut ws, &mut args)
    };
    let append_refused = append.run(s, &mut Workspace::none(), &mut mine.append_args(&token, &token));
    let graph = s.end_capture(CUgraphInstantiate_flags(0)).unwrap();
    for (what, r) in [("decode", decode_refused), ("append", append_refused)] {
        assert!(matches!(r, Err(Error::CaptureWithTracking)), "{what} captured with tracking: got {r:?}");
    }
    if let Some(graph) = graph {
        let mut nodes = 0usize;
        // SAFETY: `graph` owns a live graph; a null node array asks for the count alone.
        unsafe { cudarc::driver::sys::cuGraphGetNodes(graph.cu_graph(), std::ptr::null_mut(), &mut nodes) }
            .result()
            .unwrap();
        assert_eq!(nodes, 0, "the refused runs recorded work");
    }
    let (o, lse) = run_decode(&dev, &plan, &mut mine);
    check("after the refused capture", &spec, &o, &lse, &host.reference().unwrap());
    lone_stream.synchronize().unwrap();
    tracked_stream.synchronize().unwrap();
    println!("unordered context objects and tracked capture refused; a managing object's tensors taken");
}

/// A context object that orders streams with events (a created stream of its own): tensors and a
/// workspace allocated on its default stream are refused on the created stream and on the
/// per-thread stream (`UnorderedStream`), where the ordering would end with the context's last
/// created stream; they are taken on the legacy default stream, tensors of the created stream are
/// taken on all three, and each run gives the reference's result (so a programmatic launch works
/// on the default streams too). Once the created stream is dropped the context orders nothing
/// with events, and the default stream's tensors are taken on any of its streams again.
#[test]
fn run_refuses_default_stream_operands_on_a_created_stream() {
    use cudarc::driver::CudaContext;
    let Some(dev) = device("run_refuses_default_stream_operands_on_a_created_stream") else { return };
    let spec = ProblemSpec::uniform(3, 700, 16, 4, 128, 16);
    let host = HostProblem::<f16>::random(&spec).unwrap();
    let want = host.reference().unwrap();
    let plan =
        BatchPagedDecodePlan::<f16>::select(&dev.stream, &host.desc, PlanPreference::default()).unwrap();
    assert!(plan.workspace_size() > 0, "a split plan, so that the workspace is checked");
    let unordered = |r: paged_decode::Result<()>, operand: &str, what: &str| match r {
        Err(Error::UnorderedStream { operand: o }) => assert_eq!(o, operand, "{what}"),
        other => panic!("{what}: expected UnorderedStream for {operand}, got {other:?}"),
    };

    let ctx = CudaContext::new(0).unwrap();
    let created = ctx.new_stream().unwrap();
    let (default, per_thread) = (ctx.default_stream(), ctx.per_thread_stream());
    assert!(ctx.is_managing_stream_synchronization());
    let mut on_default = DeviceProblem::upload(&default, &host, plan.workspace_size()).unwrap();
    let mut on_created = DeviceProblem::upload(&created, &host, plan.workspace_size()).unwrap();
    for (what, stream) in [("a created stream", &created), ("the per-thread stream", &per_thread)] {
        let (mut args, mut ws) = on_default.args_and_workspace();
        unordered(plan.run(stream, &mut ws, &mut args), "q", &format!("default-stream tensors on {what}"));
        let zeroed = Workspace::zeroed(stream, on_default.workspace.slice_mut(..)).map(|_| ());
        unordered(zeroed, "workspace", &format!("a default-stream workspace zeroed on {what}"));
    }
    {
        // Tensors of the created stream with a workspace of the default one.
        let (mut args, _) = on_created.args_and_workspace();
        let mut ws = Workspace::zeroed(&default, on_default.workspace.slice_mut(..)).unwrap();
        unordered(plan.run(&created, &mut ws, &mut args), "workspace", "a default-stream workspace");
    }
    on_default.poison_outputs(&default).unwrap();
    let (o, lse) = {
        let (mut args, mut ws) = on_default.args_and_workspace();
        plan.run(&default, &mut ws, &mut args).unwrap();
        (default.clone_dtoh(&on_default.o).unwrap(), default.clone_dtoh(&on_default.lse).unwrap())
    };
    check("default-stream tensors on the default stream", &spec, &o, &lse, &want);
    for (what, stream) in [("created", &created), ("default", &default), ("per-thread", &per_thread)] {
        on_created.poison_outputs(&created).unwrap();
        let (mut args, mut ws) = on_created.args_and_workspace();
        plan.run(stream, &mut ws, &mut args).unwrap();
        let (o, lse) =
            (created.clone_dtoh(&on_created.o).unwrap(), created.clone_dtoh(&on_created.lse).unwrap());
        check(&format!("created-stream tensors on the {what} stream"), &spec, &o, &lse, &want);
    }
    drop(on_created);
    drop(created);
    assert!(!ctx.is_managing_stream_synchronization(), "the last created stream is gone");
    on_default.poison_outputs(&default).unwrap();
    {
        let (mut args, mut ws) = on_default.args_and_workspace();
        plan.run(&per_thread, &mut ws, &mut args).unwrap();
    }
    per_thread.synchronize().unwrap();
    let (o, lse) = (default.clone_dtoh(&on_default.o).unwrap(), default.clone_dtoh(&on_default.lse).unwrap());
    check("default-stream tensors on the per-thread stream, no created stream left", &spec, &o, &lse, &want);
    println!("default-stream operands refused off the legacy stream while the context orders streams");
}

/// A checked `run` or `check_page_table` on a capturing stream says so, before touching the
/// stream; the capture then ends cleanly and checked runs work again.
#[test]
fn checked_run_under_capture_is_refused() {
    use cudarc::driver::sys::{CUgraphInstantiate_flags, CUstreamCaptureMode};
    let Some(dev) = capture_device("checked_run_under_capture_is_refused") else { return };
    let s = &dev.stream;
    let host = HostProblem::<f16>::random(&ProblemSpec::uniform(2, 300, 8, 2, 128, 16)).unwrap();
    let checked = PlanPreference { checked: true, ..PlanPreference::default() };
    let plan = BatchPagedDecodePlan::<f16>::select(s, &host.desc, checked).unwrap();
    let desc = PagedKvAppendDescriptor { batch_size: 2, paged_kv: host.desc.paged_kv };
    let append = PagedKvAppendPlan::<f16>::select(s, &desc, checked).unwrap();
    let mut buf = DeviceProblem::upload(s, &host, plan.workspace_size()).unwrap();
    let token = s.clone_htod(&vec![f16::ONE; 2 * 2 * 128]).unwrap();
    s.synchronize().unwrap();
    let refused = |r: paged_decode::Result<()>, what: &str| {
        assert!(matches!(r, Err(Error::CheckedUnderCapture)), "{what} under capture: {r:?}");
    };
    s.begin_capture(CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL).unwrap();
    // One node of our own, so the graph is not empty.
    s.memset_zeros(&mut buf.lse).unwrap();
    {
        let (mut args, mut ws) = buf.args_and_workspace();
        refused(plan.run(s, &mut ws, &mut args), "checked decode run");
        refused(plan.check_page_table(s, &args), "check_page_table");
    }
    {
        let mut args = buf.append_args(&token, &token);
        refused(append.run(s, &mut Workspace::none(), &mut args), "checked append run");
        refused(append.check_page_table(s, &args), "append check_page_table");
    }
    // The capture was not invalidated, and the refused runs recorded nothing.
    let graph = s.end_capture(CUgraphInstantiate_flags(0)).unwrap().expect("the memset was captured");
    let mut nodes = 0usize;
    // SAFETY: `graph` owns a live graph; a null node array asks for the count alone.
    unsafe { cudarc::driver::sys::cuGraphGetNodes(graph.cu_graph(), std::ptr::null_mut(), &mut nodes) }
        .result()
        .unwrap();
    assert_eq!(nodes, 1, "the refused runs recorded work");
    drop(graph);
    let (o, lse) = run_decode(&dev, &plan, &mut buf);
    check("checked run after capture", &host.spec, &o, &lse, &host.reference().unwrap());
    println!("checked decode and append runs under capture: CheckedUnderCapture");
}

/// With `checked: true` the append plan rejects every table its contract forbids
/// (`last_page_len == 0` on a request with pages, two requests appending to one slot, to two
/// slots of one page, or to a page another request fills) and writes nothing; the unchecked
/// plan runs on them without faulting. A request without pages appends nothing.
#[test]
fn checked_append_rejects_tables_that_lose_tokens() {
    let Some(dev) = device("checked_append_rejects_tables_that_lose_tokens") else { return };
    let s = &dev.stream;
    // Lengths after the caller advanced the table for the new token (≥ 1).
    let spec =
        ProblemSpec { lens: vec![17, 5, 32, 9], spare_pages: 4, ..ProblemSpec::uniform(4, 0, 8, 2, 64, 16) };
    let good = HostProblem::<f16>::random(&spec).unwrap();
    let desc = PagedKvAppendDescriptor { batch_size: 4, paged_kv: good.desc.paged_kv };
    let checked = PlanPreference { checked: true, ..PlanPreference::default() };
    let plan = PagedKvAppendPlan::<f16>::select(s, &desc, checked).unwrap();
    let fast = PagedKvAppendPlan::<f16>::select(s, &desc, PlanPreference::default()).unwrap();
    let mut rng = Rng::new(7);
    let token: Vec<f16> = (0..4 * 2 * 64).map(|_| f16::from_f64(rng.symmetric())).collect();
    let token_d = s.clone_htod(&token).unwrap();
    let last_page = |h: &HostProblem<f16>, b: usize| h.indptr[b + 1] as usize - 1;
    let mut corruptions: Vec<(&str, &str, HostProblem<f16>)> = Vec::new();
    let mut h = good.clone();
    h.last_page_len[3] = 0;
    corruptions.push(("uncounted token", "last_page_len[3] = 0", h));
    let mut h = good.clone();
    let (p0, p2) = (last_page(&h, 0), last_page(&h, 2));
    h.indices[p2] = h.indices[p0];
    h.last_page_len[2] = h.last_page_len[0];
    corruptions.push(("two requests, one slot", "requests 0 and 2 both append to slot", h));
    // Request 0 (17 tokens) appends to slot 0 of its second page; request 2 (32 tokens) counts
    // slots 0 and 1 of that page as its own last page, and appends to slot 1.
    let mut h = good.clone();
    let (p0, p2) = (last_page(&h, 0), last_page(&h, 2));
    h.indices[p2] = h.indices[p0];
    h.last_page_len[2] = 2;
    corruptions.push(("two requests, one page", "request 0 appends to slot 0 of page", h));
    // Request 1 appends to the first page of request 0, which request 0 fills.
    let mut h = good.clone();
    let first0 = h.indptr[0] as usize;
    let p1 = last_page(&h, 1);
    h.indices[p1] = h.indices[first0];
    corruptions.push(("a page another request counts", "which is also page 0 of request 0", h));
    for (name, part, bad) in &corruptions {
        let err = paged_decode::page_table::validate_append_table(&desc.paged_kv, 4, bad.page_table());
        assert!(
            matches!(&err, Err(Error::InvalidPageTable(m)) if m.contains(part)),
            "{name}: host check {err:?}"
        );
        let mut buf = DeviceProblem::upload(s, bad, 0).unwrap();
        {
            let mut args = buf.append_args(&token_d, &token_d);
            match plan.run(s, &mut Workspace::none(), &mut args) {
                Err(Error::InvalidPageTable(msg)) => {
                    assert!(msg.contains(part), "{name}: {msg:?} does not mention {part:?}");
                    println!("{name}: {msg}");
                }
                other => panic!("{name}: expected InvalidPageTable, got {other:?}"),
            }
        }
        assert_eq!(checksum(&s.clone_dtoh(&buf.k_data).unwrap()), checksum(&bad.k_data), "{name}: K written");
        assert_eq!(checksum(&s.clone_dtoh(&buf.v_data).unwrap()), checksum(&bad.v_data), "{name}: V written");
        // Unchecked: stays inside the store (the tokens are dropped or race).
        let mut args = buf.append_args(&token_d, &token_d);
        fast.run(s, &mut Workspace::none(), &mut args).unwrap();
        s.synchronize().unwrap();
    }
    // Valid tables pass the check and match the reference: the table as built, and one whose
    // request 1 has no pages (a free slot: it appends nothing; request 2 takes its pages).
    let mut with_free_slot = good.clone();
    with_free_slot.indptr[2] = with_free_slot.indptr[1];
    for (name, table) in [("valid table", &good), ("valid table with a free slot", &with_free_slot)] {
        let (mut k_ref, mut v_ref) = (table.k_data.clone(), table.v_data.clone());
        paged_decode::reference::append(&desc, &token, &token, &mut k_ref, &mut v_ref, table.page_table())
            .unwrap();
        let mut buf = DeviceProblem::upload(s, table, 0).unwrap();
        // `indptr` in a buffer longer than its shape, whose tail holds values no table has.
        let padded = s.clone_htod(&[table.indptr.clone(), vec![i32::MAX, -1, 0]].concat()).unwrap();
        {
            let mut args = buf.append_args(&token_d, &token_d);
            args.indptr = TensorRef::new(padded.slice(..), [5]);
            plan.run(s, &mut Workspace::none(), &mut args).unwrap();
        }
        assert_eq!(checksum(&s.clone_dtoh(&buf.k_data).unwrap()), checksum(&k_ref), "{name}: K");
        assert_eq!(checksum(&s.clone_dtoh(&buf.v_data).unwrap()), checksum(&v_ref), "{name}: V");
    }
}

/// `Device::open` keeps cudarc's event tracking on, so a decode on a second stream that reads
/// the output of decodes still running on the first one as its queries waits for them.
#[test]
fn tracked_device_orders_runs_across_streams() {
    let Some(dev) = device("tracked_device_orders_runs_across_streams") else { return };
    assert!(dev.is_event_tracking());
    let (a_stream, b_stream) = (&dev.stream, &dev.ctx.new_stream().unwrap());
    // Long enough that the first stream is still busy when the second one launches.
    let spec = ProblemSpec::uniform(16, 4096, 32, 8, 128, 16);
    let first = HostProblem::<f16>::random(&spec).unwrap();
    let second = HostProblem::<f16>::random(&ProblemSpec { seed: spec.seed + 1, ..spec.clone() }).unwrap();
    let unsplit = PlanPreference { num_splits: Some(1), spare_chunks: Some(0), ..PlanPreference::default() };
    let plan = BatchPagedDecodePlan::<f16>::select(a_stream, &first.desc, unsplit).unwrap();
    assert_eq!(plan.workspace_size(), 0);
    let mut a = DeviceProblem::upload(a_stream, &first, 0).unwrap();
    let mut b = DeviceProblem::upload(b_stream, &second, 0).unwrap();
    // The queries stream B reads: stream A's output, computed alone first.
    let mut fed = second.clone();
    fed.q = run_decode(&dev, &plan, &mut a).0;
    let want = fed.reference().unwrap();
    // Five rounds; fewer with PAGED_DECODE_REPLAYS (the sanitizers' runs).
    let rounds: usize = problem::env_number("PAGED_DECODE_REPLAYS", 5).clamp(1, 5);
    for round in 0..rounds {
        a.poison_outputs(a_stream).unwrap();
        b.poison_outputs(b_stream).unwrap();
        for _ in 0..8 {
            let (mut args, mut ws) = a.args_and_workspace();
            plan.run(a_stream, &mut ws, &mut args).unwrap();
        }
        let (mut args, mut ws) = b.args_and_workspace_with_q(Some(a.o.slice(..)));
        plan.run(b_stream, &mut ws, &mut args).unwrap();
        let (o, lse) = (b_stream.clone_dtoh(&b.o).unwrap(), b_stream.clone_dtoh(&b.lse).unwrap());
        check(&format!("round {round}: decode on stream B of stream A's output"), &spec, &o, &lse, &want);
    }
    println!("stream B waited for stream A's writes of its queries in {rounds} rounds");
}

/// Two decodes on two streams read one K/V store allocated on a third, the store's home: the
/// first is held behind a gate (a stream wait on a device word), the second runs at once, and
/// then the home stream zeroes the store. cudarc records one read event per allocation, the
/// second decode's, so without `run` joining its reads into the home stream the zeroing would
/// wait for the second decode only and run under the held one, which would then read zeros.
/// Joined, the home stream waits for both: the held decode sees the store as it was, and an
/// event recorded on the home stream after the runs stays pending until the gate opens.
#[test]
fn reads_on_other_streams_join_the_operands_stream() {
    use cudarc::driver::sys::{
        CU_MEMHOSTALLOC_DEVICEMAP, CUresult, CUstreamWaitValue_flags, cuMemHostGetDevicePointer_v2,
        cuStreamWaitValue32_v2,
    };
    use std::time::Duration;
    let test = "reads_on_other_streams_join_the_operands_stream";
    let Some(dev) = device(test) else { return };
    let home = &dev.stream;
    let (held, free) = (dev.ctx.new_stream().unwrap(), dev.ctx.new_stream().unwrap());
    let spec = ProblemSpec { seed: 4400, ..with_lens(vec![0, 1, 700, 33, 2000], 32, 8, 128, 16) };
    let host = HostProblem::<f16>::random(&spec).unwrap();
    let want = host.reference().unwrap();
    let unsplit = PlanPreference { num_splits: Some(1), spare_chunks: Some(0), ..PlanPreference::default() };
    let plan = BatchPagedDecodePlan::<f16>::select(home, &host.desc, unsplit).unwrap();
    assert_eq!(plan.workspace_size(), 0);
    let mut buf = DeviceProblem::upload(home, &host, 0).unwrap();
    buf.poison_outputs(home).unwrap();
    let mut second_o = home.clone_htod(&vec![f16::NAN; buf.o.len()]).unwrap();
    let mut second_lse = home.clone_htod(&vec![f32::NAN; buf.lse.len()]).unwrap();
    home.synchronize().unwrap();
    // The gate: a device-mapped host word `held` waits on, opened by a plain store (no driver
    // call). A watchdog opens it after 10 s whatever this thread does, so that a call here that
    // blocks until the device drains (a sanitizer serializing launches) fails the test instead
    // of hanging it.
    // SAFETY: the word is written below before any use.
    let mut gate = unsafe { dev.ctx.alloc_pinned_with_flags::<u32>(1, CU_MEMHOSTALLOC_DEVICEMAP) }.unwrap();
    let gate_host = gate.as_mut_ptr().unwrap();
    // SAFETY: `gate_host` points to the live pinned word; it outlives every use (the watchdog is
    // joined and `held` synchronized before `gate` drops).
    unsafe { gate_host.write_volatile(0) };
    let mut gate_dev = 0;
    let mapped = unsafe { cuMemHostGetDevicePointer_v2(&mut gate_dev, gate_host.cast(), 0) };
    assert_eq!(mapped, CUresult::CUDA_SUCCESS);
    let open_gate = |word: usize| {
        // SAFETY: as above.
        unsafe { (word as *mut u32).write_volatile(1) };
        std::sync::atomic::fence(std::sync::atomic::Ordering::SeqCst);
    };
    let (opened_tx, opened_rx) = std::sync::mpsc::channel::<()>();
    let word = gate_host as usize;
    let watchdog = std::thread::spawn(move || {
        let fired = opened_rx.recv_timeout(Duration::from_secs(10)).is_err();
        if fired {
            open_gate(word);
        }
        fired
    });
    // SAFETY: `gate_dev` is the device address of the live word; the wait only holds `held`.
    let waits = unsafe {
        cuStreamWaitValue32_v2(
            held.cu_stream(),
            gate_dev,
            1,
            CUstreamWaitValue_flags::CU_STREAM_WAIT_VALUE_GEQ as u32,
        )
    };
    if waits == CUresult::CUDA_ERROR_NOT_SUPPORTED {
        drop(opened_tx);
        watchdog.join().unwrap();
        skipped(test, "the device has no stream memory operations");
        return;
    }
    let first = {
        let mut args = buf.args();
        plan.run(&held, &mut Workspace::none(), &mut args)
    };
    let second = {
        let kv = host.desc.paged_kv;
        let (b, hq, d) = (host.desc.batch_size, host.desc.num_qo_heads, kv.head_dim);
        let store = [kv.num_total_pages, kv.num_kv_heads, kv.page_size, d];
        let mut args = paged_decode::BatchPagedDecodeArgs {
            q: TensorRef::new(buf.q.slice(..), [b, hq, d]),
            k_data: TensorRef::strided(buf.k_data.slice(..), store, buf.kv_stride),
            v_data: TensorRef::strided(buf.v_data.slice(..), store, buf.kv_stride),
            indices: TensorRef::new(buf.indices.slice(..), [host.indices.len() as i32]),
            indptr: TensorRef::new(buf.indptr.slice(..), [b + 1]),
            last_page_len: TensorRef::new(buf.last_page_len.slice(..), [b]),
            o: paged_decode::TensorMut::new(second_o.slice_mut(..), [b, hq, d]),
            lse: paged_decode::TensorMut::new(second_lse.slice_mut(..), [b, hq]),
        };
        plan.run(&free, &mut Workspace::none(), &mut args)
    };
    // On the home stream, after both runs: the store zeroed, then an event.
    let zeroed = home.memset_zeros(&mut buf.k_data).and_then(|_| home.memset_zeros(&mut buf.v_data));
    let after_runs = home.record_event(None);
    let pending = (0..20).all(|_| {
        std::thread::sleep(Duration::from_millis(10));
        after_runs.as_ref().is_ok_and(|e| !e.is_complete())
    });
    // Open the gate before any assertion, so that a failure leaves no stream waiting.
    open_gate(word);
    let _ = opened_tx.send(());
    let watchdog_fired = watchdog.join().unwrap();
    held.synchronize().unwrap();
    home.synchronize().unwrap();
    assert_eq!(waits, CUresult::CUDA_SUCCESS);
    first.unwrap();
    second.unwrap();
    zeroed.unwrap();
    assert!(!watchdog_fired, "a call blocked while the gate was shut: the watchdog opened it");
    assert!(pending, "the home stream ran past a decode still held on another stream");
    let (o, lse) = (home.clone_dtoh(&buf.o).unwrap(), home.clone_dtoh(&buf.lse).unwrap());
    check("held decode, store zeroed on its home stream afterwards", &spec, &o, &lse, &want);
    let (o, lse) = (home.clone_dtoh(&second_o).unwrap(), home.clone_dtoh(&second_lse).unwrap());
    check("decode on a second stream", &spec, &o, &lse, &want);
    let zeros = home.clone_dtoh(&buf.k_data).unwrap();
    assert!(zeros.iter().all(|x| x.to_f32() == 0.0), "the zeroing did not run");
    drop(gate);
    println!("{test}: the home stream waited for both decodes");
}

/// Prefix caching and parallel sampling: every request's full pages start with the pages of the
/// longest request (one page id in many requests' lists, read by several CTAs at once). Returns
/// how many page-list entries now name another request's page.
fn share_prefix_pages<T, C>(host: &mut HostProblem<T, C>) -> usize {
    let pages = |b: usize| (host.indptr[b + 1] - host.indptr[b]) as usize;
    let batch = host.indptr.len() - 1;
    let Some(donor) = (0..batch).max_by_key(|&b| pages(b)) else { return 0 };
    let mut shared = 0;
    for b in (0..batch).filter(|&b| b != donor) {
        // Full pages only: the last page of either request keeps its own id.
        let common = pages(b).min(pages(donor)).saturating_sub(1);
        let (from, to) = (host.indptr[donor] as usize, host.indptr[b] as usize);
        for j in 0..common {
            host.indices[to + j] = host.indices[from + j];
        }
        shared += common;
    }
    shared
}

fn shared_prefix_case<T: Element + ProblemCache, C: ProblemCache>(
    dev: &Device,
    name: &str,
    spec: &ProblemSpec,
    pref: PlanPreference,
    expected: DecodePath,
) {
    let mut host = HostProblem::<T, C>::random(spec).unwrap();
    let shared = share_prefix_pages(&mut host);
    assert!(shared > 0, "{name}: no page shared");
    let r = host.reference().unwrap();
    for checked in [false, true] {
        let what = format!(
            "{name} {:?}/{:?} (checked: {checked}, {shared} shared page entries)",
            T::KIND,
            C::CACHE_KIND
        );
        let (err, path) = fp8_run_and_check(dev, &what, &host, &r, PlanPreference { checked, ..pref });
        assert_eq!(path, expected, "{what}");
        println!("requests_sharing_prefix_pages: {what} [{}] rel err {err:.2e}", path.name());
    }
}

/// Requests whose page lists share their first pages (prefix caching), on every path, with 16-
/// and 8-bit caches, checked mode accepting the table: each request matches the reference.
#[test]
fn requests_sharing_prefix_pages() {
    let test = "requests_sharing_prefix_pages";
    let Some(dev) = device(test) else { return };
    let tailed: Vec<usize> =
        (0..600).map(|i| if i % 97 == 5 { 3000 + 7 * i } else { (i * 37) % 301 }).collect();
    let ragged: Vec<usize> = (0..72).map(|i| 20 + (i * 397) % 3000).collect();
    let default = PlanPreference::default();
    let cases = [
        (
            "whole",
            with_lens(vec![900, 1200, 50, 1700], 32, 8, 128, 16),
            PlanPreference { num_splits: Some(1), spare_chunks: Some(0), ..default },
            DecodePath::Whole,
        ),
        ("split", with_lens(vec![0, 1, 700, 33, 4000], 32, 8, 128, 16), default, DecodePath::Split),
        (
            "scheduled",
            with_lens(ragged, 16, 4, 128, 16),
            PlanPreference { spare_chunks: Some(72), ..default },
            DecodePath::Scheduled,
        ),
        (
            "lean",
            with_lens(tailed.clone(), 32, 8, 128, 16),
            PlanPreference { lean_spare_chunks: Some(0), ..default },
            DecodePath::Lean,
        ),
        ("lean-scheduled", with_lens(tailed, 32, 8, 128, 16), default, DecodePath::LeanScheduled),
    ];
    let fp8 = runs_fp8(&dev, test);
    // `PAGED_DECODE_SHARED_PREFIX_CASES` runs only the first few (the sanitizers).
    let count: usize = problem::env_number("PAGED_DECODE_SHARED_PREFIX_CASES", cases.len());
    for (i, (name, spec, pref, expected)) in cases.into_iter().enumerate().take(count) {
        let spec = ProblemSpec { seed: 4500 + i as u64, poison_unused_slots: true, ..spec };
        shared_prefix_case::<f16, f16>(&dev, name, &spec, pref, expected);
        shared_prefix_case::<bf16, bf16>(&dev, name, &spec, pref, expected);
        // The 8-bit caches have no lean-scheduled path.
        if fp8 && expected != DecodePath::LeanScheduled {
            two_fp8_pairings!(i, |Q, C| shared_prefix_case::<Q, C>(&dev, name, &spec, pref, expected));
        }
    }
}

/// `allow_sm90a: false` loads the portable build on any device: the plan says so, its kernels
/// take the path each shape is meant for and match the reference there, and it refuses what
/// only the sm_90 build holds (8-bit caches, quantizing appends).
#[test]
fn portable_build_on_request() {
    let Some(dev) = device("portable_build_on_request") else { return };
    let portable = PlanPreference { allow_sm90a: false, ..PlanPreference::default() };
    let cases = [
        ("ragged", with_lens(vec![0, 1, 300, 2000, 17], 32, 8, 128, 16), portable, DecodePath::Split),
        ("split", with_lens(vec![4000, 9], 8, 1, 64, 16), portable, DecodePath::Split),
        ("lean", ProblemSpec::uniform(2048, 16, 32, 8, 128, 16), portable, DecodePath::Lean),
        (
            "scheduled",
            ProblemSpec::uniform(2048, 40, 16, 2, 256, 8),
            PlanPreference { lean_max_avg_tokens: Some(0), ..portable },
            DecodePath::Scheduled,
        ),
    ];
    for (i, (name, spec, pref, expected)) in cases.into_iter().enumerate() {
        let spec = ProblemSpec { seed: 4100 + i as u64, ..spec };
        let host = HostProblem::<f16>::random(&spec).unwrap();
        let r = host.reference().unwrap();
        let plan = BatchPagedDecodePlan::<f16>::select(&dev.stream, &host.desc, pref).unwrap();
        assert_eq!(plan.sku().arch, paged_decode::ArchSku::Sm80, "{name}: the plan loaded the sm_90 build");
        let (err, _, path) = run_and_check(&dev, &format!("portable {name}"), &host, &r, pref);
        assert_eq!(path, expected, "portable {name}");
        println!("portable_build_on_request: {name} [{}] rel err {err:.2e}", path.name());
    }
    let spec = ProblemSpec { seed: 4200, ..with_lens(vec![3, 70], 8, 2, 128, 16) };
    let fp8 = HostProblem::<f16, F8E4M3>::random(&spec).unwrap();
    let refused = BatchPagedDecodePlan::<f16, F8E4M3>::select(&dev.stream, &fp8.desc, portable);
    assert!(
        matches!(refused, Err(Error::Unsupported(_))),
        "an 8-bit cache on the portable build: {:?}",
        refused.err()
    );
    let append = PagedKvAppendDescriptor { batch_size: 2, paged_kv: fp8.desc.paged_kv };
    let refused = PagedKvAppendPlan::<f16, F8E4M3>::select(&dev.stream, &append, portable);
    assert!(
        matches!(refused, Err(Error::Unsupported(_))),
        "a quantizing append on the portable build: {:?}",
        refused.err()
    );
}

/// Selects, runs (scaled, outputs poisoned) and checks an 8-bit cache problem against the float64
/// reference over the dequantized cache, at q's tolerance.
fn fp8_run_and_check<T: Element + ProblemCache, C: ProblemCache>(
    dev: &Device,
    what: &str,
    host: &HostProblem<T, C>,
    r: &DecodeOutput,
    pref: PlanPreference,
) -> (f64, DecodePath) {
    let plan = BatchPagedDecodePlan::<T, C>::select(&dev.stream, &host.desc, pref)
        .unwrap_or_else(|e| panic!("{what}: select failed: {e}"));
    let (o, lse) = run_scaled_poisoned(dev, &plan, host);
    let path = plan.path(host.indices.len());
    (check(&format!("{what} [{}]", path.name()), &host.spec, &o, &lse, r), path)
}

enum PreparedFp8 {
    F16E4M3(HostProblem<f16, F8E4M3>, DecodeOutput),
    BF16E4M3(HostProblem<bf16, F8E4M3>, DecodeOutput),
    F16E5M2(HostProblem<f16, F8E5M2>, DecodeOutput),
    BF16E5M2(HostProblem<bf16, F8E5M2>, DecodeOutput),
}

/// Configuration `i`'s q type and cache format: all four pairs in turn.
fn prepare_fp8(i: usize, spec: &ProblemSpec) -> PreparedFp8 {
    fn with<T: Element + ProblemCache, C: ProblemCache>(
        spec: &ProblemSpec,
    ) -> (HostProblem<T, C>, DecodeOutput) {
        let host = HostProblem::<T, C>::random(spec).unwrap();
        let r = host.reference().unwrap();
        (host, r)
    }
    match i % 4 {
        0 => {
            let (h, r) = with(spec);
            PreparedFp8::F16E4M3(h, r)
        }
        1 => {
            let (h, r) = with(spec);
            PreparedFp8::BF16E4M3(h, r)
        }
        2 => {
            let (h, r) = with(spec);
            PreparedFp8::F16E5M2(h, r)
        }
        _ => {
            let (h, r) = with(spec);
            PreparedFp8::BF16E5M2(h, r)
        }
    }
}

/// 8-bit caches (E4M3 and E5M2, f16 and bf16 q, scales that are not powers of two): random
/// configurations over head_dims, groups 1..64, page sizes 1..256, ragged lengths with empty,
/// 1-token and full-last-page requests, permuted pages (the slots no request reads hold NaN
/// codes) and every split path, against the float64
/// reference over the dequantized cache (f16 q ≤ 1e-3, bf16 q ≤ 8e-3, lse ≤ 1e-3), plus the edge
/// cases of one long request among short ones, batches of 16384 (one ragged with a heavy tail)
/// and 65536 short requests.
#[test]
fn fp8_decode_random_sweep() {
    let test = "fp8_decode_random_sweep";
    let Some(dev) = fp8_device(test) else { return };
    let base_seed = problem::sweep_seed(test);
    let configs: usize = problem::env_number("PAGED_DECODE_SWEEP", 1200) / 2;
    let edge_cases = [
        with_lens(vec![0, 1, 30000, 0, 5, 17, 2], 32, 8, 128, 16),
        with_lens((0..16384).map(|i| i % 37).collect(), 8, 1, 64, 16),
        with_lens(vec![1, 1, 0], 64, 1, 256, 1),
        // A group past 64 (two head blocks at head_dim 64), as the 16-bit suite's "group 65".
        with_lens(vec![200, 1, 0, 77], 65, 1, 64, 8),
        ProblemSpec::uniform(1, 20000, 64, 8, 128, 16),
        // The 16-bit edge cases' largest batches: 65536 short requests (the lean kernel) and a
        // ragged 16384 with a heavy tail.
        with_lens((0..65536).map(|i| (i * 7) % 61).collect(), 4, 1, 128, 16),
        with_lens(
            (0..16384usize).map(|i| if i % 997 == 3 { 9000 + i % 1500 } else { (i * 13) % 300 }).collect(),
            8,
            2,
            128,
            16,
        ),
    ];
    // PAGED_DECODE_FP8_EDGE_CASES=N runs the first N, PAGED_DECODE_FP8_FIRST_EDGE_CASE=K from the
    // K-th on (the sanitizer runs leave the two largest batches to a run of their own).
    let edge_count =
        problem::env_number("PAGED_DECODE_FP8_EDGE_CASES", edge_cases.len()).min(edge_cases.len());
    let edge_first = problem::env_number("PAGED_DECODE_FP8_FIRST_EDGE_CASE", 0).min(edge_count);
    let edge_cases = &edge_cases[edge_first..edge_count];
    let mut worst = [0f64; 4];
    let mut paths = std::collections::BTreeMap::new();
    let config_or_edge_case = |i: usize| {
        let seed = base_seed.wrapping_add(i as u64);
        let spec = match i.checked_sub(configs) {
            Some(e) => ProblemSpec { seed, ..edge_cases[e].clone() },
            None => random_spec(&mut Rng::new(seed), seed).1,
        };
        let prepared = prepare_fp8(i, &spec);
        (spec, prepared)
    };
    prepared_on_workers(configs + edge_cases.len(), config_or_edge_case, |i, (spec, prepared)| {
        let what = format!(
            "fp8 config {i} (seed {}): lens {:?} Hq {} Hkv {} D {} page {} scale {}",
            spec.seed,
            spec.lens.iter().take(40).collect::<Vec<_>>(),
            spec.num_qo_heads,
            spec.num_kv_heads,
            spec.head_dim,
            spec.page_size,
            spec.sm_scale
        );
        // Forced spare chunks only where grid y (at most 65535 chunks) holds them beside one
        // chunk per request: a batch of 65536 cannot take them, and the plan says so.
        let grid_room = 65535u64.saturating_sub(spec.lens.len() as u64);
        let spare_chunks = match i % 6 {
            0 => Some(0),
            1 if grid_room > 0 => Some((1 + spec.seed % 40).min(grid_room) as u32),
            _ => None,
        };
        // Forced split counts on random configurations only (a batch of 16384 cannot take them).
        let num_splits = (i < configs && i % 7 == 5).then_some(1 + (spec.seed % 9) as u32);
        let stable_page_table = promised(i);
        let programmatic_launch = i % 7 != 3;
        let pref = PlanPreference {
            spare_chunks,
            num_splits,
            stable_page_table,
            programmatic_launch,
            ..PlanPreference::default()
        };
        let (err, path) = match &prepared {
            PreparedFp8::F16E4M3(h, r) => fp8_run_and_check(&dev, &what, h, r, pref),
            PreparedFp8::BF16E4M3(h, r) => fp8_run_and_check(&dev, &what, h, r, pref),
            PreparedFp8::F16E5M2(h, r) => fp8_run_and_check(&dev, &what, h, r, pref),
            PreparedFp8::BF16E5M2(h, r) => fp8_run_and_check(&dev, &what, h, r, pref),
        };
        worst[i % 4] = worst[i % 4].max(err);
        *paths.entry(path.name()).or_insert(0usize) += 1;
    });
    println!(
        "{test}: {} configurations passed ({paths:?}); worst rel err f16/e4m3 {:.2e}, bf16/e4m3 {:.2e}, f16/e5m2 {:.2e}, bf16/e5m2 {:.2e}",
        configs + edge_cases.len(),
        worst[0],
        worst[1],
        worst[2],
        worst[3]
    );
    let all = [DecodePath::Whole, DecodePath::Split, DecodePath::Scheduled];
    assert!(configs < 200 || all.iter().all(|p| paths.contains_key(p.name())), "paths taken: {paths:?}");
}

/// Quantizing appends (f16 / bf16 tokens into E4M3 / E5M2 stores) write the reference's codes bit
/// for bit, saturating out-of-range values and keeping NaN, and touch nothing else; appending
/// codes to a store of codes copies them.
#[test]
fn fp8_append_quantizes_bit_exactly() {
    let test = "fp8_append_quantizes_bit_exactly";
    let Some(dev) = fp8_device(test) else { return };
    fn one<T: Element + ProblemCache, C: ProblemCache>(dev: &Device, page: usize, d: usize, seed: u64) {
        let mut rng = Rng::new(seed);
        let (host, desc) = HostProblem::<T, C>::random_append(&mut rng, page, d, seed).unwrap();
        let (key, value) = problem::quantization_tokens::<T>(&mut rng, append_rows(&desc) * d);
        assert!(key[30].to_f64().is_nan() && key[30].to_f64().is_sign_negative());
        let codes = |data: &[C]| data.iter().map(|c| c.code()).collect::<Vec<u8>>();
        let (mut k_ref, mut v_ref) = (codes(&host.k_data), codes(&host.v_data));
        let scales = host.scales;
        paged_decode::reference::append_fp8(
            &desc,
            &key,
            &value,
            &mut k_ref,
            &mut v_ref,
            scales,
            host.page_table(),
        )
        .unwrap();

        let plan = PagedKvAppendPlan::<T, C>::select(&dev.stream, &desc, PlanPreference::default()).unwrap();
        let mut buf = DeviceProblem::upload(&dev.stream, &host, 0).unwrap();
        let key_d = dev.stream.clone_htod(&key).unwrap();
        let value_d = dev.stream.clone_htod(&value).unwrap();
        {
            let mut args = buf.append_args(&key_d, &value_d);
            plan.run_scaled(&dev.stream, &mut Workspace::none(), &mut args, scales).unwrap();
        }
        let k = codes(&dev.stream.clone_dtoh(&buf.k_data).unwrap());
        let v = codes(&dev.stream.clone_dtoh(&buf.v_data).unwrap());
        let kind = C::CACHE_KIND;
        assert!(k == k_ref, "{kind:?} K codes differ from the reference append (page {page}, d {d})");
        assert!(v == v_ref, "{kind:?} V codes differ from the reference append (page {page}, d {d})");
    }
    /// Appending codes into a store of codes copies them into the new slots only.
    fn copy<C: ProblemCache>(dev: &Device, page: usize, d: usize, seed: u64) {
        let spec =
            ProblemSpec { spare_pages: 2, seed, ..ProblemSpec::uniform(5, 3 * page / 2 + 1, 8, 4, d, page) };
        let host = HostProblem::<f16, C>::random(&spec).unwrap();
        let desc = PagedKvAppendDescriptor { batch_size: 5, paged_kv: host.desc.paged_kv };
        let mut rng = Rng::new(seed + 1);
        let token: Vec<C> = (0..5 * 4 * d).map(|_| C::store(rng.symmetric(), 0.01)).collect();
        let plan = PagedKvAppendPlan::<C, C>::select(&dev.stream, &desc, PlanPreference::default()).unwrap();
        let mut store = DeviceProblem::upload(&dev.stream, &host, 0).unwrap();
        let token_d = dev.stream.clone_htod(&token).unwrap();
        let (b, n) = (5i32, host.indices.len() as i32);
        let shape = [desc.paged_kv.num_total_pages, 4, page as i32, d as i32];
        {
            let mut args = paged_decode::PagedKvAppendArgs {
                key: paged_decode::TensorRef::new(token_d.slice(..), [b, 4, d as i32]),
                value: paged_decode::TensorRef::new(token_d.slice(..), [b, 4, d as i32]),
                k_data: paged_decode::TensorMut::new(store.k_data.slice_mut(..), shape),
                v_data: paged_decode::TensorMut::new(store.v_data.slice_mut(..), shape),
                indices: paged_decode::TensorRef::new(store.indices.slice(..), [n]),
                indptr: paged_decode::TensorRef::new(store.indptr.slice(..), [b + 1]),
                last_page_len: paged_decode::TensorRef::new(store.last_page_len.slice(..), [b]),
            };
            plan.run(&dev.stream, &mut Workspace::none(), &mut args).unwrap();
        }
        // Expected: each request's token rows in slot `last_page_len - 1` of its last page.
        let codes = |data: &[C]| data.iter().map(|c| c.code()).collect::<Vec<u8>>();
        let mut want = codes(&host.k_data);
        let token_codes = codes(&token);
        for r in 0..5 {
            let page = host.indices[host.indptr[r + 1] as usize - 1] as usize;
            let slot = host.last_page_len[r] as usize - 1;
            for h in 0..4 {
                let dst = ((page * 4 + h) * page_size_of(&desc) + slot) * d;
                let src = (r * 4 + h) * d;
                want[dst..dst + d].copy_from_slice(&token_codes[src..src + d]);
            }
        }
        let k = codes(&dev.stream.clone_dtoh(&store.k_data).unwrap());
        let v = codes(&dev.stream.clone_dtoh(&store.v_data).unwrap());
        assert!(k == want, "{:?} K code copy (page {page}, d {d})", C::CACHE_KIND);
        let mut want_v = codes(&host.v_data);
        for r in 0..5 {
            let page = host.indices[host.indptr[r + 1] as usize - 1] as usize;
            let slot = host.last_page_len[r] as usize - 1;
            for h in 0..4 {
                let dst = ((page * 4 + h) * page_size_of(&desc) + slot) * d;
                let src = (r * 4 + h) * d;
                want_v[dst..dst + d].copy_from_slice(&token_codes[src..src + d]);
            }
        }
        assert!(v == want_v, "{:?} V code copy (page {page}, d {d})", C::CACHE_KIND);
    }
    fn page_size_of(desc: &PagedKvAppendDescriptor) -> usize {
        desc.paged_kv.page_size as usize
    }
    for (i, (page, d)) in [(1, 64), (16, 128), (7, 256), (256, 128)].into_iter().enumerate() {
        let seed = 40 + i as u64;
        one::<f16, F8E4M3>(&dev, page, d, seed);
        one::<bf16, F8E4M3>(&dev, page, d, seed + 10);
        one::<f16, F8E5M2>(&dev, page, d, seed + 20);
        one::<bf16, F8E5M2>(&dev, page, d, seed + 30);
        copy::<F8E4M3>(&dev, page, d, seed + 40);
        copy::<F8E5M2>(&dev, page, d, seed + 50);
    }
    println!(
        "{test}: f16/bf16 into E4M3/E5M2 × 4 geometries match the reference bit for bit; code copies land in their slots"
    );
}

/// 8-bit caches with sliding windows (none of the tokens, fewer and more than the requests hold)
/// and attention sinks (some `-inf`), every pairing of f16 / bf16 q and E4M3 / E5M2 codes (two
/// per case in turn), on the plan's path
/// and with four splits forced (a split four ways where the plan splits at all), against the float64 reference of the variant over the dequantized cache
/// (its values rounded to f32, within 1e-7). The cases reach the split and whole entries, the
/// lean ones (one KV head per CTA and stacked), the guessing lean entry and the scheduled
/// partition at head_dim 64 and 128.
#[test]
fn fp8_windows_and_sinks() {
    let test = "fp8_windows_and_sinks";
    let Some(dev) = fp8_device(test) else { return };
    let spare = |n| PlanPreference { spare_chunks: Some(n), ..PlanPreference::default() };
    // (lengths, query heads, KV heads, head_dim, window, the plan's preference)
    let cases: Vec<(Vec<usize>, usize, usize, usize, u32, PlanPreference)> = vec![
        (vec![0, 1, 700, 33, 4000], 32, 8, 128, 100, PlanPreference::default()),
        (vec![5000], 16, 2, 64, 1023, PlanPreference::default()),
        (vec![17, 300, 1], 8, 1, 256, 0, PlanPreference::default()),
        (vec![2000, 2000], 32, 4, 128, 5000, PlanPreference::default()),
        ((0..600).map(|i| 100 + i % 300).collect(), 32, 8, 128, 191, PlanPreference::default()),
        (vec![0, 1, 40, 31], 16, 4, 128, 15, PlanPreference::default()),
        ((0..1200).map(|i| (i * 7) % 23).collect(), 16, 4, 64, 7, PlanPreference::default()),
        ((0..80).map(|i| (i * 397) % 3000).collect(), 16, 4, 128, 1023, spare(80)),
        ((0..72).map(|i| (i * 397) % 3000).collect(), 16, 4, 64, 127, spare(72)),
        // head_dim 256 split (the short batch) and scheduled (72 ragged requests), windowed.
        (vec![9000, 40, 0, 3000], 16, 8, 256, 1023, PlanPreference::default()),
        ((0..72).map(|i| (i * 397) % 3000).collect(), 16, 8, 256, 511, spare(72)),
    ];
    // `PAGED_DECODE_FP8_WINDOW_CASES` runs only the first few (the sanitizers' shorter runs).
    let count: usize = problem::env_number("PAGED_DECODE_FP8_WINDOW_CASES", cases.len());
    for (i, (lens, hq, hkv, d, window_left, pref)) in cases.into_iter().enumerate().take(count) {
        let spec = ProblemSpec { seed: 900 + i as u64, ..with_lens(lens, hq, hkv, d, 16) };
        two_fp8_pairings!(i, |Q, C| fp8_window_case::<Q, C>(&dev, i, &spec, window_left, pref));
    }
    println!("{test}: {count} cases × 2 element pairs × 2 plans match the reference");
}

/// One case of [`fp8_windows_and_sinks`]: the plan of `pref`, and the same split four ways.
fn fp8_window_case<T: Element + ProblemCache, C: ProblemCache>(
    dev: &Device,
    i: usize,
    spec: &ProblemSpec,
    window_left: u32,
    pref: PlanPreference,
) {
    use paged_decode::reference::AttentionVariant;
    use paged_decode::{AttentionVariantDescriptor, BatchPagedDecodeDescriptor, PagedKvCacheDescriptor};
    let hq = spec.num_qo_heads;
    let host = HostProblem::<T, C>::random(spec).unwrap();
    let sinks: Vec<f32> =
        (0..hq).map(|h| if h % 5 == 0 { f32::NEG_INFINITY } else { (h as f32 * 0.37).sin() * 3.0 }).collect();
    let values = |data: &[C], scale: f32| data.iter().map(|&c| c.value(scale) as f32).collect::<Vec<_>>();
    let (k, v) = (values(&host.k_data, host.scales.k_scale), values(&host.v_data, host.scales.v_scale));
    let q: Vec<f32> = host.q.iter().map(|x| x.to_f64() as f32).collect();
    let paged_kv = PagedKvCacheDescriptor { element: ElementKind::F32, ..host.desc.paged_kv };
    let desc = BatchPagedDecodeDescriptor { paged_kv, ..host.desc };
    let variant = AttentionVariant {
        window_left: Some(window_left),
        sinks: Some(&sinks),
        ..AttentionVariant::default()
    };
    let r = paged_decode::reference::decode_variant(&desc, variant, &q, &k, &v, host.page_table()).unwrap();
    let selection = AttentionVariantDescriptor { logits_soft_cap: None, window_left: Some(window_left) };
    for pref in [pref, PlanPreference { num_splits: Some(4), ..pref }] {
        let s = &dev.stream;
        let plan = BatchPagedDecodePlan::<T, C>::select_variant(s, &host.desc, &selection, pref).unwrap();
        let mut buf = DeviceProblem::upload(s, &host, plan.workspace_size()).unwrap();
        buf.poison_outputs(s).unwrap();
        let sinks_d = s.clone_htod(&sinks).unwrap();
        {
            let (mut args, mut ws) = buf.args_and_workspace();
            let sinks_view = TensorRef::new(sinks_d.slice(..), [hq as i32]);
            plan.run_scaled_with_sinks(s, &mut ws, &mut args, host.scales, &sinks_view).unwrap();
        }
        let (o, lse) = (s.clone_dtoh(&buf.o).unwrap(), s.clone_dtoh(&buf.lse).unwrap());
        let n = host.indices.len();
        let path = plan.path(n);
        let what = format!(
            "case {i} {:?}/{:?} (window {window_left}, {pref:?}) [{}, {} KV heads per CTA]",
            T::KIND,
            C::CACHE_KIND,
            path.name(),
            plan.stacked_kv_heads(n)
        );
        check(&what, &host.spec, &o, &lse, &r);
    }
}
