//! SPMD partitioned arrays: one process per rank (MPI's model), each holding its own
//! partitions of one global array, and the collective operations between the ranks.
//!
//! The ranks talk through a [`Communicator`]: `MpiComm` (feature `mpi`) implements it over an
//! MPI communicator of the `mpi` crate (rsmpi), `dlpart.mpi` over an mpi4py one, and
//! [`ThreadComm`] over threads of one process (for tests and examples). Every
//! rank calls the same collective functions in the same order with the same global arguments:
//! - [`from_local`]: each rank's own partitions and their global offsets, agreed into one
//!   global grid by one all-gather of metadata (module `local`).
//! - [`repartition`], [`repartition_into`], [`assemble`]: the planner's box copies between
//!   ranks, packed into one buffer per peer with the backend kernels, exchanged by the
//!   communicator's all-to-all-v ([`Communicator::all_to_all_v`]: point-to-point messages
//!   between the ranks with bytes for each other in `MpiComm` and `dlpart.mpi`; one call, or
//!   one per round when `DLPART_MPI_ROUND_BYTES` cuts a host exchange into rounds), unpacked
//!   into the new local partitions; boxes that stay on a rank are copied locally and never
//!   sent (module `exchange`). Where a rank's sources and targets are on devices that are not
//!   one memory (with `transfer`), only the plan's boxes cross between them: those the rank
//!   keeps as a repartition in one process moves them (`ops::crossed`), those it sends packed
//!   on the sources' device, those it receives unpacked on the targets'.
//! - [`gather`], [`scatter`]: `numpy.take` and fancy assignment with global indices, each
//!   index served by the rank holding it.
//! - [`to`]: each rank's partitions moved onto a device of its own (module `moved`).
//!
//! Device buffers go to the communicator directly when it takes them
//! ([`Communicator::accepts_device`]: a CUDA-aware MPI). Otherwise they are staged through
//! host memory, as a repartition with `transfer` in one process stages (one policy,
//! `backend::staging_buffer`): on CUDA, pinned (page-locked) memory
//! ([`crate::backend::Backend::empty_staging`]), which the device copies to and from by DMA at
//! the bus's rate and which is kept per device for reuse, for a buffer of up to
//! [`crate::backend::cuda::pinned_cache_limit`] bytes (`DLPART_PINNED_CACHE_BYTES`, 256 MiB
//! by default), as allocating it costs more than the copies it speeds up; ordinary host
//! memory for a larger one, which the cache would not keep. When no pinned memory can be had,
//! the exchange stages through ordinary host memory too: slower copies, but no failure.
//!
//! Collective safety: a rank that fails before a collective still takes part in it, with its
//! error as payload, and every rank then returns the same [`Error::Collective`] (or the same
//! validation error, computed from the same gathered metadata), so no rank waits forever.
//! Everything of an exchange that can fail on one rank (packing, every buffer, the staging
//! copy of what it sends, the crossing of the boxes it keeps between its devices) happens
//! before that agreement; what can fail after the bytes moved
//! (device work: the copy of what arrived back to the device, the unpack kernels) is agreed
//! on once more when any rank's side is in device memory, and gathers and scatters always
//! confirm (a gather's local picks allocate, on the host too; a scatter's writes are device
//! work on a GPU). What a rank may choose on its own (the device of its copy in
//! `assemble(root=None)`, its `DLPART_MPI_ROUND_BYTES`) travels in the agreement, and every
//! decision all ranks must make alike (the number of rounds of an exchange, whether to
//! confirm) is taken from what every rank sent there, never from one rank's own arguments.
//! While a collective holds the memory it reads and writes (see `crate::access`), code the
//! communicator runs on the collective's thread is refused that memory as another thread's
//! code is, so that it cannot make this rank's own claims fail after the ranks agreed.

mod agree;
mod exchange;
mod local;
mod moved;
#[cfg(feature = "mpi")]
mod mpi_comm;
#[cfg(any(feature = "python", feature = "mpi", test))]
#[cfg_attr(not(any(feature = "python", feature = "mpi")), allow(dead_code))] // its tests alone
pub(crate) mod p2p;
mod take;
mod thread;
mod wire;

#[cfg(feature = "python")]
pub(crate) use agree::check_called;
pub(crate) use agree::share;
pub use agree::{check_together, fail_together};
#[cfg_attr(not(feature = "python"), allow(unused_imports))] // for the Python bindings
pub(crate) use exchange::repartition_target;
pub use exchange::{assemble, owners, repartition, repartition_into, repartition_to, SpmdTarget};
pub(crate) use local::from_local_in;
pub use local::{from_local, from_stacked, with_ranks, LocalParts};
pub use moved::to;
#[cfg_attr(not(feature = "python"), allow(unused_imports))] // for the Python bindings
pub(crate) use moved::to_in;
#[cfg(feature = "mpi")]
pub use mpi_comm::MpiComm;
pub use take::{gather, scatter};
pub use thread::ThreadComm;
pub(crate) use wire::{fingerprint, Reader, Writer};

use std::ops::Range;

use crate::device::Device;
use crate::error::{Error, Result};
use crate::tensor::Tensor;

