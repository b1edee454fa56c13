//! The machine-readable report: per build (sm_80, sm_90) and entry, ptxas resources, the
//! occupancy of each launch configuration, and the PTX and SASS instruction mix.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use paged_decode::ptx;

use super::mix::{self, Mix};
use super::occupancy::{self, Occupancy};
use super::ptx_text;
use super::sass::{self, Disassembler};
use crate::ptxas;

/// Version of the report layout; a baseline of another version is refused.
pub const FORMAT: u32 = 1;

/// The builds reported: target architecture and the compute capability that loads it.
pub const ARCHS: [(&str, (u32, u32)); 2] = [("sm_80", (8, 0)), ("sm_90", (9, 0))];

/// Everything `inspect` knows about the embedded PTX.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Report {
    /// [`FORMAT`].
    pub format: u32,
    /// ptxas version, if ptxas was found (resources and occupancy need it).
    pub ptxas: Option<String>,
    /// Disassembler and version, if one was found and asked for (the SASS mix needs it).
    pub disassembler: Option<String>,
    /// One per entry of [`ARCHS`].
    pub builds: Vec<Build>,
}

/// One PTX build, assembled for its architecture.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Build {
    /// `sm_80` (the portable build) or `sm_90`.
    pub arch: String,
    /// Its entry points, in PTX order.
    pub entries: Vec<EntryReport>,
}

/// One entry point of one build.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EntryReport {
    /// Entry-point name.
    pub entry: String,
    /// What ptxas reports; `None` without ptxas.
    pub resources: Option<Resources>,
    /// The launch configurations the plan uses, with their occupancy.
    pub launches: Vec<LaunchReport>,
    /// Instruction mix of the PTX.
    pub ptx_mix: Mix,
    /// Instruction mix of the SASS; `None` without ptxas or a disassembler.
    pub sass_mix: Option<Mix>,
}

/// ptxas's resource report of one entry.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Resources {
    /// Registers per thread.
    pub registers: u32,
    /// Static shared memory, in bytes.
    pub static_smem_bytes: u32,
    /// Stack frame, in bytes.
    pub stack_frame_bytes: u32,
    /// Spill stores, in bytes.
    pub spill_store_bytes: u32,
    /// Spill loads, in bytes.
    pub spill_load_bytes: u32,
    /// Machine code of the entry's `.text` section, in bytes.
    pub code_bytes: u32,
}

/// Reads one field of [`Resources`].
pub type ResourceField = fn(&Resources) -> u32;

/// The fields of [`Resources`] by display name, in report order.
pub const RESOURCE_FIELDS: [(&str, ResourceField); 6] = [
    ("registers", |r| r.registers),
    ("static smem", |r| r.static_smem_bytes),
    ("stack frame", |r| r.stack_frame_bytes),
    ("spill stores", |r| r.spill_store_bytes),
    ("spill loads", |r| r.spill_load_bytes),
    ("code bytes", |r| r.code_bytes),
];

impl From<&ptxas::KernelReport> for Resources {
    fn from(r: &ptxas::KernelReport) -> Self {
        Self {
            registers: r.registers,
            static_smem_bytes: r.shared_bytes,
            stack_frame_bytes: r.stack_frame_bytes,
            spill_store_bytes: r.spill_store_bytes,
            spill_load_bytes: r.spill_load_bytes,
            code_bytes: r.code_bytes,
        }
    }
}

/// One launch configuration and what it allows.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LaunchReport {
    /// What selects it (`q_tiles=2`), empty for an entry's only configuration.
    pub label: String,
    /// Threads per CTA.
    pub threads: u32,
    /// Dynamic shared memory per CTA, in bytes.
    pub dynamic_smem_bytes: u32,
    /// CTAs and warps per SM; `None` without ptxas (the registers are unknown).
    pub occupancy: Option<Occupancy>,
}

/// The external tools a report uses; each is optional.
pub struct Tools {
    /// ptxas, for resources, occupancy and SASS.
    pub ptxas: Option<PathBuf>,
    /// nvdisasm or cuobjdump, for the SASS mix.
    pub disassembler: Option<Disassembler>,
}

