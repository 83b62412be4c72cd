//! Gather and scatter along one axis.
//!
//! Both are loops over (outer index, i) "units": the dims before the axis, then the index
//! list. Each unit copies one inner box (the dims after the axis) between position `i` on
//! the value side and position `indices[i]` on the indexed side. Inner boxes that are one
//! machine word or one contiguous block get tight loops; runs of consecutive indices become
//! one copy when the axis itself is contiguous. Indices are checked as they are used, so a
//! bad one is reported without a separate pass.
//!
//! Scatter writes the same place twice when indices repeat and the later write must win, so
//! it splits work among threads by index ranges only when the indices never decrease (cut
//! where the index changes, so repeats stay on one thread); otherwise by outer slices (each
//! slice sees its indices in order) or, with few slices, by destination windows: every thread
//! walks all indices in order and writes only its window. Windows are used only where the
//! copies outweigh reading every index on every thread.

use std::marker::PhantomData;

use super::copy::{store_for, threads, DstView, Ptrs, SrcView, Stores, Tuning, TUNING};
use super::exec::run;
use super::plan::{is_word, Dim, Dims, Kind, Orig, Plan, MAX_DIMS};
use super::stream::{copy_row, fence, prefetch, Store};
use crate::error::{tuple_string, Error, Result};

/// How far ahead random accesses are prefetched (in indices); 0 disables prefetching.
const PREFETCH: usize = 32;
/// Chunks of indices spanning fewer positions than this are not prefetched.
const NEAR: u64 = 1024;
/// The shortest run of consecutive indices copied as one block (see [`slice`]).
const RUN: usize = 8;

/// `dst[.., i, ..] = src[.., indices[i], ..]` along `axis`.
///
/// # Safety
/// Every element of `src` must be readable and every element of `dst` writable (`itemsize`
/// bytes each), `dst` must not overlap `src`, and no one else may touch `dst` meanwhile.
///
/// # Errors
/// [`Error::Shape`] when `dst.shape` is not `src.shape` with `indices.len()` along `axis`;
/// [`Error::IndexOutOfRange`] for an index outside `[0, src.shape[axis])` (then `dst` holds
/// unspecified values).
pub unsafe fn gather(
    src: SrcView<'_>,
    indices: &[i64],
    axis: usize,
    dst: DstView<'_>,
    itemsize: usize,
) -> Result<()> {
    // SAFETY: forwarded caller contract.
    unsafe { gather_tuned(src, indices, axis, dst, itemsize, &TUNING) }
}

/// [`gather`] with explicit tuning.
///
/// # Safety
/// As for [`gather`].
pub(crate) unsafe fn gather_tuned(
    src: SrcView<'_>,
    indices: &[i64],
    axis: usize,
    dst: DstView<'_>,
    itemsize: usize,
    tuning: &Tuning,
) -> Result<()> {
    check_shapes(
        "gather",
        src.shape,
        dst.shape,
        src.strides,
        dst.strides,
        axis,
        indices.len(),
    )?;
    // SAFETY: forwarded caller contract; shapes checked.
    unsafe { index::<false>(src, indices, axis, dst, itemsize, tuning) }
}

/// `dst[.., indices[i], ..] = values[.., i, ..]` along `axis`; when indices repeat, the
/// later one wins (as numpy's fancy assignment).
///
/// # Safety
/// As for [`gather`] with `values` as the source.
///
/// # Errors
/// [`Error::Shape`] when `values.shape` is not `dst.shape` with `indices.len()` along `axis`;
/// [`Error::IndexOutOfRange`] for an index outside `[0, dst.shape[axis])`.
pub unsafe fn scatter(
    values: SrcView<'_>,
    indices: &[i64],
    axis: usize,
    dst: DstView<'_>,
    itemsize: usize,
) -> Result<()> {
    // SAFETY: forwarded caller contract.
    unsafe { scatter_tuned(values, indices, axis, dst, itemsize, &TUNING) }
}

