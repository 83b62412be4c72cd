//! `Grid`: a global shape cut into a rectilinear grid of boxes, and the invariants that every
//! partitioned array obeys.
//!
//! # Invariants
//!
//! Numbered here once; every check cites its number through the constants in [`inv`], which
//! end up in [`Error::Protocol`]'s `invariant` field and in its message.
//!
//! 1. **ndim** — `shape`, `partition_tiling`, and every position, `start` and `shape` of a
//!    partition (and every position in `locals`) have the same number of axes.
//! 2. **positions** — every entry of `partition_tiling` is at least 1, and `partitions` holds
//!    each position of the tiling exactly once and no other position.
//! 3. **extents** — the global shape, every `start` and every partition `shape` are
//!    non-negative, and `start + shape` does not overflow.
//! 4. **rectilinear** — along each axis, the partitions at the same index along that axis (a
//!    slab) share one start and one length: the grid's split points.
//! 5. **cover** — along each axis the slabs tile `[0, shape[axis])` in order: the first starts
//!    at 0, each starts where the previous one ends, the last ends at `shape[axis]`. With 4, the
//!    partitions cover the global shape exactly once (no gap, no overlap).
//! 6. **dtype** — every partition that holds data has the same dtype.
//! 7. **tensor shape** — a partition's data has exactly the shape of its entry.
//! 8. **location** — every location is well formed, and its device string names a DLPack
//!    device (`kDLCPU`, `kDLCUDA:0`, ...).
//! 9. **device** — a partition that holds data and lists locations has its data on a device
//!    that one of those locations names (or on the device the data's producer reports for it
//!    through `__dlpack_device__`, where that differs from the device of its DLPack capsule).
//! 10. **locals** — `locals` names positions of the grid, each at most once.
//!
//! Invariants 1–5 are checked here ([`Grid::from_entries`]); 6–10 by
//! [`crate::partitioned::PartitionedArray::new`] and [`crate::partitioned::Location`].
//!
//! **Empty partitions** are allowed on every axis (split points are non-decreasing, not strictly
//! increasing): `numpy.array_split` of 3 elements into 5 parts, heat with more ranks than rows,
//! and dask chunks of length 0 all produce them, and the planner simply emits no copy for them.
//! A `partition_tiling` entry is still at least 1, even on an axis of length 0.

use std::fmt;

use crate::error::{tuple_string, Error, Result};

pub(crate) mod validate;

/// The invariant numbers of the module documentation.
pub mod inv {
    /// 1: one number of axes everywhere.
    pub const NDIM: u8 = 1;
    /// 2: each position of the tiling exactly once.
    pub const POSITIONS: u8 = 2;
    /// 3: non-negative extents that do not overflow.
    pub const EXTENTS: u8 = 3;
    /// 4: one start and length per slab.
    pub const RECTILINEAR: u8 = 4;
    /// 5: the slabs tile each axis in order.
    pub const COVER: u8 = 5;
    /// 6: one dtype for all data.
    pub const DTYPE: u8 = 6;
    /// 7: data of exactly the entry's shape.
    pub const TENSOR_SHAPE: u8 = 7;
    /// 8: well-formed locations naming DLPack devices.
    pub const LOCATION: u8 = 8;
    /// 9: data on a device its locations name.
    pub const DEVICE: u8 = 9;
    /// 10: `locals` names grid positions, each once.
    pub const LOCALS: u8 = 10;
}

/// One `__partitioned__` entry as read from a dict: `(position, start, shape)`. Signed, so that
/// negative values reach the validator and are reported with their invariant.
pub type Entry = (Vec<i64>, Vec<i64>, Vec<i64>);

/// `__partitioned__` entries in one flat table: every entry's position, start and shape, each
/// of any length (the validator checks them). Reading a dict of 4,096 entries into it takes a
/// few allocations in all, where [`Entry`] takes three per entry.
#[derive(Clone, Debug, Default)]
pub struct EntryTable {
    values: Vec<i64>,
    /// Per entry, where its position, start and shape end in `values`.
    ends: Vec<[usize; 3]>,
}

