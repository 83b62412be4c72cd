//! The SPMD functions of `dlpart.mpi`: the Rust [`crate::spmd`] collectives over an mpi4py
//! communicator. [`MpiComm`] implements [`Communicator`] by calling the communicator's own
//! `allgather` (of each rank's bytes alone, after the one that made it), and `Isend`, `Irecv` and `Request.Waitall`
//! between the ranks that have bytes for each other, cut into messages by rank 0's
//! `DLPART_MPI_MESSAGE_BYTES` (gathered once, when the communicator is made), with the GIL
//! held; the data buffers are dlpart's, lent to MPI as memoryviews, so the bytes are copied
//! only by packing and unpacking.

use std::ffi::c_char;

use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyTuple};

use crate::device::Device;
use crate::error::{Error, Result};
use crate::spmd::p2p::{messages, MessageBytes, TAG};
use crate::spmd::{self, Communicator, LocalParts, Segments, Traffic};

use super::device::device_arg;
use super::errors::to_py;
use super::ints::{self, Refusal};
use super::partitioned::{
    layout_arg, layout_tiling_arg, process_grid_arg, splits_arg, wrap, PyPartitioned,
};
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
    /// The most bytes of one message: rank 0's `DLPART_MPI_MESSAGE_BYTES`, gathered when the
    /// communicator was made, so that every rank cuts its segments alike though the variable
    /// may differ between the ranks.
    cut: MessageBytes,
}

