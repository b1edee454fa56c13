//! Optional `ptxas` reports: registers, shared memory, stack frame, spills and code size per entry.
//! ptxas is not needed at run time (the driver JIT-compiles the PTX); it is a tool for reading
//! what the PTX costs.

use std::path::{Path, PathBuf};
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
    /// Machine code of the entry itself (its `.text.<entry>` section in the cubin), in bytes;
    /// the subroutines it calls (e.g. 64-bit division) are not counted.
    pub code_bytes: u32,
}

/// How to get ptxas when it is missing.
pub const INSTALL_HINT: &str = "install ptxas with `python3 -m pip install nvidia-cuda-nvcc-cu12==12.9.86` \
     (or point the PTXAS environment variable at a ptxas binary)";

/// Finds ptxas ([`find_tool`]): `$PTXAS`, then `PATH`, then the PyPI `nvidia-cuda-nvcc-cu12` wheel.
pub fn find() -> Option<PathBuf> {
    find_tool("PTXAS", "ptxas", &["nvidia/cuda_nvcc/bin"])
}

/// Finds a CUDA command-line tool: the environment variable `env` if it is set (a path that is
/// not a file means "none", so a tool can be hidden), then `name` on `PATH`, then `name` in
/// each of `wheel_dirs` under Python's site-packages directories (where PyPI wheels put them).
pub fn find_tool(env: &str, name: &str, wheel_dirs: &[&str]) -> Option<PathBuf> {
    if let Some(p) = std::env::var_os(env) {
        return Some(PathBuf::from(p)).filter(|p| p.is_file());
    }
    if let Some(p) = std::env::var_os("PATH")
        .iter()
        .flat_map(std::env::split_paths)
        .map(|d| d.join(name))
        .find(|p| p.is_file())
    {
        return Some(p);
    }
    python_site_dirs()
        .iter()
        .flat_map(|site| wheel_dirs.iter().map(move |dir| site.join(dir).join(name)))
        .find(|p| p.is_file())
}

/// Python's site-packages directories (system and user), asked once; empty without python3.
fn python_site_dirs() -> &'static [PathBuf] {
    static DIRS: std::sync::OnceLock<Vec<PathBuf>> = std::sync::OnceLock::new();
    DIRS.get_or_init(|| {
        let script = "import site; print('\\n'.join(site.getsitepackages() + [site.getusersitepackages()]))";
        Command::new("python3")
            .args(["-c", script])
            .output()
            .map(|out| {
                String::from_utf8_lossy(&out.stdout).lines().map(|l| PathBuf::from(l.trim())).collect()
            })
            .unwrap_or_default()
    })
}

/// The version a CUDA tool reports (`Cuda compilation tools, release 12.9, V12.9.86` →
/// `12.9.86`), or `None` if it does not say.
pub fn version(tool: &Path) -> Option<String> {
    let out = Command::new(tool).arg("--version").output().ok()?;
    String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .filter_map(|word| word.strip_prefix('V'))
        .find(|v| v.starts_with(|c: char| c.is_ascii_digit()))
        .map(str::to_string)
}

/// What one ptxas run produced: the cubin and the `-v` log.
pub struct Assembly {
    /// The ELF image ptxas wrote.
    pub cubin: Vec<u8>,
    /// ptxas's stdout and stderr (the `-v` resource lines).
    pub log: String,
}

/// Runs `ptxas -arch=<arch> -v <extra_args>` on `ptx` and returns the cubin and the log.
pub fn assemble(ptxas: &Path, ptx: &str, arch: &str, extra_args: &[&str]) -> Result<Assembly, String> {
    static RUNS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let run = RUNS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let dir = std::env::temp_dir().join(format!("paged-decode-ptxas-{}-{run}", std::process::id()));
    std::fs::create_dir_all(&dir).map_err(|e| format!("creating {}: {e}", dir.display()))?;
    let src = dir.join(format!("kernels-{arch}.ptx"));
    let cubin = dir.join(format!("kernels-{arch}.cubin"));
    let out =
        std::fs::write(&src, ptx).map_err(|e| format!("writing {}: {e}", src.display())).and_then(|()| {
            Command::new(ptxas)
                .args([&format!("-arch={arch}"), "-v"])
                .args(extra_args)
                .arg("-o")
                .arg(&cubin)
                .arg(&src)
                .output()
                .map_err(|e| format!("running {}: {e}", ptxas.display()))
        });
    let elf = std::fs::read(&cubin);
    let _ = std::fs::remove_dir_all(&dir);
    let out = out?;
    let log = String::from_utf8_lossy(&out.stderr).into_owned() + &String::from_utf8_lossy(&out.stdout);
    if !out.status.success() {
        return Err(format!("ptxas failed for {arch}:\n{log}"));
    }
    Ok(Assembly { cubin: elf.map_err(|e| format!("reading the cubin: {e}"))?, log })
}

