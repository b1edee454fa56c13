//! Device kernels of `paged-decode`, compiled to PTX by rustc's NVPTX backend.
//!
//! Every `#[no_mangle] extern "ptx-kernel"` function here is a PTX entry point; the builder keeps
//! exactly these and internalizes the rest. Algorithms live in their modules; this file only
//! instantiates them per element type and head_dim.
//!
//! # Safety model
//!
//! Every entry point is an `unsafe fn` whose whole contract is its parameter block
//! ([`params`]): each pointer is the device address of a live allocation of the launching
//! context that holds at least the elements its documented shape needs for the block's scalars
//! (the host checks every tensor's shape, contiguity and storage against the descriptor and
//! refuses tensors of another context), the K/V store has at most 2^32 - 1 rows and every row of
//! a K/V view lies within 2^32 16-byte units of its start, in its allocation (so row offsets in
//! `u32` cannot wrap), `sinks` (when not 0) holds `num_qo_heads` f32, and no other launch writes what the kernel reads or
//! touches what it writes while it runs (the host's stream order). The *values* of the page
//! table (`indptr`, `indices`, `last_page_len`) are never trusted: every index derived from them
//! is clamped or checked before it addresses memory, so a corrupt table gives unspecified
//! values but no access outside the tensors.
//!
//! What each kernel may touch:
//! - `decode_*`: reads `q`, the K/V store, `indptr[..=batch]`, `last_page_len[..batch]`,
//!   `indices[..num_indices]`, `sinks` (when not 0) and, on the scheduled paths, the item map
//!   (`item_map`, when not 0, whose entries are clamped like the table's); writes the `o` and
//!   `lse` rows of its (request, head block).
//!   In bounds because the request, KV head and head block come from the grid (`< batch`,
//!   `< num_kv_heads`, query heads `< num_qo_heads`; with stacked KV heads the grid's y is
//!   `num_kv_heads >> stack_shift`, which the host makes exact), `indptr` values are clamped into
//!   `[0, num_indices]`, page slots into the request's pages, page ids into
//!   `[0, num_total_pages)` and in-page positions below `page_size`. The split variants also
//!   write the partial `(O, lse)` rows of their item (`< num_chunks`, the workspace's extent)
//!   and one `[ticket, done]` counter pair per (request, KV head, head block) of split-KV
//!   state, which is zero before the launch and left zero after it. The guessing entries
//!   (`decode_mma_guess_*`) also read `indptr`, `last_page_len` and `indices` before
//!   `griddepcontrol.wait`, while the previous kernel may still write them: those values only
//!   choose (clamped) addresses to fetch first (and, in the split ones, a chunk to start on),
//!   and every value the result depends on is read again after the wait, before any write.
//! - `append_*`: reads one `key` / `value` row per (request, KV head) of the grid; writes one
//!   row of each store, and only after checking `0 ≤ indptr[b] < indptr[b + 1] ≤ num_indices`,
//!   `last_page_len[b] ∈ [1, page_size]` and the page id in `[0, num_total_pages)`; otherwise
//!   it writes nothing.
//! - `schedule_chunks`: reads `indptr[..=batch]` and `last_page_len[..batch]` (clamped as in
//!   `decode_*`); writes the item map's header and at most `num_chunks` item pairs
//!   (`item_map_bytes(num_chunks)` bytes of the workspace at `item_map`).
//! - `check_page_table`: reads `indptr[b]`, `indptr[b + 1]` and `last_page_len[b]` for
//!   `b < batch`, and `indices` only inside `[indptr[b], indptr[b + 1])` after checking
//!   `0 ≤ indptr[b] ≤ indptr[b + 1] ≤ num_indices`; writes the one-word `status` (atomically)
//!   and, in append mode, `slots[b]`.
//! - `read_bandwidth`: reads `vectors` 16-byte vectors of `src`; writes at most one `u32` to
//!   `sink`.

#![no_std]
#![feature(abi_ptx, stdarch_nvptx, asm_experimental_arch)]

pub mod append;
pub mod bandwidth;
pub mod cache;
pub mod check;
pub mod chunking;
pub mod decode;
pub mod element;
pub mod fp8;
pub mod fp8_operands;
pub mod intrinsics;
pub mod merge;
pub mod params;
pub mod partition;
pub mod schedule;
pub mod variant;

