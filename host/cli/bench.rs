//! The benchmark: times plans on a shape table (the FlashInfer harness's `shapes.json` format)
//! with CUDA-graph replays, beside the card's read ceiling measured in the same run.
//!
//! Method (as the FlashInfer harness): random data, pages in random permutation, 20 `run` calls
//! captured in one graph, median of 15 replays ÷ 20. Bytes are `2·Σlen·Hkv·D·sizeof(T) + 2·|q|·sizeof(T)`.
//! (a window row: only the window's tokens). Rows may set `layout` (HND / NHD), `soft_cap` and
//! `window_left`, as the anchor's `variant-shapes.json`.

use std::path::PathBuf;
use std::sync::Arc;

use cudarc::driver::sys::{CUevent_flags, CUgraphInstantiate_flags, CUstreamCaptureMode};
use cudarc::driver::{CudaFunction, CudaSlice, CudaStream, LaunchConfig, PushKernelArg};
use cudarc::nvrtc::Ptx;
use half::{bf16, f16};
use paged_decode::device::DeviceProps;
use paged_decode::float8::{F8E4M3, F8E5M2};
use paged_decode::{
    AttentionVariantDescriptor, BatchPagedDecodeDescriptor, BatchPagedDecodePlan, Device, Element, Error,
    KvLayout, PagedKvAppendDescriptor, PagedKvAppendPlan, PlanPreference, Result, StablePageTable, Workspace,
    ptx,
};
use serde::{Deserialize, Serialize};

use crate::problem::{DeviceProblem, HostProblem, ProblemCache, ProblemSpec, rel_l2, tolerances};

/// One row of the shape table.
#[derive(Debug, Clone, Deserialize)]
pub struct Shape {
    /// Shape name, used as the row label.
    pub name: String,
    /// Number of requests (may be left out when `lens` is given).
    #[serde(default)]
    pub batch: Option<usize>,
    /// K/V length of every request (used when `lens` is absent).
    #[serde(default)]
    pub kv_len: Option<usize>,
    /// Per-request K/V lengths; takes precedence over `kv_len`.
    #[serde(default)]
    pub lens: Option<Vec<usize>>,
    /// Query/output heads.
    pub hq: usize,
    /// K/V heads.
    pub hkv: usize,
    /// Head dimension.
    pub d: usize,
    /// Tokens per page.
    pub page: usize,
    /// Element type of q and o (and of K/V unless `kv_dtype` says otherwise): `f16`, `bf16` or
    /// `f32`.
    pub dtype: String,
    /// An 8-bit K/V cache: `e4m3` or `e5m2` (q and o stay in `dtype`).
    #[serde(default)]
    pub kv_dtype: Option<String>,
    /// K/V store layout: `HND` (default) or `NHD`.
    #[serde(default)]
    pub layout: Option<String>,
    /// Logits soft-cap (`cap · tanh(logits / cap)`).
    #[serde(default)]
    pub soft_cap: Option<f32>,
    /// Sliding window: the last `window_left + 1` tokens; negative (FlashInfer's -1) or absent: all.
    #[serde(default)]
    pub window_left: Option<i64>,
}

impl Shape {
    /// The problem sizes of this row (per-request lengths from `lens`, else `kv_len`, else 0);
    /// [`Error::InvalidProblem`] for a batch past `i32` or a `batch` that contradicts `lens`.
    pub fn spec(&self) -> Result<ProblemSpec> {
        let batch = self.batch();
        if let (Some(b), Some(lens)) = (self.batch, &self.lens)
            && b != lens.len()
        {
            return Err(Error::InvalidProblem(format!("{}: batch {b} but {} lens", self.name, lens.len())));
        }
        if i32::try_from(batch).is_err() {
            return Err(Error::InvalidProblem(format!("{}: batch {batch} does not fit in i32", self.name)));
        }
        let lens = match (&self.lens, self.kv_len) {
            (Some(l), _) => l.clone(),
            (None, Some(n)) => vec![n; batch],
            (None, None) => vec![0; batch],
        };
        Ok(ProblemSpec { lens, ..ProblemSpec::uniform(batch, 0, self.hq, self.hkv, self.d, self.page) })
    }

    /// The attention variant of this row.
    pub fn variant(&self) -> AttentionVariantDescriptor {
        AttentionVariantDescriptor {
            logits_soft_cap: self.soft_cap,
            window_left: self.window_left.and_then(|w| u32::try_from(w).ok()),
        }
    }

    /// The K/V layout of this row ([`Error::InvalidProblem`] for a name other than HND / NHD).
    pub fn kv_layout(&self) -> Result<KvLayout> {
        match self.layout.as_deref() {
            None | Some("HND") => Ok(KvLayout::Hnd),
            Some("NHD") => Ok(KvLayout::Nhd),
            Some(other) => Err(Error::InvalidProblem(format!("{}: unknown layout {other}", self.name))),
        }
    }

