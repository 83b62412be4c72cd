//! Bindings for `ops` on single tensors: gather, scatter, planning statistics, backends.

use std::time::Instant;

use pyo3::exceptions::{PyBufferError, PyTypeError};
use pyo3::intern;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;

use crate::grid::Grid;
use crate::plan::Plan;

use super::device::target_device_arg;
use super::errors::to_py;
use super::tensor::{axis_arg, from_dlpack, is_producer, PyTensor};

fn grid(shape: &[usize], splits: Vec<Vec<usize>>) -> PyResult<Grid> {
    Grid::from_splits(shape, splits).map_err(to_py)
}

/// The number of box copies between two grids over `shape`, and the seconds planning took.
#[pyfunction]
fn _plan_stats(
    #[pyo3(from_py_with = super::partitioned::sizes_arg)] shape: Vec<usize>,
    #[pyo3(from_py_with = src_splits)] src_splits: Vec<Vec<usize>>,
    #[pyo3(from_py_with = super::partitioned::dst_splits_arg)] dst_splits: Vec<Vec<usize>>,
) -> PyResult<(usize, f64)> {
    let (s, d) = (grid(&shape, src_splits)?, grid(&shape, dst_splits)?);
    let t0 = Instant::now();
    let plan = Plan::new(&s, &d).map_err(to_py)?;
    let mut n = 0usize;
    plan.ops().visit(|_| n += 1);
    Ok((n, t0.elapsed().as_secs_f64()))
}

/// `_plan_stats`'s `src_splits`.
fn src_splits(obj: &Bound<'_, PyAny>) -> PyResult<Vec<Vec<usize>>> {
    super::ints::int_lists(obj, "src_splits", super::ints::Refusal::Value)
}

/// `None` when dlpart has working kernels for `device` here, else the reason it has none.
#[pyfunction]
fn backend_status(device: &Bound<'_, PyAny>) -> PyResult<Option<String>> {
    let d = target_device_arg(device)?;
    Ok(crate::backend::backend_for(d).err().map(|e| e.to_string()))
}

/// `x` itself when it is a `dlpart.Tensor`, else `x` imported through DLPack.
pub(super) fn tensor_arg(x: &Bound<'_, PyAny>) -> PyResult<PyTensor> {
    match x.cast::<PyTensor>() {
        Ok(t) => Ok(t.get().clone()),
        Err(_) => from_dlpack(x, None, None),
    }
}

/// `x` as [`tensor_arg`] imports it, for an argument the call reads once (a gather's source,
/// a scatter's values, indices): an array whose bytes are not in native order, which DLPack
/// cannot carry, is read through a copy in native order, as numpy's own functions read it.
/// Looked at only when the import fails: arrays in native order cost nothing more.
pub(super) fn read_arg(x: &Bound<'_, PyAny>) -> PyResult<PyTensor> {
    tensor_arg(x).or_else(|e| match native_copy(x)? {
        Some(copy) => tensor_arg(&copy),
        None => Err(e),
    })
}

/// `x` as [`tensor_arg`] imports it, for an argument `name` that is written in place or kept
/// (`why` says which): no copy can stand in for it, so an array whose bytes are not in native
/// order is refused by name, with `BufferError` as numpy's own DLPack export does.
pub(super) fn in_place_arg(x: &Bound<'_, PyAny>, name: &str, why: &str) -> PyResult<PyTensor> {
    tensor_arg(x).map_err(|e| match non_native(x) {
        Some(dtype) => PyBufferError::new_err(format!(
            "{}; {why}, so a copy in native order cannot stand in for it: pass {name} in \
             native byte order",
            not_native_order(name, &dtype)
        )),
        None => e,
    })
}

/// How every refusal of an array in non-native byte order starts: `name` and its `dtype`.
fn not_native_order(name: &str, dtype: &str) -> String {
    format!(
        "{name} has dtype {dtype}, whose bytes are not in native order, which DLPack cannot carry"
    )
}

