//! Exchanges of CUDA partitions staged through pinned host memory (feature
//! `kernel-host-tests`): every rank's partitions live on an emulated CUDA device of its own,
//! and [`ThreadComm`] takes host memory only, as an MPI that is not CUDA-aware. Each test's
//! devices are its own, so that the pinned allocations each device counts are the test's.

use std::sync::Arc;

use ndarray::{ArrayD, IxDyn};

use super::tests::block;
use super::*;
use crate::backend::cuda::CudaBackend;
use crate::backend::{Backend, BoxCopy};
use crate::device::{Device, DeviceType};
use crate::dtype::DType;
use crate::error::Error;
use crate::grid::Grid;
use crate::partitioned::{Data, PartitionedArray};
use crate::spmd::exchange::{assemble_with, Rounds};
use crate::tensor::Tensor;

/// The reference, built by hand: element `(i, j)` is `100 i + j`.
pub(super) fn reference(shape: [usize; 2]) -> ArrayD<f32> {
    ArrayD::from_shape_fn(IxDyn(&shape), |ix| (100 * ix[0] + ix[1]) as f32)
}

/// `a` on `be`'s device.
pub(super) fn upload(be: &CudaBackend, a: &ArrayD<f32>) -> Tensor {
    let host = Tensor::from(a.clone());
    let t = be.empty(host.shape(), DType::Float32).unwrap();
    be.transfer(&host, &t).unwrap();
    t
}

/// A device tensor's elements, copied to a host tensor of our own.
pub(super) fn download(be: &CudaBackend, t: &Tensor) -> ArrayD<f32> {
    let host = crate::backend::cpu::CpuBackend::shared(Device::CPU)
        .empty(t.shape(), t.dtype())
        .unwrap();
    be.transfer(t, &host).unwrap();
    host.to_array::<f32>().unwrap()
}

/// The emulated devices `base..base + ranks`, one per rank, each with its job-table scratch
/// (pinned too) already made, so that later pinned allocations are staging ones.
pub(super) fn devices(base: u32, ranks: usize) -> Vec<Arc<CudaBackend>> {
    (0..ranks as u32)
        .map(|r| {
            let be = CudaBackend::emulated(base + r);
            let t = be.empty(&[4], DType::UInt8).unwrap();
            let u = be.empty(&[4], DType::UInt8).unwrap();
            be.copy_boxes(&[BoxCopy::whole(&t, &u)]).unwrap();
            be.synchronize().unwrap();
            be
        })
        .collect()
}

/// Checks that `pa`'s local partitions on this rank hold the reference's boxes, and returns
/// how many there are.
pub(super) fn check_locals(be: &CudaBackend, pa: &PartitionedArray, a: &ArrayD<f32>) -> usize {
    let mut n = 0;
    for p in pa.partitions() {
        if let Data::Tensor(t) = p.data {
            assert_eq!(t.device(), be.device());
            assert_eq!(
                download(be, t),
                block(a, &p.start, &p.shape),
                "{:?}",
                p.position
            );
            n += 1;
        }
    }
    n
}

/// Rank 0: two boxes, rank 1: none, rank 2: two boxes, rank 3: none, of the uneven grid rows
/// [0, 3) [3, 7), columns [0, 2) [2, 5).
const SOURCE: [(usize, [usize; 2], [usize; 2]); 4] = [
    (0, [0, 0], [3, 2]),
    (2, [0, 2], [3, 3]),
    (2, [3, 0], [4, 2]),
    (0, [3, 2], [4, 3]),
];

/// The source array of [`SOURCE`] on this rank's device.
pub(super) fn source(comm: &ThreadComm, be: &CudaBackend, a: &ArrayD<f32>) -> PartitionedArray {
    let mine = (SOURCE.iter().filter(|b| b.0 == comm.rank()))
        .map(|(_, s, n)| (s.to_vec(), upload(be, &block(a, s, n))))
        .collect();
    from_local(comm, Ok(LocalParts::Placed(mine)), None).unwrap()
}

/// The uneven target: rows [0, 2) [2, 7), columns [0, 4) [4, 5), owned by ranks 1, 0, 2, 1
/// (rank 1, which has no source, receives; rank 3 has nothing at all).
pub(super) fn target(devs: &[Arc<CudaBackend>]) -> SpmdTarget {
    on_ranks(vec![vec![0, 2, 7], vec![0, 4, 5]], vec![1, 0, 2, 1], devs)
}

