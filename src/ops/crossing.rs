//! The copies of a repartition between memories that are not one ([`one_memory`]):
//! `kDLCUDA:0` partitions into `kDLCPU` targets, host partitions into `kDLCUDA:1` targets,
//! one GPU's partitions into another's, which run only with `transfer = true`.
//!
//! Only what the plan copies crosses, and in one transfer per (source device, target device)
//! pair: the source side's kernels pack the pair's boxes one after the other into one
//! contiguous buffer, [`Backend::transfer`] moves the buffer (the bus then carries the
//! contiguous bytes the targets need, never a whole partition of which a target wants one
//! column), and the target side's kernels unpack it into the target boxes, together with the
//! copies that stay within one memory. The host side of a pair is staging memory of the
//! pair's CUDA device as [`staging_buffer`] decides it: pinned up to [`pinned_cache_limit`]
//! (256 MiB by default) and when it can be had, ordinary `kDLCPU` memory otherwise.
//!
//! Every buffer of every pair is allocated, every pair packed and every buffer moved before
//! any target is written: an allocation or a transfer that fails leaves the targets as they
//! were. The bytes that cross are held twice while they move, once on each side.

use std::collections::BTreeMap;

use super::{backend_of, one_memory, waited_for, Backends};
#[cfg(doc)]
use crate::backend::{cuda::pinned_cache_limit, staging_buffer};
use crate::backend::{staging_buffer_within, Backend, BoxCopy};
use crate::device::Device;
use crate::dtype::DType;
use crate::error::Result;
use crate::plan::{self, Plan};
use crate::tensor::Tensor;

/// The device whose backend copies from memory on `a` into memory on `b`, one memory: the
/// device itself, or the CPU between host memory of two kinds.
pub(super) fn executor(a: Device, b: Device) -> Device {
    if a == b {
        a
    } else {
        Device::CPU
    }
}

/// The plan's copies between one (source device, target device) pair that is not one memory.
struct Pair {
    from: Device,
    to: Device,
    /// The copies, in the order their boxes lie in the buffers.
    ops: Vec<plan::BoxCopy>,
    /// Their elements in all.
    numel: usize,
}

/// The copies of a plan that cross devices, grouped by device pair.
pub(super) struct Crossings {
    pairs: Vec<Pair>,
    /// The most bytes the host side of a pair takes in pinned staging memory.
    pinned_max: usize,
}

impl Crossings {
    /// The copies of `plan` from `src` into `dst` between devices that are not one memory;
    /// none when every copy stays within one memory. Each copy that does is handed to
    /// `within`, in the plan's order, in the same walk over the plan.
    pub(super) fn of(
        plan: &Plan,
        src: &[&Tensor],
        dst: &[&Tensor],
        mut within: impl FnMut(&plan::BoxCopy),
    ) -> Self {
        let mut pairs: BTreeMap<(Device, Device), Pair> = BTreeMap::new();
        plan.ops().visit(|op| {
            let (from, to) = (src[op.src].device(), dst[op.dst].device());
            match one_memory(from, to) {
                true => within(op),
                false => add(&mut pairs, from, to, op),
            }
        });
        Crossings::with(pairs)
    }

