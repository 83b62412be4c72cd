//! Gather straight from the caller's index array: long lists of host int64 indices along the
//! outermost axis of a C-contiguous array (rows of a matrix, elements of a vector).
//!
//! [`normalise_indices`](super::normalise::normalise_indices) copies every index into a list
//! dlpart owns, then the kernel reads that list: for 64M indices, 512 MiB written and read
//! again, more than the gather itself moves for 4-byte values. Here each thread walks a range
//! of the caller's indices once: every index is read once (a volatile read, which the compiler
//! may neither repeat nor drop), wrapped and checked in a register, and used from there, so
//! another thread rewriting the caller's array cannot make the loop leave the source.
//!
//! Nothing is written to the caller's `out` before every index is known to be in range: with
//! an `out`, the gather goes to a buffer of its own first, and only a complete gather is
//! copied over. That costs the output's size, so it is done only where that is no more than
//! the copy of the indices it replaces; larger outputs take the copied-indices path.

use std::sync::atomic::{AtomicUsize, Ordering};

use rayon::prelude::*;

use crate::access::Role;

use super::copy::{store_for, threads, Stores};
use super::index_loop::{NEAR, PREFETCH, RUN};
use super::nontemporal::{copy_row, fence, prefetch, Store};
use super::normalise::SendPtr;
use super::CpuBackend;
use crate::backend::Backend;
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::tensor::{is_c_contiguous, Axes, Tensor};

/// Index lists shorter than this take the copied-indices path: their copy is cheap, and the
/// path is the one every other gather takes. (Under Miri, short lists come this way too, so
/// that its checks see this code on lists it can run.)
pub(super) const DIRECT_MIN: usize = if cfg!(miri) { 64 } else { 1 << 16 };

/// Indices a thread gathers between two looks at whether an earlier bad index was found.
const CHECK_EVERY: usize = if cfg!(miri) { 16 } else { 1 << 12 };

/// `out[i, ..] = src[indices[i], ..]` along `axis` (every axis before it of extent 1) for a
/// long list of host int64 indices read once each (see the module docs), or `None` where this
/// path does not apply and the caller takes the copied-indices path. `axis` is in range;
/// `out`, if given, is checked here as [`crate::ops::gather`] checks it.
pub(super) fn gather(
    be: &CpuBackend,
    src: &Tensor,
    indices: &Tensor,
    axis: usize,
    out: Option<&Tensor>,
) -> Result<Option<Tensor>> {
    let n = match indices.shape() {
        &[n] => n,
        _ => return Ok(None),
    };
    let ptr = indices.data_ptr().cast::<i64>();
    let applies = n >= DIRECT_MIN
        && indices.dtype() == DType::Int64
        && indices.strides()[0] == 1
        && indices.device().is_host_accessible()
        && ptr.is_aligned()
        && src.device().is_host_accessible()
        && src.shape()[..axis].iter().all(|&k| k == 1)
        && is_c_contiguous(src.shape(), src.strides());
    if !applies {
        return Ok(None);
    }
    let mut shape = Axes::from(src.shape());
    shape[axis] = n;
    // Only a complete gather may reach the caller's `out`: it goes to a buffer first, dlpart's
    // own scratch memory (plain kDLCPU memory for host memory of any kind, not new pinned
    // memory, which needs CUDA).
    let own = match out {
        Some(o) if o.nbytes() > n.saturating_mul(size_of::<i64>()) => return Ok(None),
        Some(o) => {
            crate::ops::check_out(o, &shape, src.dtype(), src.device())?;
            crate::backend::scratch_backend(be.device)?.empty(&shape, src.dtype())?
        }
        None => be.empty(&shape, src.dtype())?,
    };
    let row = src.shape()[axis + 1..].iter().product::<usize>() * src.dtype().itemsize();
    let len = src.shape()[axis];
    let reads = [(Role::new("source"), src), (Role::new("indices"), indices)];
    let claim = crate::access::tensors("gather", reads, [])?;
    if row == 0 {
        // Nothing to copy, but the indices are still checked.
        // SAFETY: `indices` is a host-accessible, contiguous, aligned int64 tensor of `n`
        // values, alive for the call.
        if let Some(bad) = unsafe { first_outside(ptr, n, len) } {
            return Err(Error::IndexOutOfRange {
                index: bad as i128,
                axis,
                len,
            });
        }
    } else {
        // SAFETY: `indices` as above; `src` is readable host memory holding `len` rows of
        // `row` bytes one after another (C order, the axes before `axis` of extent 1); `own`
        // is new, C-contiguous, `n` rows of `row` bytes, and overlaps nothing.
        unsafe { gather_rows(src.data_ptr(), len, ptr, n, own.data_ptr(), row, axis)? };
    }
    // `transfer` claims `own` and `out` itself.
    drop(claim);
    match out {
        Some(o) => {
            be.transfer(&own, o)?;
            Ok(Some(o.clone()))
        }
        None => Ok(Some(own)),
    }
}

