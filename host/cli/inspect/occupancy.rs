//! Occupancy from the documented per-architecture limits, and the launch configurations the
//! plan uses for each entry point.

use serde::{Deserialize, Serialize};

use super::params;

/// Per-SM limits of one architecture (CUDA C++ Programming Guide, compute capabilities table).
#[derive(Debug, Clone, Copy)]
pub struct ArchLimits {
    /// Registers per SM.
    pub registers: u32,
    /// Registers are allocated per warp in units of this many.
    pub register_unit: u32,
    /// Resident warps per SM.
    pub warps: u32,
    /// Resident CTAs per SM.
    pub ctas: u32,
    /// Shared memory per SM (the largest carveout), in bytes.
    pub smem: u32,
    /// Shared memory the system reserves per CTA.
    pub smem_reserved_per_cta: u32,
    /// Shared memory is allocated in units of this many bytes.
    pub smem_unit: u32,
    /// Largest shared memory (static + dynamic, opt-in) of one CTA.
    pub smem_per_block: u32,
}

const KIB: u32 = 1024;

/// The limits of `arch` (`sm_80` or `sm_90`), or `None` for another architecture.
pub fn limits(arch: &str) -> Option<ArchLimits> {
    let base = ArchLimits {
        registers: 65536,
        register_unit: 256,
        warps: 64,
        ctas: 32,
        smem: 164 * KIB,
        smem_reserved_per_cta: KIB,
        smem_unit: 128,
        smem_per_block: 163 * KIB,
    };
    match arch {
        "sm_80" => Some(base),
        "sm_90" => Some(ArchLimits { smem: 228 * KIB, smem_per_block: 227 * KIB, ..base }),
        _ => None,
    }
}

/// How many CTAs of one launch configuration an SM holds, and why no more.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Occupancy {
    /// Resident CTAs per SM (0: the configuration cannot launch).
    pub ctas_per_sm: u32,
    /// Resident warps per SM.
    pub warps_per_sm: u32,
    /// The resources that allow no more CTAs: `registers`, `shared memory`, `warps`, `CTAs`
    /// (joined with `+` when several bind), or `shared memory per block` when it cannot launch.
    pub limited_by: String,
}

/// Occupancy of CTAs of `threads` threads using `registers` per thread and `smem_bytes` of
/// shared memory (static + dynamic).
pub fn occupancy(limits: &ArchLimits, threads: u32, registers: u32, smem_bytes: u32) -> Occupancy {
    let warps_per_cta = threads.div_ceil(32).max(1);
    if smem_bytes > limits.smem_per_block {
        return Occupancy { ctas_per_sm: 0, warps_per_sm: 0, limited_by: "shared memory per block".into() };
    }
    let by_warps = limits.warps / warps_per_cta;
    let registers_per_warp = (registers * 32).div_ceil(limits.register_unit) * limits.register_unit;
    let by_registers = match registers_per_warp {
        0 => u32::MAX,
        per_warp => limits.registers / per_warp / warps_per_cta,
    };
    let smem_per_cta =
        smem_bytes.div_ceil(limits.smem_unit) * limits.smem_unit + limits.smem_reserved_per_cta;
    let by_smem = limits.smem / smem_per_cta;
    let bounds =
        [("registers", by_registers), ("shared memory", by_smem), ("warps", by_warps), ("CTAs", limits.ctas)];
    let ctas = bounds.iter().map(|&(_, n)| n).min().unwrap_or(0);
    let limited_by: Vec<&str> = bounds.iter().filter(|&&(_, n)| n == ctas).map(|&(name, _)| name).collect();
    Occupancy { ctas_per_sm: ctas, warps_per_sm: ctas * warps_per_cta, limited_by: limited_by.join("+") }
}

/// One launch configuration of an entry point.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Launch {
    /// What selects it, e.g. `q_tiles=2`; empty when the entry has a single configuration.
    pub label: String,
    /// Threads per CTA.
    pub threads: u32,
    /// Dynamic shared memory per CTA, in bytes.
    pub dynamic_smem: u32,
}

/// Threads per CTA of the append kernel (`PagedKvAppendPlan::run`: one warp per (request, KV
/// head)).
const APPEND_THREADS: u32 = 32;
/// Threads per CTA of the read-bandwidth kernel (`bench::measure_read_ceiling`).
const READ_BANDWIDTH_THREADS: u32 = 256;

