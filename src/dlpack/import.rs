//! Owning a foreign DLPack tensor: trust only its ownership, validate the rest.

use std::ptr::NonNull;
use std::sync::Arc;

use dlpack_rs::ffi::{DLManagedTensor, DLManagedTensorVersioned, DLTensor};

use crate::device::Device;
use crate::dtype::DType;
use crate::error::{tuple_string, Error, Result};
use crate::tensor::{checked_numel, contiguous_strides, Tensor};

use super::FLAG_READ_ONLY;

enum Managed {
    Versioned(NonNull<DLManagedTensorVersioned>),
    Legacy(NonNull<DLManagedTensor>),
}

/// Sole owner of a foreign managed tensor; dropping it calls the producer's deleter once.
pub struct ForeignTensor {
    managed: Managed,
}

// SAFETY: DLPack requires a deleter to be callable from any thread once the consumer is done;
// `ForeignTensor` never reads or writes through the pointer after construction except to read
// the metadata (immutable by contract while we own it) and to call the deleter, once, in `drop`.
unsafe impl Send for ForeignTensor {}
// SAFETY: `&ForeignTensor` only reads immutable metadata.
unsafe impl Sync for ForeignTensor {}

impl ForeignTensor {
    /// Takes ownership of a versioned managed tensor.
    ///
    /// # Safety
    /// `ptr` must point to a valid `DLManagedTensorVersioned` that nobody else will delete;
    /// from now on its deleter (if any) is called exactly once, by this value.
    pub unsafe fn from_versioned(ptr: NonNull<DLManagedTensorVersioned>) -> Self {
        ForeignTensor {
            managed: Managed::Versioned(ptr),
        }
    }

    /// Takes ownership of a legacy (unversioned) managed tensor.
    ///
    /// # Safety
    /// As for [`ForeignTensor::from_versioned`].
    pub unsafe fn from_legacy(ptr: NonNull<DLManagedTensor>) -> Self {
        ForeignTensor {
            managed: Managed::Legacy(ptr),
        }
    }

    /// The DLPack version the producer declared (`(0, 0)`-less legacy tensors report `None`).
    pub fn version(&self) -> Option<(u32, u32)> {
        match self.managed {
            // SAFETY: the pointer is valid while we own it (constructor contract).
            Managed::Versioned(p) => unsafe {
                let v = p.as_ref().version;
                Some((v.major, v.minor))
            },
            Managed::Legacy(_) => None,
        }
    }

    /// The `flags` field (0 for legacy tensors).
    pub fn flags(&self) -> u64 {
        match self.managed {
            // SAFETY: as in `version`; the flags field lies before the tensor, at the same
            // offset in every 1.x version.
            Managed::Versioned(p) => unsafe { p.as_ref().flags },
            Managed::Legacy(_) => 0,
        }
    }

    fn dl_tensor(&self) -> &DLTensor {
        match self.managed {
            // SAFETY: the pointer is valid while we own it; the reference borrows `self`.
            Managed::Versioned(p) => unsafe { &p.as_ref().dl_tensor },
            // SAFETY: as above.
            Managed::Legacy(p) => unsafe { &p.as_ref().dl_tensor },
        }
    }

