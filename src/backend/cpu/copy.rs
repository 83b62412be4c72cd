//! Box copies: `copy_box`, `pack`, `unpack`, and the batched, multi-threaded `copy_boxes`.

#[cfg(not(miri))]
use rayon::prelude::*;

use super::exec::run;
use super::plan::{Orig, Plan};
use super::stream::{self, Store};
use crate::tensor::contiguous_strides;

/// Strided memory a kernel reads: the address of element `[0, ..., 0]`, and per dimension
/// the extent and the stride in elements (any sign, zero allowed).
#[derive(Clone, Copy, Debug)]
pub struct SrcView<'a> {
    pub ptr: *const u8,
    pub shape: &'a [usize],
    pub strides: &'a [isize],
}

/// Strided memory a kernel writes; as [`SrcView`]. Its elements must have distinct addresses
/// (if they do not, the kernels still run, on one thread, leaving unspecified values).
#[derive(Clone, Copy, Debug)]
pub struct DstView<'a> {
    pub ptr: *mut u8,
    pub shape: &'a [usize],
    pub strides: &'a [isize],
}

// SAFETY: a view is an address plus borrowed metadata and owns nothing; every access through
// it happens in an `unsafe` kernel whose caller guarantees the memory is valid and unshared
// for the call, from whichever thread.
unsafe impl Send for SrcView<'_> {}
// SAFETY: as for `Send`.
unsafe impl Sync for SrcView<'_> {}
// SAFETY: as for `SrcView`.
unsafe impl Send for DstView<'_> {}
// SAFETY: as for `SrcView`.
unsafe impl Sync for DstView<'_> {}

/// One box copy for [`copy_boxes`]: `src` and `dst` have the same shape.
#[derive(Clone, Copy, Debug)]
pub struct RawCopy<'a> {
    pub src: SrcView<'a>,
    pub dst: DstView<'a>,
    pub itemsize: usize,
}

/// Which stores large copies use.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Stores {
    /// Streaming stores when the copy is much larger than the last-level cache (measured
    /// faster here, see `examples/cpu_copy_bench.rs`), plain stores otherwise.
    #[default]
    Auto,
    /// Always plain stores (memcpy).
    Plain,
    /// Streaming (non-temporal) stores for every row long enough to profit.
    Streaming,
}

/// Copies at least this many bytes in one call before `Stores::Auto` streams: the
/// destination then cannot stay in a last-level cache of typical size anyway.
pub const STREAM_MIN_BYTES: usize = 64 << 20;

/// How work is cut for threads. The defaults suit real use; tests shrink them so that tiny
/// boxes exercise the parallel paths too.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Tuning {
    /// Below this many bytes in total, everything runs on the calling thread.
    pub parallel_min: usize,
    /// Bounds of the bytes one thread takes at a time.
    pub piece_min: usize,
    pub piece_max: usize,
}

pub(crate) const TUNING: Tuning = Tuning {
    parallel_min: 256 << 10,
    piece_min: 64 << 10,
    piece_max: 4 << 20,
};

/// Everything on the calling thread.
#[cfg(test)]
pub(crate) const SEQUENTIAL: Tuning = Tuning {
    parallel_min: usize::MAX,
    ..TUNING
};

impl Tuning {
    /// The bytes per piece for `total` bytes of work: about 8 pieces per thread.
    pub fn piece(&self, total: usize) -> usize {
        (total / (8 * threads())).clamp(self.piece_min, self.piece_max)
    }

    pub fn parallel(&self, total: usize) -> bool {
        total >= self.parallel_min && threads() > 1
    }
}

/// The number of threads work is cut for (a fixed 3 under Miri, see [`par_steps`]).
pub(crate) fn threads() -> usize {
    if cfg!(miri) {
        3
    } else {
        rayon::current_num_threads()
    }
}

