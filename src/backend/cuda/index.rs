//! Gather and scatter: validation, the scatter winner pass, and the index status check.

use std::ffi::c_void;

use cudarc::driver::result;

use super::context::driver_err;
use super::jobs::{self, Mode, Transfer, BLOCK, MAX_JOB_NUMEL};
use super::CudaBackend;
use crate::backend::{Backend, BoxCopy};
use crate::dtype::DType;
use crate::error::{tuple_string, Error, Result};
use crate::tensor::Tensor;

impl CudaBackend {
    /// Reads the index status word pair; an out-of-range index becomes `IndexOutOfRange`.
    fn check_status(&self, status: u64, axis: usize, len: usize) -> Result<()> {
        let mut words = [0u64; 2];
        // SAFETY: `status` points at two u64 in scratch; a device-to-pageable copy returns
        // only when complete, and it is ordered after the kernels on this stream.
        unsafe { result::memcpy_dtoh_async(&mut words, status, self.stream.cu_stream()) }
            .map_err(driver_err("cuMemcpyDtoHAsync(index status)"))?;
        self.stream
            .synchronize()
            .map_err(driver_err("cuStreamSynchronize"))?;
        if words[0] != 0 {
            return Err(Error::IndexOutOfRange {
                index: words[1] as i64 as i128,
                axis,
                len,
            });
        }
        Ok(())
    }

    /// A contiguous, 8-byte aligned int64 copy of `indices` on this device (itself when it
    /// already is one).
    fn contiguous_indices(&self, indices: &Tensor, op: &str) -> Result<Tensor> {
        self.check_device(indices, "index tensor", op)?;
        if indices.dtype() != DType::Int64 || indices.ndim() != 1 {
            return Err(Error::shape(
                format!("{op}: indices must be a 1-d int64 tensor"),
                format!("{} {}", indices.dtype(), tuple_string(indices.shape())),
            ));
        }
        // The kernels read indices as aligned int64 words.
        if indices.is_contiguous() && indices.data_ptr() as usize % 8 == 0 {
            return Ok(indices.clone());
        }
        let out = self.empty(indices.shape(), DType::Int64)?;
        self.copy_boxes(&[BoxCopy {
            src: indices,
            src_start: vec![0],
            dst: &out,
            dst_start: vec![0],
            shape: indices.shape().to_vec(),
        }])?;
        Ok(out)
    }

    /// Shared by gather and scatter: `small` has `indices.len()` along `axis`, `large` the
    /// indexed extent.
    pub(super) fn indexed(
        &self,
        mode: Mode,
        src: &Tensor,
        indices: &Tensor,
        axis: usize,
        out: &Tensor,
    ) -> Result<()> {
        let op = if mode == Mode::Gather {
            "gather"
        } else {
            "scatter"
        };
        self.bind()?;
        self.check_device(src, "source", op)?;
        self.check_device(out, "output", op)?;
        Self::check_writable(out, "output")?;
        let idx = self.contiguous_indices(indices, op)?;
        let (small, large) = if mode == Mode::Gather {
            (out, src)
        } else {
            (src, out)
        };
        let n = idx.shape()[0];
        let shape_ok = src.dtype() == out.dtype()
            && axis < small.ndim()
            && small.ndim() == large.ndim()
            && small.shape()[axis] == n
            && (0..small.ndim()).all(|d| d == axis || small.shape()[d] == large.shape()[d]);
        if !shape_ok {
            return Err(Error::shape(
                format!("{op} along axis {axis} with {n} indices"),
                format!(
                    "source {} {}, output {} {}",
                    src.dtype(),
                    tuple_string(src.shape()),
                    out.dtype(),
                    tuple_string(out.shape())
                ),
            ));
        }
        let len = large.shape()[axis];
        let t = Transfer {
            src: src.data_ptr() as u64,
            dst: out.data_ptr() as u64,
            item: src.dtype().itemsize(),
            shape: small.shape().to_vec(),
            src_strides: src.strides().to_vec(),
            dst_strides: out.strides().to_vec(),
            axis: Some(axis),
            index: idx.data_ptr() as u64,
            index_len: len,
        };
        let launches = jobs::plan(&[t], mode, MAX_JOB_NUMEL)?;
        if launches.is_empty() {
            return Ok(());
        }
        let winners = if mode == Mode::Scatter { len * 8 } else { 0 };
        // Held until the status is read, so no other call reuses the scratch before that.
        let mut scratch = self.scratch.lock().expect("scratch lock");
        let status = self.run(&mut scratch, &launches, 16 + winners, |status| {
            if mode != Mode::Scatter {
                return Ok(());
            }
            let k = self.kernels()?;
            let (mut ip, mut np, mut lp, mut wp, mut sp) = (
                idx.data_ptr() as u64,
                n as u64,
                len as i64,
                status + 16,
                status,
            );
            let mut params: Vec<*mut c_void> = vec![
                (&mut ip as *mut u64).cast(),
                (&mut np as *mut u64).cast(),
                (&mut lp as *mut i64).cast(),
                (&mut wp as *mut u64).cast(),
                (&mut sp as *mut u64).cast(),
            ];
            let grid = (n.div_ceil(BLOCK as usize) as u32).clamp(1, self.sm_count * 8);
            // SAFETY: matches `scatter_winners(const i64*, u64, i64, u64*, u64*)`; the index
            // array holds `n` int64 on this device; `winner` has `len` zeroed slots.
            unsafe {
                result::launch_kernel(
                    k.winners.cu_function(),
                    (grid, 1, 1),
                    (BLOCK, 1, 1),
                    0,
                    self.stream.cu_stream(),
                    &mut params,
                )
            }
            .map_err(driver_err("launching scatter_winners"))
        })?;
        self.check_status(status, axis, len)
    }
}