impl Tools {
    /// Finds ptxas, and a disassembler when `sass` is asked for.
    pub fn find(sass: bool) -> Self {
        Self { ptxas: ptxas::find(), disassembler: if sass { Disassembler::find() } else { None } }
    }

    /// What is missing and how to get it, one line each.
    pub fn missing(&self) -> Vec<String> {
        let mut lines = Vec::new();
        if self.ptxas.is_none() {
            lines.push(format!("ptxas not found (no resources, occupancy or SASS): {}", ptxas::INSTALL_HINT));
        }
        if self.ptxas.is_some() && self.disassembler.is_none() {
            lines.push(format!("no SASS disassembler found (no SASS mix): {}", sass::INSTALL_HINT));
        }
        lines
    }
}

/// Builds the report of both embedded builds (in parallel: ptxas and the disassembler take
/// seconds each).
pub fn build(tools: &Tools) -> Result<Report, String> {
    let builds = std::thread::scope(|scope| {
        let handles: Vec<_> = ARCHS
            .iter()
            .map(|&(arch, cc)| scope.spawn(move || build_one(tools, arch, ptx::for_compute_capability(cc))))
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().unwrap_or_else(|_| Err("a report thread panicked".into())))
            .collect::<Result<Vec<Build>, String>>()
    })?;
    Ok(Report {
        format: FORMAT,
        ptxas: tools.ptxas.as_deref().map(|p| ptxas::version(p).unwrap_or_else(|| "unknown version".into())),
        disassembler: tools.ptxas.as_ref().and(tools.disassembler.as_ref()).map(Disassembler::describe),
        builds,
    })
}

/// The report of one build: `ptx` assembled for `arch`.
pub fn build_one(tools: &Tools, arch: &str, ptx: &str) -> Result<Build, String> {
    let assembly = tools.ptxas.as_deref().map(|p| ptxas::assemble(p, ptx, arch, &[])).transpose()?;
    let resources = assembly.as_ref().map(|a| ptxas::report_of(a, arch)).transpose()?;
    let sass = match (&assembly, &tools.disassembler) {
        (Some(a), Some(d)) => Some(sass::functions(&d.disassemble(&a.cubin, false)?)),
        _ => None,
    };
    let limits = occupancy::limits(arch);
    let entries = ptx_text::entry_spans(ptx)
        .iter()
        .map(|span| {
            let resources = resources
                .as_ref()
                .and_then(|all| all.iter().find(|r| r.entry == span.name))
                .map(Resources::from);
            EntryReport {
                entry: span.name.to_string(),
                launches: launch_reports(span.name, resources.as_ref(), limits.as_ref()),
                resources,
                ptx_mix: mix::ptx_mix(span.text),
                sass_mix: sass.as_ref().map(|functions| {
                    let listing = functions.iter().find(|(name, _)| name == span.name).map(|(_, text)| text);
                    mix::sass_mix(listing.map_or("", String::as_str))
                }),
            }
        })
        .collect();
    Ok(Build { arch: arch.to_string(), entries })
}

fn launch_reports(
    entry: &str,
    resources: Option<&Resources>,
    limits: Option<&occupancy::ArchLimits>,
) -> Vec<LaunchReport> {
    occupancy::launches(entry)
        .into_iter()
        .map(|launch| LaunchReport {
            occupancy: resources.zip(limits).map(|(r, limits)| {
                let smem = r.static_smem_bytes + launch.dynamic_smem;
                occupancy::occupancy(limits, launch.threads, r.registers, smem)
            }),
            label: launch.label,
            threads: launch.threads,
            dynamic_smem_bytes: launch.dynamic_smem,
        })
        .collect()
}

impl Report {
    /// Writes the report as pretty-printed JSON (ending with a newline).
    pub fn write(&self, path: &Path) -> Result<(), String> {
        let text = serde_json::to_string_pretty(self).map_err(|e| e.to_string())? + "\n";
        std::fs::write(path, text).map_err(|e| format!("writing {}: {e}", path.display()))
    }

    /// Reads a report written by [`Report::write`].
    pub fn read(path: &Path) -> Result<Self, String> {
        let text = std::fs::read_to_string(path).map_err(|e| format!("reading {}: {e}", path.display()))?;
        let report: Self = serde_json::from_str(&text)
            .map_err(|e| format!("{}: not an inspect report: {e}", path.display()))?;
        if report.format != FORMAT {
            return Err(format!(
                "{}: report format {} (this build reads {FORMAT}); regenerate it with `inspect --json`",
                path.display(),
                report.format
            ));
        }
        Ok(report)
    }

