//! Every form of [`AsIndices`] through every function that takes indices: each gives what the
//! `&Tensor` form gives and what an ndarray reference (`select`, a hand-written assignment
//! loop) gives; indices that no axis holds, and indices of two axes, are errors naming them.

use ndarray::{arr0, array, s, ArcArray1, Array1, Array2, ArrayD, ArrayRef, Axis, Ix1, IxDyn};

use super::*;
use crate::dtype::DType;
use crate::error::Error;
use crate::layout::Layout;
use crate::partitioned::PartitionedArray;
use crate::prepared::{PreparedGather, PreparedScatter};
use crate::spmd::{self, Communicator, ThreadComm};
use crate::{ops, spmd::from_stacked};

/// The side of the square test arrays: every index below is taken along an axis this long.
const N: usize = 5;
/// The list every form holds, negative ones counting from the end of an axis of `N`...
const SIGNED: [i64; 4] = [3, -4, 4, -2];
/// ... which is this list of positions (a duplicate: a scatter keeps the last).
const POSITIONS: [usize; 4] = [3, 1, 4, 3];
static S8: [i8; 4] = [3, -4, 4, -2];
static S16: [i16; 4] = [3, -4, 4, -2];
static S32: [i32; 4] = [3, -4, 4, -2];
static SIZE: [isize; 4] = [3, -4, 4, -2];
static U8: [u8; 4] = [3, 1, 4, 3];
static U32: [u32; 4] = [3, 1, 4, 3];
static U64: [u64; 4] = [3, 1, 4, 3];
static USIZE: [usize; 4] = POSITIONS;

type Form = (&'static str, Box<dyn AsIndices + Send + Sync>);

fn leak<T>(t: T) -> &'static T {
    Box::leak(Box::new(t))
}

/// The list as a tensor: the form every other one is compared with.
fn tensor_form() -> Tensor {
    Tensor::from_slice(&SIGNED, &[SIGNED.len()]).unwrap()
}

/// `SIGNED` (or `POSITIONS`, for the unsigned types) in every form a caller may hold it.
fn list_forms() -> Vec<Form> {
    let every_other: &'static Array1<i32> = leak(array![3, 9, -4, 9, 4, 9, -2]);
    let reversed: &'static Array1<i64> = leak(array![-2, 4, -4, 3]);
    let owned: &'static Array1<usize> = leak(Array1::from(POSITIONS.to_vec()));
    let array_ref: &'static ArrayRef<i64, Ix1> = leak(Array1::from(SIGNED.to_vec()));
    vec![
        ("&[i8]", Box::new(&S8[..])),
        ("&[i16]", Box::new(&S16[..])),
        ("&[i32]", Box::new(&S32[..])),
        ("&[i64]", Box::new(&SIGNED[..])),
        ("&[isize]", Box::new(&SIZE[..])),
        ("&[u8]", Box::new(&U8[..])),
        ("&[u32]", Box::new(&U32[..])),
        ("&[u64]", Box::new(&U64[..])),
        ("&[usize]", Box::new(&USIZE[..])),
        ("Vec<i64>", Box::new(SIGNED.to_vec())),
        ("&Vec<usize>", Box::new(leak(POSITIONS.to_vec()))),
        ("[i64; 4]", Box::new(SIGNED)),
        ("&[i32; 4]", Box::new(&S32)),
        ("[usize; 4]", Box::new(POSITIONS)),
        ("Array1<i64>", Box::new(Array1::from(SIGNED.to_vec()))),
        ("&Array1<usize>", Box::new(owned)),
        (
            "ArrayView1<i32> (every other)",
            Box::new(every_other.slice(s![..;2])),
        ),
        (
            "ArrayView1<i64> (reversed)",
            Box::new(reversed.slice(s![..;-1])),
        ),
        ("&ArrayRef<i64>", Box::new(array_ref)),
        ("ArcArray1<i64>", Box::new(ArcArray1::from(SIGNED.to_vec()))),
        (
            "ArrayD<u64> of 1 axis",
            Box::new(ArrayD::from_shape_vec(IxDyn(&[4]), U64.to_vec()).unwrap()),
        ),
        (
            "Tensor (int32)",
            Box::new(Tensor::from_slice(&S32, &[4]).unwrap()),
        ),
        ("&&Tensor", Box::new(leak(tensor_form()))),
    ]
}

