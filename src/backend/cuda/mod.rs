//! The CUDA backend (feature `cuda`): dlpart's own copy, gather and scatter kernels on
//! `kDLCUDA:n`, compiled at run time by NVRTC for the device's architecture.
//!
//! libcuda and libnvrtc are loaded dynamically on first use; when either is missing the
//! backend reports [`Error::BackendUnavailable`] instead of panicking. One [`CudaBackend`]
//! per device is created on demand and kept for the life of the process: it retains the
//! device's primary context (the one PyTorch, CuPy and JAX use), owns a non-blocking stream
//! that all its work is queued on, and loads the kernels on first use. The context is made
//! current only for the length of each call (`Driver::bind`): the context current on the
//! calling thread before, which is the current device of those frameworks, is current again
//! when the call returns, or when a dlpart buffer is freed.
//!
//! | file | what it holds |
//! |---|---|
//! | `jobs.rs` | lowering strided box copies to job tables (pure host code) |
//! | `nvrtc.rs` | embedded sources, NVRTC compilation to CUBIN/PTX |
//! | `driver.rs` | the driver operations the backend uses, behind one interface |
//! | `cudarc_driver.rs` | that interface on a GPU: cudarc, kernel modules |
//! | `context.rs` | driver errors, device/pinned buffers, scratch |
//! | `index_check.rs` | where indices must be and what the index check found (pure host code) |
//! | `index.rs` | the index check, gather and scatter launches |
//! | `stream.rs` | DLPack stream values and event-based waits |
//! | `staging.rs` | pinned host memory for staging, kept for reuse |
//! | `transfer.rs` | host <-> device and device <-> device copies |
//! | `host_kernels.rs` | the kernel source built for the host, for tests (feature `kernel-host-tests`) |
//! | `emulated.rs` | the driver emulated on the host over it, for tests (feature `kernel-host-tests`) |
//! | `emulated_streams.rs` | the emulation's streams and events: work runs when the host waits |

mod args;
mod jobs;
pub mod nvrtc;

mod context;
mod cudarc_driver;
mod driver;
#[cfg(feature = "kernel-host-tests")]
mod emulated;
#[cfg(feature = "kernel-host-tests")]
mod emulated_streams;
#[cfg(feature = "kernel-host-tests")]
mod host_kernels;
mod index;
mod index_check;
mod staging;
mod stream;
mod transfer;

pub use context::DeviceBuffer;
#[cfg(feature = "kernel-host-tests")]
#[doc(hidden)]
pub use emulated::{CopyCounts, EmulatedCall, PinnedCounts};
pub use staging::pinned_cache_limit;
pub use stream::{wait_on, DlpackStream};
pub use transfer::copy_tensor;

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

use crate::backend::{Backend, BoxCopy};
use crate::device::{Device, DeviceType};
use crate::dtype::DType;
use crate::error::{tuple_string, Devices, Error, Result};
use crate::tensor::{checked_numel, Tensor};
use context::{guarded, Scratch};
use cudarc_driver::CudarcDriver;
use driver::{Bound, Driver, Kernel};
use jobs::{Launch, Mode, RawCopy, MAX_JOB_NUMEL};

/// The driver's device count, or why the driver cannot be used here (the reason of the
/// [`Error::BackendUnavailable`] it gave). Read once per process, as the driver fixes the
/// count at `cuInit`.
fn device_count() -> std::result::Result<i32, String> {
    static COUNT: OnceLock<std::result::Result<i32, String>> = OnceLock::new();
    COUNT
        .get_or_init(|| {
            guarded(cudarc_driver::device_count).map_err(|e| match e {
                Error::BackendUnavailable { reason, .. } => reason,
                e => e.to_string(),
            })
        })
        .clone()
}

