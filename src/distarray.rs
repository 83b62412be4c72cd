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
//! # The optional keys
//!
//! **`periodic`** (blocks). The protocol defines `start` and `stop` as the global indices of
//! the buffer, `0 <= start < stop <= size`, and `size` as the sum of each process's
//! `num_owned_indices` (its appendix), which counts the padding at the two ends of the process
//! grid whatever `periodic` says; its prose (and version 0.9's) calls that padding, on a
//! periodic axis, communication padding: the wrap-around neighbour's indices, not counted in
//! `size`. dlpart reads both, each end on its own, by what the numbers say:
//! - an end whose padding lies inside `[0, size)` (the first process's `start >= 0`, the
//!   last's `stop <= size`) is counted in `size`, and read as part of the array, like boundary
//!   padding (the values the buffer holds there, whatever they mirror);
//! - an end whose padding holds the wrap-around neighbour's indices, written as the periodic
//!   continuation of the axis (the first process's `start = -padding[0]`, standing for
//!   `size - padding[0]..size`; the last's `stop = size + padding[1]`, for
//!   `0..padding[1]`), is not counted in `size`: communication padding, left out.
//!
//! Anything else below 0 or beyond `size` (or such an end on an axis that is not periodic, or
//! at a process inside the grid) is an error naming the axis and the values. On one process
//! (`proc_grid_size` 1, which the protocol allows periodic and padded) both ends are the same
//! block's.
//!
//! **`padding`** (blocks) is the first `padding[0]` and the last `padding[1]` indices of the
//! buffer (the protocol's padding regions at its beginning and end): the two together wider
//! than the block (`stop - start`, the buffer's extent along the axis), boundary padding
//! included, is an error naming the axis, the padding and the extent ([`DimData::runs`]).
//!
//! Communication padding, between processes or wrapping around, is at most as wide as the
//! indices the neighbouring process owns (the protocol's rule): an error naming the axis, the
//! padding and the neighbour's count otherwise, wherever the neighbour's share is known. On
//! one process along the axis the wrap-around neighbour is the block itself, which every
//! reader checks ([`DimData::runs`]); across processes, [`import_spmd`] checks it from every
//! rank's dictionaries, and that the ranks agree on `periodic`.
//!
//! The two sides of a boundary between neighbours are as wide as each other (the protocol's
//! rule: the high padding of `proc_grid_rank` `i` is the low padding of `i + 1`). On a periodic
//! axis the ends of the process grid are neighbours across the wrap-around: the last process's
//! high padding is as wide as the first's low padding where both ends are communication
//! padding, each wrapping around or 0 wide (on one process, the block's two ends;
//! [`DimData::runs`] checks that). An end counted in `size` is read as part of the array, as
//! boundary padding is, and the protocol's rule for equal widths speaks of communication
//! padding alone, so such an end is as wide as it likes, as are the ends of an axis that is
//! not periodic (boundary padding). Unequal widths are an
//! error naming the axis, both processes and both paddings; [`import_spmd`] checks them from
//! every rank's dictionaries.
//!
//! **Block axes over ranks.** The protocol has the dimension dictionaries of the processes at
//! one `proc_grid_rank` along an axis identical, but for padding, which may differ at the ends
//! of the process grid (boundary padding). Along a block axis [`import_spmd`] holds them to it
//! by the global indices each owns: `start..stop` less its communication padding, boundary
//! padding and an end counted in `size` kept, as read above (so a low end that wraps around,
//! `start = -padding[0]`, owns what one counted in `size`, `start = 0`, does). Ranks there
//! owning different indices are an error naming the axis, both ranks, the `proc_grid_rank`,
//! their `start`, `stop` and `padding` and what each owns; ranks giving the axis different
//! `size`s are one too. The coordinates' blocks must own every global index once (in any
//! order; an empty block owns none): an index owned twice, or by no process, is an error
//! naming it and what each coordinate owns. An undistributed axis (`proc_grid_size` 1, the
//! protocol's empty dictionary among them) is thus owned whole by every rank, and every rank
//! gives it one `size`.
//!
//! **Cyclic axes.** The protocol has the dimension dictionaries of the processes at one
//! `proc_grid_rank` along an axis identical; along a cyclic axis [`import_spmd`] holds them to
//! it (the same `start` and `block_size`), deals blocks of one `block_size` along the axis,
//! and reads the coordinates' `start`s in any order so long as their blocks hold every global
//! index once: otherwise an error naming the axis, the ranks or the index, and the values.
//!
//! **`one_to_one`** (unstructured axes, absent meaning `false`). When `false`, a global index
//! may be in the `indices` of several processes along the axis: dlpart reads it from the
//! process with the lowest `proc_grid_rank` along the axis that holds it, and leaves the
//! others' copies out (their runs shrink; nothing is copied). The process grid being a product
//! of the axes, an element is thus read from the lowest rank of all that hold it, the same
//! choice on every rank. Where the copies differ, that process's value is the one read. When
//! `true`, an index held by two processes is an error naming it and them. Either way, an index
//! twice in one process's `indices` (the protocol has them locally unique), and an index no
//! process holds, are errors. Only [`import_spmd`] sees other processes' indices: [`pieces`]
//! and [`local_parts`] read one process's buffer as it stands. It learns them as runs of
//! consecutive indices, not index by index: what the ranks all-gather, and the work of
//! deciding who reads what (a sweep over every process's runs by start), grow with the
//! number of runs, so that a long list in a few runs costs as little as a block.
//!
//! ```
//! use dlpart::distarray::{self, DimData, Distribution};
//! use dlpart::{Layout, PartitionedArray, Tensor};
//! use ndarray::Array1;
//!
//! // One process holding a 1-d array of 6 in the order 3, 4, 5, 0, 1, 2.
//! let buffer = Tensor::from(Array1::from(vec![30.0f64, 40.0, 50.0, 0.0, 10.0, 20.0]));
//! let dims = [DimData::new(6, Distribution::unstructured(vec![3, 4, 5, 0, 1, 2]))];
//! let pa = distarray::import(&buffer, &dims)?;
//! assert_eq!(pa.grid().splits(), &[vec![0, 3, 6]]); // two runs, two partitions
//! let whole = pa.assemble(None, false)?;
//! assert_eq!(whole.as_array::<f64>()?.as_slice().unwrap(), &[0.0, 10.0, 20.0, 30.0, 40.0, 50.0]);
//!
//! // An array of one partition describes itself as blocks, its buffer the partition's memory.
//! let one = PartitionedArray::partition(&whole, &Layout::tiling(&[1]))?;
//! let (held, dims) = distarray::describe(&one, 0, 1)?;
//! assert_eq!(held.data_ptr(), whole.data_ptr());
//! assert_eq!(dims[0].distribution, Distribution::block(0, 6)?);
//! # Ok::<(), dlpart::Error>(())
//! ```

