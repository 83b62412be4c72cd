//! Repartitioning across ranks: every rank plans the same box copies from the same global
//! grids, packs the boxes it sends into one buffer (one contiguous segment per peer) with its
//! backend's copy kernels, exchanges them with one all-to-all-v, and unpacks what it receives
//! straight into its target partitions. Boxes whose source and target live on the same rank
//! are copied there and never sent. Both sides take the boxes in the plan's order, so the
//! buffers carry no headers. Large exchanges in host memory go in rounds (module `rounds`):
//! each round packs and exchanges a slice of every peer's boxes. A rank whose sources and
//! targets are on devices that are not one memory (with `transfer`) packs what it sends on
//! its sources' device and unpacks on its targets', and its boxes that stay cross between the
//! two as a repartition in one process moves them ([`ops::crossed`]): only the plan's boxes
//! cross, never a whole partition.

use std::collections::HashMap;

use crate::access::Role;
use crate::backend::{backend_for, Backend, BoxCopy as Job};
use crate::device::Device;
use crate::dtype::DType;
use crate::error::{
    tuple_string, Devices, Error, Result, ALLOW_TRANSFER, ASSEMBLE_ELSEWHERE, REPARTITION_ELSEWHERE,
};
use crate::grid::Grid;
use crate::layout::{stay_by, Layout, Placement};
use crate::ops;
use crate::partitioned::{Data, Location, PartitionedArray};
use crate::plan::{BoxCopy, Plan};
use crate::tensor::Tensor;

use super::agree::{agree, Peers};
use super::wire::{fingerprint, Writer};
use super::{Communicator, Segments, Traffic};

mod rounds;
mod segments;

pub(super) use rounds::{Rounds, ROUNDS};
pub(super) use segments::confirmed;
pub(super) use segments::Buffers;

const REPARTITIONS: &str = "repartitions (source or target grids, owners, devices or dtypes)";

/// The partitions of `all` (a slot per partition of a grid) held here, each with the role
/// `what` numbered by its flat index, for a claim.
fn held_here<'a>(
    what: &'static str,
    all: &'a [Option<Tensor>],
) -> impl Iterator<Item = (Role, &'a Tensor)> {
    let partition =
        move |(f, t): (usize, &'a Option<Tensor>)| Some((Role::nth(what, f), t.as_ref()?));
    all.iter().enumerate().filter_map(partition)
}

/// The target of a repartition across ranks: a grid, and the rank and device of each of its
/// partitions (C order).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SpmdTarget {
    /// The target grid.
    pub grid: Grid,
    /// The rank owning each target partition.
    pub owners: Vec<usize>,
    /// The device of each target partition (on its rank).
    pub devices: Vec<Device>,
}

impl SpmdTarget {
    /// `layout` resolved for the SPMD array `pa` over `ranks` ranks. By default (placement
    /// `Stay`) each target partition goes to the rank, and the device, of the source partition
    /// holding its first element; a dealt placement (block-cyclic) deals the partitions over
    /// the ranks, rank `r` using `devices[r]`, so it needs one device per rank (a 0-d array's
    /// one partition goes to rank 0, as a single-process deal gives it to the first device);
    /// `On` and `Each` keep the default ranks and set the devices.
    pub fn resolve(layout: &Layout, pa: &PartitionedArray, ranks: usize) -> Result<Self> {
        let src_owners = owners(pa)?;
        let (grid, dealt) = layout.resolve(pa.shape())?;
        let n = grid.num_partitions();
        let stay_owner = || stay_by(pa.grid(), &grid, &|i| src_owners[i]);
        let (owners, devices) = match (&layout.placement, dealt) {
            (Placement::Dealt { devices, .. }, Some(dealt)) => {
                if devices.len() != ranks {
                    return Err(Error::shape(
                        format!("a placement dealt over {ranks} ranks needs one device per rank"),
                        format!("{} devices", devices.len()),
                    ));
                }
                let devs = dealt.iter().map(|&o| devices[o]).collect();
                (dealt, devs)
            }
            (Placement::On(d), _) => (stay_owner(), vec![*d; n]),
            (Placement::Each(ds), _) if ds.len() == n => (stay_owner(), ds.clone()),
            (Placement::Each(ds), _) => {
                return Err(Error::shape(
                    format!("one device for each of the {n} target partitions"),
                    format!("{} devices", ds.len()),
                ))
            }
            _ => {
                let dev = |i| pa.device_of(i).unwrap_or(Device::CPU);
                (stay_owner(), stay_by(pa.grid(), &grid, &dev))
            }
        };
        Ok(SpmdTarget {
            grid,
            owners,
            devices,
        })
    }

    fn check(&self, ranks: usize) -> Result<()> {
        let n = self.grid.num_partitions();
        if self.owners.len() != n || self.devices.len() != n {
            return Err(Error::shape(
                format!("an owner and a device for each of the {n} target partitions"),
                format!(
                    "{} owners, {} devices",
                    self.owners.len(),
                    self.devices.len()
                ),
            ));
        }
        if let Some(&r) = self.owners.iter().find(|&&r| r >= ranks) {
            return Err(Error::shape(
                format!("target owners among the {ranks} ranks"),
                format!("rank {r}"),
            ));
        }
        Ok(())
    }
}

/// The rank owning each partition of the SPMD array `pa`: the rank of its first location that
/// has one.
pub fn owners(pa: &PartitionedArray) -> Result<Vec<usize>> {
    (0..pa.len())
        .map(|flat| {
            let rank = pa.locations(flat).iter().find_map(|l| l.rank);
            rank.and_then(|r| usize::try_from(r).ok()).ok_or_else(|| {
                let names = match rank {
                    Some(r) => format!("names rank {r}, which is no rank (ranks count from 0)"),
                    None => "names no rank".into(),
                };
                Error::protocol(
                    "location",
                    Some(&pa.grid().position(flat)),
                    format!(
                        "{names}: not an SPMD array (make one with from_local, or read the \
                         dict with the communicator)"
                    ),
                    None,
                )
            })
        })
        .collect()
}

