//! Exchanges across ranks in which a rank's own sources and targets are on devices that are
//! not one memory (with `transfer`; feature `kernel-host-tests`): host partitions into a
//! rank's emulated CUDA device, its CUDA partitions into host memory, one of its GPUs into
//! another. Only the plan's boxes cross between a rank's devices; each test's devices are its
//! own, so that the copies each device counts are the test's.

use std::sync::Arc;

use ndarray::ArrayD;

use super::tests::{block, expected_traffic};
use super::tests_staged::{devices, download, reference, upload};
use super::*;
use crate::backend::cuda::CudaBackend;
use crate::backend::Backend;
use crate::device::Device;
use crate::error::Error;
use crate::grid::Grid;
use crate::partitioned::{Data, PartitionedArray};
use crate::test_rng::Rng;

/// Where rank `me` of `ranks` keeps its sources or targets, by `kind`: the host (0), its first
/// emulated GPU (1, `gpus[me]`) or its second (2, `gpus[ranks + me]`).
fn on(kind: usize, gpus: &[Arc<CudaBackend>], me: usize, ranks: usize) -> Device {
    match kind {
        0 => Device::CPU,
        1 => gpus[me].device(),
        _ => gpus[ranks + me].device(),
    }
}

/// `t`'s elements, read on the host.
fn values(gpus: &[Arc<CudaBackend>], t: &Tensor) -> ArrayD<f32> {
    match gpus.iter().find(|g| g.device() == t.device()) {
        Some(g) => download(g, t),
        None => t.to_array::<f32>().unwrap(),
    }
}

/// A grid over `shape` with up to three parts per axis, none empty.
fn random_grid(rng: &mut Rng, shape: &[usize]) -> Grid {
    let splits = (shape.iter())
        .map(|&n| {
            let mut s: Vec<usize> = (0..rng.below(3)).map(|_| 1 + rng.below(n)).collect();
            s.extend([0, n]);
            s.sort_unstable();
            s.dedup();
            s
        })
        .collect();
    Grid::from_splits(shape, splits).unwrap()
}

/// Rank `me`'s partitions of `a` over `grid` (those `owners` gives it) on `device`.
fn sources_on(
    comm: &ThreadComm,
    gpus: &[Arc<CudaBackend>],
    a: &ArrayD<f32>,
    (grid, owners): (&Grid, &[usize]),
    device: Device,
) -> PartitionedArray {
    let mine = (0..grid.num_partitions())
        .filter(|&f| owners[f] == comm.rank())
        .map(|f| {
            let r = grid.region_at(f);
            let b = block(a, &r.start, &r.shape);
            let t = match gpus.iter().find(|g| g.device() == device) {
                Some(g) => upload(g, &b),
                None => Tensor::from(b),
            };
            (r.start, t)
        })
        .collect();
    from_local(comm, Ok(LocalParts::Placed(mine)), None).unwrap()
}

/// Checks that `pa`'s partitions held here are on `device` and hold `a`'s boxes.
fn check_held(gpus: &[Arc<CudaBackend>], pa: &PartitionedArray, a: &ArrayD<f32>, device: Device) {
    for p in pa.partitions() {
        if let Data::Tensor(t) = p.data {
            assert_eq!(t.device(), device, "{:?}", p.position);
            let want = block(a, &p.start, &p.shape);
            assert_eq!(values(gpus, t), want, "{:?}", p.position);
        }
    }
}

