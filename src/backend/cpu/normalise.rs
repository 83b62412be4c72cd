//! Index normalisation on the host: what [`Backend::normalise_indices`] does on the CPU.
//!
//! [`Backend::normalise_indices`]: crate::backend::Backend::normalise_indices

use std::cell::UnsafeCell;
use std::mem::{size_of, MaybeUninit};
use std::sync::Arc;

use ndarray::Array1;
use rayon::prelude::*;

use crate::device::Device;
use crate::dtype::DType;
use crate::error::{tuple_string, Error, Result};
use crate::tensor::{HostBuffer, Tensor};

use super::copy::threads;

/// Index arrays shorter than this are checked on the calling thread.
const PARALLEL_INDICES: usize = 1 << 20;

/// Indices copied and checked per block of this many: the block is still in L1 when it is
/// checked, so the check costs no second trip to memory.
const BLOCK: usize = 1024;

/// Index arrays are split among threads in chunks of this many.
const CHUNK: usize = 1 << 16;

/// Room for `n` indices, or an error instead of an abort when the host has no memory left.
fn alloc_indices(n: usize) -> Result<Vec<i64>> {
    let mut v = Vec::new();
    v.try_reserve_exact(n).map_err(|_| {
        Error::host_oom(
            n.saturating_mul(size_of::<i64>()),
            format!("{n} normalised indices"),
        )
    })?;
    Ok(v)
}

/// Copies `dst.len()` int64 values from `src` into `dst` block by block and counts those
/// outside `[0, len)` in the copy: each index is read once from the caller's memory.
///
/// # Safety
/// `src` must address `dst.len()` readable, aligned int64 values (others may be writing them).
unsafe fn copy_and_count(src: *const i64, dst: &mut [MaybeUninit<i64>], len: usize) -> usize {
    let mut outside = 0;
    for (b, block) in dst.chunks_mut(BLOCK).enumerate() {
        // SAFETY: block `b` of `dst` lies `b * BLOCK` elements in, and so does its source
        // (the caller's contract); `dst` is dlpart's own memory, so the two do not overlap.
        // One copy is the only read of these indices: another thread that rewrites them
        // later changes nothing here.
        let copied = unsafe {
            let p = block.as_mut_ptr().cast::<i64>();
            std::ptr::copy_nonoverlapping(src.add(b * BLOCK), p, block.len());
            std::slice::from_raw_parts(p, block.len())
        };
        // One unsigned compare per index: negative ones wrap to huge values. AVX2 has no
        // 64-bit min/max, so this count vectorises where a min/max pass does not.
        outside += copied.iter().filter(|&&v| v as u64 >= len as u64).count();
    }
    outside
}

/// [`copy_and_count`] for lists far larger than the caches, with streaming stores: the copy
/// is read back only by the kernel, long after, so filling cache lines with it would read
/// every line first for nothing. Each index is loaded once, counted from the register and
/// stored from it.
///
/// # Safety
/// As for [`copy_and_count`].
#[cfg(all(target_arch = "x86_64", not(miri)))]
unsafe fn copy_and_count_long(src: *const i64, dst: &mut [MaybeUninit<i64>], len: usize) -> usize {
    use std::arch::x86_64::{_mm_sfence, _mm_stream_si64};
    let d = dst.as_mut_ptr().cast::<i64>();
    let mut outside = 0;
    for i in 0..dst.len() {
        // SAFETY: element `i < dst.len()` of both (the caller's contract); MOVNTI is SSE2,
        // part of every x86_64, and takes any 8-byte aligned address (`dst` is aligned).
        let v = unsafe {
            let v = src.add(i).read();
            _mm_stream_si64(d.add(i), v);
            v
        };
        outside += usize::from(v as u64 >= len as u64);
    }
    // Streaming stores are weakly ordered: make them visible before the threads that read
    // the copy are told it is done.
    // SAFETY: SFENCE is SSE, part of every x86_64.
    unsafe { _mm_sfence() };
    outside
}

/// [`copy_and_count`] where streaming stores are not used.
///
/// # Safety
/// As for [`copy_and_count`].
#[cfg(not(all(target_arch = "x86_64", not(miri))))]
unsafe fn copy_and_count_long(src: *const i64, dst: &mut [MaybeUninit<i64>], len: usize) -> usize {
    // SAFETY: forwarded caller contract.
    unsafe { copy_and_count(src, dst, len) }
}

