//! Operations on top of the planner and the backends: repartition, gather, scatter.
//!
//! Every operation validates first and writes second, so an error leaves every output
//! untouched. Data never crosses devices unless the caller passes `transfer = true`; host
//! memory of every kind is one memory (`one_memory`): copies between kinds of it are plain
//! copies, which need no `transfer`. A repartition with `transfer` moves across devices only
//! the boxes its plan copies there, packed per device pair (`crossing.rs`).

use std::borrow::{Borrow, Cow};
use std::collections::BTreeMap;
use std::sync::Arc;

use crate::backend::{backend_for, Backend, BoxCopy};
use crate::device::Device;
use crate::dtype::DType;
use crate::error::{tuple_string, Devices, Error, Result, ALLOW_TRANSFER};
use crate::grid::{same_shape, Grid};
use crate::indices::AsIndices;
use crate::plan::Plan;
use crate::tensor::{Axes, Tensor};

mod crossing;
#[cfg(all(test, feature = "kernel-host-tests"))]
mod scatter_scalar_tests;

/// Repartitions `src` (one tensor per partition of `plan`'s source grid, in C order of
/// positions) into new tensors over the target grid; target partition `j` is allocated on
/// `dst_devices[j]`. Each element that stays in its memory is copied once, straight from its
/// source partition into its target partition, on the device where it is. Host targets under
/// 2 MiB share one allocation per device (see [`Backend::empty_many`]), released when the
/// last of them is dropped.
///
/// Targets on another device than the sources they receive from need `transfer` (else
/// [`Error::DeviceMismatch`] naming the moves), unless both are host memory (of any kinds,
/// `kDLCPU`, `kDLCPU:k`, pinned, managed: plain copies). With it, only the boxes the plan
/// copies between two devices cross: for each (source device, target device) pair, packed
/// into one contiguous buffer by the source side's kernels, moved in one transfer (host memory
/// to `kDLCUDA:n`, back, or between CUDA devices) and unpacked into the targets by the target
/// side's kernels. Every allocation and transfer is done before any target is written. A
/// device without dlpart kernels (kDLOneAPI) on either side is [`Error::BackendUnavailable`].
pub fn repartition<S: Borrow<Tensor>>(
    plan: &Plan,
    src: &[S],
    dst_devices: &[Device],
    transfer: bool,
) -> Result<Vec<Tensor>> {
    let (sg, dg) = (plan.src_grid(), plan.dst_grid());
    let dtype = check_sources(sg, src)?;
    if dst_devices.len() != dg.num_partitions() {
        return Err(Error::shape(
            format!(
                "{} target partitions need as many devices",
                dg.num_partitions()
            ),
            format!("{} devices", dst_devices.len()),
        ));
    }
    let backends = check_devices(plan, src, dst_devices, dtype, transfer)?;
    check_present_all(dst_devices.iter().copied())?;
    // Every target's shape in one flat buffer (thousands of small targets are common).
    let nd = dg.ndim();
    let mut flat = Vec::with_capacity(nd * dst_devices.len());
    dg.for_each_region(|_, _, shape| flat.extend_from_slice(shape));
    let shapes: Vec<&[usize]> = if nd == 0 {
        vec![&[]; dst_devices.len()]
    } else {
        flat.chunks_exact(nd).collect()
    };
    // A device whose targets receive no bytes (empty partitions) is looked up here.
    let out = new_targets(&shapes, dst_devices, dtype, |dev| {
        backend_of(&backends, dev)
    })?;
    // SAFETY: the targets were just allocated, each on its own memory.
    unsafe { run_copies(plan, src, &out, &backends)? };
    Ok(out)
}

/// Like [`repartition`], into existing target tensors `dst` (one per partition of the target
/// grid, C order): the caller's buffers are reused. Read-only targets are refused; nothing is
/// written unless every check passes, and every allocation and transfer the copies need has
/// been done. Targets on another device than their sources need `transfer` as in
/// [`repartition`], which says what then crosses.
pub fn repartition_into<S: Borrow<Tensor>, D: Borrow<Tensor>>(
    plan: &Plan,
    src: &[S],
    dst: &[D],
    transfer: bool,
) -> Result<()> {
    let (sg, dg) = (plan.src_grid(), plan.dst_grid());
    let dtype = check_sources(sg, src)?;
    let dst_dtype = check_sources(dg, dst)?;
    if !dst.is_empty() && !src.is_empty() && dst_dtype != dtype {
        return Err(Error::DTypeMismatch {
            found: dst_dtype,
            expected: dtype,
            of: "the source partitions".into(),
        });
    }
    if let Some(j) = dst.iter().position(|t| t.borrow().readonly()) {
        // The tensor's form says why it is read-only where it knows (a legacy import).
        return Err(Error::ReadOnly {
            what: format!(
                "target partition {} {:?}",
                tuple_string(&dg.position(j)),
                dst[j].borrow()
            ),
        });
    }
    let devices: Vec<Device> = dst.iter().map(|t| t.borrow().device()).collect();
    let backends = check_devices(plan, src, &devices, dtype, transfer)?;
    // The backends need targets disjoint from each other and from every other copy's source:
    // targets sharing elements are refused (their copies would race), and sources sharing
    // memory with a target are copied aside first.
    let targets: Vec<&Tensor> = dst.iter().map(Borrow::borrow).collect();
    if let Some(s) = crate::overlap::shared_targets(&targets) {
        return Err(s.targets_error(|j| tuple_string(&dg.position(j)), ""));
    }
    let sources: Vec<&Tensor> = src.iter().map(Borrow::borrow).collect();
    let shared = crate::overlap::sources_sharing(&sources, &targets);
    if !shared.contains(&true) {
        // SAFETY: the targets were checked disjoint, and no source shares their memory.
        return unsafe { run_copies(plan, src, dst, &backends) };
    }
    let staged: Vec<Tensor> = sources
        .iter()
        .zip(&shared)
        .map(|(t, &s)| {
            if s {
                to_device(t, crate::backend::scratch_device(t.device()))
            } else {
                Ok((*t).clone())
            }
        })
        .collect::<Result<_>>()?;
    // SAFETY: the targets were checked disjoint, and every source that shared their memory
    // was copied aside into `staged`.
    unsafe { run_copies(plan, &staged, dst, &backends) }
}

/// Checks that each of `devices`, the devices new target partitions are to go on, exists
/// here ([`crate::backend::check_present`]: not `kDLCPU:5` on a host of one), each distinct
/// one once.
pub(crate) fn check_present_all(devices: impl IntoIterator<Item = Device>) -> Result<()> {
    let mut seen: Vec<Device> = Vec::new();
    for d in devices {
        if !seen.contains(&d) {
            crate::backend::check_present(d)?;
            seen.push(d);
        }
    }
    Ok(())
}