/// The per-entry report of an [`assemble`] run for `arch`.
pub fn report_of(assembly: &Assembly, arch: &str) -> Result<Vec<KernelReport>, String> {
    let sections = elf_sections(&assembly.cubin)
        .ok_or_else(|| format!("ptxas wrote a cubin for {arch} that is not a 64-bit ELF file"))?;
    let mut reports = parse(&assembly.log, arch);
    for r in &mut reports {
        let name = format!(".text.{}", r.entry);
        r.code_bytes = sections.iter().find(|(n, _)| *n == name).map_or(0, |&(_, size)| size as u32);
    }
    Ok(reports)
}

/// `(name, size)` of every section of a little-endian ELF64 file, or `None` if it is not one.
fn elf_sections(elf: &[u8]) -> Option<Vec<(String, u64)>> {
    let u16_at = |o: usize| Some(u16::from_le_bytes(elf.get(o..o.checked_add(2)?)?.try_into().ok()?));
    let u32_at = |o: usize| Some(u32::from_le_bytes(elf.get(o..o.checked_add(4)?)?.try_into().ok()?));
    let u64_at = |o: usize| Some(u64::from_le_bytes(elf.get(o..o.checked_add(8)?)?.try_into().ok()?));
    if elf.get(..6)? != b"\x7fELF\x02\x01" {
        return None;
    }
    let (table, entry_size) = (usize::try_from(u64_at(0x28)?).ok()?, u16_at(0x3a)? as usize);
    let (count, names) = (u16_at(0x3c)? as usize, u16_at(0x3e)? as usize);
    let header = |i: usize| table.checked_add(i.checked_mul(entry_size)?);
    let names_at = usize::try_from(u64_at(header(names)?.checked_add(24)?)?).ok()?;
    (0..count)
        .map(|i| {
            let h = header(i)?;
            let start = names_at.checked_add(u32_at(h)? as usize)?;
            let name = elf.get(start..)?.split(|&b| b == 0).next()?;
            Some((String::from_utf8_lossy(name).into_owned(), u64_at(h.checked_add(32)?)?))
        })
        .collect()
}

fn parse(text: &str, arch: &str) -> Vec<KernelReport> {
    let mut reports: Vec<KernelReport> = Vec::new();
    let number_before = |line: &str, unit: &str| -> u32 {
        let words: Vec<&str> = line.split([' ', ',']).filter(|w| !w.is_empty()).collect();
        words.windows(2).find(|w| w[1].starts_with(unit)).and_then(|w| w[0].parse().ok()).unwrap_or(0)
    };
    // The function whose properties the next stack-frame line gives: ptxas also lists the
    // subroutines an entry calls (their own frames) right after the entry.
    let mut properties_of = String::new();
    for line in text.lines() {
        if let Some(rest) = line.split("Compiling entry function '").nth(1) {
            let entry = rest.split('\'').next().unwrap_or_default().to_string();
            reports.push(KernelReport { entry, arch: arch.to_string(), ..Default::default() });
            continue;
        }
        if let Some(name) = line.split("Function properties for ").nth(1) {
            properties_of = name.trim().to_string();
            continue;
        }
        let Some(r) = reports.last_mut() else { continue };
        if line.contains("bytes stack frame") {
            if properties_of != r.entry {
                continue;
            }
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
            ptxas info    : Compile time = 220.608 ms\n\
            ptxas info    : Function properties for _RNvNtCs_4core9panicking9panic_fmt\n\
            \x20   0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads\n\
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
                spill_load_bytes: 4,
                code_bytes: 0
            }
        );
        assert_eq!((r[1].registers, r[1].stack_frame_bytes, r[1].spill_store_bytes), (12, 0, 0));
    }

    /// A little-endian ELF64 image with a null section, `.shstrtab` and `.text.k1` of 4096 bytes.
    fn tiny_elf() -> Vec<u8> {
        let names = b"\0.shstrtab\0.text.k1\0";
        let table = 64 + names.len();
        let mut elf = vec![0u8; table + 3 * 64];
        elf[..6].copy_from_slice(b"\x7fELF\x02\x01");
        elf[0x28..0x30].copy_from_slice(&(table as u64).to_le_bytes());
        elf[0x3a..0x3c].copy_from_slice(&64u16.to_le_bytes());
        elf[0x3c..0x3e].copy_from_slice(&3u16.to_le_bytes());
        elf[0x3e..0x40].copy_from_slice(&1u16.to_le_bytes());
        elf[64..table].copy_from_slice(names);
        let mut section = |i: usize, name: u32, offset: u64, size: u64| {
            let h = table + i * 64;
            elf[h..h + 4].copy_from_slice(&name.to_le_bytes());
            elf[h + 24..h + 32].copy_from_slice(&offset.to_le_bytes());
            elf[h + 32..h + 40].copy_from_slice(&size.to_le_bytes());
        };
        section(1, 1, 64, names.len() as u64);
        section(2, 11, 0, 4096);
        elf
    }

    #[test]
    fn reads_section_sizes_from_an_elf_file() {
        let sections = elf_sections(&tiny_elf()).unwrap();
        assert_eq!(sections[1..], [(".shstrtab".to_string(), 20), (".text.k1".to_string(), 4096)]);
        assert_eq!(elf_sections(b"not an ELF file"), None);
        let mut truncated = tiny_elf();
        truncated.truncate(100);
        assert_eq!(elf_sections(&truncated), None);
    }
}