/// The data of partition `flat` of `pa`, which `src_owners` gives to this rank `me`: an error
/// naming the partition when it holds none here (a rank must hold its own partitions' data).
pub(super) fn own_data(pa: &PartitionedArray, flat: usize, me: usize) -> Result<&Tensor> {
    pa.data()[flat].tensor().ok_or_else(|| {
        Error::buffer(format!(
            "partition {} is rank {me}'s but holds no data here",
            tuple_string(&pa.grid().position(flat))
        ))
    })
}

/// Checks that every partition of `pa` that `src_owners` gives to this rank `me` holds data
/// here (see [`own_data`]): the check every collective makes before it agrees.
pub(super) fn check_own_data(pa: &PartitionedArray, src_owners: &[usize], me: usize) -> Result<()> {
    for flat in (0..pa.len()).filter(|&f| src_owners[f] == me) {
        own_data(pa, flat, me)?;
    }
    Ok(())
}

/// The same array over `layout` across the ranks of `comm` (a collective call), with the bytes
/// this rank moved. See [`SpmdTarget::resolve`] for where target partitions go; a target on
/// another device than this rank's sources needs `transfer`, unless both are host memory (of
/// any kinds: a plain copy, as in one process), and then only the plan's boxes cross between
/// the rank's devices. New partitions are the memory
/// their device names, as in one process ([`PartitionedArray::repartition`]): pinned memory
/// from CUDA on `kDLCUDAHost` (an [`Error::BackendUnavailable`] where CUDA cannot load), and
/// none on `kDLCUDAManaged` or `kDLROCMHost`, which dlpart does not make
/// ([`Error::NoNewMemory`]); such an error on the ranks holding those partitions is every
/// rank's, before anything moves.
pub fn repartition(
    comm: &dyn Communicator,
    pa: &PartitionedArray,
    layout: &Layout,
    transfer: bool,
) -> Result<(PartitionedArray, Traffic)> {
    let target = SpmdTarget::resolve(layout, pa, comm.size());
    repartition_target(comm, pa, target, transfer)
}

/// [`repartition`] onto an explicit target (grid, owner ranks and devices).
pub fn repartition_to(
    comm: &dyn Communicator,
    pa: &PartitionedArray,
    target: SpmdTarget,
    transfer: bool,
) -> Result<(PartitionedArray, Traffic)> {
    repartition_target(comm, pa, Ok(target), transfer)
}

/// [`repartition_to`] with this rank's target, or the error it had making it (which every
/// rank then returns).
pub(crate) fn repartition_target(
    comm: &dyn Communicator,
    pa: &PartitionedArray,
    target: Result<SpmdTarget>,
    transfer: bool,
) -> Result<(PartitionedArray, Traffic)> {
    repartition_target_with(comm, pa, target, transfer, &ROUNDS)
}

/// [`repartition_target`] cut into rounds by `rounds`.
pub(super) fn repartition_target_with(
    comm: &dyn Communicator,
    pa: &PartitionedArray,
    target: Result<SpmdTarget>,
    transfer: bool,
    rounds: &Rounds,
) -> Result<(PartitionedArray, Traffic)> {
    let me = comm.rank();
    let stage = target.and_then(|t| {
        t.check(comm.size())?;
        let dtype = dtype_of(pa)?;
        let mine: Vec<usize> = (0..t.owners.len()).filter(|&j| t.owners[j] == me).collect();
        ops::check_present_all(mine.iter().map(|&j| t.devices[j]))?;
        rank_device(mine.iter().map(|&j| t.devices[j]), "targets")?;
        let all = new_targets(&t, &mine, dtype)?;
        Stage::new(comm, pa, &t, all, false, transfer, rounds).map(|s| (s, t))
    });
    let stage = stage.map_err(|e| e.advise(REPARTITION_ELSEWHERE));
    let ((mut stage, target), peers) = agreed(
        comm,
        "repartition",
        stage,
        |(s, _)| s.fingerprint,
        |(s, _)| s.note(),
        REPARTITIONS,
    )?;
    let confirm = stage.settle(comm, &peers)?;
    let (targets, traffic) = stage.run(comm, confirm)?;
    let out = spmd_array(
        target.grid,
        targets,
        &target.owners,
        &target.devices,
        &peers,
        dtype_of(pa)?,
    )?;
    Ok((out, traffic))
}

/// New tensors for this rank's target partitions `mine` of `t` (`None` for the others),
/// allocated as a single-process repartition allocates them ([`ops::new_targets`]): host
/// memory of one kind is not another's, though the exchange works on every host kind alike.
fn new_targets(t: &SpmdTarget, mine: &[usize], dtype: DType) -> Result<Vec<Option<Tensor>>> {
    let shapes: Vec<Vec<usize>> = mine.iter().map(|&j| t.grid.region_at(j).shape).collect();
    let refs: Vec<&[usize]> = shapes.iter().map(Vec::as_slice).collect();
    let devices: Vec<Device> = mine.iter().map(|&j| t.devices[j]).collect();
    let mut all: Vec<Option<Tensor>> = vec![None; t.owners.len()];
    for (&j, tensor) in mine
        .iter()
        .zip(ops::new_targets(&refs, &devices, dtype, backend_for)?)
    {
        all[j] = Some(tensor);
    }
    Ok(all)
}

