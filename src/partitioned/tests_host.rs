//! The one transfer rule in one process: data moving between host memory of any kinds
//! (`kDLCPU`, an emulated `kDLCPU:k`, pinned `kDLCUDAHost`, `kDLCUDAManaged`, `kDLROCMHost`)
//! is a plain copy, which needs no `transfer`, in every operation; data moving to or from
//! device memory still needs it. The other kinds of host memory are ordinary memory labelled
//! so here: the CPU reads and writes every kind alike, and none of these copies needs CUDA
//! (asking for new pinned memory would, and fails where CUDA is missing).

use ndarray::{Array2, ArrayD, Axis};

use super::tests::expect_blocks;
use super::*;
use crate::device::DeviceType;
use crate::layout::Layout;

/// The host memory of other kinds than `kDLCPU:0` that partitions are labelled with.
fn kinds() -> [Device; 4] {
    crate::backend::note_host_devices(2);
    [
        Device::new(DeviceType::CudaHost, 0).unwrap(),
        Device::new(DeviceType::CudaManaged, 0).unwrap(),
        Device::new(DeviceType::RocmHost, 0).unwrap(),
        Device::new(DeviceType::Cpu, 1).unwrap(),
    ]
}

/// `a[i, j] = 10 i + j` of shape (6, `cols`), as an ndarray reference.
fn reference(cols: usize) -> ArrayD<i32> {
    Array2::from_shape_fn((6, cols), |(i, j)| (10 * i + j) as i32).into_dyn()
}

/// `a` in two row blocks: rows 0..3 in kDLCPU memory, rows 3..6 in memory of `device`.
fn mixed(a: &ArrayD<i32>, device: Device) -> PartitionedArray {
    let top = Tensor::from(a.slice_axis(Axis(0), (0..3).into()).to_owned());
    let bottom = Tensor::from(a.slice_axis(Axis(0), (3..6).into()).to_owned());
    // SAFETY: `device` is host memory of some kind, or (kDLCUDA:0) refused before any access
    // by the operations these tests run.
    let bottom = unsafe { bottom.labelled(device) };
    PartitionedArray::new(
        Grid::from_splits(a.shape(), vec![vec![0, 3, 6], vec![0, a.shape()[1]]]).unwrap(),
        vec![Data::Tensor(top), Data::Tensor(bottom)],
        vec![vec![], vec![]],
        None,
    )
    .unwrap()
}

fn is_move_refused(e: &Error, moved: &str) -> bool {
    matches!(e, Error::DeviceMismatch { .. }) && e.to_string().contains(moved)
}

#[test]
fn repartition_between_host_kinds_needs_no_transfer() {
    let a = reference(4);
    for device in kinds() {
        let pa = mixed(&a, device);
        let cols = pa
            .repartition(&Layout::tiling(&[1, 2]).on(Device::CPU), false)
            .unwrap();
        assert_eq!(cols.devices(), vec![Device::CPU], "{device}");
        expect_blocks(&cols, &a);
        // kDLCPU sources onto an emulated host device, which dlpart allocates.
        let host = Device::new(DeviceType::Cpu, 1).unwrap();
        let there = cols.repartition(&Layout::tiling(&[3, 1]).on(host), false);
        let there = there.unwrap();
        assert_eq!(there.devices(), vec![host], "{device}");
        expect_blocks(&there, &a);
    }
    // Device memory still needs transfer, named.
    let e = mixed(&a, Device::CPU)
        .repartition(&Layout::tiling(&[1, 2]).on(Device::cuda(0)), false)
        .unwrap_err();
    assert!(is_move_refused(&e, "kDLCPU -> kDLCUDA:0"), "{e}");
}

#[test]
fn repartition_into_between_host_kinds_needs_no_transfer() {
    let a = reference(4);
    let target = |device: Device| {
        let zeros: Vec<Tensor> = (0..2)
            .map(|_| Tensor::zeros(&[6, 2], DType::Int32).unwrap())
            .collect();
        // SAFETY: `device` is host memory of some kind, or refused before any access.
        let there: Vec<Tensor> = zeros
            .iter()
            .map(|t| unsafe { t.labelled(device) })
            .collect();
        let grid = Grid::from_splits(&[6, 4], vec![vec![0, 6], vec![0, 2, 4]]).unwrap();
        (
            PartitionedArray::from_tensors_unchecked(grid, there, DType::Int32),
            zeros,
        )
    };
    for device in kinds() {
        // Sources of this kind into kDLCPU targets, and kDLCPU sources into targets of it.
        for (src, dst) in [(device, Device::CPU), (Device::CPU, device)] {
            let (out, backing) = target(dst);
            mixed(&a, src).repartition_into(&out, false).unwrap();
            assert_eq!(
                backing[0].to_array::<i32>().unwrap(),
                a.slice_axis(Axis(1), (0..2).into())
            );
            assert_eq!(
                backing[1].to_array::<i32>().unwrap(),
                a.slice_axis(Axis(1), (2..4).into())
            );
        }
    }
    let (out, backing) = target(Device::cuda(0));
    let e = mixed(&a, Device::CPU)
        .repartition_into(&out, false)
        .unwrap_err();
    assert!(is_move_refused(&e, "kDLCPU -> kDLCUDA:0"), "{e}");
    assert!(backing
        .iter()
        .all(|t| t.to_array::<i32>().unwrap().iter().all(|&v| v == 0)));
}

