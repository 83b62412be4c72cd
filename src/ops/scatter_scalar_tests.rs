//! A scalar (0-d values in host memory) scattered into device memory, over emulated CUDA
//! devices (feature `kernel-host-tests`), which this crate's unit tests reach through
//! `backend_for`: the one element is copied to each device written and broadcast there, with
//! no `transfer`; values of more elements in host memory are still refused there.

use ndarray::{array, Array2};

use super::{scatter, to_device};
use crate::backend::cuda::CudaBackend;
use crate::backend::Backend;
use crate::grid::Grid;
use crate::partitioned::Data;
use crate::{Device, Error, PartitionedArray, Tensor};

/// Emulated device `n` (120 and up: these tests' own).
fn emu(n: u32) -> Device {
    CudaBackend::emulated(n).device()
}

/// `a` on `device`.
fn upload(a: Array2<f32>, device: Device) -> Tensor {
    to_device(&Tensor::from(a), device).unwrap()
}

/// A tensor's elements, read on the host.
fn values(t: &Tensor) -> Array2<f32> {
    let host = to_device(t, Device::CPU).unwrap();
    host.to_array::<f32>()
        .unwrap()
        .into_dimensionality()
        .unwrap()
}

/// `-1.0 * (10 i + j)` of shape (4, 3): what the outputs hold before a scatter.
fn before() -> Array2<f32> {
    Array2::from_shape_fn((4, 3), |(i, j)| -((10 * i + j) as f32))
}

#[test]
fn a_host_scalar_scatters_into_device_memory() {
    let gpu = emu(120);
    let out = upload(before(), gpu);
    let half = Tensor::from_slice(&[0.5f32], &[]).unwrap();
    // numpy: a = before(); a[:, [2, 0]] = 0.5
    scatter(&half, [2i64, 0], &out, 1).unwrap();
    let mut want = before();
    want.column_mut(2).fill(0.5);
    want.column_mut(0).fill(0.5);
    assert_eq!(values(&out), want);
    // One index drops the axis: a[1] = 0.5
    scatter(&half, 1i64, &out, 0).unwrap();
    want.row_mut(1).fill(0.5);
    assert_eq!(values(&out), want);
    // Values of more elements on the host are no scalar: they must be on the device.
    let row = Tensor::from(array![1.0f32, 2.0, 3.0]);
    let e = scatter(&row, [0i64], &out, 0).unwrap_err();
    assert!(matches!(e, Error::DeviceMismatch { .. }), "{e}");
    assert_eq!(values(&out), want, "nothing written");
}

/// Rows 0..2 on `top`, rows 2..4 on `bottom`, of [`before`].
fn two_blocks(top: Device, bottom: Device) -> PartitionedArray {
    let a = before();
    let t = upload(a.slice(ndarray::s![0..2, ..]).to_owned(), top);
    let b = upload(a.slice(ndarray::s![2..4, ..]).to_owned(), bottom);
    PartitionedArray::new(
        Grid::from_splits(&[4, 3], vec![vec![0, 2, 4], vec![0, 3]]).unwrap(),
        vec![Data::Tensor(t), Data::Tensor(b)],
        vec![vec![], vec![]],
        None,
    )
    .unwrap()
}

fn assembled(pa: &PartitionedArray) -> Array2<f32> {
    values(&pa.assemble(Some(Device::CPU), true).unwrap())
}

#[test]
fn a_host_scalar_scatters_into_partitions_on_any_device_without_transfer() {
    for (top, bottom) in [
        (emu(121), emu(122)),
        (Device::CPU, emu(121)),
        (emu(122), emu(122)),
    ] {
        let pa = two_blocks(top, bottom);
        let seven = Tensor::from_slice(&[7.0f32], &[]).unwrap();
        // numpy: a = before(); a[[3, 0, 2]] = 7
        pa.scatter(&seven, [3i64, 0, 2], 0, false).unwrap();
        let mut want = before();
        for i in [3, 0, 2] {
            want.row_mut(i).fill(7.0);
        }
        assert_eq!(assembled(&pa), want, "{top} {bottom}");
        // One index: a[:, 1] = -0.25
        let q = Tensor::from_slice(&[-0.25f32], &[]).unwrap();
        pa.scatter(&q, 1i64, 1, false).unwrap();
        want.column_mut(1).fill(-0.25);
        assert_eq!(assembled(&pa), want, "{top} {bottom}");
        // A row of values on the host still needs transfer to reach a device's partition,
        // and nothing is written without it.
        let row = Tensor::from(array![[1.0f32, 2.0, 3.0]]);
        let e = pa.scatter(&row, [3i64, 0], 0, false).unwrap_err();
        assert!(matches!(e, Error::DeviceMismatch { .. }), "{e}");
        assert_eq!(assembled(&pa), want, "{top} {bottom}: nothing written");
    }
}
