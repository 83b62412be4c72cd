//! The repartition planner: (source grid, target grid) -> box copies, and target layouts.
//!
//! Along each axis a merged sweep of both split lists gives the pieces `(source slab, target
//! slab, lo, hi)` where slabs overlap; the copies are the cartesian product of the pieces of
//! all axes. A [`Plan`] stores only those per-axis pieces (about `src + dst` slabs per axis),
//! so planning costs `O(sum of tilings)` and no memory per copy; the copies are produced on
//! demand, all of them ([`Plan::ops`]) or those of one partition ([`Plan::ops_into`],
//! [`Plan::ops_from`]). Empty slabs get no pieces, so no copy ever has zero elements.

use std::collections::{BTreeMap, HashMap};

use crate::device::Device;
use crate::error::{tuple_string, Error, Result};
use crate::grid::Grid;
use crate::tensor::Tensor;

/// Where one source slab and one target slab overlap along an axis.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Piece {
    src: usize,
    /// Offset of the overlap inside the source slab.
    src_off: usize,
    dst: usize,
    dst_off: usize,
    len: usize,
}

/// One box copy: `shape` elements from partition `src` at `src_start`, relative to that
/// partition, to partition `dst` at `dst_start`. In the planner `src` and `dst` are flat C-order
/// partition indices (`BoxCopy<usize>`, the default); a backend receives the same copy with the
/// tensors themselves ([`crate::backend::BoxCopy`], `BoxCopy<&Tensor>`).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct BoxCopy<P = usize> {
    /// The source partition: its flat C-order index in the source grid, or its tensor.
    pub src: P,
    /// Where the box starts inside the source partition.
    pub src_start: Vec<usize>,
    /// The target partition: its flat C-order index in the target grid, or its tensor.
    pub dst: P,
    /// Where the box starts inside the target partition.
    pub dst_start: Vec<usize>,
    /// The box's extent per axis (never empty: the planner emits no empty copies).
    pub shape: Vec<usize>,
}

impl<P> BoxCopy<P> {
    /// The number of elements copied.
    pub fn numel(&self) -> usize {
        self.shape.iter().product()
    }
}

impl BoxCopy {
    /// The same copy between the tensors of the partitions it names, `src[self.src]` into
    /// `dst[self.dst]`, as a backend takes it; `None` when either list has no such partition.
    pub fn on<'a>(self, src: &[&'a Tensor], dst: &[&'a Tensor]) -> Option<BoxCopy<&'a Tensor>> {
        Some(BoxCopy {
            src: src.get(self.src).copied()?,
            src_start: self.src_start,
            dst: dst.get(self.dst).copied()?,
            dst_start: self.dst_start,
            shape: self.shape,
        })
    }
}

/// The copies that turn a partitioning over `src` into one over `dst`. Reusable: it holds both
/// grids and nothing about the data.
#[derive(Clone, Debug)]
pub struct Plan {
    src: Grid,
    dst: Grid,
    axes: Vec<Vec<Piece>>,
    /// Per axis: the pieces of source slab `i` are `axes[a][src_first[a][i]..src_first[a][i + 1]]`
    /// (the sweep visits slabs in order, so they are contiguous).
    src_first: Vec<Vec<usize>>,
    dst_first: Vec<Vec<usize>>,
    src_strides: Vec<usize>,
    dst_strides: Vec<usize>,
}

/// The overlaps of two split lists over the same length, in order.
fn sweep(s: &[usize], d: &[usize]) -> Vec<Piece> {
    let n = s[s.len() - 1];
    let mut out = Vec::with_capacity(s.len() + d.len());
    let (mut i, mut j, mut lo) = (0, 0, 0);
    while lo < n {
        // Skip slabs ending at or before `lo` (empty ones included); both lists end at n > lo.
        while s[i + 1] <= lo {
            i += 1;
        }
        while d[j + 1] <= lo {
            j += 1;
        }
        let hi = s[i + 1].min(d[j + 1]);
        out.push(Piece {
            src: i,
            src_off: lo - s[i],
            dst: j,
            dst_off: lo - d[j],
            len: hi - lo,
        });
        lo = hi;
    }
    out
}

/// Offsets of each slab's first piece (CSR), from pieces sorted by `slab`.
fn firsts(pieces: &[Piece], slabs: usize, slab: fn(&Piece) -> usize) -> Vec<usize> {
    let mut first = vec![0; slabs + 1];
    for p in pieces {
        first[slab(p) + 1] += 1;
    }
    for i in 0..slabs {
        first[i + 1] += first[i];
    }
    first
}

