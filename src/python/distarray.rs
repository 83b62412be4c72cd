//! The Distributed Array Protocol's dimension dictionaries as [`DimData`], and the
//! [`crate::distarray`] functions for `dlpart.from_distarray`, `dlpart.mpi.from_distarray` and
//! `__distarray__`.

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyDict, PyList, PyTuple};

use crate::device::Device;
use crate::distarray::{self, DimData, Distribution};
use crate::dtype::DType;
use crate::error::{Error, Result};

use super::errors::to_py;
use super::ints::{self, Int, Refusal};
use super::partitioned::{described, type_name, wrap, PyPartitioned};
use super::spmd::{failure, MpiComm};
use super::tensor::{import, is_producer, PyTensor};

/// `e`, the error of reading `value` (named `what`) through [`ints`], as the protocol's error:
/// an int out of range keeps the words [`ints::int`] gives it for every argument (`"'size':
/// 1180591620717411303424 is out of range (expected an int from 0 to ...)"`); what is no int
/// at all is named, with the conversion's words.
fn refused(e: PyErr, value: &Bound<'_, PyAny>, what: &str, at: &str) -> Error {
    let py = value.py();
    let words = e.value(py).to_string();
    if e.is_instance_of::<PyValueError>(py) {
        return Error::dist_array(at, words);
    }
    Error::dist_array(
        at,
        format!("{what}: {} is not an int ({words})", described(value)),
    )
}

/// An integer (Python's or numpy's, never a bool: the protocol's ints are no flags) from
/// `value`, named `what`, as a `T`: read as [`ints::int`] reads arguments.
fn integer<T: Int>(value: &Bound<'_, PyAny>, what: &str, at: &str) -> Result<T> {
    if value.is_instance_of::<PyBool>() {
        return Err(Error::dist_array(
            at,
            format!("{what}: {} is not an int (a bool)", described(value)),
        ));
    }
    ints::int::<T>(value, what, Refusal::Value).map_err(|e| refused(e, value, what, at))
}

/// A non-negative integer (Python's or numpy's, never a bool) from `value`, named `what`.
fn count(value: &Bound<'_, PyAny>, what: &str, at: &str) -> Result<usize> {
    integer::<usize>(value, what, at)
}

/// An integer (Python's or numpy's, never a bool) that may be negative, from `value`.
fn signed(value: &Bound<'_, PyAny>, what: &str, at: &str) -> Result<isize> {
    integer::<isize>(value, what, at)
}

/// A bool (Python's or numpy's) from `value`, named `what`: anything else (an int included,
/// as the protocol's bools are no numbers) is named with its type, in the words an int that is
/// a bool gets (`"'one_to_one': 1 is not a bool (an int)"`).
fn flag(value: &Bound<'_, PyAny>, what: &str, at: &str) -> Result<bool> {
    value.extract::<bool>().map_err(|_| {
        Error::dist_array(
            at,
            format!(
                "{what}: {} is not a bool ({})",
                described(value),
                a_type(value)
            ),
        )
    })
}

/// `"an int"`, `"a str"`, `"a numpy.int64"`: the type of `value`, qualified by its module
/// outside the builtins, with its article.
fn a_type(value: &Bound<'_, PyAny>) -> String {
    let name = value
        .get_type()
        .fully_qualified_name()
        .map_or_else(|_| type_name(value), |n| n.to_string());
    let vowel = name.starts_with(['a', 'e', 'i', 'o', 'u', 'A', 'E', 'I', 'O', 'U']);
    format!("{} {name}", if vowel { "an" } else { "a" })
}

