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
//! it splits work among threads by index ranges only when the indices are strictly increasing;
//! otherwise by outer slices (each slice sees its indices in order) or, with few slices, by
//! destination windows: every thread walks all indices in order and writes only its window.

use std::marker::PhantomData;

use super::copy::{par_steps, store_for, threads, DstView, Ptrs, SrcView, Stores, Tuning, TUNING};
use super::exec::run;
use super::plan::{is_word, Dim, Dims, Kind, Orig, Plan, MAX_DIMS};
use super::stream::{copy_row, fence, prefetch, Store};
use crate::error::{tuple_string, Error, Result};

/// How far ahead random accesses are prefetched (in indices).
const PREFETCH: usize = 16;

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
        index: idx[i] as i128,
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
}

struct Word<T>(PhantomData<T>);
// SAFETY: a marker for the element type; it holds no data.
unsafe impl<T> Sync for Word<T> {}

impl<T: Copy> Unit for Word<T> {
    #[inline(always)]
    unsafe fn copy(&self, src: *const u8, dst: *mut u8, count: usize) {
        // SAFETY: caller contract; `count` contiguous words on both sides.
        unsafe {
            if count == 1 {
                std::ptr::write_unaligned(dst as *mut T, std::ptr::read_unaligned(src as *const T));
            } else {
                std::ptr::copy_nonoverlapping(src, dst, count * size_of::<T>());
            }
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
    let unique = !SCATTER || plan.idx.windows(2).all(|w| w[0] < w[1]);
    if unique {
        let step = units.div_ceil(units.div_ceil(per));
        par_steps(units, step, |lo| piece(lo, (lo + step).min(units), full))
    } else if plan.outer_count >= 4 * threads {
        let step = per.div_ceil(m).max(1) * m;
        par_steps(units, step, |lo| piece(lo, (lo + step).min(units), full))
    } else {
        let step = plan.len.div_ceil(threads);
        par_steps(plan.len, step, |a| {
            piece(0, units, (a, (a + step).min(plan.len)))
        })
    }
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
        unsafe { slice::<U, SCATTER>(p, unit, s, d, i, end, win)? };
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

/// Indices `i0..i1` of one outer slice; `Err(i)` names the first bad index met.
///
/// # Safety
/// As for [`schedule`], with `src`/`dst` at the outer slice.
#[inline]
unsafe fn slice<U: Unit, const SCATTER: bool>(
    p: &IndexPlan<'_>,
    unit: &U,
    src: *const u8,
    dst: *mut u8,
    i0: usize,
    i1: usize,
    win: (usize, usize),
) -> Result<(), usize> {
    let (idx, len) = (p.idx, p.len);
    // The randomly addressed side: prefetch where indices will send us.
    let (far, far_step) = if SCATTER {
        (dst as *const u8, p.ax_d)
    } else {
        (src, p.ax_s)
    };
    let mut i = i0;
    while i < i1 {
        let j = idx[i];
        if j as u64 >= len as u64 {
            return Err(i);
        }
        if let Some(&ahead) = idx.get(i + PREFETCH) {
            prefetch(far.wrapping_offset((ahead as isize).wrapping_mul(far_step)));
        }
        let j = j as usize;
        let mut k = 1;
        if p.runs {
            while i + k < i1 && idx[i + k] == (j + k) as i64 {
                k += 1;
            }
            if j + k > len {
                return Err(i + (len - j));
            }
        }
        let (a, b) = (j.max(win.0), (j + k).min(win.1));
        if a < b {
            let (x, y) = ((i + (a - j)) as isize, a as isize);
            let (s, d) = if SCATTER {
                (
                    src.wrapping_offset(x * p.ax_s),
                    dst.wrapping_offset(y * p.ax_d),
                )
            } else {
                (
                    src.wrapping_offset(y * p.ax_s),
                    dst.wrapping_offset(x * p.ax_d),
                )
            };
            // SAFETY: positions x.. (value side) and y.. (indexed side, checked < len) are
            // inside the boxes; runs are contiguous on both sides when `p.runs`.
            unsafe { unit.copy(s, d, b - a) };
        }
        i += k;
    }
    Ok(())
}
