//! Side-by-side of two reports: per build and entry, every metric that changed.

use std::collections::BTreeSet;
use std::fmt::Write;

use super::mix::{self, Mix};
use super::report::{EntryReport, RESOURCE_FIELDS, Report};

/// One metric of one entry build, in the baseline and now (`None`: not measured there).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Row {
    /// `registers`, `CTAs/SM q_tiles=2`, `ptx ld.global.128`, …
    pub metric: String,
    /// Baseline value.
    pub old: Option<u64>,
    /// Current value.
    pub new: Option<u64>,
    /// Extra context, e.g. which resource limits the occupancy.
    pub note: String,
}

impl Row {
    /// More spill or stack bytes than the baseline.
    pub fn is_regression(&self) -> bool {
        let worse = self.new.unwrap_or(0) > self.old.unwrap_or(0);
        worse && (self.metric.starts_with("spill") || self.metric.starts_with("stack"))
    }
}

/// The changes of one entry in one build.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EntryDiff {
    /// `sm_80` or `sm_90`.
    pub arch: String,
    /// Entry-point name.
    pub entry: String,
    /// `changed`, `new` (not in the baseline) or `removed`.
    pub status: &'static str,
    /// Changed metrics, in report order.
    pub rows: Vec<Row>,
}

/// The entries whose metrics differ between `base` and `current`; empty when they agree.
/// A metric measured on one side only (e.g. no ptxas or no disassembler there) is no change.
pub fn diff(base: &Report, current: &Report) -> Vec<EntryDiff> {
    let mut out = Vec::new();
    for (report, other, is_base) in [(current, base, false), (base, current, true)] {
        for build in &report.builds {
            for entry in &build.entries {
                let counterpart = find_entry(other, &build.arch, &entry.entry);
                let (old, new, status) = match (counterpart, is_base) {
                    (Some(_), true) => continue, // compared from the current side
                    (Some(old), false) => (Some(old), Some(entry), "changed"),
                    (None, false) => (None, Some(entry), "new"),
                    (None, true) => (Some(entry), None, "removed"),
                };
                let rows = entry_rows(old, new);
                if !rows.is_empty() {
                    out.push(EntryDiff {
                        arch: build.arch.clone(),
                        entry: entry.entry.clone(),
                        status,
                        rows,
                    });
                }
            }
        }
    }
    out
}

fn find_entry<'r>(report: &'r Report, arch: &str, entry: &str) -> Option<&'r EntryReport> {
    let build = report.builds.iter().find(|b| b.arch == arch)?;
    build.entries.iter().find(|e| e.entry == entry)
}

/// The metrics that differ between two versions of an entry (`None`: the entry is not there).
fn entry_rows(old: Option<&EntryReport>, new: Option<&EntryReport>) -> Vec<Row> {
    let one_sided = old.is_none() || new.is_none();
    let mut rows = Vec::new();
    let mut compare = |metric: String, values: [Option<u64>; 2], notes: [String; 2]| {
        let comparable = one_sided || values.iter().all(Option::is_some);
        if comparable && (values[0] != values[1] || notes[0] != notes[1]) {
            let [old_note, new_note] = notes;
            let note = match (old_note.strip_prefix("limited by "), new_note.strip_prefix("limited by ")) {
                _ if old_note == new_note => new_note,
                (Some(a), Some(b)) => format!("limited by {a} → {b}"),
                _ => format!("{old_note} → {new_note}"),
            };
            rows.push(Row { metric, old: values[0], new: values[1], note });
        }
    };
    let sides = [old, new];
    for (metric, field) in RESOURCE_FIELDS {
        let values = sides.map(|e| e.and_then(|e| e.resources.as_ref()).map(|r| field(r).into()));
        compare(metric.into(), values, Default::default());
    }
    let mut labels: Vec<&str> = Vec::new();
    for l in sides.iter().flatten().flat_map(|e| &e.launches) {
        if !labels.contains(&l.label.as_str()) {
            labels.push(&l.label);
        }
    }
    for label in labels {
        let launch = sides.map(|e| e.and_then(|e| e.launches.iter().find(|l| l.label == label)));
        let at = if label.is_empty() { String::new() } else { format!(" {label}") };
        compare(
            format!("dyn smem{at}"),
            launch.map(|l| l.map(|l| l.dynamic_smem_bytes.into())),
            Default::default(),
        );
        let occupancy = launch.map(|l| l.and_then(|l| l.occupancy.as_ref()));
        compare(
            format!("CTAs/SM{at}"),
            occupancy.map(|o| o.map(|o| o.ctas_per_sm.into())),
            occupancy.map(|o| o.map(|o| format!("limited by {}", o.limited_by)).unwrap_or_default()),
        );
    }
    let ptx = sides.map(|e| e.map(|e| &e.ptx_mix));
    let sass = sides.map(|e| e.and_then(|e| e.sass_mix.as_ref()));
    for (prefix, mix) in [("ptx", ptx), ("sass", sass)] {
        let classes: BTreeSet<&String> = mix.iter().flatten().flat_map(|m| m.keys()).collect();
        for class in classes {
            // A class missing from a measured mix occurs 0 times.
            let values = mix.map(|m| m.map(|m| m.get(class).copied().unwrap_or(0)));
            compare(format!("{prefix} {class}"), values, Default::default());
        }
    }
    rows
}

