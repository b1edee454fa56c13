//! The tensor-core decode's warp roles (`kernels-gpu/src/params.rs`, computed without a division
//! on the device) against their definition by division, for every tiling the kernels are built
//! with and every query-tile count a CTA of it can have.

use crate::params::{
    DECODE_THREADS, MmaTiling, fp8_lean_tiling, fp8_tiling, group_reciprocal, lean_tiling,
    stacked_head_of_row, standard_tiling,
};

fn tilings() -> Vec<(String, MmaTiling)> {
    let mut all = Vec::new();
    for d in [64, 128, 256] {
        all.push((format!("standard d{d}"), standard_tiling(d)));
        all.push((format!("fp8 d{d}"), fp8_tiling(d)));
    }
    for d in [64, 128] {
        all.push((format!("lean d{d}"), lean_tiling(d)));
        all.push((format!("fp8 lean d{d}"), fp8_lean_tiling(d)));
    }
    all
}

#[test]
fn warp_roles_match_their_definition() {
    let warps = DECODE_THREADS / 32;
    for (name, t) in tilings() {
        assert!((1..=warps).contains(&t.max_q_tiles()), "{name}: {} query tiles", t.max_q_tiles());
        assert!(
            !t.stacks_heads || t.max_q_tiles() <= 2,
            "{name}: stacked rows need one or two query tiles (stacked_head_of_row)"
        );
        for q_tiles in 1..=t.max_q_tiles() {
            let phases = warps / q_tiles / t.d_parts;
            assert!(phases >= 1, "{name}, {q_tiles} query tiles: no phase");
            let mut covered = vec![false; (q_tiles * phases * t.d_parts) as usize];
            for warp in 0..warps {
                let roles = t.warp_roles(warp, q_tiles);
                let d_part = warp / q_tiles / phases;
                assert_eq!(
                    (roles.q_tile, roles.phase, roles.phases, roles.d_part),
                    (warp % q_tiles, (warp / q_tiles) % phases, phases, d_part),
                    "{name}, {q_tiles} query tiles, warp {warp}"
                );
                if d_part < t.d_parts {
                    let slot = (roles.q_tile + q_tiles * (roles.phase + phases * roles.d_part)) as usize;
                    assert!(!covered[slot], "{name}, {q_tiles} query tiles: warp {warp} repeats a role");
                    covered[slot] = true;
                }
            }
            assert!(covered.iter().all(|&c| c), "{name}, {q_tiles} query tiles: a role has no warp");
        }
    }
}

#[test]
fn stacked_head_of_row_divides_every_row_of_two_query_tiles() {
    for group in 1..=1024 {
        for row in 0..32 {
            assert_eq!(
                stacked_head_of_row(row, group_reciprocal(group)),
                row / group,
                "row {row}, group {group}"
            );
        }
    }
}
