//! The embedded PTX: both builds define exactly the entry points the host names, only the sm_90
//! build uses `griddepcontrol`, only the split entries carry the merge's ticket and
//! release/acquire count, and ptxas assembles each for its architecture with no spills, no stack
//! frame and a bounded amount of split-only code, and no `cp.async` of the machine code reads a
//! cache-policy descriptor nothing wrote.

#[path = "../host/cli/ptxas.rs"]
#[allow(dead_code)]
mod ptxas;
#[path = "../host/cli/inspect/sass.rs"]
#[allow(dead_code)]
mod sass;

use std::io::Write;

use paged_decode::ptx;

#[test]
fn ptx_declares_every_entry() {
    for cc in [(8, 0), (9, 0)] {
        let text = ptx::for_compute_capability(cc);
        let expected_entries = ptx::expected_entries(cc);
        assert!(text.contains(".target sm_"), "the embedded PTX is empty or not PTX");
        let mut entries = ptx::entries(text);
        for want in expected_entries.iter() {
            assert!(
                entries.contains(&want.as_str()),
                "entry {want} missing from the PTX (found {entries:?})"
            );
        }
        // ...and the host names every entry the kernels define, once.
        let mut expected: Vec<&str> = expected_entries.iter().map(String::as_str).collect();
        entries.sort_unstable();
        expected.sort_unstable();
        assert_eq!(entries, expected);
    }
    assert!(ptx::PTX_SM90.contains(".target sm_90"));
}

#[test]
fn only_the_sm90_build_uses_programmatic_launch() {
    assert!(!ptx::PTX.contains("griddepcontrol"), "the portable PTX must assemble for sm_80");
    assert!(ptx::PTX_SM90.contains("griddepcontrol.wait;"));
    assert!(ptx::PTX_SM90.contains("griddepcontrol.launch_dependents;"));
    assert!(ptx::supports_programmatic_launch((9, 0)) && !ptx::supports_programmatic_launch((8, 9)));
    // `allow_sm90a: false` loads the portable build everywhere.
    use paged_decode::ArchSku;
    assert_eq!(ptx::build_for_preference((9, 0), true), ArchSku::Sm90);
    assert_eq!(ptx::build_for_preference((9, 0), false), ArchSku::Sm80);
    assert_eq!(ptx::build_for_preference((8, 6), true), ArchSku::Sm80);
    assert_eq!(ptx::of_build(ArchSku::Sm80), ptx::PTX);
}

/// Machine code the split merge and the length-aware partition may add to an entry.
const SPLIT_CODE_BUDGET: u32 = 56 * 1024;

/// One embedded build assembled by ptxas: architecture, compute capability, ptxas's output.
type Assembled = (&'static str, (u32, u32), ptxas::Assembly);

/// Both builds assembled for their architectures, once for the tests that read them; `None`
/// without ptxas.
fn assemblies() -> Option<&'static [Assembled]> {
    static ASSEMBLIES: std::sync::OnceLock<Option<Vec<Assembled>>> = std::sync::OnceLock::new();
    let built = ASSEMBLIES.get_or_init(|| {
        let ptxas = ptxas::find()?;
        let build = |(arch, cc): (&'static str, (u32, u32))| {
            let assembly = ptxas::assemble(&ptxas, ptx::for_compute_capability(cc), arch, &[])
                .unwrap_or_else(|e| panic!("{e}"));
            (arch, cc, assembly)
        };
        Some([("sm_80", (8, 0)), ("sm_90", (9, 0))].into_iter().map(build).collect())
    });
    built.as_deref()
}

#[test]
fn ptxas_reports_no_spills_no_stack_and_bounded_split_code() {
    let Some(assemblies) = assemblies() else {
        let _ = writeln!(
            std::io::stderr().lock(),
            "SKIPPED ptxas check: ptxas not found; {}",
            ptxas::INSTALL_HINT
        );
        return;
    };
    for (arch, cc, assembly) in assemblies {
        let (arch, cc) = (*arch, *cc);
        let reports = ptxas::report_of(assembly, arch).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(reports.len(), ptx::expected_entries(cc).len(), "{arch}: one report per entry");
        for r in &reports {
            assert!(
                r.stack_frame_bytes == 0 && r.spill_store_bytes + r.spill_load_bytes == 0,
                "{arch} {}: {} bytes of stack frame, {} + {} bytes of spills",
                r.entry,
                r.stack_frame_bytes,
                r.spill_store_bytes,
                r.spill_load_bytes
            );
            // Every CTA of a split entry runs the partition at its start, and one CTA per KV head
            // the merge, each fetching that code cold: an 8-way unrolled partition (76 KiB more
            // than the unsplit entry) cost ~2 µs per CTA start in instruction-cache misses.
            // The lean split entries' unsplit counterpart is the lean entry of one KV head per CTA.
            let unsplit_of = |e: &str| e.replace("_lean_split_", "_lean_x1_").replace("_split_", "_");
            if let Some(unsplit) = r.entry.contains("_split_").then(|| unsplit_of(&r.entry)) {
                let base = reports.iter().find(|u| u.entry == unsplit).expect("unsplit entry");
                assert!(
                    r.code_bytes > 0 && r.code_bytes <= base.code_bytes + SPLIT_CODE_BUDGET,
                    "{arch} {}: {} bytes of code, {} more than {unsplit}; the partition and the merge may add {SPLIT_CODE_BUDGET}",
                    r.entry,
                    r.code_bytes,
                    r.code_bytes.saturating_sub(base.code_bytes)
                );
            }
        }
    }
}