    /// Number of requests: `batch`, else the number of `lens`.
    pub fn batch(&self) -> usize {
        self.batch.or(self.lens.as_ref().map(Vec::len)).unwrap_or(0)
    }
}

/// One result row (the format `compare.py` reads).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct BenchRow {
    /// Shape name.
    pub name: String,
    /// Median time of one `run` call, in microseconds.
    pub us: f64,
    /// Achieved bandwidth in TB/s (bytes as counted by [`ProblemSpec::kv_bytes`]).
    pub tb_s: f64,
    /// `tb_s` as a percentage of the measured read ceiling.
    pub pct_of_ceiling: f64,
    /// KV splits per request (at equal lengths) the selected plan uses.
    pub num_splits: u32,
    /// Chunks the kernel partitions the requests into.
    pub num_chunks: u32,
    /// CTAs per KV head and head block along the chunks (fewer than `num_chunks` when the page
    /// table cannot hold enough tokens to use them all).
    #[serde(default)]
    pub launched_chunks: u32,
    /// The kernel path `run` took ([`paged_decode::plan::DecodePath::name`]).
    #[serde(default)]
    pub path: String,
    /// Largest relative L2 error of the checked requests, when checking was on.
    pub max_rel_err: Option<f64>,
}

/// Options of the `bench` subcommand.
#[derive(Debug, Clone)]
pub struct BenchOptions {
    /// Path of the shape table (JSON).
    pub shapes: PathBuf,
    /// Where to write the result rows as JSON.
    pub json: Option<PathBuf>,
    /// Where to write the SVG plot.
    pub plot: Option<PathBuf>,
    /// Compare some requests against the float64 reference before timing.
    pub check: bool,
    /// Launch with programmatic dependent launch where the GPU supports it (the default).
    pub programmatic_launch: bool,
    /// Read the page table before waiting for the previous kernel
    /// ([`PlanPreference::stable_page_table`]).
    pub stable_page_table: bool,
    /// Chunks per request instead of the plan's rule ([`PlanPreference::num_splits`]).
    pub num_splits: Option<u32>,
    /// Spare chunks instead of the plan's rule ([`PlanPreference::spare_chunks`]).
    pub spare_chunks: Option<u32>,
    /// Lean-kernel bound instead of the plan's ([`PlanPreference::lean_max_avg_tokens`]).
    pub lean_max_avg_tokens: Option<u32>,
    /// Most KV heads per lean CTA instead of the plan's bound
    /// ([`PlanPreference::max_stacked_kv_heads`]).
    pub max_stacked_kv_heads: Option<u32>,
    /// Most CTAs of a guessing launch instead of the plan's bound
    /// ([`PlanPreference::guess_max_ctas`]).
    pub guess_max_ctas: Option<u32>,
    /// Spare chunks of the lean kernel's scheduled partition instead of the plan's rule
    /// ([`PlanPreference::lean_spare_chunks`]).
    pub lean_spare_chunks: Option<u32>,
    /// Unused page-table slots after the batch's ([`ProblemSpec::indices_slack`]): a buffer
    /// sized for a larger batch, which keeps split grids at their full size.
    pub indices_slack: usize,
    /// Each timed call after an unrelated operation instead of after the call before
    /// ([`GraphTiming::separator`]).
    pub separator: Option<Separator>,
    /// Each timed call right after the append of one token per request, as in a serving step
    /// ([`GraphTiming::after_append`]).
    pub after_append: bool,
    /// Give each plan the row's longest length as its bound
    /// ([`BatchPagedDecodePlan::set_max_kv_len`]), as a serving step that knows its lengths.
    pub max_kv_len: bool,
}

/// How [`time_plan`] times: `calls` runs captured in one CUDA graph, the median of `replays`
/// replays, each run after the one before or after a copy.
#[derive(Debug, Clone, Copy)]
pub struct GraphTiming {
    /// Runs per graph.
    pub calls: usize,
    /// Timed replays (after three untimed ones).
    pub replays: usize,
    /// Each run preceded by this operation, whose own time (a graph of the separators alone)
    /// is subtracted; `None`: each run after the one before.
    pub separator: Option<Separator>,
    /// Each run preceded (after its separator) by our append of one token per request into the
    /// store it reads ([`PagedKvAppendPlan`], a plain launch), as a serving step appends the new
    /// token before the decode; the appends' own time (a graph of them alone, after their
    /// separators) is subtracted. The append overwrites each request's last token in place (the
    /// page table already counts it), so every replay reads the same lengths.
    pub after_append: bool,
}