/// [`scatter`] with explicit tuning.
///
/// # Safety
/// As for [`scatter`].
pub(crate) unsafe fn scatter_tuned(
    values: SrcView<'_>,
    indices: &[i64],
    axis: usize,
    dst: DstView<'_>,
    itemsize: usize,
    tuning: &Tuning,
) -> Result<()> {
    check_shapes(
        "scatter",
        dst.shape,
        values.shape,
        values.strides,
        dst.strides,
        axis,
        indices.len(),
    )?;
    // SAFETY: forwarded caller contract; shapes checked.
    unsafe { index::<true>(values, indices, axis, dst, itemsize, tuning) }
}

/// Checks that `valued` (the side indexed by position `i`) is `indexed` with `m` along `axis`.
fn check_shapes(
    op: &str,
    indexed: &[usize],
    valued: &[usize],
    ss: &[isize],
    ds: &[isize],
    axis: usize,
    m: usize,
) -> Result<()> {
    let n = indexed.len();
    let ok = axis < n
        && valued.len() == n
        && ss.len() == n
        && ds.len() == n
        && valued[axis] == m
        && (0..n).all(|k| k == axis || valued[k] == indexed[k]);
    if ok {
        return Ok(());
    }
    Err(Error::shape(
        format!("{op} along axis {axis} with {m} indices"),
        format!(
            "shapes {} and {}",
            tuple_string(indexed),
            tuple_string(valued)
        ),
    ))
}

/// The inner box of one unit.
#[derive(Clone)]
enum Inner<'a> {
    /// One machine word of that many bytes.
    Word(usize),
    /// One contiguous block of that many bytes.
    Block(usize),
    /// Anything else, planned as a box copy.
    Strided(Box<Plan<'a>>),
}

struct IndexPlan<'a> {
    /// Dims before the axis: `s` on the source, `d` on the destination.
    outer: Dims,
    outer_count: usize,
    /// Byte strides along the axis.
    ax_s: isize,
    ax_d: isize,
    /// Extent of the indexed axis.
    len: usize,
    idx: &'a [i64],
    inner: Inner<'a>,
    /// Whether consecutive indices merge into one copy.
    runs: bool,
    unit_bytes: usize,
    dst_distinct: bool,
}