/// Random grids, owners and devices, each rank's sources on one of its devices and its
/// targets on one (the same or another): a repartition with `transfer` holds ndarray's boxes
/// on every rank, on the devices named, and moves what the plan moves; without `transfer` it
/// is refused on every rank exactly when some rank's sources and targets are not one memory.
/// An assemble onto a root's device, and onto every rank's own, gives the whole array.
#[test]
fn ranks_whose_sources_and_targets_are_on_different_devices_match_ndarray() {
    const RANKS: usize = 3;
    let gpus = devices(140, 2 * RANKS);
    let mut rng = Rng(0x5eed_c405);
    for case in 0..40 {
        let shape = [1 + rng.below(7), 1 + rng.below(6)];
        let a = reference(shape);
        let src = random_grid(&mut rng, &shape);
        let src_owners: Vec<usize> = (0..src.num_partitions())
            .map(|_| rng.below(RANKS))
            .collect();
        let dst = random_grid(&mut rng, &shape);
        let dst_owners: Vec<usize> = (0..dst.num_partitions())
            .map(|_| rng.below(RANKS))
            .collect();
        let kinds = |rng: &mut Rng| -> Vec<usize> { (0..RANKS).map(|_| rng.below(3)).collect() };
        let (src_kind, dst_kind, own_kind) = (kinds(&mut rng), kinds(&mut rng), kinds(&mut rng));
        let root = rng.below(RANKS);
        let what = format!(
            "case {case}: {src:?} {src_owners:?} on {src_kind:?} -> {dst:?} {dst_owners:?} on \
             {dst_kind:?}"
        );
        // A rank holding sources and targets on two memories needs `transfer`.
        let crossing = (0..RANKS).any(|r| {
            src_owners.contains(&r) && dst_owners.contains(&r) && src_kind[r] != dst_kind[r]
        });
        let gpus = &gpus;
        let (src, dst) = (&src, &dst);
        let (src_owners, dst_owners) = (&src_owners, &dst_owners);
        let (src_kind, dst_kind, own_kind) = (&src_kind, &dst_kind, &own_kind);
        let (a, what) = (&a, &what);
        ThreadComm::run(RANKS, |comm| {
            let me = comm.rank();
            let pa = sources_on(
                comm,
                gpus,
                a,
                (src, src_owners),
                on(src_kind[me], gpus, me, RANKS),
            );
            let target = SpmdTarget {
                grid: dst.clone(),
                owners: dst_owners.clone(),
                devices: (dst_owners.iter())
                    .map(|&r| on(dst_kind[r], gpus, r, RANKS))
                    .collect(),
            };
            match repartition_to(comm, &pa, target.clone(), false) {
                Err(Error::DeviceMismatch { .. } | Error::Collective { .. }) if crossing => {}
                Ok(_) if !crossing => {}
                other => panic!("{what}: rank {me} without transfer: {other:?}"),
            }
            let (out, traffic) = repartition_to(comm, &pa, target, true).unwrap();
            check_held(gpus, &out, a, on(dst_kind[me], gpus, me, RANKS));
            let (sent, local) = expected_traffic(src, src_owners, dst, dst_owners, me, RANKS);
            assert_eq!((traffic.sent, traffic.local), (sent, local), "{what}");
            // Onto the root's device of `own_kind`, then every rank onto its own.
            let there = on(own_kind[root], gpus, root, RANKS);
            let whole = assemble(comm, &pa, Some(root), Some(there), true).unwrap();
            assert_eq!(whole.is_some(), me == root, "{what}");
            if let Some(t) = whole {
                assert_eq!((t.device(), values(gpus, &t)), (there, a.clone()), "{what}");
            }
            let mine = on(own_kind[me], gpus, me, RANKS);
            let t = assemble(comm, &out, None, Some(mine), true)
                .unwrap()
                .unwrap();
            assert_eq!((t.device(), values(gpus, &t)), (mine, a.clone()), "{what}");
        });
    }
}

