//! [`MpiComm`]: a [`Communicator`] over an MPI communicator of the `mpi` crate (rsmpi), for
//! Rust programs run under `mpirun` (feature `mpi`). It moves bytes as `dlpart.mpi` does over
//! mpi4py: the all-gather by `MPI_Allgather` of the byte counts and `MPI_Allgatherv` of the
//! bytes, the all-to-all-v by `MPI_Isend` and `MPI_Irecv` only between the ranks with bytes for
//! each other ([`super::p2p`]), then `MPI_Waitall`. rsmpi owns the communicator and links MPI;
//! the calls that move bytes go through its raw bindings (`mpi::ffi`) so that every MPI error
//! code comes back as an [`Error`] rather than aborting the program.

use std::ffi::{c_char, c_int, c_void, CStr};
use std::mem::ManuallyDrop;
use std::sync::Mutex;

use mpi::datatype::Equivalence;
use mpi::environment::{self, Threading};
use mpi::ffi;
use mpi::topology::SimpleCommunicator;
use mpi::traits::{AsRaw, Communicator as _};

use crate::error::{Error, Result};

use super::p2p::{messages, MessageBytes, TAG};
use super::{Communicator, Segments};

/// dlpart's [`Communicator`] over the ranks of an MPI communicator (feature `mpi`, through the
/// `mpi` crate, re-exported as `dlpart::mpi`): run the program under `mpirun -n N`, one process
/// per rank.
///
/// [`MpiComm::new`] duplicates the communicator it is given (`MPI_Comm_dup`, collective), so
/// that dlpart's messages never meet the program's own (a wildcard receive the program leaves
/// pending included), broadcasts rank 0's message size on it (below), and sets
/// `MPI_ERRORS_RETURN` on that duplicate only: an MPI error in
/// dlpart's calls is an [`Error::Backend`] naming the call (`"mpi error in MPI_Waitall (Irecv
/// of bytes 0..512 from rank 2): ..."`) on the rank that met it, not an abort. MPI itself
/// gives no promise that the other ranks learn of it. The `MpiComm` owns the duplicate and
/// frees it when dropped (`MPI_Comm_free`: drop it on every rank, before MPI is finalized,
/// that is before the [`mpi::environment::Universe`]; one dropped after finalization leaves
/// it to MPI).
///
/// The bytes move as `dlpart.mpi` moves them over mpi4py: the all-gather as an
/// `MPI_Allgather` of the byte counts and an `MPI_Allgatherv` of the bytes, the all-to-all-v
/// as nonblocking point-to-point messages only between the ranks that have bytes for each
/// other (a sparse plan touches only its peers), waited for together. A peer's bytes beyond 1
/// GiB travel as several messages (MPI's counts are C ints), and an all-gather of more than
/// that in several rounds; `DLPART_MPI_MESSAGE_BYTES` sets the cut, for tests. The ranks may
/// set it differently, and a receive must be cut as its send is: [`MpiComm::new`] broadcasts
/// rank 0's value (`MPI_Bcast`, once), and every rank cuts every call by it, an all-to-all-v
/// made before any all-gather included. [`host`] is
/// this node's address as other nodes reach it: the first address of the host name or of a
/// network interface that is not loopback, else `127.0.0.1` (as in `dlpart.mpi`).
///
/// Host memory only: device buffers are staged through host memory
/// ([`Communicator::accepts_device`] is false), even where MPI is CUDA-aware; that path is
/// untested here.
///
/// Threads: MPI says which threads may call it (the level it was initialized with). At
/// [`Threading::Single`] or [`Threading::Funneled`] ([`mpi::initialize`] asks for `Single`),
/// an `MpiComm` is made and used on the thread that initialized MPI, and a call from another
/// thread is an error; from [`Threading::Serialized`] on, any thread may use it through a
/// shared reference, one call through it at a time (it serializes its own calls; the
/// program's own MPI calls must not run at the same time at `Serialized`). It is `Sync` but
/// not `Send`: it is dropped on the thread that made it.
///
/// [`host`]: Communicator::host
///
/// ```no_run
/// use dlpart::spmd::{self, Communicator, MpiComm};
/// use dlpart::{Device, Layout, Tensor};
/// use ndarray::{s, Array2};
///
/// // Run as `mpirun -n 4 ./program`.
/// let universe = dlpart::mpi::initialize().expect("MPI is initialized once");
/// let comm = MpiComm::new(&universe.world())?;
/// let (rank, size) = (comm.rank(), comm.size());
/// let whole = Array2::from_shape_fn((2 * size, 6), |(i, j)| (10 * i + j) as f32);
/// let mine = whole.slice(s![2 * rank..2 * rank + 2, ..]).to_owned();
/// // Each rank's rows, stacked in rank order: one all-gather agrees the grid.
/// let rows = spmd::from_stacked(&comm, vec![Tensor::from(mine)], 0)?;
/// // 2x3 blocks dealt over the ranks: one exchange.
/// let layout = Layout::block_cyclic(&[2, 3], vec![Device::CPU; size]);
/// let (blocks, traffic) = spmd::repartition(&comm, &rows, &layout, false)?;
/// assert_eq!(traffic.sent[rank], 0); // boxes that stay are never sent
/// if let Some(t) = spmd::assemble(&comm, &blocks, Some(0), None, false)? {
///     assert_eq!(t.as_array::<f32>()?, whole.view().into_dyn());
/// }
/// # Ok::<(), dlpart::Error>(())
/// ```
pub struct MpiComm {
    /// dlpart's duplicate of the caller's communicator (with `MPI_ERRORS_RETURN`).
    comm: ManuallyDrop<SimpleCommunicator>,
    rank: usize,
    size: usize,
    host: String,
    /// Whether any thread may call MPI (`Serialized` or `Multiple`), else only MPI's main one.
    any_thread: bool,
    /// Held during each call into MPI: one at a time.
    calls: Mutex<()>,
    /// The most bytes of one message: rank 0's `DLPART_MPI_MESSAGE_BYTES`, broadcast when the
    /// communicator was made, so that every rank cuts alike.
    cut: MessageBytes,
    /// Not `Send` whatever MPI's handle type (a pointer in Open MPI, an `int` in MPICH): the
    /// communicator is freed on the thread that made it.
    _not_send: std::marker::PhantomData<*const ()>,
}

