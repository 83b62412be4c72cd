//! `dlpart.Device`.

use pyo3::exceptions::PyOverflowError;
use pyo3::prelude::*;
use pyo3::types::{PyTuple, PyType};

use crate::device::Device;
use crate::error::Error;

use super::errors::{to_py, DeviceError};

/// A DLPack device such as `Device('kDLCUDA:1')`; compares equal to its string form.
#[pyclass(name = "Device", module = "dlpart", frozen)]
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct PyDevice(pub Device);

/// Reads a device given as a `Device`, a DLPack name (`'kDLCUDA:0'`), a framework's name
/// (`'cpu'`, `'cuda'`, `'cuda:1'`, `'gpu:0'`, `'xpu:0'`, or a `torch.device`) or a DLPack
/// `(type, id)` pair.
pub(crate) fn device_arg(obj: &Bound<'_, PyAny>) -> PyResult<Device> {
    if let Ok(d) = obj.cast::<PyDevice>() {
        return Ok(d.get().0);
    }
    let text = match obj.extract::<String>() {
        Ok(s) => Some(s),
        // torch.device and the like print as 'cuda:0'
        Err(_) if obj.get_type().name()? == "device" => Some(obj.str()?.to_string()),
        Err(_) => None,
    };
    if let Some(s) = text {
        return s.parse().map_err(to_py);
    }
    if let Ok(t) = obj.cast::<PyTuple>() {
        match pair_arg(t) {
            Ok((kind, id)) => return Device::from_dlpack(kind, id).map_err(to_py),
            Err(e) if e.is_instance_of::<DeviceError>(obj.py()) => return Err(e),
            Err(_) => {}
        }
    }
    Err(DeviceError::new_err(format!(
        "invalid device {}: expected a dlpart.Device, a string such as 'kDLCUDA:0' or a DLPack \
         (type, id) pair",
        obj.repr().map(|r| r.to_string()).unwrap_or_default()
    )))
}

/// `obj` as a DLPack `(type, id)` pair of ints, as pyo3 reads it, except that an int beyond
/// 32 bits is an [`crate::Error::InvalidDevice`] naming it, where pyo3 raises a bare
/// `OverflowError`.
fn pair_arg(obj: &Bound<'_, PyAny>) -> PyResult<(i32, i32)> {
    super::ints::located(obj.extract(), obj.py(), || {
        for (i, what) in ["type", "id"].into_iter().enumerate() {
            let x = obj.get_item(i)?;
            if x.extract::<i32>()
                .is_err_and(|e| e.is_instance_of::<PyOverflowError>(obj.py()))
            {
                return Err(to_py(Error::InvalidDevice {
                    text: super::partitioned::described(obj),
                    reason: format!("the device {what} {x} does not fit in 32 bits"),
                }));
            }
        }
        Ok(())
    })
}

/// [`device_arg`] for a device data is to be put on here (a target, a `device=` argument):
/// one that does not exist on this machine (`'kDLCPU:5'`, `'cuda:7'` with fewer GPUs) is a
/// `DeviceError` (see [`crate::backend::check_present`]).
pub(crate) fn target_device_arg(obj: &Bound<'_, PyAny>) -> PyResult<Device> {
    let d = device_arg(obj)?;
    crate::backend::check_present(d).map_err(to_py)?;
    Ok(d)
}

/// [`target_device_arg`] for the device an import is to put data on (`from_dlpack`'s and
/// `from_partitioned`'s `device=`), checked before any producer is asked to move its data
/// there (see [`crate::backend::check_reachable`]): a device this machine lacks raises what
/// `Tensor.to` raises for it (`DeviceError`, or `BackendUnavailableError` without a CUDA
/// driver), naming it, not the producer's `BufferError`.
pub(crate) fn import_device_arg(obj: &Bound<'_, PyAny>) -> PyResult<Device> {
    let d = device_arg(obj)?;
    crate::backend::check_reachable(d).map_err(to_py)?;
    Ok(d)
}

#[pymethods]
impl PyDevice {
    #[new]
    fn new(spec: &Bound<'_, PyAny>) -> PyResult<Self> {
        device_arg(spec).map(PyDevice)
    }

    /// The device from a DLPack `(type, id)` pair, as `__dlpack_device__` returns it.
    #[classmethod]
    fn from_dlpack(
        _cls: &Bound<'_, PyType>,
        #[pyo3(from_py_with = pair_arg)] pair: (i32, i32),
    ) -> PyResult<Self> {
        Device::from_dlpack(pair.0, pair.1)
            .map(PyDevice)
            .map_err(to_py)
    }

    /// The DLPack `(type, id)` pair.
    #[allow(clippy::wrong_self_convention)] // pyo3 methods take &self
    fn to_dlpack(&self) -> (i32, i32) {
        self.0.to_dlpack()
    }

    /// The `kDL` name of the device type, e.g. `'kDLCUDA'`.
    #[getter]
    fn kind(&self) -> &'static str {
        self.0.kind.name()
    }

    /// The device ordinal.
    #[getter]
    fn id(&self) -> i32 {
        self.0.id
    }

    /// The DLPack device type code.
    #[getter]
    fn type_code(&self) -> i32 {
        self.0.kind.code()
    }

    fn __str__(&self) -> String {
        self.0.to_string()
    }

    /// Equal to another `Device`, to a DLPack name (`'kDLCUDA:0'`) or to a DLPack pair naming
    /// the same device (not to framework names such as `'cuda:0'`, whose hash would differ).
    fn __eq__(&self, other: &Bound<'_, PyAny>) -> bool {
        if let Ok(s) = other.extract::<String>() {
            return s.starts_with("kDL") && s.parse::<Device>().is_ok_and(|d| d == self.0);
        }
        device_arg(other).is_ok_and(|d| d == self.0)
    }

    fn __hash__(&self, py: Python<'_>) -> PyResult<isize> {
        // Consistent with equality to the string form.
        pyo3::types::PyString::new(py, &self.0.to_string()).hash()
    }

    fn __repr__(&self) -> String {
        format!("Device('{}')", self.0)
    }

    fn __reduce__<'py>(slf: &Bound<'py, Self>) -> PyResult<(Bound<'py, PyAny>, (String,))> {
        Ok((slf.get_type().into_any(), (slf.get().0.to_string(),)))
    }
}
