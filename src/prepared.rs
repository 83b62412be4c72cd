//! Prepared gathers and scatters: checked once, run again and again.
//!
//! A halo exchange or a time-step loop copies the same faces between the same buffers at every
//! step. [`ops::gather`](crate::ops::gather) and [`ops::scatter`](crate::ops::scatter) check
//! their operands on every call, and the Python bindings import every operand through DLPack
//! on every call, which costs more than a small copy. A prepared operation does all of that
//! once, when it is made, and keeps what a run needs: the tensors themselves and the indices,
//! read once into dlpart's own memory and checked there. These are the persistent operations
//! of HPC libraries for indexing (MPI's `MPI_Send_init`, the plans of FFTW and cuFFT); the
//! name *plan* stays with [`crate::Plan`], the box copies between two grids.
//!
//! A run still does what the backend's own entry point does for safety (devices, dtypes and
//! shapes compared, every index checked again as the kernel reads it): a few comparisons and
//! no DLPack import, index copy or allocation of the output.

use std::fmt;
use std::sync::Arc;

use crate::backend::{backend_for, Backend};
use crate::device::Device;
use crate::error::{Devices, Error, Result};
use crate::indices::AsIndices;
use crate::ops::{check_axis, gather_operands, index_list, one_index_out, scatter_operands};
use crate::tensor::Tensor;

/// `out[.., i, ..] = src[.., indices[i], ..]` along `axis`, as [`ops::gather`](crate::ops::gather),
/// checked once and run as often as wanted.
///
/// It holds `src` and `out` (the same memory: for an imported tensor, the producer's export
/// stays alive until the prepared gather and every other view of it are dropped, and its
/// deleter then runs once), the indices as dlpart's own int64 copy on `src`'s device,
/// normalised to `[0, len)`, and the backend that runs the copy. The data of `src` may
/// change between runs, and each run copies what is there then; shapes, strides and
/// indices are fixed. `out` may not share memory with `src` (each run would have to copy
/// `src` aside first, which [`ops::gather`](crate::ops::gather) does, per call).
///
/// ```
/// use dlpart::{PreparedGather, PreparedScatter, Tensor};
/// use ndarray::{Array2, Axis};
///
/// // Rows 0 and 5 of the field are ghost rows; each step refreshes them periodically from
/// // the interior rows next to the opposite boundary (4 and 1), through a (2, 4) buffer.
/// let field = Tensor::from(Array2::from_shape_fn((6, 4), |(i, j)| (10 * i + j) as f32));
/// let pack = PreparedGather::new(&field, [4, 1], 0, None)?;
/// let unpack = PreparedScatter::new(pack.out(), [0, -1], &field, 0)?;
/// for _step in 0..3 {
///     // ... a stencil updates rows 1 to 4 of `field` here ...
///     pack.run()?;
///     unpack.run()?;
/// }
/// let f = field.as_array::<f32>()?;
/// assert_eq!(f.index_axis(Axis(0), 0), f.index_axis(Axis(0), 4));
/// assert_eq!(f.index_axis(Axis(0), 5), f.index_axis(Axis(0), 1));
/// # Ok::<(), dlpart::Error>(())
/// ```
pub struct PreparedGather {
    op: Operands,
    /// The output as the caller sees it: `op.out` itself, or for one index (0-d indices)
    /// `op.out` without the axis of extent 1 the kernels write.
    out: Tensor,
}

impl PreparedGather {
    /// Checks a gather as [`ops::gather`](crate::ops::gather) does, with the same errors,
    /// and keeps it ready to run. `out` is allocated when not given where
    /// [`ops::gather`](crate::ops::gather) allocates it: on `src`'s device, or in `kDLCPU`
    /// memory for a source in managed or ROCm host memory. An `out` that shares memory with
    /// `src`, or refers to an element more than once, is [`Error::Buffer`]. `indices` takes
    /// any of the forms of [`AsIndices`] (a [`Tensor`], a slice, `Vec` or array of integers,
    /// an ndarray array or view, one integer), and is copied once into the prepared gather,
    /// so the caller's may change or go afterwards.
    pub fn new(
        src: &Tensor,
        indices: impl AsIndices,
        axis: usize,
        out: Option<&Tensor>,
    ) -> Result<Self> {
        check_axis(src, axis, "source")?;
        let backend = backend_for(crate::backend::result_device(src.device()))?;
        Self::on(backend, src, indices, axis, out)
    }