impl EntryTable {
    /// An empty table with room for `entries` entries of `ndim` axes.
    pub fn with_capacity(entries: usize, ndim: usize) -> Self {
        EntryTable {
            values: Vec::with_capacity(entries.saturating_mul(3).saturating_mul(ndim)),
            ends: Vec::with_capacity(entries),
        }
    }

    /// Appends one entry.
    pub fn push(&mut self, position: &[i64], start: &[i64], shape: &[i64]) {
        let mut ends = [0; 3];
        for (end, list) in ends.iter_mut().zip([position, start, shape]) {
            self.values.extend_from_slice(list);
            *end = self.values.len();
        }
        self.ends.push(ends);
    }

    /// The number of entries.
    pub fn len(&self) -> usize {
        self.ends.len()
    }

    /// Whether there are no entries.
    pub fn is_empty(&self) -> bool {
        self.ends.is_empty()
    }

    /// Entry `k`: `(position, start, shape)`. Panics when `k >= len()`.
    pub fn get(&self, k: usize) -> (&[i64], &[i64], &[i64]) {
        let begin = if k == 0 { 0 } else { self.ends[k - 1][2] };
        let [p, s, n] = self.ends[k];
        (
            &self.values[begin..p],
            &self.values[p..s],
            &self.values[s..n],
        )
    }
}

/// A box of the global index space: `start .. start + shape` along each axis.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Region {
    /// The global index of the box's first element, per axis.
    pub start: Vec<usize>,
    /// The box's extent per axis (0 allowed: an empty box).
    pub shape: Vec<usize>,
}

impl Region {
    /// The number of axes.
    pub fn ndim(&self) -> usize {
        self.shape.len()
    }

    /// One past the last index along each axis.
    ///
    /// # Panics
    /// When an end does not fit in `usize` (a box no grid makes: the fields are public).
    pub fn end(&self) -> Vec<usize> {
        self.start
            .iter()
            .zip(&self.shape)
            .map(|(s, n)| {
                s.checked_add(*n)
                    .unwrap_or_else(|| panic!("a region ending past usize::MAX: {self:?}"))
            })
            .collect()
    }

    /// The number of elements in the box.
    pub fn numel(&self) -> usize {
        self.shape.iter().product()
    }

    /// Whether the box has no elements (some extent is 0).
    pub fn is_empty(&self) -> bool {
        self.shape.contains(&0)
    }

    /// Whether the global `index` lies inside this box.
    pub fn contains(&self, index: &[usize]) -> bool {
        index.len() == self.ndim()
            && (0..self.ndim())
                .all(|a| index[a] >= self.start[a] && index[a] - self.start[a] < self.shape[a])
    }

    /// The common part of two boxes, or `None` when it has no elements.
    ///
    /// # Panics
    /// When the boxes have different numbers of axes, or one ends past `usize::MAX`.
    pub fn intersect(&self, other: &Region) -> Option<Region> {
        assert_eq!(
            self.ndim(),
            other.ndim(),
            "intersecting a {}-d region with a {}-d one",
            self.ndim(),
            other.ndim()
        );
        let (self_end, other_end) = (self.end(), other.end());
        let mut start = Vec::with_capacity(self.ndim());
        let mut shape = Vec::with_capacity(self.ndim());
        for a in 0..self.ndim() {
            let lo = self.start[a].max(other.start[a]);
            let hi = self_end[a].min(other_end[a]);
            if hi <= lo {
                return None;
            }
            start.push(lo);
            shape.push(hi - lo);
        }
        Some(Region { start, shape })
    }
}

impl fmt::Display for Region {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "Region(start={}, shape={})",
            tuple_string(&self.start),
            tuple_string(&self.shape)
        )
    }
}

