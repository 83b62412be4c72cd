//! Device backends: the kernels that move bytes on the device where they already are.
//!
//! Every backend implements [`Backend`]. [`backend_for`] picks the one for a device: the CPU
//! backend for host-accessible memory, the CUDA backend for `kDLCUDA` (feature `cuda`; without
//! it a stub with the same API returns [`Error::BackendUnavailable`]). Callers (the `ops` layer)
//! validate arguments first; backends may assume shapes fit, boxes are in bounds, indices are
//! normalised to `[0, len)` (by the backend's own [`Backend::normalise_indices`], on its
//! device), and the destination is writable.

pub mod cpu;
#[cfg(feature = "cuda")]
pub mod cuda;
// Without the feature, a stub with the same API (every entry point BackendUnavailable): the
// one `cfg` on the backend seam, so that `ops` and the bindings need none.
#[cfg(not(feature = "cuda"))]
#[path = "cuda_stub.rs"]
pub mod cuda;

use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU64, Ordering};
use std::sync::Arc;

use crate::device::{Device, DeviceType};
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::plan::Plan;
use crate::tensor::Tensor;

/// One box copy at a backend: the planner's [`crate::plan::BoxCopy`] with the tensors
/// themselves. Both tensors have the same dtype and live on the backend's device.
pub type BoxCopy<'a> = crate::plan::BoxCopy<&'a Tensor>;

impl<'a> BoxCopy<'a> {
    /// The copy of all of `src` into `dst` (of the same shape).
    pub fn whole(src: &'a Tensor, dst: &'a Tensor) -> Self {
        let zeros = vec![0; src.ndim()];
        BoxCopy {
            src,
            src_start: zeros.clone(),
            dst,
            dst_start: zeros,
            shape: src.shape().to_vec(),
        }
    }
}

/// The operations every device backend provides.
pub trait Backend: Send + Sync {
    /// The device this backend runs on.
    fn device(&self) -> Device;

    /// A new contiguous tensor with unspecified contents (in host memory never uninitialised
    /// bytes: zero, or what a reused buffer held).
    fn empty(&self, shape: &[usize], dtype: DType) -> Result<Tensor>;

    /// New contiguous tensors of `shapes`, with unspecified contents: the targets of one
    /// repartition. Backends may carve small ones out of one allocation (which then lives
    /// until the last of them is dropped).
    fn empty_many(&self, shapes: &[&[usize]], dtype: DType) -> Result<Vec<Tensor>> {
        // A loop into a Vec of the final size (see the CPU backend's).
        let mut out = Vec::with_capacity(shapes.len());
        for s in shapes {
            out.push(self.empty(s, dtype)?);
        }
        Ok(out)
    }

    /// A new contiguous tensor in host memory with unspecified contents, suited for staging
    /// this device's data on its way to or from code that reads only host memory:
    /// page-locked memory on CUDA, which the device copies to and from by DMA at the bus's
    /// rate, kept for reuse as it is expensive to get; ordinary host memory elsewhere (this
    /// default). [`Backend::transfer`] copies between it and the device, into the buffers
    /// given. Allocation failure is [`Error::OutOfMemory`]. dlpart's own staging asks
    /// `staging_buffer` (in this module), which decides when pinned memory is worth having.
    fn empty_staging(&self, shape: &[usize], dtype: DType) -> Result<Tensor> {
        cpu::CpuBackend::shared(Device::CPU).empty(shape, dtype)
    }

