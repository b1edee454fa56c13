//! The page-table check on the device ([`PlanPreference::checked`](crate::PlanPreference::checked)
//! and the plans' `check_page_table`): one kernel over the table, then the verdict on the host.

use std::sync::Arc;

use cudarc::driver::{CudaFunction, CudaStream, DevicePtr, DevicePtrMut, LaunchConfig, PushKernelArg};

use crate::error::{Error, Result};
use crate::guard;
use crate::params::{self, PageTableCheckParams};
use crate::tensor::TensorRef;
use crate::types::PagedKvCacheDescriptor;

/// Device page-table arrays, borrowed from a plan's arguments.
pub(super) struct PageTableView<'r, 'a> {
    indices: &'r TensorRef<'a, i32, 1>,
    indptr: &'r TensorRef<'a, i32, 1>,
    last_page_len: &'r TensorRef<'a, i32, 1>,
}

impl<'r, 'a> PageTableView<'r, 'a> {
    pub(super) fn of(
        indices: &'r TensorRef<'a, i32, 1>,
        indptr: &'r TensorRef<'a, i32, 1>,
        last_page_len: &'r TensorRef<'a, i32, 1>,
    ) -> Self {
        Self { indices, indptr, last_page_len }
    }
}

/// Runs the check kernel over `table` (the append contract with `append`) and waits for its
/// verdict; [`Error::CheckedUnderCapture`] while `stream` captures. In append mode, a table that
/// passes is then searched on the host for appends that collide ([`append_collisions`]).
pub(super) fn check_on_device(
    stream: &Arc<CudaStream>,
    check_fn: &CudaFunction,
    table: PageTableView<'_, '_>,
    batch: u32,
    kv: &PagedKvCacheDescriptor,
    append: bool,
) -> Result<()> {
    guard::refuse_capture(stream)?;
    let mut status = stream.clone_htod(&[u64::MAX])?;
    let mut slots = stream.alloc_zeros::<u64>(if append { batch as usize } else { 1 })?;
    {
        let (indices, _i) = table.indices.data.device_ptr(stream);
        let (indptr, _p) = table.indptr.data.device_ptr(stream);
        let (last, _l) = table.last_page_len.data.device_ptr(stream);
        let (status_ptr, _s) = status.device_ptr_mut(stream);
        let (slots_ptr, _o) = slots.device_ptr_mut(stream);
        let p = PageTableCheckParams {
            indices,
            indptr,
            last_page_len: last,
            status: status_ptr,
            slots: if append { slots_ptr } else { 0 },
            batch,
            page_size: kv.page_size as u32,
            num_total_pages: kv.num_total_pages as u32,
            num_indices: table.indices.shape[0] as u32,
            append: append as u32,
        };
        let warps = params::DECODE_THREADS / 32;
        let cfg = LaunchConfig {
            grid_dim: (batch.div_ceil(warps), 1, 1),
            block_dim: (params::DECODE_THREADS, 1, 1),
            shared_mem_bytes: 0,
        };
        // SAFETY: the kernel reads `batch + 1` indptr, `batch` last_page_len and only the
        // indices inside `[0, num_indices)` (shapes checked by the caller, all in the stream's
        // context), and writes `status` and, in append mode, `slots[..batch]`.
        unsafe { stream.launch_builder(check_fn).arg(&p).launch(cfg)? };
    }
    let found = stream.clone_dtoh(&status)?[0];
    if found == u64::MAX {
        return if append {
            append_collisions(stream, &table, &stream.clone_dtoh(&slots)?, kv)
        } else {
            Ok(())
        };
    }
    let (request, code) = (found >> 8, (found & 0xff) as u32);
    let what = match code {
        params::check_code::INDPTR_OUT_OF_RANGE => format!(
            "indptr[{request}] or indptr[{}] lies outside [0, {}] (the length of indices)",
            request + 1,
            table.indices.shape[0]
        ),
        params::check_code::INDPTR_DECREASING => {
            format!("indptr[{}] < indptr[{request}]: indptr must be non-decreasing", request + 1)
        }
        params::check_code::LAST_PAGE_LEN_OUT_OF_RANGE => {
            format!("last_page_len[{request}] lies outside [0, {}]", kv.page_size)
        }
        params::check_code::PAGE_OUT_OF_RANGE => {
            format!("a page id of request {request} lies outside [0, {})", kv.num_total_pages)
        }
        params::check_code::LAST_PAGE_EMPTY => crate::page_table::last_page_empty_message(request),
        _ => format!("unknown violation code {code} at request {request}"),
    };
    Err(Error::InvalidPageTable(what))
}

