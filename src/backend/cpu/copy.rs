//! Box copies: `copy_box`, `pack`, `unpack`, and the batched, multi-threaded `copy_boxes`.

use super::exec::run;
use super::lower::{Kind, Lowered, Orig};
use super::nontemporal::{self, Store};
use crate::tensor::contiguous_strides;

/// Strided memory a kernel reads: the address of element `[0, ..., 0]`, and per dimension
/// the extent and the stride in elements (any sign, zero allowed).
#[derive(Clone, Copy, Debug)]
pub struct SrcView<'a> {
    /// Address of element `[0, ..., 0]` (any alignment).
    pub ptr: *const u8,
    /// Extent per dimension.
    pub shape: &'a [usize],
    /// Stride per dimension, in elements.
    pub strides: &'a [isize],
}

/// Strided memory a kernel writes; as [`SrcView`]. Its elements must have distinct addresses
/// (if they do not, the kernels still run, on one thread, leaving unspecified values).
#[derive(Clone, Copy, Debug)]
pub struct DstView<'a> {
    /// Address of element `[0, ..., 0]` (any alignment).
    pub ptr: *mut u8,
    /// Extent per dimension.
    pub shape: &'a [usize],
    /// Stride per dimension, in elements.
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
    /// Where the elements are read.
    pub src: SrcView<'a>,
    /// Where they are written.
    pub dst: DstView<'a>,
    /// Bytes per element, on both sides.
    pub itemsize: usize,
}

/// Which stores large copies use. dlpart itself always uses `Auto`; the benchmarks and tests
/// force the others to compare them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
#[cfg_attr(not(feature = "bench-internals"), allow(dead_code))]
pub enum Stores {
    /// Streaming stores for copies of [`STREAM_MIN_BYTES`] or more, plain stores otherwise.
    #[default]
    Auto,
    /// Always plain stores (memcpy).
    Plain,
    /// Streaming (non-temporal) stores for every row long enough to profit.
    Streaming,
}

/// Copies of at least this many bytes in one call use streaming stores under
/// `Stores::Auto`. Measured here (`cpu_copy_bench stores`, 2 threads): streaming was 1.4-1.6x
/// faster than plain stores from 2 MiB up and slower at 1 MiB and below.
pub const STREAM_MIN_BYTES: usize = 2 << 20;

/// Gathers and scatters of few big slabs of at most this many bytes in all run on the calling
/// thread (`slabs.rs`), as numpy copies them. Measured here (2 vCPUs, slabs of a float32
/// array gathered again and again, so in cache): against the box copies on the pool, one
/// memcpy per contiguous slab took 40 instead of 51-62 us for 1 MiB and 117-152 instead of
/// 195-255 us for 4 MiB (the box copies cut rows at 128 KiB, wake the pool and, from 2 MiB,
/// use streaming stores, which lose on data in cache). Data that is not in cache would gain
/// from two threads; halo faces and the like, gathered near their last use, are.
pub(crate) const SLABS_HERE_MAX_BYTES: usize = 4 << 20;

/// How work is cut for threads. The defaults suit real use; tests shrink them so that tiny
/// boxes exercise the parallel paths too.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Tuning {
    /// Below this many bytes in total, everything runs on the calling thread.
    pub parallel_min: usize,
    /// The same for the small row boxes of a whole repartition plan (`repart.rs`).
    pub rows_parallel_min: usize,
    /// Gathers and scatters of a few big slabs (`slabs.rs`) of at most this many
    /// bytes in all run on the calling thread.
    pub slabs_here_max: usize,
    /// Bounds of the bytes one thread takes at a time.
    pub piece_min: usize,
    pub piece_max: usize,
    /// Runs the pieces on the calling thread, last first: tests use it to make any
    /// dependence on the order of pieces show.
    pub reverse: bool,
}

pub(crate) const TUNING: Tuning = Tuning {
    parallel_min: 256 << 10,
    // Small boxes under 2 MiB are in cache, and waking a helper costs more than it saves:
    // small_grid/1MiB (16,129 boxes) took 1.22-1.27 ms median in parallel and 1.04-1.07 ms
    // on the calling thread (3 runs of 200 calls each, loaded 2-vCPU machine); with 4 MiB
    // (boxes of 8x8 float32) 1.5-4.0 against 1.6-1.7 ms.
    rows_parallel_min: STREAM_MIN_BYTES,
    slabs_here_max: SLABS_HERE_MAX_BYTES,
    piece_min: 64 << 10,
    piece_max: 4 << 20,
    reverse: false,
};

