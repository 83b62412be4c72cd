//! `Tensor`: a strided n-d array on some device, whose memory is kept alive by a shared owner.
//!
//! A tensor is a view: a pointer to element `[0, ..., 0]`, a shape, strides in elements (any
//! sign, zero allowed), a dtype, a device and a read-only flag. The memory belongs to `owner`,
//! an `Arc` that releases it when the last view goes: a Rust allocation ([`HostBuffer`]), the
//! buffer of an ndarray array ([`Tensor::from_ndarray`], [`Tensor::from_arc_array`]), a
//! foreign DLPack tensor whose deleter runs on drop ([`crate::dlpack::ForeignTensor`]), or a
//! device allocation of a backend. Views of views share the one owner.

use std::any::Any;

use ndarray::{ArcArray, Array, Dimension, ShapeBuilder};
use std::fmt;
use std::sync::Arc;

use crate::access::{self, Role};
use crate::device::Device;
use crate::dtype::DType;
use crate::error::{tuple_string, Error, Result};

/// Whatever keeps a tensor's memory alive. Dropping the last reference releases the memory.
pub type Owner = Arc<dyn Any + Send + Sync>;

/// A strided n-d array on a device. Cloning a `Tensor` makes another view of the same memory.
#[derive(Clone)]
pub struct Tensor {
    data: *mut u8,
    shape: Axes<usize>,
    strides: Axes<isize>,
    dtype: DType,
    device: Device,
    readonly: bool,
    owner: Owner,
}

/// What the claim of an [`Tensor::as_array`] or [`Tensor::as_array_mut`] view is to it, as
/// another operation refused by it names it (see [`crate::access`]).
const LIVE_VIEW: Role = Role::new("live view");

/// Axes a tensor holds inline; more go to the heap. Four covers the arrays seen in practice
/// (images, volumes, batches of matrices) and keeps a `Tensor` at 120 bytes rather than 152
/// with six: an array of 4,096 partitions holds 4,096 tensors, and importing one is bound by
/// the cache misses of reading and writing them.
const INLINE_AXES: usize = 4;

/// A tensor's shape or strides: inline up to [`INLINE_AXES`] axes, so that making (and
/// dropping) a tensor allocates nothing. A repartition into a fine grid makes one tensor per
/// target: for 65,536 targets of 32x32 float32, the two `Vec`s per tensor cost about 13 ms of
/// the call here, alongside about 56 ms of copying. The operations use it for the shapes they
/// work out per call, for the same reason.
#[derive(Clone)]
pub(crate) enum Axes<T: Copy + Default> {
    Inline { len: u8, v: [T; INLINE_AXES] },
    Heap(Box<[T]>),
}

impl<T: Copy + Default> From<&[T]> for Axes<T> {
    #[inline]
    fn from(s: &[T]) -> Self {
        if s.len() <= INLINE_AXES {
            let mut v = [T::default(); INLINE_AXES];
            v[..s.len()].copy_from_slice(s);
            Axes::Inline {
                len: s.len() as u8,
                v,
            }
        } else {
            Axes::Heap(s.into())
        }
    }
}

impl<T: Copy + Default> From<Vec<T>> for Axes<T> {
    fn from(v: Vec<T>) -> Self {
        if v.len() <= INLINE_AXES {
            Axes::from(v.as_slice())
        } else {
            Axes::Heap(v.into_boxed_slice())
        }
    }
}

impl<T: Copy + Default> std::ops::Deref for Axes<T> {
    type Target = [T];

    #[inline]
    fn deref(&self) -> &[T] {
        match self {
            Axes::Inline { len, v } => &v[..*len as usize],
            Axes::Heap(b) => b,
        }
    }
}

impl<T: Copy + Default> std::ops::DerefMut for Axes<T> {
    #[inline]
    fn deref_mut(&mut self) -> &mut [T] {
        match self {
            Axes::Inline { len, v } => &mut v[..*len as usize],
            Axes::Heap(b) => b,
        }
    }
}

// SAFETY: `data` points into memory owned by `owner`, which is `Send + Sync`. Clones and views
// in other threads reach the same memory, and safe operations write through `&Tensor`; every
// read and write dlpart makes of host memory, and every view `as_array` and `as_array_mut`
// hand out, first claims its byte ranges (`crate::access`), which refuses a write that meets
// any other live claim and a read that meets a live write: no two threads touch the same
// bytes with one writing. The `unsafe` APIs that skip those checks make exclusivity their caller's contract.
unsafe impl Send for Tensor {}
// SAFETY: see `Send`; shared references read the metadata, and the memory only under a claim.
unsafe impl Sync for Tensor {}

/// Row-major (C-order) strides in elements for `shape`.
pub fn contiguous_strides(shape: &[usize]) -> Vec<isize> {
    let mut strides = vec![0isize; shape.len()];
    let mut acc = 1isize;
    for (s, &n) in strides.iter_mut().zip(shape).rev() {
        *s = acc;
        acc = acc.saturating_mul(n.max(1) as isize);
    }
    strides
}

/// Whether `shape` with `strides` (in elements) lays its elements out in C order without
/// gaps (axes of extent 1 may have any stride; an empty shape always does).
pub(crate) fn is_c_contiguous(shape: &[usize], strides: &[isize]) -> bool {
    if shape.contains(&0) {
        return true;
    }
    let mut expect = 1isize;
    for (&n, &s) in shape.iter().zip(strides).rev() {
        if n > 1 && s != expect {
            return false;
        }
        expect = expect.saturating_mul(n as isize);
    }
    true
}

/// Product of `shape`, or an error naming the shape when the product of its non-zero axes
/// overflows `isize`. That is ndarray's rule (and numpy's, counted in elements): a shape with
/// a zero is refused or accepted whatever the order of its axes, and every tensor has an
/// `ndarray` view.
pub fn checked_numel(shape: &[usize]) -> Result<usize> {
    shape
        .iter()
        .try_fold(1usize, |acc, &n| acc.checked_mul(n.max(1)))
        .filter(|&n| n <= isize::MAX as usize)
        .map(|n| if shape.contains(&0) { 0 } else { n })
        .ok_or_else(|| Error::shape("shape has too many elements", tuple_string(shape)))
}

impl Tensor {
    /// Builds a tensor from raw parts.
    ///
    /// # Safety
    /// For every index within `shape`, `data + sum(index * strides) * itemsize` must lie inside
    /// memory that stays valid (and, unless `readonly`, writable) for as long as `owner` lives.
    /// `data` may be dangling only when the tensor has no elements.
    pub unsafe fn from_raw_parts(
        data: *mut u8,
        shape: Vec<usize>,
        strides: Vec<isize>,
        dtype: DType,
        device: Device,
        readonly: bool,
        owner: Owner,
    ) -> Self {
        // SAFETY: forwarded caller contract.
        unsafe { Self::from_raw_slices(data, &shape, &strides, dtype, device, readonly, owner) }
    }

    /// As [`Tensor::from_raw_parts`], with the shape and strides borrowed: nothing is
    /// allocated for them up to the axes a tensor holds inline.
    ///
    /// # Safety
    /// As for [`Tensor::from_raw_parts`].
    pub(crate) unsafe fn from_raw_slices(
        data: *mut u8,
        shape: &[usize],
        strides: &[isize],
        dtype: DType,
        device: Device,
        readonly: bool,
        owner: Owner,
    ) -> Self {
        debug_assert_eq!(shape.len(), strides.len());
        Tensor {
            data,
            shape: shape.into(),
            strides: strides.into(),
            dtype,
            device,
            readonly,
            owner,
        }
    }

    /// A C-order tensor of `shape` at `data`, with no allocation for its shape and strides.
    ///
    /// # Safety
    /// As for [`Tensor::from_raw_parts`], with C-order strides for `shape`.
    pub(crate) unsafe fn contiguous_unchecked(
        data: *mut u8,
        shape: &[usize],
        dtype: DType,
        device: Device,
        owner: Owner,
    ) -> Self {
        let strides = if shape.len() <= INLINE_AXES {
            let mut v = [0isize; INLINE_AXES];
            let mut acc = 1isize;
            for (s, &n) in v[..shape.len()].iter_mut().zip(shape).rev() {
                *s = acc;
                acc = acc.saturating_mul(n.max(1) as isize);
            }
            Axes::Inline {
                len: shape.len() as u8,
                v,
            }
        } else {
            contiguous_strides(shape).into()
        };
        Tensor {
            data,
            shape: shape.into(),
            strides,
            dtype,
            device,
            readonly: false,
            owner,
        }
    }

    /// A new zero-filled contiguous tensor in host memory.
    pub fn zeros(shape: &[usize], dtype: DType) -> Result<Self> {
        let n = checked_numel(shape)?;
        let nbytes = n
            .checked_mul(dtype.itemsize())
            .ok_or_else(|| Error::shape("tensor too large", tuple_string(shape)))?;
        let buf = Arc::new(HostBuffer::zeroed(nbytes)?);
        let data = buf.as_ptr();
        // SAFETY: `buf` holds `nbytes = numel * itemsize` bytes and the strides are C-order for
        // `shape`, so every in-bounds index addresses memory inside it; the Arc keeps it alive.
        Ok(unsafe { Tensor::contiguous_unchecked(data, shape, dtype, Device::CPU, buf) })
    }

    /// A new host tensor holding `values` in C order.
    pub fn from_slice<T: Element>(values: &[T], shape: &[usize]) -> Result<Self> {
        let n = checked_numel(shape)?;
        if n != values.len() {
            return Err(Error::shape(
                format!("{} values do not fill shape", values.len()),
                tuple_string(shape),
            ));
        }
        let t = Tensor::zeros(shape, T::DTYPE)?;
        // SAFETY: `t` is a fresh contiguous allocation of exactly `n` elements of `T`, not yet
        // shared with anyone.
        unsafe { std::ptr::copy_nonoverlapping(values.as_ptr(), t.data as *mut T, n) };
        Ok(t)
    }