    /// Runs every copy, after checking that the jobs' destination boxes share no element with
    /// each other or with another job's source box (a source overlapping its own destination
    /// is fine); jobs that do are refused with [`Error::Buffer`], as their copies would race.
    fn copy_boxes(&self, jobs: &[BoxCopy<'_>]) -> Result<()> {
        crate::overlap::check_jobs(jobs)?;
        // SAFETY: the destinations were just checked disjoint from each other and from every
        // other job's source.
        unsafe { self.copy_boxes_unchecked(jobs) }
    }

    /// Runs every copy, without the overlap check of [`Backend::copy_boxes`].
    ///
    /// # Safety
    /// Destination boxes share no element with each other, and no job's destination shares an
    /// element with another job's source (a source overlapping its own destination is fine):
    /// the backend writes the boxes from several threads or kernels at once.
    unsafe fn copy_boxes_unchecked(&self, jobs: &[BoxCopy<'_>]) -> Result<()>;

    /// Runs every copy of `plan`, from `src[op.src]` into `dst[op.dst]` for each [`BoxCopy`](crate::plan::BoxCopy):
    /// `src` and `dst` hold one tensor per partition of the plan's source and target grid (C
    /// order), of the partitions' shapes, of one dtype, all on this backend's device (or, on
    /// the CPU, in host-accessible memory). The default hands the plan's copies to
    /// [`Backend::copy_boxes_unchecked`]; a backend may check the tensors once each instead of
    /// once per box, which is what thousands of small boxes cost.
    ///
    /// # Safety
    /// The target tensors share no element with each other, and no target shares an element
    /// with a source tensor (the contract of [`Backend::copy_boxes_unchecked`] for every box
    /// of the plan; `ops` checks it, or allocates the targets itself).
    unsafe fn copy_plan(&self, plan: &Plan, src: &[&Tensor], dst: &[&Tensor]) -> Result<()> {
        let jobs = plan
            .ops()
            .map(|op| op.on(src, dst))
            .collect::<Option<Vec<_>>>()
            .ok_or_else(|| {
                Error::shape(
                    "copy_plan needs one tensor per partition of both grids",
                    format!("{} source and {} target tensors", src.len(), dst.len()),
                )
            })?;
        // SAFETY: the caller guarantees the targets disjoint from each other and from the
        // sources, so every box's destination is too.
        unsafe { self.copy_boxes_unchecked(&jobs) }
    }

    /// Checks `indices` (1-d, any integer dtype) against an axis `axis` of length `len`, on
    /// this backend's device, and returns them as [`Backend::gather`] and [`Backend::scatter`]
    /// take them: a 1-d int64 tensor on this device with every value in `[0, len)`. Negative
    /// values count from the end, as in numpy; a value outside `[-len, len)` is
    /// [`Error::IndexOutOfRange`] naming the first such one, before anything is written. Host
    /// indices are accepted by every backend (a device backend copies them over first);
    /// indices on another device are refused. Every backend returns a copy it owns, read
    /// once from `indices` and checked there: the caller's memory may be rewritten by another
    /// thread after the check, so the kernels must never read it again.
    fn normalise_indices(&self, indices: &Tensor, axis: usize, len: usize) -> Result<Tensor>;

    /// `out[.., i, ..] = src[.., indices[i], ..]` along `axis`. `indices` is a 1-d int64 tensor
    /// on this device with every value in `[0, src.shape[axis])`, as
    /// [`Backend::normalise_indices`] returns them.
    fn gather(&self, src: &Tensor, indices: &Tensor, axis: usize, out: &Tensor) -> Result<()>;

    /// [`crate::ops::gather`]'s work from the caller's `indices` as they are (1-d, any integer
    /// dtype, negative ones counting from the end): the checks of
    /// [`Backend::normalise_indices`] and of `out`, with nothing written to a given `out`
    /// unless every index is in range, then the gather. Returns `out`, allocated on this
    /// device when not given. The default gathers from the normalised copy; a backend may
    /// instead read the caller's indices on their way into the kernel, as long as each index
    /// is read once for its use: the value checked must be the value used, whatever another
    /// thread writes to the caller's memory meanwhile.
    fn gather_from_caller(
        &self,
        src: &Tensor,
        indices: &Tensor,
        axis: usize,
        out: Option<&Tensor>,
    ) -> Result<Tensor> {
        crate::ops::gather_normalised(self, src, indices, axis, out)
    }

    /// `out[.., indices[i], ..] = values[.., i, ..]` along `axis`; later duplicates win.
    fn scatter(&self, values: &Tensor, indices: &Tensor, axis: usize, out: &Tensor) -> Result<()>;

    /// Waits until all work queued by this backend is done.
    fn synchronize(&self) -> Result<()> {
        Ok(())
    }

    /// Copies all of `src` into `dst` (same shape and dtype, `dst` writable), one of them on
    /// this backend's device and the other on a device it reaches: host memory for every
    /// backend, other CUDA devices for CUDA. Returns once the data has arrived. This is how
    /// data crosses devices; [`crate::ops::to_device`] picks the backend.
    fn transfer(&self, src: &Tensor, dst: &Tensor) -> Result<()>;

    /// The DLPack `stream` value to hand a producer when importing onto this device, so that
    /// it makes our queue wait for its work; `None` where the device has no streams.
    fn dlpack_stream(&self) -> Option<i64> {
        None
    }

    /// Export side of DLPack's `stream` argument: makes the consumer's `stream` wait for the
    /// work this backend has queued. A no-op where work is never left queued (the CPU).
    fn make_consumer_wait(&self, stream: Option<i64>) -> Result<()> {
        let _ = stream;
        Ok(())
    }
}

/// Host memory to stage data of `device_side`'s device in, on its way to or from code that
/// reads host memory only: dlpart's one staging policy, which the host side of a repartition
/// with `transfer` (`ops/crossing.rs`) and an SPMD exchange through a communicator that takes
/// no device pointers (`spmd/exchange/segments.rs`) both follow.
///
/// - Up to [`cuda::pinned_cache_limit`] bytes (256 MiB by default): the device's pinned
///   staging memory ([`Backend::empty_staging`]), which the device reads and writes by DMA at
///   the bus's rate, and which its cache keeps for reuse once the tensor goes: an operation in
///   a loop pins its buffers once.
/// - Beyond that: ordinary `kDLCPU` memory, which the driver copies through a pinned buffer
///   of its own. Pinning a new buffer of a GiB takes a good part of a second (see
///   `backend/cuda/staging.rs`), more than that copy, and the cache would not keep it for the
///   next call. `DLPART_PINNED_CACHE_BYTES=0` so turns pinned staging off.
/// - Pinned memory that cannot be had ([`Error::OutOfMemory`]: a low memlock limit, other
///   processes' pinned buffers): ordinary `kDLCPU` memory too, noted in the log. Pinned memory
///   only makes the copies faster; the slower pageable copy still moves the bytes.
///
/// Any other error is returned. A backend without pinned memory (the CPU's) gives ordinary
/// host memory either way.
pub(crate) fn staging_buffer(
    device_side: &dyn Backend,
    shape: &[usize],
    dtype: DType,
) -> Result<Tensor> {
    staging_buffer_within(device_side, shape, dtype, cuda::pinned_cache_limit())
}

/// [`staging_buffer`] with `pinned_max` bytes in place of [`cuda::pinned_cache_limit`] (which
/// is read once per process): for callers' tests.
pub(crate) fn staging_buffer_within(
    device_side: &dyn Backend,
    shape: &[usize],
    dtype: DType,
    pinned_max: usize,
) -> Result<Tensor> {
    let pageable = || backend_for(Device::CPU)?.empty(shape, dtype);
    let bytes = crate::tensor::checked_numel(shape)?.saturating_mul(dtype.itemsize());
    if bytes > pinned_max {
        return pageable();
    }
    match device_side.empty_staging(shape, dtype) {
        Err(Error::OutOfMemory { bytes, device, .. }) => {
            log::info!(
                "{}: no {bytes} bytes of {device} memory to stage in; staging through \
                 pageable host memory",
                device_side.device()
            );
            pageable()
        }
        other => other,
    }
}

/// The `kDLCPU` ids in use here: 0, and those of host devices a framework emulates (JAX with
/// `--xla_force_host_platform_device_count` labels its buffers `kDLCPU:k`).
static HOST_DEVICES: AtomicI32 = AtomicI32::new(1);

/// Records that ids `0..count` of `kDLCPU` are in use here: called when a tensor on
/// `kDLCPU:k` is imported (with `k + 1`), and by adapters of frameworks that emulate several
/// host devices, so that [`check_present`] accepts them as targets.
pub fn note_host_devices(count: i32) {
    HOST_DEVICES.fetch_max(count, Ordering::Relaxed);
}

/// Checks that `device` exists on this machine, for a device a caller names as the place to
/// put data: no device has a negative id; `kDLCPU` has the id 0 and those of [`note_host_devices`], and `kDLCUDA:n` needs
/// `n` below the driver's device count (when a driver is there to ask; without one, using
/// the device reports [`Error::BackendUnavailable`]). Other device types cannot be enumerated
/// here and pass; a device named only as a partition's location may be on another machine
/// and is not checked.
pub fn check_present(device: Device) -> Result<()> {
    check_id(device)?;
    let hosts = HOST_DEVICES.load(Ordering::Relaxed);
    match device.kind {
        DeviceType::Cpu if device.id >= hosts => Err(Error::InvalidDevice {
            text: device.to_string(),
            reason: match hosts {
                1 => "this machine has one CPU device, kDLCPU:0 ('cpu')".into(),
                n => format!(
                    "the CPU devices here are kDLCPU:0 to kDLCPU:{} (a framework's emulated \
                     host devices)",
                    n - 1
                ),
            },
        }),
        DeviceType::Cuda => cuda::check_present(device),
        _ => Ok(()),
    }
}

/// Whether dlpart has kernels for every one of `devices`: the [`Error::BackendUnavailable`]
/// of the first without any (kDLOneAPI, ...), whose data only its own library can copy, so
/// that an operation says so before it suggests a transfer that could not run. Host memory
/// and CUDA devices pass (a CUDA backend that cannot load reports that when used).
pub(crate) fn check_kernels(devices: impl IntoIterator<Item = Device>) -> Result<()> {
    for d in devices {
        if !d.is_host_accessible() && d.kind != DeviceType::Cuda {
            backend_for(d)?;
        }
    }
    Ok(())
}

/// [`check_present`] for a device to import data onto (`from_dlpack(x, device=...)`), where the
/// producer, not dlpart, may be the one to put it there: a `kDLCUDA` device, or `kDLCUDAHost`
/// memory, also needs a usable CUDA driver ([`Error::BackendUnavailable`] naming the device
/// otherwise, the error moving data there with [`crate::ops::to_device`] gives), so that a
/// device this machine lacks is named as such rather than left to the producer's refusal.
pub fn check_reachable(device: Device) -> Result<()> {
    check_present(device)?;
    match device.kind {
        DeviceType::Cuda | DeviceType::CudaHost => cuda::check_driver(device),
        _ => Ok(()),
    }
}

/// The device dlpart's own scratch copies of data on `device` go on: host memory of any
/// kind is worked on as `kDLCPU` memory (the CPU backend reads and writes every host kind),
/// so that dlpart allocates no pinned or managed memory for its own use.
pub(crate) fn scratch_device(device: Device) -> Device {
    match device.is_host_accessible() && device.kind != DeviceType::Cpu {
        true => Device::CPU,
        false => device,
    }
}

/// The device a new result read from data on `device` goes on, where dlpart chooses it (a
/// gather without `out`): `device` itself, unless it is host memory of a kind dlpart does not
/// make (`kDLCUDAManaged`, `kDLROCMHost`: see [`Error::NoNewMemory`]), whose results go in
/// `kDLCPU` memory, as dlpart's scratch copies of it do ([`scratch_device`]): host memory,
/// as the source is, that the host reads as it reads the source. Pinned `kDLCUDAHost`
/// memory, which dlpart makes through CUDA, stays pinned.
pub(crate) fn result_device(device: Device) -> Device {
    match device.kind {
        DeviceType::CudaManaged | DeviceType::RocmHost => Device::CPU,
        _ => device,
    }
}

/// The backend that allocates dlpart's own scratch buffers for data on `device` (see
/// [`scratch_device`]).
pub(crate) fn scratch_backend(device: Device) -> Result<Arc<dyn Backend>> {
    backend_for(scratch_device(device))
}

/// Refuses a device of negative id ([`Device`]'s fields are public, so one can be built
/// without [`Device::new`], which refuses it): no DLPack device has one.
fn check_id(device: Device) -> Result<()> {
    match device.id {
        0.. => Ok(()),
        _ => Err(Error::InvalidDevice {
            text: device.to_string(),
            reason: "the device id must be >= 0".into(),
        }),
    }
}

/// The backend for `device`; an error for a device of negative id.
pub fn backend_for(device: Device) -> Result<Arc<dyn Backend>> {
    check_id(device)?;
    let chosen = match device.kind {
        k if k.is_host_accessible() => Ok(cpu::CpuBackend::shared(device)),
        DeviceType::Cuda => cuda::CudaBackend::shared(device),
        // dlpart has no kernels of its own for these devices: what a backend that cannot load
        // here is to its users (the Python layer goes through the producer's array-API
        // namespace where it can).
        kind => Err(Error::BackendUnavailable {
            backend: kind.name(),
            reason: format!(
                "dlpart has no kernels for {device}, only for host memory and CUDA devices; \
                 copy its data with its own library"
            ),
        }),
    };
    if first_use(device) && log::log_enabled!(log::Level::Info) {
        announce(device, &chosen);
    }
    chosen
}

/// Whether this is the first call for `device` in this process. After that it costs one
/// atomic load for `kDLCPU` and `kDLCUDA:0..64`: asking the logger whether a record is wanted
/// costs about 100 ns (measured), which a loop of small operations would notice.
fn first_use(device: Device) -> bool {
    static HOST: AtomicBool = AtomicBool::new(false);
    static CUDA: AtomicU64 = AtomicU64::new(0);
    static OTHERS: std::sync::Mutex<std::collections::BTreeSet<Device>> =
        std::sync::Mutex::new(std::collections::BTreeSet::new());
    match (device.kind, device.id) {
        (DeviceType::Cpu, 0) => {
            !HOST.load(Ordering::Relaxed) && !HOST.swap(true, Ordering::Relaxed)
        }
        (DeviceType::Cuda, id @ 0..=63) => {
            let bit = 1u64 << id;
            CUDA.load(Ordering::Relaxed) & bit == 0
                && CUDA.fetch_or(bit, Ordering::Relaxed) & bit == 0
        }
        _ => OTHERS.lock().is_ok_and(|mut seen| seen.insert(device)),
    }
}

/// Logs which kernels serve `device` (or why none do): at its first use in the process, so
/// once per device, as this runs for every operation.
fn announce(device: Device, chosen: &Result<Arc<dyn Backend>>) {
    match chosen {
        Ok(_) if device.kind == DeviceType::Cuda => {
            log::info!("{device}: dlpart's CUDA kernels")
        }
        Ok(_) => log::info!("{device}: dlpart's CPU kernels"),
        Err(e) => log::info!("{device}: no dlpart kernels here ({e})"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_ids_beyond_those_in_use_are_not_present() {
        assert!(check_present(Device::CPU).is_ok());
        // Other tests may note up to a few host devices; none notes 1000.
        let e = check_present(Device::new(DeviceType::Cpu, 1000).unwrap()).unwrap_err();
        assert!(matches!(e, Error::InvalidDevice { .. }), "{e:?}");
        assert!(e.to_string().contains("kDLCPU:1000"), "{e}");
        note_host_devices(3);
        assert!(check_present(Device::new(DeviceType::Cpu, 2).unwrap()).is_ok());
        let e = check_present(Device::new(DeviceType::Cpu, 1000).unwrap()).unwrap_err();
        assert!(e.to_string().contains("kDLCPU:0 to kDLCPU:"), "{e}");
    }

    #[test]
    fn the_cpu_backend_transfers_through_the_trait() {
        let b = backend_for(Device::CPU).unwrap();
        let vals: Vec<i32> = (0..12).collect();
        let src = Tensor::from_slice(&vals, &[3, 4]).unwrap();
        let cols = src.view(&[0, 1], &[3, 2]).unwrap(); // strided: every row, columns 1..3
        let dst = b.empty(&[3, 2], DType::Int32).unwrap();
        b.transfer(&cols, &dst).unwrap();
        let got = dst.to_array::<i32>().unwrap().into_raw_vec_and_offset().0;
        assert_eq!(got, vec![1, 2, 5, 6, 9, 10]);
        // Shapes must match.
        let e = b.transfer(&src, &dst).unwrap_err().to_string();
        assert!(
            e.contains("shapes differ") && e.contains("(3, 4) -> (3, 2)"),
            "{e}"
        );
    }

    #[test]
    fn the_cpu_backend_checks_host_indices_naming_the_bad_one() {
        let b = backend_for(Device::CPU).unwrap();
        // Every other int16 of [-1, 7, 2, 7, -9, 7]: the first bad one is -9, not 7.
        let raw = Tensor::from_slice(&[-1i16, 7, 2, 7, -9, 7], &[6]).unwrap();
        // SAFETY: three int16 two elements apart lie inside `raw`, kept alive by its owner.
        let strided = unsafe {
            Tensor::from_raw_parts(
                raw.data_ptr(),
                vec![3],
                vec![2],
                DType::Int16,
                Device::CPU,
                true,
                raw.owner().clone(),
            )
        };
        match b.normalise_indices(&strided, 1, 5) {
            Err(Error::IndexOutOfRange {
                index: -9,
                axis: 1,
                len: 5,
            }) => {}
            other => panic!("expected index -9 out of range, got {other:?}"),
        }
        let ok = b.normalise_indices(&strided, 1, 10).unwrap();
        assert_eq!(ok.dtype(), DType::Int64);
        assert_eq!(
            ok.to_array::<i64>().unwrap().into_raw_vec_and_offset().0,
            vec![9, 2, 1]
        );
        // Even in-range contiguous int64 indices come back as a copy: the kernels must never
        // read the caller's memory, which another thread may rewrite after the check.
        let plain = Tensor::from_slice(&[0i64, 4], &[2]).unwrap();
        assert_ne!(
            b.normalise_indices(&plain, 0, 5).unwrap().data_ptr(),
            plain.data_ptr()
        );
    }

    #[test]
    fn the_cpu_backend_refuses_indices_on_a_device() {
        let b = backend_for(Device::CPU).unwrap();
        let host = Tensor::from_slice(&[0i64], &[1]).unwrap();
        // SAFETY: only the descriptor is inspected; the refusal comes before any read.
        let on_gpu = unsafe {
            Tensor::from_raw_parts(
                host.data_ptr(),
                vec![1],
                vec![1],
                DType::Int64,
                Device::cuda(0),
                true,
                host.owner().clone(),
            )
        };
        let e = b.normalise_indices(&on_gpu, 0, 3).unwrap_err().to_string();
        assert!(e.contains("kDLCUDA:0") && e.contains("CPU backend"), "{e}");
    }

    #[test]
    fn the_cpu_backend_stages_in_ordinary_host_memory() {
        let b = backend_for(Device::CPU).unwrap();
        let t = b.empty_staging(&[2, 3], DType::Int16).unwrap();
        assert_eq!(
            (t.device(), t.shape(), t.dtype()),
            (Device::CPU, &[2, 3][..], DType::Int16)
        );
        assert!(t.is_contiguous() && !t.readonly());
    }

    /// The staging policy on an emulated CUDA device of its own (80): pinned up to the limit,
    /// ordinary `kDLCPU` memory beyond it and when no pinned memory can be had, either way a
    /// buffer the device transfers into.
    #[cfg(feature = "kernel-host-tests")]
    #[test]
    fn staging_is_pinned_up_to_the_limit_and_pageable_beyond_it_or_without_pinned_memory() {
        use cuda::{CudaBackend, EmulatedCall};
        let be = CudaBackend::emulated(80);
        let vals: Vec<f32> = (0..101).map(|i| i as f32 * 0.5).collect();
        let on_device = be.empty(&[101], DType::Float32).unwrap();
        be.transfer(&Tensor::from_slice(&vals, &[101]).unwrap(), &on_device)
            .unwrap();
        let base = be.emulated_pinned();
        let allocs = || be.emulated_pinned().allocs - base.allocs;
        // Lands where `want` says, and the device's bytes arrive in it.
        let staged = |t: Tensor, n: usize, want: DeviceType| {
            assert_eq!((t.device().kind, t.shape()), (want, &[n][..]));
            assert!(t.is_contiguous() && !t.readonly());
            be.transfer(&on_device.view(&[0], &[n]).unwrap(), &t)
                .unwrap();
            assert_eq!(t.to_array::<f32>().unwrap().as_slice().unwrap(), &vals[..n]);
        };
        let pinned = DeviceType::CudaHost;
        // 400 bytes: at the limit, pinned; 404: beyond it, pageable, no pinned allocation.
        let t = staging_buffer_within(&*be, &[100], DType::Float32, 400).unwrap();
        staged(t, 100, pinned);
        assert_eq!(allocs(), 1);
        let t = staging_buffer_within(&*be, &[101], DType::Float32, 400).unwrap();
        staged(t, 101, DeviceType::Cpu);
        assert_eq!(allocs(), 1);
        // The first buffer is back in the cache and serves a request of its size again.
        let t = staging_buffer_within(&*be, &[100], DType::Float32, 400).unwrap();
        assert_eq!((t.device().kind, allocs()), (pinned, 1));
        drop(t);
        be.release_staging();
        // No pinned memory to be had (the device's limit, a failed cuMemAllocHost): pageable.
        be.set_emulated_pinned_limit(be.emulated_pinned().live_bytes + 100);
        let t = staging_buffer_within(&*be, &[50], DType::Float32, 400).unwrap();
        staged(t, 50, DeviceType::Cpu);
        be.set_emulated_pinned_limit(usize::MAX);
        be.fail_emulated(EmulatedCall::AllocPinned, 0);
        let t = staging_buffer_within(&*be, &[50], DType::Float32, 400).unwrap();
        assert!(be.emulated_faults_spent());
        staged(t, 50, DeviceType::Cpu);
        assert_eq!(allocs(), 1);
        // Without a fault, pinned again; the default limit is the cache's.
        let t = staging_buffer(&*be, &[50], DType::Float32).unwrap();
        let want = match 200 <= cuda::pinned_cache_limit() {
            true => pinned,
            false => DeviceType::Cpu,
        };
        assert_eq!(t.device().kind, want);
        drop(t);
        be.release_staging();
        assert_eq!(be.emulated_pinned().live_bytes, base.live_bytes);
        // Other errors are the caller's: a shape too large to count is refused, not staged.
        let e = staging_buffer_within(&*be, &[usize::MAX, 2], DType::Float32, 400).unwrap_err();
        assert!(matches!(e, Error::Shape { .. }), "{e:?}");
        // The CPU backend stages in ordinary host memory under the limit too.
        let cpu = backend_for(Device::CPU).unwrap();
        let t = staging_buffer_within(&*cpu, &[3], DType::Float32, 400).unwrap();
        assert_eq!(t.device(), Device::CPU);
    }

    #[test]
    fn the_cpu_backend_has_no_stream_to_wait_on() {
        let b = backend_for(Device::CPU).unwrap();
        assert_eq!(b.dlpack_stream(), None);
        b.make_consumer_wait(None).unwrap();
        b.make_consumer_wait(Some(-1)).unwrap();
    }
}