/// The grid of [`SOURCE`] with its owners, as a target.
pub(super) fn back(devs: &[Arc<CudaBackend>]) -> SpmdTarget {
    on_ranks(vec![vec![0, 3, 7], vec![0, 2, 5]], vec![0, 2, 2, 0], devs)
}

fn on_ranks(splits: Vec<Vec<usize>>, owners: Vec<usize>, devs: &[Arc<CudaBackend>]) -> SpmdTarget {
    SpmdTarget {
        grid: Grid::from_splits(&[7, 5], splits).unwrap(),
        devices: owners.iter().map(|&r| devs[r].device()).collect(),
        owners,
    }
}

#[test]
fn cuda_partitions_cross_ranks_through_pinned_memory_freed_once() {
    let a = reference([7, 5]);
    let devs = devices(20, 4);
    let before: Vec<_> = devs.iter().map(|d| d.emulated_pinned()).collect();
    let counts = ThreadComm::run(4, |comm| {
        let be = &devs[comm.rank()];
        assert!(!comm.accepts_device(be.device()), "the staging path runs");
        let pa = source(comm, be, &a);
        let (out, traffic) = repartition_to(comm, &pa, target(&devs), false).unwrap();
        let held = check_locals(be, &out, &a);
        assert_eq!(held, [1, 2, 1, 0][comm.rank()]);
        let first = be.emulated_pinned();
        // Back to the source grid (rank 1 sends and receives nothing), then the first
        // exchange again, whose sizes reuse the buffers kept from its first run.
        let (returned, _) = repartition_to(comm, &out, back(&devs), false).unwrap();
        assert_eq!(check_locals(be, &returned, &a), [2, 0, 2, 0][comm.rank()]);
        let second = be.emulated_pinned();
        let (again, _) = repartition_to(comm, &returned, target(&devs), false).unwrap();
        check_locals(be, &again, &a);
        let third = be.emulated_pinned();
        assert_eq!(third.allocs, second.allocs, "the kept buffers are reused");
        (traffic, first, third, be.kept_staging_bytes())
    });
    for (r, (traffic, first, again, kept)) in counts.into_iter().enumerate() {
        let base = before[r];
        let moved = traffic.sent.iter().chain(&traffic.received).any(|&b| b > 0);
        // Ranks 0 and 2 send and receive (a send and a receive buffer staged), rank 1 only
        // receives; rank 3 moves nothing and stages nothing.
        assert_eq!(moved, r != 3, "rank {r}: {traffic:?}");
        let staged = first.allocs - base.allocs;
        assert_eq!(staged, [2, 1, 2, 0][r], "rank {r}: pinned allocations");
        // Every staging buffer is back in the cache, and nothing else is live.
        assert_eq!(again.frees, base.frees, "rank {r}");
        assert_eq!(again.live_bytes - base.live_bytes, kept, "rank {r}");
        devs[r].release_staging();
        let after = devs[r].emulated_pinned();
        let made = again.allocs - base.allocs;
        assert_eq!(after.frees - base.frees, made, "rank {r}: each freed once");
        assert_eq!(after.live_bytes, base.live_bytes, "rank {r}");
        assert_eq!(devs[r].kept_staging_bytes(), 0);
    }
}

#[test]
fn pinned_memory_that_cannot_be_had_is_out_of_memory_and_the_exchange_stages_anyway() {
    let be = &devices(30, 1)[0];
    let base = be.emulated_pinned();
    // 1000 bytes beyond the job-table scratch's.
    be.set_emulated_pinned_limit(base.live_bytes + 1000);
    let small = be.empty_staging(&[100], DType::Float32).unwrap();
    assert_eq!(small.device().kind, DeviceType::CudaHost);
    drop(small);
    assert_eq!(be.kept_staging_bytes(), 400);
    match be.empty_staging(&[1000], DType::Float32) {
        Err(Error::OutOfMemory { bytes, device, .. }) => {
            assert_eq!((bytes, device.as_str()), (4000, "pinned host"))
        }
        other => panic!("expected OutOfMemory, got {other:?}"),
    }
    // Nothing was allocated or kept by the failed request; the kept buffer is still there.
    let now = be.emulated_pinned();
    assert_eq!((now.allocs, now.frees), (base.allocs + 1, base.frees));
    assert_eq!(now.live_bytes, base.live_bytes + 400);
    assert_eq!(be.kept_staging_bytes(), 400);
    be.release_staging();

    // An exchange whose devices have no pinned memory to give stages through pageable memory
    // instead of failing on one rank while the others wait in the exchange.
    let a = reference([7, 5]);
    let devs = devices(31, 4);
    for d in &devs {
        d.set_emulated_pinned_limit(0);
    }
    let before: Vec<_> = devs.iter().map(|d| d.emulated_pinned()).collect();
    ThreadComm::run(4, |comm| {
        let be = &devs[comm.rank()];
        let pa = source(comm, be, &a);
        let (out, _) = repartition_to(comm, &pa, target(&devs), false).unwrap();
        check_locals(be, &out, &a);
    });
    for (d, b) in devs.iter().zip(before) {
        assert_eq!(
            d.emulated_pinned(),
            b,
            "{}: no pinned allocation",
            d.device()
        );
    }
}