    /// A new host tensor of `dtype` holding `bytes`: its elements in C order, each
    /// `dtype.itemsize()` bytes as this machine lays that dtype out. The way to build tensors
    /// of the dtypes without an [`Element`] type (the float8 types; float16 and bfloat16
    /// without the `half` feature); [`Tensor::to_bytes`] reads them back.
    ///
    /// ```
    /// use dlpart::{DType, Tensor};
    ///
    /// // float8_e4m3fn: 0x38 is 1.0, 0xC0 is -2.0.
    /// let t = Tensor::from_bytes(&[0x38, 0xC0, 0x00, 0x38], &[2, 2], DType::Float8E4M3Fn)?;
    /// assert_eq!(t.dtype(), DType::Float8E4M3Fn);
    /// let column = t.view(&[0, 1], &[2, 1])?;
    /// assert_eq!(column.to_bytes()?, vec![0xC0, 0x38]);
    /// # Ok::<(), dlpart::Error>(())
    /// ```
    pub fn from_bytes(bytes: &[u8], shape: &[usize], dtype: DType) -> Result<Self> {
        // A shape of more elements than memory holds is one the bytes do not fill either.
        let want = checked_numel(shape)
            .ok()
            .and_then(|n| n.checked_mul(dtype.itemsize()));
        if want != Some(bytes.len()) {
            return Err(Error::shape(
                format!(
                    "{} bytes do not fill a {dtype} tensor of {} bytes per element and shape",
                    bytes.len(),
                    dtype.itemsize()
                ),
                tuple_string(shape),
            ));
        }
        let t = Tensor::zeros(shape, dtype)?;
        // SAFETY: `t` is a fresh contiguous allocation of exactly `bytes.len()` bytes, not yet
        // shared with anyone.
        unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), t.data, bytes.len()) };
        Ok(t)
    }

    /// The bytes of host data's elements in C order, each `dtype().itemsize()` bytes as in
    /// memory: every dtype reads this way, those without an [`Element`] type (the float8
    /// types) included. Device memory is refused as by [`Tensor::to_array`]; copy it to the
    /// host first ([`Tensor::to_device`]).
    pub fn to_bytes(&self) -> Result<Vec<u8>> {
        self.read_bytes("to_bytes", <[u8]>::to_vec)
    }

    /// `read` of the bytes [`Tensor::to_bytes`] returns, borrowed: this tensor's own memory
    /// where it is contiguous, else a contiguous copy in `kDLCPU` memory (dlpart's own kernel;
    /// host memory of any kind is read as `kDLCPU`, so no pinned or managed memory is made).
    /// Device memory is refused, naming `op`.
    pub(crate) fn read_bytes<R>(
        &self,
        op: &'static str,
        read: impl FnOnce(&[u8]) -> R,
    ) -> Result<R> {
        if !self.device.is_host_accessible() {
            return Err(Error::UnsupportedDevice {
                device: self.device.to_string(),
                op: op.into(),
            });
        }
        let c = match self.is_contiguous() {
            true => self.clone(),
            false => crate::ops::to_device(self, Device::CPU)?,
        };
        let _claim = access::tensors(op, [(Role::new("tensor"), &c)], [])?;
        if c.numel() == 0 {
            return Ok(read(&[]));
        }
        // SAFETY: `c` is contiguous host memory of `numel * itemsize` bytes from `data`, kept
        // alive by `c.owner`, and claimed for reading above so no dlpart write races it.
        Ok(read(unsafe {
            std::slice::from_raw_parts(c.data.cast_const(), c.nbytes())
        }))
    }

    /// A writable host tensor over the buffer of `a`, without copying: the tensor takes the
    /// array's allocation and keeps it alive, and its shape and strides (in elements, of any
    /// sign) are the array's own, so Fortran-order, sliced and reversed arrays stay zero-copy.
    ///
    /// ```
    /// use dlpart::Tensor;
    ///
    /// let a = ndarray::array![[1.0f32, 2.0, 3.0], [4.0, 5.0, 6.0]].reversed_axes();
    /// let first = a.as_ptr();
    /// let t = Tensor::from_ndarray(a);
    /// assert_eq!(t.data_ptr().cast_const(), first.cast::<u8>());
    /// assert_eq!((t.shape(), t.strides()), (&[3, 2][..], &[1, 3][..]));
    /// assert_eq!(t.as_array::<f32>()?[[2, 1]], 6.0);
    /// # Ok::<(), dlpart::Error>(())
    /// ```
    pub fn from_ndarray<T: Element, D: Dimension>(a: Array<T, D>) -> Tensor {
        let shape = a.shape().to_vec();
        let strides = a.strides().to_vec();
        let (mut vec, offset) = a.into_raw_vec_and_offset();
        // `offset` is `None` only for an empty array, whose pointer is never dereferenced.
        let data = vec
            .as_mut_ptr()
            .wrapping_add(offset.unwrap_or(0))
            .cast::<u8>();
        // Moving the Vec into the Arc leaves its heap buffer, and so `data`, where it is.
        let owner: Owner = Arc::new(VecOwner { _vec: vec });
        // SAFETY: ndarray's invariants for `a` (which held this Vec) say that every index
        // within `shape` addresses, from element `offset` with these strides, an element of
        // the Vec; the Vec is owned by `owner` and nothing else can reach it (`VecOwner` is
        // private and exposes nothing), so writing through the tensor is exclusive to it.
        unsafe { Tensor::from_raw_parts(data, shape, strides, T::DTYPE, Device::CPU, false, owner) }
    }

    /// A read-only host tensor over the buffer of `a`, without copying; the tensor keeps a
    /// clone of `a` as its owner.
    ///
    /// Read-only because the buffer is shared: any clone of `a` may be mutated, which
    /// copies-on-write only while the buffer is shared, so dlpart must never write into it.
    /// For a writable tensor use `Tensor::from_ndarray(a.into_owned())`, which copies only
    /// if another `ArcArray` still shares the buffer.
    pub fn from_arc_array<T: Element, D: Dimension + 'static>(a: ArcArray<T, D>) -> Tensor {
        let data = a.as_ptr().cast_mut().cast::<u8>();
        let shape = a.shape().to_vec();
        let strides = a.strides().to_vec();
        let owner: Owner = Arc::new(ArcOwner { _array: a });
        // SAFETY: ndarray's invariants for `a` say that every index within `shape` addresses,
        // from `a.as_ptr()` with these strides, an element of its buffer; `owner` holds a
        // handle to that buffer, so it lives as long as the tensor, and a mutation through
        // another handle copies-on-write (the buffer is shared with `owner`) rather than
        // touching it. The tensor is read-only, so dlpart never writes it either.
        unsafe { Tensor::from_raw_parts(data, shape, strides, T::DTYPE, Device::CPU, true, owner) }
    }

    /// Extent per axis; empty for a 0-d tensor.
    pub fn shape(&self) -> &[usize] {
        &self.shape
    }
    /// Strides in elements.
    pub fn strides(&self) -> &[isize] {
        &self.strides
    }
    /// The element type.
    pub fn dtype(&self) -> DType {
        self.dtype
    }
    /// The device whose memory holds the elements.
    pub fn device(&self) -> Device {
        self.device
    }
    /// Whether the elements must not be written (by dlpart or through an export).
    pub fn readonly(&self) -> bool {
        self.readonly
    }
    /// The number of axes.
    pub fn ndim(&self) -> usize {
        self.shape.len()
    }
    /// The number of elements (1 for a 0-d tensor).
    pub fn numel(&self) -> usize {
        self.shape.iter().product()
    }
    /// Bytes of the elements (not of the span they occupy).
    pub fn nbytes(&self) -> usize {
        self.numel() * self.dtype.itemsize()
    }
    /// Address of element `[0, ..., 0]` (dangling or null when the tensor is empty).
    pub fn data_ptr(&self) -> *mut u8 {
        self.data
    }
    /// The owner keeping the memory alive.
    pub fn owner(&self) -> &Owner {
        &self.owner
    }

    /// This tensor's host memory labelled `kDLCPU` (the CPU reads and writes every
    /// host-accessible kind alike), for dlpart's own host-to-host work; `None` for memory the
    /// host cannot reach.
    #[cfg(feature = "python")]
    pub(crate) fn as_cpu(&self) -> Option<Tensor> {
        if !self.device.is_host_accessible() {
            return None;
        }
        // SAFETY: the same memory, layout, read-only flag and owner; only the label changes,
        // between host-accessible kinds, which the CPU addresses alike.
        Some(unsafe {
            Tensor::from_raw_parts(
                self.data_ptr(),
                self.shape().to_vec(),
                self.strides().to_vec(),
                self.dtype(),
                Device::CPU,
                self.readonly(),
                self.owner().clone(),
            )
        })
    }

    /// Whether the elements are laid out in C order without gaps.
    pub fn is_contiguous(&self) -> bool {
        is_c_contiguous(&self.shape, &self.strides)
    }

    /// Byte offsets (relative to `data_ptr`) of the lowest and one-past-highest bytes that
    /// the elements touch; `(0, 0)` for an empty tensor.
    pub fn byte_span(&self) -> (isize, isize) {
        if self.numel() == 0 {
            return (0, 0);
        }
        let item = self.dtype.itemsize() as isize;
        let (mut lo, mut hi) = (0isize, 0isize);
        for (&n, &s) in self.shape.iter().zip(self.strides.iter()) {
            let ext = (n as isize - 1) * s * item;
            if ext < 0 {
                lo += ext;
            } else {
                hi += ext;
            }
        }
        (lo, hi + item)
    }

    /// The same memory marked read-only (or not). Marking read-only data writable is refused.
    pub fn with_readonly(&self, readonly: bool) -> Result<Self> {
        if self.readonly && !readonly {
            return Err(Error::ReadOnly {
                what: format!("tensor {self:?}"),
            });
        }
        let mut t = self.clone();
        t.readonly = readonly;
        Ok(t)
    }

    /// The same elements with an axis of extent 1 inserted at `axis` (at most `ndim`): the
    /// slab of one that a gather or scatter with one index (which drops the axis, as numpy's
    /// do) runs over.
    pub(crate) fn with_unit_axis(&self, axis: usize) -> Self {
        debug_assert!(axis <= self.ndim());
        let (mut shape, mut strides) = (self.shape.to_vec(), self.strides.to_vec());
        // Any stride reaches the one element along an axis of extent 1; this one keeps a
        // C-ordered tensor C-ordered.
        let stride = match axis < self.ndim() {
            true => strides[axis].saturating_mul(shape[axis] as isize),
            false => 1,
        };
        shape.insert(axis, 1);
        strides.insert(axis, stride);
        let mut t = self.clone();
        t.shape = shape.into();
        t.strides = strides.into();
        t
    }

    /// A view of these elements broadcast to `shape` by numpy's rules, as numpy's fancy
    /// assignment broadcasts its values: the axes aligned from the end, an axis of extent 1
    /// (or one missing in front) repeated with stride 0, and leading axes of extent 1 beyond
    /// `shape`'s dropped (`a[i] = v` takes `v` of shape `(1, n)` for a row of `n`). `None`
    /// where the shapes do not broadcast. The view reads the same memory, within the same
    /// span; its repeated elements make it a source only (targets are checked to be distinct).
    pub(crate) fn broadcast_to(&self, shape: &[usize]) -> Option<Self> {
        if *self.shape == *shape {
            return Some(self.clone());
        }
        let extra = self.ndim().saturating_sub(shape.len());
        if self.shape[..extra].iter().any(|&n| n != 1) {
            return None;
        }
        let lead = shape.len() - (self.ndim() - extra);
        let mut strides = vec![0isize; shape.len()];
        let own = self.shape[extra..].iter().zip(&self.strides[extra..]);
        for (k, (&n, &stride)) in own.enumerate() {
            strides[lead + k] = match (n, shape[lead + k]) {
                (n, want) if n == want => stride,
                (1, _) => 0,
                _ => return None,
            };
        }
        let mut t = self.clone();
        t.shape = shape.to_vec().into();
        t.strides = strides.into();
        Some(t)
    }

    /// The same elements without axis `axis`, whose extent is 1.
    pub(crate) fn without_unit_axis(&self, axis: usize) -> Self {
        debug_assert_eq!(self.shape[axis], 1);
        let (mut shape, mut strides) = (self.shape.to_vec(), self.strides.to_vec());
        shape.remove(axis);
        strides.remove(axis);
        let mut t = self.clone();
        t.shape = shape.into();
        t.strides = strides.into();
        t
    }

    /// A C-order tensor of `shape` at byte `offset` of this contiguous buffer, sharing its
    /// memory and owner: one box of a packed buffer (a repartition's crossing, an SPMD
    /// exchange's send and receive buffers). Callers lay their boxes out inside the buffer.
    pub(crate) fn box_view(&self, offset: usize, shape: &[usize]) -> Tensor {
        debug_assert!(
            self.is_contiguous()
                && (shape.iter().product::<usize>() * self.dtype.itemsize())
                    .checked_add(offset)
                    .is_some_and(|end| end <= self.nbytes()),
            "a box of shape {shape:?} at byte {offset} of {self:?}"
        );
        // SAFETY: callers lay the boxes out inside the contiguous buffer: `offset` plus the
        // box's bytes is at most `self.nbytes()`, so every element of the C-order view lies
        // inside this tensor's memory, which its owner, cloned into the view, keeps alive.
        // Device addresses are only offset, never dereferenced here.
        unsafe {
            Tensor::from_raw_parts(
                self.data.wrapping_add(offset),
                shape.to_vec(),
                contiguous_strides(shape),
                self.dtype,
                self.device,
                false,
                self.owner.clone(),
            )
        }
    }

    /// [`Tensor::box_view`]s of boxes of `shapes` that lie one after the other in this
    /// contiguous buffer, the first at byte `start`.
    pub(crate) fn box_views<'a, S: AsRef<[usize]> + 'a>(
        &'a self,
        start: usize,
        shapes: impl IntoIterator<Item = S> + 'a,
    ) -> impl Iterator<Item = Tensor> + 'a {
        let itemsize = self.dtype.itemsize();
        shapes.into_iter().scan(start, move |at, shape| {
            let shape = shape.as_ref();
            let view = self.box_view(*at, shape);
            *at += shape.iter().product::<usize>() * itemsize;
            Some(view)
        })
    }

    /// A view of the box `start .. start + shape`, sharing this tensor's memory.
    pub fn view(&self, start: &[usize], shape: &[usize]) -> Result<Self> {
        if start.len() != self.ndim() || shape.len() != self.ndim() {
            return Err(Error::shape(
                format!("box of a {}-d tensor", self.ndim()),
                format!(
                    "start {} shape {}",
                    tuple_string(start),
                    tuple_string(shape)
                ),
            ));
        }
        for d in 0..self.ndim() {
            let end = start[d].checked_add(shape[d]);
            if end.is_none_or(|e| e > self.shape[d]) {
                return Err(Error::shape(
                    format!("box outside tensor of shape {}", tuple_string(&self.shape)),
                    format!(
                        "start {} shape {}",
                        tuple_string(start),
                        tuple_string(shape)
                    ),
                ));
            }
        }
        // An empty box touches no memory: its other axes may be long enough to overflow.
        let data = if shape.contains(&0) {
            self.data
        } else {
            let offset: isize = (0..self.ndim())
                .map(|d| start[d] as isize * self.strides[d])
                .sum();
            self.data
                .wrapping_offset(offset * self.dtype.itemsize() as isize)
        };
        let mut t = self.clone();
        t.data = data;
        t.shape = shape.into();
        Ok(t)
    }

    /// A read-only `ndarray` view of host data of element type `T`, borrowing the tensor
    /// (a [`HostView`], which derefs to an `ndarray::ArrayRef`; its `view()` is an `ArrayViewD`).
    ///
    /// Zero-copy; axes with negative strides come out inverted, so the view indexes like the
    /// tensor. The view is read-only because a tensor's memory may be shared with other
    /// tensors, other frameworks or read-only DLPack producers. While it lives, dlpart
    /// refuses (with [`Error::Buffer`]) to write the memory it shows, from any clone or view
    /// of the tensor in any thread. A `bool` tensor is checked first to hold only bytes 0 and
    /// 1 (foreign producers may hand out any byte). For a view to write through, see
    /// [`Tensor::as_array_mut`].
    pub fn as_array<T: Element>(&self) -> Result<HostView<'_, T>> {
        self.host_array("as_array", LIVE_VIEW)
    }

    /// [`Tensor::as_array`], named `op` in errors, the view's claim `role` there.
    fn host_array<T: Element>(&self, op: &'static str, role: Role) -> Result<HostView<'_, T>> {
        let (view, claim) = self.claimed_view::<T, ndarray::RawArrayView<T, _>>(op, role)?;
        // SAFETY: `claimed_view` checked that the elements are valid, aligned `T`s in host
        // memory, which `self.owner` keeps alive for the borrow of `self`; the read claim
        // keeps dlpart from writing them while the `HostView` lives, and nothing borrowed
        // from it outlives it (see `HostView`).
        let view = unsafe { view.deref_into_view() };
        Ok(HostView {
            view,
            _claim: claim,
        })
    }

    /// A mutable `ndarray` view of host data of element type `T`, to write the tensor in
    /// place (a [`HostViewMut`], which derefs to an `ndarray::ArrayRef`; its `view_mut()` is
    /// an `ArrayViewMutD` that borrows it).
    ///
    /// Zero-copy; axes with negative strides come out inverted, so the view indexes like the
    /// tensor. While it lives, the view's memory is claimed for writing: dlpart refuses (with
    /// [`Error::Buffer`]) to read or write it, from any clone or view of the tensor in any
    /// thread, and so does another `as_array` or `as_array_mut` of it. Views of parts of one
    /// tensor that share no element (its partitions) may be written side by side, and dlpart
    /// may read and write the other parts meanwhile (repartition the next column block).
    ///
    /// It takes `&self`, like the operations that write a tensor (a `Tensor` is a shared
    /// handle: its clones reach the same memory, so `&mut self` would not make the view
    /// exclusive); the claim is what does, across clones and threads.
    ///
    /// Refused: an element type that is not the dtype's, memory the host cannot reach, a
    /// [read-only](Tensor::readonly) tensor, one whose elements overlap each other (a zero
    /// stride, as in a broadcast view: a mutable view of one element under two indices would
    /// be unsound) or whose strides interleave (ndarray's mutable views need each axis to step
    /// over the whole reach of the smaller ones), data not aligned for `T`, and a `bool`
    /// tensor holding bytes other than 0 and 1. Each refusal names the tensor or value.
    ///
    /// ```
    /// use dlpart::Tensor;
    /// use ndarray::{array, s};
    ///
    /// let t = Tensor::from(ndarray::Array2::<i32>::zeros((2, 3)));
    /// let mut host = t.as_array_mut::<i32>()?;
    /// host.slice_mut(s![0, ..]).fill(1);
    /// host[[1, 2]] = 5;
    /// // The memory is being written: another view of it (from any clone) is refused.
    /// assert!(t.clone().as_array::<i32>().is_err());
    /// drop(host);
    /// assert_eq!(t.to_array::<i32>()?, array![[1, 1, 1], [0, 0, 5]].into_dyn());
    /// assert!(t.with_readonly(true)?.as_array_mut::<i32>().is_err());
    /// # Ok::<(), dlpart::Error>(())
    /// ```
    pub fn as_array_mut<T: Element>(&self) -> Result<HostViewMut<'_, T>> {
        let (view, claim) =
            self.claimed_view::<T, ndarray::RawArrayViewMut<T, _>>("as_array_mut", LIVE_VIEW)?;
        // SAFETY: `claimed_view` checked that the elements are valid, aligned `T`s in
        // writable host memory, each under one index only (the strides nest), which
        // `self.owner` keeps alive for the borrow of `self`; the write claim keeps every other
        // dlpart read, write and view off them while the `HostViewMut` lives, and nothing
        // borrowed from it outlives it (see `HostViewMut`).
        let view = unsafe { view.deref_into_view_mut() };
        Ok(HostViewMut {
            view,
            _claim: claim,
        })
    }

    /// The checks and the claim behind [`Tensor::as_array`] (`V` a `RawArrayView`) and
    /// [`Tensor::as_array_mut`] (`V` a `RawArrayViewMut`), named `op` in errors (the claim
    /// `role` there): the elements
    /// as a raw `ndarray` view of `T`, valid and aligned, and the claim on them for reading or
    /// writing. To be written, the tensor must also be writable and its strides must nest
    /// (each axis steps over the whole reach of the smaller ones), so that no element is
    /// under two indices: ndarray's mutable views need that.
    fn claimed_view<T: Element, V: RawView<T>>(
        &self,
        op: &'static str,
        role: Role,
    ) -> Result<(V, access::Claim)> {
        self.check_host_element::<T>(op)?;
        if V::WRITE && self.readonly {
            return Err(Error::ReadOnly {
                what: format!("{op}: tensor {self:?}"),
            });
        }
        if V::WRITE && self.numel() > 0 && !crate::overlap::nested(self) {
            let what = match crate::overlap::covers_an_element_twice(self) {
                Some(s) => s.more_than_once(),
                None => "has strides that interleave".into(),
            };
            return Err(Error::buffer(format!(
                "{op}: tensor {self:?} {what}: ndarray's mutable views need every element \
                 under one index and strides that nest; write a tensor whose elements are \
                 distinct, or copy it (to_array)"
            )));
        }
        let claim = match V::WRITE {
            true => access::tensors(op, [], [(role, self)])?,
            false => access::tensors(op, [(role, self)], [])?,
        };
        // Every element sits a whole number of `T`s away from `data`, so one check covers all.
        if self.numel() > 0 && !self.data.cast::<T>().is_aligned() {
            return Err(Error::buffer(format!(
                "{op}: data at {:p} is not aligned for {}; to_array copies it",
                self.data,
                T::DTYPE
            )));
        }
        if T::DTYPE == DType::Bool {
            // SAFETY: the tensor is host memory (checked above) and `u8` has the size of `bool`.
            let bytes = unsafe { self.host_view::<u8, ndarray::RawArrayView<u8, _>>()? };
            // SAFETY: the bytes are claimed above and kept alive by `self.owner` for this
            // borrow; `u8` has the alignment of `bool`, and every byte is a valid `u8`.
            let bytes = unsafe { bytes.deref_into_view() };
            if let Some(b) = bytes.iter().find(|&&b| b > 1) {
                return Err(Error::buffer(format!(
                    "{op}: bool tensor holds byte {b}, which is not a bool"
                )));
            }
        }
        // SAFETY: the tensor is host memory and `T` has the dtype's item size (both checked
        // above, the size by `Element`'s contract); a mutable view's strides nest if it has
        // elements (checked above).
        let view = unsafe { self.host_view::<T, V>()? };
        Ok((view, claim))
    }

    /// The elements as a raw `ndarray` view `V` of `U`, with the axes of negative stride
    /// inverted so that it indexes like the tensor.
    ///
    /// # Safety
    /// The tensor must be host accessible and `U` must have the dtype's item size; for a
    /// `RawArrayViewMut` of a tensor with elements, its strides must nest
    /// ([`crate::overlap::nested`]).
    unsafe fn host_view<U, V: RawView<U>>(&self) -> Result<V> {
        let shape = ndarray::IxDyn(&self.shape);
        if self.numel() == 0 {
            // Refused only for a shape `checked_numel` refuses, which `from_raw_parts` takes
            // on trust.
            if ndarray::ArrayViewD::<U>::from_shape(shape.clone(), &[]).is_err() {
                return Err(Error::shape(
                    "shape has too many elements",
                    tuple_string(&self.shape),
                ));
            }
            // SAFETY: ndarray has just taken this shape, in C order, for a safe view of no
            // elements; with none, the pointer is never dereferenced and may dangle.
            return Ok(unsafe {
                V::from_parts(shape.into(), std::ptr::NonNull::dangling().as_ptr())
            });
        }
        // ndarray wants non-negative strides: start at the lowest address, then flip the axes
        // whose stride is negative.
        let (lo, _) = self.byte_span();
        let base = self.data.wrapping_offset(lo);
        let strides: Vec<usize> = self.strides.iter().map(|&s| s.unsigned_abs()).collect();
        // SAFETY: with `base` at the lowest byte, the pointers reached with absolute strides
        // are exactly the tensor's elements, `U`-sized (the caller's contract), inside the one
        // allocation of host memory that `from_raw_parts`'s contract says holds them; a
        // mutable view's strides nest (the caller's contract, for a tensor with elements).
        let mut view =
            unsafe { V::from_parts(shape.strides(ndarray::IxDyn(&strides)), base.cast::<U>()) };
        for (axis, &s) in self.strides.iter().enumerate() {
            if s < 0 {
                view.as_mut().invert_axis(ndarray::Axis(axis));
            }
        }
        Ok(view)
    }

    /// A copy on `device` (Python's `Tensor.to`): the one way data crosses devices, as
    /// [`ops::to_device`](crate::ops::to_device). The same device, or host memory to
    /// `kDLCPU`, gives a contiguous copy; a device this build or machine lacks is an error
    /// naming it, before anything is allocated, and so is a device dlpart has no kernels for
    /// (kDLOneAPI) on either side: [`Error::BackendUnavailable`], as only its own library
    /// copies its data.
    ///
    /// ```
    /// use dlpart::{Device, Tensor};
    ///
    /// let t = Tensor::from(ndarray::array![[1.0f32, 2.0], [3.0, 4.0]]).view(&[0, 1], &[2, 1])?;
    /// let c = t.to_device(Device::CPU)?;
    /// assert!(c.is_contiguous());
    /// assert_eq!(c.to_array::<f32>()?, ndarray::array![[2.0f32], [4.0]].into_dyn());
    /// // Without the `cuda` feature (or a GPU), CUDA is refused, not emulated.
    /// # #[cfg(not(feature = "cuda"))]
    /// assert!(t.to_device(Device::cuda(0)).is_err());
    /// # Ok::<(), dlpart::Error>(())
    /// ```
    pub fn to_device(&self, device: Device) -> Result<Tensor> {
        crate::ops::to_device(self, device)
    }

    /// A contiguous copy on the same device (Python's `Tensor.copy`).
    pub fn copy(&self) -> Result<Tensor> {
        crate::ops::to_device(self, self.device)
    }

    /// A copy of host data into a new C-order `ndarray`; unlike [`Tensor::as_array`] it also
    /// takes data that is not aligned for `T` (DLPack producers may hand such data out).
    pub fn to_array<T: Element>(&self) -> Result<ndarray::ArrayD<T>> {
        self.check_host_element::<T>("to_array")?;
        if self.numel() == 0 || self.data.cast::<T>().is_aligned() {
            return Ok(self
                .host_array::<T>("to_array", Role::new("tensor"))?
                .as_standard_layout()
                .into_owned());
        }
        // Unaligned, so never `bool` (align 1): every bit pattern is a valid `T`.
        let _claim = access::tensors("to_array", [(Role::new("tensor"), self)], [])?;
        let values = ndarray::indices(&self.shape[..])
            .into_iter()
            .map(|index| {
                let offset: isize = (0..self.ndim())
                    .map(|d| index[d] as isize * self.strides[d])
                    .sum();
                // SAFETY: `index` is within the shape, so the element lies in the tensor's
                // host memory (checked above), kept alive by `self.owner`; the read is
                // unaligned, and any bit pattern is a valid `T` (`Element`'s contract).
                unsafe {
                    self.data
                        .cast::<T>()
                        .wrapping_offset(offset)
                        .read_unaligned()
                }
            })
            .collect();
        Ok(ndarray::ArrayD::from_shape_vec(&self.shape[..], values).expect("C order"))
    }

    fn check_host_element<T: Element>(&self, op: &str) -> Result<()> {
        if T::DTYPE != self.dtype {
            return Err(Error::DTypeMismatch {
                found: self.dtype,
                expected: T::DTYPE,
                of: format!("the element type {op} was asked for"),
            });
        }
        if !self.device.is_host_accessible() {
            return Err(Error::UnsupportedDevice {
                device: self.device.to_string(),
                op: op.into(),
            });
        }
        Ok(())
    }
}

