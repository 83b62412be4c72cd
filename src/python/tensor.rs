//! `dlpart.Tensor` and `dlpart.from_dlpack`.

use pyo3::exceptions::{PyBufferError, PyOverflowError, PyTypeError, PyValueError};
use pyo3::intern;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyBytes, PyTuple, PyType};

use crate::backend::backend_for;
use crate::device::Device;
use crate::dlpack::FLAG_IS_COPIED;
use crate::error::tuple_string;
use crate::tensor::Tensor;

use super::capsule::{consume_capsule, export_capsule};
use super::device::{device_arg, import_device_arg, target_device_arg, PyDevice};
use super::dlpack_call::{call_legacy, call_numpy, call_versioned, Keywords};
use super::errors::{to_py, BackendUnavailableError, DeviceError};
use crate::error::TARGET_ELSEWHERE;

/// A strided n-d array on one device, exchanged zero-copy through DLPack.
///
/// `strides` are in elements, as in DLPack (not in bytes, as in numpy).
#[pyclass(name = "Tensor", module = "dlpart", frozen)]
#[derive(Clone)]
pub struct PyTensor {
    pub inner: Tensor,
}

impl PyTensor {
    pub fn new(inner: Tensor) -> Self {
        PyTensor { inner }
    }
}

/// A contiguous copy of `t` on its own device.
pub(crate) fn copy_tensor(t: &Tensor) -> PyResult<Tensor> {
    t.copy()
        .map_err(|e| to_py(e.advise("copy it onto one of them instead (t.to('cpu'))")))
}

/// `t` placed on `target`, copying only where it must and only if `copy` allows.
/// Returns the tensor and whether it is a copy.
fn place(t: Tensor, target: Option<Device>, copy: Option<bool>) -> PyResult<(Tensor, bool)> {
    let here = t.device();
    let to = target.unwrap_or(here);
    if copy != Some(true) {
        if to == here {
            return Ok((t, false));
        }
        // Host-accessible memory is readable as kDLCPU without a copy (e.g. kDLCUDAHost).
        if let Some(alias) = t.as_cpu().filter(|_| to == Device::CPU) {
            return Ok((alias, false));
        }
    }
    if copy == Some(false) {
        return Err(copy_forbidden(here, to));
    }
    // A copy on the target device, as the array API's from_dlpack allows: what dlpart cannot
    // place there is a BufferError, as the array API asks of both from_dlpack and __dlpack__
    // (memory running out stays a MemoryError). A device without dlpart kernels (kDLOneAPI)
    // is said as every other move says it, the BackendUnavailableError chained as the cause.
    match crate::ops::to_device(&t, to).map_err(|e| e.advise(TARGET_ELSEWHERE)) {
        Ok(c) => Ok((c, true)),
        Err(e @ crate::Error::OutOfMemory { .. }) => Err(to_py(e)),
        Err(e) => {
            let refused =
                PyBufferError::new_err(format!("cannot place a tensor on {here} onto {to}: {e}"));
            if matches!(e, crate::Error::BackendUnavailable { .. }) {
                Python::attach(|py| refused.set_cause(py, Some(to_py(e))));
            }
            Err(refused)
        }
    }
}

/// The `BufferError` of a move from `here` to `to` that `copy=False` forbids: said alike
/// whether dlpart or the producer was to make the move.
fn copy_forbidden(here: Device, to: Device) -> PyErr {
    PyBufferError::new_err(format!(
        "cannot place a tensor on {here} onto {to}: copy=False forbids the copy this needs"
    ))
}

/// Export side of the DLPack stream rules: the consumer's stream waits (through an event) for
/// the work dlpart queued on the device. Where dlpart has no backend it queued none.
fn consumer_waits(device: Device, stream: Option<i64>) -> PyResult<()> {
    match backend_for(device) {
        Ok(b) => b.make_consumer_wait(stream).map_err(to_py),
        Err(crate::Error::BackendUnavailable { .. } | crate::Error::UnsupportedDevice { .. }) => {
            Ok(())
        }
        Err(e) => Err(to_py(e)),
    }
}

