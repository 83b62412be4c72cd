//! Gather and scatter with global indices across ranks: each index is served by the rank that
//! owns it. Every rank passes the same indices (and, for scatter, the same values); the ranks
//! agree on them before anything is written.

use crate::access::Role;
use crate::backend::backend_for;
use crate::device::Device;
use crate::error::{tuple_string, Devices, Error, Result};
use crate::grid::Grid;
use crate::indices::AsIndices;
use crate::ops;
use crate::partitioned::PartitionedArray;
use crate::tensor::Tensor;

use super::exchange::{
    agreed, check_own_data, confirmed, dtype_of, own_data, owners, prefix, rank_device, spmd_array,
    Buffers,
};
use super::wire::{fingerprint, Writer};
use super::{Communicator, Segments, Traffic};

/// The indices along an axis grouped by the source slab holding them.
struct Slabs {
    /// Per slab: the positions `k` in the index list whose index falls in the slab.
    at: Vec<Vec<i64>>,
    /// Per slab: those indices relative to the slab's start.
    local: Vec<Vec<i64>>,
}

impl Slabs {
    fn new(grid: &Grid, axis: usize, idx: &[i64]) -> Self {
        let splits = &grid.splits()[axis];
        let n = splits.len() - 1;
        let (mut at, mut local) = (vec![Vec::new(); n], vec![Vec::new(); n]);
        for (k, &i) in idx.iter().enumerate() {
            let s = splits.partition_point(|&b| b <= i as usize) - 1;
            at[s].push(k as i64);
            local[s].push(i - splits[s] as i64);
        }
        Slabs { at, local }
    }

    fn serving(&self) -> impl Iterator<Item = usize> + '_ {
        (0..self.at.len()).filter(|&s| !self.at[s].is_empty())
    }
}

fn index_tensor(v: &[i64]) -> Result<Tensor> {
    Tensor::from_slice(v, &[v.len()])
}

/// The indices (any integer dtype, host memory) read once, normalised to `[0, len)`, and
/// whether they are one index (a 0-d tensor: the axis is dropped, as in numpy).
fn read_indices(indices: &Tensor, axis: usize, pa: &PartitionedArray) -> Result<Index> {
    if axis >= pa.ndim() {
        return Err(Error::shape(
            format!("axis {axis} is out of range for a {}-d array", pa.ndim()),
            format!("shape {}", tuple_string(pa.shape())),
        ));
    }
    let (list, one) = ops::index_list(indices)?;
    Ok(Index {
        list: crate::partitioned::host_indices(&list, axis, pa.shape()[axis])?,
        one,
    })
}

/// Indices read by [`read_indices`].
struct Index {
    /// The indices, normalised.
    list: Vec<i64>,
    /// Whether they are one index, given as a 0-d tensor (`list` then holds it).
    one: bool,
}

fn print(pa: &PartitionedArray, src_owners: &[usize], axis: usize, idx: &Index) -> Writer {
    let mut w = Writer::default();
    w.usize(axis).usizes(src_owners);
    for s in pa.grid().splits() {
        w.usizes(s);
    }
    w.usize(usize::from(idx.one)).usize(idx.list.len());
    for &i in &idx.list {
        w.u64(i as u64);
    }
    w
}