impl Tensor {
    /// Whether the memory came from a legacy (unversioned) DLPack capsule: it has no flag to
    /// say the memory may be written, so it is imported read-only (as numpy does), and a
    /// write into it is refused for that reason, which the tensor's `Debug` form states.
    fn is_legacy_import(&self) -> bool {
        self.owner
            .downcast_ref::<crate::dlpack::ForeignTensor>()
            .is_some_and(|f| f.version().is_none())
    }
}

impl fmt::Debug for Tensor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "Tensor(shape={}, dtype={}, device={}",
            tuple_string(&self.shape),
            self.dtype,
            self.device
        )?;
        if !self.is_contiguous() {
            write!(f, ", strides={}", tuple_string(&self.strides))?;
        }
        if self.readonly {
            f.write_str(", readonly=True")?;
            if self.is_legacy_import() {
                f.write_str(
                    " (imported from a producer without DLPack 1.x versioned capsules, which \
                     cannot mark memory writable)",
                )?;
            }
        }
        f.write_str(")")
    }
}

/// The owner of a tensor made by [`Tensor::from_ndarray`]: private and opaque, so that no
/// one can reach the elements through the owner while the tensor is written.
struct VecOwner<T> {
    _vec: Vec<T>,
}

/// The owner of a tensor made by [`Tensor::from_arc_array`].
struct ArcOwner<T, D: Dimension> {
    _array: ArcArray<T, D>,
}