/// The first of `n` indices at `idx` outside `[-len, len)`, each read once.
///
/// # Safety
/// `idx` addresses `n` readable, aligned int64 values (others may be writing them).
unsafe fn first_outside(idx: *const i64, n: usize, len: usize) -> Option<i64> {
    (0..n)
        // SAFETY: `i < n` (the caller's contract).
        .map(|i| unsafe { idx.add(i).read_volatile() })
        .find(|&v| wrapped(v, len).is_none())
}

/// `v` counted from the end when negative, as numpy does, if it is then in `[0, len)`.
#[inline(always)]
fn wrapped(v: i64, len: usize) -> Option<usize> {
    let j = if v < 0 { v.wrapping_add(len as i64) } else { v };
    ((j as u64) < len as u64).then_some(j as usize)
}

/// Gathers `n` rows of `row` bytes from `src` (`len` rows) into `dst` at the indices at
/// `idx`, split among threads in ranges. An index outside `[-len, len)` is
/// [`Error::IndexOutOfRange`] naming the first such one in order (then `dst` holds
/// unspecified values).
///
/// # Safety
/// `idx` addresses `n` readable, aligned int64 values (others may be writing them); `src`
/// holds `len` readable rows of `row` bytes one after another, `dst` `n` writable ones that
/// overlap neither `src` nor anything another thread touches meanwhile.
unsafe fn gather_rows(
    src: *const u8,
    len: usize,
    idx: *const i64,
    n: usize,
    dst: *mut u8,
    row: usize,
    axis: usize,
) -> Result<()> {
    // Where the first bad index found so far is: work past it is skipped.
    let first_bad = AtomicUsize::new(usize::MAX);
    let (src, idx, dst) = (SendPtr(src), SendPtr(idx), SendPtr(dst.cast_const()));
    // Large outputs of long rows are written with streaming stores, as the kernels do.
    let store = store_for(Stores::Auto, n.saturating_mul(row));
    let range = |(lo, hi): (usize, usize)| -> Option<(usize, i64)> {
        let rows = Rows {
            src: src.get(),
            len,
            idx: idx.get(),
            dst: dst.get().cast_mut(),
            store,
        };
        // SAFETY: forwarded caller contract; `lo..hi` lies inside `0..n`, and each range is
        // given to one thread only, so no two threads write the same row.
        let found = unsafe {
            match row {
                1 => rows.range::<u8>(lo, hi, &first_bad),
                2 => rows.range::<u16>(lo, hi, &first_bad),
                4 => rows.range::<u32>(lo, hi, &first_bad),
                8 => rows.range::<u64>(lo, hi, &first_bad),
                16 => rows.range::<u128>(lo, hi, &first_bad),
                _ => rows.range_bytes(row, lo, hi, &first_bad),
            }
        };
        // Streaming stores are weakly ordered: done before the range is reported done.
        fence(store);
        found
    };
    let per = n.div_ceil(4 * threads()).max(CHECK_EVERY);
    let ranges: Vec<(usize, usize)> = (0..n)
        .step_by(per)
        .map(|lo| (lo, (lo + per).min(n)))
        .collect();
    // Under Miri the ranges run in order on this thread, as the kernels' pieces do.
    let found: Vec<Option<(usize, i64)>> = if cfg!(miri) || threads() == 1 || ranges.len() == 1 {
        #[cfg(test)]
        let ranges = match LAST_FIRST.with(std::cell::Cell::get) {
            true => ranges.into_iter().rev().collect(),
            false => ranges,
        };
        ranges.into_iter().map(range).collect()
    } else {
        ranges.into_par_iter().map(range).collect()
    };
    finish(found, axis, len)
}

