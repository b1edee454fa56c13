//! `inspect` without ptxas or a disassembler: every view still runs, says what it leaves out and
//! how to get the tool; bad input gets an error message, not a panic.

#[path = "../host/cli/ptxas.rs"]
#[allow(dead_code)]
mod ptxas;

use std::process::Command;

/// Runs `paged-decode inspect ARGS` with ptxas, nvdisasm and cuobjdump hidden: (success,
/// stdout + stderr).
fn inspect_without_tools(args: &[&str]) -> (bool, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_paged-decode"))
        .arg("inspect")
        .args(args)
        .env("PTXAS", "/nonexistent/ptxas")
        .env("NVDISASM", "/nonexistent/nvdisasm")
        .env("CUOBJDUMP", "/nonexistent/cuobjdump")
        .output()
        .expect("running the paged-decode binary");
    let text = String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    assert!(!text.contains("panicked"), "inspect {args:?} panicked:\n{text}");
    (out.status.success(), text)
}

const BASELINE: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/docs/inspect-baseline.json");

#[test]
fn summary_and_entry_views_work_without_ptxas() {
    let (ok, text) = inspect_without_tools(&[]);
    assert!(ok && text.contains(ptxas::INSTALL_HINT), "{text}");
    assert!(text.contains("PTX instruction mix") && text.contains("decode_mma_f16_d128"), "{text}");
    let (ok, text) = inspect_without_tools(&["--entry", "decode_mma_f16_d128"]);
    assert!(ok && text.contains(ptxas::INSTALL_HINT) && text.contains("ldmatrix"), "{text}");
    let (ok, text) = inspect_without_tools(&["--ptx", "--entry", "append_f16", "--arch", "sm_80"]);
    assert!(ok && text.starts_with(".visible .entry append_f16(") && !text.contains("append_bf16"), "{text}");
}

#[test]
fn sass_and_source_views_say_what_they_need() {
    let (ok, text) = inspect_without_tools(&["--sass", "--entry", "decode_mma_f16_d64"]);
    assert!(ok && text.contains("ptxas not found") && text.contains(ptxas::INSTALL_HINT), "{text}");
    let (ok, text) = inspect_without_tools(&["--source", "decode_mma_f16_d64"]);
    let line_info = paged_decode::ptx::PTX_SM90.lines().any(|l| l.trim_start().starts_with(".loc\t"));
    if line_info {
        assert!(ok && text.contains("instructions selected"), "{text}");
    } else {
        assert!(!ok && text.contains("PAGED_DECODE_PTX_LINEINFO=1"), "{text}");
    }
}

#[test]
fn json_and_diff_work_without_ptxas() {
    let path = std::env::temp_dir().join(format!("paged-decode-inspect-{}.json", std::process::id()));
    let out = path.to_str().unwrap();
    let (ok, text) = inspect_without_tools(&["--json", out]);
    assert!(ok && text.contains("note: ptxas not found"), "{text}");
    let (self_ok, self_diff) = inspect_without_tools(&["--diff", out]);
    let _ = std::fs::remove_file(&path);
    assert!(self_ok && self_diff.contains("no differences"), "{self_diff}");
    // Against the repository's baseline (made with ptxas; not in the published package): only
    // what both sides measured is compared.
    if std::path::Path::new(BASELINE).is_file() {
        let (ok, text) = inspect_without_tools(&["--diff", BASELINE]);
        assert!(ok && text.contains("baseline: ptxas") && text.contains("current:  no ptxas"), "{text}");
    }
}

#[test]
fn bad_input_gets_an_error() {
    for (args, expected) in [
        (&["--entry", "no_such_entry"][..], "no entry `no_such_entry`"),
        (&["--sass", "--entry", "no_such_entry"][..], "no entry `no_such_entry`"),
        (&["--diff", "/nonexistent/baseline.json"][..], "reading /nonexistent/baseline.json"),
        (&["--diff", env!("CARGO_MANIFEST_DIR")][..], "reading"),
        (&["--source", "no_such_entry"][..], "no entry `no_such_entry`"),
    ] {
        let (ok, text) = inspect_without_tools(args);
        assert!(!ok && text.contains(expected), "inspect {args:?}:\n{text}");
    }
    let not_a_report = concat!(env!("CARGO_MANIFEST_DIR"), "/Cargo.toml");
    let (ok, text) = inspect_without_tools(&["--diff", not_a_report]);
    assert!(!ok && text.contains("not an inspect report"), "{text}");
}