/// C-order strides of a tiling, in partitions.
pub(crate) fn strides(tiling: &[usize]) -> Vec<usize> {
    let mut s = vec![1; tiling.len()];
    for a in (0..tiling.len().saturating_sub(1)).rev() {
        s[a] = s[a + 1] * tiling[a + 1];
    }
    s
}

impl Plan {
    /// Plans the copies from `src` to `dst`, which must cover the same global shape.
    pub fn new(src: &Grid, dst: &Grid) -> Result<Plan> {
        if src.shape() != dst.shape() {
            return Err(Error::shape(
                "repartitioning needs grids over the same shape",
                format!(
                    "source {}, target {}",
                    tuple_string(src.shape()),
                    tuple_string(dst.shape())
                ),
            ));
        }
        let (st, dt) = (src.tiling(), dst.tiling());
        let axes: Vec<Vec<Piece>> = src
            .splits()
            .iter()
            .zip(dst.splits())
            .map(|(s, d)| sweep(s, d))
            .collect();
        let src_first = axes
            .iter()
            .zip(&st)
            .map(|(p, &n)| firsts(p, n, |p| p.src))
            .collect();
        let dst_first = axes
            .iter()
            .zip(&dt)
            .map(|(p, &n)| firsts(p, n, |p| p.dst))
            .collect();
        Ok(Plan {
            src: src.clone(),
            dst: dst.clone(),
            axes,
            src_first,
            dst_first,
            src_strides: strides(&st),
            dst_strides: strides(&dt),
        })
    }

    /// The grid the copies read from.
    pub fn src_grid(&self) -> &Grid {
        &self.src
    }

    /// The grid the copies write to.
    pub fn dst_grid(&self) -> &Grid {
        &self.dst
    }

    /// Whether source and target grids are the same: every copy moves a whole partition onto
    /// one of the same shape, so callers may reuse the source partitions instead.
    pub fn is_identity(&self) -> bool {
        self.src == self.dst
    }

    /// The number of copies.
    pub fn len(&self) -> usize {
        self.axes.iter().map(Vec::len).product()
    }

    /// Whether there is nothing to copy (the global shape has no elements).
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Bytes the copies read (and as many they write): every element exactly once.
    pub fn bytes(&self, itemsize: usize) -> u64 {
        self.src
            .shape()
            .iter()
            .fold(itemsize as u64, |acc, &n| acc.saturating_mul(n as u64))
    }