/// Checks that `device` (`kDLCUDA:n`) exists here: [`Error::InvalidDevice`] when `n` is not
/// below the driver's device count. Without a usable driver nothing can be counted, so this
/// passes, and the backend's own [`Error::BackendUnavailable`] says what is missing when the
/// device is used (or [`check_driver`], asked first).
pub fn check_present(device: Device) -> Result<()> {
    #[cfg(all(test, feature = "kernel-host-tests"))]
    if device.id >= emulated::EMULATED_ID_BASE {
        return emulated::backend_of(device).map(drop);
    }
    match device_count() {
        Ok(n) if device.id >= n => Err(cudarc_driver::missing_device(device, n)),
        _ => Ok(()),
    }
}

/// Checks that the CUDA driver can be used here, for `device` (a CUDA device, or pinned host
/// memory) to be reachable at all: without it no library in this process reaches a GPU.
/// [`Error::BackendUnavailable`] names `device` and says what is missing.
pub fn check_driver(device: Device) -> Result<()> {
    #[cfg(all(test, feature = "kernel-host-tests"))]
    if device.id >= emulated::EMULATED_ID_BASE {
        return Ok(());
    }
    device_count()
        .map(drop)
        .map_err(|reason| Error::BackendUnavailable {
            backend: "cuda",
            reason: format!("{device} cannot be used here: {reason}"),
        })
}

/// Kernels on one CUDA device. Obtain it with [`CudaBackend::get`] (or
/// [`crate::backend::backend_for`]); all work goes to one stream of the device
/// ([`Backend::dlpack_stream`]).
pub struct CudaBackend {
    device: Device,
    driver: Arc<dyn Driver>,
    sm_count: u32,
    scratch: Mutex<Scratch>,
    /// Freed pinned staging buffers, kept for reuse ([`Backend::empty_staging`]).
    staging: Arc<staging::StagingCache>,
    /// Runs on the host emulation of the driver (tests only): its peers are emulated too,
    /// and no call needs libcuda.
    emulated: bool,
}

impl CudaBackend {
    /// The backend of `device`, as the trait object [`crate::backend::backend_for`] returns.
    pub fn shared(device: Device) -> Result<Arc<dyn Backend>> {
        Ok(Self::get(device)?)
    }

    /// The backend of `device` (`kDLCUDA:n`), created on first use.
    pub fn get(device: Device) -> Result<Arc<CudaBackend>> {
        static BACKENDS: OnceLock<Mutex<HashMap<i32, Arc<CudaBackend>>>> = OnceLock::new();
        if device.kind != DeviceType::Cuda {
            return Err(Error::UnsupportedDevice {
                device: device.to_string(),
                op: "the CUDA backend".into(),
            });
        }
        // This crate's own unit tests reach the emulated devices they made by id, so that
        // code picking backends by device (the SPMD exchange) runs over them; the library
        // and its integration tests never do.
        #[cfg(all(test, feature = "kernel-host-tests"))]
        if device.id >= emulated::EMULATED_ID_BASE {
            return emulated::backend_of(device);
        }
        let map = BACKENDS.get_or_init(Default::default);
        let mut map = map.lock().expect("CUDA backend registry lock");
        if let Some(b) = map.get(&device.id) {
            return Ok(b.clone());
        }
        let driver: Arc<dyn Driver> = Arc::new(guarded(|| CudarcDriver::new(device))?);
        let b = Arc::new(Self::over(device, driver, false));
        map.insert(device.id, b.clone());
        // After the lock: a log record may wait for the GIL.
        drop(map);
        log::debug!(
            "{device}: primary context retained, {} multiprocessors, one non-blocking stream",
            b.sm_count
        );
        Ok(b)
    }

    fn over(device: Device, driver: Arc<dyn Driver>, emulated: bool) -> CudaBackend {
        CudaBackend {
            device,
            sm_count: driver.sm_count(),
            scratch: Mutex::new(Scratch::new(driver.clone())),
            staging: Arc::new(staging::StagingCache::new(
                driver.clone(),
                pinned_cache_limit(),
            )),
            driver,
            emulated,
        }
    }