/// The SPMD array over `grid` whose partition `j` lives on rank `owners[j]`, device
/// `devices[j]`: `local[j]` holds this rank's tensors (`None` where another rank owns `j`).
pub(super) fn spmd_array(
    grid: Grid,
    local: Vec<Option<Tensor>>,
    owners: &[usize],
    devices: &[Device],
    peers: &Peers,
    dtype: DType,
) -> Result<PartitionedArray> {
    let n = grid.num_partitions();
    let mut data = Vec::with_capacity(n);
    let mut locations = Vec::with_capacity(n);
    let mut locals = Vec::new();
    for (j, t) in local.into_iter().enumerate().take(n) {
        let r = owners[j];
        locations.push(vec![Location {
            host: Some(peers.hosts[r].as_str().into()),
            pid: Some(peers.pids[r]),
            device: devices[j],
            rank: Some(r as i64),
        }]);
        match t {
            Some(t) => {
                data.push(Data::Tensor(t));
                locals.push(grid.position(j));
            }
            None => data.push(Data::Remote),
        }
    }
    PartitionedArray::new(grid, data, locations, Some(locals))?.with_dtype(dtype)
}

/// Copies the SPMD array `pa` into the SPMD array `out`'s partitions (a collective call; `out`
/// gives the target grid and owners), reusing the caller's buffers. Nothing is written on any
/// rank unless every rank's checks pass. A replicated target (a rank holding a copy of a
/// partition another rank owns) is refused.
///
/// ```
/// use dlpart::spmd::{self, Communicator, LocalParts, ThreadComm};
/// use dlpart::Tensor;
/// use ndarray::{s, Array2};
///
/// let a = Array2::from_shape_fn((4, 6), |(i, j)| (10 * i + j) as f32);
/// ThreadComm::run(2, |comm| {
///     let r = comm.rank();
///     let mine = a.slice(s![2 * r..2 * r + 2, ..]).to_owned();
///     let rows = spmd::from_stacked(comm, vec![Tensor::from(mine)], 0)?;
///     // Each rank's own buffer for three columns of the result, placed at its global start.
///     let buffer = Tensor::from(Array2::<f32>::zeros((4, 3)));
///     let placed = LocalParts::Placed(vec![(vec![0, 3 * r], buffer.clone())]);
///     let cols = spmd::from_local(comm, Ok(placed), None)?;
///     let traffic = spmd::repartition_into(comm, &rows, &cols, false)?;
///     assert_eq!(buffer.as_array::<f32>()?, a.slice(s![.., 3 * r..3 * r + 3]).into_dyn());
///     assert_eq!(traffic.sent[1 - r], 2 * 3 * 4); // its two rows of the other's columns
///     Ok::<(), dlpart::Error>(())
/// })
/// .into_iter()
/// .collect::<Result<(), _>>()?;
/// # Ok::<(), dlpart::Error>(())
/// ```
pub fn repartition_into(
    comm: &dyn Communicator,
    pa: &PartitionedArray,
    out: &PartitionedArray,
    transfer: bool,
) -> Result<Traffic> {
    repartition_into_with(comm, pa, out, transfer, &ROUNDS)
}

/// [`repartition_into`] cut into rounds by `rounds`.
pub(super) fn repartition_into_with(
    comm: &dyn Communicator,
    pa: &PartitionedArray,
    out: &PartitionedArray,
    transfer: bool,
    rounds: &Rounds,
) -> Result<Traffic> {
    let me = comm.rank();
    let stage = (|| {
        pa.check_target_shape(out)?;
        let target = SpmdTarget {
            grid: out.grid().clone(),
            owners: owners(out)?,
            devices: (0..out.len())
                .map(|j| out.device_of(j).unwrap_or(Device::CPU))
                .collect(),
        };
        let dtype = dtype_of(pa)?;
        let mut targets: Vec<Option<Tensor>> = vec![None; out.len()];
        for (j, slot) in targets.iter_mut().enumerate() {
            let position = || tuple_string(&out.grid().position(j));
            if target.owners[j] != me {
                if out.data()[j].tensor().is_some() {
                    return Err(Error::buffer(format!(
                        "target partition {} is rank {}'s, and rank {me} holds a copy of it \
                         (a replicated array, as heat's split=None): repartition_into writes \
                         one copy of each partition, so the copies would part ways; \
                         assemble(root=None) gives every rank the whole array",
                        position(),
                        target.owners[j]
                    )));
                }
                continue;
            }
            let t = out.data()[j].tensor().ok_or_else(|| {
                Error::buffer(format!(
                    "target partition {} is rank {me}'s but holds no data here",
                    position()
                ))
            })?;
            if t.readonly() {
                return Err(Error::ReadOnly {
                    what: format!("target partition {}", position()),
                });
            }
            if t.dtype() != dtype {
                return Err(Error::DTypeMismatch {
                    found: t.dtype(),
                    expected: dtype,
                    of: "the source partitions".into(),
                });
            }
            *slot = Some(t.clone());
        }
        let held: Vec<&Tensor> = targets.iter().flatten().collect();
        if let Some(s) = crate::overlap::shared_targets(&held) {
            let whose = format!(" of rank {me} (in the order held)");
            return Err(s.targets_error(|j| j.to_string(), &whose));
        }
        Stage::new(comm, pa, &target, targets, false, transfer, rounds)
    })();
    let (mut stage, peers) = agreed(
        comm,
        "repartition_into",
        stage,
        |s| s.fingerprint,
        Stage::note,
        REPARTITIONS,
    )?;
    let confirm = stage.settle(comm, &peers)?;
    Ok(stage.run(comm, confirm)?.1)
}