    /// Entries of any build with spills or a stack frame: `sm_90 name: …`.
    pub fn spills_and_stack(&self) -> Vec<String> {
        self.builds
            .iter()
            .flat_map(|b| b.entries.iter().map(move |e| (b, e)))
            .filter_map(|(b, e)| {
                let r = e.resources.as_ref()?;
                (r.stack_frame_bytes + r.spill_store_bytes + r.spill_load_bytes > 0).then(|| {
                    format!(
                        "{} {}: {} bytes stack frame, {} bytes spill stores, {} bytes spill loads",
                        b.arch, e.entry, r.stack_frame_bytes, r.spill_store_bytes, r.spill_load_bytes
                    )
                })
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn no_tools() -> Tools {
        Tools { ptxas: None, disassembler: None }
    }

    #[test]
    fn without_ptxas_the_report_has_the_ptx_mix_only() {
        let report = build(&no_tools()).unwrap();
        assert_eq!(report.builds.len(), 2);
        for (build, (_, cc)) in report.builds.iter().zip(ARCHS) {
            assert_eq!(build.entries.len(), ptx::expected_entries(cc).len());
            for e in &build.entries {
                assert!(e.resources.is_none() && e.sass_mix.is_none());
                assert!(e.launches.iter().all(|l| l.occupancy.is_none()));
                assert!(e.ptx_mix[mix::TOTAL] > 0, "{}: no instructions counted", e.entry);
            }
        }
        assert!(no_tools().missing()[0].contains(ptxas::INSTALL_HINT));
    }

    #[test]
    fn json_round_trips() {
        let report = build(&no_tools()).unwrap();
        let path = std::env::temp_dir().join(format!("paged-decode-report-{}.json", std::process::id()));
        report.write(&path).unwrap();
        let back = Report::read(&path);
        std::fs::write(&path, "{\"format\": 99}").unwrap();
        let wrong = Report::read(&path);
        let _ = std::fs::remove_file(&path);
        assert_eq!(back.unwrap(), report);
        assert!(wrong.is_err());
    }

    /// With ptxas: every entry has resources, a known launch configuration and an occupancy
    /// for each launch.
    #[test]
    fn with_ptxas_every_launch_has_an_occupancy() {
        let Some(ptxas) = ptxas::find() else {
            eprintln!("SKIPPED with_ptxas_every_launch_has_an_occupancy: {}", ptxas::INSTALL_HINT);
            return;
        };
        let report = build(&Tools { ptxas: Some(ptxas), disassembler: None }).unwrap();
        for e in report.builds.iter().flat_map(|b| &b.entries) {
            let r = e.resources.as_ref().unwrap_or_else(|| panic!("{}: no ptxas report", e.entry));
            assert!(r.registers > 0 && r.code_bytes > 0, "{}: {r:?}", e.entry);
            assert!(!e.launches.is_empty(), "{}: launch configuration unknown", e.entry);
            for l in &e.launches {
                assert!(l.occupancy.as_ref().is_some_and(|o| o.ctas_per_sm >= 1), "{} {}", e.entry, l.label);
            }
        }
    }

    #[test]
    fn spills_and_stack_frames_are_listed() {
        let mut report = build(&no_tools()).unwrap();
        let clean = Resources {
            registers: 32,
            static_smem_bytes: 0,
            stack_frame_bytes: 0,
            spill_store_bytes: 0,
            spill_load_bytes: 0,
            code_bytes: 1024,
        };
        for e in report.builds.iter_mut().flat_map(|b| &mut b.entries) {
            e.resources = Some(clean.clone());
        }
        assert!(report.spills_and_stack().is_empty());
        let entry = &mut report.builds[1].entries[0];
        entry.resources = Some(Resources { stack_frame_bytes: 16, spill_store_bytes: 8, ..clean });
        let name = entry.entry.clone();
        assert_eq!(
            report.spills_and_stack(),
            [format!("sm_90 {name}: 16 bytes stack frame, 8 bytes spill stores, 0 bytes spill loads")]
        );
    }
}
