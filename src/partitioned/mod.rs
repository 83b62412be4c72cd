//! The partitioned array: one logical n-d array cut along a [`Grid`], each partition holding
//! its data here (a [`Tensor`]), a [`Handle`] to data not fetched yet, or nothing (another
//! rank's partition), with the [`Location`]s where it can be reached.
//!
//! [`PartitionedArray`] is dlpart's one model of a partitioned array: every way an array comes
//! into being (cut from a tensor, imported from a `__partitioned__` dict, made by an operation)
//! ends in it, and its methods are the operations (`repartition`, `assemble`, `gather`, ...).
//! [`PartitionedArray::new`] checks invariants 6, 7, 9 and 10 of [`crate::grid`] (the grid
//! itself guarantees 1-5; [`Location::parse_device`] checks 8):
//! - 6: two partitions holding data with different dtypes.
//! - 7: a partition's tensor whose shape differs from the partition's shape.
//! - 9: a partition holding data here and listing a location in this process (its pid is
//!   ours), where no such location names the tensor's device. dlpart plans transfers from these
//!   devices, so a dict that misstates them is refused rather than trusted. Locations in other
//!   processes describe where the original lives, which a copy fetched here need not share.
//! - 10: a `locals` position outside the grid, or listed twice. A local partition need not hold
//!   data yet (it may be fetched through a handle later).

mod location;
mod ops;

use std::any::Any;
use std::fmt;
use std::sync::Arc;

pub use location::Location;
pub(crate) use location::LocationTable;
pub(crate) use ops::{host_indices, moved_to_device};

use crate::device::Device;
use crate::dtype::DType;
use crate::error::{tuple_string, Error, Result};
use crate::grid::validate::Violations;
use crate::grid::{inv, Grid};
use crate::tensor::Tensor;

/// An opaque reference to a partition's data that lives elsewhere (a Dask future, a Ray
/// ObjectRef): resolved only when the data is needed, through [`PartitionedArray::fetch`].
#[derive(Clone)]
pub struct Handle(Arc<dyn Any + Send + Sync>);

impl Handle {
    /// Wraps any value as a handle.
    pub fn new<T: Any + Send + Sync>(value: T) -> Self {
        Handle(Arc::new(value))
    }

    /// The wrapped value, if it is a `T`.
    pub fn downcast_ref<T: Any>(&self) -> Option<&T> {
        self.0.downcast_ref()
    }
}

impl fmt::Debug for Handle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Handle(..)")
    }
}

/// What a partition holds in this process.
#[derive(Clone, Debug)]
pub enum Data {
    /// The data, as a tensor on some device.
    Tensor(Tensor),
    /// A handle to data not fetched yet.
    Handle(Handle),
    /// Nothing: another rank's partition (SPMD).
    Remote,
}

impl Data {
    /// The tensor, if the data is here.
    pub fn tensor(&self) -> Option<&Tensor> {
        match self {
            Data::Tensor(t) => Some(t),
            _ => None,
        }
    }

    /// The handle, if the data has not been fetched yet.
    pub fn handle(&self) -> Option<&Handle> {
        match self {
            Data::Handle(h) => Some(h),
            _ => None,
        }
    }
}

/// One partition of a [`PartitionedArray`], borrowed from it.
#[derive(Clone, Debug)]
pub struct Partition<'a> {
    /// The grid position.
    pub position: Vec<usize>,
    /// The global index of the partition's first element.
    pub start: Vec<usize>,
    /// The partition's shape.
    pub shape: Vec<usize>,
    /// What the partition holds here.
    pub data: &'a Data,
    /// Where it can be reached (several mean replicas). Empty for data dlpart holds in this
    /// process, whose tensor says where it is.
    pub locations: &'a [Location],
}