/// The copy of `n` (> 0) contiguous int64 indices at `src` as a host tensor dlpart owns, and
/// how many are outside `[0, len)`.
///
/// The copy lives in a [`HostBuffer`], whose freed large buffers are reused: a fresh 512 MiB
/// allocation for 64M indices is faulted in and zeroed by the kernel page by page, which
/// costs about as much as the copy itself, on every gather in a loop.
///
/// # Safety
/// As for [`copy_and_count`], with `n` values.
unsafe fn copy_indices(src: *const i64, n: usize, len: usize) -> Result<(Tensor, usize)> {
    if n <= FEW_INDICES {
        // SAFETY: forwarded caller contract.
        return Ok(unsafe { copy_few_indices(src, n, len) });
    }
    let nbytes = n.saturating_mul(size_of::<i64>());
    let buf = HostBuffer::uninit(nbytes)
        .map_err(|_| Error::host_oom(nbytes, format!("a copy of {n} indices")))?;
    let buf = Arc::new(buf);
    let dst = buf.as_ptr().cast::<MaybeUninit<i64>>();
    // SAFETY: the buffer holds `nbytes` bytes, aligned for any element (`HostBuffer::ALIGN`),
    // and nothing else can reach it yet.
    let spare = unsafe { std::slice::from_raw_parts_mut(dst, n) };
    let outside = if n < PARALLEL_INDICES || threads() == 1 {
        // SAFETY: forwarded caller contract.
        unsafe { copy_and_count(src, spare, len) }
    } else {
        let src = SendPtr(src);
        spare
            .par_chunks_mut(CHUNK)
            .enumerate()
            // SAFETY: chunk `c` starts `c * CHUNK` elements into both (the caller's contract).
            .map(|(c, chunk)| unsafe { copy_and_count_long(src.get().add(c * CHUNK), chunk, len) })
            .sum()
    };
    // SAFETY: `copy_and_count` wrote all `n` int64 values of the buffer (every block of every
    // chunk), which `buf`, the owner, keeps alive; C-order strides for one axis of `n`.
    let t = unsafe {
        Tensor::from_raw_slices(
            buf.as_ptr(),
            &[n],
            &[1],
            DType::Int64,
            Device::CPU,
            false,
            buf,
        )
    };
    Ok((t, outside))
}

/// Index arrays up to this long are copied into one small allocation ([`FewIndices`]).
const FEW_INDICES: usize = 8;

/// The copy of a short index array: its values and the reference counts share one
/// allocation (an `Arc` of this), where a [`HostBuffer`] in an `Arc` takes two, the first
/// aligned to 64 bytes. A halo face is gathered with one index, once per face per step.
struct FewIndices(UnsafeCell<[MaybeUninit<i64>; FEW_INDICES]>);

// SAFETY: the values are written only by `normalise_indices`, through the tensor it has just
// made and not yet handed out; after that every thread only reads them.
unsafe impl Sync for FewIndices {}

/// [`copy_indices`] for `n <= FEW_INDICES`.
///
/// # Safety
/// As for [`copy_and_count`], with `n` values.
unsafe fn copy_few_indices(src: *const i64, n: usize, len: usize) -> (Tensor, usize) {
    let owner = Arc::new(FewIndices(UnsafeCell::new(
        [MaybeUninit::uninit(); FEW_INDICES],
    )));
    let data = owner.0.get().cast::<MaybeUninit<i64>>();
    // SAFETY: `data` addresses the `FEW_INDICES >= n` values inside `owner`, which nothing
    // else can reach yet; the rest is the caller's contract.
    let outside = unsafe { copy_and_count(src, std::slice::from_raw_parts_mut(data, n), len) };
    // SAFETY: `copy_and_count` wrote the first `n` values, which `owner` keeps alive at a
    // fixed address (the `Arc`'s allocation), writable through `data` (an `UnsafeCell`);
    // C-order strides for one axis of `n`.
    let t = unsafe {
        Tensor::from_raw_slices(
            data.cast::<u8>(),
            &[n],
            &[1],
            DType::Int64,
            Device::CPU,
            false,
            owner,
        )
    };
    (t, outside)
}

/// A pointer the index threads share: they read the caller's indices through it (here and in
/// `direct.rs`), and in `direct.rs` also read a source and write the rows of an output that
/// each thread alone writes.
pub(super) struct SendPtr<T>(pub(super) *const T);