    /// The copies `ops` (a part of a plan: its copy `op` reads `src(op.src)` and writes a
    /// tensor on `dst(op.dst)`), every one of which crosses between devices that are not one
    /// memory, grouped by device pair as [`Crossings::of`] groups a plan's.
    pub(super) fn of_boxes<'a>(
        ops: impl IntoIterator<Item = &'a plan::BoxCopy>,
        src: impl Fn(usize) -> Device,
        dst: impl Fn(usize) -> Device,
    ) -> Self {
        let mut pairs: BTreeMap<(Device, Device), Pair> = BTreeMap::new();
        for op in ops {
            let (from, to) = (src(op.src), dst(op.dst));
            debug_assert!(!one_memory(from, to), "{from} -> {to} is no crossing");
            add(&mut pairs, from, to, op);
        }
        Crossings::with(pairs)
    }

    fn with(pairs: BTreeMap<(Device, Device), Pair>) -> Self {
        Crossings {
            pairs: pairs.into_values().collect(),
            pinned_max: crate::backend::cuda::pinned_cache_limit(),
        }
    }

    /// The same crossings with the host side of a pair of more than `bytes` bytes in
    /// ordinary host memory (tests: the cache limit is read once per process).
    #[cfg(all(test, feature = "kernel-host-tests"))]
    pub(super) fn pinned_up_to(self, bytes: usize) -> Self {
        Crossings {
            pinned_max: bytes,
            ..self
        }
    }

    /// A buffer of `numel` elements on the host side of a pair whose other side is
    /// `device_side`: [`staging_buffer`]'s, with `pinned_max` as its limit.
    fn host_side(&self, device_side: &dyn Backend, numel: usize, dtype: DType) -> Result<Tensor> {
        staging_buffer_within(device_side, &[numel], dtype, self.pinned_max)
    }

    /// Allocates both buffers of every pair, packs each pair's boxes into the buffer on its
    /// source side and moves it to the one on its target side. Returns each box as it arrived
    /// (a view of a target-side buffer) with its copy, for the target side's kernels to
    /// unpack; none, and nothing looked up or allocated, when no copy crosses. Writes no
    /// target.
    pub(super) fn send<'p, 's>(
        &'p self,
        src: impl Fn(usize) -> &'s Tensor,
        backends: &Backends,
    ) -> Result<Vec<(Tensor, &'p plan::BoxCopy)>> {
        let first = self.pairs.iter().flat_map(|p| p.ops.first()).next();
        let Some(dtype) = first.map(|op| src(op.src).dtype()) else {
            return Ok(Vec::new());
        };
        let mut buffers = Vec::with_capacity(self.pairs.len());
        for p in &self.pairs {
            let (from, to) = (backend_of(backends, p.from)?, backend_of(backends, p.to)?);
            let packed = match p.from.is_host_accessible() {
                true => self.host_side(to.as_ref(), p.numel, dtype)?,
                false => from.empty(&[p.numel], dtype)?,
            };
            let arrived = match p.to.is_host_accessible() {
                true => self.host_side(from.as_ref(), p.numel, dtype)?,
                false => to.empty(&[p.numel], dtype)?,
            };
            buffers.push((packed, arrived));
        }
        let views: Vec<Vec<Tensor>> = (self.pairs.iter().zip(&buffers))
            .map(|(p, (packed, _))| boxes_of(p, packed).collect())
            .collect();
        let mut packs: BTreeMap<Device, Vec<BoxCopy<'_>>> = BTreeMap::new();
        for (p, views) in self.pairs.iter().zip(&views) {
            for (op, view) in p.ops.iter().zip(views) {
                let s = src(op.src);
                packs
                    .entry(executor(s.device(), view.device()))
                    .or_default()
                    .push(BoxCopy {
                        src: s,
                        src_start: op.src_start.clone(),
                        dst: view,
                        dst_start: vec![0; op.shape.len()],
                        shape: op.shape.clone(),
                    });
            }
        }
        for (&dev, jobs) in &packs {
            let backend = backend_of(backends, dev)?;
            // SAFETY: each box is written into a byte range of its own of a buffer allocated
            // just above, which shares no memory with any source.
            let packed = unsafe { backend.copy_boxes_unchecked(jobs) };
            waited_for(backend.as_ref(), packed)?;
        }
        // The transfer runs on the pair's device side: the target's, unless it is host
        // memory (as `to_device` picks it). It returns once the bytes have arrived.
        for (p, (packed, arrived)) in self.pairs.iter().zip(&buffers) {
            let runner = match p.to.is_host_accessible() {
                true => p.from,
                false => p.to,
            };
            backend_of(backends, runner)?.transfer(packed, arrived)?;
        }
        let mut out = Vec::with_capacity(self.pairs.iter().map(|p| p.ops.len()).sum());
        for (p, (_, arrived)) in self.pairs.iter().zip(&buffers) {
            out.extend(boxes_of(p, arrived).zip(&p.ops));
        }
        Ok(out)
    }
}

/// Adds the copy `op` from `from` to `to` to its pair's.
fn add(pairs: &mut BTreeMap<(Device, Device), Pair>, from: Device, to: Device, op: &plan::BoxCopy) {
    let pair = pairs.entry((from, to)).or_insert_with(|| Pair {
        from,
        to,
        ops: Vec::new(),
        numel: 0,
    });
    pair.numel += op.numel();
    pair.ops.push(op.clone());
}

/// Each of `pair`'s boxes as a view of `buf`, one after the other in the order of its copies.
fn boxes_of<'a>(pair: &'a Pair, buf: &'a Tensor) -> impl Iterator<Item = Tensor> + 'a {
    buf.box_views(0, pair.ops.iter().map(|op| &op.shape))
}

#[cfg(all(test, feature = "kernel-host-tests"))]
#[path = "crossing_tests.rs"]
mod tests;
