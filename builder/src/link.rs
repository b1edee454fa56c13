//! Our own link step: bitcode of the kernel crate + `core` + `compiler_builtins` → PTX.

use std::path::{Path, PathBuf};

use super::toolchain::{Toolchain, run};
use super::{BuildError, Result};

pub const TARGET: &str = "nvptx64-nvidia-cuda";

/// The kernel crate's bitcode and the rlibs of its `-Zbuild-std` dependencies.
pub struct KernelBitcode {
    kernel: PathBuf,
    rlibs: Vec<PathBuf>,
}

impl KernelBitcode {
    /// Locates the newest `<crate>-*.bc` and the `core` / `compiler_builtins` rlibs.
    pub fn find(target_dir: &Path, crate_name: &str) -> Result<Self> {
        let deps = target_dir.join(TARGET).join("release/deps");
        let newest = |prefix: &str, suffix: &str| -> Result<PathBuf> {
            std::fs::read_dir(&deps)
                .map_err(|e| BuildError(format!("reading {}: {e}", deps.display())))?
                .flatten()
                .filter(|e| {
                    let name = e.file_name().to_string_lossy().into_owned();
                    name.starts_with(prefix) && name.ends_with(suffix)
                })
                .max_by_key(|e| e.metadata().and_then(|m| m.modified()).ok())
                .map(|e| e.path())
                .ok_or_else(|| BuildError(format!("no {prefix}*{suffix} in {}", deps.display())))
        };
        Ok(Self {
            kernel: newest(&format!("{crate_name}-"), ".bc")?,
            rlibs: vec![newest("libcore-", ".rlib")?, newest("libcompiler_builtins-", ".rlib")?],
        })
    }
}

/// Links, internalizes all but the kernel entry points, optimizes and emits PTX.
pub fn link_to_ptx(
    tc: &Toolchain,
    bitcode: &KernelBitcode,
    work_dir: &Path,
    arch: &str,
    ptx_isa: &str,
) -> Result<String> {
    let work = work_dir.join("link");
    let members = work.join("members");
    let _ = std::fs::remove_dir_all(&work);
    std::fs::create_dir_all(&members)
        .map_err(|e| BuildError(format!("creating {}: {e}", members.display())))?;

    let mut inputs = vec![bitcode.kernel.clone()];
    for rlib in &bitcode.rlibs {
        run(std::process::Command::new(tc.llvm_tool("llvm-ar"))
            .arg("x")
            .arg("--output")
            .arg(&members)
            .arg(rlib))?;
    }
    let mut objects: Vec<PathBuf> = std::fs::read_dir(&members)
        .map_err(|e| BuildError(format!("reading {}: {e}", members.display())))?
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "o"))
        .collect();
    objects.sort();
    inputs.extend(objects);

    let entries = kernel_entries(tc, &bitcode.kernel)?;
    if entries.is_empty() {
        return Err(BuildError("the kernel crate exports no #[no_mangle] kernels".into()));
    }

    let linked = work.join("linked.bc");
    let optimized = work.join("opt.bc");
    let ptx = work.join("kernels.ptx");
    run(std::process::Command::new(tc.llvm_tool("llvm-link"))
        .arg("--only-needed")
        .args(&inputs)
        .arg("-o")
        .arg(&linked))?;
    run(std::process::Command::new(tc.llvm_tool("opt"))
        .arg("-passes=internalize,globaldce,default<O3>")
        .arg(format!("-unroll-threshold={}", super::UNROLL_THRESHOLD))
        .arg(format!("--internalize-public-api-list={}", entries.join(",")))
        .arg(&linked)
        .arg("-o")
        .arg(&optimized))?;
    run(std::process::Command::new(tc.llvm_tool("llc"))
        .args(["-O3", &format!("-mcpu={arch}"), &format!("-mattr=+{ptx_isa}")])
        .arg(&optimized)
        .arg("-o")
        .arg(&ptx))?;
    let text =
        std::fs::read_to_string(&ptx).map_err(|e| BuildError(format!("reading {}: {e}", ptx.display())))?;
    Ok(without_crate_disambiguators(&text))
}