/// The import of `x` refused with `e`: for an array whose bytes are not in native order (see
/// [`non_native`]), whose producer's `BufferError` (numpy's) does not say which dtype or what
/// to do, a `BufferError` that does, the producer's chained as its cause; `e` otherwise. An
/// import keeps the caller's memory, so it makes no copy in native order itself (as the
/// arguments a call only reads get, [`read_arg`]).
pub(super) fn byte_order_refusal(x: &Bound<'_, PyAny>, e: PyErr) -> PyErr {
    let py = x.py();
    if !e.is_instance_of::<PyBufferError>(py) {
        return e;
    }
    let Some(dtype) = non_native(x) else {
        return e;
    };
    let what = format!("the {} to import", super::partitioned::type_name(x));
    let refused = PyBufferError::new_err(format!(
        "{}: convert it first, x.astype(x.dtype.newbyteorder('=')), a copy in native order",
        not_native_order(&what, &dtype)
    ));
    refused.set_cause(py, Some(e));
    refused
}

/// The dtype (as numpy writes it, `'>i8'`) of `x` when `x` is an array whose dtype says its
/// bytes are not in native order (numpy's `dtype.isnative`); `None` for anything else.
fn non_native(x: &Bound<'_, PyAny>) -> Option<String> {
    let py = x.py();
    let dtype = x.getattr_opt(intern!(py, "dtype")).ok()??;
    let native = dtype.getattr_opt(intern!(py, "isnative")).ok()??;
    match native.extract::<bool>() {
        Ok(false) => Some(
            dtype
                .getattr(intern!(py, "str"))
                .and_then(|s| s.extract::<String>())
                .unwrap_or_else(|_| dtype.to_string()),
        ),
        _ => None,
    }
}

/// A copy of `x` in native byte order (`x.astype(x.dtype.newbyteorder("="))`) when its bytes
/// are not (see [`non_native`]), else `None`.
pub(super) fn native_copy<'py>(x: &Bound<'py, PyAny>) -> PyResult<Option<Bound<'py, PyAny>>> {
    if non_native(x).is_none() {
        return Ok(None);
    }
    let dtype = x.getattr(intern!(x.py(), "dtype"))?;
    let native = dtype.call_method1(intern!(x.py(), "newbyteorder"), ("=",))?;
    x.call_method1(intern!(x.py(), "astype"), (native,))
        .map(Some)
}

/// `indices` as a tensor: a dlpart tensor or any DLPack array as it is (read through a copy
/// when its bytes are not in native order, [`read_arg`]), anything else (a Python sequence or
/// scalar) through `dlpart._functions._indices`, as int64. Asked here rather than in the
/// Python wrapper: its `hasattr(indices, "__dlpack__")` cost about 400 instructions
/// (callgrind) on every call with an index array.
///
/// An index array of a dtype DLPack cannot carry (numpy's strings, bytes, objects, datetimes)
/// is a `TypeError` naming the dtype, as one of a float dtype is ([`index_dtype_refusal`]);
/// so is a Python sequence (or scalar) that numpy reads as no integer array, named too:
/// `indices must be integers, found dtype float64 in [1.5]`.
pub(super) fn indices_arg(indices: &Bound<'_, PyAny>) -> PyResult<PyTensor> {
    static INDICES: PyOnceLock<Py<PyAny>> = PyOnceLock::new();
    if indices.cast::<PyTensor>().is_ok() || is_producer(indices)? {
        return read_arg(indices).map_err(|e| index_dtype_refusal(indices, e, None));
    }
    let convert = INDICES.import(indices.py(), "dlpart._functions", "_indices")?;
    let arr = convert.call1((indices,))?;
    let t = tensor_arg(&arr).map_err(|e| index_dtype_refusal(&arr, e, Some(indices)))?;
    match t.inner.dtype().index_signed() {
        Ok(_) => Ok(t),
        Err(e) => Err(PyTypeError::new_err(format!("{e}{}", given(indices)))),
    }
}

/// `" in {repr(value)}"`, the value of indices given as a Python sequence that are no
/// integers, its `repr` cut to [`GIVEN_MAX_CHARS`] characters.
fn given(value: &Bound<'_, PyAny>) -> String {
    let text = super::partitioned::described(value);
    match text.char_indices().nth(GIVEN_MAX_CHARS) {
        Some((at, _)) => format!(" in {}...", &text[..at]),
        None => format!(" in {text}"),
    }
}

/// The longest `repr` of indices [`given`] writes in full.
const GIVEN_MAX_CHARS: usize = 80;

