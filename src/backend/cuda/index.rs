//! Gather and scatter: the index check before them, validation, the scatter winner pass, and
//! the index status check.
//!
//! Indices are copied once into memory dlpart owns and checked there, on the device, by
//! `check_indices_*` (kernels/index.cu) before any data moves: that is
//! [`Backend::normalise_indices`] for CUDA. The gather and scatter kernels check every index
//! again as they read it, so indices handed to them directly (not normalised) and changed
//! meanwhile can fail the call but never address memory out of bounds.

use super::args::{CheckArgs, WinnersArgs};
use super::driver::Kernel;
use super::index_check::{
    index_check, index_home, index_value, verdict, IndexCheck, IndexHome, Verdict,
};
use super::jobs::{self, Mode, RawCopy, BLOCK, MAX_JOB_NUMEL};
use super::{CudaBackend, DeviceBuffer};
use crate::backend::{Backend, BoxCopy};
use crate::dtype::DType;
use crate::error::{tuple_string, Error, Result};
use crate::tensor::Tensor;

/// The largest scatter winner table kept in the backend's scratch between calls: a larger
/// one is allocated for its call and freed when the call returns, so that one large scatter
/// does not hold device memory for the life of the process.
pub(super) const KEPT_WINNER_BYTES: usize = 16 << 20;

/// Where a scatter's winner table lies and its form, as the index kernels take it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(super) struct WinnerTable {
    /// Its address; `None`: in scratch, after the index status.
    pub at: Option<u64>,
    /// 0: one word per slot of the axis; else a hashed table of this many slots (a power of
    /// two), keys then winners (see `dlp_winner` in kernels/common.cuh).
    pub slots: u64,
}

/// The form and size in bytes of the winner table for `n` (> 0) indices into an axis of
/// `len`: one word per slot of the axis, or a hash table of twice the number of indices
/// (rounded up to a power of two; two words a slot), whichever is smaller. So it never
/// takes more than 64 bytes an index, however long the axis: one value scattered into 2^30
/// slots takes 32 bytes, not 8 GiB.
pub(super) fn winner_table(n: usize, len: usize) -> (u64, usize) {
    let direct = len.saturating_mul(8);
    let slots = n.saturating_mul(2).max(2).next_power_of_two();
    let hashed = slots.saturating_mul(16);
    if hashed < direct {
        (slots as u64, hashed)
    } else {
        (0, direct)
    }
}

impl CudaBackend {
    /// Reads the two status words at `status` once the work queued before is done.
    fn read_status(&self, status: u64) -> Result<[u64; 2]> {
        let mut words = [0u64; 2];
        let mut bytes = [0u8; 16];
        // SAFETY: `status` points at two u64 in scratch; a device-to-pageable copy returns
        // only when complete, and it is ordered after the kernels on this stream.
        unsafe { self.driver.copy_dtoh(&mut bytes, status) }?;
        self.driver.synchronize()?;
        for (w, b) in words.iter_mut().zip(bytes.chunks_exact(8)) {
            *w = u64::from_le_bytes(b.try_into().expect("8 bytes"));
        }
        Ok(words)
    }

    /// Reads the index status word pair; an out-of-range index becomes `IndexOutOfRange`.
    fn check_status(&self, status: u64, axis: usize, len: usize) -> Result<()> {
        let words = self.read_status(status)?;
        if words[0] != 0 {
            return Err(Error::IndexOutOfRange {
                index: words[1] as i64 as i128,
                axis,
                len,
            });
        }
        Ok(())
    }