/// The whole array as one tensor on rank `root` (`Some` there, `None` elsewhere), or on every
/// rank when `root` is `None` (a collective call). The tensor goes to `device`, by default the
/// device of the receiving rank's first partition (host memory for a rank without one), in
/// memory of the kind that device names, as [`repartition`] allocates it. With a `root`,
/// `device` is a global argument, the same on every rank; with `root` `None` each rank names
/// the device of its own copy, or none, whatever the others name.
pub fn assemble(
    comm: &dyn Communicator,
    pa: &PartitionedArray,
    root: Option<usize>,
    device: Option<Device>,
    transfer: bool,
) -> Result<Option<Tensor>> {
    assemble_with(comm, pa, root, device, transfer, &ROUNDS)
}

/// [`assemble`] cut into rounds by `rounds`.
pub(super) fn assemble_with(
    comm: &dyn Communicator,
    pa: &PartitionedArray,
    root: Option<usize>,
    device: Option<Device>,
    transfer: bool,
    rounds: &Rounds,
) -> Result<Option<Tensor>> {
    let me = comm.rank();
    let stage = (|| {
        let whole = Grid::even(pa.shape(), &vec![1; pa.ndim()])?;
        let src_owners = owners(pa)?;
        let first_of = |r: usize| {
            (0..pa.len())
                .find(|&i| src_owners[i] == r)
                .and_then(|i| pa.device_of(i))
                .unwrap_or(Device::CPU)
        };
        let owner = root.unwrap_or(me);
        if owner >= comm.size() {
            return Err(Error::shape(
                format!("assemble onto one of the {} ranks", comm.size()),
                format!("rank {owner}"),
            ));
        }
        let dev = device.unwrap_or_else(|| first_of(owner));
        let target = SpmdTarget {
            grid: whole,
            owners: vec![owner],
            devices: vec![dev],
        };
        let out = match owner == me {
            true => {
                ops::check_present_all(device)?;
                Some(backend_for(dev)?.empty(pa.shape(), dtype_of(pa)?)?)
            }
            false => None,
        };
        Stage::new(
            comm,
            pa,
            &target,
            vec![out],
            root.is_none(),
            transfer,
            rounds,
        )
    })()
    .map_err(|e| e.advise(ASSEMBLE_ELSEWHERE));
    let (mut stage, peers) = agreed(
        comm,
        "assemble",
        stage,
        |s| s.fingerprint,
        Stage::note,
        REPARTITIONS,
    )?;
    let confirm = stage.settle(comm, &peers)?;
    let (mut targets, _) = stage.run(comm, confirm)?;
    Ok(targets.pop().flatten())
}

/// The agreement before any data moves: every rank's outcome so far, all-gathered; an error on
/// any rank (or different plans) is an error on every rank. Each rank's `note` on its stage
/// travels along (see [`agree`]).
pub(super) fn agreed<T>(
    comm: &dyn Communicator,
    call: &str,
    stage: Result<T>,
    print: impl Fn(&T) -> u64,
    note: impl Fn(&T) -> String,
    what: &str,
) -> Result<(T, Peers)> {
    let outcome = stage.as_ref().map(print);
    let note = stage.as_ref().map_or(String::new(), note);
    let peers = agree(comm, call, outcome, what, &note)?;
    Ok((stage.expect("every rank succeeded"), peers))
}

pub(super) fn dtype_of(pa: &PartitionedArray) -> Result<DType> {
    pa.dtype().ok_or_else(|| {
        Error::protocol(
            "partitions",
            None,
            "no partition holds data or states a dtype",
            None,
        )
    })
}

/// The one device this rank's `what` live on (host-accessible memory counting as the host);
/// `None` when it has none. An exchange packs and unpacks on one device per rank.
pub(super) fn rank_device(
    devices: impl Iterator<Item = Device>,
    what: &str,
) -> Result<Option<Device>> {
    let mut found: Option<Device> = None;
    for d in devices {
        let d = if d.is_host_accessible() {
            Device::CPU
        } else {
            d
        };
        match found {
            None => found = Some(d),
            Some(f) if f != d => {
                return Err(Error::UnsupportedDevice {
                    device: format!("{f}, {d}"),
                    op: format!(
                        "an exchange between ranks with one rank's {what} on several devices"
                    ),
                })
            }
            Some(_) => {}
        }
    }
    Ok(found)
}

/// What a rank notes about its side of an exchange in the agreement (see [`Stage::note`]):
/// what the others cannot know, and must agree on from every rank's note.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Note {
    device: bool,
    host: bool,
    tuning: Rounds,
}

impl Note {
    /// As the agreement carries it: four numbers.
    fn write(&self) -> String {
        let Rounds { bytes, min_bytes } = self.tuning;
        let (d, h) = (u8::from(self.device), u8::from(self.host));
        format!("{d} {h} {bytes} {min_bytes}")
    }

    /// The number of rounds the noting rank makes its buffers for before the agreement, in
    /// an exchange in which the busiest pair of ranks moves `largest` bytes (the same on
    /// every rank, from the global plan): several only where it sees the whole exchange in
    /// host memory, as many as its own round size asks.
    fn guess(&self, largest: usize) -> usize {
        match self.host {
            true => self.tuning.count(largest),
            false => 1,
        }
    }

    /// Rank `rank`'s note, written by [`Note::write`]; an error naming it otherwise (the
    /// same on every rank, which all read the same notes).
    fn read(note: &str, rank: usize) -> Result<Note> {
        let numbers: Option<Vec<usize>> = note.split(' ').map(|n| n.parse().ok()).collect();
        match numbers.as_deref() {
            Some(&[d @ 0..=1, h @ 0..=1, bytes, min_bytes]) => Ok(Note {
                device: d == 1,
                host: h == 1,
                tuning: Rounds { bytes, min_bytes },
            }),
            _ => Err(Error::protocol(
                "spmd",
                None,
                format!(
                    "rank {rank}'s note on its side of the exchange, {note:?}, is not one \
                     dlpart {} writes",
                    env!("CARGO_PKG_VERSION")
                ),
                None,
            )),
        }
    }
}

