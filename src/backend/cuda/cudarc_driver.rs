//! The driver on a GPU: libcuda through cudarc, kernels compiled by NVRTC for the device's
//! architecture and loaded once per device.

use std::any::Any;
use std::collections::HashMap;
use std::ffi::c_void;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Instant;

use cudarc::driver::result;
use cudarc::driver::{sys, CudaContext, CudaFunction, CudaStream};
use cudarc::nvrtc::Ptx;

use super::context::{driver_err, unavailable};
use super::driver::{Bound, Driver, Kernel};
use super::jobs::BLOCK;
use super::nvrtc::{self, Image, SOURCES};
use crate::device::Device;
use crate::error::{Error, Result};

/// Every kernel of one device by entry name, loaded from the images for its architecture.
type Functions = HashMap<&'static str, CudaFunction>;

/// The primary context of one device, the backend's non-blocking stream on it, and the
/// kernels, loaded on first use.
pub(crate) struct CudarcDriver {
    ctx: Arc<CudaContext>,
    stream: Arc<CudaStream>,
    sm_count: u32,
    kernels: Mutex<Option<Arc<Functions>>>,
}

/// The number of CUDA devices the driver reports (after `cuInit`). The caller has checked
/// that libcuda loads (see `context::guarded`).
pub(crate) fn device_count() -> Result<i32> {
    result::init()
        .map_err(|e| unavailable(format!("cuInit failed: {}", driver_err("cuInit")(e))))?;
    CudaContext::device_count().map_err(driver_err("cuDeviceGetCount"))
}

/// The context current on the calling thread; null when there is none.
fn current_context() -> Result<sys::CUcontext> {
    result::ctx::get_current()
        .map(|c| c.unwrap_or(std::ptr::null_mut()))
        .map_err(driver_err("cuCtxGetCurrent"))
}

/// Makes `ctx` current on the calling thread until the returned binding goes, which makes the
/// context that was current before current again.
fn bind_context(ctx: &CudaContext) -> Result<Bound> {
    let previous = current_context()?;
    if previous == ctx.cu_ctx() {
        return Ok(Bound::unchanged());
    }
    // SAFETY: `ctx` is retained by the `CudaContext` borrowed here, so it is live.
    unsafe { result::ctx::set_current(ctx.cu_ctx()) }.map_err(driver_err("cuCtxSetCurrent"))?;
    // SAFETY: libcuda is loaded (it answered cuCtxGetCurrent above), and `previous` is null
    // or the context that was current on this thread until just now.
    Ok(unsafe { Bound::restoring(previous) })
}

/// `device` is past the last of the `count` CUDA devices of this machine.
pub(crate) fn missing_device(device: Device, count: i32) -> Error {
    let valid = match count {
        0 => "none".to_string(),
        1 => "kDLCUDA:0 ('cuda:0')".to_string(),
        n => format!(
            "kDLCUDA:0 to kDLCUDA:{} ('cuda:0' to 'cuda:{}')",
            n - 1,
            n - 1
        ),
    };
    Error::InvalidDevice {
        text: device.to_string(),
        reason: format!(
            "this machine has {count} CUDA device(s) (valid: {valid}); CUDA_VISIBLE_DEVICES \
             may hide some"
        ),
    }
}

