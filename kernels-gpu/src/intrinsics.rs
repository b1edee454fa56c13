//! Thin wrappers over PTX instructions that `core::arch::nvptx` lacks.
//!
//! Shared-memory addresses are 32-bit `.shared` window addresses (what `ldmatrix`,
//! `cp.async` and `ld/st.shared` take).

use core::arch::asm;
use core::arch::nvptx;

core::arch::global_asm!(".extern .shared .align 128 .b8 DYN_SMEM[];");

#[inline(always)]
pub fn thread_idx() -> u32 {
    unsafe { nvptx::_thread_idx_x() as u32 }
}
/// `threadIdx.x` read anew, never merged with an earlier read: for the values a kernel derives
/// from it after a long loop, which cost fewer instructions to recompute there than registers
/// (or spills) to keep across the loop.
#[inline(always)]
pub fn thread_idx_reread() -> u32 {
    let t: u32;
    unsafe { asm!("mov.u32 {t}, %tid.x;", t = out(reg32) t, options(nomem, nostack, preserves_flags)) };
    t
}
/// `x` through an empty `asm!` that LLVM cannot look into nor merge with another: what is
/// derived from the result is computed again where it is used, not kept from an earlier use.
#[inline(always)]
pub fn opaque_u32(mut x: u32) -> u32 {
    unsafe { asm!("// opaque {x}", x = inout(reg32) x, options(nomem, nostack, preserves_flags)) };
    x
}
#[inline(always)]
pub fn block_idx() -> (u32, u32, u32) {
    unsafe { (nvptx::_block_idx_x() as u32, nvptx::_block_idx_y() as u32, nvptx::_block_idx_z() as u32) }
}
#[inline(always)]
pub fn block_dim_x() -> u32 {
    unsafe { nvptx::_block_dim_x() as u32 }
}
#[inline(always)]
pub fn grid_dim_x() -> u32 {
    unsafe { nvptx::_grid_dim_x() as u32 }
}
#[inline(always)]
pub fn sync_threads() {
    unsafe { nvptx::_syncthreads() }
}

/// `.shared` address of the dynamic shared memory.
#[inline(always)]
pub fn smem_base() -> u32 {
    let a: u32;
    unsafe { asm!("mov.u32 {a}, DYN_SMEM;", a = out(reg32) a, options(pure, nomem, nostack)) };
    a
}

#[inline(always)]
pub fn shfl_xor_u32(v: u32, lane_mask: u32) -> u32 {
    let r: u32;
    unsafe {
        asm!("shfl.sync.bfly.b32 {r}, {v}, {m}, 0x1f, 0xffffffff;",
             r = out(reg32) r, v = in(reg32) v, m = in(reg32) lane_mask,
             options(nomem, nostack, preserves_flags))
    };
    r
}

#[inline(always)]
pub fn shfl_xor(v: f32, lane_mask: u32) -> f32 {
    f32::from_bits(shfl_xor_u32(v.to_bits(), lane_mask))
}

/// Value of `v` in lane `lane - delta` (own value in lanes below `delta`).
#[inline(always)]
pub fn shfl_up_u32(v: u32, delta: u32) -> u32 {
    let r: u32;
    unsafe {
        asm!("shfl.sync.up.b32 {r}, {v}, {d}, 0, 0xffffffff;",
             r = out(reg32) r, v = in(reg32) v, d = in(reg32) delta,
             options(nomem, nostack, preserves_flags))
    };
    r
}

/// Value of `v` in lane `src`.
#[inline(always)]
pub fn shfl_idx_u32(v: u32, src: u32) -> u32 {
    let r: u32;
    unsafe {
        asm!("shfl.sync.idx.b32 {r}, {v}, {s}, 0x1f, 0xffffffff;",
             r = out(reg32) r, v = in(reg32) v, s = in(reg32) src,
             options(nomem, nostack, preserves_flags))
    };
    r
}

#[inline(always)]
pub fn shfl_idx(v: f32, src: u32) -> f32 {
    f32::from_bits(shfl_idx_u32(v.to_bits(), src))
}

/// Bit `i` set where `pred` holds in lane `i`.
#[inline(always)]
pub fn ballot_sync(pred: bool) -> u32 {
    let r: u32;
    unsafe {
        asm!("{{ .reg .pred p; setp.ne.u32 p, {x}, 0; vote.sync.ballot.b32 {r}, p, 0xffffffff; }}",
             x = in(reg32) pred as u32, r = out(reg32) r, options(nomem, nostack))
    };
    r
}