impl<T> Clone for SendPtr<T> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<T> Copy for SendPtr<T> {}

impl<T> SendPtr<T> {
    pub(super) fn get(self) -> *const T {
        self.0
    }
}

// SAFETY: the callers keep the memory alive until the threads are joined, the threads only
// read through a shared pointer, except for disjoint ranges of an output, one per thread.
unsafe impl<T> Send for SendPtr<T> {}
// SAFETY: as for `Send`.
unsafe impl<T> Sync for SendPtr<T> {}

/// Normalises `indices` (negative ones count from the end, as in numpy) against an axis of
/// length `len`; an index outside `[-len, len)` is an error before anything is written.
///
/// The result is always a new contiguous int64 tensor that dlpart owns: every index is read
/// once from the caller's memory, into that copy, and checked there (the copy and the check
/// are one pass). The kernels read only the copy, so another thread that rewrites the caller's
/// index array meanwhile cannot turn a checked index into an out-of-range one.
pub fn normalise_indices(indices: &Tensor, axis: usize, len: usize) -> Result<Tensor> {
    if indices.ndim() != 1 {
        return Err(Error::shape(
            "indices must be 1-d",
            format!("shape {}", tuple_string(indices.shape())),
        ));
    }
    if !indices.device().is_host_accessible() {
        return Err(Error::UnsupportedDevice {
            device: indices.device().to_string(),
            op: "indices on the CPU backend".into(),
        });
    }
    // Checked here, not only per index read: an empty list of floats or bools is no more a
    // list of indices than a full one (the CUDA check refuses both too).
    indices.dtype().index_signed()?;
    let n = indices.shape()[0];
    let (lo, hi) = (-(len as i64), len as i64);
    let out_of_range = |index: i128| Error::IndexOutOfRange { index, axis, len };
    let ptr = indices.data_ptr().cast::<i64>();
    if indices.dtype() == DType::Int64
        && (indices.strides()[0] == 1 || n <= 1)
        && n > 0
        && ptr.is_aligned()
    {
        // SAFETY: a host-accessible contiguous int64 tensor of `n` elements, kept alive by
        // `indices` during the call, and aligned (checked just above).
        let (copy, outside) = unsafe { copy_indices(ptr, n, len)? };
        if outside == 0 {
            return Ok(copy);
        }
        // Negative or bad indices: everything from here on reads dlpart's copy only.
        // SAFETY: the copy holds `n` int64 values, made just above; nothing else has it yet.
        let fixed = unsafe { std::slice::from_raw_parts_mut(copy.data_ptr().cast::<i64>(), n) };
        let bad = fixed.iter().find(|&&v| v < lo || v >= hi).copied();
        if let Some(bad) = bad {
            return Err(out_of_range(bad as i128));
        }
        let wrap = |v: &mut i64| {
            if *v < 0 {
                *v += hi
            }
        };
        // Short lists on the calling thread: waking the pool costs more than the loop.
        if n < PARALLEL_INDICES || threads() == 1 {
            fixed.iter_mut().for_each(wrap);
        } else {
            fixed.par_iter_mut().for_each(wrap);
        }
        return Ok(copy);
    }
    let stride = indices.strides()[0];
    let mut out = alloc_indices(n)?;
    for i in 0..n {
        let v = read_index(indices, i as isize * stride)?;
        if v < lo as i128 || v >= hi as i128 {
            return Err(out_of_range(v));
        }
        let v = v as i64; // in range, so it fits
        out.push(if v < 0 { v + hi } else { v });
    }
    Ok(Tensor::from_ndarray(Array1::from_vec(out)))
}