// SAFETY: `MpiComm` is not `Send` (its communicator handle stays on the thread that made it),
// but `&MpiComm` may be shared: every method that calls MPI first takes `calls`, so no two of
// its MPI calls run at once, and below `Threading::Serialized` (`any_thread` false) it refuses
// to call MPI from any thread but MPI's main one (`MPI_Is_thread_main`): the calls keep to
// what the MPI library's thread level allows. The other fields are plain data.
unsafe impl Sync for MpiComm {}

/// The error of an MPI call `op` that returned `code`.
fn mpi_error(op: impl Into<String>, code: c_int) -> Error {
    Error::Backend {
        backend: "mpi",
        op: op.into(),
        message: error_string(code),
    }
}

/// MPI's own words for an error code (`MPI_Error_string`), with the code.
fn error_string(code: c_int) -> String {
    let mut buf = vec![0 as c_char; ffi::MPI_MAX_ERROR_STRING as usize + 1];
    let mut len: c_int = 0;
    // SAFETY: `buf` holds MPI_MAX_ERROR_STRING characters and a terminating NUL, the most
    // MPI_Error_string writes; `len` is a valid int to write.
    let rc = unsafe { ffi::MPI_Error_string(code, buf.as_mut_ptr(), &mut len) };
    if rc != ffi::MPI_SUCCESS as c_int {
        return format!("MPI error code {code}");
    }
    // SAFETY: MPI_Error_string wrote a NUL-terminated string into `buf`, whose last element
    // is NUL in any case (never written: at most MPI_MAX_ERROR_STRING characters are).
    let text = unsafe { CStr::from_ptr(buf.as_ptr()) };
    format!(
        "{} (MPI error code {code})",
        text.to_string_lossy().trim_end()
    )
}