impl CudarcDriver {
    /// Retains `device`'s primary context and creates a stream on it. The caller has
    /// checked that libcuda loads (see `context::guarded`). The context current on the
    /// calling thread before is current again when this returns.
    pub fn new(device: Device) -> Result<CudarcDriver> {
        let count = device_count()?;
        if device.id >= count {
            return Err(missing_device(device, count));
        }
        // cudarc makes the new context current (in `CudaContext::new` and `new_stream`):
        // put back what was current, once everything made below (the context too, on an
        // error) has been dropped.
        // SAFETY: libcuda is loaded (`device_count` ran cuInit), and the context read here is
        // the one current on this thread now.
        let _restore = unsafe { Bound::restoring(current_context()?) };
        let ctx = CudaContext::new(device.id as usize).map_err(driver_err(format!(
            "retaining the primary context of {device}"
        )))?;
        let sm = ctx
            .attribute(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)
            .map_err(driver_err("cuDeviceGetAttribute(multiprocessor count)"))?;
        // cudarc's event tracking orders uses of its own `CudaSlice`s across streams, and
        // `new_stream` begins it with a cuCtxSynchronize: a wait for all work queued on the
        // device by anyone (torch, cupy), under the backend registry's lock and perhaps with
        // the GIL held. dlpart makes no `CudaSlice`: its memory is raw allocations ordered on
        // its one stream, and waits between streams are its own events.
        // SAFETY: `disable_event_tracking` only stops tracking for `CudaSlice`s made after
        // it on this `CudaContext` value (dlpart's own, not shared with other libraries), and
        // dlpart makes none.
        unsafe { ctx.disable_event_tracking() };
        let stream = ctx.new_stream().map_err(driver_err("cuStreamCreate"))?;
        Ok(CudarcDriver {
            ctx,
            stream,
            sm_count: sm.max(1) as u32,
            kernels: Mutex::new(None),
        })
    }

    /// The kernels, compiled and loaded on first use (about a second of NVRTC per
    /// architecture and process).
    fn kernels(&self) -> Result<Arc<Functions>> {
        let mut k = self.kernels.lock().expect("kernel cache lock");
        if let Some(k) = k.as_ref() {
            return Ok(k.clone());
        }
        let (functions, notes) = {
            // Loading modules needs the context current; put back the caller's after.
            let _ctx = self.bind()?;
            load(&self.ctx)?
        };
        let loaded = Arc::new(functions);
        *k = Some(loaded.clone());
        // Written after the lock: a record may wait for the GIL, whose holder may be about
        // to launch on this device.
        drop(k);
        for (level, note) in notes {
            log::log!(level, "{note}");
        }
        Ok(loaded)
    }

    fn cu_stream(&self) -> sys::CUstream {
        self.stream.cu_stream()
    }
}

/// What loading the kernels has to report, written once no lock is held.
type Notes = Vec<(log::Level, String)>;

/// Compiled images per target architecture, shared by devices of the same kind, with the
/// log records of the compilation (or of the cache hit).
fn images_for(arch: &str) -> Result<(Arc<Vec<Image>>, Notes)> {
    static CACHE: OnceLock<Mutex<HashMap<String, Arc<Vec<Image>>>>> = OnceLock::new();
    let cache = CACHE.get_or_init(Default::default);
    if let Some(i) = cache.lock().expect("image cache lock").get(arch) {
        let note = format!("kernels for {arch}: compiled images from the process cache");
        return Ok((i.clone(), vec![(log::Level::Debug, note)]));
    }
    // Compiled outside the lock and one thread per source: NVRTC takes seconds.
    let start = Instant::now();
    let timed = std::thread::scope(|scope| {
        let jobs: Vec<_> = SOURCES
            .iter()
            .map(|s| {
                scope.spawn(move || {
                    let t = Instant::now();
                    nvrtc::compile(s, arch).map(|image| (image, t.elapsed()))
                })
            })
            .collect();
        jobs.into_iter()
            .map(|j| j.join().expect("NVRTC panics are caught in compile"))
            .collect::<Result<Vec<_>>>()
    })?;
    let mut notes: Notes = SOURCES
        .iter()
        .zip(&timed)
        .map(|(src, (image, took))| {
            let form = match image {
                Image::Cubin(_) => "CUBIN",
                Image::Ptx(_) => "PTX",
            };
            let note = format!(
                "NVRTC: kernels/{} for {arch} ({form}) in {took:.2?}",
                src.name
            );
            (log::Level::Debug, note)
        })
        .collect();
    notes.push((
        log::Level::Info,
        format!(
            "NVRTC compiled {} kernel sources for {arch} in {:.2?} (once per architecture \
             and process)",
            timed.len(),
            start.elapsed()
        ),
    ));
    let images = Arc::new(
        timed
            .into_iter()
            .map(|(image, _)| image)
            .collect::<Vec<_>>(),
    );
    cache
        .lock()
        .expect("image cache lock")
        .insert(arch.to_string(), images.clone());
    Ok((images, notes))
}