/// The shared body of gather (`SCATTER = false`) and scatter. `src`/`dst` shapes are checked.
///
/// # Safety
/// As for [`gather`].
unsafe fn index<const SCATTER: bool>(
    src: SrcView<'_>,
    idx: &[i64],
    axis: usize,
    dst: DstView<'_>,
    itemsize: usize,
    tuning: &Tuning,
) -> Result<()> {
    let shape = if SCATTER { dst.shape } else { src.shape };
    let len = shape[axis];
    let bad = |i: usize| Error::IndexOutOfRange {
        index: idx[i],
        axis,
        len,
    };
    let numel = |s: &[usize]| s.iter().product::<usize>();
    if numel(src.shape) == 0 || numel(dst.shape) == 0 || itemsize == 0 {
        return match idx.iter().position(|&j| j as u64 >= len as u64) {
            Some(i) => Err(bad(i)),
            None => Ok(()),
        };
    }
    let item = itemsize as isize;
    if shape[..axis].iter().filter(|&&n| n > 1).count() > MAX_DIMS {
        // Too many dims for a plan: peel the first one off (it has extent > 1 here).
        for t in 0..shape[0] as isize {
            let s = SrcView {
                ptr: src.ptr.wrapping_offset(t * src.strides[0] * item),
                shape: &src.shape[1..],
                strides: &src.strides[1..],
            };
            let d = DstView {
                ptr: dst.ptr.wrapping_offset(t * dst.strides[0] * item),
                shape: &dst.shape[1..],
                strides: &dst.strides[1..],
            };
            // SAFETY: one slab of the caller's boxes.
            unsafe { index::<SCATTER>(s, idx, axis - 1, d, itemsize, tuning)? };
        }
        return Ok(());
    }
    let mut outer = Dims::new();
    let before = shape.iter().zip(src.strides).zip(dst.strides).take(axis);
    for ((&n, &s), &d) in before.filter(|((&n, _), _)| n > 1) {
        let pushed = outer.push(Dim {
            n,
            s: s * item,
            d: d * item,
        });
        debug_assert!(pushed, "outer dims were counted above");
    }
    outer.merge();
    let inner = Plan::new(Orig {
        shape: &src.shape[axis + 1..],
        src_strides: &src.strides[axis + 1..],
        dst_strides: &dst.strides[axis + 1..],
        itemsize,
    });
    let (mut base_s, mut base_d) = (src.ptr, dst.ptr);
    let inner = match inner.kind {
        Kind::Rows { bytes, .. } if inner.outer.as_slice().is_empty() => {
            base_s = base_s.wrapping_offset(inner.src_off);
            base_d = base_d.wrapping_offset(inner.dst_off);
            if is_word(bytes) {
                Inner::Word(bytes)
            } else {
                Inner::Block(bytes)
            }
        }
        _ => Inner::Strided(Box::new(inner)),
    };
    let (ax_s, ax_d) = (src.strides[axis] * item, dst.strides[axis] * item);
    let block = match inner {
        Inner::Word(b) | Inner::Block(b) => b,
        Inner::Strided(ref p) => p.bytes,
    };
    let runs =
        !matches!(inner, Inner::Strided(_)) && ax_s == block as isize && ax_d == block as isize;
    let plan = IndexPlan {
        outer_count: outer.count(),
        outer,
        ax_s,
        ax_d,
        len,
        idx,
        inner,
        runs,
        unit_bytes: block,
        dst_distinct: super::plan::distinct_layout(dst.shape, dst.strides, itemsize),
    };
    let ptrs = Ptrs {
        src: base_s,
        dst: base_d,
    };
    let store = store_for(Stores::Auto, plan.outer_count * idx.len() * block);
    // SAFETY: forwarded caller contract; the plan describes the caller's boxes.
    let r = unsafe {
        match plan.inner {
            Inner::Word(1) => {
                schedule::<_, SCATTER>(&plan, &Word::<u8>(PhantomData), ptrs, store, tuning)
            }
            Inner::Word(2) => {
                schedule::<_, SCATTER>(&plan, &Word::<u16>(PhantomData), ptrs, store, tuning)
            }
            Inner::Word(4) => {
                schedule::<_, SCATTER>(&plan, &Word::<u32>(PhantomData), ptrs, store, tuning)
            }
            Inner::Word(8) => {
                schedule::<_, SCATTER>(&plan, &Word::<u64>(PhantomData), ptrs, store, tuning)
            }
            Inner::Word(_) => {
                schedule::<_, SCATTER>(&plan, &Word::<u128>(PhantomData), ptrs, store, tuning)
            }
            Inner::Block(bytes) => {
                schedule::<_, SCATTER>(&plan, &BlockUnit { bytes, store }, ptrs, store, tuning)
            }
            Inner::Strided(ref p) => {
                schedule::<_, SCATTER>(&plan, &BoxUnit { plan: p, store }, ptrs, store, tuning)
            }
        }
    };
    r.map_err(bad)
}

/// Copies `count` consecutive inner boxes (`count > 1` only when the plan merges runs).
trait Unit: Sync {
    /// # Safety
    /// The boxes must be readable at `src` and writable at `dst`.
    unsafe fn copy(&self, src: *const u8, dst: *mut u8, count: usize);

    /// Whether an inner box is one word (at most 16 bytes): such boxes may be written to a
    /// scratch word instead of branching around the write.
    const WORD: bool = false;

    /// One inner box.
    ///
    /// # Safety
    /// As for [`Unit::copy`].
    #[inline(always)]
    unsafe fn one(&self, src: *const u8, dst: *mut u8) {
        // SAFETY: forwarded.
        unsafe { self.copy(src, dst, 1) }
    }
}

