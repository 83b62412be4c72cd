//! Prepared gathers and scatters against ndarray, run many times over changing data; their
//! errors against those of `ops::gather` and `ops::scatter`; the memory they keep alive.

use ndarray::{ArcArray, ArrayD, Axis, IxDyn};

use super::*;
use crate::dtype::DType;
use crate::ops;

use crate::test_rng::Rng;

impl Rng {
    fn tensor(&mut self, shape: &[usize]) -> Tensor {
        let n: usize = shape.iter().product();
        let v: Vec<i32> = (0..n).map(|_| self.next() as i32).collect();
        Tensor::from_slice(&v, shape).unwrap()
    }
}

/// New random data in `t`, written through dlpart (a scatter over its whole first axis), as a
/// stencil would rewrite it between two runs.
fn rewrite(t: &Tensor, rng: &mut Rng) {
    let every: Vec<i64> = (0..t.shape()[0] as i64).collect();
    let all = Tensor::from_slice(&every, &[every.len()]).unwrap();
    ops::scatter(&rng.tensor(t.shape()), &all, t, 0).unwrap();
}

/// `t` inside a bigger tensor: every other element along `axis`, so that strides have gaps.
fn stepped(t: &Tensor, axis: usize) -> Tensor {
    let mut big_shape = t.shape().to_vec();
    big_shape[axis] *= 2;
    let big = Tensor::zeros(&big_shape, t.dtype()).unwrap();
    let mut strides = big.strides().to_vec();
    strides[axis] *= 2;
    // SAFETY: every element of the view is an element of `big` (even positions along `axis`),
    // whose owner the view keeps.
    let view = unsafe {
        Tensor::from_raw_parts(
            big.data_ptr(),
            t.shape().to_vec(),
            strides,
            t.dtype(),
            t.device(),
            false,
            big.owner().clone(),
        )
    };
    let every: Vec<i64> = (0..t.shape()[0] as i64).collect();
    ops::scatter(
        t,
        Tensor::from_slice(&every, &[every.len()]).unwrap(),
        &view,
        0,
    )
    .unwrap();
    view
}

fn array(t: &Tensor) -> ArrayD<i32> {
    t.to_array::<i32>().unwrap()
}

/// A random case: (shape of the indexed side, axis, indices with negative ones and repeats).
fn case(rng: &mut Rng) -> (Vec<usize>, usize, Vec<i64>) {
    let ndim = 1 + rng.below(4);
    let shape: Vec<usize> = (0..ndim).map(|_| 1 + rng.below(6)).collect();
    let axis = rng.below(ndim);
    let len = shape[axis] as i64;
    let idx = (0..rng.below(9))
        .map(|_| rng.below(2 * len as usize) as i64 - len)
        .collect();
    (shape, axis, idx)
}

fn positive(idx: &[i64], len: usize) -> Vec<usize> {
    idx.iter()
        .map(|&i| if i < 0 { i + len as i64 } else { i } as usize)
        .collect()
}

#[test]
fn gathers_match_ndarray_select_run_after_run() {
    let mut rng = Rng(11);
    for n in 0..200 {
        let (shape, axis, idx) = case(&mut rng);
        let mut src = rng.tensor(&shape);
        if n % 3 == 0 {
            src = stepped(&src, rng.below(shape.len()));
        }
        let indices = Tensor::from_slice(&idx, &[idx.len()]).unwrap();
        let mut out_shape = shape.clone();
        out_shape[axis] = idx.len();
        let given = (n % 2 == 0).then(|| rng.tensor(&out_shape));
        let g = PreparedGather::new(&src, &indices, axis, given.as_ref()).unwrap();
        assert_eq!((g.axis(), g.num_indices()), (axis, idx.len()));
        if let Some(o) = &given {
            assert_eq!(g.out().data_ptr(), o.data_ptr(), "out is the caller's");
        }
        let pick = positive(&idx, shape[axis]);
        for run in 0..3 {
            if run > 0 {
                rewrite(&src, &mut rng);
            }
            g.run().unwrap();
            let want = array(&src).select(Axis(axis), &pick);
            assert_eq!(
                array(g.out()),
                want,
                "case {n} run {run}: {shape:?} axis {axis}"
            );
        }
    }
}

