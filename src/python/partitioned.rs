//! `dlpart._core._PartitionedArray`: the Rust [`PartitionedArray`] for the Python layer, and
//! the `__partitioned__` dict read into it and written from it.
//!
//! The Python class `dlpart.PartitionedArray` wraps this one and keeps only what needs Python:
//! handles resolved through the dict's `get`, the array-API namespace route for devices
//! without dlpart kernels, and the `Partition` objects made when `.partitions` is asked for.

use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use pyo3::exceptions::{PyBufferError, PyException, PyKeyError, PyMemoryError, PyValueError};
use pyo3::intern;
use pyo3::prelude::*;
use pyo3::types::{
    PyBool, PyByteArray, PyBytes, PyComplex, PyDict, PyFloat, PyFrozenSet, PyInt, PyList, PySet,
    PyString, PyTuple,
};

use crate::device::Device;
use crate::dtype::DType;
use crate::error::{tuple_string, Error};
use crate::grid::{inv, EntryTable, Grid};
use crate::layout::Layout;
use crate::partitioned::{
    contradicts, device_contradiction, stated_dtype_conflict, Data, Handle, Location,
    LocationTable, PartitionedArray,
};
use crate::plan::Plan;

use super::device::{device_arg, import_device_arg, target_device_arg, PyDevice};
use super::errors::{to_py, BackendUnavailableError, DeviceError, ProtocolError};
use super::ints::{self, Refusal};
use super::location::{framework_device, LocationReader};
use super::tensor::{
    axis_arg, import_producer, is_numpy_array, is_producer, non_negative, source_device, PyTensor,
};

/// A partitioned array held in Rust; see the Python class `dlpart.PartitionedArray`.
///
/// Fetching handles is the one change after construction, and it replaces the array
/// (copy-on-write): an operation works on the array as it was when it began, so a fetch in
/// another thread (while this one runs with the GIL released) neither waits for it nor
/// disturbs it.
#[pyclass(name = "_PartitionedArray", module = "dlpart._core", frozen)]
pub struct PyPartitioned {
    state: Mutex<Arc<PartitionedArray>>,
    /// For arrays read from a dict: each partition's place in the dict's order (by flat
    /// index), so that handles are fetched, and blamed, in the order the producer wrote them.
    order: Option<Vec<usize>>,
}

impl PyPartitioned {
    fn new(pa: PartitionedArray, order: Option<Vec<usize>>) -> Self {
        PyPartitioned {
            state: Mutex::new(Arc::new(pa)),
            order,
        }
    }

    /// The array's slot. The lock is held only to clone or replace the `Arc`, never across
    /// other work, so taking it with the GIL held cannot deadlock.
    fn slot(&self) -> MutexGuard<'_, Arc<PartitionedArray>> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The array as it is now: a method takes it once and works on that snapshot.
    pub(crate) fn inner(&self) -> Arc<PartitionedArray> {
        self.slot().clone()
    }
}

pub(super) fn wrap(inner: PartitionedArray) -> PyPartitioned {
    PyPartitioned::new(inner, None)
}

pub(super) fn type_name(obj: &Bound<'_, PyAny>) -> String {
    obj.get_type()
        .name()
        .map(|n| n.to_string())
        .unwrap_or_default()
}

/// `obj`'s repr for an error message; a user object whose `repr()` raises is named by its
/// type instead, so that its exception never escapes in place of the protocol error.
pub(super) fn described(obj: &Bound<'_, PyAny>) -> String {
    obj.repr().map_or_else(
        |_| format!("a {} whose repr() raised", type_name(obj)),
        |r| r.to_string(),
    )
}

fn ints(obj: &Bound<'_, PyAny>, key: &str, position: Option<&[i64]>) -> PyResult<Vec<i64>> {
    let mut out = Vec::new();
    ints_into(obj, key, position, &mut out)?;
    Ok(out)
}

/// Reads a tuple of ints (or one int, or any iterable of ints) into `out`, replacing its
/// contents: a dict reader reuses one buffer for every entry.
fn ints_into(
    obj: &Bound<'_, PyAny>,
    key: &str,
    position: Option<&[i64]>,
    out: &mut Vec<i64>,
) -> PyResult<()> {
    out.clear();
    // The exception of a user object (an `__index__`, an `__iter__` that raises), or of the
    // conversion itself, is the cause.
    let bad = |cause: Option<PyErr>| {
        let py = obj.py();
        if let Some(e) = cause.as_ref().filter(|e| fatal(py, e)) {
            return e.clone_ref(py);
        }
        let at = position
            .map(|p| format!(" at position {}", tuple_string(p)))
            .unwrap_or_default();
        let e = ProtocolError::new_err(format!(
            "__partitioned__[{key:?}]{at}: expected a tuple of ints, found {}",
            described(obj)
        ));
        e.set_cause(py, cause);
        e
    };
    let item = |x: &Bound<'_, PyAny>| -> PyResult<i64> {
        if x.is_instance_of::<PyBool>() {
            return Err(bad(None));
        }
        x.extract::<i64>().map_err(|e| bad(Some(e)))
    };
    if let Ok(t) = obj.cast::<PyTuple>() {
        for x in t.iter_borrowed() {
            // Exact ints (what every producer writes) are read directly: no bool check, no
            // `__index__` lookup; about half the cost of reading a 4,096-entry dict's starts
            // and shapes.
            if x.is_exact_instance_of::<PyInt>() {
                // SAFETY: `x` is a live exact int; `PyLong_AsLongLong` runs no Python code.
                let v = unsafe { pyo3::ffi::PyLong_AsLongLong(x.as_ptr()) };
                if v == -1 {
                    if let Some(e) = PyErr::take(obj.py()) {
                        return Err(bad(Some(e))); // does not fit an int64
                    }
                }
                out.push(v);
                continue;
            }
            out.push(item(&x)?);
        }
        return Ok(());
    }
    if obj.is_instance_of::<PyString>() || obj.is_instance_of::<PyBool>() {
        return Err(bad(None));
    }
    if let Ok(i) = obj.extract::<i64>() {
        out.push(i);
        return Ok(());
    }
    for x in obj.try_iter().map_err(|e| bad(Some(e)))? {
        out.push(item(&x.map_err(|e| bad(Some(e)))?)?);
    }
    Ok(())
}

/// A stated dtype: a name (`"float32"`), or what prints as one (a numpy dtype, a torch dtype
/// such as heat writes), or a scalar type named as one (`numpy.float32`), or what numpy
/// reads as a dtype when numpy is installed (`"<f4"`, Python's `float`); anything else is a
/// `ValueError` naming it.
fn stated_dtype(v: &Bound<'_, PyAny>) -> PyResult<DType> {
    let text = v.str()?.to_string();
    if let Ok(dt) = text.strip_prefix("torch.").unwrap_or(&text).parse() {
        return Ok(dt);
    }
    let name = v
        .getattr("__name__")
        .ok()
        .and_then(|n| n.extract::<String>().ok());
    // numpy's reading, in native byte order only (a DLPack tensor is native).
    let numpy = || -> PyResult<Option<DType>> {
        let dt = v.py().import("numpy")?.getattr("dtype")?.call1((v,))?;
        let name: String = dt.getattr("name")?.extract()?;
        Ok(dt
            .getattr("isnative")?
            .is_truthy()?
            .then(|| name.parse().ok())
            .flatten())
    };
    let by_name = match name.as_deref() {
        Some("bool_") => Some(DType::Bool),
        Some(n) => n.parse().ok(),
        None => None,
    };
    by_name.or_else(|| numpy().ok().flatten()).ok_or_else(|| {
        PyValueError::new_err(format!(
            "dtype {} is not one dlpart knows (a name such as 'float32', a numpy or torch \
                 dtype)",
            described(v)
        ))
    })
}

/// `e`, raised while `key` of the entry at `position` was read (by a producer's `__dlpack__`, a
/// `__hash__`, a `__str__`, ...), as a dlpart error that names both, with `e` as its cause.
///
/// A `ProtocolError` names them already and a `MemoryError` or a `BaseException` that is no
/// `Exception` (`KeyboardInterrupt`) must stay what it is: they pass through. The DLPack
/// failures of `data` keep their class (`BufferError`, `DeviceError`, ...); everything else is
/// a `ProtocolError`.
fn in_entry(py: Python<'_>, e: PyErr, key: &str, position: &[usize]) -> PyErr {
    let at = format!(
        "__partitioned__[\"partitions\"] at position {}: {key:?}",
        tuple_string(position)
    );
    blamed(py, e, &at, key == "data")
}

