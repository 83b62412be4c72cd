//! The CPU backend: host-memory kernels.
//!
//! [`CpuBackend`] is the safe layer: it validates tensors, then calls the raw kernels of
//! this module (crate-private, `unsafe`). Those take pointers, shapes and strides in elements
//! and move elements as 1-, 2-, 4-, 8- or 16-byte words by item size (float8, bfloat16 and
//! complex are just bytes; other item sizes are moved as byte runs). They lower each box into
//! long loops (`lower.rs`), run them in one rayon pass over pieces of similar size, and store
//! large copies with streaming stores (`nontemporal.rs`). Gathers and scatters check and
//! normalise their indices into a copy first (`normalise.rs`), except gathers of long lists
//! along an array's outermost axis, which read the caller's indices once each on their way
//! into the loop (`direct.rs`).

mod copy;
mod direct;
mod exec;
mod index;
mod index_loop;
mod lower;
mod nontemporal;
mod normalise;
mod repart;
mod slabs;
#[cfg(test)]
mod tests;
mod threads;

use std::borrow::Cow;
use std::fmt;
use std::sync::{Arc, OnceLock};

pub(crate) use copy::{copy_boxes, pack, DstView, RawCopy, SrcView};
pub(crate) use index::{gather, scatter};
pub use threads::{num_threads, set_num_threads};

/// The raw kernels, for dlpart's own benchmarks and examples (feature `bench-internals`).
/// Not part of the API: no stability, and every kernel is `unsafe` with the contract in its
/// source.
#[cfg(feature = "bench-internals")]
#[doc(hidden)]
pub mod __bench {
    pub use super::copy::{
        copy_box, copy_boxes, copy_boxes_with, DstView, RawCopy, SrcView, Stores, STREAM_MIN_BYTES,
    };
    pub use super::index::{gather, scatter};
}

use crate::access::{self, Role};
use crate::backend::{Backend, BoxCopy};
use crate::device::{Device, DeviceType};
use crate::dtype::DType;
use crate::error::{tuple_string, Error, Result};
use crate::plan::Plan;
use crate::tensor::{contiguous_strides, HostBuffer, Tensor};

/// Kernels for host-accessible memory (`kDLCPU`, `kDLCUDAHost`, ...).
pub struct CpuBackend {
    device: Device,
}

impl CpuBackend {
    /// A backend for the host-accessible `device` (the kernels are the same for every such
    /// device; the device is what new tensors report).
    pub fn shared(device: Device) -> Arc<dyn Backend> {
        // `kDLCPU:0`, nearly always the device asked for, has one backend made once: a new
        // `Arc` per operation was an allocation and a free in every gather of a halo face.
        static HOST: OnceLock<Arc<dyn Backend>> = OnceLock::new();
        if device == Device::CPU {
            return HOST.get_or_init(|| Arc::new(CpuBackend { device })).clone();
        }
        Arc::new(CpuBackend { device })
    }
}

/// Copies the strided box `src` to the strided box `dst`, both of `shape`, element by element:
/// the slow reference the fast kernels are tested against.
///
/// # Safety
/// Every index within `shape` must address `itemsize` readable bytes from `src` and writable
/// bytes from `dst` (strides in elements), and the two boxes must not overlap.
pub(crate) unsafe fn copy_strided(
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
        unsafe {
            std::ptr::copy_nonoverlapping(
                src.wrapping_offset(so * i),
                dst.wrapping_offset(d_o * i),
                itemsize,
            )
        };
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

/// Lowest and one-past-highest address touched by a box (`(0, 0)` when empty).
fn span(ptr: *const u8, shape: &[usize], strides: &[isize], itemsize: usize) -> (usize, usize) {
    if shape.contains(&0) {
        return (0, 0);
    }
    let (mut lo, mut hi) = (ptr as isize, ptr as isize + itemsize as isize);
    for (&n, &s) in shape.iter().zip(strides) {
        let ext = (n as isize - 1) * s * itemsize as isize;
        if ext < 0 {
            lo += ext;
        } else {
            hi += ext;
        }
    }
    (lo as usize, hi as usize)
}

fn overlap(a: (usize, usize), b: (usize, usize)) -> bool {
    a.0 < b.1 && b.0 < a.1
}

/// Names copy job `.0` (and a side, `.1`) in errors, formatted only when one is raised.
struct Job(usize, &'static str);

impl fmt::Display for Job {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "copy job {}{}", self.0, self.1)
    }
}