/// Calls `f(start)` for every `start` in `(0..n).step_by(step)` on rayon's threads, stopping
/// at an error. Under Miri the calls run in order on this thread: rayon's deques trip Miri's
/// Stacked Borrows checks inside crossbeam-epoch, and our kernels are what Miri should check.
pub(crate) fn par_steps<E: Send>(
    n: usize,
    step: usize,
    f: impl Fn(usize) -> Result<(), E> + Sync + Send,
) -> Result<(), E> {
    #[cfg(not(miri))]
    return (0..n).into_par_iter().step_by(step).try_for_each(f);
    #[cfg(miri)]
    return (0..n).step_by(step).try_for_each(f);
}

/// Resolves `stores` for a call moving `bytes` in total.
pub(crate) fn store_for(stores: Stores, bytes: usize) -> Store {
    let stream = match stores {
        Stores::Auto => bytes >= STREAM_MIN_BYTES,
        Stores::Plain => false,
        Stores::Streaming => true,
    };
    if stream && stream::available() {
        Store::Stream
    } else {
        Store::Plain
    }
}

/// Raw pointers handed to worker threads.
#[derive(Clone, Copy)]
pub(crate) struct Ptrs {
    pub src: *const u8,
    pub dst: *mut u8,
}
// SAFETY: the pointers are only dereferenced inside kernels whose callers guarantee that each
// thread writes destination elements no other thread touches, and that sources are not written.
unsafe impl Send for Ptrs {}
// SAFETY: as for `Send`.
unsafe impl Sync for Ptrs {}

/// Copies the box `src` into the box `dst` (same shape).
///
/// # Safety
/// Every element of `src` must be readable and every element of `dst` writable for the call,
/// with `itemsize` bytes each; `dst` must not overlap `src` nor be touched by anyone else
/// meanwhile. Addresses need no alignment.
///
/// # Panics
/// If the shapes or stride counts differ.
pub unsafe fn copy_box(src: SrcView<'_>, dst: DstView<'_>, itemsize: usize) {
    // SAFETY: forwarded caller contract.
    unsafe { copy_boxes(&[RawCopy { src, dst, itemsize }]) }
}

/// Copies the box `src` into the contiguous C-order buffer at `dst`.
///
/// # Safety
/// As for [`copy_box`], with `dst` writable for `numel * itemsize` bytes.
pub unsafe fn pack(src: SrcView<'_>, dst: *mut u8, itemsize: usize) {
    let strides = contiguous_strides(src.shape);
    let dst = DstView {
        ptr: dst,
        shape: src.shape,
        strides: &strides,
    };
    // SAFETY: forwarded caller contract; C-order strides address exactly the buffer.
    unsafe { copy_box(src, dst, itemsize) }
}

/// Copies the contiguous C-order buffer at `src` into the box `dst`.
///
/// # Safety
/// As for [`copy_box`], with `src` readable for `numel * itemsize` bytes.
pub unsafe fn unpack(src: *const u8, dst: DstView<'_>, itemsize: usize) {
    let strides = contiguous_strides(dst.shape);
    let src = SrcView {
        ptr: src,
        shape: dst.shape,
        strides: &strides,
    };
    // SAFETY: forwarded caller contract; C-order strides address exactly the buffer.
    unsafe { copy_box(src, dst, itemsize) }
}

