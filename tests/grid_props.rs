//! Property tests of the grid model, its validator and the planner, on grids drawn by a small
//! deterministic generator, against naive references (element-by-element walks, numpy's
//! `array_split` rule written out as numpy does it).

use std::collections::BTreeMap;

use dlpart::grid::{Entry, Grid};
use dlpart::plan::{BoxCopy, Plan};
use dlpart::{Device, Error};

mod common;
use common::Rng;

fn random_shape(rng: &mut Rng, max_ndim: usize, max_len: usize) -> Vec<usize> {
    let nd = rng.range(0, max_ndim);
    (0..nd).map(|_| rng.range(0, max_len)).collect()
}

/// Split points with random (possibly repeated, so possibly empty) interior boundaries.
fn random_grid(rng: &mut Rng, shape: &[usize], max_parts: usize) -> Grid {
    let splits = shape
        .iter()
        .map(|&len| {
            let n = rng.range(1, max_parts);
            let mut pts: Vec<usize> = (0..n - 1).map(|_| rng.range(0, len)).collect();
            pts.sort();
            let mut s = vec![0];
            s.extend(pts);
            s.push(len);
            s
        })
        .collect();
    Grid::from_splits(shape, splits).unwrap()
}

fn entries_of(g: &Grid) -> Vec<Entry> {
    let i = |v: &[usize]| v.iter().map(|&x| x as i64).collect::<Vec<i64>>();
    g.positions()
        .map(|p| {
            let r = g.region(&p).unwrap();
            (i(&p), i(&r.start), i(&r.shape))
        })
        .collect()
}

fn header(g: &Grid) -> (Vec<i64>, Vec<i64>) {
    let shape = g.shape().iter().map(|&x| x as i64).collect();
    let tiling = g.tiling().iter().map(|&x| x as i64).collect();
    (shape, tiling)
}

type Found = (String, Option<Vec<usize>>, Option<u8>);

fn violations(e: &Error) -> Vec<Found> {
    match e {
        Error::ProtocolMany { errors } => errors.iter().flat_map(violations).collect(),
        Error::Protocol {
            key,
            position,
            invariant,
            ..
        } => {
            vec![(
                key.clone(),
                position.as_ref().map(|p| p.0.clone()),
                *invariant,
            )]
        }
        other => panic!("not a protocol error: {other}"),
    }
}

fn found(key: &str, pos: Option<&[usize]>, inv: u8) -> Found {
    (key.to_string(), pos.map(<[usize]>::to_vec), Some(inv))
}

/// numpy's `array_split` boundaries, written the way numpy computes them.
fn array_split_points(len: usize, n: usize) -> Vec<usize> {
    let (each, extras) = (len / n, len % n);
    let sizes = std::iter::repeat_n(each + 1, extras).chain(std::iter::repeat_n(each, n - extras));
    let mut pts = vec![0];
    for s in sizes {
        pts.push(pts.last().unwrap() + s);
    }
    pts
}

#[test]
fn even_grids_equal_array_split() {
    let mut rng = Rng(1);
    for _ in 0..300 {
        let shape = random_shape(&mut rng, 3, 40);
        let tiling: Vec<usize> = shape.iter().map(|_| rng.range(1, 12)).collect();
        let g = Grid::even(&shape, &tiling).unwrap();
        for a in 0..shape.len() {
            assert_eq!(
                g.splits()[a],
                array_split_points(shape[a], tiling[a]),
                "{shape:?} {tiling:?}"
            );
        }
        assert_eq!(g.num_partitions(), tiling.iter().product::<usize>());
    }
}

#[test]
fn shuffled_valid_entries_give_back_the_grid() {
    let mut rng = Rng(2);
    for _ in 0..300 {
        let shape = random_shape(&mut rng, 3, 9);
        let g = random_grid(&mut rng, &shape, 4);
        let mut entries = entries_of(&g);
        rng.shuffle(&mut entries);
        let (s, t) = header(&g);
        assert_eq!(Grid::from_entries(&s, &t, &entries).unwrap(), g);
    }
    // The size the benchmark validates.
    let g = Grid::even(&[8192, 8192], &[256, 256]).unwrap();
    let mut entries = entries_of(&g);
    rng.shuffle(&mut entries);
    let (s, t) = header(&g);
    assert_eq!(Grid::from_entries(&s, &t, &entries).unwrap(), g);
}

