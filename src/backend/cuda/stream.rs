//! DLPack's `stream` argument for CUDA, and the event-based waits that implement it.
//!
//! DLPack fixes the values: `None` or 1 is the legacy default stream, 2 the
//! per-thread default stream, any value > 2 a `cudaStream_t`, -1 "do not synchronise", and 0
//! is invalid (ambiguous). The driver API accepts 1 and 2 directly as `CU_STREAM_LEGACY` and
//! `CU_STREAM_PER_THREAD`. The producer makes the consumer's stream wait for the producer's
//! work by recording an event on its own stream and having the consumer's stream wait on
//! it; nothing blocks the host.

use super::CudaBackend;
use crate::backend::Backend;
use crate::device::Device;
use crate::error::{Error, Result};

/// A validated DLPack `stream` value for a CUDA device.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DlpackStream {
    /// `None` or 1.
    Legacy,
    /// 2.
    PerThread,
    /// A `cudaStream_t` / `CUstream` (any value > 2).
    Handle(u64),
    /// -1: the consumer asked for no synchronisation.
    NoSync,
}

impl DlpackStream {
    /// Validates a DLPack `stream` argument; 0 and values below -1 are refused.
    pub fn from_dlpack(stream: Option<i64>) -> Result<Self> {
        match stream {
            None | Some(1) => Ok(DlpackStream::Legacy),
            Some(2) => Ok(DlpackStream::PerThread),
            Some(-1) => Ok(DlpackStream::NoSync),
            Some(0) => Err(Error::buffer(
                "stream=0 is ambiguous and not allowed by DLPack for CUDA; use 1 for the legacy \
                 default stream or 2 for the per-thread default stream",
            )),
            Some(s) if s > 2 => Ok(DlpackStream::Handle(s as u64)),
            Some(s) => Err(Error::buffer(format!(
                "stream={s} is not a valid DLPack stream for CUDA (expected None, -1, 1, 2 or a \
                 stream handle)"
            ))),
        }
    }

    /// The value to pass as DLPack's `stream` argument.
    pub fn to_dlpack(self) -> i64 {
        match self {
            DlpackStream::Legacy => 1,
            DlpackStream::PerThread => 2,
            DlpackStream::Handle(h) => h as i64,
            DlpackStream::NoSync => -1,
        }
    }

    /// The driver handle; `None` for [`DlpackStream::NoSync`].
    fn raw(self) -> Option<u64> {
        match self {
            DlpackStream::Legacy => Some(1),
            DlpackStream::PerThread => Some(2),
            DlpackStream::Handle(h) => Some(h),
            DlpackStream::NoSync => None,
        }
    }
}

/// The raw `(consumer, producer)` streams to order, or `None` when there is nothing to do:
/// either is -1, or both name the same stream.
fn streams_to_order(consumer: Option<i64>, producer: Option<i64>) -> Result<Option<(u64, u64)>> {
    let consumer = DlpackStream::from_dlpack(consumer)?;
    let producer = DlpackStream::from_dlpack(producer)?;
    Ok(match (consumer.raw(), producer.raw()) {
        (Some(c), Some(p)) if c != p => Some((c, p)),
        _ => None,
    })
}

/// Makes `consumer` wait (on the device, not the host) for all work queued so far on
/// `producer`, both DLPack stream values of CUDA device `device`. A no-op when either is -1
/// or both name the same stream.
///
/// The caller guarantees that handles > 2 are live streams of that device's primary
/// context (DLPack's contract for the `stream` argument).
pub fn wait_on(device: Device, consumer: Option<i64>, producer: Option<i64>) -> Result<()> {
    match streams_to_order(consumer, producer)? {
        None => Ok(()),
        Some((c, p)) => CudaBackend::get(device)?.order_streams(c, p),
    }
}

impl CudaBackend {
    /// Makes this backend's stream wait for everything queued on `producer`.
    pub fn wait_for_producer(&self, producer: Option<i64>) -> Result<()> {
        self.wait_streams(self.dlpack_stream(), producer)
    }

