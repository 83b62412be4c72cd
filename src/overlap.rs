//! Which tensors share memory: the check that lets `ops::repartition_into` hand the backends
//! copies whose destinations are disjoint from each other and from every other copy's source,
//! and that `Backend::copy_boxes` runs on the jobs its callers give it.
//!
//! Each tensor is cut into its *runs*, the address ranges of its innermost rows once axes
//! that continue one another are merged (one element each when the innermost axis is not
//! contiguous; one run for a contiguous tensor). Sorted by address, runs of different
//! tensors that intersect share memory, exactly, whatever the strides. A tensor with more
//! runs than [`MAX_RUNS`] is judged by its whole byte span instead, which may see sharing
//! where there is none, and by its strides for elements it covers twice: targets are then
//! refused with a [`Shared`] that says the sharing is possible, not proven, and sources are
//! staged, both safe.

use crate::backend::BoxCopy;
use crate::error::{Error, Result};
use crate::tensor::Tensor;

/// Beyond this many runs in all, tensors are compared by their byte spans.
pub(crate) const MAX_RUNS: usize = 1 << 22;

/// One address range `[start, end)` of tensor `owner`.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Run {
    pub(crate) start: usize,
    pub(crate) end: usize,
    pub(crate) owner: usize,
}

/// The runs of `t` (numbered `owner`), appended to `out`; `false`, with nothing appended,
/// when there would be more than `budget` of them.
fn runs_of(t: &Tensor, owner: usize, out: &mut Vec<Run>, budget: usize) -> bool {
    let item = t.dtype().itemsize();
    runs_in(
        t.data_ptr() as usize,
        t.shape(),
        t.strides(),
        item,
        owner,
        out,
        budget,
    )
}

/// [`runs_of`] the elements of `item` bytes with `shape` and `strides` (in elements) from
/// address `data`.
pub(crate) fn runs_in(
    data: usize,
    shape: &[usize],
    strides: &[isize],
    item: usize,
    owner: usize,
    out: &mut Vec<Run>,
    budget: usize,
) -> bool {
    if shape.contains(&0) {
        return true;
    }
    let item = item as isize;
    let (first, dims) = merged_dims(shape, strides);
    let inner_contiguous = dims.last().is_some_and(|&(_, s)| s == 1);
    let (outer, run_len) = match (inner_contiguous, dims.last()) {
        (true, Some(&(n, _))) => (&dims[..dims.len() - 1], n as isize * item),
        _ => (&dims[..], item),
    };
    let count: usize = outer.iter().map(|&(n, _)| n).product();
    if count > budget {
        return false;
    }
    let base = (data as isize).wrapping_add(first * item);
    let mut index = vec![0usize; outer.len()];
    out.reserve(count);
    for _ in 0..count {
        let off: isize = index
            .iter()
            .zip(outer)
            .map(|(&i, &(_, s))| i as isize * s)
            .sum::<isize>()
            * item;
        let start = base.wrapping_add(off) as usize;
        out.push(Run {
            start,
            end: start + run_len as usize,
            owner,
        });
        for a in (0..outer.len()).rev() {
            index[a] += 1;
            if index[a] < outer[a].0 {
                break;
            }
            index[a] = 0;
        }
    }
    true
}

/// The lowest element's offset (in elements) and `(extent, stride)` of the axes, outermost
/// first, that address the same *set* of elements as a tensor with `shape` and `strides` with
/// fewest axes: axes of extent 1 dropped, negative strides flipped (the offset moves to the
/// lowest element), the axes ordered by decreasing stride, and an axis whose stride is the
/// next axis's extent times its stride merged into it. A C- or Fortran-contiguous tensor
/// becomes one axis of stride 1, so one run however many rows it has (a column block of
/// 8,192 rows was 8,192 runs to sort on every `repartition_into`; a Fortran-order block was
/// one run per element, past [`MAX_RUNS`]).
fn merged_dims(shape: &[usize], strides: &[isize]) -> (isize, Vec<(usize, isize)>) {
    let mut first = 0isize;
    let mut axes: Vec<(usize, isize)> = shape
        .iter()
        .zip(strides)
        .filter(|(&n, _)| n != 1)
        .map(|(&n, &s)| {
            if s < 0 {
                first += (n as isize - 1) * s;
            }
            (n, s.abs())
        })
        .collect();
    // Stable: axes of equal stride (zero strides) keep their order.
    axes.sort_by_key(|&(_, s)| std::cmp::Reverse(s));
    let mut dims: Vec<(usize, isize)> = Vec::with_capacity(axes.len());
    for &(n, s) in axes.iter().rev() {
        match dims.last_mut() {
            Some(inner) if s == inner.0 as isize * inner.1 => inner.0 *= n,
            _ => dims.push((n, s)),
        }
    }
    dims.reverse();
    (first, dims)
}

