//! Calling a producer's `__dlpack__` with keyword arguments, cheaply.
//!
//! An import asks `x.__dlpack__(stream=..., max_version=(1, 3)[, dl_device=...][, copy=...])`.
//! Through `PyObject_Call` that takes a keyword dict, which CPython then unpacks again for a
//! vectorcall callee (numpy's is one): measured from Python on numpy 2.4, a call with a dict
//! of keywords took 590 ns against 200 ns for the same call by vectorcall, and numpy's whole
//! `from_dlpack` takes 330 ns. So the call goes through `PyObject_VectorcallMethod` with a
//! cached tuple of keyword names, and nothing is allocated for it.
//!
//! `PyObject_VectorcallMethod` is exported by CPython since 3.9 and part of the stable ABI
//! since 3.12, but the abi3-py39 bindings do not declare it, so it is looked up once at run
//! time; where it is missing the keyword dict is used. The method is looked up on every call,
//! as `x.__dlpack__(...)` in Python does, except for an exact `numpy.ndarray` (see
//! [`call_numpy`]).

use std::ffi::c_void;
use std::sync::OnceLock;

use pyo3::ffi;
use pyo3::intern;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyBool, PyDict, PyString, PyTuple, PyType};

/// `PyObject *PyObject_VectorcallMethod(PyObject *name, PyObject *const *args, size_t nargsf,
/// PyObject *kwnames)`.
type VectorcallMethod = unsafe extern "C" fn(
    *mut ffi::PyObject,
    *const *mut ffi::PyObject,
    usize,
    *mut ffi::PyObject,
) -> *mut ffi::PyObject;

/// The interpreter's `PyObject_VectorcallMethod`, or `None` where it exports none.
fn vectorcall_method() -> Option<VectorcallMethod> {
    static FN: OnceLock<Option<VectorcallMethod>> = OnceLock::new();
    *FN.get_or_init(|| lookup(c"PyObject_VectorcallMethod"))
}

/// The interpreter's `PyObject_Vectorcall`, which takes the callable where
/// `PyObject_VectorcallMethod` takes a method name (same C signature otherwise), or `None`
/// where it exports none (3.9 and 3.10 define it inline only).
fn vectorcall() -> Option<VectorcallMethod> {
    static FN: OnceLock<Option<VectorcallMethod>> = OnceLock::new();
    *FN.get_or_init(|| lookup(c"PyObject_Vectorcall"))
}

/// `name`, one of CPython's two vectorcall entry points, as loaded in this process.
fn lookup(name: &std::ffi::CStr) -> Option<VectorcallMethod> {
    // SAFETY: `dlsym` with RTLD_DEFAULT only searches the symbols already loaded; the name is
    // a NUL-terminated string.
    let p = unsafe { libc::dlsym(libc::RTLD_DEFAULT, name.as_ptr()) };
    if p.is_null() {
        return None;
    }
    // SAFETY: the symbol is CPython's `PyObject_VectorcallMethod` or `PyObject_Vectorcall`
    // (this module only runs inside CPython: it is an abi3 extension), whose C signature is
    // `VectorcallMethod` in every version that exports them (`PyObject_VectorcallMethod` from
    // 3.9, `PyObject_Vectorcall` as a function from 3.11; both stable ABI since 3.12).
    Some(unsafe { std::mem::transmute::<*mut c_void, VectorcallMethod>(p) })
}

/// The keywords an import passes to `__dlpack__`, beyond `stream` and `max_version`.
#[derive(Clone, Copy, Default)]
pub(crate) struct Keywords<'a, 'py> {
    /// `dl_device=(type, id)`, when the producer must move the data.
    pub dl_device: Option<&'a Bound<'py, PyAny>>,
    /// `copy=`, when the caller asked for or against a copy.
    pub copy: Option<bool>,
}

/// The keyword names of each form of the call, made once each. Interned: a callee that
/// parses keywords by identity first (numpy does) then needs no string compare; with plain
/// strings numpy's argument parser was half the time spent inside its `__dlpack__`.
static NAMES: [PyOnceLock<Py<PyTuple>>; 4] = [const { PyOnceLock::new() }; 4];
/// `(1, 3)`, the `max_version` every import asks for, made once.
static MAX_VERSION: PyOnceLock<Py<PyTuple>> = PyOnceLock::new();

/// `x.__dlpack__(stream=stream, max_version=(1, 3), ...)` with the optional keywords in `kw`.
pub(crate) fn call_versioned<'py>(
    x: &Bound<'py, PyAny>,
    stream: Option<i64>,
    kw: Keywords<'_, 'py>,
) -> PyResult<Bound<'py, PyAny>> {
    let py = x.py();
    let max_version = max_version(py)?;
    let stream = stream.into_pyobject(py)?;
    let copy = kw.copy.map(|c| PyBool::new(py, c));
    let mut args = [std::ptr::null_mut(); 5];
    args[..3].copy_from_slice(&[x.as_ptr(), stream.as_ptr(), max_version.as_ptr()]);
    let mut n = 3;
    for extra in [
        kw.dl_device.map(Bound::as_ptr),
        copy.as_deref().map(Bound::as_ptr),
    ]
    .into_iter()
    .flatten()
    {
        args[n] = extra;
        n += 1;
    }
    let form = usize::from(kw.dl_device.is_some()) | usize::from(kw.copy.is_some()) << 1;
    let names = NAMES[form]
        .get_or_try_init(py, || {
            let all = ["stream", "max_version", "dl_device", "copy"];
            let wanted = [true, true, kw.dl_device.is_some(), kw.copy.is_some()];
            let names: Vec<Bound<'_, PyString>> = all
                .iter()
                .zip(wanted)
                .filter(|(_, w)| *w)
                .map(|(k, _)| PyString::intern(py, k))
                .collect();
            PyTuple::new(py, names).map(Bound::unbind)
        })?
        .bind(py);
    call(x, names, &args[..n])
}