/// What precedes each timed run of a separated timing, so that each run starts as it would after
/// an unrelated operation, without the programmatic overlap with the run before it that a graph
/// of back-to-back runs gives. A copy is a graph node that no launch overlaps; a read is a kernel
/// that never signals its dependents early, so a run launched with programmatic launch may start
/// only as the read's last CTAs exit, as after any such kernel. One larger than L2
/// ([`COLD_L2_SEPARATOR_BYTES`]) also leaves L2 holding none of the run's data, as in a model
/// whose other layers run between two decodes of one layer; back to back, the lines a run
/// leaves in L2 serve the next one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Separator {
    /// A device-to-device copy of this many bytes (reads and writes as many): after a large one
    /// L2 is full of dirty lines, which the run's reads must write back.
    Copy(usize),
    /// The read-ceiling kernel over this many bytes (reads only): after a large one L2 is full
    /// of clean lines of another buffer, as after a GEMM that read its weights.
    Read(usize),
}

impl GraphTiming {
    /// 20 back-to-back runs per graph, the median of 15 replays: FlashInfer's harness's method.
    pub const BACK_TO_BACK: GraphTiming =
        GraphTiming { calls: 20, replays: 15, separator: None, after_append: false };
}

/// Bytes of the copy before each run of a separated timing ([`GraphTiming::separator`]) by
/// default (FlashInfer's harness copies as many, `benches/flashinfer/common.py`).
pub const SEPARATOR_BYTES: usize = 1 << 20;

/// A separator that leaves L2 cold: 128 MiB, well above the 50 MB L2 of an H100 or H200.
pub const COLD_L2_SEPARATOR_BYTES: usize = 128 << 20;

/// Median time of one call.
#[derive(Debug, Clone, Copy)]
pub struct Timing {
    /// Microseconds.
    pub us: f64,
}

/// Times `plan` on `dev` as `timing` says; the time of one run.
///
/// Capture needs a device opened with [`Device::open_untracked`]; with event tracking on, the
/// plan refuses the captured runs (`Error::CaptureWithTracking`) and this returns that error.
/// The graphs are dropped before this returns, so the buffers they captured outlive them.
pub fn time_plan<T: Element, C: ProblemCache>(
    device: &Device,
    plan: &BatchPagedDecodePlan<T, C>,
    dev: &mut DeviceProblem<T, C>,
    scales: paged_decode::KvScales,
    timing: GraphTiming,
) -> Result<Timing> {
    let stream = &device.stream;
    let mut separator = match timing.separator {
        Some(kind) => Some(SeparatorOp::new(device, kind)?),
        None => None,
    };
    let append =
        if timing.after_append { Some(AppendStep::<T, C>::new(stream, plan.descriptor())?) } else { None };
    let mut before_run = |dev: &mut DeviceProblem<T, C>| -> Result<()> {
        if let Some(op) = separator.as_mut() {
            op.launch(stream)?;
        }
        match &append {
            Some(step) => step.launch(stream, dev, scales),
            None => Ok(()),
        }
    };
    let with_runs = time_graph(device, timing, || {
        before_run(dev)?;
        let (mut args, mut ws) = dev.args_and_workspace();
        plan.run_scaled(stream, &mut ws, &mut args, scales)
    })?;
    let before = if timing.separator.is_some() || timing.after_append {
        time_graph(device, timing, || before_run(dev))?
    } else {
        0.0
    };
    Ok(Timing { us: with_runs - before })
}

/// The append of [`GraphTiming::after_append`]: our append plan for the decode's store, and one
/// zero token row per request and KV head for both K and V.
struct AppendStep<T: Element, C: ProblemCache> {
    plan: PagedKvAppendPlan<T, C>,
    rows: CudaSlice<T>,
}

impl<T: Element, C: ProblemCache> AppendStep<T, C> {
    fn new(stream: &Arc<CudaStream>, decode: &BatchPagedDecodeDescriptor) -> Result<Self> {
        let desc = PagedKvAppendDescriptor { batch_size: decode.batch_size, paged_kv: decode.paged_kv };
        let plan = PagedKvAppendPlan::<T, C>::select(stream, &desc, PlanPreference::default())?;
        let kv = &decode.paged_kv;
        let len =
            decode.batch_size.max(0) as usize * kv.num_kv_heads.max(0) as usize * kv.head_dim.max(0) as usize;
        Ok(Self { plan, rows: stream.alloc_zeros(len.max(1))? })
    }

    /// Appends the zero rows into `dev`'s store, quantized with `scales` for an 8-bit one.
    fn launch(
        &self,
        stream: &Arc<CudaStream>,
        dev: &mut DeviceProblem<T, C>,
        scales: paged_decode::KvScales,
    ) -> Result<()> {
        let mut args = dev.append_args(&self.rows, &self.rows);
        self.plan.run_scaled(stream, &mut Workspace::none(), &mut args, scales)
    }
}

