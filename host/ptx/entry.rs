//! Names of the PTX entry points. The kernels define them (`kernels-gpu/src/lib.rs`); the host
//! forms every name it loads here, and [`all`] lists them.

use crate::plan::{DecodeKernel, SUPPORTED_HEAD_DIMS};
use crate::types::ElementKind;

/// The entry that computes a split partition once per launch ([`DecodePath::Scheduled`](crate::DecodePath::Scheduled)).
pub const SCHEDULE_CHUNKS: &str = "schedule_chunks";
/// The page-table check ([`PlanPreference::checked`](crate::PlanPreference::checked)).
pub const CHECK_PAGE_TABLE: &str = "check_page_table";
/// The read-bandwidth probe of the benchmark.
pub const READ_BANDWIDTH: &str = "read_bandwidth";

/// Head dimensions the lean kernel is built for (16-bit and 8-bit caches).
pub const LEAN_HEAD_DIMS: [u32; 2] = [64, 128];

/// KV heads per CTA of the 16-bit lean entries ([`DecodeVariant::LeanHeads`]), one entry each:
/// `1 << shift` for every stack shift up to `params::STACKED_MAX_HEADS`.
pub const LEAN_STACKED_HEADS: [u32; 5] = [1, 2, 4, 8, 16];
const _: () = assert!(LEAN_STACKED_HEADS[LEAN_STACKED_HEADS.len() - 1] == crate::params::STACKED_MAX_HEADS);

/// Which decode entry of a kernel, element type and head_dim.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DecodeVariant {
    /// Whole requests: one chunk per request.
    Whole,
    /// Requests split into chunks by the length-aware partition, then merged.
    Split,
    /// The lean tensor-core kernel for short requests ([`DecodeKernel::Mma`] only) over an 8-bit
    /// cache: one entry for any number of KV heads per CTA (`DecodeParams::stack_shift`).
    Lean,
    /// The lean kernel over a 16-bit cache with `k` KV heads per CTA (stacked), `k` a constant
    /// of the entry (1, 2, 4, 8 or 16: [`LEAN_STACKED_HEADS`]), so that the head and segment
    /// arithmetic of its main loop folds.
    LeanHeads(u32),
    /// The lean kernel over the scheduled partition: a long request among short ones is cut
    /// into chunks and merged ([`DecodeKernel::Mma`] over a 16-bit cache only).
    LeanSplit,
}

/// `decode_{mma|simt}[_split|_lean_x{k}|_lean_split]_{element}_d{head_dim}`.
pub fn decode(kernel: DecodeKernel, variant: DecodeVariant, element: ElementKind, head_dim: u32) -> String {
    decode_name(kernel, "", variant, element, head_dim)
}

/// The logits soft-cap entry of a [`decode`] entry: `decode_{mma|simt}_softcap[_split]_…`
/// (no lean one).
pub fn decode_soft_cap(
    kernel: DecodeKernel,
    variant: DecodeVariant,
    element: ElementKind,
    head_dim: u32,
) -> String {
    decode_name(kernel, "_softcap", variant, element, head_dim)
}

fn decode_name(
    kernel: DecodeKernel,
    logits: &str,
    variant: DecodeVariant,
    element: ElementKind,
    head_dim: u32,
) -> String {
    let kernel = match kernel {
        DecodeKernel::Mma => "mma",
        DecodeKernel::Simt => "simt",
    };
    let variant = match variant {
        DecodeVariant::Whole => String::new(),
        DecodeVariant::Split => "_split".into(),
        DecodeVariant::Lean => "_lean".into(),
        DecodeVariant::LeanHeads(k) => format!("_lean_x{k}"),
        DecodeVariant::LeanSplit => "_lean_split".into(),
    };
    format!("decode_{kernel}{logits}{variant}_{}_d{head_dim}", element_name(element))
}