/// A global shape and, per axis, the split points `0 = b0 <= b1 <= ... <= bk = shape[axis]`
/// that cut it into `k` slabs; partition `(i, j, ...)` is the box of slab `i` of axis 0, slab
/// `j` of axis 1, and so on. Partitions are numbered in C order of their positions.
///
/// The fields are private so that every `Grid` satisfies invariants 1–5.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Grid {
    shape: Vec<usize>,
    splits: Vec<Vec<usize>>,
}

/// An argument error for the constructors that take user layouts (not `__partitioned__` dicts).
fn arg_error(invariant: u8, what: impl fmt::Display, found: impl Into<String>) -> Error {
    Error::shape(format!("{what} (grid invariant {invariant})"), found)
}

/// Product of `dims`, or `None` on overflow.
fn checked_product(dims: &[usize]) -> Option<usize> {
    dims.iter().try_fold(1usize, |acc, &n| acc.checked_mul(n))
}

/// The most partitions a grid may have: beyond it a layout is a mistake, reported as one
/// rather than as a failed allocation.
pub const MAX_PARTITIONS: usize = 1 << 28;

pub(crate) fn check_count(tiling: &[usize]) -> Result<()> {
    match checked_product(tiling) {
        Some(n) if n <= MAX_PARTITIONS => Ok(()),
        _ => Err(arg_error(
            inv::POSITIONS,
            format!("too many partitions (at most {MAX_PARTITIONS})"),
            tuple_string(tiling),
        )),
    }
}

/// Host bytes one partition costs, rounded up, in the structures built for it: its tensor
/// (or view) and data slot, its target device, its share of a plan, and the Python objects
/// that wrap it.
const PARTITION_BYTES: usize = 512;

/// Grids of fewer partitions than this are not checked by [`check_room`]: their structures
/// are small next to what any process has.
const ROOM_CHECKED_FROM: usize = 1 << 16;

/// Refuses, as [`Error::OutOfMemory`], a grid of `n` partitions whose per-partition
/// structures the host cannot hold. Those are many small allocations (and a few of `n`
/// entries), any of which would abort the process when memory runs out half-way through
/// building them; asked for here first as one fallible allocation, given back at once, a grid
/// of 2^28 partitions over a small array is an error instead.
pub(crate) fn check_room(n: usize) -> Result<()> {
    if n < ROOM_CHECKED_FROM {
        return Ok(());
    }
    let bytes = n.saturating_mul(PARTITION_BYTES);
    let mut probe: Vec<u8> = Vec::new();
    probe
        .try_reserve_exact(bytes)
        .map_err(|_| Error::host_oom(bytes, format!("the structures of {n} partitions")))
}

/// `a == b` for a partition's shape, inline: the slice comparison calls `memcmp`, which for a
/// few axes costs more than the comparison (7% of a profile of small_grid/1MiB, whose
/// checks compare 12,288 shapes a call).
#[inline]
pub(crate) fn same_shape(a: &[usize], b: &[usize]) -> bool {
    a.len() == b.len() && a.iter().zip(b).all(|(x, y)| x == y)
}

/// Advances `pos` to the next position in C order within `tiling`; `false` after the last one.
pub(crate) fn next_position(pos: &mut [usize], tiling: &[usize]) -> bool {
    for a in (0..pos.len()).rev() {
        pos[a] += 1;
        if pos[a] < tiling[a] {
            return true;
        }
        pos[a] = 0;
    }
    false
}