/// Maximum over all 32 lanes.
#[inline(always)]
pub fn warp_max(mut v: f32) -> f32 {
    let mut m = 16;
    while m > 0 {
        v = fmax(v, shfl_xor(v, m));
        m >>= 1;
    }
    v
}

/// Sum over all 32 lanes.
#[inline(always)]
pub fn warp_sum(mut v: f32) -> f32 {
    let mut m = 16;
    while m > 0 {
        v += shfl_xor(v, m);
        m >>= 1;
    }
    v
}

/// Sum over all 32 lanes, saturating.
#[inline(always)]
pub fn warp_sum_u32(mut v: u32) -> u32 {
    for step in 0..5 {
        let m = 16 >> step;
        v = v.saturating_add(shfl_xor_u32(v, m));
    }
    v
}

/// 2^x (approximate, flushes denormals; `-inf` gives 0).
#[inline(always)]
pub fn exp2(x: f32) -> f32 {
    let r: u32;
    unsafe {
        asm!("ex2.approx.ftz.f32 {r}, {x};", r = out(reg32) r, x = in(reg32) x.to_bits(),
             options(pure, nomem, nostack))
    };
    f32::from_bits(r)
}

/// log2(x) (approximate).
#[inline(always)]
pub fn log2(x: f32) -> f32 {
    let r: u32;
    unsafe {
        asm!("lg2.approx.ftz.f32 {r}, {x};", r = out(reg32) r, x = in(reg32) x.to_bits(),
             options(pure, nomem, nostack))
    };
    f32::from_bits(r)
}

#[inline(always)]
pub fn fmax(a: f32, b: f32) -> f32 {
    let r: u32;
    unsafe {
        asm!("max.f32 {r}, {a}, {b};", r = out(reg32) r, a = in(reg32) a.to_bits(), b = in(reg32) b.to_bits(),
             options(pure, nomem, nostack))
    };
    f32::from_bits(r)
}

/// L2 cache policy that marks the lines it tags for eviction first
/// (`createpolicy.fractional.L2::evict_first`), for data read once.
#[inline(always)]
pub fn l2_evict_first_policy() -> u64 {
    let policy: u64;
    unsafe {
        asm!("createpolicy.fractional.L2::evict_first.b64 {p}, 1.0;", p = out(reg64) policy,
             options(nostack, nomem, pure))
    };
    policy
}

/// 16-byte global → shared copy, bypassing L1, under the L2 cache policy `policy`; bytes past
/// `src_bytes` (0 or 16) are zero-filled.
///
/// # Safety
/// `dst` is a 16-byte-aligned `.shared` address of 16 writable bytes inside this CTA's shared
/// memory; with `src_bytes == 16`, `src` is a 16-byte-aligned global address of 16 readable bytes
/// (`src_bytes == 0` reads nothing). `dst` is not read before the copy's group is waited for.
#[inline(always)]
pub unsafe fn cp_async_16(dst: u32, src: *const u8, src_bytes: u32, policy: u64) {
    unsafe {
        asm!("cp.async.cg.shared.global.L2::cache_hint [{d}], [{s}], 16, {n}, {pol};",
             d = in(reg32) dst, s = in(reg64) src, n = in(reg32) src_bytes, pol = in(reg64) policy,
             options(nostack))
    };
}
/// [`cp_async_16`] under the default L2 policy.
///
/// # Safety
/// As [`cp_async_16`].
#[inline(always)]
pub unsafe fn cp_async_16_default_policy(dst: u32, src: *const u8, src_bytes: u32) {
    unsafe {
        asm!("cp.async.cg.shared.global [{d}], [{s}], 16, {n};",
             d = in(reg32) dst, s = in(reg64) src, n = in(reg32) src_bytes, options(nostack))
    };
}
#[inline(always)]
pub fn cp_async_commit() {
    unsafe { asm!("cp.async.commit_group;", options(nostack)) };
}
/// Waits until at most `N` committed groups are still in flight.
#[inline(always)]
pub fn cp_async_wait<const N: u32>() {
    unsafe { asm!("cp.async.wait_group {n};", n = const N, options(nostack)) };
}

/// [`cp_async_wait`] with a count known only after inlining (folds to one instruction).
#[inline(always)]
pub fn cp_async_wait_dyn(n: u32) {
    match n {
        0 => cp_async_wait::<0>(),
        1 => cp_async_wait::<1>(),
        2 => cp_async_wait::<2>(),
        3 => cp_async_wait::<3>(),
        _ => cp_async_wait::<4>(),
    }
}

