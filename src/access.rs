//! Claims on host memory: how safe code sharing tensors between threads never races.
//!
//! A [`Tensor`] is a shared handle: clones and views of it, in any thread, reach the same
//! memory, and dlpart's operations write through `&Tensor`. Before a kernel reads or writes
//! host memory it claims the byte ranges it will touch, and [`Tensor::as_array`] (reading) and
//! [`Tensor::as_array_mut`] (writing) claim the range of their view for as long as the view
//! lives. A claim that would write memory another live claim reads or writes, or read memory
//! another writes, is refused with [`Error::Buffer`] naming the range: concurrent readers
//! share, a writer is alone. Nothing waits, so a thread can never block on a claim it holds
//! itself (a view it still holds, or a kernel it called from inside another operation's
//! work).
//!
//! Claims cover dlpart's own reads and writes of host-accessible memory. Device memory is
//! never dereferenced by the host, and memory a foreign framework shares (numpy's view of a
//! DLPack export) is that framework's to synchronise, as in any DLPack exchange.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use crate::error::{Error, Result};
use crate::tensor::Tensor;

/// A byte range `[lo, hi)` and whether the claim writes it.
#[derive(Clone, Copy, Debug)]
struct Range {
    lo: usize,
    hi: usize,
    write: bool,
}

struct Entry {
    id: u64,
    /// The smallest range holding every one of `ranges`, for a quick first test.
    bounds: (usize, usize),
    ranges: Vec<Range>,
    /// For each range, the tensor it spans when that tensor has gaps (a column block): two
    /// such ranges that meet are told apart exactly, element by element (see `exact`).
    gapped: Vec<Option<Tensor>>,
}

static ACTIVE: Mutex<Vec<Entry>> = Mutex::new(Vec::new());
static NEXT: AtomicU64 = AtomicU64::new(0);

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
            // The entry's tensors go after the lock: dropping one may run a DLPack deleter,
            // which may wait (for Python's lock) on a thread that waits for this one.
            drop(active);
            drop(gone);
        }
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

/// Claims the spans of `reads` for reading and of `writes` for writing (see the module docs).
///
/// Tensors with gaps whose strides nest (column blocks, every other row) are compared with
/// each other element by element when their spans meet, so that threads working on
/// interleaved blocks of one array do not refuse each other.
pub(crate) fn tensors<'a>(
    reads: impl IntoIterator<Item = &'a Tensor>,
    writes: impl IntoIterator<Item = &'a Tensor>,
) -> Result<Claim> {
    let of = |write: bool| {
        move |t: &'a Tensor| {
            let (lo, hi) = span(t)?;
            let gapped = (!t.is_contiguous() && crate::overlap::nested(t)).then(|| t.clone());
            Some((Range { lo, hi, write }, gapped))
        }
    };
    claim(
        reads
            .into_iter()
            .filter_map(of(false))
            .chain(writes.into_iter().filter_map(of(true)))
            .collect(),
    )
}

/// Claims byte ranges `[lo, hi)`: `reads` for reading, `writes` for writing. Ranges of one
/// claim may overlap each other (a kernel that reads what it writes orders that itself).
pub(crate) fn ranges(
    reads: impl IntoIterator<Item = (usize, usize)>,
    writes: impl IntoIterator<Item = (usize, usize)>,
) -> Result<Claim> {
    let range = |write: bool| move |(lo, hi)| (Range { lo, hi, write }, None);
    claim(
        reads
            .into_iter()
            .map(range(false))
            .chain(writes.into_iter().map(range(true)))
            .collect(),
    )
}

/// Claims `list`'s ranges, each with the tensor it spans where that has gaps.
fn claim(mut list: Vec<(Range, Option<Tensor>)>) -> Result<Claim> {
    list.retain(|(r, _)| r.lo < r.hi);
    if list.is_empty() {
        return Ok(Claim { id: None });
    }
    let (ranges, gapped): (Vec<Range>, Vec<Option<Tensor>>) = list.into_iter().unzip();
    let bounds = ranges
        .iter()
        .fold((usize::MAX, 0), |(lo, hi), r| (lo.min(r.lo), hi.max(r.hi)));
    let mut active = ACTIVE.lock().unwrap_or_else(|e| e.into_inner());
    for other in active.iter() {
        if other.bounds.0 >= bounds.1 || bounds.0 >= other.bounds.1 {
            continue;
        }
        let exact = |i: usize, j: usize| match (&gapped[i], &other.gapped[j]) {
            (Some(a), Some(b)) => crate::overlap::shares_memory(a, b),
            _ => true,
        };
        if let Some((mine, theirs)) = conflict(&ranges, &other.ranges, exact) {
            let what = if mine.write { "write" } else { "read" };
            let by = if theirs.write { "written" } else { "read" };
            let (lo, hi) = (mine.lo.max(theirs.lo), mine.hi.min(theirs.hi));
            return Err(Error::buffer(format!(
                "cannot {what} host memory {lo:#x}..{hi:#x}: it is being {by} at the same time \
                 by another dlpart operation or a live view (Tensor::as_array, as_array_mut) \
                 of it; dlpart refuses to race on memory"
            )));
        }
    }
    let id = NEXT.fetch_add(1, Ordering::Relaxed);
    active.push(Entry {
        id,
        bounds,
        ranges,
        gapped,
    });
    Ok(Claim { id: Some(id) })
}

/// The first pair of ranges, one of `mine` and one of `theirs`, that overlap with at least
/// one of them writing. Among few ranges, a pair that meets is a conflict only when
/// `exact(i, j)` (their tensors share an element) agrees; among many (thousands of small
/// boxes, which have no tensors) the spans decide.
fn conflict(
    mine: &[Range],
    theirs: &[Range],
    exact: impl Fn(usize, usize) -> bool,
) -> Option<(Range, Range)> {
    let meet = |a: &Range, b: &Range| a.lo < b.hi && b.lo < a.hi && (a.write || b.write);
    if mine.len().saturating_mul(theirs.len()) <= 4096 {
        return mine.iter().enumerate().find_map(|(i, a)| {
            theirs
                .iter()
                .enumerate()
                .find(|&(j, b)| meet(a, b) && exact(i, j))
                .map(|(_, b)| (*a, *b))
        });
    }
    // Many ranges on both sides (thousands of small boxes): sweep them in address order.
    let mut all: Vec<(Range, bool)> = mine
        .iter()
        .map(|&r| (r, true))
        .chain(theirs.iter().map(|&r| (r, false)))
        .collect();
    all.sort_unstable_by_key(|(r, _)| r.lo);
    // The ranges of each side seen so far that reach furthest, reading and writing.
    let mut reach: [[Option<Range>; 2]; 2] = [[None; 2]; 2];
    for (r, is_mine) in all {
        let other = usize::from(!is_mine);
        for open in reach[other].iter().flatten() {
            if meet(&r, open) {
                return Some(if is_mine { (r, *open) } else { (*open, r) });
            }
        }
        let slot = &mut reach[usize::from(is_mine)][usize::from(r.write)];
        if slot.is_none_or(|s| s.hi < r.hi) {
            *slot = Some(r);
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn r(lo: usize, hi: usize, write: bool) -> Range {
        Range { lo, hi, write }
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
    fn the_sweep_finds_what_the_pairwise_test_finds() {
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
            let found = conflict(&mine, &theirs, |_, _| true);
            assert_eq!(found.is_some(), pairwise);
            if let Some((a, b)) = found {
                assert!(a.lo < b.hi && b.lo < a.hi && (a.write || b.write));
            }
        }
    }
}