/// `decode_mma_guess[_lean|_split]_{element}_d{head_dim}` (a 16-bit cache) or
/// `decode_mma_guess[_lean]_{q}_{cache}_d{head_dim}` (an 8-bit one): the tensor-core decode with
/// plain logits that guesses its page lookup before waiting for the previous kernel (sm_90 build
/// only): whole requests ([`DecodeVariant::Whole`] or [`DecodeVariant::Lean`], the lean entries
/// of one KV head per CTA) or the split partition's chunks ([`DecodeVariant::Split`], 16-bit
/// caches only).
pub fn decode_guess(variant: DecodeVariant, q: ElementKind, cache: ElementKind, head_dim: u32) -> String {
    let variant = match variant {
        DecodeVariant::Lean | DecodeVariant::LeanHeads(_) => "_lean",
        DecodeVariant::Split => "_split",
        DecodeVariant::Whole | DecodeVariant::LeanSplit => "",
    };
    let elements = match cache.fp8_layout() {
        Some(_) => format!("{}_{}", element_name(q), element_name(cache)),
        None => element_name(cache).to_owned(),
    };
    format!("decode_mma_guess{variant}_{elements}_d{head_dim}")
}

/// `decode_mma[_split|_lean]_{q}_{cache}_d{head_dim}`: the tensor-core decode of `q` (f16 or bf16)
/// over an 8-bit cache (sm_90 build only). Its lean entry ([`DecodeVariant::Lean`]) takes any
/// number of KV heads per CTA, so [`DecodeVariant::LeanHeads`] names it too.
pub fn decode_fp8(variant: DecodeVariant, q: ElementKind, cache: ElementKind, head_dim: u32) -> String {
    let variant = match variant {
        DecodeVariant::Whole => "",
        DecodeVariant::Split => "_split",
        DecodeVariant::Lean | DecodeVariant::LeanHeads(_) => "_lean",
        DecodeVariant::LeanSplit => "_lean_split",
    };
    format!("decode_mma{variant}_{}_{}_d{head_dim}", element_name(q), element_name(cache))
}

/// `append_{element}`.
pub fn append(element: ElementKind) -> String {
    format!("append_{}", element_name(element))
}

/// `append_{token}_{cache}`: quantizes f16 / bf16 tokens into an 8-bit cache (sm_90 build only).
pub fn append_quantized(token: ElementKind, cache: ElementKind) -> String {
    format!("append_{}_{}", element_name(token), element_name(cache))
}

/// Element types of q (and of quantized tokens) the 8-bit caches take.
pub const FP8_Q_ELEMENTS: [ElementKind; 2] = [ElementKind::F16, ElementKind::BF16];
/// The 8-bit cache formats.
pub const FP8_CACHE_ELEMENTS: [ElementKind; 2] = [ElementKind::E4M3, ElementKind::E5M2];

fn element_name(element: ElementKind) -> &'static str {
    match element {
        ElementKind::F16 => "f16",
        ElementKind::BF16 => "bf16",
        ElementKind::F32 => "f32",
        ElementKind::I32 => "i32",
        ElementKind::U8 => "u8",
        ElementKind::E4M3 => "e4m3",
        ElementKind::E5M2 => "e5m2",
    }
}

