//! [`from_local`]: the ranks' own partitions agreed into one global grid, by one all-gather of
//! metadata after which every rank builds and validates the same grid from the same bytes.

use std::collections::BTreeSet;

use crate::device::Device;
use crate::dtype::DType;
use crate::error::{tuple_string, Error, Result};
use crate::grid::Grid;
use crate::partitioned::{Data, Location, PartitionedArray};
use crate::tensor::Tensor;

use super::agree::{
    agree, collective_error, gathered, header, read_headers, read_outcome, write_outcome,
};
use super::wire::{fingerprint, Reader, Writer};
use super::Communicator;

/// This rank's partitions for [`from_local`].
#[derive(Clone, Debug)]
pub enum LocalParts {
    /// Partitions with the global index of their first element.
    Placed(Vec<(Vec<usize>, Tensor)>),
    /// Partitions stacked along `axis` in rank order (a rank's own in the order given), like
    /// `numpy.concatenate` of every rank's list: each offset follows from the extents before it.
    Stacked {
        /// The axis the partitions follow each other along.
        axis: usize,
        /// This rank's partitions (any number, none included).
        parts: Vec<Tensor>,
    },
}

/// One rank's metadata, as every rank reads it.
struct RankMeta {
    shape: Option<Vec<usize>>,
    stacked: Option<usize>,
    dtype: Option<String>,
    /// Per partition: its start (placed form only), shape and device.
    parts: Vec<(Option<Vec<usize>>, Vec<usize>, Device)>,
    host: String,
    pid: i64,
}

fn encode(
    comm: &dyn Communicator,
    call: &str,
    parts: &Result<LocalParts>,
    shape: Option<&[usize]>,
) -> Vec<u8> {
    let mut w = header(call);
    match parts {
        Err(e) => write_outcome(&mut w, Err(e)),
        Ok(p) => {
            write_outcome(&mut w, Ok(0));
            match shape {
                Some(s) => w.u8(1).usizes(s),
                None => w.u8(0),
            };
            let tensors: Vec<&Tensor> = match p {
                LocalParts::Placed(v) => v.iter().map(|(_, t)| t).collect(),
                LocalParts::Stacked { parts, .. } => parts.iter().collect(),
            };
            match p {
                LocalParts::Placed(_) => w.u8(0),
                LocalParts::Stacked { axis, .. } => w.u8(1).usize(*axis),
            };
            w.str(tensors.first().map_or("", |t| t.dtype().name()));
            w.usize(tensors.len());
            for (k, t) in tensors.iter().enumerate() {
                if let LocalParts::Placed(v) = p {
                    w.usizes(&v[k].0);
                }
                w.usizes(t.shape()).device(t.device());
                w.str(t.dtype().name());
            }
        }
    }
    w.str(&comm.host()).u64(u64::from(std::process::id()));
    w.0
}

fn decode(mut r: Reader<'_>) -> Result<std::result::Result<RankMeta, (String, String)>> {
    let rank = r.rank();
    let outcome = read_outcome(&mut r)?;
    if let Err(e) = outcome {
        return Ok(Err(e));
    }
    let shape = match r.u8()? {
        1 => Some(r.usizes()?),
        _ => None,
    };
    let stacked = match r.u8()? {
        1 => Some(r.usize()?),
        _ => None,
    };
    let dtype = Some(r.str()?).filter(|s| !s.is_empty());
    let n = r.usize()?;
    let mut parts = Vec::new();
    for k in 0..n {
        let start = match stacked {
            None => Some(r.usizes()?),
            Some(_) => None,
        };
        let pshape = r.usizes()?;
        let device: Device = r.str()?.parse()?;
        let dt = r.str()?;
        if dtype.as_deref() != Some(dt.as_str()) {
            return Err(spmd_error(format!(
                "rank {rank} gives partitions of dtypes {} and {dt} (its partition {k})",
                dtype.as_deref().unwrap_or("?")
            )));
        }
        parts.push((start, pshape, device));
    }
    let host = r.str()?;
    let pid = r.u64()? as i64;
    Ok(Ok(RankMeta {
        shape,
        stacked,
        dtype,
        parts,
        host,
        pid,
    }))
}

