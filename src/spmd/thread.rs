//! [`ThreadComm`]: a [`Communicator`] over the threads of one process, so that the SPMD logic
//! runs under `cargo test` and in examples without MPI.

use std::sync::{Arc, Condvar, Mutex};

use crate::error::{Error, Result};

use super::{Communicator, Segments};

/// One rank of a group of threads that talk through shared memory. Each collective call waits
/// at a barrier for every rank of the group, as an MPI collective does. A rank whose thread
/// panics (dropping its `ThreadComm` while it unwinds, or inside [`ThreadComm::run`]) breaks
/// the barrier: the other ranks' collective calls then return an error naming it, rather
/// than wait forever.
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
    barrier: Gate,
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
            barrier: Gate::default(),
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
        let f = &f;
        std::thread::scope(|s| {
            // Each thread owns its rank, which breaks the barrier when dropped while the
            // thread unwinds from a panic (see `Drop`).
            let handles: Vec<_> = ThreadComm::group(size)
                .into_iter()
                .map(|c| s.spawn(move || f(&c)))
                .collect();
            handles
                .into_iter()
                .map(|h| h.join().expect("a rank's thread panicked"))
                .collect()
        })
    }

    /// Waits for every rank at the group's barrier; an error when a rank's thread panicked.
    fn wait(&self) -> Result<()> {
        self.shared.barrier.wait(self.shared.size)
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
        self.wait()?;
        let all = Self::lock(&self.shared.slots).clone();
        // Nobody may overwrite a slot before every rank has read it.
        self.wait()?;
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
        self.wait()?;
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
        self.wait()?;
        result
    }
}

impl Drop for ThreadComm {
    fn drop(&mut self) {
        if std::thread::panicking() {
            self.shared.barrier.break_by(self.rank);
        }
    }
}

/// A reusable barrier that a rank can break (`std::sync::Barrier` cannot be): waits then
/// return an error naming that rank.
#[derive(Default)]
struct Gate {
    state: Mutex<GateState>,
    turn: Condvar,
}

#[derive(Default)]
struct GateState {
    /// Ranks waiting in this round.
    arrived: usize,
    /// Rounds completed.
    round: u64,
    /// The first rank that broke the barrier.
    broken: Option<usize>,
}

impl Gate {
    fn wait(&self, size: usize) -> Result<()> {
        let mut s = ThreadComm::lock(&self.state);
        if let Some(rank) = s.broken {
            return Err(broken(rank));
        }
        let round = s.round;
        s.arrived += 1;
        if s.arrived == size {
            s.arrived = 0;
            s.round += 1;
            self.turn.notify_all();
            return Ok(());
        }
        while s.round == round && s.broken.is_none() {
            s = self.turn.wait(s).unwrap_or_else(|e| e.into_inner());
        }
        match (s.round == round, s.broken) {
            (true, Some(rank)) => Err(broken(rank)),
            _ => Ok(()),
        }
    }

    fn break_by(&self, rank: usize) {
        let mut s = ThreadComm::lock(&self.state);
        s.broken.get_or_insert(rank);
        self.turn.notify_all();
    }
}

fn broken(rank: usize) -> Error {
    Error::Backend {
        backend: "ThreadComm",
        op: "collective call".into(),
        message: format!(
            "rank {rank}'s thread panicked, so this group's collectives can no longer complete"
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_rank_that_panics_fails_the_others_collectives_rather_than_hanging_them() {
        // Rank 0 panics before its first collective; rank 1 waits in an all-gather.
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let run = std::panic::catch_unwind(|| {
                ThreadComm::run(2, |c| {
                    if c.rank() == 0 {
                        panic!("rank 0 fails");
                    }
                    c.all_gather(b"x").map(drop).map_err(|e| e.to_string())
                })
            });
            let _ = tx.send(run.is_err());
        });
        let limit = if cfg!(miri) { 600 } else { 30 };
        let panicked = rx.recv_timeout(std::time::Duration::from_secs(limit));
        assert_eq!(
            panicked,
            Ok(true),
            "run returns, passing the rank's panic on"
        );

        // With threads of the caller's own, the other rank gets the error.
        let mut comms = ThreadComm::group(3).into_iter();
        let (c0, c1, c2) = (
            comms.next().unwrap(),
            comms.next().unwrap(),
            comms.next().unwrap(),
        );
        let waiter = std::thread::spawn(move || c1.all_gather(b"y").map(drop));
        let bystander = std::thread::spawn(move || c2.all_gather(b"z").map(drop));
        let failed = std::thread::spawn(move || {
            let _c0 = c0;
            panic!("rank 0 fails");
        });
        assert!(failed.join().is_err());
        for rank in [waiter.join().unwrap(), bystander.join().unwrap()] {
            let e = rank.unwrap_err().to_string();
            assert!(e.contains("rank 0's thread panicked"), "{e}");
        }
    }

    #[test]
    fn the_barrier_is_reused_round_after_round() {
        // Miri interprets every thread switch: fewer rounds there.
        let rounds: u8 = if cfg!(miri) { 4 } else { 50 };
        let sums = ThreadComm::run(4, |c| {
            (0..rounds)
                .map(|k| {
                    let all = c.all_gather(&[k.wrapping_add(c.rank() as u8)]).unwrap();
                    all.iter().map(|b| b[0] as usize).sum::<usize>()
                })
                .sum::<usize>()
        });
        let want: usize = (0..rounds as usize).map(|k| 4 * k + 6).sum();
        assert_eq!(sums, vec![want; 4]);
    }
}