#[test]
fn assemble_between_host_kinds_needs_no_transfer() {
    let a = reference(4);
    for device in kinds() {
        let pa = mixed(&a, device);
        let whole = pa.assemble(Some(Device::CPU), false).unwrap();
        assert_eq!(whole.device(), Device::CPU);
        assert_eq!(whole.to_array::<i32>().unwrap(), a, "{device}");
        // Several devices and none named: a device is asked for, but no transfer.
        let e = pa.assemble(None, false).unwrap_err();
        assert!(matches!(e, Error::DeviceMismatch { .. }), "{e}");
        assert!(e.to_string().contains("pass a device"), "{e}");
        assert!(!e.to_string().contains("transfer"), "{e}");
    }
    let host = Device::new(DeviceType::Cpu, 1).unwrap();
    let there = mixed(&a, Device::CPU).assemble(Some(host), false).unwrap();
    assert_eq!(there.device(), host);
    assert_eq!(there.to_array::<i32>().unwrap(), a);
    let gpu = mixed(&a, Device::cuda(0));
    let e = gpu.assemble(Some(Device::CPU), false).unwrap_err();
    assert!(is_move_refused(&e, "kDLCUDA:0 -> kDLCPU"), "{e}");
    let e = gpu.assemble(None, false).unwrap_err();
    assert!(
        e.to_string().contains("allow the move with transfer"),
        "{e}"
    );
}

/// The gather's result partition lives on kDLCPU, the device of the first index's partition;
/// the rows of the other partition are read where they are, and picked into plain host
/// memory on the way, not new pinned memory. Long index lists too, whose picks go through a
/// buffer of the gather's own (the CPU backend's direct path).
#[test]
fn gather_between_host_kinds_needs_no_transfer_nor_cuda() {
    let a = reference(2); // rows of 8 bytes: long lists take the direct path
    let long: Vec<i64> = std::iter::once(1)
        .chain((0..1 << 16).map(|k| 3 + k % 3))
        .collect();
    for device in kinds() {
        let pa = mixed(&a, device);
        for idx in [vec![1i64, 4, -1, 0, 3], long.clone()] {
            let picked = pa.gather(&idx, 0, false).unwrap();
            assert_eq!(picked.devices(), vec![Device::CPU], "{device}");
            let rows: Vec<usize> = idx.iter().map(|&i| i.rem_euclid(6) as usize).collect();
            let got = picked.assemble(None, false).unwrap();
            assert_eq!(got.to_array::<i32>().unwrap(), a.select(Axis(0), &rows));
        }
    }
    let e = mixed(&a, Device::cuda(0))
        .gather([1i64, 4], 0, false)
        .unwrap_err();
    assert!(is_move_refused(&e, "kDLCUDA:0 -> kDLCPU"), "{e}");
}

/// Values in host memory of any kind write partitions of any other host kind in place; the
/// rows of values each partition takes are picked into plain host memory, not new pinned
/// memory.
#[test]
fn scatter_between_host_kinds_needs_no_transfer_nor_cuda() {
    let a = reference(2);
    let rows = [5i64, 1, -2];
    let vals = Array2::from_shape_fn((3, 2), |(i, j)| -(10 * i as i32 + j as i32) - 1).into_dyn();
    // numpy: a[[5, 1, -2]] = vals
    let mut want = a.clone();
    for (k, &r) in rows.iter().enumerate() {
        want.index_axis_mut(Axis(0), r.rem_euclid(6) as usize)
            .assign(&vals.index_axis(Axis(0), k));
    }
    for device in kinds() {
        for (parts, values) in [
            (device, Device::CPU),
            (Device::CPU, device),
            (device, device),
        ] {
            let pa = mixed(&a, parts);
            let backing = Tensor::from(vals.clone());
            // SAFETY: `values` is host memory of some kind.
            let there = unsafe { backing.labelled(values) };
            pa.scatter(&there, rows, 0, false).unwrap();
            assert_eq!(
                pa.assemble(Some(Device::CPU), false)
                    .unwrap()
                    .to_array::<i32>()
                    .unwrap(),
                want
            );
        }
    }
    let backing = Tensor::from(vals.clone());
    // SAFETY: never read: the move to the partitions is refused first.
    let on_gpu = unsafe { backing.labelled(Device::cuda(0)) };
    let pa = mixed(&a, Device::CPU);
    let e = pa.scatter(&on_gpu, rows, 0, false).unwrap_err();
    assert!(is_move_refused(&e, "kDLCUDA:0 -> kDLCPU"), "{e}");
    assert_eq!(
        pa.assemble(None, false).unwrap().to_array::<i32>().unwrap(),
        a
    );
}