/// The runs of `tensors`, or their whole byte spans when there are too many runs; and for
/// each tensor, whether it was judged by its span.
fn all_runs(tensors: &[&Tensor]) -> (Vec<Run>, Vec<bool>) {
    let mut out = Vec::new();
    let mut spanned = vec![false; tensors.len()];
    let mut budget = MAX_RUNS;
    for (i, t) in tensors.iter().enumerate() {
        let before = out.len();
        if !runs_of(t, i, &mut out, budget) {
            out.truncate(before);
            spanned[i] = true;
            let (lo, hi) = t.byte_span();
            let base = t.data_ptr() as isize;
            out.push(Run {
                start: base.wrapping_add(lo) as usize,
                end: base.wrapping_add(hi) as usize,
                owner: i,
            });
        }
        budget = budget.saturating_sub(out.len() - before);
    }
    out.sort_unstable_by_key(|r| (r.start, r.end));
    (out, spanned)
}

/// Two targets that share memory, or one (`first == second`) that covers some element twice.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Shared {
    /// The lower index.
    pub first: usize,
    pub second: usize,
    /// Whether the sharing is certain; `false` when a tensor with more than [`MAX_RUNS`] runs
    /// could not be told apart exactly, and is refused to be safe.
    pub proven: bool,
}

impl Shared {
    /// "share memory", worded for what was found.
    pub(crate) fn share_memory(&self) -> String {
        match self.proven {
            true => "share memory".into(),
            false => format!(
                "may share memory (they interleave in more than {MAX_RUNS} address ranges, \
                 too many to compare exactly)"
            ),
        }
    }

    /// The error for targets found sharing, named by `name` (given an index) and followed by
    /// `whose` (" of rank 3"): their writes would race.
    pub(crate) fn targets_error(&self, name: impl Fn(usize) -> String, whose: &str) -> Error {
        let (a, b) = (name(self.first), name(self.second));
        Error::buffer(match self.first == self.second {
            true => format!(
                "target partition {a}{whose} {}: its writes would race",
                self.more_than_once()
            ),
            false => format!(
                "target partitions {a} and {b}{whose} {}: their copies would race",
                self.share_memory()
            ),
        })
    }

    /// "refers to some element more than once", worded for what was found.
    pub(crate) fn more_than_once(&self) -> String {
        match self.proven {
            true => "refers to some element more than once".into(),
            false => format!(
                "may refer to some element more than once (its strides interleave, and it \
                 has more than {MAX_RUNS} address ranges, too many to tell exactly)"
            ),
        }
    }
}

/// Whether each axis of `t`, by increasing stride, steps over the whole reach of the smaller
/// ones: then no element of `t` is another of its elements.
pub(crate) fn nested(t: &Tensor) -> bool {
    let item = t.dtype().itemsize() as u128;
    let mut axes: Vec<(u128, u128)> = t
        .shape()
        .iter()
        .zip(t.strides())
        .filter(|(&n, _)| n > 1)
        .map(|(&n, &s)| (s.unsigned_abs() as u128 * item, n as u128))
        .collect();
    axes.sort_unstable();
    let mut reach = item; // bytes spanned by the axes so far, the element included
    axes.iter().all(|&(step, n)| {
        let ok = step >= reach;
        reach += step * (n - 1);
        ok
    })
}