/// Everything on the calling thread.
#[cfg(test)]
pub(crate) const SEQUENTIAL: Tuning = Tuning {
    parallel_min: usize::MAX,
    rows_parallel_min: usize::MAX,
    slabs_here_max: usize::MAX,
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

    /// Calls `f(start)` for every `start` in `(0..n).step_by(step)`, on the calling thread and
    /// rayon's, stopping at an error. Under Miri the calls run in order on this thread: rayon's
    /// deques trip Miri's Stacked Borrows checks inside crossbeam-epoch, and our kernels are
    /// what Miri should check.
    pub fn run<E: Send>(
        &self,
        n: usize,
        step: usize,
        f: impl Fn(usize) -> Result<(), E> + Sync + Send,
    ) -> Result<(), E> {
        if self.reverse {
            return (0..n).step_by(step).rev().try_for_each(f);
        }
        #[cfg(not(miri))]
        return shared_loop(n, step, f);
        #[cfg(miri)]
        return (0..n).step_by(step).try_for_each(f);
    }
}

/// `f(start)` for every `start` in `(0..n).step_by(step)`, the starts handed out one at a time
/// from a shared counter to the calling thread and `threads() - 1` helpers from rayon's pool.
///
/// The caller works from the start instead of sleeping until rayon's workers are done. A
/// thread that blocks as it wakes the pool lets the scheduler put the woken workers on the
/// caller's CPU; measured here (2 vCPUs) the second worker then began 3-5 ms into a 16 ms
/// copy of 8192² float32, and the copy ran about 15% slower than the same loop with the
/// caller taking part. Handing out one piece at a time also keeps every thread busy to the
/// end, where rayon's adaptive splitting can leave a run of pieces that no thread may steal.
#[cfg(not(miri))]
fn shared_loop<E: Send>(
    n: usize,
    step: usize,
    f: impl Fn(usize) -> Result<(), E> + Sync + Send,
) -> Result<(), E> {
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::Relaxed};
    use std::sync::Mutex;

    let count = n.div_ceil(step);
    let (next, stop) = (AtomicUsize::new(0), AtomicBool::new(false));
    let first_error = Mutex::new(None);
    let work = || {
        while !stop.load(Relaxed) {
            let k = next.fetch_add(1, Relaxed);
            if k >= count {
                break;
            }
            if let Err(e) = f(k * step) {
                stop.store(true, Relaxed);
                first_error
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .get_or_insert(e);
            }
        }
    };
    let helpers = threads().saturating_sub(1).min(count.saturating_sub(1));
    if helpers == 0 {
        // No scope: it would start rayon's pool, which may be what cannot start.
        work();
    } else {
        rayon::in_place_scope(|s| {
            for _ in 0..helpers {
                s.spawn(|_| work());
            }
            work();
        });
    }
    match first_error.into_inner().unwrap_or_else(|p| p.into_inner()) {
        Some(e) => Err(e),
        None => Ok(()),
    }
}

/// The number of threads work is cut for (a fixed 3 under Miri, see [`Tuning::run`]): 1 when
/// rayon's global pool cannot start, and then every parallel path runs on the calling thread.
pub(crate) fn threads() -> usize {
    if cfg!(miri) {
        3
    } else if rayon::current_thread_index().is_some() || global_pool_started() {
        // In a pool's worker (the tests' own pools), that pool's threads.
        rayon::current_num_threads()
    } else {
        1
    }
}

/// Whether rayon's global pool is running, starting it on the first call.
///
/// rayon starts its pool on first use and panics when it cannot start the threads (no memory
/// or address space left for their stacks, a process limit), then again on every later use:
/// that panic would reach Python as a `PanicException`. Asked once here, a pool that cannot
/// start means slower work on the calling thread instead.
fn global_pool_started() -> bool {
    static STARTED: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *STARTED.get_or_init(|| std::panic::catch_unwind(rayon::current_num_threads).is_ok())
}