use crate::error::{tuple_string, Error, Result};
use crate::grid::Grid;
use crate::partitioned::PartitionedArray;
use crate::spmd::{self, Communicator, LocalParts, Reader, Writer};
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
    /// of the process grid; on a periodic axis, the ends are either (see the module docs).
    Block {
        /// The global index of the buffer's first element: negative only at the low end of a
        /// periodic axis whose padding holds the wrap-around neighbour's indices
        /// (`-padding[0]`).
        start: isize,
        /// One past the last (`size + padding[1]` at most, at the high end of a periodic
        /// axis).
        stop: usize,
        /// Padding at the low and the high end.
        padding: [usize; 2],
        /// Whether the axis is periodic (`periodic`; absent is `false`).
        periodic: bool,
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
    Unstructured {
        /// The global indices (`indices`), locally unique.
        indices: Vec<usize>,
        /// Whether every global index is held by one process alone (`one_to_one`; absent is
        /// `false`: an index several processes hold is read from one of them, see the module
        /// docs).
        one_to_one: bool,
    },
}

impl Distribution {
    /// The protocol's `dist_type`: `'b'`, `'c'` or `'u'`.
    pub fn dist_type(&self) -> char {
        match self {
            Distribution::Block { .. } => 'b',
            Distribution::Cyclic { .. } => 'c',
            Distribution::Unstructured { .. } => 'u',
        }
    }

    /// A block of the global indices `start..stop`, without padding, not periodic. A `start`
    /// beyond `isize::MAX` (the largest [`Distribution::Block`] holds) is an error naming both
    /// values, not a block somewhere else.
    pub fn block(start: usize, stop: usize) -> Result<Self> {
        let Ok(first) = isize::try_from(start) else {
            return Err(error(
                None,
                format!(
                    "block start {start} (stop {stop}) is beyond isize::MAX = {}, the largest \
                     start a block holds",
                    isize::MAX
                ),
            ));
        };
        Ok(Distribution::Block {
            start: first,
            stop,
            padding: [0, 0],
            periodic: false,
        })
    }

