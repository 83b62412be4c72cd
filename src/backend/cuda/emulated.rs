//! The driver emulated on the host, for tests only (feature `kernel-host-tests`): the backend
//! above it (job tables, index checks, transfers, scratch, stream waits, pinned staging)
//! runs unchanged on a machine without a GPU, and its launches run the real kernel source
//! built for the host (`host_kernels.rs`).
//!
//! Device memory is host memory, poisoned when allocated (as uninitialised device memory
//! may hold anything) and registered, so that every copy, memset and kernel access is checked
//! to stay inside one live allocation: a kernel touching host memory, or a copy past the end
//! of scratch, fails as `CUDA_ERROR_ILLEGAL_ADDRESS` / `CUDA_ERROR_INVALID_VALUE` instead of
//! going unnoticed. Queued work runs only when the host waits for it
//! (`emulated_streams.rs`), so a missing wait shows up as stale data. Emulated devices are `kDLCUDA:1000` and up, reachable only through
//! [`CudaBackend::emulated`] and from each other: [`crate::backend::backend_for`] never
//! returns them (but in this crate's own unit tests, `cfg(test)`), so users never get one
//! as a `kDLCUDA` device. Each device counts its pinned host allocations and frees
//! ([`CudaBackend::emulated_pinned`]), and a limit on them makes allocations fail. Tests
//! can also make one given allocation or copy of a device fail
//! ([`CudaBackend::fail_emulated`]), to see what a driver error at that point does.

use std::alloc::{alloc, dealloc, Layout};
use std::any::Any;
use std::collections::{BTreeMap, HashMap};
use std::ffi::c_void;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use super::driver::{Bound, Driver, Kernel};
use super::emulated_streams as streams;
use super::host_kernels::{self, LaunchError, Region};
use super::jobs::BLOCK;
use super::nvrtc::SOURCES;
use super::CudaBackend;
use crate::device::Device;
use crate::error::{Error, Result};

/// The id of emulated device 0: far above any real device ordinal, so that an emulated
/// tensor handed to the real backend is refused as an invalid device.
pub const EMULATED_ID_BASE: i32 = 1000;

/// Stream handles of emulated devices: `STREAM_BASE + n` for device n (never 0, 1 or 2).
const STREAM_BASE: u64 = 0x5eed_0000;

/// The byte uninitialised emulated memory is filled with.
const POISON: u8 = 0xa5;

/// Live allocations by address: their layout and device (`None` for pinned host memory).
type Allocations = BTreeMap<u64, (Layout, Option<i32>)>;

fn memory() -> &'static Mutex<Allocations> {
    static MEMORY: OnceLock<Mutex<Allocations>> = OnceLock::new();
    MEMORY.get_or_init(Default::default)
}

fn backends() -> &'static Mutex<HashMap<i32, Arc<CudaBackend>>> {
    static BACKENDS: OnceLock<Mutex<HashMap<i32, Arc<CudaBackend>>>> = OnceLock::new();
    BACKENDS.get_or_init(Default::default)
}

fn fail(op: impl Into<String>, message: impl Into<String>) -> Error {
    Error::Backend {
        backend: "cuda",
        op: op.into(),
        message: message.into(),
    }
}

/// Allocates `bytes` (> 0 after rounding up) host bytes, poisoned, and registers them.
fn allocate(bytes: usize, align: usize, device: Option<i32>, op: &str) -> Result<u64> {
    let layout = Layout::from_size_align(bytes.max(1), align)
        .map_err(|e| fail(op, format!("CUDA_ERROR_OUT_OF_MEMORY: {e}")))?;
    // SAFETY: the layout has a non-zero size.
    let p = unsafe { alloc(layout) };
    if p.is_null() {
        return Err(fail(op, "CUDA_ERROR_OUT_OF_MEMORY"));
    }
    // SAFETY: `p` holds `layout.size()` bytes, just allocated.
    unsafe { p.write_bytes(POISON, layout.size()) };
    let at = p as u64;
    memory()
        .lock()
        .expect("emulated memory lock")
        .insert(at, (layout, device));
    Ok(at)
}

/// Unregisters and frees an allocation of `device` (`None`: pinned); returns its bytes as
/// asked for (at least 1).
///
/// # Safety
/// Nothing uses the memory any more.
unsafe fn release(at: u64, device: Option<i32>) -> usize {
    let entry = memory().lock().expect("emulated memory lock").remove(&at);
    match entry {
        Some((layout, d)) if d == device => {
            // SAFETY: allocated by `allocate` with this layout, unregistered just above so
            // freed once.
            unsafe { dealloc(at as *mut u8, layout) };
            layout.size()
        }
        other => panic!("emulated driver: freeing {at:#x}, which is {other:?}, not {device:?}"),
    }
}