#[test]
fn locate_agrees_with_a_linear_scan_of_regions() {
    let mut rng = Rng(3);
    for _ in 0..200 {
        let shape = random_shape(&mut rng, 3, 8);
        let g = random_grid(&mut rng, &shape, 4);
        if shape.contains(&0) {
            continue;
        }
        let index: Vec<usize> = shape.iter().map(|&n| rng.range(0, n - 1)).collect();
        let holders: Vec<Vec<usize>> = g
            .positions()
            .filter(|p| g.region(p).unwrap().contains(&index))
            .collect();
        assert_eq!(holders.len(), 1, "{index:?} in {g}");
        assert_eq!(g.locate(&index).unwrap(), holders[0]);
    }
}

/// A grid with at least 3 slabs on axis 0 and 3 partitions per slab, so that one corrupt entry
/// is outvoted within its slab.
fn corruptible(rng: &mut Rng) -> Grid {
    let rows = rng.range(9, 14);
    let cols = rng.range(6, 10);
    let mut g = random_grid(rng, &[rows, cols], 5);
    while g.tiling()[0] < 3 || g.tiling()[1] < 3 || g.splits()[0].windows(2).any(|w| w[0] == w[1]) {
        g = random_grid(rng, &[rows, cols], 5);
    }
    g
}

#[test]
fn each_corruption_is_reported_with_key_position_and_invariant() {
    let mut rng = Rng(4);
    for _ in 0..50 {
        let g = corruptible(&mut rng);
        let (shape, tiling) = header(&g);
        let good = entries_of(&g);
        let k = rng.range(0, good.len() - 1);
        let pos = g.position(k);
        let check = |entries: &[Entry], expect: Vec<Found>| {
            let mut shuffled = entries.to_vec();
            Rng(k as u64).shuffle(&mut shuffled);
            let e = Grid::from_entries(&shape, &tiling, &shuffled).unwrap_err();
            assert_eq!(violations(&e), expect, "{e}");
            e.to_string()
        };

        let mut v = good.clone();
        v.remove(k);
        let msg = check(&v, vec![found("partitions", Some(&pos), 2)]);
        assert!(msg.contains("missing"), "{msg}");

        let mut v = good.clone();
        v.push(good[k].clone());
        check(&v, vec![found("partitions", Some(&pos), 2)]);

        let mut v = good.clone();
        v.push((vec![tiling[0], 0], vec![0, 0], vec![1, 1]));
        let msg = check(&v, vec![found("partitions", None, 2)]);
        assert!(msg.contains(&format!("({}, 0)", tiling[0])), "{msg}");

        let mut v = good.clone();
        v.push((vec![-1, 0], vec![0, 0], vec![1, 1]));
        check(&v, vec![found("partitions", None, 2)]);

        let mut v = good.clone();
        v.push((vec![0], vec![0, 0], vec![1, 1]));
        check(&v, vec![found("partitions", None, 1)]);

        let mut v = good.clone();
        v[k].1.push(0);
        check(&v, vec![found("start", Some(&pos), 1)]);

        let mut v = good.clone();
        v[k].2[1] = -3;
        let msg = check(&v, vec![found("shape", Some(&pos), 3)]);
        assert!(msg.contains("-3"), "{msg}");

        let mut v = good.clone();
        v[k].1[0] = i64::MAX;
        check(&v, vec![found("shape", Some(&pos), 3)]);

        // One entry's start moved off its slab's split point: outvoted, so only it is blamed.
        let mut v = good.clone();
        v[k].1[0] += 1;
        let msg = check(&v, vec![found("start", Some(&pos), 4)]);
        let want = format!("expected ({}, {})", good[k].1[0], good[k].1[1]);
        assert!(msg.contains(&want), "{msg}");

        let mut v = good.clone();
        v[k].2[1] += 2;
        check(&v, vec![found("shape", Some(&pos), 4)]);
    }
}