    /// Validates the managed tensor into a [`Tensor`] that keeps `self` as its owner.
    ///
    /// On error `self` is dropped here, which calls the deleter: the caller has nothing left
    /// to release.
    pub fn into_tensor(self) -> Result<Tensor> {
        if let Some((major, minor)) = self.version() {
            if major != 1 {
                return Err(field(
                    "version",
                    format!("{major}.{minor}"),
                    "dlpart reads major version 1",
                ));
            }
        }
        let t = self.dl_tensor();
        // The C enum's value as the producer wrote it (a u32), never reinterpreted as negative.
        let code = i32::try_from(t.device.device_type).map_err(|_| Error::InvalidDevice {
            text: t.device.device_type.to_string(),
            reason: "not a DLPack device type code".into(),
        });
        let device = code
            .and_then(|code| Device::from_dlpack(code, t.device.device_id))
            .map_err(|e| {
                let pair = (t.device.device_type, t.device.device_id);
                field(
                    "device",
                    format!("{pair:?}"),
                    format!("unknown device ({e})"),
                )
            })?;
        let dtype = DType::from_dlpack(t.dtype)?;
        if t.ndim < 0 {
            return Err(field("ndim", t.ndim, "a negative number of axes"));
        }
        let ndim = t.ndim as usize;
        if ndim > 0 && t.shape.is_null() {
            return Err(field(
                "shape",
                "NULL",
                format!("ndim is {ndim}, so a NULL shape is not allowed"),
            ));
        }
        let raw_shape: &[i64] = if ndim == 0 {
            &[]
        } else {
            // SAFETY: a non-NULL `shape` of a valid DLTensor holds `ndim` entries.
            unsafe { std::slice::from_raw_parts(t.shape, ndim) }
        };
        let (mut shape_stack, mut shape_heap) = ([0usize; STACK_AXES], Vec::new());
        let shape = convert_axes(
            raw_shape,
            usize::try_from,
            &mut shape_stack,
            &mut shape_heap,
        )
        .map_err(|_| field("shape", tuple_string(raw_shape), "a negative extent"))?;
        let numel = checked_numel(shape).map_err(|_| {
            field(
                "shape",
                tuple_string(shape),
                "more elements than fit a usize",
            )
        })?;
        let itemsize = dtype.itemsize();
        // Every byte count must fit an isize: `Tensor::nbytes` and the copy kernels rely on it.
        if numel
            .checked_mul(itemsize)
            .is_none_or(|b| b > isize::MAX as usize)
        {
            return Err(field(
                "shape",
                tuple_string(shape),
                format!("more bytes of {dtype} than fit an isize"),
            ));
        }
        let (mut strides_stack, mut strides_heap) = ([0isize; STACK_AXES], Vec::new());
        let strides: &[isize] = if ndim == 0 || t.strides.is_null() {
            // DLPack < 1.2 allowed NULL strides to mean C order.
            strides_heap = contiguous_strides(shape);
            &strides_heap
        } else {
            // SAFETY: a non-NULL `strides` of a valid DLTensor holds `ndim` entries.
            let s = unsafe { std::slice::from_raw_parts(t.strides, ndim) };
            convert_axes(s, isize::try_from, &mut strides_stack, &mut strides_heap)
                .map_err(|_| field("strides", tuple_string(s), "they do not fit this platform"))?
        };
        let data = if numel == 0 {
            // Zero-size tensors may carry NULL or any pointer; never dereferenced.
            std::ptr::NonNull::<u64>::dangling().as_ptr() as *mut u8
        } else {
            if t.data.is_null() {
                return Err(field(
                    "data",
                    "NULL",
                    format!(
                        "the shape {} has elements, so a NULL data pointer is not allowed",
                        tuple_string(shape)
                    ),
                ));
            }
            let offset = isize::try_from(t.byte_offset)
                .map_err(|_| field("byte_offset", t.byte_offset, "too large"))?;
            if byte_span(t.data as usize, offset, shape, strides, itemsize).is_none() {
                return Err(field(
                    "strides",
                    tuple_string(strides),
                    format!(
                        "with byte_offset {offset}, shape {} and {dtype} the element offsets \
                         overflow: the elements would not lie in the address space",
                        tuple_string(shape)
                    ),
                ));
            }
            (t.data as *mut u8).wrapping_offset(offset)
        };
        // A legacy (unversioned) tensor carries no read-only flag, so nothing says its memory
        // may be written: it is imported read-only, as numpy does (jax hands out legacy capsules
        // of immutable buffers). A caller who needs to write asks for a copy.
        let readonly = self.version().is_none() || self.flags() & FLAG_READ_ONLY != 0;
        if device.kind == crate::device::DeviceType::Cpu && device.id > 0 {
            // A producer's host device `kDLCPU:k` (a framework's emulated one) is in use here:
            // copies onto it, where the data already is, must find it present. (`kDLCPU:0`
            // always is: most imports skip the shared atomic.)
            crate::backend::note_host_devices(device.id.saturating_add(1));
        }
        // SAFETY: the producer guarantees that every in-bounds element of the described tensor
        // is valid memory until its deleter runs; the deleter runs when `owner` (this
        // ForeignTensor) is dropped, after the last view is gone.
        Ok(unsafe {
            Tensor::from_raw_slices(
                data,
                shape,
                strides,
                dtype,
                device,
                readonly,
                Arc::new(self),
            )
        })
    }
}

