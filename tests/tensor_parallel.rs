//! Tensor-parallel decode over as many visible GPUs as divide the 8 KV heads, with NCCL
//! (`--features nccl`): runs when two GPUs and libnccl are present, and prints a skip line
//! otherwise. It shards uniform problems' KV heads over the GPUs as `examples/tensor_parallel.rs`
//! does, and requires the single-GPU decode of the whole problem and every GPU's gathered output
//! (NaN until written) to match the float64 reference.
#![cfg(feature = "nccl")]

#[path = "../examples/common/mod.rs"]
mod common;

use std::io::Write;

use common::tensor_parallel::{HostDecode, compare, open_all};
use common::{TOLERANCE, within_tolerance};

#[test]
fn sharded_decode_matches_one_gpu() {
    let test = "sharded_decode_matches_one_gpu";
    let skip = |why: &str| {
        let _ = writeln!(std::io::stderr().lock(), "SKIPPED {test}: {why}");
    };
    let Some(devices) = open_all(test).unwrap() else { return skip("fewer than two GPUs or no driver") };
    if !common::tensor_parallel::nccl_present() {
        return skip("libnccl.so not found (scripts/nccl-library-path)");
    }
    for (batch, len) in [(8, 1000), (1, 5000), (3, 17)] {
        let report = compare(&devices, &HostDecode::random(batch, len, 5 + batch as u64), 3).unwrap();
        println!(
            "batch {batch} × {len} tokens on {} GPUs: worst error {:.2e}",
            devices.len(),
            report.worst_error
        );
        within_tolerance(report.worst_error)
            .unwrap_or_else(|e| panic!("batch {batch} × {len}: {e} (≤ {TOLERANCE:.0e})"));
    }
}