impl<T: Element, D: Dimension> From<Array<T, D>> for Tensor {
    /// Zero-copy: see [`Tensor::from_ndarray`].
    fn from(a: Array<T, D>) -> Tensor {
        Tensor::from_ndarray(a)
    }
}

/// A read-only `ndarray` view of a tensor's host memory, from [`Tensor::as_array`]. It
/// derefs to the `ArrayRef` every ndarray array does (`sum`, `iter`, indexing, `shape`, ...),
/// and [`view`](ndarray::ArrayRef::view) gives an `ArrayViewD` that borrows it. While it
/// lives, dlpart refuses to write the memory it shows (see [`Tensor::as_array`]): drop it
/// before writing into that tensor. Nothing it hands out outlives it, so no view of the
/// memory remains once the claim is released:
///
/// ```
/// let t = dlpart::Tensor::from(ndarray::Array1::<i32>::from_vec(vec![1, 2, 3]));
/// let host = t.as_array::<i32>()?;
/// assert_eq!(host.sum(), 6);
/// let row = host.view(); // borrows `host`
/// assert_eq!(row[[2]], 3);
/// # Ok::<(), dlpart::Error>(())
/// ```
///
/// ```compile_fail,E0505
/// let t = dlpart::Tensor::from(ndarray::Array1::<i32>::zeros(3));
/// let host = t.as_array::<i32>().unwrap();
/// // A view that would outlive `host`'s claim on the memory: refused.
/// let escaped: ndarray::ArrayViewD<'_, i32> = host.view();
/// drop(host);
/// assert_eq!(escaped[[0]], 0);
/// ```
pub struct HostView<'a, T> {
    view: ndarray::ArrayViewD<'a, T>,
    _claim: access::Claim,
}

/// A mutable `ndarray` view of a tensor's host memory, from [`Tensor::as_array_mut`]. It
/// derefs, mutably too, to the `ArrayRef` every ndarray array does (indexing, `fill`,
/// `assign`, `iter_mut`, `slice_mut`, ...), and
/// [`view_mut`](ndarray::ArrayRef::view_mut) gives an `ArrayViewMutD` that borrows it. While
/// it lives, dlpart refuses to read or write the memory it shows, and to view it again (see
/// [`Tensor::as_array_mut`]): drop it before using that tensor otherwise. Nothing it hands
/// out outlives it, so no view of the memory remains once the claim is released:
///
/// ```
/// let t = dlpart::Tensor::from(ndarray::Array1::<i32>::zeros(3));
/// let mut host = t.as_array_mut::<i32>()?;
/// let mut row = host.view_mut(); // borrows `host`
/// row[[2]] = 7;
/// assert_eq!(host, ndarray::array![0, 0, 7]);
/// # Ok::<(), dlpart::Error>(())
/// ```
///
/// ```compile_fail,E0505
/// let t = dlpart::Tensor::from(ndarray::Array1::<i32>::zeros(3));
/// let mut host = t.as_array_mut::<i32>().unwrap();
/// // A view that would outlive `host`'s claim on the memory: refused.
/// let mut escaped = host.view_mut();
/// drop(host);
/// escaped[[0]] = 1;
/// ```
pub struct HostViewMut<'a, T> {
    view: ndarray::ArrayViewMutD<'a, T>,
    _claim: access::Claim,
}

/// `Deref` to the view's `ArrayRef`, `Debug` and `PartialEq` with ndarray arrays, alike for
/// [`HostView`] and [`HostViewMut`] (field `view`).
macro_rules! host_view_impls {
    ($($guard:ident),*) => { $(
        impl<T> std::ops::Deref for $guard<'_, T> {
            // Not the `'a` view itself: a `HostView`'s is `Copy`, and a `HostViewMut`'s could
            // be moved out through `DerefMut` (`std::mem::replace`); either would keep the
            // memory borrowed for `'a` after the guard's claim on it is released. An
            // `ArrayRef` is unsized, so not even a `&mut` to it can be swapped out.
            type Target = ndarray::ArrayRef<T, ndarray::IxDyn>;

            fn deref(&self) -> &Self::Target {
                &self.view
            }
        }

        impl<T: fmt::Debug> fmt::Debug for $guard<'_, T> {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                self.view.fmt(f)
            }
        }

        /// Compares like the view: equal shapes and elements.
        impl<T, S, D> PartialEq<ndarray::ArrayBase<S, D>> for $guard<'_, T>
        where
            T: PartialEq,
            S: ndarray::Data<Elem = T>,
            D: Dimension,
        {
            fn eq(&self, other: &ndarray::ArrayBase<S, D>) -> bool {
                self.view == other.view().into_dyn()
            }
        }
    )* };
}
host_view_impls!(HostView, HostViewMut);

impl<T> std::ops::DerefMut for HostViewMut<'_, T> {
    fn deref_mut(&mut self) -> &mut Self::Target {
        &mut self.view
    }
}

/// ndarray's raw views of `U`, read-only (`RawArrayView`) and mutable (`RawArrayViewMut`),
/// which [`Tensor::host_view`] makes alike.
trait RawView<U>: AsMut<ndarray::LayoutRef<U, ndarray::IxDyn>> {
    /// Whether the view is for writing.
    const WRITE: bool;

    /// The view's own `from_shape_ptr`.
    ///
    /// # Safety
    /// That of the view's `from_shape_ptr`, and for a mutable view, strides that nest (which
    /// ndarray checks in debug builds).
    unsafe fn from_parts(shape: ndarray::StrideShape<ndarray::IxDyn>, ptr: *mut U) -> Self;
}

macro_rules! raw_view {
    ($($view:ident => $write:expr),*) => { $(
        impl<U> RawView<U> for ndarray::$view<U, ndarray::IxDyn> {
            const WRITE: bool = $write;

            unsafe fn from_parts(
                shape: ndarray::StrideShape<ndarray::IxDyn>,
                ptr: *mut U,
            ) -> Self {
                // SAFETY: the caller's contract is this function's (a `*mut U` coerces to
                // the read-only view's `*const U`).
                unsafe { ndarray::$view::from_shape_ptr(shape, ptr) }
            }
        }
    )* };
}
raw_view!(RawArrayView => false, RawArrayViewMut => true);

/// Rust element types with a dlpart dtype: `bool`, the fixed-width integers, `f32`/`f64`,
/// [`Complex<f32>`](num_complex::Complex) (complex64) and `Complex<f64>` (complex128), and with
/// the `half` feature `half::f16` (float16) and `half::bf16` (bfloat16). The float8 types
/// have none: their tensors move like any other, and Rust reads and builds them as bytes
/// ([`Tensor::to_bytes`], [`Tensor::from_bytes`]).
///
/// | Rust type | dtype | item size |
/// |---|---|---|
/// | `bool` | `bool` | 1 |
/// | `i8`, `i16`, `i32`, `i64` | `int8` .. `int64` | 1 .. 8 |
/// | `u8`, `u16`, `u32`, `u64` | `uint8` .. `uint64` | 1 .. 8 |
/// | `f32`, `f64` | `float32`, `float64` | 4, 8 |
/// | `Complex<f32>`, `Complex<f64>` | `complex64`, `complex128` | 8, 16 |
/// | `half::f16`, `half::bf16` (feature `half`) | `float16`, `bfloat16` | 2, 2 |
///
/// `num_complex` (re-exported as [`dlpart::num_complex`](crate::num_complex), the crate
/// ndarray uses) lays a `Complex<T>` out as DLPack does: `#[repr(C)]` `{ re, im }`, the real
/// part first. A complex tensor from torch, jax or numpy reads as such:
///
/// ```
/// use dlpart::num_complex::Complex;
/// use dlpart::{DType, Tensor};
///
/// let z = ndarray::array![Complex::new(1.0f32, 2.0), Complex::new(-3.0, 0.5)];
/// let t = Tensor::from(z.clone());
/// assert_eq!(t.dtype(), DType::Complex64);
/// assert_eq!(t.as_array::<Complex<f32>>()?, z.into_dyn());
/// // The wrong element type is an error, not a reinterpretation.
/// assert!(t.as_array::<f32>().is_err());
/// # Ok::<(), dlpart::Error>(())
/// ```
///
/// Sealed: [`Tensor::as_array`] and [`Tensor::as_array_mut`] reinterpret a tensor's bytes as
/// `T` on the strength of `T::DTYPE` alone, so an implementation for a type whose size,
/// alignment or valid bit patterns do not match its dtype would be undefined behaviour. Every
/// implementor has the size of its dtype's item and an alignment no larger (`Complex<f64>` is
/// 16 bytes aligned to 8, as numpy's complex128 is). Every bit pattern of the dtype's item size
/// is a valid `T` for all implementors except `bool`, whose bytes both check: the integers and
/// floats are plain bits (any pattern is some value, NaNs included), a `Complex<T>` is two such
/// `T`s with no padding (`#[repr(C)]` of two fields of one type), and `f16`/`bf16` are
/// `#[repr(transparent)]` over a `u16`.
pub trait Element: Copy + Send + Sync + 'static + sealed::Sealed {
    /// The dtype whose items are exactly the values of this type.
    const DTYPE: DType;
}

mod sealed {
    /// Implemented only here, so that no type outside dlpart can be an [`super::Element`].
    pub trait Sealed {}
}

macro_rules! element {
    ($($t:ty => $d:ident),*) => { $(
        impl sealed::Sealed for $t {}
        impl Element for $t { const DTYPE: DType = DType::$d; }
    )* };
}
element!(bool => Bool, i8 => Int8, i16 => Int16, i32 => Int32, i64 => Int64, u8 => UInt8,
    u16 => UInt16, u32 => UInt32, u64 => UInt64, f32 => Float32, f64 => Float64);