/// One rank's part of a collective exchange, prepared (planned, packed, allocated) before
/// the ranks agree to go on.
struct Stage {
    /// The device this rank's targets are on, where it unpacks (host memory as `kDLCPU`);
    /// its sources' where it has no targets.
    device: Option<Device>,
    /// The device this rank's sources are on, where it packs what it sends; its targets'
    /// where it has no sources.
    src_device: Option<Device>,
    /// The array's dtype, of every source and target.
    dtype: DType,
    sources: Vec<Option<Tensor>>,
    targets: Vec<Option<Tensor>>,
    /// The boxes copied between this rank's own partitions within one memory.
    local: Vec<BoxCopy>,
    /// The boxes that stay on this rank but cross between its sources' and its targets'
    /// devices, as they arrived on the targets' side, with their copies.
    crossed: Vec<(Tensor, BoxCopy)>,
    /// The boxes this rank sends: one list per peer, or one for every peer when
    /// `replicated`.
    segments: Vec<Vec<BoxCopy>>,
    replicated: bool,
    /// Per peer: the boxes received from it, in the order it packs them.
    recvs: Vec<Vec<BoxCopy>>,
    /// What this rank sends: its packed boxes, its one source (sent in place), or in rounds
    /// the buffer each round is packed into.
    send: Option<Tensor>,
    send_counts: Vec<usize>,
    send_displs: Vec<usize>,
    recv_counts: Vec<usize>,
    recv_displs: Vec<usize>,
    /// Whether the peers' boxes are sent straight from this rank's one source.
    send_in_place: bool,
    /// Whether the peers' boxes are received straight into this rank's one target.
    recv_in_place: bool,
    /// The number of rounds the buffers are made for (the same on every rank once settled,
    /// see [`Stage::settle`]): 1 packs everything before the ranks agree, more (host memory
    /// only) pack round by round after.
    rounds: usize,
    /// What this rank notes in the agreement: whether its side is in device memory, whether
    /// it sees every rank's side in host memory (the global metadata's devices, and its own
    /// targets'), and its round size (`DLPART_MPI_ROUND_BYTES`, or a test's).
    note: Note,
    /// The most bytes one rank sends another, from the global plan: the same on every rank.
    largest: usize,
    /// The buffer each round is received into when not in place.
    recv_buf: Option<Tensor>,
    /// In one round, the exchange's buffers, made (and the send buffer staged) before the
    /// ranks agree.
    buffers: Option<Buffers>,
    fingerprint: u64,
    traffic: Traffic,
    /// The sources and targets, claimed from before the agreement until the exchange is done.
    _scope: crate::access::Scope,
}