/// `text` with the crate disambiguators of its v0-mangled names (`Cs<hash>_` before a crate
/// name) replaced by `Cs_`. Cargo derives them from each crate's source path, which for `core`
/// is inside the toolchain's install directory; without them the PTX is the same on every
/// machine. The names are internal functions and comments, so only their spelling changes.
pub fn without_crate_disambiguators(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = String::with_capacity(text.len());
    let mut copied = 0;
    let mut i = 0;
    while let Some(found) = text[i..].find("Cs") {
        let hash_start = i + found + 2;
        let hash_len = bytes[hash_start..].iter().take_while(|b| b.is_ascii_alphanumeric()).count();
        let after = hash_start + hash_len;
        let is_disambiguator = hash_len > 0
            && bytes.get(after) == Some(&b'_')
            && bytes.get(after + 1).is_some_and(u8::is_ascii_digit);
        if is_disambiguator {
            out.push_str(&text[copied..hash_start]);
            copied = after;
        }
        i = hash_start;
    }
    out.push_str(&text[copied..]);
    out
}

/// Unmangled (`#[no_mangle]`) functions defined by the kernel crate: its entry points.
fn kernel_entries(tc: &Toolchain, kernel_bc: &Path) -> Result<Vec<String>> {
    let out = run(std::process::Command::new(tc.llvm_tool("llvm-nm"))
        .args(["--defined-only", "--extern-only", "--format=just-symbols"])
        .arg(kernel_bc))?;
    Ok(String::from_utf8_lossy(&out)
        .lines()
        .map(str::trim)
        .filter(|s| !s.is_empty() && !s.starts_with("_ZN") && !s.starts_with("_R") && !s.starts_with("rust_"))
        .map(String::from)
        .collect())
}

/// Adds each of `directives`' performance-tuning directives (`.maxnreg 128`, `.maxntid 1024, 1,
/// 1`) to every entry whose name starts with its prefix: they go between the entry's parameter
/// list and its body, in the order given.
pub fn entry_directives(ptx: &str, directives: &[(String, String)]) -> String {
    let mut out = String::with_capacity(ptx.len() + 64 * directives.len());
    let mut pending: Vec<&str> = Vec::new();
    for line in ptx.split_inclusive('\n') {
        if let Some(name) = line
            .trim_start()
            .strip_prefix(".visible .entry ")
            .or_else(|| line.trim_start().strip_prefix(".entry "))
        {
            pending = directives
                .iter()
                .filter(|(prefix, _)| name.starts_with(prefix.as_str()))
                .map(|(_, directive)| directive.as_str())
                .collect();
        }
        if line.trim() == "{" {
            for directive in pending.drain(..) {
                out.push_str(directive);
                out.push('\n');
            }
        }
        out.push_str(line);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::{entry_directives, without_crate_disambiguators};

    #[test]
    fn directives_go_between_the_parameters_and_the_body_of_matching_entries() {
        let ptx = ".visible .entry lean_a(\n\t.param .u64 p\n)\n{\n\tret;\n}\n.visible .entry other(\n)\n{\n\tret;\n}\n\
                   .visible .entry wide(\n)\n{\n\tret;\n}\n";
        let directives = [
            ("lean_".into(), ".maxnreg 128".into()),
            ("wide".into(), ".maxntid 1024, 1, 1".into()),
            ("lean_".into(), ".maxntid 128, 1, 1".into()),
        ];
        let out = entry_directives(ptx, &directives);
        assert_eq!(out.matches(".maxnreg 128").count(), 1);
        assert!(out.contains(")\n.maxnreg 128\n.maxntid 128, 1, 1\n{\n\tret;"));
        assert!(out.contains(".visible .entry other(\n)\n{"));
        assert!(out.contains(".visible .entry wide(\n)\n.maxntid 1024, 1, 1\n{"));
    }

    #[test]
    fn crate_disambiguators_are_dropped_and_nothing_else() {
        let ptx = ".func _RNvNtNtCsjyqfColeDL_4core9panicking11panic_const23panic_const_div_by_zero\n\
                   $L__BB0_6: // %_RINvNtCs5o5Wr52bBeZ_11kernels_gpu6append12append_tokenfEB4_.exit\n\
                   Cs_4core Csx_y Cs9 CsAb_ ld.global.nc.v4.b32";
        assert_eq!(
            without_crate_disambiguators(ptx),
            ".func _RNvNtNtCs_4core9panicking11panic_const23panic_const_div_by_zero\n\
             $L__BB0_6: // %_RINvNtCs_11kernels_gpu6append12append_tokenfEB4_.exit\n\
             Cs_4core Csx_y Cs9 CsAb_ ld.global.nc.v4.b32"
        );
    }
}