/// The address of box `start` (of `shape`) in `t`, checking it lies inside `t`.
fn box_ptr(
    t: &Tensor,
    start: &[usize],
    shape: &[usize],
    what: &dyn fmt::Display,
) -> Result<*mut u8> {
    let fits = start.len() == t.ndim()
        && shape.len() == t.ndim()
        && (0..t.ndim()).all(|d| {
            start[d]
                .checked_add(shape[d])
                .is_some_and(|e| e <= t.shape()[d])
        });
    if !fits {
        return Err(Error::shape(
            format!(
                "{what} box outside tensor of shape {}",
                tuple_string(t.shape())
            ),
            format!(
                "start {} shape {}",
                tuple_string(start),
                tuple_string(shape)
            ),
        ));
    }
    if shape.contains(&0) {
        return Ok(t.data_ptr());
    }
    let off: isize = start
        .iter()
        .zip(t.strides())
        .map(|(&i, &s)| i as isize * s)
        .sum();
    Ok(t.data_ptr()
        .wrapping_offset(off * t.dtype().itemsize() as isize))
}

/// Where new memory for host-accessible `device` comes from: the CPU backend (`None`) for
/// `kDLCPU`, the CUDA backend's page-locked memory for `kDLCUDAHost`; other kinds (managed,
/// ROCm host) are refused, as plain memory would be mislabelled as them.
pub(crate) fn host_allocator(device: Device) -> Result<Option<Arc<dyn Backend>>> {
    match device.kind {
        DeviceType::Cpu => Ok(None),
        DeviceType::CudaHost => match crate::backend::backend_for(pinned_source()) {
            Ok(cuda) => Ok(Some(cuda)),
            Err(Error::BackendUnavailable { backend, reason }) => Err(Error::BackendUnavailable {
                backend,
                reason: format!("new {device} memory is page-locked memory from CUDA: {reason}"),
            }),
            Err(e) => Err(e),
        },
        _ => Err(Error::no_new_memory(device)),
    }
}

/// The CUDA device whose page-locked memory new `kDLCUDAHost` memory is: device 0 (DLPack
/// gives pinned memory no device of its own). This crate's tests with `kernel-host-tests` may
/// name an emulated device for the calling thread instead (`pin_host_memory_on`), so that
/// code allocating `kDLCUDAHost` memory runs without a GPU.
fn pinned_source() -> Device {
    #[cfg(all(test, feature = "kernel-host-tests"))]
    if let Some(d) = PINNED_SOURCE.with(std::cell::Cell::get) {
        return d;
    }
    Device::cuda(0)
}

#[cfg(all(test, feature = "kernel-host-tests"))]
thread_local! {
    static PINNED_SOURCE: std::cell::Cell<Option<Device>> = const { std::cell::Cell::new(None) };
}

/// Makes new `kDLCUDAHost` memory on this thread page-locked memory of the emulated CUDA
/// `device` (`None`: of device 0 again), for tests without a GPU.
#[cfg(all(test, feature = "kernel-host-tests"))]
pub(crate) fn pin_host_memory_on(device: Option<Device>) {
    PINNED_SOURCE.with(|s| s.set(device));
}

