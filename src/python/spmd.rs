//! The SPMD functions of `dlpart.mpi`: the Rust [`crate::spmd`] collectives over an mpi4py
//! communicator. [`MpiComm`] implements [`Communicator`] by calling the communicator's own
//! `allgather` and `Alltoallv` with the GIL held; the data buffers are dlpart's, lent to MPI
//! as memoryviews, so the bytes are copied only by packing and unpacking.

use std::ffi::c_char;

use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyTuple};

use crate::device::Device;
use crate::error::{Error, Result};
use crate::spmd::{self, Communicator, LocalParts, Segments, Traffic};

use super::device::device_arg;
use super::errors::to_py;
use super::partitioned::{layout_arg, wrap, PyPartitioned};
use super::tensor::PyTensor;

/// An mpi4py communicator as dlpart's [`Communicator`] (made by `dlpart.mpi`).
#[pyclass(name = "_MpiComm", module = "dlpart._core", frozen)]
pub struct MpiComm {
    comm: Py<PyAny>,
    rank: usize,
    size: usize,
    host: String,
    /// Whether MPI takes CUDA device pointers (`MPI.Query_cuda_support()`).
    cuda_aware: bool,
}

#[pymethods]
impl MpiComm {
    /// Wraps `comm` (an `mpi4py.MPI.Comm`), whose `Get_rank()` and `Get_size()` are read once.
    #[new]
    #[pyo3(signature = (comm, host, cuda_aware=false))]
    fn new(comm: &Bound<'_, PyAny>, host: String, cuda_aware: bool) -> PyResult<Self> {
        Ok(MpiComm {
            rank: comm.call_method0("Get_rank")?.extract()?,
            size: comm.call_method0("Get_size")?.extract()?,
            comm: comm.clone().unbind(),
            host,
            cuda_aware,
        })
    }

    /// This rank.
    #[getter]
    fn rank(&self) -> usize {
        self.rank
    }

    /// The number of ranks.
    #[getter]
    fn size(&self) -> usize {
        self.size
    }
}

fn mpi_error(op: &str, e: PyErr) -> Error {
    Error::Backend {
        backend: "mpi",
        op: op.into(),
        message: e.to_string(),
    }
}

/// MPI counts and displacements are C ints (MPI-3 through mpi4py).
fn c_ints(what: &str, v: &[usize]) -> Result<Vec<i32>> {
    v.iter()
        .map(|&x| {
            i32::try_from(x).map_err(|_| {
                Error::shape(
                    format!("MPI {what} below 2 GiB per exchange (MPI counts are C ints)"),
                    format!("{x} bytes"),
                )
            })
        })
        .collect()
}

/// A memoryview over `len` bytes at `ptr`, writable or not.
///
/// # Safety
/// `ptr .. ptr + len` is valid (and writable when `write`) until the view is released.
unsafe fn memoryview<'py>(
    py: Python<'py>,
    ptr: *mut u8,
    len: usize,
    write: bool,
) -> PyResult<Bound<'py, PyAny>> {
    // PyBUF_READ and PyBUF_WRITE, stable values of the C API.
    let flags = if write { 0x200 } else { 0x100 };
    // SAFETY: the caller guarantees the memory; `len` came from a Rust slice, so it fits isize.
    unsafe {
        let raw = pyo3::ffi::PyMemoryView_FromMemory(ptr.cast::<c_char>(), len as isize, flags);
        Bound::from_owned_ptr_or_err(py, raw)
    }
}

impl MpiComm {
    fn alltoallv<'py>(
        &self,
        py: Python<'py>,
        send: Bound<'py, PyAny>,
        recv: Bound<'py, PyAny>,
        segments: &Segments<'_>,
    ) -> Result<()> {
        let spec = |buf: &Bound<'py, PyAny>, counts: &[usize], displs: &[usize]| -> Result<_> {
            let layout = (c_ints("counts", counts)?, c_ints("displacements", displs)?);
            let byte = py
                .import("mpi4py.MPI")
                .and_then(|m| m.getattr("BYTE"))
                .map_err(|e| mpi_error("import mpi4py.MPI", e))?;
            Ok(vec![
                buf.clone(),
                layout
                    .into_pyobject(py)
                    .map_err(|e| mpi_error("counts", e))?
                    .into_any(),
                byte,
            ])
        };
        let s = spec(&send, segments.send_counts, segments.send_displs)?;
        let r = spec(&recv, segments.recv_counts, segments.recv_displs)?;
        let result = self.comm.bind(py).call_method1("Alltoallv", (s, r));
        // The views lent our memory for this call only.
        for v in [&send, &recv] {
            if v.hasattr("release").unwrap_or(false) {
                let _ = v.call_method0("release");
            }
        }
        result.map(drop).map_err(|e| mpi_error("Alltoallv", e))
    }
}

impl Communicator for MpiComm {
    fn rank(&self) -> usize {
        self.rank
    }

    fn size(&self) -> usize {
        self.size
    }

    fn host(&self) -> String {
        self.host.clone()
    }