/// A [`Separator`] ready to launch: its buffers, and its kernel for a read.
enum SeparatorOp {
    Copy { src: CudaSlice<u8>, dst: CudaSlice<u8> },
    Read { src: CudaSlice<u8>, kernel: ReadKernel },
}

impl SeparatorOp {
    fn new(device: &Device, kind: Separator) -> Result<Self> {
        let stream = &device.stream;
        Ok(match kind {
            Separator::Copy(bytes) => {
                SeparatorOp::Copy { src: stream.alloc_zeros(bytes)?, dst: stream.alloc_zeros(bytes)? }
            }
            Separator::Read(bytes) => {
                SeparatorOp::Read { src: stream.alloc_zeros(bytes)?, kernel: ReadKernel::load(device)? }
            }
        })
    }

    fn launch(&mut self, stream: &Arc<CudaStream>) -> Result<()> {
        match self {
            SeparatorOp::Copy { src, dst } => stream.memcpy_dtod(src, dst)?,
            SeparatorOp::Read { src, kernel } => kernel.launch(stream, src)?,
        }
        Ok(())
    }
}

/// Microseconds per call of `call`: `timing.calls` calls captured in one CUDA graph, the median
/// of `timing.replays` replays.
fn time_graph(device: &Device, timing: GraphTiming, mut call: impl FnMut() -> Result<()>) -> Result<f64> {
    let stream = &device.stream;
    stream.begin_capture(CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)?;
    let captured = (0..timing.calls).try_for_each(|_| call());
    let graph = stream.end_capture(CUgraphInstantiate_flags::CUDA_GRAPH_INSTANTIATE_FLAG_AUTO_FREE_ON_LAUNCH);
    captured?;
    let graph = graph?.ok_or_else(|| Error::InvalidProblem("graph capture recorded nothing".into()))?;
    graph.upload()?;
    for _ in 0..3 {
        graph.launch()?;
    }
    let start = device.ctx.new_event(Some(CUevent_flags::CU_EVENT_DEFAULT))?;
    let stop = device.ctx.new_event(Some(CUevent_flags::CU_EVENT_DEFAULT))?;
    let mut samples = Vec::with_capacity(timing.replays);
    for _ in 0..timing.replays {
        start.record(stream)?;
        graph.launch()?;
        stop.record(stream)?;
        stop.synchronize()?;
        samples.push(start.elapsed_ms(&stop)? as f64 * 1e3 / timing.calls as f64);
    }
    Ok(median(&mut samples))
}

/// Back-to-back launches of the read kernel in each sample of [`read_ceiling`]: the launch
/// latency is shared by them, as the rows' graphs of 20 calls share theirs.
const CEILING_LAUNCHES: usize = 5;

/// Read bandwidth of the card in TB/s: our 16-byte `ld.global.nc` kernel over 2 GiB, the median
/// of 20 samples of [`CEILING_LAUNCHES`] launches each.
pub fn read_ceiling(device: &Device) -> Result<f64> {
    let stream = &device.stream;
    let bytes: usize = 2 << 30;
    let src = stream.alloc_zeros::<u8>(bytes)?;
    let mut kernel = ReadKernel::load(device)?;
    kernel.launch(stream, &src)?;
    let start = device.ctx.new_event(Some(CUevent_flags::CU_EVENT_DEFAULT))?;
    let stop = device.ctx.new_event(Some(CUevent_flags::CU_EVENT_DEFAULT))?;
    let mut samples = Vec::new();
    for _ in 0..20 {
        start.record(stream)?;
        for _ in 0..CEILING_LAUNCHES {
            kernel.launch(stream, &src)?;
        }
        stop.record(stream)?;
        stop.synchronize()?;
        let seconds = start.elapsed_ms(&stop)? as f64 * 1e-3;
        samples.push((CEILING_LAUNCHES * bytes) as f64 / seconds / 1e12);
    }
    Ok(median(&mut samples))
}

/// The `read_bandwidth` entry of the PTX build the device loads (as a module of its own:
/// [`ptx::EntryModules`]; the library's module cache is private to it), and the word it writes
/// only if its checksum matches a sentinel, so that its reads cannot be optimized away.
struct ReadKernel {
    function: CudaFunction,
    sink: CudaSlice<u32>,
    /// Four CTAs per SM.
    grid: u32,
}

impl ReadKernel {
    fn load(device: &Device) -> Result<Self> {
        let props = DeviceProps::query(&device.ctx)?;
        let build = ptx::entry_modules(ptx::build_for(props.compute_capability));
        let source = build.module(ptx::entry::READ_BANDWIDTH).ok_or_else(|| {
            Error::Unsupported(format!("entry point {} is not in the PTX build", ptx::entry::READ_BANDWIDTH))
        })?;
        let module = device.ctx.load_module(Ptx::from_src(source))?;
        let function = module.load_function(ptx::entry::READ_BANDWIDTH)?;
        Ok(ReadKernel { function, sink: device.stream.alloc_zeros(1)?, grid: props.sm_count * 4 })
    }

