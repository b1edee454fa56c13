//! The paged K/V page table ([`PageTable`]: `indptr`, `indices`, `last_page_len`) and its host-side
//! validation.
//!
//! Contract checked by [`validate_page_table`], for a batch of `B` requests:
//! - `indptr` has `B + 1` entries, starts at 0, never decreases, and `indptr[B] <= indices.len()`.
//!   Request `b` owns the pages `indices[indptr[b]..indptr[b + 1]]`, in token order.
//! - `last_page_len` has `B` entries, each in `[0, page_size]`. A request with `n ≥ 1` pages holds
//!   `(n - 1) * page_size + last_page_len[b]` tokens, so 0 means its last page is still empty
//!   (it was allocated ahead of the next token). A request with no page holds 0 tokens whatever
//!   its `last_page_len`, which must still lie in `[0, page_size]`.
//! - Every page id in `indices[0..indptr[B]]` lies in `[0, num_total_pages)`. Entries past
//!   `indptr[B]` are never read and not checked.
//! - No page id appears twice (within one request or across requests) unless
//!   [`PageTableRules::allow_shared_pages`] is set.
//!
//! These are the same rules the device-side check enforces, plus `indptr[0] == 0` and the
//! optional uniqueness check.
//!
//! Appending ([`validate_append_table`], [`crate::PagedKvAppendPlan`] with
//! [`checked`](crate::PlanPreference::checked), [`crate::reference::append`]) needs the table
//! advanced for the new token, so on top of the rules above (shared pages allowed):
//! - a request without pages appends nothing (a free slot of a batch padded to a fixed size, as
//!   a captured graph needs); its token rows are not read,
//! - on a request with pages, `last_page_len[b] ≥ 1` (the new token is counted: it goes to slot
//!   `last_page_len[b] - 1` of its last page),
//! - no two requests append to the same slot of the same page,
//! - and no request appends to a page that appears elsewhere in the table (in another request,
//!   or earlier in its own): every other reference to the page counts the slot as a token, or
//!   appends to a slot the appending request counts, so one token would overwrite another.
//!   Pages shared as a common prefix are fine; the page a request appends to is its own.

use std::collections::HashMap;

use crate::error::{Error, Result};
use crate::types::PagedKvCacheDescriptor;

/// A borrowed page table in CSR form.
///
/// Request `b` owns the pages `indices[indptr[b]..indptr[b + 1]]` in token order, and its last
/// page holds `last_page_len[b]` tokens. See the [module documentation](self) for the full
/// contract.
#[derive(Clone, Copy, Debug)]
pub struct PageTable<'a> {
    /// `batch + 1` offsets into `indices`, starting at 0 and non-decreasing.
    pub indptr: &'a [i32],
    /// Physical page ids, `[0, num_total_pages)`.
    pub indices: &'a [i32],
    /// Tokens in each request's last page, `[0, page_size]`.
    pub last_page_len: &'a [i32],
}

impl PageTable<'_> {
    /// Number of tokens of request `b`: 0 when it owns no page, otherwise
    /// `(pages - 1) * page_size + last_page_len[b]`.
    ///
    /// Out-of-contract values are read the way the kernels read them: a negative page count
    /// counts as 0 and `last_page_len[b]` is clamped into `[0, page_size]`. A request the
    /// arrays do not hold (`b + 1 >= indptr.len()` or `b >= last_page_len.len()`) has 0 tokens.
    pub fn request_len(&self, b: usize, page_size: usize) -> usize {
        let (Some(&start), Some(&stop), Some(&last)) =
            (self.indptr.get(b), self.indptr.get(b.saturating_add(1)), self.last_page_len.get(b))
        else {
            return 0;
        };
        let pages = (i64::from(stop) - i64::from(start)).max(0) as usize;
        if pages == 0 {
            return 0;
        }
        let last = (last.max(0) as usize).min(page_size);
        (pages - 1).saturating_mul(page_size).saturating_add(last)
    }
}

/// Options for [`validate_page_table`].
#[derive(Clone, Copy, Debug, Default)]
pub struct PageTableRules {
    /// Accept a page id used more than once (e.g. a prefix shared by several requests).
    /// Decode only reads pages, so sharing is safe there; writers usually want it off.
    pub allow_shared_pages: bool,
}

fn bad(msg: String) -> Error {
    Error::InvalidPageTable(msg)
}