/// Checks that `addr..addr + len` lies in one live device allocation.
fn check_range(addr: u64, len: usize, op: &str) -> Result<()> {
    let mem = memory().lock().expect("emulated memory lock");
    let inside = mem.range(..=addr).next_back().is_some_and(|(&at, (l, d))| {
        d.is_some() && addr - at <= l.size() as u64 && len as u64 <= l.size() as u64 - (addr - at)
    });
    if inside {
        Ok(())
    } else {
        Err(fail(
            op,
            format!(
                "CUDA_ERROR_INVALID_VALUE: {len} bytes at {addr:#x} are not inside one device \
                 allocation"
            ),
        ))
    }
}

/// The emulated driver of emulated device `n` (`kDLCUDA:{EMULATED_ID_BASE + n}`).
pub(crate) struct EmulatedDriver {
    n: i32,
    launches: AtomicU64,
    pinned: Mutex<PinnedCounts>,
    copies: Mutex<CopyCounts>,
    /// Calls made to fail: each entry fails the call of its kind after skipping that many.
    faults: Mutex<Vec<(EmulatedCall, usize)>>,
}

/// A driver call of an emulated device that a test can make fail
/// ([`CudaBackend::fail_emulated`]).
#[doc(hidden)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EmulatedCall {
    /// `cuMemAlloc`: fails as `CUDA_ERROR_OUT_OF_MEMORY`.
    Alloc,
    /// `cuMemAllocHost`: fails as `CUDA_ERROR_OUT_OF_MEMORY`.
    AllocPinned,
    /// `cuMemcpyHtoDAsync`: fails as `CUDA_ERROR_UNKNOWN`.
    CopyHtod,
    /// `cuMemcpyDtoHAsync`: fails as `CUDA_ERROR_UNKNOWN`.
    CopyDtoh,
}

impl EmulatedDriver {
    /// Fails this `call` (made as `op`) if a test asked for it, counting it otherwise.
    fn injected(&self, call: EmulatedCall, op: &str) -> Result<()> {
        let mut faults = self.faults.lock().expect("emulated faults lock");
        let Some(i) = faults.iter().position(|f| f.0 == call) else {
            return Ok(());
        };
        if faults[i].1 > 0 {
            faults[i].1 -= 1;
            return Ok(());
        }
        faults.remove(i);
        let code = match call {
            EmulatedCall::Alloc | EmulatedCall::AllocPinned => "CUDA_ERROR_OUT_OF_MEMORY",
            EmulatedCall::CopyHtod | EmulatedCall::CopyDtoh => "CUDA_ERROR_UNKNOWN",
        };
        Err(fail(op, format!("{code}: made to fail by the test")))
    }
}

/// What an emulated device's pinned host allocations have been, for tests: each device
/// counts its own, so tests on other devices running at the same time do not disturb them.
#[doc(hidden)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PinnedCounts {
    /// Allocations made (`cuMemHostAlloc`).
    pub allocs: usize,
    /// Allocations freed (`cuMemFreeHost`); freeing one twice panics.
    pub frees: usize,
    /// Bytes allocated and not yet freed.
    pub live_bytes: usize,
    /// The most bytes that may be live at once: beyond it an allocation fails with
    /// `CUDA_ERROR_OUT_OF_MEMORY`, as on a machine with no memory left that the OS can
    /// lock.
    pub limit: usize,
}

/// What an emulated device's copies between host and device memory have moved, for tests
/// (each device counts its own): the bytes that crossed the bus, job tables included.
#[doc(hidden)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CopyCounts {
    /// Copies from host to device memory queued (`cuMemcpyHtoDAsync`).
    pub htod: usize,
    /// Their bytes.
    pub htod_bytes: usize,
    /// Copies from device to host memory queued (`cuMemcpyDtoHAsync`).
    pub dtoh: usize,
    /// Their bytes.
    pub dtoh_bytes: usize,
}

/// Whether `len` bytes at `addr` lie in one pinned host allocation.
fn is_pinned(addr: u64, len: usize) -> bool {
    let mem = memory().lock().expect("emulated memory lock");
    mem.range(..=addr).next_back().is_some_and(|(&at, (l, d))| {
        d.is_none() && addr - at <= l.size() as u64 && len as u64 <= l.size() as u64 - (addr - at)
    })
}

