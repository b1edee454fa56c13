//! Device-side page-table check: one warp per request, reads only inside the arrays' bounds.
//! Each violation `code` of request `b` is folded into `status` as `min((b << 8) | code)`.
//! In append mode it also enforces the append contract (a counted token in a request's last page)
//! and writes each request's append slot to `slots[b]` ([`NO_APPEND_SLOT`] for a request without
//! pages, which appends nothing), from which the host finds two requests that would write the
//! same slot.

use crate::intrinsics::*;
use crate::params::{NO_APPEND_SLOT, PageTableCheckParams, check_code, check_lane_slots};

/// # Safety
/// `p` is a [`PageTableCheckParams`] block: `indptr` of `batch + 1` and `last_page_len` of
/// `batch` i32s, `indices` of `num_indices` i32s, one u64 `status` and, in append mode, `batch`
/// u64 `slots`, all writable ones unused by other work while the kernel runs.
#[inline(always)]
pub unsafe fn check_page_table(p: &PageTableCheckParams) {
    let lane = thread_idx() % 32;
    let b = block_idx().0 * (block_dim_x() / 32) + thread_idx() / 32;
    if b >= p.batch {
        return;
    }
    let report = |code: u32| unsafe { atomic_min_u64(p.status as *mut u64, ((b as u64) << 8) | code as u64) };
    let indptr = p.indptr as *const i32;
    let (start, stop) = unsafe { (ld_nc_i32(indptr.add(b as usize)), ld_nc_i32(indptr.add(b as usize + 1))) };
    let last = unsafe { ld_nc_i32((p.last_page_len as *const i32).add(b as usize)) };
    let n = p.num_indices as i32;
    if lane == 0 && (last < 0 || last as u32 > p.page_size) {
        report(check_code::LAST_PAGE_LEN_OUT_OF_RANGE);
    }
    if start < 0 || start > n || stop < 0 || stop > n {
        if lane == 0 {
            report(check_code::INDPTR_OUT_OF_RANGE);
        }
        return;
    }
    if stop < start {
        if lane == 0 {
            report(check_code::INDPTR_DECREASING);
        }
        return;
    }
    if p.append != 0 {
        if stop == start {
            // No page: the request appends nothing (a free slot of a padded batch).
            if lane == 0 {
                unsafe { *(p.slots as *mut u64).add(b as usize) = NO_APPEND_SLOT };
            }
            return;
        }
        if lane == 0 && last == 0 {
            report(check_code::LAST_PAGE_EMPTY);
        }
    }
    // `0 ≤ start ≤ stop ≤ num_indices`: every slot read is inside `indices`.
    let mut bad = false;
    for i in check_lane_slots(start as u32, stop as u32, lane) {
        let page = unsafe { ld_nc_i32((p.indices as *const i32).add(i as usize)) };
        bad |= page < 0 || page as u32 >= p.num_total_pages;
    }
    if bad {
        report(check_code::PAGE_OUT_OF_RANGE);
    }
    if p.append != 0 && lane == 0 {
        // `start ≤ stop - 1 < stop ≤ num_indices`: the last page id is inside `indices`. The slot
        // is only read by the host when no request broke a rule above.
        let page = unsafe { ld_nc_i32((p.indices as *const i32).add(stop as usize - 1)) };
        let slot = (page as u32 as u64) * p.page_size as u64 + (last as u32 as u64).wrapping_sub(1);
        unsafe { *(p.slots as *mut u64).add(b as usize) = slot };
    }
}