/// The kernels loaded on `ctx`'s device, with the log records of getting their images.
fn load(ctx: &Arc<CudaContext>) -> Result<(Functions, Notes)> {
    let cc = ctx
        .compute_capability()
        .map_err(driver_err("cuDeviceGetAttribute(compute capability)"))?;
    let arch = nvrtc::arch_for(cc, &nvrtc::supported_archs()?)?;
    let (images, notes) = images_for(&arch)?;
    let mut functions = Functions::new();
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
    Ok((functions, notes))
}

fn event(e: u64) -> sys::CUevent {
    e as usize as sys::CUevent
}

fn stream(s: u64) -> sys::CUstream {
    s as usize as sys::CUstream
}

impl Driver for CudarcDriver {
    fn as_any(&self) -> &dyn Any {
        self
    }

    fn bind(&self) -> Result<Bound> {
        bind_context(&self.ctx)
    }

    fn sm_count(&self) -> u32 {
        self.sm_count
    }

    fn stream(&self) -> u64 {
        self.cu_stream() as usize as u64
    }

    fn load_kernels(&self) -> Result<()> {
        self.kernels().map(drop)
    }

    fn alloc(&self, bytes: usize) -> Result<u64> {
        let _ctx = self.bind()?;
        // SAFETY: the context is current; the caller owns the returned pointer.
        unsafe { result::malloc_sync(bytes.max(1)) }
            .map_err(driver_err(format!("cuMemAlloc({bytes} bytes)")))
    }

    unsafe fn free(&self, ptr: u64) {
        // Errors cannot be reported from a drop; a failed free leaks the allocation. The
        // binding (when it succeeded) lives until the end of the call.
        let _ctx = self.bind();
        // SAFETY: the caller's contract: `ptr` came from cuMemAlloc in this context, once.
        let _ = unsafe { result::free_sync(ptr) };
    }

    fn alloc_pinned(&self, bytes: usize) -> Result<*mut u8> {
        let _ctx = self.bind()?;
        // SAFETY: the context is current; the caller owns the returned memory.
        let p = unsafe { result::malloc_host(bytes.max(1), 0) }
            .map_err(driver_err(format!("cuMemAllocHost({bytes} bytes)")))?;
        Ok(p.cast())
    }

    unsafe fn free_pinned(&self, ptr: *mut u8) {
        // As in `free`: a failed bind or free leaks the memory.
        let _ctx = self.bind();
        // SAFETY: the caller's contract: `ptr` came from cuMemAllocHost, freed once.
        let _ = unsafe { result::free_host(ptr.cast()) };
    }

    unsafe fn memset_zero(&self, dst: u64, bytes: usize) -> Result<()> {
        let _ctx = self.bind()?;
        // SAFETY: the caller's contract: the range lies in one allocation of this device.
        unsafe { result::memset_d8_async(dst, 0, bytes, self.cu_stream()) }
            .map_err(driver_err(format!("cuMemsetD8Async({bytes} bytes)")))
    }

    unsafe fn copy_htod(&self, dst: u64, src: &[u8]) -> Result<()> {
        let _ctx = self.bind()?;
        // SAFETY: the caller's contract: `dst` has room for `src`; a pageable source is
        // staged before the call returns, a pinned one the caller keeps untouched.
        unsafe { result::memcpy_htod_async(dst, src, self.cu_stream()) }.map_err(driver_err(
            format!("cuMemcpyHtoDAsync({} bytes)", src.len()),
        ))
    }

    unsafe fn copy_dtoh(&self, dst: &mut [u8], src: u64) -> Result<()> {
        let n = dst.len();
        let _ctx = self.bind()?;
        // SAFETY: the caller's contract: `src` holds `n` bytes; `dst` is borrowed mutably
        // for the call, and a pinned one the caller leaves alone until it synchronises.
        unsafe { result::memcpy_dtoh_async(dst, src, self.cu_stream()) }
            .map_err(driver_err(format!("cuMemcpyDtoHAsync({n} bytes)")))
    }