impl Grid {
    /// Cuts each axis into `tiling[axis]` slabs exactly like `numpy.array_split`: the first
    /// `len % n` slabs get one element more than the others.
    pub fn even(shape: &[usize], tiling: &[usize]) -> Result<Grid> {
        if shape.len() != tiling.len() {
            return Err(arg_error(
                inv::NDIM,
                format!(
                    "tiling for a {}-d shape {}",
                    shape.len(),
                    tuple_string(shape)
                ),
                tuple_string(tiling),
            ));
        }
        check_count(tiling)?;
        let splits = shape
            .iter()
            .zip(tiling)
            .map(|(&len, &n)| {
                if n == 0 {
                    return Err(arg_error(
                        inv::POSITIONS,
                        "every tiling entry must be >= 1",
                        tuple_string(tiling),
                    ));
                }
                let (q, r) = (len / n, len % n);
                Ok((0..=n).map(|k| k * q + k.min(r)).collect())
            })
            .collect::<Result<Vec<Vec<usize>>>>()?;
        Grid::checked(shape.to_vec(), splits)
    }

    /// A grid from explicit split points per axis (`splits[axis]` starts at 0, ends at
    /// `shape[axis]` and never decreases).
    pub fn from_splits(shape: &[usize], splits: Vec<Vec<usize>>) -> Result<Grid> {
        if splits.len() != shape.len() {
            return Err(arg_error(
                inv::NDIM,
                format!(
                    "split points for a {}-d shape {}",
                    shape.len(),
                    tuple_string(shape)
                ),
                format!("{} axes of split points", splits.len()),
            ));
        }
        for (a, (s, &len)) in splits.iter().zip(shape).enumerate() {
            if s.len() < 2 {
                return Err(arg_error(
                    inv::POSITIONS,
                    format!("split points of axis {a} need at least [0, {len}]"),
                    tuple_string(s),
                ));
            }
            if s[0] != 0 || s[s.len() - 1] != len || s.windows(2).any(|w| w[1] < w[0]) {
                return Err(arg_error(
                    inv::COVER,
                    format!(
                        "split points of axis {a} must rise from 0 to {len} without decreasing"
                    ),
                    tuple_string(s),
                ));
            }
        }
        Grid::checked(shape.to_vec(), splits)
    }

    /// Validates the entries of a `__partitioned__` dict (invariants 1–5) and returns their
    /// grid. Entries may come in any order. Every violation is reported, as one
    /// [`Error::Protocol`] or an [`Error::ProtocolMany`] of them.
    pub fn from_entries(shape: &[i64], tiling: &[i64], entries: &[Entry]) -> Result<Grid> {
        validate::grid_from_entries(shape, tiling, entries.len(), |k| {
            let (p, s, n) = &entries[k];
            (p, s, n)
        })
    }

    /// [`Grid::from_entries`] for entries held in an [`EntryTable`].
    pub fn from_table(shape: &[i64], tiling: &[i64], entries: &EntryTable) -> Result<Grid> {
        validate::grid_from_entries(shape, tiling, entries.len(), |k| entries.get(k))
    }

    /// Final check shared by the constructors.
    fn checked(shape: Vec<usize>, splits: Vec<Vec<usize>>) -> Result<Grid> {
        check_count(&splits.iter().map(|s| s.len() - 1).collect::<Vec<_>>())?;
        Ok(Grid::new_unchecked(shape, splits))
    }

    /// A grid whose invariants the caller has established.
    pub(crate) fn new_unchecked(shape: Vec<usize>, splits: Vec<Vec<usize>>) -> Grid {
        debug_assert_eq!(shape.len(), splits.len());
        Grid { shape, splits }
    }

    /// The number of axes.
    pub fn ndim(&self) -> usize {
        self.shape.len()
    }

    /// The global shape.
    pub fn shape(&self) -> &[usize] {
        &self.shape
    }

    /// The split points of every axis.
    pub fn splits(&self) -> &[Vec<usize>] {
        &self.splits
    }

    /// The number of partitions along each axis (`partition_tiling`).
    pub fn tiling(&self) -> Vec<usize> {
        self.splits.iter().map(|s| s.len() - 1).collect()
    }

    /// The number of partitions (empty ones included).
    pub fn num_partitions(&self) -> usize {
        self.splits.iter().map(|s| s.len() - 1).product()
    }