use cache::Native;
use decode::{Lean, Standard, Tiling};
use element::{BF16, F16};
use params::{AppendParams, DecodeParams, PageTableCheckParams, decode_merge_batch};
use variant::{Plain, SoftCap};

#[panic_handler]
fn panic(_: &core::panic::PanicInfo) -> ! {
    // SAFETY: `trap` aborts the kernel; it has no precondition.
    unsafe { core::arch::nvptx::trap() }
}

/// The tensor-core decode entry `$name` over the K/V cache format `$cache` ([`cache::KvCache`]).
/// `$stack` (`decode::decode_mma`'s `STACK`, the stack shift) defaults to the run-time one in
/// the unsplit, unguessing entries of a tiling that stacks heads, and to 0 in the others.
macro_rules! decode_mma_entry {
    ($name:ident, $cache:ty, $d:literal, $tiling:ident, $split:literal) => {
        decode_mma_entry!($name, $cache, $d, $tiling, $split, Plain, false);
    };
    ($name:ident, $cache:ty, $d:literal, $tiling:ident, $split:literal, $logits:ident) => {
        decode_mma_entry!($name, $cache, $d, $tiling, $split, $logits, false);
    };
    ($name:ident, $cache:ty, $d:literal, $tiling:ident, $split:literal, $logits:ident, $guess:literal) => {
        decode_mma_entry!($name, $cache, $d, $tiling, $split, $logits, $guess, {
            if $tiling::<$d>::T.stacks_heads && !$split && !$guess {
                crate::params::ANY_STACK_SHIFT
            } else {
                0
            }
        });
    };
    (
        $name:ident,
        $cache:ty,
        $d:literal,
        $tiling:ident,
        $split:literal,
        $logits:ident,
        $guess:literal,
        $stack:block
    ) => {
        /// # Safety
        /// `p` satisfies the [safety model](crate#safety-model) of `decode_*`.
        #[unsafe(no_mangle)]
        pub unsafe extern "ptx-kernel" fn $name(p: DecodeParams) {
            unsafe {
                decode::decode_mma::<
                    $cache,
                    $d,
                    { $d / 16 },
                    { $d / 8 / $tiling::<$d>::T.d_parts as usize },
                    { $d / 32 },
                    $tiling<$d>,
                    $split,
                    { decode_merge_batch($d) as usize },
                    $logits,
                    $guess,
                    $stack,
                >(&p)
            }
        }
    };
}
decode_mma_entry!(decode_mma_f16_d64, Native<F16>, 64, Standard, false);
decode_mma_entry!(decode_mma_split_f16_d64, Native<F16>, 64, Standard, true);
decode_mma_entry!(decode_mma_f16_d128, Native<F16>, 128, Standard, false);
decode_mma_entry!(decode_mma_split_f16_d128, Native<F16>, 128, Standard, true);
decode_mma_entry!(decode_mma_f16_d256, Native<F16>, 256, Standard, false);
decode_mma_entry!(decode_mma_split_f16_d256, Native<F16>, 256, Standard, true);
decode_mma_entry!(decode_mma_bf16_d64, Native<BF16>, 64, Standard, false);
decode_mma_entry!(decode_mma_split_bf16_d64, Native<BF16>, 64, Standard, true);
decode_mma_entry!(decode_mma_bf16_d128, Native<BF16>, 128, Standard, false);
decode_mma_entry!(decode_mma_split_bf16_d128, Native<BF16>, 128, Standard, true);
decode_mma_entry!(decode_mma_bf16_d256, Native<BF16>, 256, Standard, false);
decode_mma_entry!(decode_mma_split_bf16_d256, Native<BF16>, 256, Standard, true);
// Lean tiling, unsplit: many short requests (see `params::lean_tiling`), one entry per stack
// shift (`1 << shift` KV heads per CTA), so that the shift is a constant of each.
macro_rules! decode_lean_entries {
    ($($cache:ty, $d:literal: $x1:ident, $x2:ident, $x4:ident, $x8:ident, $x16:ident;)*) => {
        $(
            decode_mma_entry!($x1, $cache, $d, Lean, false, Plain, false, { 0 });
            decode_mma_entry!($x2, $cache, $d, Lean, false, Plain, false, { 1 });
            decode_mma_entry!($x4, $cache, $d, Lean, false, Plain, false, { 2 });
            decode_mma_entry!($x8, $cache, $d, Lean, false, Plain, false, { 3 });
            decode_mma_entry!($x16, $cache, $d, Lean, false, Plain, false, { 4 });
        )*
    };
}
decode_lean_entries! {
    Native<F16>, 64: decode_mma_lean_x1_f16_d64, decode_mma_lean_x2_f16_d64, decode_mma_lean_x4_f16_d64,
        decode_mma_lean_x8_f16_d64, decode_mma_lean_x16_f16_d64;
    Native<F16>, 128: decode_mma_lean_x1_f16_d128, decode_mma_lean_x2_f16_d128, decode_mma_lean_x4_f16_d128,
        decode_mma_lean_x8_f16_d128, decode_mma_lean_x16_f16_d128;
    Native<BF16>, 64: decode_mma_lean_x1_bf16_d64, decode_mma_lean_x2_bf16_d64, decode_mma_lean_x4_bf16_d64,
        decode_mma_lean_x8_bf16_d64, decode_mma_lean_x16_bf16_d64;
    Native<BF16>, 128: decode_mma_lean_x1_bf16_d128, decode_mma_lean_x2_bf16_d128, decode_mma_lean_x4_bf16_d128,
        decode_mma_lean_x8_bf16_d128, decode_mma_lean_x16_bf16_d128;
}

