//! Read-bandwidth probe: grid-stride 16-byte `ld.global.nc`, 8 loads in flight per thread.
//! The XOR of everything read is stored only if it equals `sentinel`, so no load is dead.

use crate::intrinsics::*;

/// # Safety
/// `src` holds `vectors × 16` readable, 16-byte-aligned bytes and `sink` one writable `u32`.
#[inline(always)]
pub unsafe fn read_bandwidth(src: *const u8, vectors: u64, sentinel: u32, sink: *mut u32) {
    const UNROLL: u64 = 8;
    let threads = grid_dim_x() as u64 * block_dim_x() as u64;
    let tid = block_idx().0 as u64 * block_dim_x() as u64 + thread_idx() as u64;
    let mut acc = 0u32;
    let mut i = tid;
    while i + (UNROLL - 1) * threads < vectors {
        let mut v = [[0u32; 4]; UNROLL as usize];
        for u in 0..UNROLL as usize {
            v[u] = unsafe { ld_nc_v4(src.add(16 * (i + u as u64 * threads) as usize)) };
        }
        for u in 0..UNROLL as usize {
            acc ^= v[u][0] ^ v[u][1] ^ v[u][2] ^ v[u][3];
        }
        i += UNROLL * threads;
    }
    while i < vectors {
        let v = unsafe { ld_nc_v4(src.add(16 * i as usize)) };
        acc ^= v[0] ^ v[1] ^ v[2] ^ v[3];
        i += threads;
    }
    if acc == sentinel {
        unsafe { *sink = acc };
    }
}