/// What the ranks of an SPMD program need from their transport: collective calls that every
/// rank makes in the same order. Implementations move bytes only; dlpart plans, packs and
/// checks.
///
/// dlpart calls these methods while its collective holds the memory it reads and writes.
/// Code of the implementation's own in [`Communicator::host`] and the calls that move bytes
/// that reads or writes that memory through dlpart ([`Tensor::as_array`], another dlpart
/// operation) is refused with [`Error::Buffer`], as it would be on another thread.
/// [`Communicator::rank`], [`Communicator::size`] and [`Communicator::accepts_device`] are
/// meant only to answer: dlpart calls them as its own code, and does not set its claims
/// aside for them.
pub trait Communicator: Sync {
    /// This rank, in `0..size()`.
    fn rank(&self) -> usize;

    /// The number of ranks.
    fn size(&self) -> usize;

    /// The address other ranks reach this one by (a draft-2 location's host).
    fn host(&self) -> String {
        "127.0.0.1".into()
    }

    /// Every rank's `bytes`, indexed by rank (this rank's own included).
    fn all_gather(&self, bytes: &[u8]) -> Result<Vec<Vec<u8>>>;

    /// Sends `send[segments.send_range(p)]` to each rank `p` and receives rank `p`'s bytes for
    /// this rank into `recv[segments.recv_range(p)]` (MPI's `Alltoallv` over bytes; `MpiComm`
    /// and `dlpart.mpi` send point-to-point messages between the ranks with bytes for each
    /// other). Send ranges may overlap (the same bytes to several ranks); receive ranges do
    /// not.
    ///
    /// dlpart hands each peer's segment whole and never cuts an exchange into messages for an
    /// implementation, so no message size of dlpart's can differ between the ranks of a
    /// custom communicator. `MpiComm` and `dlpart.mpi` cut by rank 0's
    /// `DLPART_MPI_MESSAGE_BYTES`, handed to every rank once when the communicator is made
    /// (`MpiComm` broadcasts it, `dlpart.mpi` gathers it with the ranks' readiness; their cutting
    /// code takes no other value), so the first call cuts as the later ones do. An
    /// implementation that cuts segments itself must likewise fix its cut by a collective
    /// call when it is made, not read a setting of each rank's when called: a receive cut
    /// otherwise than its send fails or mixes bytes.
    fn all_to_all_v(&self, send: &[u8], recv: &mut [u8], segments: &Segments<'_>) -> Result<()>;

    /// Whether [`Communicator::all_to_all_v_device`] takes buffers on `device` (a CUDA-aware
    /// MPI); otherwise device buffers are staged through host memory (pinned on CUDA). Each
    /// rank asks about its own side's device, so in one exchange some ranks may call
    /// [`Communicator::all_to_all_v_device`] while others call
    /// [`Communicator::all_to_all_v`]: the two must make one collective call together.
    fn accepts_device(&self, device: Device) -> bool {
        let _ = device;
        false
    }

    /// [`Communicator::all_to_all_v`] between the memory of two contiguous tensors on a
    /// device for which [`Communicator::accepts_device`] is true.
    fn all_to_all_v_device(
        &self,
        send: &Tensor,
        recv: &Tensor,
        segments: &Segments<'_>,
    ) -> Result<()> {
        let _ = (recv, segments);
        Err(Error::UnsupportedDevice {
            device: send.device().to_string(),
            op: "exchange of device buffers by this communicator".into(),
        })
    }
}

/// Where each rank's segment lies in one rank's buffers of an all-to-all-v: byte counts and
/// displacements, indexed by peer rank, for what it sends and for what it receives.
#[derive(Clone, Copy, Debug)]
pub struct Segments<'a> {
    /// Bytes sent to each rank.
    pub send_counts: &'a [usize],
    /// Where the bytes for each rank start in the send buffer.
    pub send_displs: &'a [usize],
    /// Bytes received from each rank.
    pub recv_counts: &'a [usize],
    /// Where the bytes from each rank start in the receive buffer.
    pub recv_displs: &'a [usize],
}

impl Segments<'_> {
    /// The bytes of the send buffer that go to rank `p`.
    pub fn send_range(&self, p: usize) -> Range<usize> {
        self.send_displs[p]..self.send_displs[p] + self.send_counts[p]
    }

    /// The bytes of the receive buffer that rank `p`'s bytes go to.
    pub fn recv_range(&self, p: usize) -> Range<usize> {
        self.recv_displs[p]..self.recv_displs[p] + self.recv_counts[p]
    }
}

/// The bytes one collective operation moved on this rank: sent to and received from each
/// rank (this rank's own entries stay 0), and copied locally without communication.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Traffic {
    /// Bytes sent to each rank.
    pub sent: Vec<u64>,
    /// Bytes received from each rank.
    pub received: Vec<u64>,
    /// Bytes copied between this rank's own partitions.
    pub local: u64,
}

#[cfg(test)]
mod tests;
#[cfg(all(test, feature = "kernel-host-tests"))]
mod tests_crossing;
#[cfg(all(test, feature = "kernel-host-tests"))]
mod tests_faults;
#[cfg(test)]
mod tests_host;
#[cfg(test)]
mod tests_messages;
#[cfg(test)]
mod tests_scatter;
#[cfg(all(test, feature = "kernel-host-tests"))]
mod tests_staged;