/// `e`, raised by a user object while what `at` names was read (`__partitioned__["shape"]`),
/// as a `ProtocolError` saying so, with `e` as its cause; the DLPack failures of `data` keep
/// their class. What [`in_entry`] lets pass, passes.
fn blamed(py: Python<'_>, e: PyErr, at: &str, data: bool) -> PyErr {
    if fatal(py, &e) || e.is_instance_of::<ProtocolError>(py) {
        return e;
    }
    let msg = format!("{at}: {}", exception_text(py, &e));
    let keep = data
        && (e.is_instance_of::<PyBufferError>(py)
            || e.is_instance_of::<DeviceError>(py)
            || e.is_instance_of::<BackendUnavailableError>(py));
    let wrapped = if keep {
        PyErr::from_type(e.get_type(py), msg)
    } else {
        ProtocolError::new_err(msg)
    };
    wrapped.set_cause(py, Some(e));
    wrapped
}

/// Whether `e` must reach the caller as it is: a `MemoryError`, or a `BaseException` that is
/// no `Exception` (`KeyboardInterrupt`).
fn fatal(py: Python<'_>, e: &PyErr) -> bool {
    !e.is_instance_of::<PyException>(py) || e.is_instance_of::<PyMemoryError>(py)
}

/// `e` as a message names it: `RuntimeError: what it says`.
fn exception_text(py: Python<'_>, e: &PyErr) -> String {
    let what = e.value(py).str().map_or_else(
        |_| "(an exception whose str() raised)".to_string(),
        |s| s.to_string_lossy().into_owned(),
    );
    format!("{}: {what}", type_name(e.value(py).as_any()))
}

/// Whether `obj` is a plain Python value (a string, a number, a container), which can be
/// neither a DLPack array nor a handle.
fn is_plain_value(obj: &Bound<'_, PyAny>) -> bool {
    obj.is_instance_of::<PyString>()
        || obj.is_instance_of::<PyBytes>()
        || obj.is_instance_of::<PyByteArray>()
        || obj.is_instance_of::<PyInt>()
        || obj.is_instance_of::<PyFloat>()
        || obj.is_instance_of::<PyComplex>()
        || obj.is_instance_of::<PyDict>()
        || obj.is_instance_of::<PyList>()
        || obj.is_instance_of::<PyTuple>()
        || obj.is_instance_of::<PySet>()
        || obj.is_instance_of::<PyFrozenSet>()
}

fn missing_key(key: &str) -> PyErr {
    ProtocolError::new_err(format!("__partitioned__ is missing the key {key:?}"))
}

/// `d[key]`, or `None` when `d` has no such key.
///
/// A dict, a subclass's instance too, is read through the dict API, as `dict.get(d, key)`
/// reads it: the items it holds, never what an overridden `__getitem__` or `get` would
/// answer. So no method of a subclass runs (a `defaultdict` would insert a default for an
/// absent optional key), and since the Python layer takes `get` from this reader, not from
/// the dict, every part of dlpart sees the same values. Any other mapping is read through its
/// `__getitem__`, a `KeyError` meaning absent. An exception a user object raises meanwhile
/// (the mapping's `__getitem__`, a stored key's `__eq__`) is a `ProtocolError` naming the key,
/// with that exception as its cause.
fn dict_item<'py>(
    d: &Bound<'py, PyAny>,
    key: &Bound<'py, PyString>,
) -> PyResult<Option<Bound<'py, PyAny>>> {
    let py = d.py();
    let found = match d.cast::<PyDict>() {
        Ok(dict) => dict.get_item(key),
        Err(_) => match d.get_item(key) {
            Ok(v) => Ok(Some(v)),
            Err(e) if e.is_instance_of::<PyKeyError>(py) => Ok(None),
            Err(e) => Err(e),
        },
    };
    found.map_err(|e| {
        let at = format!("__partitioned__[{:?}]", key.to_string_lossy());
        blamed(py, e, &at, false)
    })
}

/// The optional key `key` of the dict (`None` when absent or `None`); see [`dict_item`].
fn optional<'py>(
    d: &Bound<'py, PyAny>,
    key: &Bound<'py, PyString>,
) -> PyResult<Option<Bound<'py, PyAny>>> {
    Ok(dict_item(d, key)?.filter(|v| !v.is_none()))
}

/// What a dict consumer does with each partition's data.
#[derive(Clone, Copy)]
enum Import {
    /// Check the dict (`validate`): data held here is imported as it is (zero-copy) to check
    /// its dtype, shape and device against the dict, then released; handles are not
    /// resolved. A failure to import is listed with the dict's other problems, not raised.
    Check,
    /// Import arrays through DLPack (onto `device`, copying as `copy` says).
    Yes {
        device: Option<Device>,
        copy: Option<bool>,
    },
}

/// A dict as [`read_dict`] read it.
struct ReadDict<'py> {
    array: PartitionedArray,
    /// The array-API namespace of the first partition on a device without dlpart kernels.
    namespace: Option<Py<PyAny>>,
    /// Each partition's place in the dict's order, by flat index.
    order: Vec<usize>,
    /// The dict's `get` (checked callable), as this reader read it.
    get: Option<Bound<'py, PyAny>>,
    /// The first array imported (in the dict's order): its producer's framework is the one
    /// data goes back out in.
    first: Option<Bound<'py, PyAny>>,
}