/// `numpy.take(pa, indices, axis)` across the ranks (a collective call; every rank passes the
/// same indices): each index is served by the rank holding it, and the picked slabs travel in
/// one all-to-all-v. The result keeps `pa`'s split points on the other axes and has one slab
/// along `axis`; each of its partitions goes to the rank (and device) of the source partition
/// holding its first element, in memory of the kind that device names, as
/// [`crate::spmd::repartition`] allocates it. An index out of range, a partition of a rank's
/// own that holds no data there, or memory dlpart cannot make there, is an error on every
/// rank before anything moves. `indices` takes any of the forms of [`AsIndices`]: a
/// [`Tensor`] (host memory), a slice, `Vec` or array of integers, an ndarray array or view,
/// one integer (which drops the axis).
///
/// ```
/// use dlpart::spmd::{self, Communicator, ThreadComm};
/// use dlpart::Tensor;
/// use ndarray::{s, Array2, Axis};
///
/// let a = Array2::from_shape_fn((8, 3), |(i, j)| (10 * i + j) as f32);
/// ThreadComm::run(4, |comm| {
///     let mine = a.slice(s![2 * comm.rank()..2 * comm.rank() + 2, ..]).to_owned();
///     let rows = spmd::from_stacked(comm, vec![Tensor::from(mine)], 0)?;
///     let (picked, _) = spmd::gather(comm, &rows, [7, 0, 5], 0)?;
///     if let Some(t) = spmd::assemble(comm, &picked, Some(0), None, false)? {
///         assert_eq!(t.to_array::<f32>()?, a.select(Axis(0), &[7, 0, 5]).into_dyn());
///     }
///     Ok::<(), dlpart::Error>(())
/// })
/// .into_iter()
/// .collect::<Result<(), _>>()?;
/// # Ok::<(), dlpart::Error>(())
/// ```
pub fn gather(
    comm: &dyn Communicator,
    pa: &PartitionedArray,
    indices: impl AsIndices,
    axis: usize,
) -> Result<(PartitionedArray, Traffic)> {
    let (me, size) = (comm.rank(), comm.size());
    let stage = (|| {
        let index = read_indices(&*indices.index_tensor()?, axis, pa)?;
        let idx = &index.list;
        let src_owners = owners(pa)?;
        // Every partition of this rank's must be here, as for the other collectives: the
        // picks below read those that hold an index, after the ranks have agreed.
        check_own_data(pa, &src_owners, me)?;
        let dtype = dtype_of(pa)?;
        let item = dtype.itemsize();
        let slabs = Slabs::new(pa.grid(), axis, idx);
        let mut splits = pa.grid().splits().to_vec();
        splits[axis] = vec![0, idx.len()];
        let mut shape = pa.shape().to_vec();
        shape[axis] = idx.len();
        let grid = Grid::from_splits(&shape, splits)?;
        let first = idx.first().map_or(0, |&i| {
            pa.grid().splits()[axis].partition_point(|&b| b <= i as usize) - 1
        });
        let source = |j: usize, s: usize| {
            let mut pos = grid.position(j);
            pos[axis] = s;
            pa.grid().flat_index(&pos).expect("a source position")
        };
        let n = grid.num_partitions();
        let out_owner: Vec<usize> = (0..n).map(|j| src_owners[source(j, first)]).collect();
        let out_dev: Vec<Device> = (0..n)
            .map(|j| pa.device_of(source(j, first)).unwrap_or(Device::CPU))
            .collect();
        let mine: Vec<usize> = (0..n).filter(|&j| out_owner[j] == me).collect();
        let src_mine = (0..pa.len()).filter(|&i| src_owners[i] == me);
        let dev = rank_device(
            src_mine
                .map(|i| pa.device_of(i).unwrap_or(Device::CPU))
                .chain(mine.iter().map(|&j| out_dev[j])),
            "partitions",
        )?
        .unwrap_or(Device::CPU);
        let mut outs: Vec<Option<Tensor>> = vec![None; n];
        // Each in the memory its device names, as a single-process gather allocates it
        // (pinned kDLCUDAHost memory from CUDA; no new managed memory), though the picks
        // work on every host kind alike.
        for &j in &mine {
            outs[j] = Some(backend_for(out_dev[j])?.empty(&grid.region_at(j).shape, dtype)?);
        }
        // Contributions (output partition, slab) in (j, s) order, by sender and receiver.
        let piece = |j: usize, s: usize| {
            let mut shp = grid.region_at(j).shape;
            shp[axis] = slabs.at[s].len();
            shp
        };
        let (mut sends, mut recvs, mut local) =
            (vec![Vec::new(); size], vec![Vec::new(); size], Vec::new());
        for j in 0..n {
            for s in slabs.serving() {
                let (r, d) = (src_owners[source(j, s)], out_owner[j]);
                match (r == me, d == me) {
                    (true, true) => local.push((j, s)),
                    (true, false) => sends[d].push((j, s)),
                    (false, true) => recvs[r].push((j, s)),
                    (false, false) => {}
                }
            }
        }
        let bytes = |list: &[(usize, usize)]| -> usize {
            list.iter()
                .map(|&(j, s)| piece(j, s).iter().product::<usize>() * item)
                .sum()
        };
        let send_counts: Vec<usize> = sends.iter().map(|l| bytes(l)).collect();
        let recv_counts: Vec<usize> = recvs.iter().map(|l| bytes(l)).collect();
        let total: usize = send_counts.iter().sum();
        let send = match total {
            0 => None,
            _ => {
                let buf = crate::backend::scratch_backend(dev)?.empty(&[total / item], dtype)?;
                let views = buf.box_views(0, sends.iter().flatten().map(|&(j, s)| piece(j, s)));
                for (&(j, s), view) in sends.iter().flatten().zip(views) {
                    let part = on_device(own_data(pa, source(j, s), me)?, dev)?;
                    ops::gather(&part, &index_tensor(&slabs.local[s])?, axis, Some(&view))?;
                }
                Some(buf)
            }
        };
        let (sends_displs, recv_displs) = (prefix(&send_counts), prefix(&recv_counts));
        let segments = Segments {
            send_counts: &send_counts,
            send_displs: &sends_displs,
            recv_counts: &recv_counts,
            recv_displs: &recv_displs,
        };
        let buffers = segments.prepare(comm, send.as_ref(), dev, dtype, item, None)?;
        let fp = fingerprint(&print(pa, &src_owners, axis, &index).0);
        Ok(Prepared {
            one: index.one,
            grid,
            out_owner,
            out_dev,
            outs,
            slabs,
            sends_displs,
            send_counts,
            recv_displs,
            recv_counts,
            buffers,
            recvs,
            local,
            dev,
            fp,
        })
    })();
    let (p, peers) = agreed(
        comm,
        "gather",
        stage,
        |p| p.fp,
        |_| String::new(),
        "gathers (indices, axes or grids)",
    )?;
    let source = |j: usize, s: usize| {
        let mut pos = p.grid.position(j);
        pos[axis] = s;
        pa.grid().flat_index(&pos).expect("a source position")
    };
    let dtype = dtype_of(pa)?;
    let item = dtype.itemsize();
    let segments = Segments {
        send_counts: &p.send_counts,
        send_displs: &p.sends_displs,
        recv_counts: &p.recv_counts,
        recv_displs: &p.recv_displs,
    };
    // Picking the local slabs allocates, on the host too, and device work can fail on one
    // rank: the ranks always confirm a gather's outcome, one small all-gather against the
    // per-index work of the picks.
    let moved = (|| {
        let recv = segments.exchange(comm, p.buffers)?;
        let out_of = |j: usize| p.outs[j].as_ref().expect("an output of this rank");
        for &(j, s) in &p.local {
            let part = on_device(own_data(pa, source(j, s), me)?, p.dev)?;
            let picked = ops::gather_scratch(&part, &index_tensor(&p.slabs.local[s])?, axis)?;
            ops::scatter(&picked, &index_tensor(&p.slabs.at[s])?, out_of(j), axis)?;
        }
        if let Some(recv) = &recv {
            let piece = |&(j, s): &(usize, usize)| {
                let mut shp = p.grid.region_at(j).shape;
                shp[axis] = p.slabs.at[s].len();
                shp
            };
            for (peer, list) in p.recvs.iter().enumerate() {
                let views = recv.box_views(p.recv_displs[peer], list.iter().map(piece));
                for (&(j, s), view) in list.iter().zip(views) {
                    ops::scatter(&view, &index_tensor(&p.slabs.at[s])?, out_of(j), axis)?;
                }
            }
        }
        Ok(())
    })();
    confirmed(comm, moved, "gathers")?;
    let traffic = Traffic {
        sent: p.send_counts.iter().map(|&c| c as u64).collect(),
        received: p.recv_counts.iter().map(|&c| c as u64).collect(),
        local: p
            .local
            .iter()
            .map(|&(j, s)| {
                let mut shp = p.grid.region_at(j).shape;
                shp[axis] = p.slabs.at[s].len();
                (shp.iter().product::<usize>() * item) as u64
            })
            .sum(),
    };
    let out = spmd_array(p.grid, p.outs, &p.out_owner, &p.out_dev, &peers, dtype)?;
    let out = match p.one {
        true => out.without_unit_axis(axis)?,
        false => out,
    };
    Ok((out, traffic))
}

