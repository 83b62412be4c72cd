//! The Distributed Array Protocol (`__distarray__`, version 0.10): reading a process's local
//! buffer and dimension dictionaries as dlpart partitions, and describing dlpart arrays in it.
//!
//! A DAP array gives each process one buffer and, per axis, a [`DimData`] saying how the
//! buffer's indices map to global ones: a block ([`Distribution::Block`], with optional
//! padding), cyclic blocks dealt round-robin over the process grid ([`Distribution::Cyclic`]),
//! or an explicit index list ([`Distribution::Unstructured`]). dlpart reads each axis as
//! [`Run`]s of contiguous global indices held contiguously in the buffer, and each combination
//! of one run per axis becomes a partition: a view of the buffer (no copy), placed at its
//! global start. Communication padding (the indices a block shares with its neighbour) is left
//! out; boundary padding is part of the array, as the protocol counts them.
//!
//! ```
//! use dlpart::distarray::{self, DimData, Distribution};
//! use dlpart::{Layout, PartitionedArray, Tensor};
//! use ndarray::Array1;
//!
//! // One process holding a 1-d array of 6 in the order 3, 4, 5, 0, 1, 2.
//! let buffer = Tensor::from(Array1::from(vec![30.0f64, 40.0, 50.0, 0.0, 10.0, 20.0]));
//! let dims = [DimData::new(6, Distribution::Unstructured(vec![3, 4, 5, 0, 1, 2]))];
//! let pa = distarray::import(&buffer, &dims)?;
//! assert_eq!(pa.grid().splits(), &[vec![0, 3, 6]]); // two runs, two partitions
//! let whole = pa.assemble(None, false)?;
//! assert_eq!(whole.as_array::<f64>()?.as_slice().unwrap(), &[0.0, 10.0, 20.0, 30.0, 40.0, 50.0]);
//!
//! // An array of one partition describes itself as blocks, its buffer the partition's memory.
//! let one = PartitionedArray::partition(&whole, &Layout::tiling(&[1]))?;
//! let (held, dims) = distarray::describe(&one, 0, 1)?;
//! assert_eq!(held.data_ptr(), whole.data_ptr());
//! assert_eq!(dims[0].distribution, Distribution::Block { start: 0, stop: 6, padding: [0, 0] });
//! # Ok::<(), dlpart::Error>(())
//! ```

use crate::error::{tuple_string, Error, Result};
use crate::grid::Grid;
use crate::partitioned::PartitionedArray;
use crate::spmd::{self, Communicator, LocalParts};
use crate::tensor::Tensor;
use crate::DeviceType;

/// The protocol version dlpart writes (it reads every 0.x).
pub const VERSION: &str = "0.10.0";

/// How one axis's global indices are dealt to the processes along it (the protocol's
/// `dist_type` with the keys that belong to it).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Distribution {
    /// `'b'`: the global indices `start..stop` (padding included), of which the first
    /// `padding[0]` and the last `padding[1]` are padding: communication padding (a
    /// neighbour's indices, left out) between processes, boundary padding (kept) at the ends
    /// of the process grid.
    Block {
        /// The first global index of the buffer.
        start: usize,
        /// One past the last.
        stop: usize,
        /// Padding at the low and the high end.
        padding: [usize; 2],
    },
    /// `'c'`: blocks of `block_size` indices from `start` on, every
    /// `proc_grid_size * block_size` indices (block size 1 is the plain cyclic distribution).
    Cyclic {
        /// The first global index of this process's first block.
        start: usize,
        /// Indices per block.
        block_size: usize,
    },
    /// `'u'`: the global index of each of the buffer's indices along the axis.
    Unstructured(Vec<usize>),
}

impl Distribution {
    /// The protocol's `dist_type`: `'b'`, `'c'` or `'u'`.
    pub fn dist_type(&self) -> char {
        match self {
            Distribution::Block { .. } => 'b',
            Distribution::Cyclic { .. } => 'c',
            Distribution::Unstructured(_) => 'u',
        }
    }
}