/// New target partitions with unspecified contents, tensor `k` of `shapes[k]` on
/// `devices[k]` (checked present by [`check_present_all`] first), each in the memory its
/// device names: new `kDLCUDAHost` memory is pinned memory from CUDA, and managed or ROCm
/// host memory is [`Error::NoNewMemory`]. The targets of each device come from one call of
/// its backend's [`Backend::empty_many`] (`backend` gives it), so that the backend can
/// share allocations. [`repartition`]'s targets, and one rank's in an SPMD repartition.
pub(crate) fn new_targets(
    shapes: &[&[usize]],
    devices: &[Device],
    dtype: DType,
    backend: impl Fn(Device) -> Result<Arc<dyn Backend>>,
) -> Result<Vec<Tensor>> {
    debug_assert_eq!(shapes.len(), devices.len());
    match devices.first() {
        // One device, the common case: the backend's tensors are the targets, in order.
        Some(&dev) if devices.iter().all(|&d| d == dev) => backend(dev)?.empty_many(shapes, dtype),
        _ => {
            let mut by_device: BTreeMap<Device, Vec<usize>> = BTreeMap::new();
            for (k, &dev) in devices.iter().enumerate() {
                by_device.entry(dev).or_default().push(k);
            }
            let mut out: Vec<Option<Tensor>> = vec![None; devices.len()];
            for (dev, ks) in by_device {
                let of_device: Vec<&[usize]> = ks.iter().map(|&k| shapes[k]).collect();
                for (k, t) in ks
                    .into_iter()
                    .zip(backend(dev)?.empty_many(&of_device, dtype)?)
                {
                    out[k] = Some(t);
                }
            }
            Ok(out.into_iter().map(|t| t.expect("every target")).collect())
        }
    }
}

type Backends = BTreeMap<Device, Arc<dyn Backend>>;

/// The backend of `device`, resolved by `check_devices` or, for a device that sends or
/// receives no bytes (the CPU executing copies between two kinds of host memory, a device
/// whose targets are all empty), looked up now.
fn backend_of(backends: &Backends, device: Device) -> Result<Arc<dyn Backend>> {
    match backends.get(&device) {
        Some(b) => Ok(b.clone()),
        None => backend_for(device),
    }
}

/// Refuses device crossings without `transfer` (moves between host memory of any kinds are
/// plain copies, not crossings: [`one_memory`]), and resolves the backend of every device
/// that sends or receives bytes, before anything is allocated or written. With `transfer`,
/// a crossing needs dlpart kernels on both of its devices ([`crossing`]).
fn check_devices<S: Borrow<Tensor>>(
    plan: &Plan,
    src: &[S],
    dst_devices: &[Device],
    dtype: DType,
    transfer: bool,
) -> Result<Backends> {
    let pairs = plan.bytes_by_device_pair(dtype.itemsize(), &|i| src[i].borrow().device(), &|j| {
        dst_devices[j]
    });
    let crossing: Vec<(Device, Device)> = pairs
        .keys()
        .copied()
        .filter(|&(s, d)| !one_memory(s, d))
        .collect();
    if !crossing.is_empty() && !transfer {
        return Err(Error::DeviceMismatch {
            op: "repartition".into(),
            devices: Devices::Moves(crossing),
            reason: format!("the target layout moves data to another device; {ALLOW_TRANSFER}"),
        });
    }
    // A device without dlpart kernels (kDLOneAPI) on either side of a copy, or a CUDA device
    // whose backend cannot load here, is refused by its `backend_for`.
    let mut backends = Backends::new();
    for &(s, d) in pairs.keys() {
        for dev in [s, d] {
            if let std::collections::btree_map::Entry::Vacant(e) = backends.entry(dev) {
                e.insert(backend_for(dev)?);
            }
        }
    }
    Ok(backends)
}

/// Runs the plan's copies. When every tensor is on one device, or all are host memory, one
/// backend runs the whole plan ([`Backend::copy_plan`]: checked per tensor, not per box);
/// otherwise one batch per executing device: same-device copies run on that device, and
/// copies between host memory of two kinds (kDLCPU <-> kDLCUDAHost) on the CPU. Copies
/// between devices that are not one memory (`check_devices` let them through with
/// `transfer`) are packed, moved and unpacked per device pair ([`crossing`]): every target is
/// written after every pair's bytes have arrived, and the host memory of every source and
/// target is claimed from before the first pack until the last write: a claim held elsewhere
/// (another thread's call, a live view) is refused before anything moves, never between two
/// batches of writes.
///
/// # Safety
/// The targets share no element with each other or with any source (the contract of
/// [`Backend::copy_plan`]).
unsafe fn run_copies<S: Borrow<Tensor>, D: Borrow<Tensor>>(
    plan: &Plan,
    src: &[S],
    dst: &[D],
    backends: &Backends,
) -> Result<()> {
    if plan.is_empty() {
        return Ok(());
    }
    let srcs: Vec<&Tensor> = src.iter().map(Borrow::borrow).collect();
    let dsts: Vec<&Tensor> = dst.iter().map(Borrow::borrow).collect();
    let first = srcs.first().map(|t| t.device());
    let all = |f: &dyn Fn(Device) -> bool| srcs.iter().chain(&dsts).all(|t| f(t.device()));
    let whole = match first {
        Some(dev) if all(&|d| d == dev) => Some(dev),
        Some(_) if all(&|d| d.is_host_accessible()) => Some(Device::CPU),
        _ => None,
    };
    if let Some(dev) = whole {
        let backend = backend_of(backends, dev)?;
        // SAFETY: this function's contract.
        let copied = unsafe { backend.copy_plan(plan, &srcs, &dsts) };
        return waited_for(backend.as_ref(), copied);
    }
    // The copies run in batches, one per executing device: every host source and target is
    // claimed before the first, so that a claim refused in a later batch (another host
    // device's, or a crossing's) finds nothing written yet.
    let _scope = crate::access::scope(
        "partition copy",
        crate::access::numbered("source partition", srcs.iter().copied()),
        crate::access::numbered("target partition", dsts.iter().copied()),
    )?;
    // The copies within one memory go into the batches as the plan is walked for the
    // crossings; the crossing boxes join them once they have arrived.
    let mut batches: BTreeMap<Device, Vec<BoxCopy<'_>>> = BTreeMap::new();
    let crossings = crossing::Crossings::of(plan, &srcs, &dsts, |op| {
        let (src, dst) = (srcs[op.src], dsts[op.dst]);
        batches
            .entry(crossing::executor(src.device(), dst.device()))
            .or_default()
            .push(BoxCopy {
                src,
                src_start: op.src_start.clone(),
                dst,
                dst_start: op.dst_start.clone(),
                shape: op.shape.clone(),
            });
    });
    let arrived = crossings.send(|i| srcs[i], backends)?;
    for (view, op) in &arrived {
        let dst = dsts[op.dst];
        (batches.entry(crossing::executor(view.device(), dst.device())))
            .or_default()
            .push(BoxCopy {
                src: view,
                src_start: vec![0; op.shape.len()],
                dst,
                dst_start: op.dst_start.clone(),
                shape: op.shape.clone(),
            });
    }
    for (&dev, jobs) in &batches {
        let backend = backend_of(backends, dev)?;
        // SAFETY: the boxes of disjoint targets are disjoint, and no target shares memory with
        // a source (this function's contract) or with the buffers the crossing boxes arrived
        // in, which dlpart just allocated.
        let copied = unsafe { backend.copy_boxes_unchecked(jobs) };
        waited_for(backend.as_ref(), copied)?;
    }
    Ok(())
}

/// The copies `ops`, each of which crosses between devices that are not one memory
/// ([`one_memory`]: the copy `op` reads `src(op.src)` and writes a tensor on `dst(op.dst)`),
/// packed on their source devices and moved to new memory on the target side in one transfer
/// per device pair, as a repartition moves its crossing boxes ([`crossing`]): each box as it
/// arrived, with its copy, for the target side's kernels to unpack. Only the boxes' bytes
/// cross; nothing of the caller's is written, so an error leaves every target as it was.
pub(crate) fn crossed<'s>(
    ops: &[crate::plan::BoxCopy],
    src: impl Fn(usize) -> &'s Tensor,
    dst: impl Fn(usize) -> Device,
) -> Result<Vec<(Tensor, crate::plan::BoxCopy)>> {
    let crossings = crossing::Crossings::of_boxes(ops, |i| src(i).device(), dst);
    let arrived = crossings.send(&src, &Backends::new())?;
    Ok(arrived.into_iter().map(|(t, op)| (t, op.clone())).collect())
}