    /// An index list, `one_to_one` false (the protocol's default).
    pub fn unstructured(indices: Vec<usize>) -> Self {
        Distribution::Unstructured {
            indices,
            one_to_one: false,
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
    count_of(n, "process", "processes")
}

/// `"1 index"`, `"4 indices"`: `n` of `one` or `many`.
fn count_of(n: usize, one: &str, many: &str) -> String {
    format!("{n} {}", if n == 1 { one } else { many })
}

/// What a sweep over spans of global indices finds (see [`sweep`]).
struct Sweep {
    /// The smallest index two spans share.
    twice: Option<usize>,
    /// The first indices from 0 that no span holds, as `lo..hi`.
    gap: Option<(usize, usize)>,
    /// The furthest end of a span.
    end: usize,
}

/// Sweeps `spans` (`(start, end)` of global indices, sorted by start; empty ones are
/// skipped): a span starting beyond the furthest end before it leaves a gap, and one starting
/// below that end starts an index held twice. The first of each found is the lowest.
fn sweep(spans: impl Iterator<Item = (usize, usize)>) -> Sweep {
    let mut found = Sweep {
        twice: None,
        gap: None,
        end: 0,
    };
    for (start, stop) in spans.filter(|&(start, stop)| start < stop) {
        if found.gap.is_none() && start > found.end {
            found.gap = Some((found.end, start));
        }
        if found.twice.is_none() && start < found.end {
            found.twice = Some(start);
        }
        found.end = found.end.max(stop);
    }
    found
}

/// The smallest global index in more than one of `runs` (`(first global index, length)`
/// pairs, in any order).
fn first_overlap(runs: impl Iterator<Item = (usize, usize)>) -> Option<usize> {
    let mut sorted: Vec<(usize, usize)> = runs.map(|(g, n)| (g, g + n)).collect();
    sorted.sort_unstable();
    sweep(sorted.into_iter()).twice
}

/// The first fault, by global index, of spans that must cover `0..size` (see [`tiling_fault`]).
enum Fault {
    /// The lowest index several spans hold, and the coordinates of those spans, ascending.
    Twice(usize, Vec<usize>),
    /// The first indices from 0 that no span holds, as `lo..hi`.
    Gap(usize, usize),
}

/// Sorts `spans` (`(start, end, coordinate)` of global indices) by start and finds the first
/// fault, by index, in their cover of `0..size`: an index held twice below the first gap
/// (where the spans must hold each index `once`), or that gap.
fn tiling_fault(spans: &mut [(usize, usize, usize)], size: usize, once: bool) -> Option<Fault> {
    spans.sort_unstable();
    let Sweep { twice, gap, end } = sweep(spans.iter().map(|&(start, stop, _)| (start, stop)));
    let gap = gap.or((end < size).then_some((end, size)));
    if let Some(g) = twice.filter(|&g| once && gap.is_none_or(|(lo, _)| g < lo)) {
        let mut coords: Vec<usize> = spans
            .iter()
            .filter(|&&(start, stop, _)| start <= g && g < stop)
            .map(|s| s.2)
            .collect();
        coords.sort_unstable();
        return Some(Fault::Twice(g, coords));
    }
    gap.map(|(lo, hi)| Fault::Gap(lo, hi))
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
        let whole = Distribution::Block {
            start: 0,
            stop: len,
            padding: [0, 0],
            periodic: false,
        };
        DimData::new(len, whole)
    }

    /// The same on a process grid of `procs` processes along the axis, at coordinate `coord`.
    pub fn on_grid(mut self, procs: usize, coord: usize) -> Self {
        self.proc_grid_size = procs;
        self.proc_grid_rank = coord;
        self
    }

    /// The runs of this axis (`axis`, for messages) in a buffer of `extent` along it, in
    /// buffer order. Checks the dictionary against itself and the buffer (on a process grid of
    /// one along the axis, a block's wrap-around padding against its own indices too); an axis
    /// of length 0 has one empty run, at the process of coordinate 0.
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
                periodic,
            } => self
                .block_run(where_, extent, start, stop, padding, periodic)?
                .into_iter()
                .collect(),
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
            Distribution::Unstructured { indices, .. } => {
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
                let runs = index_runs(indices);
                // Locally unique, as the protocol has them: else the smallest repeated index,
                // with the first two buffer positions that hold it (found on the runs, not
                // the indices one by one).
                if let Some(g) = first_overlap(runs.iter().map(|r| (r.global, r.len))) {
                    let mut at: Vec<usize> = runs
                        .iter()
                        .filter(|r| r.global <= g && g - r.global < r.len)
                        .map(|r| r.local + (g - r.global))
                        .collect();
                    at.sort_unstable();
                    return Err(error(
                        where_,
                        format!(
                            "global index {g} is at positions {} and {} of this process's \
                             'indices' (the protocol has them locally unique)",
                            at[0], at[1]
                        ),
                    ));
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

    /// The widths of a block's communication padding (the neighbours' indices, the wrap-around
    /// one's included) at its low and its high end: 0 at an end whose padding is boundary
    /// padding (at an end of the process grid, inside the array).
    fn communication_padding(&self, start: isize, stop: usize, padding: [usize; 2]) -> [usize; 2] {
        let low = self.proc_grid_rank > 0 || start < 0;
        let high = self.proc_grid_rank + 1 < self.proc_grid_size || stop > self.size;
        [
            if low { padding[0] } else { 0 },
            if high { padding[1] } else { 0 },
        ]
    }

    /// The run of a block (none when it holds only padding), after checking its dictionary
    /// against the buffer's `extent` along the axis (see the module docs on `periodic`).
    fn block_run(
        &self,
        where_: Option<(usize, char)>,
        extent: usize,
        start: isize,
        stop: usize,
        padding: [usize; 2],
        periodic: bool,
    ) -> Result<Option<Run>> {
        let (size, procs, coord) = (self.size, self.proc_grid_size, self.proc_grid_rank);
        let pad = tuple_string(&padding);
        // Every value fits in an i128, so no sum or difference below overflows.
        let (lo, hi, n) = (start as i128, stop as i128, size as i128);
        if hi - lo != extent as i128 {
            return Err(error(
                where_,
                format!(
                    "start {start}, stop {stop} for size {size} and a buffer of {extent} along the \
                     axis"
                ),
            ));
        }
        // The padding is the first `padding[0]` and the last `padding[1]` indices of the buffer
        // (the protocol's "padding region at the beginning and end of a buffer"): together at
        // most the block, else the two regions would overlap or reach outside it.
        let padded = padding[0] as i128 + padding[1] as i128;
        if padded > extent as i128 {
            return Err(error(
                where_,
                format!(
                    "padding {pad} is {padded} wide, wider than the block's {extent} indices \
                     along the axis (start {start}, stop {stop}): the protocol's padding is \
                     part of the buffer, at its two ends"
                ),
            ));
        }
        let last = coord + 1 == procs;
        // An end below 0 or beyond `size`: the wrap-around neighbour's indices, at that end of a
        // periodic axis alone, and exactly its padding wide.
        let low_wraps = lo < 0;
        if low_wraps && !(periodic && coord == 0 && lo == -(padding[0] as i128)) {
            let why = if !periodic {
                "the axis is not periodic".to_string()
            } else if coord > 0 {
                format!(
                    "proc_grid_rank {coord} is not the first of {}",
                    processes(procs)
                )
            } else {
                format!(
                    "the low end of a periodic axis begins at 0 (its padding counted in size) or at \
                     -padding[0] = -{} (its padding the wrap-around neighbour's indices)",
                    padding[0]
                )
            };
            return Err(error(
                where_,
                format!("start {start} (padding {pad}) is below 0: {why}"),
            ));
        }
        let high_wraps = hi > n;
        if high_wraps && !(periodic && last && hi == n + padding[1] as i128) {
            let why = if !periodic {
                "the axis is not periodic".to_string()
            } else if !last {
                format!(
                    "proc_grid_rank {coord} is not the last of {}",
                    processes(procs)
                )
            } else {
                format!(
                    "the high end of a periodic axis ends at size {size} (its padding counted in \
                     size) or at size + padding[1] = {} (its padding the wrap-around neighbour's \
                     indices)",
                    n + padding[1] as i128
                )
            };
            return Err(error(
                where_,
                format!("stop {stop} (padding {pad}) is beyond size {size}: {why}"),
            ));
        }
        // Communication padding (a neighbour's indices, the wrap-around one's included) is left
        // out; boundary padding (at the ends of the grid, inside the array) is part of it.
        // At most `extent` together: each is at most its end's padding, checked above.
        let [left, right] = self.communication_padding(start, stop, padding);
        let len = extent - left - right;
        // Communication padding is at most as wide as the neighbour's indices (the protocol's
        // rule). On one process the wrap-around neighbour is this block: checked here; across
        // processes, `import_spmd` checks it once it has every rank's dictionaries.
        if procs == 1 {
            let ends = [(low_wraps, left, "low"), (high_wraps, right, "high")];
            if let Some(&(_, width, end)) = ends.iter().find(|e| e.0 && e.1 > len) {
                return Err(error(
                    where_,
                    format!(
                        "start {start}, stop {stop}, padding {pad}: the communication padding \
                         of {width} at the {end} end (the wrap-around neighbour's indices) is \
                         wider than the {} its neighbour owns (this process, the only one along \
                         the axis; the protocol has it at most that)",
                        count_of(len, "index", "indices")
                    ),
                ));
            }
            // The two ends of a periodic axis face each other across the wrap-around, here
            // the block's own: as wide as each other where both are communication padding
            // (each wraps or is 0 wide; an end counted in size is part of the array, as
            // boundary padding is), the rule `check_blocks` applies across processes.
            let counted = [padding[0] > 0 && left == 0, padding[1] > 0 && right == 0];
            if periodic && padding[0] != padding[1] && !counted[0] && !counted[1] {
                return Err(error(
                    where_,
                    format!(
                        "start {start}, stop {stop}, padding {pad} on a periodic axis: the \
                         communication padding across the wrap-around is {} wide at the high \
                         end of proc_grid_rank 0 and {} at the low end of its neighbour, \
                         proc_grid_rank 0 (this process, the only one along the axis; the \
                         protocol has the two equal)",
                        padding[1], padding[0]
                    ),
                ));
            }
        }
        // At least 0: `start` is, or it is `-padding[0]` and `left` is `padding[0]`.
        let global = usize::try_from(lo + left as i128).expect("checked above");
        Ok((len > 0).then_some(Run {
            global,
            local: left,
            len,
        }))
    }
}

/// The runs of an index list, in buffer order: a run ends wherever the next index is not one
/// more than this one's.
fn index_runs(indices: &[usize]) -> Vec<Run> {
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
/// The pieces are the buffer's as this process alone sees it: an index of an unstructured
/// axis that other processes hold too (`one_to_one` false) is among them, where
/// [`import_spmd`] reads it from one process only.
pub fn pieces(
    dims: &[DimData],
    extents: &[usize],
    rank: usize,
    nprocs: usize,
) -> Result<(Vec<Piece>, Vec<usize>)> {
    let axes = checked_runs(dims, extents, rank, nprocs)?;
    Ok((combinations(&axes), global_shape(dims)))
}

/// This process's partitions of a DAP array, `(global start, view of buffer)` pairs, and the
/// global shape (see [`pieces`]: this process's alone, whatever the others hold).
pub fn local_parts(
    buffer: &Tensor,
    dims: &[DimData],
    rank: usize,
    nprocs: usize,
) -> Result<(Placed, Vec<usize>)> {
    let axes = checked_runs(dims, buffer.shape(), rank, nprocs)?;
    Ok((views(buffer, &axes)?, global_shape(dims)))
}

/// `(global start, view of buffer)` of each combination of runs of `axes`, in C order.
fn views(buffer: &Tensor, axes: &[Vec<Run>]) -> Result<Placed> {
    combinations(axes)
        .into_iter()
        .map(|p| Ok((p.start, buffer.view(&p.local, &p.shape)?)))
        .collect()
}

/// The global shape the dimension dictionaries give.
fn global_shape(dims: &[DimData]) -> Vec<usize> {
    dims.iter().map(|d| d.size).collect()
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
    let grid = Grid::from_splits(&global_shape(dims), splits)?;
    // Views of the buffer cut at the grid's own slabs: exactly its boxes, in its dtype.
    let tensors = views(buffer, &axes)?.into_iter().map(|(_, t)| t).collect();
    Ok(PartitionedArray::from_tensors_unchecked(
        grid,
        tensors,
        buffer.dtype(),
    ))
}

/// The SPMD array of a DAP array spread over the ranks of `comm`, a collective call: each
/// rank's pieces of its `buffer` (views, no copy) become its partitions through
/// [`spmd::from_local`], so a rank whose buffer or dimension dictionaries are wrong makes
/// every rank return the same error. An all-gather of the ranks' dictionaries comes first:
/// along an unstructured axis, an index several processes hold is read from the one of lowest
/// `proc_grid_rank` (an error when `one_to_one` is true; see the module docs); along a block
/// axis, ranks that disagree on `periodic` or `size`, ranks at one `proc_grid_rank` that own
/// different global indices, blocks that own an index twice or not at all (an undistributed
/// axis not owned whole), communication padding wider than the indices its neighbour owns,
/// and padding unequal to its neighbour's across a boundary, are errors; along a cyclic axis,
/// ranks at one `proc_grid_rank` that give different `start`s or `block_size`s, coordinates
/// that deal blocks of different sizes, and blocks that hold an index twice or not at all, are
/// errors; so are ranks that give one axis different `dist_type`s. Each rank sends a few
/// numbers per axis, and for an index list its runs of consecutive indices (the lowest rank at
/// each coordinate; the others a fingerprint of theirs, which must match): bytes per run, not
/// per index.
pub fn import_spmd(
    comm: &dyn Communicator,
    buffer: &Tensor,
    dims: &[DimData],
) -> Result<PartitionedArray> {
    spmd_import(comm, Ok((buffer, dims)))
}

/// The collective [`import_spmd`] makes, as the ranks name it to each other.
const CALL: &str = "from_distarray";

/// [`import_spmd`] of this rank's buffer and dimension dictionaries, or of the error that
/// stopped it before (which every rank then returns).
pub(crate) fn spmd_import(
    comm: &dyn Communicator,
    input: Result<(&Tensor, &[DimData])>,
) -> Result<PartitionedArray> {
    let checked = input.and_then(|(buffer, dims)| {
        let axes = checked_runs(dims, buffer.shape(), comm.rank(), comm.size())?;
        Ok((buffer, dims, axes))
    });
    let mine = checked
        .as_ref()
        .map(|(_, dims, axes)| encode_axes(dims, axes));
    let all = spmd::share(comm, CALL, mine.as_ref().map(Vec::as_slice).map_err(|e| *e))?;
    let (buffer, dims, mut axes) = checked.expect("a failed rank returned above");
    let shares = all
        .iter()
        .enumerate()
        .map(|(rank, bytes)| decode_axes(Reader::new(bytes, rank)))
        .collect::<Result<Vec<_>>>()?;
    // Decided from the same bytes on every rank: the same verdict everywhere.
    read_from_lowest(&shares, comm.rank(), &mut axes)?;
    let parts = views(buffer, &axes).map(LocalParts::Placed);
    spmd::from_local_in(comm, CALL, parts, Some(&global_shape(dims)))
}

/// What a rank tells the others of one of its axes before it cuts its pieces: a few numbers
/// per axis, and along an unstructured axis its index list as runs (a list compresses into
/// its runs of consecutive indices), so that what the ranks gather grows with the runs, not
/// with the indices.
struct AxisShare {
    size: usize,
    procs: usize,
    coord: usize,
    /// The indices this process owns along the axis as it reads its own buffer (the lengths
    /// of its runs; what the protocol's `num_owned_indices` counts, a block's communication
    /// padding left out).
    owned: usize,
    kind: Shared,
}

/// The distribution's part of an [`AxisShare`].
enum Shared {
    /// A block: `periodic`, its `padding` (for messages), the widths of its communication
    /// padding at each end ([`DimData::communication_padding`]) and the first global index it
    /// owns (`start` past the low communication padding): the block owns
    /// `owned_start..owned_start + owned`, which every rank at one coordinate gives alike and
    /// which the coordinates' blocks tile (see [`check_blocks`]). `start` and `stop` are those
    /// less and plus the communication padding.
    Block {
        periodic: bool,
        padding: [usize; 2],
        communication: [usize; 2],
        owned_start: usize,
    },
    /// Cyclic blocks: `start` and `block_size`, which every rank at one coordinate gives
    /// alike, and whose blocks cover the axis once over the coordinates (see
    /// [`check_cyclic`]).
    Cyclic { start: usize, block_size: usize },
    /// An index list: `one_to_one`, a fingerprint of the list and `one_to_one` together
    /// (which every rank at one coordinate must give alike), and the list as
    /// `(first global index, length)` runs in buffer order. Only the lowest rank at its
    /// coordinate along the axis (the one at coordinate 0 along every other axis) sends the
    /// runs: the others' lists are the same when their fingerprints are.
    Listed {
        one_to_one: bool,
        print: u64,
        runs: Option<Vec<(usize, usize)>>,
    },
}

impl Shared {
    /// The protocol's `dist_type` of the share.
    fn dist_type(&self) -> char {
        match self {
            Shared::Block { .. } => 'b',
            Shared::Cyclic { .. } => 'c',
            Shared::Listed { .. } => 'u',
        }
    }
}

/// This rank's [`AxisShare`]s: its dimension dictionaries `dims` and the runs `axes` read
/// from them.
fn encode_axes(dims: &[DimData], axes: &[Vec<Run>]) -> Vec<u8> {
    let mut w = Writer::default();
    w.usize(dims.len());
    for (a, (d, runs)) in dims.iter().zip(axes).enumerate() {
        let owned: usize = runs.iter().map(|r| r.len).sum();
        w.usize(d.size)
            .usize(d.proc_grid_size)
            .usize(d.proc_grid_rank)
            .usize(owned);
        match &d.distribution {
            &Distribution::Block {
                start,
                stop,
                padding,
                periodic,
            } => {
                let [low, high] = d.communication_padding(start, stop, padding);
                // At least 0: `DimData::runs` let `start` below 0 only as `-padding[0]`, at a
                // low end whose padding is communication padding (`low`).
                let owned_start =
                    usize::try_from(start as i128 + low as i128).expect("checked by DimData::runs");
                w.u8(2).u8(u8::from(periodic));
                w.usize(padding[0]).usize(padding[1]).usize(low).usize(high);
                w.usize(owned_start);
            }
            &Distribution::Cyclic { start, block_size } => {
                w.u8(0).usize(start).usize(block_size);
            }
            Distribution::Unstructured { one_to_one, .. } => {
                // The runs of the list, in buffer order (the empty run of an empty axis is
                // none of the list's).
                let flat: Vec<usize> = runs
                    .iter()
                    .filter(|r| r.len > 0)
                    .flat_map(|r| [r.global, r.len])
                    .collect();
                let mut listed = Writer::default();
                listed.u8(u8::from(*one_to_one)).usizes(&flat);
                let print = spmd::fingerprint(&listed.0);
                let first_here = dims
                    .iter()
                    .enumerate()
                    .all(|(b, e)| b == a || e.proc_grid_rank == 0);
                w.u8(1).u8(u8::from(*one_to_one)).u64(print);
                w.u8(u8::from(first_here));
                if first_here {
                    w.usizes(&flat);
                }
            }
        }
    }
    w.0
}

fn decode_axes(mut r: Reader<'_>) -> Result<Vec<AxisShare>> {
    let n = r.usize()?;
    let mut axes = Vec::new();
    for _ in 0..n {
        let (size, procs, coord, owned) = (r.usize()?, r.usize()?, r.usize()?, r.usize()?);
        let kind = match r.u8()? {
            2 => Shared::Block {
                periodic: r.u8()? == 1,
                padding: [r.usize()?, r.usize()?],
                communication: [r.usize()?, r.usize()?],
                owned_start: r.usize()?,
            },
            1 => {
                let one_to_one = r.u8()? == 1;
                let print = r.u64()?;
                let runs = match r.u8()? {
                    1 => {
                        let flat = r.usizes()?;
                        Some(flat.chunks_exact(2).map(|p| (p[0], p[1])).collect())
                    }
                    _ => None,
                };
                Shared::Listed {
                    one_to_one,
                    print,
                    runs,
                }
            }
            _ => Shared::Cyclic {
                start: r.usize()?,
                block_size: r.usize()?,
            },
        };
        axes.push(AxisShare {
            size,
            procs,
            coord,
            owned,
            kind,
        });
    }
    Ok(axes)
}

/// `"0"`, `"0 and 2"`, `"0, 1 and 3"`.
fn and_list(items: &[usize]) -> String {
    match items {
        [] => String::new(),
        [one] => one.to_string(),
        [head @ .., last] => {
            let head: Vec<String> = head.iter().map(ToString::to_string).collect();
            format!("{} and {last}", head.join(", "))
        }
    }
}

/// Along each axis, from every rank's [`AxisShare`]s: checks that the ranks agree on the
/// process grid, and on each axis what one rank cannot check alone. Along an unstructured
/// axis: that every global index is held, then cuts this rank's (`me`) runs there down to
/// the indices it is the lowest coordinate to hold (see the module docs on `one_to_one`).
/// Along a block axis: see [`check_blocks`]. Along a cyclic axis: see [`check_cyclic`]. Along
/// every axis, first: that every rank gives it the same `dist_type`.
fn read_from_lowest(shares: &[Vec<AxisShare>], me: usize, axes: &mut [Vec<Run>]) -> Result<()> {
    // One process grid on every rank, or the coordinates below are not of one grid.
    let grid = |s: &[AxisShare]| s.iter().map(|a| a.procs).collect::<Vec<_>>();
    let grid0 = grid(&shares[0]);
    if let Some((r, g)) = shares
        .iter()
        .map(|s| grid(s))
        .enumerate()
        .find(|(_, g)| *g != grid0)
    {
        return Err(error(
            None,
            format!(
                "rank 0 reads a process grid of {}, rank {r} {}: every process reads the same",
                tuple_string(&grid0),
                tuple_string(&g)
            ),
        ));
    }
    for (a, &procs) in grid0.iter().enumerate() {
        let axis: Vec<&AxisShare> = shares.iter().map(|s| &s[a]).collect();
        // One dist_type along the axis: a dictionary at another coordinate describes the
        // other coordinates' shares of the same distribution (and the protocol has the
        // dictionaries at one coordinate identical).
        let kind = axis[0].kind.dist_type();
        if let Some(r) = (0..axis.len()).find(|&r| axis[r].kind.dist_type() != kind) {
            return Err(Error::dist_array(
                format!(" dim_data[{a}]"),
                format!(
                    "dist_type is '{kind}' at proc_grid_rank {} (rank 0) but '{}' at \
                     proc_grid_rank {} (rank {r}): an axis has one dist_type on every process",
                    axis[0].coord,
                    axis[r].kind.dist_type(),
                    axis[r].coord
                ),
            ));
        }
        match kind {
            'u' => read_listed(&axis, procs, me, Some((a, kind)), &mut axes[a])?,
            'b' => {
                // Ranks along the axis (the ranks are the grid's coordinates in C order, every
                // rank checked its own) are `stride` apart.
                let stride = grid0[a + 1..].iter().product();
                check_blocks(&axis, procs, stride, a)?;
            }
            _ => check_cyclic(&axis, procs, a)?,
        }
    }
    Ok(())
}

/// `True` or `False` of a rank's share of a block axis, `None` for other distributions.
fn periodic_of(share: &AxisShare) -> Option<bool> {
    match share.kind {
        Shared::Block { periodic, .. } => Some(periodic),
        _ => None,
    }
}

/// `(start, stop, padding)` of a rank's share of a block axis as its dictionary gives them,
/// and the global indices it owns, `start..stop` less its communication padding.
fn block_of(share: &AxisShare) -> (isize, usize, [usize; 2], (usize, usize)) {
    match share.kind {
        Shared::Block {
            padding,
            communication,
            owned_start,
            ..
        } => {
            let owned = (owned_start, owned_start + share.owned);
            // Both fit: `DimData::runs` read them from an `isize` start and a `usize` stop.
            let start = (owned_start as i128 - communication[0] as i128) as isize;
            let stop = owned.1 + communication[1];
            (start, stop, padding, owned)
        }
        _ => unreachable!("check_blocks reads block axes"),
    }
}

/// [`read_from_lowest`] along block axis `a`, over `procs` coordinates `stride` ranks apart
/// (every rank's share of it in `axis`): the ranks agree on `periodic` and `size`; the ranks
/// at one coordinate own the same global indices (the protocol has the dimension dictionaries
/// at one `proc_grid_rank` identical, their padding aside, which may differ at the ends of the
/// process grid: so the indices compared are `start..stop` less communication padding, with
/// boundary padding and an end counted in `size` kept, as [`DimData::runs`] reads them); the
/// coordinates' blocks own every global index once (in any order; along an axis of one
/// process, an undistributed one, that block owns all of it); each communication padding is
/// at most as wide as the indices its neighbour owns, and as wide as the neighbour's padding
/// facing it (the protocol's rules; the wrap-around neighbour's on a periodic axis).
fn check_blocks(axis: &[&AxisShare], procs: usize, stride: usize, a: usize) -> Result<()> {
    let at = Some((a, 'b'));
    let mut blocks = (0..axis.len()).filter_map(|r| Some((r, periodic_of(axis[r])?)));
    if let Some((r0, periodic)) = blocks.next() {
        if let Some((r, _)) = blocks.find(|&(_, p)| p != periodic) {
            return Err(error(
                at,
                format!(
                    "periodic is {} at proc_grid_rank {} (rank {r0}) but {} at proc_grid_rank {} \
                     (rank {r}): it speaks for the whole axis",
                    py_bool(periodic),
                    axis[r0].coord,
                    py_bool(!periodic),
                    axis[r].coord
                ),
            ));
        }
    }
    let size = one_size(axis, at)?;
    // The first rank at each coordinate; the others there own the same indices.
    let first = first_at_each_coordinate(
        axis,
        procs,
        at,
        |share| block_of(share).3,
        |r0, r, c| {
            let (s0, t0, p0, o0) = block_of(axis[r0]);
            let (s, t, p, o) = block_of(axis[r]);
            format!(
                "ranks {r0} and {r}, both at proc_grid_rank {c} along it, give start \
                         {s0}, stop {t0}, padding {} and start {s}, stop {t}, padding {}, which \
                         own global indices {}..{} and {}..{} (the protocol has the dimension \
                         dictionaries at one proc_grid_rank identical)",
                tuple_string(&p0),
                tuple_string(&p),
                o0.0,
                o0.1,
                o.0,
                o.1
            )
        },
    )?;
    let owned: Vec<(usize, usize)> = first.iter().map(|&r| block_of(axis[r]).3).collect();
    // The coordinates' owned indices, by start, must tile `0..size`.
    let mut spans: Vec<(usize, usize, usize)> = owned
        .iter()
        .enumerate()
        .map(|(c, &(lo, hi))| (lo, hi, c))
        .collect();
    let ranges = |coords: &[usize]| -> Vec<String> {
        coords
            .iter()
            .map(|&c| format!("{}..{}", owned[c].0, owned[c].1))
            .collect()
    };
    if let Some(fault) = tiling_fault(&mut spans, size, true) {
        let found = match fault {
            Fault::Twice(g, coords) => format!(
                "global index {g} is owned by the processes at proc_grid_rank {} along it \
                 (global indices {}): blocks own each index once",
                and_list(&coords),
                ranges(&coords).join(" and ")
            ),
            Fault::Gap(lo, hi) => {
                let all: Vec<usize> = (0..procs).collect();
                let owners = match procs {
                    1 => format!(
                        "proc_grid_rank 0, the only process along it, owns {}..{} of size {size}",
                        owned[0].0, owned[0].1
                    ),
                    _ => format!(
                        "proc_grid_rank 0 to {} own {} of size {size}",
                        procs - 1,
                        ranges(&all).join(", ")
                    ),
                };
                format!("global indices {lo}..{hi} are owned by no process ({owners})")
            }
        };
        return Err(error(at, found));
    }
    // The neighbour along the axis of rank `r` (at coordinate `c`): the rank at coordinate
    // `next` there, at the same coordinates along the other axes.
    let neighbour = |r: usize, c: usize, next: usize| r - c * stride + next * stride;
    for (r, share) in axis.iter().enumerate() {
        let Shared::Block {
            padding,
            communication,
            ..
        } = share.kind
        else {
            continue;
        };
        let c = share.coord;
        for (end, width, next) in [
            ("low", communication[0], (c + procs - 1) % procs),
            ("high", communication[1], (c + 1) % procs),
        ] {
            let n = neighbour(r, c, next);
            let owned = axis[n].owned;
            if width > owned {
                return Err(error(
                    at,
                    format!(
                        "rank {r} (proc_grid_rank {c} along it) has padding {}: the \
                         communication padding of {width} at its {end} end is wider than the {} \
                         its neighbour owns, rank {n} at proc_grid_rank {next} (the protocol \
                         has it at most that)",
                        tuple_string(&padding),
                        count_of(owned, "index", "indices")
                    ),
                ));
            }
        }
    }
    // The two sides of each boundary between neighbours hold each other's indices: the high
    // padding of one coordinate and the low padding of the next are as wide (the protocol's
    // rule). On a periodic axis the boundary across the wrap-around is one of them where
    // both its ends are communication padding (each wraps around, or is 0 wide); an end
    // counted in size is part of the array, as boundary padding is, and the protocol's rule
    // for equal widths speaks of communication padding alone, so such an end is as wide as
    // it likes. On an axis that is not periodic, the ends are boundary padding. On one
    // process along the axis, `DimData::runs` checked the block against itself.
    if procs > 1 {
        for (r, share) in axis.iter().enumerate() {
            let (
                Shared::Block {
                    padding,
                    communication,
                    ..
                },
                c,
            ) = (&share.kind, share.coord)
            else {
                continue;
            };
            let last = c + 1 == procs;
            if last && !periodic_of(share).unwrap_or(false) {
                continue;
            }
            let next = (c + 1) % procs;
            let n = neighbour(r, c, next);
            let Shared::Block {
                padding: theirs,
                communication: their_communication,
                ..
            } = &axis[n].kind
            else {
                continue;
            };
            // An end counted in size: padding that is not communication padding.
            let counted = (padding[1] > 0 && communication[1] == 0)
                || (theirs[0] > 0 && their_communication[0] == 0);
            if padding[1] != theirs[0] && !counted {
                let across = if last {
                    " across the wrap-around of the periodic axis"
                } else {
                    ""
                };
                return Err(error(
                    at,
                    format!(
                        "rank {r} (proc_grid_rank {c} along it) has padding {} and its \
                         neighbour{across}, rank {n} at proc_grid_rank {next}, has padding {}: \
                         the communication padding between them is {} wide at the high end of \
                         rank {r} and {} at the low end of rank {n} (the protocol has the two \
                         equal)",
                        tuple_string(padding),
                        tuple_string(theirs),
                        padding[1],
                        theirs[0]
                    ),
                ));
            }
        }
    }
    Ok(())
}

/// `(start, block_size)` of a rank's share of a cyclic axis.
fn cyclic_of(share: &AxisShare) -> (usize, usize) {
    match share.kind {
        Shared::Cyclic { start, block_size } => (start, block_size),
        _ => unreachable!("check_cyclic reads cyclic axes"),
    }
}

/// The `size` every rank gives an axis: an error naming the first rank that differs from
/// rank 0.
fn one_size(axis: &[&AxisShare], at: Option<(usize, char)>) -> Result<usize> {
    let size = axis[0].size;
    if let Some(r) = (0..axis.len()).find(|&r| axis[r].size != size) {
        return Err(error(
            at,
            format!("size {size} on rank 0, {} on rank {r}", axis[r].size),
        ));
    }
    Ok(size)
}

/// The lowest rank at each of the `procs` coordinates along an axis, after checking that the
/// ranks at one coordinate give the same `key` (the protocol has the dimension dictionaries at
/// one `proc_grid_rank` identical): `differ(r0, r, c)` words the error for ranks `r0 < r` at
/// coordinate `c` that do not; a coordinate no rank is at is an error too.
fn first_at_each_coordinate<K: PartialEq>(
    axis: &[&AxisShare],
    procs: usize,
    at: Option<(usize, char)>,
    key: impl Fn(&AxisShare) -> K,
    differ: impl Fn(usize, usize, usize) -> String,
) -> Result<Vec<usize>> {
    let mut first: Vec<Option<usize>> = vec![None; procs];
    for (r, share) in axis.iter().enumerate() {
        let c = share.coord;
        match first[c] {
            None => first[c] = Some(r),
            Some(r0) if key(axis[r0]) != key(share) => return Err(error(at, differ(r0, r, c))),
            Some(_) => {}
        }
    }
    first
        .iter()
        .enumerate()
        .map(|(c, r)| {
            r.ok_or_else(|| error(at, format!("no rank is at proc_grid_rank {c} along it")))
        })
        .collect()
}

/// [`read_from_lowest`] along cyclic axis `a`, over `procs` coordinates (every rank's share of
/// it in `axis`): the ranks agree on `size`; the ranks at one coordinate give the same `start`
/// and `block_size` (the protocol has the dimension dictionaries at one `proc_grid_rank`
/// identical); every coordinate deals blocks of one `block_size`; and the blocks cover every
/// global index once. Blocks of one size `b` repeat every `procs * b` indices, so the first
/// block of each coordinate (those starting below that period and `size`, cut at both) must
/// tile the indices below the smaller of the two: a sweep over `procs` spans, whatever `size`.
fn check_cyclic(axis: &[&AxisShare], procs: usize, a: usize) -> Result<()> {
    let at = Some((a, 'c'));
    let size = one_size(axis, at)?;
    // The first rank at each coordinate; the others there give the same numbers.
    let first = first_at_each_coordinate(axis, procs, at, cyclic_of, |r0, r, c| {
        let ((s0, b0), (s, b)) = (cyclic_of(axis[r0]), cyclic_of(axis[r]));
        format!(
            "ranks {r0} and {r}, both at proc_grid_rank {c} along it, give start {s0}, \
             block_size {b0} and start {s}, block_size {b} (the protocol has the dimension \
             dictionaries at one proc_grid_rank identical)"
        )
    })?;
    let dealt: Vec<(usize, usize, usize)> = first
        .iter()
        .map(|&r| {
            let (start, block_size) = cyclic_of(axis[r]);
            (start, block_size, r)
        })
        .collect();
    let (_, block_size, r0) = dealt[0];
    if let Some(c) = dealt.iter().position(|d| d.1 != block_size) {
        return Err(error(
            at,
            format!(
                "block_size is {block_size} at proc_grid_rank 0 (rank {r0}) but {} at \
                 proc_grid_rank {c} (rank {}): the blocks dealt round-robin along an axis are \
                 of one size",
                dealt[c].1, dealt[c].2
            ),
        ));
    }
    // Below `period` (or `size`, the smaller), each coordinate holds its first block alone.
    let period = procs.saturating_mul(block_size).min(size);
    let mut spans: Vec<(usize, usize, usize)> = dealt
        .iter()
        .enumerate()
        .filter(|(_, d)| d.0 < period)
        .map(|(c, d)| (d.0, d.0.saturating_add(block_size).min(period), c))
        .collect();
    if let Some(fault) = tiling_fault(&mut spans, period, true) {
        let found = match fault {
            Fault::Twice(g, coords) => {
                let starts: Vec<usize> = coords.iter().map(|&c| dealt[c].0).collect();
                format!(
                    "global index {g} is held by the processes at proc_grid_rank {} along it \
                     (start {}, block_size {block_size}): cyclic blocks hold each index once",
                    and_list(&coords),
                    and_list(&starts)
                )
            }
            Fault::Gap(lo, hi) => {
                let starts: Vec<usize> = dealt.iter().map(|d| d.0).collect();
                let coords = match procs {
                    1 => format!("start {} at proc_grid_rank 0", starts[0]),
                    _ => format!(
                        "starts {} at proc_grid_rank 0 to {}",
                        tuple_string(&starts),
                        procs - 1
                    ),
                };
                format!(
                    "global indices {lo}..{hi} are held by no process ({coords} along it, \
                     block_size {block_size})"
                )
            }
        };
        return Err(error(at, found));
    }
    Ok(())
}

/// [`read_from_lowest`] along one unstructured axis over `procs` coordinates (every rank's
/// share of it in `axis`, `at` for messages): this rank's (`me`) runs in `runs`. A sweep over
/// every coordinate's runs, sorted by start, finds the indices no process holds and those
/// several hold.
fn read_listed(
    axis: &[&AxisShare],
    procs: usize,
    me: usize,
    at: Option<(usize, char)>,
    runs: &mut Vec<Run>,
) -> Result<()> {
    let size = one_size(axis, at)?;
    // (one_to_one, fingerprint, runs) of a rank's share: every share here is listed.
    fn listed(s: &AxisShare) -> (bool, u64, Option<&[(usize, usize)]>) {
        match &s.kind {
            Shared::Listed {
                one_to_one,
                print,
                runs,
            } => (*one_to_one, *print, runs.as_deref()),
            _ => unreachable!("read_listed reads unstructured axes"),
        }
    }
    // Each coordinate's indices, as the first rank there gives them: the others there (the
    // processes along the other axes) give the same, as the protocol has it (the same
    // fingerprint of indices and one_to_one).
    let first = first_at_each_coordinate(
        axis,
        procs,
        at,
        |share| listed(share).1,
        |r0, r, c| {
            format!(
                "ranks {r0} and {r}, both at proc_grid_rank {c} along it, give different \
                 'indices' or 'one_to_one'"
            )
        },
    )?;
    let mut held: Vec<(&[(usize, usize)], bool)> = Vec::with_capacity(procs);
    for (c, &r) in first.iter().enumerate() {
        let (one_to_one, _, listed_runs) = listed(axis[r]);
        // The lowest rank at a coordinate is the one at coordinate 0 along the other axes,
        // which sends its runs.
        let Some(listed_runs) = listed_runs else {
            return Err(error(
                at,
                format!("rank {r}, the first at proc_grid_rank {c} along it, sent no indices"),
            ));
        };
        held.push((listed_runs, one_to_one));
    }
    let one_to_one = held[0].1;
    if let Some(c) = held.iter().position(|h| h.1 != one_to_one) {
        return Err(error(
            at,
            format!(
                "one_to_one is {} at proc_grid_rank 0 but {} at proc_grid_rank {c}: it speaks \
                 for the whole axis",
                py_bool(one_to_one),
                py_bool(!one_to_one)
            ),
        ));
    }
    // Every coordinate's runs as (start, end, coordinate), by start: an index held twice is
    // held by two coordinates (a coordinate's own runs never overlap: its indices are locally
    // unique).
    let mut spans: Vec<(usize, usize, usize)> = held
        .iter()
        .enumerate()
        .flat_map(|(c, (runs, _))| runs.iter().map(move |&(g, n)| (g, g + n, c)))
        .collect();
    // The first fault by index: a shared index below the first gap (one_to_one true), or the gap.
    if let Some(fault) = tiling_fault(&mut spans, size, one_to_one) {
        let found = match fault {
            Fault::Twice(g, coords) => format!(
                "global index {g} is held by the processes at proc_grid_rank {} along it, \
                 and one_to_one is True",
                and_list(&coords)
            ),
            Fault::Gap(lo, hi) => format!("global indices {lo}..{hi} are held by no process"),
        };
        return Err(error(at, found));
    }
    let coord = axis[me].coord;
    if size > 0 {
        // The indices of lower coordinates, merged into disjoint spans: this rank's runs
        // (its list is its coordinate's) less those.
        let mut lower: Vec<(usize, usize)> = Vec::new();
        for &(start, stop, _) in spans.iter().filter(|s| s.2 < coord) {
            match lower.last_mut() {
                Some(last) if start <= last.1 => last.1 = last.1.max(stop),
                _ => lower.push((start, stop)),
            }
        }
        *runs = runs_outside(runs, &lower);
    }
    Ok(())
}

/// The parts of `runs` (in their order, each cut in ascending order) outside `taken`, disjoint
/// `(start, end)` spans of global indices sorted by start.
fn runs_outside(runs: &[Run], taken: &[(usize, usize)]) -> Vec<Run> {
    let mut out = Vec::new();
    for r in runs {
        let (mut at, end) = (r.global, r.global + r.len);
        // The first span ending past `at`, then each one after it that starts before `end`.
        let mut k = taken.partition_point(|&(_, stop)| stop <= at);
        while at < end {
            let (start, stop) = match taken.get(k) {
                Some(&(start, stop)) if start < end => (start, stop),
                _ => (end, end),
            };
            if start > at {
                out.push(Run {
                    global: at,
                    local: r.local + (at - r.global),
                    len: start - at,
                });
            }
            at = at.max(stop);
            k += 1;
        }
    }
    out
}

/// `True` or `False`, as the protocol's Python dicts write them.
fn py_bool(b: bool) -> &'static str {
    if b {
        "True"
    } else {
        "False"
    }
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
        .map(|a| {
            let start = held.start[a];
            let distribution = Distribution::block(start, start + held.shape[a]).map_err(|_| {
                error(
                    None,
                    format!("partition start {start} along axis {a} is beyond isize::MAX"),
                )
            })?;
            Ok(DimData {
                size: array.shape()[a],
                proc_grid_size: tiling[a],
                proc_grid_rank: held.position[a],
                distribution,
            })
        })
        .collect::<Result<_>>()?;
    Ok((t.clone(), dims))
}

#[cfg(test)]
mod tests;