/// Reads the dict's grid (invariants 1-5), then every entry's data and locations, into the
/// model (invariants 6-10).
///
/// The problems of the data (6, 7, 9, and for [`Import::Check`] a failure to import) and of
/// `locals` (10) are listed together, as those of the grid are; a key that cannot be read at
/// all, a malformed location or dtype statement, stops the reading where it is met.
///
/// Keys are interned Python strings: looking entries up by Rust `&str` made a new Python
/// string, hashed it, and dropped it for each of the seven lookups per entry. Positions,
/// starts and shapes go into one [`EntryTable`] through reused buffers, not three `Vec`s
/// per entry.
fn read_dict<'py>(
    py: Python<'py>,
    d: &Bound<'py, PyAny>,
    import: Import,
) -> PyResult<ReadDict<'py>> {
    let get = |key: &Bound<'py, PyString>| -> PyResult<Bound<'py, PyAny>> {
        dict_item(d, key)?.ok_or_else(|| missing_key(&key.to_string_lossy()))
    };
    let shape = ints(&get(intern!(py, "shape"))?, "shape", None)?;
    let tiling = ints(
        &get(intern!(py, "partition_tiling"))?,
        "partition_tiling",
        None,
    )?;
    let parts = get(intern!(py, "partitions"))?;
    let parts = parts.cast::<PyDict>().map_err(|_| {
        ProtocolError::new_err(format!(
            "__partitioned__[\"partitions\"]: expected a dict, found {}",
            type_name(&parts)
        ))
    })?;
    // A snapshot: the mapping may change while its keys are read (a key's `__index__`).
    // Collecting the pairs runs no Python code, so nothing can change the dict meanwhile; it
    // makes no `(key, value)` tuple per entry, unlike `items()`.
    let items: Vec<(Bound<'py, PyAny>, Bound<'py, PyAny>)> = parts.iter().collect();
    let (k_start, k_shape, k_data) = (
        intern!(py, "start"),
        intern!(py, "shape"),
        intern!(py, "data"),
    );
    let mut table = EntryTable::with_capacity(items.len(), shape.len());
    let (mut pos, mut start, mut pshape) = (Vec::new(), Vec::new(), Vec::new());
    let (k_device, k_location, k_dtype) = (
        intern!(py, "device"),
        intern!(py, "location"),
        intern!(py, "dtype"),
    );
    // Per entry, in the dict's order: its values, looked up while the entry is in cache.
    let mut values: Vec<EntryValues<'py>> = Vec::with_capacity(items.len());
    let mut lookup_errors = LookupErrors::new();
    for (key, entry) in items {
        ints_into(&key, "partitions", None, &mut pos)?;
        let at = || tuple_string(&pos);
        let entry = match entry.cast_into::<PyDict>() {
            Ok(e) => e,
            Err(e) => {
                let found = type_name(&e.into_inner());
                return Err(ProtocolError::new_err(format!(
                    "__partitioned__[\"partitions\"] at position {}: expected a dict, found {found}",
                    at()
                )));
            }
        };
        let field = |k: &Bound<'py, PyString>| -> PyResult<Bound<'py, PyAny>> {
            entry.get_item(k)?.ok_or_else(|| {
                ProtocolError::new_err(format!(
                    "__partitioned__[\"partitions\"] at position {}: missing {:?}",
                    at(),
                    k.to_string_lossy()
                ))
            })
        };
        ints_into(&field(k_start)?, "start", Some(&pos), &mut start)?;
        ints_into(&field(k_shape)?, "shape", Some(&pos), &mut pshape)?;
        let data = field(k_data)?;
        table.push(&pos, &start, &pshape);
        values.push(EntryValues::read(
            values.len(),
            &entry,
            data,
            [k_location, k_device, k_dtype],
            &mut lookup_errors,
        ));
    }
    let grid = py
        .detach(|| Grid::from_table(&shape, &tiling, &table))
        .map_err(to_py)?;
    let locals = match optional(d, intern!(py, "locals"))? {
        None => None,
        Some(l) => Some(read_locals(&l, &grid)?),
    };
    let get = optional(d, intern!(py, "get"))?;
    if let Some(g) = &get {
        if !g.is_callable() {
            return Err(ProtocolError::new_err(format!(
                "__partitioned__[\"get\"]: expected a callable, found {}",
                type_name(g)
            )));
        }
    }
    let check = matches!(import, Import::Check);
    let (target, copy) = match import {
        Import::Yes { device, copy } => (device, copy),
        Import::Check => (None, None),
    };
    let n = grid.num_partitions();
    // The grid checked that the entries name every position once: `n` entries. Data is
    // collected in the dict's order and put in C order at the end (nothing to do for the
    // usual dict, already in C order): filling a C-order Vec first would write every
    // partition's tensor twice, and at 4,096 partitions that is cache misses.
    let mut data: Vec<Data> = Vec::with_capacity(n);
    let mut locations = LocationTable::empty(n, n);
    let mut namespace = None;
    // The last device found to have dlpart kernels: asking `backend_for` makes a backend.
    let mut native: Option<Device> = None;
    // The dtype the first entry stating one states, where, and the object it was read from
    // (later entries mostly state the same object: it is not read again).
    let mut stated: Option<(DType, Vec<usize>, Bound<'py, PyAny>)> = None;
    // The first partition imported (flat index), its dtype and the object it came from.
    let mut first_data: Option<(usize, DType, Bound<'py, PyAny>)> = None;
    // Problems of the data, by flat index, listed with those `PartitionedArray::new_in_order`
    // finds; and the exception of the first import that failed (`validate`), chained as their
    // cause.
    let mut problems: Vec<(usize, Error)> = Vec::new();
    let mut first_failure: Option<PyErr> = None;
    let mut order = vec![0usize; n];
    let mut reader = LocationReader::default();
    // By flat index, for data the locations contradict, the device its producer reports
    // (`__dlpack_device__`) where that is not the device of its capsule: invariant 9 accepts
    // a location naming it.
    let mut reported: Vec<(usize, Device)> = Vec::new();
    let me = Some(i64::from(std::process::id()));
    // The grid checked every position: in range, each once.
    let mut position = vec![0usize; grid.ndim()];
    // Consumed as read: each value is released while it is in cache.
    for (k, values) in values.into_iter().enumerate() {
        let EntryValues {
            data: obj,
            location,
            device: device_key,
            dtype: dtype_value,
            more,
        } = values;
        let obj = &obj;
        for (p, &i) in position.iter_mut().zip(table.get(k).0) {
            *p = i as usize;
        }
        let position = position.as_slice();
        let flat = grid.flat_index(position).map_err(to_py)?;
        order[flat] = k;
        lookup_error(&mut lookup_errors, k, "location")
            .map_err(|e| in_entry(py, e, "location", position))?;
        lookup_error(&mut lookup_errors, k, "device")
            .map_err(|e| in_entry(py, e, "device", position))?;
        let extra = framework_device(device_key.as_ref(), "device", position)
            .map_err(|e| in_entry(py, e, "device", position))?;
        let mut fallback = extra.unwrap_or(Device::CPU);
        let mut moved = false;
        let mut imported_on = None;
        let mut datum = Data::Remote;
        // The device of data `validate` could not import, as its `__dlpack_device__` names
        // it: checked against the locations (invariant 9) all the same.
        let mut unimported_on = None;
        if !obj.is_none() {
            // `validate` lists what keeps data from being imported; `from_partitioned`
            // raises it.
            let mut failed = None;
            let producer = match is_producer(obj) {
                Ok(p) => p,
                Err(e) if check && !fatal(py, &e) => {
                    failed = Some(e);
                    true
                }
                Err(e) => return Err(in_entry(py, e, "data", position)),
            };
            // Arrays first: the eleven type checks of a plain value are for what is left.
            if !producer && !is_numpy_array(obj) && is_plain_value(obj) {
                return Err(ProtocolError::new_err(format!(
                    "__partitioned__[\"partitions\"] at position {}: \"data\" must be a DLPack \
                     array, None or a handle (a Dask future, a Ray ObjectRef, ...), found {}",
                    tuple_string(position),
                    type_name(obj)
                )));
            }
            if producer {
                let imported = match failed {
                    Some(e) => Err(e),
                    None => import_producer(obj, target, copy),
                };
                match imported {
                    Ok(t) => {
                        let t = t.inner;
                        fallback = t.device();
                        imported_on = Some(t.device());
                        moved = target.is_some();
                        let kernels = || {
                            native == Some(t.device())
                                || crate::backend::backend_for(t.device()).is_ok()
                        };
                        // `validate` keeps no array, so it needs no namespace.
                        if check || namespace.is_some() || kernels() {
                            native = Some(t.device());
                        } else if let Ok(ns) = obj.getattr("__array_namespace__") {
                            let ns = ns.call0().map_err(|e| in_entry(py, e, "data", position))?;
                            namespace = Some(ns.unbind());
                        }
                        if first_data.is_none() {
                            first_data = Some((flat, t.dtype(), obj.clone()));
                        }
                        datum = Data::Tensor(t);
                    }
                    Err(e) if check && !fatal(py, &e) => {
                        let found = format!("\"data\": {}", exception_text(py, &e));
                        let problem = Error::protocol("partitions", Some(position), found, None);
                        problems.push((flat, problem));
                        first_failure.get_or_insert(e);
                        match source_device(obj) {
                            Ok(on) => unimported_on = on,
                            Err(e) if fatal(py, &e) => return Err(e),
                            Err(_) => {} // its own problem, listed above
                        }
                        if let Some(on) = unimported_on {
                            fallback = on;
                        }
                    }
                    Err(e) => return Err(in_entry(py, e, "data", position)),
                }
            } else if !check {
                datum = Data::Handle(Handle::new(obj.clone().unbind()));
            }
        }
        data.push(datum);
        if !moved {
            // Data moved here by the import is located by its tensor.
            locations
                .set_with(flat, |all| {
                    reader.read(location.as_ref(), position, fallback, all)
                })
                .map_err(|e| in_entry(py, e, "location", position))?;
        }
        if let Some(on) = imported_on.filter(|_| !moved) {
            if let Some(r) = reported_device(obj, locations.get(flat), me, on)? {
                reported.push((flat, r));
            }
        }
        if let Some(on) = unimported_on {
            if let Some(why) = device_contradiction(locations.get(flat), on) {
                let problem = Error::protocol("location", Some(position), why, Some(inv::DEVICE));
                problems.push((flat, problem));
            }
        }
        if more {
            let dtype = || -> PyResult<Option<(DType, Bound<'py, PyAny>)>> {
                lookup_error(&mut lookup_errors, k, "dtype")?;
                let Some(dt) = dtype_value.filter(|v| !v.is_none()) else {
                    return Ok(None);
                };
                match &stated {
                    Some((_, _, first)) if first.is(&dt) => Ok(None),
                    _ => Ok(Some((stated_dtype(&dt)?, dt))),
                }
            };
            match dtype().map_err(|e| in_entry(py, e, "dtype", position))? {
                None => {}
                Some((dt, obj)) => match &stated {
                    None => stated = Some((dt, position.to_vec(), obj)),
                    Some((first, at, _)) if *first != dt => {
                        let found = format!(
                            "\"dtype\": dtype {dt} differs from {first}, stated at {}",
                            tuple_string(at)
                        );
                        let problem =
                            Error::protocol("partitions", Some(position), found, Some(inv::DTYPE));
                        problems.push((flat, problem));
                    }
                    Some(_) => {}
                },
            }
        }
    }
    // A statement that contradicts the data, listed with the data's own problems.
    if let (Some((dt, at, _)), Some((_, data_dtype, _))) = (&stated, &first_data) {
        if dt != data_dtype {
            let flat = grid.flat_index(at).map_err(to_py)?;
            problems.push((flat, stated_dtype_conflict(*dt, *data_dtype, at)));
        }
    }
    problems.sort_by_key(|(flat, _)| *flat); // stable: a partition's in the order found
    let data = in_c_order(data, &order);
    let (first_flat, first) = match first_data {
        Some((flat, _, obj)) => (Some(flat), Some(obj)),
        None => (None, None),
    };
    reported.sort_unstable_by_key(|&(flat, _)| flat);
    let mut array = PartitionedArray::new_in_order(
        grid, data, locations, locals, first_flat, problems, &reported,
    )
    .map_err(|e| {
        let e = to_py(e);
        if let Some(cause) = first_failure {
            e.set_cause(py, Some(cause));
        }
        e
    })?;
    if let Some((dt, at, _)) = stated {
        array = array.with_dtype_stated_at(dt, Some(&at)).map_err(to_py)?;
    }
    Ok(ReadDict {
        array,
        namespace,
        order,
        get,
        first,
    })
}

/// An entry's values beyond its start and shape, looked up when the entry is first read,
/// for the second pass (after the grid is checked; no data is imported before). Looking them
/// up then, while the entry's dict is in cache, instead of in the second pass saves cache
/// misses. Kept small (a lookup error, which needs a key whose `__eq__` raises, goes to
/// [`LookupErrors`]) for the same reason.
struct EntryValues<'py> {
    data: Bound<'py, PyAny>,
    location: Option<Bound<'py, PyAny>>,
    device: Option<Bound<'py, PyAny>>,
    dtype: Option<Bound<'py, PyAny>>,
    /// Whether the entry has keys beyond start, shape, data and location.
    more: bool,
}

