//! Running a range of units of a [`Lowered`] on one thread.

use std::ptr::{read_unaligned, write_unaligned};

use super::lower::{Cursor, Dim, Kind, Lowered};
use super::nontemporal::{copy_row, Store};

/// Calls `$f::<T>($args)` with `T` the unsigned integer of `$elem` bytes.
macro_rules! by_word {
    ($elem:expr, $f:ident ( $($arg:expr),* )) => {
        match $elem {
            1 => $f::<u8>($($arg),*),
            2 => $f::<u16>($($arg),*),
            4 => $f::<u32>($($arg),*),
            8 => $f::<u64>($($arg),*),
            16 => $f::<u128>($($arg),*),
            e => unreachable!("element size {e} is not a machine word"),
        }
    };
}

/// Runs units `lo..hi` of `plan` on the box whose element `[0, ..., 0]` is at `src` / `dst`.
///
/// # Safety
/// The box described by the plan's original shape and strides must be readable from `src`
/// and writable from `dst`, the two must not overlap, and `lo <= hi <= plan.units`. No other
/// thread may touch the destination elements of these units meanwhile.
pub(crate) unsafe fn run(
    plan: &Lowered<'_>,
    src: *const u8,
    dst: *mut u8,
    lo: usize,
    hi: usize,
    store: Store,
) {
    if lo >= hi {
        return;
    }
    if plan.kind == Kind::Naive {
        let o = plan.orig;
        // SAFETY: forwarded caller contract; a naive plan has exactly one unit.
        unsafe { super::copy_strided(src, o.src_strides, dst, o.dst_strides, o.shape, o.itemsize) };
        return;
    }
    let outer = plan.outer.as_slice();
    let iu = plan.inner_units;
    let (so, dof) = (plan.src_off, plan.dst_off);
    if let (Kind::Rows { bytes, .. }, [dim], 1) = (plan.kind, outer, iu) {
        // Rows along one outer dim, the most common box (tiny ones included): a plain loop.
        for r in lo..hi {
            let (s, d) = (so + r as isize * dim.s, dof + r as isize * dim.d);
            // SAFETY: row r < dim.n of the box (caller contract).
            unsafe { copy_row(dst.wrapping_offset(d), src.wrapping_offset(s), bytes, store) };
        }
        return;
    }
    let mut at = Cursor::at(outer, lo / iu, so, dof);
    let mut k = lo % iu;
    for _ in lo..hi {
        let (s, d) = (src.wrapping_offset(at.s), dst.wrapping_offset(at.d));
        // SAFETY: (s, d) address the element of the current outer index, inside the box;
        // `k < iu` names a unit inside it (caller contract).
        unsafe { unit(plan, s, d, k, store) };
        k += 1;
        if k == iu {
            k = 0;
            at.step(outer);
        }
    }
}

/// Runs unit `k` of the inner kernel at one outer index.
///
/// # Safety
/// As for [`run`], with `src`/`dst` at the outer index and `k < plan.inner_units`.
#[inline]
unsafe fn unit(plan: &Lowered<'_>, src: *const u8, dst: *mut u8, k: usize, store: Store) {
    // The unit's elements lie inside the box (caller contract); every offset below is within
    // the inner extents the plan was built from.
    match plan.kind {
        Kind::Rows { bytes, seg } => {
            let off = k * seg;
            // SAFETY: bytes `off .. off + seg` (clipped to the row) of one row inside the box;
            // `k < inner_units` keeps `off < bytes`.
            unsafe { copy_row(dst.add(off), src.add(off), seg.min(bytes - off), store) }
        }
        Kind::Elems { run, seg } => {
            let start = k * seg;
            let n = seg.min(run.n - start);
            let s = src.wrapping_offset(start as isize * run.s);
            let d = dst.wrapping_offset(start as isize * run.d);
            // SAFETY: elements start .. start + n of the run, inside the box (see above).
            unsafe { by_word!(plan.elem, strided(s, run.s, d, run.d, n)) }
        }
        Kind::Tile {
            p,
            q,
            t,
            block,
            blocks_q,
        } => {
            let (p0, q0) = ((k / blocks_q) * block, (k % blocks_q) * block);
            let (np, nq) = (block.min(p.n - p0), block.min(q.n - q0));
            for pt in (p0..p0 + np).step_by(t) {
                for qt in (q0..q0 + nq).step_by(t) {
                    let s = src.wrapping_offset(pt as isize * p.s + qt as isize * q.s);
                    let d = dst.wrapping_offset(pt as isize * p.d + qt as isize * q.d);
                    let (tp, tq) = (t.min(p0 + np - pt), t.min(q0 + nq - qt));
                    // SAFETY: a tp x tq tile clipped to the block, inside the box (see above).
                    unsafe { by_word!(plan.elem, tile(s, d, p, q, tp, tq)) }
                }
            }
        }
        Kind::Naive => unreachable!("naive plans are run whole"),
    }
}

/// `n` elements of `T` from `src` (step `ss` bytes) to `dst` (step `ds` bytes).
///
/// # Safety
/// Every addressed element must be readable / writable; unaligned addresses are fine.
#[inline]
pub(crate) unsafe fn strided<T: Copy>(
    src: *const u8,
    ss: isize,
    dst: *mut u8,
    ds: isize,
    n: usize,
) {
    let (mut s, mut d) = (src, dst);
    for _ in 0..n {
        // SAFETY: the i-th element on each side is inside the caller's ranges.
        unsafe { write_unaligned(d as *mut T, read_unaligned(s as *const T)) };
        s = s.wrapping_offset(ss);
        d = d.wrapping_offset(ds);
    }
}

/// One `np x nq` tile: source contiguous along `p`, destination contiguous along `q`. Both
/// sides touch `np` / `nq` short runs of whole lines, so the tile stays in L1 while it turns.
///
/// # Safety
/// Every addressed element must be readable / writable.
unsafe fn tile<T: Copy>(src: *const u8, dst: *mut u8, p: Dim, q: Dim, np: usize, nq: usize) {
    for i in 0..np as isize {
        let s = src.wrapping_offset(i * p.s);
        let d = dst.wrapping_offset(i * p.d);
        // SAFETY: row i of the tile is inside the box (caller contract).
        unsafe { strided::<T>(s, q.s, d, q.d, nq) };
    }
}
