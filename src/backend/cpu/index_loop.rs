//! The per-thread loops of gather and scatter, how their work is split among threads, and the
//! plan they run ([`IndexPlan`], built by [`super::index`], which calls into this module and
//! never the other way).

use std::marker::PhantomData;

use super::copy::{threads, Ptrs, Tuning};
use super::exec::run;
use super::lower::{Cursor, Dims, Lowered};
use super::nontemporal::{copy_row, fence, prefetch, Store};

/// How far ahead random accesses are prefetched (in indices); 0 disables prefetching.
pub(super) const PREFETCH: usize = 32;
/// Chunks of indices spanning fewer positions than this are not prefetched.
pub(super) const NEAR: u64 = 1024;
/// The shortest run of consecutive indices copied as one block (see [`slice()`]).
pub(super) const RUN: usize = 8;

/// The inner box of one unit.
#[derive(Clone)]
pub(super) enum Inner<'a> {
    /// One machine word of that many bytes.
    Word(usize),
    /// One contiguous block of that many bytes.
    Block(usize),
    /// Anything else, planned as a box copy.
    Strided(Box<Lowered<'a>>),
}

/// A planned gather or scatter; pointers stay outside (see [`Ptrs`]).
pub(super) struct IndexPlan<'a> {
    /// Dims before the axis: `s` on the source, `d` on the destination.
    pub outer: Dims,
    pub outer_count: usize,
    /// Byte strides along the axis.
    pub ax_s: isize,
    pub ax_d: isize,
    /// Extent of the indexed axis.
    pub len: usize,
    pub idx: &'a [i64],
    pub inner: Inner<'a>,
    /// Whether consecutive indices merge into one copy.
    pub runs: bool,
    pub unit_bytes: usize,
    pub dst_distinct: bool,
}

/// Copies `count` consecutive inner boxes (`count > 1` only when the plan merges runs).
pub(super) trait Unit: Sync {
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

pub(super) struct Word<T>(pub PhantomData<T>);
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

pub(super) struct BlockUnit {
    pub bytes: usize,
    pub store: Store,
}

impl Unit for BlockUnit {
    #[inline]
    unsafe fn copy(&self, src: *const u8, dst: *mut u8, count: usize) {
        // SAFETY: caller contract; `count` contiguous blocks on both sides.
        unsafe { copy_row(dst, src, count * self.bytes, self.store) }
    }
}

pub(super) struct BoxUnit<'a> {
    pub plan: &'a Lowered<'a>,
    pub store: Store,
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
/// As for [`super::gather`]; `plan` and `ptrs` describe the caller's boxes.
pub(super) unsafe fn schedule<U: Unit, const SCATTER: bool>(
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
    let mut at = Cursor::at(outer, lo / m, 0, 0);
    let (mut i, mut left) = (lo % m, hi - lo);
    while left > 0 {
        let end = (i + left).min(m);
        let (s, d) = (
            ptrs.src.wrapping_offset(at.s),
            ptrs.dst.wrapping_offset(at.d),
        );
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
        at.step(outer);
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
