//! Device kernels of `paged-decode`, compiled to PTX by rustc's NVPTX backend.
//!
//! Every `#[no_mangle] extern "ptx-kernel"` function here is a PTX entry point; the builder keeps
//! exactly these and internalizes the rest. Algorithms live in their modules; this file only
//! instantiates them per element type and head_dim.

#![no_std]
#![feature(abi_ptx, stdarch_nvptx, asm_experimental_arch)]

pub mod append;
pub mod bandwidth;
pub mod check;
pub mod chunking;
pub mod decode;
pub mod element;
pub mod intrinsics;
pub mod params;
pub mod partition;
pub mod schedule;

use decode::{Lean, Standard, Tiling};
use element::{BF16, F16};
use params::{AppendParams, DecodeParams, PageTableCheckParams, decode_merge_batch};

#[panic_handler]
fn panic(_: &core::panic::PanicInfo) -> ! {
    unsafe { core::arch::nvptx::trap() }
}

macro_rules! decode_mma_entry {
    ($name:ident, $t:ty, $d:literal, $tiling:ident, $split:literal) => {
        #[unsafe(no_mangle)]
        pub unsafe extern "ptx-kernel" fn $name(p: DecodeParams) {
            unsafe {
                decode::decode_mma::<
                    $t,
                    $d,
                    { $d / 16 },
                    { $d / 8 / $tiling::<$d>::T.d_parts as usize },
                    { $d / 32 },
                    $tiling<$d>,
                    $split,
                    { decode_merge_batch($d) as usize },
                >(&p)
            }
        }
    };
}
decode_mma_entry!(decode_mma_f16_d64, F16, 64, Standard, false);
decode_mma_entry!(decode_mma_split_f16_d64, F16, 64, Standard, true);
decode_mma_entry!(decode_mma_f16_d128, F16, 128, Standard, false);
decode_mma_entry!(decode_mma_split_f16_d128, F16, 128, Standard, true);
decode_mma_entry!(decode_mma_f16_d256, F16, 256, Standard, false);
decode_mma_entry!(decode_mma_split_f16_d256, F16, 256, Standard, true);
decode_mma_entry!(decode_mma_bf16_d64, BF16, 64, Standard, false);
decode_mma_entry!(decode_mma_split_bf16_d64, BF16, 64, Standard, true);
decode_mma_entry!(decode_mma_bf16_d128, BF16, 128, Standard, false);
decode_mma_entry!(decode_mma_split_bf16_d128, BF16, 128, Standard, true);
decode_mma_entry!(decode_mma_bf16_d256, BF16, 256, Standard, false);
decode_mma_entry!(decode_mma_split_bf16_d256, BF16, 256, Standard, true);
// Lean tiling, unsplit: many short requests (see `params::lean_tiling`).
decode_mma_entry!(decode_mma_lean_f16_d64, F16, 64, Lean, false);
decode_mma_entry!(decode_mma_lean_f16_d128, F16, 128, Lean, false);
decode_mma_entry!(decode_mma_lean_bf16_d64, BF16, 64, Lean, false);
decode_mma_entry!(decode_mma_lean_bf16_d128, BF16, 128, Lean, false);

macro_rules! decode_simt_entry {
    ($name:ident, $t:ty, $d:literal, $split:literal) => {
        #[unsafe(no_mangle)]
        pub unsafe extern "ptx-kernel" fn $name(p: DecodeParams) {
            unsafe { decode::decode_simt::<$t, $d, { $d / 32 }, $split>(&p) }
        }
    };
}
decode_simt_entry!(decode_simt_f32_d64, f32, 64, false);
decode_simt_entry!(decode_simt_split_f32_d64, f32, 64, true);
decode_simt_entry!(decode_simt_f32_d128, f32, 128, false);
decode_simt_entry!(decode_simt_split_f32_d128, f32, 128, true);
decode_simt_entry!(decode_simt_f32_d256, f32, 256, false);
decode_simt_entry!(decode_simt_split_f32_d256, f32, 256, true);

macro_rules! append_entry {
    ($name:ident, $t:ty) => {
        #[unsafe(no_mangle)]
        pub unsafe extern "ptx-kernel" fn $name(p: AppendParams) {
            unsafe { append::append_token::<$t>(&p) }
        }
    };
}
append_entry!(append_f16, F16);
append_entry!(append_bf16, BF16);
append_entry!(append_f32, f32);

#[unsafe(no_mangle)]
pub unsafe extern "ptx-kernel" fn schedule_chunks(p: DecodeParams) {
    unsafe { schedule::schedule_chunks(&p) }
}

#[unsafe(no_mangle)]
pub unsafe extern "ptx-kernel" fn check_page_table(p: PageTableCheckParams) {
    unsafe { check::check_page_table(&p) }
}

#[unsafe(no_mangle)]
pub unsafe extern "ptx-kernel" fn read_bandwidth(src: *const u8, chunks: u64, sentinel: u32, sink: *mut u32) {
    unsafe { bandwidth::read_bandwidth(src, chunks, sentinel, sink) }
}