#[test]
fn scatters_match_a_loop_where_the_last_duplicate_wins_run_after_run() {
    let mut rng = Rng(12);
    for n in 0..200 {
        let (shape, axis, idx) = case(&mut rng);
        let mut out = rng.tensor(&shape);
        if n % 3 == 0 {
            out = stepped(&out, rng.below(shape.len()));
        }
        let mut values_shape = shape.clone();
        values_shape[axis] = idx.len();
        let values = rng.tensor(&values_shape);
        let indices = Tensor::from_slice(&idx, &[idx.len()]).unwrap();
        let s = PreparedScatter::new(&values, &indices, &out, axis).unwrap();
        let pick = positive(&idx, shape[axis]);
        for run in 0..3 {
            if run > 0 && !idx.is_empty() {
                rewrite(&values, &mut rng);
            }
            let mut want = array(&out);
            let v = array(&values);
            for (i, &j) in pick.iter().enumerate() {
                want.index_axis_mut(Axis(axis), j)
                    .assign(&v.index_axis(Axis(axis), i));
            }
            s.run().unwrap();
            assert_eq!(
                array(&out),
                want,
                "case {n} run {run}: {shape:?} axis {axis}"
            );
        }
    }
}

/// The error of a preparation, which must be the plain operation's, and nothing written.
fn same_error(prepared: Result<()>, plain: Result<()>, written: &Tensor, before: &ArrayD<i32>) {
    let (a, b) = (prepared.unwrap_err(), plain.unwrap_err());
    assert_eq!(std::mem::discriminant(&a), std::mem::discriminant(&b));
    assert_eq!(a.to_string(), b.to_string());
    assert_eq!(&array(written), before, "written before the error: {a}");
}

#[test]
fn preparation_refuses_what_gather_and_scatter_refuse_with_the_same_errors() {
    let x = Tensor::from_slice(&(0..24).collect::<Vec<i32>>(), &[4, 6]).unwrap();
    let idx = |v: &[i64]| Tensor::from_slice(v, &[v.len()]).unwrap();
    let out = Tensor::zeros(&[2, 6], DType::Int32).unwrap();
    let zeros = array(&out);
    let readonly = out.with_readonly(true).unwrap();
    let wide = Tensor::zeros(&[2, 7], DType::Int32).unwrap();
    let float = Tensor::zeros(&[2, 6], DType::Float32).unwrap();
    let gathers: Vec<(&str, Tensor, usize, &Tensor)> = vec![
        ("axis", idx(&[0, 1]), 2, &out),
        ("index past the end", idx(&[0, 4]), 0, &out),
        ("index before the start", idx(&[-5, 0]), 0, &out),
        (
            "2-d indices",
            Tensor::from_slice(&[0i64, 1], &[1, 2]).unwrap(),
            0,
            &out,
        ),
        (
            "float indices",
            Tensor::from_slice(&[0f32, 1.], &[2]).unwrap(),
            0,
            &out,
        ),
        ("out shape", idx(&[0, 1]), 0, &wide),
        ("out dtype", idx(&[0, 1]), 0, &float),
        ("read-only out", idx(&[0, 1]), 0, &readonly),
    ];
    for (what, i, axis, o) in &gathers {
        eprintln!("gather: {what}");
        same_error(
            PreparedGather::new(&x, i, *axis, Some(o)).map(drop),
            ops::gather(&x, i, *axis, Some(o)).map(drop),
            &out,
            &zeros,
        );
    }
    let target = x.clone();
    let before = array(&x);
    let values = Tensor::zeros(&[4, 2], DType::Int32).unwrap();
    let scatters: Vec<(&str, Tensor, Tensor, Tensor, usize)> = vec![
        ("axis", values.clone(), idx(&[0, 1]), target.clone(), 2),
        ("index", values.clone(), idx(&[0, 6]), target.clone(), 1),
        (
            "values shape",
            Tensor::zeros(&[4, 3], DType::Int32).unwrap(),
            idx(&[0, 1]),
            target.clone(),
            1,
        ),
        (
            "values dtype",
            Tensor::zeros(&[4, 2], DType::Int64).unwrap(),
            idx(&[0, 1]),
            target.clone(),
            1,
        ),
        (
            "read-only out",
            values.clone(),
            idx(&[0, 1]),
            x.with_readonly(true).unwrap(),
            1,
        ),
    ];
    for (what, v, i, o, axis) in &scatters {
        eprintln!("scatter: {what}");
        same_error(
            PreparedScatter::new(v, i, o, *axis).map(drop),
            ops::scatter(v, i, o, *axis),
            &x,
            &before,
        );
    }
}

