//! DLPack capsules: making them for our exports, consuming them on import.
//!
//! Names are static C strings. A capsule's destructor deletes the tensor only while the capsule
//! still has its original name; a consumer renames it to `used_*` when it takes ownership.

use std::ffi::{c_void, CStr};
use std::ptr::NonNull;

use pyo3::exceptions::{PyBufferError, PyTypeError};
use pyo3::ffi;
use pyo3::prelude::*;

use crate::dlpack::ffi::{DLManagedTensor, DLManagedTensorVersioned};
use crate::dlpack::{export_legacy, export_versioned, ForeignTensor};
use crate::tensor::Tensor;

use super::errors::to_py;

const VERSIONED: &CStr = c"dltensor_versioned";
const USED_VERSIONED: &CStr = c"used_dltensor_versioned";
const LEGACY: &CStr = c"dltensor";
const USED_LEGACY: &CStr = c"used_dltensor";

/// A capsule owning a new export of `t`: versioned (with `copied` as `IS_COPIED`) or legacy.
pub(crate) fn export_capsule<'py>(
    py: Python<'py>,
    t: &Tensor,
    versioned: bool,
    copied: bool,
) -> PyResult<Bound<'py, PyAny>> {
    let (ptr, name, destructor): (*mut c_void, &CStr, Option<ffi::PyCapsule_Destructor>) =
        if versioned {
            (
                export_versioned(t, copied).cast(),
                VERSIONED,
                Some(destroy_versioned),
            )
        } else {
            (
                export_legacy(t).map_err(to_py)?.cast(),
                LEGACY,
                Some(destroy_legacy),
            )
        };
    // SAFETY: `ptr` is a live export that the capsule now owns; `name` is 'static.
    let cap = unsafe { ffi::PyCapsule_New(ptr, name.as_ptr(), destructor) };
    if cap.is_null() {
        // The capsule does not exist, so nobody else will delete the export.
        // SAFETY: `ptr` came from the matching export function just above and was not shared.
        unsafe { delete_export(ptr, versioned) };
        return Err(PyErr::fetch(py));
    }
    // SAFETY: `cap` is a new, owned reference.
    Ok(unsafe { Bound::from_owned_ptr(py, cap) })
}

/// Calls the deleter of an export that never reached a consumer.
///
/// # Safety
/// `ptr` must be an undeleted export of the kind `versioned` says.
unsafe fn delete_export(ptr: *mut c_void, versioned: bool) {
    // SAFETY: caller's contract; our exports always have a deleter.
    unsafe {
        if versioned {
            let p = ptr.cast::<DLManagedTensorVersioned>();
            if let Some(d) = (*p).deleter {
                d(p)
            }
        } else {
            let p = ptr.cast::<DLManagedTensor>();
            if let Some(d) = (*p).deleter {
                d(p)
            }
        }
    }
}

/// Capsule destructor: deletes the tensor unless a consumer renamed (took) it.
/// Never leaves an exception set.
unsafe fn destroy(cap: *mut ffi::PyObject, name: &CStr, versioned: bool) {
    // SAFETY: called by CPython with the GIL held on a capsule object. `PyCapsule_IsValid`
    // checks the name without setting an error, and the pointer it vouches for is our export.
    unsafe {
        if ffi::PyCapsule_IsValid(cap, name.as_ptr()) == 1 {
            let p = ffi::PyCapsule_GetPointer(cap, name.as_ptr());
            if !p.is_null() {
                delete_export(p, versioned);
            }
        }
    }
}

unsafe extern "C" fn destroy_versioned(cap: *mut ffi::PyObject) {
    // SAFETY: see `destroy`.
    unsafe { destroy(cap, VERSIONED, true) }
}

unsafe extern "C" fn destroy_legacy(cap: *mut ffi::PyObject) {
    // SAFETY: see `destroy`.
    unsafe { destroy(cap, LEGACY, false) }
}

/// Takes ownership of the tensor in a DLPack capsule and validates it.
///
/// The capsule is renamed to `used_*` before anything that can fail, so it is consumed exactly
/// once; if validation fails the producer's deleter is called (by `ForeignTensor`'s drop).
pub(crate) fn consume_capsule(cap: &Bound<'_, PyAny>) -> PyResult<(Tensor, u64)> {
    let obj = cap.as_ptr();
    // SAFETY: `PyCapsule_CheckExact` only inspects the type of a live object.
    if unsafe { ffi::PyCapsule_CheckExact(obj) } == 0 {
        return Err(PyTypeError::new_err(format!(
            "__dlpack__ returned {} of type {}, not a DLPack capsule",
            cap.repr().map(|r| r.to_string()).unwrap_or_default(),
            cap.get_type()
                .name()
                .map(|n| n.to_string())
                .unwrap_or_default()
        )));
    }
    // SAFETY: `obj` is a capsule; GetName may return NULL with an error set for invalid ones.
    let name_ptr = unsafe { ffi::PyCapsule_GetName(obj) };
    if name_ptr.is_null() {
        return Err(PyErr::take(cap.py())
            .unwrap_or_else(|| PyBufferError::new_err("DLPack capsule without a name")));
    }
    // SAFETY: a capsule name is a NUL-terminated string that outlives this call.
    let name = unsafe { CStr::from_ptr(name_ptr) };
    let (versioned, used) = if name == VERSIONED {
        (true, USED_VERSIONED)
    } else if name == LEGACY {
        (false, USED_LEGACY)
    } else if name == USED_VERSIONED || name == USED_LEGACY {
        return Err(PyBufferError::new_err(format!(
            "the DLPack capsule was already consumed (its name is {name:?})"
        )));
    } else {
        return Err(PyBufferError::new_err(format!(
            "not a DLPack capsule: its name is {name:?}, expected \"dltensor_versioned\" or \
             \"dltensor\""
        )));
    };
    // SAFETY: the name matches, so GetPointer returns the stored pointer (NULL only on error).
    let ptr = unsafe { ffi::PyCapsule_GetPointer(obj, name.as_ptr()) };
    let ptr = NonNull::new(ptr).ok_or_else(|| {
        PyErr::take(cap.py()).unwrap_or_else(|| PyBufferError::new_err("DLPack capsule holds NULL"))
    })?;
    // SAFETY: `used` is 'static; renaming is how a DLPack consumer takes ownership.
    if unsafe { ffi::PyCapsule_SetName(obj, used.as_ptr()) } != 0 {
        return Err(PyErr::fetch(cap.py()));
    }
    // SAFETY: the capsule is renamed, so its destructor no longer deletes the tensor: we are
    // the sole owner, and the producer gave us a valid managed tensor of the named kind.
    let foreign = unsafe {
        if versioned {
            ForeignTensor::from_versioned(ptr.cast())
        } else {
            ForeignTensor::from_legacy(ptr.cast())
        }
    };
    let flags = foreign.flags();
    let t = foreign.into_tensor().map_err(to_py)?;
    Ok((t, flags))
}
