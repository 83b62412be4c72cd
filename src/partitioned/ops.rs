//! The operations of [`PartitionedArray`]: partition, repartition, assemble, transfers, and
//! gather/scatter with global indices. Each validates first and writes second, on the device
//! where the data is; data crosses devices only with `transfer = true`, and moves between host
//! memory of any kinds are plain copies that need none ([`ops::one_memory`]).

use std::borrow::Borrow;

use crate::access::Role;
use crate::backend::backend_for;
use crate::device::Device;
use crate::dtype::DType;
use crate::error::{
    tuple_string, Devices, Error, Result, ALLOW_TRANSFER, ASSEMBLE_ELSEWHERE,
    REPARTITION_ELSEWHERE, TARGET_ELSEWHERE,
};
use crate::grid::Grid;
use crate::indices::AsIndices;
use crate::layout::Layout;
use crate::ops;
use crate::plan::Plan;
use crate::tensor::Tensor;

use super::PartitionedArray;

impl PartitionedArray {
    /// Cuts `t` along `layout`'s cut into zero-copy views that share its memory. The layout's
    /// placement must keep the data where it is (the default).
    ///
    /// ```
    /// use dlpart::{Layout, PartitionedArray, Tensor};
    /// let t = Tensor::from(ndarray::Array2::<f32>::zeros((6, 4)));
    /// let rows = PartitionedArray::partition(&t, &Layout::tiling(&[3, 1]))?;
    /// assert_eq!(rows.grid().splits()[0], vec![0, 2, 4, 6]);
    /// # Ok::<(), dlpart::Error>(())
    /// ```
    pub fn partition(t: &Tensor, layout: &Layout) -> Result<Self> {
        let target = layout.target(&Grid::even(t.shape(), &vec![1; t.ndim()])?, &|_| t.device())?;
        if let Some(d) = target.devices.iter().find(|&&d| d != t.device()) {
            return Err(Error::DeviceMismatch {
                op: "partition".into(),
                devices: Devices::move_(t.device(), *d),
                reason: "partition makes views of the data where it is; use repartition with \
                         transfer to move it"
                    .into(),
            });
        }
        Self::from_tensor(t, target.grid)
    }

