//! The shared FP8 conversions (`kernels-gpu/src/fp8.rs`) against the `float8` crate and the
//! formats' definitions: every code decodes exactly, every finite code survives a round trip,
//! ties go to the even code, and out-of-range values saturate.

use float8::{F8E4M3, F8E5M2};
use proptest::prelude::*;

use crate::fp8::{E4M3, E5M2, Fp8Layout, f32_to_fp8, fp8_to_f32};

fn reference_value(format: Fp8Layout, bits: u8) -> f32 {
    if format == E4M3 { F8E4M3::from_bits(bits).to_f32() } else { F8E5M2::from_bits(bits).to_f32() }
}

fn formats() -> [(&'static str, Fp8Layout); 2] {
    [("e4m3", E4M3), ("e5m2", E5M2)]
}

#[test]
fn every_code_decodes_as_the_float8_crate_does() {
    for (name, format) in formats() {
        for bits in 0..=255u8 {
            let (ours, theirs) = (fp8_to_f32(format, bits), reference_value(format, bits));
            if theirs.is_nan() {
                assert!(ours.is_nan(), "{name} {bits:#04x}: {ours} is not NaN");
            } else {
                assert_eq!(ours.to_bits(), theirs.to_bits(), "{name} {bits:#04x}: {ours} against {theirs}");
            }
        }
    }
}

#[test]
fn the_formats_have_their_documented_ranges() {
    assert_eq!(fp8_to_f32(E4M3, 0x7e), 448.0);
    assert_eq!(fp8_to_f32(E4M3, 0x01), 2f32.powi(-9));
    assert!(fp8_to_f32(E4M3, 0x7f).is_nan() && fp8_to_f32(E4M3, 0xff).is_nan());
    assert_eq!(fp8_to_f32(E5M2, 0x7b), 57344.0);
    assert_eq!(fp8_to_f32(E5M2, 0x01), 2f32.powi(-16));
    assert_eq!(fp8_to_f32(E5M2, 0x7c), f32::INFINITY);
    assert_eq!(fp8_to_f32(E5M2, 0xfc), f32::NEG_INFINITY);
    assert!(fp8_to_f32(E5M2, 0x7d).is_nan());
}

#[test]
fn every_finite_code_round_trips() {
    for (name, format) in formats() {
        for bits in 0..=255u8 {
            let v = fp8_to_f32(format, bits);
            if v.is_finite() {
                assert_eq!(f32_to_fp8(format, v), bits, "{name} {bits:#04x} ({v})");
            }
        }
    }
}

/// Finite non-negative codes in increasing order of value.
fn ladder(format: Fp8Layout) -> Vec<(u8, f32)> {
    (0..=format.max_finite()).map(|b| (b, fp8_to_f32(format, b))).collect()
}

#[test]
fn ties_go_to_the_even_code_and_everything_else_to_the_nearest() {
    for (name, format) in formats() {
        for pair in ladder(format).windows(2) {
            let [(lo, a), (hi, b)] = [pair[0], pair[1]];
            let mid = (a as f64 + b as f64) / 2.0;
            let even = if lo % 2 == 0 { lo } else { hi };
            for sign in [0u8, 0x80] {
                let s = if sign == 0 { 1.0 } else { -1.0 };
                assert_eq!(f32_to_fp8(format, (s * mid) as f32), sign | even, "{name} tie {a}..{b}");
                let below = f32::from_bits((mid as f32).to_bits() - 1);
                let above = f32::from_bits((mid as f32).to_bits() + 1);
                assert_eq!(f32_to_fp8(format, s as f32 * below), sign | lo, "{name} below {mid}");
                assert_eq!(f32_to_fp8(format, s as f32 * above), sign | hi, "{name} above {mid}");
            }
        }
    }
}

#[test]
fn out_of_range_values_saturate_and_nan_stays_nan() {
    for (name, format) in formats() {
        let max = fp8_to_f32(format, format.max_finite());
        for v in [max * 1.0001, max * 1.2, max * 2.0, 1e30, f32::MAX, f32::INFINITY] {
            assert_eq!(f32_to_fp8(format, v), format.max_finite(), "{name} {v}");
            assert_eq!(f32_to_fp8(format, -v), 0x80 | format.max_finite(), "{name} -{v}");
        }
        for nan in [f32::NAN, -f32::NAN, f32::from_bits(0x7f80_0001)] {
            assert!(fp8_to_f32(format, f32_to_fp8(format, nan)).is_nan(), "{name} NaN");
        }
        assert_eq!(f32_to_fp8(format, -0.0), 0x80);
        assert_eq!(f32_to_fp8(format, f32::from_bits(1)), 0);
        assert_eq!(f32_to_fp8(format, 1e-30), 0);
    }
}

proptest! {
    /// Any finite f32 within range lands on a code whose value is one of its two neighbours on
    /// the ladder, and the nearer one (ties aside), as the float8 crate rounds.
    #[test]
    fn quantization_picks_the_nearest_code(v in -60000f32..60000f32, e4m3 in any::<bool>()) {
        let format = if e4m3 { E4M3 } else { E5M2 };
        let max = fp8_to_f32(format, format.max_finite());
        prop_assume!(v.abs() <= max);
        let q = fp8_to_f32(format, f32_to_fp8(format, v));
        let best = ladder(format)
            .iter()
            .map(|&(_, x)| (x as f64 - v.abs() as f64).abs())
            .fold(f64::INFINITY, f64::min);
        prop_assert_eq!((q.abs() as f64 - v.abs() as f64).abs(), best);
        prop_assert!(q == 0.0 || q.is_sign_negative() == v.is_sign_negative());
        let theirs = if e4m3 { F8E4M3::from_f32(v).to_f32() } else { F8E5M2::from_f32(v).to_f32() };
        prop_assert_eq!(q, theirs);
    }
}
