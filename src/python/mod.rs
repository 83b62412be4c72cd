//! The `dlpart._core` Python extension module: the only place that touches pyo3.
//!
//! Thin by design: argument conversion, capsules and error mapping live here; everything else
//! calls into the Rust core.

mod capsule;
mod device;
mod distarray;
mod dlpack_call;
mod errors;
mod ints;
mod location;
mod ops;
mod partitioned;
mod prepared;
mod spmd;
mod tensor;
mod testing;

use pyo3::prelude::*;

pub(crate) use device::PyDevice;
pub(crate) use tensor::PyTensor;

/// Clears the logging bridge's cache of Python loggers and their levels.
static LOG_RESET: std::sync::OnceLock<pyo3_log::ResetHandle> = std::sync::OnceLock::new();

/// Sends the Rust core's `log` records to Python's `logging`, under the logger names of their
/// module paths (`dlpart.backend.cuda...`, children of `logging.getLogger("dlpart")`). Each
/// logger's level is cached on first use, so a record below it returns without the GIL: log
/// records cost nothing measurable while logging is off. Another `log` logger already in
/// this process (a Rust program embedding Python) keeps its place.
fn install_logger(py: Python<'_>) {
    let Ok(logger) = pyo3_log::Logger::new(py, pyo3_log::Caching::LoggersAndLevels) else {
        return;
    };
    if let Ok(handle) = logger.filter(log::LevelFilter::Debug).install() {
        let _ = LOG_RESET.set(handle);
    }
}

/// This node's address as other nodes reach it (see `crate::host::this_host`), for
/// `dlpart._location`.
#[pyfunction]
fn _this_host() -> String {
    crate::host::this_host()
}

/// Re-reads the levels of the `dlpart` loggers; call it after changing them while the
/// program runs (the Rust side caches each logger's level when it first logs).
#[pyfunction]
fn reload_log_levels() {
    if let Some(h) = LOG_RESET.get() {
        h.reset();
    }
}

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
    distarray::register(m)?;
    ops::register(m)?;
    prepared::register(m)?;
    m.add_function(wrap_pyfunction!(reload_log_levels, m)?)?;
    m.add_function(wrap_pyfunction!(_this_host, m)?)?;
    install_logger(py);
    let testing = PyModule::new(py, "_testing")?;
    testing::register(&testing)?;
    m.add_submodule(&testing)?;
    Ok(())
}