/// The byte sizes of a kernel's parameters, in order (kernels/*.cu).
fn param_sizes(kernel: Kernel) -> &'static [usize] {
    match kernel {
        Kernel::Copy(_) => &[8, 4, 4],
        Kernel::Gather(_) | Kernel::Scatter(_) => &[8, 4, 4, 8, 8, 8],
        Kernel::Winners => &[8, 8, 8, 8, 8, 8],
        Kernel::Check(_) => &[8, 8, 8, 8, 4, 8, 8],
    }
}

/// Runs `kernel` on the host over the device memory live now.
fn run_kernel(kernel: Kernel, grid: u32, mut args: Vec<u64>, seed: u64) -> Result<()> {
    // Kernels may touch device memory only, of any emulated device (peer access).
    let regions: Vec<Region> = memory()
        .lock()
        .expect("emulated memory lock")
        .iter()
        .filter(|(_, (_, d))| d.is_some())
        .map(|(&at, (l, _))| Region::new(at, l.size(), true))
        .collect();
    // A 4-byte parameter is read from the low half of its slot (little-endian).
    let mut params: Vec<*mut c_void> = args.iter_mut().map(|a| (a as *mut u64).cast()).collect();
    let op = format!("launching {}", kernel.entry());
    // SAFETY: `params` point at the values the backend launched with, in the kernel's
    // order; every global access of the kernel is checked against `regions` (job tables and
    // status words are read plainly: the backend placed them in scratch).
    match unsafe { host_kernels::launch(kernel.entry(), grid, BLOCK, &mut params, seed, &regions) }
    {
        Ok(()) => Ok(()),
        Err(LaunchError::Fault(f)) => Err(fail(
            op,
            format!(
                "CUDA_ERROR_ILLEGAL_ADDRESS: {f:?} (kind 1 misaligned, 2 outside device \
                 memory, 3 read-only)"
            ),
        )),
        Err(e) => Err(fail(op, format!("CUDA_ERROR_INVALID_VALUE: {e:?}"))),
    }
}

impl Driver for EmulatedDriver {
    fn as_any(&self) -> &dyn Any {
        self
    }

    fn bind(&self) -> Result<Bound> {
        Ok(Bound::unchanged())
    }

    /// Few multiprocessors: grids are capped at 16 blocks, so the kernels' grid-stride loops
    /// run more than once.
    fn sm_count(&self) -> u32 {
        2
    }

    fn stream(&self) -> u64 {
        STREAM_BASE + self.n as u64
    }

    /// Checks that the host build has every kernel the GPU build has.
    fn load_kernels(&self) -> Result<()> {
        static MISSING: OnceLock<Vec<&'static str>> = OnceLock::new();
        let missing = MISSING.get_or_init(|| {
            let have = host_kernels::entries();
            SOURCES
                .iter()
                .flat_map(|s| s.entries.iter().copied())
                .filter(|e| !have.iter().any(|h| h == e))
                .collect()
        });
        if missing.is_empty() {
            Ok(())
        } else {
            Err(fail(
                "loading the host build of the kernels",
                format!("kernels/host/launch.cpp lacks {missing:?}"),
            ))
        }
    }

    fn alloc(&self, bytes: usize) -> Result<u64> {
        let op = format!("cuMemAlloc({bytes} bytes)");
        self.injected(EmulatedCall::Alloc, &op)?;
        allocate(bytes, 256, Some(self.n), &op)
    }

    unsafe fn free(&self, ptr: u64) {
        // As cuMemFree: queued work that may use the memory runs first.
        streams::drain_all();
        // SAFETY: the caller's contract; no work is queued any more.
        unsafe { release(ptr, Some(self.n)) };
    }

    fn alloc_pinned(&self, bytes: usize) -> Result<*mut u8> {
        let op = format!("cuMemAllocHost({bytes} bytes)");
        self.injected(EmulatedCall::AllocPinned, &op)?;
        let mut counts = self.pinned.lock().expect("pinned counts lock");
        if bytes > counts.limit.saturating_sub(counts.live_bytes) {
            return Err(fail(
                op,
                "CUDA_ERROR_OUT_OF_MEMORY: the pinned limit is reached",
            ));
        }
        let at = allocate(bytes, 64, None, &op)?;
        counts.allocs += 1;
        counts.live_bytes += bytes.max(1);
        Ok(at as *mut u8)
    }

    unsafe fn free_pinned(&self, ptr: *mut u8) {
        streams::drain_all();
        // SAFETY: the caller's contract; no work is queued any more.
        let bytes = unsafe { release(ptr as u64, None) };
        let mut counts = self.pinned.lock().expect("pinned counts lock");
        counts.frees += 1;
        counts.live_bytes -= bytes;
    }