impl Partition<'_> {
    /// The tensor, if the data is here.
    pub fn tensor(&self) -> Option<&Tensor> {
        self.data.tensor()
    }

    /// The device the data lives on: the tensor's, else the first location's.
    pub fn device(&self) -> Option<Device> {
        match self.data {
            Data::Tensor(t) => Some(t.device()),
            _ => self.locations.first().map(|l| l.device),
        }
    }
}

/// A validated partitioned array: a grid, each partition's [`Data`] and [`Location`]s, the
/// positions this rank owns (`locals`, SPMD producers only) and the dtype.
#[derive(Clone, Debug)]
pub struct PartitionedArray {
    grid: Grid,
    dtype: Option<DType>,
    data: Vec<Data>,
    locations: LocationTable,
    locals: Option<Vec<Vec<usize>>>,
}

impl PartitionedArray {
    /// Checks `data` and `locations` (one entry per partition of `grid`, in C order of
    /// positions) and `locals` against the grid and each other, reporting every violation.
    /// The dtype is that of the partitions holding data (`None` when none does).
    ///
    /// This is the Rust side of importing a `__partitioned__` dict: arrays made apart (by
    /// several workers, say) become the partitions of one array, without a copy.
    ///
    /// ```
    /// use dlpart::{Data, Grid, PartitionedArray, Tensor};
    /// use ndarray::{array, concatenate, Axis};
    ///
    /// let (top, bottom) = (array![[1.0f64, 2.0], [3.0, 4.0]], array![[5.0f64, 6.0]]);
    /// let grid = Grid::from_splits(&[3, 2], vec![vec![0, 2, 3], vec![0, 2]])?;
    /// let data = vec![
    ///     Data::Tensor(Tensor::from(top.clone())),
    ///     Data::Tensor(Tensor::from(bottom.clone())),
    /// ];
    /// let pa = PartitionedArray::new(grid, data.clone(), vec![vec![]; 2], None)?;
    /// let whole = pa.assemble(None, false)?;
    /// assert_eq!(whole.as_array::<f64>()?, concatenate![Axis(0), top, bottom].into_dyn());
    /// // Data that does not fit its partition is refused, naming the position and the rule.
    /// let grid = Grid::from_splits(&[3, 2], vec![vec![0, 1, 3], vec![0, 2]])?;
    /// let e = PartitionedArray::new(grid, data, vec![vec![]; 2], None).unwrap_err();
    /// let found = "tensor of shape (2, 2) for a partition of shape (1, 2)";
    /// assert!(e.to_string().contains(found), "{e}");
    /// # Ok::<(), dlpart::Error>(())
    /// ```
    pub fn new(
        grid: Grid,
        data: Vec<Data>,
        locations: Vec<Vec<Location>>,
        locals: Option<Vec<Vec<usize>>>,
    ) -> Result<Self> {
        Self::new_in_order(grid, data, locations.into(), locals, None, Vec::new(), &[])
    }

