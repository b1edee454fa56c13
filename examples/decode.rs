//! One decode step on a paged K/V cache allocated with cudarc: four requests with some history
//! each get one new token appended ([`PagedKvAppendPlan`]), then attend over their whole history
//! ([`BatchPagedDecodePlan`]); the outputs are checked against the float64 CPU reference.
//!
//! `cargo run --release --example decode` (without a CUDA driver it says so and exits 0).

mod common;

use std::process::ExitCode;

use common::{
    DevicePageTable, HEAD_DIM, HostPageTable, KV_HEADS, PAGE_SIZE, PagePool, QO_HEADS, Sequence, TOLERANCE,
    exit_code, lse_err, open_device, paged_kv, random_values, rel_err, within_tolerance,
};
use paged_decode::half::f16;
use paged_decode::{
    BatchPagedDecodeArgs, BatchPagedDecodeDescriptor, BatchPagedDecodePlan, PagedKvAppendArgs,
    PagedKvAppendDescriptor, PagedKvAppendPlan, PlanPreference, TensorMut, TensorRef, Workspace, reference,
};
use rand::SeedableRng;
use rand::rngs::SmallRng;

const NUM_PAGES: usize = 64;
/// History of each request before the step: 16 fills a page, so its new token takes a new one.
const HISTORY: [usize; 4] = [45, 16, 1, 130];

fn main() -> ExitCode {
    exit_code("decode example", run())
}

fn run() -> Result<(), Box<dyn std::error::Error>> {
    let Some(device) = open_device("decode example")? else { return Ok(()) };
    let stream = &device.stream;
    let mut rng = SmallRng::seed_from_u64(7);

    // The paged store, [pages, kv_heads, page_size, head_dim] for K and for V, with random
    // history; a host copy stays behind for the reference.
    let store_shape = [NUM_PAGES as i32, KV_HEADS as i32, PAGE_SIZE as i32, HEAD_DIM as i32];
    let store_len = NUM_PAGES * KV_HEADS * PAGE_SIZE * HEAD_DIM;
    let (mut k_host, mut v_host) = (random_values(&mut rng, store_len), random_values(&mut rng, store_len));
    let mut k_store = stream.clone_htod(&k_host)?;
    let mut v_store = stream.clone_htod(&v_host)?;

    // Pages come from a free list in no particular order; each request first takes its history's
    // pages, then makes room for the new token (the append convention: the table is advanced
    // before the append runs).
    let mut pool = PagePool::new(NUM_PAGES, &mut rng);
    let mut requests: Vec<Sequence> = HISTORY.iter().map(|_| Sequence::default()).collect();
    for (seq, &history) in requests.iter_mut().zip(&HISTORY) {
        for _ in 0..=history {
            if !seq.grow(&mut pool, PAGE_SIZE) {
                return Err("the page pool is too small for the requests".into());
            }
        }
    }
    let table = HostPageTable::of(requests.iter().map(Some), PAGE_SIZE, 0);
    let device_table = DevicePageTable::upload(stream, &table)?;

    let batch = HISTORY.len();
    let paged_kv = paged_kv(NUM_PAGES);
    let (b, hq, hkv, d) = (batch as i32, QO_HEADS as i32, KV_HEADS as i32, HEAD_DIM as i32);

    // Append the new token's K and V.
    let (key, value) = (
        random_values(&mut rng, batch * KV_HEADS * HEAD_DIM),
        random_values(&mut rng, batch * KV_HEADS * HEAD_DIM),
    );
    let (key_dev, value_dev) = (stream.clone_htod(&key)?, stream.clone_htod(&value)?);
    let append_desc = PagedKvAppendDescriptor { batch_size: b, paged_kv };
    let append = PagedKvAppendPlan::<f16>::select(stream, &append_desc, PlanPreference::default())?;
    let (indices, indptr, last_page_len) = device_table.views();
    append.run(
        stream,
        &mut Workspace::none(),
        &mut PagedKvAppendArgs {
            key: TensorRef::new(key_dev.slice(..), [b, hkv, d]),
            value: TensorRef::new(value_dev.slice(..), [b, hkv, d]),
            k_data: TensorMut::new(k_store.slice_mut(..), store_shape),
            v_data: TensorMut::new(v_store.slice_mut(..), store_shape),
            indices,
            indptr,
            last_page_len,
        },
    )?;

    // Decode: one query row per request over its history and the new token. The workspace is
    // zeroed once before its first use; every launch leaves it that way.
    let decode_desc = BatchPagedDecodeDescriptor {
        batch_size: b,
        num_qo_heads: hq,
        sm_scale: 1.0 / (d as f32).sqrt(),
        paged_kv,
    };
    let decode = BatchPagedDecodePlan::<f16>::select(stream, &decode_desc, PlanPreference::default())?;
    let q = random_values(&mut rng, batch * QO_HEADS * HEAD_DIM);
    let q_dev = stream.clone_htod(&q)?;
    let mut o = stream.alloc_zeros::<f16>(q.len())?;
    let mut lse = stream.alloc_zeros::<f32>(batch * QO_HEADS)?;
    let mut workspace = stream.alloc_zeros::<u8>(decode.workspace_size().max(1))?;
    let (indices, indptr, last_page_len) = device_table.views();
    decode.run(
        stream,
        &mut Workspace::zeroed(stream, workspace.slice_mut(..))?,
        &mut BatchPagedDecodeArgs {
            q: TensorRef::new(q_dev.slice(..), [b, hq, d]),
            k_data: TensorRef::new(k_store.slice(..), store_shape),
            v_data: TensorRef::new(v_store.slice(..), store_shape),
            indices,
            indptr,
            last_page_len,
            o: TensorMut::new(o.slice_mut(..), [b, hq, d]),
            lse: TensorMut::new(lse.slice_mut(..), [b, hq]),
        },
    )?;
    let (o, lse) = (stream.clone_dtoh(&o)?, stream.clone_dtoh(&lse)?);

    // The same step on the CPU, in float64.
    reference::append(&append_desc, &key, &value, &mut k_host, &mut v_host, table.view())?;
    let expected = reference::decode(&decode_desc, &q, &k_host, &v_host, table.view())?;
    let row = QO_HEADS * HEAD_DIM;
    println!(
        "{} requests, {QO_HEADS}/{KV_HEADS} heads, head_dim {HEAD_DIM}, f16, {PAGE_SIZE}-token pages; {} splits",
        batch,
        decode.config().num_splits
    );
    let mut worst: f64 = 0.0;
    for (r, seq) in requests.iter().enumerate() {
        let err = rel_err(&o[r * row..(r + 1) * row], &expected.o[r * row..(r + 1) * row]);
        let heads = r * QO_HEADS..(r + 1) * QO_HEADS;
        let lse_err = lse_err(&lse[heads.clone()], &expected.lse[heads]);
        println!(
            "  request {r}: {} tokens on pages {:?}; rel err {err:.2e}, lse err {lse_err:.2e}",
            seq.len, seq.pages
        );
        worst = worst.max(err).max(lse_err);
    }
    within_tolerance(worst)?;
    println!("append + decode match the float64 reference (worst error {worst:.2e} ≤ {TOLERANCE:.0e})");
    Ok(())
}
