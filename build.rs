//! Hands the kernels' PTX to the host code: `$OUT_DIR/kernels.ptx` (portable, runs on sm_80+
//! through the driver's JIT) and `$OUT_DIR/kernels_sm90.ptx` (Hopper: adds programmatic dependent
//! launch).
//!
//! Both come from `ptx/`, shipped with the package, so a dependent needs only stable Rust. A file
//! is built from the kernel sources instead (`kernels-gpu/` with the pinned nightly; see
//! `builder/`) when
//! - the shipped PTX does not match the sources: `ptx/manifest.txt` records the SHA-256 of every
//!   file it was built from, and a stale file is never embedded;
//! - `PAGED_DECODE_BUILD_PTX=1`: always build from source;
//! - `PAGED_DECODE_PTX_ARCH` (`sm_80` default, `sm_86`, `sm_89`, `sm_90`) differs from the
//!   shipped portable build's target.
//!
//! `PAGED_DECODE_PTX=/path/kernels.ptx` embeds that file as the portable PTX instead. Building
//! from source never installs anything: without the nightly the build fails and prints the
//! `rustup` command that installs it. `$OUT_DIR/manifest.txt` records the files built from
//! source; `scripts/ship-ptx` copies them and it into `ptx/`.

#[path = "builder/src/lib.rs"]
#[allow(dead_code)]
mod ptx_builder;

use std::path::{Path, PathBuf};

use ptx_builder::manifest::{self, MANIFEST_FILE, Manifest, PtxFile};
use ptx_builder::{PTX_ISA, PtxBuild, TOOLCHAIN, Toolchain, sha256};

const PORTABLE: &str = "kernels.ptx";
const SM90: &str = "kernels_sm90.ptx";
const PORTABLE_ARCHS: [&str; 4] = ["sm_80", "sm_86", "sm_89", "sm_90"];

// The entries' register limits (kernel parameters, so hashed into the shipped manifest).
#[path = "kernels-gpu/src/params.rs"]
#[allow(dead_code)]
mod params;

fn main() {
    for dir in manifest::SOURCE_DIRS.iter().chain([&manifest::SHIPPED_DIR]) {
        println!("cargo::rerun-if-changed={dir}");
    }
    for var in ["PAGED_DECODE_PTX_ARCH", "PAGED_DECODE_PTX", "PAGED_DECODE_BUILD_PTX"] {
        println!("cargo::rerun-if-env-changed={var}");
    }
    let root = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").unwrap());
    let out_dir = PathBuf::from(std::env::var("OUT_DIR").unwrap());
    let sources = manifest::source_digests(&root).unwrap_or_else(|e| fail(&e.0));
    let current = Manifest { toolchain: TOOLCHAIN.into(), ptx_isa: PTX_ISA.into(), ptx: Vec::new(), sources };
    let mut kernels = Kernels::new(&root, &out_dir, &current);

    let portable_arch = std::env::var("PAGED_DECODE_PTX_ARCH").unwrap_or_else(|_| "sm_80".into());
    if !PORTABLE_ARCHS.contains(&portable_arch.as_str()) {
        fail(&format!(
            "PAGED_DECODE_PTX_ARCH={portable_arch}: expected one of {}",
            PORTABLE_ARCHS.join(", ")
        ));
    }
    let portable = match std::env::var("PAGED_DECODE_PTX") {
        Ok(prebuilt) => {
            println!("cargo::rerun-if-changed={prebuilt}");
            let text = std::fs::read_to_string(&prebuilt)
                .unwrap_or_else(|e| fail(&format!("PAGED_DECODE_PTX={prebuilt}: {e}")));
            let shipped = std::fs::read_to_string(root.join(manifest::SHIPPED_DIR).join(PORTABLE))
                .unwrap_or_else(|e| fail(&format!("reading the shipped {PORTABLE}: {e}")));
            check_prebuilt(&text, &shipped)
                .unwrap_or_else(|e| fail(&format!("PAGED_DECODE_PTX={prebuilt}: {e}")));
            text
        }
        Err(_) => kernels.get(PORTABLE, &portable_arch),
    };
    let sm90 = kernels.get(SM90, "sm_90");
    write(&out_dir.join(PORTABLE), &portable);
    write(&out_dir.join(SM90), &sm90);
    let record = Manifest { ptx: kernels.built, ..current };
    write(&out_dir.join(MANIFEST_FILE), &record.render());
}

/// Where each PTX file comes from: the shipped copy while it matches the sources, else a build.
struct Kernels<'a> {
    root: &'a Path,
    out_dir: &'a Path,
    /// The shipped files, or why they cannot be used.
    shipped: Result<Vec<(PtxFile, String)>, String>,
    toolchain: Option<Toolchain>,
    /// Files built from source, for `$OUT_DIR/manifest.txt`.
    built: Vec<PtxFile>,
}

