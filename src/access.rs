//! Claims on host memory: how safe code sharing tensors between threads never races.
//!
//! A [`Tensor`] is a shared handle: clones and views of it, in any thread, reach the same
//! memory, and dlpart's operations write through `&Tensor`. Before a kernel reads or writes
//! host memory it claims the byte ranges it will touch, and [`Tensor::as_array`] (reading) and
//! [`Tensor::as_array_mut`] (writing) claim the range of their view for as long as the view
//! lives. A claim that would write memory another live claim reads or writes, or read memory
//! another writes, is refused with [`Error::Buffer`] naming both sides: the operation, the
//! tensor and what it is to the operation (a [`Role`]: `output`, `target partition 3`) on
//! this side, the operation and role on the other, and the bytes they share. Concurrent
//! readers share, a writer is alone. Nothing waits, so a thread can never block on a claim it holds
//! itself (a view it still holds, or a kernel it called from inside another operation's
//! work).
//!
//! A tensor whose elements leave gaps in its span (a column block, a tile of a larger array)
//! claims its elements only: where its span meets another claim's, the elements are compared
//! (see [`conflict`]), so that threads working on interleaved blocks of one array do not
//! refuse each other.
//!
//! Claims cover dlpart's own reads and writes of host-accessible memory. Device memory is
//! never dereferenced by the host, and memory a foreign framework shares (numpy's view of a
//! DLPack export) is that framework's to synchronise, as in any DLPack exchange.

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use crate::error::{Error, Result};
use crate::overlap::{self, Run};
use crate::tensor::{Axes, Tensor};

/// What a claimed tensor is to the operation claiming it, as a conflict names it: `output`,
/// `source partition 3`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Role {
    what: &'static str,
    index: Option<usize>,
}

impl Role {
    /// The role `what`: `"output"`.
    pub(crate) const fn new(what: &'static str) -> Self {
        Role { what, index: None }
    }

    /// The role `what` numbered `index`: `"target partition"` 3.
    pub(crate) const fn nth(what: &'static str, index: usize) -> Self {
        Role {
            what,
            index: Some(index),
        }
    }
}

impl fmt::Display for Role {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.index {
            Some(i) => write!(f, "{} {i}", self.what),
            None => f.write_str(self.what),
        }
    }
}

/// `tensors` numbered in order as `what` 0, 1, ...: the partitions of an operation.
pub(crate) fn numbered<'a>(
    what: &'static str,
    tensors: impl IntoIterator<Item = &'a Tensor>,
) -> impl Iterator<Item = (Role, &'a Tensor)> {
    let role = move |(i, t)| (Role::nth(what, i), t);
    tensors.into_iter().enumerate().map(role)
}

/// A byte range `[lo, hi)`, whether the claim writes it, and what the tensor it covers is to
/// the claiming operation.
#[derive(Clone, Copy, Debug)]
struct Range {
    lo: usize,
    hi: usize,
    write: bool,
    role: Role,
}

/// The tensor a range of a claim being made covers, for its error: the operation's own
/// tensors are at hand then, so a claim keeps none of them.
#[derive(Clone, Copy)]
enum Mine<'a> {
    /// A whole tensor.
    Tensor(&'a Tensor),
    /// The box `.2` elements from element `.1` of a tensor.
    Box(&'a Tensor, &'a [usize], &'a [usize]),
    /// Raw bytes (the claims of tests).
    #[cfg(test)]
    Bytes,
}

impl fmt::Display for Mine<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Mine::Tensor(t) => write!(f, "{t:?}"),
            Mine::Box(t, start, shape) => write!(
                f,
                "the box of shape {} at {} of {t:?}",
                crate::error::tuple_string(shape),
                crate::error::tuple_string(start)
            ),
            #[cfg(test)]
            Mine::Bytes => f.write_str("bytes"),
        }
    }
}

struct Entry {
    id: u64,
    /// The operation, for the errors of claims that meet this one.
    op: &'static str,
    /// The smallest range holding every one of `ranges`, for a quick first test.
    bounds: (usize, usize),
    ranges: Vec<Range>,
    /// For each range, the elements of the tensor it spans when they leave gaps in it: the
    /// range then claims those elements only. `None` claims every byte.
    gapped: Vec<Option<Elements>>,
}

/// Where the elements of a tensor lie: its address, item size, and shape and strides (in
/// elements). A claim keeps these rather than the tensor: a copy of its fields, with no
/// reference count to touch, for each of thousands of partitions.
struct Elements {
    data: usize,
    item: usize,
    shape: Axes<usize>,
    strides: Axes<isize>,
}

impl Elements {
    /// Appends the runs of these elements to `out` (see [`overlap::runs_in`]); `false`,
    /// appending nothing, beyond `budget` runs.
    fn runs(&self, out: &mut Vec<Run>, budget: usize) -> bool {
        let (shape, strides) = (&self.shape, &self.strides);
        overlap::runs_in(self.data, shape, strides, self.item, 0, out, budget)
    }
}

static ACTIVE: Mutex<Vec<Entry>> = Mutex::new(Vec::new());
static NEXT: AtomicU64 = AtomicU64::new(0);