    unsafe fn launch(&self, kernel: Kernel, grid: u32, params: &mut [*mut c_void]) -> Result<()> {
        let kernels = self.kernels()?;
        let _ctx = self.bind()?;
        let f = kernels
            .get(kernel.entry())
            .expect("every kernel is listed in SOURCES");
        // SAFETY: the caller's contract on `params`; the function and stream belong to this
        // context.
        unsafe {
            result::launch_kernel(
                f.cu_function(),
                (grid, 1, 1),
                (BLOCK, 1, 1),
                0,
                self.cu_stream(),
                params,
            )
        }
        .map_err(driver_err(format!("launching {}", kernel.entry())))
    }

    fn synchronize(&self) -> Result<()> {
        let _ctx = self.bind()?;
        self.stream
            .synchronize()
            .map_err(driver_err("cuStreamSynchronize"))
    }

    /// The event belongs to this device's context, made current here.
    fn event_create(&self) -> Result<u64> {
        let _ctx = self.bind()?;
        let ev = result::event::create(sys::CUevent_flags::CU_EVENT_DISABLE_TIMING)
            .map_err(driver_err("cuEventCreate"))?;
        Ok(ev as usize as u64)
    }

    unsafe fn event_record(&self, ev: u64, s: u64) -> Result<()> {
        let _ctx = self.bind()?;
        // SAFETY: the caller's contract: a live event and a live stream of this context.
        unsafe { result::event::record(event(ev), stream(s)) }.map_err(driver_err("cuEventRecord"))
    }

    unsafe fn event_synchronize(&self, ev: u64) -> Result<()> {
        let _ctx = self.bind()?;
        // SAFETY: the caller's contract: a live event.
        unsafe { result::event::synchronize(event(ev)) }.map_err(driver_err("cuEventSynchronize"))
    }

    unsafe fn stream_wait_event(&self, s: u64, ev: u64) -> Result<()> {
        // `ev` may belong to another device's context (a peer's stream); `s` is ours.
        let _ctx = self.bind()?;
        // SAFETY: the caller's contract: a live event and a live stream of this context.
        unsafe {
            result::stream::wait_event(
                stream(s),
                event(ev),
                sys::CUevent_wait_flags::CU_EVENT_WAIT_DEFAULT,
            )
        }
        .map_err(driver_err("cuStreamWaitEvent"))
    }

    unsafe fn event_destroy(&self, ev: u64) -> Result<()> {
        let _ctx = self.bind()?;
        // SAFETY: the caller's contract: created here, destroyed once. A pending wait on it
        // is resolved by the driver after the destroy.
        unsafe { result::event::destroy(event(ev)) }.map_err(driver_err("cuEventDestroy"))
    }

    fn enable_peer_access(&self, peer: &dyn Driver) -> Result<bool> {
        let Some(peer) = peer.as_any().downcast_ref::<CudarcDriver>() else {
            return Ok(false);
        };
        let mut can = 0;
        // SAFETY: `can` is valid for writes; both devices are valid ordinals.
        unsafe { sys::cuDeviceCanAccessPeer(&mut can, self.ctx.cu_device(), peer.ctx.cu_device()) }
            .result()
            .map_err(driver_err("cuDeviceCanAccessPeer"))?;
        if can == 0 {
            return Ok(false);
        }
        let _ctx = self.bind()?;
        // SAFETY: our context is current; `peer`'s context is live.
        match unsafe { sys::cuCtxEnablePeerAccess(peer.ctx.cu_ctx(), 0) } {
            sys::CUresult::CUDA_SUCCESS | sys::CUresult::CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED => {
                Ok(true)
            }
            e => Err(driver_err("cuCtxEnablePeerAccess")(result::DriverError(e))),
        }
    }
}
