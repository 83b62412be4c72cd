//! The safe layer: `CpuBackend` on tensors, checked against ndarray.

use std::sync::Arc;

use ndarray::{s, Axis};

use crate::backend::cpu::CpuBackend;
use crate::backend::{Backend, BoxCopy};
use crate::device::Device;
use crate::dtype::DType;
use crate::error::Error;
use crate::tensor::Tensor;

fn backend() -> Arc<dyn Backend> {
    CpuBackend::shared(Device::CPU)
}

fn iota(shape: &[usize]) -> Tensor {
    let n: usize = shape.iter().product();
    Tensor::from_slice(&(0..n as i32).collect::<Vec<_>>(), shape).unwrap()
}

/// A 1-d view of every other element of `t` (a non-contiguous index tensor).
fn every_other(t: &Tensor) -> Tensor {
    let n = t.shape()[0].div_ceil(2);
    // SAFETY: elements 0, 2, 4, ... of `t` lie inside it; `t`'s owner keeps them alive.
    unsafe {
        Tensor::from_raw_parts(
            t.data_ptr(),
            vec![n],
            vec![2],
            t.dtype(),
            t.device(),
            false,
            t.owner().clone(),
        )
    }
}

#[test]
fn row_blocks_to_column_blocks() {
    let b = backend();
    let src = iota(&[6, 8]);
    // Rows 0..3 and 3..6 of `src` into two column blocks of 4 columns each.
    let cols = [
        b.empty(&[6, 4], DType::Int32).unwrap(),
        b.empty(&[6, 4], DType::Int32).unwrap(),
    ];
    let mut jobs = Vec::new();
    for (c, col) in cols.iter().enumerate() {
        for r in 0..2 {
            jobs.push(BoxCopy {
                src: &src,
                src_start: vec![3 * r, 4 * c],
                dst: col,
                dst_start: vec![3 * r, 0],
                shape: vec![3, 4],
            });
        }
    }
    b.copy_boxes(&jobs).unwrap();
    let whole = src.to_array::<i32>().unwrap();
    for (c, col) in cols.iter().enumerate() {
        let want = whole.slice(s![.., 4 * c..4 * c + 4]).into_dyn();
        assert_eq!(col.to_array::<i32>().unwrap(), want);
    }
}

#[test]
fn copy_boxes_refuses_bad_boxes_naming_them() {
    let b = backend();
    let src = iota(&[4, 4]);
    let dst = Tensor::zeros(&[4, 4], DType::Int32).unwrap();
    let far = BoxCopy {
        src: &src,
        src_start: vec![3, 0],
        dst: &dst,
        dst_start: vec![0, 0],
        shape: vec![2, 4],
    };
    let e = b.copy_boxes(&[far]).unwrap_err();
    assert!(e.to_string().contains("start (3, 0) shape (2, 4)"), "{e}");
    let f = Tensor::zeros(&[4, 4], DType::Float32).unwrap();
    let e = b
        .copy_boxes(&[BoxCopy {
            src: &src,
            src_start: vec![0, 0],
            dst: &f,
            dst_start: vec![0, 0],
            shape: vec![1, 1],
        }])
        .unwrap_err();
    assert!(e.to_string().contains("int32 and float32"), "{e}");
    let ro = dst.with_readonly(true).unwrap();
    let e = b
        .copy_boxes(&[BoxCopy {
            src: &src,
            src_start: vec![0, 0],
            dst: &ro,
            dst_start: vec![0, 0],
            shape: vec![1, 1],
        }])
        .unwrap_err();
    assert!(matches!(e, Error::ReadOnly { .. }), "{e}");
}

#[test]
fn a_box_copied_within_one_tensor() {
    // Column 0 into column 1 of the same tensor: spans overlap, elements do not.
    let b = backend();
    let t = iota(&[5, 3]);
    let want = t
        .to_array::<i32>()
        .unwrap()
        .slice(s![.., 0..1])
        .to_owned()
        .into_dyn();
    let job = BoxCopy {
        src: &t,
        src_start: vec![0, 0],
        dst: &t,
        dst_start: vec![0, 1],
        shape: vec![5, 1],
    };
    b.copy_boxes(&[job]).unwrap();
    assert_eq!(
        t.view(&[0, 1], &[5, 1]).unwrap().to_array::<i32>().unwrap(),
        want
    );
}

#[test]
fn overlapping_boxes_copy_as_if_read_first() {
    // Rows 0..4 onto rows 1..5 of the same tensor, as numpy's `t[1:] = t[:-1]`.
    let b = backend();
    let t = iota(&[5, 3]);
    let want = t
        .to_array::<i32>()
        .unwrap()
        .slice(s![0..4, ..])
        .to_owned()
        .into_dyn();
    let job = BoxCopy {
        src: &t,
        src_start: vec![0, 0],
        dst: &t,
        dst_start: vec![1, 0],
        shape: vec![4, 3],
    };
    b.copy_boxes(&[job]).unwrap();
    assert_eq!(
        t.view(&[1, 0], &[4, 3]).unwrap().to_array::<i32>().unwrap(),
        want
    );
}