/// Lean tiling, split: a long request among many short ones, cut by the scheduled partition.
/// sm_90 only: at the lean entries' 128 registers the sm_80 build spills the split chunk's
/// fields around the main loop.
#[cfg(target_feature = "sm_90")]
mod lean_split_entries {
    use crate::cache::Native;
    use crate::decode::{self, Lean, Tiling};
    use crate::element::{BF16, F16};
    use crate::params::{DecodeParams, decode_merge_batch};
    use crate::variant::Plain;

    decode_mma_entry!(decode_mma_lean_split_f16_d64, Native<F16>, 64, Lean, true);
    decode_mma_entry!(decode_mma_lean_split_f16_d128, Native<F16>, 128, Lean, true);
    decode_mma_entry!(decode_mma_lean_split_bf16_d64, Native<BF16>, 64, Lean, true);
    decode_mma_entry!(decode_mma_lean_split_bf16_d128, Native<BF16>, 128, Lean, true);
}

/// Entries that guess their page lookup before `griddepcontrol.wait` (the default programmatic
/// launch of at most one CTA per SM, one and a half waves on the split path; see
/// `decode::decode_mma`), with plain logits: whole requests (standard and lean tilings, every
/// cache) and split chunks (16-bit caches, standard tiling). sm_90 only, where CTAs start under
/// the previous kernel.
#[cfg(target_feature = "sm_90")]
mod guess_entries {
    use crate::cache::{E4M3, E5M2, Fp8, Native};
    use crate::decode::{self, Fp8Lean, Fp8Standard, Lean, Standard, Tiling};
    use crate::element::{BF16, F16};
    use crate::params::{DecodeParams, decode_merge_batch};
    use crate::variant::Plain;

    decode_mma_entry!(decode_mma_guess_f16_d64, Native<F16>, 64, Standard, false, Plain, true);
    decode_mma_entry!(decode_mma_guess_f16_d128, Native<F16>, 128, Standard, false, Plain, true);
    decode_mma_entry!(decode_mma_guess_f16_d256, Native<F16>, 256, Standard, false, Plain, true);
    decode_mma_entry!(decode_mma_guess_bf16_d64, Native<BF16>, 64, Standard, false, Plain, true);
    decode_mma_entry!(decode_mma_guess_bf16_d128, Native<BF16>, 128, Standard, false, Plain, true);
    decode_mma_entry!(decode_mma_guess_bf16_d256, Native<BF16>, 256, Standard, false, Plain, true);
    decode_mma_entry!(decode_mma_guess_lean_f16_d64, Native<F16>, 64, Lean, false, Plain, true);
    decode_mma_entry!(decode_mma_guess_lean_f16_d128, Native<F16>, 128, Lean, false, Plain, true);
    decode_mma_entry!(decode_mma_guess_lean_bf16_d64, Native<BF16>, 64, Lean, false, Plain, true);
    decode_mma_entry!(decode_mma_guess_lean_bf16_d128, Native<BF16>, 128, Lean, false, Plain, true);
    decode_mma_entry!(decode_mma_guess_split_f16_d64, Native<F16>, 64, Standard, true, Plain, true);
    decode_mma_entry!(decode_mma_guess_split_f16_d128, Native<F16>, 128, Standard, true, Plain, true);
    decode_mma_entry!(decode_mma_guess_split_f16_d256, Native<F16>, 256, Standard, true, Plain, true);
    decode_mma_entry!(decode_mma_guess_split_bf16_d64, Native<BF16>, 64, Standard, true, Plain, true);
    decode_mma_entry!(decode_mma_guess_split_bf16_d128, Native<BF16>, 128, Standard, true, Plain, true);
    decode_mma_entry!(decode_mma_guess_split_bf16_d256, Native<BF16>, 256, Standard, true, Plain, true);