struct Prepared {
    /// One index: the result drops the axis.
    one: bool,
    grid: Grid,
    out_owner: Vec<usize>,
    out_dev: Vec<Device>,
    outs: Vec<Option<Tensor>>,
    slabs: Slabs,
    send_counts: Vec<usize>,
    sends_displs: Vec<usize>,
    recv_counts: Vec<usize>,
    recv_displs: Vec<usize>,
    recvs: Vec<Vec<(usize, usize)>>,
    local: Vec<(usize, usize)>,
    /// The exchange's buffers, made (and the send buffer staged) before the ranks agree.
    buffers: Buffers,
    dev: Device,
    fp: u64,
}

/// `t` on `dev`: itself when it is there (host memory counting as the host).
fn on_device(t: &Tensor, dev: Device) -> Result<Tensor> {
    let here = t.device();
    if ops::one_memory(here, dev) {
        Ok(t.clone())
    } else {
        Err(Error::DeviceMismatch {
            op: "gather".into(),
            devices: Devices::move_(here, dev),
            reason: "a rank's partitions must live on one device".into(),
        })
    }
}

/// `pa[.., indices[k], ..] = values[.., k, ..]` along `axis` across the ranks (a collective
/// call; every rank passes the same indices and the same `values`, held whole on every rank):
/// each rank writes the indices that fall in the partitions it holds (its own, and its copies
/// of a replicated array's), so nothing travels. The ranks compare the indices and the
/// values' shape and dtype, not the values' contents (that would cost a pass over them): each
/// rank writes from its own `values`, broadcast to the shape written as [`ops::scatter`]
/// broadcasts them. `values` are on each rank's device, or host values writing host memory
/// of any kind in place; a scalar (0-d values in host memory) writes partitions on any
/// device, its one element copied to each of the rank's devices once. `indices` takes any
/// of the forms of [`AsIndices`], as for [`gather`].
///
/// Everything that can fail before the writes (the checks, a partition in use elsewhere,
/// picking each partition's rows from `values` and moving its indices to its device, which
/// allocates) is done on every rank before the ranks agree: an error there, on any rank, is
/// every rank's, and nothing is written anywhere. Then each rank writes its partitions, one
/// after the other in C order, and the ranks confirm how that went, so that every rank
/// returns the same result. Only a device's failing write (a driver error, a failed kernel
/// launch, on a GPU) can fail after the agreement: every rank then returns the failing
/// rank's error, that rank's partitions before the failing one hold the new values, the
/// failing one may hold some of them, the later ones their old values, and every other
/// rank's partitions hold the new values (or, where a write failed there too, as on the
/// failing rank).
///
/// ```
/// use dlpart::spmd::{self, Communicator, ThreadComm};
/// use dlpart::Tensor;
/// use ndarray::{array, Array2};
///
/// ThreadComm::run(2, |comm| {
///     let mine = Tensor::from(Array2::<i32>::zeros((2, 3))); // rows 2r and 2r + 1
///     let rows = spmd::from_stacked(comm, vec![mine.clone()], 0)?;
///     // The same global indices and values on every rank: each writes the rows it holds.
///     spmd::scatter(comm, &rows, &Tensor::from(array![[1, 2, 3], [4, 5, 6]]), [3, 0], 0)?;
///     let want = match comm.rank() {
///         0 => array![[4, 5, 6], [0, 0, 0]],
///         _ => array![[0, 0, 0], [1, 2, 3]],
///     };
///     assert_eq!(mine.as_array::<i32>()?, want.into_dyn());
///     Ok::<(), dlpart::Error>(())
/// })
/// .into_iter()
/// .collect::<Result<(), _>>()?;
/// # Ok::<(), dlpart::Error>(())
/// ```
pub fn scatter(
    comm: &dyn Communicator,
    pa: &PartitionedArray,
    values: &Tensor,
    indices: impl AsIndices,
    axis: usize,
) -> Result<()> {
    let me = comm.rank();
    let stage = (|| {
        let index = read_indices(&*indices.index_tensor()?, axis, pa)?;
        let idx = &index.list;
        let src_owners = owners(pa)?;
        check_own_data(pa, &src_owners, me)?;
        let dtype = dtype_of(pa)?;
        let mut want = pa.shape().to_vec();
        want[axis] = idx.len();
        if index.one {
            want.remove(axis);
        }
        if values.dtype() != dtype {
            return Err(Error::DTypeMismatch {
                found: values.dtype(),
                expected: dtype,
                of: "the partitioned array".into(),
            });
        }
        // A scalar (0-d values in host memory) writes partitions on any device: its one
        // element is copied to each such device once, below, and broadcast there.
        let scalar = ops::is_host_scalar(values);
        let value = values;
        let broadcast = ops::broadcast_values(values, &want, || {
            format!("scatter values must have shape {}", tuple_string(&want))
        })?;
        let slabs = Slabs::new(pa.grid(), axis, idx);
        let mut writes = Vec::new();
        // This rank's partitions, and the copies it holds of other ranks' (a replicated
        // array, as heat's split=None): every copy is written, or they would part ways.
        let held = |f: usize| src_owners[f] == me || pa.data()[f].tensor().is_some();
        for f in (0..pa.len()).filter(|&f| held(f)) {
            let s = pa.grid().position(f)[axis];
            if slabs.at[s].is_empty() {
                continue;
            }
            let t = own_data(pa, f, me)?;
            let what = format!("partition {}", tuple_string(&pa.grid().position(f)));
            if t.readonly() {
                return Err(Error::ReadOnly { what });
            }
            ops::check_distinct(t, &what)?;
            // Host values write host memory of any kind in place.
            if !ops::one_memory(values.device(), t.device()) && !scalar {
                crate::backend::check_kernels([values.device(), t.device()])?;
                return Err(Error::DeviceMismatch {
                    op: "scatter".into(),
                    devices: Devices::move_(values.device(), t.device()),
                    reason: "values must be on each rank's device".into(),
                });
            }
            writes.push((f, s, t));
        }
        // Partitions sharing memory would be written one after the other, each from its own
        // values (see `PartitionedArray::scatter`).
        let held: Vec<&Tensor> = writes.iter().map(|&(_, _, t)| t).collect();
        if let Some(s) = crate::overlap::shared_targets(&held) {
            let position = |j: usize| tuple_string(&pa.grid().position(writes[j].0));
            return Err(s.targets_error(position, &format!(" of rank {me}")));
        }
        // A view this process holds of a partition written (or a write to `values` under
        // way) would refuse this rank's writes after the ranks agreed: found here, where its
        // error reaches every rank, and the memory held until the writes are done, so that
        // no other thread claims it in between (see `crate::access::scope`).
        let scope = crate::access::scope(
            "scatter",
            [(Role::new("values"), values)],
            writes
                .iter()
                .map(|&(f, _, t)| (Role::nth("partition", f), t)),
        )?;
        let mut w = print(pa, &src_owners, axis, &index);
        w.usizes(values.shape()).str(values.dtype().name());
        // Every partition's rows picked, and its indices made, before the ranks agree:
        // picking allocates, on the host too, and device work can fail on one rank.
        // Values that view this rank's partitions are read before any of them is written.
        let values = &ops::apart_from(&broadcast, held.iter().copied())?;
        // One index writes a slab of one.
        let values = &match index.one {
            true => values.with_unit_axis(axis),
            false => values.clone(),
        };
        let mut ready = Vec::with_capacity(writes.len());
        let mut scalars: Vec<Tensor> = Vec::new();
        for &(f, s, t) in &writes {
            let backend = crate::backend::backend_for(t.device())?;
            let picked = match ops::scalar_on_once(&mut scalars, value, t.device())? {
                Some(v) => v,
                None => {
                    let r = pa.grid().region_at(f);
                    let (mut start, mut shape) = (r.start.clone(), r.shape.clone());
                    start[axis] = 0;
                    shape[axis] = values.shape()[axis];
                    let rows = values.view(&start, &shape)?;
                    ops::gather_scratch(&rows, &index_tensor(&slabs.at[s])?, axis)?
                }
            };
            let local = index_tensor(&slabs.local[s])?;
            let (local, picked) =
                ops::scatter_operands(backend.as_ref(), &picked, &local, t, axis)?;
            ready.push(Write {
                backend,
                picked,
                local,
                target: t.clone(),
            });
        }
        Ok((ready, fingerprint(&w.0), scope))
    })();
    let ((ready, _, _scope), _) = agreed(
        comm,
        "scatter",
        stage,
        |s| s.1,
        |_| String::new(),
        "scatters (indices, values' shapes or dtypes, or grids)",
    )?;
    // Only the writes are left, which only a device can fail (see above): the ranks confirm
    // their outcome, so that none returns success while another fails.
    let written = ready.iter().try_for_each(|w| w.run(axis));
    confirmed(comm, written, "scatters")
}

