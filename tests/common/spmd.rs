//! What the SPMD tests share, over threads (`src/spmd/tests.rs` includes this file) and over
//! MPI processes (`tests/mpi.rs`): random global layouts that every rank draws alike from one
//! seed, and references built with ndarray independently of the planner. Public API only.

use dlpart::grid::Grid;
use dlpart::spmd::{owners, LocalParts, Traffic};
use dlpart::{Device, Layout, PartitionedArray, Tensor};
use ndarray::{ArrayD, Axis, IxDyn, SliceInfoElem};

/// A small deterministic generator (xorshift), seeded per case so every rank draws the same.
pub struct Rng(pub u64);

impl Rng {
    /// The next 64 random bits.
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    /// Uniform in `0..n`.
    pub fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

/// The global array of `shape`: 1, 2, 3, ... in C order.
pub fn reference(shape: &[usize]) -> ArrayD<f32> {
    let mut k = 0.0f32;
    ArrayD::from_shape_fn(IxDyn(shape), |_| {
        k += 1.0;
        k
    })
}

/// The box of `a` at `start` of `shape`, copied out.
pub fn block(a: &ArrayD<f32>, start: &[usize], shape: &[usize]) -> ArrayD<f32> {
    let info: Vec<SliceInfoElem> = start
        .iter()
        .zip(shape)
        .map(|(&s, &n)| (s..s + n).into())
        .collect();
    a.slice(info.as_slice()).to_owned()
}

/// A random target: blocks of 1-4 along each axis dealt over `ranks` host slots when
/// `cyclic`, else 1-4 random (possibly empty) slabs along each axis.
pub fn random_layout(rng: &mut Rng, shape: &[usize], cyclic: bool, ranks: usize) -> Layout {
    if cyclic {
        let b: Vec<usize> = shape.iter().map(|_| 1 + rng.below(4)).collect();
        return Layout::block_cyclic(&b, vec![Device::CPU; ranks]);
    }
    let s = shape
        .iter()
        .map(|&n| {
            let parts = 1 + rng.below(4);
            random_splits(rng, n, parts)
        })
        .collect();
    Layout::splits(s)
}

/// Random split points of `len` into `parts` slabs (some possibly empty).
pub fn random_splits(rng: &mut Rng, len: usize, parts: usize) -> Vec<usize> {
    let mut cuts: Vec<usize> = (1..parts).map(|_| rng.below(len + 1)).collect();
    cuts.sort_unstable();
    let mut s = vec![0];
    s.extend(cuts);
    s.push(len);
    s
}

/// A random source grid over `shape` (uneven, no empty slab: empty partitions at one offset
/// would share a slab in the placed form) and a random rank for each partition, several per
/// rank; rank 1 gets none when there are more than two ranks.
pub fn random_source(rng: &mut Rng, shape: &[usize], ranks: usize) -> (Grid, Vec<usize>) {
    let splits = shape
        .iter()
        .map(|&n| {
            let parts = 1 + rng.below(4);
            let mut s = random_splits(rng, n, parts);
            s.dedup();
            s
        })
        .collect();
    let grid = Grid::from_splits(shape, splits).unwrap();
    let owners = (0..grid.num_partitions())
        .map(|_| match rng.below(ranks) {
            1 if ranks > 2 => 0,
            r => r,
        })
        .collect();
    (grid, owners)
}

/// Rank `me`'s partitions of `a` over `grid`: each box it owns, at its global start.
pub fn local_parts(a: &ArrayD<f32>, grid: &Grid, owners: &[usize], me: usize) -> LocalParts {
    LocalParts::Placed(
        (0..grid.num_partitions())
            .filter(|&f| owners[f] == me)
            .map(|f| {
                let r = grid.region_at(f);
                (r.start.clone(), Tensor::from(block(a, &r.start, &r.shape)))
            })
            .collect(),
    )
}

/// The bytes (of f32 elements) rank `me` must send to each rank and copy locally in a
/// repartition from `src` to `dst`, from the intersections of their boxes.
pub fn expected_traffic(
    src: &Grid,
    src_owners: &[usize],
    dst: &Grid,
    dst_owners: &[usize],
    me: usize,
    ranks: usize,
) -> (Vec<u64>, u64) {
    let mut sent = vec![0u64; ranks];
    let mut local = 0;
    for (i, &s) in src_owners.iter().enumerate() {
        for (j, &d) in dst_owners.iter().enumerate() {
            let (a, b) = (src.region_at(i), dst.region_at(j));
            let n = a.intersect(&b).map_or(0, |r| r.numel()) as u64 * 4;
            match (s == me, d == me) {
                (true, true) => local += n,
                (true, false) => sent[d] += n,
                _ => {}
            }
        }
    }
    (sent, local)
}

/// Checks rank `me`'s side of a repartition from `src` (grid and owners) of `a`: each local
/// partition of `out` is this rank's and holds `a`'s box, and `traffic` sent and copied
/// locally what the plan moves. Returns the target grid and owners.
pub fn check_repartitioned(
    out: &PartitionedArray,
    traffic: &Traffic,
    a: &ArrayD<f32>,
    (src, src_owners): (&Grid, &[usize]),
    me: usize,
    case: u64,
) -> (Grid, Vec<usize>) {
    let dst_grid = out.grid().clone();
    let dst_owners = owners(out).unwrap();
    for p in out.partitions() {
        if let Some(t) = p.tensor() {
            assert_eq!(dst_owners[dst_grid.flat_index(&p.position).unwrap()], me);
            let want = block(a, &p.start, &p.shape);
            assert_eq!(t.to_array::<f32>().unwrap(), want, "case {case}");
        }
    }
    let ranks = traffic.sent.len();
    let (sent, local) = expected_traffic(src, src_owners, &dst_grid, &dst_owners, me, ranks);
    assert_eq!(
        (traffic.sent.clone(), traffic.local),
        (sent, local),
        "case {case}"
    );
    (dst_grid, dst_owners)
}

/// Random global indices into an axis of `len`: up to `2 * len` of them, negative ones (from
/// the end) and repeats included.
pub fn random_picks(rng: &mut Rng, len: usize) -> Vec<i64> {
    (0..rng.below(2 * len + 1))
        .map(|_| rng.below(2 * len) as i64 - len as i64)
        .collect()
}

/// `numpy.take(a, picks, axis)`; values to scatter back, the taken slabs each raised by
/// 10,000 times its position plus one (so that every value differs from the others written
/// at the same index); and `a`'s zeros with those values assigned at `picks`
/// (`z[.., picks, ..] = values`: the last of repeated indices wins), written out with ndarray.
pub fn take_and_assign(
    a: &ArrayD<f32>,
    picks: &[i64],
    axis: usize,
) -> (ArrayD<f32>, ArrayD<f32>, ArrayD<f32>) {
    let len = a.shape()[axis] as i64;
    let positive: Vec<usize> = picks.iter().map(|&i| ((i + len) % len) as usize).collect();
    let taken = a.select(Axis(axis), &positive);
    let mut values = taken.clone();
    for (k, mut slab) in values.axis_iter_mut(Axis(axis)).enumerate() {
        slab += 10_000.0 * (k + 1) as f32;
    }
    let mut assigned = ArrayD::<f32>::zeros(a.raw_dim());
    for (k, &i) in positive.iter().enumerate() {
        assigned
            .index_axis_mut(Axis(axis), i)
            .assign(&values.index_axis(Axis(axis), k));
    }
    (taken, values, assigned)
}