/// `Ok` for `MPI_SUCCESS`, else the error of `op`.
fn check(code: c_int, op: impl FnOnce() -> String) -> Result<()> {
    if code == ffi::MPI_SUCCESS as c_int {
        Ok(())
    } else {
        Err(mpi_error(op(), code))
    }
}

impl MpiComm {
    /// dlpart's communicator over the ranks of `comm` (collective: every rank of `comm` makes
    /// it): its duplicate, with MPI's errors returned rather than fatal. An error when MPI is
    /// not initialized or already finalized, or for an intercommunicator (its collectives
    /// gather the remote group's bytes: merge its groups first).
    pub fn new<C: mpi::topology::Communicator + ?Sized>(comm: &C) -> Result<MpiComm> {
        let op = "MpiComm::new";
        let refuse = |message: &str| Error::Backend {
            backend: "mpi",
            op: op.into(),
            message: message.into(),
        };
        if !environment::is_initialized() {
            return Err(refuse(
                "MPI is not initialized: call dlpart::mpi::initialize() first",
            ));
        }
        if environment::is_finalized() {
            return Err(refuse("MPI is already finalized"));
        }
        let any_thread = environment::threading_support() >= Threading::Serialized;
        if !any_thread && !is_thread_main()? {
            return Err(refuse(&not_main_thread()));
        }
        let mut inter: c_int = 0;
        // SAFETY: `comm` is a live communicator (MPI is initialized and not finalized);
        // `inter` is a valid int to write.
        let rc = unsafe { ffi::MPI_Comm_test_inter(comm.as_raw(), &mut inter) };
        check(rc, || "MPI_Comm_test_inter".into())?;
        if inter != 0 {
            return Err(refuse(
                "dlpart's collective calls need an intracommunicator: merge the \
                 intercommunicator's groups first (MPI_Intercomm_merge)",
            ));
        }
        let own = comm.duplicate();
        // SAFETY: `own` is the live duplicate made above, and the predefined error handler
        // MPI_ERRORS_RETURN (rsmpi's constant) lives as long as MPI.
        let rc = unsafe { ffi::MPI_Comm_set_errhandler(own.as_raw(), ffi::RSMPI_ERRORS_RETURN) };
        check(rc, || "MPI_Comm_set_errhandler".into())?;
        let cut = MessageBytes::agree(|mine| {
            let mut value = mine;
            // SAFETY: one u64 at `value`, sent from rank 0 and received on every other rank,
            // on the live duplicate `own` (collective: every rank makes its `MpiComm`).
            let rc = unsafe {
                ffi::MPI_Bcast(
                    (&mut value as *mut u64).cast::<c_void>(),
                    1,
                    u64::equivalent_datatype().as_raw(),
                    0,
                    own.as_raw(),
                )
            };
            check(rc, || "MPI_Bcast of the message size".into())?;
            Ok(value)
        })?;
        Ok(MpiComm {
            rank: own.rank() as usize,
            size: own.size() as usize,
            comm: ManuallyDrop::new(own),
            host: crate::host::this_host(),
            any_thread,
            calls: Mutex::new(()),
            cut,
            _not_send: std::marker::PhantomData,
        })
    }

    /// dlpart's communicator over every process of the program (`MPI_COMM_WORLD`), as
    /// [`MpiComm::new`] makes it.
    pub fn world() -> Result<MpiComm> {
        MpiComm::new(&SimpleCommunicator::world())
    }

    /// The right to call MPI for `op`: one call through this communicator at a time, on a
    /// thread MPI's thread level allows.
    fn enter(&self, op: &str) -> Result<std::sync::MutexGuard<'_, ()>> {
        let refuse = |message: String| Error::Backend {
            backend: "mpi",
            op: op.into(),
            message,
        };
        if environment::is_finalized() {
            return Err(refuse("MPI is already finalized".into()));
        }
        if !self.any_thread && !is_thread_main()? {
            return Err(refuse(not_main_thread()));
        }
        // A call that panicked holding the lock left nothing half-done behind it.
        Ok(self.calls.lock().unwrap_or_else(|e| e.into_inner()))
    }

    fn raw(&self) -> ffi::MPI_Comm {
        self.comm.as_raw()
    }
}

