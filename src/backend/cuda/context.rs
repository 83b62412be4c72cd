//! Driver plumbing: driver errors, device and pinned allocations, and the scratch space that
//! kernel launches use for their job tables.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Arc;

use cudarc::driver::result::DriverError;
use cudarc::driver::sys;

use super::driver::Driver;
use crate::error::{Error, Result};

/// Maps a driver error onto [`Error::Backend`], naming the operation.
pub(crate) fn driver_err(op: impl Into<String>) -> impl FnOnce(DriverError) -> Error {
    let op = op.into();
    move |e| {
        let name = e.error_name().map(|s| s.to_string_lossy().into_owned());
        let text = e.error_string().map(|s| s.to_string_lossy().into_owned());
        Error::Backend {
            backend: "cuda",
            op,
            message: match (name, text) {
                (Ok(n), Ok(t)) => format!("{n}: {t}"),
                _ => format!("{:?}", e.0),
            },
        }
    }
}

pub(crate) fn unavailable(reason: impl Into<String>) -> Error {
    Error::BackendUnavailable {
        backend: "cuda",
        reason: reason.into(),
    }
}

/// Runs a driver call, turning cudarc's panic on a missing libcuda or symbol into
/// [`Error::BackendUnavailable`].
pub(crate) fn guarded<T>(f: impl FnOnce() -> Result<T>) -> Result<T> {
    // SAFETY: only probes whether the shared library can be opened; no symbol is called.
    if !unsafe { sys::is_culib_present() } {
        return Err(unavailable(
            "libcuda (the NVIDIA driver library) could not be loaded on this machine",
        ));
    }
    catch_unwind(AssertUnwindSafe(f)).unwrap_or_else(|p| {
        let msg = p
            .downcast_ref::<String>()
            .cloned()
            .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
            .unwrap_or_else(|| "unknown panic".into());
        Err(unavailable(format!(
            "the CUDA driver could not be used: {msg}"
        )))
    })
}

/// A driver's out-of-memory failure as [`Error::OutOfMemory`] (a `MemoryError` in Python, as
/// cupy raises), any other error unchanged.
fn out_of_memory(e: Error, bytes: usize, device: &str) -> Error {
    match e {
        Error::Backend { message, op, .. } if message.starts_with("CUDA_ERROR_OUT_OF_MEMORY") => {
            Error::OutOfMemory {
                bytes,
                what: op,
                device: device.into(),
            }
        }
        e => e,
    }
}

/// Device memory from `cuMemAlloc`, released by `cuMemFree` when the last view of it goes.
/// `cuMemFree` waits for work still using the memory, whichever stream queued it.
pub struct DeviceBuffer {
    ptr: u64,
    bytes: usize,
    driver: Arc<dyn Driver>,
}

impl DeviceBuffer {
    /// `bytes` (> 0) of uninitialised device memory, 256-byte aligned.
    pub(crate) fn alloc(driver: &Arc<dyn Driver>, bytes: usize) -> Result<Self> {
        let ptr = driver
            .alloc(bytes)
            .map_err(|e| out_of_memory(e, bytes, "CUDA device"))?;
        Ok(DeviceBuffer {
            ptr,
            bytes,
            driver: driver.clone(),
        })
    }

    /// The device address of the first byte.
    pub fn device_ptr(&self) -> u64 {
        self.ptr
    }

    /// The size asked for, in bytes.
    pub fn len(&self) -> usize {
        self.bytes
    }

    /// Whether [`DeviceBuffer::len`] is 0.
    pub fn is_empty(&self) -> bool {
        self.bytes == 0
    }
}

impl Drop for DeviceBuffer {
    fn drop(&mut self) {
        // SAFETY: `ptr` came from this driver's `alloc` and is freed once, here.
        unsafe { self.driver.free(self.ptr) };
    }
}

/// Page-locked host memory from `cuMemAllocHost`.
pub(crate) struct PinnedBuffer {
    ptr: *mut u8,
    bytes: usize,
    driver: Arc<dyn Driver>,
}

