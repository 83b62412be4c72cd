//! Page-locked (pinned) host memory for staging a device's data on its way to host-only
//! consumers (an MPI that takes no device pointers): the CUDA backend's
//! [`crate::backend::Backend::empty_staging`].
//!
//! Copies between a device and pinned memory run at the bus's rate by DMA; from pageable
//! memory the driver first copies through a pinned bounce buffer of its own, in chunks. But
//! `cuMemHostAlloc` is expensive: it maps and locks every page and registers them with the
//! device (milliseconds for a few MiB, a good part of a second for a GiB), which would cost
//! more than the copy it speeds up if an exchange in a loop paid it every time. So freed
//! staging buffers are kept per device and handed out again, up to [`pinned_cache_limit`]
//! bytes in all: locked pages are taken from every other process on the machine, so the
//! cache may not grow without bound.

use std::sync::{Arc, Mutex, OnceLock};

use super::context::PinnedBuffer;
use super::driver::Driver;
use super::CudaBackend;
use crate::device::{Device, DeviceType};
use crate::dtype::DType;
use crate::error::{tuple_string, Error, Result};
use crate::tensor::{checked_numel, Tensor};

/// The bytes of freed pinned staging buffers each CUDA device keeps for reuse:
/// `DLPART_PINNED_CACHE_BYTES` if set, else 256 MiB. Read once per process. dlpart's staging
/// (`backend::staging_buffer`) takes pinned memory for buffers of up to this size
/// only, ordinary host memory beyond: 0 turns both the cache and pinned staging off.
pub fn pinned_cache_limit() -> usize {
    static LIMIT: OnceLock<usize> = OnceLock::new();
    *LIMIT.get_or_init(|| {
        std::env::var("DLPART_PINNED_CACHE_BYTES")
            .ok()
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(256 << 20)
    })
}

/// The pinned staging buffers of one device that no tensor uses, oldest first.
pub(crate) struct StagingCache {
    driver: Arc<dyn Driver>,
    limit: usize,
    kept: Mutex<Kept>,
}

#[derive(Default)]
struct Kept {
    bytes: usize,
    free: Vec<PinnedBuffer>,
}

impl StagingCache {
    pub fn new(driver: Arc<dyn Driver>, limit: usize) -> Self {
        StagingCache {
            driver,
            limit,
            kept: Mutex::new(Kept::default()),
        }
    }

    fn kept(&self) -> std::sync::MutexGuard<'_, Kept> {
        // Each update is a push or a remove with its byte count: consistent after a panic.
        self.kept.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A buffer of at least `bytes` (> 0): the smallest kept one that holds them and is not
    /// more than twice their size (a big buffer is not tied up by a small exchange), else a
    /// new one. A failed allocation is [`Error::OutOfMemory`] and leaves the cache as it was.
    pub fn take(&self, bytes: usize) -> Result<PinnedBuffer> {
        let reused = {
            let mut kept = self.kept();
            let fits = |b: &PinnedBuffer| b.len() >= bytes && b.len() / 2 <= bytes;
            let best = (kept.free.iter().enumerate())
                .filter(|(_, b)| fits(b))
                .min_by_key(|(_, b)| b.len())
                .map(|(i, _)| i);
            best.map(|i| {
                let b = kept.free.remove(i);
                kept.bytes -= b.len();
                b
            })
        };
        match reused {
            Some(b) => Ok(b),
            None => PinnedBuffer::alloc(&self.driver, bytes),
        }
    }

    /// Keeps `buf` (no longer used by anyone, no copy queued on it) for reuse if it fits
    /// under the limit, freeing the oldest kept buffers to make room; frees it otherwise.
    pub fn keep(&self, buf: PinnedBuffer) {
        let mut freed = Vec::new();
        {
            let mut kept = self.kept();
            if buf.len() > self.limit || kept.free.try_reserve(1).is_err() {
                freed.push(buf);
            } else {
                while kept.bytes + buf.len() > self.limit {
                    let old = kept.free.remove(0);
                    kept.bytes -= old.len();
                    freed.push(old);
                }
                kept.bytes += buf.len();
                kept.free.push(buf);
            }
        }
        // Freed (cuMemFreeHost) after the lock: the driver call may wait for the device.
        drop(freed);
    }

    /// Frees every kept buffer.
    pub fn release(&self) {
        let all = std::mem::take(&mut *self.kept());
        drop(all);
    }

    /// The bytes kept now.
    pub fn kept_bytes(&self) -> usize {
        self.kept().bytes
    }
}

/// The owner of a staging tensor: hands its buffer back to the cache when the last view of
/// it goes.
struct Staged {
    buf: Option<PinnedBuffer>,
    cache: Arc<StagingCache>,
}

// SAFETY: the owner only holds the buffer until it is handed back; it never reads or writes
// the memory, which the tensors viewing it reach through their own pointer.
unsafe impl Sync for Staged {}

impl Drop for Staged {
    fn drop(&mut self) {
        if let Some(buf) = self.buf.take() {
            // Every dlpart copy into or out of staging memory waits for its stream before it
            // returns, so nothing is queued on the buffer when its last tensor goes.
            self.cache.keep(buf);
        }
    }
}

/// The device a staging tensor is labelled with: DLPack's name for memory from
/// `cuMemHostAlloc`, host-accessible like `kDLCPU`.
pub(crate) const STAGING_DEVICE: Device = Device {
    kind: DeviceType::CudaHost,
    id: 0,
};