/// Import side, for a producer whose `__dlpack__` takes no `stream` and so promised no order:
/// such producers queue their work on the legacy default stream, which dlpart's non-blocking
/// stream does not wait for by itself. For data on a CUDA device, dlpart's stream there waits
/// (on the device) for the work queued on the legacy stream so far. Where dlpart has no
/// backend it queues no work.
fn follow_legacy_stream(device: Device) -> PyResult<()> {
    if device.kind != crate::DeviceType::Cuda {
        return Ok(());
    }
    match crate::backend::cuda::CudaBackend::get(device) {
        // DLPack's 1: the legacy default stream.
        Ok(b) => b.wait_for_producer(Some(1)).map_err(to_py),
        Err(crate::Error::BackendUnavailable { .. } | crate::Error::UnsupportedDevice { .. }) => {
            Ok(())
        }
        Err(e) => Err(to_py(e)),
    }
}

/// Import side: the stream to hand a producer for data on `device`, and the backend whose
/// legacy stream the host must wait for once the capsule is taken (see [`host_waits`]). For
/// a CUDA device, our backend's stream, so the producer makes it wait for its work; `None`
/// (the legacy default stream) otherwise.
fn import_stream(
    x: &Bound<'_, PyAny>,
    device: Option<Device>,
) -> PyResult<(
    Option<i64>,
    Option<std::sync::Arc<crate::backend::cuda::CudaBackend>>,
)> {
    let Some(d) = device else {
        return Ok((None, None));
    };
    if let Some(b) = host_waits(x, d)? {
        // DLPack's 1: the legacy default stream, tied to no stream of dlpart's.
        return Ok((Some(1), Some(b)));
    }
    Ok(match d {
        // Host backends queue no work, so their stream is always None: answered without
        // making a backend (an `Arc` per import).
        d if d.is_host_accessible() => (None, None),
        d => (backend_for(d).ok().and_then(|b| b.dlpack_stream()), None),
    })
}

/// For memory CUDA's kernels write and the host reads directly (`kDLCUDAHost`,
/// `kDLCUDAManaged`): the CUDA backend of the device it names, whose legacy default stream
/// the producer is asked to order its work before, and which the host then waits for before
/// reading anything (dlpart's CPU backend reads such memory at once: a wait on the device
/// would order nothing). `None` where CUDA cannot be loaded (no producer here can have queued
/// work on a GPU) and for numpy arrays (host memory numpy imported: numpy queues no GPU
/// work and takes only `stream=None`).
///
/// DLPack gives no device for `kDLCUDAHost` memory (its id is 0): the legacy stream of the
/// device it names is the one waited for.
fn host_waits(
    x: &Bound<'_, PyAny>,
    device: Device,
) -> PyResult<Option<std::sync::Arc<crate::backend::cuda::CudaBackend>>> {
    use crate::DeviceType::{CudaHost, CudaManaged};
    if !matches!(device.kind, CudaHost | CudaManaged) || numpy_instance(x) {
        return Ok(None);
    }
    match crate::backend::cuda::CudaBackend::get(Device::cuda(device.id)) {
        Ok(b) => Ok(Some(b)),
        Err(crate::Error::BackendUnavailable { .. }) => Ok(None),
        Err(e) => Err(to_py(e)),
    }
}

fn stream_ok(device: Device, stream: &Bound<'_, PyAny>) -> PyResult<()> {
    if stream.is_none() {
        return Ok(());
    }
    let s: i64 = stream.extract().map_err(|_| {
        let repr = stream.repr().map(|r| r.to_string()).unwrap_or_default();
        if stream.is_instance_of::<pyo3::types::PyInt>() {
            PyValueError::new_err(format!(
                "stream={repr} is not a stream: a DLPack stream is a 64-bit integer"
            ))
        } else {
            PyTypeError::new_err(format!("stream must be None or an int, not {repr}"))
        }
    })?;
    if device.is_host_accessible() && device.kind == crate::DeviceType::Cpu {
        if s == -1 {
            return Ok(());
        }
        return Err(PyBufferError::new_err(format!(
            "stream={s} was given for a tensor on {device}: CPU tensors take stream=None"
        )));
    }
    if s == 0 {
        return Err(PyValueError::new_err(
            "stream=0 is ambiguous and not allowed by DLPack; use 1 for the legacy default stream \
             or 2 for the per-thread default stream",
        ));
    }
    Ok(())
}

#[pymethods]
impl PyTensor {
    /// The extent of each axis.
    #[getter]
    fn shape<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyTuple>> {
        PyTuple::new(py, self.inner.shape())
    }

    /// Strides in elements.
    #[getter]
    fn strides<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyTuple>> {
        PyTuple::new(py, self.inner.strides())
    }

