//! DLPack's `stream` argument for CUDA, and the event-based waits that implement it.
//!
//! DLPack (and DESIGN.md) fix the values: `None` or 1 is the legacy default stream, 2 the
//! per-thread default stream, any value > 2 a `cudaStream_t`, -1 "do not synchronise", and 0
//! is invalid (ambiguous). The driver API accepts 1 and 2 directly as `CU_STREAM_LEGACY` and
//! `CU_STREAM_PER_THREAD`. The producer makes the consumer's stream wait for the producer's
//! work by recording an event on its own stream and having the consumer's stream wait on
//! it; nothing blocks the host.

use cudarc::driver::result;
use cudarc::driver::sys;

use super::context::{driver_err, guarded};
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
    fn raw(self) -> Option<sys::CUstream> {
        match self {
            DlpackStream::Legacy => Some(1usize as sys::CUstream),
            DlpackStream::PerThread => Some(2usize as sys::CUstream),
            DlpackStream::Handle(h) => Some(h as usize as sys::CUstream),
            DlpackStream::NoSync => None,
        }
    }
}

/// Makes `consumer` wait (on the device, not the host) for all work queued so far on
/// `producer`, both DLPack stream values of CUDA device `device`. A no-op when either is -1
/// or both name the same stream.
///
/// The caller guarantees that handles > 2 are live streams of that device's primary
/// context (DLPack's contract for the `stream` argument).
pub fn wait_on(device: Device, consumer: Option<i64>, producer: Option<i64>) -> Result<()> {
    let consumer = DlpackStream::from_dlpack(consumer)?;
    let producer = DlpackStream::from_dlpack(producer)?;
    let (Some(c), Some(p)) = (consumer.raw(), producer.raw()) else {
        return Ok(());
    };
    if c == p {
        return Ok(());
    }
    let backend = CudaBackend::get(device)?;
    backend.bind()?;
    guarded(|| {
        let ev = result::event::create(sys::CUevent_flags::CU_EVENT_DISABLE_TIMING)
            .map_err(driver_err("cuEventCreate"))?;
        // SAFETY: `ev` is a fresh event of the current context; `p` and `c` are live
        // streams of it (the caller's contract, or the backend's own stream).
        let queued = unsafe { result::event::record(ev, p) }
            .map_err(driver_err("cuEventRecord(producer stream)"))
            .and_then(|()| {
                // SAFETY: as above.
                unsafe {
                    result::stream::wait_event(
                        c,
                        ev,
                        sys::CUevent_wait_flags::CU_EVENT_WAIT_DEFAULT,
                    )
                }
                .map_err(driver_err("cuStreamWaitEvent(consumer stream)"))
            });
        // SAFETY: destroying an event with a pending wait is allowed: the driver releases it
        // once the wait is resolved.
        let destroyed = unsafe { result::event::destroy(ev) }.map_err(driver_err("cuEventDestroy"));
        queued.and(destroyed)
    })
}

impl CudaBackend {
    /// Makes this backend's stream wait for everything queued on `producer`.
    pub fn wait_for_producer(&self, producer: Option<i64>) -> Result<()> {
        wait_on(self.device, self.dlpack_stream(), producer)
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
