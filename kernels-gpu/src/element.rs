//! Element types as the kernels see them: raw bits plus conversions and MMA.

use core::arch::asm;

/// A storage element of Q, K, V and O.
pub trait Elem: Copy {
    /// Whether the type's range exceeds f16's, so that its values need a scale to become f16.
    const WIDER_THAN_F16: bool;
    fn to_f32(self) -> f32;
    fn from_f32(v: f32) -> Self;
    /// Stores 4 consecutive values at global address `dst` (aligned to 4 elements) in one
    /// instruction.
    unsafe fn store4(dst: *mut Self, v: [f32; 4]);
    /// Stores 2 consecutive values at global address `dst` (aligned to 2 elements) in one
    /// instruction.
    unsafe fn store2(dst: *mut Self, v: [f32; 2]);
}

/// `st.global.b32` of the 16-bit elements `v`, packed.
#[inline(always)]
unsafe fn store2_16bit(dst: *mut u16, v: [u16; 2]) {
    let packed = v[0] as u32 | (v[1] as u32) << 16;
    unsafe { asm!("st.global.b32 [{p}], {a};", p = in(reg64) dst, a = in(reg32) packed, options(nostack)) };
}

/// `st.global.v2.b32` of the 16-bit elements `v`, packed in pairs.
#[inline(always)]
unsafe fn store4_16bit(dst: *mut u16, v: [u16; 4]) {
    let (lo, hi) = (v[0] as u32 | (v[1] as u32) << 16, v[2] as u32 | (v[3] as u32) << 16);
    unsafe {
        asm!("st.global.v2.b32 [{p}], {{{a}, {b}}};", p = in(reg64) dst, a = in(reg32) lo, b = in(reg32) hi,
             options(nostack))
    };
}

/// IEEE half, as raw bits.
#[repr(transparent)]
#[derive(Clone, Copy)]
pub struct F16(pub u16);

/// bfloat16, as raw bits.
#[repr(transparent)]
#[derive(Clone, Copy)]
pub struct BF16(pub u16);

impl Elem for f32 {
    const WIDER_THAN_F16: bool = true;
    #[inline(always)]
    fn to_f32(self) -> f32 {
        self
    }
    #[inline(always)]
    fn from_f32(v: f32) -> Self {
        v
    }

    #[inline(always)]
    unsafe fn store4(dst: *mut Self, v: [f32; 4]) {
        unsafe { crate::intrinsics::st_global_v4_f32(dst, v) };
    }

    #[inline(always)]
    unsafe fn store2(dst: *mut Self, v: [f32; 2]) {
        unsafe {
            asm!("st.global.v2.f32 [{p}], {{{a}, {b}}};", p = in(reg64) dst, a = in(reg32) v[0], b = in(reg32) v[1],
                 options(nostack))
        };
    }
}

impl Elem for F16 {
    const WIDER_THAN_F16: bool = false;
    #[inline(always)]
    fn to_f32(self) -> f32 {
        let r: u32;
        unsafe {
            asm!("cvt.f32.f16 {r}, {h};", r = out(reg32) r, h = in(reg16) self.0, options(pure, nomem, nostack))
        };
        f32::from_bits(r)
    }
    #[inline(always)]
    fn from_f32(v: f32) -> Self {
        let h: u16;
        unsafe {
            asm!("cvt.rn.f16.f32 {h}, {v};", h = out(reg16) h, v = in(reg32) v.to_bits(), options(pure, nomem, nostack))
        };
        F16(h)
    }

    #[inline(always)]
    unsafe fn store4(dst: *mut Self, v: [f32; 4]) {
        unsafe { store4_16bit(dst as *mut u16, v.map(|x| Self::from_f32(x).0)) };
    }

    #[inline(always)]
    unsafe fn store2(dst: *mut Self, v: [f32; 2]) {
        unsafe { store2_16bit(dst as *mut u16, v.map(|x| Self::from_f32(x).0)) };
    }
}

impl Elem for BF16 {
    const WIDER_THAN_F16: bool = true;
    #[inline(always)]
    fn to_f32(self) -> f32 {
        f32::from_bits((self.0 as u32) << 16)
    }
    #[inline(always)]
    fn from_f32(v: f32) -> Self {
        let h: u16;
        unsafe {
            asm!("cvt.rn.bf16.f32 {h}, {v};", h = out(reg16) h, v = in(reg32) v.to_bits(), options(pure, nomem, nostack))
        };
        BF16(h)
    }

    #[inline(always)]
    unsafe fn store4(dst: *mut Self, v: [f32; 4]) {
        unsafe { store4_16bit(dst as *mut u16, v.map(|x| Self::from_f32(x).0)) };
    }

    #[inline(always)]
    unsafe fn store2(dst: *mut Self, v: [f32; 2]) {
        unsafe { store2_16bit(dst as *mut u16, v.map(|x| Self::from_f32(x).0)) };
    }
}

/// 16-bit elements the tensor cores multiply: `mma.sync.m16n8k16` with f32 accumulation.
pub trait MmaElem: Elem {
    /// The element of raw bits `bits`.
    fn from_bits(bits: u16) -> Self;
    /// Packs two f32 into one register, `lo` in the low half.
    fn pack2(lo: f32, hi: f32) -> u32;
    /// `acc += a · b` for one 16×8×16 tile.
    fn mma(acc: &mut [f32; 4], a: [u32; 4], b0: u32, b1: u32);
}

macro_rules! mma_elem {
    ($t:ty, $cvt:literal, $mma:literal) => {
        impl MmaElem for $t {
            #[inline(always)]
            fn from_bits(bits: u16) -> Self {
                Self(bits)
            }
            #[inline(always)]
            fn pack2(lo: f32, hi: f32) -> u32 {
                let r: u32;
                unsafe {
                    asm!(concat!($cvt, " {r}, {hi}, {lo};"), r = out(reg32) r,
                         hi = in(reg32) hi.to_bits(), lo = in(reg32) lo.to_bits(), options(pure, nomem, nostack))
                };
                r
            }
            #[inline(always)]
            fn mma(acc: &mut [f32; 4], a: [u32; 4], b0: u32, b1: u32) {
                let (mut c0, mut c1, mut c2, mut c3) =
                    (acc[0].to_bits(), acc[1].to_bits(), acc[2].to_bits(), acc[3].to_bits());
                unsafe {
                    asm!(concat!($mma, " {{{c0}, {c1}, {c2}, {c3}}}, {{{a0}, {a1}, {a2}, {a3}}}, {{{b0}, {b1}}}, {{{c0}, {c1}, {c2}, {c3}}};"),
                         c0 = inout(reg32) c0, c1 = inout(reg32) c1, c2 = inout(reg32) c2, c3 = inout(reg32) c3,
                         a0 = in(reg32) a[0], a1 = in(reg32) a[1], a2 = in(reg32) a[2], a3 = in(reg32) a[3],
                         b0 = in(reg32) b0, b1 = in(reg32) b1, options(nomem, nostack))
                };
                *acc = [f32::from_bits(c0), f32::from_bits(c1), f32::from_bits(c2), f32::from_bits(c3)];
            }
        }
    };
}

mma_elem!(F16, "cvt.rn.f16x2.f32", "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32");
mma_elem!(BF16, "cvt.rn.bf16x2.f32", "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32");