/// The launch configurations the plan (and the bench, for `read_bandwidth`) uses for `entry`;
/// empty for an entry it does not know. The tensor-core decode entries launch with the dynamic
/// shared memory of `q_tiles` 16-row query tiles of their tiling (`params::standard_tiling`, or
/// `params::lean_tiling` for `decode_mma_lean_*` and `decode_mma_guess_lean_*`; the `fp8_`
/// tilings for entries over an 8-bit cache, `…_e4m3_…` and `…_e5m2_…`),
/// `q_tiles = ceil(min(group, heads per CTA) / 16)`; one query tile in the lean entries of
/// several stacked KV heads (`decode_mma_lean_x{2,4,8,16}_*`).
pub fn launches(entry: &str) -> Vec<Launch> {
    let single = |threads, dynamic_smem| vec![Launch { label: String::new(), threads, dynamic_smem }];
    if entry.starts_with("decode_mma_") {
        let Some(head_dim) = head_dim(entry) else { return Vec::new() };
        let fp8 = entry.contains("_e4m3_") || entry.contains("_e5m2_");
        let lean = entry.starts_with("decode_mma_lean_") || entry.starts_with("decode_mma_guess_lean_");
        let tiling = match (lean, fp8) {
            (true, false) => params::lean_tiling(head_dim),
            (true, true) => params::fp8_lean_tiling(head_dim),
            (false, false) => params::standard_tiling(head_dim),
            (false, true) => params::fp8_tiling(head_dim),
        };
        let stacked = entry.starts_with("decode_mma_lean_x") && !entry.starts_with("decode_mma_lean_x1_");
        let max_q_tiles = if stacked { 1 } else { tiling.heads_per_cta / 16 };
        return (1..=max_q_tiles)
            .map(|q_tiles| Launch {
                label: format!("q_tiles={q_tiles}"),
                threads: params::DECODE_THREADS,
                dynamic_smem: params::mma_smem_bytes(tiling, head_dim, q_tiles),
            })
            .collect();
    }
    match entry {
        "check_page_table" => single(params::DECODE_THREADS, 0),
        "schedule_chunks" => single(params::SCHEDULE_THREADS, params::SCHEDULE_SMEM_BYTES),
        "read_bandwidth" => single(READ_BANDWIDTH_THREADS, 0),
        _ if entry.starts_with("decode_simt_") => single(params::DECODE_THREADS, 0),
        _ if entry.starts_with("append_") => single(APPEND_THREADS, 0),
        _ => Vec::new(),
    }
}

/// The head dimension in an entry's name (`…_d128` → 128).
fn head_dim(entry: &str) -> Option<u32> {
    entry.rsplit_once("_d")?.1.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn registers_limit_by_whole_warps() {
        let a100 = limits("sm_80").unwrap();
        // 206 registers: 6656 per warp, 9 warps fit, so two 4-warp CTAs.
        let o = occupancy(&a100, 128, 206, 0);
        assert_eq!((o.ctas_per_sm, o.warps_per_sm, o.limited_by.as_str()), (2, 8, "registers"));
        // 32 registers: 64 warps, so the warp limit and the register limit bind together.
        let o = occupancy(&a100, 128, 32, 0);
        assert_eq!((o.ctas_per_sm, o.limited_by.as_str()), (16, "registers+warps"));
        // Tiny CTAs hit the CTA limit.
        assert_eq!(occupancy(&a100, 32, 16, 0).limited_by, "CTAs");
    }

    #[test]
    fn shared_memory_counts_the_reserved_kib_and_the_per_block_limit() {
        let a100 = limits("sm_80").unwrap();
        let h100 = limits("sm_90").unwrap();
        // 81 KiB + 1 KiB reserved: two fit in 164 KiB; one byte more rounds up and fits one.
        assert_eq!(occupancy(&a100, 128, 64, 81 * KIB).ctas_per_sm, 2);
        assert_eq!(occupancy(&a100, 128, 64, 81 * KIB + 1).ctas_per_sm, 1);
        assert_eq!(occupancy(&a100, 128, 64, 81 * KIB + 1).limited_by, "shared memory");
        assert_eq!(occupancy(&a100, 128, 64, 164 * KIB).limited_by, "shared memory per block");
        assert_eq!(occupancy(&h100, 128, 64, 164 * KIB).ctas_per_sm, 1);
        assert_eq!(occupancy(&h100, 128, 64, 113 * KIB).ctas_per_sm, 2);
        assert!(limits("sm_86").is_none());
    }

    #[test]
    fn decode_launches_follow_the_plan_parameters() {
        let d128 = launches("decode_mma_split_f16_d128");
        assert_eq!(d128.len(), 4);
        assert_eq!(d128[3].dynamic_smem, params::mma_smem_bytes(params::standard_tiling(128), 128, 4));
        assert!(d128.iter().all(|l| l.threads == params::DECODE_THREADS));
        assert_eq!(launches("decode_mma_bf16_d256").len(), 2);
        let lean = launches("decode_mma_lean_x1_f16_d128");
        assert_eq!(lean.len(), 2);
        // Stacked KV heads fill one query tile.
        assert_eq!(launches("decode_mma_lean_x4_f16_d128"), lean[..1]);
        assert_eq!(lean[0].dynamic_smem, params::mma_smem_bytes(params::lean_tiling(128), 128, 1));
        // The guessing entries launch with their path's tiling: lean, or the standard one.
        assert_eq!(launches("decode_mma_guess_lean_f16_d128"), lean);
        assert_eq!(launches("decode_mma_guess_f16_d128"), launches("decode_mma_f16_d128"));
        // Entries over an 8-bit cache launch with their own tilings.
        let fp8 = launches("decode_mma_split_f16_e4m3_d128");
        assert_eq!(fp8[0].dynamic_smem, params::mma_smem_bytes(params::fp8_tiling(128), 128, 1));
        let fp8_lean = launches("decode_mma_lean_bf16_e5m2_d64");
        assert_eq!(fp8_lean[1].dynamic_smem, params::mma_smem_bytes(params::fp8_lean_tiling(64), 64, 2));
        assert_eq!(launches("schedule_chunks")[0].threads, params::SCHEDULE_THREADS);
        assert_eq!(launches("decode_simt_f32_d64")[0].dynamic_smem, 0);
        assert_eq!(launches("append_f16")[0].threads, 32);
        assert!(launches("unknown").is_empty());
    }
}