/// The index -2 (position 3 of an axis of `N`) in every form of one index.
fn one_forms() -> Vec<Form> {
    vec![
        ("i8", Box::new(-2i8)),
        ("i32", Box::new(-2i32)),
        ("i64", Box::new(-2i64)),
        ("isize", Box::new(-2isize)),
        ("u8", Box::new(3u8)),
        ("u64", Box::new(3u64)),
        ("usize", Box::new(3usize)),
        ("&usize", Box::new(leak(3usize))),
        ("arr0(i64)", Box::new(arr0(-2i64))),
        ("&arr0(usize)", Box::new(leak(arr0(3usize)))),
        (
            "0-d Tensor",
            Box::new(Tensor::from_slice(&[-2i64], &[]).unwrap()),
        ),
    ]
}

fn source() -> Array2<i32> {
    Array2::from_shape_fn((N, N), |(i, j)| (10 * i + j) as i32)
}

/// `numpy`'s `out[.., positions[k], ..] = values[.., k, ..]`, the last of duplicates winning.
fn assigned(values: &ArrayD<i32>, positions: &[usize], axis: usize) -> ArrayD<i32> {
    let mut out = ArrayD::<i32>::zeros(IxDyn(&[N, N]));
    for (k, &i) in positions.iter().enumerate() {
        out.index_axis_mut(Axis(axis), i)
            .assign(&values.index_axis(Axis(axis), k));
    }
    out
}

/// Values for a scatter along `axis` of `want`'s shape, distinct along the axis even where
/// `want` repeats a slice, so that the last of duplicate indices is seen to win.
fn distinct_values(want: &ArrayD<i32>, axis: usize) -> ArrayD<i32> {
    ArrayD::from_shape_fn(want.shape(), |i| -1 - want[&i] - 100 * i[axis] as i32)
}

fn values_of(t: &Tensor) -> ArrayD<i32> {
    t.to_array::<i32>().unwrap()
}

#[test]
fn every_form_of_a_list_gathers_and_scatters_as_its_tensor_and_ndarray_do() {
    let x = source();
    let src = Tensor::from(x.clone());
    let tensor = tensor_form();
    for axis in 0..2 {
        let want = x.select(Axis(axis), &POSITIONS).into_dyn();
        assert_eq!(
            values_of(&ops::gather(&src, &tensor, axis, None).unwrap()),
            want
        );
        // Values with a distinct element everywhere, scattered back along the axis.
        let values = distinct_values(&want, axis);
        let written = assigned(&values, &POSITIONS, axis);
        let scattered = |indices: &dyn AsIndices| {
            let out = Tensor::zeros(&[N, N], DType::Int32).unwrap();
            ops::scatter(&Tensor::from(values.clone()), indices, &out, axis).unwrap();
            values_of(&out)
        };
        assert_eq!(scattered(&tensor), written);
        for (form, indices) in list_forms() {
            let what = format!("{form}, axis {axis}");
            let indices = &*indices;
            let got = ops::gather(&src, indices, axis, None).unwrap();
            assert_eq!(values_of(&got), want, "{what}");
            assert_eq!(scattered(indices), written, "{what}");
            let pack = PreparedGather::new(&src, indices, axis, None).unwrap();
            pack.run().unwrap();
            assert_eq!(values_of(pack.out()), want, "{what}");
            let out = Tensor::zeros(&[N, N], DType::Int32).unwrap();
            let unpack =
                PreparedScatter::new(&Tensor::from(values.clone()), indices, &out, axis).unwrap();
            unpack.run().unwrap();
            assert_eq!(values_of(&out), written, "{what}");
            let normalised = ops::normalise_indices(indices, axis, N).unwrap();
            let normalised: Vec<i64> = normalised
                .as_array::<i64>()
                .unwrap()
                .iter()
                .copied()
                .collect();
            assert_eq!(normalised, POSITIONS.map(|i| i as i64), "{what}");
        }
    }
}

#[test]
fn every_form_of_a_list_gathers_and_scatters_a_partitioned_array_as_its_tensor_does() {
    let x = source();
    let tensor = tensor_form();
    let split = |a: ArrayD<i32>| {
        PartitionedArray::partition(&Tensor::from(a), &Layout::tiling(&[2, 3])).unwrap()
    };
    let pa = split(x.clone().into_dyn());
    let whole = |pa: &PartitionedArray| values_of(&pa.assemble(None, false).unwrap());
    for axis in 0..2 {
        let want = x.select(Axis(axis), &POSITIONS).into_dyn();
        let values = distinct_values(&want, axis);
        let written = assigned(&values, &POSITIONS, axis);
        assert_eq!(whole(&pa.gather(&tensor, axis, false).unwrap()), want);
        let serving = pa.serving(&tensor, axis).unwrap();
        for (form, indices) in list_forms() {
            let what = format!("{form}, axis {axis}");
            let indices = &*indices;
            assert_eq!(
                whole(&pa.gather(indices, axis, false).unwrap()),
                want,
                "{what}"
            );
            let target = split(ArrayD::zeros(IxDyn(&[N, N])));
            target
                .scatter(&Tensor::from(values.clone()), indices, axis, false)
                .unwrap();
            assert_eq!(whole(&target), written, "{what}");
            assert_eq!(pa.serving(indices, axis).unwrap(), serving, "{what}");
        }
    }
}

