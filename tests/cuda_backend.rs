//! The CUDA backend on a real device, checked against the CPU backend and naive loops.
//!
//! Skips (printing `SKIP`) when no CUDA driver or device is available, unless
//! `DLPART_REQUIRE_CUDA=1`, which turns that into a failure (set on GPU machines).
//! libnvrtc must be on the loader path (see tests/cuda_ptx.rs).
#![cfg(feature = "cuda")]

use std::sync::Arc;

use dlpart::backend::cpu::CpuBackend;
use dlpart::backend::cuda::{copy_tensor, wait_on, CudaBackend};
use dlpart::backend::{Backend, BoxCopy};
use dlpart::{DType, Device, Error, Tensor};

fn backend(test: &str) -> Option<Arc<CudaBackend>> {
    match CudaBackend::get(Device::cuda(0)) {
        Ok(b) => Some(b),
        Err(Error::BackendUnavailable { reason, .. })
            if std::env::var("DLPART_REQUIRE_CUDA").as_deref() != Ok("1") =>
        {
            eprintln!("SKIP {test}: {reason}");
            None
        }
        Err(e) => panic!("CUDA backend unavailable: {e}"),
    }
}

struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

const DTYPES: [DType; 5] = [
    DType::UInt8,
    DType::Int16,
    DType::Float32,
    DType::Float64,
    DType::Complex128,
];

/// A contiguous host tensor of random bytes.
fn random_host(rng: &mut Rng, shape: &[usize], dtype: DType) -> Tensor {
    let t = Tensor::zeros(shape, dtype).unwrap();
    // SAFETY: `t` is a fresh contiguous host allocation of `nbytes` bytes that nothing else
    // references yet.
    let bytes = unsafe { std::slice::from_raw_parts_mut(t.data_ptr(), t.nbytes()) };
    bytes.iter_mut().for_each(|b| *b = rng.next() as u8);
    t
}

fn host_bytes(t: &Tensor) -> Vec<u8> {
    assert!(t.is_contiguous() && t.device() == Device::CPU);
    // SAFETY: a contiguous host tensor's elements are its `nbytes` bytes from `data_ptr`.
    unsafe { std::slice::from_raw_parts(t.data_ptr(), t.nbytes()) }.to_vec()
}

fn to_device(be: &CudaBackend, host: &Tensor) -> Tensor {
    let d = be.empty(host.shape(), host.dtype()).unwrap();
    be.copy_host_to_device(host, &d).unwrap();
    d
}

fn to_host(be: &CudaBackend, dev: &Tensor) -> Tensor {
    let h = Tensor::zeros(dev.shape(), dev.dtype()).unwrap();
    be.copy_device_to_host(dev, &h).unwrap();
    h
}

/// `t` with dim `d` reversed: same elements, negative stride (works for any device).
fn reversed(t: &Tensor, d: usize) -> Tensor {
    let mut strides = t.strides().to_vec();
    let n = t.shape()[d] as isize;
    let item = t.dtype().itemsize() as isize;
    let data = t.data_ptr().wrapping_offset((n - 1) * strides[d] * item);
    strides[d] = -strides[d];
    // SAFETY: the reversed view addresses exactly the elements of `t`, kept alive by its owner.
    unsafe {
        Tensor::from_raw_parts(
            data,
            t.shape().to_vec(),
            strides,
            t.dtype(),
            t.device(),
            false,
            t.owner().clone(),
        )
    }
}