/// Checks `table` against `paged_kv` for a batch of `batch_size` requests.
///
/// Returns [`Error::InvalidProblem`] if `paged_kv` itself is unusable (`page_size < 1` or
/// `num_total_pages < 0`), and otherwise [`Error::InvalidPageTable`] naming the first broken rule:
/// the array, the position, the offending value and the request it belongs to. See the
/// [module documentation](self) for the rules.
pub fn validate_page_table(
    paged_kv: &PagedKvCacheDescriptor,
    batch_size: usize,
    table: PageTable<'_>,
    rules: PageTableRules,
) -> Result<()> {
    let page_size = paged_kv.page_size;
    let num_pages = paged_kv.num_total_pages;
    if page_size < 1 {
        return Err(Error::InvalidProblem(format!("page_size = {page_size} must be at least 1")));
    }
    if num_pages < 0 {
        return Err(Error::InvalidProblem(format!("num_total_pages = {num_pages} must be non-negative")));
    }
    let PageTable { indptr, indices, last_page_len } = table;

    let expected =
        batch_size.checked_add(1).ok_or_else(|| bad(format!("batch_size = {batch_size} is too large")))?;
    if indptr.len() != expected {
        return Err(bad(format!(
            "indptr has {} entries, expected batch_size + 1 = {expected}",
            indptr.len()
        )));
    }
    if last_page_len.len() != batch_size {
        return Err(bad(format!(
            "last_page_len has {} entries, expected batch_size = {batch_size}",
            last_page_len.len()
        )));
    }
    if indptr[0] != 0 {
        return Err(bad(format!("indptr[0] = {} must be 0", indptr[0])));
    }
    for b in 0..batch_size {
        if indptr[b + 1] < indptr[b] {
            return Err(bad(format!(
                "indptr[{}] = {} is less than indptr[{b}] = {} (request {b}); indptr must be non-decreasing",
                b + 1,
                indptr[b + 1],
                indptr[b]
            )));
        }
    }
    // Non-negative: indptr[0] == 0 and indptr never decreases.
    let used = indptr[batch_size] as usize;
    if used > indices.len() {
        return Err(bad(format!("indptr[{batch_size}] = {used} exceeds indices.len() = {}", indices.len())));
    }
    for (b, &len) in last_page_len.iter().enumerate() {
        if !(0..=page_size).contains(&len) {
            return Err(bad(format!("last_page_len[{b}] = {len} is outside [0, {page_size}] (request {b})")));
        }
    }
    // (position in indices, request, page id) of every page reference.
    let refs = (0..batch_size).flat_map(|b| {
        let (start, stop) = (indptr[b] as usize, indptr[b + 1] as usize);
        (start..stop).map(move |i| (i, b, indices[i]))
    });
    for (i, b, page) in refs.clone() {
        if !(0..num_pages).contains(&page) {
            return Err(bad(format!("indices[{i}] = {page} is outside [0, {num_pages}) (request {b})")));
        }
    }
    if !rules.allow_shared_pages {
        // Page id -> (position in indices, request) of its first use.
        let mut first_use: HashMap<i32, (usize, usize)> = HashMap::with_capacity(used);
        for (i, b, page) in refs {
            if let Some(&(j, a)) = first_use.get(&page) {
                return Err(bad(format!(
                    "indices[{i}] = {page} (request {b}) repeats the page at indices[{j}] (request {a}); \
                     shared pages are not allowed"
                )));
            }
            first_use.insert(page, (i, b));
        }
    }
    Ok(())
}

/// Checks `table` for appending one token per request: [`validate_page_table`] with shared pages
/// allowed, then the append rules of the [module documentation](self), reported as
/// [`Error::InvalidPageTable`] naming the request (and, for a shared slot, both requests).
pub fn validate_append_table(
    paged_kv: &PagedKvCacheDescriptor,
    batch_size: usize,
    table: PageTable<'_>,
) -> Result<()> {
    append_slots(paged_kv, batch_size, table).map(|_| ())
}

/// The `(page, slot)` each request appends to (`None`: no pages, nothing to append), after
/// [`validate_append_table`]'s checks.
pub(crate) fn append_slots(
    paged_kv: &PagedKvCacheDescriptor,
    batch_size: usize,
    table: PageTable<'_>,
) -> Result<Vec<Option<(usize, usize)>>> {
    validate_page_table(paged_kv, batch_size, table, PageTableRules { allow_shared_pages: true })?;
    let mut slots = Vec::with_capacity(batch_size);
    // (page, slot) -> the first request appending there.
    let mut writers: HashMap<(usize, usize), usize> = HashMap::with_capacity(batch_size);
    for b in 0..batch_size {
        let (start, stop) = (table.indptr[b], table.indptr[b + 1]);
        if stop == start {
            slots.push(None);
            continue;
        }
        let last = table.last_page_len[b];
        if last < 1 {
            return Err(bad(last_page_empty_message(b as u64)));
        }
        let pos = stop as usize - 1;
        let target = (table.indices[pos] as usize, last as usize - 1);
        if let Some(a) = writers.insert(target, b) {
            return Err(bad(shared_slot_message(a as u64, b as u64, target.0 as u64, target.1 as u64)));
        }
        slots.push(Some(target));
    }
    match shared_append_page(table, &slots) {
        Some(message) => Err(bad(message)),
        None => Ok(slots),
    }
}