/// The first pair of `targets` that share memory, or a target that covers some element
/// twice (a zero stride, or strides that interleave); `None` when all are disjoint.
pub(crate) fn shared_targets(targets: &[&Tensor]) -> Option<Shared> {
    let (runs, spanned) = all_runs(targets);
    // A tensor judged by its span is one run, which cannot meet itself: its strides tell.
    for (i, t) in targets.iter().enumerate() {
        if spanned[i] && !nested(t) {
            let zero = t
                .shape()
                .iter()
                .zip(t.strides())
                .any(|(&n, &s)| n > 1 && s == 0);
            return Some(Shared {
                first: i,
                second: i,
                proven: zero,
            });
        }
    }
    let mut reach: Option<Run> = None; // the run reaching furthest so far
    for r in runs {
        if let Some(prev) = reach {
            if r.start < prev.end {
                return Some(Shared {
                    first: prev.owner.min(r.owner),
                    second: prev.owner.max(r.owner),
                    proven: !spanned[prev.owner] && !spanned[r.owner],
                });
            }
        }
        if reach.is_none_or(|p| r.end > p.end) {
            reach = Some(r);
        }
    }
    None
}

/// For each of `sources`, whether it shares memory with any of `targets` (which are disjoint
/// from each other: see [`shared_targets`]).
pub(crate) fn sources_sharing(sources: &[&Tensor], targets: &[&Tensor]) -> Vec<bool> {
    let (dst, _) = all_runs(targets);
    let (src, _) = all_runs(sources);
    let mut shared = vec![false; sources.len()];
    // Disjoint and sorted by start, the target runs are sorted by end too.
    for s in src {
        let k = dst.partition_point(|d| d.end <= s.start);
        if dst.get(k).is_some_and(|d| d.start < s.end) {
            shared[s.owner] = true;
        }
    }
    shared
}

/// Whether some element of `t` is also another of its elements (a zero stride, or strides
/// that interleave), as a [`Shared`] of `t` with itself. Strides that nest are told apart
/// without cutting `t` into runs.
pub(crate) fn covers_an_element_twice(t: &Tensor) -> Option<Shared> {
    match t.numel() <= 1 || nested(t) {
        true => None,
        false => shared_targets(&[t]),
    }
}

/// Whether `a` shares an element with `b` (which covers none of its own twice: see
/// [`shared_targets`]). Tensors whose byte spans are apart are told so without cutting them
/// into runs, which a big source would make costly.
pub(crate) fn shares_memory(a: &Tensor, b: &Tensor) -> bool {
    if a.numel() == 0 || b.numel() == 0 {
        return false;
    }
    let absolute = |t: &Tensor| {
        let (lo, hi) = t.byte_span();
        let base = t.data_ptr() as isize;
        (
            base.wrapping_add(lo) as usize,
            base.wrapping_add(hi) as usize,
        )
    };
    let ((a0, a1), (b0, b1)) = (absolute(a), absolute(b));
    a0 < b1 && b0 < a1 && sources_sharing(&[a], &[b])[0]
}

