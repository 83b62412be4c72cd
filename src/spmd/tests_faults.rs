//! A driver error on one rank of an exchange staged through pinned memory (feature
//! `kernel-host-tests`): the emulated CUDA driver fails one given copy, and every rank must
//! return the same error, in bounded time, with the pinned buffers freed once.

use std::sync::mpsc;
use std::sync::Arc;
use std::time::Duration;

use ndarray::{ArrayD, IxDyn};

use super::tests_staged::{check_locals, devices, download, reference, source, target, upload};
use super::*;
use crate::backend::cuda::{CudaBackend, EmulatedCall, PinnedCounts};
use crate::backend::Backend;
use crate::partitioned::{Data, PartitionedArray};

/// `f` on `ranks` ranks, or a panic when they have not all returned within a minute: a rank
/// left waiting in a collective fails the test instead of hanging it (its threads stay
/// blocked until the test process exits).
fn finishing<T: Send + 'static>(
    ranks: usize,
    f: impl Fn(&ThreadComm) -> T + Send + Sync + 'static,
) -> Vec<T> {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(ThreadComm::run(ranks, f));
    });
    match rx.recv_timeout(Duration::from_secs(60)) {
        Ok(out) => out,
        Err(mpsc::RecvTimeoutError::Timeout) => panic!("a rank was left waiting"),
        Err(e) => panic!("a rank panicked: {e}"),
    }
}

/// Checks that every rank returned the same error, of `kind`, naming the failed rank first
/// (`prefix`, "rank N: ") and holding `holds`.
fn same_error_everywhere(out: &[(String, String)], kind: &str, prefix: &str, holds: &str) {
    assert!(out.iter().all(|o| o == &out[0]), "{out:?}");
    assert_eq!(out[0].0, kind);
    let msg = &out[0].1;
    assert!(msg.starts_with(prefix) && msg.contains(holds), "{msg}");
}

/// The partitions of [`target`] that are this rank's, zeros on its device, as one SPMD array.
fn zeros(comm: &ThreadComm, devs: &[Arc<CudaBackend>]) -> PartitionedArray {
    let t = target(devs);
    let be = &devs[comm.rank()];
    let mine = (0..t.owners.len())
        .filter(|&j| t.owners[j] == comm.rank())
        .map(|j| {
            let r = t.grid.region_at(j);
            (r.start, upload(be, &ArrayD::zeros(IxDyn(&r.shape))))
        })
        .collect();
    from_local(comm, Ok(LocalParts::Placed(mine)), Some(&[7, 5])).unwrap()
}

/// Whether every local partition of `pa` on `be` holds zeros only.
fn all_zero(be: &CudaBackend, pa: &PartitionedArray) -> bool {
    pa.data().iter().all(|d| match d {
        Data::Tensor(t) => download(be, t).iter().all(|&x| x == 0.0),
        _ => true,
    })
}

/// Checks that every pinned buffer `devs` allocated since `before` was freed exactly once.
fn freed_once(devs: &[Arc<CudaBackend>], before: &[PinnedCounts]) {
    for (d, b) in devs.iter().zip(before) {
        d.release_staging();
        let now = d.emulated_pinned();
        let (made, freed) = (now.allocs - b.allocs, now.frees - b.frees);
        assert_eq!(made, freed, "{}: each pinned buffer freed once", d.device());
        assert_eq!(now.live_bytes, b.live_bytes, "{}", d.device());
    }
}

#[test]
fn a_staging_copy_failing_on_one_rank_fails_every_rank_and_writes_nothing() {
    let a = reference([7, 5]);
    let devs = devices(50, 4);
    let before: Vec<_> = devs.iter().map(|d| d.emulated_pinned()).collect();
    let ranks = devs.clone();
    let out = finishing(4, move |comm| {
        let be = &ranks[comm.rank()];
        let pa = source(comm, be, &a);
        let into = zeros(comm, &ranks);
        // Rank 2's next device -> host copy is the staging of what it sends.
        if comm.rank() == 2 {
            be.fail_emulated(EmulatedCall::CopyDtoh, 0);
        }
        let e = repartition_into(comm, &pa, &into, false).unwrap_err();
        assert!(be.emulated_faults_spent());
        assert!(all_zero(be, &into), "rank {}: nothing written", comm.rank());
        // The ranks are in step: the same exchange goes through now.
        repartition_into(comm, &pa, &into, false).unwrap();
        check_locals(be, &into, &a);
        (e.kind().to_string(), e.to_string())
    });
    same_error_everywhere(&out, "RuntimeError", "rank 2: ", "cuMemcpyDtoHAsync");
    freed_once(&devs, &before);
}

#[test]
fn a_scatter_failing_on_one_rank_while_it_prepares_fails_every_rank_and_writes_nothing() {
    let a = reference([7, 5]);
    let devs = devices(62, 4);
    let ranks = devs.clone();
    let out = finishing(4, move |comm| {
        let be = &ranks[comm.rank()];
        let pa = source(comm, be, &a);
        // Columns 1 and 3 (one in each column slab of the source) become 1000 + row.
        let idx = Tensor::from_slice(&[1i64, 3], &[2]).unwrap();
        let new = ArrayD::from_shape_fn(IxDyn(&[7, 2]), |ix| (1000 + ix[0]) as f32);
        let values = upload(be, &new);
        // Rank 2 holds partitions of both slabs: its next device allocation is for the first
        // rows it picks, before the ranks agree.
        if comm.rank() == 2 {
            be.fail_emulated(EmulatedCall::Alloc, 0);
        }
        let e = scatter(comm, &pa, &values, &idx, 1).unwrap_err();
        assert!(be.emulated_faults_spent());
        check_locals(be, &pa, &a);
        // No rank went on alone: the same scatter now goes through on every rank.
        scatter(comm, &pa, &values, &idx, 1).unwrap();
        let mut want = a.clone();
        for (k, &j) in [1usize, 3].iter().enumerate() {
            for i in 0..7 {
                want[[i, j]] = new[[i, k]];
            }
        }
        check_locals(be, &pa, &want);
        (e.kind().to_string(), e.to_string())
    });
    same_error_everywhere(&out, "MemoryError", "rank 2: ", "cuMemAlloc");
}

#[test]
fn a_copy_to_the_device_failing_after_the_exchange_fails_every_rank() {
    let a = reference([7, 5]);
    let devs = devices(54, 4);
    let before: Vec<_> = devs.iter().map(|d| d.emulated_pinned()).collect();
    let ranks = devs.clone();
    let out = finishing(4, move |comm| {
        let be = &ranks[comm.rank()];
        let pa = source(comm, be, &a);
        // Rank 1 only receives: its next host -> device copy is that of what arrived.
        if comm.rank() == 1 {
            be.fail_emulated(EmulatedCall::CopyHtod, 0);
        }
        let e = repartition_to(comm, &pa, target(&ranks), false).unwrap_err();
        assert!(be.emulated_faults_spent());
        // No rank goes on alone: the next collective finds every rank there.
        let (again, _) = repartition_to(comm, &pa, target(&ranks), false).unwrap();
        check_locals(be, &again, &a);
        (e.kind().to_string(), e.to_string())
    });
    same_error_everywhere(&out, "RuntimeError", "rank 1: ", "cuMemcpyHtoDAsync");
    freed_once(&devs, &before);
}
