//! The parameter blocks of dlpart's kernels (`kernels/*.cu`), written once for the backend's
//! launches and for the tests that run the same kernels on the host.

use std::ffi::c_void;
use std::ptr::from_mut;

use super::jobs::{Launch, Mode};

/// `copy_W(table, jobs, tiles)`, and `gather_W` / `scatter_W` with `(winner, slots, status)`
/// after: the scatter winner table and its form (`slots` 0: one word per slot of the axis,
/// else hashed with that many slots; see `dlp_winner` in kernels/common.cuh).
pub(crate) struct CopyArgs {
    table: u64,
    jobs: u32,
    tiles: u32,
    winner: u64,
    slots: u64,
    status: u64,
    index: bool,
}

impl CopyArgs {
    /// The arguments of `l` whose job table is at `table`.
    pub(crate) fn new(l: &Launch, table: u64, winner: u64, status: u64) -> Self {
        CopyArgs {
            table,
            jobs: l.jobs.len() as u32,
            tiles: l.ntiles,
            winner,
            slots: 0,
            status,
            index: l.mode != Mode::Box,
        }
    }

    /// The same, with a hashed winner table of `slots` slots (0: one word per slot of the
    /// axis, the default).
    pub(crate) fn winner_slots(mut self, slots: u64) -> Self {
        self.slots = slots;
        self
    }

    /// Pointers to the arguments in the kernel's order, as a launch takes them. They point
    /// into `self`, which must stay where it is until the launch has read them.
    pub(crate) fn params(&mut self) -> Vec<*mut c_void> {
        let mut p: Vec<*mut c_void> = vec![
            from_mut(&mut self.table).cast(),
            from_mut(&mut self.jobs).cast(),
            from_mut(&mut self.tiles).cast(),
        ];
        if self.index {
            p.push(from_mut(&mut self.winner).cast());
            p.push(from_mut(&mut self.slots).cast());
            p.push(from_mut(&mut self.status).cast());
        }
        p
    }
}

/// `scatter_winners(const i64* index, u64 n, i64 len, u64* winner, u64 slots, u64* status)`:
/// the winner table of a scatter (see [`CopyArgs`]).
pub(crate) struct WinnersArgs {
    pub index: u64,
    pub n: u64,
    pub len: i64,
    pub winner: u64,
    pub slots: u64,
    pub status: u64,
}

impl WinnersArgs {
    /// As [`CopyArgs::params`].
    pub(crate) fn params(&mut self) -> Vec<*mut c_void> {
        vec![
            from_mut(&mut self.index).cast(),
            from_mut(&mut self.n).cast(),
            from_mut(&mut self.len).cast(),
            from_mut(&mut self.winner).cast(),
            from_mut(&mut self.slots).cast(),
            from_mut(&mut self.status).cast(),
        ]
    }
}

/// `check_indices_W(const uW* indices, i64 stride, u64 n, i64 len, u32 signed, i64* out,
/// u64* status)`; `out` 0 checks without writing the normalised indices.
pub(crate) struct CheckArgs {
    pub indices: u64,
    pub stride: i64,
    pub n: u64,
    pub len: i64,
    pub signed: u32,
    pub out: u64,
    pub status: u64,
}

impl CheckArgs {
    /// As [`CopyArgs::params`].
    pub(crate) fn params(&mut self) -> Vec<*mut c_void> {
        vec![
            from_mut(&mut self.indices).cast(),
            from_mut(&mut self.stride).cast(),
            from_mut(&mut self.n).cast(),
            from_mut(&mut self.len).cast(),
            from_mut(&mut self.signed).cast(),
            from_mut(&mut self.out).cast(),
            from_mut(&mut self.status).cast(),
        ]
    }
}
