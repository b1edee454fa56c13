//! Tensor-core operands of the decode from an 8-bit K/V cache ([`crate::cache::Fp8`]).
//!
//! `mma.m16n8k16` pairs its operands along k in 16-bit registers, and `ldmatrix` moves 16-bit
//! elements only, so the 8-bit tiles are read with plain shared loads and three free
//! permutations make every lane's bytes contiguous:
//! - **q's columns** (S = Q·Kᵀ, k = head dimension): in k-step `kk = 4·g + s`, lane column pair
//!   `c` (`lane % 4`) takes its K pair `(2c, 2c+1)` from bytes `4s, 4s+1` and its pair
//!   `(2c+8, 2c+9)` from bytes `4s+2, 4s+3` of 16-byte chunk `4g + c` of the token's row. Q is
//!   staged into shared memory with the same permutation of its columns ([`stage_q`]), so the dot
//!   products are unchanged and one 16-byte load feeds four k-steps.
//! - **S's columns** (= P's k, tokens of a 16-token block): column `2c + j` of n-tile `nt` is
//!   token `4c + 2·nt + j` ([`score_token`]), so P·V's k pairs `(2c, 2c+1)` and `(2c+8, 2c+9)`
//!   are the lane's tokens `4c…4c+3`, whose rows it reads itself.
//! - **O's columns**: of a warp's `DN` n-tiles, n-tile `j` row `n` (`lane / 4`) is output column
//!   `DN·n + j` ([`out_col`]), so a lane's V bytes are `DN` consecutive columns of its 4 rows; a
//!   byte permute puts two tokens of one column side by side.
//!
//! Tiles are `[rows][D]` bytes, 16-byte chunks XOR-swizzled inside each 128-byte line
//! ([`swizzle8`]) so that the K loads (8 rows of 64 bytes per quarter warp), the V loads (4
//! rows × 32 bytes) and the `cp.async` stores all hit distinct bank groups.

use crate::cache::KvCache;
use crate::element::{Elem, F16, MmaElem};
use crate::intrinsics::*;
use crate::params::{DECODE_THREADS, DecodeParams};

/// Byte offset of 16-byte chunk `c` of row `r` in an 8-bit `[rows][D]` tile.
#[inline(always)]
pub fn swizzle8<const D: u32>(r: u32, c: u32) -> u32 {
    let linear = r * D + c * 16;
    let flip = (((r >> 2) & 3) << 1) ^ if D >= 128 { (r & 1) << 2 } else { 0 };
    (linear & !127) | ((((linear >> 4) & 7) ^ flip) << 4)
}

/// Token (of its 16-token block) of column `2·pair + j` of S's n-tile `nt`.
#[inline(always)]
pub fn score_token(nt: u32, pair: u32, j: u32) -> u32 {
    4 * pair + 2 * nt + j
}

/// Output column (from the warp's first) of element `j` of the pair `pair` in n-tile `n` of a
/// warp's `DN` n-tiles.
#[inline(always)]
pub fn out_col<const DN: usize>(n: u32, pair: u32, j: u32) -> u32 {
    DN as u32 * (2 * pair + j) + n
}

/// `S = Q·Kᵀ` for the 16 tokens of the block at row `row0` of the 8-bit K tile `k_tile` (two
/// n-tiles of 8, columns as [`score_token`]); `q_frag(kk)` gives the A fragment of k-step `kk`.
/// Even and odd k-steps accumulate separately (two dependent MMA chains).
///
/// # Safety
/// Warp-collective; `k_tile` holds the block's 16 rows, swizzled as [`swizzle8`].
#[inline(always)]
pub unsafe fn scores<C: KvCache, const D: u32, const QK: usize>(
    q_frag: impl Fn(usize) -> [u32; 4],
    k_tile: u32,
    row0: u32,
    lane: u32,
) -> [[f32; 4]; 2] {
    let (n, c) = (lane / 4, lane % 4);
    let rows = [row0 + score_token(0, n / 2, n & 1), row0 + score_token(1, n / 2, n & 1)];
    let mut s = [[0f32; 4]; 2];
    let mut s_odd = [[0f32; 4]; 2];
    for g in 0..D / 64 {
        let k = rows.map(|r| unsafe { ld_shared_v4_u32(k_tile + swizzle8::<D>(r, 4 * g + c)) });
        for step in 0..4 {
            let kk = (4 * g) as usize + step;
            let q = q_frag(kk);
            let acc = if kk % 2 == 0 { &mut s } else { &mut s_odd };
            for nt in 0..2 {
                let [b0, b1] = C::dequant4(k[nt][step]);
                C::Mma::mma(&mut acc[nt], q, b0, b1);
            }
        }
    }
    for nt in 0..2 {
        for i in 0..4 {
            s[nt][i] += s_odd[nt][i];
        }
    }
    s
}