/// An [`Error::DLPackField`]: `name` of the imported tensor holds `value`, which `problem` says
/// is wrong.
fn field(name: &'static str, value: impl std::fmt::Display, problem: impl Into<String>) -> Error {
    Error::DLPackField {
        field: name,
        value: value.to_string(),
        problem: problem.into(),
    }
}

/// Axes up to this many are read into arrays on the stack: a `Vec` for the shape and one for
/// the strides cost two allocations and two frees per import, for a tensor that holds its
/// axes inline anyway.
const STACK_AXES: usize = 8;

/// `raw` converted by `f`, in `stack` when it fits, else in `heap`.
fn convert_axes<'a, U: Copy, T: Copy, E>(
    raw: &[U],
    f: impl Fn(U) -> std::result::Result<T, E>,
    stack: &'a mut [T; STACK_AXES],
    heap: &'a mut Vec<T>,
) -> std::result::Result<&'a [T], E> {
    if raw.len() <= STACK_AXES {
        for (d, &x) in stack.iter_mut().zip(raw) {
            *d = f(x)?;
        }
        Ok(&stack[..raw.len()])
    } else {
        *heap = raw
            .iter()
            .map(|&x| f(x))
            .collect::<std::result::Result<_, _>>()?;
        Ok(heap)
    }
}

/// The bytes `[lo, hi)` the elements of a non-empty tensor span, as addresses, with every
/// step checked: `None` when any offset overflows an isize or the span leaves the address
/// space. Checked arithmetic behaves the same in debug and release builds.
fn byte_span(
    data: usize,
    offset: isize,
    shape: &[usize],
    strides: &[isize],
    itemsize: usize,
) -> Option<(usize, usize)> {
    let item = isize::try_from(itemsize).ok()?;
    let (mut lo, mut hi) = (offset, offset.checked_add(item)?);
    for (&n, &s) in shape.iter().zip(strides) {
        let step = isize::try_from(n - 1)
            .ok()?
            .checked_mul(s)?
            .checked_mul(item)?;
        if step < 0 {
            lo = lo.checked_add(step)?;
        } else {
            hi = hi.checked_add(step)?;
        }
    }
    let lo = data.checked_add_signed(lo)?;
    let hi = data.checked_add_signed(hi)?;
    (hi.checked_sub(lo)? <= isize::MAX as usize).then_some((lo, hi))
}