    fn all_gather(&self, bytes: &[u8]) -> Result<Vec<Vec<u8>>> {
        Python::attach(|py| {
            let all = self
                .comm
                .bind(py)
                .call_method1("allgather", (PyBytes::new(py, bytes),))?;
            all.extract::<Vec<Vec<u8>>>()
        })
        .map_err(|e| mpi_error("allgather", e))
    }

    fn all_to_all_v(&self, send: &[u8], recv: &mut [u8], segments: &Segments<'_>) -> Result<()> {
        // Empty slices share one dangling address, and Open MPI refuses a send buffer equal
        // to the receive buffer (MPI_ERR_ARG): give empty ones distinct addresses of their own.
        let (mut s_spare, mut r_spare) = ([0u8; 1], [0u8; 1]);
        let send_ptr = match send.len() {
            0 => s_spare.as_mut_ptr(),
            _ => send.as_ptr().cast_mut(),
        };
        let recv_ptr = match recv.len() {
            0 => r_spare.as_mut_ptr(),
            _ => recv.as_mut_ptr(),
        };
        Python::attach(|py| {
            // SAFETY: both buffers outlive the views, which `alltoallv` releases before it
            // returns; MPI only reads the send view.
            let (s, r) = unsafe {
                (
                    memoryview(py, send_ptr, send.len(), false),
                    memoryview(py, recv_ptr, recv.len(), true),
                )
            };
            let (s, r) = (
                s.map_err(|e| mpi_error("memoryview", e))?,
                r.map_err(|e| mpi_error("memoryview", e))?,
            );
            self.alltoallv(py, s, r, segments)
        })
    }

    fn accepts_device(&self, device: Device) -> bool {
        self.cuda_aware && device.kind == crate::DeviceType::Cuda
    }

    fn all_to_all_v_device(
        &self,
        send: &crate::Tensor,
        recv: &crate::Tensor,
        segments: &Segments<'_>,
    ) -> Result<()> {
        Python::attach(|py| {
            // A CUDA-aware mpi4py takes device buffers through DLPack.
            let as_py = |t: &crate::Tensor| {
                PyTensor::new(t.clone())
                    .into_pyobject(py)
                    .map(|b| b.into_any())
                    .map_err(|e| mpi_error("tensor", e))
            };
            let (s, r) = (as_py(send)?, as_py(recv)?);
            self.alltoallv(py, s, r, segments)
        })
    }
}

fn traffic<'py>(py: Python<'py>, t: &Traffic) -> PyResult<Bound<'py, PyTuple>> {
    (t.sent.clone(), t.received.clone(), t.local).into_pyobject(py)
}

fn failure(error: Option<(String, String)>) -> Option<Error> {
    error.map(|(kind, message)| Error::Collective {
        rank: 0,
        kind,
        message,
    })
}

/// See `dlpart.mpi.from_local`: `parts` as `(start, tensor)` pairs (start `None` when stacked
/// along `axis`), or this rank's `error` as `(exception class name, message)`.
#[pyfunction]
#[pyo3(signature = (comm, parts, axis=None, shape=None, error=None))]
fn _spmd_from_local(
    py: Python<'_>,
    comm: &MpiComm,
    parts: Vec<(Option<Vec<usize>>, PyTensor)>,
    axis: Option<usize>,
    shape: Option<Vec<usize>>,
    error: Option<(String, String)>,
) -> PyResult<PyPartitioned> {
    let local = match (failure(error), axis) {
        (Some(e), _) => Err(e),
        (None, Some(axis)) => Ok(LocalParts::Stacked {
            axis,
            parts: parts.into_iter().map(|(_, t)| t.inner).collect(),
        }),
        (None, None) => Ok(LocalParts::Placed(
            parts
                .into_iter()
                .map(|(s, t)| (s.unwrap_or_default(), t.inner))
                .collect(),
        )),
    };
    py.detach(|| spmd::from_local(comm, local, shape.as_deref()))
        .map(wrap)
        .map_err(to_py)
}

/// See `dlpart.mpi.from_partitioned`: ranks filled in from hosts and pids, every rank agreeing.
#[pyfunction]
#[pyo3(signature = (comm, pa=None, error=None))]
fn _spmd_with_ranks(
    py: Python<'_>,
    comm: &MpiComm,
    pa: Option<PyRef<'_, PyPartitioned>>,
    error: Option<(String, String)>,
) -> PyResult<PyPartitioned> {
    let pa = match (pa, failure(error)) {
        (_, Some(e)) => Err(e),
        (Some(p), None) => Ok(p.inner.clone()),
        (None, None) => Err(Error::buffer("no array and no error given")),
    };
    py.detach(|| spmd::with_ranks(comm, pa))
        .map(wrap)
        .map_err(to_py)
}