/// `copied` once `backend` has finished the work queued on it, also when the copies failed:
/// what was queued before the error may still read or write the tensors, which the caller
/// is free to release once it has the error. An error of the copies wins over one of the
/// wait.
fn waited_for(backend: &dyn Backend, copied: Result<()>) -> Result<()> {
    let waited = backend.synchronize();
    copied.and(waited)
}

fn check_sources<S: Borrow<Tensor>>(grid: &Grid, src: &[S]) -> Result<DType> {
    if src.len() != grid.num_partitions() {
        return Err(Error::shape(
            format!(
                "a grid of tiling {} needs one tensor per partition",
                tuple_string(&grid.tiling())
            ),
            format!("{} tensors", src.len()),
        ));
    }
    let dtype = src.first().map_or(DType::Float32, |t| t.borrow().dtype());
    // Found without allocating per partition; the error is built for the first bad one.
    let mut bad = None;
    grid.for_each_region(|i, _, shape| {
        let t = src[i].borrow();
        if bad.is_none() && (!same_shape(t.shape(), shape) || t.dtype() != dtype) {
            bad = Some(i);
        }
    });
    if let Some(i) = bad {
        let t = src[i].borrow();
        let region = grid.region_at(i);
        if t.shape() != region.shape.as_slice() {
            return Err(Error::protocol(
                "partitions",
                Some(&grid.position(i)),
                format!(
                    "data of shape {} for an entry of shape {}",
                    tuple_string(t.shape()),
                    tuple_string(&region.shape)
                ),
                Some(7),
            ));
        }
        return Err(Error::protocol(
            "partitions",
            Some(&grid.position(i)),
            format!("dtype {} differs from {dtype}", t.dtype()),
            Some(6),
        ));
    }
    Ok(dtype)
}

/// Normalises `indices` against an axis of length `len` on the backend of the indices' own
/// device ([`Backend::normalise_indices`]): negative ones count from the end, as in numpy, and
/// an index outside `[-len, len)` is [`Error::IndexOutOfRange`] naming it. Host indices come
/// back as a host int64 tensor that dlpart owns: each index is read once, into it, so a thread
/// rewriting the caller's array cannot change an index after its check.
///
/// `indices` is a 1-d list in any of the forms of [`AsIndices`]: a [`Tensor`] of any integer
/// dtype, a slice, `Vec` or array of integers, a 1-d ndarray array or view.
///
/// ```
/// use dlpart::ops::normalise_indices;
///
/// let idx = normalise_indices([0i64, -1, 2, -5], 0, 5)?;
/// assert_eq!(idx.as_array::<i64>()?.as_slice(), Some(&[0, 4, 2, 0][..]));
/// let e = normalise_indices([1usize, 7], 0, 5).unwrap_err();
/// assert!(matches!(e, dlpart::Error::IndexOutOfRange { index: 7, axis: 0, len: 5 }), "{e}");
/// # Ok::<(), dlpart::Error>(())
/// ```
pub fn normalise_indices(indices: impl AsIndices, axis: usize, len: usize) -> Result<Tensor> {
    let indices = indices.index_tensor()?;
    backend_for(indices.device())?.normalise_indices(&indices, axis, len)
}

pub(crate) fn check_axis(t: &Tensor, axis: usize, what: &str) -> Result<()> {
    if axis >= t.ndim() {
        return Err(Error::shape(
            format!("axis {axis} is out of range for the {}-d {what}", t.ndim()),
            format!("shape {}", tuple_string(t.shape())),
        ));
    }
    Ok(())
}

pub(crate) fn check_out(out: &Tensor, shape: &[usize], dtype: DType, device: Device) -> Result<()> {
    if out.readonly() {
        return Err(Error::ReadOnly {
            what: format!("out {out:?}"),
        });
    }
    check_distinct(out, "out")?;
    if out.dtype() != dtype {
        return Err(Error::DTypeMismatch {
            found: out.dtype(),
            expected: dtype,
            of: "the gather's source (out must have its dtype)".into(),
        });
    }
    if out.shape() != shape {
        return Err(Error::shape(
            format!(
                "out must have shape {} and dtype {dtype}",
                tuple_string(shape)
            ),
            format!("{out:?}"),
        ));
    }
    // Host memory of any kind is written from host memory of any kind in place.
    if !one_memory(device, out.device()) {
        // No move could bring them together where one side has no dlpart kernels.
        crate::backend::check_kernels([device, out.device()])?;
        return Err(Error::DeviceMismatch {
            op: "gather".into(),
            devices: Devices::move_(device, out.device()),
            reason: "the source and out must be on one device, or both in host memory".into(),
        });
    }
    Ok(())
}

/// `values`, or a copy of it on its device when it shares memory with one of `targets`: the
/// values a scatter writes into several targets, one after the other, must not change under
/// it as the earlier targets are written.
pub(crate) fn apart_from<'a>(
    values: &Tensor,
    mut targets: impl Iterator<Item = &'a Tensor>,
) -> Result<Tensor> {
    if targets.any(|t| crate::overlap::shares_memory(values, t)) {
        to_device(values, crate::backend::scratch_device(values.device()))
    } else {
        Ok(values.clone())
    }
}

/// Refuses a target `what` whose elements overlap each other (a zero stride, or strides that
/// interleave): the threads that write its elements would race.
pub(crate) fn check_distinct(t: &Tensor, what: &str) -> Result<()> {
    if let Some(s) = crate::overlap::covers_an_element_twice(t) {
        return Err(Error::buffer(format!(
            "{what} {t:?} {}: its writes would race; pass a target whose elements are distinct",
            s.more_than_once()
        )));
    }
    Ok(())
}

/// `out[.., i, ..] = src[.., indices[i], ..]` along `axis`, like `numpy.take`. Allocates `out`
/// on `src`'s device unless given, or in `kDLCPU` memory for a source in host memory dlpart
/// does not make (`kDLCUDAManaged`, `kDLROCMHost`; see
/// [`Error::NoNewMemory`]): the host reads it as it reads the source, as `numpy.take` of such
/// memory gives an ordinary host array. An `out` that is read-only or refers to some element more
/// than once (a zero stride) is refused before anything is written. To copy the same indices
/// between the same tensors again and again, [`PreparedGather`](crate::PreparedGather) checks
/// all this once.
///
/// `indices` is a 1-d list, or one index (a 0-d tensor, or one integer): then, as in numpy,
/// `axis` is dropped (`numpy.take(x, 2, 0)` is `x[2]`), and `out` has `src`'s shape without
/// it. It takes any of the forms of [`AsIndices`]: a [`Tensor`] (on the host, or on `src`'s
/// device), a slice, `Vec` or array of integers, an ndarray array or view, one integer.
///
/// ```
/// use dlpart::{ops, Tensor};
/// use ndarray::{array, Axis};
///
/// let x = array![[1.0f32, 2.0], [3.0, 4.0], [5.0, 6.0]];
/// let src = Tensor::from(x.clone());
/// let picked = ops::gather(&src, [2, 0, -1], 0, None)?; // negative: from the end
/// assert_eq!(picked.to_array::<f32>()?, x.select(Axis(0), &[2, 0, 2]).into_dyn());
/// let column = ops::gather(&src, 1, 1, None)?; // one index drops the axis
/// assert_eq!(column.to_array::<f32>()?, x.column(1).into_dyn());
/// # Ok::<(), dlpart::Error>(())
/// ```
pub fn gather(
    src: &Tensor,
    indices: impl AsIndices,
    axis: usize,
    out: Option<&Tensor>,
) -> Result<Tensor> {
    gather_tensor(src, &*indices.index_tensor()?, axis, out, None)
}