/// One dimension dictionary, of an axis along which the buffer holds `extent` (the empty
/// dictionary's length); `axis` for messages.
fn dim_data(dim: &Bound<'_, PyAny>, axis: usize, extent: usize) -> Result<DimData> {
    let dim = dim.cast::<PyDict>().map_err(|_| {
        Error::dist_array(
            String::new(),
            format!("dim_data[{axis}] is a {}, not a dict", type_name(dim)),
        )
    })?;
    if dim.is_empty() {
        return Ok(DimData::undistributed(extent));
    }
    let get = |key: &str| dim.get_item(key).ok().flatten().filter(|v| !v.is_none());
    let kind = get("dist_type");
    let kind_text = kind.as_ref().map_or("None".into(), described);
    let at = format!(" dim_data[{axis}] ({kind_text})");
    let int = |key: &str, default: Option<usize>| match get(key) {
        Some(v) => count(&v, &format!("'{key}'"), &at),
        None => default.ok_or_else(|| Error::dist_array(at.as_str(), format!("no '{key}'"))),
    };
    // The optional bools: absent (or None) is false.
    let bool_key = |key: &str| match get(key) {
        Some(v) => flag(&v, &format!("'{key}'"), &at),
        None => Ok(false),
    };
    let kind: Option<String> = kind.as_ref().and_then(|k| k.extract().ok());
    let distribution = match kind.as_deref() {
        Some("b") => {
            let padding = match get("padding") {
                None => [0, 0],
                Some(p) => {
                    let pair: Option<Vec<Bound<'_, PyAny>>> = p.extract().ok();
                    match pair.as_deref() {
                        Some([l, r]) => [
                            count(l, "'padding'[0]", &at)?,
                            count(r, "'padding'[1]", &at)?,
                        ],
                        _ => {
                            return Err(Error::dist_array(
                                at,
                                format!("padding {} is not a pair of integers", described(&p)),
                            ))
                        }
                    }
                }
            };
            // `start` may be negative at the low end of a periodic axis (the wrap-around
            // neighbour's indices); `DimData::runs` checks where.
            let start = match get("start") {
                Some(v) => signed(&v, "'start'", &at)?,
                None => return Err(Error::dist_array(at, "no 'start'")),
            };
            Distribution::Block {
                start,
                stop: int("stop", None)?,
                padding,
                periodic: bool_key("periodic")?,
            }
        }
        Some("c") => Distribution::Cyclic {
            start: int("start", None)?,
            block_size: int("block_size", Some(1))?,
        },
        Some("u") => {
            let indices = match get("indices") {
                None => Vec::new(),
                Some(v) => indices(&v, &at)?,
            };
            Distribution::Unstructured {
                indices,
                one_to_one: bool_key("one_to_one")?,
            }
        }
        _ => {
            return Err(Error::dist_array(
                format!(" dim_data[{axis}]"),
                format!("dist_type {kind_text}: dlpart reads 'b', 'c' and 'u'"),
            ))
        }
    };
    Ok(DimData {
        size: int("size", None)?,
        proc_grid_size: int("proc_grid_size", Some(1))?,
        proc_grid_rank: int("proc_grid_rank", Some(0))?,
        distribution,
    })
}

/// An unstructured axis's global indices: a host int64 array (numpy's default) read through
/// DLPack, any other sequence of integers entry by entry as [`count`] reads an int. An entry
/// out of range (a negative one included: dlpart reads global indices of the array), a bool
/// (the protocol's ints are no flags) or no int at all is named `'indices'[k]`, with its value
/// (`"'indices'[0]: True is not an int (a bool)"`).
fn indices(v: &Bound<'_, PyAny>, at: &str) -> Result<Vec<usize>> {
    const NAME: &str = "'indices'";
    let imported = match is_producer(v) {
        Ok(true) => import(v, None, None).ok().map(|t| t.inner),
        _ => None,
    };
    let int64 = imported
        .filter(|t| t.dtype() == DType::Int64 && t.ndim() == 1 && t.device() == Device::CPU);
    if let Some(t) = int64 {
        let listed = t.as_array::<i64>()?;
        return listed
            .iter()
            .enumerate()
            .map(|(k, &i)| {
                usize::try_from(i).map_err(|_| {
                    Error::dist_array(
                        at,
                        format!(
                            "{NAME}[{k}]: {i} is out of range {}",
                            ints::expected_range(0, usize::MAX)
                        ),
                    )
                })
            })
            .collect();
    }
    // Read as pyo3 reads a `Vec` (any sequence but a `str`), each entry as `count` reads an
    // int: a bool is no index, so it is checked where the entry is read, in the one pass.
    let entries: Vec<Bound<'_, PyAny>> = v.extract().map_err(|e: PyErr| {
        Error::dist_array(
            at,
            format!(
                "{NAME}: {} is not a sequence of ints ({})",
                described(v),
                e.value(v.py())
            ),
        )
    })?;
    let mut out = Vec::with_capacity(entries.len());
    for (k, x) in entries.iter().enumerate() {
        match x.extract::<usize>() {
            Ok(i) if !x.is_instance_of::<PyBool>() => out.push(i),
            // Read again to name the entry: a bool, no int at all, or out of range.
            _ => out.push(count(x, &format!("{NAME}[{k}]"), at)?),
        }
    }
    Ok(out)
}

/// The dict's `dim_data`: a tuple (or list) of dimension dictionaries, for a buffer of shape
/// `extents`.
fn dims_arg(dims: &Bound<'_, PyAny>, extents: &[usize]) -> Result<Vec<DimData>> {
    let items: Vec<Bound<'_, PyAny>> = if let Ok(t) = dims.cast::<PyTuple>() {
        t.iter().collect()
    } else if let Ok(l) = dims.cast::<PyList>() {
        l.iter().collect()
    } else {
        return Err(Error::dist_array(
            String::new(),
            format!("dim_data is a {}, not a tuple", type_name(dims)),
        ));
    };
    items
        .iter()
        .enumerate()
        .map(|(a, d)| dim_data(d, a, extents.get(a).copied().unwrap_or(0)))
        .collect()
}