/// One partition's write of a scatter, prepared before the ranks agree: its rows of the
/// values and its indices, on its device.
struct Write {
    backend: std::sync::Arc<dyn crate::backend::Backend>,
    picked: Tensor,
    local: Tensor,
    target: Tensor,
}

impl Write {
    fn run(&self, axis: usize) -> Result<()> {
        #[cfg(test)]
        failing_write()?;
        (self.backend).scatter(&self.picked, &self.local, axis, &self.target)?;
        self.backend.synchronize()
    }
}

#[cfg(test)]
thread_local! {
    /// Tests: how many more partition writes of this thread's scatters succeed before one
    /// fails as a device's would (`None`: all succeed).
    pub(super) static WRITES_BEFORE_FAILURE: std::cell::Cell<Option<usize>> =
        const { std::cell::Cell::new(None) };
}

/// Tests: the failure [`WRITES_BEFORE_FAILURE`] asks for, if this write is the one.
#[cfg(test)]
fn failing_write() -> Result<()> {
    WRITES_BEFORE_FAILURE.with(|w| match w.get() {
        Some(0) => {
            w.set(None);
            Err(Error::Backend {
                backend: "test",
                op: "scatter".into(),
                message: "a write made to fail by the test".into(),
            })
        }
        Some(n) => {
            w.set(Some(n - 1));
            Ok(())
        }
        None => Ok(()),
    })
}