    /// [`PartitionedArray::new`], where partition `first` (a flat index) sets the dtype the
    /// others are checked against (invariant 6): the first one a producer's data was read
    /// from. By default, the first partition holding data in C order. `found` are the
    /// violations the caller found while reading the parts, each with the flat index of its
    /// partition, in that order: listed with that partition's own. `reported`: by flat index
    /// (ascending), the device a partition's producer reported for its data where that differs
    /// from the tensor's (see [`contradicts`]).
    pub(crate) fn new_in_order(
        grid: Grid,
        data: Vec<Data>,
        locations: LocationTable,
        locals: Option<Vec<Vec<usize>>>,
        first: Option<usize>,
        found: Vec<(usize, Error)>,
        reported: &[(usize, Device)],
    ) -> Result<Self> {
        let n = grid.num_partitions();
        for (key, len) in [("partitions", data.len()), ("location", locations.len())] {
            if len != n {
                return Err(Error::protocol(
                    key,
                    None,
                    format!(
                        "{len} entries for partition_tiling {}, which has {n} positions",
                        tuple_string(&grid.tiling())
                    ),
                    Some(inv::POSITIONS),
                ));
            }
        }
        let mut v = Violations::default();
        let mut found = found.into_iter().peekable();
        let first = first
            .filter(|&f| data.get(f).is_some_and(|d| d.tensor().is_some()))
            .or_else(|| data.iter().position(|d| d.tensor().is_some()));
        let dtype = first.map(|f| (data[f].tensor().expect("holds data").dtype(), f));
        // Per partition this allocates nothing and asks for the pid once in all (glibc makes a
        // system call each time): a region, a filtered location Vec and a getpid per location
        // were a third of this check's cost on a 64x64 grid.
        let me = Some(i64::from(std::process::id()));
        let tiling = grid.tiling();
        let mut pos = vec![0usize; grid.ndim()];
        for (flat, d) in data.iter().enumerate() {
            let locs = locations.get(flat);
            if flat > 0 {
                crate::grid::next_position(&mut pos, &tiling);
            }
            while let Some((_, e)) = found.next_if(|(f, _)| *f <= flat) {
                v.push_error(e);
            }
            let Some(t) = d.tensor() else { continue };
            let position = || grid.position(flat);
            if let Some((expected, by)) = dtype.filter(|(d, _)| *d != t.dtype()) {
                v.push("partitions", Some(&position()), inv::DTYPE, || {
                    Error::DTypeMismatch {
                        found: t.dtype(),
                        expected,
                        of: format!("partition {}", tuple_string(&grid.position(by))),
                    }
                    .to_string()
                });
            }
            let splits = grid.splits();
            let fits = t.shape().len() == pos.len()
                && (0..pos.len())
                    .all(|a| t.shape()[a] == splits[a][pos[a] + 1] - splits[a][pos[a]]);
            if !fits {
                let region = grid.region_at(flat);
                v.push("partitions", Some(&position()), inv::TENSOR_SHAPE, || {
                    format!(
                        "tensor of shape {} for a partition of shape {}",
                        tuple_string(t.shape()),
                        tuple_string(&region.shape)
                    )
                });
            }
            let also = reported_for(reported, flat);
            if contradicts(locs, me, t.device(), also) {
                v.push("location", Some(&position()), inv::DEVICE, || {
                    contradiction(locs, me, t.device(), also)
                });
            }
        }
        found.for_each(|(_, e)| v.push_error(e));
        if let Some(locals) = &locals {
            check_locals(&grid, locals, &mut v);
        }
        v.finish()?;
        Ok(PartitionedArray {
            grid,
            dtype: dtype.map(|(d, _)| d),
            data,
            locations,
            locals,
        })
    }

    /// An array over `grid` whose partitions are `tensors` (C order), made by dlpart for exactly
    /// these boxes: no check beyond debug assertions, and no locations (the tensors say where
    /// they are).
    pub(crate) fn from_tensors_unchecked(grid: Grid, tensors: Vec<Tensor>, dtype: DType) -> Self {
        debug_assert_eq!(tensors.len(), grid.num_partitions());
        debug_assert!(tensors
            .iter()
            .enumerate()
            .all(|(j, t)| t.shape() == grid.region_at(j).shape.as_slice() && t.dtype() == dtype));
        let n = tensors.len();
        PartitionedArray {
            grid,
            dtype: Some(dtype),
            data: tensors.into_iter().map(Data::Tensor).collect(),
            locations: LocationTable::empty(n, 0),
            locals: None,
        }
    }