/// See `dlpart.mpi.SpmdArray.repartition`; returns the array and `(sent, received, local)`.
#[pyfunction]
#[pyo3(signature = (comm, pa, tiling=None, splits=None, block_cyclic=None, devices=None, process_grid=None, transfer=false))]
#[allow(clippy::too_many_arguments)]
fn _spmd_repartition<'py>(
    py: Python<'py>,
    comm: &MpiComm,
    pa: PyRef<'_, PyPartitioned>,
    tiling: Option<Vec<usize>>,
    splits: Option<Vec<Vec<usize>>>,
    block_cyclic: Option<&Bound<'py, PyAny>>,
    devices: Option<&Bound<'py, PyAny>>,
    process_grid: Option<Vec<usize>>,
    transfer: bool,
) -> PyResult<(PyPartitioned, Bound<'py, PyTuple>)> {
    let layout = layout_arg(
        tiling,
        splits,
        block_cyclic,
        devices,
        process_grid,
        pa.inner.ndim(),
    );
    // A bad layout on one rank is that rank's error, which the others learn of.
    let layout = layout.map_err(|e| Error::Collective {
        rank: comm.rank,
        kind: e
            .get_type(py)
            .name()
            .map(|n| n.to_string())
            .unwrap_or_default(),
        message: e.value(py).to_string(),
    });
    let inner = &pa.inner;
    let (out, t) = py
        .detach(|| {
            let target = layout.and_then(|l| spmd::SpmdTarget::resolve(&l, inner, comm.size));
            spmd::repartition_target(comm, inner, target, transfer)
        })
        .map_err(to_py)?;
    Ok((wrap(out), traffic(py, &t)?))
}

/// See `dlpart.mpi.SpmdArray.repartition_into`; returns `(sent, received, local)`.
#[pyfunction]
#[pyo3(signature = (comm, pa, out, transfer=false))]
fn _spmd_repartition_into<'py>(
    py: Python<'py>,
    comm: &MpiComm,
    pa: PyRef<'_, PyPartitioned>,
    out: PyRef<'_, PyPartitioned>,
    transfer: bool,
) -> PyResult<Bound<'py, PyTuple>> {
    let (inner, out) = (&pa.inner, &out.inner);
    let t = py
        .detach(|| spmd::repartition_into(comm, inner, out, transfer))
        .map_err(to_py)?;
    traffic(py, &t)
}

/// Fails every rank with this rank's error `(exception class name, message)`, met before it
/// could make its part of the collective call the others are making.
#[pyfunction]
fn _spmd_fail(py: Python<'_>, comm: &MpiComm, kind: String, message: String) -> PyResult<()> {
    let e = Error::Collective {
        rank: comm.rank,
        kind,
        message,
    };
    Err(to_py(py.detach(|| spmd::fail_together(comm, e))))
}

/// See `dlpart.mpi.SpmdArray.assemble`.
#[pyfunction]
#[pyo3(signature = (comm, pa, root=None, device=None, transfer=false))]
fn _spmd_assemble(
    py: Python<'_>,
    comm: &MpiComm,
    pa: PyRef<'_, PyPartitioned>,
    root: Option<usize>,
    device: Option<&Bound<'_, PyAny>>,
    transfer: bool,
) -> PyResult<Option<PyTensor>> {
    let device = device
        .filter(|d| !d.is_none())
        .map(device_arg)
        .transpose()?;
    let inner = &pa.inner;
    py.detach(|| spmd::assemble(comm, inner, root, device, transfer))
        .map(|t| t.map(PyTensor::new))
        .map_err(to_py)
}

/// See `dlpart.mpi.SpmdArray.gather`; returns the array and `(sent, received, local)`.
#[pyfunction]
fn _spmd_gather<'py>(
    py: Python<'py>,
    comm: &MpiComm,
    pa: PyRef<'_, PyPartitioned>,
    indices: PyTensor,
    axis: usize,
) -> PyResult<(PyPartitioned, Bound<'py, PyTuple>)> {
    let inner = &pa.inner;
    let (out, t) = py
        .detach(|| spmd::gather(comm, inner, &indices.inner, axis))
        .map_err(to_py)?;
    Ok((wrap(out), traffic(py, &t)?))
}

/// See `dlpart.mpi.SpmdArray.scatter`.
#[pyfunction]
fn _spmd_scatter(
    py: Python<'_>,
    comm: &MpiComm,
    pa: PyRef<'_, PyPartitioned>,
    values: PyTensor,
    indices: PyTensor,
    axis: usize,
) -> PyResult<()> {
    let inner = &pa.inner;
    py.detach(|| spmd::scatter(comm, inner, &values.inner, &indices.inner, axis))
        .map_err(to_py)
}

pub(super) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<MpiComm>()?;
    m.add_function(wrap_pyfunction!(_spmd_from_local, m)?)?;
    m.add_function(wrap_pyfunction!(_spmd_with_ranks, m)?)?;
    m.add_function(wrap_pyfunction!(_spmd_repartition, m)?)?;
    m.add_function(wrap_pyfunction!(_spmd_repartition_into, m)?)?;
    m.add_function(wrap_pyfunction!(_spmd_assemble, m)?)?;
    m.add_function(wrap_pyfunction!(_spmd_fail, m)?)?;
    m.add_function(wrap_pyfunction!(_spmd_gather, m)?)?;
    m.add_function(wrap_pyfunction!(_spmd_scatter, m)?)?;
    Ok(())
}