/// [`gather`] of indices in a tensor. Without `out`, the result is a new tensor on `new_on`
/// when given (allocated before the gather), else on the device the gathering backend
/// allocates it on as it gathers (see [`gather`]).
fn gather_tensor(
    src: &Tensor,
    indices: &Tensor,
    axis: usize,
    out: Option<&Tensor>,
    new_on: Option<Device>,
) -> Result<Tensor> {
    debug_assert!(out.is_none() || new_on.is_none(), "out, or a new tensor");
    check_axis(src, axis, "source")?;
    let backend = backend_for(crate::backend::result_device(src.device()))?;
    let (list, one) = index_list(indices)?;
    let new;
    let out = match new_on {
        Some(device) => {
            let shape = match one {
                true => without_axis(src.shape(), axis),
                false => {
                    let mut shape = src.shape().to_vec();
                    shape[axis] = list.shape()[0];
                    shape
                }
            };
            new = backend_for(device)?.empty(&shape, src.dtype())?;
            Some(&new)
        }
        None => out,
    };
    if !one {
        let out = backend.gather_from_caller(src, indices, axis, out)?;
        backend.synchronize()?;
        return Ok(out);
    }
    let out = one_index_out(backend.as_ref(), src, axis, out)?;
    backend.gather_from_caller(src, &list, axis, Some(&out.with_unit_axis(axis)))?;
    backend.synchronize()?;
    Ok(out)
}

/// [`gather`] into dlpart's own scratch memory, for picks that are only passed on (scattered
/// into a result, sent to another rank): on `src`'s device, but in plain `kDLCPU` memory for
/// host memory of any kind ([`scratch_device`](crate::backend::scratch_device)), never in new
/// pinned memory, which needs CUDA and which no one but the next copy reads. `indices` is a
/// 1-d list, or one index (the axis dropped, as in [`gather`]).
pub(crate) fn gather_scratch(src: &Tensor, indices: &Tensor, axis: usize) -> Result<Tensor> {
    let scratch = crate::backend::scratch_device(src.device());
    gather_tensor(src, indices, axis, None, Some(scratch))
}

/// `indices` as the 1-d list the backends take, and whether it is one index: a 0-d tensor,
/// numpy's scalar index, for which a gather or scatter drops the axis (it runs over a slab of
/// one, [`Tensor::with_unit_axis`]). Indices of more axes are refused, and so are indices on
/// a device without dlpart kernels ([`Error::BackendUnavailable`]: no backend reads them,
/// and only their own library can move them).
pub(crate) fn index_list(indices: &Tensor) -> Result<(Cow<'_, Tensor>, bool)> {
    crate::backend::check_kernels([indices.device()])?;
    match indices.ndim() {
        0 => Ok((Cow::Owned(indices.with_unit_axis(0)), true)),
        1 => Ok((Cow::Borrowed(indices), false)),
        _ => Err(Error::shape(
            "indices must be one index (0-d) or a 1-d list: indices of more axes, whose shape \
             numpy.take puts in place of the axis, are not supported (flatten them, and \
             reshape the result)",
            format!("shape {}", tuple_string(indices.shape())),
        )),
    }
}

/// `shape` less `axis`: a gather's output, or a scatter's values, for one index.
pub(crate) fn without_axis(shape: &[usize], axis: usize) -> Vec<usize> {
    let mut s = shape.to_vec();
    s.remove(axis);
    s
}

/// The output of a gather of one index from `src` along `axis`, of `src`'s shape without
/// the axis: `out` checked as [`check_out`] checks it, or allocated on `backend` when not
/// given.
pub(crate) fn one_index_out<B: Backend + ?Sized>(
    backend: &B,
    src: &Tensor,
    axis: usize,
    out: Option<&Tensor>,
) -> Result<Tensor> {
    let shape = without_axis(src.shape(), axis);
    match out {
        Some(o) => {
            check_out(o, &shape, src.dtype(), src.device())?;
            Ok(o.clone())
        }
        None => backend.empty(&shape, src.dtype()),
    }
}

/// [`Backend::gather_from_caller`] by way of the normalised copy of the indices: what every
/// backend does unless it has a better way.
pub(crate) fn gather_normalised<B: Backend + ?Sized>(
    backend: &B,
    src: &Tensor,
    indices: &Tensor,
    axis: usize,
    out: Option<&Tensor>,
) -> Result<Tensor> {
    let (idx, out) = gather_operands(backend, src, indices, axis, out)?;
    backend.gather(src, &idx, axis, &out)?;
    Ok(out)
}

/// What [`gather`] checks before it writes, on the backend of `src`'s device, once `axis` is
/// known to be in range: the indices normalised into dlpart's own memory, and `out` (checked,
/// or allocated when not given).
pub(crate) fn gather_operands<B: Backend + ?Sized>(
    backend: &B,
    src: &Tensor,
    indices: &Tensor,
    axis: usize,
    out: Option<&Tensor>,
) -> Result<(Tensor, Tensor)> {
    let idx = backend.normalise_indices(indices, axis, src.shape()[axis])?;
    let mut shape = Axes::from(src.shape());
    shape[axis] = idx.shape()[0];
    let out = match out {
        Some(o) => {
            check_out(o, &shape, src.dtype(), src.device())?;
            o.clone()
        }
        None => backend.empty(&shape, src.dtype())?,
    };
    Ok((idx, out))
}

/// `out[.., indices[i], ..] = values[.., i, ..]` along `axis`, like numpy's fancy assignment
/// (the last of duplicate indices wins); an `out` that is read-only or refers to some element
/// more than once (a zero stride) is refused before anything is written.
/// [`PreparedScatter`](crate::PreparedScatter) checks all this once for a scatter that runs
/// again and again. For one index (a 0-d `indices`, or one integer) `values` has `out`'s
/// shape without `axis`, as numpy's `out[.., i, ..] = values` takes it. `values` of another
/// shape that broadcasts to the one written are broadcast, as numpy's fancy assignment
/// broadcasts them: a 0-d value is written at every element, a row of `out`'s last axis in
/// every row. `values` are on `out`'s device, or host values writing host memory of any kind
/// in place; but a 0-d value in host memory (a scalar) writes `out` on any device, its one
/// element copied there first. `indices` takes any of the forms of [`AsIndices`], as for
/// [`gather`].
///
/// ```
/// use dlpart::{ops, DType, Tensor};
/// use ndarray::array;
///
/// let out = Tensor::zeros(&[4, 2], DType::Int32)?;
/// let rows = vec![3usize, 0, 3]; // duplicates: the last one wins
/// ops::scatter(&Tensor::from(array![[1, 2], [3, 4], [5, 6]]), &rows, &out, 0)?;
/// ops::scatter(&Tensor::from(array![7, 8]), -2, &out, 0)?; // one index: a row of values
/// assert_eq!(out.to_array::<i32>()?, array![[3, 4], [0, 0], [7, 8], [5, 6]].into_dyn());
/// # Ok::<(), dlpart::Error>(())
/// ```
pub fn scatter(values: &Tensor, indices: impl AsIndices, out: &Tensor, axis: usize) -> Result<()> {
    scatter_tensor(values, &*indices.index_tensor()?, out, axis)
}