    /// The same array without axis `axis`, whose extent is 1 (a gather of one index, which
    /// drops the axis as numpy's does): the same partitions, data and locations, in the same
    /// order, each tensor without the axis.
    pub(crate) fn without_unit_axis(self, axis: usize) -> Result<Self> {
        debug_assert_eq!(self.shape()[axis], 1);
        let mut splits = self.grid.splits().to_vec();
        splits.remove(axis);
        let mut shape = self.shape().to_vec();
        shape.remove(axis);
        let data = self
            .data
            .into_iter()
            .map(|d| match d {
                Data::Tensor(t) => Data::Tensor(t.without_unit_axis(axis)),
                other => other,
            })
            .collect();
        let locals = self.locals.map(|positions| {
            positions
                .into_iter()
                .map(|mut p| {
                    p.remove(axis);
                    p
                })
                .collect()
        });
        Ok(PartitionedArray {
            grid: Grid::from_splits(&shape, splits)?,
            dtype: self.dtype,
            data,
            locations: self.locations,
            locals,
        })
    }

    /// States the dtype of an array whose data is not here yet (heat's `dtype` key); a dtype
    /// that contradicts the data held is refused (invariant 6).
    pub fn with_dtype(self, dtype: DType) -> Result<Self> {
        self.with_dtype_stated_at(dtype, None)
    }

    /// [`with_dtype`](Self::with_dtype) for a dtype the entry at `position` of a
    /// `__partitioned__` dict states, which a contradiction names.
    pub(crate) fn with_dtype_stated_at(
        mut self,
        dtype: DType,
        position: Option<&[usize]>,
    ) -> Result<Self> {
        match self.dtype {
            Some(d) if d != dtype => Err(match position {
                Some(p) => stated_dtype_conflict(dtype, d, p),
                None => Error::protocol(
                    "dtype",
                    None,
                    Error::DTypeMismatch {
                        found: dtype,
                        expected: d,
                        of: "the partitions' data".into(),
                    }
                    .to_string(),
                    Some(inv::DTYPE),
                ),
            }),
            _ => {
                self.dtype = Some(dtype);
                Ok(self)
            }
        }
    }

    /// The grid.
    pub fn grid(&self) -> &Grid {
        &self.grid
    }

    /// The global shape.
    pub fn shape(&self) -> &[usize] {
        self.grid.shape()
    }

    /// The number of axes.
    pub fn ndim(&self) -> usize {
        self.grid.ndim()
    }

    /// The element type (`None` until some data is here or stated).
    pub fn dtype(&self) -> Option<DType> {
        self.dtype
    }

    /// The number of partitions.
    pub fn len(&self) -> usize {
        self.data.len()
    }

    /// Whether the grid has no partition (never: a tiling entry is at least 1).
    pub fn is_empty(&self) -> bool {
        self.data.is_empty()
    }

    /// Every partition's data, in C order of positions.
    pub fn data(&self) -> &[Data] {
        &self.data
    }

    /// The locations of partition `flat` (C order). Empty for data dlpart holds here. Panics
    /// when `flat` is out of range.
    pub fn locations(&self, flat: usize) -> &[Location] {
        self.locations.get(flat)
    }

    /// Changes every location in place (e.g. to fill in the ranks of an SPMD producer's).
    pub(crate) fn map_locations(&mut self, f: impl FnMut(&mut Location)) {
        self.locations.for_each_mut(f);
    }