#[pymethods]
impl MpiComm {
    /// Wraps `comm` (an `mpi4py.MPI.Comm`), whose `Get_rank()` and `Get_size()` are read once
    /// (collective: every rank makes it). One `comm.allgather((value, error))`, here and never
    /// again, carries each rank's `DLPART_MPI_MESSAGE_BYTES` and `error`, what failed on this
    /// rank while it got ready (its `host`, say: `(exception class name, message)`, or
    /// None): when a rank gives one, every rank raises the lowest such rank's error (`rank N:
    /// ...`), as every collective does, rather than leave the others waiting; else rank 0's
    /// value is the message size every exchange through this communicator cuts by, the first
    /// included.
    #[new]
    #[pyo3(signature = (comm, host, cuda_aware=false, error=None))]
    fn new(
        comm: &Bound<'_, PyAny>,
        host: String,
        cuda_aware: bool,
        error: Option<(String, String)>,
    ) -> PyResult<Self> {
        let rank = comm.call_method0("Get_rank")?.extract()?;
        let size = comm.call_method0("Get_size")?.extract()?;
        let cut = MessageBytes::agree(|mine| {
            let all: Vec<(u64, Option<(String, String)>)> = comm
                .call_method1("allgather", ((mine, error),))
                .and_then(|all| all.extract())
                .map_err(|e| mpi_error("allgather of the message size", e))?;
            let failed = all
                .iter()
                .enumerate()
                .find_map(|(r, (_, e))| Some((r, e.clone()?)));
            match (failed, all.first()) {
                (Some((rank, (kind, message))), _) => Err(Error::Collective {
                    rank,
                    kind,
                    message,
                }),
                (None, Some(&(root, _))) => Ok(root),
                (None, None) => Err(Error::buffer(
                    "allgather of the message size gave no rank's",
                )),
            }
        })
        .map_err(to_py)?;
        Ok(MpiComm {
            rank,
            size,
            comm: comm.clone().unbind(),
            host,
            cuda_aware,
            cut,
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

    /// The communicator wrapped (dlpart's duplicate of the caller's).
    #[getter]
    fn comm(&self, py: Python<'_>) -> Py<PyAny> {
        self.comm.clone_ref(py)
    }
}

fn mpi_error(op: &str, e: PyErr) -> Error {
    Error::Backend {
        backend: "mpi",
        op: op.into(),
        message: e.to_string(),
    }
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
    /// Moves each peer's segment of `segments` with nonblocking point-to-point messages, only
    /// between the ranks that have bytes for each other (a sparse plan touches only its
    /// peers), then waits for all of them: receives are posted first, so every message finds
    /// its receive (see [`messages`]). `send(offset, len)` and `recv(offset, len)` make the
    /// buffer objects mpi4py takes for a byte range of the send and receive buffers, of
    /// `lens` bytes; they are asked only for ranges inside them. Every rank calls this with
    /// segments that match its peers' (the plan is global), so each pair's messages match in
    /// order (MPI's messages between two ranks with one tag do not overtake).
    fn exchange<'py>(
        &self,
        py: Python<'py>,
        send: &dyn Fn(usize, usize) -> Result<Bound<'py, PyAny>>,
        recv: &dyn Fn(usize, usize) -> Result<Bound<'py, PyAny>>,
        lens: (usize, usize),
        segments: &Segments<'_>,
    ) -> Result<()> {
        let (mpi, byte) = py
            .import("mpi4py.MPI")
            .and_then(|m| {
                let byte = m.getattr("BYTE")?;
                Ok((m, byte))
            })
            .map_err(|e| mpi_error("import mpi4py.MPI", e))?;
        // Every buffer object first (what can fail before anything is posted).
        let plan = messages(self.rank, segments, lens.0, lens.1, self.cut)?;
        let mut posts = Vec::with_capacity(plan.len());
        for m in &plan {
            let buf = if m.send {
                send(m.at, m.len)?
            } else {
                recv(m.at, m.len)?
            };
            posts.push((m.op(), m.peer, buf));
        }
        let comm = self.comm.bind(py);
        let mut requests = Vec::with_capacity(posts.len());
        let mut failed = None;
        for (op, p, buf) in &posts {
            match comm.call_method1(*op, ((buf.clone(), byte.clone()), *p, TAG)) {
                Ok(r) => requests.push(r),
                Err(e) => {
                    failed = Some(mpi_error(op, e));
                    break;
                }
            }
        }
        // Posted requests are waited for even after a failed post: MPI may still be reading
        // or writing the buffers they lent, which the caller frees when this returns.
        let waited = mpi
            .getattr("Request")
            .and_then(|r| r.call_method1("Waitall", (requests,)))
            .map(drop)
            .map_err(|e| mpi_error("Waitall", e));
        // The views lent our memory for these messages only.
        for (_, _, v) in &posts {
            if v.hasattr("release").unwrap_or(false) {
                let _ = v.call_method0("release");
            }
        }
        match failed {
            Some(e) => Err(e),
            None => waited,
        }
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

    /// Every rank's bytes, by the communicator's `allgather` of a `bytes` object.
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
        let lens = (send.len(), recv.len());
        let (send_ptr, recv_ptr) = (send.as_ptr().cast_mut(), recv.as_mut_ptr());
        Python::attach(|py| {
            let view = |base: *mut u8, write: bool| {
                move |at: usize, len: usize| {
                    // SAFETY: `exchange` asks only for byte ranges inside the buffers (`lens`,
                    // checked by `messages`); both buffers outlive the views, which `exchange`
                    // releases before it returns (after MPI is done with them); MPI only reads
                    // the send views.
                    unsafe { memoryview(py, base.wrapping_add(at), len, write) }
                        .map_err(|e| mpi_error("memoryview", e))
                }
            };
            let (s, r) = (view(send_ptr, false), view(recv_ptr, true));
            self.exchange(py, &s, &r, lens, segments)
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
            let (s, r) = (device_bytes(py, send), device_bytes(py, recv));
            self.exchange(py, &s, &r, (send.nbytes(), recv.nbytes()), segments)
        })
    }
}

/// The byte ranges of a contiguous device tensor as mpi4py takes them from a CUDA-aware MPI:
/// one-dimensional byte tensors, lent through DLPack.
fn device_bytes<'py>(
    py: Python<'py>,
    t: &crate::Tensor,
) -> impl Fn(usize, usize) -> Result<Bound<'py, PyAny>> {
    let t = t.clone();
    move |at: usize, len: usize| {
        if t.nbytes() < at.saturating_add(len) || !t.is_contiguous() {
            return Err(Error::buffer(format!(
                "bytes {at}..{} of a {} byte exchange buffer",
                at.saturating_add(len),
                t.nbytes()
            )));
        }
        // SAFETY: the range lies inside `t`'s contiguous memory (checked above), which the
        // view's owner (`t`'s) keeps alive; the device address is only offset here, never
        // dereferenced.
        let view = unsafe {
            crate::Tensor::from_raw_parts(
                t.data_ptr().wrapping_add(at),
                vec![len],
                vec![1],
                crate::DType::UInt8,
                t.device(),
                false,
                t.owner().clone(),
            )
        };
        PyTensor::new(view)
            .into_pyobject(py)
            .map(|b| b.into_any())
            .map_err(|e| mpi_error("tensor", e))
    }
}

