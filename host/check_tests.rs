//! The page-table check's walk over a request's slots (`kernels-gpu/src/check.rs`, through the
//! shared `params::check_lane_slots`) on the CPU.

use crate::params::check_lane_slots;

/// The warp's 32 lanes read every slot of `[start, stop)` once and no other.
fn assert_covers(start: u32, stop: u32) {
    let mut seen: Vec<u32> = (0..32).flat_map(|lane| check_lane_slots(start, stop, lane)).collect();
    seen.sort_unstable();
    let expected: Vec<u32> = (start..stop).collect();
    assert_eq!(seen, expected, "[{start}, {stop})");
}

#[test]
fn every_slot_of_the_request_once() {
    for (start, stop) in [(0, 0), (0, 1), (0, 31), (0, 32), (0, 33), (5, 100), (7, 7), (1000, 1065)] {
        assert_covers(start, stop);
    }
}

#[test]
fn no_wrap_at_the_largest_table() {
    // `indices` may hold up to `i32::MAX` slots; a walk in `i32` wrapped here.
    let max = i32::MAX as u32;
    for (start, stop) in
        [(max, max), (max - 1, max), (max - 31, max), (max - 32, max), (max - 100, max), (0, 64)]
    {
        assert_covers(start, stop);
    }
    for lane in 0..32 {
        assert!(check_lane_slots(max - 40, max, lane).all(|i| i < max));
    }
}
