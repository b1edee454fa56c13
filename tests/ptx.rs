//! The embedded PTX: every entry point is there, and ptxas assembles it for sm_80 and sm_90
//! with no spills and no stack frame.

use std::io::Write;

use paged_decode::{ptx, ptxas};

#[test]
fn ptx_declares_every_entry() {
    assert!(ptx::PTX.contains(".target sm_"), "the embedded PTX is empty or not PTX");
    let entries = ptx::entries(ptx::PTX);
    for want in ptx::EXPECTED_ENTRIES {
        assert!(entries.contains(want), "entry {want} missing from the PTX (found {entries:?})");
    }
}

#[test]
fn ptxas_reports_no_spills_and_no_stack() {
    let Some(ptxas) = ptxas::find() else {
        let _ = writeln!(
            std::io::stderr().lock(),
            "SKIPPED ptxas check: ptxas not found; {}",
            ptxas::INSTALL_HINT
        );
        return;
    };
    for arch in ["sm_80", "sm_90"] {
        let reports = ptxas::report(&ptxas, ptx::PTX, arch).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(reports.len(), ptx::EXPECTED_ENTRIES.len(), "{arch}: one report per entry");
        for r in &reports {
            assert_eq!(
                (r.stack_frame_bytes, r.spill_store_bytes, r.spill_load_bytes),
                (0, 0, 0),
                "{arch} {}: stack frame / spills",
                r.entry
            );
        }
    }
}