/// The append rule past the shared slots: no request appends to a page that appears elsewhere
/// in the table. `targets[b]` is the `(page, slot)` request `b` appends to, its last page
/// `indices[indptr[b + 1] - 1]` (`None`: it has no pages and appends nothing); the requests' ranges of `indices` are valid (`0 ≤ indptr[b] ≤
/// indptr[b + 1] ≤ indices.len()`); `last_page_len` is not read. Any other reference to an append page counts the appended
/// slot as a token (a page before a request's last counts all `page_size`), or is another
/// request's append page, and then one of the two counts the slot the other appends to.
/// Returns the message of the first such reference, in table order.
pub(crate) fn shared_append_page(table: PageTable<'_>, targets: &[Option<(usize, usize)>]) -> Option<String> {
    let batch = targets.len();
    // Append page -> (request, slot, its position in indices).
    let mut appended: HashMap<usize, (usize, usize, usize)> = HashMap::with_capacity(batch);
    for (b, &(page, slot)) in targets.iter().enumerate().filter_map(|(b, t)| Some((b, t.as_ref()?))) {
        let position = table.indptr[b + 1] as usize - 1;
        appended.entry(page).or_insert((b, slot, position));
    }
    for a in 0..batch {
        let (start, stop) = (table.indptr[a] as usize, table.indptr[a + 1] as usize);
        for position in start..stop {
            let page = table.indices[position] as usize;
            let Some(&(b, slot, at)) = appended.get(&page) else { continue };
            if position != at {
                return Some(shared_page_message(b, page, slot, a, position - start));
            }
        }
    }
    None
}

/// Append rule: request `b` has pages but `last_page_len[b] = 0`.
pub(crate) fn last_page_empty_message(b: u64) -> String {
    format!(
        "last_page_len[{b}] = 0 on a request with pages (request {b}); when appending it must lie in \
         [1, page_size]: count the new token before appending"
    )
}

/// Append rule: requests `a < b` append to the same `slot` of `page`.
pub(crate) fn shared_slot_message(a: u64, b: u64, page: u64, slot: u64) -> String {
    format!(
        "requests {a} and {b} both append to slot {slot} of page {page}; one token would overwrite the other"
    )
}

/// Append rule: request `b` appends to `slot` of `page`, which is also page `k` (from 0) of
/// request `a`.
pub(crate) fn shared_page_message(b: usize, page: usize, slot: usize, a: usize, k: usize) -> String {
    let whose = if a == b { format!("its own page {k}") } else { format!("page {k} of request {a}") };
    format!(
        "request {b} appends to slot {slot} of page {page}, which is also {whose}: the new token would \
         overwrite a token the table counts there; the page a request appends to must appear once"
    )
}

#[cfg(test)]
mod tests {
    use rand::rngs::SmallRng;
    use rand::{Rng, SeedableRng};

    use super::*;
    use crate::types::ElementKind;

    fn kv(page_size: i32, num_total_pages: i32) -> PagedKvCacheDescriptor {
        PagedKvCacheDescriptor {
            page_size,
            num_total_pages,
            num_kv_heads: 2,
            head_dim: 64,
            element: ElementKind::F16,
        }
    }