/// [`scatter`] of indices in a tensor.
fn scatter_tensor(values: &Tensor, indices: &Tensor, out: &Tensor, axis: usize) -> Result<()> {
    check_axis(out, axis, "output")?;
    let backend = backend_for(out.device())?;
    let scalar = scalar_on(values, out.device())?;
    let values = scalar.as_ref().unwrap_or(values);
    let (idx, values) = scatter_operands(backend.as_ref(), values, indices, out, axis)?;
    backend.scatter(&values, &idx, axis, out)?;
    backend.synchronize()
}

/// A scalar written by a scatter into memory of `device`: 0-d `values` in host memory, for a
/// `device` that is not host memory, copied there (one element, once), where the scatter
/// broadcasts it as it broadcasts a 0-d value on that device; `None` for any other values,
/// which are written from where they are (host values into host memory of any kind in place).
pub(crate) fn scalar_on(values: &Tensor, device: Device) -> Result<Option<Tensor>> {
    if !is_host_scalar(values) || one_memory(values.device(), device) {
        return Ok(None);
    }
    to_device(values, device).map(Some)
}

/// Whether a scatter's `values` are a scalar, 0-d in host memory, which [`scalar_on`] copies
/// to any device written: the scatters that ask no `transfer` for it ask this.
pub(crate) fn is_host_scalar(values: &Tensor) -> bool {
    values.ndim() == 0 && values.device().is_host_accessible()
}

/// [`scalar_on`] for a scatter writing tensors on several devices: the copies it made are
/// kept in `made`, so that the scalar is copied to each device once.
pub(crate) fn scalar_on_once(
    made: &mut Vec<Tensor>,
    values: &Tensor,
    device: Device,
) -> Result<Option<Tensor>> {
    if let Some(v) = made.iter().find(|v| v.device() == device) {
        return Ok(Some(v.clone()));
    }
    let v = scalar_on(values, device)?;
    made.extend(v.clone());
    Ok(v)
}

/// What [`scatter`] checks before it writes, on the backend of `out`'s device, once `axis` is
/// known to be in range; returns the indices normalised into dlpart's own memory, and the
/// values as the backend takes them (broadcast to the shape written, with the axis of extent
/// 1 back for one index).
pub(crate) fn scatter_operands(
    backend: &dyn Backend,
    values: &Tensor,
    indices: &Tensor,
    out: &Tensor,
    axis: usize,
) -> Result<(Tensor, Tensor)> {
    let (list, one) = index_list(indices)?;
    let idx = backend.normalise_indices(&list, axis, out.shape()[axis])?;
    let mut shape = Axes::from(out.shape());
    shape[axis] = idx.shape()[0];
    if one {
        shape = without_axis(out.shape(), axis).into();
    }
    if values.dtype() != out.dtype() {
        return Err(Error::DTypeMismatch {
            found: values.dtype(),
            expected: out.dtype(),
            of: "the scatter's out (values must have its dtype)".into(),
        });
    }
    let values = broadcast_values(values, &shape, || {
        format!(
            "values must have shape {} and dtype {}",
            tuple_string(&shape),
            out.dtype()
        )
    })?;
    if out.readonly() {
        return Err(Error::ReadOnly {
            what: format!("out {out:?}"),
        });
    }
    check_distinct(out, "out")?;
    // Host values write host memory of any kind in place.
    if !one_memory(values.device(), out.device()) {
        crate::backend::check_kernels([values.device(), out.device()])?;
        return Err(Error::DeviceMismatch {
            op: "scatter".into(),
            devices: Devices::move_(values.device(), out.device()),
            reason: "values and out must be on one device, or both in host memory".into(),
        });
    }
    let values = match one {
        true => values.with_unit_axis(axis),
        false => values,
    };
    Ok((idx, values))
}

/// A scatter's `values` as the `shape` it writes: themselves, or broadcast to it as numpy's
/// fancy assignment broadcasts them ([`Tensor::broadcast_to`]: a 0-d value fills every
/// element, a row every row). Values that do not broadcast are [`Error::Shape`], `wanted`
/// saying what was expected (its shape first, in the words of every scatter).
pub(crate) fn broadcast_values(
    values: &Tensor,
    shape: &[usize],
    wanted: impl FnOnce() -> String,
) -> Result<Tensor> {
    values.broadcast_to(shape).ok_or_else(|| {
        Error::shape(
            format!("{} (or values that broadcast to it, as in numpy)", wanted()),
            format!("{values:?}"),
        )
    })
}

/// A copy of `t` on `device`: the one way data crosses devices. The same device (or host
/// memory to `kDLCPU`) gives a contiguous copy; otherwise the backend of the side that is not
/// host memory runs [`Backend::transfer`] (the target's, when neither side is), so anything
/// touching `kDLCUDA` needs dlpart built with the `cuda` feature. A device without dlpart
/// kernels (kDLOneAPI) on either side is [`Error::BackendUnavailable`] naming it and the
/// move, as the [`PartitionedArray`](crate::PartitionedArray) operations report it.
pub fn to_device(t: &Tensor, device: Device) -> Result<Tensor> {
    let runner = transfer_runner(t.device(), device)?;
    let out = backend_for(device)?.empty(t.shape(), t.dtype())?;
    if one_memory(t.device(), device) {
        let job = BoxCopy::whole(t, &out);
        // SAFETY: `out` was just allocated: it shares no memory with `t`.
        let copied = unsafe { runner.copy_boxes_unchecked(&[job]) };
        waited_for(runner.as_ref(), copied)?;
        return Ok(out);
    }
    runner.transfer(t, &out)?;
    Ok(out)
}

/// The backend that moves data from `here` to `device` for [`to_device`], or the error
/// `to_device` raises before it allocates or copies anything: callers that must write all or
/// nothing check every move with this first.
pub(crate) fn transfer_runner(here: Device, device: Device) -> Result<Arc<dyn Backend>> {
    // Data on a device without dlpart kernels (kDLOneAPI) is copied by its own library only,
    // whichever side of the move it is on: said as such, as the PartitionedArray operations
    // say it, before anything else about the move.
    crate::backend::check_kernels([here, device]).map_err(|e| match e {
        Error::BackendUnavailable { backend, reason } => Error::BackendUnavailable {
            backend,
            reason: format!("{reason} (transfer {here} -> {device})"),
        },
        e => e,
    })?;
    crate::backend::check_present(device)?;
    // New host memory is kDLCPU, or page-locked kDLCUDAHost memory from CUDA; no other kind.
    if device.is_host_accessible() {
        crate::backend::cpu::host_allocator(device)?;
    }
    if one_memory(here, device) {
        let runner = backend_for(here)?;
        backend_for(device)?;
        return Ok(runner);
    }
    let runner = if device.is_host_accessible() {
        here
    } else {
        device
    };
    let backend = backend_for(runner)?;
    backend_for(device)?;
    Ok(backend)
}