impl<'a> Kernels<'a> {
    fn new(root: &'a Path, out_dir: &'a Path, current: &Manifest) -> Self {
        let shipped = if std::env::var_os("PAGED_DECODE_BUILD_PTX").is_some_and(|v| v != "0") {
            Err("PAGED_DECODE_BUILD_PTX is set".into())
        } else {
            manifest::load_shipped(root, current)
                .map_err(|why| format!("the shipped PTX in ptx/ is stale ({why})"))
        };
        Self { root, out_dir, shipped, toolchain: None, built: Vec::new() }
    }

    /// The PTX text of `file` for `arch`.
    fn get(&mut self, file: &str, arch: &str) -> String {
        let why_build = match &self.shipped {
            Err(why) => why.clone(),
            Ok(files) => match files.iter().find(|(p, _)| p.file == file) {
                Some((p, text)) if p.arch == arch => return text.clone(),
                Some((p, _)) => {
                    format!("PAGED_DECODE_PTX_ARCH={arch}; the shipped {file} targets {}", p.arch)
                }
                None => format!("ptx/{MANIFEST_FILE} lists no {file}"),
            },
        };
        let text = self.build(arch, &why_build);
        self.built.push(PtxFile {
            file: file.into(),
            arch: arch.into(),
            sha256: sha256::hex_digest(text.as_bytes()),
        });
        text
    }

    fn build(&mut self, arch: &str, why: &str) -> String {
        let toolchain = self.toolchain.get_or_insert_with(|| find_toolchain(why));
        // `<target>/<profile>/build/<pkg>/out` → `<target>/ptx-build/<arch>`, shared by all profiles.
        let target_dir = self
            .out_dir
            .ancestors()
            .nth(4)
            .map(|t| t.join("ptx-build"))
            .unwrap_or_else(|| self.out_dir.join("ptx-build"))
            .join(arch);
        let build = PtxBuild {
            crate_root: self.root.join("kernels-gpu/src/lib.rs"),
            target_dir,
            arch: arch.into(),
            ptx_isa: PTX_ISA.into(),
            max_registers: params::MAX_REGISTERS_BY_PREFIX.iter().map(|&(p, n)| (p.into(), n)).collect(),
            max_threads: params::MAX_THREADS_BY_PREFIX.iter().map(|&(p, n)| (p.into(), n)).collect(),
        };
        build.build(toolchain).unwrap_or_else(|e| fail(&e.to_string()))
    }
}

/// The pinned nightly, or a build failure that says why it is needed and how to install it.
fn find_toolchain(why: &str) -> Toolchain {
    let toolchain = Toolchain::find(TOOLCHAIN).unwrap_or_else(|e| {
        fail(&format!(
            "{why}, so the PTX is built from the kernel sources, and {e}\n\
             (after installing it, `scripts/ship-ptx` regenerates the shipped PTX)"
        ))
    });
    if why.contains("stale") {
        println!("cargo::warning={why}: building it from source; `scripts/ship-ptx` updates ptx/");
    }
    toolchain
}

/// A prebuilt portable PTX file must have the shipped build's interface, which the host code
/// launches: the same entry points with the same parameter blocks (a file built from other
/// sources would have the kernels read their parameters at other offsets), a portable target,
/// and no NUL byte (the driver takes the text as a C string).
fn check_prebuilt(text: &str, shipped: &str) -> Result<(), String> {
    if text.contains('\0') {
        return Err("the file holds a NUL byte".into());
    }
    let target = text.lines().find_map(|l| l.strip_prefix(".target ")).map(str::trim);
    if !target.is_some_and(|t| PORTABLE_ARCHS.contains(&t)) {
        return Err(format!(".target {target:?}: expected one of {}", PORTABLE_ARCHS.join(", ")));
    }
    let (ours, theirs) = (entry_signatures(shipped), entry_signatures(text));
    if let Some(missing) = ours.iter().find(|e| !theirs.contains(e)) {
        return Err(format!(
            "no entry `{}` with the parameters `{}` of the shipped build",
            missing.0, missing.1
        ));
    }
    Ok(())
}

/// Each entry point of a PTX text: its name and its parameter declarations.
fn entry_signatures(ptx: &str) -> Vec<(String, String)> {
    let mut entries = Vec::new();
    let mut lines = ptx.lines();
    while let Some(line) = lines.next() {
        let Some(name) = line.strip_prefix(".visible .entry ").and_then(|l| l.strip_suffix('(')) else {
            continue;
        };
        let params: Vec<&str> = lines.by_ref().map(str::trim).take_while(|l| !l.starts_with(')')).collect();
        entries.push((name.to_string(), params.join(" ")));
    }
    entries
}

fn write(path: &Path, text: &str) {
    std::fs::write(path, text).unwrap_or_else(|e| fail(&format!("writing {}: {e}", path.display())));
}

fn fail(msg: &str) -> ! {
    eprintln!("error: building the PTX kernels: {msg}");
    std::process::exit(1);
}
