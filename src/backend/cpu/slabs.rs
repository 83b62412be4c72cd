//! Gathers and scatters of a few indices over big slabs (the faces of a cube, a handful of
//! rows of a matrix), as one box copy per index: the index loop pays a step per unit of
//! the inner box (per row of a face along axis 1) and splits the units among threads.
//!
//! Up to [`Tuning::slabs_here_max`] bytes in all the slabs are copied on the calling thread,
//! as numpy copies them: a halo face is gathered near its last use, so it is in cache, and
//! waking a second thread then costs more than it saves (see [`SLABS_HERE_MAX_BYTES`]).
//!
//! [`SLABS_HERE_MAX_BYTES`]: super::copy::SLABS_HERE_MAX_BYTES

use super::copy::{copy_boxes_tuned, DstView, RawCopy, SrcView, Stores, Tuning};
use super::exec::run;
use super::index::check_indices;
use super::lower::{distinct_layout, Kind, Lowered, Orig};
use super::nontemporal::Store;
use crate::error::Result;
use crate::tensor::{is_c_contiguous, Axes};

/// Gathers and scatters of at most this many indices, each selecting a slab of at least
/// [`SLAB_MIN_ELEMENTS`] elements, take this path.
const SLAB_INDICES: usize = 64;
const SLAB_MIN_ELEMENTS: usize = 4096;

/// The shape of one slab when `m` indices along `axis` of the value side `valued` (the side
/// with `m` along the axis) select few big slabs; `None` otherwise.
fn few_big_slabs(valued: &[usize], axis: usize, m: usize) -> Option<Axes<usize>> {
    let numel: usize = valued.iter().product();
    if !(1..=SLAB_INDICES).contains(&m) || numel / m < SLAB_MIN_ELEMENTS {
        return None;
    }
    let mut slab = Axes::from(valued);
    slab[axis] = 1;
    Some(slab)
}

/// A gather of few big slabs: slab `indices[i]` of `src` into slab `i` of `dst`. Returns
/// `Ok(false)`, having done nothing, when the gather is not of that shape or `dst`'s slabs
/// could share memory.
///
/// # Safety
/// As for [`super::gather`], with shapes checked.
pub(super) unsafe fn gather_slabs(
    src: SrcView<'_>,
    indices: &[i64],
    axis: usize,
    dst: DstView<'_>,
    itemsize: usize,
    tuning: &Tuning,
) -> Result<bool> {
    let m = indices.len();
    let Some(slab) = few_big_slabs(dst.shape, axis, m) else {
        return Ok(false);
    };
    check_indices(indices, axis, src.shape[axis])?;
    let src_at = |j: i64| {
        src.ptr
            .wrapping_offset(slab_offset(src.strides, axis, itemsize, j))
    };
    let dst_at = |i: usize| {
        dst.ptr
            .wrapping_offset(slab_offset(dst.strides, axis, itemsize, i as i64))
    };
    // Slabs are copied in parallel above `slabs_here_max`, so the slabs written must not
    // share memory (one slab shares with no other: a halo face, gathered per call, skips the
    // list).
    if m > 1 {
        let mut spans: Vec<(usize, usize)> = (0..m)
            .map(|i| super::span(dst_at(i), &slab, dst.strides, itemsize))
            .collect();
        spans.sort_unstable();
        if spans.windows(2).any(|w| super::overlap(w[0], w[1])) {
            return Ok(false);
        }
    }
    let plan = plan_of(&slab, src.strides, dst.strides, itemsize);
    if here(&plan, m, tuning) {
        let pairs = indices
            .iter()
            .enumerate()
            .map(|(i, &j)| (src_at(j), dst_at(i)));
        // SAFETY: every slab lies inside the caller's boxes (indices checked above); `dst`
        // does not overlap `src` (caller contract).
        unsafe { copy_here(pairs, &plan) };
        return Ok(true);
    }
    let jobs: Vec<RawCopy<'_>> = indices
        .iter()
        .enumerate()
        .map(|(i, &j)| RawCopy {
            src: SrcView {
                ptr: src_at(j),
                shape: &slab,
                strides: src.strides,
            },
            dst: DstView {
                ptr: dst_at(i),
                shape: &slab,
                strides: dst.strides,
            },
            itemsize,
        })
        .collect();
    // SAFETY: every slab lies inside the caller's boxes (indices checked above); the
    // destination slabs are disjoint (checked above) and `dst` does not overlap `src`
    // (caller contract).
    unsafe { copy_boxes_tuned(&jobs, Stores::Auto, tuning) };
    Ok(true)
}