    /// The backend of another CUDA device, for transfers between devices: an emulated
    /// backend only ever reaches emulated peers.
    fn peer(&self, device: Device) -> Result<Arc<CudaBackend>> {
        #[cfg(feature = "kernel-host-tests")]
        if self.emulated {
            return emulated::backend_of(device);
        }
        CudaBackend::get(device)
    }

    /// Runs a driver call, turning a missing libcuda into [`Error::BackendUnavailable`]; the
    /// host emulation needs no libcuda.
    fn guarded<T>(&self, f: impl FnOnce() -> Result<T>) -> Result<T> {
        if self.emulated {
            return f();
        }
        guarded(f)
    }

    /// Makes the context current on the calling thread (driver calls need it) until the
    /// returned binding goes, which makes the caller's context current again: hold it for
    /// the whole operation.
    pub(crate) fn bind(&self) -> Result<Bound> {
        self.guarded(|| self.driver.bind())
    }

    /// `result`, once the stream has drained if it is an error: work queued before the error
    /// may still read or write the caller's memory, which the caller is free to release once
    /// it has the error. The wait's own error is dropped: the first error is what went
    /// wrong.
    fn settled<T>(&self, result: Result<T>) -> Result<T> {
        if result.is_err() {
            let _ = self.guarded(|| self.driver.synchronize());
        }
        result
    }

    /// Compiles and loads the kernels on first use (about a second of NVRTC per
    /// architecture and process).
    fn load_kernels(&self) -> Result<()> {
        self.guarded(|| self.driver.load_kernels())
    }

    fn check_device(&self, t: &Tensor, role: &str, op: &str) -> Result<()> {
        if t.device() != self.device {
            return Err(Error::DeviceMismatch {
                op: op.into(),
                devices: Devices::Apart(t.device(), self.device),
                reason: format!("the {role} is not on the backend's device"),
            });
        }
        Ok(())
    }

    fn check_writable(t: &Tensor, role: &str) -> Result<()> {
        if t.readonly() {
            return Err(Error::ReadOnly {
                what: format!("the {role} {t:?}"),
            });
        }
        Ok(())
    }

    /// Uploads every launch's job table, then queues the launches. `extra` is zeroed
    /// scratch (index status, then a scatter's winners unless `winners` places them
    /// elsewhere) placed after the tables; `before` runs once it is zeroed and before the
    /// launches. Returns the address of that scratch.
    fn run(
        &self,
        scratch: &mut Scratch,
        launches: &[Launch],
        extra: usize,
        winners: index::WinnerTable,
        before: impl FnOnce(u64) -> Result<()>,
    ) -> Result<u64> {
        self.load_kernels()?;
        // Launches go to our stream, which belongs to our context: make it current even if
        // a call on another device's backend switched contexts on this thread.
        let _ctx = self.bind()?;
        let queued = self.queue(scratch, launches, extra, winners, before);
        self.settled(queued)
    }

