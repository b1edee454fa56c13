//! Optional `ptxas` reports: registers, shared memory, stack frame and spills per entry.
//! ptxas is not needed at run time (the driver JIT-compiles the PTX); it is a tool for reading
//! what the PTX costs.

use std::path::PathBuf;
use std::process::Command;

/// One entry point's resources for one architecture.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct KernelReport {
    /// Entry-point name.
    pub entry: String,
    /// Target architecture, e.g. `sm_90`.
    pub arch: String,
    /// Registers per thread.
    pub registers: u32,
    /// Static shared memory, in bytes.
    pub shared_bytes: u32,
    /// Stack frame, in bytes.
    pub stack_frame_bytes: u32,
    /// Spill stores, in bytes.
    pub spill_store_bytes: u32,
    /// Spill loads, in bytes.
    pub spill_load_bytes: u32,
}

/// How to get ptxas when it is missing.
pub const INSTALL_HINT: &str = "install ptxas with `python3 -m pip install nvidia-cuda-nvcc-cu12==12.9.86` \
     (or point the PTXAS environment variable at a ptxas binary)";

/// Finds ptxas: `$PTXAS`, then `PATH`, then the PyPI `nvidia-cuda-nvcc-cu12` wheel.
pub fn find() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("PTXAS").map(PathBuf::from).filter(|p| p.is_file()) {
        return Some(p);
    }
    if let Some(p) = std::env::var_os("PATH")
        .iter()
        .flat_map(std::env::split_paths)
        .map(|d| d.join("ptxas"))
        .find(|p| p.is_file())
    {
        return Some(p);
    }
    let out = Command::new("python3")
        .args([
            "-c",
            "import site, sys; print('\\n'.join(site.getsitepackages() + [site.getusersitepackages()]))",
        ])
        .output()
        .ok()?;
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|dir| PathBuf::from(dir.trim()).join("nvidia/cuda_nvcc/bin/ptxas"))
        .find(|p| p.is_file())
}

/// Assembles `ptx` for `arch` (e.g. `sm_90`) and parses the per-entry report.
pub fn report(ptxas: &std::path::Path, ptx: &str, arch: &str) -> Result<Vec<KernelReport>, String> {
    let dir = std::env::temp_dir().join(format!("paged-decode-ptxas-{}", std::process::id()));
    std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
    let src = dir.join(format!("kernels-{arch}.ptx"));
    std::fs::write(&src, ptx).map_err(|e| e.to_string())?;
    let out = Command::new(ptxas)
        .args([&format!("-arch={arch}"), "-v", "-o", "/dev/null"])
        .arg(&src)
        .output()
        .map_err(|e| format!("running {}: {e}", ptxas.display()))?;
    let _ = std::fs::remove_dir_all(&dir);
    let text = String::from_utf8_lossy(&out.stderr).into_owned() + &String::from_utf8_lossy(&out.stdout);
    if !out.status.success() {
        return Err(format!("ptxas failed for {arch}:\n{text}"));
    }
    Ok(parse(&text, arch))
}

fn parse(text: &str, arch: &str) -> Vec<KernelReport> {
    let mut reports: Vec<KernelReport> = Vec::new();
    let number_before = |line: &str, unit: &str| -> u32 {
        let words: Vec<&str> = line.split([' ', ',']).filter(|w| !w.is_empty()).collect();
        words.windows(2).find(|w| w[1].starts_with(unit)).and_then(|w| w[0].parse().ok()).unwrap_or(0)
    };
    for line in text.lines() {
        if let Some(rest) = line.split("Compiling entry function '").nth(1) {
            let entry = rest.split('\'').next().unwrap_or_default().to_string();
            reports.push(KernelReport { entry, arch: arch.to_string(), ..Default::default() });
            continue;
        }
        let Some(r) = reports.last_mut() else { continue };
        if line.contains("bytes stack frame") {
            let nums: Vec<u32> = line.split(',').map(|part| number_before(part, "bytes")).collect();
            r.stack_frame_bytes = nums.first().copied().unwrap_or(0);
            r.spill_store_bytes = nums.get(1).copied().unwrap_or(0);
            r.spill_load_bytes = nums.get(2).copied().unwrap_or(0);
        } else if line.contains("Used") && line.contains("registers") {
            r.registers = number_before(line, "registers");
            r.shared_bytes = line
                .split(',')
                .find(|part| part.contains("smem"))
                .map(|part| number_before(part, "bytes"))
                .unwrap_or(0);
        }
    }
    reports
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_a_report() {
        let text = "ptxas info    : 0 bytes gmem\n\
            ptxas info    : Compiling entry function 'k1' for 'sm_90'\n\
            ptxas info    : Function properties for k1\n\
            \x20   16 bytes stack frame, 8 bytes spill stores, 4 bytes spill loads\n\
            ptxas info    : Used 96 registers, used 1 barriers, 1024 bytes smem, 400 bytes cmem[0]\n\
            ptxas info    : Compiling entry function 'k2' for 'sm_90'\n\
            ptxas info    : Function properties for k2\n\
            \x20   0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads\n\
            ptxas info    : Used 12 registers, used 0 barriers, 368 bytes cmem[0]\n";
        let r = parse(text, "sm_90");
        assert_eq!(r.len(), 2);
        assert_eq!(
            r[0],
            KernelReport {
                entry: "k1".into(),
                arch: "sm_90".into(),
                registers: 96,
                shared_bytes: 1024,
                stack_frame_bytes: 16,
                spill_store_bytes: 8,
                spill_load_bytes: 4
            }
        );
        assert_eq!((r[1].registers, r[1].stack_frame_bytes, r[1].spill_store_bytes), (12, 0, 0));
    }
}