impl Stage {
    /// Plans the copies from `pa` to `target` (this rank's target partitions in `targets`;
    /// every rank wants the one target partition when `replicated`), checks devices, packs
    /// what this rank sends and makes every buffer of the exchange (staging it in host memory
    /// where the communicator takes no device memory), or, for an exchange in several rounds,
    /// allocates the buffers of one round: everything that can fail before the bytes move.
    fn new(
        comm: &dyn Communicator,
        pa: &PartitionedArray,
        target: &SpmdTarget,
        targets: Vec<Option<Tensor>>,
        replicated: bool,
        transfer: bool,
        tuning: &Rounds,
    ) -> Result<Self> {
        let (me, size) = (comm.rank(), comm.size());
        let src_owners = owners(pa)?;
        let dtype = dtype_of(pa)?;
        let itemsize = dtype.itemsize();
        let mut sources: Vec<Option<Tensor>> = vec![None; pa.len()];
        for (i, slot) in sources.iter_mut().enumerate() {
            if src_owners[i] == me {
                *slot = Some(own_data(pa, i, me)?.clone());
            }
        }
        let src_dev = rank_device(sources.iter().flatten().map(Tensor::device), "sources")?;
        let dst_dev = rank_device(targets.iter().flatten().map(Tensor::device), "targets")?;
        let device = match (src_dev, dst_dev) {
            (Some(s), Some(d)) if s != d => {
                if !transfer {
                    return Err(Error::DeviceMismatch {
                        op: "repartition".into(),
                        devices: Devices::move_(s, d),
                        reason: format!(
                            "rank {me}'s partitions would move to another device; {ALLOW_TRANSFER}"
                        ),
                    });
                }
                // Refused as a move of the partitions would be (a device without dlpart
                // kernels, new memory of a kind dlpart does not make), before anything moves.
                for t in sources.iter().flatten() {
                    ops::transfer_runner(t.device(), d)?;
                }
                Some(d)
            }
            (s, d) => d.or(s),
        };
        // What this rank sends is packed on its sources' device; what it receives is unpacked
        // on its targets'. Where the two are not one memory, only the plan's boxes cross
        // between them: the boxes that stay on this rank move as a repartition in one process
        // moves them (`ops::crossed`), and those it sends or receives are staged through host
        // memory by the exchange (`Segments::prepare`).
        let src_device = src_dev.or(device);
        let crossing = src_device != device;
        // Sources sharing memory with a target (repartition_into) are copied aside first.
        let held: Vec<&Tensor> = targets.iter().flatten().collect();
        let srcs: Vec<&Tensor> = sources.iter().flatten().collect();
        let shared = crate::overlap::sources_sharing(&srcs, &held);
        for (t, shared) in sources.iter_mut().flatten().zip(shared) {
            if shared {
                *t = ops::to_device(t, crate::backend::scratch_device(t.device()))?;
            }
        }
        // A view this process holds of memory the exchange reads or writes would refuse the
        // exchange's own claims (see `crate::access`) after the ranks agreed, leaving the
        // others waiting in the all-to-all or writing alone: found here, before the
        // agreement, where its error reaches every rank, and held until the exchange is
        // done, so that no other thread claims the memory in between.
        let scope = crate::access::scope(
            "exchange",
            held_here("source partition", &sources),
            held_here("target partition", &targets),
        )?;
        let plan = Plan::new(pa.grid(), &target.grid)?;
        let mut segments: Vec<Vec<BoxCopy>> = vec![Vec::new(); if replicated { 1 } else { size }];
        let mut recvs: Vec<Vec<BoxCopy>> = vec![Vec::new(); size];
        let mut local: Vec<BoxCopy> = Vec::new();
        // The bytes each rank sends to each other rank (for the number of rounds): a
        // replicated target gets a rank's every box, so that its one segment goes to all.
        let mut pairs: HashMap<(usize, usize), usize> = HashMap::new();
        for op in plan.ops() {
            let s = src_owners[op.src];
            let to = match replicated {
                // Every box goes to every other rank: counted once, towards the next rank.
                true if size > 1 => (s + 1) % size,
                true => s,
                false => target.owners[op.dst],
            };
            if s != to {
                *pairs.entry((s, to)).or_default() += op.numel() * itemsize;
            }
            let d = if replicated {
                me
            } else {
                target.owners[op.dst]
            };
            match (s == me, d == me) {
                (true, true) if replicated => {
                    local.push(op.clone());
                    segments[0].push(op);
                }
                (true, true) => local.push(op),
                (true, false) => segments[d].push(op),
                (false, true) => recvs[s].push(op),
                (false, false) => {}
            }
        }
        let bytes = |ops: &[BoxCopy]| ops.iter().map(BoxCopy::numel).sum::<usize>() * itemsize;
        let local_bytes = bytes(&local) as u64;
        // The boxes that stay on this rank but cross between its devices, moved now (before
        // the ranks agree: an allocation or a transfer that fails is this rank's outcome
        // there, and no target has been written), to be unpacked with the received ones.
        let crossed = match crossing {
            true => {
                let src = |i: usize| sources[i].as_ref().expect("a source of this rank");
                let dst = |j: usize| targets[j].as_ref().expect("a target of this rank");
                ops::crossed(&std::mem::take(&mut local), src, |j| dst(j).device())?
            }
            false => Vec::new(),
        };
        let seg_bytes: Vec<usize> = segments.iter().map(|s| bytes(s)).collect();
        let seg_start: Vec<usize> = prefix(&seg_bytes);
        let segment_of = |p: usize| if replicated { 0 } else { p };
        let (mut send_counts, mut send_displs) = (vec![0; size], vec![0; size]);
        for p in (0..size).filter(|&p| p != me) {
            send_counts[p] = seg_bytes[segment_of(p)];
            send_displs[p] = seg_start[segment_of(p)];
        }
        let recv_counts: Vec<usize> = recvs.iter().map(|r| bytes(r)).collect();
        let mut recv_displs = prefix(&recv_counts);
        // MPI reads and writes this rank's own tensors in place where every box of a peer is
        // one contiguous range of one tensor: that saves the pack or the unpack copy, which
        // costs as much as MPI's own copy (rows -> columns receives in place).
        // A crossing rank's exchange goes through host memory (the communicator takes one
        // device per call), so only a side in host memory is read or written in place.
        let direct = |dev: Option<Device>| {
            dev.is_none_or(|d| d.is_host_accessible() || (!crossing && comm.accepts_device(d)))
        };
        let only = |ts: &[Option<Tensor>], dev: Option<Device>| match ts.iter().flatten().count() {
            1 if direct(dev) => ts.iter().flatten().next().cloned(),
            _ => None,
        };
        let send_place = only(&sources, src_device).and_then(|t| {
            let at = in_place(&t, &segments, |op| &op.src_start, itemsize)?;
            Some((t, at))
        });
        let recv_in_place = only(&targets, device)
            .and_then(|t| in_place(&t, &recvs, |op| &op.dst_start, itemsize))
            .map(|at| {
                for (p, a) in at.into_iter().enumerate() {
                    if recv_counts[p] > 0 {
                        recv_displs[p] = a;
                    }
                }
            })
            .is_some();
        // Rounds only where every rank's side of the exchange is in host memory. This rank
        // sees the global metadata and its own targets (a replicated target is each rank's
        // own, on a device of its own), and the round size it was given: its guess at the
        // number of rounds, settled with the others' after the agreement (`Stage::settle`).
        let on_host = |d: Option<Device>| d.is_none_or(|d| d.is_host_accessible());
        let host = (0..pa.len()).all(|i| on_host(pa.device_of(i)))
            && target.devices.iter().all(|&d| on_host(Some(d)));
        let largest = pairs.into_values().max().unwrap_or(0);
        let note = Note {
            device: device.is_some_and(|d| !d.is_host_accessible()),
            host,
            tuning: *tuning,
        };
        let rounds = note.guess(largest);
        let send_in_place = send_place.is_some();
        let total: usize = seg_bytes.iter().sum();
        let send = match (device, send_place) {
            (Some(_), Some((t, at))) if total > 0 => {
                for p in (0..size).filter(|&p| p != me && send_counts[p] > 0) {
                    send_displs[p] = at[segment_of(p)];
                }
                Some(t)
            }
            // Nothing to send, or packed by `prepare`, as the rounds ask.
            _ => None,
        };
        let mut w = Writer::default();
        w.u8(u8::from(replicated)).str(dtype.name());
        for grid in [pa.grid(), &target.grid] {
            for s in grid.splits() {
                w.usizes(s);
            }
        }
        w.usizes(&src_owners);
        if !replicated {
            // Replicated targets are every rank's own: their owners and devices differ by
            // design. Otherwise the ranks must agree where each target partition lives.
            w.usizes(&target.owners);
            for &d in &target.devices {
                w.device(d);
            }
        }
        let mut sent: Vec<u64> = send_counts.iter().map(|&c| c as u64).collect();
        if replicated && size == 1 {
            sent = vec![0];
        }
        let mut stage = Stage {
            device,
            src_device,
            dtype,
            sources,
            targets,
            local,
            crossed,
            segments,
            replicated,
            recvs,
            send,
            send_counts,
            send_displs,
            recv_counts: recv_counts.clone(),
            recv_displs,
            send_in_place,
            recv_in_place,
            rounds,
            note,
            largest,
            recv_buf: None,
            buffers: None,
            fingerprint: fingerprint(&w.0),
            _scope: scope,
            traffic: Traffic {
                sent,
                received: recv_counts.iter().map(|&c| c as u64).collect(),
                local: local_bytes,
            },
        };
        stage.prepare(comm, rounds)?;
        Ok(stage)
    }

