//! `copy_plan` on the CPU (whole repartition plans) against `copy_boxes` on the same boxes.

use std::sync::Arc;

use super::{in_pool, Buf, Rng, REVERSED, TINY, TRIALS};
use crate::backend::cpu::copy::{Tuning, TUNING};
use crate::backend::cpu::{repart, CpuBackend};
use crate::backend::{Backend, BoxCopy};
use crate::device::Device;
use crate::dtype::DType;
use crate::grid::Grid;
use crate::plan::Plan;
use crate::tensor::{Owner, Tensor};

const DTYPES: [DType; 5] = [
    DType::Int8,
    DType::Int16,
    DType::Int32,
    DType::Int64,
    DType::Complex128,
];

/// A tensor over the bytes of `b`, and where those bytes lie (to read them back).
fn tensor(mut b: Buf, dtype: DType) -> (Tensor, *const u8, usize) {
    assert_eq!(b.itemsize, dtype.itemsize());
    let (ptr, len) = (b.bytes.as_mut_ptr(), b.bytes.len());
    let data = ptr.wrapping_add(b.base);
    // Moving the Vec into the owner leaves its heap buffer, and so `ptr`, where it is.
    let owner: Owner = Arc::new(b.bytes);
    // SAFETY: `Buf` lays out every element of `shape` with `strides` from `base` inside its
    // bytes, which `owner` keeps alive.
    let t = unsafe {
        Tensor::from_raw_parts(data, b.shape, b.strides, dtype, Device::CPU, false, owner)
    };
    (t, ptr, len)
}

/// The bytes under `(ptr, len)` from [`tensor`], whose tensor is still alive.
fn bytes(ptr: *const u8, len: usize) -> Vec<u8> {
    // SAFETY: the owner of these bytes is alive (caller), and no copy is running.
    unsafe { std::slice::from_raw_parts(ptr, len) }.to_vec()
}

/// Random split points of `n` into up to 4 slabs, some of them empty.
fn splits(rng: &mut Rng, n: usize) -> Vec<usize> {
    let k = 1 + rng.below(4);
    let mut cuts: Vec<usize> = (0..k - 1).map(|_| rng.below(n + 1)).collect();
    cuts.sort_unstable();
    let mut s = vec![0];
    s.extend(cuts);
    s.push(n);
    s
}

fn views(whole: &Tensor, grid: &Grid) -> Vec<Tensor> {
    (0..grid.num_partitions())
        .map(|i| {
            let r = grid.region_at(i);
            whole.view(&r.start, &r.shape).unwrap()
        })
        .collect()
}

/// The reference: every box of `plan` through `copy_boxes`.
fn reference(plan: &Plan, src: &[&Tensor], dst: &[&Tensor]) {
    let jobs: Vec<BoxCopy<'_>> = plan
        .ops()
        .map(|op| op.on(src, dst).expect("one tensor per partition"))
        .collect();
    CpuBackend {
        device: Device::CPU,
    }
    .copy_boxes(&jobs)
    .unwrap();
}

fn run(plan: &Plan, src: &[&Tensor], dst: &[&Tensor], tuning: &Tuning) {
    in_pool(|| repart::copy_plan(plan, src, dst, tuning)).unwrap();
}

/// One random case: sources are views of a randomly laid out array (dims permuted, flipped,
/// some of stride 0); targets are views of another one, or new contiguous tensors.
fn trial(rng: &mut Rng, shape: &[usize], tuning: &Tuning) {
    let sg = Grid::from_splits(shape, shape.iter().map(|&n| splits(rng, n)).collect()).unwrap();
    let dg = Grid::from_splits(shape, shape.iter().map(|&n| splits(rng, n)).collect()).unwrap();
    let dtype = DTYPES[rng.below(DTYPES.len())];
    trial_between(rng, &sg, &dg, dtype, tuning);
}

fn trial_between(rng: &mut Rng, sg: &Grid, dg: &Grid, dtype: DType, tuning: &Tuning) {
    let (shape, item) = (sg.shape(), dtype.itemsize());
    let (sg, dg) = (sg.clone(), dg.clone());
    let plan = Plan::new(&sg, &dg).unwrap();
    let (whole, _, _) = tensor(Buf::random(rng, shape, item, true), dtype);
    let src = views(&whole, &sg);
    let src: Vec<&Tensor> = src.iter().collect();
    if rng.below(2) == 0 {
        let out = Buf::random(rng, shape, item, false);
        let (a, pa, len) = tensor(out.clone(), dtype);
        let (b, pb, _) = tensor(out, dtype);
        let (va, vb) = (views(&a, &dg), views(&b, &dg));
        run(&plan, &src, &va.iter().collect::<Vec<_>>(), tuning);
        reference(&plan, &src, &vb.iter().collect::<Vec<_>>());
        assert_eq!(
            bytes(pa, len),
            bytes(pb, len),
            "{shape:?} {dtype} {sg} -> {dg}"
        );
    } else {
        let be = CpuBackend {
            device: Device::CPU,
        };
        let new = || -> Vec<Tensor> {
            (0..dg.num_partitions())
                .map(|j| be.empty(&dg.region_at(j).shape, dtype).unwrap())
                .collect()
        };
        let (a, b) = (new(), new());
        run(&plan, &src, &a.iter().collect::<Vec<_>>(), tuning);
        reference(&plan, &src, &b.iter().collect::<Vec<_>>());
        for (x, y) in a.iter().zip(&b) {
            assert_eq!(
                bytes(x.data_ptr(), x.nbytes()),
                bytes(y.data_ptr(), y.nbytes()),
                "{shape:?} {dtype} {sg} -> {dg}"
            );
        }
    }
}