/// One axis's dimension dictionary: the global length, the process grid along the axis, this
/// process's coordinate in it, and the distribution.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DimData {
    /// The global length of the axis (`size`).
    pub size: usize,
    /// Processes along the axis (`proc_grid_size`).
    pub proc_grid_size: usize,
    /// This process's coordinate along the axis (`proc_grid_rank`).
    pub proc_grid_rank: usize,
    /// How the indices are dealt.
    pub distribution: Distribution,
}

/// A run of contiguous global indices held contiguously in the buffer along one axis.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Run {
    /// The first global index.
    pub global: usize,
    /// Where the run starts in the buffer.
    pub local: usize,
    /// Its length (never 0, except for the one run of an empty axis).
    pub len: usize,
}

/// Partitions with their global starts (`(start, tensor)` pairs), as
/// [`LocalParts::Placed`] takes them.
pub type Placed = Vec<(Vec<usize>, Tensor)>;

/// One of a process's partitions: where it sits in the global array and in the buffer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Piece {
    /// The global offset of its first element.
    pub start: Vec<usize>,
    /// The buffer index of its first element.
    pub local: Vec<usize>,
    /// Its shape.
    pub shape: Vec<usize>,
}

/// `"1 process"`, `"4 processes"`.
fn processes(n: usize) -> String {
    format!("{n} process{}", if n == 1 { "" } else { "es" })
}

fn error(axis: Option<(usize, char)>, found: impl Into<String>) -> Error {
    let at = axis.map(|(a, kind)| format!(" dim_data[{a}] ('{kind}')"));
    Error::dist_array(at.unwrap_or_default(), found)
}

impl DimData {
    /// The dimension dictionary of an axis of length `size` held by one process.
    pub fn new(size: usize, distribution: Distribution) -> Self {
        DimData {
            size,
            proc_grid_size: 1,
            proc_grid_rank: 0,
            distribution,
        }
    }

    /// An undistributed axis of length `len`: one block over all of it, on a process grid of
    /// one (what the protocol's empty dimension dictionary, `{}`, stands for).
    pub fn undistributed(len: usize) -> Self {
        DimData::new(
            len,
            Distribution::Block {
                start: 0,
                stop: len,
                padding: [0, 0],
            },
        )
    }

    /// The same on a process grid of `procs` processes along the axis, at coordinate `coord`.
    pub fn on_grid(mut self, procs: usize, coord: usize) -> Self {
        self.proc_grid_size = procs;
        self.proc_grid_rank = coord;
        self
    }