#[test]
fn box_copies_match_the_cpu_backend() {
    let Some(be) = backend("box_copies_match_the_cpu_backend") else {
        return;
    };
    let cpu = CpuBackend::shared(Device::CPU);
    let mut rng = Rng(11);
    for case in 0..60 {
        let dtype = DTYPES[rng.below(DTYPES.len())];
        let ndim = 1 + rng.below(4);
        let shape: Vec<usize> = (0..ndim).map(|_| 1 + rng.below(40)).collect();
        let (hs, hd) = (
            random_host(&mut rng, &shape, dtype),
            random_host(&mut rng, &shape, dtype),
        );
        let (mut ds, mut dd) = (to_device(&be, &hs), to_device(&be, &hd));
        let (mut hs, mut hd) = (hs, hd);
        if rng.below(2) == 0 {
            let d = rng.below(ndim);
            (hs, ds) = (reversed(&hs, d), reversed(&ds, d));
        }
        if rng.below(2) == 0 {
            let d = rng.below(ndim);
            (hd, dd) = (reversed(&hd, d), reversed(&dd, d));
        }
        // Disjoint destination slabs along dim 0, each fed from a random source box.
        let mut boxes = Vec::new();
        let mut start = 0;
        while start < shape[0] {
            let rows = 1 + rng.below(shape[0] - start);
            let mut box_shape: Vec<usize> = shape.iter().map(|&n| 1 + rng.below(n)).collect();
            box_shape[0] = rows;
            let src_start: Vec<usize> = (0..ndim)
                .map(|d| rng.below(shape[d] - box_shape[d] + 1))
                .collect();
            let mut dst_start: Vec<usize> = (0..ndim)
                .map(|d| rng.below(shape[d] - box_shape[d] + 1))
                .collect();
            dst_start[0] = start;
            boxes.push((src_start, dst_start, box_shape));
            start += rows;
        }
        run_boxes(cpu.as_ref(), &hs, &hd, &boxes);
        run_boxes(be.as_ref(), &ds, &dd, &boxes);
        let got = contiguous_host(&to_host(&be, &dd));
        let expect = contiguous_host(&hd);
        assert_eq!(
            host_bytes(&got),
            host_bytes(&expect),
            "case {case}: {dtype} {shape:?}"
        );
    }
}

/// (source start, destination start, shape)
type Box3 = (Vec<usize>, Vec<usize>, Vec<usize>);

fn run_boxes(b: &dyn Backend, src: &Tensor, dst: &Tensor, boxes: &[Box3]) {
    let copies: Vec<BoxCopy> = boxes
        .iter()
        .map(|(ss, ds, shape)| BoxCopy {
            src,
            src_start: ss.clone(),
            dst,
            dst_start: ds.clone(),
            shape: shape.clone(),
        })
        .collect();
    b.copy_boxes(&copies).unwrap();
}

/// A contiguous host copy of a (possibly strided) host tensor.
fn contiguous_host(t: &Tensor) -> Tensor {
    let out = Tensor::zeros(t.shape(), t.dtype()).unwrap();
    let zero = vec![0; t.ndim()];
    CpuBackend::shared(Device::CPU)
        .copy_boxes(&[BoxCopy {
            src: t,
            src_start: zero.clone(),
            dst: &out,
            dst_start: zero,
            shape: t.shape().to_vec(),
        }])
        .unwrap();
    out
}

/// Naive gather/scatter on host bytes, C-order over the index space `shape`.
fn reference(
    gather: bool,
    src: &Tensor,
    idx: &[i64],
    axis: usize,
    out: &Tensor,
    shape: &[usize],
) -> Vec<u8> {
    let item = src.dtype().itemsize();
    let (s, mut o) = (host_bytes(src), host_bytes(out));
    let strides = |t: &Tensor| dlpart::tensor::contiguous_strides(t.shape());
    let (ss, os) = (strides(src), strides(out));
    let n: usize = shape.iter().product();
    for lin in 0..n {
        let mut rem = lin;
        let mut ix = vec![0usize; shape.len()];
        for d in (0..shape.len()).rev() {
            ix[d] = rem % shape[d];
            rem /= shape[d];
        }
        let (mut si, mut oi) = (ix.clone(), ix.clone());
        if gather {
            si[axis] = idx[ix[axis]] as usize;
        } else {
            oi[axis] = idx[ix[axis]] as usize;
        }
        let off = |i: &[usize], st: &[isize]| {
            i.iter()
                .zip(st)
                .map(|(&a, &b)| a as isize * b)
                .sum::<isize>() as usize
                * item
        };
        let (a, b) = (off(&si, &ss), off(&oi, &os));
        o[b..b + item].copy_from_slice(&s[a..a + item]);
    }
    o
}

