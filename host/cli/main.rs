//! `paged-decode`: the main job (a realistic decode step), PTX inspection and the benchmark.

mod bench;
mod inspect;
// Shared with the GPU and property tests, which use the rest of it.
#[allow(dead_code)]
mod problem;
mod ptxas;
mod sweep;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use half::f16;
use paged_decode::{BatchPagedDecodePlan, Device, Element, Error, PlanPreference};
use problem::{DeviceProblem, HostProblem, ProblemSpec, compare_request};

#[derive(Parser)]
#[command(version, about = "Batched paged-KV decode attention in pure Rust (PTX from rustc's NVPTX backend)")]
struct Cli {
    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(Subcommand)]
enum Command {
    /// Run one realistic decode step, check it against the CPU reference and time it (default).
    Run {
        #[arg(long, default_value_t = 32)]
        batch: usize,
        #[arg(long, default_value_t = 4096)]
        kv_len: usize,
    },
    /// The kernels as a tuner reads them, without a GPU: per entry, ptxas resources, occupancy of
    /// the plan's launch configurations and the instruction mix for sm_80 and sm_90; SASS
    /// listings, a JSON report and its diff against a baseline, and a source-mapped view.
    Inspect {
        /// Print the PTX itself (one entry with `--entry`): the build that `--arch` loads.
        #[arg(long, conflicts_with_all = ["sass", "json", "diff", "source"])]
        ptx: bool,
        /// Print the SASS ptxas makes for `--arch` (one entry with `--entry`); needs ptxas and
        /// nvdisasm or cuobjdump. With `--source`: map the SASS instead of the PTX.
        #[arg(long, conflicts_with_all = ["json", "diff"])]
        sass: bool,
        /// Build and target of `--ptx`, `--sass` and `--source` (`sm_80`: the portable build).
        #[arg(long, default_value = "sm_90", value_parser = ["sm_80", "sm_86", "sm_89", "sm_90"])]
        arch: String,
        /// One entry point: in detail (widths, SASS mix, each launch), or the PTX / SASS of it.
        #[arg(long, value_name = "NAME", conflicts_with_all = ["json", "diff", "source"])]
        entry: Option<String>,
        /// Write the machine-readable report of both builds here (SASS mix when a
        /// disassembler is found).
        #[arg(long, value_name = "OUT")]
        json: Option<PathBuf>,
        /// Compare this build with a report written by `--json` (the repository keeps
        /// docs/inspect-baseline.json); fails only if an entry spills or has a stack frame
        /// beyond the baseline's.
        #[arg(long, value_name = "BASELINE")]
        diff: Option<PathBuf>,
        /// Show ENTRY's PTX (its SASS with `--sass`) under the Rust lines it comes from; needs a
        /// build with PAGED_DECODE_BUILD_PTX=1 PAGED_DECODE_PTX_LINEINFO=1.
        #[arg(long, value_name = "ENTRY", conflicts_with_all = ["json", "diff"])]
        source: Option<String>,
        /// With `--source`: only the code of one Rust function (`NAME`, inlined callees included)
        /// or lines (`decode.rs:300-360`, `decode.rs:312`).
        #[arg(long, value_name = "REGION", requires = "source")]
        region: Option<String>,
    },
    /// Time the plan on a shape table (FlashInfer harness format) with CUDA-graph replays.
    Bench {
        #[arg(long, default_value = "benches/shapes.json")]
        shapes: PathBuf,
        /// Write `[{name, us, tb_s, pct_of_ceiling}]` here.
        #[arg(long)]
        json: Option<PathBuf>,
        /// Write an SVG plot of TB/s per shape against the measured ceiling here.
        #[arg(long)]
        plot: Option<PathBuf>,
        /// Also check every shape's output against the CPU reference (slow for large shapes).
        #[arg(long)]
        check: bool,
        /// Launch without programmatic dependent launch (on by default on sm_90+).
        #[arg(long)]
        no_programmatic_launch: bool,
        /// Let the CTAs read the page table before waiting for the previous kernel
        /// (`PlanPreference::stable_page_table`); the timed graph holds only the plan's own
        /// launches, which do not write it.
        #[arg(long)]
        stable_page_table: bool,
        /// Chunks per request instead of the plan's rule (1..=64; tuning).
        #[arg(long)]
        splits: Option<u32>,
        /// Spare chunks for long requests instead of the plan's rule (tuning).
        #[arg(long)]
        spare: Option<u32>,
        /// Unused page-table slots after the batch's (a buffer sized for a larger batch).
        #[arg(long, default_value_t = 0)]
        indices_slack: usize,
        /// Largest page-table tokens per request for the lean kernel (0: off; tuning).
        #[arg(long)]
        lean_tokens: Option<u32>,
        /// Most KV heads of a request per lean CTA (1: one; tuning).
        #[arg(long)]
        stack: Option<u32>,
        /// Most CTAs of a launch that guesses its page lookup (default launch; 0: never; tuning).
        #[arg(long)]
        guess_ctas: Option<u32>,
        /// Spare chunks of the lean kernel's scheduled partition (0: whole requests; tuning).
        #[arg(long)]
        lean_spare: Option<u32>,
        /// Precede each timed call by a 1 MiB device-to-device copy (a graph node no launch
        /// overlaps), and subtract the copies' own time: each decode then follows an unrelated
        /// operation, not the decode before it (FlashInfer's harness: PAGED_DECODE_SEPARATED=1).
        #[arg(long)]
        separated: bool,
        /// As `--separated`, with a 128 MiB copy: L2 then holds none of the decode's data, as
        /// when a model's other layers run between two decodes of one layer (FlashInfer's
        /// harness: PAGED_DECODE_SEPARATED=1 PAGED_DECODE_SEPARATOR_BYTES=134217728).
        #[arg(long, conflicts_with = "separated")]
        cold_l2: bool,
        /// As `--cold-l2`, with our read kernel over 128 MiB instead of a copy: L2 then holds
        /// clean lines of another buffer, as after a GEMM that read its weights, not dirty ones
        /// (FlashInfer's harness: PAGED_DECODE_SEPARATED=1 PAGED_DECODE_SEPARATOR_BYTES=134217728
        /// PAGED_DECODE_SEPARATOR_KIND=read).
        #[arg(long, conflicts_with_all = ["separated", "cold_l2"])]
        clean_l2: bool,
        /// Precede each timed call (after its separator, if one is named) by our append of one
        /// token per request into the same store, as a serving step appends the new token before
        /// the decode, and subtract the appends' own time (a graph of them alone): the decode's
        /// share of the step, with what it overlaps of the append (FlashInfer's harness:
        /// PAGED_DECODE_AFTER_APPEND=1, with FlashInfer's append).
        #[arg(long)]
        after_append: bool,
        /// Give each plan its row's longest length as the bound on the longest request
        /// (`set_max_kv_len`), as a serving step that knows it. Without it (the scoreboards) the
        /// plan chooses from the descriptor and the page table's shape alone.
        #[arg(long)]
        max_kv_len: bool,
    },
    /// The scaling view: a table and a log–log SVG of µs per request and TB/s over a batch ×
    /// length grid (`benches/sweep-shapes.json`), ours and FlashInfer's, from saved results.
    PlotSweep {
        /// The grid's shape table.
        #[arg(long, default_value = "benches/sweep-shapes.json")]
        shapes: PathBuf,
        /// Our rows (`bench --shapes <grid> --json`).
        #[arg(long)]
        ours: PathBuf,
        /// FlashInfer's rows (the anchor harness's `--out`).
        #[arg(long)]
        flashinfer: Option<PathBuf>,
        /// The SVG to write.
        #[arg(long)]
        out: PathBuf,
        /// Read ceiling in TB/s (default: recovered from our rows).
        #[arg(long)]
        ceiling: Option<f64>,
    },
    /// Re-plot saved bench results (`bench --json`) as SVG, without a GPU.
    Plot {
        /// Result rows written by `bench --json`.
        json: PathBuf,
        /// The SVG to write.
        #[arg(long)]
        out: PathBuf,
        /// Read ceiling in TB/s (default: recovered from the rows' `pct_of_ceiling`).
        #[arg(long)]
        ceiling: Option<f64>,
    },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command.unwrap_or(Command::Run { batch: 32, kv_len: 4096 }) {
        Command::Run { batch, kv_len } => main_job(batch, kv_len),
        Command::Inspect { ptx, sass, arch, entry, json, diff, source, region } => {
            inspect::run(&inspect::Options { ptx, sass, arch, entry, json, diff, source, region })
        }
        Command::Plot { json, out, ceiling } => bench::replot(&json, &out, ceiling),
        Command::PlotSweep { shapes, ours, flashinfer, out, ceiling } => {
            sweep::plot_sweep(&shapes, &ours, flashinfer.as_deref(), &out, ceiling)
        }
        Command::Bench {
            shapes,
            json,
            plot,
            check,
            no_programmatic_launch,
            stable_page_table,
            splits,
            spare,
            indices_slack,
            lean_tokens,
            stack,
            guess_ctas,
            lean_spare,
            separated,
            cold_l2,
            clean_l2,
            after_append,
            max_kv_len,
        } => bench::run_cli(&bench::BenchOptions {
            shapes,
            json,
            plot,
            check,
            programmatic_launch: !no_programmatic_launch,
            stable_page_table,
            num_splits: splits,
            spare_chunks: spare,
            indices_slack,
            lean_max_avg_tokens: lean_tokens,
            max_stacked_kv_heads: stack,
            guess_max_ctas: guess_ctas,
            lean_spare_chunks: lean_spare,
            separator: if clean_l2 {
                Some(bench::Separator::Read(bench::COLD_L2_SEPARATOR_BYTES))
            } else if cold_l2 {
                Some(bench::Separator::Copy(bench::COLD_L2_SEPARATOR_BYTES))
            } else if separated {
                Some(bench::Separator::Copy(bench::SEPARATOR_BYTES))
            } else {
                None
            },
            after_append,
            max_kv_len,
        }),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

/// Decode step of a 32/8-head, d=128 f16 model over 16-token pages.
fn main_job(batch: usize, kv_len: usize) -> Result<(), Box<dyn std::error::Error>> {
    let spec = ProblemSpec::uniform(batch, kv_len, 32, 8, 128, 16);
    // SAFETY: all work below is issued on `device.stream` alone (one stream orders every use and
    // free), and the captured graph is dropped before the buffers it uses.
    let device = match unsafe { Device::open_untracked(0) } {
        Ok(d) => d,
        Err(Error::NoDevice) => {
            println!(
                "no CUDA driver or GPU on this machine: running the float64 CPU reference on a smaller problem"
            );
            let small = ProblemSpec::uniform(4, 256, 32, 8, 128, 16);
            let host = HostProblem::<f16>::random(&small)?;
            let t = std::time::Instant::now();
            let out = host.reference()?;
            println!(
                "cpu reference: batch 4 × 256 tokens, 32/8 heads, d=128, f16: {:.1} ms, lse[0] = {:.4}",
                t.elapsed().as_secs_f64() * 1e3,
                out.lse[0]
            );
            return Ok(());
        }
        Err(e) => return Err(e.into()),
    };
    println!("device: {}", device.name()?);
    let host = HostProblem::<f16>::random(&spec)?;
    let plan = BatchPagedDecodePlan::<f16>::select(&device.stream, &host.desc, PlanPreference::default())?;
    let mut dev = DeviceProblem::upload(&device.stream, &host, plan.workspace_size())?;
    {
        let (mut args, mut ws) = dev.args_and_workspace();
        plan.run(&device.stream, &mut ws, &mut args)?;
    }
    let o = device.stream.clone_dtoh(&dev.o)?;
    let lse = device.stream.clone_dtoh(&dev.lse)?;

    // Check a sample of requests against the float64 reference.
    let sample = [0, batch / 2, batch - 1];
    let (heads, row) = (spec.num_qo_heads, spec.num_qo_heads * spec.head_dim);
    let mut worst: f64 = 0.0;
    for &b in &sample {
        let r = host.reference_request(b)?;
        let (o_b, lse_b) = (&o[b * row..(b + 1) * row], &lse[b * heads..(b + 1) * heads]);
        worst = worst.max(compare_request(&spec, b, (o_b, lse_b), (&r.o, &r.lse))?);
    }
    println!("checked requests {sample:?} against the CPU reference: max rel err {worst:.2e}");

    let timing = bench::time_plan(&device, &plan, &mut dev, host.scales, bench::GraphTiming::BACK_TO_BACK)?;
    let bytes = spec.kv_bytes(f16::KIND) as f64;
    println!(
        "decode b{batch} L{kv_len} 32/8 d128 p16 f16: {:.1} µs per call ({} splits), {:.2} TB/s",
        timing.us,
        plan.config().num_splits,
        bytes / timing.us / 1e6
    );
    Ok(())
}