/// The import of the index array `x` refused with `e`: for an array whose dtype is no integer
/// type (numpy's `dtype.kind` is neither `'i'` nor `'u'`), whose producer refused it with a
/// `BufferError` that does not say what is wrong with it as indices (numpy's, for the dtypes
/// DLPack cannot carry: strings, bytes, objects, datetimes), the `TypeError` of
/// [`crate::Error::IndexDType`], naming the dtype as the producer writes it (and the Python
/// value `x` was made of, where it was: see [`given`]), the producer's error chained as its
/// cause; `e` otherwise. Looked at only when the import fails.
fn index_dtype_refusal(x: &Bound<'_, PyAny>, e: PyErr, from: Option<&Bound<'_, PyAny>>) -> PyErr {
    let py = x.py();
    if !e.is_instance_of::<PyBufferError>(py) {
        return e;
    }
    let Some(dtype) = x.getattr_opt(intern!(py, "dtype")).ok().flatten() else {
        return e;
    };
    let kind = dtype
        .getattr_opt(intern!(py, "kind"))
        .ok()
        .flatten()
        .and_then(|k| k.extract::<String>().ok());
    match kind.as_deref() {
        Some(k) if k != "i" && k != "u" => {
            let name = dtype.str().map_or_else(|_| k.to_owned(), |s| s.to_string());
            let given = from.map(given).unwrap_or_default();
            let message = crate::error::index_dtype_message(&name) + &given;
            let refused = PyTypeError::new_err(message);
            refused.set_cause(py, Some(e));
            refused
        }
        _ => e,
    }
}

/// `indices` as [`indices_arg`] reads them, for the Python layer's own calls (the SPMD
/// `gather` and `scatter`, which read them before the ranks agree).
#[pyfunction]
fn _indices_tensor(indices: &Bound<'_, PyAny>) -> PyResult<PyTensor> {
    indices_arg(indices)
}

/// A scatter's `values` as a tensor: a dlpart tensor or any DLPack array as [`read_arg`] reads
/// it; anything else through `dlpart._functions._values`, which reads a numpy scalar as the
/// 0-d array of its dtype and a Python scalar as a 0-d array of `dtype` (the target's, where
/// known), as numpy's assignment reads them. Arrays, the common case, go straight to the
/// import: the Python conversion is called only for what is no array.
pub(super) fn values_arg(
    values: &Bound<'_, PyAny>,
    dtype: Option<crate::DType>,
) -> PyResult<PyTensor> {
    static VALUES: PyOnceLock<Py<PyAny>> = PyOnceLock::new();
    if values.cast::<PyTensor>().is_ok() || is_producer(values)? {
        return read_arg(values);
    }
    let convert = VALUES.import(values.py(), "dlpart._functions", "_values")?;
    read_arg(&convert.call1((values, dtype.map(|d| d.name())))?)
}

/// `out[.., i, ..] = x[.., indices[i], ..]` along `axis`, like `numpy.take`; negative indices
/// count from the end, and an out-of-range index raises `IndexError` before anything is written.
#[pyfunction]
#[pyo3(signature = (x, indices, axis=0, out=None))]
fn gather(
    py: Python<'_>,
    x: &Bound<'_, PyAny>,
    indices: &Bound<'_, PyAny>,
    #[pyo3(from_py_with = super::ints::axis)] axis: i64,
    out: Option<&Bound<'_, PyAny>>,
) -> PyResult<PyTensor> {
    let (x, idx) = (read_arg(x)?, indices_arg(indices)?);
    let axis = axis_arg("gather", axis, x.inner.ndim(), "source")?;
    let out = out
        .map(|o| in_place_arg(o, "out", "gather writes out in place"))
        .transpose()?;
    let bytes = out.as_ref().map_or(usize::MAX, |o| o.inner.nbytes());
    let r = detach_unless_small(py, &x.inner, bytes, || {
        crate::ops::gather(&x.inner, &idx.inner, axis, out.as_ref().map(|o| &o.inner))
    })
    .map_err(to_py)?;
    Ok(PyTensor::new(r))
}