    /// The partition with flat index `flat` (C order). Panics when out of range.
    pub fn at_flat(&self, flat: usize) -> Partition<'_> {
        let region = self.grid.region_at(flat);
        Partition {
            position: self.grid.position(flat),
            start: region.start,
            shape: region.shape,
            data: &self.data[flat],
            locations: self.locations.get(flat),
        }
    }

    /// The partition at grid `position`.
    pub fn at(&self, position: &[usize]) -> Result<Partition<'_>> {
        Ok(self.at_flat(self.grid.flat_index(position)?))
    }

    /// The partitions in C order of their positions.
    pub fn partitions(&self) -> impl ExactSizeIterator<Item = Partition<'_>> + '_ {
        (0..self.len()).map(|flat| self.at_flat(flat))
    }

    /// The positions owned by this process (SPMD producers only).
    pub fn locals(&self) -> Option<&[Vec<usize>]> {
        self.locals.as_deref()
    }

    /// The device partition `flat` lives on: its tensor's, else its first location's.
    /// Panics when `flat` is out of range.
    pub fn device_of(&self, flat: usize) -> Option<Device> {
        match &self.data[flat] {
            Data::Tensor(t) => Some(t.device()),
            _ => self.locations.get(flat).first().map(|l| l.device),
        }
    }

    /// The distinct devices in use, in order of first appearance: each held tensor's device,
    /// and the first location's device of partitions that hold no data here.
    pub fn devices(&self) -> Vec<Device> {
        let mut out: Vec<Device> = Vec::new();
        let mut last = None;
        for flat in 0..self.len() {
            let Some(d) = self.device_of(flat) else {
                continue;
            };
            if last != Some(d) && !out.contains(&d) {
                out.push(d);
            }
            last = Some(d);
        }
        out
    }

    /// Every partition's tensor in C order; an error naming the first partition whose data is
    /// not here (a handle not fetched, or another rank's partition).
    pub fn tensors(&self) -> Result<Vec<&Tensor>> {
        Ok(self
            .tensors_where(|_| true)?
            .into_iter()
            .flatten()
            .collect())
    }

    /// The tensor of each partition that `wanted` (given a flat index) says an operation
    /// reads or writes, `None` for the others: an error names the first wanted partition
    /// that holds no data here, as [`tensors`](Self::tensors) does.
    pub(crate) fn tensors_where(
        &self,
        wanted: impl Fn(usize) -> bool,
    ) -> Result<Vec<Option<&Tensor>>> {
        self.data
            .iter()
            .enumerate()
            .map(|(flat, d)| match (wanted(flat), d) {
                (false, _) => Ok(None),
                (true, Data::Tensor(t)) => Ok(Some(t)),
                (true, Data::Handle(_)) => Err(self.missing(flat, "a handle not fetched yet")),
                (true, Data::Remote) => {
                    Err(self.missing(flat, "another rank's partition in SPMD mode"))
                }
            })
            .collect()
    }

    fn missing(&self, flat: usize, why: &str) -> Error {
        Error::protocol(
            "partitions",
            Some(&self.grid.position(flat)),
            format!("no data here ({why})"),
            None,
        )
    }

    /// The flat indices of the partitions at `positions` (all when `None`) that hold a handle.
    pub fn pending(&self, positions: Option<&[Vec<usize>]>) -> Result<Vec<usize>> {
        let flats: Vec<usize> = match positions {
            None => (0..self.len()).collect(),
            Some(ps) => ps
                .iter()
                .map(|p| self.grid.flat_index(p))
                .collect::<Result<_>>()?,
        };
        let mut out: Vec<usize> = flats
            .into_iter()
            .filter(|&f| matches!(self.data[f], Data::Handle(_)))
            .collect();
        out.sort_unstable();
        out.dedup();
        Ok(out)
    }

    /// Resolves the handles of `positions` (all when `None`) through `get`, which receives the
    /// pending handles in C order and returns one tensor for each. The fetched tensors are
    /// checked (invariants 6 and 7) before any is kept: on an error the array is unchanged.
    pub fn fetch(
        &mut self,
        positions: Option<&[Vec<usize>]>,
        get: impl FnOnce(&[&Handle]) -> Result<Vec<Tensor>>,
    ) -> Result<()> {
        let pending = self.pending(positions)?;
        if pending.is_empty() {
            return Ok(());
        }
        let handles: Vec<&Handle> = pending
            .iter()
            .filter_map(|&f| self.data[f].handle())
            .collect();
        let fetched = get(&handles)?;
        self.set_fetched(&pending, fetched)
    }

    /// Puts `tensors` into the partitions `flats` (which held handles, each named once), after
    /// checking their shapes and dtypes; nothing changes on an error.
    pub fn set_fetched(&mut self, flats: &[usize], tensors: Vec<Tensor>) -> Result<()> {
        self.set_fetched_where(flats, tensors, false, &[])
    }

    /// An [`Error::Shape`] naming the first partition `flats` lists twice, if any: data fetched
    /// for one partition twice, of which only one could be kept.
    pub(crate) fn fetched_once(&self, flats: &[usize]) -> Result<()> {
        let mut seen = std::collections::HashSet::with_capacity(flats.len());
        let Some(&twice) = flats.iter().find(|&&f| !seen.insert(f)) else {
            return Ok(());
        };
        let at = match twice < self.len() {
            true => format!(" at {}", tuple_string(&self.grid.position(twice))),
            false => String::new(),
        };
        Err(Error::shape(
            "fetched data for each partition once",
            format!("partition {twice}{at} is listed twice"),
        ))
    }

    /// [`PartitionedArray::set_fetched`]; `moved`: the tensors were put on a device the
    /// caller named (an import's `device=`), so their partitions are located by the tensors
    /// and lose the locations the producer gave. Otherwise fetched data must live on a device
    /// the locations in this process name (invariant 9), as data given in the dict must;
    /// `reported` as for [`PartitionedArray::new_in_order`].
    pub(crate) fn set_fetched_where(
        &mut self,
        flats: &[usize],
        tensors: Vec<Tensor>,
        moved: bool,
        reported: &[(usize, Device)],
    ) -> Result<()> {
        let me = Some(i64::from(std::process::id()));
        if tensors.len() != flats.len() {
            return Err(Error::shape(
                format!("one fetched tensor for each of {} handles", flats.len()),
                format!("{} tensors", tensors.len()),
            ));
        }
        self.fetched_once(flats)?;
        let mut dtype = self.dtype;
        for (&flat, t) in flats.iter().zip(&tensors) {
            if flat >= self.len() {
                return Err(Error::shape(
                    format!(
                        "fetched data for a partition of the {} (flat indices 0 to {})",
                        self.len(),
                        self.len() - 1
                    ),
                    format!("partition {flat}, out of range"),
                ));
            }
            if self.data[flat].handle().is_none() {
                let held = match self.data[flat] {
                    Data::Tensor(_) => "data already",
                    _ => "no handle to fetch (another rank's partition)",
                };
                return Err(Error::shape(
                    "fetched data for a partition holding a handle",
                    format!(
                        "partition {flat} at {}, which holds {held}",
                        tuple_string(&self.grid.position(flat))
                    ),
                ));
            }
            let position = self.grid.position(flat);
            let shape = self.grid.region_at(flat).shape;
            if t.shape() != shape.as_slice() {
                return Err(Error::protocol(
                    "partitions",
                    Some(&position),
                    format!(
                        "fetched data of shape {} for an entry of shape {}",
                        tuple_string(t.shape()),
                        tuple_string(&shape)
                    ),
                    Some(inv::TENSOR_SHAPE),
                ));
            }
            match dtype {
                None => dtype = Some(t.dtype()),
                Some(d) if d != t.dtype() => {
                    return Err(Error::protocol(
                        "partitions",
                        Some(&position),
                        format!(
                            "fetched {}",
                            Error::DTypeMismatch {
                                found: t.dtype(),
                                expected: d,
                                of: "the array".into(),
                            }
                        ),
                        Some(inv::DTYPE),
                    ))
                }
                Some(_) => {}
            }
            let locs = self.locations.get(flat);
            let also = reported_for(reported, flat);
            if !moved && contradicts(locs, me, t.device(), also) {
                return Err(Error::protocol(
                    "location",
                    Some(&position),
                    format!("fetched {}", contradiction(locs, me, t.device(), also)),
                    Some(inv::DEVICE),
                ));
            }
        }
        for (&flat, t) in flats.iter().zip(tensors) {
            self.data[flat] = Data::Tensor(t);
            if moved {
                self.locations.set_with(flat, |_| Ok::<(), ()>(())).ok();
            }
        }
        self.dtype = dtype;
        Ok(())
    }
}