#[test]
fn ranks_assembling_everywhere_onto_devices_of_their_own_agree_on_the_rounds() {
    // Sources cut into rounds of two elements where every rank's side is in host memory.
    // Case 0: rank 1 names its CUDA device, the others the host. Case 1: rank 1 its CUDA
    // device, rank 3 the host, ranks 0 and 2 none (their first partition's, the host). Case
    // 2: none names one, and rank 2's sources are on its CUDA device (so is its target). A
    // rank whose own target is in host memory guesses rounds, one whose target is on a
    // device one round: the ranks settle on one round, and those that guessed rounds make
    // their buffers again.
    let a = reference([7, 5]);
    let devs = devices(40, 4);
    let rounds = Rounds {
        bytes: 8,
        min_bytes: 0,
    };
    for case in 0..3 {
        let (a, devs) = (a.clone(), devs.clone());
        super::tests::within_a_minute(4, move |comm| {
            let me = comm.rank();
            let be = &devs[me];
            let on_device = case == 2 && me == 2;
            let mine = (SOURCE.iter().filter(|b| b.0 == me))
                .map(|(_, s, n)| {
                    let b = block(&a, s, n);
                    let t = match on_device {
                        true => upload(be, &b),
                        false => Tensor::from(b),
                    };
                    (s.to_vec(), t)
                })
                .collect();
            let pa = from_local(comm, Ok(LocalParts::Placed(mine)), None).unwrap();
            let device = match (case, me) {
                (0 | 1, 1) => Some(be.device()),
                (0, _) | (1, 3) => Some(Device::CPU),
                _ => None,
            };
            let whole = assemble_with(comm, &pa, None, device, true, &rounds)
                .unwrap()
                .expect("every rank assembles");
            let here = match on_device {
                true => be.device(),
                false => Device::CPU,
            };
            assert_eq!(whole.device(), device.unwrap_or(here), "case {case}");
            let got = match whole.device() == be.device() {
                true => download(be, &whole),
                false => whole.to_array::<f32>().unwrap(),
            };
            assert_eq!(got, a, "case {case}: rank {me}");
        });
    }
}

