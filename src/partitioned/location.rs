//! [`Location`]: where a partition can be reached without communication.

use std::fmt;
use std::sync::Arc;

use crate::device::Device;
use crate::error::{Error, Result};
use crate::grid::inv;

/// Where a partition can be accessed without communication: a process on a host, a device in
/// it, and, for MPI-like producers, a rank. Every form found in the wild maps onto it: draft 2's
/// `(ip, pid, device)`, `(ip, pid)`, a bare IP string (draft 1, xgboost_ray) and an MPI rank
/// (heat). A rank stays a rank; it is never written as an address.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Location {
    /// Host address (IP string), if the producer gave one. Shared: the partitions of one
    /// producer repeat a few hosts, and a dict of 4,096 entries copied the same text 4,096
    /// times (one allocation each) as a `String`.
    pub host: Option<Arc<str>>,
    /// Process id on that host, if given.
    pub pid: Option<i64>,
    /// The device the partition lives on in that process.
    pub device: Device,
    /// MPI rank (or another producer-defined process number, e.g. a JAX device id).
    pub rank: Option<i64>,
}

impl Location {
    /// A draft-2 location `(host, pid, device)`.
    pub fn new(host: impl Into<Arc<str>>, pid: i64, device: Device) -> Self {
        Location {
            host: Some(host.into()),
            pid: Some(pid),
            device,
            rank: None,
        }
    }

    /// A location known only by an MPI rank (heat's form).
    pub fn rank(rank: i64, device: Device) -> Self {
        Location {
            host: None,
            pid: None,
            device,
            rank: Some(rank),
        }
    }

    /// Whether this location names the calling process (its pid is ours).
    pub fn is_this_process(&self) -> bool {
        self.pid == Some(i64::from(std::process::id()))
    }

    /// Parses the device string of a location, citing invariant 8 on failure.
    pub fn parse_device(text: &str, position: &[usize]) -> Result<Device> {
        Device::from_dlpack_name(text).map_err(|e| {
            Error::protocol(
                "location",
                Some(position),
                format!("{e}"),
                Some(inv::LOCATION),
            )
        })
    }
}

/// Every partition's locations in one list, partition `flat` owning `ranges[flat]` of it.
///
/// One `Vec<Location>` per partition was one small allocation each: reading a dict of 4,096
/// partitions grew the heap by that many and gave the pages back on drop, and the page faults
/// of growing it again were about a quarter of a `dlpart.validate` of such a dict.
#[derive(Clone, Debug, Default)]
pub(crate) struct LocationTable {
    all: Vec<Location>,
    ranges: Vec<(usize, usize)>,
}

impl LocationTable {
    /// `n` partitions with no locations, with room for `capacity` locations.
    pub fn empty(n: usize, capacity: usize) -> Self {
        LocationTable {
            all: Vec::with_capacity(capacity),
            ranges: vec![(0, 0); n],
        }
    }

    /// The number of partitions.
    pub fn len(&self) -> usize {
        self.ranges.len()
    }

    /// The locations of partition `flat`. Panics when `flat >= len()`.
    pub fn get(&self, flat: usize) -> &[Location] {
        let (a, b) = self.ranges[flat];
        &self.all[a..b]
    }

    /// Changes every location in place.
    pub fn for_each_mut(&mut self, f: impl FnMut(&mut Location)) {
        self.all.iter_mut().for_each(f);
    }

    /// Gives partition `flat` the locations that `read` appends to the list it is handed,
    /// replacing any it had (those stay in the list, unused).
    pub fn set_with<E>(
        &mut self,
        flat: usize,
        read: impl FnOnce(&mut Vec<Location>) -> std::result::Result<(), E>,
    ) -> std::result::Result<(), E> {
        let a = self.all.len();
        read(&mut self.all)?;
        self.ranges[flat] = (a, self.all.len());
        Ok(())
    }
}

impl From<Vec<Vec<Location>>> for LocationTable {
    fn from(per_partition: Vec<Vec<Location>>) -> Self {
        let total = per_partition.iter().map(Vec::len).sum();
        let mut t = LocationTable::empty(per_partition.len(), total);
        for (flat, locs) in per_partition.into_iter().enumerate() {
            t.set_with(flat, |all| {
                all.extend(locs);
                Ok::<(), ()>(())
            })
            .expect("infallible");
        }
        t
    }
}

/// Writes `s` as a Python string literal in single quotes.
fn write_py_str(f: &mut fmt::Formatter<'_>, s: &str) -> fmt::Result {
    f.write_str("'")?;
    for c in s.chars() {
        match c {
            '\\' => f.write_str("\\\\")?,
            '\'' => f.write_str("\\'")?,
            c => write!(f, "{c}")?,
        }
    }
    f.write_str("'")
}

/// Prints the draft-2 tuple, `('1.1.1.1', 7755737, 'kDLCUDA:0')`, with `None` for a missing
/// host or pid; a rank follows as `rank=3`.
impl fmt::Display for Location {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("(")?;
        match &self.host {
            Some(h) => write_py_str(f, h)?,
            None => f.write_str("None")?,
        }
        match self.pid {
            Some(pid) => write!(f, ", {pid}, ")?,
            None => f.write_str(", None, ")?,
        }
        write_py_str(f, &self.device.to_string())?;
        if let Some(r) = self.rank {
            write!(f, ", rank={r}")?;
        }
        f.write_str(")")
    }
}
