//! Copies between host memory and CUDA devices, and between CUDA devices.
//!
//! Every transfer returns once the data has arrived. Strided sides are packed or unpacked
//! where the data is (with the CPU loop on the host, with the box-copy kernel on a device),
//! so the bus only ever carries the contiguous elements. Between devices the destination's
//! kernel reads the source directly when peer access is possible, otherwise the bytes are
//! staged through pinned host memory.

use std::borrow::Cow;

use super::context::PinnedBuffer;
use super::{whole_copy, CudaBackend};
use crate::backend::cpu::copy_strided;
use crate::backend::{Backend, BoxCopy};
use crate::device::DeviceType;
use crate::error::{tuple_string, Error, Result};
use crate::tensor::{contiguous_strides, zeroed_vec, Tensor};

fn check_pair(src: &Tensor, dst: &Tensor, op: &str) -> Result<()> {
    if src.shape() != dst.shape() || src.dtype() != dst.dtype() {
        return Err(Error::shape(
            format!("{op}: source and destination differ"),
            format!(
                "{} {} -> {} {}",
                src.dtype(),
                tuple_string(src.shape()),
                dst.dtype(),
                tuple_string(dst.shape())
            ),
        ));
    }
    if dst.readonly() {
        return Err(Error::ReadOnly {
            what: format!("the destination {dst:?}"),
        });
    }
    Ok(())
}

/// The elements of a host tensor in C order: borrowed when contiguous, packed otherwise.
fn host_bytes(t: &Tensor) -> Result<Cow<'_, [u8]>> {
    let n = t.nbytes();
    if n == 0 {
        return Ok(Cow::Borrowed(&[]));
    }
    if t.is_contiguous() {
        // SAFETY: a contiguous tensor's elements are the `n` bytes from `data_ptr`, host
        // accessible (checked by the caller) and kept alive by `t`'s owner while `t` lives.
        return Ok(Cow::Borrowed(unsafe {
            std::slice::from_raw_parts(t.data_ptr(), n)
        }));
    }
    let mut buf = zeroed_vec(n, || format!("packing {t:?} for an upload"))?;
    // SAFETY: `t`'s elements are readable host memory (tensor invariant, checked by the
    // caller); `buf` holds `n` bytes for the C-order destination; the two do not overlap.
    unsafe {
        copy_strided(
            t.data_ptr(),
            t.strides(),
            buf.as_mut_ptr(),
            &contiguous_strides(t.shape()),
            t.shape(),
            t.dtype().itemsize(),
        )
    };
    Ok(Cow::Owned(buf))
}

impl CudaBackend {
    /// `dst` itself when contiguous, else a fresh contiguous tensor of its shape.
    fn contiguous_target(&self, dst: &Tensor) -> Result<Tensor> {
        if dst.is_contiguous() {
            Ok(dst.clone())
        } else {
            self.empty(dst.shape(), dst.dtype())
        }
    }

    /// Queues the copy of all of `src` into `dst`, both on this device (a `src` sharing
    /// memory with `dst` is copied first, and the call then waits: see
    /// `copy_boxes_unchecked`).
    pub(super) fn box_copy(&self, src: &Tensor, dst: &Tensor) -> Result<()> {
        let job = BoxCopy::whole(src, dst);
        // SAFETY: one job: there is no other job whose boxes it could meet.
        unsafe { self.copy_boxes_unchecked(&[job]) }
    }

    /// Writes `bytes` (the C-order elements) into `dst` on this device and waits, also when
    /// it fails: `bytes` may be pinned memory its caller frees next, and the packed copy is
    /// freed when it goes.
    fn upload(&self, bytes: &[u8], dst: &Tensor) -> Result<()> {
        let target = self.contiguous_target(dst)?;
        // SAFETY: `target` is contiguous on this device with exactly `bytes.len()` bytes of
        // elements; the call returns after a pageable source has been staged, and we
        // synchronise below, error or not, before `bytes` can go away.
        let queued =
            unsafe { self.driver.copy_htod(target.data_ptr() as u64, bytes) }.and_then(|()| {
                match dst.is_contiguous() {
                    true => Ok(()),
                    false => self.box_copy(&target, dst),
                }
            });
        let waited = self.driver.synchronize();
        queued.and(waited)
    }