#[test]
fn gaps_overlaps_and_short_covers_cite_invariant_5() {
    let g = Grid::from_splits(&[10, 2], vec![vec![0, 3, 6, 10], vec![0, 2]]).unwrap();
    let (shape, tiling) = header(&g);
    let good = entries_of(&g);
    // Slab 1 of axis 0 starts late (gap) and, being one partition, cannot be outvoted.
    let mut v = good.clone();
    v[1].1[0] = 4;
    v[1].2[0] = 2;
    let e = Grid::from_entries(&shape, &tiling, &v).unwrap_err();
    assert_eq!(violations(&e), vec![found("start", Some(&[1, 0]), 5)]);
    assert!(
        e.to_string()
            .contains("gap on axis 0: slab 1 starts at 4 but the previous one ends at 3"),
        "{e}"
    );
    // Slab 2 starts early (overlap) and the last slab ends past the shape.
    let mut v = good.clone();
    v[2].1[0] = 5;
    v[2].2[0] = 6;
    let e = Grid::from_entries(&shape, &tiling, &v).unwrap_err();
    assert_eq!(
        violations(&e),
        vec![
            found("start", Some(&[2, 0]), 5),
            found("shape", Some(&[2, 0]), 5)
        ]
    );
    assert!(e.to_string().contains("overlap on axis 0"), "{e}");
    assert!(
        e.to_string().contains("end at 11 but shape[0] is 10"),
        "{e}"
    );
}

#[test]
fn broken_headers_and_many_violations_are_all_reported() {
    let e = Grid::from_entries(&[4, -2], &[2, 0, 1], &[]).unwrap_err();
    assert_eq!(
        violations(&e),
        vec![
            found("partition_tiling", None, 1),
            found("shape", None, 3),
            found("partition_tiling", None, 2)
        ]
    );
    // 64 missing partitions: the first 32 are listed, the rest counted.
    let e = Grid::from_entries(&[8, 8], &[8, 8], &[]).unwrap_err();
    let all = violations(&e);
    assert_eq!(all.len(), 33);
    assert_eq!(all[31], found("partitions", Some(&[3, 7]), 2));
    assert!(e.to_string().ends_with("... and 32 more violations"), "{e}");
    let e = Grid::from_entries(&[8], &[1 << 40], &[]).unwrap_err();
    assert_eq!(violations(&e), vec![found("partition_tiling", None, 2)]);
}

/// The C-order index of element `k` of a box of `shape`.
fn unflatten(mut k: usize, shape: &[usize]) -> Vec<usize> {
    let mut index = vec![0; shape.len()];
    for a in (0..shape.len()).rev() {
        index[a] = k % shape[a];
        k /= shape[a];
    }
    index
}

/// Checks every copy against both grids and counts how often each global element is written.
fn coverage(plan: &Plan) -> Vec<u32> {
    let (src, dst) = (plan.src_grid(), plan.dst_grid());
    let shape = src.shape();
    let mut count = vec![0u32; shape.iter().product()];
    for op in plan.ops() {
        let (sr, dr) = (src.region_at(op.src), dst.region_at(op.dst));
        assert!(op.numel() > 0, "{op:?}");
        for k in 0..op.numel() {
            let idx = unflatten(k, &op.shape);
            let mut flat = 0;
            for a in 0..shape.len() {
                let s = op.src_start[a] + idx[a];
                let d = op.dst_start[a] + idx[a];
                assert!(
                    s < sr.shape[a] && d < dr.shape[a],
                    "{op:?} leaves its partitions"
                );
                assert_eq!(sr.start[a] + s, dr.start[a] + d, "{op:?} moves data");
                flat = flat * shape[a] + sr.start[a] + s;
            }
            count[flat] += 1;
        }
    }
    count
}

#[test]
fn plans_copy_every_element_exactly_once() {
    let mut rng = Rng(5);
    for _ in 0..300 {
        let shape = random_shape(&mut rng, 3, 9);
        let (a, b) = (
            random_grid(&mut rng, &shape, 5),
            random_grid(&mut rng, &shape, 5),
        );
        let plan = Plan::new(&a, &b).unwrap();
        let count = coverage(&plan);
        assert!(count.iter().all(|&c| c == 1), "{a} -> {b}: {count:?}");
        assert_eq!(plan.bytes(8), 8 * count.len() as u64);
        assert_eq!(plan.ops().len(), plan.len());
        // Grouping by partition yields the same copies.
        let all: Vec<BoxCopy> = plan.ops().collect();
        for j in 0..b.num_partitions() {
            let want: Vec<&BoxCopy> = all.iter().filter(|o| o.dst == j).collect();
            assert_eq!(
                plan.ops_into(j)
                    .collect::<Vec<_>>()
                    .iter()
                    .collect::<Vec<_>>(),
                want
            );
        }
        for i in 0..a.num_partitions() {
            let want: Vec<&BoxCopy> = all.iter().filter(|o| o.src == i).collect();
            assert_eq!(
                plan.ops_from(i)
                    .collect::<Vec<_>>()
                    .iter()
                    .collect::<Vec<_>>(),
                want
            );
        }
    }
}