/// New `kDLCUDAHost` partitions across ranks are page-locked memory from CUDA, as in one
/// process, not plain host memory labelled so: host blocks dealt over the ranks onto pinned
/// memory, a gather from those partitions, and an assemble onto rank 0's first partition's
/// device each allocate pinned memory of the rank's own (emulated) device, and hold the
/// reference's elements.
#[test]
fn new_pinned_partitions_across_ranks_are_page_locked_memory_from_cuda() {
    use crate::backend::cpu::pin_host_memory_on;
    use crate::layout::Layout;
    let a = reference([7, 5]);
    let devs = devices(70, 4);
    let pinned = Device::new(DeviceType::CudaHost, 0).unwrap();
    let before: Vec<usize> = devs.iter().map(|d| d.emulated_pinned().allocs).collect();
    // A rank failing alone would leave the others waiting: a failure, not a hang.
    let made = super::tests::within_a_minute(4, move |comm| {
        let me = comm.rank();
        let be = &devs[me];
        pin_host_memory_on(Some(be.device()));
        let allocs = || be.emulated_pinned().allocs - before[me];
        let mine = (SOURCE.iter().filter(|b| b.0 == me))
            .map(|(_, s, n)| (s.to_vec(), Tensor::from(block(&a, s, n))))
            .collect();
        let pa = from_local(comm, Ok(LocalParts::Placed(mine)), None).unwrap();
        let held = |pa: &PartitionedArray, a: &ArrayD<f32>| {
            let mut n = 0;
            for p in pa.partitions() {
                assert_eq!(p.locations[0].device, pinned, "{:?}", p.position);
                if let Data::Tensor(t) = p.data {
                    assert_eq!(t.device(), pinned, "{:?}", p.position);
                    let got = t.to_array::<f32>().unwrap();
                    assert_eq!(got, block(a, &p.start, &p.shape), "{:?}", p.position);
                    n += 1;
                }
            }
            n
        };
        // Blocks of 2x2 on a 2x2 process grid: 4, 2, 4 and 2 blocks on ranks 0 to 3.
        let dealt = Layout::block_cyclic(&[2, 2], vec![pinned; 4]);
        let (cyclic, _) = repartition(comm, &pa, &dealt, true).unwrap();
        let blocks = held(&cyclic, &a);
        let after_repartition = allocs();
        // numpy.take(a, [4, 0], 1): each row block on the rank holding its column 4.
        let picks = Tensor::from_slice(&[4i64, 0], &[2]).unwrap();
        let (taken, _) = gather(comm, &cyclic, &picks, 1).unwrap();
        let columns = ndarray::concatenate![
            ndarray::Axis(1),
            block(&a, &[0, 4], &[7, 1]),
            block(&a, &[0, 0], &[7, 1])
        ];
        let slabs = held(&taken, &columns);
        let after_gather = allocs();
        let whole = assemble(comm, &cyclic, Some(0), None, false).unwrap();
        if let Some(whole) = &whole {
            assert_eq!(whole.device(), pinned);
            assert_eq!(whole.to_array::<f32>().unwrap(), a);
        }
        pin_host_memory_on(None);
        (blocks, after_repartition, slabs, after_gather, allocs())
    });
    for (r, &(blocks, repartitioned, slabs, gathered, assembled)) in made.iter().enumerate() {
        assert_eq!(blocks, [4, 2, 4, 2][r], "rank {r}");
        assert_eq!(slabs, [2, 0, 2, 0][r], "rank {r}");
        // One pinned allocation per new block, on the rank's own device, and one per new
        // slab: the gather picks into plain kDLCPU scratch (`ops::gather_scratch`), never
        // into new pinned memory.
        assert_eq!(repartitioned, blocks, "rank {r}");
        assert_eq!(gathered - repartitioned, slabs, "rank {r}");
        assert_eq!(assembled - gathered, usize::from(r == 0), "rank {r}");
    }
}

/// A scalar (a 0-d host value) scattered into CUDA partitions: each rank copies its one
/// element to its device and writes it there, with no transfer; a row of host values is
/// still refused, on every rank, and nothing is written.
#[test]
fn a_host_scalar_scatters_into_every_ranks_cuda_partitions() {
    let a = reference([7, 5]);
    let devs = devices(130, 4);
    ThreadComm::run(4, |comm| {
        let be = &devs[comm.rank()];
        let pa = source(comm, be, &a);
        // numpy: a[[6, 1, 3]] = 9, then a[:, 4] = -1 (one index drops the axis)
        let nine = Tensor::from_slice(&[9.0f32], &[]).unwrap();
        scatter(comm, &pa, &nine, [6i64, 1, 3], 0).unwrap();
        let mut want = a.clone();
        for i in [6, 1, 3] {
            want.index_axis_mut(ndarray::Axis(0), i).fill(9.0);
        }
        let held = check_locals(be, &pa, &want);
        assert_eq!(held, [2, 0, 2, 0][comm.rank()]);
        let minus = Tensor::from_slice(&[-1.0f32], &[]).unwrap();
        scatter(comm, &pa, &minus, 4i64, 1).unwrap();
        want.index_axis_mut(ndarray::Axis(1), 4).fill(-1.0);
        check_locals(be, &pa, &want);
        let row = Tensor::from(ArrayD::<f32>::zeros(IxDyn(&[1, 5])));
        let e = scatter(comm, &pa, &row, [0i64], 0).unwrap_err();
        assert!(e.to_string().contains("device"), "{e}");
        check_locals(be, &pa, &want);
    });
}
