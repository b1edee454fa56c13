//! A serving engine's decode loop. Every step appends each running request's new token to the
//! paged K/V cache and decodes one query row per request: both launches are captured once into
//! a CUDA graph and replayed every step. Between replays the engine does what a real one does on
//! the host: requests finish and give their pages back to a free list, new ones arrive and take
//! pages for their prompt (the prompt's K/V stands in for a prefill), running ones take a page
//! when their last one is full, and the page table is uploaded into the buffers the graph reads.
//!
//! The graph has a fixed batch of slots; an empty slot is a request without pages (the decode
//! gives it `o = 0`, `lse = -inf`; the append skips it). The device results are checked against
//! the float64 CPU reference every [`CHECK_EVERY`] steps.
//!
//! `cargo run --release --example serving_loop` (without a CUDA driver it says so and exits 0).

mod common;

use std::process::ExitCode;
use std::time::Instant;

use common::{
    DevicePageTable, HEAD_DIM, HostPageTable, KV_HEADS, PAGE_SIZE, PagePool, QO_HEADS, Sequence, TOLERANCE,
    exit_code, lse_err, open_device_for_capture, paged_kv, random_values, rel_err, within_tolerance,
};
use paged_decode::cudarc::driver::CudaSlice;
use paged_decode::cudarc::driver::sys::{CUgraphInstantiate_flags, CUstreamCaptureMode};
use paged_decode::half::f16;
use paged_decode::{
    BatchPagedDecodeArgs, BatchPagedDecodeDescriptor, BatchPagedDecodePlan, Device, PagedKvAppendArgs,
    PagedKvAppendDescriptor, PagedKvAppendPlan, PlanPreference, TensorMut, TensorRef, Workspace, reference,
};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

const NUM_PAGES: usize = 512;
/// Request slots in the captured batch.
const SLOTS: usize = 8;
const STEPS: usize = 400;
const CHECK_EVERY: usize = 100;
/// A free slot receives a new request with probability 1 / ARRIVAL_ODDS per step.
const ARRIVAL_ODDS: usize = 4;
const MAX_PROMPT: usize = 600;
const MAX_GENERATED: usize = 160;
/// Elements of one page of the K (or V) store: `[kv_heads, page_size, head_dim]`.
const PAGE_ELEMS: usize = KV_HEADS * PAGE_SIZE * HEAD_DIM;
/// Elements of one token's K (or V) for all KV heads, and of one query row.
const TOKEN_ELEMS: usize = KV_HEADS * HEAD_DIM;
const Q_ELEMS: usize = QO_HEADS * HEAD_DIM;

fn main() -> ExitCode {
    exit_code("serving loop example", run())
}

/// A running request.
struct Running {
    seq: Sequence,
    /// Tokens still to generate.
    remaining: usize,
}

/// The engine's device buffers: the store, the page table, this step's inputs and the outputs.
/// The graph holds their addresses, so they live as long as it does and are only written into.
struct Buffers {
    k_store: CudaSlice<f16>,
    v_store: CudaSlice<f16>,
    table: DevicePageTable,
    q: CudaSlice<f16>,
    key: CudaSlice<f16>,
    value: CudaSlice<f16>,
    o: CudaSlice<f16>,
    lse: CudaSlice<f32>,
    workspace: CudaSlice<u8>,
}

/// What the host keeps: the requests, the free pages and a copy of the store for checking.
struct Engine {
    rng: SmallRng,
    pool: PagePool,
    slots: Vec<Option<Running>>,
    k_host: Vec<f16>,
    v_host: Vec<f16>,
    admitted: usize,
    finished: usize,
    peak_pages: usize,
}

impl Engine {
    /// Frees the pages of requests that have generated all their tokens.
    fn retire_finished(&mut self) {
        for slot in &mut self.slots {
            if let Some(mut done) = slot.take_if(|r| r.remaining == 0) {
                self.pool.release(&mut done.seq.pages);
                self.finished += 1;
            }
        }
    }

    /// Lets new requests into free slots. Admission reserves a request's whole budget (prompt
    /// plus generated tokens), so running requests never wait for a page. The prompt's K/V is
    /// written into its pages here; a real engine runs its prefill instead.
    fn admit(&mut self, dev: &Device, buffers: &mut Buffers) -> Result<(), Box<dyn std::error::Error>> {
        for s in 0..SLOTS {
            if self.slots[s].is_some() || self.rng.random_range(0..ARRIVAL_ODDS) != 0 {
                continue;
            }
            let prompt = 1 + self.rng.random_range(0..MAX_PROMPT);
            let generated = 1 + self.rng.random_range(0..MAX_GENERATED);
            let reserved: usize =
                self.slots.iter().flatten().map(|r| r.remaining.div_ceil(PAGE_SIZE) + 1).sum();
            if self.pool.available() < (prompt + generated).div_ceil(PAGE_SIZE) + reserved {
                continue;
            }
            let mut seq = Sequence::default();
            if !(0..prompt).all(|_| seq.grow(&mut self.pool, PAGE_SIZE)) {
                return Err("the page pool ran dry despite the admission check".into());
            }
            for &page in &seq.pages {
                let range = page as usize * PAGE_ELEMS..(page as usize + 1) * PAGE_ELEMS;
                let (k, v) =
                    (random_values(&mut self.rng, PAGE_ELEMS), random_values(&mut self.rng, PAGE_ELEMS));
                self.k_host[range.clone()].copy_from_slice(&k);
                self.v_host[range.clone()].copy_from_slice(&v);
                dev.stream.memcpy_htod(&k, &mut buffers.k_store.slice_mut(range.clone()))?;
                dev.stream.memcpy_htod(&v, &mut buffers.v_store.slice_mut(range))?;
            }
            self.slots[s] = Some(Running { seq, remaining: generated });
            self.admitted += 1;
        }
        Ok(())
    }