impl CpuBackend {
    /// Checks that `src` can be read and `dst` written by this backend, with one dtype.
    fn check_pair(&self, op: &dyn fmt::Display, src: &Tensor, dst: &Tensor) -> Result<usize> {
        for t in [src, dst] {
            if !t.device().is_host_accessible() {
                return Err(Error::UnsupportedDevice {
                    device: t.device().to_string(),
                    op: format!("{op} on the CPU backend"),
                });
            }
        }
        if src.dtype() != dst.dtype() {
            return Err(Error::shape(
                format!("{op}: source and destination dtypes differ"),
                format!("{} and {}", src.dtype(), dst.dtype()),
            ));
        }
        if dst.readonly() {
            return Err(Error::ReadOnly {
                what: format!("{op} destination {dst:?}"),
            });
        }
        Ok(src.dtype().itemsize())
    }
}

/// The values of a 1-d int64 index tensor, borrowed when contiguous, aligned and not aliased
/// by `out`.
fn index_values<'a>(indices: &'a Tensor, out: &Tensor) -> Result<Cow<'a, [i64]>> {
    if indices.dtype() != DType::Int64 || indices.ndim() != 1 {
        return Err(Error::shape(
            "indices must be a 1-d int64 tensor",
            format!(
                "{} of shape {}",
                indices.dtype(),
                tuple_string(indices.shape())
            ),
        ));
    }
    if !indices.device().is_host_accessible() {
        return Err(Error::UnsupportedDevice {
            device: indices.device().to_string(),
            op: "indices on the CPU backend".into(),
        });
    }
    let n = indices.shape()[0];
    let p = indices.data_ptr() as *const i64;
    let out_span = span(
        out.data_ptr(),
        out.shape(),
        out.strides(),
        out.dtype().itemsize(),
    );
    let idx_span = span(p as *const u8, indices.shape(), indices.strides(), 8);
    if n == 0 {
        Ok(Cow::Borrowed(&[]))
    } else if (n == 1 || indices.strides()[0] == 1)
        && p.is_aligned()
        && !overlap(idx_span, out_span)
    {
        // SAFETY: `n` contiguous, aligned int64 values kept alive by `indices` for 'a, and
        // nothing writes them during the call (they do not overlap `out`).
        Ok(Cow::Borrowed(unsafe { std::slice::from_raw_parts(p, n) }))
    } else {
        let s = indices.strides()[0];
        // SAFETY: element `i < n` of a valid 1-d tensor; unaligned reads are allowed.
        Ok(Cow::Owned(
            (0..n as isize)
                .map(|i| unsafe { p.wrapping_offset(i * s).read_unaligned() })
                .collect(),
        ))
    }
}

fn src_view(t: &Tensor) -> SrcView<'_> {
    SrcView {
        ptr: t.data_ptr(),
        shape: t.shape(),
        strides: t.strides(),
    }
}

fn dst_view(t: &Tensor) -> DstView<'_> {
    DstView {
        ptr: t.data_ptr(),
        shape: t.shape(),
        strides: t.strides(),
    }
}

impl Backend for CpuBackend {
    fn device(&self) -> Device {
        self.device
    }

    /// Host memory dlpart allocates is `kDLCPU` (of this backend's id); `kDLCUDAHost` memory is
    /// real page-locked memory from the CUDA backend; other kinds (managed, ROCm host) are
    /// refused, as plain memory would be mislabelled as them (a consumer could hand it to
    /// device kernels).
    fn empty(&self, shape: &[usize], dtype: DType) -> Result<Tensor> {
        if let Some(pinned) = host_allocator(self.device)? {
            return pinned.empty_staging(shape, dtype);
        }
        let n = crate::tensor::checked_numel(shape)?;
        let nbytes = n
            .checked_mul(dtype.itemsize())
            .ok_or_else(|| Error::shape("tensor too large", tuple_string(shape)))?;
        let buf = HostBuffer::uninit(nbytes).map_err(|_| {
            Error::host_oom(
                nbytes,
                format!("a {dtype} tensor of shape {}", tuple_string(shape)),
            )
        })?;
        let buf = Arc::new(buf);
        // SAFETY: the buffer holds numel * itemsize bytes laid out in C order for `shape`.
        Ok(unsafe { Tensor::contiguous_unchecked(buf.as_ptr(), shape, dtype, self.device, buf) })
    }

