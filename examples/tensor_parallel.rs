//! Tensor-parallel decode across the visible GPUs (at least two; as many as divide the 8 KV
//! heads), with NCCL: each GPU holds its share of the KV heads of one paged cache (and the query
//! heads of their groups), decodes it with its own plan and stream, and an all-gather assembles
//! `o` and `lse` on every GPU. The
//! result is checked against a single-GPU decode of the whole problem, and the step time is
//! compared with it for a bandwidth-bound shape (b64-L8k) and a latency-bound one (b1-L32k).
//!
//! `cargo run --release --features nccl --example tensor_parallel`
//!
//! NCCL is loaded at run time (cudarc's dynamic loading) as `libnccl.so`, found through the
//! loader's search path. Machines with PyTorch have it inside the Python environment (the
//! `nvidia-nccl-cu12` / `-cu13` wheels ship `nvidia/nccl/lib/libnccl.so.2`);
//! `scripts/nccl-library-path` prints a directory holding a `libnccl.so` link to it, for
//! `LD_LIBRARY_PATH`. Without a driver, fewer than two GPUs or no NCCL, the example says so and
//! exits 0.

mod common;

use std::process::ExitCode;

use common::tensor_parallel::{HostDecode, compare, open_all};
use common::{TOLERANCE, exit_code, within_tolerance};

/// (name, batch, tokens per request).
const SHAPES: [(&str, usize, usize); 2] = [("b64-L8k-32/8-d128", 64, 8192), ("b1-L32k-32/8-d128", 1, 32768)];
const STEPS: usize = 50;

fn main() -> ExitCode {
    exit_code("tensor-parallel example", run())
}

fn run() -> Result<(), Box<dyn std::error::Error>> {
    let Some(devices) = open_all("tensor-parallel example")? else { return Ok(()) };
    if !common::tensor_parallel::nccl_present() {
        println!("tensor-parallel example: libnccl.so not found; see `scripts/nccl-library-path`");
        return Ok(());
    }
    println!("tensor-parallel example: {} GPUs ({})", devices.len(), devices[0].name()?);
    for (name, batch, len) in SHAPES {
        let report = compare(&devices, &HostDecode::random(batch, len, 11), STEPS)?;
        within_tolerance(report.worst_error)?;
        println!(
            "{name}: 1 GPU {:.1} µs per step, {} GPUs {:.1} µs (decode + all-gather), speedup {:.2}; every \
             GPU's gathered output, and the single-GPU one, match the float64 reference (worst error \
             {:.2e} ≤ {TOLERANCE:.0e})",
            report.single_us,
            devices.len(),
            report.parallel_us,
            report.single_us / report.parallel_us,
            report.worst_error
        );
    }
    Ok(())
}