/// Lookup errors of [`EntryValues::read`]: entry, key and error, in the order they happened.
type LookupErrors = std::collections::VecDeque<(usize, &'static str, PyErr)>;

impl<'py> EntryValues<'py> {
    /// Entry `k`'s values; `keys` are the interned `location`, `device` and `dtype`.
    fn read(
        k: usize,
        entry: &Bound<'py, PyDict>,
        data: Bound<'py, PyAny>,
        [location, device, dtype]: [&Bound<'py, PyString>; 3],
        errors: &mut LookupErrors,
    ) -> Self {
        let mut get = |key: &Bound<'py, PyString>, name: &'static str| {
            entry.get_item(key).unwrap_or_else(|e| {
                errors.push_back((k, name, e));
                None
            })
        };
        let location = get(location, "location");
        // An entry of only start, shape, data (all checked) and location has no `device` or
        // `dtype` key to look up: two of six lookups per entry saved for draft-2 producers,
        // dlpart's own dicts among them. (A location whose lookup failed is reported first.)
        let more = entry.len() > 3 + usize::from(location.is_some());
        let (device, dtype) = match more {
            true => (get(device, "device"), get(dtype, "dtype")),
            false => (None, None),
        };
        EntryValues {
            data,
            location,
            device,
            dtype,
            more,
        }
    }
}

/// The error of looking up `key` in entry `k`, if [`EntryValues::read`] met one.
fn lookup_error(errors: &mut LookupErrors, k: usize, key: &str) -> PyResult<()> {
    // Those of earlier entries that were not needed (a dtype after one was found).
    while errors.front().is_some_and(|(at, _, _)| *at < k) {
        errors.pop_front();
    }
    match errors.front() {
        Some((at, name, _)) if *at == k && *name == key => {
            Err(errors.pop_front().expect("just seen").2)
        }
        _ => Ok(()),
    }
}

/// `data` (entry `k` of the dict at `k`) in C order of positions, given `order[flat] = k`.
fn in_c_order(data: Vec<Data>, order: &[usize]) -> Vec<Data> {
    if order.iter().enumerate().all(|(flat, &k)| flat == k) {
        return data;
    }
    let mut slots: Vec<Option<Data>> = data.into_iter().map(Some).collect();
    order
        .iter()
        .map(|&k| {
            slots[k]
                .take()
                .expect("the grid checked that each position is named once")
        })
        .collect()
}

fn read_locals(value: &Bound<'_, PyAny>, grid: &Grid) -> PyResult<Vec<Vec<usize>>> {
    if !(value.is_instance_of::<PyList>() || value.is_instance_of::<PyTuple>()) {
        return Err(ProtocolError::new_err(format!(
            "__partitioned__[\"locals\"]: expected a list of positions, found {}",
            described(value)
        )));
    }
    let tiling = grid.tiling();
    let mut seen = std::collections::HashSet::new();
    value
        .try_iter()?
        .map(|p| {
            let pos = ints(&p?, "locals", None)?;
            let inside = pos.len() == tiling.len()
                && pos
                    .iter()
                    .zip(&tiling)
                    .all(|(&i, &n)| i >= 0 && (i as usize) < n);
            if !inside {
                return Err(to_py(Error::protocol(
                    "locals",
                    None,
                    format!(
                        "position {} is outside partition_tiling {}",
                        tuple_string(&pos),
                        tuple_string(&tiling)
                    ),
                    Some(inv::LOCALS),
                )));
            }
            let pos: Vec<usize> = pos.into_iter().map(|i| i as usize).collect();
            if !seen.insert(pos.clone()) {
                return Err(to_py(Error::protocol(
                    "locals",
                    Some(&pos),
                    "listed twice",
                    Some(inv::LOCALS),
                )));
            }
            Ok(pos)
        })
        .collect()
}

/// Checks a `__partitioned__` dict: its structure, then the data held here, imported as it is
/// (zero-copy) and released (see [`Import::Check`]).
#[pyfunction]
fn _validate_dict(py: Python<'_>, d: &Bound<'_, PyAny>) -> PyResult<()> {
    read_dict(py, d, Import::Check).map(drop)
}

/// Split points per axis for `shape`: `tiling` cuts each axis like `numpy.array_split`,
/// `splits` are checked as given. Exactly one of them.
#[pyfunction]
#[pyo3(signature = (shape, tiling=None, *, splits=None))]
fn split_points(
    #[pyo3(from_py_with = super::tensor::shape_arg)] shape: Vec<i64>,
    #[pyo3(from_py_with = tiling_arg)] tiling: Option<Vec<i64>>,
    #[pyo3(from_py_with = splits_arg)] splits: Option<Vec<Vec<usize>>>,
) -> PyResult<Vec<Vec<usize>>> {
    let shape = non_negative("split_points", "shape", &shape)?;
    let grid = match (tiling, splits) {
        (Some(t), None) => Grid::even(&shape, &non_negative("split_points", "tiling", &t)?),
        (None, Some(s)) => Grid::from_splits(&shape, s),
        (Some(_), Some(_)) => {
            return Err(PyValueError::new_err(
                "split_points takes tiling or splits, not both",
            ))
        }
        (None, None) => return Err(PyValueError::new_err("split_points needs tiling or splits")),
    };
    Ok(grid.map_err(to_py)?.splits().to_vec())
}

/// A `tiling` argument (of `split_points`), or None.
fn tiling_arg(obj: &Bound<'_, PyAny>) -> PyResult<Option<Vec<i64>>> {
    ints::optional(obj, |t| ints::ints(t, "tiling", Refusal::Value))
}

/// A layout's `tiling` (of `_PartitionedArray.partition`, `target` and `repartition`, and
/// of `_spmd_repartition`), or None.
pub(super) fn layout_tiling_arg(obj: &Bound<'_, PyAny>) -> PyResult<Option<Vec<usize>>> {
    ints::optional(obj, |t| ints::ints(t, "tiling", Refusal::Value))
}

/// A layout's `process_grid` (of `target`, `repartition`, `_spmd_repartition`), or None.
pub(super) fn process_grid_arg(obj: &Bound<'_, PyAny>) -> PyResult<Option<Vec<usize>>> {
    ints::optional(obj, |t| ints::ints(t, "process_grid", Refusal::Value))
}

/// A `splits` argument (of `split_points`, `_PartitionedArray.from_parts`, a layout's), or
/// None.
pub(super) fn splits_arg(obj: &Bound<'_, PyAny>) -> PyResult<Option<Vec<Vec<usize>>>> {
    ints::optional(obj, |s| ints::int_lists(s, "splits", Refusal::Value))
}

/// The `positions` of `_PartitionedArray.pending`, or None.
fn positions_arg(obj: &Bound<'_, PyAny>) -> PyResult<Option<Vec<Vec<usize>>>> {
    ints::optional(obj, |p| ints::int_lists(p, "positions", Refusal::Index))
}

/// The `flats` of `_PartitionedArray.set_fetched`: flat indices of partitions.
fn flats_arg(obj: &Bound<'_, PyAny>) -> PyResult<Vec<usize>> {
    ints::ints(obj, "flats", Refusal::Index)
}

/// The `dst_splits` of `_PartitionedArray.plan_ops` and `_plan_stats`.
pub(super) fn dst_splits_arg(obj: &Bound<'_, PyAny>) -> PyResult<Vec<Vec<usize>>> {
    ints::int_lists(obj, "dst_splits", Refusal::Value)
}

/// The `rank` of `_PartitionedArray.to_dict`, or None.
fn rank_arg(obj: &Bound<'_, PyAny>) -> PyResult<Option<i64>> {
    ints::optional(obj, |r| ints::int(r, "rank", Refusal::Value))
}

/// The `shape` of `_PartitionedArray.from_parts` and `_plan_stats`.
pub(super) fn sizes_arg(obj: &Bound<'_, PyAny>) -> PyResult<Vec<usize>> {
    ints::ints(obj, "shape", Refusal::Value)
}

/// The `splits` of `_PartitionedArray.from_parts`.
fn split_lists_arg(obj: &Bound<'_, PyAny>) -> PyResult<Vec<Vec<usize>>> {
    ints::int_lists(obj, "splits", Refusal::Value)
}

/// The `locals` of `_PartitionedArray.from_parts`, or None.
fn locals_arg(obj: &Bound<'_, PyAny>) -> PyResult<Option<Vec<Vec<usize>>>> {
    ints::optional(obj, |l| ints::int_lists(l, "locals", Refusal::Value))
}

/// One partition of `_PartitionedArray.from_parts`: `(position, start, shape, tensor, handle,
/// locations)`, locations as `(host, pid, device, rank)`.
type Part<'py> = (
    Vec<usize>,
    Vec<usize>,
    Vec<usize>,
    Option<PyTensor>,
    Option<Py<PyAny>>,
    Vec<(Option<String>, Option<i64>, Bound<'py, PyAny>, Option<i64>)>,
);

/// The `parts` of `_PartitionedArray.from_parts` (what `PartitionedArray(shape, splits,
/// partitions)` gives it): an int out of range is named by the partition's position, the
/// key of its entry in `partitions`.
fn parts_arg<'py>(obj: &Bound<'py, PyAny>) -> PyResult<Vec<Part<'py>>> {
    ints::located(obj.extract(), obj.py(), || {
        for part in obj.try_iter()? {
            let part = part?;
            let part = part.cast::<PyTuple>()?;
            let position = part.get_item(0)?;
            let at = format!("partitions[{}]", described(&position));
            ints::ints::<usize>(&position, &format!("{at}.position"), Refusal::Index)?;
            ints::ints::<usize>(&part.get_item(1)?, &format!("{at}.start"), Refusal::Value)?;
            ints::ints::<usize>(&part.get_item(2)?, &format!("{at}.shape"), Refusal::Value)?;
            for (k, location) in part.get_item(5)?.try_iter()?.enumerate() {
                let location = location?;
                let location = location.cast::<PyTuple>()?;
                for (i, field) in [(1, "pid"), (3, "rank")] {
                    let v = location.get_item(i)?;
                    if !v.is_none() {
                        let name = format!("{at}.locations[{k}].{field}");
                        ints::int::<i64>(&v, &name, Refusal::Value)?;
                    }
                }
            }
        }
        Ok(())
    })
}