/// Whether data on `device` contradicts `locs`: some of them are in this process (pid `me`)
/// and none of those names `device`, nor `reported`, the device the data's producer reports
/// for it (its `__dlpack_device__`) where that differs from the device the data was imported
/// on (invariant 9). A location may name either: JAX 0.10, for one, writes `kDLCPU:k` into the
/// capsules of its emulated host device `k` while its `__dlpack_device__` says `kDLCPU`.
pub(crate) fn contradicts(
    locs: &[Location],
    me: Option<i64>,
    device: Device,
    reported: Option<Device>,
) -> bool {
    let mut here = locs.iter().filter(|l| l.pid == me).peekable();
    here.peek().is_some() && here.all(|l| l.device != device && Some(l.device) != reported)
}

/// What [`contradicts`] found, in words.
fn contradiction(
    locs: &[Location],
    me: Option<i64>,
    device: Device,
    reported: Option<Device>,
) -> String {
    let named: Vec<String> = locs
        .iter()
        .filter(|l| l.pid == me)
        .map(|l| l.device.to_string())
        .collect();
    let also = match reported {
        Some(r) => format!(" (its producer's __dlpack_device__ names {r})"),
        None => String::new(),
    };
    format!(
        "data lives on {device}{also} but the locations in this process name {}",
        named.join(", ")
    )
}