thread_local! {
    /// The ids of the [`Scope`]s this thread holds: its own later claims may overlap them.
    static SCOPES: std::cell::RefCell<Vec<u64>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// Memory claimed until this is dropped.
#[must_use = "the memory is claimed only while the claim lives"]
#[derive(Debug)]
pub(crate) struct Claim {
    id: Option<u64>,
}

impl Drop for Claim {
    fn drop(&mut self) {
        if let Some(id) = self.id {
            let mut active = ACTIVE.lock().unwrap_or_else(|e| e.into_inner());
            let gone = active
                .iter()
                .position(|e| e.id == id)
                .map(|at| active.swap_remove(at));
            // The entry is freed after the lock.
            drop(active);
            drop(gone);
        }
    }
}

/// A claim held for the whole of a collective operation, from the check before the ranks
/// agree to the last copy after: other threads are refused as by any claim, while the steps
/// of the operation on this thread (its own claims of the same memory) go on. A claim that
/// lapsed between the check and the steps would let another thread claim the memory in
/// between, and this rank fail alone after the others had agreed to go on. Code the
/// operation calls out to on this thread without controlling it (a communicator's methods)
/// runs with the scope set aside ([`suspend`]), as code of any other thread.
///
/// Dropped on the thread that made it (it is not `Send`).
#[must_use = "the memory is claimed only while the scope lives"]
#[derive(Debug)]
pub(crate) struct Scope {
    claim: Claim,
    _here: std::marker::PhantomData<*const ()>,
}

impl Drop for Scope {
    fn drop(&mut self) {
        if let Some(id) = self.claim.id {
            SCOPES.with(|s| s.borrow_mut().retain(|&x| x != id));
        }
    }
}

/// [`tensors`] held as a [`Scope`] of this thread.
pub(crate) fn scope<'a>(
    op: &'static str,
    reads: impl IntoIterator<Item = (Role, &'a Tensor)>,
    writes: impl IntoIterator<Item = (Role, &'a Tensor)>,
) -> Result<Scope> {
    let claim = tensors(op, reads, writes)?;
    if let Some(id) = claim.id {
        SCOPES.with(|s| s.borrow_mut().push(id));
    }
    Ok(Scope {
        claim,
        _here: std::marker::PhantomData,
    })
}

/// This thread's [`Scope`]s set aside until the guard is dropped: around code a collective
/// operation calls but does not control (a [`crate::spmd::Communicator`]'s `host` and the
/// calls that move bytes, which may run a program's own code on this thread), whose claims
/// then meet the scopes' memory as any other code's do. A view such code took of that
/// memory, and kept, would otherwise refuse the operation's own later claims on this rank
/// alone, after the ranks agreed to go on.
///
/// Dropped on the thread that made it (it is not `Send`).
#[must_use = "the scopes are set aside only while the guard lives"]
pub(crate) struct Suspended {
    scopes: Vec<u64>,
    _here: std::marker::PhantomData<*const ()>,
}

impl Drop for Suspended {
    fn drop(&mut self) {
        SCOPES.with(|s| {
            let mut s = s.borrow_mut();
            // Scopes made while suspended and still held stay this thread's too.
            let later = std::mem::take(&mut *s);
            *s = std::mem::take(&mut self.scopes);
            s.extend(later);
        });
    }
}

/// Sets this thread's scopes aside until the guard returned is dropped (see [`Suspended`]).
pub(crate) fn suspend() -> Suspended {
    Suspended {
        scopes: SCOPES.with(|s| std::mem::take(&mut *s.borrow_mut())),
        _here: std::marker::PhantomData,
    }
}

/// The host bytes `t` spans, or `None` when it holds no elements or lives in device memory.
pub(crate) fn span(t: &Tensor) -> Option<(usize, usize)> {
    if t.numel() == 0 || !t.device().is_host_accessible() {
        return None;
    }
    let (lo, hi) = t.byte_span();
    let base = t.data_ptr() as usize;
    Some((base.wrapping_add_signed(lo), base.wrapping_add_signed(hi)))
}

/// One range of a claim being made: the range, the elements it claims when it does not
/// claim them all, and the tensor it covers.
type Part<'a> = (Range, Option<Elements>, Mine<'a>);

/// The range `t` spans, with `t`'s elements when they leave gaps in it: the range then
/// claims those only.
fn part<'a>(t: &Tensor, write: bool, role: Role, mine: Mine<'a>) -> Option<Part<'a>> {
    let (lo, hi) = span(t)?;
    let gapped = (!t.is_contiguous()).then(|| Elements {
        data: t.data_ptr() as usize,
        item: t.dtype().itemsize(),
        shape: t.shape().into(),
        strides: t.strides().into(),
    });
    let range = Range {
        lo,
        hi,
        write,
        role,
    };
    Some((range, gapped, mine))
}

