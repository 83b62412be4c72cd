//! Bindings for prepared gathers and scatters (`dlpart.prepare_gather`,
//! `dlpart.prepare_scatter`): the operands are imported and checked once; a call of the
//! object runs the copy and nothing else, with no argument to convert.

use pyo3::prelude::*;

use crate::error::tuple_string;
use crate::prepared::{PreparedGather, PreparedScatter};

use super::errors::to_py;
use super::ops::{in_place_arg, indices_arg, values_arg};
use super::tensor::{axis_arg, is_producer, PyTensor};

/// The methods both prepared classes share: `$class` wraps `inner`, shown by `__repr__` as
/// `dlpart.$name`, with the tensor it reads (the Rust accessor `$read`) named `$label`.
macro_rules! prepared_methods {
    ($class:ident, $name:literal, $read:ident, $label:literal) => {
        #[pymethods]
        impl $class {
            /// Runs the copy the object was made for (see the class); returns ``None`` once it
            /// is done. The GIL is released meanwhile.
            fn __call__(&self, py: Python<'_>) -> PyResult<()> {
                py.detach(|| self.inner.run()).map_err(to_py)
            }

            /// The array each call writes, as a `dlpart.Tensor` over its memory.
            #[getter]
            fn out(&self) -> PyTensor {
                PyTensor::new(self.inner.out().clone())
            }

            /// The axis the slices are selected along (non-negative).
            #[getter]
            fn axis(&self) -> usize {
                self.inner.axis()
            }

            fn __repr__(&self) -> String {
                let (p, out) = (&self.inner, self.inner.out());
                format!(
                    "dlpart.{}(axis={}, indices={}, {}={}, out={}, dtype='{}', device='{}')",
                    $name,
                    p.axis(),
                    p.num_indices(),
                    $label,
                    tuple_string(p.$read().shape()),
                    tuple_string(out.shape()),
                    out.dtype(),
                    out.device()
                )
            }
        }
    };
}

/// A gather checked once and run by calling it: ``g()`` does ``out[.., i, ..] =
/// x[.., indices[i], ..]`` along the axis it was made with (see `dlpart.prepare_gather`).
///
/// It holds ``x`` and ``out`` (their DLPack imports, so the producers' memory stays valid
/// until it is dropped) and its own checked copy of the indices. The data of ``x`` may change
/// between calls, and each call copies what is there then; the shapes may not.
#[pyclass(name = "PreparedGather", module = "dlpart", frozen)]
pub struct PyPreparedGather {
    inner: PreparedGather,
}

prepared_methods!(PyPreparedGather, "PreparedGather", src, "source");

/// A scatter checked once and run by calling it: ``s()`` does ``out[.., indices[i], ..] =
/// values[.., i, ..]`` along the axis it was made with (see `dlpart.prepare_scatter`).
///
/// It holds ``values`` and ``out`` (their DLPack imports, so the producers' memory stays
/// valid until it is dropped) and its own checked copy of the indices. The data of ``values``
/// may change between calls, and each call copies what is there then; the shapes may not.
#[pyclass(name = "PreparedScatter", module = "dlpart", frozen)]
pub struct PyPreparedScatter {
    inner: PreparedScatter,
}

prepared_methods!(PyPreparedScatter, "PreparedScatter", values, "values");

/// A gather checked once: see `dlpart.prepare_gather`.
#[pyfunction]
#[pyo3(signature = (x, indices, axis=0, out=None))]
fn prepare_gather(
    py: Python<'_>,
    x: &Bound<'_, PyAny>,
    indices: &Bound<'_, PyAny>,
    #[pyo3(from_py_with = super::ints::axis)] axis: i64,
    out: Option<&Bound<'_, PyAny>>,
) -> PyResult<PyPreparedGather> {
    let x = in_place_arg(x, "x", "a prepared gather reads x itself at each call")?;
    let idx = indices_arg(indices)?;
    let axis = axis_arg("prepare_gather", axis, x.inner.ndim(), "source")?;
    let out = out
        .map(|o| in_place_arg(o, "out", "a prepared gather writes out itself at each call"))
        .transpose()?;
    let out = out.as_ref().map(|o| &o.inner);
    let inner = py
        .detach(|| PreparedGather::new(&x.inner, &idx.inner, axis, out))
        .map_err(to_py)?;
    Ok(PyPreparedGather { inner })
}

/// A scatter checked once: see `dlpart.prepare_scatter`.
#[pyfunction]
#[pyo3(signature = (values, indices, out, axis=0))]
fn prepare_scatter(
    py: Python<'_>,
    values: &Bound<'_, PyAny>,
    indices: &Bound<'_, PyAny>,
    out: &Bound<'_, PyAny>,
    #[pyo3(from_py_with = super::ints::axis)] axis: i64,
) -> PyResult<PyPreparedScatter> {
    let o = in_place_arg(
        out,
        "out",
        "a prepared scatter writes out itself at each call",
    )?;
    // A scalar is a constant: its 0-d array, which the object keeps, as `scatter` reads it.
    let v = match values.cast::<PyTensor>().is_ok() || is_producer(values)? {
        true => {
            let why = "a prepared scatter reads values itself at each call";
            in_place_arg(values, "values", why)?
        }
        false => values_arg(values, Some(o.inner.dtype()))?,
    };
    let idx = indices_arg(indices)?;
    let axis = axis_arg("prepare_scatter", axis, o.inner.ndim(), "output")?;
    let inner = py
        .detach(|| PreparedScatter::new(&v.inner, &idx.inner, &o.inner, axis))
        .map_err(to_py)?;
    Ok(PyPreparedScatter { inner })
}

pub(super) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PyPreparedGather>()?;
    m.add_class::<PyPreparedScatter>()?;
    m.add_function(wrap_pyfunction!(prepare_gather, m)?)?;
    m.add_function(wrap_pyfunction!(prepare_scatter, m)?)?;
    Ok(())
}