fn dim_dict<'py>(py: Python<'py>, d: &DimData) -> PyResult<Bound<'py, PyDict>> {
    let out = PyDict::new(py);
    out.set_item("dist_type", d.distribution.dist_type().to_string())?;
    out.set_item("size", d.size)?;
    out.set_item("proc_grid_size", d.proc_grid_size)?;
    out.set_item("proc_grid_rank", d.proc_grid_rank)?;
    match &d.distribution {
        Distribution::Block {
            start,
            stop,
            padding,
            periodic,
        } => {
            out.set_item("start", start)?;
            out.set_item("stop", stop)?;
            out.set_item("padding", (padding[0], padding[1]))?;
            // Optional, absent meaning false: written when true.
            if *periodic {
                out.set_item("periodic", true)?;
            }
        }
        Distribution::Cyclic { start, block_size } => {
            out.set_item("start", start)?;
            out.set_item("block_size", block_size)?;
        }
        Distribution::Unstructured {
            indices,
            one_to_one,
        } => {
            out.set_item("indices", indices.clone())?;
            if *one_to_one {
                out.set_item("one_to_one", true)?;
            }
        }
    }
    Ok(out)
}

/// See `dlpart.from_distarray`: the array of this one process's buffer.
#[pyfunction]
fn _distarray_import(
    py: Python<'_>,
    buffer: PyRef<'_, PyTensor>,
    dims: &Bound<'_, PyAny>,
) -> PyResult<PyPartitioned> {
    let dims = dims_arg(dims, buffer.inner.shape()).map_err(to_py)?;
    let buffer = buffer.inner.clone();
    py.detach(|| distarray::import(&buffer, &dims))
        .map(wrap)
        .map_err(to_py)
}

/// See `dlpart.mpi.from_distarray`: this rank's buffer and dimension dictionaries, or its
/// `error` as `(exception class name, message)`.
#[pyfunction]
#[pyo3(signature = (comm, buffer=None, dims=None, error=None))]
fn _spmd_from_distarray(
    py: Python<'_>,
    comm: &MpiComm,
    buffer: Option<PyRef<'_, PyTensor>>,
    dims: Option<&Bound<'_, PyAny>>,
    error: Option<(String, String)>,
) -> PyResult<PyPartitioned> {
    let input = match (failure(error), buffer, dims) {
        (Some(e), _, _) => Err(e),
        (None, Some(b), Some(d)) => {
            let buffer = b.inner.clone();
            dims_arg(d, buffer.shape()).map(|d| (buffer, d))
        }
        _ => Err(Error::buffer(
            "no buffer, dimension dictionaries or error given",
        )),
    };
    py.detach(|| match input {
        Ok((buffer, dims)) => distarray::spmd_import(comm, Ok((&buffer, &dims))),
        Err(e) => distarray::spmd_import(comm, Err(e)),
    })
    .map(wrap)
    .map_err(to_py)
}

/// See `__distarray__`: this process's buffer (the memory of its partition) and dimension
/// dictionaries.
#[pyfunction]
fn _distarray_describe<'py>(
    py: Python<'py>,
    pa: PyRef<'_, PyPartitioned>,
    #[pyo3(from_py_with = describe_rank)] rank: usize,
    #[pyo3(from_py_with = describe_nprocs)] nprocs: usize,
) -> PyResult<(PyTensor, Bound<'py, PyTuple>)> {
    let (buffer, dims) = distarray::describe(&pa.inner(), rank, nprocs).map_err(to_py)?;
    let dicts = dims
        .iter()
        .map(|d| dim_dict(py, d))
        .collect::<PyResult<Vec<_>>>()?;
    Ok((PyTensor::new(buffer), PyTuple::new(py, dicts)?))
}

/// `_distarray_describe`'s `rank`.
fn describe_rank(obj: &Bound<'_, PyAny>) -> PyResult<usize> {
    super::ints::int(obj, "rank", super::ints::Refusal::Value)
}

/// `_distarray_describe`'s `nprocs`.
fn describe_nprocs(obj: &Bound<'_, PyAny>) -> PyResult<usize> {
    super::ints::int(obj, "nprocs", super::ints::Refusal::Value)
}

pub(super) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(_distarray_import, m)?)?;
    m.add_function(wrap_pyfunction!(_spmd_from_distarray, m)?)?;
    m.add_function(wrap_pyfunction!(_distarray_describe, m)?)?;
    m.add("DISTARRAY_VERSION", distarray::VERSION)?;
    Ok(())
}