    /// Reads the C-order elements of `src` on this device into `out` and waits, also when it
    /// fails: `out` may be pinned memory its caller frees next, and the packed copy is freed
    /// when it goes.
    fn download(&self, src: &Tensor, out: &mut [u8]) -> Result<()> {
        let packed = match src.is_contiguous() {
            true => None,
            false => Some(self.empty(src.shape(), src.dtype())?),
        };
        let from = packed.as_ref().unwrap_or(src);
        let queued = match &packed {
            Some(tmp) => self.box_copy(src, tmp),
            None => Ok(()),
        }
        .and_then(|()| {
            // SAFETY: `from` is contiguous on this device with `out.len()` bytes of
            // elements; the copy is ordered after the packing kernel, and we synchronise
            // below, error or not, before `out` can go away.
            unsafe { self.driver.copy_dtoh(out, from.data_ptr() as u64) }
        });
        let waited = self.driver.synchronize();
        queued.and(waited)
    }

    /// Copies the host tensor `src` (any host-accessible device) into `dst` on this device.
    pub fn copy_host_to_device(&self, src: &Tensor, dst: &Tensor) -> Result<()> {
        check_pair(src, dst, "copy_host_to_device")?;
        self.check_device(dst, "destination", "copy_host_to_device")?;
        if !src.device().is_host_accessible() {
            return Err(Error::UnsupportedDevice {
                device: src.device().to_string(),
                op: "copy_host_to_device (source must be host memory)".into(),
            });
        }
        if src.numel() == 0 {
            return Ok(());
        }
        let _ctx = self.bind()?;
        self.guarded(|| self.upload(&host_bytes(src)?, dst))
    }

    /// Copies `src` on this device into the host tensor `dst`.
    pub fn copy_device_to_host(&self, src: &Tensor, dst: &Tensor) -> Result<()> {
        check_pair(src, dst, "copy_device_to_host")?;
        self.check_device(src, "source", "copy_device_to_host")?;
        if !dst.device().is_host_accessible() {
            return Err(Error::UnsupportedDevice {
                device: dst.device().to_string(),
                op: "copy_device_to_host (destination must be host memory)".into(),
            });
        }
        let n = src.nbytes();
        if n == 0 {
            return Ok(());
        }
        let _ctx = self.bind()?;
        self.guarded(|| {
            if dst.is_contiguous() {
                // SAFETY: `dst` is contiguous, writable host memory of `n` bytes, not aliased
                // by anything we read.
                let out = unsafe { std::slice::from_raw_parts_mut(dst.data_ptr(), n) };
                return self.download(src, out);
            }
            let mut buf = zeroed_vec(n, || format!("staging a download of {src:?}"))?;
            self.download(src, &mut buf)?;
            // SAFETY: `buf` holds the C-order elements; `dst`'s elements are writable host
            // memory (checked above) and do not overlap `buf`.
            unsafe {
                copy_strided(
                    buf.as_ptr(),
                    &contiguous_strides(src.shape()),
                    dst.data_ptr(),
                    dst.strides(),
                    dst.shape(),
                    dst.dtype().itemsize(),
                )
            };
            Ok(())
        })
    }