/// The target layout named by the Python `repartition` arguments.
pub(super) fn layout_arg(
    tiling: Option<Vec<usize>>,
    splits: Option<Vec<Vec<usize>>>,
    block_cyclic: Option<&Bound<'_, PyAny>>,
    devices: Option<&Bound<'_, PyAny>>,
    process_grid: Option<Vec<usize>>,
    ndim: usize,
) -> PyResult<Layout> {
    let given: Vec<&str> = [
        ("tiling", tiling.is_some()),
        ("splits", splits.is_some()),
        ("block_cyclic", block_cyclic.is_some()),
    ]
    .iter()
    .filter(|(_, g)| *g)
    .map(|(n, _)| *n)
    .collect();
    if given.len() != 1 {
        return Err(PyValueError::new_err(format!(
            "repartition takes exactly one of tiling, splits, block_cyclic; got {given:?}"
        )));
    }
    let list = devices
        .filter(|d| d.is_instance_of::<PyList>())
        .map(|d| {
            d.try_iter()?
                .map(|x| target_device_arg(&x?))
                .collect::<PyResult<Vec<Device>>>()
        })
        .transpose()?;
    let one = match (devices, &list) {
        (Some(d), None) => Some(target_device_arg(d)?),
        _ => None,
    };
    let layout = if let Some(b) = block_cyclic {
        let Some(list) = list else {
            return Err(PyValueError::new_err(
                "block_cyclic needs devices=[...], the devices the blocks are dealt to",
            ));
        };
        // One block size for every axis (an int, anything with `__index__`), or one per axis.
        let block: Vec<usize> = match b.try_iter() {
            Err(_) => vec![ints::int(b, "block_cyclic", Refusal::Value)?; ndim],
            Ok(_) => ints::ints(b, "block_cyclic", Refusal::Value)?,
        };
        Layout::block_cyclic(&block, list)
    } else {
        let base = match (tiling, splits) {
            (Some(t), _) => Layout::tiling(&t),
            (_, Some(s)) => Layout::splits(s),
            _ => unreachable!("exactly one layout was given"),
        };
        match (one, list) {
            (Some(d), _) => base.on(d),
            (_, Some(l)) if process_grid.is_some() => base.dealt(l),
            (_, Some(l)) => base.devices(l),
            _ => base,
        }
    };
    Ok(match process_grid {
        Some(pg) => layout.process_grid(&pg),
        None => layout,
    })
}