/// `x.__dlpack__(max_version=(1, 3))` for an exact `numpy.ndarray` `x`, through the method
/// `numpy.ndarray.__dlpack__` itself, fetched once.
///
/// A numpy array lives in host memory, so the stream an import passes is `None`, the default:
/// leaving `stream` out asks the same. The method of an exact ndarray cannot be replaced
/// (the type is immutable and its instances have no `__dict__`), so the lookup by name that
/// `x.__dlpack__` makes finds this one every time. Measured with callgrind on numpy 2.4: the
/// lookup and the second keyword cost about 200 of the 830 instructions of the call.
pub(crate) fn call_numpy<'py>(
    x: &Bound<'py, PyAny>,
    ndarray: &Bound<'py, PyType>,
) -> PyResult<Bound<'py, PyAny>> {
    static METHOD: PyOnceLock<Py<PyAny>> = PyOnceLock::new();
    static NAMES: PyOnceLock<Py<PyTuple>> = PyOnceLock::new();
    let py = x.py();
    let Some(vectorcall) = vectorcall() else {
        return call_versioned(x, None, Keywords::default());
    };
    let method = METHOD
        .get_or_try_init(py, || {
            ndarray
                .getattr(intern!(py, "__dlpack__"))
                .map(Bound::unbind)
        })?
        .bind(py);
    let names = NAMES
        .get_or_try_init(py, || {
            PyTuple::new(py, [PyString::intern(py, "max_version")]).map(Bound::unbind)
        })?
        .bind(py);
    let args = [x.as_ptr(), max_version(py)?.as_ptr()];
    // SAFETY: `method` is numpy's `ndarray.__dlpack__` (a method descriptor) and `x` an
    // exact ndarray, its receiver, passed as the one positional argument; `args[1]` is the
    // value of the keyword named by `names`; all are live for the call and the GIL is held.
    // The result is a new reference, or NULL with an exception set.
    unsafe {
        let r = vectorcall(method.as_ptr(), args.as_ptr(), 1, names.as_ptr());
        Bound::from_owned_ptr_or_err(py, r)
    }
}

/// `(1, 3)`, made once.
fn max_version(py: Python<'_>) -> PyResult<&Bound<'_, PyTuple>> {
    Ok(MAX_VERSION
        .get_or_try_init(py, || -> PyResult<Py<PyTuple>> {
            Ok((1u32, 3u32).into_pyobject(py)?.unbind())
        })?
        .bind(py))
}

/// `x.__dlpack__(stream=stream)`, the call of DLPack before 1.0.
pub(crate) fn call_legacy<'py>(
    x: &Bound<'py, PyAny>,
    stream: Option<i64>,
) -> PyResult<Bound<'py, PyAny>> {
    static LEGACY: PyOnceLock<Py<PyTuple>> = PyOnceLock::new();
    let py = x.py();
    let names = LEGACY
        .get_or_try_init(py, || {
            PyTuple::new(py, [PyString::intern(py, "stream")]).map(Bound::unbind)
        })?
        .bind(py);
    let stream = stream.into_pyobject(py)?;
    call(x, names, &[x.as_ptr(), stream.as_ptr()])
}

/// `x.__dlpack__(**dict(zip(names, args[1:])))`; `args[0]` is `x`, and every pointer in
/// `args` is a live object the caller holds a reference to.
fn call<'py>(
    x: &Bound<'py, PyAny>,
    names: &Bound<'py, PyTuple>,
    args: &[*mut ffi::PyObject],
) -> PyResult<Bound<'py, PyAny>> {
    let py = x.py();
    let method: &Bound<'py, PyString> = intern!(py, "__dlpack__");
    debug_assert_eq!(names.len() + 1, args.len());
    let Some(vectorcall) = vectorcall_method() else {
        let kwargs = PyDict::new(py);
        for (k, &v) in names.iter().zip(&args[1..]) {
            // SAFETY: `v` is a live object (caller contract); this takes a new reference.
            kwargs.set_item(k, unsafe { Bound::from_borrowed_ptr(py, v) })?;
        }
        return x.call_method(method, (), Some(&kwargs));
    };
    // SAFETY: every pointer in `args` is a live object (caller contract), `args[0]` the
    // receiver and the rest the values of the keywords named by the string tuple `names`;
    // the GIL is held (we have `py`). `nargsf = 1`: one positional argument, the receiver.
    // The result is a new reference, or NULL with an exception set.
    unsafe {
        let r = vectorcall(method.as_ptr(), args.as_ptr(), 1, names.as_ptr());
        Bound::from_owned_ptr_or_err(py, r)
    }
}
