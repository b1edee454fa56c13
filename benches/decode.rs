//! `cargo bench`: the shape-table benchmark (graph replay, median), by running `paged-decode
//! bench`. Set `PAGED_DECODE_SHAPES` to use another table and `PAGED_DECODE_BENCH_ARGS` for more
//! `bench` arguments (e.g. `--stable-page-table`, the scoreboards' launch); results go to
//! `target/bench.json` and `target/bench.svg`.

use std::path::PathBuf;
use std::process::{Command, ExitCode};

fn main() -> ExitCode {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let shapes = std::env::var_os("PAGED_DECODE_SHAPES")
        .map(PathBuf::from)
        .unwrap_or_else(|| root.join("benches/shapes.json"));
    let target = root.join("target");
    let status = Command::new(env!("CARGO_BIN_EXE_paged-decode"))
        .arg("bench")
        .arg("--shapes")
        .arg(shapes)
        .arg("--json")
        .arg(target.join("bench.json"))
        .arg("--plot")
        .arg(target.join("bench.svg"))
        .args(std::env::var("PAGED_DECODE_BENCH_ARGS").unwrap_or_default().split_whitespace())
        .status();
    match status {
        Ok(s) if s.success() => ExitCode::SUCCESS,
        Ok(_) => ExitCode::FAILURE,
        Err(e) => {
            eprintln!("error: running paged-decode: {e}");
            ExitCode::FAILURE
        }
    }
}