    /// The C-order number of `position`.
    pub fn flat_index(&self, position: &[usize]) -> Result<usize> {
        if position.len() != self.ndim() {
            return Err(Error::shape(
                format!("position in a {}-d grid", self.ndim()),
                tuple_string(position),
            ));
        }
        let mut flat = 0;
        for (a, (&p, s)) in position.iter().zip(&self.splits).enumerate() {
            let n = s.len() - 1;
            if p >= n {
                return Err(Error::IndexOutOfRange {
                    index: p as i128,
                    axis: a,
                    len: n,
                });
            }
            flat = flat * n + p;
        }
        Ok(flat)
    }

    /// The position numbered `flat` in C order. Panics when `flat >= num_partitions()`.
    pub fn position(&self, mut flat: usize) -> Vec<usize> {
        assert!(
            flat < self.num_partitions(),
            "partition {flat} of a grid with {} partitions",
            self.num_partitions()
        );
        let mut pos = vec![0; self.ndim()];
        for a in (0..self.ndim()).rev() {
            let n = self.splits[a].len() - 1;
            pos[a] = flat % n;
            flat /= n;
        }
        pos
    }

    /// The box of the partition at `position`.
    pub fn region(&self, position: &[usize]) -> Result<Region> {
        self.flat_index(position)?;
        Ok(self.region_unchecked(position))
    }

    /// The box of partition number `flat` (C order). Panics when out of range.
    pub fn region_at(&self, flat: usize) -> Region {
        self.region_unchecked(&self.position(flat))
    }

    fn region_unchecked(&self, position: &[usize]) -> Region {
        let (start, shape) = position
            .iter()
            .zip(&self.splits)
            .map(|(&p, s)| (s[p], s[p + 1] - s[p]))
            .unzip();
        Region { start, shape }
    }

    /// Calls `f(flat, start, shape)` for every partition in C order, reusing two buffers:
    /// checks over thousands of partitions allocate nothing per partition.
    pub(crate) fn for_each_region(&self, mut f: impl FnMut(usize, &[usize], &[usize])) {
        let n = self.num_partitions();
        if n == 0 {
            return;
        }
        let tiling = self.tiling();
        let mut pos = vec![0; self.ndim()];
        let mut start: Vec<usize> = self.splits.iter().map(|s| s[0]).collect();
        let mut shape: Vec<usize> = self.splits.iter().map(|s| s[1] - s[0]).collect();
        for flat in 0..n {
            f(flat, &start, &shape);
            // Advance in C order, refreshing only the axes whose slab changed.
            for a in (0..pos.len()).rev() {
                pos[a] = if pos[a] + 1 < tiling[a] {
                    pos[a] + 1
                } else {
                    0
                };
                let s = &self.splits[a];
                start[a] = s[pos[a]];
                shape[a] = s[pos[a] + 1] - s[pos[a]];
                if pos[a] != 0 {
                    break;
                }
            }
        }
    }

    /// Every position in C order.
    pub fn positions(&self) -> Positions {
        Positions {
            tiling: self.tiling(),
            next: Some(vec![0; self.ndim()]).filter(|_| self.num_partitions() > 0),
            remaining: self.num_partitions(),
        }
    }

    /// The slab of `axis` that holds global index `i` (the non-empty one, when empty slabs
    /// share its start), or `None` when `i >= shape[axis]`. Panics when `axis >= ndim`.
    pub fn locate_axis(&self, axis: usize, i: usize) -> Option<usize> {
        if i >= self.shape[axis] {
            return None;
        }
        // Last split point <= i: the slab after it is the one non-empty slab containing i.
        Some(self.splits[axis].partition_point(|&b| b <= i) - 1)
    }