#[cfg(test)]
thread_local! {
    /// Makes the ranges that run on one thread run last first: a later range then finds its
    /// bad index before an earlier one does, as it may on another thread.
    pub(super) static LAST_FIRST: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// The error for the bad indices the ranges found (position and value), if any.
fn finish(found: Vec<Option<(usize, i64)>>, axis: usize, len: usize) -> Result<()> {
    // Every index before the first bad one was read and checked (work is skipped only past a
    // bad index found), so the least position found is the first bad index in order.
    match found.into_iter().flatten().min_by_key(|&(at, _)| at) {
        Some((_, index)) => Err(Error::IndexOutOfRange {
            index: index as i128,
            axis,
            len,
        }),
        None => Ok(()),
    }
}

/// The operands of [`gather_rows`], for one thread.
struct Rows {
    src: *const u8,
    len: usize,
    idx: *const i64,
    dst: *mut u8,
    /// How rows of more than a word, and runs of rows, are stored.
    store: Store,
}

impl Rows {
    /// Gathers rows `lo..hi` of one machine word `T` each; returns the position and value
    /// of the first bad index in the range, if any (nothing after it is gathered).
    ///
    /// # Safety
    /// As for [`gather_rows`], with rows of `size_of::<T>()` bytes and `lo <= hi <= n`.
    unsafe fn range<T: Copy>(
        &self,
        lo: usize,
        hi: usize,
        first_bad: &AtomicUsize,
    ) -> Option<(usize, i64)> {
        let (src, dst) = (self.src.cast::<T>(), self.dst.cast::<T>());
        // SAFETY: forwarded; each row is one `T`, read and written unaligned (DLPack data
        // may have any alignment).
        unsafe {
            self.walk(size_of::<T>(), lo, hi, first_bad, |i, j| {
                dst.add(i).write_unaligned(src.add(j).read_unaligned())
            })
        }
    }

    /// [`Rows::range`] for rows of `row` bytes that are no machine word.
    ///
    /// # Safety
    /// As for [`gather_rows`], with `lo <= hi <= n`.
    unsafe fn range_bytes(
        &self,
        row: usize,
        lo: usize,
        hi: usize,
        first_bad: &AtomicUsize,
    ) -> Option<(usize, i64)> {
        let (src, dst, store) = (self.src, self.dst, self.store);
        // SAFETY: forwarded; row `j < len` of `src` and row `i < n` of `dst`, disjoint.
        unsafe {
            self.walk(row, lo, hi, first_bad, |i, j| {
                copy_row(dst.add(i * row), src.add(j * row), row, store)
            })
        }
    }

    /// Reads indices `lo..hi` once each and copies row `j` (the index wrapped and checked to
    /// be in `[0, len)`) of `row` bytes to row `i`: with `one(i, j)`, or with one copy for
    /// [`RUN`] consecutive indices. Stops at the first bad index (returned with its position)
    /// or when another thread has found an earlier one. As the general kernel does, it
    /// prefetches the rows of indices about [`PREFETCH`] ahead: the start of a later run after
    /// a run, every row of a chunk that is spread out (those indices are read a second time
    /// for that, as a hint only: a prefetch never faults).
    ///
    /// # Safety
    /// `idx` addresses at least `hi` readable, aligned int64 values; `one(i, j)` and the run
    /// copies may be made for any `i` in `lo..hi` and `j < len`.
    #[inline(always)]
    unsafe fn walk(
        &self,
        row: usize,
        lo: usize,
        hi: usize,
        first_bad: &AtomicUsize,
        mut one: impl FnMut(usize, usize),
    ) -> Option<(usize, i64)> {
        let (idx, len) = (self.idx, self.len);
        let read = |i: usize| {
            // SAFETY: every position read is below `hi` (the contract). One volatile read per
            // index: the value checked is the value used, whatever another thread writes.
            unsafe { idx.add(i).read_volatile() }
        };
        let mut at = lo;
        while at < hi {
            if at > first_bad.load(Ordering::Relaxed) {
                return None; // an earlier bad index is known: the rest is not needed
            }
            let end = (at + CHECK_EVERY).min(hi);
            let mut i = at;
            while i < end {
                if i + RUN > end {
                    // The last few indices, one by one.
                    let v = read(i);
                    let Some(j) = wrapped(v, len) else {
                        first_bad.fetch_min(i, Ordering::Relaxed);
                        return Some((i, v));
                    };
                    one(i, j);
                    i += 1;
                    continue;
                }
                let mut js = [0usize; RUN];
                for (t, j) in js.iter_mut().enumerate() {
                    let v = read(i + t);
                    let Some(w) = wrapped(v, len) else {
                        first_bad.fetch_min(i + t, Ordering::Relaxed);
                        return Some((i + t, v));
                    };
                    *j = w;
                }
                let ahead = |t: usize| {
                    let j = read(i + PREFETCH + t) as usize;
                    self.src.wrapping_add(j.wrapping_mul(row))
                };
                let run = js[RUN - 1].wrapping_sub(js[0]) == RUN - 1
                    && js.iter().enumerate().all(|(t, &j)| j == js[0] + t);
                // The furthest index read ahead is `i + PREFETCH + RUN` (after a run).
                if i + PREFETCH + RUN < hi {
                    if run {
                        // Blocked indices: the start of a later run, which the hardware
                        // prefetcher cannot guess.
                        let p = ahead(RUN);
                        prefetch(p);
                        prefetch(p.wrapping_add(64));
                    } else if read(i + PREFETCH + RUN - 1)
                        .wrapping_sub(read(i + PREFETCH))
                        .unsigned_abs()
                        >= NEAR
                    {
                        // Spread out indices: each row of the chunk ahead.
                        for t in 0..RUN {
                            prefetch(ahead(t));
                        }
                    }
                }
                if run {
                    // SAFETY: rows js[0]..js[0] + RUN of `src` (each checked < len) and
                    // i..i + RUN of `dst` (below `hi`), contiguous on both sides.
                    unsafe {
                        copy_row(
                            self.dst.add(i * row),
                            self.src.add(js[0] * row),
                            RUN * row,
                            self.store,
                        )
                    };
                } else {
                    for (t, &j) in js.iter().enumerate() {
                        one(i + t, j);
                    }
                }
                i += RUN;
            }
            at = end;
        }
        None
    }
}