    /// [`CudaBackend::run`] once the kernels are loaded and the context is current.
    fn queue(
        &self,
        scratch: &mut Scratch,
        launches: &[Launch],
        extra: usize,
        winners: index::WinnerTable,
        before: impl FnOnce(u64) -> Result<()>,
    ) -> Result<u64> {
        let table_bytes: usize = launches
            .iter()
            .map(|l| l.jobs.len() * size_of::<jobs::CudaJob>())
            .sum();
        let extra_at = table_bytes.next_multiple_of(256);
        let base = scratch.device(extra_at + extra)?;
        if extra > 0 {
            // SAFETY: the region lies inside the scratch allocation sized just above.
            unsafe { self.driver.memset_zero(base + extra_at as u64, extra) }?;
        }
        before(base + extra_at as u64)?;
        if table_bytes > 0 {
            let bytes: Vec<u8> = launches
                .iter()
                .flat_map(|l| l.jobs.iter())
                .flat_map(|j| j.to_bytes())
                .collect();
            scratch.upload(base, &bytes)?;
        }
        let status = base + extra_at as u64;
        let winner = winners.at.unwrap_or(status + 16);
        let mut table = base;
        for l in launches {
            let kernel = match l.mode {
                Mode::Box => Kernel::Copy(l.word),
                Mode::Gather => Kernel::Gather(l.word),
                Mode::Scatter => Kernel::Scatter(l.word),
            };
            let grid = l.ntiles.clamp(1, self.sm_count * 8);
            let mut args =
                args::CopyArgs::new(l, table, winner, status).winner_slots(winners.slots);
            let mut params = args.params();
            // SAFETY: the parameters match the kernel's signature in kernels/*.cu (a job
            // table pointer, two u32, and for index kernels the winner table pointer, its u64
            // slot count and the status pointer); the job table was
            // uploaded on this stream before the launch; every address in it was derived
            // from tensors on this device whose boxes the caller checked to be in bounds.
            unsafe { self.driver.launch(kernel, grid, &mut params) }?;
            table += (l.jobs.len() * size_of::<jobs::CudaJob>()) as u64;
        }
        Ok(status)
    }

    /// Queues the strided `copies` (addresses may be on peer devices).
    fn copy_raw(&self, copies: &[RawCopy]) -> Result<()> {
        let launches = jobs::to_launches(copies, Mode::Box, MAX_JOB_NUMEL)?;
        if !launches.is_empty() {
            // Loaded before the lock: loading may log, and a log record may wait for the GIL.
            self.load_kernels()?;
            let mut scratch = self.scratch.lock().expect("scratch lock");
            let none = index::WinnerTable::default();
            self.run(&mut scratch, &launches, 0, none, |_| Ok(()))?;
        }
        Ok(())
    }

    /// [`Backend::copy_boxes_unchecked`] with the context current, not yet settled.
    fn copy_boxes_queued(&self, jobs: &[BoxCopy<'_>]) -> Result<()> {
        let mut copies = Vec::with_capacity(jobs.len());
        // Copies of the sources that overlap their destinations, and where they go.
        let mut staging = Vec::new();
        let mut staged = Vec::new();
        for j in jobs {
            self.check_device(j.src, "source", "copy_boxes")?;
            self.check_device(j.dst, "destination", "copy_boxes")?;
            Self::check_writable(j.dst, "destination")?;
            if j.src.dtype().itemsize() != j.dst.dtype().itemsize() {
                return Err(Error::shape(
                    "copy_boxes: source and destination item sizes differ",
                    format!("{} and {}", j.src.dtype(), j.dst.dtype()),
                ));
            }
            let s = j.src.view(&j.src_start, &j.shape)?;
            let d = j.dst.view(&j.dst_start, &j.shape)?;
            let s = if crate::overlap::shares_memory(&s, &d) {
                let copy = self.empty(&j.shape, s.dtype())?;
                staging.push(whole_copy(&s, &copy));
                staged.push(copy.clone());
                copy
            } else {
                s
            };
            copies.push(whole_copy(&s, &d));
        }
        // Queued first on our one stream, so every staging copy has run before the copies
        // that write the destinations start.
        let queued = self
            .copy_raw(&staging)
            .and_then(|()| self.copy_raw(&copies));
        if staged.is_empty() {
            return queued;
        }
        // The staging memory is freed when `staged` goes: not before the copies that read
        // it have run, whether or not all of them could be queued.
        let waited = self.driver.synchronize();
        queued.and(waited)
    }
}

/// The copy of all of `src` into `dst` (same shape and item size), as the kernels take it.
fn whole_copy(src: &Tensor, dst: &Tensor) -> RawCopy {
    RawCopy {
        src: src.data_ptr() as u64,
        dst: dst.data_ptr() as u64,
        item: src.dtype().itemsize(),
        shape: src.shape().to_vec(),
        src_strides: src.strides().to_vec(),
        dst_strides: dst.strides().to_vec(),
        axis: None,
        index: 0,
        index_len: 0,
    }
}

impl Backend for CudaBackend {
    fn device(&self) -> Device {
        self.device
    }

