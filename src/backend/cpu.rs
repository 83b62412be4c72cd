//! The CPU backend: host-memory kernels.

use std::sync::Arc;

use crate::backend::{Backend, BoxCopy};
use crate::device::Device;
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::tensor::{contiguous_strides, HostBuffer, Tensor};

/// Kernels for host-accessible memory (`kDLCPU`, `kDLCUDAHost`, ...).
pub struct CpuBackend {
    device: Device,
}

impl CpuBackend {
    pub fn shared(device: Device) -> Arc<dyn Backend> {
        Arc::new(CpuBackend { device })
    }
}

/// Copies the strided box `src` to the strided box `dst`, both of `shape`, element by element.
///
/// # Safety
/// Every index within `shape` must address `itemsize` readable bytes from `src` and writable
/// bytes from `dst` (strides in elements), and the two boxes must not overlap.
pub unsafe fn copy_strided(
    src: *const u8,
    src_strides: &[isize],
    dst: *mut u8,
    dst_strides: &[isize],
    shape: &[usize],
    itemsize: usize,
) {
    if shape.contains(&0) {
        return;
    }
    let nd = shape.len();
    let mut idx = vec![0usize; nd];
    loop {
        let (mut so, mut d_o) = (0isize, 0isize);
        for d in 0..nd {
            so += idx[d] as isize * src_strides[d];
            d_o += idx[d] as isize * dst_strides[d];
        }
        let i = itemsize as isize;
        // SAFETY: the index is within `shape`, so both addresses are valid (caller's contract).
        unsafe { std::ptr::copy_nonoverlapping(src.offset(so * i), dst.offset(d_o * i), itemsize) };
        let mut d = nd;
        loop {
            if d == 0 {
                return;
            }
            d -= 1;
            idx[d] += 1;
            if idx[d] < shape[d] {
                break;
            }
            idx[d] = 0;
        }
    }
}

impl Backend for CpuBackend {
    fn device(&self) -> Device {
        self.device
    }

    fn empty(&self, shape: &[usize], dtype: DType) -> Result<Tensor> {
        let n = crate::tensor::checked_numel(shape)?;
        let buf = Arc::new(HostBuffer::uninit(n * dtype.itemsize()));
        // SAFETY: the buffer holds numel * itemsize bytes laid out in C order for `shape`.
        Ok(unsafe {
            Tensor::from_raw_parts(
                buf.as_ptr(),
                shape.to_vec(),
                contiguous_strides(shape),
                dtype,
                self.device,
                false,
                buf,
            )
        })
    }

    fn copy_boxes(&self, jobs: &[BoxCopy<'_>]) -> Result<()> {
        for j in jobs {
            let s = j.src.view(&j.src_start, &j.shape)?;
            let d = j.dst.view(&j.dst_start, &j.shape)?;
            // SAFETY: `view` checked both boxes are inside their tensors; the caller guarantees
            // the destination is writable and does not overlap the source.
            unsafe {
                copy_strided(
                    s.data_ptr(),
                    s.strides(),
                    d.data_ptr(),
                    d.strides(),
                    &j.shape,
                    s.dtype().itemsize(),
                )
            };
        }
        Ok(())
    }

    fn gather(&self, _src: &Tensor, _indices: &Tensor, _axis: usize, _out: &Tensor) -> Result<()> {
        Err(Error::UnsupportedDevice {
            device: self.device.to_string(),
            op: "gather (not yet implemented)".into(),
        })
    }

    fn scatter(&self, _v: &Tensor, _indices: &Tensor, _axis: usize, _out: &Tensor) -> Result<()> {
        Err(Error::UnsupportedDevice {
            device: self.device.to_string(),
            op: "scatter (not yet implemented)".into(),
        })
    }
}