    /// Reads all of `src` (whole 16-byte chunks).
    fn launch(&mut self, stream: &Arc<CudaStream>, src: &CudaSlice<u8>) -> Result<()> {
        let chunks = (src.len() / 16) as u64;
        let sentinel = 0x9E37_79B9u32;
        let cfg = LaunchConfig { grid_dim: (self.grid, 1, 1), block_dim: (256, 1, 1), shared_mem_bytes: 0 };
        // SAFETY: reads `chunks` 16-byte chunks of `src`, writes at most one u32 to `sink`.
        unsafe {
            stream
                .launch_builder(&self.function)
                .arg(src)
                .arg(&chunks)
                .arg(&sentinel)
                .arg(&mut self.sink)
                .launch(cfg)?
        };
        Ok(())
    }
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// Benchmarks one shape with q and o of `T` and K/V of `C`, as `opts` says (its check, page-table
/// slack and timing).
pub fn bench_shape<T: Element, C: ProblemCache>(
    device: &Device,
    shape: &Shape,
    ceiling: f64,
    opts: &BenchOptions,
    pref: PlanPreference,
) -> Result<BenchRow> {
    let (check, separator) = (opts.check, opts.separator);
    let spec = ProblemSpec { indices_slack: opts.indices_slack, ..shape.spec()? };
    let host = HostProblem::<T, C>::random(&spec)?;
    let (variant, layout) = (shape.variant(), shape.kv_layout()?);
    let mut plan = BatchPagedDecodePlan::<T, C>::select_variant(&device.stream, &host.desc, &variant, pref)?;
    if opts.max_kv_len {
        plan.set_max_kv_len(spec.lens.iter().max().and_then(|&len| u32::try_from(len).ok()));
    }
    let mut dev = DeviceProblem::upload(&device.stream, &host, plan.workspace_size())?
        .with_layout(layout, &host.desc.paged_kv);
    let max_rel_err = if check {
        let (mut args, mut ws) = dev.args_and_workspace();
        plan.run_scaled(&device.stream, &mut ws, &mut args, host.scales)?;
        let o = device.stream.clone_dtoh(&dev.o)?;
        let row = spec.num_qo_heads * spec.head_dim;
        let (tol, _) = tolerances(T::KIND);
        let mut worst: f64 = 0.0;
        for b in [0, spec.batch() / 2, spec.batch() - 1] {
            let reference_variant = paged_decode::reference::AttentionVariant {
                logits_soft_cap: variant.logits_soft_cap,
                window_left: variant.window_left,
                sinks: None,
            };
            let r = host.reference_request_variant(b, reference_variant, layout)?;
            let err = rel_l2(o[b * row..(b + 1) * row].iter().map(|x| x.to_f64()), &r.o);
            if err.is_nan() || err > tol {
                return Err(Error::InvalidProblem(format!(
                    "{}: request {b} differs from the reference (rel err {err:.2e})",
                    shape.name
                )));
            }
            worst = worst.max(err);
        }
        Some(worst)
    } else {
        None
    };
    let timing = GraphTiming { separator, after_append: opts.after_append, ..GraphTiming::BACK_TO_BACK };
    let t = time_plan(device, &plan, &mut dev, host.scales, timing)?;
    let tb_s = spec.bytes_moved(T::KIND, C::CACHE_KIND, variant.window_left) as f64 / (t.us * 1e-6) / 1e12;
    Ok(BenchRow {
        name: shape.name.clone(),
        us: t.us,
        tb_s,
        pct_of_ceiling: 100.0 * tb_s / ceiling,
        num_splits: plan.config().num_splits,
        num_chunks: plan.config().partition(plan.descriptor(), plan.path(host.indices.len())).num_chunks,
        launched_chunks: plan.launched_chunks(host.indices.len()),
        path: {
            let (path, n) = (plan.path(host.indices.len()).name(), host.indices.len());
            match plan.stacked_kv_heads(n) {
                1 => path.into(),
                heads => format!("{path}-x{heads}"),
            }
        },
        max_rel_err,
    })
}

/// How the bench's plans launch, in words (where the GPU supports programmatic launch).
fn launch_mode(pref: &PlanPreference) -> &'static str {
    match (pref.programmatic_launch, pref.stable_page_table.is_some()) {
        (false, _) => "plain (no programmatic dependent launch)",
        (true, false) => "programmatic dependent launch, every read after the wait",
        (true, true) => "programmatic dependent launch, page table read before the wait",
    }
}