    /// Makes room for each running request's next token (the append convention: the table is
    /// advanced before the append runs).
    fn advance(&mut self) -> Result<(), String> {
        for running in self.slots.iter_mut().flatten() {
            if !running.seq.grow(&mut self.pool, PAGE_SIZE) {
                return Err("the page pool ran dry despite the admission reserve".into());
            }
            running.remaining -= 1;
        }
        self.peak_pages = self.peak_pages.max(NUM_PAGES - self.pool.available());
        Ok(())
    }

    fn running(&self) -> usize {
        self.slots.iter().flatten().count()
    }

    fn table(&self, indices_capacity: usize) -> HostPageTable {
        HostPageTable::of(self.slots.iter().map(|s| s.as_ref().map(|r| &r.seq)), PAGE_SIZE, indices_capacity)
    }
}

fn run() -> Result<(), Box<dyn std::error::Error>> {
    // SAFETY: every transfer, append, decode and graph replay goes through `dev.stream`, the
    // buffers the graph uses (`Buffers`) outlive it, and its workspace, zeroed once before the
    // capture, serves only the graph's decode.
    let Some(dev) = (unsafe { open_device_for_capture("serving loop example") })? else { return Ok(()) };
    let stream = &dev.stream;
    let paged_kv = paged_kv(NUM_PAGES);
    let append_desc = PagedKvAppendDescriptor { batch_size: SLOTS as i32, paged_kv };
    let decode_desc = BatchPagedDecodeDescriptor {
        batch_size: SLOTS as i32,
        num_qo_heads: QO_HEADS as i32,
        sm_scale: 1.0 / (HEAD_DIM as f32).sqrt(),
        paged_kv,
    };
    let append = PagedKvAppendPlan::<f16>::select(stream, &append_desc, PlanPreference::default())?;
    let decode = BatchPagedDecodePlan::<f16>::select(stream, &decode_desc, PlanPreference::default())?;

    // `indices` is sized for the whole pool: a table of any step fits, and it is never empty. The
    // workspace is zeroed once here; every launch leaves it that way, so replays reuse it.
    let store_len = NUM_PAGES * PAGE_ELEMS;
    let mut buffers = Buffers {
        k_store: stream.alloc_zeros(store_len)?,
        v_store: stream.alloc_zeros(store_len)?,
        table: DevicePageTable::upload(
            stream,
            &HostPageTable::of((0..SLOTS).map(|_| None), PAGE_SIZE, NUM_PAGES),
        )?,
        q: stream.alloc_zeros(SLOTS * Q_ELEMS)?,
        key: stream.alloc_zeros(SLOTS * TOKEN_ELEMS)?,
        value: stream.alloc_zeros(SLOTS * TOKEN_ELEMS)?,
        o: stream.alloc_zeros(SLOTS * Q_ELEMS)?,
        lse: stream.alloc_zeros(SLOTS * QO_HEADS)?,
        workspace: stream.alloc_zeros(decode.workspace_size().max(1))?,
    };
    let graph = capture_step(&dev, &append, &decode, &mut buffers)?;

    let mut rng = SmallRng::seed_from_u64(2024);
    let pool = PagePool::new(NUM_PAGES, &mut rng);
    let mut engine = Engine {
        rng,
        pool,
        slots: (0..SLOTS).map(|_| None).collect(),
        k_host: vec![f16::ZERO; store_len],
        v_host: vec![f16::ZERO; store_len],
        admitted: 0,
        finished: 0,
        peak_pages: 0,
    };
    let (mut replays, mut worst) = (0, 0.0f64);
    let start = Instant::now();
    for step in 1..=STEPS {
        engine.retire_finished();
        engine.admit(&dev, &mut buffers)?;
        if engine.running() == 0 {
            continue;
        }
        engine.advance()?;
        let table = engine.table(NUM_PAGES);
        let q = random_values(&mut engine.rng, SLOTS * Q_ELEMS);
        let (key, value) = (
            random_values(&mut engine.rng, SLOTS * TOKEN_ELEMS),
            random_values(&mut engine.rng, SLOTS * TOKEN_ELEMS),
        );
        buffers.table.write(stream, &table)?;
        stream.memcpy_htod(&q, &mut buffers.q)?;
        stream.memcpy_htod(&key, &mut buffers.key)?;
        stream.memcpy_htod(&value, &mut buffers.value)?;
        graph.launch()?;
        replays += 1;

        append_on_host(&mut engine, &append_desc, &table, &key, &value)?;
        if step % CHECK_EVERY == 0 {
            let err = check_step(&dev, &engine, &decode_desc, &table, &q, &buffers)?;
            println!(
                "step {step}: {} running, {} pages in use, max error against the reference {err:.2e}",
                engine.running(),
                NUM_PAGES - engine.pool.available()
            );
            worst = worst.max(err);
        }
    }
    stream.synchronize()?;
    let elapsed = start.elapsed();
    println!(
        "{STEPS} steps ({replays} graph replays of append + decode, {} splits): {} requests admitted, {} finished, \
         {} running; peak {}/{NUM_PAGES} pages in use",
        decode.config().num_splits,
        engine.admitted,
        engine.finished,
        engine.running(),
        engine.peak_pages
    );
    println!(
        "{:.1} µs per step: host bookkeeping, uploads and the replay, plus the host copy of the store and the \
         reference checks",
        elapsed.as_secs_f64() * 1e6 / STEPS as f64
    );
    within_tolerance(worst)?;
    println!("every checked step matches the float64 reference (worst error {worst:.2e} ≤ {TOLERANCE:.0e})");
    Ok(())
}