fn traffic<'py>(py: Python<'py>, t: &Traffic) -> PyResult<Bound<'py, PyTuple>> {
    (t.sent.clone(), t.received.clone(), t.local).into_pyobject(py)
}

/// This rank's Python error `e` as the error of a collective call, which the others learn of
/// (its class by name).
fn rank_error(py: Python<'_>, comm: &MpiComm, e: &PyErr) -> Error {
    Error::Collective {
        rank: comm.rank,
        kind: e
            .get_type(py)
            .name()
            .map(|n| n.to_string())
            .unwrap_or_default(),
        message: e.value(py).to_string(),
    }
}

pub(super) fn failure(error: Option<(String, String)>) -> Option<Error> {
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
    parts: &Bound<'_, PyAny>,
    axis: Option<&Bound<'_, PyAny>>,
    shape: Option<&Bound<'_, PyAny>>,
    error: Option<(String, String)>,
) -> PyResult<PyPartitioned> {
    // An argument this rank cannot read is this rank's error, which the others learn of.
    let read = || -> PyResult<_> {
        let parts = local_parts_arg(parts)?;
        let axis = axis.map_or(Ok(None), |a| ints::optional(a, axis_arg))?;
        let shape = shape.map_or(Ok(None), |s| {
            ints::optional(s, |s| ints::ints::<usize>(s, "shape", Refusal::Value))
        })?;
        Ok((parts, axis, shape))
    };
    let (local, shape) = match (failure(error), read()) {
        (Some(e), _) => (Err(e), None),
        (None, Err(e)) => (Err(rank_error(py, comm, &e)), None),
        (None, Ok((parts, Some(axis), shape))) => (
            Ok(LocalParts::Stacked {
                axis,
                parts: parts.into_iter().map(|(_, t)| t.inner).collect(),
            }),
            shape,
        ),
        (None, Ok((parts, None, shape))) => (
            Ok(LocalParts::Placed(
                parts
                    .into_iter()
                    .map(|(s, t)| (s.unwrap_or_default(), t.inner))
                    .collect(),
            )),
            shape,
        ),
    };
    py.detach(|| spmd::from_local(comm, local, shape.as_deref()))
        .map(wrap)
        .map_err(to_py)
}