    unsafe fn memset_zero(&self, dst: u64, bytes: usize) -> Result<()> {
        check_range(dst, bytes, "cuMemsetD8Async")?;
        let op = move || {
            // SAFETY: checked to lie in one allocation, which frees only after queued work.
            unsafe { (dst as *mut u8).write_bytes(0, bytes) };
            Ok(())
        };
        streams::enqueue(self.stream(), Box::new(op), "cuMemsetD8Async")
    }

    unsafe fn copy_htod(&self, dst: u64, src: &[u8]) -> Result<()> {
        self.injected(EmulatedCall::CopyHtod, "cuMemcpyHtoDAsync")?;
        check_range(dst, src.len(), "cuMemcpyHtoDAsync")?;
        let len = src.len();
        {
            let mut copies = self.copies.lock().expect("copy counts lock");
            copies.htod += 1;
            copies.htod_bytes += len;
        }
        // A pinned source is read when the copy runs; a pageable one is staged now.
        let op: streams::Op = if is_pinned(src.as_ptr() as u64, len) {
            let from = src.as_ptr() as u64;
            Box::new(move || {
                // SAFETY: pinned memory the caller leaves alone until the copy has run, and
                // a device allocation that frees only after queued work; they do not overlap.
                unsafe { std::ptr::copy_nonoverlapping(from as *const u8, dst as *mut u8, len) };
                Ok(())
            })
        } else {
            let staged = src.to_vec();
            Box::new(move || {
                // SAFETY: as above; `staged` is our own.
                unsafe { std::ptr::copy_nonoverlapping(staged.as_ptr(), dst as *mut u8, len) };
                Ok(())
            })
        };
        streams::enqueue(self.stream(), op, "cuMemcpyHtoDAsync")
    }

    unsafe fn copy_dtoh(&self, dst: &mut [u8], src: u64) -> Result<()> {
        self.injected(EmulatedCall::CopyDtoh, "cuMemcpyDtoHAsync")?;
        check_range(src, dst.len(), "cuMemcpyDtoHAsync")?;
        let (to, len) = (dst.as_mut_ptr() as u64, dst.len());
        {
            let mut copies = self.copies.lock().expect("copy counts lock");
            copies.dtoh += 1;
            copies.dtoh_bytes += len;
        }
        let op = move || {
            // SAFETY: `src` holds `len` bytes of a device allocation; `to` is the caller's
            // buffer, pinned and left alone until it synchronises, or pageable and
            // borrowed for this call, which runs the copy before returning.
            unsafe { std::ptr::copy_nonoverlapping(src as *const u8, to as *mut u8, len) };
            Ok(())
        };
        streams::enqueue(self.stream(), Box::new(op), "cuMemcpyDtoHAsync")?;
        if is_pinned(to, len) {
            Ok(())
        } else {
            // Into pageable memory the copy is synchronous, and reports earlier failures.
            streams::synchronize(self.stream())
        }
    }

    unsafe fn launch(&self, kernel: Kernel, grid: u32, params: &mut [*mut c_void]) -> Result<()> {
        let sizes = param_sizes(kernel);
        if params.len() != sizes.len() {
            return Err(fail(
                format!("launching {}", kernel.entry()),
                format!(
                    "CUDA_ERROR_INVALID_VALUE: {} parameters for {}",
                    params.len(),
                    sizes.len()
                ),
            ));
        }
        // The values are taken now, as the driver does.
        let args: Vec<u64> = params
            .iter()
            .zip(sizes)
            .map(|(&p, &size)| {
                // SAFETY: the caller's contract: each parameter points at a live value of
                // the kernel's parameter type, of `size` bytes.
                unsafe {
                    if size == 4 {
                        u64::from(p.cast::<u32>().read_unaligned())
                    } else {
                        p.cast::<u64>().read_unaligned()
                    }
                }
            })
            .collect();
        // Threads run in order on one launch in four, shuffled otherwise.
        let seed = self.launches.fetch_add(1, Ordering::Relaxed) % 4;
        let op = move || run_kernel(kernel, grid, args, seed);
        streams::enqueue(self.stream(), Box::new(op), "cuLaunchKernel")
    }

    fn synchronize(&self) -> Result<()> {
        streams::synchronize(self.stream())
    }

    fn event_create(&self) -> Result<u64> {
        Ok(streams::event_create())
    }

    unsafe fn event_record(&self, ev: u64, stream: u64) -> Result<()> {
        streams::event_record(ev, stream)
    }

