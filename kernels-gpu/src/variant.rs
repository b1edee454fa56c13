//! Attention variants of the decode kernels, as the host's `reference::decode_variant` defines
//! them.
//!
//! - **Logits soft-cap** is a compile-time variant ([`Logits`], FlashInfer's `variants.cuh`
//!   pattern): the entries `decode_*_softcap_*` turn each score `q·k` into `cap · tanh(sm_scale ·
//!   q·k / cap)` (in the base-2 domain), the plain entries keep `sm_scale · q·k`, so their code
//!   is unchanged. `tanh` is [`tanh`] below (about 2e-7 relative error), not `tanh.approx.f32`,
//!   whose 2^-11 relative error is an absolute error of up to `cap · 2^-11` on a logit (0.024 at
//!   cap 50): that much on the largest logits exceeds f16's 1e-3 budget.
//! - **Sliding window** is a run-time parameter of every entry (`p.window_left`, `u32::MAX`
//!   off): a request of `len` tokens attends to `[window_start, len)`. The partition and the
//!   schedule size chunks by the attended tokens ([`attended`]) and every chunk starts at or after
//!   [`window_start`], so only the window's pages are read.
//! - **Attention sinks** are a run-time tensor (`p.sinks`, 0 without): one logit per query head
//!   (natural-log domain, as the scaled logits) in the softmax's denominator, applied to the
//!   finished row only ([`with_sink`]): by the CTA that writes `o` of a whole request, or by
//!   the split merge. The main loop never sees it.

use core::arch::asm;

use crate::intrinsics::*;
use crate::params::DecodeParams;

const LOG2_E: f32 = core::f32::consts::LOG2_E;

/// How a decode entry turns a score `q·k` into its base-2 logit (compile-time variant).
pub trait Logits {
    /// Whether the logit is soft-capped (its polynomial keeps more registers in the main loop).
    const SOFT_CAPPED: bool;
    fn logit(p: &DecodeParams, score: f32) -> f32;
}

/// Plain attention: `sm_scale · log2(e) · q·k`.
pub struct Plain;
impl Logits for Plain {
    const SOFT_CAPPED: bool = false;
    #[inline(always)]
    fn logit(p: &DecodeParams, score: f32) -> f32 {
        score * p.scale_log2
    }
}

/// Logits soft-cap: `cap · log2(e) · tanh(q·k · sm_scale / cap)`.
pub struct SoftCap;
impl Logits for SoftCap {
    const SOFT_CAPPED: bool = true;
    #[inline(always)]
    fn logit(p: &DecodeParams, score: f32) -> f32 {
        tanh(score * p.soft_cap_scale) * p.soft_cap_log2
    }
}

/// `rcp.approx.ftz.f32`: 1/x within 1 ulp.
#[inline(always)]
fn rcp(x: f32) -> f32 {
    let r: u32;
    unsafe {
        asm!("rcp.approx.ftz.f32 {r}, {x};", r = out(reg32) r, x = in(reg32) x.to_bits(),
             options(pure, nomem, nostack))
    };
    f32::from_bits(r)
}

/// `tanh(y)` to about 2e-7 relative error, without branches: an odd polynomial below |y| = 0.6
/// (least squares over [0, 0.6], 7e-8 relative error in f32 arithmetic), `1 - 2 / (e^{2|y|} + 1)`
/// from there (`ex2.approx` and `rcp.approx`, each within about 2^-22; the result is at least
/// 0.53, so the subtraction loses nothing). Large |y| gives ±1 (`e^{2|y|}` = inf).
#[inline(always)]
pub fn tanh(y: f32) -> f32 {
    let a = f32::from_bits(y.to_bits() & 0x7fff_ffff);
    let t = y * y;
    let poly = -5.883_243e-3;
    let poly = poly * t + 2.078_515_7e-2;
    let poly = poly * t - 5.378_040_3e-2;
    let poly = poly * t + 1.333_188e-1;
    let poly = poly * t - 3.333_329_6e-1;
    let small = y + (y * t) * poly;
    let large = 1.0 - 2.0 * rcp(exp2(a * (2.0 * LOG2_E)) + 1.0);
    let large = f32::from_bits(large.to_bits() | (y.to_bits() & 0x8000_0000));
    if a < 0.6 { small } else { large }
}

/// First token of a request of `len` tokens that its sliding window attends to.
#[inline(always)]
pub fn window_start(p: &DecodeParams, len: u32) -> u32 {
    len - attended(p, len)
}

/// Tokens of a request of `len` tokens that its sliding window attends to: `min(len,
/// window_left + 1)` (`len` without a window, whose `window_left` is `u32::MAX`).
#[inline(always)]
pub fn attended(p: &DecodeParams, len: u32) -> u32 {
    len.min(p.window_left.saturating_add(1))
}

/// `(1 / l, lse)` of a finished output row of query head `head` (of the request), whose
/// softmax denominator is `l` and base-2 log-sum-exp `lse`, with the head's attention sink
/// added to the denominator: `lse' = log2(2^lse + 2^{sink · log2(e)})`, and the output scaled
/// by `2^{lse - lse'}`. A row with no token (`lse = -inf`, `1 / l = 0`) gets `lse' = sink ·
/// log2(e)` and stays 0; a sink of `-inf` (or `p.sinks == 0`) changes nothing.
#[inline(always)]
pub fn with_sink(p: &DecodeParams, head: u32, inv: f32, lse: f32) -> (f32, f32) {
    if p.sinks == 0 {
        return (inv, lse);
    }
    let sink = unsafe { *(p.sinks as *const f32).add(head as usize) } * LOG2_E;
    if sink == f32::NEG_INFINITY {
        return (inv, lse);
    }
    let m = fmax(lse, sink);
    let total = m + log2(exp2(lse - m) + exp2(sink - m));
    (inv * exp2(lse - total), total)
}