impl CudaBackend {
    /// [`crate::backend::Backend::empty_staging`]: pinned host memory, reused from this
    /// device's cache.
    pub(super) fn staging_tensor(&self, shape: &[usize], dtype: DType) -> Result<Tensor> {
        let n = checked_numel(shape)?;
        let bytes = n
            .checked_mul(dtype.itemsize())
            .ok_or_else(|| Error::shape("tensor too large", tuple_string(shape)))?;
        let (data, owner): (*mut u8, crate::tensor::Owner) = if bytes == 0 {
            (std::ptr::null_mut(), Arc::new(()))
        } else {
            let _ctx = self.bind()?;
            let buf = self.guarded(|| self.staging.take(bytes))?;
            let data = buf.as_ptr();
            let owner = Staged {
                buf: Some(buf),
                cache: self.staging.clone(),
            };
            (data, Arc::new(owner))
        };
        // SAFETY: the buffer holds at least numel * itemsize bytes of host memory, laid out
        // in C order for `shape`, and goes back to the cache only when `owner` drops; the
        // tensor is empty when `data` is null.
        Ok(unsafe { Tensor::contiguous_unchecked(data, shape, dtype, STAGING_DEVICE, owner) })
    }

    /// Frees the pinned staging buffers this device keeps for reuse (see
    /// [`pinned_cache_limit`]), as `torch.cuda.empty_cache` does for its pools; buffers in use
    /// are freed when their tensors go.
    pub fn release_staging(&self) {
        self.staging.release();
    }

    /// The bytes of pinned staging buffers this device keeps for reuse now.
    pub fn kept_staging_bytes(&self) -> usize {
        self.staging.kept_bytes()
    }
}

#[cfg(all(test, feature = "kernel-host-tests"))]
mod tests {
    use super::*;
    use crate::backend::Backend;

    #[test]
    fn the_cache_keeps_the_newest_buffers_under_its_limit_and_frees_the_rest_once() {
        // Emulated device 44 is this test's (the SPMD staged tests take 40 to 43): its pinned
        // counts are ours.
        let be = CudaBackend::emulated(44);
        let cache = StagingCache::new(be.driver.clone(), 1000);
        let base = be.emulated_pinned();
        let counts = || {
            let c = be.emulated_pinned();
            (c.allocs - base.allocs, c.frees - base.frees)
        };
        let (a, b) = (cache.take(600).unwrap(), cache.take(600).unwrap());
        let (pa, pb) = (a.as_ptr(), b.as_ptr());
        cache.keep(a);
        cache.keep(b); // over the limit: the older one (a) is freed
        assert_eq!((cache.kept_bytes(), counts()), (600, (2, 1)));
        cache.keep(cache.take(2000).unwrap()); // larger than the limit: freed at once
        assert_eq!((cache.kept_bytes(), counts()), (600, (3, 2)));
        // A request of half the kept buffer or less gets a new one; 300 to 600 bytes reuse it.
        let small = cache.take(299).unwrap();
        assert_eq!(counts(), (4, 2));
        let reused = cache.take(300).unwrap();
        assert_eq!((reused.as_ptr(), counts()), (pb, (4, 2)));
        assert_ne!(reused.as_ptr(), pa);
        cache.keep(small);
        cache.keep(reused);
        assert_eq!(cache.kept_bytes(), 899);
        cache.release();
        assert_eq!((cache.kept_bytes(), counts()), (0, (4, 4)));
        assert_eq!(be.emulated_pinned().live_bytes, base.live_bytes);
    }

    #[test]
    fn a_staging_tensor_is_pinned_host_memory_the_device_copies_into() {
        // Emulated device 45 is this test's (the SPMD staged tests' devices(40, 4) stage
        // through 41's cache): its pinned counts and kept bytes are ours.
        let be = CudaBackend::emulated(45);
        let host = Tensor::from_slice(&[1.5f64, -2.0, 3.25, 4.0, 5.0, 6.0], &[2, 3]).unwrap();
        let dev = be.empty(&[2, 3], DType::Float64).unwrap();
        be.transfer(&host, &dev).unwrap();
        let staged = be.empty_staging(&[2, 3], DType::Float64).unwrap();
        assert_eq!(staged.device(), STAGING_DEVICE);
        assert!(staged.is_contiguous() && !staged.readonly());
        be.transfer(&dev, &staged).unwrap();
        assert_eq!(
            staged.to_array::<f64>().unwrap(),
            host.to_array::<f64>().unwrap()
        );
        let empty = be.empty_staging(&[0, 3], DType::Float64).unwrap();
        assert_eq!(empty.numel(), 0);
        let before = be.emulated_pinned();
        drop(staged);
        // Back in the cache, not freed; a view keeps it alive until the view goes too.
        assert_eq!(be.emulated_pinned(), before);
        assert_eq!(be.kept_staging_bytes(), 48);
        let again = be.empty_staging(&[6], DType::Float64).unwrap();
        let view = again.view(&[1], &[2]).unwrap();
        drop(again);
        assert_eq!(be.kept_staging_bytes(), 0);
        drop(view);
        assert_eq!(be.kept_staging_bytes(), 48);
        be.release_staging();
        assert_eq!(be.emulated_pinned().frees, before.frees + 1);
    }
}