    /// Makes the buffers of an exchange in `rounds` rounds, dropping those made for another
    /// number first: in one round, what this rank sends packed and every buffer of the
    /// exchange made (staged in host memory where the communicator takes no device memory);
    /// in several (host memory only), the buffers of one round.
    fn prepare(&mut self, comm: &dyn Communicator, rounds: usize) -> Result<()> {
        self.buffers = None;
        self.recv_buf = None;
        if !self.send_in_place {
            self.send = None;
        }
        self.rounds = rounds;
        let dtype = self.dtype;
        let elements = |lists: &[Vec<BoxCopy>]| {
            let totals: Vec<usize> = lists
                .iter()
                .map(|l| l.iter().map(BoxCopy::numel).sum())
                .collect();
            rounds::largest_round(&totals, rounds)
        };
        // Without sources and targets here, nothing to send or receive.
        if let Some(dev) = self.device {
            let recv_total: usize = self.recv_counts.iter().sum();
            if rounds > 1 && !self.recv_in_place && recv_total > 0 {
                let scratch = crate::backend::scratch_backend(dev)?;
                self.recv_buf = Some(scratch.empty(&[elements(&self.recvs)], dtype)?);
            }
            let total: usize = self.segments.iter().flatten().map(BoxCopy::numel).sum();
            if !self.send_in_place && total > 0 {
                let backend = crate::backend::scratch_backend(self.src_device.unwrap_or(dev))?;
                self.send = Some(match rounds {
                    1 => {
                        let buf = backend.empty(&[total], dtype)?;
                        pack(&*backend, &buf, &self.segments, &self.sources)?;
                        buf
                    }
                    _ => backend.empty(&[elements(&self.segments)], dtype)?,
                });
            }
        }
        // In one round, the exchange's buffers ([`Segments::prepare`]).
        if rounds == 1 {
            let segments = Segments {
                send_counts: &self.send_counts,
                send_displs: &self.send_displs,
                recv_counts: &self.recv_counts,
                recv_displs: &self.recv_displs,
            };
            let into = match self.recv_in_place {
                true => self.targets.iter().flatten().next().cloned(),
                false => None,
            };
            let dev = self.device.unwrap_or(Device::CPU);
            let itemsize = dtype.itemsize();
            let buffers = segments.prepare(comm, self.send.as_ref(), dev, dtype, itemsize, into)?;
            self.buffers = Some(buffers);
        }
        Ok(())
    }

    /// What this rank tells the others in the agreement and they cannot know themselves:
    /// whether its side of the exchange is in device memory (where its work after the
    /// exchange can fail on its own), whether it sees the whole exchange in host memory and
    /// its round size, from which every rank knows the number of rounds it guessed (see
    /// [`Stage::settle`]).
    fn note(&self) -> String {
        self.note.write()
    }

    /// After the agreement (`peers`, with every rank's [`Stage::note`]), the number of rounds
    /// every rank takes: several only when every rank's side is in host memory, as many as
    /// rank 0's round size asks (the ranks' `DLPART_MPI_ROUND_BYTES` may differ). A rank
    /// whose guess was another makes its buffers again, and then, since that can fail on it
    /// alone, the ranks confirm (all of them, as every rank knows every guess: [`Note::guess`]
    /// from the rank's note and the plan's busiest pair) before any bytes move. Returns
    /// whether the ranks confirm the exchange's outcome after it: when some rank's side is in
    /// device memory.
    fn settle(&mut self, comm: &dyn Communicator, peers: &Peers) -> Result<bool> {
        let notes = (peers.notes.iter().enumerate())
            .map(|(rank, n)| Note::read(n, rank))
            .collect::<Result<Vec<Note>>>()?;
        let rounds = match notes.iter().all(|n| n.host) {
            true => notes[0].tuning.count(self.largest),
            false => 1,
        };
        if notes.iter().any(|n| n.guess(self.largest) != rounds) {
            let made = match self.rounds == rounds {
                true => Ok(()),
                false => self.prepare(comm, rounds),
            };
            confirmed(comm, made, "exchanges")?;
        }
        Ok(notes.iter().any(|n| n.device))
    }