    /// Tensors under [`HostBuffer::HUGE`] bytes share one allocation (64-byte aligned each):
    /// thousands of small targets then cost one allocation, and page faults on 2 MiB pages,
    /// rather than one allocation and a fault per 4 KiB page each, at whatever state the
    /// allocator was left in. Larger tensors get buffers of their own.
    fn empty_many(&self, shapes: &[&[usize]], dtype: DType) -> Result<Vec<Tensor>> {
        const ALIGN: usize = 64;
        if let Some(pinned) = host_allocator(self.device)? {
            return shapes
                .iter()
                .map(|s| pinned.empty_staging(s, dtype))
                .collect();
        }
        let mut offsets = Vec::with_capacity(shapes.len());
        let mut total = 0usize;
        for shape in shapes {
            let nbytes = crate::tensor::checked_numel(shape)?
                .checked_mul(dtype.itemsize())
                .filter(|&n| n < HostBuffer::HUGE)
                .map(|n| n.next_multiple_of(ALIGN));
            // A total that saturates is refused by the allocation below.
            offsets.push(nbytes.map(|n| {
                let at = total;
                total = total.saturating_add(n);
                at
            }));
        }
        let arena = HostBuffer::uninit(total).map_err(|_| {
            Error::host_oom(total, format!("{} small {dtype} tensors", shapes.len()))
        })?;
        let arena = Arc::new(arena);
        // An explicit loop into a Vec of the final size: collecting an iterator of Results
        // cannot size the Vec up front, and its regrowth (about 10 MB moved for 65,536
        // targets) made this take 6.3 ms instead of 1.6 ms here.
        let mut r = Vec::with_capacity(shapes.len());
        for (shape, offset) in shapes.iter().zip(offsets) {
            r.push(match offset {
                None => self.empty(shape, dtype)?,
                // SAFETY: the tensor's numel * itemsize bytes, in C order, lie inside the
                // arena at `offset` (the offsets above step by each size rounded up to 64);
                // each tensor holds the Arc, so the arena outlives every view of it.
                Some(offset) => unsafe {
                    Tensor::contiguous_unchecked(
                        arena.as_ptr().wrapping_add(offset),
                        shape,
                        dtype,
                        self.device,
                        arena.clone(),
                    )
                },
            });
        }
        Ok(r)
    }

