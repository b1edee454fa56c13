//! `inspect`: what the compiler made of the kernels, on a machine without a GPU. ptxas
//! resources, occupancy of the plan's launch configurations, PTX and SASS instruction mix,
//! SASS listings, a JSON report and its diff against a baseline, and a source-mapped view.
//! ptxas and a disassembler are optional: without them each view says what it leaves out and
//! how to get the tool.

mod diff;
mod mix;
mod occupancy;
mod ptx_text;
mod report;
mod sass;
mod source;

#[path = "../../../kernels-gpu/src/params.rs"]
#[allow(dead_code)]
mod params;

use std::collections::BTreeSet;
use std::error::Error;
use std::fmt::Write;
use std::path::PathBuf;

use paged_decode::ptx;

use crate::ptxas;
use report::{EntryReport, Report, Tools};
use sass::Disassembler;

/// What `inspect` was asked for (see the subcommand's help in `main.rs`).
pub struct Options {
    /// Print the PTX (`--ptx`).
    pub ptx: bool,
    /// Print the SASS (`--sass`), or with `source` map the SASS instead of the PTX.
    pub sass: bool,
    /// The build and target of `--ptx`, `--sass` and `--source`.
    pub arch: String,
    /// One entry only.
    pub entry: Option<String>,
    /// Write the report here.
    pub json: Option<PathBuf>,
    /// Compare with this report.
    pub diff: Option<PathBuf>,
    /// Source view of this entry.
    pub source: Option<String>,
    /// Region of the source view.
    pub region: Option<String>,
}

type Result<T> = std::result::Result<T, Box<dyn Error>>;

/// Runs `inspect` with `options`.
pub fn run(options: &Options) -> Result<()> {
    if let Some(entry) = &options.source {
        return source_view(entry, options);
    }
    if options.ptx {
        return print_ptx(options);
    }
    if options.sass {
        return print_sass(options);
    }
    if options.json.is_some() || options.diff.is_some() {
        return write_and_compare(options);
    }
    match &options.entry {
        Some(entry) => entry_view(entry),
        None => summary(),
    }
}

/// The PTX build a device of `arch` loads (`sm_86` → the portable build).
fn ptx_for(arch: &str) -> &'static str {
    let digits: Vec<u32> = arch.chars().filter_map(|c| c.to_digit(10)).collect();
    let cc = (digits.first().copied().unwrap_or(8), digits.get(1).copied().unwrap_or(0));
    ptx::for_compute_capability(cc)
}

fn print_ptx(options: &Options) -> Result<()> {
    let text = ptx_for(&options.arch);
    match &options.entry {
        Some(entry) => print!("{}", ptx_text::find_entry(text, entry)?.text),
        None => print!("{text}"),
    }
    Ok(())
}

/// `--sass`: the SASS of one entry (or all) for `--arch`, each followed by its mix.
fn print_sass(options: &Options) -> Result<()> {
    let text = ptx_for(&options.arch);
    if let Some(entry) = &options.entry {
        ptx_text::find_entry(text, entry)?;
    }
    let Some(ptxas) = ptxas::find() else {
        println!("ptxas not found, so no SASS: {}", ptxas::INSTALL_HINT);
        return Ok(());
    };
    let Some(disassembler) = Disassembler::find() else {
        println!("no SASS disassembler found: {}", sass::INSTALL_HINT);
        return Ok(());
    };
    let assembly = ptxas::assemble(&ptxas, text, &options.arch, &[])?;
    let listing = disassembler.disassemble(&assembly.cubin, false)?;
    let ptxas_version = ptxas::version(&ptxas).unwrap_or_default();
    for (name, code) in sass::functions(&listing) {
        if options.entry.as_ref().is_some_and(|e| *e != name) {
            continue;
        }
        println!("// {name}: {} SASS ({}, ptxas {})", options.arch, disassembler.describe(), ptxas_version);
        print!("{code}");
        println!("// {name} SASS mix: {}", mix::one_line(&mix::sass_mix(&code)));
        let unwritten = sass::copies_with_unwritten_descriptor(&code);
        if !unwritten.is_empty() {
            println!(
                "// {name}: {} copies read an L2-policy descriptor nothing writes (they trap on the GPU), first: {}",
                unwritten.len(),
                unwritten[0]
            );
        }
        println!();
    }
    Ok(())
}