#[test]
fn gather_and_scatter_on_tensors() {
    let b = backend();
    let src = iota(&[5, 4]);
    let all = Tensor::from_slice(&[3i64, 9, 0, 9, 1, 9, 1, 9], &[8]).unwrap();
    let idx = every_other(&all); // [3, 0, 1, 1]
    let list = [3usize, 0, 1, 1];
    let out = b.empty(&[5, 4], DType::Int32).unwrap();
    b.gather(&src, &idx, 1, &out).unwrap();
    let want = src.to_array::<i32>().unwrap().select(Axis(1), &list);
    assert_eq!(out.to_array::<i32>().unwrap(), want);

    let dst = Tensor::zeros(&[5, 4], DType::Int32).unwrap();
    b.scatter(&src, &idx, 1, &dst).unwrap();
    let v = src.to_array::<i32>().unwrap();
    let mut want = ndarray::ArrayD::<i32>::zeros(ndarray::IxDyn(&[5, 4]));
    for (i, &j) in list.iter().enumerate() {
        want.slice_mut(s![.., j]).assign(&v.slice(s![.., i]));
    }
    assert_eq!(dst.to_array::<i32>().unwrap(), want);
    // Column 1 got values column 3, the later of its two writers.
    assert_eq!(dst.to_array::<i32>().unwrap()[[0, 1]], 3);
}

#[test]
fn gather_checks_index_tensors() {
    let b = backend();
    let src = iota(&[5]);
    let out = b.empty(&[2], DType::Int32).unwrap();
    let idx32 = Tensor::from_slice(&[0i32, 1], &[2]).unwrap();
    let e = b.gather(&src, &idx32, 0, &out).unwrap_err();
    assert!(e.to_string().contains("int32"), "{e}");
    let bad = Tensor::from_slice(&[0i64, 5], &[2]).unwrap();
    let e = b.gather(&src, &bad, 0, &out).unwrap_err();
    assert!(
        matches!(
            e,
            Error::IndexOutOfRange {
                index: 5,
                axis: 0,
                len: 5
            }
        ),
        "{e}"
    );
}

/// A gather or scatter whose bad index comes after good ones writes nothing: every index is
/// checked before the first write, on each kernel path (rows, columns, long lists).
#[test]
fn gather_and_scatter_with_a_bad_index_leave_out_as_it_was() {
    let b = backend();
    for (shape, axis, n) in [
        (&[4usize, 3][..], 0, 2),
        (&[4, 3], 1, 2),
        (&[4096, 2], 0, 3000),
    ] {
        let len = shape[axis] as i64;
        let mut list: Vec<i64> = (0..n as i64).map(|k| (k * 7) % len).collect();
        list[n - 1] = len + 5;
        let idx = Tensor::from_slice(&list, &[n]).unwrap();
        let mut short = shape.to_vec();
        short[axis] = n;
        let bad = |e: Error| {
            assert!(
                matches!(e, Error::IndexOutOfRange { index, axis: a, len: l }
                    if index == (len + 5) as i128 && a == axis && l == len as usize),
                "{e}"
            )
        };
        // gather: out is the short side
        let src = iota(shape);
        let out = Tensor::zeros(&short, DType::Int32).unwrap();
        bad(b.gather(&src, &idx, axis, &out).unwrap_err());
        let zeros = ndarray::ArrayD::<i32>::zeros(ndarray::IxDyn(&short));
        assert_eq!(out.to_array::<i32>().unwrap(), zeros, "gather {shape:?}");
        // scatter: out is the indexed side
        let values = iota(&short);
        let out = Tensor::zeros(shape, DType::Int32).unwrap();
        bad(b.scatter(&values, &idx, axis, &out).unwrap_err());
        let zeros = ndarray::ArrayD::<i32>::zeros(ndarray::IxDyn(shape));
        assert_eq!(out.to_array::<i32>().unwrap(), zeros, "scatter {shape:?}");
    }
}

#[test]
fn identity_gather_in_place_keeps_the_data() {
    let b = backend();
    let t = iota(&[6, 2]);
    let want = t.to_array::<i32>().unwrap();
    let idx = Tensor::from_slice(&(0..6i64).collect::<Vec<_>>(), &[6]).unwrap();
    b.gather(&t, &idx, 0, &t).unwrap();
    assert_eq!(t.to_array::<i32>().unwrap(), want);
}