fn spmd_error(found: String) -> Error {
    Error::protocol("partitions", None, found, None)
}

/// An SPMD array from every rank's own partitions: a collective call, made by every rank once.
///
/// One all-gather of metadata (each partition's start, shape, dtype and device, the rank's host
/// and pid, or the rank's error when `parts` is `Err`); then every rank builds the same global
/// grid and checks it the same way, so a mismatch (dtypes, axes, stated shapes, overlapping or
/// missing boxes, a rank that failed) is the same error on every rank. The global shape is
/// `shape` when given (every rank must give the same), else the bounding box of all partitions.
/// The result holds this rank's partitions as tensors (`locals`, in C order) and the others'
/// as [`Data::Remote`]; each partition has one location `(host, pid, device)` with its rank.
///
/// In the placed form, partitions of zero extent at the same offset along an axis share one
/// slab there; the stacked form gives each its own.
pub fn from_local(
    comm: &dyn Communicator,
    parts: Result<LocalParts>,
    shape: Option<&[usize]>,
) -> Result<PartitionedArray> {
    from_local_in(comm, "from_local", parts, shape)
}

/// [`from_local`] in the collective `call` (named to the ranks making another).
pub(crate) fn from_local_in(
    comm: &dyn Communicator,
    call: &str,
    parts: Result<LocalParts>,
    shape: Option<&[usize]>,
) -> Result<PartitionedArray> {
    let bytes = encode(comm, call, &parts, shape);
    let all = gathered(comm, &bytes)?;
    let mut metas = Vec::with_capacity(all.len());
    let mut failed = Vec::new();
    for (rank, r) in read_headers(&all)?.into_iter().enumerate() {
        match decode(r) {
            Ok(Ok(m)) => metas.push(m),
            Ok(Err((kind, message))) => failed.push((rank, kind, message)),
            Err(e) => failed.push((rank, e.kind().to_string(), e.to_string())),
        }
    }
    if let Some(e) = collective_error(&failed) {
        return Err(e);
    }
    let mine: Vec<Tensor> = match parts.expect("a failed rank returned above") {
        LocalParts::Placed(v) => v.into_iter().map(|(_, t)| t).collect(),
        LocalParts::Stacked { parts, .. } => parts,
    };
    build(&metas, comm.rank(), mine)
}

/// [`from_local`] of partitions stacked along `axis` in rank order.
pub fn from_stacked(
    comm: &dyn Communicator,
    parts: Vec<Tensor>,
    axis: usize,
) -> Result<PartitionedArray> {
    from_local(comm, Ok(LocalParts::Stacked { axis, parts }), None)
}