    /// Copies `src` on any CUDA device into `dst` on this one: a kernel copy on the same
    /// device (from a copy of `src` when it shares memory with `dst`), a kernel reading over
    /// the peer link when the devices allow it, else staged through pinned host memory.
    pub fn copy_device_to_device(&self, src: &Tensor, dst: &Tensor) -> Result<()> {
        check_pair(src, dst, "copy_device_to_device")?;
        self.check_device(dst, "destination", "copy_device_to_device")?;
        if src.device().kind != DeviceType::Cuda {
            return Err(Error::UnsupportedDevice {
                device: src.device().to_string(),
                op: "copy_device_to_device (source must be on a CUDA device)".into(),
            });
        }
        if src.numel() == 0 {
            return Ok(());
        }
        if src.device() == self.device {
            let _ctx = self.bind()?;
            self.box_copy(src, dst)?;
            return self.synchronize();
        }
        let peer = self.peer(src.device())?;
        let _ctx = self.bind()?;
        self.guarded(|| {
            if self.enable_peer_access(&peer)? {
                // Our kernel must not read `src` before the source device's queued work.
                self.wait_on_other(&peer)?;
                // Memory of two devices: `src` cannot overlap `dst`.
                self.copy_raw(&[whole_copy(src, dst)])?;
                return self.synchronize();
            }
            let mut staging = PinnedBuffer::alloc(&self.driver, src.nbytes())?;
            let bytes = &mut staging.as_mut_slice()[..src.nbytes()];
            {
                // The peer's context for its download; ours again once it is done.
                let _peer = peer.bind()?;
                peer.download(src, bytes)?;
            }
            self.upload(bytes, dst)
        })
    }

    /// Lets this device's kernels read `peer`'s memory; false when the hardware cannot.
    fn enable_peer_access(&self, peer: &CudaBackend) -> Result<bool> {
        self.driver.enable_peer_access(peer.driver.as_ref())
    }

    /// Makes our stream wait for the work queued on `other`'s stream (another device).
    fn wait_on_other(&self, other: &CudaBackend) -> Result<()> {
        let ev = other.driver.event_create()?;
        // SAFETY: `ev` is a fresh event of `other`'s context, recorded on its own stream;
        // our stream may wait on an event of another context.
        let queued = unsafe { other.driver.event_record(ev, other.driver.stream()) }
            // SAFETY: as above; our stream is live.
            .and_then(|()| unsafe { self.driver.stream_wait_event(self.driver.stream(), ev) });
        // SAFETY: created above, destroyed once; a pending wait still resolves.
        let destroyed = unsafe { other.driver.event_destroy(ev) };
        queued.and(destroyed)
    }

    /// [`Backend::transfer`]: `src` and `dst` on this device, another CUDA device this one
    /// reaches, or host memory; one of them is on this device.
    pub(super) fn copy_between(&self, src: &Tensor, dst: &Tensor) -> Result<()> {
        let (s, d) = (src.device(), dst.device());
        if d == self.device && s.is_host_accessible() {
            self.copy_host_to_device(src, dst)
        } else if s == self.device && d.is_host_accessible() {
            self.copy_device_to_host(src, dst)
        } else if d == self.device {
            self.copy_device_to_device(src, dst)
        } else if s == self.device && d.kind == DeviceType::Cuda {
            self.peer(d)?.copy_device_to_device(src, dst)
        } else {
            Err(Error::UnsupportedDevice {
                device: format!("{s} -> {d}"),
                op: "copy_tensor (CUDA transfers)".into(),
            })
        }
    }
}

/// Copies `src` into `dst` (same shape and dtype) between any host-accessible memory and
/// CUDA devices; returns once the data has arrived.
pub fn copy_tensor(src: &Tensor, dst: &Tensor) -> Result<()> {
    let (s, d) = (src.device(), dst.device());
    match (s.kind, d.kind) {
        (_, DeviceType::Cuda) if s.is_host_accessible() => {
            CudaBackend::get(d)?.copy_host_to_device(src, dst)
        }
        (DeviceType::Cuda, _) if d.is_host_accessible() => {
            CudaBackend::get(s)?.copy_device_to_host(src, dst)
        }
        (DeviceType::Cuda, DeviceType::Cuda) => {
            CudaBackend::get(d)?.copy_device_to_device(src, dst)
        }
        _ => Err(Error::UnsupportedDevice {
            device: format!("{s} -> {d}"),
            op: "copy_tensor (CUDA transfers)".into(),
        }),
    }
}