fn read_index(t: &Tensor, offset: isize) -> Result<i128> {
    let p = t
        .data_ptr()
        .wrapping_offset(offset * t.dtype().itemsize() as isize);
    // SAFETY: `offset` addresses an in-bounds element of the host-accessible 1-d tensor `t`
    // (callers iterate `i < shape[0]` with the tensor's own stride); unaligned reads are used
    // because DLPack producers may hand out unaligned data.
    unsafe {
        Ok(match t.dtype() {
            DType::Int8 => p.cast::<i8>().read_unaligned() as i128,
            DType::Int16 => p.cast::<i16>().read_unaligned() as i128,
            DType::Int32 => p.cast::<i32>().read_unaligned() as i128,
            DType::Int64 => p.cast::<i64>().read_unaligned() as i128,
            DType::UInt8 => p.cast::<u8>().read_unaligned() as i128,
            DType::UInt16 => p.cast::<u16>().read_unaligned() as i128,
            DType::UInt32 => p.cast::<u32>().read_unaligned() as i128,
            DType::UInt64 => p.cast::<u64>().read_unaligned() as i128,
            other => return Err(Error::IndexDType { found: other }),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Short lists, lists of several copy blocks and (natively) lists long enough for threads;
    /// Miri would take minutes over a million indices.
    fn sizes() -> [usize; 3] {
        if cfg!(miri) {
            [5, 2 * BLOCK + 5, 3 * BLOCK]
        } else {
            [5, 2 * BLOCK + 5, PARALLEL_INDICES + 5]
        }
    }

    /// Rewrites every index of `t` (a contiguous int64 tensor dlpart owns) to `v`.
    fn overwrite(t: &Tensor, v: i64) {
        let n = t.shape()[0];
        // SAFETY: `t` is a contiguous host int64 tensor of `n` elements, kept alive by `t`,
        // and nothing else reads it during this call.
        unsafe { std::slice::from_raw_parts_mut(t.data_ptr().cast::<i64>(), n) }.fill(v);
    }

    #[test]
    fn the_normalised_indices_are_a_copy_the_caller_cannot_change() {
        // Short and long (parallel) lists, in range and with negative indices.
        for n in sizes() {
            for first in [0i64, -1] {
                let mut values: Vec<i64> = (0..n as i64).map(|i| i % 7).collect();
                values[0] = first;
                let caller = Tensor::from_slice(&values, &[n]).unwrap();
                let idx = normalise_indices(&caller, 0, 7).unwrap();
                assert_ne!(idx.data_ptr(), caller.data_ptr());
                // Another thread rewriting the caller's array after the check changes nothing.
                overwrite(&caller, i64::MAX);
                let got = idx.to_array::<i64>().unwrap().into_raw_vec_and_offset().0;
                assert_eq!(got[0], if first < 0 { 6 } else { 0 });
                assert!(got.iter().all(|&v| (0..7).contains(&v)));
                assert_eq!(got[1..], values[1..]);
            }
        }
    }

    #[test]
    fn a_bad_index_anywhere_is_reported() {
        for n in sizes() {
            for (at, bad) in [(0, 7i64), (n - 1, -8), (n / 2, i64::MIN), (n / 3, i64::MAX)] {
                let mut values = vec![1i64; n];
                values[at] = bad;
                let t = Tensor::from_slice(&values, &[n]).unwrap();
                match normalise_indices(&t, 2, 7) {
                    Err(Error::IndexOutOfRange {
                        index,
                        axis: 2,
                        len: 7,
                    }) => {
                        assert_eq!(index, bad as i128)
                    }
                    other => panic!("{n} {at}: expected {bad} out of range, got {other:?}"),
                }
            }
        }
    }

    #[test]
    fn short_lists_on_both_sides_of_the_small_copy_match_the_reference() {
        // 1 and FEW_INDICES indices take the one-allocation copy, FEW_INDICES + 1 the buffer.
        for n in [1, FEW_INDICES, FEW_INDICES + 1] {
            let values: Vec<i64> = (0..n as i64)
                .map(|i| if i % 2 == 0 { -1 - i } else { i })
                .collect();
            let expect: Vec<i64> = values
                .iter()
                .map(|&v| if v < 0 { v + 11 } else { v })
                .collect();
            let caller = Tensor::from_slice(&values, &[n]).unwrap();
            let idx = normalise_indices(&caller, 0, 11).unwrap();
            overwrite(&caller, 0);
            assert_eq!(idx.shape(), &[n]);
            assert_eq!(idx.strides(), &[1]);
            assert!(!idx.readonly());
            let view = idx.view(&[0], &[n]).unwrap();
            drop(idx); // the view keeps the copy alive
            assert_eq!(
                view.to_array::<i64>().unwrap().into_raw_vec_and_offset().0,
                expect
            );
            let mut bad = values.clone();
            bad[n - 1] = -12;
            let t = Tensor::from_slice(&bad, &[n]).unwrap();
            assert!(matches!(
                normalise_indices(&t, 0, 11),
                Err(Error::IndexOutOfRange {
                    index: -12,
                    axis: 0,
                    len: 11
                })
            ));
        }
    }
}
