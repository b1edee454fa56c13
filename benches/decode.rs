//! `cargo bench`: the shape-table benchmark (graph replay, median), same as `paged-decode bench`.
//! Set `PAGED_DECODE_SHAPES` to use another table; results go to `target/bench.json` and
//! `target/bench.svg`.

use std::path::PathBuf;

use paged_decode::bench::{BenchOptions, run_cli};

fn main() {
    let shapes = std::env::var_os("PAGED_DECODE_SHAPES")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("benches/shapes.json"));
    let target = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("target");
    let opts = BenchOptions {
        shapes,
        json: Some(target.join("bench.json")),
        plot: Some(target.join("bench.svg")),
        check: false,
        programmatic_launch: true,
        num_splits: None,
        spare_chunks: None,
        indices_slack: 0,
        lean_max_avg_tokens: None,
    };
    if let Err(e) = run_cli(&opts) {
        eprintln!("error: {e}");
        std::process::exit(1);
    }
}