/// `out[.., indices[i], ..] = values[.., i, ..]` along `axis`, like numpy's fancy assignment
/// (the last of duplicate indices wins, values broadcast, scalars read as numpy reads them);
/// validates everything before writing.
#[pyfunction]
#[pyo3(signature = (values, indices, out, axis=0))]
fn scatter(
    py: Python<'_>,
    values: &Bound<'_, PyAny>,
    indices: &Bound<'_, PyAny>,
    out: &Bound<'_, PyAny>,
    #[pyo3(from_py_with = super::ints::axis)] axis: i64,
) -> PyResult<()> {
    let o = in_place_arg(out, "out", "scatter writes out in place")?;
    let (v, idx) = (
        values_arg(values, Some(o.inner.dtype()))?,
        indices_arg(indices)?,
    );
    let axis = axis_arg("scatter", axis, o.inner.ndim(), "output")?;
    detach_unless_small(py, &o.inner, v.inner.nbytes(), || {
        crate::ops::scatter(&v.inner, &idx.inner, &o.inner, axis)
    })
    .map_err(to_py)
}

/// Host work up to this many bytes runs with the GIL held. Releasing and retaking it cost
/// about 470 instructions a call (callgrind), a twentieth of the fixed cost of gathering a
/// halo face; and below `Tuning::parallel_min` (256 KiB) the CPU kernels run on the calling
/// thread alone, so no pool thread can be left waiting for the GIL while it is held.
const GIL_HELD_MAX_BYTES: usize = 64 << 10;

/// `f()`, with the GIL released unless it moves at most [`GIL_HELD_MAX_BYTES`] of `on`'s
/// host memory.
fn detach_unless_small<T: Send>(
    py: Python<'_>,
    on: &crate::tensor::Tensor,
    bytes: usize,
    f: impl FnOnce() -> T + Send,
) -> T {
    if bytes <= GIL_HELD_MAX_BYTES && on.device().is_host_accessible() {
        f()
    } else {
        py.detach(f)
    }
}

/// Sets the number of threads dlpart's CPU kernels use (the calling thread and `n - 1` pool
/// threads). Call it before anything else in dlpart: the pool starts with the first parallel
/// copy, at `RAYON_NUM_THREADS` or one thread per logical CPU, and cannot be resized later,
/// so a late call asking for another size raises `RuntimeError` (the size it already has is
/// accepted).
#[pyfunction]
fn set_num_threads(py: Python<'_>, #[pyo3(from_py_with = threads)] n: i64) -> PyResult<()> {
    if n < 1 {
        return Err(pyo3::exceptions::PyValueError::new_err(format!(
            "set_num_threads: n must be >= 1, got {n}"
        )));
    }
    let n = usize::try_from(n)?;
    py.detach(|| crate::backend::cpu::set_num_threads(n))
        .map_err(to_py)
}

/// `set_num_threads`'s `n`.
fn threads(obj: &Bound<'_, PyAny>) -> PyResult<i64> {
    super::ints::int(obj, "n", super::ints::Refusal::Value)
}

/// The number of threads dlpart's CPU kernels use; asking starts the pool, fixing its size.
#[pyfunction]
fn get_num_threads(py: Python<'_>) -> usize {
    py.detach(crate::backend::cpu::num_threads)
}

/// Makes `kDLCPU:0` to `kDLCPU:count-1` valid targets here: the host devices a framework
/// emulates (the JAX adapter calls it with JAX's CPU devices).
#[pyfunction]
fn _note_host_devices(#[pyo3(from_py_with = host_devices)] count: i32) {
    crate::backend::note_host_devices(count);
}

/// `_note_host_devices`'s `count`.
fn host_devices(obj: &Bound<'_, PyAny>) -> PyResult<i32> {
    super::ints::int(obj, "count", super::ints::Refusal::Value)
}

pub(super) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(_note_host_devices, m)?)?;
    m.add_function(wrap_pyfunction!(set_num_threads, m)?)?;
    m.add_function(wrap_pyfunction!(get_num_threads, m)?)?;
    m.add_function(wrap_pyfunction!(_plan_stats, m)?)?;
    m.add_function(wrap_pyfunction!(backend_status, m)?)?;
    m.add_function(wrap_pyfunction!(gather, m)?)?;
    m.add_function(wrap_pyfunction!(_indices_tensor, m)?)?;
    m.add_function(wrap_pyfunction!(scatter, m)?)?;
    Ok(())
}