    /// [`PreparedGather::new`] on a given backend of `src`'s device (`new` takes the one
    /// [`backend_for`] gives), for backends that `backend_for` does not hand out.
    pub fn on(
        backend: Arc<dyn Backend>,
        src: &Tensor,
        indices: impl AsIndices,
        axis: usize,
        out: Option<&Tensor>,
    ) -> Result<Self> {
        check_axis(src, axis, "source")?;
        check_backend(backend.as_ref(), src.device(), "gather")?;
        let indices = indices.index_tensor()?;
        let (list, one) = index_list(&indices)?;
        // One index drops the axis, as in numpy: the kernels write a slab of one.
        let shown = match one {
            true => Some(one_index_out(backend.as_ref(), src, axis, out)?),
            false => None,
        };
        let slab = shown.as_ref().map(|o| o.with_unit_axis(axis));
        let (indices, new_out) =
            gather_operands(backend.as_ref(), src, &list, axis, slab.as_ref().or(out))?;
        // The caller's `out` named in errors, not the slab of one made of it.
        if let Some(out) = out {
            check_apart(src, out, "source")?;
        }
        let out = shown.unwrap_or_else(|| new_out.clone());
        let op = Operands {
            backend,
            read: src.clone(),
            indices,
            axis,
            out: new_out,
        };
        Ok(PreparedGather { op, out })
    }

    /// Copies the selected slices of the source into `out`, and returns when they are there.
    pub fn run(&self) -> Result<()> {
        let op = &self.op;
        op.backend.gather(&op.read, &op.indices, op.axis, &op.out)?;
        op.backend.synchronize()
    }

    /// The tensor the slices are gathered from.
    pub fn src(&self) -> &Tensor {
        &self.op.read
    }

    /// The tensor each run writes: the caller's, or the one allocated when none was given.
    pub fn out(&self) -> &Tensor {
        &self.out
    }

    /// The axis along which slices are selected (non-negative).
    pub fn axis(&self) -> usize {
        self.op.axis
    }

    /// The number of indices, which is `out`'s extent along the axis (1 for one index, which
    /// drops the axis).
    pub fn num_indices(&self) -> usize {
        self.op.num_indices()
    }
}

impl fmt::Debug for PreparedGather {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.op
            .debug(f, "PreparedGather", ("src", &self.op.read), &self.out)
    }
}

/// `out[.., indices[i], ..] = values[.., i, ..]` along `axis`, as
/// [`ops::scatter`](crate::ops::scatter) (the last of duplicate indices wins), checked once
/// and run as often as wanted.
///
/// It holds `values` and `out` (the same memory, kept alive as by [`PreparedGather`]), the
/// indices as dlpart's own int64 copy on `out`'s device, normalised to `[0, len)`, and the
/// backend. The data of `values` may change between runs; shapes and indices are fixed.
/// `values` may not share memory with `out`. See [`PreparedGather`] for an example.
pub struct PreparedScatter {
    op: Operands,
    /// The values as the caller gave them: `op.read` itself, or for one index (0-d indices)
    /// `op.read` without the axis of extent 1 the kernels read.
    values: Tensor,
}

impl PreparedScatter {
    /// Checks a scatter as [`ops::scatter`](crate::ops::scatter) does, with the same errors,
    /// and keeps it ready to run. `values` sharing memory with `out`, or an `out` that refers
    /// to an element more than once, is [`Error::Buffer`]. `indices` takes any of the forms of
    /// [`AsIndices`], as for [`PreparedGather::new`].
    pub fn new(
        values: &Tensor,
        indices: impl AsIndices,
        out: &Tensor,
        axis: usize,
    ) -> Result<Self> {
        check_axis(out, axis, "output")?;
        Self::on(backend_for(out.device())?, values, indices, out, axis)
    }