impl Drop for MpiComm {
    fn drop(&mut self) {
        if environment::is_finalized() {
            // MPI released its communicators when it finalized: MPI_Comm_free would be an
            // error now.
            return;
        }
        // SAFETY: `comm` is dropped here once and never used again.
        unsafe { ManuallyDrop::drop(&mut self.comm) }
    }
}

/// Whether this thread is the one that initialized MPI (`MPI_Is_thread_main`).
fn is_thread_main() -> Result<bool> {
    let mut flag: c_int = 0;
    // SAFETY: MPI is initialized (checked when the communicator was made) and any thread may
    // ask; `flag` is a valid int to write.
    let rc = unsafe { ffi::MPI_Is_thread_main(&mut flag) };
    check(rc, || "MPI_Is_thread_main".into())?;
    Ok(flag != 0)
}

fn not_main_thread() -> String {
    format!(
        "called from a thread other than the one that initialized MPI, at MPI's thread level \
         {:?}: make dlpart's calls on that thread, or initialize MPI with \
         mpi::initialize_with_threading(Threading::Serialized) (or Multiple)",
        environment::threading_support()
    )
}

impl Communicator for MpiComm {
    fn rank(&self) -> usize {
        self.rank
    }

    fn size(&self) -> usize {
        self.size
    }

    fn host(&self) -> String {
        self.host.clone()
    }

    fn all_gather(&self, bytes: &[u8]) -> Result<Vec<Vec<u8>>> {
        let _call = self.enter("MPI_Allgather")?;
        let n = self.size;
        let byte = u8::equivalent_datatype().as_raw();
        let count = u64::equivalent_datatype().as_raw();
        // Each rank's byte count.
        let mine = bytes.len() as u64;
        let mut heads = vec![0u64; n];
        // SAFETY: one u64 sent from `mine`, one received from each of the `n` ranks into
        // `heads` (n elements), on a live communicator.
        let rc = unsafe {
            ffi::MPI_Allgather(
                (&mine as *const u64).cast::<c_void>(),
                1,
                count,
                heads.as_mut_ptr().cast::<c_void>(),
                1,
                count,
                self.raw(),
            )
        };
        check(rc, || "MPI_Allgather of the byte counts".into())?;
        let lens = heads
            .iter()
            .map(|&l| usize::try_from(l))
            .collect::<std::result::Result<Vec<usize>, _>>()
            .map_err(|_| Error::buffer("an all-gather of more bytes than this rank can address"))?;
        // Rounds of at most `max` bytes from each rank, so that every count and displacement of
        // a round fits MPI's C ints; every rank cuts the same way (the lengths are gathered,
        // the message size agreed when the communicator was made).
        let max = self.cut.get().min(i32::MAX as usize / n).max(1);
        let rounds = lens.iter().max().map_or(0, |&l| l.div_ceil(max));
        let mut out: Vec<Vec<u8>> = lens.iter().map(|&l| Vec::with_capacity(l)).collect();
        let mut buf = Vec::new();
        for round in 0..rounds {
            let piece = |len: usize| len.saturating_sub(round * max).min(max);
            let counts: Vec<c_int> = lens.iter().map(|&l| piece(l) as c_int).collect();
            let displs: Vec<c_int> = counts
                .iter()
                .scan(0, |at, &c| {
                    let d = *at;
                    *at += c;
                    Some(d)
                })
                .collect();
            let total = counts.iter().map(|&c| c as usize).sum::<usize>();
            buf.resize(total, 0u8);
            let from = (round * max).min(bytes.len());
            let send = &bytes[from..from + piece(bytes.len())];
            // SAFETY: `send` holds the `counts[rank]` bytes this rank sends (the same cut of
            // its own length); `buf` holds `total` bytes, the sum of the counts, where rank
            // `p`'s `counts[p]` bytes land at `displs[p]` (all within C ints: `max * n` at
            // most); `counts` and `displs` have one element per rank.
            let rc = unsafe {
                ffi::MPI_Allgatherv(
                    send.as_ptr().cast::<c_void>(),
                    send.len() as c_int,
                    byte,
                    buf.as_mut_ptr().cast::<c_void>(),
                    counts.as_ptr(),
                    displs.as_ptr(),
                    byte,
                    self.raw(),
                )
            };
            check(rc, || {
                format!(
                    "MPI_Allgatherv of {total} bytes (round {} of {rounds})",
                    round + 1
                )
            })?;
            for (p, o) in out.iter_mut().enumerate() {
                let at = displs[p] as usize;
                o.extend_from_slice(&buf[at..at + counts[p] as usize]);
            }
        }
        Ok(out)
    }