/// Resolves `stores` for a call moving `bytes` in total.
pub(crate) fn store_for(stores: Stores, bytes: usize) -> Store {
    let stream = match stores {
        Stores::Auto => bytes >= STREAM_MIN_BYTES,
        Stores::Plain => false,
        Stores::Streaming => true,
    };
    if stream && nontemporal::available() {
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
#[cfg(test)]
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
    /// Whole jobs `a..b`, planned by the thread that runs them.
    Jobs(usize, usize),
    /// Units `lo..hi` of every planned job `big[a..b]`, taken unit by unit across the jobs
    /// (one job, or a [row group](row_key)).
    Units(usize, usize, usize, usize),
}

/// The plan of `job`.
///
/// # Panics
/// If the job's shapes or stride counts differ.
fn plan_of<'a>(job: &RawCopy<'a>) -> Lowered<'a> {
    let (s, d) = (job.src, job.dst);
    assert!(
        s.shape == d.shape && s.strides.len() == s.shape.len() && d.strides.len() == d.shape.len(),
        "box copy with source shape {:?} strides {:?} and destination shape {:?} strides {:?}",
        s.shape,
        s.strides,
        d.shape,
        d.strides
    );
    Lowered::new(Orig {
        shape: s.shape,
        src_strides: s.strides,
        dst_strides: d.strides,
        itemsize: job.itemsize,
    })
}

fn ptrs(job: &RawCopy<'_>) -> Ptrs {
    Ptrs {
        src: job.src.ptr,
        dst: job.dst.ptr,
    }
}

/// Plans and runs all of `job`.
///
/// # Safety
/// As for [`copy_box`].
unsafe fn run_whole(job: &RawCopy<'_>, store: Store) {
    let plan = plan_of(job);
    // SAFETY: forwarded caller contract; all units of the plan.
    unsafe { run(&plan, job.src.ptr, job.dst.ptr, 0, plan.units, store) }
}

/// Jobs of at least this many bytes are planned up front to find row groups: below it a job
/// is too small for the order of its reads to matter.
pub(crate) const GROUP_MIN_BYTES: usize = 64 << 10;

/// What makes consecutive planned jobs one row group: each copies `n` rows of `bytes`
/// (contiguous on both sides; source rows `s` bytes apart) and the first source row starts
/// at `row0`. Jobs whose source rows continue one another (a source partition cut into
/// column blocks for several targets) are run row by row across the group, so that the
/// source is read front to back instead of in stripes `s` apart: measured here on 8192² f32
/// row blocks → column blocks, about 1.3x faster than job by job.
#[derive(Clone, Copy, PartialEq, Eq)]
struct RowKey {
    n: usize,
    s: isize,
    row0: usize,
    bytes: usize,
}

fn row_key(plan: &Lowered<'_>, src: *const u8) -> Option<RowKey> {
    match (plan.kind, plan.outer.as_slice(), plan.inner_units) {
        (Kind::Rows { bytes, .. }, [dim], 1) if plan.dst_distinct => Some(RowKey {
            n: dim.n,
            s: dim.s,
            row0: src.wrapping_offset(plan.src_off) as usize,
            bytes,
        }),
        _ => None,
    }
}

/// Whether rows keyed `next` continue the rows keyed `prev` in the source.
fn continues(prev: RowKey, next: RowKey) -> bool {
    next.n == prev.n && next.s == prev.s && next.row0 == prev.row0.wrapping_add(prev.bytes)
}

fn job_bytes(job: &RawCopy<'_>) -> usize {
    job.src.shape.iter().product::<usize>() * job.itemsize
}

/// How the jobs of one call are cut into pieces of about `target` bytes for threads.
struct Schedule<'a> {
    /// The jobs planned up front, in order: big ones, and row groups.
    big: Vec<(Lowered<'a>, Ptrs)>,
    pieces: Vec<Piece>,
}