/// Captures one step, the append then the decode, into a CUDA graph over `buffers`.
fn capture_step(
    dev: &Device,
    append: &PagedKvAppendPlan<f16>,
    decode: &BatchPagedDecodePlan<f16>,
    b: &mut Buffers,
) -> Result<paged_decode::cudarc::driver::CudaGraph, Box<dyn std::error::Error>> {
    let stream = &dev.stream;
    let store = [NUM_PAGES as i32, KV_HEADS as i32, PAGE_SIZE as i32, HEAD_DIM as i32];
    let (slots, hq, hkv, d) = (SLOTS as i32, QO_HEADS as i32, KV_HEADS as i32, HEAD_DIM as i32);
    // Zeroed once, outside the graph: every replayed decode leaves its split state zero again.
    let mut workspace = Workspace::zeroed(stream, b.workspace.slice_mut(..))?;
    stream.begin_capture(CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)?;
    let captured = (|| -> paged_decode::Result<()> {
        let (indices, indptr, last_page_len) = b.table.views();
        append.run(
            stream,
            &mut Workspace::none(),
            &mut PagedKvAppendArgs {
                key: TensorRef::new(b.key.slice(..), [slots, hkv, d]),
                value: TensorRef::new(b.value.slice(..), [slots, hkv, d]),
                k_data: TensorMut::new(b.k_store.slice_mut(..), store),
                v_data: TensorMut::new(b.v_store.slice_mut(..), store),
                indices,
                indptr,
                last_page_len,
            },
        )?;
        let (indices, indptr, last_page_len) = b.table.views();
        decode.run(
            stream,
            &mut workspace,
            &mut BatchPagedDecodeArgs {
                q: TensorRef::new(b.q.slice(..), [slots, hq, d]),
                k_data: TensorRef::new(b.k_store.slice(..), store),
                v_data: TensorRef::new(b.v_store.slice(..), store),
                indices,
                indptr,
                last_page_len,
                o: TensorMut::new(b.o.slice_mut(..), [slots, hq, d]),
                lse: TensorMut::new(b.lse.slice_mut(..), [slots, hq]),
            },
        )
    })();
    let graph = stream.end_capture(CUgraphInstantiate_flags::CUDA_GRAPH_INSTANTIATE_FLAG_AUTO_FREE_ON_LAUNCH);
    captured?;
    let graph = graph?.ok_or("the graph capture recorded nothing")?;
    graph.upload()?;
    Ok(graph)
}

/// Applies this step's append to the host copy of the store, with the step's table (a free
/// slot is a request without pages, which appends nothing).
fn append_on_host(
    engine: &mut Engine,
    desc: &PagedKvAppendDescriptor,
    table: &HostPageTable,
    key: &[f16],
    value: &[f16],
) -> Result<(), Box<dyn std::error::Error>> {
    reference::append(desc, key, value, &mut engine.k_host, &mut engine.v_host, table.view())?;
    Ok(())
}

/// The largest error of this step's decode against the float64 reference, over every slot
/// (empty slots must give `o = 0` and `lse = -inf`).
fn check_step(
    dev: &Device,
    engine: &Engine,
    desc: &BatchPagedDecodeDescriptor,
    table: &HostPageTable,
    q: &[f16],
    buffers: &Buffers,
) -> Result<f64, Box<dyn std::error::Error>> {
    let o = dev.stream.clone_dtoh(&buffers.o)?;
    let lse = dev.stream.clone_dtoh(&buffers.lse)?;
    let expected = reference::decode(desc, q, &engine.k_host, &engine.v_host, table.view())?;
    let o_err = (0..SLOTS)
        .map(|s| s * Q_ELEMS..(s + 1) * Q_ELEMS)
        .map(|rows| rel_err(&o[rows.clone()], &expected.o[rows]))
        .fold(0.0, f64::max);
    Ok(o_err.max(lse_err(&lse, &expected.lse)))
}