/// Four 8×8 b16 matrices from shared memory (one row address per lane).
///
/// # Safety
/// Warp-collective: all 32 lanes execute it, each with a 16-byte-aligned `.shared` address of 16
/// readable bytes inside this CTA's shared memory.
#[inline(always)]
pub unsafe fn ldmatrix_x4(addr: u32) -> [u32; 4] {
    let (a, b, c, d): (u32, u32, u32, u32);
    unsafe {
        asm!("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {{{a}, {b}, {c}, {d}}}, [{p}];",
             a = out(reg32) a, b = out(reg32) b, c = out(reg32) c, d = out(reg32) d, p = in(reg32) addr,
             options(nostack))
    };
    [a, b, c, d]
}
/// As [`ldmatrix_x4`], transposed.
///
/// # Safety
/// As [`ldmatrix_x4`].
#[inline(always)]
pub unsafe fn ldmatrix_x4_trans(addr: u32) -> [u32; 4] {
    let (a, b, c, d): (u32, u32, u32, u32);
    unsafe {
        asm!("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {{{a}, {b}, {c}, {d}}}, [{p}];",
             a = out(reg32) a, b = out(reg32) b, c = out(reg32) c, d = out(reg32) d, p = in(reg32) addr,
             options(nostack))
    };
    [a, b, c, d]
}

/// # Safety
/// `addr` is a 16-byte-aligned `.shared` address of 16 writable bytes inside this CTA's shared
/// memory.
#[inline(always)]
pub unsafe fn st_shared_v4(addr: u32, v: [u32; 4]) {
    unsafe {
        asm!("st.shared.v4.b32 [{p}], {{{a}, {b}, {c}, {d}}};",
             p = in(reg32) addr, a = in(reg32) v[0], b = in(reg32) v[1], c = in(reg32) v[2], d = in(reg32) v[3],
             options(nostack))
    };
}

/// # Safety
/// `addr` is an 8-byte-aligned `.shared` address of 8 writable bytes inside this CTA's shared
/// memory.
#[inline(always)]
pub unsafe fn st_shared_v2_u32(addr: u32, v: [u32; 2]) {
    unsafe {
        asm!("st.shared.v2.b32 [{p}], {{{a}, {b}}};", p = in(reg32) addr, a = in(reg32) v[0], b = in(reg32) v[1],
             options(nostack))
    };
}

/// # Safety
/// `addr` is a 8-byte-aligned `.shared` address of 8 writable bytes inside this CTA's shared
/// memory.
#[inline(always)]
pub unsafe fn st_shared_v2_f32(addr: u32, v: [f32; 2]) {
    unsafe {
        asm!("st.shared.v2.f32 [{p}], {{{a}, {b}}};", p = in(reg32) addr, a = in(reg32) v[0], b = in(reg32) v[1],
             options(nostack))
    };
}

/// # Safety
/// `addr` is a 16-byte-aligned `.shared` address of 16 readable bytes inside this CTA's shared
/// memory.
#[inline(always)]
pub unsafe fn ld_shared_v4_f32(addr: u32) -> [f32; 4] {
    let (a, b, c, d): (f32, f32, f32, f32);
    unsafe {
        asm!("ld.shared.v4.f32 {{{a}, {b}, {c}, {d}}}, [{p}];",
             a = out(reg32) a, b = out(reg32) b, c = out(reg32) c, d = out(reg32) d, p = in(reg32) addr,
             options(nostack))
    };
    [a, b, c, d]
}

/// `st.shared.u64`.
///
/// # Safety
/// `addr` is an 8-byte-aligned `.shared` address of 8 writable bytes inside this CTA's shared
/// memory.
#[inline(always)]
pub unsafe fn st_shared_u64(addr: u32, v: u64) {
    unsafe { asm!("st.shared.u64 [{a}], {v};", a = in(reg32) addr, v = in(reg64) v, options(nostack)) };
}

/// `ld.shared.u64`.
///
/// # Safety
/// `addr` is an 8-byte-aligned `.shared` address of 8 readable bytes inside this CTA's shared
/// memory.
#[inline(always)]
pub unsafe fn ld_shared_u64(addr: u32) -> u64 {
    let v: u64;
    unsafe {
        asm!("ld.shared.u64 {v}, [{a}];", v = out(reg64) v, a = in(reg32) addr, options(nostack, readonly))
    };
    v
}