    /// Every copy, in C order of the per-axis pieces.
    pub fn ops(&self) -> Ops<'_> {
        let hi = self.axes.iter().map(Vec::len).collect();
        Ops::new(self, vec![0; self.axes.len()], hi)
    }

    /// The copies writing into target partition `dst` (flat index). Panics when out of range.
    pub fn ops_into(&self, dst: usize) -> Ops<'_> {
        let pos = self.dst.position(dst);
        self.ops_between(&self.dst_first, &pos)
    }

    /// The copies reading from source partition `src` (flat index). Panics when out of range.
    pub fn ops_from(&self, src: usize) -> Ops<'_> {
        let pos = self.src.position(src);
        self.ops_between(&self.src_first, &pos)
    }

    fn ops_between(&self, first: &[Vec<usize>], pos: &[usize]) -> Ops<'_> {
        let lo = pos.iter().zip(first).map(|(&i, f)| f[i]).collect();
        let hi = pos.iter().zip(first).map(|(&i, f)| f[i + 1]).collect();
        Ops::new(self, lo, hi)
    }

    fn op_at(&self, cur: &[usize]) -> BoxCopy {
        let nd = cur.len();
        let mut op = BoxCopy {
            src: 0,
            src_start: Vec::with_capacity(nd),
            dst: 0,
            dst_start: Vec::with_capacity(nd),
            shape: Vec::with_capacity(nd),
        };
        self.fill_op(cur, &mut op);
        op
    }

    /// Overwrites `op` with the copy at piece counter `cur`, reusing its vectors (which
    /// already have one entry per axis, or none yet).
    #[inline]
    fn fill_op(&self, cur: &[usize], op: &mut BoxCopy) {
        let nd = cur.len();
        if op.shape.len() != nd {
            op.src_start.resize(nd, 0);
            op.dst_start.resize(nd, 0);
            op.shape.resize(nd, 0);
        }
        let (mut src, mut dst) = (0, 0);
        for (a, &k) in cur.iter().enumerate() {
            let p = &self.axes[a][k];
            src += p.src * self.src_strides[a];
            dst += p.dst * self.dst_strides[a];
            op.src_start[a] = p.src_off;
            op.dst_start[a] = p.dst_off;
            op.shape[a] = p.len;
        }
        (op.src, op.dst) = (src, dst);
    }

    /// Bytes copied between each (source device, target device) pair. `src_dev(i)` and
    /// `dst_dev(j)` give the device of source partition `i` and target partition `j`; each is
    /// called once per partition.
    pub fn bytes_by_device_pair(
        &self,
        itemsize: usize,
        src_dev: &dyn Fn(usize) -> Device,
        dst_dev: &dyn Fn(usize) -> Device,
    ) -> BTreeMap<(Device, Device), u64> {
        let (src_ids, src_devs) = intern(self.src.num_partitions(), src_dev);
        let (dst_ids, dst_devs) = intern(self.dst.num_partitions(), dst_dev);
        let mut out = BTreeMap::new();
        if let ([s], [d]) = (src_devs.as_slice(), dst_devs.as_slice()) {
            // One device on each side, the common case: every byte goes between them, and
            // there is no need to walk thousands of copies.
            if !self.is_empty() {
                out.insert((*s, *d), self.bytes(itemsize));
            }
            return out;
        }
        let mut bytes = vec![0u64; src_devs.len() * dst_devs.len()];
        let nd = self.axes.len();
        let mut cur = vec![0usize; nd];
        for _ in 0..self.len() {
            let (mut s, mut d, mut n) = (0, 0, itemsize as u64);
            for (a, &k) in cur.iter().enumerate() {
                let p = &self.axes[a][k];
                s += p.src * self.src_strides[a];
                d += p.dst * self.dst_strides[a];
                n = n.saturating_mul(p.len as u64);
            }
            let cell = &mut bytes[src_ids[s] * dst_devs.len() + dst_ids[d]];
            *cell = cell.saturating_add(n);
            advance(&mut cur, &self.axes);
        }
        for (i, &sd) in src_devs.iter().enumerate() {
            for (j, &dd) in dst_devs.iter().enumerate() {
                let n = bytes[i * dst_devs.len() + j];
                if n > 0 {
                    *out.entry((sd, dd)).or_insert(0) += n;
                }
            }
        }
        out
    }
}

/// Numbers the distinct devices of `n` partitions: (id per partition, device per id). Few
/// distinct devices is the common case, so they are searched linearly before hashing.
fn intern(n: usize, dev: &dyn Fn(usize) -> Device) -> (Vec<usize>, Vec<Device>) {
    const LINEAR: usize = 16;
    let mut index: HashMap<Device, usize> = HashMap::new();
    let mut devices: Vec<Device> = Vec::new();
    let ids = (0..n)
        .map(|i| {
            let d = dev(i);
            if let Some(id) = devices.iter().take(LINEAR).position(|&x| x == d) {
                return id;
            }
            *index.entry(d).or_insert_with(|| {
                devices.push(d);
                devices.len() - 1
            })
        })
        .collect();
    (ids, devices)
}

/// Advances the piece counter `cur` over all pieces in C order (wrapping to zero at the end).
fn advance(cur: &mut [usize], axes: &[Vec<Piece>]) {
    for a in (0..cur.len()).rev() {
        cur[a] += 1;
        if cur[a] < axes[a].len() {
            return;
        }
        cur[a] = 0;
    }
}

/// Iterator over the copies of a box of per-axis piece ranges.
pub struct Ops<'a> {
    plan: &'a Plan,
    lo: Vec<usize>,
    hi: Vec<usize>,
    cur: Vec<usize>,
    remaining: usize,
}

impl<'a> Ops<'a> {
    fn new(plan: &'a Plan, lo: Vec<usize>, hi: Vec<usize>) -> Self {
        let remaining = lo.iter().zip(&hi).map(|(l, h)| h - l).product();
        Ops {
            plan,
            cur: lo.clone(),
            lo,
            hi,
            remaining,
        }
    }
}