    /// Blocks the calling thread until everything queued so far on the DLPack stream
    /// `producer` of this device has run; -1 waits for nothing. For memory the host reads
    /// directly (`kDLCUDAHost`, `kDLCUDAManaged`) a wait on the device orders nothing: the
    /// host itself must wait before it reads what the producer's kernels may still write.
    pub fn host_wait_for(&self, producer: Option<i64>) -> Result<()> {
        let Some(p) = DlpackStream::from_dlpack(producer)?.raw() else {
            return Ok(());
        };
        // SAFETY: `ev` was recorded on `p` just now, in the current context.
        self.after_event_on(p, |ev| unsafe { self.driver.event_synchronize(ev) })
    }

    /// [`wait_on`] for this backend's device.
    pub(super) fn wait_streams(&self, consumer: Option<i64>, producer: Option<i64>) -> Result<()> {
        match streams_to_order(consumer, producer)? {
            None => Ok(()),
            Some((c, p)) => self.order_streams(c, p),
        }
    }

    /// Queues on `consumer` a wait for the work queued so far on `producer`.
    fn order_streams(&self, consumer: u64, producer: u64) -> Result<()> {
        // SAFETY: `ev` was recorded on `producer` just now; `consumer` is a live stream of the
        // current context (the caller's contract, or the backend's own stream).
        self.after_event_on(producer, |ev| unsafe {
            self.driver.stream_wait_event(consumer, ev)
        })
    }

    /// Records a fresh event on `producer` (the legacy or per-thread default stream, or a live
    /// stream of this device's context: DLPack's contract, or the backend's own stream), hands
    /// it to `then` (which waits on it, on the host or on a stream), and destroys it.
    fn after_event_on(&self, producer: u64, then: impl FnOnce(u64) -> Result<()>) -> Result<()> {
        let _ctx = self.bind()?;
        self.guarded(|| {
            let ev = self.driver.event_create()?;
            // SAFETY: `ev` is a fresh event of the current context; `producer` is a stream of
            // it, as above.
            let done = unsafe { self.driver.event_record(ev, producer) }.and_then(|()| then(ev));
            // SAFETY: created just above and destroyed once, after `then`; destroying an event
            // with a pending stream wait is allowed: the driver releases it once the wait is
            // resolved.
            let destroyed = unsafe { self.driver.event_destroy(ev) };
            done.and(destroyed)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dlpack_stream_values_follow_the_standard() {
        assert_eq!(
            DlpackStream::from_dlpack(None).unwrap(),
            DlpackStream::Legacy
        );
        assert_eq!(
            DlpackStream::from_dlpack(Some(1)).unwrap(),
            DlpackStream::Legacy
        );
        assert_eq!(
            DlpackStream::from_dlpack(Some(2)).unwrap(),
            DlpackStream::PerThread
        );
        assert_eq!(
            DlpackStream::from_dlpack(Some(-1)).unwrap(),
            DlpackStream::NoSync
        );
        assert_eq!(
            DlpackStream::from_dlpack(Some(0x7f00_1234)).unwrap(),
            DlpackStream::Handle(0x7f00_1234)
        );
        for bad in [0, -2, i64::MIN] {
            let e = DlpackStream::from_dlpack(Some(bad))
                .unwrap_err()
                .to_string();
            assert!(e.contains(&format!("stream={bad}")), "{e}");
        }
        for s in [1, 2, -1, 0x7f00_1234] {
            assert_eq!(DlpackStream::from_dlpack(Some(s)).unwrap().to_dlpack(), s);
        }
    }

    #[test]
    fn no_sync_and_same_stream_waits_need_no_driver() {
        // These return before touching the driver, so they pass on machines without CUDA.
        wait_on(Device::cuda(0), Some(-1), Some(5)).unwrap();
        wait_on(Device::cuda(0), Some(5), Some(-1)).unwrap();
        wait_on(Device::cuda(0), Some(7), Some(7)).unwrap();
        wait_on(Device::cuda(0), None, Some(1)).unwrap();
        assert!(wait_on(Device::cuda(0), Some(0), Some(5)).is_err());
    }
}