/// The lane's V bytes of the block at row `row0` of the 8-bit V tile `v_tile` for the warp's `DN`
/// n-tiles from output column `col0` (columns as [`out_col`]): rows `4c…4c+3` of the block
/// (`c = lane % 4`), `DN` bytes from column `col0 + DN·(lane / 4)` each. Loaded ahead of the
/// softmax, so that their latency hides behind it.
///
/// # Safety
/// `v_tile` holds the block's 16 rows, swizzled as [`swizzle8`].
#[inline(always)]
pub unsafe fn load_v<const D: u32, const DN: usize>(
    v_tile: u32,
    row0: u32,
    col0: u32,
    lane: u32,
) -> [[u32; 4]; 4] {
    const { assert!(DN == 8 || DN == 16) };
    let (n, c) = (lane / 4, lane % 4);
    let first = col0 + DN as u32 * n;
    let mut w = [[0u32; 4]; 4];
    for r in 0..4 {
        let at = v_tile + swizzle8::<D>(row0 + 4 * c + r as u32, first / 16);
        if DN == 16 {
            w[r] = unsafe { ld_shared_v4_u32(at) };
        } else {
            let [a, b] = unsafe { ld_shared_v2_u32(at + (first % 16)) };
            w[r] = [a, b, 0, 0];
        }
    }
    w
}

/// `O += P·V` for the warp's `DN` n-tiles, from the lane's V bytes `w` ([`load_v`]); `p` is P as
/// the A fragment.
///
/// # Safety
/// Warp-collective.
#[inline(always)]
pub unsafe fn accumulate_pv<C: KvCache, const DN: usize>(
    o: &mut [[f32; 4]; DN],
    p: [u32; 4],
    w: [[u32; 4]; 4],
) {
    for i in 0..DN / 4 {
        // Columns 4i…4i+3: tokens (4c, 4c+1) form b0, (4c+2, 4c+3) form b1.
        let [b0_0, b0_1] = C::dequant4(prmt(w[0][i], w[1][i], 0x5140));
        let [b0_2, b0_3] = C::dequant4(prmt(w[0][i], w[1][i], 0x7362));
        let [b1_0, b1_1] = C::dequant4(prmt(w[2][i], w[3][i], 0x5140));
        let [b1_2, b1_3] = C::dequant4(prmt(w[2][i], w[3][i], 0x7362));
        C::Mma::mma(&mut o[4 * i], p, b0_0, b1_0);
        C::Mma::mma(&mut o[4 * i + 1], p, b0_1, b1_1);
        C::Mma::mma(&mut o[4 * i + 2], p, b0_2, b1_2);
        C::Mma::mma(&mut o[4 * i + 3], p, b0_3, b1_3);
    }
}

/// Stages the `heads` query rows from `first_qo_head` of `request` into the f16 tiles at
/// `q_smem` (`q_tiles · 16` rows, rows past `heads` zero), their columns permuted as the module
/// docs say and swizzled for `ldmatrix`, and writes each row's logit factor (`p.scale_log2 ·
/// p.k_scale`, times the row's power-of-two scale for a q type wider than f16) at
/// `row_scales + 4·row`.
///
/// A q type wider than f16 (bf16) is scaled per row by the power of two that brings its largest
/// magnitude into `[2^14, 2^15)`: exact, and no element overflows f16.
///
/// # Safety
/// All [`DECODE_THREADS`] threads call it; the tiles and `q_tiles · 16` factors fit at their
/// addresses; `request` and the heads index `p.q`.
#[inline(always)]
pub unsafe fn stage_q<C: KvCache, const D: u32>(
    p: &DecodeParams,
    q_smem: u32,
    row_scales: u32,
    q_offset: usize,
    heads: u32,
    q_tiles: u32,
    swizzle: impl Fn(u32, u32) -> u32,
) {
    let columns = D / 8; // 16-byte chunks of an f16 row: `columns` consecutive threads per row
    let mut idx = thread_idx();
    while idx < q_tiles * 16 * columns {
        let (r, chunk) = (idx / columns, idx % columns);
        // Logical chunk: k-step kk = 4g + s, half `h`; its pairs c = 0..3 are the words
        // 32g + 8c + 2s + h of the row.
        let (kk, h) = (chunk / 2, chunk % 2);
        let first_word = 32 * (kk / 4) + 2 * (kk % 4) + h;
        let mut words = [0u32; 4];
        if r < heads {
            let row = unsafe { (p.q as *const C::Io).add(q_offset + (r * D) as usize) } as *const i32;
            for (c, word) in words.iter_mut().enumerate() {
                *word = unsafe { ld_nc_i32(row.add((first_word + 8 * c as u32) as usize)) } as u32;
            }
        }
        let mut factor = p.scale_log2 * p.k_scale;
        if C::Io::WIDER_THAN_F16 {
            // 16-bit wide type (bf16): the row's largest magnitude, over its `columns` threads.
            let mut largest = 0u32;
            for i in 0..4 {
                largest = largest.max(words[i] & 0x7fff).max((words[i] >> 16) & 0x7fff);
            }
            let mut lanes = 1;
            while lanes < columns {
                largest = largest.max(shfl_xor_u32(largest, lanes));
                lanes *= 2;
            }
            // 2^k brings the largest magnitude's binade (bf16 exponent field E) to 2^14.
            let k = (141 - (largest >> 7) as i32).clamp(-100, 100);
            let up = f32::from_bits(((127 + k) as u32) << 23);
            factor *= f32::from_bits(((127 - k) as u32) << 23);
            let bf16 = |bits: u32| f32::from_bits(bits << 16) * up;
            for i in 0..4 {
                words[i] = F16::pack2(bf16(words[i] & 0xffff), bf16(words[i] >> 16));
            }
        }
        unsafe { st_shared_v4(q_smem + swizzle(r, chunk), words) };
        if chunk == 0 {
            unsafe { st_shared_u32(row_scales + r * 4, factor.to_bits()) };
        }
        idx += DECODE_THREADS;
    }
}