/// Reads the shape table, benchmarks every row and writes the JSON and the plot.
pub fn run_cli(opts: &BenchOptions) -> std::result::Result<(), Box<dyn std::error::Error>> {
    let text = std::fs::read_to_string(&opts.shapes)
        .map_err(|e| format!("cannot read the shape table {}: {e}", opts.shapes.display()))?;
    let shapes: Vec<Shape> =
        serde_json::from_str(&text).map_err(|e| format!("shape table {}: {e}", opts.shapes.display()))?;
    // SAFETY: the benchmark issues all work on `device.stream` alone (one stream orders every use
    // and free), and each captured graph is dropped before the buffers it uses.
    let device = match unsafe { Device::open_untracked(0) } {
        Ok(d) => d,
        Err(Error::NoDevice) => {
            println!("no CUDA driver or GPU on this machine: nothing to benchmark");
            return Ok(());
        }
        Err(e) => return Err(e.into()),
    };
    let ceiling = read_ceiling(&device)?;
    // SAFETY: every graph this benchmark times holds only the plan's own decode launches, which
    // write `o`, `lse` and the workspace but never the page table, and with `after_append` our
    // appends, which write K/V but never the page table either; the run before them is preceded
    // by the uploads (copies).
    let stable_page_table = opts.stable_page_table.then(|| unsafe { StablePageTable::promise() });
    let pref = PlanPreference {
        programmatic_launch: opts.programmatic_launch,
        stable_page_table,
        num_splits: opts.num_splits,
        spare_chunks: opts.spare_chunks,
        lean_max_avg_tokens: opts.lean_max_avg_tokens,
        max_stacked_kv_heads: opts.max_stacked_kv_heads,
        guess_max_ctas: opts.guess_max_ctas,
        lean_spare_chunks: opts.lean_spare_chunks,
        ..PlanPreference::default()
    };
    println!("device: {}; read ceiling (ld.global.nc, 2 GiB): {ceiling:.2} TB/s", device.name()?);
    println!(
        "launch: {}; {}",
        launch_mode(&pref),
        if opts.max_kv_len { "bound: each row's longest request" } else { "no bound on the longest request" }
    );
    println!(
        "{:<28} {:>10} {:>8} {:>8} {:>7} {:>11} {:>9} {:>10}",
        "shape", "µs", "TB/s", "%ceil", "splits", "chunks", "path", "rel err"
    );
    // Each row's result is saved as soon as it is measured, and a row that fails is reported and
    // skipped: a run stopped part-way, or one bad row, leaves the rows measured so far.
    let mut rows = Vec::new();
    let mut failed = Vec::new();
    for shape in &shapes {
        let row = match bench_row(&device, shape, ceiling, opts, pref) {
            Ok(row) => row,
            Err(e) => {
                println!("{:<28} error: {e}", shape.name);
                failed.push(shape.name.clone());
                // A launch error can leave the context unusable: then the rows left would each
                // fill their stores on the host only to fail at the upload.
                if let Err(sticky) = device.stream.synchronize() {
                    println!("the context is unusable after that error ({sticky}): stopping");
                    break;
                }
                continue;
            }
        };
        println!(
            "{:<28} {:>10.2} {:>8.2} {:>8.1} {:>7} {:>11} {:>9} {:>10}",
            row.name,
            row.us,
            row.tb_s,
            row.pct_of_ceiling,
            row.num_splits,
            format!("{}/{}", row.launched_chunks, row.num_chunks),
            row.path,
            row.max_rel_err.map(|e| format!("{e:.1e}")).unwrap_or_else(|| "-".into())
        );
        rows.push(row);
        if let Some(path) = &opts.json {
            write_rows(path, &rows)?;
        }
    }
    if let Some(path) = &opts.json {
        write_rows(path, &rows)?;
    }
    if let Some(path) = &opts.plot {
        plot(path, &rows, ceiling)?;
    }
    if !failed.is_empty() {
        return Err(format!("{} of {} rows failed: {}", failed.len(), shapes.len(), failed.join(", ")).into());
    }
    Ok(())
}

/// One row of the table, of the element types it names.
fn bench_row(
    device: &Device,
    shape: &Shape,
    ceiling: f64,
    opts: &BenchOptions,
    pref: PlanPreference,
) -> std::result::Result<BenchRow, Box<dyn std::error::Error>> {
    Ok(match (shape.dtype.as_str(), shape.kv_dtype.as_deref()) {
        ("f16", None) => bench_shape::<f16, f16>(device, shape, ceiling, opts, pref)?,
        ("bf16", None) => bench_shape::<bf16, bf16>(device, shape, ceiling, opts, pref)?,
        ("f32", None) => bench_shape::<f32, f32>(device, shape, ceiling, opts, pref)?,
        ("f16", Some("e4m3")) => bench_shape::<f16, F8E4M3>(device, shape, ceiling, opts, pref)?,
        ("bf16", Some("e4m3")) => bench_shape::<bf16, F8E4M3>(device, shape, ceiling, opts, pref)?,
        ("f16", Some("e5m2")) => bench_shape::<f16, F8E5M2>(device, shape, ceiling, opts, pref)?,
        ("bf16", Some("e5m2")) => bench_shape::<bf16, F8E5M2>(device, shape, ceiling, opts, pref)?,
        (q, kv) => return Err(format!("unsupported dtype {q} with kv_dtype {kv:?}").into()),
    })
}