/// Checks the metadata of every rank against each other and builds the array.
fn build(metas: &[RankMeta], me: usize, mine: Vec<Tensor>) -> Result<PartitionedArray> {
    let first = &metas[0];
    for (rank, m) in metas.iter().enumerate() {
        if m.stacked != first.stacked || m.shape != first.shape {
            let form = |m: &RankMeta| {
                let how = match m.stacked {
                    Some(a) => format!("partitions stacked along axis {a}"),
                    None => "placed partitions".to_string(),
                };
                match &m.shape {
                    Some(s) => format!("{how} in shape {}", tuple_string(s)),
                    None => how,
                }
            };
            return Err(spmd_error(format!(
                "rank 0 gives {}, rank {rank} {}",
                form(first),
                form(m)
            )));
        }
    }
    let all: Vec<(usize, usize)> = metas
        .iter()
        .enumerate()
        .flat_map(|(r, m)| (0..m.parts.len()).map(move |k| (r, k)))
        .collect();
    let Some(&(r0, k0)) = all.first() else {
        return Err(spmd_error("no rank gives a partition".into()));
    };
    let ndim = metas[r0].parts[k0].1.len();
    let dtype_name = metas[r0].dtype.clone().expect("a rank with partitions");
    for &(r, k) in &all {
        let (pshape, dt) = (&metas[r].parts[k].1, metas[r].dtype.as_deref());
        if pshape.len() != ndim {
            return Err(spmd_error(format!(
                "partition {k} of rank {r} has {} axes, partition {k0} of rank {r0} {ndim}",
                pshape.len()
            )));
        }
        if dt != Some(dtype_name.as_str()) {
            return Err(spmd_error(format!(
                "rank {r} gives dtype {}, rank {r0} {dtype_name}",
                dt.unwrap_or("?")
            )));
        }
    }
    let dtype: DType = dtype_name.parse()?;
    let (grid, positions) = match first.stacked {
        Some(axis) => stacked_grid(metas, &all, axis, ndim)?,
        None => placed_grid(metas, &all, first.shape.as_deref(), ndim)?,
    };
    if let Some(stated) = first.shape.as_deref().filter(|&s| s != grid.shape()) {
        return Err(spmd_error(format!(
            "the partitions make shape {}, not the stated shape {}",
            tuple_string(grid.shape()),
            tuple_string(stated)
        )));
    }
    let n = grid.num_partitions();
    let mut owner: Vec<Option<(usize, usize)>> = vec![None; n];
    for (&(r, k), &flat) in all.iter().zip(&positions) {
        if let Some((r2, k2)) = owner[flat] {
            return Err(spmd_error(format!(
                "partition {k2} of rank {r2} and partition {k} of rank {r} cover the same box \
                 at position {}",
                tuple_string(&grid.position(flat))
            )));
        }
        owner[flat] = Some((r, k));
    }
    if let Some(flat) = owner.iter().position(Option::is_none) {
        let region = grid.region_at(flat);
        return Err(spmd_error(format!(
            "no rank gives the box at {} of shape {} (grid position {})",
            tuple_string(&region.start),
            tuple_string(&region.shape),
            tuple_string(&grid.position(flat))
        )));
    }
    let mut mine: Vec<Option<Tensor>> = mine.into_iter().map(Some).collect();
    let mut data = Vec::with_capacity(n);
    let mut locations = Vec::with_capacity(n);
    let mut locals = Vec::new();
    for (flat, o) in owner.iter().enumerate() {
        let (r, k) = o.expect("every box has an owner");
        let m = &metas[r];
        locations.push(vec![Location {
            host: Some(m.host.as_str().into()),
            pid: Some(m.pid),
            device: m.parts[k].2,
            rank: Some(r as i64),
        }]);
        if r == me {
            data.push(Data::Tensor(
                mine[k].take().expect("each local partition once"),
            ));
            locals.push(grid.position(flat));
        } else {
            data.push(Data::Remote);
        }
    }
    PartitionedArray::new(grid, data, locations, Some(locals))?.with_dtype(dtype)
}

/// The grid of partitions stacked along `axis`: one slab per partition in rank order.
fn stacked_grid(
    metas: &[RankMeta],
    all: &[(usize, usize)],
    axis: usize,
    ndim: usize,
) -> Result<(Grid, Vec<usize>)> {
    let (r0, k0) = all[0];
    let base = &metas[r0].parts[k0].1;
    if axis >= ndim {
        // An argument out of range for the arrays given (every rank reads the same metadata,
        // so every rank returns this same error).
        let what = match ndim {
            0 => "from_local: 0-d partitions have no axis to stack along".to_string(),
            _ => format!(
                "from_local: axis out of range for {ndim}-d partitions (0 <= axis < {ndim})"
            ),
        };
        return Err(Error::shape(
            what,
            format!(
                "axis={axis} (partition {k0} of rank {r0} has shape {})",
                tuple_string(base)
            ),
        ));
    }
    let mut splits = vec![0usize];
    for &(r, k) in all {
        let s = &metas[r].parts[k].1;
        if let Some(a) = (0..ndim).find(|&a| a != axis && s[a] != base[a]) {
            return Err(spmd_error(format!(
                "partitions stacked along axis {axis} differ along axis {a}: shape {} \
                 (partition {k} of rank {r}) and {} (partition {k0} of rank {r0})",
                tuple_string(s),
                tuple_string(base)
            )));
        }
        let end = splits[splits.len() - 1]
            .checked_add(s[axis])
            .ok_or_else(|| {
                spmd_error(format!("partitions stacked along axis {axis} overflow it"))
            })?;
        splits.push(end);
    }
    let mut shape = base.clone();
    shape[axis] = splits[splits.len() - 1];
    let all_splits = (0..ndim)
        .map(|a| {
            if a == axis {
                splits.clone()
            } else {
                vec![0, shape[a]]
            }
        })
        .collect();
    let grid = Grid::from_splits(&shape, all_splits)?;
    let stride: usize = grid.tiling()[axis + 1..].iter().product();
    Ok((grid, (0..all.len()).map(|i| i * stride).collect()))
}

