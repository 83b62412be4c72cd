//! Mapping [`Error`] onto Python exceptions.

use pyo3::create_exception;
use pyo3::exceptions::{PyBufferError, PyIndexError, PyRuntimeError, PyValueError};
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
    "A bad device name, or data that would have to cross devices without `transfer=True`."
);
create_exception!(
    dlpart,
    BackendUnavailableError,
    PyRuntimeError,
    "A device backend that is not compiled in or cannot be loaded here."
);

/// The Python exception for `e`.
pub(crate) fn to_py(e: Error) -> PyErr {
    let msg = e.to_string();
    match e {
        Error::Buffer { .. }
        | Error::DLPackField { .. }
        | Error::UnsupportedDType { .. }
        | Error::UnsupportedDevice { .. }
        | Error::ReadOnly { .. } => PyBufferError::new_err(msg),
        Error::Protocol { .. } | Error::ProtocolMany { .. } => ProtocolError::new_err(msg),
        Error::InvalidDevice { .. } | Error::DeviceMismatch { .. } => DeviceError::new_err(msg),
        Error::IndexOutOfRange { .. } => PyIndexError::new_err(msg),
        Error::BackendUnavailable { .. } => BackendUnavailableError::new_err(msg),
        Error::Shape { .. } | Error::DTypeMismatch { .. } => PyValueError::new_err(msg),
        _ => PyRuntimeError::new_err(msg),
    }
}