/// Each of three ranks holds a row block (rows 0..2, 2..4, 4..5) of `source()`.
fn stacked(comm: &ThreadComm, a: &Array2<i32>) -> PartitionedArray {
    let me = comm.rank();
    let rows = a.slice(s![2 * me..(2 * me + 2).min(N), ..]).to_owned();
    from_stacked(comm, vec![Tensor::from(rows)], 0).unwrap()
}

#[test]
fn every_form_of_a_list_gathers_and_scatters_across_ranks_as_its_tensor_does() {
    let x = source();
    let tensor = tensor_form();
    ThreadComm::run(3, |comm| {
        let pa = stacked(comm, &x);
        let whole = |pa: &PartitionedArray| {
            spmd::assemble(comm, pa, None, None, false)
                .unwrap()
                .map(|t| values_of(&t))
                .unwrap()
        };
        for axis in 0..2 {
            let want = x.select(Axis(axis), &POSITIONS).into_dyn();
            let values = distinct_values(&want, axis);
            let written = assigned(&values, &POSITIONS, axis);
            let (got, _) = spmd::gather(comm, &pa, &tensor, axis).unwrap();
            assert_eq!(whole(&got), want);
            for (form, indices) in list_forms() {
                let what = format!("{form}, axis {axis}");
                let indices = &*indices;
                let (got, _) = spmd::gather(comm, &pa, indices, axis).unwrap();
                assert_eq!(whole(&got), want, "{what}");
                let target = stacked(comm, &Array2::zeros((N, N)));
                spmd::scatter(comm, &target, &Tensor::from(values.clone()), indices, axis).unwrap();
                assert_eq!(whole(&target), written, "{what}");
            }
        }
    });
}

#[test]
fn one_integer_is_one_index_and_drops_the_axis_as_a_0d_tensor_does() {
    let x = source();
    let src = Tensor::from(x.clone());
    let zero_d = Tensor::from_slice(&[-2i64], &[]).unwrap();
    let pa = PartitionedArray::partition(&src, &Layout::tiling(&[2, 2])).unwrap();
    for axis in 0..2 {
        // numpy.take(x, -2, axis) is x[3] (axis 0) or x[:, 3] (axis 1).
        let want = x.index_axis(Axis(axis), 3).to_owned().into_dyn();
        assert_eq!(
            values_of(&ops::gather(&src, &zero_d, axis, None).unwrap()),
            want
        );
        let row = Tensor::from(want.mapv(|v| -1 - v));
        let mut written = ArrayD::<i32>::zeros(IxDyn(&[N, N]));
        written
            .index_axis_mut(Axis(axis), 3)
            .assign(&want.mapv(|v| -1 - v));
        for (form, index) in one_forms() {
            let what = format!("{form}, axis {axis}");
            let index = &*index;
            assert_eq!(
                values_of(&ops::gather(&src, index, axis, None).unwrap()),
                want,
                "{what}"
            );
            let out = Tensor::zeros(&[N, N], DType::Int32).unwrap();
            ops::scatter(&row, index, &out, axis).unwrap();
            assert_eq!(values_of(&out), written, "{what}");
            let pack = PreparedGather::new(&src, index, axis, None).unwrap();
            pack.run().unwrap();
            assert_eq!(values_of(pack.out()), want, "{what}");
            let got = pa.gather(index, axis, false).unwrap();
            assert_eq!(
                values_of(&got.assemble(None, false).unwrap()),
                want,
                "{what}"
            );
        }
    }
    // By value, not through `dyn`: plain literals are one index.
    assert_eq!(
        values_of(&ops::gather(&src, 4, 0, None).unwrap()),
        x.row(4).into_dyn()
    );
    assert_eq!(
        values_of(
            &pa.gather(-1, 1, false)
                .unwrap()
                .assemble(None, false)
                .unwrap()
        ),
        x.column(4).into_dyn()
    );
}