// DLPack's complex64 is two float32s, real first; `Complex<T>` is `#[repr(C)] { re: T, im: T }`.
element!(num_complex::Complex<f32> => Complex64, num_complex::Complex<f64> => Complex128);
// Both `#[repr(transparent)]` over the `u16` of their IEEE binary16 / bfloat16 bits.
#[cfg(feature = "half")]
element!(half::f16 => Float16, half::bf16 => BFloat16);

/// `n` zero bytes in a `Vec`, or [`Error::OutOfMemory`] for `what` when the host has no room:
/// `vec![0; n]` would abort the process instead. Only the CUDA backend stages host bytes in a
/// `Vec` (its uploads and downloads).
#[cfg(any(feature = "cuda", test))]
pub(crate) fn zeroed_vec(n: usize, what: impl FnOnce() -> String) -> Result<Vec<u8>> {
    let mut v = Vec::new();
    v.try_reserve_exact(n)
        .map_err(|_| Error::host_oom(n, what()))?;
    v.resize(n, 0);
    Ok(v)
}

/// A 64-byte aligned host allocation; from 2 MiB up, aligned to 2 MiB and backed by
/// transparent huge pages where the kernel offers them, because first-touch page faults of 4 KiB
/// pages cost several times the copy that fills a fresh output.
///
/// Freed buffers of 2 MiB and more are kept, up to [`host_cache_limit`] bytes in all, and
/// handed out again for the same size: a fresh allocation of that size is faulted in and
/// zeroed by the kernel page by page, which costs about as much as the copy that fills it,
/// every time an operation returning new partitions runs in a loop.
pub struct HostBuffer {
    ptr: *mut u8,
    layout: std::alloc::Layout,
}

// SAFETY: the buffer is plain memory owned exclusively by this value; access to its bytes is
// coordinated by the tensors that view it (see `Tensor`'s Send/Sync).
unsafe impl Send for HostBuffer {}
// SAFETY: as for Send; `&HostBuffer` exposes only the pointer.
unsafe impl Sync for HostBuffer {}

impl HostBuffer {
    /// Alignment in bytes of allocations below [`HostBuffer::HUGE`]: a cache line, and
    /// enough for any SIMD load.
    pub const ALIGN: usize = 64;
    /// Allocations of at least this many bytes get huge-page alignment and advice.
    pub const HUGE: usize = 2 << 20;

    /// `nbytes` zeroed bytes; [`Error::OutOfMemory`] when they cannot be had.
    pub fn zeroed(nbytes: usize) -> Result<Self> {
        let b = Self::uninit(nbytes)?;
        // SAFETY: `b` owns `layout.size() >= nbytes` writable bytes.
        unsafe { std::ptr::write_bytes(b.ptr, 0, b.layout.size()) };
        Ok(b)
    }

    /// `nbytes` bytes of unspecified contents, for outputs that are overwritten entirely:
    /// zero when fresh, a previous user's bytes when a kept buffer is reused, never
    /// uninitialised memory (safe code may read a tensor over it before anything is written).
    /// Fresh buffers of [`HostBuffer::HUGE`] bytes and more are mapped from the kernel, which
    /// zeroes each page as it first touches it, a fault the copy filling the buffer would take
    /// anyway; smaller ones are zeroed by the allocator.
    ///
    /// A size the allocator refuses, or one beyond `isize::MAX` once rounded up, is an
    /// [`Error::OutOfMemory`] naming `nbytes`: an output too large for the host is an error
    /// the caller sees (`MemoryError` in Python), never an abort of the process.
    pub fn uninit(nbytes: usize) -> Result<Self> {
        let huge = nbytes >= Self::HUGE;
        let layout = if huge {
            nbytes
                .checked_next_multiple_of(Self::HUGE)
                .and_then(|size| std::alloc::Layout::from_size_align(size, Self::HUGE).ok())
        } else {
            std::alloc::Layout::from_size_align(nbytes.max(1), Self::ALIGN).ok()
        }
        .ok_or_else(|| Error::host_oom(nbytes, "a host buffer"))?;
        if huge {
            if let Some(ptr) = cache::take(layout) {
                return Ok(HostBuffer { ptr, layout });
            }
        }
        let ptr = if huge {
            map_huge(layout)
        } else {
            // SAFETY: the layout has a non-zero size.
            unsafe { std::alloc::alloc_zeroed(layout) }
        };
        if ptr.is_null() {
            return Err(Error::host_oom(nbytes, "a host buffer"));
        }
        Ok(HostBuffer { ptr, layout })
    }

    /// The first byte (dangling but aligned for an empty buffer).
    pub fn as_ptr(&self) -> *mut u8 {
        self.ptr
    }
}

/// Fresh zeroed memory of `layout` (a multiple of [`HostBuffer::HUGE`] in size and
/// alignment) straight from the kernel, advised into transparent huge pages; null when it
/// cannot be had. Released by [`unmap_huge`].
#[cfg(all(target_os = "linux", not(miri)))]
fn map_huge(layout: std::alloc::Layout) -> *mut u8 {
    let (size, align) = (layout.size(), layout.align());
    let Some(span) = size.checked_add(align) else {
        return std::ptr::null_mut();
    };
    // SAFETY: an anonymous private mapping of `span` bytes at an address the kernel picks:
    // no existing memory is touched. The parts before the first `align`-aligned address and
    // after `size` bytes from it are unmapped again, leaving exactly the aligned range, which
    // this buffer owns until `unmap_huge`. MADV_HUGEPAGE is advice only and leaves the
    // contents and validity of the range unchanged; its result is ignored (without THP the
    // memory stays in small pages).
    unsafe {
        let base = libc::mmap(
            std::ptr::null_mut(),
            span,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        );
        if base == libc::MAP_FAILED {
            return std::ptr::null_mut();
        }
        let start = (base as usize).next_multiple_of(align);
        let head = start - base as usize;
        if head > 0 {
            libc::munmap(base, head);
        }
        let tail = span - head - size;
        if tail > 0 {
            libc::munmap((start + size) as *mut libc::c_void, tail);
        }
        libc::madvise(start as *mut libc::c_void, size, libc::MADV_HUGEPAGE);
        start as *mut u8
    }
}

/// Releases what [`map_huge`] returned for `layout`.
///
/// # Safety
/// `ptr` came from `map_huge(layout)`, is released once, and no one uses it after.
#[cfg(all(target_os = "linux", not(miri)))]
unsafe fn unmap_huge(ptr: *mut u8, layout: std::alloc::Layout) {
    // SAFETY: the range is exactly the mapping `map_huge` left (the caller's contract).
    unsafe {
        libc::munmap(ptr.cast(), layout.size());
    }
}

/// Elsewhere (and under Miri) huge buffers come from the allocator, zeroed.
#[cfg(not(all(target_os = "linux", not(miri))))]
fn map_huge(layout: std::alloc::Layout) -> *mut u8 {
    // SAFETY: the layout has a non-zero size (a multiple of `HostBuffer::HUGE`).
    unsafe { std::alloc::alloc_zeroed(layout) }
}

/// # Safety
/// As for the Linux `unmap_huge`: `ptr` came from `map_huge(layout)`, released once.
#[cfg(not(all(target_os = "linux", not(miri))))]
unsafe fn unmap_huge(ptr: *mut u8, layout: std::alloc::Layout) {
    // SAFETY: `map_huge` allocated `ptr` with exactly `layout` (the caller's contract).
    unsafe { std::alloc::dealloc(ptr, layout) }
}

/// Releases a buffer `HostBuffer` allocated with `layout`, huge or not.
///
/// # Safety
/// `ptr` came from `HostBuffer::uninit` with exactly `layout`, is released once, and no one
/// uses it after.
unsafe fn release(ptr: *mut u8, layout: std::alloc::Layout) {
    // SAFETY: the caller's contract; huge layouts (2 MiB aligned) came from `map_huge`, the
    // others from the allocator.
    unsafe {
        if layout.align() == HostBuffer::HUGE {
            unmap_huge(ptr, layout)
        } else {
            std::alloc::dealloc(ptr, layout)
        }
    }
}

impl Drop for HostBuffer {
    fn drop(&mut self) {
        if self.layout.align() == Self::HUGE && cache::keep(self.ptr, self.layout) {
            return;
        }
        // SAFETY: `ptr` was allocated in `uninit` with exactly `layout`, once, and this value
        // owned it alone.
        unsafe { release(self.ptr, self.layout) }
    }
}

/// The bytes of freed huge host buffers kept for reuse: `DLPART_HOST_CACHE_BYTES` if set (0
/// turns the cache off), else 1 GiB. Read once per process. Off under Miri, whose leak check
/// would see the kept buffers at exit.
pub fn host_cache_limit() -> usize {
    static LIMIT: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *LIMIT.get_or_init(|| {
        if cfg!(miri) {
            return 0;
        }
        std::env::var("DLPART_HOST_CACHE_BYTES")
            .ok()
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(1 << 30)
    })
}

/// The freed huge buffers [`HostBuffer`] keeps, oldest first.
mod cache {
    use std::alloc::Layout;
    use std::sync::Mutex;

    pub(super) struct Kept {
        pub(super) bytes: usize,
        /// Addresses (as integers: the cache hands them out, it never dereferences them) and
        /// the layouts they were allocated with.
        pub(super) free: Vec<(usize, Layout)>,
    }

    impl Kept {
        /// A kept buffer allocated with exactly `layout`, the most recently freed one.
        pub(super) fn take(&mut self, layout: Layout) -> Option<*mut u8> {
            let i = self.free.iter().rposition(|&(_, l)| l == layout)?;
            let (addr, l) = self.free.remove(i);
            self.bytes -= l.size();
            Some(addr as *mut u8)
        }

        /// Keeps `ptr` (allocated with `layout`, no longer used by anyone) if it fits under
        /// `limit`, releasing the oldest kept buffers to make room; false if it cannot fit
        /// (the caller releases it).
        pub(super) fn keep(&mut self, ptr: *mut u8, layout: Layout, limit: usize) -> bool {
            // Room in the list first: a failed allocation here releases the buffer instead.
            if layout.size() > limit || self.free.try_reserve(1).is_err() {
                return false;
            }
            while self.bytes + layout.size() > limit {
                let (addr, l) = self.free.remove(0);
                self.bytes -= l.size();
                // SAFETY: a kept buffer was allocated by `HostBuffer::uninit` with exactly `l`
                // and nobody uses it; it left the list just above, so it is released once.
                unsafe { super::release(addr as *mut u8, l) };
            }
            self.free.push((ptr as usize, layout));
            self.bytes += layout.size();
            true
        }
    }

    static KEPT: Mutex<Kept> = Mutex::new(Kept {
        bytes: 0,
        free: Vec::new(),
    });

    fn kept() -> std::sync::MutexGuard<'static, Kept> {
        // The list stays consistent through a panic elsewhere: each update is a push or a
        // remove with its byte count, and nothing in between can panic.
        KEPT.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub(super) fn take(layout: Layout) -> Option<*mut u8> {
        // The lock is released before logging: a record may wait for the GIL, whose holder
        // may be freeing a buffer.
        let (ptr, left) = {
            let mut kept = kept();
            (kept.take(layout), kept.bytes)
        };
        if loggable() {
            let (size, left) = (mib(layout.size()), mib(left));
            match ptr {
                Some(_) => log::debug!("host buffer cache: reused {size} ({left} still kept)"),
                None => log::debug!("host buffer cache: none of {size} kept, allocating"),
            }
        }
        ptr
    }

    pub(super) fn keep(ptr: *mut u8, layout: Layout) -> bool {
        let limit = super::host_cache_limit();
        let (kept_it, now) = {
            let mut kept = kept();
            (kept.keep(ptr, layout, limit), kept.bytes)
        };
        if loggable() {
            let (size, now) = (mib(layout.size()), mib(now));
            match kept_it {
                true => log::debug!("host buffer cache: keeping {size} for reuse ({now} kept)"),
                false => log::debug!(
                    "host buffer cache: releasing {size} (over the {} limit, \
                     DLPART_HOST_CACHE_BYTES)",
                    mib(limit)
                ),
            }
        }
        kept_it
    }

    /// Debug records are wanted, and this is not one of rayon's workers: a record goes to
    /// Python with the GIL, which the caller may hold while it waits for the workers.
    fn loggable() -> bool {
        log::log_enabled!(log::Level::Debug) && rayon::current_thread_index().is_none()
    }