    /// The element type, as a name like `'float32'`.
    #[getter]
    fn dtype(&self) -> &'static str {
        self.inner.dtype().name()
    }

    /// The device the elements live on (`kDLCPU`, `kDLCUDA:0`, ...).
    #[getter]
    fn device(&self) -> PyDevice {
        PyDevice(self.inner.device())
    }

    /// Whether the elements must not be written (by dlpart or through an export): data from a
    /// producer that marked it read-only, or from a legacy producer, which cannot say.
    #[getter]
    fn readonly(&self) -> bool {
        self.inner.readonly()
    }

    /// Whether the elements lie in C order without gaps (axes of length 1 may have any
    /// stride). JAX imports only such tensors; `copy()` makes one.
    #[getter]
    fn is_contiguous(&self) -> bool {
        self.inner.is_contiguous()
    }

    /// Bytes of the elements (`size * itemsize`), not of the span they occupy.
    #[getter]
    fn nbytes(&self) -> PyResult<usize> {
        // Checked here too: a tensor's byte count is validated where it enters (import, pickle),
        // but a wrong answer must never come back silently.
        self.inner
            .numel()
            .checked_mul(self.inner.dtype().itemsize())
            .ok_or_else(|| {
                PyOverflowError::new_err(format!(
                    "the byte count of a {} tensor of shape {} overflows",
                    self.inner.dtype(),
                    tuple_string(self.inner.shape())
                ))
            })
    }

    /// The number of axes.
    #[getter]
    fn ndim(&self) -> usize {
        self.inner.ndim()
    }

    /// The number of elements (1 for a 0-d tensor).
    #[getter]
    fn size(&self) -> usize {
        self.inner.numel()
    }

    /// Bytes of one element.
    #[getter]
    fn itemsize(&self) -> usize {
        self.inner.dtype().itemsize()
    }

    /// Address of element `[0, ..., 0]` (0 for empty tensors).
    #[getter]
    fn data_ptr(&self) -> usize {
        if self.inner.numel() == 0 {
            0
        } else {
            self.inner.data_ptr() as usize
        }
    }

    fn __repr__(&self) -> String {
        let t = &self.inner;
        let mut s = format!(
            "dlpart.Tensor(shape={}, dtype='{}', device='{}'",
            tuple_string(t.shape()),
            t.dtype(),
            t.device()
        );
        if !t.is_contiguous() {
            s.push_str(&format!(", strides={}", tuple_string(t.strides())));
        }
        if t.readonly() {
            s.push_str(", readonly=True");
        }
        s.push(')');
        s
    }

    /// A zero-copy view of the box `start .. start + shape`.
    fn view(
        &self,
        #[pyo3(from_py_with = start_arg)] start: Vec<i64>,
        #[pyo3(from_py_with = shape_arg)] shape: Vec<i64>,
    ) -> PyResult<Self> {
        let start = non_negative("view", "start", &start)?;
        let shape = non_negative("view", "shape", &shape)?;
        self.inner
            .view(&start, &shape)
            .map(PyTensor::new)
            .map_err(to_py)
    }

    /// A copy on `device`: the explicit way to move data between devices (host and CUDA
    /// devices need dlpart built with the `cuda` feature). Data on or to a device without
    /// dlpart kernels (kDLOneAPI) raises `dlpart.BackendUnavailableError`: only its own
    /// library moves it.
    fn to(&self, py: Python<'_>, device: &Bound<'_, PyAny>) -> PyResult<Self> {
        let d = target_device_arg(device)?;
        let t = self.inner.clone();
        py.detach(|| t.to_device(d))
            .map(PyTensor::new)
            .map_err(|e| to_py(e.advise(TARGET_ELSEWHERE)))
    }

    /// A contiguous copy on the same device.
    fn copy(&self) -> PyResult<Self> {
        copy_tensor(&self.inner).map(PyTensor::new)
    }

    #[pyo3(signature = (*, stream=None, max_version=None, dl_device=None, copy=None))]
    fn __dlpack__<'py>(
        &self,
        py: Python<'py>,
        stream: Option<Bound<'py, PyAny>>,
        #[pyo3(from_py_with = super::ints::max_version)] max_version: Option<(i64, i64)>,
        dl_device: Option<Bound<'py, PyAny>>,
        copy: Option<bool>,
    ) -> PyResult<Bound<'py, PyAny>> {
        if let Some((major, minor)) = max_version {
            if major < 0 || minor < 0 {
                return Err(PyValueError::new_err(format!(
                    "__dlpack__: max_version must be a (major, minor) pair of non-negative \
                     ints, not ({major}, {minor})"
                )));
            }
        }
        if let Some(s) = &stream {
            stream_ok(self.inner.device(), s)?;
        }
        // A device named wrongly is the caller's error (DeviceError, TypeError); one this
        // producer cannot serve is a BufferError, as the array API asks of `__dlpack__`.
        let target = match &dl_device {
            Some(d) if !d.is_none() => Some(device_arg(d)?),
            _ => None,
        };
        let unserved = |e: PyErr| {
            if e.is_instance_of::<DeviceError>(py)
                || e.is_instance_of::<BackendUnavailableError>(py)
            {
                let b = PyBufferError::new_err(format!("__dlpack__: {}", e.value(py)));
                b.set_cause(py, Some(e));
                return b;
            }
            e
        };
        if let Some(d) = target {
            crate::backend::check_present(d)
                .map_err(to_py)
                .map_err(unserved)?;
        }
        let (t, copied) = place(self.inner.clone(), target, copy).map_err(unserved)?;
        let s = stream
            .as_ref()
            .filter(|s| !s.is_none())
            .map(|s| s.extract::<i64>())
            .transpose()?;
        consumer_waits(t.device(), s)?;
        let versioned = max_version.is_some_and(|(major, _)| major >= 1);
        export_capsule(py, &t, versioned, copied)
    }

    /// numpy's conversion protocol: `np.asarray(t)` of host data is a view of the same memory
    /// (read-only data stays read-only); `dtype` or `copy=True` ask for a converted copy.
    /// Device data raises `BufferError`: move it with `Tensor.to('cpu')` first.
    #[pyo3(signature = (dtype=None, copy=None))]
    fn __array__<'py>(
        slf: &Bound<'py, Self>,
        dtype: Option<&Bound<'py, PyAny>>,
        copy: Option<bool>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let py = slf.py();
        let t = &slf.get().inner;
        if !t.device().is_host_accessible() {
            // dlpart moves CUDA data itself; other devices' data only their own library moves.
            let how = match t.device().kind {
                crate::DeviceType::Cuda => "call .to('cpu') first",
                _ => "copy it to host memory with its own library first",
            };
            return Err(PyBufferError::new_err(format!(
                "numpy holds host memory only: this tensor is on {}; {how}",
                t.device()
            )));
        }
        if let Some(name) = numpy_lacks(t.dtype()) {
            return Err(PyTypeError::new_err(name));
        }
        let numpy = py.import(intern!(py, "numpy"))?;
        let view = numpy.call_method1(intern!(py, "from_dlpack"), (slf,))?;
        if dtype.is_none() && copy != Some(true) {
            return Ok(view);
        }
        if copy == Some(false) {
            // numpy's contract: copy=False returns the same memory or raises ValueError.
            let want = numpy.call_method1(intern!(py, "dtype"), (dtype,))?;
            if want.eq(view.getattr(intern!(py, "dtype"))?)? {
                return Ok(view);
            }
            return Err(PyValueError::new_err(format!(
                "__array__(dtype={want}, copy=False): the tensor's dtype is {}, so a copy \
                 cannot be avoided",
                t.dtype()
            )));
        }
        let kwargs = pyo3::types::PyDict::new(py);
        kwargs.set_item(intern!(py, "copy"), copy != Some(false))?;
        let dtype = match dtype {
            Some(d) => d.clone(),
            None => view.getattr(intern!(py, "dtype"))?,
        };
        view.call_method(intern!(py, "astype"), (dtype,), Some(&kwargs))
    }

    fn __dlpack_device__(&self) -> (i32, i32) {
        self.inner.device().to_dlpack()
    }

    /// Pickles by value (host-accessible tensors only).
    fn __reduce__<'py>(
        &self,
        py: Python<'py>,
    ) -> PyResult<(Bound<'py, PyAny>, Bound<'py, PyTuple>)> {
        let t = &self.inner;
        if !t.device().is_host_accessible() {
            return Err(PyBufferError::new_err(format!(
                "cannot pickle a tensor on {}: move it to kDLCPU first",
                t.device()
            )));
        }
        let bytes = t
            .read_bytes("pickle", |b| PyBytes::new(py, b))
            .map_err(to_py)?;
        let f = py.import("dlpart._core")?.getattr("_tensor_from_bytes")?;
        let args = (
            bytes,
            PyTuple::new(py, t.shape())?,
            t.dtype().name(),
            // The bytes come back in plain host memory, whatever host memory they left.
            Device::CPU.to_string(),
            t.readonly(),
        );
        Ok((f, args.into_pyobject(py)?))
    }
}