/// Literals and by-value forms compile as a caller writes them, without a `dyn` in between.
#[test]
// `&[3, 1, 4]` as written, which clippy would have passed by value.
#[allow(clippy::needless_borrows_for_generic_args)]
fn natural_forms_compile_and_run_as_written() {
    let x = source();
    let src = Tensor::from(x.clone());
    let want = x.select(Axis(0), &[3, 1, 4]).into_dyn();
    let idx_vec: Vec<usize> = vec![3, 1, 4];
    let idx_i64: Vec<i64> = vec![3, 1, -1];
    let pa = PartitionedArray::partition(&src, &Layout::tiling(&[2, 1])).unwrap();
    let taken = |t: Tensor| values_of(&t);
    assert_eq!(taken(ops::gather(&src, &[3, 1, 4], 0, None).unwrap()), want);
    assert_eq!(taken(ops::gather(&src, [3, 1, 4], 0, None).unwrap()), want);
    assert_eq!(taken(ops::gather(&src, &idx_vec, 0, None).unwrap()), want);
    assert_eq!(
        taken(ops::gather(&src, idx_vec.as_slice(), 0, None).unwrap()),
        want
    );
    assert_eq!(taken(ops::gather(&src, &idx_i64, 0, None).unwrap()), want);
    assert_eq!(
        taken(ops::gather(&src, idx_i64.clone(), 0, None).unwrap()),
        want
    );
    assert_eq!(
        taken(ops::gather(&src, array![3, 1, 4], 0, None).unwrap()),
        want
    );
    let a = array![3usize, 1, 4];
    assert_eq!(taken(ops::gather(&src, &a, 0, None).unwrap()), want);
    assert_eq!(taken(ops::gather(&src, a.view(), 0, None).unwrap()), want);
    let t = Tensor::from(a.mapv(|i| i as i64));
    assert_eq!(taken(ops::gather(&src, &t, 0, None).unwrap()), want);
    assert_eq!(taken(ops::gather(&src, t, 0, None).unwrap()), want);
    let picked = pa.gather(&idx_vec, 0, false).unwrap();
    assert_eq!(taken(picked.assemble(None, false).unwrap()), want);
}

/// `1 << 63` and `usize::MAX` as indices: above `i64::MAX`, so no axis holds them.
const HUGE: [usize; 2] = [1 << 63, usize::MAX];

fn assert_names(e: &Error, index: usize, what: &str) {
    assert!(
        matches!(*e, Error::IndexOutOfRange { index: i, axis: 0, len: N } if i == index as i128),
        "{what}: {e:?}"
    );
    assert!(e.to_string().contains(&index.to_string()), "{what}: {e}");
}