/// Rows of a 6 x 6 array, three row blocks on rank 0 (each cut in two columns) and one on
/// rank 1, repartitioned into column blocks (columns [0, 2) on rank 0, [2, 6) on rank 1): a
/// rank's sources on its GPU and its targets in host memory bring back from the device what
/// the rank keeps and what it sends, once each, in one copy each, however many partitions hold
/// it; sources in host memory and targets on the GPU bring nothing back from the device (the
/// boxes a rank sends never go there), and the arrays are ndarray's.
#[test]
fn only_the_boxes_of_the_plan_cross_between_a_ranks_devices() {
    let a = reference([6, 6]);
    let gpus = devices(150, 2);
    let src = Grid::from_splits(&[6, 6], vec![vec![0, 1, 3, 4, 6], vec![0, 3, 6]]).unwrap();
    let src_owners = [0, 0, 0, 0, 0, 0, 1, 1];
    let dst = Grid::from_splits(&[6, 6], vec![vec![0, 6], vec![0, 2, 6]]).unwrap();
    let dst_owners = [0, 1];
    for gpu_to_host in [true, false] {
        let counts = ThreadComm::run(2, |comm| {
            let me = comm.rank();
            // Sources on the GPU (kind 1) and targets on the host (kind 0), or the reverse.
            let (from, to) = match gpu_to_host {
                true => (1, 0),
                false => (0, 1),
            };
            let pa = sources_on(comm, &gpus, &a, (&src, &src_owners), on(from, &gpus, me, 2));
            let target = SpmdTarget {
                grid: dst.clone(),
                owners: dst_owners.to_vec(),
                devices: dst_owners.iter().map(|&r| on(to, &gpus, r, 2)).collect(),
            };
            let to = on(to, &gpus, me, 2);
            let before = gpus[me].emulated_copies();
            let (out, traffic) = repartition_to(comm, &pa, target, true).unwrap();
            let after = gpus[me].emulated_copies();
            check_held(&gpus, &out, &a, to);
            (traffic, before, after)
        });
        for (r, (traffic, before, after)) in counts.into_iter().enumerate() {
            let what = format!("rank {r}, GPU to host: {gpu_to_host}");
            let (sent, local) = expected_traffic(&src, &src_owners, &dst, &dst_owners, r, 2);
            assert_eq!((&traffic.sent, traffic.local), (&sent, local), "{what}");
            let sent: u64 = sent.iter().sum();
            // Rank 0 keeps and sends parts of six partitions, rank 1 of two.
            assert!(local > 0 && sent > 0, "{what}");
            let back = (
                after.dtoh - before.dtoh,
                after.dtoh_bytes - before.dtoh_bytes,
            );
            match gpu_to_host {
                true => assert_eq!(back, (2, (local + sent) as usize), "{what}"),
                false => assert_eq!(back, (0, 0), "{what}"),
            }
        }
    }
}

/// A copy from rank 0's GPU failing while the boxes it keeps or sends cross into its host
/// targets (the first copy back, or the second) fails every rank with the same error naming
/// the driver call, before any rank writes a target; the same exchange then goes through.
#[test]
fn a_crossing_copy_failing_on_one_rank_fails_every_rank_and_writes_nothing() {
    let a = reference([6, 6]);
    let gpus = devices(156, 2);
    let src = Grid::from_splits(&[6, 6], vec![vec![0, 1, 3, 4, 6], vec![0, 3, 6]]).unwrap();
    let src_owners = [0, 0, 0, 0, 0, 0, 1, 1];
    // Column block `r` on rank `r`, in host memory.
    let dst = Grid::from_splits(&[6, 6], vec![vec![0, 6], vec![0, 2, 6]]).unwrap();
    for skip in 0..2 {
        gpus[0].fail_emulated(crate::backend::cuda::EmulatedCall::CopyDtoh, skip);
        let (a, gpus2) = (a.clone(), gpus.clone());
        let (src, dst) = (src.clone(), dst.clone());
        let out = super::tests::within_a_minute(2, move |comm| {
            let me = comm.rank();
            let pa = sources_on(comm, &gpus2, &a, (&src, &src_owners), gpus2[me].device());
            let r = dst.region_at(me);
            let zeros = Tensor::from(ArrayD::<f32>::zeros(r.shape.clone()));
            let placed = LocalParts::Placed(vec![(r.start, zeros.clone())]);
            let into = from_local(comm, Ok(placed), None).unwrap();
            let e = repartition_into(comm, &pa, &into, true).unwrap_err();
            let untouched = zeros.to_array::<f32>().unwrap().iter().all(|&x| x == 0.0);
            repartition_into(comm, &pa, &into, true).unwrap();
            let want = block(&a, &dst.region_at(me).start, &dst.region_at(me).shape);
            assert_eq!(zeros.to_array::<f32>().unwrap(), want, "rank {me}");
            (e.to_string(), untouched)
        });
        assert!(gpus[0].emulated_faults_spent(), "skip {skip}");
        assert_eq!(
            out[0].0, out[1].0,
            "skip {skip}: the same error on every rank"
        );
        assert!(
            out[0].0.contains("cuMemcpyDtoHAsync"),
            "skip {skip}: {}",
            out[0].0
        );
        assert!(out.iter().all(|o| o.1), "skip {skip}: a target was written");
    }
}
