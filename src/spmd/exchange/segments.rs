//! One rank's side of an all-to-all-v, in two steps around the ranks' agreement.
//!
//! [`Segments::prepare`] runs before the agreement and does everything that can fail on one
//! rank alone: it allocates the receive buffer, the staging buffers and the device path's
//! empty tensor, and stages the send buffer from the device into host memory. A failure
//! there is this rank's outcome in the agreement, and so every rank's error. After the
//! agreement, [`Segments::exchange`] only moves the bytes and copies what arrived back to the
//! device.
//!
//! What can still fail on one rank after the bytes moved is device work: the copy of the
//! staged bytes back to the device and the unpack kernels (a driver error, a failed launch).
//! Such exchanges end with one more agreement ([`confirmed`]), so that no rank returns
//! success while another fails, and none goes on to a later collective the failed rank never
//! joins. Host exchanges skip it: their unpack is a loop over checked boxes of buffers that
//! already exist, which the plan guarantees valid, and an extra collective call would cost
//! every host exchange a synchronisation of all ranks for nothing.

use std::sync::Arc;

use crate::access::Role;
use crate::backend::{backend_for, staging_buffer, Backend};
use crate::device::Device;
use crate::dtype::DType;
use crate::error::Result;
use crate::ops::one_memory;
use crate::tensor::Tensor;

use super::super::agree::agree;
use super::super::{Communicator, Segments};

/// `outcome` (this rank's, after an exchange) if every rank succeeded, else the same error on
/// every rank: one all-gather of each rank's outcome. Every rank must call it, or none.
pub(in crate::spmd) fn confirmed<T>(
    comm: &dyn Communicator,
    outcome: Result<T>,
    what: &str,
) -> Result<T> {
    match agree(comm, "confirm", outcome.as_ref().map(|_| 0), what, "") {
        Err(e) => Err(e),
        Ok(_) => outcome,
    }
}

/// The buffers of one rank's exchange, made by [`Segments::prepare`] before the ranks agree.
pub(in crate::spmd) struct Buffers {
    /// What the communicator reads: the send tensor itself (host memory, or device memory a
    /// CUDA-aware communicator takes), or its copy staged in host memory.
    send: Option<Tensor>,
    /// What the communicator writes into.
    recv: Option<Tensor>,
    /// Where staged received bytes go on the device, and the device's backend.
    unstage: Option<(Arc<dyn Backend>, Tensor)>,
    /// For a device exchange: the empty device tensor that stands for a side with no bytes.
    empty: Option<Tensor>,
}

impl Segments<'_> {
    /// The buffers to exchange the segments of `send` (one buffer, a segment per peer) with:
    /// what arrives goes into `into` (this rank's own contiguous tensor on `dev`) when given,
    /// else into a new buffer of `dtype` on `dev`; nothing when nothing arrives. Device memory
    /// goes to the communicator directly when it takes it and both sides are in it, else
    /// through host staging memory of the device as [`staging_buffer`] decides it (pinned on
    /// CUDA up to the pinned cache's size and when it can be had, ordinary host memory
    /// otherwise), into which `send` is copied here. `send` may be on another device than
    /// `dev` (a rank whose sources and targets are on different devices): each side is then
    /// staged on its own, and only `send`'s packed bytes cross.
    pub(in crate::spmd) fn prepare(
        &self,
        comm: &dyn Communicator,
        send: Option<&Tensor>,
        dev: Device,
        dtype: DType,
        itemsize: usize,
        into: Option<Tensor>,
    ) -> Result<Buffers> {
        let total: usize = self.recv_counts.iter().sum();
        let n = total / itemsize;
        let together = send.is_none_or(|t| one_memory(t.device(), dev));
        let host = dev.is_host_accessible();
        // Both sides handed to the communicator as they are; else device memory is staged
        // through the backend's host memory, for a communicator that does not take device
        // pointers (or one call's two sides on two devices).
        let direct = together && (host || comm.accepts_device(dev));
        let (recv, unstage) = match total {
            0 => (None, None),
            _ if direct || host => {
                let recv = match into {
                    Some(t) => t,
                    None => crate::backend::scratch_backend(dev)?.empty(&[n], dtype)?,
                };
                (Some(recv), None)
            }
            _ => {
                let b = backend_for(dev)?;
                let host = staging_buffer(&*b, &[n], dtype)?;
                let out = match into {
                    Some(t) => t,
                    None => b.empty(&[n], dtype)?,
                };
                (Some(host), Some((b.clone(), out)))
            }
        };
        let empty = match direct && !host {
            true => Some(backend_for(dev)?.empty(&[0], DType::UInt8)?),
            false => None,
        };
        let send = match send {
            Some(t) if direct || t.device().is_host_accessible() => Some(t.clone()),
            Some(t) => {
                let b = backend_for(t.device())?;
                let host = staging_buffer(&*b, t.shape(), t.dtype())?;
                b.transfer(t, &host)?;
                Some(host)
            }
            None => None,
        };
        Ok(Buffers {
            send,
            recv,
            unstage,
            empty,
        })
    }

    /// Exchanges the segments through `buffers` (every rank calls this, with or without bytes
    /// to move) and returns what arrived, on the device it was prepared for.
    pub(in crate::spmd) fn exchange(
        &self,
        comm: &dyn Communicator,
        buffers: Buffers,
    ) -> Result<Option<Tensor>> {
        let Buffers {
            send,
            recv,
            unstage,
            empty,
        } = buffers;
        match &empty {
            Some(empty) => {
                let _aside = crate::access::suspend();
                comm.all_to_all_v_device(
                    send.as_ref().unwrap_or(empty),
                    recv.as_ref().unwrap_or(empty),
                    self,
                )?
            }
            None => {
                // What MPI reads and writes, claimed while it does (see `crate::access`).
                let _claim = crate::access::tensors(
                    "exchange",
                    send.iter().map(|t| (Role::new("send buffer"), t)),
                    recv.iter().map(|t| (Role::new("receive buffer"), t)),
                )?;
                // The communicator's code (a program's own, on this thread) meets the memory
                // the operation's scope holds as any other code does: a view it kept would
                // refuse this rank's later claims alone, after the ranks agreed.
                let _aside = crate::access::suspend();
                let recv_bytes: &mut [u8] = match &recv {
                    // SAFETY: `recv` is a contiguous host tensor of `nbytes()` bytes: a buffer
                    // allocated by `prepare`, or this rank's own target (writable, checked
                    // disjoint from every source), which nothing else in this process reads
                    // or writes while the slice lives (claimed above).
                    Some(t) => unsafe { std::slice::from_raw_parts_mut(t.data_ptr(), t.nbytes()) },
                    None => &mut [],
                };
                comm.all_to_all_v(host_bytes(send.as_ref()), recv_bytes, self)?
            }
        }
        drop(send);
        Ok(match (recv, unstage) {
            (Some(host), Some((b, out))) => {
                b.transfer(&host, &out)?;
                Some(out)
            }
            (recv, _) => recv,
        })
    }
}

/// The bytes of a contiguous host tensor (empty for `None`).
fn host_bytes(t: Option<&Tensor>) -> &[u8] {
    match t {
        // SAFETY: a contiguous host tensor of `nbytes()` bytes at `data_ptr()`: a buffer of
        // the exchange's own, or this rank's one source sent in place, which nothing writes
        // while the slice lives (the exchange only reads it).
        Some(t) if t.nbytes() > 0 => unsafe {
            std::slice::from_raw_parts(t.data_ptr(), t.nbytes())
        },
        _ => &[],
    }
}