/// Whether one backend reads and writes memory on `a` and on `b` alike: the same device, or
/// host memory of any kinds and ids (`kDLCPU`, `kDLCPU:k`, `kDLCUDAHost`, `kDLCUDAManaged`,
/// `kDLROCMHost`), which the CPU backend addresses alike. Data then moves from one to the
/// other by a plain copy rather than a transfer, and a gather or scatter between them runs
/// in place. This is dlpart's one transfer rule: every operation asks for `transfer` for a
/// move between `a` and `b` exactly when this is false, in one process and across ranks.
pub(crate) fn one_memory(a: Device, b: Device) -> bool {
    a == b || (a.is_host_accessible() && b.is_host_accessible())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn arange(shape: &[usize]) -> Tensor {
        let n: usize = shape.iter().product();
        Tensor::from_slice(&(0..n as i32).collect::<Vec<_>>(), shape).unwrap()
    }

    /// An out (gather) or values (scatter) of another dtype is a dtype mismatch naming both,
    /// and nothing is written.
    #[test]
    fn a_gather_or_scatter_of_another_dtype_is_a_dtype_mismatch() {
        let src = arange(&[4, 3]);
        let idx = Tensor::from_slice(&[2i64, 0], &[2]).unwrap();
        let wide = Tensor::zeros(&[2, 3], DType::Int64).unwrap();
        let e = gather(&src, &idx, 0, Some(&wide)).unwrap_err();
        let want = (DType::Int64, DType::Int32);
        let mismatch = |e: &Error| matches!(*e, Error::DTypeMismatch { found, expected, .. } if (found, expected) == want);
        assert!(mismatch(&e), "{e:?}");
        assert_eq!(
            e.to_string(),
            "dtype int64 differs from int32 of the gather's source (out must have its dtype)"
        );
        let e = scatter(&wide, &idx, &src, 0).unwrap_err();
        assert!(mismatch(&e), "{e:?}");
        assert_eq!(
            e.to_string(),
            "dtype int64 differs from int32 of the scatter's out (values must have its dtype)"
        );
        assert_eq!(
            src.to_array::<i32>().unwrap(),
            arange(&[4, 3]).to_array::<i32>().unwrap()
        );
        assert!(wide.to_array::<i64>().unwrap().iter().all(|&v| v == 0));
    }

    #[test]
    fn repartition_rows_to_columns_matches_ndarray() {
        let t = arange(&[6, 4]);
        let src_grid = Grid::even(&[6, 4], &[3, 1]).unwrap();
        let dst_grid = Grid::even(&[6, 4], &[1, 3]).unwrap();
        let src: Vec<Tensor> = (0..3)
            .map(|i| {
                let r = src_grid.region_at(i);
                t.view(&r.start, &r.shape).unwrap()
            })
            .collect();
        let plan = Plan::new(&src_grid, &dst_grid).unwrap();
        let out = repartition(&plan, &src, &[Device::CPU; 3], false).unwrap();
        let whole = t.to_array::<i32>().unwrap();
        for (j, o) in out.iter().enumerate() {
            let r = dst_grid.region_at(j);
            let expect = whole.slice(ndarray::s![.., r.start[1]..r.start[1] + r.shape[1]]);
            assert_eq!(o.to_array::<i32>().unwrap(), expect.into_dyn());
        }
    }

    /// The one transfer rule: a move to or from device memory needs `transfer`, and the error
    /// names the move; a move between host memory of two kinds is a plain copy, which needs
    /// none, into new kDLCPU targets and into the caller's targets of any host kind alike.
    #[test]
    fn crossing_devices_needs_transfer_and_names_them() {
        use crate::DeviceType;
        let t = arange(&[4]);
        let g = Grid::even(&[4], &[1]).unwrap();
        let plan = Plan::new(&g, &g).unwrap();
        let e =
            repartition(&plan, std::slice::from_ref(&t), &[Device::cuda(0)], false).unwrap_err();
        assert!(matches!(e, Error::DeviceMismatch { .. }), "{e}");
        assert!(e.to_string().contains("kDLCPU -> kDLCUDA:0"), "{e}");
        for kind in [
            DeviceType::CudaHost,
            DeviceType::CudaManaged,
            DeviceType::RocmHost,
        ] {
            let device = Device::new(kind, 0).unwrap();
            // SAFETY: host memory labelled as another kind of it, which the CPU reads alike.
            let there = unsafe { t.labelled(device) };
            let out = repartition(&plan, &[there], &[Device::CPU], false).unwrap();
            assert_eq!(out[0].device(), Device::CPU);
            assert_eq!(values_of(&out[0]), vec![0, 1, 2, 3], "{device}");
            let backing = Tensor::zeros(&[4], DType::Int32).unwrap();
            // SAFETY: as above; the CPU writes it alike.
            let target = unsafe { backing.labelled(device) };
            repartition_into(&plan, std::slice::from_ref(&t), &[target], false).unwrap();
            assert_eq!(values_of(&backing), vec![0, 1, 2, 3], "{device}");
        }
    }

    #[test]
    fn to_device_picks_the_backend_of_the_device_side() {
        let t = arange(&[2, 3]);
        // kDLCUDA goes to the cuda backend: the stub without the `cuda` feature.
        match to_device(&t, Device::cuda(0)) {
            Ok(c) => assert_eq!(c.device(), Device::cuda(0)),
            Err(Error::BackendUnavailable {
                backend: "cuda", ..
            }) => {}
            other => panic!("expected a copy on kDLCUDA:0 or no cuda backend: {other:?}"),
        }
        // New pinned memory is CUDA's (where CUDA is), managed memory dlpart never makes.
        let pinned: Device = "kDLCUDAHost".parse().unwrap();
        match to_device(&t, pinned) {
            Ok(c) => assert_eq!(c.device(), pinned),
            Err(e) => assert!(e.to_string().contains("new kDLCUDAHost memory"), "{e}"),
        }
        let managed: Device = "kDLCUDAManaged".parse().unwrap();
        let e = to_device(&t, managed).unwrap_err().to_string();
        assert!(e.contains("kDLCUDAManaged"), "{e}");
        let same = to_device(&t.view(&[0, 1], &[2, 2]).unwrap(), Device::CPU).unwrap();
        assert!(same.is_contiguous());
        assert_eq!(
            same.to_array::<i32>().unwrap().into_raw_vec_and_offset().0,
            vec![1, 2, 4, 5]
        );
    }

    /// Data on a device without dlpart kernels (kDLOneAPI) is BackendUnavailable naming the
    /// device wherever a transfer, gather or scatter meets it, as the PartitionedArray
    /// operations report it: only its own library can copy it, so no other advice applies.
    #[test]
    fn a_device_without_kernels_is_backend_unavailable_on_every_path() {
        let one_api: Device = "kDLOneAPI:0".parse().unwrap();
        let unavailable = |e: Error, what: &str| {
            assert!(
                matches!(
                    e,
                    Error::BackendUnavailable {
                        backend: "kDLOneAPI",
                        ..
                    }
                ),
                "{what}: {e:?}"
            );
            assert!(
                e.to_string().contains("no kernels for kDLOneAPI:0"),
                "{what}: {e}"
            );
        };
        let host = arange(&[2, 3]);
        let backing = arange(&[2, 3]);
        // SAFETY: never read or written under this label: every path refuses it first.
        let there = unsafe { backing.labelled(one_api) };
        for (from, to) in [(&host, one_api), (&there, Device::CPU)] {
            let e = to_device(from, to).unwrap_err();
            let moved = format!("transfer {} -> {to}", from.device());
            assert!(e.to_string().contains(&moved), "{e}");
            unavailable(e, "to_device");
        }
        let rows = Tensor::from_slice(&[1i64], &[1]).unwrap();
        let row = Tensor::zeros(&[1, 3], DType::Int32).unwrap();
        unavailable(
            gather(
                &host,
                &rows,
                0,
                Some(&there.view(&[0, 0], &[1, 3]).unwrap()),
            )
            .unwrap_err(),
            "gather into out there",
        );
        unavailable(
            scatter(&there.view(&[0, 0], &[1, 3]).unwrap(), &rows, &host, 0).unwrap_err(),
            "scatter of values there",
        );
        // SAFETY: as above.
        let rows_there = unsafe { rows.labelled(one_api) };
        unavailable(
            gather(&host, &rows_there, 0, Some(&row)).unwrap_err(),
            "gather by indices there",
        );
        unavailable(
            scatter(&row, &rows_there, &host, 0).unwrap_err(),
            "scatter by indices there",
        );
        unavailable(
            crate::PreparedGather::new(
                &host,
                &rows,
                0,
                Some(&there.view(&[0, 0], &[1, 3]).unwrap()),
            )
            .unwrap_err(),
            "prepared gather",
        );
        assert_eq!(values_of(&host), (0..6).collect::<Vec<_>>());
        assert_eq!(values_of(&backing), (0..6).collect::<Vec<_>>());
        assert_eq!(values_of(&row), vec![0; 3]);
    }

    /// Values of another shape are broadcast to the one written, as numpy's fancy assignment
    /// broadcasts them (`out[[3, 0]] = v` in numpy, written out by hand below); values that do
    /// not broadcast are refused, and nothing is written.
    #[test]
    fn scatter_values_broadcast_as_numpys_fancy_assignment() {
        use crate::PreparedScatter;
        let rows = Tensor::from_slice(&[3i64, 0], &[2]).unwrap();
        let v = |vals: &[i32], shape: &[usize]| Tensor::from_slice(vals, shape).unwrap();
        let untouched: Vec<i32> = (0..12).collect();
        let with = |row0: [i32; 3], row3: [i32; 3]| {
            let mut w = untouched.clone();
            w[..3].copy_from_slice(&row0);
            w[9..].copy_from_slice(&row3);
            w
        };
        let cases = [
            (v(&[-1], &[]), with([-1; 3], [-1; 3])),
            (v(&[-1, -2, -3], &[3]), with([-1, -2, -3], [-1, -2, -3])),
            // One value per index: row 3 gets -1, row 0 gets -2.
            (v(&[-1, -2], &[2, 1]), with([-2; 3], [-1; 3])),
            // Leading axes of extent 1 are dropped.
            (
                v(&[-1, -2, -3], &[1, 1, 3]),
                with([-1, -2, -3], [-1, -2, -3]),
            ),
            (v(&[-5], &[1, 1]), with([-5; 3], [-5; 3])),
        ];
        for (values, want) in &cases {
            let out = arange(&[4, 3]);
            scatter(values, &rows, &out, 0).unwrap();
            assert_eq!(&values_of(&out), want, "{values:?}");
            let out = arange(&[4, 3]);
            PreparedScatter::new(values, &rows, &out, 0)
                .unwrap()
                .run()
                .unwrap();
            assert_eq!(&values_of(&out), want, "prepared {values:?}");
        }
        // One index writes a row: a 0-d value fills it.
        let out = arange(&[4, 3]);
        let one = Tensor::from_slice(&[1i64], &[]).unwrap();
        scatter(&v(&[-9], &[]), &one, &out, 0).unwrap();
        assert_eq!(
            values_of(&out),
            vec![0, 1, 2, -9, -9, -9, 6, 7, 8, 9, 10, 11]
        );
        // No broadcast: numpy refuses these too.
        let out = arange(&[4, 3]);
        for values in [
            v(&[1, 2], &[2]),
            v(&[1, 2, 3, 4], &[2, 2]),
            v(&[0; 12], &[2, 2, 3]),
            v(&[], &[0, 3]),
        ] {
            let e = scatter(&values, &rows, &out, 0).unwrap_err().to_string();
            assert!(
                e.starts_with(
                    "values must have shape (2, 3) and dtype int32 (or values that broadcast \
                     to it, as in numpy)"
                ),
                "{e}"
            );
            assert!(PreparedScatter::new(&values, &rows, &out, 0).is_err());
        }
        assert_eq!(values_of(&out), untouched);
    }

    #[test]
    fn bad_indices_write_nothing_and_duplicates_keep_the_last() {
        let src = arange(&[5]);
        let out = Tensor::from_slice(&[-1i32; 3], &[3]).unwrap();
        let bad = Tensor::from_slice(&[1i64, -6, 2], &[3]).unwrap();
        let e = gather(&src, &bad, 0, Some(&out)).unwrap_err();
        assert!(matches!(e, Error::IndexOutOfRange { index: -6, .. }), "{e}");
        let e = scatter(&arange(&[3]), &bad, &src, 0).unwrap_err();
        assert!(matches!(e, Error::IndexOutOfRange { index: -6, .. }), "{e}");
        assert_eq!(
            out.to_array::<i32>().unwrap().as_slice(),
            Some(&[-1; 3][..])
        );
        assert_eq!(
            src.to_array::<i32>().unwrap().as_slice(),
            Some(&[0, 1, 2, 3, 4][..])
        );
        let dups = Tensor::from_slice(&[-1i64, 4, 0], &[3]).unwrap();
        scatter(&arange(&[3]), &dups, &src, 0).unwrap();
        assert_eq!(
            src.to_array::<i32>().unwrap().as_slice(),
            Some(&[2, 1, 2, 3, 1][..])
        );
    }

    fn values_of(t: &Tensor) -> Vec<i32> {
        t.to_array::<i32>().unwrap().into_raw_vec_and_offset().0
    }

    #[test]
    fn gather_and_scatter_run_in_place_between_host_kinds() {
        use crate::{DeviceType, PreparedGather, PreparedScatter};
        let rows = |v: &[i64]| Tensor::from_slice(v, &[v.len()]).unwrap();
        for kind in [
            DeviceType::CudaHost,
            DeviceType::CudaManaged,
            DeviceType::RocmHost,
        ] {
            let device = Device::new(kind, 0).unwrap();
            let backing = arange(&[4, 3]);
            // SAFETY: host memory of another kind, which the CPU reads and writes alike.
            let there = unsafe { backing.labelled(device) };
            let values = Tensor::from_slice(&[-1i32, -2, -3], &[1, 3]).unwrap();
            scatter(&values, rows(&[2]), &there, 0).unwrap();
            let mut want: Vec<i32> = (0..12).collect();
            want[6..9].copy_from_slice(&[-1, -2, -3]);
            assert_eq!(values_of(&backing), want, "{device}");
            let out = Tensor::zeros(&[2, 3], DType::Int32).unwrap();
            let got = gather(&there, rows(&[3, -2]), 0, Some(&out)).unwrap();
            assert_eq!(got.device(), Device::CPU);
            assert_eq!(values_of(&out), vec![9, 10, 11, -1, -2, -3], "{device}");
            // Prepared: the same checks, the same copies.
            PreparedScatter::new(&values, rows(&[0]), &there, 0)
                .unwrap()
                .run()
                .unwrap();
            PreparedGather::new(&there, rows(&[0, 3]), 0, Some(&out))
                .unwrap()
                .run()
                .unwrap();
            assert_eq!(values_of(&out), vec![-1, -2, -3, 9, 10, 11], "{device}");
        }
    }

    /// dlpart makes no managed or ROCm host memory: a gather from it without `out` puts the
    /// result in kDLCPU memory, as numpy.take of such memory gives an ordinary host array.
    #[test]
    fn a_gather_from_managed_or_rocm_host_memory_without_out_lands_in_kdlcpu_memory() {
        use crate::{DeviceType, PreparedGather};
        let rows = Tensor::from_slice(&[3i64, -4, 1], &[3]).unwrap();
        let one = Tensor::from_slice(&[-2i64], &[]).unwrap();
        for kind in [DeviceType::CudaManaged, DeviceType::RocmHost] {
            let device = Device::new(kind, 0).unwrap();
            let backing = arange(&[4, 3]);
            // SAFETY: host memory of another kind, which the CPU reads and writes alike.
            let there = unsafe { backing.labelled(device) };
            // numpy.take(arange(12).reshape(4, 3), [3, -4, 1], 0)
            let got = gather(&there, &rows, 0, None).unwrap();
            assert_eq!(
                (got.device(), got.shape()),
                (Device::CPU, &[3, 3][..]),
                "{device}"
            );
            assert_eq!(
                values_of(&got),
                vec![9, 10, 11, 0, 1, 2, 3, 4, 5],
                "{device}"
            );
            // One index drops the axis: numpy.take(.., -2, 1) == [1, 4, 7, 10].
            let col = gather(&there, &one, 1, None).unwrap();
            assert_eq!(
                (col.device(), col.shape()),
                (Device::CPU, &[4][..]),
                "{device}"
            );
            assert_eq!(values_of(&col), vec![1, 4, 7, 10], "{device}");
            let g = PreparedGather::new(&there, &rows, 0, None).unwrap();
            g.run().unwrap();
            assert_eq!(g.out().device(), Device::CPU, "{device}");
            assert_eq!(values_of(g.out()), values_of(&got), "{device}");
            assert_eq!(values_of(&backing), (0..12).collect::<Vec<_>>());
        }
    }

    #[test]
    fn gather_and_scatter_between_host_and_device_memory_name_the_devices() {
        let rows = Tensor::from_slice(&[1i64], &[1]).unwrap();
        let host = arange(&[2, 3]);
        let block = Tensor::from_slice(&[-1i32; 3], &[1, 3]).unwrap();
        // SAFETY: never read or written: the devices are refused first.
        let on_gpu = unsafe { block.labelled(Device::cuda(0)) };
        let e = gather(&host, &rows, 0, Some(&on_gpu)).unwrap_err();
        assert!(matches!(e, Error::DeviceMismatch { .. }), "{e}");
        assert!(e.to_string().contains("kDLCPU -> kDLCUDA:0"), "{e}");
        let e = scatter(&on_gpu, &rows, &host, 0).unwrap_err();
        assert!(matches!(e, Error::DeviceMismatch { .. }), "{e}");
        assert!(e.to_string().contains("kDLCUDA:0 -> kDLCPU"), "{e}");
        assert_eq!(values_of(&host), (0..6).collect::<Vec<_>>());
        assert_eq!(values_of(&block), vec![-1; 3]);
    }

    #[test]
    fn one_index_drops_the_axis_as_numpy_does() {
        use crate::{PreparedGather, PreparedScatter};
        let src = arange(&[4, 3]);
        let one = |i: i64| Tensor::from_slice(&[i], &[]).unwrap();
        // numpy.take(arange(12).reshape(4, 3), 2, 0) == [6, 7, 8]; (-1, axis 1) == [2, 5, 8, 11]
        let row = gather(&src, one(2), 0, None).unwrap();
        assert_eq!(row.shape(), &[3]);
        assert_eq!(values_of(&row), vec![6, 7, 8]);
        let col = Tensor::zeros(&[4], DType::Int32).unwrap();
        let got = gather(&src, one(-1), 1, Some(&col)).unwrap();
        assert_eq!((got.shape(), got.data_ptr()), (&[4][..], col.data_ptr()));
        assert_eq!(values_of(&col), vec![2, 5, 8, 11]);
        // An out with the axis kept is the wrong shape, as numpy's `out=` would be.
        let kept = Tensor::zeros(&[4, 1], DType::Int32).unwrap();
        let e = gather(&src, one(0), 1, Some(&kept))
            .unwrap_err()
            .to_string();
        assert!(e.contains("out must have shape (4,)"), "{e}");
        // Scatter: out[:, 1] = values, values without the axis.
        let out = arange(&[4, 3]);
        let values = Tensor::from_slice(&[-1i32, -2, -3, -4], &[4]).unwrap();
        scatter(&values, one(1), &out, 1).unwrap();
        assert_eq!(
            values_of(&out),
            vec![0, -1, 2, 3, -2, 5, 6, -3, 8, 9, -4, 11]
        );
        let e = scatter(&values.with_unit_axis(1), one(1), &out, 1).unwrap_err();
        assert!(e.to_string().contains("values must have shape (4,)"), "{e}");
        let e = gather(&src, one(4), 0, None).unwrap_err();
        assert!(matches!(e, Error::IndexOutOfRange { index: 4, .. }), "{e}");
        // Prepared: the caller's shapes, the same copies.
        let g = PreparedGather::new(&src, one(-4), 0, None).unwrap();
        g.run().unwrap();
        assert_eq!((g.out().shape(), g.num_indices()), (&[3][..], 1));
        assert_eq!(values_of(g.out()), vec![0, 1, 2]);
        let s = PreparedScatter::new(g.out(), one(3), &out, 0).unwrap();
        assert_eq!(s.values().shape(), &[3]);
        s.run().unwrap();
        assert_eq!(values_of(&out)[9..], [0, 1, 2]);
        assert!(format!("{g:?}").contains("out: Tensor(shape=(3,)"), "{g:?}");
        // Indices of more axes: refused by name, before anything is written.
        let square = Tensor::from_slice(&[0i64, 1, 2, 3], &[2, 2]).unwrap();
        let e = gather(&src, &square, 0, None).unwrap_err().to_string();
        assert!(
            e.contains("not supported") && e.ends_with("shape (2, 2)"),
            "{e}"
        );
        assert!(scatter(&src, &square, &out, 0).is_err());
        assert!(PreparedGather::new(&src, &square, 0, None).is_err());
    }

    #[test]
    fn out_of_range_index_is_refused_naming_it() {
        let idx = Tensor::from_slice(&[0i64, -3, 3], &[3]).unwrap();
        let e = normalise_indices(&idx, 0, 3).unwrap_err();
        assert_eq!(
            e.to_string(),
            "index 3 is out of bounds for axis 0 with size 3"
        );
        let ok = normalise_indices(Tensor::from_slice(&[-1i32, 0], &[2]).unwrap(), 1, 5).unwrap();
        assert_eq!(
            ok.to_array::<i64>().unwrap().into_raw_vec_and_offset().0,
            vec![4, 0]
        );
        // Non-integer indices are refused when there are none too.
        for n in [2, 0] {
            let floats = Tensor::zeros(&[n], DType::Float32).unwrap();
            let e = normalise_indices(&floats, 0, 5).unwrap_err();
            assert!(
                matches!(
                    e,
                    Error::IndexDType {
                        found: DType::Float32
                    }
                ),
                "{e:?}"
            );
            assert_eq!(
                e.to_string(),
                "indices must be integers, found dtype float32"
            );
        }
    }
}
