//! SASS: the machine code ptxas makes of the PTX, read back with `nvdisasm` or `cuobjdump`
//! (found like ptxas: environment variable, `PATH`, then the PyPI wheels).

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::ptxas;

/// How to get a disassembler when none is found.
pub const INSTALL_HINT: &str = "install nvdisasm with `python3 -m pip install nvidia-cuda-nvdisasm==13.5.37` \
     (or cuobjdump: `nvidia-cuda-cuobjdump==13.5.37`; or point NVDISASM / CUOBJDUMP at a binary)";

/// Where the PyPI wheels put the CUDA binaries (`nvidia-cuda-*` 13.x, and the 12.x layout).
const WHEEL_DIRS: &[&str] = &["nvidia/cu13/bin", "nvidia/cuda_nvdisasm/bin", "nvidia/cuda_cuobjdump/bin"];

/// A SASS disassembler.
#[derive(Debug, Clone)]
pub enum Disassembler {
    /// `nvdisasm`: preferred, it can also map each instruction to its PTX line.
    Nvdisasm(PathBuf),
    /// `cuobjdump -sass`.
    Cuobjdump(PathBuf),
}

impl Disassembler {
    /// `nvdisasm` (`$NVDISASM`, `PATH`, wheel), else `cuobjdump` (`$CUOBJDUMP`, …).
    pub fn find() -> Option<Self> {
        ptxas::find_tool("NVDISASM", "nvdisasm", WHEEL_DIRS)
            .map(Self::Nvdisasm)
            .or_else(|| ptxas::find_tool("CUOBJDUMP", "cuobjdump", WHEEL_DIRS).map(Self::Cuobjdump))
    }

    fn path(&self) -> &Path {
        match self {
            Self::Nvdisasm(p) | Self::Cuobjdump(p) => p,
        }
    }

    /// `nvdisasm 13.5.37`: the tool and its version.
    pub fn describe(&self) -> String {
        let name = match self {
            Self::Nvdisasm(_) => "nvdisasm",
            Self::Cuobjdump(_) => "cuobjdump",
        };
        match ptxas::version(self.path()) {
            Some(version) => format!("{name} {version}"),
            None => name.to_string(),
        }
    }

    /// Whether [`Self::disassemble`] can annotate instructions with their PTX lines.
    pub fn maps_ptx_lines(&self) -> bool {
        matches!(self, Self::Nvdisasm(_))
    }

    /// The code sections of `cubin` as text; with `ptx_lines` (nvdisasm, a cubin assembled
    /// with `-lineinfo`), each run of instructions is preceded by
    /// `//## File ".nv_debug_ptx_txt", line N`, its line in the PTX.
    pub fn disassemble(&self, cubin: &[u8], ptx_lines: bool) -> Result<String, String> {
        static RUNS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let run = RUNS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let file = std::env::temp_dir().join(format!("paged-decode-sass-{}-{run}.cubin", std::process::id()));
        std::fs::write(&file, cubin).map_err(|e| format!("writing {}: {e}", file.display()))?;
        let mut cmd = Command::new(self.path());
        match self {
            Self::Nvdisasm(_) if ptx_lines => cmd.args(["-c", "-gp"]),
            Self::Nvdisasm(_) => cmd.arg("-c"),
            Self::Cuobjdump(_) => cmd.arg("-sass"),
        };
        let out = cmd.arg(&file).output();
        let _ = std::fs::remove_file(&file);
        let out = out.map_err(|e| format!("running {}: {e}", self.path().display()))?;
        if !out.status.success() {
            return Err(format!(
                "{} failed: {}",
                self.path().display(),
                String::from_utf8_lossy(&out.stderr).trim()
            ));
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }
}

/// The listing of each function: `(name, text)` in listing order. nvdisasm puts each entry in
/// its `.text.<name>` section (with the subroutines only it calls); cuobjdump heads each with
/// `Function : <name>`.
pub fn functions(listing: &str) -> Vec<(String, String)> {
    let mut out: Vec<(String, String)> = Vec::new();
    let mut open = false;
    for line in listing.lines() {
        let trimmed = line.trim();
        let section = trimmed.split_once(char::is_whitespace).filter(|(word, _)| *word == ".section");
        let started = section
            .and_then(|(_, rest)| rest.trim_start().strip_prefix(".text."))
            .map(|rest| rest.split(',').next().unwrap_or(rest))
            .or_else(|| trimmed.strip_prefix("Function : "));
        if let Some(name) = started {
            out.push((name.trim().to_string(), String::new()));
            open = true;
        } else if trimmed.starts_with("//----") || section.is_some() {
            open = false;
        } else if let (true, Some((_, text))) = (open, out.last_mut()) {
            text.push_str(line);
            text.push('\n');
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splits_nvdisasm_and_cuobjdump_listings() {
        let nvdisasm = "\
            //--------------------- .text.k1 --------------------------\n\
            \t.section\t.text.k1,\"ax\",@progbits\n\
            \t.sectionflags\t@\"SHF_BARRIERS=1\"\n\
            .text.k1:\n\
            \x20       /*0000*/                   EXIT ;\n\
            //--------------------- .nv.constant0.k1 --------------------------\n\
            \t.section\t.nv.constant0.k1,\"a\",@progbits\n\
            \x20       /*0000*/ \t.byte\t0x00\n\
            //--------------------- .text.k2 --------------------------\n\
            \t.section\t.text.k2,\"ax\",@progbits\n\
            \x20       /*0000*/                   BRA 0x0 ;\n";
        let f = functions(nvdisasm);
        assert_eq!(f.iter().map(|(n, _)| n.as_str()).collect::<Vec<_>>(), ["k1", "k2"]);
        assert!(f[0].1.contains("EXIT") && !f[0].1.contains(".byte"));
        let cuobjdump = "\n\tcode for sm_90\n\t\tFunction : k1\n\t.headerflags @\"\"\n        /*0000*/  EXIT ;\n\
            \t\tFunction : k2\n        /*0000*/  BRA 0x0 ;\n";
        let f = functions(cuobjdump);
        assert_eq!(f.len(), 2);
        assert!(f[1].1.contains("BRA") && !f[1].1.contains("EXIT"));
    }
}