/// Writes `rows` to `path` whole or not at all (a temporary file renamed over it), so that a run
/// stopped while writing leaves the previous rows.
fn write_rows(
    path: &std::path::Path,
    rows: &[BenchRow],
) -> std::result::Result<(), Box<dyn std::error::Error>> {
    let mut partial = path.as_os_str().to_owned();
    partial.push(".partial");
    std::fs::write(&partial, serde_json::to_string_pretty(rows)?)?;
    std::fs::rename(&partial, path)?;
    Ok(())
}

/// Re-plots saved result rows (`bench --json`) without a GPU; the ceiling, unless given, is
/// recovered from the rows' `tb_s` and `pct_of_ceiling` (their median).
pub fn replot(
    json: &std::path::Path,
    out: &std::path::Path,
    ceiling: Option<f64>,
) -> std::result::Result<(), Box<dyn std::error::Error>> {
    let rows: Vec<BenchRow> = serde_json::from_str(&std::fs::read_to_string(json)?)?;
    let ceiling = match ceiling {
        Some(c) => c,
        None if rows.iter().any(|r| r.pct_of_ceiling > 0.0) => ceiling_of(&rows),
        None => return Err(format!("{}: no row gives the ceiling; pass --ceiling", json.display()).into()),
    };
    plot(out, &rows, ceiling)
}

/// The read ceiling the rows were measured against (the median of `tb_s / pct_of_ceiling`), or
/// 0 when no row has one.
pub fn ceiling_of(rows: &[BenchRow]) -> f64 {
    let mut c: Vec<f64> =
        rows.iter().filter(|r| r.pct_of_ceiling > 0.0).map(|r| 100.0 * r.tb_s / r.pct_of_ceiling).collect();
    if c.is_empty() { 0.0 } else { median(&mut c) }
}