// SAFETY: plain host memory owned by this value; users synchronise access through `&mut`.
unsafe impl Send for PinnedBuffer {}

impl PinnedBuffer {
    pub fn alloc(driver: &Arc<dyn Driver>, bytes: usize) -> Result<Self> {
        let ptr = driver
            .alloc_pinned(bytes)
            .map_err(|e| out_of_memory(e, bytes, "pinned host"))?;
        Ok(PinnedBuffer {
            ptr,
            bytes,
            driver: driver.clone(),
        })
    }

    /// The first byte.
    pub fn as_ptr(&self) -> *mut u8 {
        self.ptr
    }

    /// The size asked for, in bytes.
    pub fn len(&self) -> usize {
        self.bytes
    }

    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: `ptr` points to `bytes` bytes owned by `self`, borrowed mutably here.
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.bytes) }
    }
}

impl Drop for PinnedBuffer {
    fn drop(&mut self) {
        // SAFETY: `ptr` came from this driver's `alloc_pinned` and is freed once, here; the
        // users of a staging buffer synchronise before dropping it.
        unsafe { self.driver.free_pinned(self.ptr) };
    }
}

/// Device scratch (job tables, index status, scatter winners) and the pinned staging the
/// job tables are uploaded from, so that uploads stay asynchronous.
pub(crate) struct Scratch {
    driver: Arc<dyn Driver>,
    device: Option<DeviceBuffer>,
    host: Option<PinnedBuffer>,
    /// Recorded after the last upload from `host`; `host` is rewritten only after it fires.
    uploaded: Option<u64>,
}

impl Scratch {
    pub fn new(driver: Arc<dyn Driver>) -> Self {
        Scratch {
            driver,
            device: None,
            host: None,
            uploaded: None,
        }
    }

    /// Device scratch of at least `bytes`; regrowing waits for the stream to drain first.
    pub fn device(&mut self, bytes: usize) -> Result<u64> {
        if self.device.as_ref().is_none_or(|d| d.len() < bytes) {
            self.driver.synchronize()?;
            self.device = None;
            let cap = bytes.next_power_of_two().max(1 << 16);
            self.device = Some(DeviceBuffer::alloc(&self.driver, cap)?);
        }
        Ok(self.device.as_ref().expect("allocated above").device_ptr())
    }

    /// Copies `bytes` to `dst` on the stream through pinned memory without waiting for it.
    /// `dst` must have room for them: it is scratch from [`Scratch::device`].
    pub fn upload(&mut self, dst: u64, bytes: &[u8]) -> Result<()> {
        if let Some(ev) = self.uploaded {
            // SAFETY: `ev` is a live event created below; waiting on it has no other effect.
            unsafe { self.driver.event_synchronize(ev) }?;
        }
        if self.host.as_ref().is_none_or(|h| h.len() < bytes.len()) {
            self.host = None;
            let cap = bytes.len().next_power_of_two().max(1 << 14);
            self.host = Some(PinnedBuffer::alloc(&self.driver, cap)?);
        }
        let host = self.host.as_mut().expect("allocated above").as_mut_slice();
        host[..bytes.len()].copy_from_slice(bytes);
        // SAFETY: `dst` has room for `bytes.len()` bytes (sized by `device`); the pinned
        // source stays untouched until the event recorded next has fired.
        unsafe { self.driver.copy_htod(dst, &host[..bytes.len()]) }?;
        let ev = match self.uploaded {
            Some(ev) => ev,
            None => self.driver.event_create()?,
        };
        self.uploaded = Some(ev);
        // SAFETY: `ev` and the driver's stream are live.
        unsafe { self.driver.event_record(ev, self.driver.stream()) }
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        if let Some(ev) = self.uploaded.take() {
            // SAFETY: the event was created by `upload` and is destroyed once, here.
            let _ = unsafe { self.driver.event_destroy(ev) };
        }
    }
}