/// Rebuilds a pickled tensor.
///
/// Everything is checked before anything is allocated: a pickle is untrusted input, and a
/// tiny one must not declare a shape whose allocation kills the process. The bytes land in
/// plain host memory, so only host device tags are accepted, and they come back as `kDLCPU`.
#[pyfunction]
pub fn _tensor_from_bytes(
    data: &[u8],
    #[pyo3(from_py_with = shape_arg)] shape: Vec<i64>,
    dtype: &str,
    device: &str,
    readonly: bool,
) -> PyResult<PyTensor> {
    let shape = non_negative("_tensor_from_bytes", "shape", &shape)?;
    let dtype: crate::DType = dtype.parse().map_err(to_py)?;
    let device: Device = device.parse().map_err(to_py)?;
    if !device.is_host_accessible() {
        return Err(PyValueError::new_err(format!(
            "a tensor rebuilt from bytes lives in host memory: device {device} is refused"
        )));
    }
    let t = Tensor::from_bytes(data, &shape, dtype)
        .and_then(|t| t.with_readonly(readonly))
        .map_err(to_py)?;
    Ok(PyTensor::new(t))
}

/// A `start` argument (of `Tensor.view`).
fn start_arg(obj: &Bound<'_, PyAny>) -> PyResult<Vec<i64>> {
    super::ints::ints(obj, "start", super::ints::Refusal::Value)
}