#[test]
fn unsigned_indices_above_i64_max_are_out_of_range_naming_them_and_write_nothing() {
    let x = source();
    let src = Tensor::from(x.clone());
    let pa = PartitionedArray::partition(&src, &Layout::tiling(&[2, 2])).unwrap();
    let row = Tensor::from(Array1::<i32>::from_elem(N, -1));
    for huge in HUGE {
        let lists: Vec<Form> = vec![
            ("&[usize]", Box::new(vec![0, huge])),
            ("&[u64]", Box::new(vec![0, huge as u64])),
            ("Array1<usize>", Box::new(array![0, huge])),
        ];
        for (form, indices) in lists {
            let what = format!("{form} with {huge}");
            let indices = &*indices;
            let values = Tensor::from(Array2::<i32>::from_elem((2, N), -1));
            assert_names(
                &ops::gather(&src, indices, 0, None).unwrap_err(),
                huge,
                &what,
            );
            assert_names(
                &ops::scatter(&values, indices, &src, 0).unwrap_err(),
                huge,
                &what,
            );
            let e = PreparedGather::new(&src, indices, 0, None).unwrap_err();
            assert_names(&e, huge, &what);
            let e = PreparedScatter::new(&values, indices, &src, 0).unwrap_err();
            assert_names(&e, huge, &what);
            assert_names(
                &ops::normalise_indices(indices, 0, N).unwrap_err(),
                huge,
                &what,
            );
            assert_names(&pa.gather(indices, 0, false).unwrap_err(), huge, &what);
            assert_names(
                &pa.scatter(&values, indices, 0, false).unwrap_err(),
                huge,
                &what,
            );
            assert_names(&pa.serving(indices, 0).unwrap_err(), huge, &what);
        }
        // One index.
        assert_names(
            &ops::gather(&src, huge, 0, None).unwrap_err(),
            huge,
            "usize",
        );
        assert_names(
            &ops::scatter(&row, huge, &src, 0).unwrap_err(),
            huge,
            "usize",
        );
        assert_names(&pa.gather(huge as u64, 0, false).unwrap_err(), huge, "u64");
        assert_names(
            &pa.scatter(&row, huge, 0, false).unwrap_err(),
            huge,
            "usize",
        );
    }
    assert_eq!(values_of(&src), x.into_dyn(), "nothing written");
    // Across ranks: every rank fails with the same error.
    let x = source();
    ThreadComm::run(3, |comm| {
        let pa = stacked(comm, &x);
        for huge in HUGE {
            // Every rank fails alike: the error of them all, of the kind the index's is.
            let agreed = |e: Error, what: &str| {
                assert_eq!(e.kind(), "IndexError", "{what}: {e}");
                assert!(
                    e.to_string().contains(&format!("index {huge} is out")),
                    "{what}: {e}"
                );
            };
            agreed(
                spmd::gather(comm, &pa, [0, huge], 0).unwrap_err(),
                "spmd gather",
            );
            let values = Tensor::from(Array2::<i32>::from_elem((2, N), -1));
            let e = spmd::scatter(comm, &pa, &values, vec![huge, 0], 0).unwrap_err();
            agreed(e, "spmd scatter");
        }
        let mine = pa.data()[comm.rank()]
            .tensor()
            .unwrap()
            .to_array::<i32>()
            .unwrap();
        let me = comm.rank();
        assert_eq!(
            mine,
            x.slice(s![2 * me..(2 * me + 2).min(N), ..]).into_dyn()
        );
    });
}

#[test]
fn an_ndarray_of_two_axes_is_refused_naming_its_shape_and_writes_nothing() {
    let x = source();
    let src = Tensor::from(x.clone());
    let pa = PartitionedArray::partition(&src, &Layout::tiling(&[2, 2])).unwrap();
    let square = array![[0i64, 1], [2, 3]];
    let wide = Array2::<usize>::zeros((1, 3));
    let check = |e: Error, shape: &str, what: &str| {
        assert!(matches!(e, Error::Shape { .. }), "{what}: {e:?}");
        assert!(
            e.to_string().contains(&format!("shape {shape}")),
            "{what}: {e}"
        );
    };
    let values = Tensor::from(Array2::<i32>::from_elem((2, N), -1));
    for (indices, shape) in [(&square as &dyn AsIndices, "(2, 2)"), (&wide, "(1, 3)")] {
        check(
            ops::gather(&src, indices, 0, None).unwrap_err(),
            shape,
            "gather",
        );
        check(
            ops::scatter(&values, indices, &src, 0).unwrap_err(),
            shape,
            "scatter",
        );
        check(
            PreparedGather::new(&src, indices, 0, None).unwrap_err(),
            shape,
            "prepared gather",
        );
        let e = PreparedScatter::new(&values, indices, &src, 0).unwrap_err();
        check(e, shape, "prepared scatter");
        check(
            ops::normalise_indices(indices, 0, N).unwrap_err(),
            shape,
            "normalise",
        );
        check(
            pa.gather(indices, 0, false).unwrap_err(),
            shape,
            "partitioned gather",
        );
        check(
            pa.scatter(&values, indices, 0, false).unwrap_err(),
            shape,
            "partitioned scatter",
        );
        check(pa.serving(indices, 0).unwrap_err(), shape, "serving");
    }
    // A view of two axes, however it was cut, likewise.
    let e = ops::gather(&src, square.slice(s![.., ..1]), 0, None).unwrap_err();
    check(e, "(2, 1)", "a view");
    assert_eq!(values_of(&src), x.clone().into_dyn(), "nothing written");
    ThreadComm::run(3, |comm| {
        let pa = stacked(comm, &x);
        let agreed = |e: Error, shape: &str, what: &str| {
            assert_eq!(e.kind(), "ValueError", "{what}: {e}");
            assert!(
                e.to_string().contains(&format!("shape {shape}")),
                "{what}: {e}"
            );
        };
        agreed(
            spmd::gather(comm, &pa, &square, 0).unwrap_err(),
            "(2, 2)",
            "spmd gather",
        );
        let e = spmd::scatter(comm, &pa, &values, &wide, 0).unwrap_err();
        agreed(e, "(1, 3)", "spmd scatter");
    });
}