    /// The guessing entries of q type `$t` over the 8-bit cache `$code`: whole at every head_dim,
    /// lean at 64 and 128.
    macro_rules! decode_fp8_guess_entries {
        ($($t:ty, $code:ty: $d64:ident, $d128:ident, $d256:ident, $lean64:ident, $lean128:ident;)*) => {
            $(
                decode_mma_entry!($d64, Fp8<$t, $code>, 64, Fp8Standard, false, Plain, true);
                decode_mma_entry!($d128, Fp8<$t, $code>, 128, Fp8Standard, false, Plain, true);
                decode_mma_entry!($d256, Fp8<$t, $code>, 256, Fp8Standard, false, Plain, true);
                decode_mma_entry!($lean64, Fp8<$t, $code>, 64, Fp8Lean, false, Plain, true);
                decode_mma_entry!($lean128, Fp8<$t, $code>, 128, Fp8Lean, false, Plain, true);
            )*
        };
    }
    decode_fp8_guess_entries! {
        F16, E4M3: decode_mma_guess_f16_e4m3_d64, decode_mma_guess_f16_e4m3_d128, decode_mma_guess_f16_e4m3_d256,
            decode_mma_guess_lean_f16_e4m3_d64, decode_mma_guess_lean_f16_e4m3_d128;
        BF16, E4M3: decode_mma_guess_bf16_e4m3_d64, decode_mma_guess_bf16_e4m3_d128, decode_mma_guess_bf16_e4m3_d256,
            decode_mma_guess_lean_bf16_e4m3_d64, decode_mma_guess_lean_bf16_e4m3_d128;
        F16, E5M2: decode_mma_guess_f16_e5m2_d64, decode_mma_guess_f16_e5m2_d128, decode_mma_guess_f16_e5m2_d256,
            decode_mma_guess_lean_f16_e5m2_d64, decode_mma_guess_lean_f16_e5m2_d128;
        BF16, E5M2: decode_mma_guess_bf16_e5m2_d64, decode_mma_guess_bf16_e5m2_d128, decode_mma_guess_bf16_e5m2_d256,
            decode_mma_guess_lean_bf16_e5m2_d64, decode_mma_guess_lean_bf16_e5m2_d128;
    }
}

/// Tensor-core decode over an 8-bit cache (`cvt.rn.f16x2.e4m3x2` needs sm_89: the sm_90 build
/// only).
#[cfg(target_feature = "sm_90")]
mod fp8_entries {
    use crate::cache::{E4M3, E5M2, Fp8};
    use crate::decode::{self, Fp8Lean, Fp8Standard, Tiling};
    use crate::element::{BF16, F16};
    use crate::params::{AppendParams, DecodeParams, decode_merge_batch};
    use crate::variant::Plain;

