//! ndarray in, without copying and without `unsafe`: the tensor views the array's own buffer
//! with the array's own strides, whatever its layout.

use dlpart::backend::{backend_for, BoxCopy};
use dlpart::{DType, Device, Tensor};
use ndarray::{arr2, s, ArcArray, Array, Array0, Array2, ArrayD, Dimension};

/// Takes `a` into a tensor and checks that the tensor starts at the array's first element,
/// has its shape and strides, and reads back the same values.
fn check_zero_copy<D: Dimension>(a: Array<f32, D>) -> Tensor {
    let expect = a.clone().into_dyn();
    let (ptr, shape, strides) = (a.as_ptr(), a.shape().to_vec(), a.strides().to_vec());
    let t = Tensor::from_ndarray(a);
    assert_eq!(
        t.data_ptr().cast_const(),
        ptr.cast::<u8>(),
        "the data was copied"
    );
    assert_eq!((t.shape(), t.strides()), (&shape[..], &strides[..]));
    assert_eq!(
        (t.dtype(), t.device(), t.readonly()),
        (DType::Float32, Device::CPU, false)
    );
    assert_eq!(t.to_array::<f32>().unwrap(), expect);
    assert_eq!(t.as_array::<f32>().unwrap(), expect);
    t
}

fn grid(rows: usize, cols: usize) -> Array2<f32> {
    Array::from_shape_fn((rows, cols), |(i, j)| (i * 10 + j) as f32)
}

#[test]
fn c_order_arrays_are_taken_as_they_are() {
    let t = check_zero_copy(grid(3, 4));
    assert_eq!(t.strides(), [4, 1]);
    assert!(t.is_contiguous());
}

#[test]
fn fortran_order_arrays_keep_their_strides() {
    let t = check_zero_copy(grid(3, 4).reversed_axes());
    assert_eq!((t.shape(), t.strides()), (&[4, 3][..], &[1, 4][..]));
    assert!(!t.is_contiguous());
}

#[test]
fn negatively_strided_and_offset_arrays_start_at_their_first_element() {
    let t = check_zero_copy(grid(3, 4).slice_move(s![..;-1, ..]));
    assert_eq!(t.strides(), [-4, 1]);
    assert_eq!(t.as_array::<f32>().unwrap()[[0, 0]], 20.0);
    let t = check_zero_copy(grid(5, 4).slice_move(s![1..;-2, 1..;-1]));
    assert_eq!((t.shape(), t.strides()), (&[2, 3][..], &[-8, -1][..]));
    assert_eq!(t.to_array::<f32>().unwrap()[[0, 0]], 43.0);
}

#[test]
fn zero_dimensional_and_empty_arrays() {
    let t = Tensor::from_ndarray(Array0::from_elem((), 7i64));
    assert_eq!((t.ndim(), t.numel(), t.dtype()), (0, 1, DType::Int64));
    assert_eq!(t.to_array::<i64>().unwrap(), ArrayD::from_elem(vec![], 7));
    let t = check_zero_copy(Array2::<f32>::zeros((0, 5)));
    assert_eq!((t.shape(), t.numel(), t.nbytes()), (&[0, 5][..], 0, 0));
}

#[test]
fn from_is_the_same_zero_copy_conversion() {
    let a = arr2(&[[1u16, 2], [3, 4]]);
    let ptr = a.as_ptr();
    let t: Tensor = a.into();
    assert_eq!(t.data_ptr().cast_const(), ptr.cast::<u8>());
    assert_eq!(
        t.to_array::<u16>().unwrap(),
        arr2(&[[1, 2], [3, 4]]).into_dyn()
    );
}

#[test]
fn dlpart_writes_into_the_arrays_buffer() {
    // Fortran order, so that the copy has to follow the array's strides.
    let dst = Tensor::from_ndarray(Array2::<f32>::zeros((4, 3)).reversed_axes());
    let src = Tensor::from_ndarray(grid(3, 4));
    backend_for(Device::CPU)
        .unwrap()
        .copy_boxes(&[BoxCopy {
            src: &src,
            src_start: vec![0, 1],
            dst: &dst,
            dst_start: vec![1, 0],
            shape: vec![2, 3],
        }])
        .unwrap();
    let mut expect = Array2::<f32>::zeros((3, 4));
    expect
        .slice_mut(s![1.., ..3])
        .assign(&grid(3, 4).slice(s![..2, 1..]));
    assert_eq!(dst.to_array::<f32>().unwrap(), expect.into_dyn());
}

#[test]
fn arc_arrays_are_shared_read_only() {
    let mut a = ArcArray::from_shape_vec((2, 3), vec![1i32, 2, 3, 4, 5, 6]).unwrap();
    let t = Tensor::from_arc_array(a.clone());
    assert_eq!(
        t.data_ptr().cast_const(),
        a.as_ptr().cast::<u8>(),
        "the data was copied"
    );
    assert!(t.readonly());
    assert!(t.with_readonly(false).is_err());
    let dst = Tensor::from_arc_array(a.clone());
    let copy = BoxCopy {
        src: &t,
        src_start: vec![0, 0],
        dst: &dst,
        dst_start: vec![0, 0],
        shape: vec![1, 1],
    };
    assert!(backend_for(Device::CPU)
        .unwrap()
        .copy_boxes(&[copy])
        .is_err());
    // A write through the caller's handle copies on write: the tensor keeps the old values.
    a[[0, 0]] = 99;
    assert_ne!(t.data_ptr().cast_const(), a.as_ptr().cast::<u8>());
    assert_eq!(
        t.to_array::<i32>().unwrap(),
        arr2(&[[1, 2, 3], [4, 5, 6]]).into_dyn()
    );
    // Views keep the layout of the shared array, negative strides included.
    let r = a.slice_move(s![.., ..;-1]);
    let t = Tensor::from_arc_array(r.clone());
    assert_eq!(t.strides(), [3, -1]);
    assert_eq!(t.to_array::<i32>().unwrap(), r.into_dyn().to_owned());
}