    fn empty(&self, shape: &[usize], dtype: DType) -> Result<Tensor> {
        let n = checked_numel(shape)?;
        let bytes = n
            .checked_mul(dtype.itemsize())
            .ok_or_else(|| Error::shape("tensor too large", tuple_string(shape)))?;
        let _ctx = self.bind()?;
        let (data, owner): (*mut u8, crate::tensor::Owner) = if bytes == 0 {
            (std::ptr::null_mut(), Arc::new(()))
        } else {
            let buf = self.guarded(|| DeviceBuffer::alloc(&self.driver, bytes))?;
            (buf.device_ptr() as *mut u8, Arc::new(buf))
        };
        // SAFETY: the allocation holds numel * itemsize bytes laid out in C order for
        // `shape` and lives as long as `owner`; the tensor is empty when `data` is null.
        Ok(unsafe { Tensor::contiguous_unchecked(data, shape, dtype, self.device, owner) })
    }

    /// Page-locked host memory (`cuMemHostAlloc`, labelled `kDLCUDAHost`), kept for reuse
    /// once its tensors go (see [`pinned_cache_limit`]).
    fn empty_staging(&self, shape: &[usize], dtype: DType) -> Result<Tensor> {
        self.staging_tensor(shape, dtype)
    }

    /// A job whose source shares memory with its own destination reads a copy of its source
    /// in fresh device memory, made before any destination is written, as on the CPU: one
    /// kernel reading what it writes would read elements it has already overwritten.
    unsafe fn copy_boxes_unchecked(&self, jobs: &[BoxCopy<'_>]) -> Result<()> {
        let _ctx = self.bind()?;
        let copied = self.copy_boxes_queued(jobs);
        self.settled(copied)
    }

    /// Host indices are copied to this device, then every index is checked there (see
    /// `index.rs`); indices on another CUDA device are refused.
    fn normalise_indices(&self, indices: &Tensor, axis: usize, len: usize) -> Result<Tensor> {
        let _ctx = self.bind()?;
        let normalised = self.normalise_on_device(indices, axis, len);
        self.settled(normalised)
    }

    /// Checks every index on the device; an out-of-range one is reported as
    /// [`Error::IndexOutOfRange`] with its value. Waits for the stream to read that verdict.
    fn gather(&self, src: &Tensor, indices: &Tensor, axis: usize, out: &Tensor) -> Result<()> {
        self.indexed(Mode::Gather, src, indices, axis, out)
    }

    /// Later duplicates win, as on the CPU; checks indices like [`Backend::gather`].
    fn scatter(&self, values: &Tensor, indices: &Tensor, axis: usize, out: &Tensor) -> Result<()> {
        self.indexed(Mode::Scatter, values, indices, axis, out)
    }

    fn synchronize(&self) -> Result<()> {
        let _ctx = self.bind()?;
        self.driver.synchronize()
    }

    /// Host <-> this device, or between this device and another CUDA device (see
    /// [`copy_tensor`]).
    fn transfer(&self, src: &Tensor, dst: &Tensor) -> Result<()> {
        if src.device() != self.device && dst.device() != self.device {
            return Err(Error::DeviceMismatch {
                op: "transfer".into(),
                devices: Devices::move_(src.device(), dst.device()),
                reason: format!("neither side is on the backend's device {}", self.device),
            });
        }
        self.copy_between(src, dst)
    }

    /// This backend's stream, which all its work is queued on.
    fn dlpack_stream(&self) -> Option<i64> {
        Some(self.driver.stream() as i64)
    }

    /// Queues an event wait on the consumer's stream; nothing blocks the host.
    fn make_consumer_wait(&self, stream: Option<i64>) -> Result<()> {
        self.wait_streams(stream, self.dlpack_stream())
    }
}