/// `_spmd_from_local`'s `parts`: `(start, tensor)` pairs, start `None` when stacked; a start
/// entry out of range is named `parts[i].start[k]`.
fn local_parts_arg(obj: &Bound<'_, PyAny>) -> PyResult<Vec<(Option<Vec<usize>>, PyTensor)>> {
    ints::located(obj.extract(), obj.py(), || {
        for (i, part) in obj.try_iter()?.enumerate() {
            let start = part?.get_item(0)?;
            if !start.is_none() {
                let name = format!("parts[{i}].start");
                ints::ints::<usize>(&start, &name, Refusal::Value)?;
            }
        }
        Ok(())
    })
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
        (Some(p), None) => Ok(crate::PartitionedArray::clone(&p.inner())),
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
    tiling: Option<&Bound<'py, PyAny>>,
    splits: Option<&Bound<'py, PyAny>>,
    block_cyclic: Option<&Bound<'py, PyAny>>,
    devices: Option<&Bound<'py, PyAny>>,
    process_grid: Option<&Bound<'py, PyAny>>,
    transfer: bool,
) -> PyResult<(PyPartitioned, Bound<'py, PyTuple>)> {
    let inner = &pa.inner();
    let layout = (|| {
        layout_arg(
            tiling.map_or(Ok(None), layout_tiling_arg)?,
            splits.map_or(Ok(None), splits_arg)?,
            block_cyclic,
            devices,
            process_grid.map_or(Ok(None), process_grid_arg)?,
            inner.ndim(),
        )
    })();
    // A bad layout on one rank is that rank's error, which the others learn of.
    let layout = layout.map_err(|e| rank_error(py, comm, &e));
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
    let (inner, out) = (&pa.inner(), &out.inner());
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

/// Every rank's verdict on a check each made alone (`error`: this rank's failure as
/// `(exception class name, message)`, or None) in the collective `call`: the lowest failing
/// rank's error on every rank.
#[pyfunction]
#[pyo3(signature = (comm, error=None, call="check_together"))]
fn _spmd_check(
    py: Python<'_>,
    comm: &MpiComm,
    error: Option<(String, String)>,
    call: &str,
) -> PyResult<()> {
    let outcome = failure(error).map_or(Ok(()), Err);
    py.detach(|| spmd::check_called(comm, call, outcome))
        .map_err(to_py)
}

/// See `dlpart.mpi.SpmdArray.assemble`.
#[pyfunction]
#[pyo3(signature = (comm, pa, root=None, device=None, transfer=false))]
fn _spmd_assemble(
    py: Python<'_>,
    comm: &MpiComm,
    pa: PyRef<'_, PyPartitioned>,
    #[pyo3(from_py_with = root_arg)] root: Option<usize>,
    device: Option<&Bound<'_, PyAny>>,
    transfer: bool,
) -> PyResult<Option<PyTensor>> {
    let device = device
        .filter(|d| !d.is_none())
        .map(device_arg)
        .transpose()?;
    let inner = &pa.inner();
    py.detach(|| spmd::assemble(comm, inner, root, device, transfer))
        .map(|t| t.map(PyTensor::new))
        .map_err(to_py)
}

/// See `dlpart.mpi.SpmdArray.to`: this rank's `device`, or its `error` as `(exception class
/// name, message)` met reading it.
#[pyfunction]
#[pyo3(signature = (comm, pa, device=None, error=None))]
fn _spmd_to(
    py: Python<'_>,
    comm: &MpiComm,
    pa: PyRef<'_, PyPartitioned>,
    device: Option<&Bound<'_, PyAny>>,
    error: Option<(String, String)>,
) -> PyResult<PyPartitioned> {
    let device = match (failure(error), device) {
        (Some(e), _) => Err(e),
        (None, Some(d)) => device_arg(d).map_err(|e| rank_error(py, comm, &e)),
        (None, None) => Err(Error::buffer("no device and no error given")),
    };
    let inner = &pa.inner();
    py.detach(|| spmd::to_in(comm, inner, device))
        .map(wrap)
        .map_err(to_py)
}

/// See `dlpart.mpi.SpmdArray.gather`; returns the array and `(sent, received, local)`.
#[pyfunction]
fn _spmd_gather<'py>(
    py: Python<'py>,
    comm: &MpiComm,
    pa: PyRef<'_, PyPartitioned>,
    indices: PyTensor,
    #[pyo3(from_py_with = axis_arg)] axis: usize,
) -> PyResult<(PyPartitioned, Bound<'py, PyTuple>)> {
    let inner = &pa.inner();
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
    #[pyo3(from_py_with = axis_arg)] axis: usize,
) -> PyResult<()> {
    let inner = &pa.inner();
    py.detach(|| spmd::scatter(comm, inner, &values.inner, &indices.inner, axis))
        .map_err(to_py)
}

/// `_spmd_assemble`'s `root`, or None.
fn root_arg(obj: &Bound<'_, PyAny>) -> PyResult<Option<usize>> {
    ints::optional(obj, |r| ints::int(r, "root", Refusal::Value))
}

/// The `axis` of `_spmd_gather` and `_spmd_scatter`, which the Python layer has made
/// non-negative.
fn axis_arg(obj: &Bound<'_, PyAny>) -> PyResult<usize> {
    ints::int(obj, "axis", Refusal::Value)
}

pub(super) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<MpiComm>()?;
    m.add_function(wrap_pyfunction!(_spmd_from_local, m)?)?;
    m.add_function(wrap_pyfunction!(_spmd_with_ranks, m)?)?;
    m.add_function(wrap_pyfunction!(_spmd_repartition, m)?)?;
    m.add_function(wrap_pyfunction!(_spmd_repartition_into, m)?)?;
    m.add_function(wrap_pyfunction!(_spmd_assemble, m)?)?;
    m.add_function(wrap_pyfunction!(_spmd_fail, m)?)?;
    m.add_function(wrap_pyfunction!(_spmd_check, m)?)?;
    m.add_function(wrap_pyfunction!(_spmd_to, m)?)?;
    m.add_function(wrap_pyfunction!(_spmd_gather, m)?)?;
    m.add_function(wrap_pyfunction!(_spmd_scatter, m)?)?;
    Ok(())
}