    /// The runs of this axis (`axis`, for messages) in a buffer of `extent` along it, in
    /// buffer order. Checks the dictionary against itself and the buffer; an axis of length 0
    /// has one empty run, at the process of coordinate 0.
    pub fn runs(&self, axis: usize, extent: usize) -> Result<Vec<Run>> {
        let (size, procs, coord) = (self.size, self.proc_grid_size, self.proc_grid_rank);
        let where_ = Some((axis, self.distribution.dist_type()));
        if procs < 1 || coord >= procs {
            return Err(error(
                where_,
                format!("proc_grid_size {procs}, proc_grid_rank {coord}"),
            ));
        }
        let runs = match &self.distribution {
            &Distribution::Block {
                start,
                stop,
                padding,
            } => {
                if start > stop || stop > size || stop - start != extent {
                    return Err(error(
                        where_,
                        format!(
                            "start {start}, stop {stop} for size {size} and a buffer of \
                             {extent} along the axis"
                        ),
                    ));
                }
                // Boundary padding (at the ends of the grid) is part of the array;
                // communication padding is a neighbour's indices.
                let left = if coord > 0 { padding[0] } else { 0 };
                let right = if coord + 1 < procs { padding[1] } else { 0 };
                if left.checked_add(right).is_none_or(|p| p > extent) {
                    return Err(error(
                        where_,
                        format!("padding {} on a block of {extent}", tuple_string(&padding)),
                    ));
                }
                let n = extent - left - right;
                if n > 0 {
                    vec![Run {
                        global: start + left,
                        local: left,
                        len: n,
                    }]
                } else {
                    vec![]
                }
            }
            &Distribution::Cyclic { start, block_size } => {
                if block_size < 1 {
                    return Err(error(where_, format!("block_size {block_size}")));
                }
                // The blocks starting below `size`, the last one perhaps cut short: counted
                // before any is made, so that a wrong dictionary cannot make a long loop.
                let step = procs.saturating_mul(block_size);
                let held = match size.checked_sub(start).filter(|&n| n > 0) {
                    None => 0,
                    Some(n) => {
                        let blocks = (n - 1) / step + 1;
                        (blocks - 1) * block_size + block_size.min(n - (blocks - 1) * step)
                    }
                };
                if held != extent {
                    return Err(error(
                        where_,
                        format!(
                            "start {start}, block_size {block_size} over {} give {held} of \
                             {size} indices here, the buffer holds {extent}",
                            processes(procs)
                        ),
                    ));
                }
                let mut runs = Vec::new();
                let (mut at, mut local) = (start, 0usize);
                while at < size {
                    let len = block_size.min(size - at);
                    runs.push(Run {
                        global: at,
                        local,
                        len,
                    });
                    local += len;
                    at = at.saturating_add(step);
                }
                runs
            }
            Distribution::Unstructured(indices) => {
                if indices.len() != extent {
                    return Err(error(
                        where_,
                        format!("{} indices for a buffer of {extent}", indices.len()),
                    ));
                }
                if let Some(i) = indices.iter().find(|&&i| i >= size) {
                    return Err(error(
                        where_,
                        format!(
                            "index {i} outside [0, {size}) (dlpart reads global indices of the \
                             array, without wrapping)"
                        ),
                    ));
                }
                // A run ends wherever the next index is not one more than this one.
                let mut runs: Vec<Run> = Vec::new();
                for (local, &global) in indices.iter().enumerate() {
                    match runs.last_mut() {
                        Some(r) if r.global + r.len == global => r.len += 1,
                        _ => runs.push(Run {
                            global,
                            local,
                            len: 1,
                        }),
                    }
                }
                runs
            }
        };
        if size == 0 && coord == 0 {
            return Ok(vec![Run {
                global: 0,
                local: 0,
                len: 0,
            }]);
        }
        Ok(runs)
    }
}

/// Each axis's runs, after checking the dimension dictionaries against the buffer's shape
/// `extents`, and the process grid against `rank` of `nprocs`.
fn checked_runs(
    dims: &[DimData],
    extents: &[usize],
    rank: usize,
    nprocs: usize,
) -> Result<Vec<Vec<Run>>> {
    if dims.len() != extents.len() {
        return Err(error(
            None,
            format!(
                "dim_data has {} entries for a {}-d buffer",
                dims.len(),
                extents.len()
            ),
        ));
    }
    let axes = dims
        .iter()
        .zip(extents)
        .enumerate()
        .map(|(a, (d, &n))| d.runs(a, n))
        .collect::<Result<Vec<_>>>()?;
    let grid: Vec<usize> = dims.iter().map(|d| d.proc_grid_size).collect();
    let procs = grid.iter().try_fold(1usize, |p, &g| p.checked_mul(g));
    if procs != Some(nprocs) {
        return Err(error(
            None,
            format!(
                "a process grid of {} for {}",
                tuple_string(&grid),
                processes(nprocs)
            ),
        ));
    }
    let coords: Vec<usize> = dims.iter().map(|d| d.proc_grid_rank).collect();
    let at = coords.iter().zip(&grid).fold(0, |f, (&c, &g)| f * g + c);
    if at != rank {
        return Err(error(
            None,
            format!(
                "process grid rank {} is rank {at} in C order, but this process is rank {rank}",
                tuple_string(&coords)
            ),
        ));
    }
    Ok(axes)
}