/// The append rules across requests, for a table the kernel passed (so its request ranges lie
/// inside `indices`): no two requests append to one slot ([`shared_append_slot`]), then, from a
/// copy of the table, no request appends to a page that appears elsewhere in it
/// ([`page_table::shared_append_page`](crate::page_table::shared_append_page)).
fn append_collisions(
    stream: &Arc<CudaStream>,
    table: &PageTableView<'_, '_>,
    slots: &[u64],
    kv: &PagedKvCacheDescriptor,
) -> Result<()> {
    let page_size = kv.page_size as u64;
    shared_append_slot(slots, page_size)?;
    // The request ranges (`indptr`'s first `batch + 1` entries, one slot per request: its storage
    // may hold more) and the page ids up to their end, which the kernel found inside `indices`;
    // `last_page_len` is not read.
    // The copies are read back after the kernel's: a table that no longer has the ranges it
    // passed with (written meanwhile, which only an `unsafe` ordering contract can allow) is
    // reported as invalid, never indexed out of range.
    let changed = || Error::InvalidPageTable("the page table changed while it was checked".into());
    let indptr_view = table.indptr.data.try_slice(..slots.len() + 1).ok_or_else(changed)?;
    let indptr = stream.clone_dtoh(&indptr_view)?;
    let end = indptr.last().map_or(0, |&end| end.max(0) as usize);
    let indices = match end {
        0 => Vec::new(),
        _ => stream.clone_dtoh(&table.indices.data.try_slice(..end).ok_or_else(changed)?)?,
    };
    let targets: Vec<Option<(usize, usize)>> = slots
        .iter()
        .map(|&row| {
            (row != params::NO_APPEND_SLOT).then(|| ((row / page_size) as usize, (row % page_size) as usize))
        })
        .collect();
    if !ranges_hold(&indptr, indices.len(), &targets) {
        return Err(changed());
    }
    let host = crate::page_table::PageTable { indptr: &indptr, indices: &indices, last_page_len: &[] };
    match crate::page_table::shared_append_page(host, &targets) {
        Some(message) => Err(Error::InvalidPageTable(message)),
        None => Ok(()),
    }
}

/// Whether `indptr` (`targets.len() + 1` entries) holds what [`crate::page_table::shared_append_page`]
/// needs: non-decreasing ranges from 0 or more up to at most `indices_len`, and at least one page
/// in the range of each request that appends (`Some` target).
fn ranges_hold(indptr: &[i32], indices_len: usize, targets: &[Option<(usize, usize)>]) -> bool {
    indptr.len() == targets.len() + 1
        && indptr.first().is_some_and(|&first| first >= 0)
        && indptr.last().is_some_and(|&last| last as usize <= indices_len)
        && indptr.windows(2).zip(targets).all(|(w, t)| w[0] <= w[1] && (t.is_none() || w[0] < w[1]))
}

/// [`Error::InvalidPageTable`] naming the first request whose append slot (a store row,
/// `page × page_size + slot`) an earlier request already takes; requests without pages
/// ([`params::NO_APPEND_SLOT`]) append nothing.
fn shared_append_slot(slots: &[u64], page_size: u64) -> Result<()> {
    let mut first_writer = std::collections::HashMap::with_capacity(slots.len());
    for (b, &row) in slots.iter().enumerate().filter(|&(_, &row)| row != params::NO_APPEND_SLOT) {
        if let Some(a) = first_writer.insert(row, b) {
            let (page, slot) = (row / page_size.max(1), row % page_size.max(1));
            let message = crate::page_table::shared_slot_message(a as u64, b as u64, page, slot);
            return Err(Error::InvalidPageTable(message));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::ranges_hold;

    /// A host copy of a table that changed after the kernel passed it is told apart, never
    /// indexed out of range.
    #[test]
    fn ranges_that_changed_after_the_check_are_caught() {
        let two = [Some((5, 2)), None];
        assert!(ranges_hold(&[0, 1, 1], 1, &two));
        assert!(ranges_hold(&[0, 2, 3], 3, &two));
        assert!(!ranges_hold(&[0, 0, 1], 1, &two), "an appending request lost its pages");
        assert!(!ranges_hold(&[0, 2, 1], 2, &two), "decreasing");
        assert!(!ranges_hold(&[-1, 1, 1], 1, &two), "negative start");
        assert!(!ranges_hold(&[0, 1, 4], 3, &two), "past indices");
        assert!(!ranges_hold(&[0, 1, -4], 3, &two), "negative end");
        assert!(!ranges_hold(&[0, 1], 1, &two), "too short");
        assert!(ranges_hold(&[0], 0, &[]));
    }
}
