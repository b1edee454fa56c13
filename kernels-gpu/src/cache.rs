//! K/V cache formats of the tensor-core decode: the compile-time hook that says how cached
//! elements become MMA operands.
//!
//! - [`Native<T>`]: K/V in the 16-bit type `T` of q and o, read by `ldmatrix` as they are.
//! - [`Fp8<T, F>`]: K/V as 8-bit codes of format `F` ([`E4M3`] or [`E5M2`]), q and o in `T` (f16
//!   or bf16). The codes are dequantized to f16 in registers ([`Fp8Code::dequant4`], exact) and
//!   multiplied on the f16 tensor cores with q rounded to f16 (bf16 q after a per-row power-of-two
//!   scale, so no value leaves f16's range); the dequantization scales are applied to the logits
//!   and to the output. See [`crate::fp8_operands`] for the fragment layout.

use core::arch::asm;
use core::marker::PhantomData;

use crate::element::{Elem, F16, MmaElem};

/// How a K/V cache is stored and multiplied.
pub trait KvCache {
    /// Type of q and o.
    type Io: Elem;
    /// 16-bit type of the MMA operands.
    type Mma: MmaElem;
    /// Whether K and V hold 8-bit codes (else elements of `Mma`).
    const FP8: bool;
    /// Converts the codes in bytes (0, 1) and (2, 3) of `w` into two packed `Mma` pairs, the lower
    /// byte of each pair in the lower half (8-bit caches only).
    fn dequant4(w: u32) -> [u32; 2];
}

/// K/V in the 16-bit type of q and o.
pub struct Native<T>(PhantomData<T>);
impl<T: MmaElem> KvCache for Native<T> {
    type Io = T;
    type Mma = T;
    const FP8: bool = false;
    #[inline(always)]
    fn dequant4(w: u32) -> [u32; 2] {
        [w & 0xffff, w >> 16]
    }
}

/// An 8-bit float format of the cache.
pub trait Fp8Code {
    /// Two pairs of codes (bytes (0, 1) and (2, 3) of `w`) as two f16x2, exactly.
    fn dequant4(w: u32) -> [u32; 2];
}

/// E4M3 codes (`e4m3fn`, see [`crate::fp8`]).
pub struct E4M3;
impl Fp8Code for E4M3 {
    #[inline(always)]
    fn dequant4(w: u32) -> [u32; 2] {
        let (lo, hi): (u32, u32);
        // sm_89+: one conversion per pair.
        unsafe {
            asm!("{{ .reg .b16 l, h; mov.b32 {{l, h}}, {w}; cvt.rn.f16x2.e4m3x2 {lo}, l; cvt.rn.f16x2.e4m3x2 {hi}, h; }}",
                 lo = out(reg32) lo, hi = out(reg32) hi, w = in(reg32) w, options(pure, nomem, nostack))
        };
        [lo, hi]
    }
}

/// E5M2 codes (the upper byte of the f16 of the same value): one conversion per pair, as E4M3
/// (placing the bytes with two byte permutes instead measured the same: 84.3 against 84.0 µs on
/// fp8e5m2-b32-L4k).
pub struct E5M2;
impl Fp8Code for E5M2 {
    #[inline(always)]
    fn dequant4(w: u32) -> [u32; 2] {
        let (lo, hi): (u32, u32);
        unsafe {
            asm!("{{ .reg .b16 l, h; mov.b32 {{l, h}}, {w}; cvt.rn.f16x2.e5m2x2 {lo}, l; cvt.rn.f16x2.e5m2x2 {hi}, h; }}",
                 lo = out(reg32) lo, hi = out(reg32) hi, w = in(reg32) w, options(pure, nomem, nostack))
        };
        [lo, hi]
    }
}

/// K/V as 8-bit codes of format `F`; q and o in `T`.
pub struct Fp8<T, F>(PhantomData<(T, F)>);
impl<T: Elem, F: Fp8Code> KvCache for Fp8<T, F> {
    type Io = T;
    type Mma = F16;
    const FP8: bool = true;
    #[inline(always)]
    fn dequant4(w: u32) -> [u32; 2] {
        F::dequant4(w)
    }
}
