//! Driver plumbing: loading libcuda, per-device contexts, compiled modules, device and pinned
//! allocations, and the scratch space that kernel launches use for their job tables.

use std::collections::HashMap;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::{Arc, Mutex, OnceLock};

use cudarc::driver::result::{self, DriverError};
use cudarc::driver::{sys, CudaContext, CudaFunction, CudaStream};
use cudarc::nvrtc::Ptx;

use super::nvrtc::{self, Image, SOURCES};
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

/// The kernels of one device, loaded from the images compiled for its architecture.
pub(crate) struct Kernels {
    pub copy: Vec<CudaFunction>,
    pub gather: Vec<CudaFunction>,
    pub scatter: Vec<CudaFunction>,
    pub winners: CudaFunction,
    /// `check_indices_{1,2,4,8}`, by [`INDEX_WORDS`].
    pub check: Vec<CudaFunction>,
}

/// The index widths `check_indices` is stamped for: every integer dtype.
pub(crate) const INDEX_WORDS: [usize; 4] = [1, 2, 4, 8];

/// Compiled images per target architecture, shared by devices of the same kind.
fn images_for(arch: &str) -> Result<Arc<Vec<Image>>> {
    static CACHE: OnceLock<Mutex<HashMap<String, Arc<Vec<Image>>>>> = OnceLock::new();
    let cache = CACHE.get_or_init(Default::default);
    if let Some(i) = cache.lock().expect("image cache lock").get(arch) {
        return Ok(i.clone());
    }
    // Compiled outside the lock and one thread per source: NVRTC takes seconds.
    let images = std::thread::scope(|scope| {
        let jobs: Vec<_> = SOURCES
            .iter()
            .map(|s| scope.spawn(move || nvrtc::compile(s, arch)))
            .collect();
        jobs.into_iter()
            .map(|j| j.join().expect("NVRTC panics are caught in compile"))
            .collect::<Result<Vec<_>>>()
    })?;
    let images = Arc::new(images);
    cache
        .lock()
        .expect("image cache lock")
        .insert(arch.to_string(), images.clone());
    Ok(images)
}

impl Kernels {
    pub fn load(ctx: &Arc<CudaContext>) -> Result<Kernels> {
        let cc = ctx
            .compute_capability()
            .map_err(driver_err("cuDeviceGetAttribute(compute capability)"))?;
        let arch = nvrtc::arch_for(cc, &nvrtc::supported_archs()?)?;
        let images = images_for(&arch)?;
        let mut functions: HashMap<&str, CudaFunction> = HashMap::new();
        for (src, image) in SOURCES.iter().zip(images.iter()) {
            let ptx = match image {
                Image::Cubin(b) => Ptx::from_binary(b.clone()),
                Image::Ptx(p) => Ptx::from_src(p.clone()),
            };
            let module = ctx.load_module(ptx).map_err(driver_err(format!(
                "cuModuleLoadData(kernels/{}, {arch})",
                src.name
            )))?;
            for &entry in src.entries {
                let f = module
                    .load_function(entry)
                    .map_err(driver_err(format!("cuModuleGetFunction({entry})")))?;
                functions.insert(entry, f);
            }
        }
        let mut take = |name: &str| {
            functions
                .remove(name)
                .expect("entry point listed in SOURCES")
        };
        let words = super::jobs::WORDS;
        Ok(Kernels {
            copy: words
                .iter()
                .map(|w| take(&format!("copy_box_{w}")))
                .collect(),
            gather: words.iter().map(|w| take(&format!("gather_{w}"))).collect(),
            scatter: words
                .iter()
                .map(|w| take(&format!("scatter_{w}")))
                .collect(),
            winners: take("scatter_winners"),
            check: INDEX_WORDS
                .iter()
                .map(|w| take(&format!("check_indices_{w}")))
                .collect(),
        })
    }
}

/// Device memory from `cuMemAlloc`, released by `cuMemFree` when the last view of it goes.
/// `cuMemFree` waits for work still using the memory, whichever stream queued it.
pub struct DeviceBuffer {
    ptr: sys::CUdeviceptr,
    bytes: usize,
    ctx: Arc<CudaContext>,
}

