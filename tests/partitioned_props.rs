//! Property tests of the Rust model: partition -> repartition -> assemble, and gather/scatter
//! with global indices, on random layouts drawn by a small deterministic generator, against
//! ndarray references (slices, `select`, element-wise assignment).

use dlpart::{DType, Device, Layout, PartitionedArray, Tensor};
use ndarray::{ArrayD, Axis, IxDyn, Slice};

mod common;
use common::Rng;

fn random_shape(rng: &mut Rng) -> Vec<usize> {
    let nd = rng.range(1, 4);
    (0..nd).map(|_| rng.range(0, 9)).collect()
}

/// A random layout over `shape`: a tiling, split points with empty slabs, or blocks dealt over
/// a few host devices.
fn random_layout(rng: &mut Rng, shape: &[usize]) -> Layout {
    match rng.range(0, 2) {
        0 => Layout::tiling(&shape.iter().map(|_| rng.range(1, 4)).collect::<Vec<_>>()),
        1 => Layout::splits(
            shape
                .iter()
                .map(|&n| {
                    let mut pts: Vec<usize> =
                        (0..rng.range(0, 3)).map(|_| rng.range(0, n)).collect();
                    pts.push(0);
                    pts.push(n);
                    pts.sort_unstable();
                    pts
                })
                .collect(),
        ),
        _ => {
            let block: Vec<usize> = shape.iter().map(|_| rng.range(1, 4)).collect();
            let devices = rng.range(1, 4);
            Layout::block_cyclic(&block, vec![Device::CPU; devices])
        }
    }
}

/// `layout`'s cut with each target partition on its source's device (the default placement).
fn staying(layout: Layout) -> Layout {
    Layout::new(layout.cut, dlpart::Placement::Stay)
}

fn reference(shape: &[usize], rng: &mut Rng) -> ArrayD<i64> {
    ArrayD::from_shape_fn(IxDyn(shape), |_| (rng.next() >> 40) as i64)
}

/// Every partition of `pa` equals the slice of `a` at its box.
fn check_blocks(pa: &PartitionedArray, a: &ArrayD<i64>) {
    for p in pa.partitions() {
        let got = p
            .tensor()
            .expect("data held here")
            .to_array::<i64>()
            .unwrap();
        let want = a.slice_each_axis(|ax| {
            let i = ax.axis.index();
            Slice::from(p.start[i]..p.start[i] + p.shape[i])
        });
        assert_eq!(got, want, "partition {:?}", p.position);
    }
}

#[test]
fn partition_repartition_assemble_match_ndarray_on_random_layouts() {
    let mut rng = Rng(7);
    for case in 0..300 {
        let shape = random_shape(&mut rng);
        let a = reference(&shape, &mut rng);
        let t = Tensor::from_ndarray(a.clone());
        let first = random_layout(&mut rng, &shape);
        let src = PartitionedArray::partition(&t, &staying(first));
        let src = src.unwrap_or_else(|e| panic!("case {case}: {e}"));
        check_blocks(&src, &a);
        let layout = random_layout(&mut rng, &shape);
        let out = src.repartition(&layout, false).unwrap();
        check_blocks(&out, &a);
        assert_eq!(out.dtype(), Some(DType::Int64));
        let whole = out.assemble(None, false).unwrap();
        assert_eq!(whole.to_array::<i64>().unwrap(), a, "case {case}");
        // into preallocated targets of a third layout
        let third = random_layout(&mut rng, &shape);
        let fresh = PartitionedArray::partition(
            &Tensor::from_ndarray(ArrayD::<i64>::zeros(IxDyn(&shape))),
            &staying(third),
        )
        .unwrap();
        out.repartition_into(&fresh, false).unwrap();
        check_blocks(&fresh, &a);
    }
}

#[test]
fn gather_and_scatter_with_global_indices_match_ndarray() {
    let mut rng = Rng(11);
    for case in 0..200 {
        let shape: Vec<usize> = random_shape(&mut rng).iter().map(|&n| n.max(1)).collect();
        let a = reference(&shape, &mut rng);
        let layout = random_layout(&mut rng, &shape);
        let layout = staying(layout);
        let pa = PartitionedArray::partition(&Tensor::from_ndarray(a.clone()), &layout).unwrap();
        let axis = rng.range(0, shape.len() - 1);
        let len = shape[axis];
        let idx: Vec<i64> = (0..rng.range(0, 7))
            .map(|_| rng.range(0, 2 * len - 1) as i64 - len as i64)
            .collect();
        let rows: Vec<usize> = idx
            .iter()
            .map(|&i| i.rem_euclid(len as i64) as usize)
            .collect();
        let it = Tensor::from_slice(&idx, &[idx.len()]).unwrap();
        let got = pa.gather(&it, axis, false).unwrap();
        let want = a.select(Axis(axis), &rows);
        assert_eq!(
            got.assemble(None, false)
                .unwrap()
                .to_array::<i64>()
                .unwrap(),
            want,
            "case {case}"
        );

        let mut vshape = shape.clone();
        vshape[axis] = idx.len();
        let values = reference(&vshape, &mut rng);
        let target = reference(&shape, &mut rng);
        let tpa =
            PartitionedArray::partition(&Tensor::from_ndarray(target.clone()), &layout).unwrap();
        tpa.scatter(&Tensor::from_ndarray(values.clone()), &it, axis, false)
            .unwrap();
        let mut expect = target;
        for (k, &r) in rows.iter().enumerate() {
            expect
                .index_axis_mut(Axis(axis), r)
                .assign(&values.index_axis(Axis(axis), k)); // later duplicates win
        }
        let after = tpa
            .assemble(None, false)
            .unwrap()
            .to_array::<i64>()
            .unwrap();
        assert_eq!(after, expect, "case {case}");
    }
}