/// A scatter of few big slabs of at most `slabs_here_max` bytes in all: slab `i` of `values`
/// into slab `indices[i]` of `dst`, in order of `i` on the calling thread, so that the last
/// of repeated indices wins. Returns `Ok(false)`, having done nothing, when the scatter is
/// not of that shape or size, or `dst` refers to an element more than once (the index
/// loop's order of writes then decides, as it does for every other scatter).
///
/// # Safety
/// As for [`super::scatter`], with shapes checked.
pub(super) unsafe fn scatter_slabs(
    values: SrcView<'_>,
    indices: &[i64],
    axis: usize,
    dst: DstView<'_>,
    itemsize: usize,
    tuning: &Tuning,
) -> Result<bool> {
    let m = indices.len();
    let Some(slab) = few_big_slabs(values.shape, axis, m) else {
        return Ok(false);
    };
    let plan = plan_of(&slab, values.strides, dst.strides, itemsize);
    if !here(&plan, m, tuning) || !distinct_layout(dst.shape, dst.strides, itemsize) {
        return Ok(false);
    }
    check_indices(indices, axis, dst.shape[axis])?;
    let pairs = indices.iter().enumerate().map(|(i, &j)| {
        (
            (values.ptr).wrapping_offset(slab_offset(values.strides, axis, itemsize, i as i64)),
            (dst.ptr).wrapping_offset(slab_offset(dst.strides, axis, itemsize, j)),
        )
    });
    // SAFETY: every slab lies inside the caller's boxes (indices checked above); `dst` does
    // not overlap `values` (caller contract).
    unsafe { copy_here(pairs, &plan) };
    Ok(true)
}

/// The byte offset of slab `k` along `axis` of a view with `strides` (in elements).
fn slab_offset(strides: &[isize], axis: usize, itemsize: usize, k: i64) -> isize {
    k as isize * strides[axis] * itemsize as isize
}

/// The plan of one slab of `shape`, strides `ss` on the source and `ds` on the destination.
pub(super) fn plan_of<'a>(
    shape: &'a [usize],
    ss: &'a [isize],
    ds: &'a [isize],
    itemsize: usize,
) -> Lowered<'a> {
    Lowered::new(Orig {
        shape,
        src_strides: ss,
        dst_strides: ds,
        itemsize,
    })
}

/// Whether `m` slabs planned as `plan` are copied on the calling thread: up to
/// `slabs_here_max` bytes in all, in rows of a cache line or more on both sides. Shorter rows
/// and strided elements touch a line for every few bytes copied, so the lines touched, not
/// the bytes copied, decide, and they are seldom in cache: a face along the last axis of a
/// 512³ float32 cube copies 1 MiB from 16 MiB of lines, and two threads keep twice the misses
/// in flight.
pub(super) fn here(plan: &Lowered<'_>, m: usize, tuning: &Tuning) -> bool {
    let total = m * plan.bytes;
    total <= tuning.slabs_here_max && matches!(plan.kind, Kind::Rows { bytes, .. } if bytes >= 64)
}

/// Copies the slab that `plan` describes from each source address to its destination
/// address, in order, on the calling thread with plain stores: one `memcpy` per slab when
/// both sides are C-contiguous (as numpy copies them), else the plan run slab by slab.
///
/// # Safety
/// Each pair must address a box of the plan's shape and strides, readable at the source and
/// writable at the destination; no destination may overlap any source.
unsafe fn copy_here(pairs: impl Iterator<Item = (*const u8, *mut u8)>, plan: &Lowered<'_>) {
    let o = plan.orig;
    if is_c_contiguous(o.shape, o.src_strides) && is_c_contiguous(o.shape, o.dst_strides) {
        let bytes = o.shape.iter().product::<usize>() * o.itemsize;
        for (s, d) in pairs {
            // SAFETY: both boxes are one run of `bytes` bytes (C-contiguous over the shape).
            unsafe { std::ptr::copy_nonoverlapping(s, d, bytes) };
        }
        return;
    }
    for (s, d) in pairs {
        // SAFETY: all units of the plan of the box at (s, d) (caller contract).
        unsafe { run(plan, s, d, 0, plan.units, Store::Plain) };
    }
}