impl DeviceBuffer {
    /// `bytes` (> 0) of uninitialised device memory, 256-byte aligned.
    pub(crate) fn alloc(ctx: &Arc<CudaContext>, bytes: usize) -> Result<Self> {
        ctx.bind_to_thread()
            .map_err(driver_err("cuCtxSetCurrent"))?;
        // SAFETY: the context is current; the returned pointer is owned by the new value.
        let ptr = unsafe { result::malloc_sync(bytes.max(1)) }
            .map_err(driver_err(format!("cuMemAlloc({bytes} bytes)")))?;
        Ok(DeviceBuffer {
            ptr,
            bytes,
            ctx: ctx.clone(),
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
        // Errors cannot be reported from drop; a failed free leaks the allocation.
        let _ = self.ctx.bind_to_thread();
        // SAFETY: `ptr` came from cuMemAlloc in this context and is freed once, here.
        let _ = unsafe { result::free_sync(self.ptr) };
    }
}

/// Page-locked host memory from `cuMemAllocHost`.
pub(crate) struct PinnedBuffer {
    ptr: *mut u8,
    bytes: usize,
    ctx: Arc<CudaContext>,
}

// SAFETY: plain host memory owned by this value; users synchronise access through `&mut`.
unsafe impl Send for PinnedBuffer {}

impl PinnedBuffer {
    pub fn alloc(ctx: &Arc<CudaContext>, bytes: usize) -> Result<Self> {
        ctx.bind_to_thread()
            .map_err(driver_err("cuCtxSetCurrent"))?;
        // SAFETY: the context is current; the memory is owned by the new value.
        let ptr = unsafe { result::malloc_host(bytes.max(1), 0) }
            .map_err(driver_err(format!("cuMemAllocHost({bytes} bytes)")))?;
        Ok(PinnedBuffer {
            ptr: ptr as *mut u8,
            bytes,
            ctx: ctx.clone(),
        })
    }

    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: `ptr` points to `bytes` bytes owned by `self`, borrowed mutably here.
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.bytes) }
    }
}

impl Drop for PinnedBuffer {
    fn drop(&mut self) {
        let _ = self.ctx.bind_to_thread();
        // SAFETY: `ptr` came from cuMemAllocHost and is freed once, here.
        let _ = unsafe { result::free_host(self.ptr as *mut _) };
    }
}

/// Device scratch (job tables, index status, scatter winners) and the pinned staging the
/// job tables are uploaded from, so that uploads stay asynchronous.
pub(crate) struct Scratch {
    device: Option<DeviceBuffer>,
    host: Option<PinnedBuffer>,
    /// Recorded after the last upload from `host`; `host` is rewritten only after it fires.
    uploaded: Option<sys::CUevent>,
}

// SAFETY: the raw event handle is only used while the owning backend's mutex is held.
unsafe impl Send for Scratch {}

impl Scratch {
    pub fn new() -> Self {
        Scratch {
            device: None,
            host: None,
            uploaded: None,
        }
    }

    /// Device scratch of at least `bytes`; regrowing waits for `stream` to drain first.
    pub fn device(&mut self, stream: &CudaStream, bytes: usize) -> Result<u64> {
        if self.device.as_ref().is_none_or(|d| d.len() < bytes) {
            stream
                .synchronize()
                .map_err(driver_err("cuStreamSynchronize"))?;
            self.device = None;
            let cap = bytes.next_power_of_two().max(1 << 16);
            self.device = Some(DeviceBuffer::alloc(stream.context(), cap)?);
        }
        Ok(self.device.as_ref().expect("allocated above").device_ptr())
    }

    /// Copies `bytes` to `dst` on `stream` through pinned memory without waiting for it.
    pub fn upload(&mut self, stream: &CudaStream, dst: u64, bytes: &[u8]) -> Result<()> {
        if let Some(ev) = self.uploaded {
            // SAFETY: `ev` is a live event created below; waiting on it has no other effect.
            unsafe { result::event::synchronize(ev) }.map_err(driver_err("cuEventSynchronize"))?;
        }
        if self.host.as_ref().is_none_or(|h| h.bytes < bytes.len()) {
            self.host = None;
            let cap = bytes.len().next_power_of_two().max(1 << 14);
            self.host = Some(PinnedBuffer::alloc(stream.context(), cap)?);
        }
        let host = self.host.as_mut().expect("allocated above").as_mut_slice();
        host[..bytes.len()].copy_from_slice(bytes);
        // SAFETY: `dst` has room for `bytes.len()` bytes (sized by `device`); the pinned
        // source stays untouched until the event recorded next has fired.
        unsafe { result::memcpy_htod_async(dst, &host[..bytes.len()], stream.cu_stream()) }
            .map_err(driver_err("cuMemcpyHtoDAsync(job table)"))?;
        let ev = match self.uploaded {
            Some(ev) => ev,
            None => result::event::create(sys::CUevent_flags::CU_EVENT_DISABLE_TIMING)
                .map_err(driver_err("cuEventCreate"))?,
        };
        self.uploaded = Some(ev);
        // SAFETY: `ev` and the stream are live.
        unsafe { result::event::record(ev, stream.cu_stream()) }
            .map_err(driver_err("cuEventRecord"))
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        if let Some(ev) = self.uploaded.take() {
            // SAFETY: the event was created by `upload` and is destroyed once, here.
            let _ = unsafe { result::event::destroy(ev) };
        }
    }
}