/// Every entry point the kernels provide for the host, in their order of definition: the
/// tensor-core decode entries for 16-bit elements, whole and split, at each supported head_dim;
/// the lean ones at [`LEAN_HEAD_DIMS`] for each of [`LEAN_STACKED_HEADS`]; the CUDA-core decode
/// entries for f32; the logits soft-cap entries of both kernels (whole and split); the append
/// entries (`u8`: a byte copy, for tokens already quantized to 8 bits); then [`SCHEDULE_CHUNKS`], [`CHECK_PAGE_TABLE`] and
/// [`READ_BANDWIDTH`]. The sm_90 build adds [`sm90_only`].
pub fn all() -> Vec<String> {
    use DecodeVariant::{LeanHeads, Split, Whole};
    let head_dims = SUPPORTED_HEAD_DIMS.map(|d| d as u32);
    let sixteen_bit = [ElementKind::F16, ElementKind::BF16];
    let mut names = Vec::new();
    for element in sixteen_bit {
        for d in head_dims {
            names.extend([Whole, Split].map(|v| decode(DecodeKernel::Mma, v, element, d)));
        }
    }
    for element in sixteen_bit {
        for d in LEAN_HEAD_DIMS {
            names.extend(LEAN_STACKED_HEADS.map(|k| decode(DecodeKernel::Mma, LeanHeads(k), element, d)));
        }
    }
    for d in head_dims {
        names.extend([Whole, Split].map(|v| decode(DecodeKernel::Simt, v, ElementKind::F32, d)));
    }
    for element in sixteen_bit {
        for d in head_dims {
            names.extend([Whole, Split].map(|v| decode_soft_cap(DecodeKernel::Mma, v, element, d)));
        }
    }
    for d in head_dims {
        names.extend([Whole, Split].map(|v| decode_soft_cap(DecodeKernel::Simt, v, ElementKind::F32, d)));
    }
    names.extend([ElementKind::F16, ElementKind::BF16, ElementKind::F32, ElementKind::U8].map(append));
    names.extend([SCHEDULE_CHUNKS, CHECK_PAGE_TABLE, READ_BANDWIDTH].map(String::from));
    names
}

/// The entries of the sm_90 build only, in their order of definition: the lean split entries
/// per 16-bit element type at [`LEAN_HEAD_DIMS`]; the guessing whole, lean and split entries
/// ([`decode_guess`]) per 16-bit element type, then the whole and lean ones per 8-bit cache
/// format and q type; the tensor-core decode over 8-bit caches, whole and split, per cache format, q type and
/// head_dim; the lean ones at [`LEAN_HEAD_DIMS`]; then the quantizing appends.
pub fn sm90_only() -> Vec<String> {
    use DecodeVariant::{Lean, LeanSplit, Split, Whole};
    let mut names = Vec::new();
    for element in [ElementKind::F16, ElementKind::BF16] {
        names.extend(LEAN_HEAD_DIMS.map(|d| decode(DecodeKernel::Mma, LeanSplit, element, d)));
    }
    for element in [ElementKind::F16, ElementKind::BF16] {
        names.extend(SUPPORTED_HEAD_DIMS.map(|d| decode_guess(Whole, element, element, d as u32)));
    }
    for element in [ElementKind::F16, ElementKind::BF16] {
        names.extend(LEAN_HEAD_DIMS.map(|d| decode_guess(Lean, element, element, d)));
    }
    for element in [ElementKind::F16, ElementKind::BF16] {
        names.extend(SUPPORTED_HEAD_DIMS.map(|d| decode_guess(Split, element, element, d as u32)));
    }
    for cache in FP8_CACHE_ELEMENTS {
        for q in FP8_Q_ELEMENTS {
            names.extend(SUPPORTED_HEAD_DIMS.map(|d| decode_guess(Whole, q, cache, d as u32)));
            names.extend(LEAN_HEAD_DIMS.map(|d| decode_guess(Lean, q, cache, d)));
        }
    }
    for cache in FP8_CACHE_ELEMENTS {
        for q in FP8_Q_ELEMENTS {
            for d in SUPPORTED_HEAD_DIMS.map(|d| d as u32) {
                names.extend([Whole, Split].map(|v| decode_fp8(v, q, cache, d)));
            }
        }
    }
    for cache in FP8_CACHE_ELEMENTS {
        for q in FP8_Q_ELEMENTS {
            names.extend(LEAN_HEAD_DIMS.map(|d| decode_fp8(DecodeVariant::Lean, q, cache, d)));
        }
    }
    for cache in FP8_CACHE_ELEMENTS {
        names.extend(FP8_Q_ELEMENTS.map(|t| append_quantized(t, cache)));
    }
    names
}

/// Every entry of the build a device of compute capability `cc` loads.
pub fn of_build(cc: (u32, u32)) -> Vec<String> {
    let mut names = all();
    if crate::ptx::build_for(cc) == crate::types::ArchSku::Sm90 {
        names.extend(sm90_only());
    }
    names
}
