//! The record of the shipped PTX (`ptx/manifest.txt`): each PTX file with the architecture it
//! was built for and its SHA-256, and the SHA-256 of every source the build reads. The build
//! embeds a shipped file only while the record matches the sources exactly.

use std::path::Path;

use super::sha256::hex_digest;
use super::{BuildError, Result};

/// Directory of the shipped PTX and its record, relative to the package root.
pub const SHIPPED_DIR: &str = "ptx";

/// File name of the record inside [`SHIPPED_DIR`].
pub const MANIFEST_FILE: &str = "manifest.txt";

/// Directories (relative to the package root) whose `.rs` files, recursively, determine the PTX:
/// the kernel sources and this builder (flags, link step, the kernel crate's manifest).
pub const SOURCE_DIRS: [&str; 2] = ["kernels-gpu/src", "builder/src"];

/// One PTX file of a build.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PtxFile {
    /// File name, e.g. `kernels.ptx`.
    pub file: String,
    /// Architecture it was built for, e.g. `sm_80`.
    pub arch: String,
    /// SHA-256 of its contents.
    pub sha256: String,
}

/// What a set of PTX files was built from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Manifest {
    /// Toolchain of the build.
    pub toolchain: String,
    /// PTX ISA feature of the build.
    pub ptx_isa: String,
    /// The PTX files.
    pub ptx: Vec<PtxFile>,
    /// `(path relative to the package root, SHA-256)` of every source, sorted by path.
    pub sources: Vec<(String, String)>,
}

const HEADER: &str = "\
# PTX shipped with paged-decode and the sources it was built from (SHA-256).
# The build embeds these files only while every line matches; scripts/ship-ptx regenerates them.
";

impl Manifest {
    /// The record's text.
    pub fn render(&self) -> String {
        let mut out = String::from(HEADER);
        out += &format!("toolchain {}\nptx-isa {}\n", self.toolchain, self.ptx_isa);
        for p in &self.ptx {
            out += &format!("ptx {} {} {}\n", p.file, p.arch, p.sha256);
        }
        for (path, sha) in &self.sources {
            out += &format!("source {path} {sha}\n");
        }
        out
    }

    /// Parses a record written by [`Manifest::render`].
    pub fn parse(text: &str) -> Result<Self> {
        let mut manifest = Manifest {
            toolchain: String::new(),
            ptx_isa: String::new(),
            ptx: Vec::new(),
            sources: Vec::new(),
        };
        for (n, line) in text.lines().enumerate() {
            let fields: Vec<&str> = line.split_whitespace().collect();
            match fields.as_slice() {
                [] => {}
                [comment, ..] if comment.starts_with('#') => {}
                ["toolchain", name] => manifest.toolchain = name.to_string(),
                ["ptx-isa", isa] => manifest.ptx_isa = isa.to_string(),
                ["ptx", file, arch, sha] => manifest.ptx.push(PtxFile {
                    file: file.to_string(),
                    arch: arch.to_string(),
                    sha256: sha.to_string(),
                }),
                ["source", path, sha] => manifest.sources.push((path.to_string(), sha.to_string())),
                _ => return Err(BuildError(format!("{MANIFEST_FILE} line {}: cannot read `{line}`", n + 1))),
            }
        }
        Ok(manifest)
    }

    /// Why PTX built under this record does not match `current` (same toolchain, ISA and
    /// sources), naming the first difference; `None` when it matches.
    pub fn difference(&self, current: &Manifest) -> Option<String> {
        if self.toolchain != current.toolchain {
            return Some(format!("built with {}, the build uses {}", self.toolchain, current.toolchain));
        }
        if self.ptx_isa != current.ptx_isa {
            return Some(format!("built for {}, the build uses {}", self.ptx_isa, current.ptx_isa));
        }
        for (path, sha) in &current.sources {
            match self.sources.iter().find(|(p, _)| p == path) {
                None => return Some(format!("{path} is new")),
                Some((_, recorded)) if recorded != sha => return Some(format!("{path} changed")),
                Some(_) => {}
            }
        }
        let removed = self.sources.iter().find(|(p, _)| !current.sources.iter().any(|(c, _)| c == p));
        removed.map(|(path, _)| format!("{path} was removed"))
    }
}