/// Small targets share one 64-byte aligned allocation without overlapping; big ones get their
/// own; every tensor can be written and read back independently, also after others are dropped.
#[test]
fn empty_many_carves_small_tensors_from_one_allocation() {
    let b = backend();
    let shapes: [&[usize]; 5] = [&[3, 5], &[0, 4], &[1100, 1024], &[1], &[2, 2, 3]];
    let mut ts = b.empty_many(&shapes, DType::Int16).unwrap();
    for (t, s) in ts.iter().zip(shapes) {
        assert_eq!(t.shape(), s);
        assert!(t.is_contiguous());
        assert_eq!(t.data_ptr() as usize % 64, 0);
    }
    // 1100 x 1024 x 2 bytes is over 2 MiB: a buffer of its own.
    assert!(!Arc::ptr_eq(ts[2].owner(), ts[0].owner()));
    assert!(Arc::ptr_eq(ts[0].owner(), ts[3].owner()));
    assert!(Arc::ptr_eq(ts[0].owner(), ts[4].owner()));
    // Distinct fills, written through one tensor at a time, must all survive.
    let fill = |t: &Tensor, k: i16| {
        let n: usize = t.shape().iter().product();
        // SAFETY: a contiguous int16 tensor of n elements, which this test alone writes.
        unsafe { std::slice::from_raw_parts_mut(t.data_ptr().cast::<i16>(), n) }.fill(k);
    };
    let read = |t: &Tensor| {
        let n: usize = t.shape().iter().product();
        // SAFETY: as for `fill`, read only.
        unsafe { std::slice::from_raw_parts(t.data_ptr().cast::<i16>(), n) }.to_vec()
    };
    // The big one is left alone: filling it is slow under Miri and it shares nothing.
    for (k, t) in ts.iter().enumerate().filter(|(k, _)| *k != 2) {
        fill(t, k as i16 + 1);
    }
    let last = ts.pop().unwrap();
    drop(ts.remove(0));
    assert!(read(&last).iter().all(|&v| v == 5));
    assert!(read(&ts[2]).iter().all(|&v| v == 4));
    assert!(read(&ts[0]).is_empty());
}

/// A tensor of `shape` whose every element is the one int32 of `keep` (all strides 0): a huge
/// logical size over 4 bytes.
fn repeated(keep: &Tensor, shape: &[usize]) -> Tensor {
    // SAFETY: with zero strides every index addresses `keep`'s first element, which `keep`'s
    // owner keeps alive.
    unsafe {
        Tensor::from_raw_parts(
            keep.data_ptr(),
            shape.to_vec(),
            vec![0; shape.len()],
            keep.dtype(),
            Device::CPU,
            false,
            keep.owner().clone(),
        )
    }
}

/// Outputs, staging copies and index copies too large for the host are errors naming the
/// bytes, not an abort (2^62 bytes: a valid layout no machine can map).
#[test]
#[cfg_attr(miri, ignore = "Miri stops at an allocation it cannot make")]
fn allocations_the_host_refuses_are_out_of_memory_errors() {
    let b = backend();
    let huge: &[usize] = &[1 << 30, 1 << 30];
    let oom = |r: Result<_, Error>, bytes: usize| match r {
        Err(Error::OutOfMemory { bytes: b, .. }) => assert_eq!(b, bytes),
        Err(e) => panic!("{e}"),
        Ok(_) => panic!("allocated"),
    };
    oom(b.empty(huge, DType::Float32).map(drop), 1 << 62);
    oom(
        b.empty_many(&[&[2], huge], DType::Float32).map(drop),
        1 << 62,
    );
    let one = iota(&[1]);
    let src = repeated(&one, huge);
    oom(crate::ops::to_device(&src, Device::CPU).map(drop), 1 << 62);
    let idx = Tensor::from_slice(&[0i64, 1], &[2]).unwrap();
    // The gathered output, then the copy of the indices.
    let wide = repeated(&one, &[2, 1 << 59]);
    oom(crate::ops::gather(&wide, &idx, 0, None).map(drop), 1 << 62);
    let many = repeated(&idx, &[1 << 59]);
    oom(crate::ops::gather(&src, &many, 1, None).map(drop), 1 << 62);
    // The staging copy of a source that overlaps its destination.
    let view = crate::backend::cpu::SrcView {
        ptr: one.data_ptr(),
        shape: huge,
        strides: &[0, 0],
    };
    oom(super::super::packed(view, 4).map(drop), 1 << 62);
}

/// The backend's own gather, scatter and transfer write from several threads: a writable
/// destination holding an element twice (a zero stride, as a DLPack import may hand over) is
/// refused before anything is written, as `ops` refuses it.
#[test]
fn destinations_holding_an_element_twice_are_refused() {
    let b = backend();
    let keep = iota(&[1]);
    let out = repeated(&keep, &[4]);
    let idx = b
        .normalise_indices(&Tensor::from_slice(&[0i64, 1, 2, 3], &[4]).unwrap(), 0, 4)
        .unwrap();
    let values = Tensor::from_slice(&[7i32, 8, 9, 10], &[4]).unwrap();
    for e in [
        b.scatter(&values, &idx, 0, &out).unwrap_err(),
        b.gather(&values, &idx, 0, &out).unwrap_err(),
        b.transfer(&values, &out).unwrap_err(),
    ] {
        assert!(e.to_string().contains("more than once"), "{e}");
    }
    assert_eq!(keep.to_array::<i32>().unwrap()[[0]], 0, "nothing written");
}