/// The diff as text: what was compared, then one block per changed entry with its changed
/// metrics side by side (`!` marks more spills or stack than the baseline).
pub fn render(base: &Report, current: &Report, diffs: &[EntryDiff]) -> String {
    let mut s = String::new();
    let tools = |r: &Report| {
        let ptxas = r.ptxas.as_deref().map_or("no ptxas".to_string(), |v| format!("ptxas {v}"));
        let sass = r.disassembler.as_deref().unwrap_or("no disassembler");
        format!("{ptxas}, {sass}")
    };
    let _ = writeln!(s, "baseline: {}\ncurrent:  {}", tools(base), tools(current));
    if base.ptxas != current.ptxas {
        let _ = writeln!(
            s,
            "note: the ptxas versions differ, so SASS-side numbers may differ for that reason alone"
        );
    }
    let total: usize = current.builds.iter().map(|b| b.entries.len()).sum();
    if diffs.is_empty() {
        let _ = writeln!(s, "no differences ({total} entry builds compared)");
        return s;
    }
    let _ = writeln!(s, "{} of {total} entry builds differ\n", diffs.len());
    s.push_str(&summary_table(base, current, diffs));
    s.push('\n');
    for d in diffs {
        let _ = writeln!(s, "{} {} ({})", d.arch, d.entry, d.status);
        let _ = writeln!(s, "    {:<28} {:>10} {:>10} {:>9}", "", "baseline", "current", "change");
        for row in &d.rows {
            let show = |v: Option<u64>| v.map_or("-".to_string(), |v| v.to_string());
            let change = match (row.old, row.new) {
                (Some(a), Some(b)) => format!("{:+}", b as i64 - a as i64),
                _ => String::new(),
            };
            let mark = if row.is_regression() { "!" } else { "*" };
            let line = format!(
                "  {mark} {:<28} {:>10} {:>10} {:>9}  {}",
                row.metric,
                show(row.old),
                show(row.new),
                change,
                row.note
            );
            let _ = writeln!(s, "{}", line.trim_end());
        }
    }
    s
}

/// Headline numbers of an entry build: registers, spill bytes, stack, code bytes, CTAs per SM
/// over its launches, PTX and SASS instruction counts.
fn headline(e: &EntryReport) -> [Option<String>; 7] {
    let r = e.resources.as_ref();
    let ctas: Vec<u32> = e.launches.iter().filter_map(|l| Some(l.occupancy.as_ref()?.ctas_per_sm)).collect();
    let ctas = match (ctas.iter().min(), ctas.iter().max()) {
        (Some(lo), Some(hi)) if lo == hi => Some(lo.to_string()),
        (Some(lo), Some(hi)) => Some(format!("{lo}..{hi}")),
        _ => None,
    };
    let total = |m: Option<&Mix>| m.map(|m| m.get(mix::TOTAL).copied().unwrap_or(0).to_string());
    [
        r.map(|r| r.registers.to_string()),
        r.map(|r| (r.spill_store_bytes + r.spill_load_bytes).to_string()),
        r.map(|r| r.stack_frame_bytes.to_string()),
        r.map(|r| r.code_bytes.to_string()),
        ctas,
        total(Some(&e.ptx_mix)),
        total(e.sass_mix.as_ref()),
    ]
}