/// Claims the elements of `reads` for reading and of `writes` for writing (see the module
/// docs), for the operation `op`, each with its [`Role`] there. A claim's tensors may share
/// memory (a kernel that reads what it writes orders that itself).
pub(crate) fn tensors<'a>(
    op: &'static str,
    reads: impl IntoIterator<Item = (Role, &'a Tensor)>,
    writes: impl IntoIterator<Item = (Role, &'a Tensor)>,
) -> Result<Claim> {
    let side =
        |write: bool| move |(role, t): (Role, &'a Tensor)| part(t, write, role, Mine::Tensor(t));
    claim(
        op,
        reads
            .into_iter()
            .filter_map(side(false))
            .chain(writes.into_iter().filter_map(side(true)))
            .collect(),
    )
}

/// A box of a tensor: `.2` elements (its shape) from element `.1` of tensor `.0`.
pub(crate) type TensorBox<'a> = (&'a Tensor, &'a [usize], &'a [usize]);

/// Claims boxes of tensors, as [`tensors`] claims the views of them, for the operation `op`:
/// `reads` for reading, `writes` for writing, each with its [`Role`]. A box outside its
/// tensor is refused with the error of [`Tensor::view`].
pub(crate) fn boxes<'a>(
    op: &'static str,
    reads: impl IntoIterator<Item = (Role, TensorBox<'a>)>,
    writes: impl IntoIterator<Item = (Role, TensorBox<'a>)>,
) -> Result<Claim> {
    let mut list = Vec::new();
    let mut add = |write: bool, (role, (t, start, shape)): (Role, TensorBox<'a>)| -> Result<()> {
        if !t.device().is_host_accessible() || shape.contains(&0) {
            return Ok(());
        }
        let mine = Mine::Box(t, start, shape);
        list.extend(part(&t.view(start, shape)?, write, role, mine));
        Ok(())
    };
    for b in reads {
        add(false, b)?;
    }
    for b in writes {
        add(true, b)?;
    }
    claim(op, list)
}

/// Claims byte ranges `[lo, hi)`: `reads` for reading, `writes` for writing, each named
/// `range` and its index. Ranges of one claim may overlap each other.
#[cfg(test)]
fn ranges(
    reads: impl IntoIterator<Item = (usize, usize)>,
    writes: impl IntoIterator<Item = (usize, usize)>,
) -> Result<Claim> {
    let range = |write: bool| {
        move |(i, (lo, hi))| {
            let role = Role::nth("range", i);
            let range = Range {
                lo,
                hi,
                write,
                role,
            };
            (range, None, Mine::Bytes)
        }
    };
    claim(
        "ranges",
        reads
            .into_iter()
            .enumerate()
            .map(range(false))
            .chain(writes.into_iter().enumerate().map(range(true)))
            .collect(),
    )
}

/// Claims `list`'s ranges for the operation `op`, each with the elements it claims when it
/// does not claim them all.
fn claim(op: &'static str, mut list: Vec<Part<'_>>) -> Result<Claim> {
    list.retain(|(r, _, _)| r.lo < r.hi);
    if list.is_empty() {
        return Ok(Claim { id: None });
    }
    let mut ranges = Vec::with_capacity(list.len());
    let mut gapped = Vec::with_capacity(list.len());
    let mut mine_of = Vec::with_capacity(list.len());
    for (r, g, m) in list {
        ranges.push(r);
        gapped.push(g);
        mine_of.push(m);
    }
    let bounds = ranges
        .iter()
        .fold((usize::MAX, 0), |(lo, hi), r| (lo.min(r.lo), hi.max(r.hi)));
    let mut active = ACTIVE.lock().unwrap_or_else(|e| e.into_inner());
    for other in active.iter() {
        if other.bounds.0 >= bounds.1 || bounds.0 >= other.bounds.1 {
            continue;
        }
        if SCOPES.with(|s| s.borrow().contains(&other.id)) {
            continue; // this thread's own operation
        }
        let theirs = Side {
            ranges: &other.ranges,
            gapped: &other.gapped,
        };
        let mine = Side {
            ranges: &ranges,
            gapped: &gapped,
        };
        if let Some(((i, a), (_, b))) = conflict(mine, theirs) {
            let what = if a.write { "write" } else { "read" };
            let by = if b.write { "written" } else { "read" };
            let (lo, hi) = (a.lo.max(b.lo), a.hi.min(b.hi));
            let (role, theirs, tensor, other) = (a.role, b.role, mine_of[i], other.op);
            return Err(Error::buffer(format!(
                "{op}: cannot {what} its {role}, {tensor}: host memory {lo:#x}..{hi:#x} of \
                 it is being {by} at the same time by {other} (its {theirs}), a dlpart call \
                 in another thread or a live view (Tensor::as_array, as_array_mut); dlpart \
                 refuses to race on memory"
            )));
        }
    }
    let id = NEXT.fetch_add(1, Ordering::Relaxed);
    active.push(Entry {
        id,
        op,
        bounds,
        ranges,
        gapped,
    });
    Ok(Claim { id: Some(id) })
}

/// One claim's ranges, and for each the elements it claims when it does not claim them all.
#[derive(Clone, Copy)]
struct Side<'a> {
    ranges: &'a [Range],
    gapped: &'a [Option<Elements>],
}

/// Beyond this many runs (see [`overlap`]) in all, the elements of two claims whose spans
/// meet are judged by their spans. Comparing them exactly takes up to about 16 MB, and time
/// under the lock every claim takes: 0.7 ms for the 65,000 runs of 1,000 64x64 tiles against
/// a column block of their array here, 2.3 ms for two claims of 512 interleaved tiles each.
const CLAIM_RUNS: usize = 1 << 18;

/// Two ranges, one of `mine` and one of `theirs`, that share a byte with at least one of them
/// writing, each with its index on its side: the spans of two ranges that claim every byte,
/// or the runs of elements that meet; `None` when no byte is shared.
///
/// The spans are compared first. Only when they meet where a range claims some elements only
/// are the ranges that meet a range of the other side cut into their runs (one per row of
/// elements, see [`overlap`]) and compared again, exactly however the blocks interleave. A
/// tensor with more runs than are left of [`CLAIM_RUNS`] is judged by its span, which may
/// refuse claims that share no byte, never the reverse.
fn conflict(mine: Side<'_>, theirs: Side<'_>) -> Option<((usize, Range), (usize, Range))> {
    let (i, j) = meeting(mine.ranges, theirs.ranges)?;
    if mine.gapped[i].is_none() && theirs.gapped[j].is_none() {
        return Some(((i, mine.ranges[i]), (j, theirs.ranges[j])));
    }
    let (by_theirs, by_mine) = (
        Sorted::new(items(theirs.ranges, false)),
        Sorted::new(items(mine.ranges, true)),
    );
    let mut budget = CLAIM_RUNS;
    // The runs of the ranges of `side` that meet some range of the other side, `other`.
    let mut runs = |side: Side<'_>, other: &Sorted, mine: bool| {
        let mut out: Vec<Item> = Vec::new();
        let mut cut: Vec<Run> = Vec::new();
        for (at, (r, elements)) in side.ranges.iter().zip(side.gapped).enumerate() {
            let item = Item::new(at, r, mine);
            if other.meeting(&item, other.below(r.hi, 0)).is_none() {
                continue;
            }
            cut.clear();
            if !elements.as_ref().is_some_and(|e| e.runs(&mut cut, budget)) {
                out.push(item);
                budget = budget.saturating_sub(1);
                continue;
            }
            budget = budget.saturating_sub(cut.len());
            out.extend(cut.iter().map(|c| Item {
                lo: c.start,
                hi: c.end,
                ..item
            }));
        }
        out
    };
    let (ranges, their_ranges) = (mine.ranges, theirs.ranges);
    let (mine, theirs) = (runs(mine, &by_theirs, true), runs(theirs, &by_mine, false));
    first_meeting(mine, theirs)
        .map(|(a, b)| ((a.at, a.range(ranges)), (b.at, b.range(their_ranges))))
}

