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
                return Err(Error::buffer(format!(
                    "unsupported DLPack version {major}.{minor}: dlpart reads major version 1"
                )));
            }
        }
        let t = self.dl_tensor();
        let device = Device::from_dlpack(t.device.device_type as i32, t.device.device_id)
            .map_err(|e| Error::buffer(format!("DLPack tensor on an unknown device: {e}")))?;
        let dtype = DType::from_dlpack(t.dtype)?;
        if t.ndim < 0 {
            return Err(Error::buffer(format!("DLPack tensor with ndim {}", t.ndim)));
        }
        let ndim = t.ndim as usize;
        if ndim > 0 && t.shape.is_null() {
            return Err(Error::buffer(format!(
                "DLPack tensor with ndim {ndim} and a NULL shape"
            )));
        }
        let raw_shape: &[i64] = if ndim == 0 {
            &[]
        } else {
            // SAFETY: a non-NULL `shape` of a valid DLTensor holds `ndim` entries.
            unsafe { std::slice::from_raw_parts(t.shape, ndim) }
        };
        let shape = raw_shape
            .iter()
            .map(|&n| usize::try_from(n))
            .collect::<Result<Vec<usize>, _>>()
            .map_err(|_| {
                Error::buffer(format!(
                    "DLPack tensor with a negative extent in shape {}",
                    tuple_string(raw_shape)
                ))
            })?;
        let numel = checked_numel(&shape)?;
        let strides: Vec<isize> = if ndim == 0 || t.strides.is_null() {
            // DLPack < 1.2 allowed NULL strides to mean C order.
            contiguous_strides(&shape)
        } else {
            // SAFETY: a non-NULL `strides` of a valid DLTensor holds `ndim` entries.
            let s = unsafe { std::slice::from_raw_parts(t.strides, ndim) };
            s.iter().map(|&x| x as isize).collect()
        };
        let itemsize = dtype.itemsize();
        let data = if numel == 0 {
            // Zero-size tensors may carry NULL or any pointer; never dereferenced.
            std::ptr::NonNull::<u64>::dangling().as_ptr() as *mut u8
        } else {
            if t.data.is_null() {
                return Err(Error::buffer(format!(
                    "DLPack tensor of shape {} has a NULL data pointer",
                    tuple_string(&shape)
                )));
            }
            let offset = isize::try_from(t.byte_offset).map_err(|_| {
                Error::buffer(format!("DLPack byte_offset {} is too large", t.byte_offset))
            })?;
            let ext = shape
                .iter()
                .zip(&strides)
                .try_fold(0isize, |acc, (&n, &s)| {
                    (n as isize - 1)
                        .checked_mul(s)
                        .and_then(|x| x.checked_mul(itemsize as isize))
                        .and_then(|x| acc.checked_add(x.abs()))
                });
            if ext.is_none() {
                return Err(Error::buffer(format!(
                    "DLPack strides {} overflow for shape {}",
                    tuple_string(&strides),
                    tuple_string(&shape)
                )));
            }
            (t.data as *mut u8).wrapping_offset(offset)
        };
        let readonly = self.flags() & FLAG_READ_ONLY != 0;
        // SAFETY: the producer guarantees that every in-bounds element of the described tensor
        // is valid memory until its deleter runs; the deleter runs when `owner` (this
        // ForeignTensor) is dropped, after the last view is gone.
        Ok(unsafe {
            Tensor::from_raw_parts(
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