impl<'a> Schedule<'a> {
    fn new(jobs: &[RawCopy<'a>], target: usize) -> Self {
        let mut s = Schedule {
            big: Vec::new(),
            pieces: Vec::new(),
        };
        let (mut start, mut acc, mut j) = (0, 0, 0);
        while j < jobs.len() {
            let end = s.split(jobs, j, target);
            if end > j {
                if start < j {
                    s.pieces.push(Piece::Jobs(start, j));
                }
                (start, acc, j) = (end, 0, end);
                continue;
            }
            acc += job_bytes(&jobs[j]);
            j += 1;
            if acc >= target {
                s.pieces.push(Piece::Jobs(start, j));
                (start, acc) = (j, 0);
            }
        }
        if start < jobs.len() {
            s.pieces.push(Piece::Jobs(start, jobs.len()));
        }
        s
    }

    /// Plans job `j` and the jobs after it that continue its source rows, and cuts them into
    /// pieces of units. Returns the index after the last job taken, or `j` if job `j` is
    /// better batched whole with its neighbours.
    fn split(&mut self, jobs: &[RawCopy<'a>], j: usize, target: usize) -> usize {
        let planned = |job: &RawCopy<'_>| job_bytes(job) >= GROUP_MIN_BYTES.min(target);
        let job = &jobs[j];
        if !planned(job) {
            return j;
        }
        let plan = plan_of(job);
        // A job whose destination overlaps itself stays in one piece.
        if !plan.dst_distinct || plan.units == 0 {
            return j;
        }
        let (units, mut unit_bytes) = (plan.units, plan.unit_bytes);
        let mut key = row_key(&plan, job.src.ptr);
        let mut group = vec![(plan, ptrs(job))];
        while let (Some(prev), Some(next)) = (key, jobs.get(j + group.len())) {
            if !planned(next) {
                break;
            }
            let plan = plan_of(next);
            let Some(k) = row_key(&plan, next.src.ptr).filter(|k| continues(prev, *k)) else {
                break;
            };
            (key, unit_bytes) = (Some(k), unit_bytes + k.bytes);
            group.push((plan, ptrs(next)));
        }
        if group.len() == 1 && (units < 2 || unit_bytes * units < target) {
            return j;
        }
        let end = j + group.len();
        let a = self.big.len();
        self.big.extend(group);
        let b = self.big.len();
        let per = (target / unit_bytes.max(1)).max(1);
        let step = units.div_ceil(units.div_ceil(per));
        self.pieces.extend(
            (0..units)
                .step_by(step)
                .map(|lo| Piece::Units(a, b, lo, (lo + step).min(units))),
        );
        end
    }
}

/// The sizes of the groups of jobs that `copy_boxes_tuned` runs unit by unit together (1 for
/// a big job split alone), in order.
#[cfg(test)]
pub(crate) fn unit_groups(jobs: &[RawCopy<'_>], tuning: &Tuning) -> Vec<usize> {
    let total = jobs.iter().map(job_bytes).sum();
    let mut sizes: Vec<(usize, usize)> = Schedule::new(jobs, tuning.piece(total))
        .pieces
        .iter()
        .filter_map(|p| match *p {
            Piece::Units(a, b, ..) => Some((a, b - a)),
            Piece::Jobs(..) => None,
        })
        .collect();
    sizes.dedup();
    sizes.into_iter().map(|(_, n)| n).collect()
}

/// [`copy_boxes_with`] with explicit tuning. Small jobs are planned by the thread that runs
/// them (a plan is a few hundred bytes: storing thousands would cost more than copying tiny
/// boxes); only jobs big enough to be split or grouped are planned up front.
///
/// # Safety
/// As for [`copy_boxes`].
pub(crate) unsafe fn copy_boxes_tuned(jobs: &[RawCopy<'_>], stores: Stores, tuning: &Tuning) {
    let total: usize = jobs.iter().map(job_bytes).sum();
    let store = store_for(stores, total);
    if !tuning.parallel(total) {
        // SAFETY: forwarded caller contract, job by job.
        jobs.iter().for_each(|j| unsafe { run_whole(j, store) });
        nontemporal::fence(store);
        return;
    }
    let Schedule { big, pieces } = Schedule::new(jobs, tuning.piece(total));
    let done = tuning.run(pieces.len(), 1, |k| {
        match pieces[k] {
            // SAFETY: forwarded caller contract, job by job.
            Piece::Jobs(a, b) => jobs[a..b]
                .iter()
                .for_each(|j| unsafe { run_whole(j, store) }),
            Piece::Units(a, b, lo, hi) if b - a == 1 => {
                let (plan, ptrs) = &big[a];
                // SAFETY: pieces cover disjoint unit ranges, and units of a plan whose
                // destination elements are distinct write disjoint elements.
                unsafe { run(plan, ptrs.src, ptrs.dst, lo, hi, store) }
            }
            Piece::Units(a, b, lo, hi) => {
                for u in lo..hi {
                    for (plan, ptrs) in &big[a..b] {
                        // SAFETY: as above, per job of the group (all have `hi` units or more,
                        // their row counts being equal); distinct jobs write disjoint memory
                        // (caller contract).
                        unsafe { run(plan, ptrs.src, ptrs.dst, u, u + 1, store) }
                    }
                }
            }
        }
        nontemporal::fence(store);
        Ok::<(), ()>(())
    });
    debug_assert!(done.is_ok());
}
