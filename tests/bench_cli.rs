//! `bench`'s timing modes on the command line: each separator flag is accepted alone or with
//! `--after-append` (and `--max-kv-len` with either), and two separators at once are refused as
//! a usage error (clap's exit status 2) before any device work.

use std::process::{Command, Output};

/// Runs `paged-decode bench ARGS` on a shape table that does not exist, so that a run whose
/// arguments parse stops at its first step (no device, or the missing table) with status 1.
fn bench(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_paged-decode"))
        .arg("bench")
        .args(["--shapes", "/nonexistent/shapes.json"])
        .args(args)
        .output()
        .expect("running the paged-decode binary")
}

fn text(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr)
}

#[test]
fn each_separator_flag_parses() {
    for flag in [
        &[][..],
        &["--separated"],
        &["--cold-l2"],
        &["--clean-l2"],
        &["--after-append"],
        &["--clean-l2", "--after-append"],
        &["--separated", "--after-append"],
        &["--max-kv-len"],
        &["--clean-l2", "--after-append", "--max-kv-len"],
    ] {
        let out = bench(flag);
        let text = text(&out);
        assert!(!text.contains("panicked"), "bench {flag:?} panicked:\n{text}");
        assert_eq!(out.status.code(), Some(1), "bench {flag:?} should fail past parsing:\n{text}");
        assert!(text.starts_with("error: "), "bench {flag:?}: {text}");
    }
}

#[test]
fn two_separators_are_a_usage_error() {
    for flags in [["--separated", "--cold-l2"], ["--separated", "--clean-l2"], ["--cold-l2", "--clean-l2"]] {
        let out = bench(&flags);
        let text = text(&out);
        assert_eq!(out.status.code(), Some(2), "bench {flags:?} should be refused:\n{text}");
        assert!(text.contains("cannot be used with"), "bench {flags:?}: {text}");
    }
}