/// Checks the contract of `Backend::copy_boxes_unchecked` on `jobs`: no two destination boxes
/// share an element, and no job's source box shares one with another job's destination box.
pub(crate) fn check_jobs(jobs: &[BoxCopy<'_>]) -> Result<()> {
    let dst: Vec<Tensor> = jobs
        .iter()
        .map(|j| j.dst.view(&j.dst_start, &j.shape))
        .collect::<Result<_>>()?;
    let dst_refs: Vec<&Tensor> = dst.iter().collect();
    if let Some(s) = shared_targets(&dst_refs) {
        let (a, b) = (s.first, s.second);
        return Err(Error::buffer(if a == b {
            format!("the destination of box copy {a} {}", s.more_than_once())
        } else {
            format!(
                "the destinations of box copies {a} and {b} {}: they would race",
                s.share_memory()
            )
        }));
    }
    let src: Vec<Tensor> = jobs
        .iter()
        .map(|j| j.src.view(&j.src_start, &j.shape))
        .collect::<Result<_>>()?;
    let src_refs: Vec<&Tensor> = src.iter().collect();
    for (i, shared) in sources_sharing(&src_refs, &dst_refs)
        .into_iter()
        .enumerate()
    {
        if !shared {
            continue;
        }
        // Sharing with its own destination is fine: the backends handle a box that reads
        // what it writes.
        let others: Vec<&Tensor> = (0..dst.len())
            .filter(|&k| k != i)
            .map(|k| &dst[k])
            .collect();
        if sources_sharing(&[&src[i]], &others)[0] {
            return Err(Error::buffer(format!(
                "box copy {i} reads memory another box copy writes: they would race"
            )));
        }
    }
    Ok(())
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::dtype::DType;

    /// The indices of a proven sharing, `None` for none (and a panic for an unproven one).
    fn pair(s: Option<Shared>) -> Option<(usize, usize)> {
        s.map(|s| {
            assert!(s.proven, "{s:?} is proven");
            (s.first, s.second)
        })
    }

    fn grid(rows: usize, cols: usize) -> Tensor {
        Tensor::zeros(&[rows, cols], DType::Float32).unwrap()
    }

    /// A view of `a`'s memory (a contiguous tensor) with any shape and strides (in elements,
    /// of either sign) from element `offset`.
    pub(crate) fn strided(a: &Tensor, shape: &[usize], strides: &[isize], offset: isize) -> Tensor {
        assert!(a.is_contiguous(), "a view of a contiguous buffer");
        let item = a.dtype().itemsize() as isize;
        // The lowest and highest element the view reaches, in elements from `a`'s first.
        let (low, high) =
            shape
                .iter()
                .zip(strides)
                .fold((offset, offset), |(low, high), (&n, &s)| {
                    match (n as isize - 1) * s {
                        _ if n == 0 => (low, high),
                        d if d < 0 => (low + d, high),
                        d => (low, high + d),
                    }
                });
        assert!(
            shape.contains(&0) || (low >= 0 && high < a.numel() as isize),
            "inside the buffer"
        );
        // SAFETY: every element of the view lies inside `a`'s contiguous buffer (asserted just
        // above), which `a`'s owner keeps alive; the view is read-only.
        unsafe {
            Tensor::from_raw_parts(
                a.data_ptr().wrapping_offset(offset * item),
                shape.to_vec(),
                strides.to_vec(),
                a.dtype(),
                a.device(),
                true,
                a.owner().clone(),
            )
        }
    }

    #[test]
    fn blocks_of_one_array_are_disjoint_and_overlaps_are_found() {
        let a = grid(6, 8);
        let blocks: Vec<Tensor> = [(0, 0), (0, 4), (3, 0), (3, 4)]
            .iter()
            .map(|&(r, c)| a.view(&[r, c], &[3, 4]).unwrap())
            .collect();
        let refs: Vec<&Tensor> = blocks.iter().collect();
        assert_eq!(
            pair(shared_targets(&refs)),
            None,
            "interleaved rows, no common element"
        );
        let shifted = a.view(&[2, 3], &[2, 2]).unwrap(); // meets blocks 0, 1 and 3's rows
        let mut with = refs.clone();
        with.push(&shifted);
        assert!(shared_targets(&with).is_some());
        let other = grid(6, 8);
        let whole = a.view(&[0, 0], &[6, 8]).unwrap();
        assert_eq!(
            sources_sharing(&[&other, &whole, &blocks[2]], &refs),
            vec![false, true, true]
        );
    }

    #[test]
    fn axes_that_continue_one_another_are_merged_into_fewer_runs() {
        assert_eq!(merged_dims(&[4, 6], &[6, 1]), (0, vec![(24, 1)]));
        assert_eq!(
            merged_dims(&[2, 1, 3, 5], &[15, 99, 5, 1]),
            (0, vec![(30, 1)])
        );
        // A column block: rows stay apart; its rows' two axes merge.
        assert_eq!(
            merged_dims(&[4, 2, 3], &[12, 3, 1]),
            (0, vec![(4, 12), (6, 1)])
        );
        // A transposed (Fortran-order) view covers a contiguous range, as does a reversed
        // one from its last element; a repeating view keeps its axes.
        assert_eq!(merged_dims(&[3, 4], &[1, 3]), (0, vec![(12, 1)]));
        assert_eq!(merged_dims(&[3, 4], &[-4, -1]), (-11, vec![(12, 1)]));
        assert_eq!(merged_dims(&[3, 2], &[0, 1]), (0, vec![(2, 1), (3, 0)]));
        assert_eq!(merged_dims(&[1, 1], &[7, 3]), (0, vec![]));

        let a = grid(64, 32);
        let count = |t: &Tensor| {
            let mut out = Vec::new();
            assert!(runs_of(t, 0, &mut out, MAX_RUNS));
            out.len()
        };
        assert_eq!(count(&a), 1, "a contiguous tensor is one run");
        assert_eq!(count(&a.view(&[8, 0], &[40, 32]).unwrap()), 1);
        assert_eq!(count(&a.view(&[0, 8], &[40, 16]).unwrap()), 40);
        let cube = strided(&a, &[4, 8, 32], &[256, 32, 1], 0);
        assert_eq!(count(&cube), 1);
        // A Fortran-order row block: one run per column, not one per element.
        let fortran = strided(&a, &[16, 128], &[1, 16], 0);
        assert_eq!(count(&fortran.view(&[0, 0], &[8, 128]).unwrap()), 128);
    }

    #[test]
    fn strided_views_and_zero_strides() {
        let a = grid(4, 8);
        // Every other column: runs of one element, disjoint from the odd columns.
        let even = strided(&a, &[4, 4], &[8, 2], 0);
        let odd = strided(&a, &[4, 4], &[8, 2], 1);
        assert_eq!(pair(shared_targets(&[&even, &odd])), None);
        let again = strided(&a, &[2, 2], &[8, 2], 2);
        assert_eq!(pair(shared_targets(&[&even, &again])), Some((0, 1)));
        // A zero stride repeats elements: a target covering one element twice.
        let repeated = strided(&a, &[3, 2], &[0, 1], 0);
        assert_eq!(pair(shared_targets(&[&repeated])), Some((0, 0)));
    }

    #[test]
    fn tensors_with_too_many_runs_are_refused_as_possibly_shared() {
        // Past MAX_RUNS runs, a tensor is judged by its span and its strides.
        let n = MAX_RUNS + 1;
        let a = Tensor::zeros(&[2 * n + 2], DType::UInt8).unwrap();
        let repeated = strided(&a, &[n, 2], &[0, 1], 0);
        let found = covers_an_element_twice(&repeated).expect("a zero stride repeats");
        assert!(found.proven, "a zero stride is proven to repeat elements");
        assert!(found.more_than_once().starts_with("refers to"));
        // Strides that interleave (1 and 2 over two axes of extent > 2): possibly repeated.
        let interleaved = strided(&a, &[n, 3], &[2, 1], 0);
        let found = covers_an_element_twice(&interleaved).expect("interleaving strides");
        assert!(!found.proven);
        assert!(found.more_than_once().starts_with("may refer"), "{found:?}");
        // Even and odd elements share nothing, but too many runs to tell: refused, unproven.
        let (even, odd) = (strided(&a, &[n], &[2], 0), strided(&a, &[n], &[2], 1));
        assert_eq!(covers_an_element_twice(&even), None, "a stride of 2 nests");
        let found = shared_targets(&[&even, &odd]).expect("spans that meet");
        assert_eq!((found.first, found.second, found.proven), (0, 1, false));
        assert!(found.share_memory().starts_with("may share"), "{found:?}");
        // Spans apart are still told apart.
        let upper = strided(&a, &[2], &[1], 2 * n as isize);
        assert_eq!(shared_targets(&[&even, &upper]), None);
    }

    /// A 2x2 box copy from `src` at `s` to `dst` at `d`.
    fn job<'a>(src: &'a Tensor, s: [usize; 2], dst: &'a Tensor, d: [usize; 2]) -> BoxCopy<'a> {
        BoxCopy {
            src,
            src_start: s.to_vec(),
            dst,
            dst_start: d.to_vec(),
            shape: vec![2, 2],
        }
    }

    #[test]
    fn an_element_covered_twice_is_found_whatever_the_strides() {
        let a = grid(16, 16);
        let mut seed = 7u64;
        let mut below = |n: u64| {
            seed = seed
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((seed >> 33) % n) as usize
        };
        for case in 0..2000 {
            let nd = 1 + below(3);
            let shape: Vec<usize> = (0..nd).map(|_| 1 + below(4)).collect();
            let strides: Vec<isize> = (0..nd).map(|_| below(7) as isize).collect();
            let t = strided(&a, &shape, &strides, 0);
            // Every element's offset, listed: the reference.
            let mut offsets = offsets(0, &shape, &strides);
            let count = offsets.len();
            offsets.dedup();
            assert_eq!(
                covers_an_element_twice(&t).is_some(),
                offsets.len() < count,
                "case {case}: shape {shape:?} strides {strides:?}"
            );
        }
    }

    /// Every element's offset of a view with `shape` and `strides` from `start`, sorted.
    pub(crate) fn offsets(start: isize, shape: &[usize], strides: &[isize]) -> Vec<isize> {
        let mut all = vec![start];
        for (&n, &s) in shape.iter().zip(strides) {
            all = all
                .iter()
                .flat_map(|&o| (0..n as isize).map(move |i| o + i * s))
                .collect();
        }
        all.sort_unstable();
        all
    }

    #[test]
    fn sharing_is_found_exactly_whatever_the_strides() {
        let a = grid(16, 16);
        let mut rng = crate::test_rng::Rng(11);
        for case in 0..3000 {
            let view = |rng: &mut crate::test_rng::Rng| {
                let nd = 1 + rng.below(3);
                let shape: Vec<usize> = (0..nd).map(|_| 1 + rng.below(4)).collect();
                // Strides that often continue one another, so that axes merge.
                let strides: Vec<isize> = (0..nd).map(|_| rng.below(9) as isize).collect();
                let start = rng.below(40) as isize;
                (start, shape, strides)
            };
            let (x, y) = (view(&mut rng), view(&mut rng));
            let (tx, ty) = (strided(&a, &x.1, &x.2, x.0), strided(&a, &y.1, &y.2, y.0));
            let (ox, oy) = (offsets(x.0, &x.1, &x.2), offsets(y.0, &y.1, &y.2));
            let twice = |o: &[isize]| o.windows(2).any(|w| w[0] == w[1]);
            let common = ox.iter().any(|o| oy.binary_search(o).is_ok());
            let what = format!("case {case}: {x:?} and {y:?}");
            assert_eq!(
                shared_targets(&[&tx, &ty]).is_some(),
                common || twice(&ox) || twice(&oy),
                "{what}"
            );
            if !twice(&oy) {
                assert_eq!(sources_sharing(&[&tx], &[&ty]), vec![common], "{what}");
            }
        }
    }

    #[test]
    fn interleaved_views_share_no_memory_though_their_spans_meet() {
        let (a, b) = (grid(4, 8), grid(4, 8));
        let even = strided(&a, &[4, 4], &[8, 2], 0);
        let odd = strided(&a, &[4, 4], &[8, 2], 1);
        assert!(!shares_memory(&even, &odd) && !shares_memory(&odd, &even));
        assert!(shares_memory(&even, &strided(&a, &[1, 1], &[8, 1], 30)));
        assert!(!shares_memory(&even, &strided(&b, &[4, 4], &[8, 2], 0)));
        assert!(!shares_memory(&even, &strided(&a, &[0, 4], &[8, 2], 0)));
    }

    #[test]
    fn box_copies_that_would_race_are_refused() {
        let (a, b) = (grid(4, 4), grid(4, 4));
        // the last one reads what it writes: fine
        let ok = [
            job(&a, [0, 0], &b, [0, 0]),
            job(&a, [2, 2], &b, [2, 2]),
            job(&a, [0, 2], &a, [0, 2]),
        ];
        assert!(check_jobs(&ok).is_ok());
        let twice = [job(&a, [0, 0], &b, [0, 0]), job(&a, [2, 2], &b, [1, 1])];
        let e = check_jobs(&twice).unwrap_err().to_string();
        assert!(e.contains("box copies 0 and 1 share memory"), "{e}");
        let crossed = [job(&a, [0, 0], &b, [0, 0]), job(&b, [1, 1], &a, [2, 2])];
        let e = check_jobs(&crossed).unwrap_err().to_string();
        assert!(e.contains("reads memory another"), "{e}");
    }
}