    fn all_to_all_v(&self, send: &[u8], recv: &mut [u8], segments: &Segments<'_>) -> Result<()> {
        let plan = messages(self.rank, segments, send.len(), recv.len(), self.cut)?;
        let _call = self.enter("MPI_Isend")?;
        let byte = u8::equivalent_datatype().as_raw();
        let (send_ptr, recv_ptr) = (send.as_ptr(), recv.as_mut_ptr());
        let describe = |m: &super::p2p::Message| {
            let dir = if m.send { "to" } else { "from" };
            format!(
                "{} of bytes {}..{} {dir} rank {}",
                m.op(),
                m.at,
                m.at + m.len,
                m.peer
            )
        };
        let mut requests: Vec<ffi::MPI_Request> = Vec::with_capacity(plan.len());
        let mut failed = None;
        for m in &plan {
            // SAFETY: reading the predefined null request, a constant of rsmpi's.
            let mut request = unsafe { ffi::RSMPI_REQUEST_NULL };
            // SAFETY: `messages` checked every message inside its buffer (`m.at + m.len` at
            // most the buffer's length) and cut it to at most i32::MAX bytes; `send` and
            // `recv` outlive the requests, all waited for below before this returns, and
            // nothing else touches `recv` until then (it is borrowed mutably here).
            let rc = unsafe {
                if m.send {
                    ffi::MPI_Isend(
                        send_ptr.add(m.at).cast::<c_void>(),
                        m.len as c_int,
                        byte,
                        m.peer as c_int,
                        TAG,
                        self.raw(),
                        &mut request,
                    )
                } else {
                    ffi::MPI_Irecv(
                        recv_ptr.add(m.at).cast::<c_void>(),
                        m.len as c_int,
                        byte,
                        m.peer as c_int,
                        TAG,
                        self.raw(),
                        &mut request,
                    )
                }
            };
            if let Err(e) = check(rc, || format!("MPI_{}", describe(m))) {
                failed = Some(e);
                break;
            }
            requests.push(request);
        }
        // Posted requests are waited for even after a failed post: MPI may still be reading
        // or writing the buffers, which the caller frees when this returns.
        // SAFETY: MPI_Status is a C struct of integers, for which all zeros is a valid value.
        let zero: ffi::MPI_Status = unsafe { std::mem::zeroed() };
        let mut statuses = vec![zero; requests.len()];
        // SAFETY: `requests` holds `requests.len()` requests posted above and `statuses` as
        // many statuses to write.
        let rc = unsafe {
            ffi::MPI_Waitall(
                requests.len() as c_int,
                requests.as_mut_ptr(),
                statuses.as_mut_ptr(),
            )
        };
        if let Some(e) = failed {
            return Err(e);
        }
        if rc == ffi::MPI_ERR_IN_STATUS as c_int {
            // The first message that failed, by its own error code.
            let success = ffi::MPI_SUCCESS as c_int;
            let pending = ffi::MPI_ERR_PENDING as c_int;
            if let Some((m, s)) = plan
                .iter()
                .zip(&statuses)
                .find(|(_, s)| s.MPI_ERROR != success && s.MPI_ERROR != pending)
            {
                return Err(mpi_error(
                    format!("MPI_Waitall ({})", describe(m)),
                    s.MPI_ERROR,
                ));
            }
        }
        check(rc, || format!("MPI_Waitall of {} messages", requests.len()))
    }
}