    macro_rules! decode_fp8_entry {
        ($name:ident, $t:ty, $code:ty, $d:literal, $tiling:ident, $split:literal) => {
            decode_mma_entry!($name, Fp8<$t, $code>, $d, $tiling, $split);
        };
    }
    macro_rules! decode_fp8_entries {
        ($($whole:ident, $split:ident, $t:ty, $code:ty, $d:literal;)*) => {
            $(
                decode_fp8_entry!($whole, $t, $code, $d, Fp8Standard, false);
                decode_fp8_entry!($split, $t, $code, $d, Fp8Standard, true);
            )*
        };
    }
    decode_fp8_entries! {
        decode_mma_f16_e4m3_d64, decode_mma_split_f16_e4m3_d64, F16, E4M3, 64;
        decode_mma_f16_e4m3_d128, decode_mma_split_f16_e4m3_d128, F16, E4M3, 128;
        decode_mma_f16_e4m3_d256, decode_mma_split_f16_e4m3_d256, F16, E4M3, 256;
        decode_mma_bf16_e4m3_d64, decode_mma_split_bf16_e4m3_d64, BF16, E4M3, 64;
        decode_mma_bf16_e4m3_d128, decode_mma_split_bf16_e4m3_d128, BF16, E4M3, 128;
        decode_mma_bf16_e4m3_d256, decode_mma_split_bf16_e4m3_d256, BF16, E4M3, 256;
        decode_mma_f16_e5m2_d64, decode_mma_split_f16_e5m2_d64, F16, E5M2, 64;
        decode_mma_f16_e5m2_d128, decode_mma_split_f16_e5m2_d128, F16, E5M2, 128;
        decode_mma_f16_e5m2_d256, decode_mma_split_f16_e5m2_d256, F16, E5M2, 256;
        decode_mma_bf16_e5m2_d64, decode_mma_split_bf16_e5m2_d64, BF16, E5M2, 64;
        decode_mma_bf16_e5m2_d128, decode_mma_split_bf16_e5m2_d128, BF16, E5M2, 128;
        decode_mma_bf16_e5m2_d256, decode_mma_split_bf16_e5m2_d256, BF16, E5M2, 256;
    }
    // Lean tiling, unsplit: many short requests (see `params::fp8_lean_tiling`).
    decode_fp8_entry!(decode_mma_lean_f16_e4m3_d64, F16, E4M3, 64, Fp8Lean, false);
    decode_fp8_entry!(decode_mma_lean_f16_e4m3_d128, F16, E4M3, 128, Fp8Lean, false);
    decode_fp8_entry!(decode_mma_lean_bf16_e4m3_d64, BF16, E4M3, 64, Fp8Lean, false);
    decode_fp8_entry!(decode_mma_lean_bf16_e4m3_d128, BF16, E4M3, 128, Fp8Lean, false);
    decode_fp8_entry!(decode_mma_lean_f16_e5m2_d64, F16, E5M2, 64, Fp8Lean, false);
    decode_fp8_entry!(decode_mma_lean_f16_e5m2_d128, F16, E5M2, 128, Fp8Lean, false);
    decode_fp8_entry!(decode_mma_lean_bf16_e5m2_d64, BF16, E5M2, 64, Fp8Lean, false);
    decode_fp8_entry!(decode_mma_lean_bf16_e5m2_d128, BF16, E5M2, 128, Fp8Lean, false);

    macro_rules! append_quantized_entry {
        ($name:ident, $t:ty, $format:expr) => {
            /// # Safety
            /// See [`append::append_quantized`](crate::append::append_quantized).
            #[unsafe(no_mangle)]
            pub unsafe extern "ptx-kernel" fn $name(p: AppendParams) {
                unsafe { crate::append::append_quantized::<$t>(&p, $format) }
            }
        };
    }
    append_quantized_entry!(append_f16_e4m3, F16, crate::fp8::E4M3);
    append_quantized_entry!(append_bf16_e4m3, BF16, crate::fp8::E4M3);
    append_quantized_entry!(append_f16_e5m2, F16, crate::fp8::E5M2);
    append_quantized_entry!(append_bf16_e5m2, BF16, crate::fp8::E5M2);
}