#[test]
fn random_plans_match_copy_boxes() {
    let mut rng = Rng::new(17);
    for t in 0..TRIALS * 8 {
        let nd = rng.below(5);
        let shape: Vec<usize> = (0..nd).map(|_| rng.below(10)).collect();
        let tuning = [TINY, REVERSED, TUNING][t % 3];
        trial(&mut rng, &shape, &tuning);
    }
}

#[test]
#[cfg_attr(miri, ignore = "large boxes are slow under Miri")]
fn boxes_large_enough_to_split_match_copy_boxes() {
    let mut rng = Rng::new(5);
    for t in 0..6 {
        let tuning = [TINY, TUNING][t % 2];
        trial(&mut rng, &[300, 200], &tuning);
    }
}

#[test]
#[cfg_attr(miri, ignore = "streaming mode needs megabytes, slow under Miri")]
fn row_groups_in_streaming_mode_match_copy_boxes() {
    // Over 2 MiB, so rows run with streaming stores and by row groups: 2x2 blocks into blocks
    // of 16 or 24 (64 or 96 bytes of int32, whole lines or not), into new tensors or views.
    let mut rng = Rng::new(9);
    let shape = [640, 1000];
    let sg = Grid::even(&shape, &[2, 2]).unwrap();
    for (t, b) in [16, 24, 16, 24].into_iter().enumerate() {
        let blocks: Vec<Vec<usize>> = shape
            .iter()
            .map(|&n| (0..n).step_by(b).chain([n]).collect())
            .collect();
        let dg = Grid::from_splits(&shape, blocks).unwrap();
        let tuning = [TUNING, TINY][t / 2];
        trial_between(&mut rng, &sg, &dg, DType::Int32, &tuning);
    }
}

#[test]
fn a_box_reading_what_it_writes_reads_it_first() {
    // One partition: the target is the source reversed, in the same memory.
    let vals: Vec<i32> = (0..10).collect();
    let t = Tensor::from_slice(&vals, &[10]).unwrap();
    // SAFETY: the ten elements of `t`, last first, kept alive by its owner.
    let rev = unsafe {
        Tensor::from_raw_parts(
            t.data_ptr().wrapping_add(36),
            vec![10],
            vec![-1],
            DType::Int32,
            Device::CPU,
            false,
            t.owner().clone(),
        )
    };
    let g = Grid::even(&[10], &[1]).unwrap();
    let plan = Plan::new(&g, &g).unwrap();
    for tuning in [TINY, TUNING] {
        run(&plan, &[&t], &[&rev], &tuning);
        let got = t.to_array::<i32>().unwrap().into_raw_vec_and_offset().0;
        assert_eq!(got, (0..10).rev().collect::<Vec<_>>());
        run(&plan, &[&t], &[&rev], &tuning); // and back
    }
    // Identity into the very same views: nothing changes.
    let whole = Tensor::from_slice(&(0..24).collect::<Vec<i32>>(), &[4, 6]).unwrap();
    let g = Grid::even(&[4, 6], &[2, 3]).unwrap();
    let parts = views(&whole, &g);
    let refs: Vec<&Tensor> = parts.iter().collect();
    run(&Plan::new(&g, &g).unwrap(), &refs, &refs, &TINY);
    assert_eq!(
        whole.to_array::<i32>().unwrap().into_raw_vec_and_offset().0,
        (0..24).collect::<Vec<_>>()
    );
}

#[test]
fn tensors_not_matching_the_grids_are_refused() {
    let b = CpuBackend {
        device: Device::CPU,
    };
    let g = Grid::even(&[4, 6], &[2, 1]).unwrap();
    let plan = Plan::new(&g, &g).unwrap();
    let src: Vec<Tensor> = (0..2)
        .map(|_| b.empty(&[2, 6], DType::Int32).unwrap())
        .collect();
    let bad = b.empty(&[2, 5], DType::Int32).unwrap();
    let other = b.empty(&[2, 6], DType::Int64).unwrap();
    let readonly = src[1].with_readonly(true).unwrap();
    let s: Vec<&Tensor> = src.iter().collect();
    for (dst, what) in [
        (vec![&src[0], &bad], "shape (2, 6)"),
        (vec![&src[0]], "one target tensor per partition"),
        (vec![&other, &other], "dtypes differ"),
        (vec![&src[0], &readonly], "read-only"),
    ] {
        let e = repart::copy_plan(&plan, &s, &dst, &TUNING)
            .unwrap_err()
            .to_string();
        assert!(e.contains(what), "{e}");
    }
}