/// `(path relative to root, SHA-256)` of every `.rs` file under [`SOURCE_DIRS`], sorted by path.
pub fn source_digests(root: &Path) -> Result<Vec<(String, String)>> {
    let mut files = Vec::new();
    for dir in SOURCE_DIRS {
        collect_rs_files(&root.join(dir), dir, &mut files)?;
    }
    files.sort();
    files
        .into_iter()
        .map(|rel| {
            let path = root.join(&rel);
            let bytes =
                std::fs::read(&path).map_err(|e| BuildError(format!("reading {}: {e}", path.display())))?;
            Ok((rel, hex_digest(&bytes)))
        })
        .collect()
}

fn collect_rs_files(dir: &Path, rel: &str, out: &mut Vec<String>) -> Result<()> {
    let entries =
        std::fs::read_dir(dir).map_err(|e| BuildError(format!("reading {}: {e}", dir.display())))?;
    for entry in entries {
        let entry = entry.map_err(|e| BuildError(format!("reading {}: {e}", dir.display())))?;
        let name = entry.file_name().to_string_lossy().into_owned();
        let rel_child = format!("{rel}/{name}");
        if entry.path().is_dir() {
            collect_rs_files(&entry.path(), &rel_child, out)?;
        } else if name.ends_with(".rs") {
            out.push(rel_child);
        }
    }
    Ok(())
}

/// The shipped PTX files under `root`, read and checked against their record and `current`:
/// `Ok` with `(file, text)` pairs when every file and source matches, `Err` with the reason the
/// shipped PTX is stale otherwise.
pub fn load_shipped(root: &Path, current: &Manifest) -> std::result::Result<Vec<(PtxFile, String)>, String> {
    let dir = root.join(SHIPPED_DIR);
    let record = std::fs::read_to_string(dir.join(MANIFEST_FILE))
        .map_err(|e| format!("{SHIPPED_DIR}/{MANIFEST_FILE}: {e}"))?;
    let shipped = Manifest::parse(&record).map_err(|e| e.0)?;
    if let Some(why) = shipped.difference(current) {
        return Err(why);
    }
    shipped
        .ptx
        .into_iter()
        .map(|p| {
            let text = std::fs::read_to_string(dir.join(&p.file))
                .map_err(|e| format!("{SHIPPED_DIR}/{}: {e}", p.file))?;
            if hex_digest(text.as_bytes()) != p.sha256 {
                return Err(format!("{SHIPPED_DIR}/{} does not match its recorded SHA-256", p.file));
            }
            Ok((p, text))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(sources: &[(&str, &str)]) -> Manifest {
        Manifest {
            toolchain: "nightly-2026-05-20".into(),
            ptx_isa: "ptx78".into(),
            ptx: vec![PtxFile { file: "kernels.ptx".into(), arch: "sm_80".into(), sha256: "ab".into() }],
            sources: sources.iter().map(|(p, s)| (p.to_string(), s.to_string())).collect(),
        }
    }

    #[test]
    fn the_record_reads_back_what_it_wrote() {
        let m = record(&[("kernels-gpu/src/lib.rs", "01"), ("kernels-gpu/src/decode.rs", "02")]);
        assert_eq!(Manifest::parse(&m.render()).unwrap(), m);
        assert!(Manifest::parse("source only-a-path\n").is_err());
    }

    #[test]
    fn the_first_difference_is_named() {
        let shipped = record(&[("a.rs", "01"), ("b.rs", "02")]);
        assert_eq!(shipped.difference(&record(&[("a.rs", "01"), ("b.rs", "02")])), None);
        assert_eq!(shipped.difference(&record(&[("a.rs", "01"), ("b.rs", "03")])).unwrap(), "b.rs changed");
        assert_eq!(shipped.difference(&record(&[("a.rs", "01")])).unwrap(), "b.rs was removed");
        let added = record(&[("a.rs", "01"), ("b.rs", "02"), ("c.rs", "04")]);
        assert_eq!(shipped.difference(&added).unwrap(), "c.rs is new");
        let other_toolchain = Manifest { toolchain: "nightly-2027-01-01".into(), ..shipped.clone() };
        assert!(shipped.difference(&other_toolchain).unwrap().contains("nightly-2027-01-01"));
    }
}