    /// Cuts `t` along `grid` into zero-copy views that share its memory.
    pub fn from_tensor(t: &Tensor, grid: Grid) -> Result<Self> {
        if t.shape() != grid.shape() {
            return Err(Error::shape(
                format!("grid over {} for a tensor", tuple_string(grid.shape())),
                format!("shape {}", tuple_string(t.shape())),
            ));
        }
        crate::grid::check_room(grid.num_partitions())?;
        let views = grid
            .positions()
            .map(|position| {
                let r = grid.region(&position)?;
                t.view(&r.start, &r.shape)
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(Self::from_tensors_unchecked(grid, views, t.dtype()))
    }

    /// The same array over `layout`: new partitions, each element that stays in its memory
    /// copied once from its source partition straight into its target partition, on the
    /// device where the data is. A layout whose placement moves data across devices needs
    /// `transfer`; one that moves it between host memory of any kinds (`kDLCPU`, `kDLCPU:k`,
    /// pinned, managed) does not. With `transfer`, only the boxes the new layout needs cross,
    /// packed into one buffer per device pair, moved in one transfer and unpacked on the
    /// target's device ([`ops::repartition`]); every allocation and transfer is done before
    /// any target is written.
    ///
    /// ```
    /// use dlpart::{Layout, PartitionedArray, Tensor};
    /// let a = ndarray::Array::from_shape_fn((4, 6), |(i, j)| (10 * i + j) as i32);
    /// let rows = PartitionedArray::partition(&Tensor::from(a.clone()), &Layout::tiling(&[2, 1]))?;
    /// let cols = rows.repartition(&Layout::tiling(&[1, 3]), false)?;
    /// let last = cols.at(&[0, 2])?;
    /// assert_eq!(last.tensor().unwrap().as_array::<i32>()?, a.slice(ndarray::s![.., 4..]).into_dyn());
    /// # Ok::<(), dlpart::Error>(())
    /// ```
    pub fn repartition(&self, layout: &Layout, transfer: bool) -> Result<Self> {
        let src = self.tensors()?;
        let target = layout.target(&self.grid, &|i| src[i].device())?;
        let dtype = self.known_dtype("repartition")?;
        let plan = Plan::new(&self.grid, &target.grid)?;
        // Devices without dlpart kernels: said first, rather than a transfer suggested that
        // could not run.
        let mut devices = distinct_devices(&src);
        devices.extend(distinct_devices_of(target.devices.iter().copied()));
        crate::backend::check_kernels(devices)?;
        let out = ops::repartition(&plan, &src, &target.devices, transfer)
            .map_err(|e| e.advise(REPARTITION_ELSEWHERE))?;
        Ok(Self::from_tensors_unchecked(target.grid, out, dtype))
    }

    /// Refuses a `repartition_into` target whose shape differs from this array's.
    pub(crate) fn check_target_shape(&self, out: &PartitionedArray) -> Result<()> {
        if out.shape() == self.shape() {
            return Ok(());
        }
        Err(Error::shape(
            format!(
                "repartition_into needs a target of this array's shape {}",
                tuple_string(self.shape())
            ),
            format!("shape {}", tuple_string(out.shape())),
        ))
    }

    /// Copies this array into `out`'s existing partitions (its grid is the target layout),
    /// reusing the caller's buffers. `out` must have the same shape and dtype and writable
    /// partitions; nothing is written unless every check passes. Targets on another device
    /// than their sources need `transfer`, unless both are host memory (of any kinds); with
    /// it, what they receive crosses as in [`repartition`](Self::repartition), and none is
    /// written before all of it has arrived.
    ///
    /// ```
    /// use dlpart::{Layout, PartitionedArray, Tensor};
    /// use ndarray::Array2;
    ///
    /// let a = Array2::from_shape_fn((4, 6), |(i, j)| (10 * i + j) as f32);
    /// let rows = PartitionedArray::partition(&Tensor::from(a.clone()), &Layout::tiling(&[2, 1]))?;
    /// // The caller's own buffer, cut into the target layout: column blocks over its memory.
    /// let out = Tensor::from(Array2::<f32>::zeros((4, 6)));
    /// let cols = PartitionedArray::partition(&out, &Layout::tiling(&[1, 3]))?;
    /// rows.repartition_into(&cols, false)?;
    /// assert_eq!(out.as_array::<f32>()?, a.view().into_dyn());
    /// // A target of another shape is refused before anything is written.
    /// let small = Tensor::from(Array2::<f32>::zeros((4, 5)));
    /// let one = PartitionedArray::partition(&small, &Layout::tiling(&[1, 1]))?;
    /// let e = rows.repartition_into(&one, false).unwrap_err();
    /// assert!(e.to_string().contains("shape (4, 6)"), "{e}");
    /// assert!(small.as_array::<f32>()?.iter().all(|&v| v == 0.0));
    /// # Ok::<(), dlpart::Error>(())
    /// ```
    pub fn repartition_into(&self, out: &PartitionedArray, transfer: bool) -> Result<()> {
        self.check_target_shape(out)?;
        let plan = Plan::new(&self.grid, &out.grid)?;
        ops::repartition_into(&plan, &self.tensors()?, &out.tensors()?, transfer)
    }

    /// The whole array as one new tensor, on `device` or else on the partitions' common device.
    /// Partitions on other devices than the target need `transfer`, unless both are host
    /// memory (of any kinds): those are read in place. With `transfer`, the partitions that
    /// cross do so as in [`repartition`](Self::repartition) ([`ops::repartition`] into one
    /// target): packed into one buffer per device by that device's kernels, moved in one
    /// transfer per device and unpacked into the result on its device. Every allocation and
    /// transfer is done before the result is written; an error returns no tensor and leaves
    /// the partitions as they were.
    pub fn assemble(&self, device: Option<Device>, transfer: bool) -> Result<Tensor> {
        self.assemble_on(device, transfer)
            .map_err(|e| e.advise(ASSEMBLE_ELSEWHERE))
    }

    fn assemble_on(&self, device: Option<Device>, transfer: bool) -> Result<Tensor> {
        let tensors = self.tensors()?;
        let devices = distinct_devices(&tensors);
        let target = match device {
            Some(d) => d,
            None if devices.len() > 1 => {
                // Host memory of several kinds needs a device named, but no transfer.
                let mut reason = "partitions live on several devices; pass a device".to_string();
                if !devices.iter().all(|d| d.is_host_accessible()) {
                    reason += &format!(" and {ALLOW_TRANSFER}");
                }
                return Err(Error::DeviceMismatch {
                    op: "assemble".into(),
                    devices: Devices::Several(devices),
                    reason,
                });
            }
            None => devices.first().copied().unwrap_or(Device::CPU),
        };
        let whole = Grid::even(self.shape(), &vec![1; self.ndim()])?;
        let plan = Plan::new(&self.grid, &whole)?;
        check_moves(&tensors, target, transfer, "assemble")?;
        let mut out = ops::repartition(&plan, &tensors, &[target], transfer)?;
        Ok(out.pop().expect("one target partition"))
    }

    /// Every partition copied onto `device` (an explicit transfer), over the same grid.
    /// Partitions already there are shared, not copied.
    /// Data on a device without dlpart kernels (kDLOneAPI) is refused with
    /// [`Error::BackendUnavailable`]: only its own library can copy it.
    ///
    /// ```
    /// use dlpart::{Device, Error, Layout, PartitionedArray, Tensor};
    /// use ndarray::Array2;
    ///
    /// let a = Array2::from_shape_fn((4, 6), |(i, j)| (10 * i + j) as f32);
    /// let rows = PartitionedArray::partition(&Tensor::from(a.clone()), &Layout::tiling(&[2, 1]))?;
    /// let here = rows.to(Device::CPU)?; // already there: the same memory
    /// let first = |pa: &PartitionedArray| pa.at(&[0, 0]).map(|p| p.tensor().unwrap().data_ptr());
    /// assert_eq!(first(&here)?, first(&rows)?);
    /// // Onto a GPU and back (feature `cuda` and a GPU; elsewhere an error says what is missing).
    /// match rows.to(Device::cuda(0)) {
    ///     Ok(on_gpu) => {
    ///         assert!(on_gpu.assemble(Some(Device::CPU), false).is_err()); // needs `transfer`
    ///         let back = on_gpu.assemble(Some(Device::CPU), true)?;
    ///         assert_eq!(back.as_array::<f32>()?, a.view().into_dyn());
    ///     }
    ///     Err(e) => assert!(matches!(e, Error::BackendUnavailable { .. }), "{e}"),
    /// }
    /// # Ok::<(), dlpart::Error>(())
    /// ```
    pub fn to(&self, device: Device) -> Result<Self> {
        let tensors = self.tensors()?;
        let moved = moved_to_device(&tensors, device)?;
        let dtype = self.known_dtype("to")?;
        Ok(Self::from_tensors_unchecked(
            self.grid.clone(),
            moved,
            dtype,
        ))
    }

    /// The dtype, which `op` gives its result: an error while it is unknown (no partition
    /// holds data here and none was stated), never a guess.
    fn known_dtype(&self, op: &str) -> Result<DType> {
        self.dtype.ok_or_else(|| {
            Error::shape(
                format!(
                    "{op} needs the array's dtype, which is unknown until a partition is \
                     fetched: state it with with_dtype, or fetch the partitions first \
                     (fetch, set_fetched)"
                ),
                format!("none of the {} partitions holds data here", self.len()),
            )
        })
    }

    /// `out[.., k, ..] = self[.., indices[k], ..]` along `axis`, like `numpy.take`, with global
    /// indices (negative ones count from the end). Each index is served by the partition that
    /// holds it, on its device. The result keeps this array's split points on the other axes
    /// and has one slab of `indices.len()` along `axis`; each of its partitions lives on the
    /// device of the source partition holding its first element. Serving partitions on other
    /// devices need `transfer`, except host memory of another kind (`kDLCPU:k`, pinned,
    /// managed) filling a host partition, which is read in place, through plain `kDLCPU`
    /// scratch memory (never new pinned memory, which needs CUDA). An out-of-range index is
    /// an error before anything is written.
    ///
    /// Only the partitions holding an index need data here ([`serving`](Self::serving)):
    /// the others may hold handles not fetched yet. One index (a 0-d `indices`) drops the
    /// axis, as in numpy. The result takes the array's dtype, which must be known even when no
    /// partition is read (no indices): an array of unfetched handles needs it stated
    /// ([`with_dtype`](Self::with_dtype)) or a partition fetched.
    ///
    /// `indices` takes any of the forms of [`AsIndices`]: a [`Tensor`] (host memory), a slice,
    /// `Vec` or array of integers, an ndarray array or view, one integer.
    ///
    /// ```
    /// use dlpart::{Layout, PartitionedArray, Tensor};
    /// use ndarray::{Array2, Axis};
    ///
    /// let a = Array2::from_shape_fn((6, 4), |(i, j)| (10 * i + j) as i64);
    /// let pa = PartitionedArray::partition(&Tensor::from(a.clone()), &Layout::tiling(&[3, 2]))?;
    /// let rows: Vec<usize> = vec![5, 0, 3];
    /// let picked = pa.gather(&rows, 0, false)?.assemble(None, false)?;
    /// assert_eq!(picked.to_array::<i64>()?, a.select(Axis(0), &rows).into_dyn());
    /// let last = pa.gather(-1, 1, false)?.assemble(None, false)?; // one index drops the axis
    /// assert_eq!(last.to_array::<i64>()?, a.column(3).into_dyn());
    /// # Ok::<(), dlpart::Error>(())
    /// ```
    pub fn gather(&self, indices: impl AsIndices, axis: usize, transfer: bool) -> Result<Self> {
        self.check_axis(axis)?;
        let indices = indices.index_tensor()?;
        let (list, one) = ops::index_list(&indices)?;
        let taken = self.gather_list(&list, axis, transfer)?;
        match one {
            true => taken.without_unit_axis(axis),
            false => Ok(taken),
        }
    }

    /// [`gather`](Self::gather) of a 1-d list of indices.
    fn gather_list(&self, indices: &Tensor, axis: usize, transfer: bool) -> Result<Self> {
        let idx = host_indices(indices, axis, self.shape()[axis])?;
        let groups = Groups::new(&self.grid, axis, &idx);
        let src = self.tensors_where(|f| groups.serves_partition(&self.grid, f))?;
        let src = |f: usize| src[f].expect("a serving partition");
        let mut splits = self.grid.splits().to_vec();
        splits[axis] = vec![0, idx.len()];
        let out_grid = Grid::from_splits(self.shape_with(axis, idx.len()).as_slice(), splits)?;
        let first_slab = groups.slab_of.first().copied().unwrap_or(0);
        // Source partition serving slab `s` for output partition `j` (whose axis index is 0).
        let source = |j: usize, s: usize| {
            let mut pos = out_grid.position(j);
            pos[axis] = s;
            self.grid
                .flat_index(&pos)
                .expect("a position of the source grid")
        };
        // Without indices no partition serves: the devices come from the metadata.
        let devices: Vec<Device> = (0..out_grid.num_partitions())
            .map(|j| self.device_of(source(j, first_slab)).unwrap_or(Device::CPU))
            .collect();
        // Devices without dlpart kernels: said first, rather than a transfer suggested that
        // could not run (each output partition lives on the device of a serving partition).
        let serving: Vec<usize> = groups.serving().collect();
        crate::backend::check_kernels(
            (0..devices.len())
                .flat_map(|j| serving.iter().map(move |&s| (j, s)))
                .map(|(j, s)| src(source(j, s)).device()),
        )?;
        for (j, &dev) in devices.iter().enumerate() {
            for &s in &serving {
                check_crossing("gather", src(source(j, s)).device(), dev, transfer)?;
            }
        }
        // Without indices no partition is read: the dtype must be known all the same.
        let dtype = self.known_dtype("gather")?;
        let mut out = Vec::with_capacity(devices.len());
        for (j, &dev) in devices.iter().enumerate() {
            let shape = out_grid.region_at(j).shape;
            let o = backend_for(dev)?.empty(&shape, dtype)?;
            for s in groups.serving() {
                let part = src(source(j, s));
                if groups.is_all(s) && ops::one_memory(part.device(), dev) {
                    ops::gather(part, &groups.local[s], axis, Some(&o))?;
                    continue;
                }
                let mut picked = ops::gather_scratch(part, &groups.local[s], axis)?;
                if !ops::one_memory(picked.device(), dev) {
                    picked = ops::to_device(&picked, dev)?;
                }
                ops::scatter(&picked, &groups.at[s], &o, axis)?;
            }
            out.push(o);
        }
        Ok(Self::from_tensors_unchecked(out_grid, out, dtype))
    }

    /// `self[.., indices[k], ..] = values[.., k, ..]` along `axis`, like numpy's fancy
    /// assignment, with global indices (the last of duplicate indices wins). Each index is
    /// written by the partition that holds it, on its device; `values` on another device needs
    /// `transfer`, except that host values write partitions in host memory of any kind
    /// (`kDLCPU:k`, pinned, managed, ROCm host memory) in place without it, as
    /// [`ops::scatter`] writes such memory, and a scalar (0-d values in host memory) writes
    /// partitions on any device without it, its one element copied to each such device once
    /// and broadcast there. Nothing is written unless every check passes: a
    /// partition to write that another thread reads or writes (a live view of it) is refused
    /// before any partition is written, and so are partitions to write that share memory
    /// ([`Error::Buffer`] both), as
    /// [`repartition_into`](Self::repartition_into) refuses such targets. `values` may view
    /// this array's own memory: they are read as they were before the call (copied aside
    /// first). Only the partitions holding an index need data here
    /// ([`serving`](Self::serving)).
    /// For one index (a 0-d `indices`) `values` has this array's shape without `axis`, as
    /// numpy's `a[.., i, ..] = values` takes it. `values` of another shape that broadcasts to
    /// the one written are broadcast, as numpy's fancy assignment broadcasts them (a 0-d
    /// value is written at every element). `indices` takes any of the forms of
    /// [`AsIndices`], as for [`gather`](Self::gather).
    ///
    /// ```
    /// use dlpart::{DType, Layout, PartitionedArray, Tensor};
    /// use ndarray::{array, Array2};
    ///
    /// let zeros = Tensor::zeros(&[4, 3], DType::Int32)?;
    /// let pa = PartitionedArray::partition(&zeros, &Layout::tiling(&[2, 1]))?;
    /// pa.scatter(&Tensor::from(array![[1, 2, 3], [4, 5, 6]]), [3, 0], 0, false)?;
    /// let mut want = Array2::<i32>::zeros((4, 3));
    /// want.row_mut(3).assign(&array![1, 2, 3]);
    /// want.row_mut(0).assign(&array![4, 5, 6]);
    /// assert_eq!(pa.assemble(None, false)?.to_array::<i32>()?, want.into_dyn());
    /// # Ok::<(), dlpart::Error>(())
    /// ```
    pub fn scatter(
        &self,
        values: &Tensor,
        indices: impl AsIndices,
        axis: usize,
        transfer: bool,
    ) -> Result<()> {
        self.check_axis(axis)?;
        let indices = indices.index_tensor()?;
        let (list, one) = ops::index_list(&indices)?;
        let idx = host_indices(&list, axis, self.shape()[axis])?;
        let want = match one {
            true => ops::without_axis(self.shape(), axis),
            false => self.shape_with(axis, idx.len()),
        };
        // A scalar (0-d values in host memory) writes partitions on any device: its one
        // element is copied to each such device once, below, and broadcast there.
        let scalar = ops::is_host_scalar(values);
        let value = values;
        let values = values.broadcast_to(&want).ok_or_else(|| {
            Error::shape(
                format!(
                    "scatter values must have shape {} (or values that broadcast to it, as \
                     in numpy)",
                    tuple_string(&want)
                ),
                format!("values of shape {}", tuple_string(values.shape())),
            )
        })?;
        // The slab of one that one index writes.
        let values = &match one {
            true => values.with_unit_axis(axis),
            false => values,
        };
        let dtype = self.dtype.unwrap_or(values.dtype());
        if values.dtype() != dtype {
            return Err(Error::DTypeMismatch {
                found: values.dtype(),
                expected: dtype,
                of: "the partitioned array".into(),
            });
        }
        let groups = Groups::new(&self.grid, axis, &idx);
        let serves = |f: usize| groups.serves_partition(&self.grid, f);
        let targets = self.tensors_where(serves)?;
        let targets = |f: usize| targets[f].expect("a written partition");
        let written: Vec<usize> = (0..self.len()).filter(|&f| serves(f)).collect();
        // Devices without dlpart kernels: said first, rather than a transfer suggested that
        // could not run.
        if !written.is_empty() {
            crate::backend::check_kernels(
                std::iter::once(values.device())
                    .chain(written.iter().map(|&f| targets(f).device())),
            )?;
        }
        for &f in &written {
            let t = targets(f);
            let what = format!("partition {}", tuple_string(&self.grid.position(f)));
            if t.readonly() {
                return Err(Error::ReadOnly { what });
            }
            ops::check_distinct(t, &what)?;
            // Host memory of any kind is written from host values in place (below), as
            // `ops::scatter` writes it: no move, so no transfer to ask for; nor for a scalar's
            // one element.
            check_crossing("scatter", values.device(), t.device(), transfer || scalar)?;
            let crossing = !ops::one_memory(values.device(), t.device());
            // A device with no backend, or a move between devices dlpart cannot make, said
            // here, before the checks of all the partitions below and any copy of values.
            backend_for(t.device())?;
            if crossing {
                ops::transfer_runner(values.device(), t.device())?;
            }
        }
        // Partitions sharing memory would be written one after the other, each from its own
        // values: what they hold would follow the order of the partitions, not numpy's (the
        // last of duplicate indices wins). Refused, as repartition_into refuses such targets.
        let written_tensors: Vec<&Tensor> = written.iter().map(|&f| targets(f)).collect();
        if let Some(s) = crate::overlap::shared_targets(&written_tensors) {
            return Err(s.targets_error(|j| tuple_string(&self.grid.position(written[j])), ""));
        }
        if !written.is_empty() {
            backend_for(values.device())?;
        }
        // Values that view this array's own memory are read before any partition is written.
        let values = &ops::apart_from(values, written.iter().map(|&f| targets(f)))?;
        // Everything that can fail before a kernel runs (each partition's rows of `values`
        // picked and moved to its device, its indices normalised there) is done for every
        // partition before the first is written: an error leaves the array as it was. The
        // picked rows together are at most the size of `values`.
        let mut writes = Vec::with_capacity(written.len());
        let mut scalars: Vec<Tensor> = Vec::new();
        for f in written {
            let t = targets(f);
            let backend = backend_for(t.device())?;
            if let Some(on) = ops::scalar_on_once(&mut scalars, value, t.device())? {
                let s = self.grid.position(f)[axis];
                let (local, picked) =
                    ops::scatter_operands(backend.as_ref(), &on, &groups.local[s], t, axis)?;
                writes.push((f, backend, picked, local, t));
                continue;
            }
            let r = self.grid.region_at(f);
            let s = self.grid.position(f)[axis];
            let mut start = r.start.clone();
            let mut shape = r.shape.clone();
            start[axis] = 0;
            shape[axis] = idx.len();
            let rows = values.view(&start, &shape)?;
            let mut picked = if groups.is_all(s) {
                rows
            } else {
                ops::gather_scratch(&rows, &groups.at[s], axis)?
            };
            // Host values write host memory of any kind in place.
            if !ops::one_memory(picked.device(), t.device()) {
                picked = ops::to_device(&picked, t.device())?;
            }
            let (local, picked) =
                ops::scatter_operands(backend.as_ref(), &picked, &groups.local[s], t, axis)?;
            writes.push((f, backend, picked, local, t));
        }
        // Every partition written (and the values and indices read) claimed at once, for the
        // whole write: a partition another thread reads or writes is refused before any is
        // written, and none can be claimed by another thread between two writes. The writes'
        // own claims on this thread go on within it.
        let _scope = crate::access::scope(
            "scatter",
            writes.iter().flat_map(|(f, _, v, i, _)| {
                let f = *f;
                [
                    (Role::nth("values for partition", f), v),
                    (Role::nth("indices for partition", f), i),
                ]
            }),
            writes
                .iter()
                .map(|&(f, _, _, _, t)| (Role::nth("partition", f), t)),
        )?;
        for (_, backend, picked, local, t) in &writes {
            backend.scatter(picked, local, axis, t)?;
            backend.synchronize()?;
        }
        Ok(())
    }

    /// The positions of the partitions a [`gather`](Self::gather) or
    /// [`scatter`](Self::scatter) of `indices` along `axis` reads or writes (C order): those
    /// holding at least one index. An array of handles needs only these fetched. `indices`
    /// takes any of the forms of [`AsIndices`].
    pub fn serving(&self, indices: impl AsIndices, axis: usize) -> Result<Vec<Vec<usize>>> {
        self.check_axis(axis)?;
        let indices = indices.index_tensor()?;
        let (list, _) = ops::index_list(&indices)?;
        let idx = host_indices(&list, axis, self.shape()[axis])?;
        let groups = Groups::new(&self.grid, axis, &idx);
        Ok((0..self.len())
            .filter(|&f| groups.serves_partition(&self.grid, f))
            .map(|f| self.grid.position(f))
            .collect())
    }

    fn check_axis(&self, axis: usize) -> Result<()> {
        if axis >= self.ndim() {
            return Err(Error::shape(
                format!("axis {axis} is out of range for a {}-d array", self.ndim()),
                format!("shape {}", tuple_string(self.shape())),
            ));
        }
        Ok(())
    }

    fn shape_with(&self, axis: usize, len: usize) -> Vec<usize> {
        let mut s = self.shape().to_vec();
        s[axis] = len;
        s
    }
}

/// The indices of an axis grouped by the slab that holds them.
struct Groups {
    /// Per slab: the positions `k` in the index list whose index falls in the slab.
    at: Vec<Tensor>,
    /// Per slab: those indices relative to the slab's start.
    local: Vec<Tensor>,
    /// Per index: its slab.
    slab_of: Vec<usize>,
    /// The number of indices.
    n: usize,
    /// The axis the indices run along.
    axis: usize,
}

impl Groups {
    /// `idx` holds indices in `[0, len)` of the axis. Slabs are found by binary search over
    /// the split points: memory grows with the indices, never with the axis (which may be
    /// longer than memory holds, for a broadcast source).
    fn new(grid: &Grid, axis: usize, idx: &[i64]) -> Self {
        let splits = &grid.splits()[axis];
        let slabs = splits.len() - 1;
        let slab_of: Vec<usize> = idx
            .iter()
            .map(|&i| {
                grid.locate_axis(axis, i as usize)
                    .expect("indices are in range")
            })
            .collect();
        let mut at: Vec<Vec<i64>> = vec![Vec::new(); slabs];
        let mut local: Vec<Vec<i64>> = vec![Vec::new(); slabs];
        for (k, &i) in idx.iter().enumerate() {
            let s = slab_of[k];
            at[s].push(k as i64);
            local[s].push(i - splits[s] as i64);
        }
        let tensor = |v: Vec<i64>| {
            let n = v.len();
            Tensor::from_slice(&v, &[n]).expect("a 1-d index list")
        };
        Groups {
            at: at.into_iter().map(tensor).collect(),
            local: local.into_iter().map(tensor).collect(),
            slab_of,
            n: idx.len(),
            axis,
        }
    }

    /// The slabs that serve at least one index.
    fn serving(&self) -> impl Iterator<Item = usize> + '_ {
        (0..self.at.len()).filter(|&s| self.serves(s))
    }

    /// Whether slab `s` serves at least one index.
    fn serves(&self, s: usize) -> bool {
        self.at[s].numel() > 0
    }

    /// Whether partition `flat` of `grid` (the grid the groups were made over) lies in a slab
    /// that serves an index.
    fn serves_partition(&self, grid: &Grid, flat: usize) -> bool {
        self.serves(grid.position(flat)[self.axis])
    }

    /// Whether slab `s` serves every index, in order.
    fn is_all(&self, s: usize) -> bool {
        self.at[s].numel() == self.n
    }
}

/// The indices of `indices` (any integer dtype, host memory), each read once into memory of
/// our own, normalised to `[0, len)`; an index outside `[-len, len)` is an error.
pub(crate) fn host_indices(indices: &Tensor, axis: usize, len: usize) -> Result<Vec<i64>> {
    // Normalising reads each index once, into a tensor of our own; indices in other host
    // memory (pinned, managed) are copied to kDLCPU for the CPU backend first.
    let normalised = match indices.device() {
        Device::CPU => ops::normalise_indices(indices, axis, len)?,
        _ => ops::normalise_indices(ops::to_device(indices, Device::CPU)?, axis, len)?,
    };
    Ok(normalised.as_array::<i64>()?.iter().copied().collect())
}

/// Refuses a move of data from `from` to `to` without `transfer`, unless both are one memory
/// (the same device, or host memory of any kinds: [`ops::one_memory`]).
fn check_crossing(op: &str, from: Device, to: Device, transfer: bool) -> Result<()> {
    if !ops::one_memory(from, to) && !transfer {
        return Err(Error::DeviceMismatch {
            op: op.into(),
            devices: Devices::move_(from, to),
            reason: format!("the data would move to another device; {ALLOW_TRANSFER}"),
        });
    }
    Ok(())
}

/// Each of `tensors` on `device` (an explicit transfer): those already there shared, the
/// others copied. Every move is checked for kernels on both sides before anything is copied.
pub(crate) fn moved_to_device<T: Borrow<Tensor>>(
    tensors: &[T],
    device: Device,
) -> Result<Vec<Tensor>> {
    let away: Vec<Device> = distinct_devices(tensors)
        .into_iter()
        .filter(|&d| d != device)
        .collect();
    if !away.is_empty() {
        crate::backend::check_kernels(away.into_iter().chain([device]))?;
    }
    tensors
        .iter()
        .map(|t| {
            let t = t.borrow();
            if t.device() == device {
                Ok(t.clone())
            } else {
                ops::to_device(t, device).map_err(|e| e.advise(TARGET_ELSEWHERE))
            }
        })
        .collect()
}

/// Refuses moving `tensors` onto `target` for `op` without `transfer` where some live on
/// another device ([`Error::DeviceMismatch`] naming the moves; host memory of any kind is one
/// memory with a host `target`), and a move a transfer could not make (a device without
/// dlpart kernels on either side, [`Error::BackendUnavailable`]), with `transfer` or without,
/// before anything is allocated.
fn check_moves(tensors: &[&Tensor], target: Device, transfer: bool, op: &str) -> Result<()> {
    let away: Vec<Device> = distinct_devices(tensors)
        .into_iter()
        .filter(|&d| !ops::one_memory(d, target))
        .collect();
    if away.is_empty() {
        return Ok(());
    }
    crate::backend::check_kernels(away.iter().copied().chain([target]))?;
    if transfer {
        return Ok(());
    }
    Err(Error::DeviceMismatch {
        op: op.into(),
        devices: Devices::Moves(away.iter().map(|&d| (d, target)).collect()),
        reason: format!("partitions would be moved to another device; {ALLOW_TRANSFER}"),
    })
}

fn distinct_devices<T: Borrow<Tensor>>(tensors: &[T]) -> Vec<Device> {
    distinct_devices_of(tensors.iter().map(|t| t.borrow().device()))
}

/// The distinct devices of `devices`, in order of first appearance.
fn distinct_devices_of(devices: impl IntoIterator<Item = Device>) -> Vec<Device> {
    let mut out: Vec<Device> = Vec::new();
    let mut last = None;
    for d in devices {
        if last != Some(d) && !out.contains(&d) {
            out.push(d);
        }
        last = Some(d);
    }
    out
}