#[test]
fn gather_and_scatter_match_naive_loops() {
    let Some(be) = backend("gather_and_scatter_match_naive_loops") else {
        return;
    };
    let mut rng = Rng(5);
    for case in 0..60 {
        let gather = case % 2 == 0;
        let dtype = DTYPES[rng.below(DTYPES.len())];
        let ndim = 1 + rng.below(3);
        let shape: Vec<usize> = (0..ndim).map(|_| 1 + rng.below(33)).collect();
        let axis = rng.below(ndim);
        let len = 1 + rng.below(20);
        let mut indexed = shape.clone();
        indexed[axis] = len;
        let idx: Vec<i64> = (0..shape[axis]).map(|_| rng.below(len) as i64).collect();
        let (src_shape, out_shape) = if gather {
            (&indexed, &shape)
        } else {
            (&shape, &indexed)
        };
        let hs = random_host(&mut rng, src_shape, dtype);
        let ho = random_host(&mut rng, out_shape, dtype);
        let hi = Tensor::from_slice(&idx, &[idx.len()]).unwrap();
        let (ds, d_o, di) = (
            to_device(&be, &hs),
            to_device(&be, &ho),
            to_device(&be, &hi),
        );
        if gather {
            be.gather(&ds, &di, axis, &d_o).unwrap();
        } else {
            be.scatter(&ds, &di, axis, &d_o).unwrap();
        }
        let want = reference(gather, &hs, &idx, axis, &ho, &shape);
        assert_eq!(
            host_bytes(&to_host(&be, &d_o)),
            want,
            "case {case}: gather={gather} {dtype} {shape:?} axis {axis}"
        );
    }
}

#[test]
fn out_of_range_indices_are_reported_with_their_value() {
    let Some(be) = backend("out_of_range_indices_are_reported_with_their_value") else {
        return;
    };
    let src = to_device(&be, &Tensor::from_slice(&[1f32, 2., 3., 4.], &[4]).unwrap());
    let idx = to_device(&be, &Tensor::from_slice(&[0i64, 7, 1], &[3]).unwrap());
    let out = be.empty(&[3], DType::Float32).unwrap();
    match be.gather(&src, &idx, 0, &out) {
        Err(Error::IndexOutOfRange {
            index: 7,
            axis: 0,
            len: 4,
        }) => {}
        other => panic!("expected index 7 out of range, got {other:?}"),
    }
    let dst = be.empty(&[4], DType::Float32).unwrap();
    let vals = to_device(&be, &Tensor::from_slice(&[9f32, 8., 7.], &[3]).unwrap());
    assert!(matches!(
        be.scatter(&vals, &idx, 0, &dst),
        Err(Error::IndexOutOfRange { index: 7, .. })
    ));
    // The backend stays usable afterwards.
    let ok = to_device(&be, &Tensor::from_slice(&[3i64, 0, 3], &[3]).unwrap());
    be.scatter(&vals, &ok, 0, &dst).unwrap();
    let got = to_host(&be, &dst).to_array::<f32>().unwrap();
    assert_eq!((got[[0]], got[[3]]), (8., 7.)); // the later duplicate of 3 wins
}

#[test]
fn transfers_handle_strided_tensors_on_both_sides() {
    let Some(be) = backend("transfers_handle_strided_tensors_on_both_sides") else {
        return;
    };
    let vals: Vec<i32> = (0..60).collect();
    let host = Tensor::from_slice(&vals, &[3, 4, 5]).unwrap();
    let dev = be.empty(&[3, 4, 5], DType::Int32).unwrap();
    copy_tensor(&reversed(&host, 1), &reversed(&dev, 2)).unwrap();
    let back = Tensor::zeros(&[3, 4, 5], DType::Int32).unwrap();
    copy_tensor(&reversed(&dev, 2), &reversed(&back, 1)).unwrap();
    assert_eq!(
        back.to_array::<i32>().unwrap(),
        host.to_array::<i32>().unwrap()
    );
    let other = be.empty(&[3, 4, 5], DType::Int32).unwrap();
    be.copy_device_to_device(&dev, &other).unwrap();
    let expect = reversed(&reversed(&host, 1), 2).to_array::<i32>().unwrap();
    assert_eq!(to_host(&be, &other).to_array::<i32>().unwrap(), expect);
}