    /// [`Backend::normalise_indices`] on this device: always indices dlpart owns, each read
    /// once from the caller's memory, as on the CPU. The caller's device memory may be
    /// rewritten (by another thread, or work on another stream) after a check, so the kernels
    /// never read it: `check_indices_*` reads every index once, checks that value and writes
    /// it, moved into `[0, len)`, to a fresh int64 tensor. Host indices are uploaded into
    /// dlpart's own device memory first; contiguous int64 ones all in `[0, len)` are then
    /// used as they are, checked in place (the upload is the one copy).
    pub(super) fn normalise_on_device(
        &self,
        indices: &Tensor,
        axis: usize,
        len: usize,
    ) -> Result<Tensor> {
        let (indices, owned) = match index_home(self.device, indices)? {
            IndexHome::Resident => (indices.clone(), false),
            IndexHome::Upload => {
                index_check(indices.dtype(), 0, 1, 0)?; // refuse a float dtype before copying
                let on_device = self.empty(indices.shape(), indices.dtype())?;
                self.copy_host_to_device(indices, &on_device)?;
                (on_device, true)
            }
        };
        let n = indices.shape()[0];
        let check = index_check(
            indices.dtype(),
            indices.data_ptr() as u64,
            indices.strides()[0],
            n,
        )?;
        if n == 0 {
            return self.empty(&[0], DType::Int64);
        }
        // A staged copy is dlpart's own, but read once more below: the staging copy itself
        // read the caller's indices once, and the check reads only the copy.
        let src = if check.stage {
            let aligned = self.empty(indices.shape(), indices.dtype())?;
            self.box_copy(&indices, &aligned)?;
            aligned
        } else {
            indices
        };
        let bad = |position| self.bad_index(&src, position, axis, len);
        if check.in_place && owned {
            match self.check_indices(&src, check, len, None)? {
                Verdict::Valid { negative: false } => return Ok(src),
                Verdict::Valid { negative: true } => {}
                Verdict::Bad { position } => return Err(bad(position)?),
            }
        }
        let out = self.empty(&[n], DType::Int64)?;
        match self.check_indices(&src, check, len, Some(&out))? {
            Verdict::Valid { .. } => Ok(out),
            Verdict::Bad { position } => Err(bad(position)?),
        }
    }

    /// Runs `check_indices_{word}` over the 1-d `idx` (on this device, aligned to its item
    /// size) and waits for its verdict; with `out`, also writes the normalised indices there.
    fn check_indices(
        &self,
        idx: &Tensor,
        check: IndexCheck,
        len: usize,
        out: Option<&Tensor>,
    ) -> Result<Verdict> {
        self.load_kernels()?;
        let _ctx = self.bind()?;
        let n = idx.shape()[0];
        // Held until the status is read, so no other call reuses the scratch before that.
        let mut scratch = self.scratch.lock().expect("scratch lock");
        let status = scratch.device(16)?;
        // SAFETY: the scratch allocation holds at least 16 bytes (asked for just above).
        unsafe { self.driver.memset_zero(status, 16) }?;
        let mut args = CheckArgs {
            indices: idx.data_ptr() as u64,
            stride: idx.strides()[0] as i64,
            n: n as u64,
            len: len as i64,
            signed: u32::from(check.signed),
            out: out.map_or(0, |o| o.data_ptr() as u64),
            status,
        };
        let mut params = args.params();
        let grid = (n.div_ceil(BLOCK as usize) as u32).clamp(1, self.sm_count * 8);
        // SAFETY: matches `check_indices_W(const uW*, i64, u64, i64, u32, i64*, u64*)`; `idx`
        // holds `n` items of W bytes `stride` apart on this device, aligned to W (the caller
        // staged it otherwise); `out`, when given, holds `n` int64 on this device; `status`
        // is two zeroed u64 of scratch.
        unsafe {
            self.driver
                .launch(Kernel::Check(check.word), grid, &mut params)
        }?;
        Ok(verdict(self.read_status(status)?, n))
    }

    /// [`Error::IndexOutOfRange`] for the index at `position` of `idx` (on this device).
    fn bad_index(&self, idx: &Tensor, position: usize, axis: usize, len: usize) -> Result<Error> {
        let item = idx.dtype().itemsize();
        let at = idx
            .data_ptr()
            .wrapping_offset(position as isize * idx.strides()[0] * item as isize);
        let mut bytes = [0u8; 8];
        // SAFETY: `position < n`, so `at` addresses one item of `idx` on this device; the
        // copy into pageable memory returns when complete, after the work queued before.
        unsafe { self.driver.copy_dtoh(&mut bytes[..item], at as u64) }?;
        self.driver.synchronize()?;
        Ok(Error::IndexOutOfRange {
            index: index_value(&bytes[..item], idx.dtype()),
            axis,
            len,
        })
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
        let job = BoxCopy::whole(indices, &out);
        // SAFETY: one job, into `out`, which was just allocated.
        unsafe { self.copy_boxes_unchecked(&[job])? };
        Ok(out)
    }