/// Values of a C-order array of `shape` inside `region`, in C order.
fn cut(global: &[i64], shape: &[usize], start: &[usize], size: &[usize]) -> Vec<i64> {
    let mut out = Vec::new();
    let n: usize = size.iter().product();
    for k in 0..n {
        let (local, mut flat) = (unflatten(k, size), 0);
        for a in 0..size.len() {
            flat = flat * shape[a] + start[a] + local[a];
        }
        out.push(global[flat]);
    }
    out
}

#[test]
fn applying_a_plan_to_data_reproduces_the_target_partitions() {
    let mut rng = Rng(6);
    for _ in 0..100 {
        let shape = random_shape(&mut rng, 3, 7);
        let (a, b) = (
            random_grid(&mut rng, &shape, 4),
            random_grid(&mut rng, &shape, 4),
        );
        let global: Vec<i64> = (0..shape.iter().product::<usize>() as i64).collect();
        let src: Vec<Vec<i64>> = (0..a.num_partitions())
            .map(|i| {
                let r = a.region_at(i);
                cut(&global, &shape, &r.start, &r.shape)
            })
            .collect();
        let mut dst: Vec<Vec<i64>> = (0..b.num_partitions())
            .map(|j| vec![-1; b.region_at(j).numel()])
            .collect();
        for op in Plan::new(&a, &b).unwrap().ops() {
            let (ss, ds) = (a.region_at(op.src).shape, b.region_at(op.dst).shape);
            let vals = cut(&src[op.src], &ss, &op.src_start, &op.shape);
            // Write the box back through the same index walk on the target side.
            let positions = cut(
                &(0..ds.iter().product::<usize>() as i64).collect::<Vec<_>>(),
                &ds,
                &op.dst_start,
                &op.shape,
            );
            for (p, v) in positions.into_iter().zip(vals) {
                dst[op.dst][p as usize] = v;
            }
        }
        for (j, got) in dst.iter().enumerate() {
            let r = b.region_at(j);
            assert_eq!(
                got,
                &cut(&global, &shape, &r.start, &r.shape),
                "{a} -> {b}, partition {j}"
            );
        }
    }
}

#[test]
fn bytes_by_device_pair_matches_per_element_attribution() {
    let mut rng = Rng(7);
    for _ in 0..100 {
        let shape = random_shape(&mut rng, 3, 8);
        let (a, b) = (
            random_grid(&mut rng, &shape, 4),
            random_grid(&mut rng, &shape, 4),
        );
        let sdev: Vec<Device> = (0..a.num_partitions())
            .map(|_| Device::cuda(rng.range(0, 2) as i32))
            .collect();
        let ddev: Vec<Device> = (0..b.num_partitions())
            .map(|_| Device::cuda(rng.range(0, 2) as i32))
            .collect();
        let got = Plan::new(&a, &b)
            .unwrap()
            .bytes_by_device_pair(4, &|i| sdev[i], &|j| ddev[j]);
        let mut want: BTreeMap<(Device, Device), u64> = BTreeMap::new();
        let n: usize = shape.iter().product();
        for k in 0..n {
            let index = unflatten(k, &shape);
            let i = a.flat_index(&a.locate(&index).unwrap()).unwrap();
            let j = b.flat_index(&b.locate(&index).unwrap()).unwrap();
            *want.entry((sdev[i], ddev[j])).or_insert(0) += 4;
        }
        assert_eq!(got, want, "{a} -> {b}");
    }
}

#[test]
fn the_benchmark_plan_has_one_copy_per_pair_of_overlapping_slabs() {
    let src = Grid::even(&[8192, 8192], &[256, 256]).unwrap();
    let dst = Grid::even(&[8192, 8192], &[255, 257]).unwrap();
    let plan = Plan::new(&src, &dst).unwrap();
    // Along an axis, the pieces are the intervals between the union of both boundary sets.
    let pieces = |x: &[usize], y: &[usize]| {
        let mut u: Vec<usize> = x.iter().chain(y).copied().collect();
        u.sort();
        u.dedup();
        u.len() - 1
    };
    let expect =
        pieces(&src.splits()[0], &dst.splits()[0]) * pieces(&src.splits()[1], &dst.splits()[1]);
    assert_eq!(plan.len(), expect);
    let (mut n, mut elems) = (0, 0u64);
    for op in plan.ops() {
        n += 1;
        elems += op.numel() as u64;
    }
    assert_eq!((n, elems), (expect, 8192 * 8192));
}