    fn table<'a>(indptr: &'a [i32], indices: &'a [i32], last_page_len: &'a [i32]) -> PageTable<'a> {
        PageTable { indptr, indices, last_page_len }
    }

    const STRICT: PageTableRules = PageTableRules { allow_shared_pages: false };
    const SHARED: PageTableRules = PageTableRules { allow_shared_pages: true };

    /// Asserts an `InvalidPageTable` error whose message contains every one of `parts`.
    fn expect_err(r: Result<()>, parts: &[&str]) {
        match r {
            Err(Error::InvalidPageTable(msg)) => {
                for p in parts {
                    assert!(msg.contains(p), "message {msg:?} does not mention {p:?}");
                }
            }
            other => panic!("expected InvalidPageTable, got {other:?}"),
        }
    }

    #[test]
    fn accepts_valid_tables() {
        let d = kv(16, 8);
        // Requests with 2, 0, 1 and 1 pages; last_page_len 0 means an empty last page.
        let t = table(&[0, 2, 2, 3, 4], &[5, 1, 7, 0, 99], &[16, 3, 1, 0]);
        validate_page_table(&d, 4, t, STRICT).unwrap();
        validate_page_table(&d, 4, t, SHARED).unwrap();
        // Empty batch.
        validate_page_table(&d, 0, table(&[0], &[], &[]), STRICT).unwrap();
        // No pages in the store and no request using one.
        validate_page_table(&kv(16, 0), 2, table(&[0, 0, 0], &[], &[0, 16]), STRICT).unwrap();
    }

    #[test]
    fn rejects_bad_descriptor() {
        let t = table(&[0], &[], &[]);
        assert!(matches!(validate_page_table(&kv(0, 8), 0, t, STRICT), Err(Error::InvalidProblem(_))));
        assert!(matches!(validate_page_table(&kv(16, -1), 0, t, STRICT), Err(Error::InvalidProblem(_))));
    }

    #[test]
    fn rejects_indptr_wrong_length() {
        let d = kv(16, 8);
        expect_err(
            validate_page_table(&d, 2, table(&[0, 1], &[0], &[1, 1]), STRICT),
            &["indptr", "2 entries", "3"],
        );
        expect_err(validate_page_table(&d, 0, table(&[], &[], &[]), STRICT), &["indptr", "0 entries", "1"]);
    }

    #[test]
    fn rejects_last_page_len_wrong_length() {
        let d = kv(16, 8);
        expect_err(
            validate_page_table(&d, 2, table(&[0, 1, 2], &[0, 1], &[1]), STRICT),
            &["last_page_len", "1 entries", "2"],
        );
    }

    #[test]
    fn rejects_nonzero_indptr_start() {
        let d = kv(16, 8);
        expect_err(validate_page_table(&d, 1, table(&[1, 2], &[0, 1], &[1]), STRICT), &["indptr[0] = 1"]);
        expect_err(validate_page_table(&d, 1, table(&[-1, 0], &[0], &[1]), STRICT), &["indptr[0] = -1"]);
    }

    #[test]
    fn rejects_decreasing_indptr() {
        let d = kv(16, 8);
        expect_err(
            validate_page_table(&d, 3, table(&[0, 2, 1, 3], &[0, 1, 2], &[1, 1, 1]), STRICT),
            &["indptr[2] = 1", "indptr[1] = 2", "request 1", "non-decreasing"],
        );
    }

    #[test]
    fn rejects_indptr_past_indices() {
        let d = kv(16, 8);
        expect_err(
            validate_page_table(&d, 2, table(&[0, 1, 4], &[0, 1, 2], &[1, 1]), STRICT),
            &["indptr[2] = 4", "indices.len() = 3"],
        );
    }

    #[test]
    fn rejects_last_page_len_out_of_range() {
        let d = kv(16, 8);
        expect_err(
            validate_page_table(&d, 2, table(&[0, 1, 2], &[0, 1], &[16, 17]), STRICT),
            &["last_page_len[1] = 17", "[0, 16]", "request 1"],
        );
        expect_err(
            validate_page_table(&d, 2, table(&[0, 1, 2], &[0, 1], &[-1, 1]), STRICT),
            &["last_page_len[0] = -1", "request 0"],
        );
        // Also checked for a request without pages.
        expect_err(
            validate_page_table(&d, 2, table(&[0, 1, 1], &[0], &[1, 20]), STRICT),
            &["last_page_len[1] = 20"],
        );
    }

    #[test]
    fn rejects_page_out_of_range() {
        let d = kv(16, 4096);
        let mut indices: Vec<i32> = (0..16).collect();
        indices[12] = 4100;
        let indptr = [0, 4, 8, 12, 16];
        expect_err(
            validate_page_table(&d, 4, table(&indptr, &indices, &[1, 1, 1, 1]), SHARED),
            &["indices[12] = 4100 is outside [0, 4096) (request 3)"],
        );
        indices[12] = 12;
        indices[5] = -3;
        expect_err(
            validate_page_table(&d, 4, table(&indptr, &indices, &[1, 1, 1, 1]), SHARED),
            &["indices[5] = -3", "request 1"],
        );
        // Entries past indptr[B] are not read.
        indices[5] = 5;
        indices.push(-7);
        validate_page_table(&d, 4, table(&indptr, &indices, &[1, 1, 1, 1]), STRICT).unwrap();
    }

    #[test]
    fn shared_pages_need_permission() {
        let d = kv(16, 8);
        // Page 3 used by requests 0 and 2.
        let t = table(&[0, 2, 3, 5], &[3, 1, 2, 6, 3], &[4, 4, 4]);
        validate_page_table(&d, 3, t, SHARED).unwrap();
        expect_err(
            validate_page_table(&d, 3, t, STRICT),
            &["indices[4] = 3", "request 2", "indices[0]", "request 0", "shared"],
        );
        // Page used twice by the same request.
        let t = table(&[0, 3], &[5, 6, 5], &[1]);
        validate_page_table(&d, 1, t, SHARED).unwrap();
        expect_err(validate_page_table(&d, 1, t, STRICT), &["indices[2] = 5", "indices[0]", "request 0"]);
    }

    #[test]
    fn append_needs_a_counted_token_and_its_own_slot() {
        let d = kv(4, 8);
        // Request 0 appends to slot 1 of page 3, request 1 to slot 1 of page 3 too.
        let shared_slot = table(&[0, 1, 2], &[3, 3], &[2, 2]);
        // A request without pages appends nothing, whatever its last_page_len.
        validate_append_table(&d, 2, table(&[0, 1, 1], &[0], &[1, 0])).unwrap();
        validate_append_table(&d, 2, table(&[0, 0, 1], &[0], &[4, 1])).unwrap();
        let cases = [
            (table(&[0, 1, 2], &[0, 1], &[0, 1]), "last_page_len[0] = 0"),
            (shared_slot, "requests 0 and 1 both append to slot 1 of page 3"),
        ];
        for (t, part) in cases {
            // Each is a valid decode table (shared pages allowed)...
            validate_page_table(&d, 2, t, SHARED).unwrap();
            // ...that appending rejects.
            expect_err(validate_append_table(&d, 2, t), &[part]);
        }
        // An append page seen elsewhere: two requests appending to two slots of one page (request 1
        // counts slot 0, which request 0 writes), a page request 0 fills earlier that request 1
        // appends to, and a request appending to a page it repeats.
        let overwrites = [
            (
                table(&[0, 1, 2], &[3, 3], &[1, 2]),
                "request 0 appends to slot 0 of page 3, which is also page 0 of request 1",
            ),
            (
                table(&[0, 2, 3], &[3, 5, 3], &[1, 2]),
                "request 1 appends to slot 1 of page 3, which is also page 0 of request 0",
            ),
            (table(&[0, 2, 3], &[3, 5, 6], &[2, 2]), ""),
            (
                table(&[0, 3], &[3, 5, 3], &[2]),
                "request 0 appends to slot 1 of page 3, which is also its own page 0",
            ),
        ];
        for (t, part) in overwrites {
            let batch = t.last_page_len.len();
            validate_page_table(&d, batch, t, SHARED).unwrap();
            if part.is_empty() {
                validate_append_table(&d, batch, t).unwrap();
            } else {
                expect_err(validate_append_table(&d, batch, t), &[part, "overwrite"]);
            }
        }
        // A shared prefix page before the appended ones.
        validate_append_table(&d, 2, table(&[0, 2, 4], &[5, 3, 5, 6], &[4, 4])).unwrap();
        // The decode rules still apply.
        expect_err(validate_append_table(&d, 2, table(&[0, 1, 2], &[0, 9], &[1, 1])), &["indices[1] = 9"]);
        expect_err(validate_append_table(&d, 1, table(&[0, 1], &[0], &[5])), &["last_page_len[0] = 5"]);
    }

    #[test]
    fn garbage_never_panics() {
        let d = kv(7, 5);
        let vals = [i32::MIN, -1, 0, 1, 2, 3, 6, 7, 8, i32::MAX];
        let mut rng = SmallRng::seed_from_u64(0x1234_5678_9abc_def0);
        let pick = |rng: &mut SmallRng, max_len: usize| -> Vec<i32> {
            let n = rng.random_range(0..max_len);
            (0..n).map(|_| vals[rng.random_range(0..vals.len())]).collect()
        };
        for _ in 0..2000 {
            let b = rng.random_range(0..4);
            let mut indptr = pick(&mut rng, 6);
            if rng.random_bool(0.5) {
                indptr.sort_unstable();
                if let Some(first) = indptr.first_mut() {
                    *first = 0;
                }
            }
            let indices = pick(&mut rng, 8);
            let last = pick(&mut rng, 5);
            let rules = PageTableRules { allow_shared_pages: rng.random_bool(0.5) };
            let r = validate_page_table(&d, b, table(&indptr, &indices, &last), rules);
            assert!(matches!(r, Ok(()) | Err(Error::InvalidPageTable(_))));
        }
    }
}