/// A `shape` argument (of `Tensor.view`, `split_points`, `_tensor_from_bytes`).
pub(super) fn shape_arg(obj: &Bound<'_, PyAny>) -> PyResult<Vec<i64>> {
    super::ints::ints(obj, "shape", super::ints::Refusal::Value)
}

/// Why numpy cannot hold elements of `dtype` (it has no bfloat16 or float8 types), or
/// `None` when it can.
pub(crate) fn numpy_lacks(dtype: crate::DType) -> Option<String> {
    let name = dtype.name();
    (name == "bfloat16" || name.starts_with("float8_")).then(|| {
        format!(
            "numpy has no {name} type: hand the tensor to torch or jax (which have one), or \
             convert it to float32 there first"
        )
    })
}

/// `axis` of the `ndim`-d array `what` (`"source"`, `"output"`, `"array"`) for `func`:
/// negative ones count from the end, as in numpy; one outside `[-ndim, ndim)` is a
/// `ValueError` saying so (pyo3 would raise a bare `OverflowError` below zero).
pub(crate) fn axis_arg(func: &str, axis: i64, ndim: usize, what: &str) -> PyResult<usize> {
    let a = if axis < 0 { axis + ndim as i64 } else { axis };
    match usize::try_from(a) {
        Ok(a) if a < ndim => Ok(a),
        _ if ndim == 0 => Err(PyValueError::new_err(format!(
            "{func}: the {what} is 0-d, so it has no axis {axis} (nor any other)"
        ))),
        _ => Err(PyValueError::new_err(format!(
            "{func}: axis {axis} is out of range for the {ndim}-d {what} (negative axes count \
             from the end, down to -{ndim})"
        ))),
    }
}

/// `values` as sizes or positions for `arg` of `func`, each non-negative: a negative one is a
/// `ValueError` saying which argument and why (pyo3 would raise a bare `OverflowError`).
pub(crate) fn non_negative(func: &str, arg: &str, values: &[i64]) -> PyResult<Vec<usize>> {
    values
        .iter()
        .map(|&v| usize::try_from(v))
        .collect::<Result<Vec<usize>, _>>()
        .map_err(|_| {
            PyValueError::new_err(format!(
                "{func}: {arg} must hold non-negative ints, not {}",
                tuple_string(values)
            ))
        })
}