    unsafe fn event_synchronize(&self, ev: u64) -> Result<()> {
        streams::event_synchronize(ev)
    }

    unsafe fn stream_wait_event(&self, stream: u64, ev: u64) -> Result<()> {
        streams::stream_wait_event(stream, ev)
    }

    unsafe fn event_destroy(&self, ev: u64) -> Result<()> {
        streams::event_destroy(ev)
    }

    /// Emulated devices 0 and 1 reach each other's memory; any other pair does not, so
    /// that both the peer path and the pinned staging of transfers run.
    fn enable_peer_access(&self, peer: &dyn Driver) -> Result<bool> {
        Ok(peer
            .as_any()
            .downcast_ref::<EmulatedDriver>()
            .is_some_and(|p| self.n < 2 && p.n < 2))
    }
}

/// The emulated backend of `device`, if one was made.
pub(super) fn backend_of(device: Device) -> Result<Arc<CudaBackend>> {
    backends()
        .lock()
        .expect("emulated backend registry lock")
        .get(&device.id.wrapping_sub(EMULATED_ID_BASE))
        .filter(|b| b.device == device)
        .cloned()
        .ok_or_else(|| Error::InvalidDevice {
            text: device.to_string(),
            reason: "no emulated CUDA device has this id".into(),
        })
}

impl CudaBackend {
    /// The CUDA backend of emulated device `n`, on `kDLCUDA:{1000 + n}`, over the host
    /// emulation of the driver: for tests only (feature `kernel-host-tests`). Never returned
    /// by [`crate::backend::backend_for`] or [`CudaBackend::get`] outside this crate's own
    /// unit tests (which reach it through them once made, to run code that picks backends
    /// by device, such as the SPMD exchange).
    #[doc(hidden)]
    pub fn emulated(n: u32) -> Arc<CudaBackend> {
        let n = i32::try_from(n).expect("a small emulated device number");
        let mut map = backends().lock().expect("emulated backend registry lock");
        map.entry(n)
            .or_insert_with(|| {
                let driver = Arc::new(EmulatedDriver {
                    n,
                    launches: AtomicU64::new(0),
                    pinned: Mutex::new(PinnedCounts {
                        allocs: 0,
                        frees: 0,
                        live_bytes: 0,
                        limit: usize::MAX,
                    }),
                    copies: Mutex::new(CopyCounts::default()),
                    faults: Mutex::new(Vec::new()),
                });
                streams::add_stream(driver.stream());
                Arc::new(CudaBackend::over(
                    Device::cuda(EMULATED_ID_BASE + n),
                    driver,
                    true,
                ))
            })
            .clone()
    }

    fn emulated_driver(&self) -> &EmulatedDriver {
        assert!(self.emulated, "{} is not an emulated device", self.device);
        (self.driver.as_any().downcast_ref::<EmulatedDriver>())
            .expect("an emulated backend runs over the emulated driver")
    }

    /// The pinned host allocations of this emulated device so far (tests only).
    #[doc(hidden)]
    pub fn emulated_pinned(&self) -> PinnedCounts {
        *self
            .emulated_driver()
            .pinned
            .lock()
            .expect("pinned counts lock")
    }

    /// The copies between host and device memory this emulated device has queued so far
    /// (tests only).
    #[doc(hidden)]
    pub fn emulated_copies(&self) -> CopyCounts {
        *self
            .emulated_driver()
            .copies
            .lock()
            .expect("copy counts lock")
    }

    /// Makes the `call` after the next `skip` ones of this emulated device fail, once, as a
    /// driver error (tests only).
    #[doc(hidden)]
    pub fn fail_emulated(&self, call: EmulatedCall, skip: usize) {
        self.emulated_driver()
            .faults
            .lock()
            .expect("emulated faults lock")
            .push((call, skip));
    }

    /// Whether every call made to fail by [`CudaBackend::fail_emulated`] has failed (tests
    /// only).
    #[doc(hidden)]
    pub fn emulated_faults_spent(&self) -> bool {
        (self.emulated_driver().faults.lock())
            .expect("emulated faults lock")
            .is_empty()
    }

    /// Sets the most pinned bytes this emulated device may have live at once (tests only).
    #[doc(hidden)]
    pub fn set_emulated_pinned_limit(&self, bytes: usize) {
        self.emulated_driver()
            .pinned
            .lock()
            .expect("pinned counts lock")
            .limit = bytes;
    }
}

#[cfg(test)]
#[path = "emulated_tests.rs"]
mod tests;