struct Word<T>(PhantomData<T>);
// SAFETY: a marker for the element type; it holds no data.
unsafe impl<T> Sync for Word<T> {}

impl<T: Copy> Unit for Word<T> {
    const WORD: bool = true;

    #[inline(always)]
    unsafe fn copy(&self, src: *const u8, dst: *mut u8, count: usize) {
        // SAFETY: caller contract; `count` contiguous words on both sides.
        unsafe { std::ptr::copy_nonoverlapping(src, dst, count * size_of::<T>()) }
    }

    #[inline(always)]
    unsafe fn one(&self, src: *const u8, dst: *mut u8) {
        // SAFETY: caller contract; unaligned words are allowed.
        unsafe {
            std::ptr::write_unaligned(dst as *mut T, std::ptr::read_unaligned(src as *const T))
        }
    }
}

struct BlockUnit {
    bytes: usize,
    store: Store,
}

impl Unit for BlockUnit {
    #[inline]
    unsafe fn copy(&self, src: *const u8, dst: *mut u8, count: usize) {
        // SAFETY: caller contract; `count` contiguous blocks on both sides.
        unsafe { copy_row(dst, src, count * self.bytes, self.store) }
    }
}

struct BoxUnit<'a> {
    plan: &'a Plan<'a>,
    store: Store,
}

impl Unit for BoxUnit<'_> {
    unsafe fn copy(&self, src: *const u8, dst: *mut u8, count: usize) {
        debug_assert_eq!(count, 1);
        // SAFETY: caller contract; the plan describes the inner box at these addresses.
        unsafe { run(self.plan, src, dst, 0, self.plan.units, self.store) }
    }
}

/// Runs every unit, on this thread or split among threads (see the module docs).
///
/// # Safety
/// As for [`index`]; `plan` and `ptrs` describe the caller's boxes.
unsafe fn schedule<U: Unit, const SCATTER: bool>(
    plan: &IndexPlan<'_>,
    unit: &U,
    ptrs: Ptrs,
    store: Store,
    tuning: &Tuning,
) -> Result<(), usize> {
    let m = plan.idx.len();
    let units = plan.outer_count * m;
    let full = (0, plan.len);
    // Random single words cost a cache line each, whatever their size.
    let bytes = units * plan.unit_bytes.max(64);
    let piece = |lo: usize, hi: usize, win: (usize, usize)| {
        // SAFETY: forwarded; the scheduling below gives each piece disjoint destinations.
        let r = unsafe { units_range::<U, SCATTER>(plan, unit, ptrs, lo, hi, win) };
        fence(store);
        r
    };
    if !tuning.parallel(bytes) || !plan.dst_distinct {
        return piece(0, units, full);
    }
    let threads = threads();
    let per = (tuning.piece(bytes) / plan.unit_bytes.max(64)).max(1);
    let step = units.div_ceil(units.div_ceil(per));
    if !SCATTER {
        tuning.run(units, step, |lo| piece(lo, (lo + step).min(units), full))
    } else if sorted(plan.idx, tuning) {
        // Repeated indices are neighbours: pieces that never split a group of equal indices
        // keep every group in order on one thread.
        let idx = plan.idx;
        let snap = |u: usize| {
            let i = u % m;
            if u >= units || i == 0 {
                return u.min(units);
            }
            let prev = idx[i - 1];
            u + idx[i..].partition_point(|&x| x == prev).min(m - i)
        };
        tuning.run(units, step, |lo| {
            let (a, b) = (snap(lo), snap(lo + step));
            if a < b {
                piece(a, b, full)
            } else {
                Ok(())
            }
        })
    } else if plan.outer_count >= 4 * threads {
        let step = per.div_ceil(m).max(1) * m;
        tuning.run(units, step, |lo| piece(lo, (lo + step).min(units), full))
    } else if plan.unit_bytes >= 64 || threads >= 4 {
        let step = plan.len.div_ceil(threads);
        tuning.run(plan.len, step, |a| {
            piece(0, units, (a, (a + step).min(plan.len)))
        })
    } else {
        // Windows make every thread read every index: with two threads and small inner
        // boxes that cost more than the second thread saved (measured here), so one does it.
        piece(0, units, full)
    }
}