#[pymethods]
impl PyPartitioned {
    /// Reads a `__partitioned__` dict, importing arrays through DLPack (onto `device`, as
    /// `copy` says) and keeping handles as handles. Returns the array, the array-API
    /// namespace of partitions on devices without dlpart kernels (or None), the dict's `get`
    /// (or None) and the first array imported (or None): the Python layer reads nothing of the
    /// dict itself, so that it sees what this reader saw.
    #[staticmethod]
    #[pyo3(signature = (d, device=None, copy=None))]
    #[allow(clippy::type_complexity)]
    fn from_dict<'py>(
        py: Python<'py>,
        d: &Bound<'py, PyAny>,
        device: Option<&Bound<'py, PyAny>>,
        copy: Option<bool>,
    ) -> PyResult<(
        Self,
        Option<Py<PyAny>>,
        Option<Bound<'py, PyAny>>,
        Option<Bound<'py, PyAny>>,
    )> {
        let device = device
            .filter(|d| !d.is_none())
            .map(import_device_arg)
            .transpose()?;
        let read = read_dict(py, d, Import::Yes { device, copy })?;
        let array = PyPartitioned::new(read.array, Some(read.order));
        Ok((array, read.namespace, read.get, read.first))
    }

    /// An array from its parts: `shape`, `splits` and one `(position, start, shape, tensor,
    /// handle, locations)` per partition, locations as `(host, pid, device, rank)`.
    #[staticmethod]
    #[pyo3(signature = (shape, splits, parts, dtype=None, locals=None))]
    #[allow(clippy::type_complexity)]
    fn from_parts(
        #[pyo3(from_py_with = sizes_arg)] shape: Vec<usize>,
        #[pyo3(from_py_with = split_lists_arg)] splits: Vec<Vec<usize>>,
        #[pyo3(from_py_with = parts_arg)] parts: Vec<Part<'_>>,
        dtype: Option<Bound<'_, PyAny>>,
        #[pyo3(from_py_with = locals_arg)] locals: Option<Vec<Vec<usize>>>,
    ) -> PyResult<Self> {
        let dtype = dtype.map(|d| stated_dtype(&d)).transpose()?;
        let grid = Grid::from_splits(&shape, splits).map_err(to_py)?;
        let n = grid.num_partitions();
        let mut data: Vec<Option<Data>> = vec![None; n];
        let mut locations: Vec<Vec<Location>> = vec![Vec::new(); n];
        for (position, start, pshape, tensor, handle, locs) in parts {
            let flat = grid.flat_index(&position).map_err(to_py)?;
            let region = grid.region_at(flat);
            if region.start != start || region.shape != pshape {
                return Err(to_py(Error::protocol(
                    "partitions",
                    Some(&position),
                    format!(
                        "start {} shape {}, but the split points give start {} shape {}",
                        tuple_string(&start),
                        tuple_string(&pshape),
                        tuple_string(&region.start),
                        tuple_string(&region.shape)
                    ),
                    Some(inv::RECTILINEAR),
                )));
            }
            if data[flat].is_some() {
                return Err(to_py(Error::protocol(
                    "partitions",
                    Some(&position),
                    "listed twice",
                    Some(inv::POSITIONS),
                )));
            }
            data[flat] = Some(match (tensor, handle) {
                (Some(t), _) => Data::Tensor(t.inner),
                (None, Some(h)) => Data::Handle(Handle::new(h)),
                (None, None) => Data::Remote,
            });
            locations[flat] = locs
                .into_iter()
                .map(|(host, pid, device, rank)| {
                    Ok(Location {
                        host: host.map(Into::into),
                        pid,
                        device: device_arg(&device)?,
                        rank,
                    })
                })
                .collect::<PyResult<_>>()?;
        }
        if let Some(flat) = data.iter().position(Option::is_none) {
            return Err(to_py(Error::protocol(
                "partitions",
                Some(&grid.position(flat)),
                "missing; every position of the tiling needs a partition",
                Some(inv::POSITIONS),
            )));
        }
        let data = data.into_iter().map(|d| d.expect("checked")).collect();
        let mut pa = PartitionedArray::new(grid, data, locations, locals).map_err(to_py)?;
        if let Some(dt) = dtype {
            pa = pa.with_dtype(dt).map_err(to_py)?;
        }
        Ok(wrap(pa))
    }

    /// Zero-copy views of `x` (any DLPack array) along `tiling` or `splits`.
    #[staticmethod]
    #[pyo3(signature = (x, tiling=None, splits=None))]
    fn partition(
        x: &Bound<'_, PyAny>,
        #[pyo3(from_py_with = layout_tiling_arg)] tiling: Option<Vec<usize>>,
        #[pyo3(from_py_with = splits_arg)] splits: Option<Vec<Vec<usize>>>,
    ) -> PyResult<Self> {
        let t = super::ops::tensor_arg(x)?.inner;
        let layout = match (tiling, splits) {
            (Some(_), Some(_)) => {
                return Err(PyValueError::new_err("pass tiling or splits, not both"))
            }
            (_, Some(s)) => Layout::splits(s),
            (Some(t), None) => Layout::tiling(&t),
            (None, None) => Layout::tiling(&vec![1; t.ndim()]),
        };
        PartitionedArray::partition(&t, &layout)
            .map(wrap)
            .map_err(to_py)
    }

    /// The global shape.
    #[getter]
    fn shape<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyTuple>> {
        PyTuple::new(py, self.inner().shape())
    }

    /// Per axis, the split points.
    #[getter]
    fn splits<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyTuple>> {
        let axes: Vec<Bound<'py, PyTuple>> = self
            .inner()
            .grid()
            .splits()
            .iter()
            .map(|s| PyTuple::new(py, s))
            .collect::<PyResult<_>>()?;
        PyTuple::new(py, axes)
    }

    /// The element type's name, or None.
    #[getter]
    fn dtype(&self) -> Option<&'static str> {
        self.inner().dtype().map(DType::name)
    }

    /// The positions this rank owns, or None.
    #[getter]
    fn locals(&self) -> Option<Vec<Vec<usize>>> {
        self.inner().locals().map(<[Vec<usize>]>::to_vec)
    }

    /// The distinct devices, in order of first appearance.
    #[getter]
    fn devices(&self) -> Vec<PyDevice> {
        self.inner().devices().into_iter().map(PyDevice).collect()
    }

    /// Whether every device in use has dlpart kernels (else the array-API route applies).
    #[getter]
    fn native(&self) -> bool {
        self.inner()
            .devices()
            .into_iter()
            .all(|d| crate::backend::backend_for(d).is_ok() || d.kind == crate::DeviceType::Cuda)
    }

    /// `(position, start, shape, data, locations)` of every partition, C order; data is the
    /// tensor, the handle or None; locations are `(host, pid, device, rank)`.
    #[allow(clippy::type_complexity)]
    fn entries<'py>(
        &self,
        py: Python<'py>,
    ) -> PyResult<
        Vec<(
            Vec<usize>,
            Vec<usize>,
            Vec<usize>,
            Py<PyAny>,
            Vec<(Option<String>, Option<i64>, PyDevice, Option<i64>)>,
        )>,
    > {
        self.inner()
            .partitions()
            .map(|p| {
                let data = match p.data {
                    Data::Tensor(t) => PyTensor::new(t.clone())
                        .into_pyobject(py)?
                        .into_any()
                        .unbind(),
                    Data::Handle(h) => h
                        .downcast_ref::<Py<PyAny>>()
                        .map(|o| o.clone_ref(py))
                        .unwrap_or_else(|| py.None()),
                    Data::Remote => py.None(),
                };
                let locs = p
                    .locations
                    .iter()
                    .map(|l| {
                        (
                            l.host.as_deref().map(str::to_owned),
                            l.pid,
                            PyDevice(l.device),
                            l.rank,
                        )
                    })
                    .collect();
                Ok((p.position, p.start, p.shape, data, locs))
            })
            .collect()
    }

    /// Every partition's tensor in C order (an error naming a partition whose data is not here).
    fn tensors(&self) -> PyResult<Vec<PyTensor>> {
        Ok(self
            .inner()
            .tensors()
            .map_err(to_py)?
            .into_iter()
            .map(|t| PyTensor::new(t.clone()))
            .collect())
    }

    /// `(flat index, handle)` of the partitions at `positions` (all when None) that hold one.
    #[pyo3(signature = (positions=None))]
    fn pending(
        &self,
        py: Python<'_>,
        #[pyo3(from_py_with = positions_arg)] positions: Option<Vec<Vec<usize>>>,
    ) -> PyResult<Vec<(usize, Py<PyAny>)>> {
        let pa = self.inner();
        let mut flats = pa.pending(positions.as_deref()).map_err(to_py)?;
        if let Some(order) = &self.order {
            flats.sort_by_key(|&f| order[f]);
        }
        Ok(flats
            .into_iter()
            .map(|f| {
                let h = pa.data()[f]
                    .handle()
                    .expect("pending partitions hold handles");
                let obj = h
                    .downcast_ref::<Py<PyAny>>()
                    .map(|o| o.clone_ref(py))
                    .unwrap_or_else(|| py.None());
                (f, obj)
            })
            .collect())
    }

    /// Puts fetched `tensors` into partitions `flats`, after checking them, in a new array
    /// that replaces this one's (operations under way keep the one they began with). A
    /// partition another thread fetched meanwhile keeps that thread's data. Returns the
    /// tensor each of `flats` now holds, for the Python `Partition` objects. `sources`: the
    /// objects the tensors were imported from, whose `__dlpack_device__` is asked where the
    /// locations contradict a tensor's device (invariant 9 accepts the device it reports). A
    /// partition listed twice is a `ValueError` naming it, and nothing changes.
    #[pyo3(signature = (flats, tensors, moved=false, sources=None))]
    fn set_fetched(
        &self,
        #[pyo3(from_py_with = flats_arg)] flats: Vec<usize>,
        tensors: Vec<PyTensor>,
        moved: bool,
        sources: Option<Vec<Bound<'_, PyAny>>>,
    ) -> PyResult<Vec<PyTensor>> {
        // Before anything: a partition listed twice is refused even where another thread's
        // fetch filled it meanwhile (and the list would pass the core's check unseen).
        self.inner().fetched_once(&flats).map_err(to_py)?;
        // Asked before the lock is taken: a producer's method may wait for a thread that
        // wants the lock.
        let mut reported = Vec::new();
        if let (Some(sources), false) = (&sources, moved) {
            let current = self.inner();
            let me = Some(i64::from(std::process::id()));
            for ((&f, t), obj) in flats.iter().zip(&tensors).zip(sources) {
                let on = t.inner.device();
                if f >= current.len() {
                    continue;
                }
                if let Some(r) = reported_device(obj, current.locations(f), me, on)? {
                    reported.push((f, r));
                }
            }
            reported.sort_unstable_by_key(|&(f, _)| f);
        }
        let mut state = self.slot();
        let (new, data): (Vec<usize>, Vec<_>) = flats
            .iter()
            .zip(&tensors)
            .filter(|(f, _)| !matches!(state.data().get(**f), Some(Data::Tensor(_))))
            .map(|(&f, t)| (f, t.inner.clone()))
            .unzip();
        // What is replaced or left out is dropped after the lock is released: its last
        // reference may run a producer's deleter, which must not find the lock held.
        let mut old = None;
        if !new.is_empty() {
            let mut next = PartitionedArray::clone(&state);
            next.set_fetched_where(&new, data, moved, &reported)
                .map_err(to_py)?;
            old = Some(std::mem::replace(&mut *state, Arc::new(next)));
        }
        let held = flats
            .iter()
            .map(|&f| match state.data().get(f) {
                Some(Data::Tensor(t)) => Ok(PyTensor::new(t.clone())),
                _ => Err(PyValueError::new_err(format!(
                    "partition {f} holds no data"
                ))),
            })
            .collect();
        drop(state);
        drop((old, tensors));
        held
    }

    /// The target grid's split points and every target partition's device for a layout.
    #[pyo3(signature = (tiling=None, splits=None, block_cyclic=None, devices=None, process_grid=None))]
    #[allow(clippy::type_complexity)]
    fn target(
        &self,
        #[pyo3(from_py_with = layout_tiling_arg)] tiling: Option<Vec<usize>>,
        #[pyo3(from_py_with = splits_arg)] splits: Option<Vec<Vec<usize>>>,
        block_cyclic: Option<&Bound<'_, PyAny>>,
        devices: Option<&Bound<'_, PyAny>>,
        #[pyo3(from_py_with = process_grid_arg)] process_grid: Option<Vec<usize>>,
    ) -> PyResult<(Vec<Vec<usize>>, Vec<PyDevice>)> {
        let src = self.inner();
        let layout = layout_arg(
            tiling,
            splits,
            block_cyclic,
            devices,
            process_grid,
            src.ndim(),
        )?;
        let t = layout
            .target(src.grid(), &|i| src.device_of(i).unwrap_or(Device::CPU))
            .map_err(to_py)?;
        Ok((
            t.grid.splits().to_vec(),
            t.devices.into_iter().map(PyDevice).collect(),
        ))
    }

    /// The same array over another layout (see `dlpart.PartitionedArray.repartition`).
    #[pyo3(signature = (tiling=None, splits=None, block_cyclic=None, devices=None, process_grid=None, transfer=false))]
    #[allow(clippy::too_many_arguments)]
    fn repartition(
        &self,
        py: Python<'_>,
        #[pyo3(from_py_with = layout_tiling_arg)] tiling: Option<Vec<usize>>,
        #[pyo3(from_py_with = splits_arg)] splits: Option<Vec<Vec<usize>>>,
        block_cyclic: Option<&Bound<'_, PyAny>>,
        devices: Option<&Bound<'_, PyAny>>,
        #[pyo3(from_py_with = process_grid_arg)] process_grid: Option<Vec<usize>>,
        transfer: bool,
    ) -> PyResult<Self> {
        let pa = self.inner();
        let layout = layout_arg(
            tiling,
            splits,
            block_cyclic,
            devices,
            process_grid,
            pa.ndim(),
        )?;
        py.detach(|| pa.repartition(&layout, transfer))
            .map(wrap)
            .map_err(to_py)
    }

    /// Copies this array into `out`'s partitions.
    #[pyo3(signature = (out, transfer=false))]
    fn repartition_into(
        &self,
        py: Python<'_>,
        out: PyRef<'_, Self>,
        transfer: bool,
    ) -> PyResult<()> {
        let out = out.inner();
        py.detach(|| self.inner().repartition_into(&out, transfer))
            .map_err(to_py)
    }

    /// The whole array as one tensor.
    #[pyo3(signature = (device=None, transfer=false))]
    fn assemble(
        &self,
        py: Python<'_>,
        device: Option<&Bound<'_, PyAny>>,
        transfer: bool,
    ) -> PyResult<PyTensor> {
        let device = device
            .filter(|d| !d.is_none())
            .map(target_device_arg)
            .transpose()?;
        py.detach(|| self.inner().assemble(device, transfer))
            .map(PyTensor::new)
            .map_err(to_py)
    }

    /// Every partition copied onto `device`.
    fn to(&self, py: Python<'_>, device: &Bound<'_, PyAny>) -> PyResult<Self> {
        let device = target_device_arg(device)?;
        py.detach(|| self.inner().to(device))
            .map(wrap)
            .map_err(to_py)
    }

    /// `numpy.take` along `axis` with global indices.
    #[pyo3(signature = (indices, axis=0, transfer=false))]
    fn gather(
        &self,
        py: Python<'_>,
        indices: &Bound<'_, PyAny>,
        #[pyo3(from_py_with = super::ints::axis)] axis: i64,
        transfer: bool,
    ) -> PyResult<Self> {
        let (pa, idx) = (self.inner(), super::ops::indices_arg(indices)?.inner);
        let axis = axis_arg("gather", axis, pa.ndim(), "array")?;
        py.detach(|| pa.gather(&idx, axis, transfer))
            .map(wrap)
            .map_err(to_py)
    }

    /// The positions of the partitions holding `indices` along `axis`: those a gather or
    /// scatter (`op`, named in errors) reads or writes.
    #[pyo3(signature = (indices, axis=0, op="gather"))]
    fn serving(
        &self,
        py: Python<'_>,
        indices: &Bound<'_, PyAny>,
        #[pyo3(from_py_with = super::ints::axis)] axis: i64,
        op: &str,
    ) -> PyResult<Vec<Vec<usize>>> {
        let (pa, idx) = (self.inner(), super::ops::indices_arg(indices)?.inner);
        let axis = axis_arg(op, axis, pa.ndim(), "array")?;
        py.detach(|| pa.serving(&idx, axis)).map_err(to_py)
    }

    /// Fancy assignment along `axis` with global indices.
    #[pyo3(signature = (values, indices, axis=0, transfer=false))]
    fn scatter(
        &self,
        py: Python<'_>,
        values: &Bound<'_, PyAny>,
        indices: &Bound<'_, PyAny>,
        #[pyo3(from_py_with = super::ints::axis)] axis: i64,
        transfer: bool,
    ) -> PyResult<()> {
        let pa = self.inner();
        let v = super::ops::values_arg(values, pa.dtype())?.inner;
        let idx = super::ops::indices_arg(indices)?.inner;
        let axis = axis_arg("scatter", axis, pa.ndim(), "array")?;
        py.detach(|| pa.scatter(&v, &idx, axis, transfer))
            .map_err(to_py)
    }

    /// Every box copy to `dst_splits`: `(src, src_start, dst, dst_start, shape)`, for the
    /// array-API route.
    #[allow(clippy::type_complexity)]
    fn plan_ops(
        &self,
        #[pyo3(from_py_with = dst_splits_arg)] dst_splits: Vec<Vec<usize>>,
    ) -> PyResult<Vec<(usize, Vec<usize>, usize, Vec<usize>, Vec<usize>)>> {
        let src = self.inner();
        let dst = Grid::from_splits(src.shape(), dst_splits).map_err(to_py)?;
        let plan = Plan::new(src.grid(), &dst).map_err(to_py)?;
        Ok(plan
            .ops()
            .map(|o| (o.src, o.src_start, o.dst, o.dst_start, o.shape))
            .collect())
    }

    /// The `__partitioned__` dict: `get` is the given function; each tensor goes out as
    /// `convert(tensor)` (the tensor itself when `convert` is None). Locations are written in
    /// `form`: `"draft2"` writes `(host, pid, device)` tuples for data held here and for
    /// locations given as such, and keeps the forms that carry no pid as they came (an MPI
    /// rank stays an int, a bare address a string); `"ip"` writes every location as its host
    /// address (xgboost_ray); `"rank"` writes every location as its rank, `rank` for data held
    /// here (heat). `host` is this node's address. Keys are interned strings, as in a dict
    /// written in Python: a consumer's lookups then match by identity.
    #[pyo3(signature = (get, host, convert=None, form="draft2", rank=None))]
    fn to_dict<'py>(
        &self,
        py: Python<'py>,
        get: &Bound<'py, PyAny>,
        host: &str,
        convert: Option<&Bound<'py, PyAny>>,
        form: &str,
        #[pyo3(from_py_with = rank_arg)] rank: Option<i64>,
    ) -> PyResult<Bound<'py, PyDict>> {
        let form = LocationForm::parse(form)?;
        let pid = i64::from(std::process::id());
        let host: std::sync::Arc<str> = host.into();
        let parts = PyDict::new(py);
        let mut written: Option<(Location, Bound<'py, PyAny>)> = None;
        let pa = self.inner();
        for p in pa.partitions() {
            let entry = PyDict::new(py);
            entry.set_item(intern!(py, "start"), PyTuple::new(py, &p.start)?)?;
            entry.set_item(intern!(py, "shape"), PyTuple::new(py, &p.shape)?)?;
            let data: Bound<'py, PyAny> = match p.data {
                Data::Tensor(t) => {
                    let t = PyTensor::new(t.clone()).into_pyobject(py)?.into_any();
                    match convert {
                        Some(f) => f.call1((t,))?,
                        None => t,
                    }
                }
                Data::Handle(h) => h
                    .downcast_ref::<Py<PyAny>>()
                    .map(|o| o.bind(py).clone())
                    .unwrap_or_else(|| py.None().into_bound(py)),
                Data::Remote => py.None().into_bound(py),
            };
            entry.set_item(intern!(py, "data"), data)?;
            let here = p.tensor().map(|t| Location {
                host: Some(host.clone()),
                pid: Some(pid),
                device: t.device(),
                rank,
            });
            // Data held here is on this rank and this host, whatever its locations name: as
            // ranks, where they name none or are all this process's (the JAX adapter keeps JAX
            // device ids in `rank`); as addresses, where they name no host.
            let any = |f: fn(&Location) -> bool| p.locations.iter().any(f);
            let write_here = match form {
                LocationForm::Rank => {
                    any(|l| l.rank.is_none())
                        || (rank.is_some() && p.locations.iter().all(|l| l.pid == Some(pid)))
                }
                LocationForm::Ip => any(|l| l.host.is_none()),
                LocationForm::Draft2 => false,
            };
            let locations: Vec<&Location> = match &here {
                Some(h) if write_here => vec![h],
                _ if p.locations.is_empty() => here.iter().collect(),
                _ => p.locations.iter().collect(),
            };
            let out = PyList::empty(py);
            for l in locations {
                // One object per location, shared by the entries that name it (the forms are
                // immutable: tuples, strings, ints): making a tuple and two strings per entry
                // was most of a big dict's locations, and a consumer reading them (dlpart's
                // own reader among them) can then reuse what it read by identity.
                match &written {
                    Some((last, obj)) if last == l => out.append(obj)?,
                    _ => {
                        let obj = form.write(py, l, &p.position)?;
                        out.append(&obj)?;
                        written = Some((l.clone(), obj));
                    }
                }
            }
            entry.set_item(intern!(py, "location"), out)?;
            parts.set_item(PyTuple::new(py, &p.position)?, entry)?;
        }
        let d = PyDict::new(py);
        d.set_item(intern!(py, "shape"), PyTuple::new(py, pa.shape())?)?;
        d.set_item("partition_tiling", PyTuple::new(py, pa.grid().tiling())?)?;
        d.set_item(intern!(py, "partitions"), parts)?;
        d.set_item(intern!(py, "get"), get)?;
        if let Some(locals) = pa.locals() {
            let l: Vec<Bound<'py, PyTuple>> = locals
                .iter()
                .map(|p| PyTuple::new(py, p))
                .collect::<PyResult<_>>()?;
            d.set_item(intern!(py, "locals"), l)?;
        }
        Ok(d)
    }
}