#[test]
fn row_blocks_become_column_blocks_of_a_large_array() {
    let Some(be) = backend("row_blocks_become_column_blocks_of_a_large_array") else {
        return;
    };
    let n = 8192usize;
    let vals: Vec<u32> = (0..(n * n) as u32).collect();
    let full = to_device(&be, &Tensor::from_slice(&vals, &[n, n]).unwrap());
    let cols: Vec<Tensor> = (0..4)
        .map(|_| be.empty(&[n, n / 4], DType::UInt32).unwrap())
        .collect();
    let jobs: Vec<BoxCopy> = (0..4)
        .flat_map(|r| (0..4).map(move |c| (r, c)))
        .map(|(r, c)| BoxCopy {
            src: &full,
            src_start: vec![r * n / 4, c * n / 4],
            dst: &cols[c],
            dst_start: vec![r * n / 4, 0],
            shape: vec![n / 4, n / 4],
        })
        .collect();
    be.copy_boxes(&jobs).unwrap();
    for (c, col) in cols.iter().enumerate() {
        let got = to_host(&be, col).to_array::<u32>().unwrap();
        for (i, j) in [(0, 0), (n - 1, n / 4 - 1), (1234, 567), (4097, 2047)] {
            assert_eq!(
                got[[i, j]] as usize,
                i * n + c * n / 4 + j,
                "column block {c} at ({i}, {j})"
            );
        }
    }
}

#[test]
fn stream_waits_queue_on_the_device() {
    let Some(be) = backend("stream_waits_queue_on_the_device") else {
        return;
    };
    let ours = be.dlpack_stream().expect("a CUDA backend has a stream");
    assert!(ours > 2);
    wait_on(Device::cuda(0), Some(1), Some(ours)).unwrap();
    wait_on(Device::cuda(0), Some(2), Some(ours)).unwrap();
    wait_on(Device::cuda(0), Some(ours), None).unwrap();
    be.make_consumer_wait(None).unwrap();
    be.wait_for_producer(Some(2)).unwrap();
    be.synchronize().unwrap();
}

#[test]
fn copies_between_two_devices() {
    let Some(be0) = backend("copies_between_two_devices") else {
        return;
    };
    let Ok(be1) = CudaBackend::get(Device::cuda(1)) else {
        eprintln!("SKIP copies_between_two_devices: one CUDA device");
        return;
    };
    let vals: Vec<f64> = (0..1000).map(f64::from).collect();
    let a = to_device(&be0, &Tensor::from_slice(&vals, &[10, 100]).unwrap());
    let b = be1.empty(&[10, 100], DType::Float64).unwrap();
    be1.copy_device_to_device(&reversed(&a, 0), &b).unwrap();
    let got = to_host(&be1, &b).to_array::<f64>().unwrap();
    assert_eq!(got[[0, 5]], 905.0);
}

/// A view of `t`'s memory from byte `offset` as `dtype` with `shape` and `strides` (elements).
fn reinterpret(
    t: &Tensor,
    offset: usize,
    dtype: DType,
    shape: &[usize],
    strides: &[isize],
) -> Tensor {
    // SAFETY: the callers' views stay inside `t`'s bytes, kept alive by its owner.
    unsafe {
        Tensor::from_raw_parts(
            t.data_ptr().wrapping_add(offset),
            shape.to_vec(),
            strides.to_vec(),
            dtype,
            t.device(),
            false,
            t.owner().clone(),
        )
    }
}

fn host_f32(be: &CudaBackend, t: &Tensor) -> Vec<f32> {
    to_host(be, t)
        .to_array::<f32>()
        .unwrap()
        .into_raw_vec_and_offset()
        .0
}

