//! Mapping [`Error`] onto Python exceptions.

use pyo3::create_exception;
use pyo3::exceptions::{
    PyBufferError, PyException, PyIndexError, PyMemoryError, PyRuntimeError, PyTypeError,
    PyValueError,
};
use pyo3::prelude::*;
use pyo3::types::PyType;
use pyo3::PyErr;

use crate::error::Error;

create_exception!(
    dlpart,
    ProtocolError,
    PyValueError,
    "A `__partitioned__` dict or layout that breaks the protocol."
);
create_exception!(
    dlpart,
    DeviceError,
    PyValueError,
    "A bad device name, or data that would have to move to or from device memory without \
     `transfer=True` (moves between kinds of host memory are plain copies)."
);
create_exception!(
    dlpart,
    BackendUnavailableError,
    PyRuntimeError,
    "A device backend that is not compiled in or cannot be loaded here."
);

/// The Python exception for `e`: the class named by [`Error::kind`], so that an error raised
/// here and the same error reported by another SPMD rank become the same class.
pub(crate) fn to_py(e: Error) -> PyErr {
    let msg = e.to_string();
    match e.kind() {
        "ProtocolError" => ProtocolError::new_err(msg),
        "DeviceError" => DeviceError::new_err(msg),
        "BackendUnavailableError" => BackendUnavailableError::new_err(msg),
        "BufferError" => PyBufferError::new_err(msg),
        "IndexError" => PyIndexError::new_err(msg),
        "ValueError" => PyValueError::new_err(msg),
        "TypeError" => PyTypeError::new_err(msg),
        "MemoryError" => PyMemoryError::new_err(msg),
        kind => Python::attach(|py| builtin(py, kind, &msg))
            .unwrap_or_else(|| PyRuntimeError::new_err(msg)),
    }
}

/// Python's built-in exception class named `kind` (another SPMD rank's error, which that rank
/// reduced to the nearest built-in class), made with `msg`; None for any other name.
fn builtin(py: Python<'_>, kind: &str, msg: &str) -> Option<PyErr> {
    let class = PyModule::import(py, "builtins").ok()?.getattr(kind).ok()?;
    let class = class.cast_into::<PyType>().ok()?;
    if !class.is_subclass_of::<PyException>().ok()? {
        return None;
    }
    // Made now, so that a class whose constructor wants more than a message (UnicodeDecodeError,
    // ExceptionGroup) falls back to RuntimeError rather than raising its own TypeError.
    let error = class.call1((msg,)).ok()?;
    Some(PyErr::from_value(error))
}
