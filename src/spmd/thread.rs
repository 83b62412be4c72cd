//! [`ThreadComm`]: a [`Communicator`] over the threads of one process, so that the SPMD logic
//! runs under `cargo test` and in examples without MPI.

use std::sync::{Arc, Barrier, Mutex};

use crate::error::{Error, Result};

use super::{Communicator, Segments};

/// One rank of a group of threads that talk through shared memory. Each collective call waits
/// at a barrier for every rank of the group, as an MPI collective does.
///
/// ```
/// use dlpart::spmd::{Communicator, ThreadComm};
/// let sums = ThreadComm::run(3, |comm| {
///     let all = comm.all_gather(&[comm.rank() as u8]).unwrap();
///     all.iter().map(|b| b[0] as usize).sum::<usize>()
/// });
/// assert_eq!(sums, vec![3, 3, 3]);
/// ```
pub struct ThreadComm {
    rank: usize,
    shared: Arc<Shared>,
}

struct Shared {
    size: usize,
    barrier: Barrier,
    /// All-gather: each rank's bytes.
    slots: Mutex<Vec<Vec<u8>>>,
    /// All-to-all: `matrix[from][to]`.
    matrix: Mutex<Vec<Vec<Vec<u8>>>>,
}

impl ThreadComm {
    /// The `size` ranks of a new group, rank `r` at index `r`: hand one to each thread.
    pub fn group(size: usize) -> Vec<ThreadComm> {
        let shared = Arc::new(Shared {
            size,
            barrier: Barrier::new(size),
            slots: Mutex::new(vec![Vec::new(); size]),
            matrix: Mutex::new(vec![vec![Vec::new(); size]; size]),
        });
        (0..size)
            .map(|rank| ThreadComm {
                rank,
                shared: shared.clone(),
            })
            .collect()
    }

    /// Runs `f` on `size` threads, one rank each, and returns their results by rank.
    pub fn run<T: Send>(size: usize, f: impl Fn(&ThreadComm) -> T + Sync) -> Vec<T> {
        let comms = ThreadComm::group(size);
        std::thread::scope(|s| {
            let handles: Vec<_> = comms.iter().map(|c| s.spawn(|| f(c))).collect();
            handles
                .into_iter()
                .map(|h| h.join().expect("a rank's thread panicked"))
                .collect()
        })
    }

    fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
        // A rank that panicked holding the lock left plain bytes behind: still usable.
        m.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl Communicator for ThreadComm {
    fn rank(&self) -> usize {
        self.rank
    }

    fn size(&self) -> usize {
        self.shared.size
    }

    fn all_gather(&self, bytes: &[u8]) -> Result<Vec<Vec<u8>>> {
        Self::lock(&self.shared.slots)[self.rank] = bytes.to_vec();
        self.shared.barrier.wait();
        let all = Self::lock(&self.shared.slots).clone();
        // Nobody may overwrite a slot before every rank has read it.
        self.shared.barrier.wait();
        Ok(all)
    }

    fn all_to_all_v(&self, send: &[u8], recv: &mut [u8], segments: &Segments<'_>) -> Result<()> {
        let n = self.shared.size;
        {
            let mut m = Self::lock(&self.shared.matrix);
            for p in 0..n {
                m[self.rank][p] = send[segments.send_range(p)].to_vec();
            }
        }
        self.shared.barrier.wait();
        let mut result = Ok(());
        {
            let m = Self::lock(&self.shared.matrix);
            for p in 0..n {
                let got = &m[p][self.rank];
                if got.len() != segments.recv_counts[p] {
                    result = Err(Error::buffer(format!(
                        "rank {} expected {} bytes from rank {p}, which sent {}",
                        self.rank,
                        segments.recv_counts[p],
                        got.len()
                    )));
                    continue;
                }
                recv[segments.recv_range(p)].copy_from_slice(got);
            }
        }
        self.shared.barrier.wait();
        result
    }
}