    /// [`PreparedScatter::new`] on a given backend of `out`'s device (`new` takes the one
    /// [`backend_for`] gives), for backends that `backend_for` does not hand out.
    pub fn on(
        backend: Arc<dyn Backend>,
        values: &Tensor,
        indices: impl AsIndices,
        out: &Tensor,
        axis: usize,
    ) -> Result<Self> {
        check_axis(out, axis, "output")?;
        check_backend(backend.as_ref(), out.device(), "scatter")?;
        let indices = indices.index_tensor()?;
        let (indices, read) = scatter_operands(backend.as_ref(), values, &indices, out, axis)?;
        check_apart(values, out, "values")?;
        let op = Operands {
            backend,
            read,
            indices,
            axis,
            out: out.clone(),
        };
        Ok(PreparedScatter {
            op,
            values: values.clone(),
        })
    }

    /// Copies the values into the selected slices of `out`, and returns when they are there.
    pub fn run(&self) -> Result<()> {
        let op = &self.op;
        op.backend
            .scatter(&op.read, &op.indices, op.axis, &op.out)?;
        op.backend.synchronize()
    }

    /// The tensor whose slices are copied out.
    pub fn values(&self) -> &Tensor {
        &self.values
    }

    /// The tensor each run writes into.
    pub fn out(&self) -> &Tensor {
        &self.op.out
    }

    /// The axis along which slices are selected (non-negative).
    pub fn axis(&self) -> usize {
        self.op.axis
    }

    /// The number of indices, which is `values`'s extent along the axis once broadcast (1
    /// for one index, which drops the axis).
    pub fn num_indices(&self) -> usize {
        self.op.num_indices()
    }
}

impl fmt::Debug for PreparedScatter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.op
            .debug(f, "PreparedScatter", ("values", &self.values), &self.op.out)
    }
}

/// What a prepared gather and a prepared scatter both keep: the backend that runs the copy,
/// the tensor each run reads (a gather's source, a scatter's values), the checked indices,
/// the axis and the tensor each run writes.
struct Operands {
    backend: Arc<dyn Backend>,
    read: Tensor,
    indices: Tensor,
    axis: usize,
    out: Tensor,
}

impl Operands {
    fn num_indices(&self) -> usize {
        self.indices.shape()[0]
    }

    /// The `Debug` form of the prepared operation `name`, with the tensors as the caller
    /// sees them: `read`, named `label`, and `out`.
    fn debug(
        &self,
        f: &mut fmt::Formatter<'_>,
        name: &str,
        (label, read): (&str, &Tensor),
        out: &Tensor,
    ) -> fmt::Result {
        f.debug_struct(name)
            .field("axis", &self.axis)
            .field("indices", &self.num_indices())
            .field(label, read)
            .field("out", out)
            .finish()
    }
}

/// Refuses a backend that does not run on `device` (host memory is one place for the CPU).
fn check_backend(backend: &dyn Backend, device: Device, op: &str) -> Result<()> {
    let here = backend.device();
    if crate::ops::one_memory(here, device) {
        return Ok(());
    }
    Err(Error::DeviceMismatch {
        op: op.into(),
        devices: Devices::move_(device, here),
        reason: format!("the tensors are not on the backend's device {here}"),
    })
}

/// Refuses an `out` whose elements overlap each other or `other`: every run reads `other`
/// while it writes `out`, from several threads.
fn check_apart(other: &Tensor, out: &Tensor, what: &str) -> Result<()> {
    if let Some(s) = crate::overlap::covers_an_element_twice(out) {
        return Err(Error::buffer(format!(
            "out {out:?} {}: its copies would race",
            s.more_than_once()
        )));
    }
    if crate::overlap::shares_memory(other, out) {
        return Err(Error::buffer(format!(
            "out {out:?} shares memory with the {what} {other:?}: a prepared operation \
             reads one while it writes the other; pass tensors that do not overlap"
        )));
    }
    Ok(())
}

#[cfg(test)]
#[path = "prepared_tests.rs"]
mod tests;