/// How produced dicts write locations (see `PyPartitioned::to_dict`).
#[derive(Clone, Copy)]
enum LocationForm {
    Draft2,
    Ip,
    Rank,
}

impl LocationForm {
    fn parse(form: &str) -> PyResult<Self> {
        match form {
            "draft2" => Ok(LocationForm::Draft2),
            "ip" => Ok(LocationForm::Ip),
            "rank" => Ok(LocationForm::Rank),
            other => Err(PyValueError::new_err(format!(
                "locations={other:?}: expected 'draft2', 'ip' or 'rank'"
            ))),
        }
    }

    fn write<'py>(
        self,
        py: Python<'py>,
        l: &Location,
        position: &[usize],
    ) -> PyResult<Bound<'py, PyAny>> {
        let missing = |what: &str, hint: &str| {
            PyValueError::new_err(format!(
                "the location {l} of partition {} has no {what} to write{hint}",
                tuple_string(position)
            ))
        };
        let device = l.device.to_string();
        Ok(match (self, &l.host, l.pid, l.rank) {
            (LocationForm::Draft2, Some(h), Some(pid), _) => {
                (&**h, pid, device).into_pyobject(py)?.into_any()
            }
            // The forms without a pid are written as they came: a rank stays a rank.
            (LocationForm::Draft2, Some(h), None, _) => h.into_pyobject(py)?.into_any(),
            (LocationForm::Draft2 | LocationForm::Rank, None, _, Some(r)) => {
                r.into_pyobject(py)?.into_any()
            }
            (LocationForm::Ip, Some(h), _, _) => h.into_pyobject(py)?.into_any(),
            (LocationForm::Ip, None, _, Some(r)) => {
                return Err(missing(
                    "host address",
                    &format!(
                        ": it names rank {r} alone; read the dict with \
                         dlpart.mpi.from_partitioned(obj, comm), which learns every rank's host"
                    ),
                ))
            }
            (LocationForm::Ip, None, _, None) => return Err(missing("host address", "")),
            (LocationForm::Rank, _, _, Some(r)) => r.into_pyobject(py)?.into_any(),
            (LocationForm::Rank, _, _, None) => {
                return Err(missing(
                    "rank",
                    ": locations='rank' needs MPI ranks (pass rank= for data held in this \
                     process, or read the dict with dlpart.mpi.from_partitioned), or write \
                     locations='draft2' or 'ip'",
                ))
            }
            (LocationForm::Draft2, None, _, None) => return Err(missing("host or rank", "")),
        })
    }
}

/// The device the producer `obj` of data on `on` reports through `__dlpack_device__`, where
/// `locations` contradict `on` (see `contradicts`; `me`: this process's pid) and the producer
/// names another device, which invariant 9 then accepts (JAX's CPU arrays report kDLCPU:0
/// while their capsules name kDLCPU:k). `None` otherwise; a producer that cannot answer
/// leaves the contradiction to be reported, unless its error is fatal.
fn reported_device(
    obj: &Bound<'_, PyAny>,
    locations: &[Location],
    me: Option<i64>,
    on: Device,
) -> PyResult<Option<Device>> {
    if !contradicts(locations, me, on, None) {
        return Ok(None);
    }
    match source_device(obj) {
        Ok(Some(r)) if r != on => Ok(Some(r)),
        Ok(_) => Ok(None),
        Err(e) if fatal(obj.py(), &e) => Err(e),
        Err(_) => Ok(None),
    }
}

pub(super) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PyPartitioned>()?;
    m.add_function(wrap_pyfunction!(_validate_dict, m)?)?;
    m.add_function(wrap_pyfunction!(split_points, m)?)?;
    Ok(())
}