/// `--json` and `--diff`: the full report (both builds, SASS mix when a disassembler is
/// found), written and/or compared; lists the entries that spill or have a stack frame, and
/// fails only if one has more of either than the baseline (`tests/ptx.rs` allows none).
fn write_and_compare(options: &Options) -> Result<()> {
    let tools = Tools::find(true);
    for line in tools.missing() {
        println!("note: {line}");
    }
    let report = report::build(&tools)?;
    if let Some(path) = &options.json {
        report.write(path)?;
        let entries: usize = report.builds.iter().map(|b| b.entries.len()).sum();
        println!("wrote {} ({entries} entry builds)", path.display());
    }
    let spilling = report.spills_and_stack();
    if !spilling.is_empty() {
        println!("spills or a stack frame:\n  {}", spilling.join("\n  "));
    }
    if let Some(path) = &options.diff {
        let base = Report::read(path)?;
        println!("inspect diff: {} → this build", path.display());
        let diffs = diff::diff(&base, &report);
        print!("{}", diff::render(&base, &report, &diffs));
        let worse: Vec<String> = diffs
            .iter()
            .flat_map(|d| {
                d.rows.iter().filter(|r| r.is_regression()).map(move |r| {
                    format!(
                        "{} {}: {} {} → {}",
                        d.arch,
                        d.entry,
                        r.metric,
                        r.old.unwrap_or(0),
                        r.new.unwrap_or(0)
                    )
                })
            })
            .collect();
        if !worse.is_empty() {
            return Err(format!("more spills or stack than the baseline:\n  {}", worse.join("\n  ")).into());
        }
    }
    Ok(())
}

/// The default view: resources, occupancy and PTX mix of every entry.
fn summary() -> Result<()> {
    let tools = Tools::find(false);
    let report = report::build(&tools)?;
    println!(
        "{} entry points in the sm_90 PTX ({} bytes), {} in the portable build ({} bytes)",
        ptx::entries(ptx::PTX_SM90).len(),
        ptx::PTX_SM90.len(),
        ptx::entries(ptx::PTX).len(),
        ptx::PTX.len()
    );
    match &tools.ptxas {
        Some(path) => println!("ptxas: {}", path.display()),
        None => println!("ptxas not found (no resources or occupancy): {}", ptxas::INSTALL_HINT),
    }
    let [b80, b90] = [&report.builds[0], &report.builds[1]];
    if tools.ptxas.is_some() {
        print!("{}", resource_table(b80, b90));
        print!("\n{}", occupancy_table(b80, b90));
    }
    print!("\n{}", mix_table(b90));
    Ok(())
}

fn resource_table(b80: &report::Build, b90: &report::Build) -> String {
    let w = name_width(&[b80, b90]);
    let mut s = String::new();
    let title = format!("{:<w$} | {:^32} | {:^32}", "", "sm_80", "sm_90");
    let _ = writeln!(s, "{}", title.trim_end());
    let _ = writeln!(
        s,
        "{:<w$} | {:>5} {:>6} {:>6} {:>6} {:>5} | {:>5} {:>6} {:>6} {:>6} {:>5}",
        "entry", "regs", "smem", "stack", "spill", "code", "regs", "smem", "stack", "spill", "code"
    );
    for (name, e80, e90) in entries_by_name(b80, b90) {
        let cols = |e: Option<&EntryReport>| match e.and_then(|e| e.resources.as_ref()) {
            Some(r) => format!(
                "{:>5} {:>6} {:>6} {:>6} {:>4}K",
                r.registers,
                r.static_smem_bytes,
                r.stack_frame_bytes,
                r.spill_store_bytes + r.spill_load_bytes,
                r.code_bytes.div_ceil(1024)
            ),
            None => format!("{:>32}", "-"),
        };
        let _ = writeln!(s, "{:<w$} | {} | {}", name, cols(e80), cols(e90));
    }
    let _ = writeln!(
        s,
        "- where a build has no such entry (the portable build has no 8-bit cache or guessing entries)"
    );
    let _ =
        writeln!(s, "smem is static shared memory; the decode kernels' is dynamic (see the occupancy table)");
    let _ = writeln!(s, "code is the entry's machine code in KiB (without the subroutines it calls)");
    s
}