impl Ops<'_> {
    /// Calls `f` on every remaining copy through one reused `BoxCopy`: no allocation per copy,
    /// for callers that only read each copy (to pack descriptors, to count bytes).
    pub fn visit(mut self, mut f: impl FnMut(&BoxCopy)) {
        let mut op = BoxCopy {
            src: 0,
            src_start: Vec::new(),
            dst: 0,
            dst_start: Vec::new(),
            shape: Vec::new(),
        };
        if self.remaining == 0 {
            return;
        }
        self.plan.fill_op(&self.cur, &mut op);
        let (axes, ss, ds) = (
            &self.plan.axes,
            &self.plan.src_strides,
            &self.plan.dst_strides,
        );
        loop {
            f(&op);
            self.remaining -= 1;
            if self.remaining == 0 {
                return;
            }
            // Step the counter, rewriting only the axes that moved: usually just the last.
            for a in (0..self.cur.len()).rev() {
                let old = &axes[a][self.cur[a]];
                op.src -= old.src * ss[a];
                op.dst -= old.dst * ds[a];
                self.cur[a] += 1;
                let wrapped = self.cur[a] == self.hi[a];
                if wrapped {
                    self.cur[a] = self.lo[a];
                }
                let p = &axes[a][self.cur[a]];
                op.src += p.src * ss[a];
                op.dst += p.dst * ds[a];
                op.src_start[a] = p.src_off;
                op.dst_start[a] = p.dst_off;
                op.shape[a] = p.len;
                if !wrapped {
                    break;
                }
            }
        }
    }

    fn step(&mut self) {
        self.remaining -= 1;
        for a in (0..self.cur.len()).rev() {
            self.cur[a] += 1;
            if self.cur[a] < self.hi[a] {
                break;
            }
            self.cur[a] = self.lo[a];
        }
    }
}

impl Iterator for Ops<'_> {
    type Item = BoxCopy;

    fn next(&mut self) -> Option<BoxCopy> {
        if self.remaining == 0 {
            return None;
        }
        let op = self.plan.op_at(&self.cur);
        self.step();
        Some(op)
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        (self.remaining, Some(self.remaining))
    }
}

impl ExactSizeIterator for Ops<'_> {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sweep_splits_axes_at_every_boundary_of_either_grid() {
        let src = Grid::from_splits(&[10], vec![vec![0, 4, 4, 10]]).unwrap();
        let dst = Grid::from_splits(&[10], vec![vec![0, 3, 7, 10]]).unwrap();
        let plan = Plan::new(&src, &dst).unwrap();
        let ops: Vec<(usize, usize, usize, usize, usize)> = plan
            .ops()
            .map(|o| (o.src, o.src_start[0], o.dst, o.dst_start[0], o.shape[0]))
            .collect();
        // Hand-built: [0,3) from src 0 to dst 0, [3,4) src 0 -> dst 1, [4,7) src 2 -> dst 1,
        // [7,10) src 2 -> dst 2; the empty source slab 1 gets nothing.
        assert_eq!(
            ops,
            vec![
                (0, 0, 0, 0, 3),
                (0, 3, 1, 0, 1),
                (2, 0, 1, 1, 3),
                (2, 3, 2, 0, 3)
            ]
        );
        assert_eq!(plan.ops_from(1).count(), 0);
        assert_eq!(
            plan.ops_into(1).map(|o| o.src).collect::<Vec<_>>(),
            vec![0, 2]
        );
        assert_eq!(plan.bytes(4), 40);
        let mut visited = Vec::new();
        plan.ops().visit(|op| visited.push(op.clone()));
        assert_eq!(visited, plan.ops().collect::<Vec<_>>());
        let mut into_2 = Vec::new();
        plan.ops_into(2)
            .visit(|op| into_2.push((op.src, op.src_start[0])));
        assert_eq!(into_2, vec![(2, 3)]);
    }

    #[test]
    fn zero_d_and_empty_arrays_plan_one_and_no_copies() {
        let g = Grid::even(&[], &[]).unwrap();
        let ops: Vec<BoxCopy> = Plan::new(&g, &g).unwrap().ops().collect();
        assert_eq!(
            ops,
            vec![BoxCopy {
                src: 0,
                src_start: vec![],
                dst: 0,
                dst_start: vec![],
                shape: vec![]
            }]
        );
        let (a, b) = (
            Grid::even(&[0, 5], &[2, 2]).unwrap(),
            Grid::even(&[0, 5], &[1, 3]).unwrap(),
        );
        let plan = Plan::new(&a, &b).unwrap();
        assert!(plan.is_empty() && plan.ops().next().is_none());
        assert!(Plan::new(&a, &Grid::even(&[1, 5], &[1, 1]).unwrap()).is_err());
    }
}