#[test]
fn operands_sharing_memory_are_refused_and_disjoint_views_of_one_buffer_run() {
    let x = Tensor::from_slice(&(0..24).collect::<Vec<i32>>(), &[6, 4]).unwrap();
    let rows = |start: usize, n: usize| x.view(&[start, 0], &[n, 4]).unwrap();
    let two = Tensor::from_slice(&[0i64, 1], &[2]).unwrap();
    let e = PreparedGather::new(&x, &two, 0, Some(&rows(3, 2))).unwrap_err();
    assert!(
        matches!(e, Error::Buffer { .. }) && e.to_string().contains("shares memory"),
        "{e}"
    );
    let e = PreparedScatter::new(&rows(0, 2), &two, &rows(1, 4), 0).unwrap_err();
    assert!(
        matches!(e, Error::Buffer { .. }) && e.to_string().contains("shares memory"),
        "{e}"
    );
    // Every element of a zero-stride out is one element.
    // SAFETY: all 8 elements of the view are element 0 of `x`, whose owner it keeps.
    let broadcast = unsafe {
        Tensor::from_raw_parts(
            x.data_ptr(),
            vec![2, 4],
            vec![0, 0],
            DType::Int32,
            Device::CPU,
            false,
            x.owner().clone(),
        )
    };
    let other = Tensor::zeros(&[6, 4], DType::Int32).unwrap();
    let e = PreparedGather::new(&other, &two, 0, Some(&broadcast)).unwrap_err();
    assert!(e.to_string().contains("more than once"), "{e}");
    // A periodic halo within one array: ghost rows 0 and 5 from interior rows 4 and 1.
    let interior = rows(1, 4);
    let g = PreparedGather::new(
        &interior,
        Tensor::from_slice(&[3i64, 0], &[2]).unwrap(),
        0,
        None,
    )
    .unwrap();
    let ghosts = Tensor::from_slice(&[0i64, 5], &[2]).unwrap();
    let s = PreparedScatter::new(g.out(), &ghosts, &x, 0).unwrap();
    g.run().unwrap();
    s.run().unwrap();
    let a = array(&x);
    assert_eq!(a.index_axis(Axis(0), 0), a.index_axis(Axis(0), 4));
    assert_eq!(a.index_axis(Axis(0), 5), a.index_axis(Axis(0), 1));
}

/// One index drops the axis: an `out` refused for sharing memory with the source is named as
/// the caller gave it, not as the slab of one the kernels write.
#[test]
fn a_refused_out_for_one_index_is_named_as_given() {
    let x = Tensor::zeros(&[4, 3], DType::Int32).unwrap();
    // Row 3 of `x` (three contiguous elements) as a 1-d tensor, keeping `x`'s owner.
    let row3 = x.view(&[3, 0], &[1, 3]).unwrap().without_unit_axis(0);
    let e = PreparedGather::new(&x, 0, 0, Some(&row3)).unwrap_err();
    let want = format!("out {row3:?} shares memory with the source {x:?}");
    assert!(matches!(e, Error::Buffer { .. }), "{e}");
    assert!(e.to_string().starts_with(&want), "{e}");
    assert!(!e.to_string().contains("(1, 3)"), "{e}");
}

#[test]
fn the_tensors_live_as_long_as_the_prepared_operation() {
    let a: ArcArray<f32, IxDyn> = ArcArray::from_shape_fn(IxDyn(&[3, 5]), |i| i[0] as f32);
    let src = Tensor::from_arc_array(a.clone());
    let g = PreparedGather::new(&src, Tensor::from_slice(&[2i64], &[1]).unwrap(), 0, None).unwrap();
    drop(src);
    assert!(
        !a.is_unique(),
        "the prepared gather keeps the source's buffer"
    );
    g.run().unwrap();
    assert_eq!(g.out().to_array::<f32>().unwrap().sum(), 10.0);
    let text = format!("{g:?}");
    assert!(text.starts_with("PreparedGather { axis: 0, indices: 1, src: Tensor(shape=(3, 5)"));
    drop(g);
    assert!(a.is_unique(), "and lets it go when dropped");
}

#[test]
fn a_backend_of_another_device_is_refused_before_anything_is_read() {
    let host = Tensor::from_slice(&[1i32, 2, 3], &[3]).unwrap();
    // SAFETY: a tensor that claims to be on kDLCUDA:0, over host memory its owner keeps; the
    // preparations below refuse it before reading or writing any element.
    let on_gpu = unsafe {
        Tensor::from_raw_parts(
            host.data_ptr(),
            vec![3],
            vec![1],
            DType::Int32,
            Device::cuda(0),
            false,
            host.owner().clone(),
        )
    };
    let cpu = backend_for(Device::CPU).unwrap();
    let one = Tensor::from_slice(&[0i64], &[1]).unwrap();
    let e = PreparedGather::on(cpu.clone(), &on_gpu, &one, 0, None).unwrap_err();
    assert!(
        e.to_string()
            .contains("the tensors are not on the backend's device kDLCPU"),
        "{e}"
    );
    let e =
        PreparedScatter::on(cpu, &on_gpu.view(&[0], &[1]).unwrap(), &one, &on_gpu, 0).unwrap_err();
    assert!(matches!(e, Error::DeviceMismatch { .. }), "{e}");
}