/// Imports any DLPack producer (or a DLPack capsule) as a `dlpart.Tensor`, zero-copy when
/// possible.
///
/// `device` asks for the result on that device (the producer is asked to move it, through
/// `dl_device`, and where it does not, dlpart copies it); a device neither can place it on is
/// a `BufferError`, as the array API asks (for a device without dlpart kernels, kDLOneAPI,
/// with the `dlpart.BackendUnavailableError` every other move raises as its `__cause__`).
/// `copy=True` always copies, `copy=False` never does (raising `BufferError` naming both
/// devices where a copy would be needed, alike when the producer refused the move itself:
/// its refusal is then the `__cause__`), `None` copies only when it must. An array whose bytes are not in native
/// order (numpy's `>f4` on a little-endian host), which DLPack cannot carry, raises
/// `BufferError` naming its dtype and the conversion that makes it importable.
#[pyfunction]
#[pyo3(signature = (x, /, *, device=None, copy=None))]
pub fn from_dlpack(
    x: &Bound<'_, PyAny>,
    device: Option<&Bound<'_, PyAny>>,
    copy: Option<bool>,
) -> PyResult<PyTensor> {
    let target = match device {
        Some(d) if !d.is_none() => Some(import_device_arg(d)?),
        _ => None,
    };
    import(x, target, copy)
}

/// `from_dlpack` with the device already read.
pub(crate) fn import(
    x: &Bound<'_, PyAny>,
    target: Option<Device>,
    copy: Option<bool>,
) -> PyResult<PyTensor> {
    if let Ok(t) = x.cast::<PyTensor>() {
        let (t, _) = place(t.get().inner.clone(), target, copy)?;
        return Ok(PyTensor::new(t));
    }
    if is_producer(x)? {
        return import_producer(x, target, copy);
    }
    // SAFETY: type check only.
    if unsafe { pyo3::ffi::PyCapsule_CheckExact(x.as_ptr()) } == 0 {
        return Err(PyTypeError::new_err(format!(
            "from_dlpack: objects of type {} do not support DLPack (no __dlpack__ method)",
            x.get_type().name()?
        )));
    }
    let (t, flags) = consume_capsule(x)?;
    finish(t, flags, false, target, copy)
}

/// Whether `x` has a `__dlpack__` method. A numpy array has one: answered without a lookup
/// (with the interned name, a lookup and the bound method it makes cost about 0.05 us).
pub(crate) fn is_producer(x: &Bound<'_, PyAny>) -> PyResult<bool> {
    if is_numpy_array(x) {
        return Ok(true);
    }
    Ok(x.getattr_opt(intern!(x.py(), "__dlpack__"))?.is_some())
}

/// Applies what the producer did not: the copy rules and the move onto `target`.
fn finish(
    t: Tensor,
    flags: u64,
    asked: bool,
    target: Option<Device>,
    copy: Option<bool>,
) -> PyResult<PyTensor> {
    let producer_copied = flags & FLAG_IS_COPIED != 0;
    if copy == Some(false) && producer_copied {
        return Err(PyBufferError::new_err(
            "the producer copied the data although copy=False was requested",
        ));
    }
    if asked && (copy != Some(true) || producer_copied) && target.is_none_or(|d| d == t.device()) {
        return Ok(PyTensor::new(t));
    }
    // The producer ignored (or could not take) our keywords: finish the job here.
    let copy = if producer_copied { None } else { copy };
    let (t, _) = place(t, target, copy)?;
    Ok(PyTensor::new(t))
}

/// `numpy.ndarray`, once numpy is imported.
static NDARRAY: PyOnceLock<Py<PyType>> = PyOnceLock::new();

/// Whether `x` is exactly a `numpy.ndarray` (not a subclass, which may override the DLPack
/// methods). Never imports numpy: while it is not in `sys.modules` no array of it exists.
pub(crate) fn is_numpy_array(x: &Bound<'_, PyAny>) -> bool {
    exact_ndarray(x).is_some()
}

/// `numpy.ndarray` (cached once found) when numpy is loaded, else `None`.
fn ndarray_type(py: Python<'_>) -> Option<Bound<'_, PyType>> {
    match NDARRAY.get(py) {
        Some(t) => Some(t.bind(py).clone()),
        None => {
            let t = numpy_ndarray(py)?;
            Some(NDARRAY.get_or_init(py, || t.unbind()).bind(py).clone())
        }
    }
}

/// `numpy.ndarray` when `x` is exactly one, else `None`.
fn exact_ndarray<'py>(x: &Bound<'py, PyAny>) -> Option<Bound<'py, PyType>> {
    ndarray_type(x.py()).filter(|ty| x.get_type().is(ty))
}