/// The indices of a range of `mine` and one of `theirs` whose spans meet, with at least one
/// of them writing.
fn meeting(mine: &[Range], theirs: &[Range]) -> Option<(usize, usize)> {
    if mine.len().saturating_mul(theirs.len()) <= 4096 {
        return mine.iter().enumerate().find_map(|(i, a)| {
            let j = theirs.iter().position(|b| meet(a, b))?;
            Some((i, j))
        });
    }
    // Many ranges on both sides (thousands of small boxes).
    first_meeting(items(mine, true), items(theirs, false)).map(|(a, b)| (a.at, b.at))
}

/// Whether `a` and `b` overlap with at least one of them writing.
fn meet(a: &Range, b: &Range) -> bool {
    a.lo < b.hi && b.lo < a.hi && (a.write || b.write)
}

/// A range of one side of [`conflict`], or a run of it: of `mine` or of `theirs`, the range
/// at index `at` there.
#[derive(Clone, Copy, Debug)]
struct Item {
    lo: usize,
    hi: usize,
    write: bool,
    mine: bool,
    at: usize,
}

impl Item {
    fn new(at: usize, r: &Range, mine: bool) -> Self {
        Item {
            lo: r.lo,
            hi: r.hi,
            write: r.write,
            mine,
            at,
        }
    }

    /// The bytes of this item, a range of `ranges` (the side it is of) or a run of one.
    fn range(&self, ranges: &[Range]) -> Range {
        Range {
            lo: self.lo,
            hi: self.hi,
            ..ranges[self.at]
        }
    }
}

/// `ranges` as items of `mine` or of theirs.
fn items(ranges: &[Range], mine: bool) -> Vec<Item> {
    let item = |(at, r)| Item::new(at, r, mine);
    ranges.iter().enumerate().map(item).collect()
}

/// The first pair of items, one of `mine` and one of `theirs`, that overlap with at least one
/// of them writing: the side with fewer items sorted, the other's looked up in it.
fn first_meeting(mine: Vec<Item>, theirs: Vec<Item>) -> Option<(Item, Item)> {
    let (probe, sorted) = match mine.len() > theirs.len() {
        true => (mine, Sorted::new(theirs)),
        false => (theirs, Sorted::new(mine)),
    };
    // The items of one range, cut into runs, come in address order: each search starts where
    // the last one ended.
    let mut k = 0;
    probe.iter().find_map(|p| {
        k = sorted.below(p.hi, k);
        let s = *sorted.meeting(p, k)?;
        Some(if p.mine { (*p, s) } else { (s, *p) })
    })
}

/// Items sorted by address, and for each prefix of them the one reaching furthest, of all and
/// of the writing ones: one binary search then finds an item meeting a given one.
struct Sorted {
    items: Vec<Item>,
    /// `reach[k]`: the indices in `items` of the items of `items[..k]` that reach furthest, of
    /// all of them and of those writing.
    reach: Vec<[Option<usize>; 2]>,
}

impl Sorted {
    fn new(mut items: Vec<Item>) -> Self {
        items.sort_unstable_by_key(|r| r.lo);
        let mut reach = Vec::with_capacity(items.len() + 1);
        let mut far: [Option<usize>; 2] = [None; 2];
        reach.push(far);
        for (k, r) in items.iter().enumerate() {
            for (slot, counts) in far.iter_mut().zip([true, r.write]) {
                if counts && slot.is_none_or(|s| items[s].hi < r.hi) {
                    *slot = Some(k);
                }
            }
            reach.push(far);
        }
        Sorted { items, reach }
    }

    /// How many items start below `hi`, searched for from `from` on when at least that many
    /// do (a gallop), else from the start.
    fn below(&self, hi: usize, from: usize) -> usize {
        let n = self.items.len();
        if from > n || (from > 0 && self.items[from - 1].lo >= hi) {
            return self.items.partition_point(|o| o.lo < hi);
        }
        // Every item before `lo` starts below `hi`.
        let (mut lo, mut step) = (from, 1);
        while lo + step <= n && self.items[lo + step - 1].lo < hi {
            lo += step;
            step *= 2;
        }
        let end = (lo + step - 1).min(n);
        lo + self.items[lo..end].partition_point(|o| o.lo < hi)
    }

    /// An item overlapping `r`, with one of the two writing, given `k`, how many items start
    /// below `r`'s end ([`Sorted::below`]).
    fn meeting(&self, r: &Item, k: usize) -> Option<&Item> {
        // One of those meets `r` if the one reaching furthest (of those writing, for a
        // reading `r`) ends past its start.
        let far = &self.items[self.reach[k][usize::from(!r.write)]?];
        (far.hi > r.lo).then_some(far)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// [`super::tensors`] of the operation `test`, each tensor's role `tensor` and its index.
    fn tensors<'a>(
        reads: impl IntoIterator<Item = &'a Tensor>,
        writes: impl IntoIterator<Item = &'a Tensor>,
    ) -> Result<Claim> {
        super::tensors(
            "test",
            numbered("tensor", reads),
            numbered("tensor", writes),
        )
    }