/// Whether `idx` never decreases, checked in parallel pieces that overlap by one index.
fn sorted(idx: &[i64], tuning: &Tuning) -> bool {
    const CHUNK: usize = 1 << 16;
    tuning
        .run(idx.len(), CHUNK, |lo| {
            let chunk = &idx[lo..(lo + CHUNK + 1).min(idx.len())];
            if chunk.is_sorted() {
                Ok(())
            } else {
                Err(())
            }
        })
        .is_ok()
}

/// Units `lo..hi`, writing only indexed positions inside `win`.
///
/// # Safety
/// As for [`schedule`].
unsafe fn units_range<U: Unit, const SCATTER: bool>(
    p: &IndexPlan<'_>,
    unit: &U,
    ptrs: Ptrs,
    lo: usize,
    hi: usize,
    win: (usize, usize),
) -> Result<(), usize> {
    let m = p.idx.len();
    let outer = p.outer.as_slice();
    let mut idx = [0usize; MAX_DIMS];
    let (mut so, mut dof) = (0isize, 0isize);
    let mut rest = lo / m;
    for (j, dim) in outer.iter().enumerate().rev() {
        idx[j] = rest % dim.n;
        rest /= dim.n;
        so += idx[j] as isize * dim.s;
        dof += idx[j] as isize * dim.d;
    }
    let (mut i, mut left) = (lo % m, hi - lo);
    while left > 0 {
        let end = (i + left).min(m);
        let (s, d) = (ptrs.src.wrapping_offset(so), ptrs.dst.wrapping_offset(dof));
        // SAFETY: (s, d) is the outer slice of the current index (caller contract).
        unsafe {
            if win == (0, p.len) {
                slice::<U, SCATTER, false>(p, unit, s, d, i, end, win)?
            } else {
                slice::<U, SCATTER, true>(p, unit, s, d, i, end, win)?
            }
        };
        left -= end - i;
        i = 0;
        for (j, dim) in outer.iter().enumerate().rev() {
            idx[j] += 1;
            so += dim.s;
            dof += dim.d;
            if idx[j] < dim.n {
                break;
            }
            idx[j] = 0;
            so -= dim.n as isize * dim.s;
            dof -= dim.n as isize * dim.d;
        }
    }
    Ok(())
}

