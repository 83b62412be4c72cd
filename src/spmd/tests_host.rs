//! The one transfer rule across ranks, as in one process: a rank's data moving between host
//! memory of any kinds (`kDLCPU`, an emulated `kDLCPU:k`, pinned, managed, ROCm host memory)
//! is a plain copy, which needs no `transfer`; a rank's data in device memory moving to the
//! host still needs it. The other kinds of host memory are ordinary memory labelled so here,
//! and none of these copies needs CUDA.

use ndarray::{Array2, ArrayD, Axis};

use super::*;
use crate::device::{Device, DeviceType};
use crate::dtype::DType;
use crate::layout::Layout;
use crate::partitioned::PartitionedArray;
use crate::tensor::Tensor;

/// `a[i, j] = 10 i + j`, of shape (8, 2).
fn reference() -> ArrayD<i32> {
    Array2::from_shape_fn((8, 2), |(i, j)| (10 * i + j) as i32).into_dyn()
}

/// Rank `r` of 2 holds rows `4r..4r + 4` of `a` as two row blocks: the first in memory of
/// `first`, the second in memory of `second`.
fn blocks(comm: &ThreadComm, a: &ArrayD<i32>, first: Device, second: Device) -> PartitionedArray {
    let me = comm.rank();
    let rows = |k: usize, device: Device| {
        let t = Tensor::from(a.slice_axis(Axis(0), (k..k + 2).into()).to_owned());
        // SAFETY: `device` is host memory of some kind, or refused before any access.
        unsafe { t.labelled(device) }
    };
    from_stacked(comm, vec![rows(4 * me, first), rows(4 * me + 2, second)], 0).unwrap()
}

fn whole(comm: &ThreadComm, pa: &PartitionedArray) -> ArrayD<i32> {
    assemble(comm, pa, None, Some(Device::CPU), false)
        .unwrap()
        .unwrap()
        .to_array::<i32>()
        .unwrap()
}

#[test]
fn every_operation_moves_data_between_host_kinds_without_transfer() {
    crate::backend::note_host_devices(2);
    let a = reference();
    let picks = [0i64, 3, -1, 2, 6];
    let rows: Vec<usize> = picks.iter().map(|&i| i.rem_euclid(8) as usize).collect();
    let values = Array2::from_shape_fn((3, 2), |(i, j)| -(10 * i as i32 + j as i32) - 1);
    let written = [7i64, 2, 5];
    // numpy: b = a.copy(); b[[7, 2, 5]] = values
    let mut scattered = a.clone();
    for (k, &r) in written.iter().enumerate() {
        scattered
            .index_axis_mut(Axis(0), r as usize)
            .assign(&values.index_axis(Axis(0), k));
    }
    for device in [
        Device::new(DeviceType::CudaHost, 0).unwrap(),
        Device::new(DeviceType::CudaManaged, 0).unwrap(),
        Device::new(DeviceType::RocmHost, 0).unwrap(),
        Device::new(DeviceType::Cpu, 1).unwrap(),
    ]
    .into_iter()
    // Under Miri, the first and the last kind: every kind takes the same code paths.
    .step_by(if cfg!(miri) { 3 } else { 1 })
    {
        let out = ThreadComm::run(2, |comm| {
            let pa = blocks(comm, &a, Device::CPU, device);
            let (cols, _) =
                repartition(comm, &pa, &Layout::tiling(&[1, 2]).on(Device::CPU), false).unwrap();
            let cols_devices = cols.devices();
            // Into targets of the other kind, and back into kDLCPU ones.
            let backing = Tensor::zeros(&[4, 2], DType::Int32).unwrap();
            // SAFETY: host memory of some kind.
            let there = from_stacked(comm, vec![unsafe { backing.labelled(device) }], 0);
            let there = there.unwrap();
            repartition_into(comm, &cols, &there, false).unwrap();
            let plain = from_stacked(comm, vec![Tensor::zeros(&[4, 2], DType::Int32).unwrap()], 0);
            let plain = plain.unwrap();
            repartition_into(comm, &there, &plain, false).unwrap();
            // The gather's partition lives on rank 0, in the kDLCPU memory of row 0; rank 0
            // picks rows 2 and 3 from its block of the other kind into plain host memory.
            let (picked, _) = gather(comm, &pa, picks, 0).unwrap();
            let picked_devices = picked.devices();
            // Values of the other kind write both kinds of partitions.
            let vals = Tensor::from(values.clone());
            // SAFETY: host memory of some kind.
            let vals = unsafe { vals.labelled(device) };
            scatter(comm, &pa, &vals, written, 0).unwrap();
            (
                whole(comm, &cols),
                cols_devices,
                whole(comm, &plain),
                whole(comm, &picked),
                picked_devices,
                whole(comm, &pa),
            )
        });
        for (rank, (cols, cols_devices, plain, picked, picked_devices, after)) in
            out.into_iter().enumerate()
        {
            let at = format!("{device}, rank {rank}");
            assert_eq!(cols, a, "{at}");
            assert_eq!(cols_devices, vec![Device::CPU], "{at}");
            assert_eq!(plain, a, "{at}");
            assert_eq!(picked, a.select(Axis(0), &rows), "{at}");
            assert_eq!(picked_devices, vec![Device::CPU], "{at}");
            assert_eq!(after, scattered, "{at}");
        }
    }
}

#[test]
fn device_memory_moving_to_the_host_still_needs_transfer_on_every_rank() {
    let a = reference();
    let out = ThreadComm::run(2, |comm| {
        let gpu = blocks(comm, &a, Device::cuda(0), Device::cuda(0));
        let e =
            repartition(comm, &gpu, &Layout::tiling(&[1, 2]).on(Device::CPU), false).unwrap_err();
        (e.kind().to_string(), e.to_string())
    });
    for (rank, (kind, message)) in out.iter().enumerate() {
        assert_eq!(kind, "DeviceError", "rank {rank}: {message}");
        assert!(
            message.contains("kDLCUDA:0 -> kDLCPU"),
            "rank {rank}: {message}"
        );
        assert!(
            message.contains("allow the move with transfer"),
            "rank {rank}: {message}"
        );
    }
}
