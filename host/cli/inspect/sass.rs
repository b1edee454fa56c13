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

/// The opcode (predicate dropped) and operands of a disassembled instruction line
/// (`/*0c30*/ @!P0 LDG.E.128 R4, desc[UR4][R2.64] ;`); `None` for any other line.
pub fn instruction(line: &str) -> Option<(&str, &str)> {
    let rest = line.trim_start().strip_prefix("/*")?;
    let (address, rest) = rest.split_once("*/")?;
    if address.is_empty() || !address.chars().all(|c| c.is_ascii_hexdigit()) {
        return None;
    }
    let rest = rest.trim_start();
    let rest = match rest.strip_prefix('@') {
        Some(predicated) => predicated.split_once(char::is_whitespace)?.1.trim_start(),
        None => rest,
    };
    let (opcode, operands) = rest.split_once(char::is_whitespace).unwrap_or((rest, ""));
    let opcode = opcode.trim_end_matches(';');
    let operands = operands.trim().trim_end_matches(';').trim_end();
    // Data in non-code sections (`.byte`, `.word`) is not an instruction.
    (!opcode.is_empty() && !opcode.starts_with('.')).then_some((opcode, operands))
}

/// The `cp.async` copies (`LDGSTS`) of one function's listing whose 64-bit memory descriptor
/// `desc[URn]` is not an even uniform register pair that an instruction of the function writes.
///
/// The descriptor carries the copy's L2 cache policy. ptxas (12.9, 13.0, and so the JIT of
/// driver 580) can drop the `createpolicy` that a `cp.async….L2::cache_hint` reads: it did for
/// the decode's first copies when they sat in a loop around the partition. The copy then reads
/// an unwritten pair (`LDGSTS [R174+UR0], desc[UR1][R36.64]`, with nothing writing UR0 or UR1)
/// and traps with `CUDA_ERROR_ILLEGAL_INSTRUCTION` on the GPU, while ptxas reports nothing.
pub fn copies_with_unwritten_descriptor(function: &str) -> Vec<String> {
    let uniform = |operand: &str| operand.strip_prefix("UR").and_then(|n| n.parse::<u32>().ok());
    let instructions: Vec<(&str, &str, &str)> = function
        .lines()
        .filter_map(|line| instruction(line).map(|(opcode, operands)| (line, opcode, operands)))
        .collect();
    let mut written = std::collections::BTreeSet::new();
    for (_, opcode, operands) in &instructions {
        if let Some(n) = operands.split(',').next().and_then(|d| uniform(d.trim())) {
            written.insert(n);
            if opcode.split('.').any(|m| m == "64") {
                written.insert(n + 1);
            }
        }
    }
    instructions
        .iter()
        .filter(|(_, opcode, operands)| {
            // A copy under the default policy may name no descriptor at all.
            opcode.starts_with("LDGSTS")
                && copy_descriptor(operands)
                    .is_some_and(|d| uniform(d).is_none_or(|n| n % 2 == 1 || !written.contains(&n)))
        })
        .map(|(line, _, _)| line.trim().to_string())
        .collect()
}

/// The register named by a copy's `desc[…]` operand; `None` for a copy under the default
/// policy, which names no descriptor (sm_80).
fn copy_descriptor(operands: &str) -> Option<&str> {
    operands.split_once("desc[").and_then(|(_, rest)| rest.split_once(']')).map(|(register, _)| register)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_copies_whose_descriptor_no_instruction_writes() {
        let line = |op: &str| format!("        /*0000*/                   {op} ;\n");
        let listing = |body: &[&str]| body.iter().map(|op| line(op)).collect::<String>();
        let good = listing(&[
            "ULDC.64 UR4, c[0x0][0x208]",
            "@!P1 LDGSTS.E.BYPASS.128 [R21+0x4000], desc[UR4][R14.64], !P1",
        ]);
        assert!(copies_with_unwritten_descriptor(&good).is_empty());
        // The miscompile: no instruction writes UR0 / UR1 (nor an odd pair is valid).
        let bad =
            listing(&["ULDC UR4, c[0x0][0x278]", "LDGSTS.E.BYPASS.128 [R174+UR0], desc[UR1][R36.64], !P6"]);
        assert_eq!(copies_with_unwritten_descriptor(&bad).len(), 1);
        let odd =
            listing(&["ULDC.64 UR4, c[0x0][0x208]", "LDGSTS.E.BYPASS.128 [R4+UR4], desc[UR5][R40.64], !P6"]);
        assert_eq!(copies_with_unwritten_descriptor(&odd).len(), 1);
        assert!(
            copies_with_unwritten_descriptor(&line("LDGSTS.E.BYPASS.128 [R42], [R16.64], !P3")).is_empty()
        );
        assert_eq!(instruction(&line("@!PT LDS RZ, [RZ]")), Some(("LDS", "RZ, [RZ]")));
        assert_eq!(instruction("        /*0000*/ \t.byte\t0x00"), None);
    }

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