/// One row per entry and run of launches with the same occupancy on both architectures.
fn occupancy_table(b80: &report::Build, b90: &report::Build) -> String {
    let w = name_width(&[b80, b90]);
    let mut s = String::new();
    let _ =
        writeln!(s, "occupancy per SM of the launch configurations the plan uses (CTAs, warps, limited by):");
    let _ = writeln!(
        s,
        "{:<w$} {:<13} {:>7} {:>15} | {:<34} | sm_90",
        "entry", "launch", "threads", "dyn smem", "sm_80"
    );
    for (name, e80, e90) in entries_by_name(b80, b90) {
        let pairs = launches_by_label(e80, e90);
        if pairs.is_empty() {
            let _ = writeln!(s, "{name:<w$} launch configuration unknown");
        }
        let same = |a: &LaunchPair, b: &LaunchPair| {
            occupancy_of(a.1) == occupancy_of(b.1) && occupancy_of(a.2) == occupancy_of(b.2)
        };
        for run in pairs.chunk_by(same) {
            let (first, last) = (run[0].0, run[run.len() - 1].0);
            let span = |f: fn(&report::LaunchReport) -> String| {
                if run.len() == 1 { f(first) } else { format!("{}..{}", f(first), f(last)) }
            };
            let label = span(|l| l.label.clone()).replace("..q_tiles=", "..");
            let smem = span(|l| l.dynamic_smem_bytes.to_string());
            let occupancy = |l: Option<&report::LaunchReport>| match occupancy_of(l) {
                Some(o) => format!("{:>2} {:>3}  {}", o.ctas_per_sm, o.warps_per_sm, o.limited_by),
                None => "-".into(),
            };
            let _ = writeln!(
                s,
                "{:<w$} {:<13} {:>7} {:>15} | {:<34} | {}",
                name,
                label,
                first.threads,
                smem,
                occupancy(run[0].1),
                occupancy(run[0].2)
            );
        }
    }
    let _ = writeln!(
        s,
        "dyn smem: params::mma_smem_bytes(tiling, head_dim, q_tiles), q_tiles = ceil(min(group, heads per CTA) / 16)"
    );
    s
}

/// Width of the entry-name column: the longest name of `builds`.
fn name_width(builds: &[&report::Build]) -> usize {
    builds.iter().flat_map(|b| &b.entries).map(|e| e.entry.len()).max().unwrap_or(0).max("entry".len())
}

/// Every entry of either build by name, in the sm_90 build's order (it holds every entry; one
/// only the portable build had would follow), with its report in each build where it has one.
fn entries_by_name<'r>(
    b80: &'r report::Build,
    b90: &'r report::Build,
) -> Vec<(&'r str, Option<&'r EntryReport>, Option<&'r EntryReport>)> {
    let find = |b: &'r report::Build, name: &str| b.entries.iter().find(|e| e.entry == name);
    let in_90 = b90.entries.iter().map(|e| (e.entry.as_str(), find(b80, &e.entry), Some(e)));
    let only_80 = b80
        .entries
        .iter()
        .filter(|e| find(b90, &e.entry).is_none())
        .map(|e| (e.entry.as_str(), Some(e), None));
    in_90.chain(only_80).collect()
}

/// A launch configuration of one entry: how either build describes it, and its report in the
/// portable and the sm_90 build.
fn occupancy_of(launch: Option<&report::LaunchReport>) -> Option<&occupancy::Occupancy> {
    launch.and_then(|l| l.occupancy.as_ref())
}