/// Every combination of one run per axis, the last axis fastest (C order): the positions of
/// a grid whose tiling is the number of runs per axis.
fn combinations(axes: &[Vec<Run>]) -> Vec<Piece> {
    let counts: Vec<usize> = axes.iter().map(Vec::len).collect();
    let mut out = Vec::new();
    if counts.contains(&0) {
        return out;
    }
    let mut pick = vec![0usize; axes.len()];
    loop {
        let runs = pick.iter().zip(axes).map(|(&k, runs)| runs[k]);
        out.push(Piece {
            start: runs.clone().map(|r| r.global).collect(),
            local: runs.clone().map(|r| r.local).collect(),
            shape: runs.map(|r| r.len).collect(),
        });
        if !crate::grid::next_position(&mut pick, &counts) {
            return out;
        }
    }
}

/// This process's pieces of a DAP array whose buffer has shape `extents`, and the global
/// shape. `rank` and `nprocs`: this process's rank and the number of processes, which the
/// dimension dictionaries' process grid must match (its coordinates are the rank in C order).
pub fn pieces(
    dims: &[DimData],
    extents: &[usize],
    rank: usize,
    nprocs: usize,
) -> Result<(Vec<Piece>, Vec<usize>)> {
    let axes = checked_runs(dims, extents, rank, nprocs)?;
    Ok((combinations(&axes), dims.iter().map(|d| d.size).collect()))
}

/// This process's partitions of a DAP array, `(global start, view of buffer)` pairs, and the
/// global shape (see [`pieces`]).
pub fn local_parts(
    buffer: &Tensor,
    dims: &[DimData],
    rank: usize,
    nprocs: usize,
) -> Result<(Placed, Vec<usize>)> {
    let (pieces, shape) = pieces(dims, buffer.shape(), rank, nprocs)?;
    let parts = pieces
        .into_iter()
        .map(|p| Ok((p.start, buffer.view(&p.local, &p.shape)?)))
        .collect::<Result<_>>()?;
    Ok((parts, shape))
}

/// The array of a DAP buffer held by this one process (every `proc_grid_size` 1): one
/// partition per combination of runs, each a view of `buffer` (no copy). Along each axis the
/// runs must cover the axis once.
pub fn import(buffer: &Tensor, dims: &[DimData]) -> Result<PartitionedArray> {
    let mut axes = checked_runs(dims, buffer.shape(), 0, 1)?;
    // Along each axis, the runs sorted by global start must follow each other from 0 to the
    // axis's length: they are then the grid's slabs, and their combinations in C order the
    // partitions in C order of positions.
    let mut splits = Vec::with_capacity(dims.len());
    for (a, (d, runs)) in dims.iter().zip(&mut axes).enumerate() {
        runs.sort_by_key(|r| r.global);
        let mut points = vec![0usize];
        for r in runs.iter() {
            let end = points[points.len() - 1];
            if r.global < end {
                let found = format!("global index {} is held twice", r.global);
                return Err(error(Some((a, d.distribution.dist_type())), found));
            }
            if r.global > end {
                break;
            }
            points.push(end + r.len);
        }
        let end = points[points.len() - 1];
        if end != d.size || points.len() != runs.len() + 1 {
            let next = runs.get(points.len() - 1).map_or(d.size, |r| r.global);
            return Err(error(
                Some((a, d.distribution.dist_type())),
                format!("global indices {end}..{next} are held by no process"),
            ));
        }
        splits.push(points);
    }
    let shape: Vec<usize> = dims.iter().map(|d| d.size).collect();
    let grid = Grid::from_splits(&shape, splits)?;
    // Views of the buffer cut at the grid's own slabs: exactly its boxes, in its dtype.
    let tensors = combinations(&axes)
        .into_iter()
        .map(|p| buffer.view(&p.local, &p.shape))
        .collect::<Result<Vec<_>>>()?;
    Ok(PartitionedArray::from_tensors_unchecked(
        grid,
        tensors,
        buffer.dtype(),
    ))
}

