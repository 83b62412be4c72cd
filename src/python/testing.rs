//! `dlpart._core._testing`: a DLPack producer with counted deleters, for conformance tests.
//!
//! `make_capsule` builds a managed tensor from explicit fields, including invalid ones, so tests
//! can feed dlpart every edge case a real producer might send and count deleter calls exactly.

use std::ffi::c_void;
use std::sync::atomic::{AtomicUsize, Ordering};

use pyo3::prelude::*;

use crate::dlpack::ffi::{
    DLDataType, DLDevice, DLManagedTensor, DLManagedTensorVersioned, DLPackVersion, DLTensor,
};
use crate::dlpack::live_exports;

static DELETER_CALLS: AtomicUsize = AtomicUsize::new(0);

/// What a test capsule owns: its data, shape and strides.
struct Payload {
    data: Vec<u8>,
    shape: Vec<i64>,
    strides: Option<Vec<i64>>,
}

#[repr(C)]
struct Owned<M> {
    managed: M,
    payload: Payload,
}

unsafe extern "C" fn count_versioned(p: *mut DLManagedTensorVersioned) {
    DELETER_CALLS.fetch_add(1, Ordering::SeqCst);
    // SAFETY: `p` is the first field of a leaked `Box<Owned<_>>` made by `make_capsule`, and
    // DLPack calls a deleter once.
    drop(unsafe { Box::from_raw(p.cast::<Owned<DLManagedTensorVersioned>>()) });
}

unsafe extern "C" fn count_legacy(p: *mut DLManagedTensor) {
    DELETER_CALLS.fetch_add(1, Ordering::SeqCst);
    // SAFETY: as in `count_versioned`.
    drop(unsafe { Box::from_raw(p.cast::<Owned<DLManagedTensor>>()) });
}

/// Deleter calls of test capsules so far.
#[pyfunction]
fn deleter_calls() -> usize {
    DELETER_CALLS.load(Ordering::SeqCst)
}

/// dlpart's exports not yet deleted.
#[pyfunction(name = "live_exports")]
fn py_live_exports() -> isize {
    live_exports()
}

/// A DLPack capsule over a copy of `data`, with every field under the caller's control.
///
/// `strides=None` sends NULL strides; `null_shape` sends a NULL shape pointer; `null_data` a
/// NULL data pointer; `ndim` overrides the length of `shape`. `version=None` makes a legacy
/// capsule.
#[pyfunction]
#[pyo3(signature = (data, shape, *, strides=None, dtype=(2, 32, 1), device=(1, 0),
    byte_offset=0, version=Some((1, 3)), flags=0, null_shape=false, null_data=false, ndim=None))]
#[allow(clippy::too_many_arguments)]
fn make_capsule<'py>(
    py: Python<'py>,
    data: Vec<u8>,
    shape: Vec<i64>,
    strides: Option<Vec<i64>>,
    dtype: (u8, u8, u16),
    device: (u32, i32),
    byte_offset: u64,
    version: Option<(u32, u32)>,
    flags: u64,
    null_shape: bool,
    null_data: bool,
    ndim: Option<i32>,
) -> PyResult<Bound<'py, PyAny>> {
    let mut payload = Payload {
        data,
        shape,
        strides,
    };
    let dl = DLTensor {
        data: if null_data {
            std::ptr::null_mut()
        } else {
            payload.data.as_mut_ptr().cast()
        },
        device: DLDevice {
            device_type: device.0,
            device_id: device.1,
        },
        ndim: ndim.unwrap_or(payload.shape.len() as i32),
        dtype: DLDataType {
            code: dtype.0,
            bits: dtype.1,
            lanes: dtype.2,
        },
        shape: if null_shape {
            std::ptr::null_mut()
        } else {
            payload.shape.as_mut_ptr()
        },
        strides: match &mut payload.strides {
            Some(s) => s.as_mut_ptr(),
            None => std::ptr::null_mut(),
        },
        byte_offset,
    };
    // Moving `payload` into the box keeps its heap buffers (and so the pointers above) in place.
    let (ptr, name): (*mut c_void, &'static std::ffi::CStr) = match version {
        Some((major, minor)) => {
            let b = Box::new(Owned {
                managed: DLManagedTensorVersioned {
                    version: DLPackVersion { major, minor },
                    manager_ctx: std::ptr::null_mut(),
                    deleter: Some(count_versioned),
                    flags,
                    dl_tensor: dl,
                },
                payload,
            });
            (Box::into_raw(b).cast(), c"dltensor_versioned")
        }
        None => {
            let b = Box::new(Owned {
                managed: DLManagedTensor {
                    dl_tensor: dl,
                    manager_ctx: std::ptr::null_mut(),
                    deleter: Some(count_legacy),
                },
                payload,
            });
            (Box::into_raw(b).cast(), c"dltensor")
        }
    };
    let destructor: Option<pyo3::ffi::PyCapsule_Destructor> = if version.is_some() {
        Some(destroy_versioned)
    } else {
        Some(destroy_legacy)
    };
    // SAFETY: `ptr` is a leaked box the capsule now owns; `name` is 'static.
    let cap = unsafe { pyo3::ffi::PyCapsule_New(ptr, name.as_ptr(), destructor) };
    if cap.is_null() {
        return Err(PyErr::fetch(py));
    }
    // SAFETY: a new, owned reference.
    Ok(unsafe { Bound::from_owned_ptr(py, cap) })
}

unsafe extern "C" fn destroy_versioned(cap: *mut pyo3::ffi::PyObject) {
    let name = c"dltensor_versioned";
    // SAFETY: CPython calls this with the GIL on a capsule; IsValid never sets an error, and a
    // capsule still bearing its name still owns our box.
    unsafe {
        if pyo3::ffi::PyCapsule_IsValid(cap, name.as_ptr()) == 1 {
            let p = pyo3::ffi::PyCapsule_GetPointer(cap, name.as_ptr());
            count_versioned(p.cast());
        }
    }
}

unsafe extern "C" fn destroy_legacy(cap: *mut pyo3::ffi::PyObject) {
    let name = c"dltensor";
    // SAFETY: as in `destroy_versioned`.
    unsafe {
        if pyo3::ffi::PyCapsule_IsValid(cap, name.as_ptr()) == 1 {
            let p = pyo3::ffi::PyCapsule_GetPointer(cap, name.as_ptr());
            count_legacy(p.cast());
        }
    }
}

pub(super) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(make_capsule, m)?)?;
    m.add_function(wrap_pyfunction!(deleter_calls, m)?)?;
    m.add_function(wrap_pyfunction!(py_live_exports, m)?)?;
    Ok(())
}