/// # Safety
/// `addr` is a 4-byte-aligned `.shared` address of 4 writable bytes inside this CTA's shared
/// memory.
#[inline(always)]
pub unsafe fn st_shared_u32(addr: u32, v: u32) {
    unsafe { asm!("st.shared.b32 [{p}], {v};", p = in(reg32) addr, v = in(reg32) v, options(nostack)) };
}

/// # Safety
/// `addr` is a 4-byte-aligned `.shared` address of 4 readable bytes inside this CTA's shared
/// memory.
#[inline(always)]
pub unsafe fn ld_shared_u32(addr: u32) -> u32 {
    let v: u32;
    unsafe { asm!("ld.shared.b32 {v}, [{p}];", v = out(reg32) v, p = in(reg32) addr, options(nostack)) };
    v
}

/// Passes `x` through an empty `asm!` block, so that LLVM sees one new value for each of its
/// elements: every later use reads that value, rather than copies of it that LLVM keeps along
/// separate paths.
#[inline(always)]
pub fn opaque4(x: &mut [f32; 4]) {
    let mut bits = x.map(f32::to_bits);
    unsafe {
        asm!("// opaque4 {a} {b} {c} {d}", a = inout(reg32) bits[0], b = inout(reg32) bits[1],
             c = inout(reg32) bits[2], d = inout(reg32) bits[3], options(pure, nomem, nostack))
    };
    *x = bits.map(f32::from_bits);
}

/// True in every lane if `pred` holds in any lane of the warp.
#[inline(always)]
pub fn any_sync(pred: bool) -> bool {
    let r: u32;
    unsafe {
        asm!("{{ .reg .pred p; setp.ne.u32 p, {x}, 0; vote.sync.any.pred p, p, 0xffffffff; selp.u32 {r}, 1, 0, p; }}",
             x = in(reg32) pred as u32, r = out(reg32) r, options(nomem, nostack))
    };
    r != 0
}

/// 16-byte read-only global load.
///
/// # Safety
/// `p` is a 16-byte-aligned global address of 16 readable bytes of a live allocation that no thread
/// writes while the kernel runs (the load may use the non-coherent path).
#[inline(always)]
pub unsafe fn ld_nc_v4(p: *const u8) -> [u32; 4] {
    let (a, b, c, d): (u32, u32, u32, u32);
    unsafe {
        asm!("ld.global.nc.v4.b32 {{{a}, {b}, {c}, {d}}}, [{p}];",
             a = out(reg32) a, b = out(reg32) b, c = out(reg32) c, d = out(reg32) d, p = in(reg64) p,
             options(nostack, readonly))
    };
    [a, b, c, d]
}

/// `st.relaxed.gpu.global.v4.b32`: a 16-byte store whose four words are each a relaxed store at
/// GPU scope, so that two threads storing to the same words do not race (each word ends up one
/// thread's).
///
/// # Safety
/// `p` is a 16-byte-aligned global address of 16 writable bytes of a live allocation.
#[inline(always)]
pub unsafe fn st_relaxed_v4(p: *mut u8, v: [u32; 4]) {
    unsafe {
        asm!("st.relaxed.gpu.global.v4.b32 [{p}], {{{a}, {b}, {c}, {d}}};",
             p = in(reg64) p, a = in(reg32) v[0], b = in(reg32) v[1], c = in(reg32) v[2], d = in(reg32) v[3],
             options(nostack))
    };
}

/// `st.relaxed.gpu.global.v2.b32`: [`st_relaxed_v4`] for 8 bytes.
///
/// # Safety
/// `p` is an 8-byte-aligned global address of 8 writable bytes of a live allocation.
#[inline(always)]
pub unsafe fn st_relaxed_v2(p: *mut u8, v: [u32; 2]) {
    unsafe {
        asm!("st.relaxed.gpu.global.v2.b32 [{p}], {{{a}, {b}}};",
             p = in(reg64) p, a = in(reg32) v[0], b = in(reg32) v[1], options(nostack))
    };
}

/// `atom.relaxed.gpu.global.add.u32`, returning the old value (no ordering: a ticket).
///
/// # Safety
/// `p` is a 4-byte-aligned global address of 4 writable bytes of a live allocation.
#[inline(always)]
pub unsafe fn atomic_add_relaxed_u32(p: *mut u32, v: u32) -> u32 {
    let old: u32;
    unsafe {
        asm!("atom.relaxed.gpu.global.add.u32 {o}, [{p}], {v};", o = out(reg32) old, p = in(reg64) p, v = in(reg32) v,
             options(nostack))
    };
    old
}