    /// [`super::scope`] as [`tensors`] claims.
    fn scope<'a>(
        reads: impl IntoIterator<Item = &'a Tensor>,
        writes: impl IntoIterator<Item = &'a Tensor>,
    ) -> Result<Scope> {
        super::scope(
            "test",
            numbered("tensor", reads),
            numbered("tensor", writes),
        )
    }

    fn r(lo: usize, hi: usize, write: bool) -> Range {
        let role = Role::new("range");
        Range {
            lo,
            hi,
            write,
            role,
        }
    }

    #[test]
    fn a_scope_lets_its_own_thread_claim_again_and_refuses_others() {
        let t = Tensor::from_slice(&[1.0f32; 64], &[8, 8]).unwrap();
        let block = t.view(&[0, 0], &[8, 4]).unwrap();
        let scope = scope([], [&t]).unwrap();
        // The operation's own steps on this thread: a write of a block, a read of the whole.
        drop(tensors([], [&block]).unwrap());
        drop(tensors([&t], []).unwrap());
        let other = |t: Tensor| std::thread::spawn(move || tensors([&t], []).map(drop));
        let e = other(block.clone())
            .join()
            .unwrap()
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("cannot read") && e.contains("being written"),
            "{e}"
        );
        drop(scope);
        other(block).join().unwrap().unwrap();
        // Without the scope, this thread's claims meet each other as any claims do.
        let w = tensors([], [&t]).unwrap();
        let e = tensors([&t], []).unwrap_err().to_string();
        assert!(e.contains("being written"), "{e}");
        drop(w);
    }

    #[test]
    fn code_called_with_the_scope_suspended_is_refused_as_another_thread_is() {
        let t = Tensor::from_slice(&[1.0f32; 16], &[4, 4]).unwrap();
        let block = t.view(&[0, 0], &[2, 4]).unwrap();
        let u = Tensor::from_slice(&[2.0f32; 4], &[4]).unwrap();
        let held = scope([], [&t]).unwrap();
        let inner = {
            let _aside = suspend();
            let e = tensors([&block], []).unwrap_err().to_string();
            assert!(
                e.contains("cannot read") && e.contains("being written"),
                "{e}"
            );
            // A scope made while suspended, and still held once the guard is gone.
            scope([], [&u]).unwrap()
        };
        // Restored: the operation's own steps go on, on both scopes' memory.
        drop(tensors([&block], []).unwrap());
        drop(tensors([&u], []).unwrap());
        drop((held, inner));
        drop(tensors([], [&t, &u]).unwrap());
    }

    #[test]
    fn readers_share_and_a_writer_is_alone() {
        // Addresses no allocation uses, so no other test's claims meet these.
        let base = usize::MAX - (1 << 20);
        let a = ranges([(base, base + 100)], []).unwrap();
        let b = ranges([(base + 50, base + 150)], []).unwrap();
        let e = ranges([], [(base + 120, base + 130)])
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("cannot write") && e.contains("being read"),
            "{e}"
        );
        drop(b);
        let w = ranges([], [(base + 120, base + 130)]).unwrap();
        let e = ranges([(base + 125, base + 126)], [])
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("cannot read") && e.contains("being written"),
            "{e}"
        );
        // A claim's own ranges may overlap; ranges next to each other do not meet.
        let own = ranges([(base + 200, base + 300)], [(base + 250, base + 260)]).unwrap();
        let next = ranges([], [(base + 130, base + 140)]).unwrap();
        drop((a, w, own, next));
        let all = ranges([], [(base, base + 300)]).unwrap();
        drop(all);
        // Empty claims claim nothing.
        let _e1 = ranges([(base, base)], []).unwrap();
        let _e2 = ranges([(base, base)], [(base, base)]).unwrap();
    }

    #[test]
    fn a_live_view_refuses_writes_and_views_share() {
        use crate::ops;
        let t = Tensor::from_ndarray(ndarray::Array1::<i32>::zeros(4));
        let idx = Tensor::from_slice(&[0i64, 1, 2, 3], &[4]).unwrap();
        let v = Tensor::from_slice(&[2i32; 4], &[4]).unwrap();
        {
            let view = t.as_array::<i32>().unwrap();
            let again = t.view(&[1], &[2]).unwrap();
            let second = again.as_array::<i32>().unwrap(); // views share
            let e = ops::scatter(&v, &idx, &t.clone(), 0)
                .unwrap_err()
                .to_string();
            assert!(
                e.contains("cannot write") && e.contains("being read"),
                "{e}"
            );
            assert_eq!(view.sum() + second.sum(), 0, "nothing written");
            // a read of the same memory is no conflict
            assert_eq!(ops::gather(&t, &idx, 0, None).unwrap().numel(), 4);
        }
        ops::scatter(&v, &idx, &t, 0).unwrap();
        assert_eq!(t.as_array::<i32>().unwrap().sum(), 8);
    }

    #[test]
    fn interleaved_blocks_of_one_array_do_not_refuse_each_other() {
        // Two column blocks of one 4x6 array: their spans meet, their elements do not.
        let t = Tensor::from_ndarray(ndarray::Array2::<i32>::zeros((4, 6)));
        let (left, right) = (
            t.view(&[0, 0], &[4, 3]).unwrap(),
            t.view(&[0, 3], &[4, 3]).unwrap(),
        );
        let idx = Tensor::from_slice(&[0i64], &[1]).unwrap();
        let v = Tensor::from_slice(&[-1i32; 4], &[4, 1]).unwrap();
        {
            let _view = left.as_array::<i32>().unwrap();
            crate::ops::scatter(&v, &idx, &right, 1).unwrap();
            // What the view shows is still refused, as is a block that crosses both.
            assert!(crate::ops::scatter(&v, &idx, &left, 1).is_err());
            let middle = t.view(&[0, 2], &[4, 2]).unwrap();
            assert!(crate::ops::scatter(&v, &idx, &middle, 1).is_err());
            // Every other column, and the columns between: apart, though they interleave.
            let cols = |first: isize| {
                // SAFETY: columns `first`, `first + 2`, `first + 4` of `t`'s four rows, in
                // its buffer, kept alive by its owner.
                unsafe {
                    Tensor::from_raw_parts(
                        t.data_ptr().wrapping_add(first as usize * 4),
                        vec![4, 3],
                        vec![6, 2],
                        t.dtype(),
                        t.device(),
                        false,
                        t.owner().clone(),
                    )
                }
            };
            drop(_view);
            let _even = cols(0).as_array::<i32>().unwrap();
            crate::ops::scatter(&v, &idx, &cols(1), 1).unwrap();
            assert!(crate::ops::scatter(&v, &idx, &cols(0), 1).is_err());
        }
        let a = t.to_array::<i32>().unwrap();
        let first: Vec<i32> = a.iter().take(6).copied().collect();
        assert_eq!(first, vec![0, -1, 0, -1, 0, 0]);
    }

    #[test]
    fn writes_from_threads_to_one_tensor_never_race() {
        // Without claims the two scatters' writes race (Miri reports it); with them each runs
        // alone or is refused, so the tensor ends up all one thread's values.
        let t = Tensor::from_ndarray(ndarray::Array1::<i32>::zeros(64));
        let calls = if cfg!(miri) { 3 } else { 300 };
        let threads: Vec<_> = [1i32, 2]
            .into_iter()
            .map(|k| {
                let t = t.clone();
                std::thread::spawn(move || {
                    let idx = Tensor::from_slice(&(0..64).collect::<Vec<i64>>(), &[64]).unwrap();
                    let v = Tensor::from_slice(&[k; 64], &[64]).unwrap();
                    for _ in 0..calls {
                        if let Err(e) = crate::ops::scatter(&v, &idx, &t, 0) {
                            assert!(e.to_string().contains("at the same time"), "{e}");
                        }
                    }
                })
            })
            .collect();
        for th in threads {
            th.join().unwrap();
        }
        let a = t.to_array::<i32>().unwrap();
        assert!(
            a.iter().all(|&x| x == a[0]) && [1, 2].contains(&a[0]),
            "{a}"
        );
    }

    #[test]
    fn many_ranges_are_found_meeting_as_the_pairwise_test_finds_them() {
        let mut rng = crate::test_rng::Rng(0x9e37_79b9_7f4a_7c15);
        for _ in 0..if cfg!(miri) { 10 } else { 200 } {
            let side = |rng: &mut crate::test_rng::Rng| -> Vec<Range> {
                (0..rng.below(100) + 50)
                    .map(|_| {
                        let lo = rng.below(100_000);
                        r(lo, lo + rng.below(30) + 1, rng.below(3) == 0)
                    })
                    .collect()
            };
            let (mine, theirs) = (side(&mut rng), side(&mut rng));
            let pairwise = mine.iter().any(|a| {
                theirs
                    .iter()
                    .any(|b| a.lo < b.hi && b.lo < a.hi && (a.write || b.write))
            });
            let found = meeting(&mine, &theirs);
            assert_eq!(found.is_some(), pairwise);
            if let Some((i, j)) = found {
                assert!(meet(&mine[i], &theirs[j]));
            }
        }
    }

    /// A view of `a`'s memory (4-byte elements) with any shape and strides (in elements, of
    /// either sign) from element `offset`, and the offset of every one of its elements.
    fn strided(
        a: &Tensor,
        shape: &[usize],
        strides: &[isize],
        offset: isize,
    ) -> (Tensor, Vec<isize>) {
        assert_eq!(a.dtype().itemsize(), 4);
        let t = crate::overlap::tests::strided(a, shape, strides, offset);
        (t, crate::overlap::tests::offsets(offset, shape, strides))
    }

    #[test]
    fn claims_conflict_exactly_when_they_share_a_byte() {
        // Random sides of views (column blocks, every other element, reversed rows) and raw
        // byte ranges of one buffer, few and many (past the pairwise test of spans), against
        // the bytes each claims, listed.
        let a = Tensor::from_ndarray(ndarray::Array1::<i32>::zeros(600));
        let base = a.data_ptr() as usize;
        let mut rng = crate::test_rng::Rng(0x5eed_c1a1);
        let side = |rng: &mut crate::test_rng::Rng, many: bool| {
            let count = if many {
                60 + rng.below(40)
            } else {
                1 + rng.below(4)
            };
            let mut list: Vec<(Range, Option<Elements>)> = Vec::new();
            // Per byte from `base`: 1 if claimed, 2 if written.
            let mut bytes = vec![0u8; 2400];
            let mut mark = |b: usize, write: bool| bytes[b - base] |= 1 | (2 * u8::from(write));
            for _ in 0..count {
                let write = rng.below(3) == 0;
                if rng.below(4) == 0 {
                    let lo = base + rng.below(2200);
                    let hi = lo + 1 + rng.below(10);
                    list.push((r(lo, hi, write), None));
                    (lo..hi).for_each(|b| mark(b, write));
                    continue;
                }
                // A box of a 3-d array (rows of 20, planes of 100), some axes reversed; or
                // every other element; or strides that interleave, or repeat elements.
                let shape: Vec<usize> = (0..3)
                    .map(|_| 1 + rng.below(if many { 3 } else { 5 }))
                    .collect();
                let step = [
                    100isize,
                    [20, 20, 3][rng.below(3)],
                    [1, 1, 2, 7, 0][rng.below(5)],
                ];
                let mut offset = rng.below(40) as isize;
                let strides: Vec<isize> = (0..3)
                    .map(|d| {
                        let back = rng.below(4) == 0;
                        if back {
                            offset += (shape[d] as isize - 1) * step[d];
                        }
                        if back {
                            -step[d]
                        } else {
                            step[d]
                        }
                    })
                    .collect();
                let (t, offsets) = strided(&a, &shape, &strides, offset);
                let role = Role::new("view");
                let (range, gapped, _) = part(&t, write, role, Mine::Tensor(&t)).unwrap();
                match gapped {
                    Some(_) => offsets
                        .iter()
                        .flat_map(|&o| (0..4).map(move |b| base + o as usize * 4 + b))
                        .for_each(|b| mark(b, write)),
                    None => (range.lo..range.hi).for_each(|b| mark(b, write)),
                }
                list.push((range, gapped));
            }
            (list, bytes)
        };
        let mut found = [0; 2];
        let cases = if cfg!(miri) { 20 } else { 600 };
        for case in 0..cases {
            let many = case % 2 == 1;
            let (mine, mine_bytes) = side(&mut rng, many);
            let (theirs, theirs_bytes) = side(&mut rng, many);
            let shared = |lo: usize, hi: usize| {
                (lo.max(base)..hi.min(base + 2400)).any(|b| {
                    let (m, t) = (mine_bytes[b - base], theirs_bytes[b - base]);
                    (m & 1 != 0 && t & 2 != 0) || (m & 2 != 0 && t & 1 != 0)
                })
            };
            let (mr, mg): (Vec<Range>, Vec<Option<Elements>>) = mine.into_iter().unzip();
            let (tr, tg): (Vec<Range>, Vec<Option<Elements>>) = theirs.into_iter().unzip();
            let got = conflict(
                Side {
                    ranges: &mr,
                    gapped: &mg,
                },
                Side {
                    ranges: &tr,
                    gapped: &tg,
                },
            );
            assert_eq!(got.is_some(), shared(0, usize::MAX), "case {case}");
            if let Some(((i, m), (j, t))) = got {
                assert!(m.write || t.write, "case {case}");
                // The indices are of the ranges the runs that meet are of.
                assert!(
                    mr[i].lo <= m.lo && m.hi <= mr[i].hi,
                    "case {case}: {m:?} {:?}",
                    mr[i]
                );
                assert!(
                    tr[j].lo <= t.lo && t.hi <= tr[j].hi,
                    "case {case}: {t:?} {:?}",
                    tr[j]
                );
                assert!(
                    shared(m.lo.max(t.lo), m.hi.min(t.hi)),
                    "case {case}: {m:?} {t:?}"
                );
            }
            found[usize::from(got.is_some())] += 1;
        }
        assert!(
            found[0] > cases / 12 && found[1] > cases / 12,
            "both outcomes tried: {found:?}"
        );
    }

    #[test]
    fn past_the_runs_compared_exactly_spans_decide() {
        // The even and the odd bytes of one buffer share none, and are told apart while they
        // are few; past CLAIM_RUNS runs in all, their spans meet, and the claim is refused.
        let n = if cfg!(miri) { 64 } else { CLAIM_RUNS / 4 };
        let buf = Tensor::zeros(&[6 * n + 2], crate::dtype::DType::UInt8).unwrap();
        let every_other = |first: usize, count: usize| {
            // SAFETY: bytes `first`, `first + 2`, ... `first + 2 * (count - 1)` of `buf`
            // (below its `6n + 2`), kept alive by its owner; only claimed, never read.
            unsafe {
                Tensor::from_raw_parts(
                    buf.data_ptr().wrapping_add(first),
                    vec![count],
                    vec![2],
                    buf.dtype(),
                    buf.device(),
                    false,
                    buf.owner().clone(),
                )
            }
        };
        let even = every_other(0, n);
        let _held = tensors([], [&even]).unwrap();
        drop(tensors([], [&every_other(1, n)]).unwrap());
        if !cfg!(miri) {
            // 3n + 1 odd bytes and the n even ones: one run past CLAIM_RUNS.
            let e = tensors([], [&every_other(1, 3 * n + 1)]);
            let e = e.unwrap_err().to_string();
            assert!(
                e.starts_with("test: cannot write its tensor 0, Tensor(shape=(196609,)")
                    && e.contains("being written at the same time by test (its tensor 0)"),
                "{e}"
            );
        }
    }

    /// `a`'s column block `cols` as a tensor sharing its memory.
    fn columns(a: &Tensor, cols: std::ops::Range<usize>) -> Tensor {
        a.view(&[0, cols.start], &[a.shape()[0], cols.len()])
            .unwrap()
    }

    #[test]
    fn a_view_of_one_column_block_lets_its_neighbour_be_repartitioned() {
        use crate::{Layout, PartitionedArray};
        let a = ndarray::Array2::from_shape_fn((4, 6), |(i, j)| (10 * i + j) as i32);
        let t = Tensor::from(a.clone());
        let cols = PartitionedArray::partition(&t, &Layout::tiling(&[1, 2])).unwrap();
        let (l, r) = (
            cols.at(&[0, 0]).unwrap().tensor().unwrap().clone(),
            cols.at(&[0, 1]).unwrap().tensor().unwrap().clone(),
        );
        let mut w = l.as_array_mut::<i32>().unwrap();
        let idx = Tensor::from_slice(&[2i64, 0], &[2]).unwrap();
        assert_eq!(crate::ops::gather(&r, &idx, 0, None).unwrap().numel(), 6);
        // The right block, read by a repartition while the left one is written.
        let rows = PartitionedArray::partition(&r, &Layout::tiling(&[1, 1]))
            .unwrap()
            .repartition(&Layout::tiling(&[2, 1]), false)
            .unwrap();
        w.fill(-1);
        for k in 0..2 {
            let got = rows
                .at(&[k, 0])
                .unwrap()
                .tensor()
                .unwrap()
                .to_array::<i32>();
            let want = a
                .slice(ndarray::s![2 * k..2 * k + 2, 3..])
                .to_owned()
                .into_dyn();
            assert_eq!(got.unwrap(), want, "rows {k}");
        }
        // And written by one: the right block of another array's rows.
        let b = ndarray::Array2::from_shape_fn((4, 3), |(i, j)| -(10 * i as i32 + j as i32));
        let from = PartitionedArray::partition(&Tensor::from(b.clone()), &Layout::tiling(&[2, 1]));
        let into = PartitionedArray::partition(&r, &Layout::tiling(&[4, 1])).unwrap();
        from.unwrap().repartition_into(&into, false).unwrap();
        // What the view holds is still refused, read or written, as is a block crossing both.
        // Each error names the operation, its tensor at fault and the other side.
        let by_the_view = "being written at the same time by as_array_mut (its live view), a \
                           dlpart call in another thread or a live view";
        let e = cols.assemble(None, false).unwrap_err().to_string();
        assert!(
            e.starts_with(
                "partition copy: cannot read its source partition 0, Tensor(shape=(4, 3), \
                 dtype=int32, device=kDLCPU, strides=(6, 1)): host memory 0x"
            ) && e.contains(by_the_view),
            "{e}"
        );
        let middle = PartitionedArray::partition(&columns(&t, 2..4), &Layout::tiling(&[2, 1]));
        let e = middle.unwrap().repartition(&Layout::tiling(&[1, 1]), false);
        let e = e.unwrap_err().to_string();
        assert!(
            e.starts_with(
                "partition copy: cannot read its source partition 0, Tensor(shape=(2, 2), \
                 dtype=int32, device=kDLCPU, strides=(6, 1))"
            ) && e.contains(by_the_view),
            "{e}"
        );
        drop(w);
        let mut want = a.clone();
        want.slice_mut(ndarray::s![.., ..3]).fill(-1);
        want.slice_mut(ndarray::s![.., 3..]).assign(&b);
        assert_eq!(t.to_array::<i32>().unwrap(), want.into_dyn());
    }

    #[test]
    fn an_element_of_a_claimed_block_is_refused_and_its_neighbours_are_not() {
        use crate::{Layout, PartitionedArray};
        let t = Tensor::from(ndarray::Array2::<i32>::zeros((4, 6)));
        let right = PartitionedArray::partition(&columns(&t, 3..6), &Layout::tiling(&[2, 1]));
        let right = right.unwrap();
        let src = Tensor::from(ndarray::Array2::from_elem((4, 3), 7i32));
        let src = PartitionedArray::partition(&src, &Layout::tiling(&[1, 1])).unwrap();
        // A live view of one element inside the right block's span, in the left block: apart.
        let inside = t.view(&[1, 2], &[1, 1]).unwrap();
        let view = inside.as_array::<i32>().unwrap();
        src.repartition_into(&right, false).unwrap();
        drop(view);
        // One element of the right block: refused with the error of any conflict.
        let element = t.view(&[1, 3], &[1, 1]).unwrap();
        let view = element.as_array::<i32>().unwrap();
        let e = src.repartition_into(&right, false).unwrap_err().to_string();
        let by_the_view = "being read at the same time by as_array (its live view)";
        assert!(
            e.starts_with(
                "partition copy: cannot write its target partition 0, Tensor(shape=(2, 3), \
                 dtype=int32, device=kDLCPU, strides=(6, 1)): host memory"
            ) && e.contains(by_the_view),
            "{e}"
        );
        // Through `copy_boxes` too: a box copy reading the element's row, or writing next to it.
        let be = crate::backend::cpu::CpuBackend::shared(crate::device::Device::CPU);
        let other = Tensor::from(ndarray::Array2::<i32>::zeros((4, 6)));
        let job = |src, dst, s: [usize; 2]| crate::plan::BoxCopy {
            src,
            src_start: s.to_vec(),
            dst,
            dst_start: s.to_vec(),
            shape: vec![4, 1],
        };
        be.copy_boxes(&[job(&other, &t, [0, 2])]).unwrap();
        let e = be.copy_boxes(&[job(&other, &t, [0, 3])]).unwrap_err();
        assert!(
            e.to_string().starts_with(
                "box copy: cannot write its destination of copy job 0, the box of shape \
                 (4, 1) at (0, 3) of Tensor(shape=(4, 6), dtype=int32, device=kDLCPU)"
            ) && e.to_string().contains(by_the_view),
            "{e}"
        );
        be.copy_boxes(&[job(&t, &other, [0, 3])]).unwrap();
        drop(view);
        let mut want = ndarray::Array2::<i32>::zeros((4, 6));
        want.slice_mut(ndarray::s![.., 3..]).fill(7);
        want.column_mut(2).fill(0);
        assert_eq!(t.to_array::<i32>().unwrap(), want.into_dyn());
    }

    #[test]
    fn threads_repartitioning_into_interleaved_column_blocks_never_refuse_each_other() {
        use crate::{Layout, PartitionedArray};
        // Both threads write column blocks of one buffer, cut into row tiles, many times at
        // once; each block's byte span meets the other's.
        let (rows, half) = if cfg!(miri) { (4, 3) } else { (512, 384) };
        let t = Tensor::from(ndarray::Array2::<i32>::zeros((rows, 2 * half)));
        let calls = if cfg!(miri) { 3 } else { 200 };
        let value = |k: usize, call: usize, i: usize, j: usize| {
            (k * 1_000_000 + call * 10_000 + i * 100 + j) as i32
        };
        let start = std::sync::Arc::new(std::sync::Barrier::new(2));
        let threads: Vec<_> = (0..2)
            .map(|k| {
                let target = columns(&t, k * half..(k + 1) * half);
                let start = start.clone();
                std::thread::spawn(move || {
                    let into = PartitionedArray::partition(&target, &Layout::tiling(&[4, 2]));
                    let into = into.unwrap();
                    for call in 0..calls {
                        let a = ndarray::Array2::from_shape_fn((rows, half), |(i, j)| {
                            value(k, call, i, j)
                        });
                        let from = Tensor::from(a);
                        let from = PartitionedArray::partition(&from, &Layout::tiling(&[3, 1]));
                        start.wait();
                        from.unwrap().repartition_into(&into, false).unwrap();
                    }
                })
            })
            .collect();
        for th in threads {
            th.join().unwrap();
        }
        let want = ndarray::Array2::from_shape_fn((rows, 2 * half), |(i, j)| {
            value(j / half, calls - 1, i, j % half)
        });
        assert_eq!(t.to_array::<i32>().unwrap(), want.into_dyn());
    }
}