macro_rules! decode_simt_entry {
    ($name:ident, $t:ty, $d:literal, $split:literal) => {
        decode_simt_entry!($name, $t, $d, $split, Plain);
    };
    ($name:ident, $t:ty, $d:literal, $split:literal, $logits:ident) => {
        /// # Safety
        /// `p` satisfies the [safety model](crate#safety-model) of `decode_*`.
        #[unsafe(no_mangle)]
        pub unsafe extern "ptx-kernel" fn $name(p: DecodeParams) {
            unsafe { decode::decode_simt::<$t, $d, { $d / 32 }, $split, $logits>(&p) }
        }
    };
}
decode_simt_entry!(decode_simt_f32_d64, f32, 64, false);
decode_simt_entry!(decode_simt_split_f32_d64, f32, 64, true);
decode_simt_entry!(decode_simt_f32_d128, f32, 128, false);
decode_simt_entry!(decode_simt_split_f32_d128, f32, 128, true);
decode_simt_entry!(decode_simt_f32_d256, f32, 256, false);
decode_simt_entry!(decode_simt_split_f32_d256, f32, 256, true);
// Logits soft-cap (`variant::SoftCap`), standard tiling and CUDA-core kernels: own entries, so
// that the plain ones above stay as they are.
decode_mma_entry!(decode_mma_softcap_f16_d64, Native<F16>, 64, Standard, false, SoftCap);
decode_mma_entry!(decode_mma_softcap_split_f16_d64, Native<F16>, 64, Standard, true, SoftCap);
decode_mma_entry!(decode_mma_softcap_f16_d128, Native<F16>, 128, Standard, false, SoftCap);
decode_mma_entry!(decode_mma_softcap_split_f16_d128, Native<F16>, 128, Standard, true, SoftCap);
decode_mma_entry!(decode_mma_softcap_f16_d256, Native<F16>, 256, Standard, false, SoftCap);
decode_mma_entry!(decode_mma_softcap_split_f16_d256, Native<F16>, 256, Standard, true, SoftCap);
decode_mma_entry!(decode_mma_softcap_bf16_d64, Native<BF16>, 64, Standard, false, SoftCap);
decode_mma_entry!(decode_mma_softcap_split_bf16_d64, Native<BF16>, 64, Standard, true, SoftCap);
decode_mma_entry!(decode_mma_softcap_bf16_d128, Native<BF16>, 128, Standard, false, SoftCap);
decode_mma_entry!(decode_mma_softcap_split_bf16_d128, Native<BF16>, 128, Standard, true, SoftCap);
decode_mma_entry!(decode_mma_softcap_bf16_d256, Native<BF16>, 256, Standard, false, SoftCap);
decode_mma_entry!(decode_mma_softcap_split_bf16_d256, Native<BF16>, 256, Standard, true, SoftCap);
decode_simt_entry!(decode_simt_softcap_f32_d64, f32, 64, false, SoftCap);
decode_simt_entry!(decode_simt_softcap_split_f32_d64, f32, 64, true, SoftCap);
decode_simt_entry!(decode_simt_softcap_f32_d128, f32, 128, false, SoftCap);
decode_simt_entry!(decode_simt_softcap_split_f32_d128, f32, 128, true, SoftCap);
decode_simt_entry!(decode_simt_softcap_f32_d256, f32, 256, false, SoftCap);
decode_simt_entry!(decode_simt_softcap_split_f32_d256, f32, 256, true, SoftCap);

macro_rules! append_entry {
    ($name:ident, $t:ty) => {
        /// # Safety
        /// See [`append::append_token`].
        #[unsafe(no_mangle)]
        pub unsafe extern "ptx-kernel" fn $name(p: AppendParams) {
            unsafe { append::append_token::<$t>(&p) }
        }
    };
}
append_entry!(append_f16, F16);
append_entry!(append_bf16, BF16);
append_entry!(append_f32, f32);
// Tokens already quantized to 8-bit codes: a byte copy.
append_entry!(append_u8, u8);

/// # Safety
/// See [`schedule::schedule_chunks`].
#[unsafe(no_mangle)]
pub unsafe extern "ptx-kernel" fn schedule_chunks(p: DecodeParams) {
    unsafe { schedule::schedule_chunks(&p) }
}

/// # Safety
/// See [`check::check_page_table`].
#[unsafe(no_mangle)]
pub unsafe extern "ptx-kernel" fn check_page_table(p: PageTableCheckParams) {
    unsafe { check::check_page_table(&p) }
}

/// # Safety
/// See [`bandwidth::read_bandwidth`].
#[unsafe(no_mangle)]
pub unsafe extern "ptx-kernel" fn read_bandwidth(
    src: *const u8,
    vectors: u64,
    sentinel: u32,
    sink: *mut u32,
) {
    unsafe { bandwidth::read_bandwidth(src, vectors, sentinel, sink) }
}