/// The grid of placed partitions: along each axis, the distinct extents `[start, end)` of the
/// partitions must follow each other from 0 to the axis length (a rectilinear grid).
fn placed_grid(
    metas: &[RankMeta],
    all: &[(usize, usize)],
    shape: Option<&[usize]>,
    ndim: usize,
) -> Result<(Grid, Vec<usize>)> {
    let boxes: Vec<(&[usize], &[usize])> = all
        .iter()
        .map(|&(r, k)| {
            let p = &metas[r].parts[k];
            (p.0.as_deref().expect("placed form"), p.1.as_slice())
        })
        .collect();
    let mut ends = Vec::with_capacity(boxes.len());
    for (&(r, k), (start, s)) in all.iter().zip(&boxes) {
        let end: Option<Vec<usize>> = (start.len() == ndim)
            .then(|| {
                start
                    .iter()
                    .zip(*s)
                    .map(|(a, b)| a.checked_add(*b))
                    .collect()
            })
            .flatten();
        ends.push(end.ok_or_else(|| {
            spmd_error(format!(
                "partition {k} of rank {r} starts at {} with shape {}",
                tuple_string(start),
                tuple_string(s)
            ))
        })?);
    }
    let global: Vec<usize> = match shape {
        Some(s) if s.len() == ndim => s.to_vec(),
        Some(s) => {
            return Err(spmd_error(format!(
                "shape {} for partitions with {ndim} axes",
                tuple_string(s)
            )))
        }
        None => (0..ndim)
            .map(|a| ends.iter().map(|e| e[a]).max().unwrap_or(0))
            .collect(),
    };
    let mut splits = Vec::with_capacity(ndim);
    let mut slabs: Vec<Vec<(usize, usize)>> = Vec::with_capacity(ndim);
    for a in 0..ndim {
        let set: BTreeSet<(usize, usize)> = boxes
            .iter()
            .zip(&ends)
            .map(|((start, _), end)| (start[a], end[a]))
            .collect();
        let list: Vec<(usize, usize)> = set.into_iter().collect();
        let mut at = 0;
        for &(lo, hi) in &list {
            if lo != at {
                return Err(spmd_error(if lo > at {
                    format!("no partition covers [{at}, {lo}) along axis {a}")
                } else {
                    format!(
                        "partition extents overlap along axis {a} without common split points \
                         ([{lo}, {hi}) against one ending at {at}): not a rectilinear grid"
                    )
                }));
            }
            at = hi;
        }
        if at != global[a] {
            return Err(spmd_error(format!(
                "the partitions end at {at} along axis {a}, whose length is {}",
                global[a]
            )));
        }
        let mut s = vec![0];
        s.extend(list.iter().map(|&(_, hi)| hi));
        splits.push(s);
        slabs.push(list);
    }
    let grid = Grid::from_splits(&global, splits)?;
    let strides = crate::plan::strides(&grid.tiling());
    let positions = boxes
        .iter()
        .zip(&ends)
        .map(|((start, _), end)| {
            (0..ndim)
                .map(|a| {
                    let i = slabs[a]
                        .binary_search(&(start[a], end[a]))
                        .expect("every extent is a slab");
                    i * strides[a]
                })
                .sum()
        })
        .collect();
    Ok((grid, positions))
}