/// SVG bar chart of TB/s per shape, with the measured ceiling as a line.
pub fn plot(
    path: &std::path::Path,
    rows: &[BenchRow],
    ceiling: f64,
) -> std::result::Result<(), Box<dyn std::error::Error>> {
    use plotters::prelude::*;
    if let Some(bad) = std::iter::once(ceiling).chain(rows.iter().map(|r| r.tb_s)).find(|v| !v.is_finite()) {
        return Err(format!("cannot plot a bandwidth of {bad} TB/s").into());
    }
    let root = SVGBackend::new(path, (1200, 640)).into_drawing_area();
    root.fill(&WHITE)?;
    let top = (ceiling.max(rows.iter().map(|r| r.tb_s).fold(0.0, f64::max)) * 1.1).max(0.1);
    if !top.is_finite() {
        return Err(format!("cannot plot bandwidths up to {top} TB/s").into());
    }
    let mut chart = ChartBuilder::on(&root)
        .caption("paged decode: K/V read bandwidth per shape", ("sans-serif", 22))
        .margin(12)
        .x_label_area_size(190)
        .y_label_area_size(60)
        .build_cartesian_2d(0..rows.len(), 0.0..top)?;
    let names: Vec<String> = rows.iter().map(|r| r.name.clone()).collect();
    chart
        .configure_mesh()
        .x_labels(rows.len().max(1))
        .x_label_formatter(&|i| names.get(*i).cloned().unwrap_or_default())
        .x_label_style(("sans-serif", 12).into_font().transform(FontTransform::Rotate90))
        .y_desc("TB/s")
        .draw()?;
    chart.draw_series(
        rows.iter()
            .enumerate()
            .map(|(i, r)| Rectangle::new([(i, 0.0), (i + 1, r.tb_s)], BLUE.mix(0.6).filled())),
    )?;
    chart
        .draw_series(LineSeries::new([(0, ceiling), (rows.len(), ceiling)], RED.stroke_width(2)))?
        .label(format!("read ceiling {ceiling:.2} TB/s"))
        .legend(|(x, y)| PathElement::new([(x, y), (x + 20, y)], RED));
    chart.configure_series_labels().border_style(BLACK).draw()?;
    root.present()?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    fn row(name: &str, tb_s: f64, pct_of_ceiling: f64) -> BenchRow {
        BenchRow {
            name: name.into(),
            us: 10.0,
            tb_s,
            pct_of_ceiling,
            num_splits: 1,
            num_chunks: 8,
            launched_chunks: 8,
            path: "whole".into(),
            max_rel_err: None,
        }
    }

    #[test]
    fn replot_recovers_the_ceiling_from_saved_rows() {
        let row = |name: &str, tb_s: f64| row(name, tb_s, 100.0 * tb_s / 4.5);
        let dir = std::env::temp_dir().join(format!("paged-decode-replot-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let (json, svg) = (dir.join("rows.json"), dir.join("rows.svg"));
        let rows = [row("a", 4.0), row("b", 2.5), row("c", 0.5)];
        std::fs::write(&json, serde_json::to_string(&rows).unwrap()).unwrap();
        replot(&json, &svg, None).unwrap();
        let text = std::fs::read_to_string(&svg).unwrap();
        assert!(text.contains("read ceiling 4.50 TB/s"), "{text}");
        assert!(["a", "b", "c"].iter().all(|n| text.lines().any(|l| l.trim() == *n)), "{text}");
        std::fs::write(&json, "[]").unwrap();
        assert!(replot(&json, &svg, None).is_err());
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// Shapes past what the kernels address are refused before anything is allocated: a batch
    /// past `i32`, a `batch` that contradicts `lens`, a store of more than 2^32 - 1 rows.
    #[test]
    fn oversized_shapes_are_refused_before_allocation() {
        let shape =
            |batch: Option<usize>, kv_len: Option<usize>, lens: Option<Vec<usize>>, page: usize| Shape {
                name: "big".into(),
                batch,
                kv_len,
                lens,
                hq: 32,
                hkv: 8,
                d: 128,
                page,
                dtype: "f16".into(),
                kv_dtype: None,
                layout: None,
                soft_cap: None,
                window_left: None,
            };
        let invalid = |r: Result<ProblemSpec>| matches!(r, Err(Error::InvalidProblem(_)));
        assert!(invalid(shape(Some(1 << 61), Some(64), None, 16).spec()));
        assert!(invalid(shape(Some(3), None, Some(vec![1, 2]), 16).spec()));
        let huge = shape(None, None, Some(vec![2_000_000_000]), 1).spec().unwrap();
        assert!(matches!(HostProblem::<half::f16>::random(&huge), Err(Error::InvalidProblem(_))));
        let fits = shape(None, None, Some(vec![5, 0, 17]), 16).spec().unwrap();
        assert!(HostProblem::<half::f16>::random(&fits).is_ok());
    }

    /// The plot and re-plot take any rows and ceiling without panicking.
    #[test]
    fn plotting_never_panics() {
        let row = |tb_s: f64, pct: f64| row("r", tb_s, pct);
        let dir = std::env::temp_dir().join(format!("paged-decode-no-panic-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let svg = dir.join("plot.svg");
        let values = [f64::NAN, f64::INFINITY, f64::NEG_INFINITY, -1.0, 0.0, 1e300, f64::MAX, 4.5];
        for &ceiling in &values {
            let _ = plot(&svg, &[], ceiling);
            for &tb_s in &values {
                let _ = plot(&svg, &[row(tb_s, 50.0), row(1.0, tb_s)], ceiling);
                let json = dir.join("rows.json");
                std::fs::write(&json, serde_json::to_string(&[row(tb_s, ceiling)]).unwrap()).unwrap();
                let _ = replot(&json, &svg, None);
            }
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 512, failure_persistence: None, ..ProptestConfig::default() })]

        /// Any shape-table row gives a problem spec of its batch size without panicking.
        #[test]
        fn shape_rows_never_panic(
            batch in prop::option::of(0..5usize),
            kv_len in prop::option::of(any::<usize>()),
            lens in prop::option::of(prop::collection::vec(any::<usize>(), 0..5)),
            (hq, hkv, d, page) in (any::<usize>(), any::<usize>(), any::<usize>(), any::<usize>()),
            (layout, soft_cap, window_left) in (
                prop::option::of(prop::sample::select(vec!["HND", "NHD", "hnd", ""])),
                prop::option::of(any::<f32>()),
                prop::option::of(any::<i64>()),
            ),
        ) {
            let layout = layout.map(String::from);
            let shape = Shape {
                name: "s".into(), batch, kv_len, lens, hq, hkv, d, page, dtype: "f16".into(), kv_dtype: None, layout, soft_cap, window_left,
            };
            let Ok(spec) = shape.spec() else {
                let contradicts = matches!((batch, &shape.lens), (Some(b), Some(l)) if b != l.len());
                prop_assert!(contradicts || i32::try_from(shape.batch()).is_err());
                return Ok(());
            };
            prop_assert_eq!(spec.batch(), shape.lens.as_ref().map_or(batch.unwrap_or(0), |l| l.len()));
            let _ = spec.kv_bytes(paged_decode::ElementKind::BF16);
            let variant = shape.variant();
            let _ = spec.kv_bytes_window(paged_decode::ElementKind::F16, variant.window_left);
            let r = shape.kv_layout();
            prop_assert!(r.is_ok() || matches!(r, Err(Error::InvalidProblem(_))));
        }
    }
}