/// The SPMD array of a DAP array spread over the ranks of `comm`, a collective call: each
/// rank's pieces of its `buffer` (views, no copy) become its partitions through
/// [`spmd::from_local`], so a rank whose buffer or dimension dictionaries are wrong makes
/// every rank return the same error.
pub fn import_spmd(
    comm: &dyn Communicator,
    buffer: &Tensor,
    dims: &[DimData],
) -> Result<PartitionedArray> {
    spmd_from_parts(comm, local_parts(buffer, dims, comm.rank(), comm.size()))
}

/// [`import_spmd`] from this rank's [`local_parts`], or the error that stopped it here.
pub(crate) fn spmd_from_parts(
    comm: &dyn Communicator,
    parts: Result<(Placed, Vec<usize>)>,
) -> Result<PartitionedArray> {
    let shape = parts.as_ref().ok().map(|(_, s)| s.clone());
    spmd::from_local_in(
        comm,
        "from_distarray",
        parts.map(|(p, _)| LocalParts::Placed(p)),
        shape.as_deref(),
    )
}

/// This process's share of `array` in the protocol: the buffer (the memory of its one
/// partition) and a block dimension dictionary per axis, over a process grid that is the
/// partition grid. Partition `f` (C order) must be on rank `f` alone; in one process
/// (`nprocs` 1), the array must have one partition.
pub fn describe(
    array: &PartitionedArray,
    rank: usize,
    nprocs: usize,
) -> Result<(Tensor, Vec<DimData>)> {
    if rank >= nprocs {
        return Err(error(
            None,
            format!("rank {rank} is not below the number of processes, {nprocs}"),
        ));
    }
    let tiling = array.grid().tiling();
    let hint = if nprocs == 1 {
        "; assemble() makes one"
    } else {
        "; repartition it to one partition per process first"
    };
    if array.len() != nprocs {
        return Err(error(
            None,
            format!(
                "each process has one buffer: a grid of tiling {} over {}{hint}",
                tuple_string(&tiling),
                processes(nprocs)
            ),
        ));
    }
    if nprocs > 1 {
        for f in 0..array.len() {
            let ranks: Vec<Option<i64>> = array.locations(f).iter().map(|l| l.rank).collect();
            if ranks != [Some(f as i64)] {
                let named: Vec<String> = ranks
                    .iter()
                    .map(|r| r.map_or("none".into(), |r| r.to_string()))
                    .collect();
                return Err(error(
                    None,
                    format!(
                        "partition {f} (C order) goes to rank {f} alone, as the process grid \
                         has it; its locations name ranks [{}]{hint}",
                        named.join(", ")
                    ),
                ));
            }
        }
    }
    let held = array.at_flat(rank);
    let Some(t) = held.tensor() else {
        return Err(error(
            None,
            format!("rank {rank} holds no data for its partition"),
        ));
    };
    if t.device().kind != DeviceType::Cpu {
        return Err(error(
            None,
            format!(
                "buffers are host memory (PEP 3118): partition {} is on {}; move it with \
                 .to('cpu') first",
                tuple_string(&held.position),
                t.device()
            ),
        ));
    }
    let dims = (0..array.ndim())
        .map(|a| DimData {
            size: array.shape()[a],
            proc_grid_size: tiling[a],
            proc_grid_rank: held.position[a],
            distribution: Distribution::Block {
                start: held.start[a],
                stop: held.start[a] + held.shape[a],
                padding: [0, 0],
            },
        })
        .collect();
    Ok((t.clone(), dims))
}

#[cfg(test)]
mod tests;