    /// The position of the partition holding the global element `index`.
    pub fn locate(&self, index: &[usize]) -> Result<Vec<usize>> {
        if index.len() != self.ndim() {
            return Err(Error::shape(
                format!("index into a {}-d array", self.ndim()),
                tuple_string(index),
            ));
        }
        (0..self.ndim())
            .map(|a| {
                self.locate_axis(a, index[a]).ok_or(Error::IndexOutOfRange {
                    index: index[a] as i128,
                    axis: a,
                    len: self.shape[a],
                })
            })
            .collect()
    }
}

impl fmt::Display for Grid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "Grid(shape={}, tiling={})",
            tuple_string(&self.shape),
            tuple_string(&self.tiling())
        )
    }
}

/// Iterator over the positions of a grid in C order.
pub struct Positions {
    tiling: Vec<usize>,
    next: Option<Vec<usize>>,
    remaining: usize,
}

impl Iterator for Positions {
    type Item = Vec<usize>;

    fn next(&mut self) -> Option<Vec<usize>> {
        let cur = self.next.take()?;
        let mut following = cur.clone();
        if next_position(&mut following, &self.tiling) {
            self.next = Some(following);
        }
        self.remaining -= 1;
        Some(cur)
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        (self.remaining, Some(self.remaining))
    }
}

impl ExactSizeIterator for Positions {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_grid_whose_partitions_the_host_cannot_hold_is_out_of_memory() {
        assert!(check_room(ROOM_CHECKED_FROM).is_ok());
        // Past the address space: refused without any allocation.
        let e = check_room(usize::MAX / 2).unwrap_err();
        assert!(
            matches!(
                e,
                Error::OutOfMemory {
                    bytes: usize::MAX,
                    ..
                }
            ),
            "{e}"
        );
    }

    /// Section sizes that `numpy.array_split(np.arange(len), n)` returns, taken from numpy.
    #[test]
    fn for_each_region_walks_every_region_in_c_order() {
        for grid in [
            Grid::from_splits(
                &[7, 5, 3],
                vec![vec![0, 2, 2, 7], vec![0, 5], vec![0, 1, 2, 3]],
            )
            .unwrap(),
            Grid::even(&[], &[]).unwrap(),
            Grid::even(&[0, 4], &[2, 2]).unwrap(),
        ] {
            let mut seen = Vec::new();
            grid.for_each_region(|i, start, shape| seen.push((i, start.to_vec(), shape.to_vec())));
            let expect: Vec<_> = (0..grid.num_partitions())
                .map(|i| {
                    let r = grid.region_at(i);
                    (i, r.start, r.shape)
                })
                .collect();
            assert_eq!(seen, expect, "{grid}");
        }
    }

    #[test]
    fn even_matches_numpy_array_split() {
        let cases: [(usize, usize, &[usize]); 6] = [
            (10, 4, &[3, 3, 2, 2]),
            (3, 5, &[1, 1, 1, 0, 0]),
            (0, 3, &[0, 0, 0]),
            (7, 7, &[1; 7]),
            (17, 5, &[4, 4, 3, 3, 3]),
            (1, 2, &[1, 0]),
        ];
        for (len, n, sizes) in cases {
            let g = Grid::even(&[len], &[n]).unwrap();
            let got: Vec<usize> = g.splits()[0].windows(2).map(|w| w[1] - w[0]).collect();
            assert_eq!(got, sizes, "array_split({len}, {n})");
        }
        // numpy: array_split(arange(8192), 255) has 32 sections of 33, then 32s.
        let g = Grid::even(&[8192, 8192], &[255, 257]).unwrap();
        let sizes: Vec<usize> = g.splits()[0].windows(2).map(|w| w[1] - w[0]).collect();
        assert_eq!(sizes.iter().filter(|&&s| s == 33).count(), 32);
        assert_eq!(sizes.iter().filter(|&&s| s == 32).count(), 223);
        let sizes: Vec<usize> = g.splits()[1].windows(2).map(|w| w[1] - w[0]).collect();
        assert_eq!((sizes[0], sizes[224], sizes[225]), (32, 32, 31));
    }