/// Whether `x` is a `numpy.ndarray` or an instance of a subclass (whose `__dlpack__`, its
/// own or numpy's, takes only `stream=None`).
fn numpy_instance(x: &Bound<'_, PyAny>) -> bool {
    ndarray_type(x.py()).is_some_and(|ty| x.is_instance(&ty).unwrap_or(false))
}

/// `sys.modules["numpy"].ndarray` when numpy is loaded and it is the real one.
fn numpy_ndarray(py: Python<'_>) -> Option<Bound<'_, PyType>> {
    // SAFETY: with the GIL held, `PyImport_GetModuleDict` returns a borrowed reference to
    // `sys.modules` (never NULL after start-up); we take a new reference before using it.
    let modules =
        unsafe { Bound::from_borrowed_ptr_or_opt(py, pyo3::ffi::PyImport_GetModuleDict()) }?;
    let np = modules.get_item(intern!(py, "numpy")).ok()?;
    let t = np.getattr("ndarray").ok()?.cast_into::<PyType>().ok()?;
    let genuine = t.module().is_ok_and(|m| m == "numpy") && t.name().is_ok_and(|n| n == "ndarray");
    genuine.then_some(t)
}

/// The device `x.__dlpack_device__()` names, or `None` when `x` has no such method.
pub(crate) fn source_device(x: &Bound<'_, PyAny>) -> PyResult<Option<Device>> {
    let Some(method) = x.getattr_opt(intern!(x.py(), "__dlpack_device__"))? else {
        return Ok(None);
    };
    let named = method.call0()?;
    let of = || {
        format!(
            "{}.__dlpack_device__() returned {}",
            super::partitioned::type_name(x),
            super::partitioned::described(&named)
        )
    };
    let pair: (i32, i32) = named
        .extract()
        .map_err(|_| PyBufferError::new_err(format!("{}: not a (type, id) pair of ints", of())))?;
    Device::from_dlpack(pair.0, pair.1)
        .map(Some)
        .map_err(|e| PyBufferError::new_err(format!("{}: an unknown device: {e}", of())))
}

/// The producer's answer `e` to an import that asked it, through `dl_device`, to move its
/// data from `source` to `target`. A `BufferError` is its refusal of the move (numpy refuses
/// every device but its own), which dlpart then answers as it answers the same request of its
/// own tensors ([`place`]):
/// - with `copy=False`, where dlpart would take the data without a copy (host memory of any
///   kind read as `kDLCPU`), the data where it is, asked for again without `dl_device`, for
///   [`finish`] to relabel; otherwise the `BufferError` that names both devices;
/// - where dlpart can make the move, the data where it is, asked for again without
///   `dl_device`, for [`finish`] to move (the refusal stands if that call fails too);
/// - where it cannot, as one side is a device without dlpart kernels (kDLOneAPI), a
///   `BufferError` that says both, the `BackendUnavailableError` as its cause.
///
/// The producer's refusal is chained as the cause of dlpart's error. Anything else is
/// returned as it is.
fn after_refusal<'py>(
    x: &Bound<'py, PyAny>,
    e: PyErr,
    stream: Option<i64>,
    (source, target): (Device, Device),
    copy: Option<bool>,
) -> PyResult<Bound<'py, PyAny>> {
    let py = x.py();
    if !e.is_instance_of::<PyBufferError>(py) {
        return Err(e);
    }
    let here = |copy| {
        let kw = Keywords {
            dl_device: None,
            copy,
        };
        call_versioned(x, stream, kw)
    };
    if copy == Some(false) {
        if source.is_host_accessible() && target == Device::CPU {
            if let Ok(cap) = here(Some(false)) {
                return Ok(cap);
            }
        }
        let refused = copy_forbidden(source, target);
        refused.set_cause(py, Some(e));
        return Err(refused);
    }
    let unavailable = match crate::backend::check_kernels([source, target]) {
        Ok(()) => return here(None).map_err(|_| e),
        Err(unavailable) => unavailable,
    };
    let refused = PyBufferError::new_err(format!(
        "cannot place a tensor on {source} onto {target}: {}.__dlpack__ refused the move ({}), \
         and dlpart cannot make it: {unavailable}",
        super::partitioned::type_name(x),
        e.value(py)
    ));
    let cause = to_py(unavailable);
    cause.set_cause(py, Some(e));
    refused.set_cause(py, Some(cause));
    Err(refused)
}