/// `pa` (the array this rank read from an SPMD producer's dict, or its error reading it) with
/// a rank in every location that names one of the ranks' processes by host and pid, as
/// draft-2 dicts do, and that process's host and pid in every location naming a rank alone, as
/// heat's do: one collective call, which also checks that every rank read the same
/// global grid and dtype, and fails on every rank when one failed.
pub fn with_ranks(
    comm: &dyn Communicator,
    pa: Result<PartitionedArray>,
) -> Result<PartitionedArray> {
    let pa = pa.and_then(locals_hold_data);
    // The dtype is known only where data is (dicts need not state it): compared apart. The
    // locations as the producer wrote them are compared too: resolved the same way on every
    // rank, they then give every rank the same owners.
    let print = pa.as_ref().map(|pa| {
        let mut w = Writer::default();
        w.usizes(pa.shape());
        for s in pa.grid().splits() {
            w.usizes(s);
        }
        for flat in 0..pa.len() {
            let locations = pa.locations(flat);
            w.usize(locations.len());
            for l in locations {
                w.u8(u8::from(l.host.is_some()))
                    .str(l.host.as_deref().unwrap_or(""))
                    .opt_u64(l.pid.map(|p| p as u64))
                    .opt_u64(l.rank.map(|r| r as u64))
                    .device(l.device);
            }
        }
        fingerprint(&w.0)
    });
    let dtype = pa.as_ref().ok().and_then(PartitionedArray::dtype);
    let note = dtype.map_or("", DType::name);
    let peers = agree(comm, "from_partitioned", print, "global grids", note)?;
    let mut pa = pa.expect("every rank succeeded");
    let named: Vec<(usize, &String)> = peers
        .notes
        .iter()
        .enumerate()
        .filter(|(_, n)| !n.is_empty())
        .collect();
    if let Some(&(r0, first)) = named.first() {
        if let Some((r, other)) = named.iter().find(|(_, n)| n != &first) {
            return Err(spmd_error(format!(
                "rank {r} holds dtype {other}, rank {r0} {first}"
            )));
        }
        pa = pa.with_dtype(first.parse()?)?;
    }
    pa.map_locations(|l| {
        if let Some(r) = l.rank {
            // A rank alone (heat's form) gets its process's host and pid, which every rank
            // knows now: a dict written from the array can then name hosts (xgboost_ray).
            let r = usize::try_from(r).ok().filter(|&r| r < peers.pids.len());
            if let (Some(r), None, None) = (r, &l.host, l.pid) {
                l.host = Some(peers.hosts[r].as_str().into());
                l.pid = Some(peers.pids[r]);
            }
            return;
        }
        let same = |r: &usize| {
            Some(peers.pids[*r]) == l.pid && l.host.as_deref().is_none_or(|h| h == peers.hosts[*r])
        };
        if let Some(r) = (0..peers.pids.len()).find(same) {
            l.rank = Some(r as i64);
        }
    });
    // Every rank checks the same locations the same way: an error here is every rank's.
    let size = comm.size();
    for (flat, owner) in super::exchange::owners(&pa)?.into_iter().enumerate() {
        if owner >= size {
            return Err(Error::protocol(
                "location",
                Some(&pa.grid().position(flat)),
                format!(
                    "names rank {owner}, but the communicator has {size} ranks (0 to {})",
                    size - 1
                ),
                None,
            ));
        }
    }
    Ok(pa)
}

/// `pa` when every position its `locals` lists holds data on this rank (heat's replicated
/// form lists a partition another rank's location names, with this rank's own copy).
fn locals_hold_data(pa: PartitionedArray) -> Result<PartitionedArray> {
    for pos in pa.locals().unwrap_or_default() {
        let flat = pa.grid().flat_index(pos)?;
        if pa.data()[flat].tensor().is_none() {
            return Err(Error::protocol(
                "locals",
                Some(pos),
                "is listed as this rank's but holds no data here",
                None,
            ));
        }
    }
    Ok(pa)
}