/// ptxas can assemble a `cp.async` whose L2 policy it dropped into a copy that traps on the GPU
/// (see [`sass::copies_with_unwritten_descriptor`]); no entry of either build may hold one.
#[test]
fn every_copy_reads_a_written_cache_policy_descriptor() {
    let (Some(assemblies), Some(disassembler)) = (assemblies(), sass::Disassembler::find()) else {
        let _ = writeln!(
            std::io::stderr().lock(),
            "SKIPPED SASS copy-descriptor check: needs ptxas and a disassembler; {}; {}",
            ptxas::INSTALL_HINT,
            sass::INSTALL_HINT
        );
        return;
    };
    for (arch, _, assembly) in assemblies {
        let listing = disassembler.disassemble(&assembly.cubin, false).unwrap_or_else(|e| panic!("{e}"));
        let functions = sass::functions(&listing);
        let copies: usize = functions
            .iter()
            .map(|(_, code)| {
                code.lines()
                    .filter(|l| sass::instruction(l).is_some_and(|(op, _)| op.starts_with("LDGSTS")))
                    .count()
            })
            .sum();
        assert!(copies > 0, "{arch}: no LDGSTS in the listing; the check would pass vacuously");
        for (name, code) in &functions {
            let bad = sass::copies_with_unwritten_descriptor(code);
            assert!(
                bad.is_empty(),
                "{arch} {name}: {} copies read an unwritten L2-policy descriptor, e.g. {}",
                bad.len(),
                bad[0]
            );
        }
    }
}

#[test]
fn split_entries_merge_through_a_ticket_and_a_release_acquire_count() {
    const TICKET: &str = "atom.relaxed.gpu.global.add.u32";
    const PUBLISH: &str = "red.release.gpu.global.add.u32";
    const OBSERVE: &str = "ld.acquire.gpu.global.u32";
    for cc in [(8, 0), (9, 0)] {
        let bodies: Vec<_> = ptx::EntryModules::new(ptx::for_compute_capability(cc)).definitions().collect();
        assert_eq!(bodies.len(), ptx::expected_entries(cc).len());
        for (name, body) in bodies {
            let split = name.contains("_split_");
            for op in [TICKET, PUBLISH, OBSERVE] {
                assert_eq!(body.contains(op), split, "{name}: `{op}` belongs to the split merge only");
            }
            assert!(!body.contains("fence."), "{name}: the merge orders its writes through barriers");
        }
    }
}

/// Each entry loads as a module of its own (`ptx::EntryModules`, so that the driver compiles
/// only a plan's entries): the cut covers the whole text, each module defines its entry alone,
/// no module-scope variable would be split between modules, and ptxas assembles an entry's
/// module into the same machine code as the whole build's.
#[test]
fn every_entry_is_a_module_of_its_own() {
    for cc in [(8, 0), (9, 0)] {
        let text = ptx::for_compute_capability(cc);
        let modules = ptx::EntryModules::new(text);
        assert_eq!(modules.names().collect::<Vec<_>>(), ptx::entries(text));
        assert!(modules.shared_state().is_empty(), "module-scope state: {:?}", modules.shared_state());
        let mut covered = modules.shared_len();
        for name in modules.names() {
            let module = modules.module(name).expect("the entry's module");
            assert_eq!(ptx::entries(&module), [name]);
            assert!(module.contains(".address_size 64") && module.contains("DYN_SMEM"));
            covered += module.len() - modules.shared_len();
        }
        assert_eq!(covered, text.len(), "the entries and the shared text are the whole build");
        assert!(modules.shared_len() < 16 * 1024, "each module repeats {} bytes", modules.shared_len());
    }
    let Some(assemblies) = assemblies() else {
        let _ = writeln!(std::io::stderr().lock(), "SKIPPED ptxas comparison: {}", ptxas::INSTALL_HINT);
        return;
    };
    let ptxas = ptxas::find().expect("ptxas, as assemblies() found it");
    for (arch, cc, whole_build) in assemblies {
        let whole = ptxas::report_of(whole_build, arch).unwrap_or_else(|e| panic!("{e}"));
        let modules = ptx::EntryModules::new(ptx::for_compute_capability(*cc));
        for name in ["decode_mma_split_f16_d128", "decode_mma_lean_x4_bf16_d64", "schedule_chunks"] {
            let alone = ptxas::assemble(&ptxas, &modules.module(name).expect("entry"), arch, &[])
                .unwrap_or_else(|e| panic!("{e}"));
            let alone = ptxas::report_of(&alone, arch).unwrap_or_else(|e| panic!("{e}"));
            let in_build = whole.iter().find(|r| r.entry == name).expect("the entry's report");
            assert_eq!(alone.len(), 1, "{arch} {name}: one entry");
            assert_eq!(
                (alone[0].registers, alone[0].code_bytes),
                (in_build.registers, in_build.code_bytes),
                "{arch} {name}: registers and code bytes alone and in the whole build"
            );
        }
    }
}