type LaunchPair<'r> =
    (&'r report::LaunchReport, Option<&'r report::LaunchReport>, Option<&'r report::LaunchReport>);

/// The launch configurations of an entry in either build, matched by label, in the order of the
/// build that lists more of them.
fn launches_by_label<'r>(e80: Option<&'r EntryReport>, e90: Option<&'r EntryReport>) -> Vec<LaunchPair<'r>> {
    let launches = |e: Option<&'r EntryReport>| e.map_or(&[][..], |e| &e.launches[..]);
    let (l80, l90) = (launches(e80), launches(e90));
    let by_label = |ls: &'r [report::LaunchReport], label: &str| ls.iter().find(|l| l.label == label);
    let order = if l90.len() >= l80.len() { l90 } else { l80 };
    order.iter().map(|l| (l, by_label(l80, &l.label), by_label(l90, &l.label))).collect()
}

fn mix_table(build: &report::Build) -> String {
    let w = name_width(&[build]);
    let mut s = String::new();
    let _ = writeln!(s, "{} PTX instruction mix (`--entry NAME` for widths and SASS):", build.arch);
    let mut header = format!("{:<w$}", "entry");
    for (_, title) in mix::SUMMARY {
        let _ = write!(header, " {title:>6}");
    }
    let _ = writeln!(s, "{header}");
    for e in &build.entries {
        let mut row = format!("{:<w$}", e.entry);
        for (family, _) in mix::SUMMARY {
            let _ = write!(row, " {:>6}", mix::family_count(&e.ptx_mix, family));
        }
        let _ = writeln!(s, "{row}");
    }
    s
}

/// `--entry NAME`: one entry in detail on both builds, SASS mix included when possible.
fn entry_view(entry: &str) -> Result<()> {
    // The sm_90 build holds every entry (the portable one lacks the 8-bit caches' entries).
    ptx_text::find_entry(ptx::PTX_SM90, entry)?;
    let tools = Tools::find(true);
    let report = report::build(&tools)?;
    let per_arch: Vec<(&str, &EntryReport)> = report
        .builds
        .iter()
        .filter_map(|b| Some((b.arch.as_str(), b.entries.iter().find(|e| e.entry == entry)?)))
        .collect();
    println!("{entry}");
    for line in tools.missing() {
        println!("note: {line}");
    }
    let mut header = format!("{:<24}", "");
    for (arch, _) in &per_arch {
        let _ = write!(header, " {arch:>10}");
    }
    println!("{header}");
    for (name, field) in report::RESOURCE_FIELDS {
        let mut row = format!("{name:<24}");
        for (_, e) in &per_arch {
            let value = e.resources.as_ref().map_or("-".to_string(), |r| field(r).to_string());
            let _ = write!(row, " {value:>10}");
        }
        println!("{row}");
    }
    println!("\nlaunch (threads, dyn smem)      occupancy per SM: CTAs, warps, limited by");
    let launches = per_arch.first().map_or(&[][..], |(_, e)| &e.launches[..]);
    for (i, launch) in launches.iter().enumerate() {
        let mut row = format!("{:<10} {:>4} {:>7}", launch.label, launch.threads, launch.dynamic_smem_bytes);
        for (arch, e) in &per_arch {
            let o = e.launches.get(i).and_then(|l| l.occupancy.as_ref());
            let text = o.map_or("-".into(), |o| {
                format!("{:>2} {:>3} {}", o.ctas_per_sm, o.warps_per_sm, o.limited_by)
            });
            let _ = write!(row, " | {arch}: {text:<26}");
        }
        println!("{}", row.trim_end());
    }
    println!("\n{}", mix_comparison(&per_arch));
    Ok(())
}

/// Every class of the entry's PTX and SASS mixes, one column per build and kind.
fn mix_comparison(per_arch: &[(&str, &EntryReport)]) -> String {
    let mut columns: Vec<(String, &mix::Mix)> = Vec::new();
    for (arch, e) in per_arch {
        columns.push((format!("PTX {arch}"), &e.ptx_mix));
    }
    for (arch, e) in per_arch {
        if let Some(m) = &e.sass_mix {
            columns.push((format!("SASS {arch}"), m));
        }
    }
    let mut classes: Vec<&String> =
        columns.iter().flat_map(|(_, m)| m.keys()).collect::<BTreeSet<_>>().into_iter().collect();
    classes.sort_by_key(|c| mix::display_order(c));
    let mut s = format!("{:<24}", "instruction mix");
    for (title, _) in &columns {
        let _ = write!(s, " {title:>10}");
    }
    s.push('\n');
    for class in classes {
        let _ = write!(s, "{class:<24}");
        for (_, m) in &columns {
            let _ = write!(s, " {:>10}", m.get(class).copied().unwrap_or(0));
        }
        s.push('\n');
    }
    s
}

/// `--source ENTRY [--region R] [--sass]`: the entry's PTX or SASS under its source lines.
fn source_view(entry: &str, options: &Options) -> Result<()> {
    let text = ptx_for(&options.arch);
    let span = ptx_text::find_entry(text, entry)?;
    let info = source::LineInfo::parse(text).ok_or(source::NO_LINE_INFO)?;
    let region = options.region.as_deref().map(|r| source::parse_region(r, &info)).transpose()?;
    let scope = options.region.as_deref().map_or(String::new(), |r| format!(", region {r}"));
    if !options.sass {
        let title = format!("{entry} ({} PTX{scope})", options.arch);
        print!("{}", source::render(&title, &source::ptx_items(&span, &info), region.as_deref(), false));
        return Ok(());
    }
    let Some(ptxas) = ptxas::find() else {
        println!("ptxas not found, so no SASS (the PTX view works without it): {}", ptxas::INSTALL_HINT);
        return Ok(());
    };
    let Some(disassembler) = Disassembler::find().filter(Disassembler::maps_ptx_lines) else {
        println!("mapping SASS to source needs nvdisasm: {}", sass::INSTALL_HINT);
        return Ok(());
    };
    let assembly = ptxas::assemble(&ptxas, text, &options.arch, &["-lineinfo"])?;
    let listing = disassembler.disassemble(&assembly.cubin, true)?;
    let functions = sass::functions(&listing);
    let code = functions.iter().find(|(name, _)| name == entry).map(|(_, code)| code.as_str()).unwrap_or("");
    let title = format!("{entry} ({} SASS{scope})", options.arch);
    print!("{}", source::render(&title, &source::sass_items(code, &info), region.as_deref(), true));
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use report::{Build, LaunchReport, Resources};

    fn entry(name: &str, registers: u32, labels: &[&str]) -> EntryReport {
        let resources = Resources {
            registers,
            static_smem_bytes: 0,
            stack_frame_bytes: 0,
            spill_store_bytes: 0,
            spill_load_bytes: 0,
            code_bytes: 2048,
        };
        let launch = |label: &&str| LaunchReport {
            label: label.to_string(),
            threads: 128,
            dynamic_smem_bytes: 1024,
            occupancy: Some(occupancy::Occupancy {
                ctas_per_sm: registers / 10,
                warps_per_sm: 4 * (registers / 10),
                limited_by: "registers".into(),
            }),
        };
        EntryReport {
            entry: name.into(),
            resources: Some(resources),
            launches: labels.iter().map(launch).collect(),
            ptx_mix: [("total".to_string(), 1)].into(),
            sass_mix: None,
        }
    }

    fn build(arch: &str, entries: Vec<EntryReport>) -> Build {
        Build { arch: arch.into(), entries }
    }

    /// The sm_90 build has entries the portable one lacks, ahead of shared ones: each row is
    /// one entry's numbers from both builds, never another entry's.
    #[test]
    fn the_tables_match_entries_and_launches_by_name() {
        let b80 = build("sm_80", vec![entry("shared", 40, &["q_tiles=1", "q_tiles=2"])]);
        let b90 = build(
            "sm_90",
            vec![
                entry("sm90_only_entry_with_a_long_name", 70, &["q_tiles=1"]),
                entry("shared", 50, &["q_tiles=2"]),
            ],
        );
        let rows = entries_by_name(&b80, &b90);
        let names: Vec<_> = rows.iter().map(|(n, a, b)| (*n, a.is_some(), b.is_some())).collect();
        assert_eq!(names, [("sm90_only_entry_with_a_long_name", false, true), ("shared", true, true)]);

        let resources = resource_table(&b80, &b90);
        let row = |text: &str, name: &str| text.lines().find(|l| l.starts_with(name)).unwrap().to_string();
        let shared = row(&resources, "shared ");
        assert!(shared.contains("|    40 ") && shared.contains("|    50 "), "{resources}");
        let only = row(&resources, "sm90_only");
        assert!(only.split('|').nth(1).unwrap().trim() == "-" && only.contains("|    70 "), "{resources}");

        let occupancy = occupancy_table(&b80, &b90);
        let shared: Vec<_> = occupancy.lines().filter(|l| l.starts_with("shared ")).collect();
        assert_eq!(shared.len(), 2, "{occupancy}");
        // q_tiles=1 exists in the portable build only, q_tiles=2 in both.
        assert!(shared[0].contains("q_tiles=1") && shared[0].trim_end().ends_with("| -"), "{occupancy}");
        assert!(shared[1].contains("q_tiles=2") && shared[1].contains(" 4  16  registers"), "{occupancy}");
        assert!(shared[1].contains(" 5  20  registers"), "{occupancy}");
    }
}