#[test]
fn ops_check_host_and_device_indices_on_the_device_before_writing() {
    let Some(be) = backend("ops_check_host_and_device_indices_on_the_device_before_writing") else {
        return;
    };
    let src = to_device(
        &be,
        &Tensor::from_slice(&[10f32, 11., 12., 13., 14.], &[5]).unwrap(),
    );
    let gather = |idx: &Tensor| host_f32(&be, &dlpart::ops::gather(&src, idx, 0, None).unwrap());
    // Host indices of any integer dtype are copied over; negative ones count from the end.
    let host = Tensor::from_slice(&[-1i32, 0, 2, -5], &[4]).unwrap();
    assert_eq!(gather(&host), vec![14., 10., 12., 10.]);
    // Device int64 indices, reversed (stride -1) and negative.
    let dev = to_device(&be, &Tensor::from_slice(&[1i64, -2, 4], &[3]).unwrap());
    assert_eq!(gather(&reversed(&dev, 0)), vec![14., 13., 11.]);
    // Device int32 indices every other element, and uint16 ones.
    let dev32 = to_device(&be, &Tensor::from_slice(&[2i32, 99, -1, 99], &[4]).unwrap());
    assert_eq!(
        gather(&reinterpret(&dev32, 0, DType::Int32, &[2], &[2])),
        vec![12., 14.]
    );
    let dev16 = to_device(&be, &Tensor::from_slice(&[4u16, 3], &[2]).unwrap());
    assert_eq!(gather(&dev16), vec![14., 13.]);
    // An int64 index at an odd address is staged to an aligned copy first.
    let mut bytes = vec![0u8; 9];
    bytes[1] = 3;
    let raw = to_device(&be, &Tensor::from_slice(&bytes, &[9]).unwrap());
    assert_eq!(
        gather(&reinterpret(&raw, 1, DType::Int64, &[1], &[1])),
        vec![13.]
    );
    // In-range contiguous int64 device indices are used as they are.
    let plain = to_device(&be, &Tensor::from_slice(&[0i64, 4], &[2]).unwrap());
    let same = be.normalise_indices(&plain, 0, 5).unwrap();
    assert_eq!(same.data_ptr(), plain.data_ptr());

    // The first bad index is named, from host or device, and nothing is written.
    let out = to_device(&be, &Tensor::from_slice(&[0f32; 4], &[4]).unwrap());
    let bad = Tensor::from_slice(&[0i64, 9, -7, 1], &[4]).unwrap();
    for idx in [bad.clone(), to_device(&be, &bad)] {
        match dlpart::ops::gather(&src, &idx, 0, Some(&out)) {
            Err(Error::IndexOutOfRange {
                index: 9,
                axis: 0,
                len: 5,
            }) => {}
            other => panic!("expected index 9 out of range, got {other:?}"),
        }
        assert_eq!(host_f32(&be, &out), vec![0.; 4]);
    }
    let huge = to_device(&be, &Tensor::from_slice(&[1u64, u64::MAX], &[2]).unwrap());
    assert!(matches!(
        be.normalise_indices(&huge, 0, 5),
        Err(Error::IndexOutOfRange { index, .. }) if index == u64::MAX as i128
    ));

    // Scatter: negative indices, later duplicates win, bad indices write nothing.
    let dst = to_device(&be, &Tensor::from_slice(&[0f32; 5], &[5]).unwrap());
    let vals = to_device(&be, &Tensor::from_slice(&[1f32, 2., 3.], &[3]).unwrap());
    let idx = to_device(&be, &Tensor::from_slice(&[-1i64, 4, 0], &[3]).unwrap());
    dlpart::ops::scatter(&vals, &idx, &dst, 0).unwrap();
    assert_eq!(host_f32(&be, &dst), vec![3., 0., 0., 0., 2.]);
    let bad = Tensor::from_slice(&[1i64, 5, 2], &[3]).unwrap();
    assert!(matches!(
        dlpart::ops::scatter(&vals, &bad, &dst, 0),
        Err(Error::IndexOutOfRange { index: 5, .. })
    ));
    assert_eq!(host_f32(&be, &dst), vec![3., 0., 0., 0., 2.]);
}
