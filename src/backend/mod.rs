//! Device backends: the kernels that move bytes on the device where they already are.
//!
//! Every backend implements [`Backend`]. [`backend_for`] picks the one for a device: the CPU
//! backend for host-accessible memory, the CUDA backend for `kDLCUDA` (feature `cuda`; without
//! it a stub with the same API returns [`Error::BackendUnavailable`]). Callers (the `ops` layer)
//! validate arguments first; backends may assume shapes fit, boxes are in bounds, indices are
//! normalised to `[0, len)`, and the destination is writable.

pub mod cpu;
#[cfg(feature = "cuda")]
pub mod cuda;
// Without the feature, a stub with the same API (every entry point BackendUnavailable): the
// one `cfg` on the backend seam, so that `ops` and the bindings need none.
#[cfg(not(feature = "cuda"))]
#[path = "cuda_stub.rs"]
pub mod cuda;

use std::sync::Arc;

use crate::device::{Device, DeviceType};
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::tensor::Tensor;

/// One box copy: `shape` elements from `src` at `src_start` to `dst` at `dst_start`.
/// Both tensors have the same dtype and live on the backend's device.
#[derive(Clone, Debug)]
pub struct BoxCopy<'a> {
    pub src: &'a Tensor,
    pub src_start: Vec<usize>,
    pub dst: &'a Tensor,
    pub dst_start: Vec<usize>,
    pub shape: Vec<usize>,
}

/// The operations every device backend provides.
pub trait Backend: Send + Sync {
    /// The device this backend runs on.
    fn device(&self) -> Device;

    /// A new contiguous tensor with unspecified contents.
    fn empty(&self, shape: &[usize], dtype: DType) -> Result<Tensor>;

    /// New contiguous tensors of `shapes`, with unspecified contents: the targets of one
    /// repartition. Backends may carve small ones out of one allocation (which then lives
    /// until the last of them is dropped).
    fn empty_many(&self, shapes: &[&[usize]], dtype: DType) -> Result<Vec<Tensor>> {
        shapes.iter().map(|s| self.empty(s, dtype)).collect()
    }

    /// Runs every copy. Destination boxes do not overlap each other, and no job's destination
    /// overlaps another job's source (a source overlapping its own destination is fine).
    fn copy_boxes(&self, jobs: &[BoxCopy<'_>]) -> Result<()>;

    /// `out[.., i, ..] = src[.., indices[i], ..]` along `axis`. `indices` is a 1-d int64 tensor
    /// on this device with every value in `[0, src.shape[axis])`.
    fn gather(&self, src: &Tensor, indices: &Tensor, axis: usize, out: &Tensor) -> Result<()>;

    /// `out[.., indices[i], ..] = values[.., i, ..]` along `axis`; later duplicates win.
    fn scatter(&self, values: &Tensor, indices: &Tensor, axis: usize, out: &Tensor) -> Result<()>;

    /// Waits until all work queued by this backend is done.
    fn synchronize(&self) -> Result<()> {
        Ok(())
    }
}

/// The backend for `device`.
pub fn backend_for(device: Device) -> Result<Arc<dyn Backend>> {
    match device.kind {
        k if k.is_host_accessible() => Ok(cpu::CpuBackend::shared(device)),
        DeviceType::Cuda => cuda::CudaBackend::shared(device),
        _ => Err(Error::UnsupportedDevice {
            device: device.to_string(),
            op: "native kernels".into(),
        }),
    }
}