/// Indices `i0..i1` of one outer slice; `Err(i)` names the first bad index met. With
/// `WINDOW`, only indexed positions inside `win` are written.
///
/// Runs of at least [`RUN`] consecutive indices become one copy. Checking for one costs a
/// load and a compare per index that is well predicted both in random indices (never a run)
/// and in blocked ones; shorter runs would cost more in mispredictions and calls than they save.
///
/// # Safety
/// As for [`schedule`], with `src`/`dst` at the outer slice.
#[inline]
#[allow(clippy::too_many_arguments)]
unsafe fn slice<U: Unit, const SCATTER: bool, const WINDOW: bool>(
    p: &IndexPlan<'_>,
    unit: &U,
    src: *const u8,
    dst: *mut u8,
    i0: usize,
    i1: usize,
    win: (usize, usize),
) -> Result<(), usize> {
    // Locals, not fields: stores through raw pointers would make the compiler reload fields.
    let (all, idx, len, runs) = (p.idx, &p.idx[..i1], p.len, p.runs);
    let (ax_s, ax_d) = (p.ax_s, p.ax_d);
    // Value-side position x, indexed-side position y.
    let at = |x: usize, y: usize| {
        let (x, y) = (x as isize, y as isize);
        if SCATTER {
            (src.wrapping_offset(x * ax_s), dst.wrapping_offset(y * ax_d))
        } else {
            (src.wrapping_offset(y * ax_s), dst.wrapping_offset(x * ax_d))
        }
    };
    // The randomly addressed side, prefetched where the indices will send us.
    let (far, far_step) = if SCATTER {
        (dst as *const u8, ax_d)
    } else {
        (src, ax_s)
    };
    let mut scratch = 0u128;
    let sink = (&mut scratch as *mut u128).cast::<u8>();
    let mut i = i0;
    while i < i1 {
        let Some(chunk) = idx.get(i..i + RUN) else {
            // The last few indices, one by one.
            let j = idx[i];
            if j as u64 >= len as u64 {
                return Err(i);
            }
            let j = j as usize;
            if !WINDOW || (win.0 <= j && j < win.1) {
                let (s, d) = at(i, j);
                // SAFETY: position i (value side) and j (indexed side, checked < len) are
                // inside the boxes.
                unsafe { unit.one(s, d) };
            }
            i += 1;
            continue;
        };
        let j = chunk[0];
        if runs
            && chunk[RUN - 1].wrapping_sub(j) == RUN as i64 - 1
            && (1..RUN).all(|t| chunk[t] == j.wrapping_add(t as i64))
        {
            if j as u64 >= len as u64 {
                return Err(i);
            }
            let j = j as usize;
            let mut k = RUN;
            while i + k < i1 && idx[i + k] == (j + k) as i64 {
                k += 1;
            }
            if j + k > len {
                return Err(i + (len - j));
            }
            if PREFETCH > 0 {
                // Blocked indices: the start of a later run, whose lines nothing else fetches.
                if let Some(&a) = all.get(i + k + PREFETCH) {
                    let p = far.wrapping_offset((a as isize).wrapping_mul(far_step));
                    prefetch(p);
                    prefetch(p.wrapping_add(64));
                }
            }
            let (a, b) = if WINDOW {
                (j.max(win.0), (j + k).min(win.1))
            } else {
                (j, j + k)
            };
            if a < b {
                let (s, d) = at(i + (a - j), a);
                // SAFETY: positions a..b (checked <= len) and the matching value-side
                // positions are inside the boxes, contiguous on both sides (`runs`).
                unsafe { unit.copy(s, d, b - a) };
            }
            i += k;
            continue;
        }
        // One well-predicted branch for the range checks of the whole chunk.
        if chunk
            .iter()
            .fold(false, |bad, &x| bad | (x as u64 >= len as u64))
        {
            let t = chunk
                .iter()
                .position(|&x| x as u64 >= len as u64)
                .unwrap_or(0);
            return Err(i + t);
        }
        if PREFETCH > 0 {
            // Chunks whose indices stay close together need no help from us: the hardware
            // prefetcher follows them.
            if let Some(ahead) = all.get(i + PREFETCH..i + PREFETCH + RUN) {
                if ahead[RUN - 1].wrapping_sub(ahead[0]).unsigned_abs() >= NEAR {
                    for &a in ahead {
                        // Outside the window: a line at its edge, already in cache.
                        let a = if WINDOW {
                            (a as usize).clamp(win.0, win.1 - 1)
                        } else {
                            a as usize
                        };
                        prefetch(far.wrapping_offset((a as isize).wrapping_mul(far_step)));
                    }
                }
            }
        }
        for (t, &j) in chunk.iter().enumerate() {
            let j = j as usize;
            if WINDOW && U::WORD {
                // Random indices fall outside the window half the time: a write to a
                // scratch word instead of a branch that would be mispredicted as often.
                let (s, d) = at(i + t, j);
                let d = if win.0 <= j && j < win.1 { d } else { sink };
                // SAFETY: position i + t (value side) is inside the box; `d` is either
                // position j (checked < len) or the scratch word, which is large enough.
                unsafe { unit.one(s, d) };
            } else if !WINDOW || (win.0 <= j && j < win.1) {
                let (s, d) = at(i + t, j);
                // SAFETY: position i + t (value side) and j (indexed side, checked < len)
                // are inside the boxes.
                unsafe { unit.one(s, d) };
            }
        }
        i += RUN;
    }
    Ok(())
}