    fn mib(bytes: usize) -> String {
        format!("{:.1} MiB", bytes as f64 / (1 << 20) as f64)
    }
}

#[cfg(test)]
impl Tensor {
    /// This tensor's memory, layout and owner under the label `device`, for tests of other
    /// memory kinds on a machine without them.
    ///
    /// # Safety
    /// `device` is host memory, which the CPU reads and writes as it does this tensor's, or
    /// the result is never read nor written (an operation refuses it first).
    pub(crate) unsafe fn labelled(&self, device: Device) -> Tensor {
        // SAFETY: the same memory and layout, kept alive by this tensor's owner, cloned into
        // the result; its use is the caller's contract.
        unsafe {
            Tensor::from_raw_parts(
                self.data_ptr(),
                self.shape().to_vec(),
                self.strides().to_vec(),
                self.dtype(),
                device,
                false,
                self.owner().clone(),
            )
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use num_complex::Complex;

    #[test]
    fn bytes_in_and_out_in_c_order() {
        let bytes: Vec<u8> = (0..12).collect();
        let t = Tensor::from_bytes(&bytes, &[3, 2], DType::Float16).unwrap();
        assert_eq!(t.dtype(), DType::Float16);
        assert_eq!(t.to_bytes().unwrap(), bytes);
        // Rows backwards, second column: elements (2, 1), (1, 1), (0, 1).
        let mut v = t.view(&[0, 1], &[3, 1]).unwrap();
        v.data = v.data.wrapping_add(2 * 2 * 2);
        v.strides = Axes::from(&[-2isize, 1][..]);
        assert_eq!(v.to_bytes().unwrap(), vec![10, 11, 6, 7, 2, 3]);
        // The same bytes through a typed reading: little-endian u16 pairs.
        let u = Tensor::from_slice(&[0x0100u16, 0x0302], &[2]).unwrap();
        if cfg!(target_endian = "little") {
            assert_eq!(u.to_bytes().unwrap(), vec![0, 1, 2, 3]);
        }
        let e = Tensor::from_bytes(&bytes, &[4, 2], DType::Float16).unwrap_err();
        assert!(e.to_string().contains("12 bytes do not fill"), "{e}");
        assert!(e.to_string().contains("(4, 2)"), "{e}");
        let empty = Tensor::from_bytes(&[], &[0, 3], DType::Float8E5M2).unwrap();
        assert_eq!(empty.to_bytes().unwrap(), Vec::<u8>::new());
        // Host memory dlpart makes none of (managed, ROCm host) is read through kDLCPU memory.
        for kind in [crate::DeviceType::CudaManaged, crate::DeviceType::RocmHost] {
            let mut w = v.clone();
            w.device = Device::new(kind, 0).unwrap();
            assert_eq!(w.to_bytes().unwrap(), vec![10, 11, 6, 7, 2, 3], "{kind:?}");
        }
    }

    #[test]
    fn copy_is_contiguous_and_owns_its_memory() {
        let base = Tensor::from(ndarray::Array2::from_shape_fn((3, 4), |(i, j)| {
            (10 * i + j) as i64
        }));
        // Columns 1..3 read backwards along the rows: gaps and a negative stride.
        let mut view = base.view(&[0, 1], &[3, 2]).unwrap();
        view.data = view.data.wrapping_add(2 * 4 * 8);
        view.strides = Axes::from(&[-4isize, 1][..]);
        let c = view.copy().unwrap();
        assert!(c.is_contiguous());
        assert_ne!(c.data_ptr(), view.data_ptr());
        let want = ndarray::array![[21i64, 22], [11, 12], [1, 2]].into_dyn();
        assert_eq!(c.to_array::<i64>().unwrap(), want);
        base.as_array_mut::<i64>().unwrap().fill(-1);
        assert_eq!(c.to_array::<i64>().unwrap(), want);
        let minus_ones = ndarray::ArrayD::from_elem(vec![3, 2], -1i64);
        assert_eq!(
            view.to_device(Device::CPU)
                .unwrap()
                .to_array::<i64>()
                .unwrap(),
            minus_ones
        );
    }

    #[test]
    #[cfg_attr(miri, ignore = "the cache is off under Miri")]
    fn a_freed_huge_buffer_is_handed_out_again_for_its_size() {
        // A size no other test allocates, so that no other thread takes the kept buffer.
        let n = (34 << 20) + 1;
        let a = HostBuffer::uninit(n).unwrap();
        let p = a.as_ptr();
        // SAFETY: `a` owns at least n writable bytes.
        unsafe { std::ptr::write_bytes(p, 0xFF, n) };
        drop(a);
        let b = HostBuffer::zeroed(n).unwrap();
        assert_eq!(b.as_ptr(), p, "the kept buffer was not reused");
        // SAFETY: `b` owns at least n readable bytes.
        let bytes = unsafe { std::slice::from_raw_parts(b.as_ptr(), n) };
        assert!(
            bytes.iter().all(|&x| x == 0),
            "zeroed() handed out old contents"
        );
    }

    /// Sizes the layout refuses (beyond `isize::MAX` once rounded up) never reach the
    /// allocator, so this runs under Miri too.
    #[test]
    fn host_buffers_beyond_isize_max_are_errors_naming_the_bytes() {
        let max = isize::MAX as usize;
        for n in [max - HostBuffer::HUGE + 2, max, max + 1, usize::MAX] {
            for r in [HostBuffer::uninit(n), HostBuffer::zeroed(n)] {
                match r {
                    Err(Error::OutOfMemory { bytes, .. }) => assert_eq!(bytes, n),
                    Err(e) => panic!("{n} bytes: {e}"),
                    Ok(_) => panic!("{n} bytes were allocated"),
                }
            }
        }
        let e = zeroed_vec(max + 1, || "a test".into()).unwrap_err();
        assert!(
            matches!(e, Error::OutOfMemory { bytes, .. } if bytes == max + 1),
            "{e}"
        );
    }

    /// 2^62 bytes is a valid layout that no machine can map (x86-64 and AArch64 address at
    /// most 2^57 bytes): the allocator refuses it whatever the overcommit policy.
    #[test]
    #[cfg_attr(miri, ignore = "Miri stops at an allocation it cannot make")]
    fn an_allocation_the_host_refuses_is_an_error_not_an_abort() {
        let e = HostBuffer::uninit(1 << 62)
            .err()
            .expect("2^62 bytes allocated");
        assert_eq!(
            e.to_string(),
            "cannot allocate 4611686018427387904 bytes of host memory for a host buffer"
        );
        let e = Tensor::zeros(&[1 << 30, 1 << 30], DType::Float32).unwrap_err();
        assert!(
            matches!(e, Error::OutOfMemory { bytes, .. } if bytes == 1 << 62),
            "{e}"
        );
        let e = zeroed_vec(1 << 62, || "a test".into()).unwrap_err();
        assert!(matches!(e, Error::OutOfMemory { .. }), "{e}");
    }

    /// A backend's new tensors have unspecified contents, but never uninitialised memory:
    /// safe code may read them before writing (Miri checks every byte read here). A fresh
    /// small buffer is zero; a huge one may be a kept buffer's old bytes.
    #[test]
    fn new_host_tensors_are_initialised_memory() {
        let backend = crate::backend::backend_for(Device::CPU).unwrap();
        let small = backend.empty(&[1000], DType::Float32).unwrap();
        assert_eq!(small.as_array::<f32>().unwrap().sum(), 0.0);
        let huge = HostBuffer::HUGE / 8 + 1;
        let t = backend.empty(&[huge], DType::UInt64).unwrap();
        let sum = t
            .as_array::<u64>()
            .unwrap()
            .iter()
            .fold(0u64, |a, &b| a ^ b);
        std::hint::black_box(sum);
        for t in backend
            .empty_many(&[&[3, 5], &[0], &[7]], DType::Int16)
            .unwrap()
        {
            assert!(t.as_array::<i16>().unwrap().iter().all(|&v| v == 0));
        }
    }

    #[test]
    fn the_cache_keeps_the_newest_buffers_under_its_limit() {
        let layout =
            std::alloc::Layout::from_size_align(HostBuffer::HUGE, HostBuffer::HUGE).unwrap();
        let other =
            std::alloc::Layout::from_size_align(2 * HostBuffer::HUGE, HostBuffer::HUGE).unwrap();
        // Made as `HostBuffer::uninit` makes them: the cache releases evicted ones itself.
        let bufs: Vec<*mut u8> = (0..3).map(|_| map_huge(layout)).collect();
        assert!(bufs.iter().all(|b| !b.is_null()));
        let mut kept = cache::Kept {
            bytes: 0,
            free: Vec::new(),
        };
        let limit = 2 * HostBuffer::HUGE;
        for &b in &bufs {
            assert!(kept.keep(b, layout, limit));
        }
        // The oldest was released to make room for the third.
        assert_eq!(kept.bytes, limit);
        assert_eq!(
            kept.free.iter().map(|f| f.0).collect::<Vec<_>>(),
            [bufs[1] as usize, bufs[2] as usize]
        );
        // Too big to keep at all: the caller releases it.
        let big = map_huge(other);
        assert!(!kept.keep(big, other, HostBuffer::HUGE));
        // SAFETY: made just above with `other`, not kept.
        unsafe { release(big, other) };
        assert_eq!(kept.take(other), None);
        assert_eq!(kept.take(layout), Some(bufs[2]));
        assert_eq!(kept.take(layout), Some(bufs[1]));
        assert_eq!((kept.take(layout), kept.bytes), (None, 0));
        for b in [bufs[1], bufs[2]] {
            // SAFETY: made with `layout` above and handed back by `take`, once each.
            unsafe { release(b, layout) };
        }
    }

    #[test]
    fn views_share_memory_and_match_ndarray_slicing() {
        let vals: Vec<i32> = (0..24).collect();
        let t = Tensor::from_slice(&vals, &[2, 3, 4]).unwrap();
        let v = t.view(&[1, 1, 2], &[1, 2, 2]).unwrap();
        let reference = ndarray::ArrayD::from_shape_vec(ndarray::IxDyn(&[2, 3, 4]), vals).unwrap();
        let expect = reference
            .slice(ndarray::s![1..2, 1..3, 2..4])
            .into_dyn()
            .to_owned();
        assert_eq!(v.to_array::<i32>().unwrap(), expect);
        assert!(Arc::ptr_eq(v.owner(), t.owner()));
        assert!(t.view(&[0, 0, 3], &[1, 1, 2]).is_err());
        assert!(t.as_array::<f32>().is_err());
    }

    #[test]
    fn shapes_with_a_zero_follow_ndarrays_rule_in_any_axis_order() {
        // ndarray (and numpy) refuse a shape whose non-zero axes overflow, even with a zero.
        for shape in [[0, 1 << 40, 1 << 40], [1 << 40, 1 << 40, 0]] {
            let e = checked_numel(&shape).unwrap_err().to_string();
            assert!(e.contains("too many elements"), "{e}");
            assert!(Tensor::zeros(&shape, DType::Float32).is_err());
        }
        assert_eq!(checked_numel(&[0, 1 << 30, 1 << 30]).unwrap(), 0);
        assert_eq!(checked_numel(&[3, 4]).unwrap(), 12);
        let t = Tensor::zeros(&[0, 1 << 30, 1 << 30], DType::Float32).unwrap();
        assert_eq!(t.as_array::<f32>().unwrap().shape(), &[0, 1 << 30, 1 << 30]);
        let v = t.view(&[0, 1 << 29, 5], &[0, 1 << 29, 7]).unwrap();
        assert_eq!(v.to_array::<f32>().unwrap().shape(), &[0, 1 << 29, 7]);
    }

    #[test]
    fn a_tensor_fits_in_two_cache_lines() {
        // Arrays of thousands of partitions are bound by the cache misses of their tensors.
        assert!(
            std::mem::size_of::<Tensor>() <= 120,
            "{}",
            std::mem::size_of::<Tensor>()
        );
        assert!(std::mem::size_of::<crate::Data>() <= 120);
    }

    #[test]
    fn shapes_beyond_the_inline_axes_go_to_the_heap() {
        for nd in [0, 1, INLINE_AXES, INLINE_AXES + 1, 9] {
            let shape: Vec<usize> = (0..nd).map(|a| 1 + a % 3).collect();
            let t = Tensor::zeros(&shape, DType::Int16).unwrap();
            assert_eq!(t.shape(), shape.as_slice());
            assert_eq!(t.strides(), contiguous_strides(&shape).as_slice());
            assert!(matches!(t.shape, Axes::Heap(_)) == (nd > INLINE_AXES));
            let buf = Arc::new(HostBuffer::uninit(t.nbytes()).unwrap());
            // SAFETY: `buf` holds the tensor's numel * 2 bytes, in C order.
            let c = unsafe {
                Tensor::contiguous_unchecked(buf.as_ptr(), &shape, DType::Int16, Device::CPU, buf)
            };
            assert_eq!((c.shape(), c.strides()), (t.shape(), t.strides()));
            if nd > 0 {
                let mut start = vec![0; nd];
                start[nd - 1] = shape[nd - 1] - 1;
                let mut ext = shape.clone();
                ext[nd - 1] = 1;
                let v = c.view(&start, &ext).unwrap();
                assert_eq!((v.shape(), v.strides()), (ext.as_slice(), c.strides()));
            }
        }
    }

    #[test]
    fn spans_cover_negative_strides() {
        let t = Tensor::zeros(&[3, 4], DType::Float32).unwrap();
        assert_eq!(t.byte_span(), (0, 48));
        let mut r = t.clone();
        r.strides = vec![-4, 1].into();
        assert_eq!(r.byte_span(), (-32, 16));
        assert!(!r.is_contiguous());
        assert!(t.is_contiguous());
    }

    #[test]
    fn element_types_match_their_dtypes() {
        fn check<T: Element>() {
            assert_eq!(
                std::mem::size_of::<T>(),
                T::DTYPE.itemsize(),
                "{}",
                T::DTYPE
            );
            assert!(std::mem::align_of::<T>() <= std::mem::size_of::<T>());
        }
        check::<bool>();
        check::<i8>();
        check::<i16>();
        check::<i32>();
        check::<i64>();
        check::<u8>();
        check::<u16>();
        check::<u32>();
        check::<u64>();
        check::<f32>();
        check::<f64>();
        check::<Complex<f32>>();
        check::<Complex<f64>>();
        #[cfg(feature = "half")]
        {
            check::<half::f16>();
            check::<half::bf16>();
        }
        // DLPack's complex layout: the real part at offset 0, the imaginary part right after.
        assert_eq!(std::mem::offset_of!(Complex<f32>, re), 0);
        assert_eq!(std::mem::offset_of!(Complex<f32>, im), 4);
        assert_eq!(std::mem::offset_of!(Complex<f64>, im), 8);
        assert_eq!(std::mem::align_of::<Complex<f64>>(), 8);
    }

    /// A host tensor of `bytes` (64-byte aligned, from `Tensor::from_slice`) whose elements
    /// are `n` items of `dtype` starting `offset` bytes in: what a DLPack producer hands over.
    fn relabelled(bytes: &[u8], offset: usize, dtype: DType, n: usize) -> Tensor {
        let mut padded = vec![0xEEu8; offset];
        padded.extend(bytes);
        let buf = Tensor::from_slice(&padded, &[padded.len()]).unwrap();
        let mut t = buf.view(&[offset], &[n * dtype.itemsize()]).unwrap();
        t.dtype = dtype;
        t.shape = vec![n].into();
        t
    }

    #[test]
    fn complex_arrays_round_trip_and_keep_their_layout() {
        let z = ndarray::array![
            [Complex::new(1.0f32, -1.0), Complex::new(2.5, 0.0)],
            [Complex::new(-0.0, 3.0), Complex::new(f32::INFINITY, -7.25)],
        ];
        let t = Tensor::from(z.clone());
        assert_eq!(t.dtype(), DType::Complex64);
        assert_eq!(t.nbytes(), 4 * 8);
        assert_eq!(t.as_array::<Complex<f32>>().unwrap(), z);
        assert!(t.as_array::<Complex<f64>>().is_err());
        assert!(t.as_array::<u64>().is_err());
        // Transposed: zero-copy strides, and a C-order copy.
        let zt = Tensor::from(z.clone().reversed_axes());
        assert_eq!(zt.strides(), &[1, 2]);
        assert_eq!(zt.to_array::<Complex<f32>>().unwrap(), z.t().into_dyn());
        let w = ndarray::array![Complex::new(1e300f64, -2.0), Complex::new(0.5, f64::MIN)];
        let t = Tensor::from_slice(w.as_slice().unwrap(), &[2]).unwrap();
        assert_eq!(t.dtype(), DType::Complex128);
        assert_eq!(t.to_array::<Complex<f64>>().unwrap(), w.into_dyn());
        // Read-only shared arrays too.
        let shared = ndarray::ArcArray::from_vec(vec![Complex::new(4.0f32, 5.0)]);
        let t = Tensor::from_arc_array(shared);
        assert!(t.readonly());
        assert_eq!(
            t.as_array::<Complex<f32>>().unwrap()[[0]],
            Complex::new(4.0, 5.0)
        );
    }

    /// DLPack's complex64 is two little-endian (here: native) float32s, real first.
    #[test]
    #[cfg(target_endian = "little")]
    fn complex_items_read_from_raw_bytes_real_part_first() {
        #[rustfmt::skip]
        let bytes = [
            0x00, 0x00, 0x80, 0x3F, 0x00, 0x00, 0x00, 0x40, // 1.0, 2.0
            0x00, 0x00, 0x40, 0xC0, 0x00, 0x00, 0x00, 0x3F, // -3.0, 0.5
        ];
        let t = relabelled(&bytes, 0, DType::Complex64, 2);
        let got: Vec<_> = t
            .as_array::<Complex<f32>>()
            .unwrap()
            .iter()
            .copied()
            .collect();
        assert_eq!(got, [Complex::new(1.0, 2.0), Complex::new(-3.0, 0.5)]);
        #[rustfmt::skip]
        let bytes = [
            0, 0, 0, 0, 0, 0, 0xF0, 0x3F, 0, 0, 0, 0, 0, 0, 0x00, 0xC0, // 1.0, -2.0
        ];
        let t = relabelled(&bytes, 0, DType::Complex128, 1);
        assert_eq!(
            t.to_array::<Complex<f64>>().unwrap()[[0]],
            Complex::new(1.0, -2.0)
        );
    }

    /// complex128 from a producer may be aligned to its float64s (8) rather than its size
    /// (16): that is `Complex<f64>`'s own alignment, so it is viewed in place. Data aligned
    /// to less is refused by `as_array` and copied by `to_array`.
    #[test]
    fn complex128_needs_only_the_alignment_of_its_parts() {
        let want = [Complex::new(1.5f64, -2.5), Complex::new(-0.0, 1e-300)];
        let bytes: Vec<u8> = want
            .iter()
            .flat_map(|z| [z.re.to_ne_bytes(), z.im.to_ne_bytes()])
            .flatten()
            .collect();
        let eight = relabelled(&bytes, 8, DType::Complex128, 2);
        assert_eq!(eight.data_ptr() as usize % 16, 8);
        let view = eight.as_array::<Complex<f64>>().unwrap();
        assert_eq!(view.as_ptr().cast::<u8>(), eight.data_ptr().cast_const());
        assert_eq!(view.iter().copied().collect::<Vec<_>>(), want);
        drop(view);
        for offset in [1, 4] {
            let t = relabelled(&bytes, offset, DType::Complex128, 2);
            let e = t.as_array::<Complex<f64>>().unwrap_err().to_string();
            assert!(e.contains("not aligned for complex128"), "{e}");
            assert_eq!(
                t.to_array::<Complex<f64>>()
                    .unwrap()
                    .iter()
                    .copied()
                    .collect::<Vec<_>>(),
                want
            );
        }
        let mut reversed = relabelled(&bytes, 4, DType::Complex128, 2);
        reversed.data = reversed.data.wrapping_add(16);
        reversed.strides = vec![-1].into();
        assert_eq!(
            reversed
                .to_array::<Complex<f64>>()
                .unwrap()
                .iter()
                .copied()
                .collect::<Vec<_>>(),
            [want[1], want[0]]
        );
    }

    /// Known bit patterns: float16 1.0 is 0x3C00, -2.0 0xC000, 65504 (its largest) 0x7BFF;
    /// bfloat16 1.0 is 0x3F80 (float32's upper half), -3.0 0xC040.
    #[test]
    #[cfg(feature = "half")]
    fn half_precision_items_have_their_ieee_bits() {
        use half::{bf16, f16};

        let bits = [0x3C00u16, 0xC000, 0x7BFF, 0x0001];
        let mut t = Tensor::from_slice(&bits, &[4]).unwrap();
        t.dtype = DType::Float16;
        let got: Vec<f32> = t
            .as_array::<f16>()
            .unwrap()
            .iter()
            .map(|h| h.to_f32())
            .collect();
        // The smallest subnormal, 2^-24 (exact; `powi` may be inexact, and is under Miri).
        assert_eq!(got, [1.0, -2.0, 65504.0, 1.0 / 16_777_216.0]);
        assert!(t.as_array::<bf16>().is_err(), "same size, another dtype");
        let mut t = Tensor::from_slice(&[0x3F80u16, 0xC040, 0x7F80], &[3]).unwrap();
        t.dtype = DType::BFloat16;
        let got: Vec<f32> = t
            .to_array::<bf16>()
            .unwrap()
            .iter()
            .map(|h| h.to_f32())
            .collect();
        assert_eq!(got, [1.0, -3.0, f32::INFINITY]);
        assert!(t.as_array::<f16>().is_err());

        // And back: arrays of f16/bf16 go in with those bits.
        let a = ndarray::array![[f16::ONE, f16::from_f32(-2.0)], [f16::MAX, f16::ZERO]];
        let mut t = Tensor::from(a.clone());
        assert_eq!(t.dtype(), DType::Float16);
        assert_eq!(t.as_array::<f16>().unwrap(), a);
        t.dtype = DType::UInt16;
        assert_eq!(
            t.to_array::<u16>().unwrap(),
            ndarray::array![[0x3C00u16, 0xC000], [0x7BFF, 0x0000]].into_dyn()
        );
        let b = ndarray::array![bf16::ONE, bf16::from_f32(-3.0)];
        let mut t = Tensor::from(b.clone());
        assert_eq!(t.dtype(), DType::BFloat16);
        assert_eq!(t.to_array::<bf16>().unwrap(), b.into_dyn());
        t.dtype = DType::UInt16;
        assert_eq!(
            t.to_array::<u16>().unwrap(),
            ndarray::array![0x3F80u16, 0xC040].into_dyn()
        );
    }

    /// Reading a tensor as another element type than its dtype is a dtype mismatch naming
    /// both, from each of the readers.
    #[test]
    fn an_element_type_other_than_the_dtype_is_a_dtype_mismatch() {
        let t = Tensor::from_slice(&[1i64, 2], &[2]).unwrap();
        let errors = [
            t.as_array::<f64>().map(drop).unwrap_err(),
            t.to_array::<f64>().map(drop).unwrap_err(),
            t.as_array_mut::<f64>().map(drop).unwrap_err(),
        ];
        for (e, op) in errors.iter().zip(["as_array", "to_array", "as_array_mut"]) {
            assert!(
                matches!(
                    e,
                    Error::DTypeMismatch {
                        found: DType::Int64,
                        expected: DType::Float64,
                        ..
                    }
                ),
                "{e:?}"
            );
            assert_eq!(
                e.to_string(),
                format!("dtype int64 differs from float64 of the element type {op} was asked for")
            );
        }
    }

    #[test]
    fn bool_views_refuse_bytes_other_than_0_and_1() {
        let mut t = Tensor::from_slice(&[0u8, 1, 1], &[3]).unwrap();
        t.dtype = DType::Bool;
        assert_eq!(
            t.as_array::<bool>()
                .unwrap()
                .iter()
                .copied()
                .collect::<Vec<_>>(),
            [false, true, true]
        );
        let mut bad = Tensor::from_slice(&[0u8, 2, 1], &[3]).unwrap();
        bad.dtype = DType::Bool;
        let err = bad.as_array::<bool>().unwrap_err().to_string();
        assert_eq!(
            err,
            "as_array: bool tensor holds byte 2, which is not a bool"
        );
        let err = bad.to_array::<bool>().unwrap_err().to_string();
        assert_eq!(
            err,
            "to_array: bool tensor holds byte 2, which is not a bool"
        );
        // A mutable view can be read too: the same check, then writes of bools.
        let err = bad.as_array_mut::<bool>().unwrap_err().to_string();
        assert!(
            err.contains("as_array_mut: bool tensor holds byte 2"),
            "{err}"
        );
        t.as_array_mut::<bool>().unwrap()[[0]] = true;
        t.as_array_mut::<bool>().unwrap()[[2]] = false;
        let mut bytes = t.clone();
        bytes.dtype = DType::UInt8;
        assert_eq!(
            bytes.to_array::<u8>().unwrap().as_slice(),
            Some(&[1, 1, 0][..])
        );
    }

    #[test]
    fn unaligned_data_is_copied_not_viewed() {
        let bytes: Vec<u8> = [1.5f32, -2.0, 3.25]
            .iter()
            .flat_map(|v| v.to_ne_bytes())
            .collect();
        let mut padded = vec![0u8];
        padded.extend(&bytes);
        let buf = Tensor::from_slice(&padded, &[13]).unwrap();
        let mut t = buf.view(&[1], &[12]).unwrap();
        assert!(!t.data_ptr().cast::<f32>().is_aligned());
        t.dtype = DType::Float32;
        t.shape = vec![3].into();
        t.strides = vec![-1].into();
        t.data = t.data.wrapping_add(8);
        assert!(t.as_array::<f32>().is_err());
        let e = t.as_array_mut::<f32>().unwrap_err().to_string();
        assert!(
            e.contains("as_array_mut: data at") && e.contains("not aligned"),
            "{e}"
        );
        assert_eq!(
            t.to_array::<f32>()
                .unwrap()
                .iter()
                .copied()
                .collect::<Vec<_>>(),
            [3.25, -2.0, 1.5]
        );
    }

    /// `base` (3x4, C order) seen from its last element with strides `(-4, -1)`: element
    /// `[i, j]` is `base[[2 - i, 3 - j]]`.
    fn reversed(base: &Tensor) -> Tensor {
        let mut r = base.clone();
        r.data = base.data.wrapping_add(11 * base.dtype.itemsize());
        r.strides = vec![-4, -1].into();
        r
    }

    #[test]
    fn mutable_views_write_the_tensors_memory_in_place() {
        let t = Tensor::from_slice(&(0..12).collect::<Vec<i32>>(), &[3, 4]).unwrap();
        {
            let clone = t.clone();
            let mut all = clone.as_array_mut::<i32>().unwrap();
            assert_eq!(all[[1, 2]], 6, "reads what is there");
            all[[0, 1]] = 100;
            all.slice_mut(ndarray::s![2, ..]).map_inplace(|v| *v = -*v);
        }
        {
            // A column block, which has gaps: only its elements are written.
            let block = t.view(&[0, 2], &[2, 2]).unwrap();
            let mut v = block.as_array_mut::<i32>().unwrap();
            assert_eq!(v.shape(), [2, 2]);
            v.fill(7);
        }
        let expect = [0, 100, 7, 7, 4, 5, 7, 7, -8, -9, -10, -11];
        assert_eq!(
            t.to_array::<i32>().unwrap(),
            ndarray::ArrayD::from_shape_vec(vec![3, 4], expect.to_vec()).unwrap()
        );
        // Empty and 0-d tensors have views too.
        let mut empty = Tensor::zeros(&[0, 3], DType::Float64).unwrap();
        empty.strides = vec![0, 0].into(); // no elements, so none repeats
        assert_eq!(empty.as_array_mut::<f64>().unwrap().shape(), [0, 3]);
        let scalar = Tensor::from_slice(&[5u16], &[]).unwrap();
        scalar.as_array_mut::<u16>().unwrap()[[]] += 1;
        assert_eq!(scalar.to_array::<u16>().unwrap()[[]], 6);
    }

    #[test]
    fn mutable_views_of_negative_strides_write_the_elements_they_index() {
        let base = Tensor::from_slice(&(0..12).collect::<Vec<i32>>(), &[3, 4]).unwrap();
        let r = reversed(&base);
        {
            let mut v = r.as_array_mut::<i32>().unwrap();
            assert_eq!((v[[0, 0]], v[[1, 2]], v[[2, 3]]), (11, 5, 0));
            v[[0, 1]] = 100; // base[[2, 2]], element 10
            v[[2, 0]] = 200; // base[[0, 3]], element 3
        }
        let mut expect: Vec<i32> = (0..12).collect();
        expect[10] = 100;
        expect[3] = 200;
        assert_eq!(
            base.to_array::<i32>().unwrap(),
            ndarray::ArrayD::from_shape_vec(vec![3, 4], expect).unwrap()
        );
        let r = r.to_array::<i32>().unwrap();
        assert_eq!((r[[0, 1]], r[[2, 0]]), (100, 200));
    }

    #[test]
    fn mutable_views_refuse_what_cannot_be_written_alone() {
        let t = Tensor::from_slice(&[1i32, 2, 3], &[3]).unwrap();
        let e = t
            .with_readonly(true)
            .unwrap()
            .as_array_mut::<i32>()
            .unwrap_err();
        assert!(matches!(e, Error::ReadOnly { .. }), "{e}");
        let e = e.to_string();
        assert!(
            e.starts_with("as_array_mut: tensor") && e.contains("readonly=True"),
            "{e}"
        );
        // A broadcast view: every row is the same three elements. It may be read, not written.
        let mut rows = t.clone();
        rows.shape = vec![2, 3].into();
        rows.strides = vec![0, 1].into();
        assert_eq!(
            rows.as_array::<i32>().unwrap(),
            ndarray::array![[1, 2, 3], [1, 2, 3]]
        );
        let e = rows.as_array_mut::<i32>().unwrap_err().to_string();
        assert!(
            e.contains("as_array_mut: tensor Tensor(shape=(2, 3)")
                && e.contains("strides=(0, 1)")
                && e.contains("refers to some element more than once"),
            "{e}"
        );
        // Strides that interleave: elements [0, 1] and [1, 0] are one.
        let mut interleaved = t.clone();
        interleaved.shape = vec![2, 2].into();
        interleaved.strides = vec![1, 1].into();
        let e = interleaved.as_array_mut::<i32>().unwrap_err().to_string();
        assert!(e.contains("refers to some element more than once"), "{e}");
        // Offsets 0, 3, 2, 5, 4, 7: distinct, but not nested as ndarray's mutable views need.
        let eight = Tensor::from_slice(&[0i32; 8], &[8]).unwrap();
        let mut apart = eight.clone();
        apart.shape = vec![3, 2].into();
        apart.strides = vec![2, 3].into();
        let e = apart.as_array_mut::<i32>().unwrap_err().to_string();
        assert!(e.contains("has strides that interleave"), "{e}");
        assert_eq!(apart.as_array::<i32>().unwrap().sum(), 0, "it may be read");
        let e = t.as_array_mut::<f32>().unwrap_err();
        assert!(
            matches!(
                e,
                Error::DTypeMismatch {
                    found: DType::Int32,
                    expected: DType::Float32,
                    ..
                }
            ),
            "{e:?}"
        );
        assert_eq!(
            e.to_string(),
            "dtype int32 differs from float32 of the element type as_array_mut was asked for"
        );
        let mut device = t.clone();
        device.device = Device::cuda(0);
        let e = device.as_array_mut::<i32>().unwrap_err();
        assert!(
            matches!(&e, Error::UnsupportedDevice { op, .. } if op == "as_array_mut"),
            "{e}"
        );
        // Nothing was written, and no refusal left a claim behind.
        let mut v = t.as_array_mut::<i32>().unwrap();
        assert_eq!(v, ndarray::array![1, 2, 3]);
        v[[1]] = 0;
        drop(v);
        assert_eq!(
            t.to_array::<i32>().unwrap(),
            ndarray::arr1(&[1, 0, 3]).into_dyn()
        );
    }

    #[test]
    fn a_mutable_view_is_alone_with_its_memory_while_it_lives() {
        use crate::{Layout, PartitionedArray};
        let t = Tensor::from_ndarray(ndarray::Array2::<i32>::zeros((4, 6)));
        let idx = Tensor::from_slice(&[0i64, 1], &[2]).unwrap();
        let ones = Tensor::from_slice(&[1i32; 12], &[2, 6]).unwrap();
        let rows = PartitionedArray::partition(&t, &Layout::tiling(&[2, 1])).unwrap();
        // Each refusal names the operation, what its tensor at fault is to it, the tensor,
        // and the other side.
        fn refused<T>(r: Result<T>, starts: &str) {
            let e = r.err().expect("refused").to_string();
            let by = "being written at the same time by as_array_mut (its live view)";
            assert!(e.starts_with(starts) && e.contains(by), "{e}");
        }
        let whole = "Tensor(shape=(4, 6), dtype=int32, device=kDLCPU)";
        let mut view = t.as_array_mut::<i32>().unwrap();
        view[[3, 5]] = 9;
        // Other views of it, from a clone or of a part of it, and from another thread.
        refused(
            t.clone().as_array::<i32>(),
            &format!("as_array: cannot read its live view, {whole}: host memory 0x"),
        );
        refused(
            t.view(&[1, 1], &[1, 1]).unwrap().as_array_mut::<i32>(),
            "as_array_mut: cannot write its live view, Tensor(shape=(1, 1), dtype=int32",
        );
        std::thread::scope(|s| {
            let c = t.clone();
            let starts = format!("as_array_mut: cannot write its live view, {whole}");
            s.spawn(move || refused(c.as_array_mut::<i32>(), &starts));
        });
        // dlpart's operations that read it or write it.
        refused(
            crate::ops::gather(&t, &idx, 0, None),
            &format!("gather: cannot read its source, {whole}"),
        );
        refused(
            crate::ops::scatter(&ones, &idx, &t, 0),
            &format!("scatter: cannot write its output, {whole}"),
        );
        refused(
            rows.repartition(&Layout::tiling(&[1, 2]), false),
            "partition copy: cannot read its source partition 0, Tensor(shape=(2, 6), dtype=int32",
        );
        refused(
            t.to_array::<i32>(),
            &format!("to_array: cannot read its tensor, {whole}"),
        );
        refused(
            t.to_bytes(),
            &format!("to_bytes: cannot read its tensor, {whole}"),
        );
        drop(view);
        // Once it is gone, all of those run; and views of blocks that share no element (the
        // column blocks' spans meet) may be written side by side.
        let cols = rows.repartition(&Layout::tiling(&[1, 2]), false).unwrap();
        let (left, right) = (
            t.view(&[0, 0], &[4, 3]).unwrap(),
            t.view(&[0, 3], &[4, 3]).unwrap(),
        );
        let (mut l, mut r) = (
            left.as_array_mut::<i32>().unwrap(),
            right.as_array_mut::<i32>().unwrap(),
        );
        l.fill(1);
        r.fill(2);
        refused(
            t.as_array::<i32>(),
            &format!("as_array: cannot read its live view, {whole}"),
        );
        drop((l, r));
        crate::ops::scatter(&ones, &idx, &t, 0).unwrap();
        let mut expect = ndarray::Array2::from_shape_fn((4, 6), |(_, j)| 1 + (j >= 3) as i32);
        expect.slice_mut(ndarray::s![..2, ..]).fill(1);
        assert_eq!(t.as_array::<i32>().unwrap(), expect);
        // The repartition made after the view was dropped copied its write.
        let right_cols = cols.partitions().last().unwrap();
        let right_cols = right_cols.tensor().unwrap().to_array::<i32>().unwrap();
        assert_eq!(right_cols[[3, 2]], 9);
        // A live read view refuses a mutable one, too.
        let read = t.as_array::<i32>().unwrap();
        let e = t.as_array_mut::<i32>().unwrap_err().to_string();
        assert!(
            e.contains("cannot write") && e.contains("being read"),
            "{e}"
        );
        assert_eq!(read[[3, 5]], 2);
    }

    #[test]
    fn readonly_cannot_be_lifted() {
        let t = Tensor::zeros(&[2], DType::UInt8)
            .unwrap()
            .with_readonly(true)
            .unwrap();
        assert!(t.with_readonly(false).is_err());
        assert!(format!("{t:?}").contains("readonly=True"));
    }
}
