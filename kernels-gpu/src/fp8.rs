//! The two 8-bit floating-point formats of a K/V cache (OCP FP8): integer-only conversions,
//! shared verbatim by the device code and the host (which includes this file), so a cache
//! quantized on either side decodes to the same values on both.
//!
//! - **E4M3** (`e4m3fn`): 1 sign, 4 exponent (bias 7), 3 mantissa bits; no infinities, NaN is
//!   `S.1111.111`; largest finite ±448, smallest subnormal 2^-9.
//! - **E5M2**: 1 sign, 5 exponent (bias 15), 2 mantissa bits; IEEE-like, with ±inf
//!   (`S.11111.00`) and NaNs (`S.11111.xx`, `xx ≠ 0`); largest finite ±57344, smallest subnormal
//!   2^-16.
//!
//! Quantization rounds to nearest, ties to even, and saturates: a finite value beyond the
//! largest finite one, and an infinity, become the largest finite value of its sign (what
//! `cvt.rn.satfinite` does on sm_89+). NaN stays NaN (sign kept, all mantissa bits set).
//! Dequantization is exact.

/// Bit layout of one 8-bit format: [`E4M3`] or [`E5M2`] (its fields are private, so that the
/// conversions' shifts only ever see these two).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Fp8Layout {
    /// Mantissa bits.
    mantissa_bits: u32,
    /// Exponent bias.
    bias: i32,
    /// Largest finite code without the sign.
    max_finite: u8,
    /// Whether the all-ones exponent is infinity / NaN (E5M2) rather than an ordinary binade
    /// whose all-ones mantissa alone is NaN (E4M3).
    ieee_specials: bool,
}

impl Fp8Layout {
    /// The largest finite code without the sign (`0x7e` for E4M3, `0x7b` for E5M2).
    #[inline(always)]
    pub const fn max_finite(self) -> u8 {
        self.max_finite
    }
}

/// E4M3 (`e4m3fn`).
pub const E4M3: Fp8Layout = Fp8Layout { mantissa_bits: 3, bias: 7, max_finite: 0x7e, ieee_specials: false };
/// E5M2.
pub const E5M2: Fp8Layout = Fp8Layout { mantissa_bits: 2, bias: 15, max_finite: 0x7b, ieee_specials: true };

/// The value of code `bits` in `format`, exactly.
#[inline(always)]
pub fn fp8_to_f32(format: Fp8Layout, bits: u8) -> f32 {
    let m = format.mantissa_bits;
    let sign = ((bits >> 7) as u32) << 31;
    let magnitude = bits & 0x7f;
    let exponent = (magnitude >> m) as i32;
    let mantissa = (magnitude & ((1 << m) - 1)) as u32;
    let all_ones: i32 = 0x7f >> m;
    let special = if format.ieee_specials { exponent == all_ones } else { magnitude == 0x7f };
    let value_bits = if special {
        if format.ieee_specials && mantissa == 0 { 0x7f80_0000 } else { 0x7fc0_0000 }
    } else if exponent == 0 {
        // Subnormal: mantissa · 2^(1 - bias - m), exact in f32 (at most 3 significant bits).
        (mantissa as f32 * f32::from_bits(((127 + 1 - format.bias - m as i32) as u32) << 23)).to_bits()
    } else {
        (((exponent - format.bias + 127) as u32) << 23) | (mantissa << (23 - m))
    };
    f32::from_bits(sign | value_bits)
}

/// `v` rounded to the nearest code of `format` (ties to even), saturating (see the module docs).
#[inline(always)]
pub fn f32_to_fp8(format: Fp8Layout, v: f32) -> u8 {
    let bits = v.to_bits();
    let sign = ((bits >> 31) as u8) << 7;
    let magnitude = bits & 0x7fff_ffff;
    if magnitude > 0x7f80_0000 {
        return sign | 0x7f;
    }
    let f32_exponent = (magnitude >> 23) as i32;
    if f32_exponent == 0 {
        // Zero or an f32 subnormal, far below half the smallest 8-bit subnormal.
        return sign;
    }
    let m = format.mantissa_bits as i32;
    let e = f32_exponent - 127;
    let significand = (1u32 << 23) | (magnitude & 0x7f_ffff);
    // Exponent of the code's quantum: that of the value's binade, or the subnormals' below it.
    let min_normal = 1 - format.bias;
    let quantum = if e >= min_normal { e - m } else { min_normal - m };
    let shift = (quantum - (e - 23)) as u32; // ≥ 23 - m > 0
    let n = if shift >= 26 {
        // Below a quarter of the quantum: rounds to zero.
        0
    } else {
        let kept = significand >> shift;
        let rest = significand & ((1 << shift) - 1);
        let half = 1 << (shift - 1);
        kept + (rest > half || (rest == half && kept & 1 == 1)) as u32
    };
    let code = if e >= min_normal {
        // `n` ∈ [2^m, 2^(m+1)]: a carry out of the mantissa moves to the next binade by itself.
        (((e + format.bias) as u32) << m).saturating_add(n - (1 << m))
    } else {
        n
    };
    sign | code.min(format.max_finite as u32) as u8
}
