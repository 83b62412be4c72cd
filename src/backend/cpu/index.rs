//! Gather and scatter along one axis.
//!
//! Both are loops over (outer index, i) "units": the dims before the axis, then the index
//! list. Each unit copies one inner box (the dims after the axis) between position `i` on
//! the value side and position `indices[i]` on the indexed side. Inner boxes that are one
//! machine word or one contiguous block get tight loops; runs of consecutive indices become
//! one copy when the axis itself is contiguous. The kernels check each index as they use
//! it; the backend's `gather` and `scatter` also check every index in one pass first
//! ([`check_indices`]), so that a bad one leaves the output as it was.
//!
//! Scatter writes the same place twice when indices repeat and the later write must win, so
//! it splits work among threads by index ranges only when the indices never decrease (cut
//! where the index changes, so repeats stay on one thread); otherwise by outer slices (each
//! slice sees its indices in order) or, with few slices, by destination windows: every thread
//! walks all indices in order and writes only its window. Windows are used only where the
//! copies outweigh reading every index on every thread.

use std::marker::PhantomData;

use super::copy::{store_for, DstView, Ptrs, SrcView, Stores, Tuning, TUNING};
use super::index_loop::{schedule, BlockUnit, BoxUnit, IndexPlan, Inner, Word};
use super::lower::{is_word, Dim, Dims, Kind, Lowered, Orig, MAX_DIMS};
use super::slabs::{gather_slabs, scatter_slabs};
use crate::error::{tuple_string, Error, Result};

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
    if unsafe { gather_slabs(src, indices, axis, dst, itemsize, tuning)? } {
        return Ok(());
    }
    // SAFETY: forwarded caller contract; shapes checked.
    unsafe { index::<false>(src, indices, axis, dst, itemsize, tuning) }
}

/// The first index outside `[0, len)` as [`Error::IndexOutOfRange`] on `axis`.
pub(super) fn check_indices(indices: &[i64], axis: usize, len: usize) -> Result<()> {
    // A branch-free pass first (the compiler vectorises it, where a search that may stop at
    // any index stays one compare and branch per index), the search only when some index is
    // out of range.
    let len64 = len as u64;
    if !indices
        .iter()
        .fold(false, |bad, &j| bad | (j as u64 >= len64))
    {
        return Ok(());
    }
    match indices.iter().find(|&&j| j as u64 >= len64) {
        Some(&index) => Err(Error::IndexOutOfRange {
            index: index as i128,
            axis,
            len,
        }),
        None => Ok(()),
    }
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
    if unsafe { scatter_slabs(values, indices, axis, dst, itemsize, tuning)? } {
        return Ok(());
    }
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
        return check_indices(idx, axis, len);
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
    let inner = Lowered::new(Orig {
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
    // An axis of extent 1 takes only index 0: its stride, which DLPack leaves free (torch
    // makes such tensors with any stride), is never stepped.
    let step = |n: usize, stride: isize| if n > 1 { stride * item } else { 0 };
    let (ax_s, ax_d) = (
        step(src.shape[axis], src.strides[axis]),
        step(dst.shape[axis], dst.strides[axis]),
    );
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
        dst_distinct: super::lower::distinct_layout(dst.shape, dst.strides, itemsize),
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