/// Runs every copy of `jobs` in one parallel pass, with [`Stores::Auto`].
///
/// # Safety
/// Each job as for [`copy_box`]; also no destination may overlap another job's source or
/// destination.
///
/// # Panics
/// If a job's shapes or stride counts differ.
pub unsafe fn copy_boxes(jobs: &[RawCopy<'_>]) {
    // SAFETY: forwarded caller contract.
    unsafe { copy_boxes_with(jobs, Stores::Auto) }
}

/// [`copy_boxes`] with the store policy chosen by the caller (benchmarks compare them).
///
/// # Safety
/// As for [`copy_boxes`].
pub unsafe fn copy_boxes_with(jobs: &[RawCopy<'_>], stores: Stores) {
    // SAFETY: forwarded caller contract.
    unsafe { copy_boxes_tuned(jobs, stores, &TUNING) }
}

/// One piece of work for a thread.
enum Piece {
    /// Whole jobs `a..b`.
    Jobs(usize, usize),
    /// Units `lo..hi` of job `j`.
    Part(usize, usize, usize),
}

/// [`copy_boxes_with`] with explicit tuning.
///
/// # Safety
/// As for [`copy_boxes`].
pub(crate) unsafe fn copy_boxes_tuned(jobs: &[RawCopy<'_>], stores: Stores, tuning: &Tuning) {
    let plans: Vec<(Plan<'_>, Ptrs)> = jobs
        .iter()
        .map(|j| {
            let (s, d) = (j.src, j.dst);
            assert!(
                s.shape == d.shape && s.strides.len() == s.shape.len() && d.strides.len() == d.shape.len(),
                "box copy with source shape {:?} strides {:?} and destination shape {:?} strides {:?}",
                s.shape,
                s.strides,
                d.shape,
                d.strides
            );
            let plan = Plan::new(Orig {
                shape: s.shape,
                src_strides: s.strides,
                dst_strides: d.strides,
                itemsize: j.itemsize,
            });
            (plan, Ptrs { src: s.ptr, dst: d.ptr })
        })
        .collect();
    let total: usize = plans.iter().map(|(p, _)| p.bytes).sum();
    let store = store_for(stores, total);
    let whole = |(plan, ptrs): &(Plan<'_>, Ptrs)| {
        // SAFETY: each job's boxes are valid and disjoint (caller contract); all units.
        unsafe { run(plan, ptrs.src, ptrs.dst, 0, plan.units, store) }
    };
    if !tuning.parallel(total) {
        plans.iter().for_each(whole);
        stream::fence(store);
        return;
    }
    let pieces = cut(&plans, tuning.piece(total));
    let done = par_steps(pieces.len(), 1, |k| {
        match pieces[k] {
            Piece::Jobs(a, b) => plans[a..b].iter().for_each(whole),
            Piece::Part(j, lo, hi) => {
                let (plan, ptrs) = &plans[j];
                // SAFETY: pieces cover disjoint unit ranges, and units of a plan whose
                // destination elements are distinct write disjoint elements.
                unsafe { run(plan, ptrs.src, ptrs.dst, lo, hi, store) }
            }
        }
        stream::fence(store);
        Ok::<(), ()>(())
    });
    debug_assert!(done.is_ok());
}

/// Cuts jobs into pieces of about `target` bytes: big jobs into unit ranges, runs of small
/// jobs grouped. A job whose destination overlaps itself stays in one piece.
fn cut(plans: &[(Plan<'_>, Ptrs)], target: usize) -> Vec<Piece> {
    let mut pieces = Vec::new();
    let (mut start, mut acc) = (0, 0);
    for (j, (plan, _)) in plans.iter().enumerate() {
        if plan.bytes < target || !plan.dst_distinct || plan.units <= 1 {
            acc += plan.bytes;
            if acc >= target {
                pieces.push(Piece::Jobs(start, j + 1));
                (start, acc) = (j + 1, 0);
            }
            continue;
        }
        if start < j {
            pieces.push(Piece::Jobs(start, j));
        }
        (start, acc) = (j + 1, 0);
        let per = (target / plan.unit_bytes.max(1)).max(1);
        let n = plan.units.div_ceil(per);
        let step = plan.units.div_ceil(n);
        pieces.extend(
            (0..plan.units)
                .step_by(step)
                .map(|lo| Piece::Part(j, lo, (lo + step).min(plan.units))),
        );
    }
    if start < plans.len() {
        pieces.push(Piece::Jobs(start, plans.len()));
    }
    pieces
}