/// Split points for an axis of `len`: a few drawn from the values arithmetic goes wrong at
/// (0, the ends, the middle, just inside the end), sometimes out of order or past the end.
fn extreme_splits(rng: &mut Rng, len: usize) -> Vec<usize> {
    let inner = rng.range(0, 3);
    let mut pts: Vec<usize> = (0..inner)
        .map(|_| match rng.range(0, 5) {
            0 => 0,
            1 => len,
            2 => len / 2,
            3 => len.saturating_sub(1),
            _ => (rng.next() as usize) % len.saturating_add(1).max(1),
        })
        .collect();
    if rng.range(0, 7) > 0 {
        pts.sort();
    }
    let mut s = vec![0];
    s.extend(pts);
    // Now and then an end that is not the axis length.
    s.push(if rng.range(0, 15) == 0 { len ^ 1 } else { len });
    s
}

/// The product of `dims` in u128, `None` when even that overflows.
fn numel(dims: &[usize]) -> Option<u128> {
    if dims.contains(&0) {
        return Some(0);
    }
    dims.iter()
        .try_fold(1u128, |acc, &n| acc.checked_mul(n as u128))
}

/// The planner fed grids over extents from 0 to `usize::MAX`: any grid the model accepts is
/// planned without a panic or an overflow, each copy inside both its partitions, and the
/// copies add up to the whole shape (counted in u128, which cannot overflow here).
#[test]
fn grids_of_extreme_extents_plan_without_panicking() {
    const EXTENTS: [usize; 10] = [
        0,
        1,
        2,
        3,
        7,
        1 << 31,
        1 << 40,
        1 << 62,
        1 << 63,
        usize::MAX,
    ];
    let mut rng = Rng(11);
    let (mut planned, mut refused) = (0, 0);
    for _ in 0..3000 {
        let nd = rng.range(0, 4);
        let shape: Vec<usize> = (0..nd)
            .map(|_| EXTENTS[rng.range(0, EXTENTS.len() - 1)])
            .collect();
        let mut grid = || {
            let splits = shape.iter().map(|&n| extreme_splits(&mut rng, n)).collect();
            Grid::from_splits(&shape, splits)
        };
        let (Ok(a), Ok(b)) = (grid(), grid()) else {
            refused += 1;
            continue;
        };
        let plan = Plan::new(&a, &b).unwrap();
        let mut total = Some(0u128);
        for op in plan.ops() {
            let (sr, dr) = (a.region_at(op.src), b.region_at(op.dst));
            for ax in 0..nd {
                assert!(op.shape[ax] > 0, "{a} -> {b}: {op:?}");
                assert!(
                    op.src_start[ax] + op.shape[ax] <= sr.shape[ax],
                    "{a} -> {b}: {op:?}"
                );
                assert!(
                    op.dst_start[ax] + op.shape[ax] <= dr.shape[ax],
                    "{a} -> {b}: {op:?}"
                );
                assert_eq!(
                    sr.start[ax] + op.src_start[ax],
                    dr.start[ax] + op.dst_start[ax]
                );
            }
            total = numel(&op.shape).and_then(|n| total?.checked_add(n));
        }
        // Three axes of 2^64 overflow even u128: then only the absence of a panic counts.
        let whole = numel(&shape);
        if whole.is_some() {
            assert_eq!(total, whole, "{a} -> {b}");
        }
        let bytes = whole.and_then(|n| n.checked_mul(16)).unwrap_or(u128::MAX);
        assert_eq!(
            plan.bytes(16) as u128,
            bytes.min(u64::MAX as u128),
            "{a} -> {b}"
        );
        let pairs = plan.bytes_by_device_pair(16, &|_| Device::CPU, &|_| Device::CPU);
        assert!(pairs.len() <= 1);
        planned += 1;
    }
    // Both outcomes are exercised.
    assert!(
        planned > 500 && refused > 100,
        "{planned} planned, {refused} refused"
    );
}