    /// Shared by gather and scatter: `small` has `indices.len()` along `axis`, `large` the
    /// indexed extent. On an error, returns once the work it queued has stopped.
    pub(super) fn indexed(
        &self,
        mode: Mode,
        src: &Tensor,
        indices: &Tensor,
        axis: usize,
        out: &Tensor,
    ) -> Result<()> {
        let _ctx = self.bind()?;
        let done = self.indexed_queued(mode, src, indices, axis, out);
        self.settled(done)
    }

    /// A copy of `src` when it shares memory with `out` (both on this device): the kernels
    /// read the source while other blocks write the output, so an overlapping source is read
    /// from a copy, as the CPU backend does (`gather(x, i, out=x)`). The copy is freed once
    /// the work reading it has run (`DeviceBuffer` waits for it).
    fn staged_apart(&self, src: &Tensor, out: &Tensor) -> Result<Option<Tensor>> {
        if !crate::overlap::shares_memory(src, out) {
            return Ok(None);
        }
        let copy = self.empty(src.shape(), src.dtype())?;
        self.copy_raw(&[super::whole_copy(src, &copy)])?;
        Ok(Some(copy))
    }

    /// [`CudaBackend::indexed`] with the context current, not yet settled.
    fn indexed_queued(
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
        let staged = self.staged_apart(src, out)?;
        let src = staged.as_ref().unwrap_or(src);
        let t = RawCopy {
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
        let launches = jobs::to_launches(&[t], mode, MAX_JOB_NUMEL)?;
        if launches.is_empty() {
            return Ok(());
        }
        let (slots, bytes) = match mode {
            Mode::Scatter => winner_table(n, len),
            _ => (0, 0),
        };
        // A large table lives for this call only; a small one in the scratch, zeroed there.
        let apart = match bytes > KEPT_WINNER_BYTES {
            true => Some(self.guarded(|| DeviceBuffer::alloc(&self.driver, bytes))?),
            false => None,
        };
        let winners = WinnerTable {
            at: apart.as_ref().map(DeviceBuffer::device_ptr),
            slots,
        };
        let in_scratch = if apart.is_some() { 0 } else { bytes };
        // Loaded before the lock: loading may log, and a log record may wait for the GIL.
        self.load_kernels()?;
        // Held until the status is read, so no other call reuses the scratch before that.
        let mut scratch = self.scratch.lock().expect("scratch lock");
        let status = self.run(
            &mut scratch,
            &launches,
            16 + in_scratch,
            winners,
            |status| {
                if mode != Mode::Scatter {
                    return Ok(());
                }
                let table = winners.at.unwrap_or(status + 16);
                if winners.at.is_some() {
                    // SAFETY: `table` is the call's own allocation of `bytes` bytes.
                    unsafe { self.driver.memset_zero(table, bytes) }?;
                }
                let mut args = WinnersArgs {
                    index: idx.data_ptr() as u64,
                    n: n as u64,
                    len: len as i64,
                    winner: table,
                    slots,
                    status,
                };
                let mut params = args.params();
                let grid = (n.div_ceil(BLOCK as usize) as u32).clamp(1, self.sm_count * 8);
                // SAFETY: matches `scatter_winners(const i64*, u64, i64, u64*, u64, u64*)`; the
                // index array holds `n` int64 on this device; `table` is `bytes` zeroed bytes,
                // the size `winner_table` gives for `slots`, queued on this stream before.
                unsafe { self.driver.launch(Kernel::Winners, grid, &mut params) }
            },
        )?;
        // The stream has drained when the status is read, or once settled on an error:
        // nothing queued uses the call's own table when it is freed below.
        let checked = self.settled(self.check_status(status, axis, len));
        drop(scratch);
        drop(apart);
        checked
    }
}