/// One line per differing entry build with its headline numbers, `old→new` where they moved.
fn summary_table(base: &Report, current: &Report, diffs: &[EntryDiff]) -> String {
    const COLUMNS: [&str; 7] = ["regs", "spill", "stack", "code bytes", "CTAs/SM", "PTX instr", "SASS instr"];
    let mut s = format!("{:<34}", "entry build");
    for title in COLUMNS {
        let _ = write!(s, " {title:>13}");
    }
    s.push('\n');
    for d in diffs {
        let old = find_entry(base, &d.arch, &d.entry).map(headline);
        let new = find_entry(current, &d.arch, &d.entry).map(headline);
        let _ = write!(s, "{:<34}", format!("{} {}", d.arch, d.entry));
        for i in 0..COLUMNS.len() {
            let (a, b) = (old.as_ref().and_then(|h| h[i].clone()), new.as_ref().and_then(|h| h[i].clone()));
            let cell = match (a, b) {
                (Some(a), Some(b)) if a != b => format!("{a}→{b}"),
                (a, b) => b.or(a).unwrap_or_else(|| "-".into()),
            };
            let _ = write!(s, " {cell:>13}");
        }
        s.push('\n');
    }
    s
}

#[cfg(test)]
mod tests {
    use super::super::occupancy::Occupancy;
    use super::super::report::{self, Build, LaunchReport, Resources, Tools};
    use super::*;

    fn entry(registers: u32, spills: u32, ctas: u32, mma: u64) -> EntryReport {
        EntryReport {
            entry: "k".into(),
            resources: Some(Resources {
                registers,
                static_smem_bytes: 0,
                stack_frame_bytes: 0,
                spill_store_bytes: spills,
                spill_load_bytes: spills,
                code_bytes: 4096,
            }),
            launches: vec![LaunchReport {
                label: "q_tiles=1".into(),
                threads: 128,
                dynamic_smem_bytes: 1024,
                occupancy: Some(Occupancy {
                    ctas_per_sm: ctas,
                    warps_per_sm: 4 * ctas,
                    limited_by: "registers".into(),
                }),
            }],
            ptx_mix: [("mma".to_string(), mma), ("total".to_string(), 100)].into(),
            sass_mix: None,
        }
    }

    fn report(entries: Vec<EntryReport>) -> Report {
        Report {
            format: report::FORMAT,
            ptxas: Some("12.9.86".into()),
            disassembler: None,
            builds: vec![Build { arch: "sm_90".into(), entries }],
        }
    }

    #[test]
    fn a_report_against_itself_has_no_differences() {
        let r = report(vec![entry(128, 0, 2, 8)]);
        assert!(diff(&r, &r).is_empty());
        assert!(render(&r, &r, &[]).contains("no differences (1 entry builds compared)"));
    }

    #[test]
    fn the_shipped_build_against_itself_has_no_differences() {
        let r = report::build(&Tools::find(false)).unwrap();
        assert_eq!(diff(&r, &r), Vec::new());
    }

    #[test]
    fn changes_are_listed_with_spills_marked() {
        let (old, new) = (report(vec![entry(128, 0, 2, 8)]), report(vec![entry(168, 16, 1, 0)]));
        let d = diff(&old, &new);
        assert_eq!(d.len(), 1);
        let metrics: Vec<&str> = d[0].rows.iter().map(|r| r.metric.as_str()).collect();
        assert_eq!(metrics, ["registers", "spill stores", "spill loads", "CTAs/SM q_tiles=1", "ptx mma"]);
        assert_eq!((d[0].rows[4].old, d[0].rows[4].new), (Some(8), Some(0)));
        let text = render(&old, &new, &d);
        assert!(text.contains("! spill stores"), "{text}");
        assert!(text.contains("* registers") && text.contains("+40"), "{text}");
    }

    #[test]
    fn a_side_without_ptxas_or_sass_is_not_a_change() {
        let mut with = entry(128, 0, 2, 8);
        with.sass_mix = Some([("total".to_string(), 50)].into());
        let mut without = entry(128, 0, 2, 8);
        without.resources = None;
        without.launches[0].occupancy = None;
        assert!(diff(&report(vec![with]), &report(vec![without])).is_empty());
    }

    #[test]
    fn new_and_removed_entries_are_reported() {
        let mut other = entry(128, 0, 2, 8);
        other.entry = "k2".into();
        let d = diff(&report(vec![entry(128, 0, 2, 8)]), &report(vec![other]));
        let statuses: Vec<(&str, &str)> = d.iter().map(|d| (d.entry.as_str(), d.status)).collect();
        assert_eq!(statuses, [("k2", "new"), ("k", "removed")]);
    }
}
