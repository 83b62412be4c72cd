//! The `dlpart._core` Python extension module: the only place that touches pyo3.
//!
//! Thin by design: argument conversion, capsules and error mapping live here; everything else
//! calls into the Rust core.

mod capsule;
mod device;
mod dlpack_call;
mod errors;
mod location;
mod ops;
mod partitioned;
mod spmd;
mod tensor;
mod testing;

use pyo3::prelude::*;

pub(crate) use device::PyDevice;
pub(crate) use tensor::PyTensor;

#[pymodule]
fn _core(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = m.py();
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    m.add("ProtocolError", py.get_type::<errors::ProtocolError>())?;
    m.add("DeviceError", py.get_type::<errors::DeviceError>())?;
    m.add(
        "BackendUnavailableError",
        py.get_type::<errors::BackendUnavailableError>(),
    )?;
    m.add_class::<PyDevice>()?;
    m.add_class::<PyTensor>()?;
    m.add_function(wrap_pyfunction!(tensor::from_dlpack, m)?)?;
    m.add_function(wrap_pyfunction!(tensor::_tensor_from_bytes, m)?)?;
    partitioned::register(m)?;
    spmd::register(m)?;
    ops::register(m)?;
    let testing = PyModule::new(py, "_testing")?;
    testing::register(&testing)?;
    m.add_submodule(&testing)?;
    Ok(())
}