    /// Exchanges the packed boxes (every rank calls this, with or without bytes to move) and
    /// writes the local and received boxes into the targets. With `confirm` (the same on
    /// every rank: some rank noted device memory in the agreement) the ranks then agree on
    /// how it went, so that a rank whose device work failed after the exchange (the copy of
    /// what arrived to the device, the unpack kernels) fails every rank; the targets then
    /// hold what the ranks had written by then.
    fn run(
        mut self,
        comm: &dyn Communicator,
        confirm: bool,
    ) -> Result<(Vec<Option<Tensor>>, Traffic)> {
        let buffers = self.buffers.take();
        let moved = self.move_boxes(comm, buffers);
        match confirm {
            true => confirmed(comm, moved, "exchanges")?,
            false => moved?,
        }
        Ok((self.targets, self.traffic))
    }

    /// [`Stage::run`] but for the confirmation.
    fn move_boxes(&self, comm: &dyn Communicator, buffers: Option<Buffers>) -> Result<()> {
        let dev = self.device.unwrap_or(Device::CPU);
        let recv = match buffers {
            Some(buffers) => {
                let segments = Segments {
                    send_counts: &self.send_counts,
                    send_displs: &self.send_displs,
                    recv_counts: &self.recv_counts,
                    recv_displs: &self.recv_displs,
                };
                segments.exchange(comm, buffers)?
            }
            // Received into the targets round by round.
            _ => {
                self.exchange_rounds(comm, dev)?;
                None
            }
        };
        let dst: Vec<&Tensor> = self.targets.iter().flatten().collect();
        if !dst.is_empty() {
            let views = match self.recv_in_place {
                true => Vec::new(),
                false => self.recv_views(recv.as_ref()),
            };
            let mut jobs: Vec<Job<'_>> =
                Vec::with_capacity(self.local.len() + self.crossed.len() + views.len());
            let target = |j: usize| self.targets[j].as_ref().expect("a target of this rank");
            for op in &self.local {
                let src = self.sources[op.src]
                    .as_ref()
                    .expect("a source of this rank");
                jobs.push(Job {
                    src,
                    src_start: op.src_start.clone(),
                    dst: target(op.dst),
                    dst_start: op.dst_start.clone(),
                    shape: op.shape.clone(),
                });
            }
            let crossed = self.crossed.iter().map(|(view, op)| (view, op));
            for (view, op) in crossed.chain(views.iter().map(|(view, op)| (view, *op))) {
                jobs.push(Job {
                    src: view,
                    src_start: vec![0; op.shape.len()],
                    dst: target(op.dst),
                    dst_start: op.dst_start.clone(),
                    shape: op.shape.clone(),
                });
            }
            let backend = backend_for(dev)?;
            // SAFETY: the planner's target boxes are disjoint; the targets were allocated
            // here or checked disjoint (repartition_into), sources sharing memory with them
            // were copied aside, and the received bytes are a buffer of our own.
            unsafe { backend.copy_boxes_unchecked(&jobs)? };
            backend.synchronize()?;
        }
        Ok(())
    }

    /// Each received box as a view of `recv`, with its copy, in the order the peers packed them.
    fn recv_views<'a>(&'a self, recv: Option<&Tensor>) -> Vec<(Tensor, &'a BoxCopy)> {
        let Some(recv) = recv else {
            return Vec::new();
        };
        let mut out = Vec::new();
        for (p, ops) in self.recvs.iter().enumerate() {
            let shapes = ops.iter().map(|op| &op.shape);
            out.extend(recv.box_views(self.recv_displs[p], shapes).zip(ops));
        }
        out
    }
}

/// For each list of boxes (a peer's), the byte offset in `t` of its one box when that box is a
/// contiguous range of `t`'s memory (C order); `None` unless every non-empty list is such.
fn in_place(
    t: &Tensor,
    lists: &[Vec<BoxCopy>],
    start: impl Fn(&BoxCopy) -> &Vec<usize>,
    itemsize: usize,
) -> Option<Vec<usize>> {
    if !t.is_contiguous() {
        return None;
    }
    lists
        .iter()
        .map(|ops| match ops.as_slice() {
            [] => Some(0),
            [op] => {
                let full = t.shape();
                let first = op.shape.iter().position(|&e| e > 1).unwrap_or(full.len());
                if (first + 1..full.len()).any(|a| op.shape[a] != full[a]) {
                    return None;
                }
                let at: isize = start(op)
                    .iter()
                    .zip(t.strides())
                    .map(|(&s, &st)| s as isize * st)
                    .sum();
                usize::try_from(at).ok().map(|e| e * itemsize)
            }
            _ => None,
        })
        .collect()
}

pub(super) fn prefix(counts: &[usize]) -> Vec<usize> {
    let mut at = 0;
    counts
        .iter()
        .map(|&c| {
            let start = at;
            at += c;
            start
        })
        .collect()
}

/// Packs every segment's boxes, one after the other, into `buf`.
fn pack(
    backend: &dyn Backend,
    buf: &Tensor,
    segments: &[Vec<BoxCopy>],
    sources: &[Option<Tensor>],
) -> Result<()> {
    let shapes = segments.iter().flatten().map(|op| &op.shape);
    let views: Vec<Tensor> = buf.box_views(0, shapes).collect();
    let jobs: Vec<Job<'_>> = segments
        .iter()
        .flatten()
        .zip(&views)
        .map(|(op, view)| Job {
            src: sources[op.src].as_ref().expect("a source of this rank"),
            src_start: op.src_start.clone(),
            dst: view,
            dst_start: vec![0; op.shape.len()],
            shape: op.shape.clone(),
        })
        .collect();
    // SAFETY: each box has a byte range of its own in `buf`, which was just allocated and so
    // shares no memory with any source.
    unsafe { backend.copy_boxes_unchecked(&jobs)? };
    backend.synchronize()
}