/// `red.release.gpu.global.add.u32`: publishes the writes ordered before it, returns nothing.
///
/// # Safety
/// `p` is a 4-byte-aligned global address of 4 writable bytes of a live allocation.
#[inline(always)]
pub unsafe fn red_add_release_u32(p: *mut u32, v: u32) {
    unsafe {
        asm!("red.release.gpu.global.add.u32 [{p}], {v};", p = in(reg64) p, v = in(reg32) v, options(nostack))
    };
}

/// `ld.acquire.gpu.global.u32`.
///
/// # Safety
/// `p` is a 4-byte-aligned global address of 4 readable bytes of a live allocation.
#[inline(always)]
pub unsafe fn ld_acquire_u32(p: *const u32) -> u32 {
    let v: u32;
    unsafe {
        asm!("ld.acquire.gpu.global.u32 {v}, [{p}];", v = out(reg32) v, p = in(reg64) p, options(nostack))
    };
    v
}

/// `bar.warp.sync` over the full warp (orders memory between its lanes, as `bar.sync` does for
/// the CTA).
#[inline(always)]
pub fn sync_warp() {
    unsafe { asm!("bar.warp.sync 0xffffffff;", options(nostack)) };
}

/// Barrier that also returns whether `pred` held in any thread of the CTA.
#[inline(always)]
pub fn sync_threads_or(pred: bool) -> bool {
    let r: u32;
    unsafe {
        asm!("{{ .reg .pred p, q; setp.ne.u32 p, {x}, 0; bar.red.or.pred q, 0, p; selp.u32 {r}, 1, 0, q; }}",
             x = in(reg32) pred as u32, r = out(reg32) r, options(nostack))
    };
    r != 0
}

/// f32 load cached in L2 only (sees other CTAs' writes published by the split merge's release
/// count).
///
/// # Safety
/// `p` is a 4-byte-aligned global address of 4 readable bytes of a live allocation.
#[inline(always)]
pub unsafe fn ld_cg_f32(p: *const f32) -> f32 {
    let v: u32;
    unsafe { asm!("ld.global.cg.b32 {v}, [{p}];", v = out(reg32) v, p = in(reg64) p, options(nostack)) };
    f32::from_bits(v)
}

/// `ld.global.cg.u32`: through L2, for data another grid wrote.
#[inline(always)]
pub unsafe fn ld_cg_u32(p: *const u32) -> u32 {
    let v: u32;
    unsafe {
        asm!("ld.global.cg.u32 {v}, [{p}];", v = out(reg32) v, p = in(reg64) p, options(nostack, readonly))
    };
    v
}

#[inline(always)]
pub fn grid_dim_y() -> u32 {
    unsafe { nvptx::_grid_dim_y() as u32 }
}

/// `ld.global.cg.b32`: an i32 through L2 only, leaving no line in L1.
///
/// # Safety
/// `p` is a 4-byte-aligned global address of 4 readable bytes of a live allocation.
#[inline(always)]
pub unsafe fn ld_cg_i32(p: *const i32) -> i32 {
    let v: u32;
    unsafe {
        asm!("ld.global.cg.b32 {v}, [{p}];", v = out(reg32) v, p = in(reg64) p, options(nostack, readonly))
    };
    v as i32
}

/// Read-only global load of an i32.
///
/// # Safety
/// `p` is a 4-byte-aligned global address of 4 readable bytes of a live allocation that no thread
/// writes while the kernel runs (the load may use the non-coherent path).
#[inline(always)]
pub unsafe fn ld_nc_i32(p: *const i32) -> i32 {
    let v: u32;
    unsafe {
        asm!("ld.global.nc.b32 {v}, [{p}];", v = out(reg32) v, p = in(reg64) p, options(nostack, readonly))
    };
    v as i32
}

/// `atom.global.min.u64`.
///
/// # Safety
/// `p` is a 8-byte-aligned global address of 8 writable bytes of a live allocation.
#[inline(always)]
pub unsafe fn atomic_min_u64(p: *mut u64, v: u64) {
    unsafe { asm!("red.global.min.u64 [{p}], {v};", p = in(reg64) p, v = in(reg64) v, options(nostack)) };
}

/// `a · b + c` with a 64-bit product and addend (one `IMAD.WIDE.U32`).
#[inline(always)]
pub fn mad_wide_u32(a: u32, b: u32, c: u64) -> u64 {
    let r: u64;
    unsafe {
        asm!("mad.wide.u32 {r}, {a}, {b}, {c};", r = out(reg64) r, a = in(reg32) a, b = in(reg32) b, c = in(reg64) c,
             options(pure, nomem, nostack))
    };
    r
}