/// The device `reported` (ascending by flat index) holds for partition `flat`.
fn reported_for(reported: &[(usize, Device)], flat: usize) -> Option<Device> {
    reported
        .binary_search_by_key(&flat, |&(f, _)| f)
        .ok()
        .map(|i| reported[i].1)
}

/// The `dtype` the entry at `position` of a `__partitioned__` dict states, `stated`, which
/// contradicts the dtype `data` of the partitions' data (invariant 6): named by the entry's key,
/// `__partitioned__["partitions"] at position (0, 0): "dtype": ...`, as other problems of an
/// entry's keys are.
pub(crate) fn stated_dtype_conflict(stated: DType, data: DType, position: &[usize]) -> Error {
    let mismatch = Error::DTypeMismatch {
        found: stated,
        expected: data,
        of: "the partitions' data".into(),
    };
    Error::protocol(
        "partitions",
        Some(position),
        format!("\"dtype\": {mismatch}"),
        Some(inv::DTYPE),
    )
}

/// What contradicts invariant 9 when data on `device` has the locations `locs`, in words: for
/// data `validate` could not import, whose device its producer's `__dlpack_device__` named.
#[cfg(feature = "python")]
pub(crate) fn device_contradiction(locs: &[Location], device: Device) -> Option<String> {
    let me = Some(i64::from(std::process::id()));
    contradicts(locs, me, device, None).then(|| contradiction(locs, me, device, None))
}

fn check_locals(grid: &Grid, locals: &[Vec<usize>], v: &mut Violations) {
    let mut seen = vec![false; grid.num_partitions()];
    for pos in locals {
        if pos.len() != grid.ndim() {
            v.push("locals", None, inv::NDIM, || {
                format!(
                    "position {} has {} axes, expected {}",
                    tuple_string(pos),
                    pos.len(),
                    grid.ndim()
                )
            });
            continue;
        }
        match grid.flat_index(pos) {
            Err(_) => v.push("locals", None, inv::LOCALS, || {
                format!(
                    "position {} is outside partition_tiling {}",
                    tuple_string(pos),
                    tuple_string(&grid.tiling())
                )
            }),
            Ok(flat) if seen[flat] => v.push("locals", Some(pos), inv::LOCALS, || {
                "listed twice".to_string()
            }),
            Ok(flat) => seen[flat] = true,
        }
    }
}

#[cfg(test)]
pub(crate) mod tests;
#[cfg(test)]
mod tests_host;