impl Drop for ForeignTensor {
    fn drop(&mut self) {
        match self.managed {
            // SAFETY: we own the managed tensor (constructor contract) and drop runs once, so
            // the deleter is called exactly once; a NULL deleter means nothing to release.
            Managed::Versioned(p) => unsafe {
                if let Some(del) = p.as_ref().deleter {
                    del(p.as_ptr())
                }
            },
            // SAFETY: as above.
            Managed::Legacy(p) => unsafe {
                if let Some(del) = p.as_ref().deleter {
                    del(p.as_ptr())
                }
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use dlpack_rs::ffi::{DLDataType, DLDevice, DLPackVersion};

    use super::*;

    /// A producer-side allocation: the managed struct first, then what it points into.
    #[repr(C)]
    struct Producer {
        managed: DLManagedTensorVersioned,
        data: Vec<f32>,
        shape: Vec<i64>,
        strides: Vec<i64>,
        deleted: &'static AtomicUsize,
    }

    unsafe extern "C" fn delete(p: *mut DLManagedTensorVersioned) {
        // SAFETY: `p` is the first field of a leaked `Box<Producer>` (`repr(C)`).
        let b = unsafe { Box::from_raw(p.cast::<Producer>()) };
        b.deleted.fetch_add(1, Ordering::SeqCst);
    }

    fn produce(
        deleted: &'static AtomicUsize,
        data: Vec<f32>,
        shape: Vec<i64>,
        strides: Option<Vec<i64>>,
        edit: impl FnOnce(&mut DLManagedTensorVersioned),
    ) -> NonNull<DLManagedTensorVersioned> {
        let null_strides = strides.is_none();
        let mut b = Box::new(Producer {
            managed: DLManagedTensorVersioned {
                version: DLPackVersion { major: 1, minor: 3 },
                manager_ctx: std::ptr::null_mut(),
                deleter: Some(delete),
                flags: 0,
                dl_tensor: DLTensor {
                    data: std::ptr::null_mut(),
                    device: DLDevice {
                        device_type: 1,
                        device_id: 0,
                    },
                    ndim: shape.len() as i32,
                    dtype: DLDataType {
                        code: 2,
                        bits: 32,
                        lanes: 1,
                    },
                    shape: std::ptr::null_mut(),
                    strides: std::ptr::null_mut(),
                    byte_offset: 0,
                },
            },
            data,
            shape,
            strides: strides.unwrap_or_default(),
            deleted,
        });
        let t = &mut b.managed.dl_tensor;
        t.data = b.data.as_mut_ptr().cast();
        t.shape = b.shape.as_mut_ptr();
        if !null_strides {
            t.strides = b.strides.as_mut_ptr();
        }
        edit(&mut b.managed);
        NonNull::new(Box::into_raw(b).cast()).unwrap()
    }

    fn import(p: NonNull<DLManagedTensorVersioned>) -> Result<Tensor> {
        // SAFETY: `p` comes fresh from `produce` and is owned by nobody else.
        unsafe { ForeignTensor::from_versioned(p) }.into_tensor()
    }

    #[test]
    fn valid_tensor_is_viewed_in_place_and_deleted_once() {
        static DELETED: AtomicUsize = AtomicUsize::new(0);
        let p = produce(
            &DELETED,
            (0..12).map(|x| x as f32).collect(),
            vec![3, 4],
            Some(vec![-4, 1]),
            |m| {
                m.dl_tensor.byte_offset = 32; // row 2 first, read upwards
                m.flags = FLAG_READ_ONLY;
            },
        );
        let t = import(p).unwrap();
        assert!(t.readonly());
        let reference =
            ndarray::Array::from_shape_vec((3, 4), (0..12).map(|x| x as f32).collect()).unwrap();
        let expect = reference
            .slice(ndarray::s![..;-1, ..])
            .into_dyn()
            .to_owned();
        assert_eq!(t.to_array::<f32>().unwrap(), expect);
        let v = t.view(&[1, 1], &[2, 2]).unwrap();
        drop(t);
        assert_eq!(DELETED.load(Ordering::SeqCst), 0);
        assert_eq!(
            v.to_array::<f32>().unwrap(),
            expect.slice(ndarray::s![1..3, 1..3]).into_dyn()
        );
        drop(v);
        assert_eq!(DELETED.load(Ordering::SeqCst), 1);
    }

    #[test]
    fn null_strides_mean_c_order_and_zero_strides_broadcast() {
        static DELETED: AtomicUsize = AtomicUsize::new(0);
        let t = import(produce(
            &DELETED,
            vec![1.0, 2.0, 3.0, 4.0, 5.0, 6.0],
            vec![2, 3],
            None,
            |_| {},
        ))
        .unwrap();
        assert_eq!(t.strides(), &[3, 1]);
        let b = import(produce(
            &DELETED,
            vec![7.0, 8.0],
            vec![3, 2],
            Some(vec![0, 1]),
            |_| {},
        ))
        .unwrap();
        assert_eq!(
            b.to_array::<f32>().unwrap(),
            ndarray::arr2(&[[7.0f32, 8.0], [7.0, 8.0], [7.0, 8.0]]).into_dyn()
        );
        drop((t, b));
        assert_eq!(DELETED.load(Ordering::SeqCst), 2);
    }

    /// A producer's complex64 tensor (torch's `cfloat`): float32 pairs, real part first, with
    /// strides counted in complex items, read as `Complex<f32>` in place.
    #[test]
    fn complex_tensors_read_real_part_first_in_place() {
        use num_complex::Complex;
        static DELETED: AtomicUsize = AtomicUsize::new(0);
        // A 2x2 complex64 matrix stored column by column.
        let t = import(produce(
            &DELETED,
            vec![1.0, 2.0, -3.0, 0.5, 10.0, -10.0, 0.25, 4.0],
            vec![2, 2],
            Some(vec![1, 2]),
            |m| {
                m.dl_tensor.dtype = DLDataType {
                    code: dlpack_rs::ffi::DLDataTypeCode::kDLComplex as u8,
                    bits: 64,
                    lanes: 1,
                }
            },
        ))
        .unwrap();
        assert_eq!(t.dtype(), DType::Complex64);
        let c = |re, im| Complex::new(re, im);
        let want = ndarray::arr2(&[
            [c(1.0f32, 2.0), c(10.0, -10.0)],
            [c(-3.0, 0.5), c(0.25, 4.0)],
        ]);
        let view = t.as_array::<Complex<f32>>().unwrap();
        assert_eq!(view, want);
        assert_eq!(view.as_ptr().cast::<u8>(), t.data_ptr().cast_const());
        drop(view);
        assert!(t.as_array::<f32>().is_err());
        drop(t);
        assert_eq!(DELETED.load(Ordering::SeqCst), 1);
    }

    #[test]
    fn every_rejection_still_calls_the_deleter_once() {
        static DELETED: AtomicUsize = AtomicUsize::new(0);
        type Edit = fn(&mut DLManagedTensorVersioned);
        let cases: [(Edit, &str); 8] = [
            (|m| m.version.major = 2, "version 2.3"),
            (|m| m.dl_tensor.dtype.lanes = 2, "lanes=2"),
            (|m| m.dl_tensor.dtype.code = 77, "code=77"),
            (|m| m.dl_tensor.device.device_type = 6, "unknown device"),
            // the value as written, not read as a negative i32
            (
                |m| m.dl_tensor.device.device_type = 0x8000_0001,
                "(2147483649, 0)",
            ),
            (|m| m.dl_tensor.shape = std::ptr::null_mut(), "NULL shape"),
            (|m| m.dl_tensor.data = std::ptr::null_mut(), "NULL data"),
            (|m| m.dl_tensor.ndim = -3, "ndim -3"),
        ];
        let n = cases.len();
        for (i, (edit, msg)) in cases.into_iter().enumerate() {
            let e = import(produce(
                &DELETED,
                vec![1.0, 2.0],
                vec![2],
                Some(vec![1]),
                edit,
            ))
            .unwrap_err();
            assert!(e.to_string().contains(msg), "{e}");
            assert_eq!(DELETED.load(Ordering::SeqCst), i + 1);
        }
        let e = import(produce(&DELETED, vec![], vec![-1], Some(vec![1]), |_| {})).unwrap_err();
        assert!(e.to_string().contains("(-1,)"), "{e}");
        assert_eq!(DELETED.load(Ordering::SeqCst), n + 1);
    }

    #[test]
    fn layouts_whose_arithmetic_overflows_are_refused_in_every_build() {
        static DELETED: AtomicUsize = AtomicUsize::new(0);
        let min_extent = (isize::MIN / 4) as i64; // (2 - 1) * stride * 4 bytes == isize::MIN
        let cases: [(Vec<i64>, Vec<i64>, u64); 6] = [
            (vec![2], vec![min_extent], 0),
            (vec![2, 2], vec![min_extent / 2, min_extent / 2], 0),
            (vec![2], vec![i64::MAX / 4 + 1], 0),
            (vec![1 << 62], vec![1], 0), // numel fits, nbytes does not
            (vec![1 << 62, 1 << 62], vec![0, 0], 0), // numel does not fit
            (vec![2], vec![1], u64::MAX / 2),
        ];
        for (i, (shape, strides, offset)) in cases.into_iter().enumerate() {
            let e = import(produce(
                &DELETED,
                vec![1.0, 2.0],
                shape.clone(),
                Some(strides),
                |m| m.dl_tensor.byte_offset = offset,
            ))
            .unwrap_err();
            assert!(matches!(e, Error::DLPackField { .. }), "{shape:?}: {e}");
            assert_eq!(DELETED.load(Ordering::SeqCst), i + 1);
        }
    }

    #[test]
    fn zero_size_tensors_may_carry_null_data() {
        static DELETED: AtomicUsize = AtomicUsize::new(0);
        let t = import(produce(
            &DELETED,
            vec![],
            vec![0, 4],
            Some(vec![4, 1]),
            |m| m.dl_tensor.data = std::ptr::null_mut(),
        ))
        .unwrap();
        assert_eq!(t.numel(), 0);
        assert_eq!(t.to_array::<f32>().unwrap().shape(), &[0, 4]);
        drop(t);
        assert_eq!(DELETED.load(Ordering::SeqCst), 1);
    }
}