/// 16-byte global store.
///
/// # Safety
/// `p` is a 16-byte-aligned global address of 16 writable bytes of a live allocation.
#[inline(always)]
pub unsafe fn st_global_v4_f32(p: *mut f32, v: [f32; 4]) {
    unsafe {
        asm!("st.global.v4.f32 [{p}], {{{a}, {b}, {c}, {d}}};",
             p = in(reg64) p, a = in(reg32) v[0], b = in(reg32) v[1], c = in(reg32) v[2], d = in(reg32) v[3],
             options(nostack))
    };
}

/// 16-byte load cached in L2 only (see [`ld_cg_f32`]).
///
/// # Safety
/// `p` is a 16-byte-aligned global address of 16 readable bytes of a live allocation.
#[inline(always)]
pub unsafe fn ld_cg_v4_f32(p: *const f32) -> [f32; 4] {
    let (a, b, c, d): (u32, u32, u32, u32);
    unsafe {
        asm!("ld.global.cg.v4.b32 {{{a}, {b}, {c}, {d}}}, [{p}];",
             a = out(reg32) a, b = out(reg32) b, c = out(reg32) c, d = out(reg32) d, p = in(reg64) p,
             options(nostack))
    };
    [f32::from_bits(a), f32::from_bits(b), f32::from_bits(c), f32::from_bits(d)]
}

/// Programmatic dependent launch, consumer side: waits until the grids this launch depends on
/// have completed and their writes are visible. Returns at once when the grid was launched
/// without a programmatic dependency, and compiles to nothing before sm_90.
#[inline(always)]
pub fn grid_dependency_wait() {
    #[cfg(target_feature = "sm_90")]
    unsafe {
        asm!("griddepcontrol.wait;", options(nostack))
    };
}

/// Programmatic dependent launch, producer side: lets the next kernel in the stream start its
/// CTAs (which then run up to their [`grid_dependency_wait`]) once every CTA of this grid has
/// called this or exited. Nothing before sm_90.
#[inline(always)]
pub fn allow_dependent_launch() {
    #[cfg(target_feature = "sm_90")]
    unsafe {
        asm!("griddepcontrol.launch_dependents;", options(nostack))
    };
}

/// `prefetch.global.L2`: a hint that pulls the 128-byte line of `p` into L2. It reads nothing
/// architecturally, so it may run before [`grid_dependency_wait`].
///
/// # Safety
/// `p` is a global address inside a live allocation (a prefetch of an unmapped address may fault).
#[inline(always)]
pub unsafe fn prefetch_l2(p: *const u8) {
    unsafe { asm!("prefetch.global.L2 [{p}];", p = in(reg64) p, options(nostack, readonly)) };
}

/// # Safety
/// `addr` is a 16-byte-aligned `.shared` address of 16 readable bytes inside this CTA's shared
/// memory.
#[inline(always)]
pub unsafe fn ld_shared_v4_u32(addr: u32) -> [u32; 4] {
    let (a, b, c, d): (u32, u32, u32, u32);
    unsafe {
        asm!("ld.shared.v4.b32 {{{a}, {b}, {c}, {d}}}, [{p}];",
             a = out(reg32) a, b = out(reg32) b, c = out(reg32) c, d = out(reg32) d, p = in(reg32) addr,
             options(nostack))
    };
    [a, b, c, d]
}

/// # Safety
/// `addr` is an 8-byte-aligned `.shared` address of 8 readable bytes inside this CTA's shared
/// memory.
#[inline(always)]
pub unsafe fn ld_shared_v2_u32(addr: u32) -> [u32; 2] {
    let (a, b): (u32, u32);
    unsafe {
        asm!("ld.shared.v2.b32 {{{a}, {b}}}, [{p}];", a = out(reg32) a, b = out(reg32) b, p = in(reg32) addr,
             options(nostack))
    };
    [a, b]
}

/// `prmt.b32`: byte `i` of the result is byte `(selector >> 4i) & 7` of the pair `(b, a)`
/// (bytes 0–3 from `a`, 4–7 from `b`).
#[inline(always)]
pub fn prmt(a: u32, b: u32, selector: u32) -> u32 {
    let r: u32;
    unsafe {
        asm!("prmt.b32 {r}, {a}, {b}, {s};", r = out(reg32) r, a = in(reg32) a, b = in(reg32) b,
             s = in(reg32) selector, options(pure, nomem, nostack))
    };
    r
}