    unsafe fn copy_boxes_unchecked(&self, jobs: &[BoxCopy<'_>]) -> Result<()> {
        let mut ptrs = Vec::with_capacity(jobs.len());
        let mut spans = Vec::with_capacity(jobs.len());
        for (n, j) in jobs.iter().enumerate() {
            let itemsize = self.check_pair(&Job(n, ""), j.src, j.dst)?;
            let src = box_ptr(j.src, &j.src_start, &j.shape, &Job(n, ": source"))?;
            let dst = box_ptr(j.dst, &j.dst_start, &j.shape, &Job(n, ": destination"))?;
            spans.push((
                span(src, &j.shape, j.src.strides(), itemsize),
                span(dst, &j.shape, j.dst.strides(), itemsize),
            ));
            ptrs.push((src as *const u8, dst, itemsize));
        }
        // Each box claims its elements only: a box of a column block leaves the next block's
        // columns, inside its span, to other threads.
        let _claim = access::boxes(
            "box copy",
            jobs.iter().enumerate().map(|(n, j)| {
                let source = Role::nth("source of copy job", n);
                (source, (j.src, &j.src_start[..], &j.shape[..]))
            }),
            jobs.iter().enumerate().map(|(n, j)| {
                let destination = Role::nth("destination of copy job", n);
                (destination, (j.dst, &j.dst_start[..], &j.shape[..]))
            }),
        )?;
        let mut temps = Vec::new();
        for (n, (j, &(src, _, itemsize))) in jobs.iter().zip(&ptrs).enumerate() {
            if overlap(spans[n].0, spans[n].1) {
                // A job that reads memory it writes reads a packed copy of its source first,
                // as numpy does for overlapping assignments.
                let view = SrcView {
                    ptr: src,
                    shape: &j.shape,
                    strides: j.src.strides(),
                };
                temps.push((n, packed(view, itemsize)?));
            }
        }
        let mut temps = temps.iter().peekable();
        let raw: Vec<RawCopy<'_>> = jobs
            .iter()
            .zip(&ptrs)
            .enumerate()
            .map(|(n, (j, &(src, dst, itemsize)))| {
                let src = match temps.next_if(|t| t.0 == n) {
                    Some((_, (buf, strides))) => SrcView {
                        ptr: buf.as_ptr(),
                        shape: &j.shape,
                        strides,
                    },
                    None => SrcView {
                        ptr: src,
                        shape: &j.shape,
                        strides: j.src.strides(),
                    },
                };
                let dst = DstView {
                    ptr: dst,
                    shape: &j.shape,
                    strides: j.dst.strides(),
                };
                RawCopy { src, dst, itemsize }
            })
            .collect();
        // SAFETY: every box was checked to lie inside its tensor, destinations are writable
        // host memory, sources that overlap their destination were replaced by copies, and the
        // trait's contract keeps destinations apart from each other and from other sources.
        unsafe { copy_boxes(&raw) };
        Ok(())
    }

    /// Checks every tensor once against the plan's grids, then copies the boxes without
    /// a per-box allocation or plan (see `repart.rs`).
    unsafe fn copy_plan(&self, plan: &Plan, src: &[&Tensor], dst: &[&Tensor]) -> Result<()> {
        repart::copy_plan(plan, src, dst, &copy::TUNING)
    }

    /// Host indices only, checked on the calling thread (in parallel when there are many).
    fn normalise_indices(&self, indices: &Tensor, axis: usize, len: usize) -> Result<Tensor> {
        let _claim = access::tensors("index check", [(Role::new("indices"), indices)], [])?;
        normalise::normalise_indices(indices, axis, len)
    }

    /// Every index is checked before anything is written: one out of range is
    /// [`Error::IndexOutOfRange`] naming the first such one, with `out` as it was.
    fn gather(&self, src: &Tensor, indices: &Tensor, axis: usize, out: &Tensor) -> Result<()> {
        let itemsize = self.check_pair(&"gather", src, out)?;
        // The kernel writes `out` from several threads: an element it holds twice would race.
        crate::ops::check_distinct(out, "gather output")?;
        let reads = [(Role::new("source"), src), (Role::new("indices"), indices)];
        let _claim = access::tensors("gather", reads, [(Role::new("output"), out)])?;
        let idx = index_values(indices, out)?;
        // SAFETY: both tensors are valid host memory, `out` is writable; shapes and indices
        // are checked by the kernel before any access they govern.
        unsafe { index_checked::<false>(src_view(src), &idx, axis, dst_view(out), itemsize) }
    }

    /// Long lists of host int64 indices along an array's outermost axis are gathered straight
    /// from the caller's memory (see `direct.rs`), without a copy of the whole list; others
    /// are normalised first.
    fn gather_from_caller(
        &self,
        src: &Tensor,
        indices: &Tensor,
        axis: usize,
        out: Option<&Tensor>,
    ) -> Result<Tensor> {
        match direct::gather(self, src, indices, axis, out)? {
            Some(out) => Ok(out),
            None => crate::ops::gather_normalised(self, src, indices, axis, out),
        }
    }

    /// Every index is checked before anything is written: one out of range is
    /// [`Error::IndexOutOfRange`] naming the first such one, with `out` as it was.
    fn scatter(&self, values: &Tensor, indices: &Tensor, axis: usize, out: &Tensor) -> Result<()> {
        let itemsize = self.check_pair(&"scatter", values, out)?;
        crate::ops::check_distinct(out, "scatter target")?;
        let reads = [
            (Role::new("values"), values),
            (Role::new("indices"), indices),
        ];
        let _claim = access::tensors("scatter", reads, [(Role::new("output"), out)])?;
        let idx = index_values(indices, out)?;
        // SAFETY: as for `gather`.
        unsafe { index_checked::<true>(src_view(values), &idx, axis, dst_view(out), itemsize) }
    }

    /// Between host-accessible devices only (`kDLCPU`, `kDLCUDAHost`, ...): one box copy.
    fn transfer(&self, src: &Tensor, dst: &Tensor) -> Result<()> {
        self.check_pair(&"transfer", src, dst)?;
        if src.shape() != dst.shape() {
            return Err(Error::shape(
                "transfer: source and destination shapes differ",
                format!(
                    "{} -> {}",
                    tuple_string(src.shape()),
                    tuple_string(dst.shape())
                ),
            ));
        }
        crate::ops::check_distinct(dst, "transfer destination")?;
        let job = BoxCopy::whole(src, dst);
        // SAFETY: one job, whose destination holds each element once (checked above): there
        // is no other job whose boxes it could meet.
        unsafe { self.copy_boxes_unchecked(&[job]) }
    }
}

/// A C-order copy of the box `src` and its strides.
/// A staging copy that does not fit in host memory is an [`Error::OutOfMemory`].
fn packed(src: SrcView<'_>, itemsize: usize) -> Result<(HostBuffer, Vec<isize>)> {
    // A size that saturates is refused by the allocation below.
    let nbytes = crate::tensor::checked_numel(src.shape)?.saturating_mul(itemsize);
    let what = || format!("staging a copy of shape {}", tuple_string(src.shape));
    let buf = HostBuffer::uninit(nbytes).map_err(|_| Error::host_oom(nbytes, what()))?;
    // SAFETY: `src` is a valid box (checked by the caller) and `buf` holds exactly its
    // elements in C order; `buf` is new, so nothing else touches it.
    unsafe { pack(src, buf.as_ptr(), itemsize) };
    Ok((buf, contiguous_strides(src.shape)))
}

/// Gather or scatter between tensors that may alias each other: an aliased source is copied
/// first, so that the result is as if every value was read before any was written. An index
/// out of range is [`Error::IndexOutOfRange`] before anything is written.
///
/// # Safety
/// The views must describe valid host memory, `dst` writable.
unsafe fn index_checked<const SCATTER: bool>(
    src: SrcView<'_>,
    idx: &[i64],
    axis: usize,
    dst: DstView<'_>,
    itemsize: usize,
) -> Result<()> {
    // Every index checked before the first write (the kernels check each as they use it,
    // after earlier ones were written): a pass over the indices, cheap beside the copy.
    let indexed = if SCATTER { dst.shape } else { src.shape };
    if let Some(&len) = indexed.get(axis) {
        index::check_indices(idx, axis, len)?;
    }
    let aliased = overlap(
        span(src.ptr, src.shape, src.strides, itemsize),
        span(dst.ptr, dst.shape, dst.strides, itemsize),
    );
    let temp = aliased.then(|| packed(src, itemsize)).transpose()?;
    let src = match &temp {
        Some((buf, strides)) => SrcView {
            ptr: buf.as_ptr(),
            shape: src.shape,
            strides,
        },
        None => src,
    };
    // SAFETY: forwarded; `src` no longer overlaps `dst`.
    unsafe {
        if SCATTER {
            scatter(src, idx, axis, dst, itemsize)
        } else {
            gather(src, idx, axis, dst, itemsize)
        }
    }
}