    #[test]
    fn constructors_refuse_bad_layouts_citing_the_invariant() {
        let e = Grid::even(&[4, 4], &[2]).unwrap_err().to_string();
        assert!(e.contains("invariant 1") && e.contains("(2,)"), "{e}");
        let e = Grid::even(&[4], &[0]).unwrap_err().to_string();
        assert!(e.contains("invariant 2") && e.contains("(0,)"), "{e}");
        let e = Grid::from_splits(&[4], vec![vec![0, 3, 2, 4]])
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("invariant 5") && e.contains("(0, 3, 2, 4)"),
            "{e}"
        );
        let e = Grid::from_splits(&[4], vec![vec![0, 3]])
            .unwrap_err()
            .to_string();
        assert!(e.contains("invariant 5") && e.contains("(0, 3)"), "{e}");
        let e = Grid::from_splits(&[4], vec![vec![4]])
            .unwrap_err()
            .to_string();
        assert!(e.contains("invariant 2"), "{e}");
        let e = Grid::even(&[1, 1, 1], &[usize::MAX, 2, 1])
            .unwrap_err()
            .to_string();
        assert!(e.contains("too many partitions"), "{e}");
    }

    #[test]
    fn positions_regions_and_flat_indices_agree() {
        let g = Grid::from_splits(&[5, 7], vec![vec![0, 2, 2, 5], vec![0, 4, 7]]).unwrap();
        assert_eq!(g.tiling(), vec![3, 2]);
        let all: Vec<Vec<usize>> = g.positions().collect();
        assert_eq!(
            all,
            vec![
                vec![0, 0],
                vec![0, 1],
                vec![1, 0],
                vec![1, 1],
                vec![2, 0],
                vec![2, 1]
            ]
        );
        for (k, p) in all.iter().enumerate() {
            assert_eq!(g.flat_index(p).unwrap(), k);
            assert_eq!(&g.position(k), p);
        }
        assert_eq!(
            g.region(&[2, 1]).unwrap(),
            Region {
                start: vec![2, 4],
                shape: vec![3, 3]
            }
        );
        assert!(g.region_at(2).is_empty());
        assert!(g.flat_index(&[3, 0]).is_err());
        // Index 2 of axis 0 is in slab 2: slab 1 is empty and shares its start.
        assert_eq!(g.locate(&[2, 3]).unwrap(), vec![2, 0]);
        assert_eq!(g.locate(&[1, 4]).unwrap(), vec![0, 1]);
        assert!(g.locate(&[5, 0]).is_err());
        let scalar = Grid::even(&[], &[]).unwrap();
        assert_eq!(
            scalar.positions().collect::<Vec<_>>(),
            vec![Vec::<usize>::new()]
        );
        assert_eq!(scalar.region_at(0).numel(), 1);
    }

    #[test]
    fn regions_intersect_like_interval_products() {
        let a = Region {
            start: vec![0, 2],
            shape: vec![4, 4],
        };
        let b = Region {
            start: vec![3, 0],
            shape: vec![5, 3],
        };
        assert_eq!(
            a.intersect(&b),
            Some(Region {
                start: vec![3, 2],
                shape: vec![1, 1]
            })
        );
        let c = Region {
            start: vec![4, 0],
            shape: vec![1, 9],
        };
        assert_eq!(a.intersect(&c), None);
        let flat = Region {
            start: vec![0],
            shape: vec![2],
        };
        let caught = std::panic::catch_unwind(|| a.intersect(&flat));
        assert!(caught.is_err(), "regions of different ndim intersected");
        let past = Region {
            start: vec![usize::MAX],
            shape: vec![2],
        };
        assert!(std::panic::catch_unwind(|| past.end()).is_err());
        assert!(a.contains(&[3, 5]) && !a.contains(&[3, 6]));
        assert_eq!(a.end(), vec![4, 6]);
    }
}