/// Whether `e` is the `TypeError` a callable raises for keywords it does not take: CPython
/// says "unexpected keyword argument", "takes no keyword arguments" or "is an invalid keyword
/// argument", always with the word "keyword".
fn is_keyword_error(py: Python<'_>, e: &PyErr) -> bool {
    e.is_instance_of::<PyTypeError>(py)
        && e.value(py)
            .str()
            .is_ok_and(|m| m.to_string_lossy().contains("keyword"))
}

/// Imports the producer `x` (see [`is_producer`]): calls `x.__dlpack__` as DLPack >= 1.0
/// asks, falling back to the legacy call on `TypeError`, then applies what the producer did
/// not do of the device and copy requests.
///
/// The call goes through [`call_versioned`]: no keyword dict, no new strings (building the
/// dict from Rust strings and a new `(1, 3)` per call cost about 0.3 us per import; perf showed
/// string creation and hashing on top of a 4,096-array import loop), or, for an exact numpy
/// array imported as it is, through [`call_numpy`].
///
/// An array whose bytes are not in native order (numpy's `>f4` on a little-endian host), which
/// DLPack cannot carry, is a `BufferError` naming its dtype and the conversion that makes it
/// importable.
pub(crate) fn import_producer(
    x: &Bound<'_, PyAny>,
    target: Option<Device>,
    copy: Option<bool>,
) -> PyResult<PyTensor> {
    import_as_asked(x, target, copy).map_err(|e| super::ops::byte_order_refusal(x, e))
}

/// [`import_producer`] before a refusal is explained.
fn import_as_asked(
    x: &Bound<'_, PyAny>,
    target: Option<Device>,
    copy: Option<bool>,
) -> PyResult<PyTensor> {
    let py = x.py();
    // A numpy array's device is host memory whatever `__dlpack_device__` says (kDLCPU, or a
    // kDLCUDAHost/kDLROCMHost/kDLCUDAManaged buffer numpy imported): its stream is None either
    // way, and without a target no `dl_device` is passed. So the `__dlpack__` call below is the
    // one the answer would have led to, and the capsule names the device. Asking cost 0.2 us
    // of the 1.0 us a numpy import took.
    let numpy = if target.is_none() {
        exact_ndarray(x)
    } else {
        None
    };
    let source = if numpy.is_some() {
        None
    } else {
        source_device(x)?
    };
    let (stream, host_wait) = import_stream(x, source)?;
    // The move asked of the producer, if any.
    let moving = match (source, target) {
        (Some(s), Some(t)) if t != s => Some((s, t)),
        _ => None,
    };
    let dl_device = match moving {
        Some((_, t)) => Some(t.to_dlpack().into_pyobject(py)?.into_any()),
        None => None,
    };
    let kw = Keywords {
        dl_device: dl_device.as_ref(),
        copy,
    };
    // Only a TypeError about the keywords themselves means an older producer: any other
    // failure is the producer's answer, and calling it again would repeat its side effects.
    let first = match &numpy {
        Some(ndarray) if copy.is_none() => call_numpy(x, ndarray),
        _ => call_versioned(x, stream, kw),
    };
    // `ordered`: the producer was handed our stream (or needs none) and orders its work
    // before it.
    let (cap, asked, ordered) = match first {
        Ok(cap) => (cap, true, true),
        Err(e) if is_keyword_error(py, &e) => match call_legacy(x, stream) {
            Ok(cap) => (cap, false, true),
            Err(e2) if is_keyword_error(py, &e2) => {
                (x.call_method0(intern!(py, "__dlpack__"))?, false, false)
            }
            Err(e2) => return Err(e2),
        },
        Err(e) => match moving {
            Some(moving) => (after_refusal(x, e, stream, moving, copy)?, true, true),
            None => return Err(e),
        },
    };
    let (t, flags) = consume_capsule(&cap)?;
    if !ordered {
        follow_legacy_stream(t.device())?;
    }
    // Host-accessible memory CUDA work may still be writing: the producer ordered its work
    // before the legacy stream (or, taking no stream, queued it there); nothing reads the
    // memory before the host has waited for it.
    if let Some(b) = host_wait {
        b.host_wait_for(Some(1)).map_err(to_py)?;
    }
    finish(t, flags, asked, target, copy)
}
