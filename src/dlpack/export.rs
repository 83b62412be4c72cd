//! Handing a [`Tensor`] out as a DLPack managed tensor.

use std::sync::atomic::{AtomicIsize, Ordering};

use dlpack_rs::ffi::{
    DLDataType, DLDevice, DLManagedTensor, DLManagedTensorVersioned, DLPackVersion, DLTensor,
};

use crate::error::{Error, Result};
use crate::tensor::Tensor;

use super::{FLAG_IS_COPIED, FLAG_READ_ONLY, VERSION};

static LIVE: AtomicIsize = AtomicIsize::new(0);

/// Managed tensors handed out and not yet deleted (for leak tests).
pub fn live_exports() -> isize {
    LIVE.load(Ordering::SeqCst)
}

/// Everything one export owns. `managed` comes first so that a pointer to it is a pointer to
/// the whole allocation (`repr(C)`).
#[repr(C)]
struct Exported<M> {
    managed: M,
    shape: Vec<i64>,
    strides: Vec<i64>,
    _tensor: Tensor,
}

fn dl_tensor(t: &Tensor, shape: &mut [i64], strides: &mut [i64]) -> DLTensor {
    let (device_type, device_id) = t.device().to_dlpack();
    DLTensor {
        data: if t.numel() == 0 {
            std::ptr::null_mut()
        } else {
            t.data_ptr().cast()
        },
        device: DLDevice {
            device_type: device_type as u32,
            device_id,
        },
        ndim: t.ndim() as i32,
        dtype: DLDataType {
            ..t.dtype().to_dlpack()
        },
        shape: if t.ndim() == 0 {
            std::ptr::null_mut()
        } else {
            shape.as_mut_ptr()
        },
        strides: if t.ndim() == 0 {
            std::ptr::null_mut()
        } else {
            strides.as_mut_ptr()
        },
        byte_offset: 0,
    }
}

fn boxed<M>(t: &Tensor, make: impl FnOnce(DLTensor, *mut std::ffi::c_void) -> M) -> *mut M {
    let mut b = Box::new(Exported {
        managed: std::mem::MaybeUninit::<M>::uninit(),
        shape: t.shape().iter().map(|&n| n as i64).collect(),
        strides: t.strides().iter().map(|&s| s as i64).collect(),
        _tensor: t.clone(),
    });
    let Exported { shape, strides, .. } = &mut *b;
    let dl = dl_tensor(t, shape, strides);
    let ctx = (&raw mut *b).cast::<std::ffi::c_void>();
    b.managed.write(make(dl, ctx));
    LIVE.fetch_add(1, Ordering::SeqCst);
    // `MaybeUninit<M>` has M's layout, and `managed` is now initialised.
    Box::into_raw(b).cast::<M>()
}

/// Exports `t` as a `DLManagedTensorVersioned` (DLPack 1.3). `copied` sets `IS_COPIED`.
///
/// The caller owns the result and must call its deleter exactly once.
pub fn export_versioned(t: &Tensor, copied: bool) -> *mut DLManagedTensorVersioned {
    let mut flags = 0;
    if t.readonly() {
        flags |= FLAG_READ_ONLY;
    }
    if copied {
        flags |= FLAG_IS_COPIED;
    }
    boxed(t, |dl_tensor, ctx| DLManagedTensorVersioned {
        version: DLPackVersion {
            major: VERSION.0,
            minor: VERSION.1,
        },
        manager_ctx: ctx,
        deleter: Some(delete_versioned),
        flags,
        dl_tensor,
    })
}

/// Exports `t` as a legacy `DLManagedTensor`. Read-only tensors are refused: the legacy struct
/// cannot say so, and the consumer would be free to write.
pub fn export_legacy(t: &Tensor) -> Result<*mut DLManagedTensor> {
    if t.readonly() {
        return Err(Error::buffer(
            "cannot export a read-only tensor as a legacy DLPack capsule, which has no \
             read-only flag; ask for max_version >= (1, 0)",
        ));
    }
    Ok(boxed(t, |dl_tensor, ctx| DLManagedTensor {
        dl_tensor,
        manager_ctx: ctx,
        deleter: Some(delete_legacy),
    }))
}

unsafe extern "C" fn delete_versioned(p: *mut DLManagedTensorVersioned) {
    if p.is_null() {
        return;
    }
    // SAFETY: `p` was made by `boxed` as `Box<Exported<MaybeUninit<_>>>` cast to its first field
    // (`repr(C)`), and DLPack guarantees the deleter is called once.
    drop(unsafe { Box::from_raw(p.cast::<Exported<DLManagedTensorVersioned>>()) });
    LIVE.fetch_sub(1, Ordering::SeqCst);
}

unsafe extern "C" fn delete_legacy(p: *mut DLManagedTensor) {
    if p.is_null() {
        return;
    }
    // SAFETY: as in `delete_versioned`.
    drop(unsafe { Box::from_raw(p.cast::<Exported<DLManagedTensor>>()) });
    LIVE.fetch_sub(1, Ordering::SeqCst);
}

#[cfg(test)]
mod tests {
    use std::ptr::NonNull;

    use super::*;
    use crate::dlpack::ForeignTensor;
    use crate::DType;

    /// The live-export counter is global: tests that read it run one at a time.
    static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

    #[test]
    fn versioned_round_trip_is_zero_copy_and_deletes_once() {
        let _serial = SERIAL.lock().unwrap();
        let before = live_exports();
        let t = Tensor::from_slice(&[1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0], &[2, 3]).unwrap();
        let v = t
            .view(&[0, 1], &[2, 2])
            .unwrap()
            .with_readonly(true)
            .unwrap();
        let p = export_versioned(&v, false);
        assert_eq!(live_exports(), before + 1);
        // SAFETY: `p` is a fresh export nobody else owns.
        let f = unsafe { ForeignTensor::from_versioned(NonNull::new(p).unwrap()) };
        let back = f.into_tensor().unwrap();
        assert_eq!(back.data_ptr(), v.data_ptr());
        assert!(back.readonly());
        assert_eq!(back.strides(), &[3, 1]);
        let expect = ndarray::arr2(&[[2.0f32, 3.0], [5.0, 6.0]]).into_dyn();
        assert_eq!(back.to_array::<f32>().unwrap(), expect);
        drop(back);
        assert_eq!(live_exports(), before);
    }

    #[test]
    fn legacy_refuses_readonly_and_handles_zero_size_and_0d() {
        let _serial = SERIAL.lock().unwrap();
        let before = live_exports();
        let ro = Tensor::zeros(&[2], DType::Int8)
            .unwrap()
            .with_readonly(true)
            .unwrap();
        assert!(export_legacy(&ro).is_err());
        assert_eq!(live_exports(), before);
        for shape in [&[][..], &[0, 3][..]] {
            let t = Tensor::zeros(shape, DType::Float64).unwrap();
            let p = export_legacy(&t).unwrap();
            // SAFETY: `p` is a fresh export; we only read it before handing it to ForeignTensor.
            unsafe {
                let dl = &(*p).dl_tensor;
                assert_eq!(dl.ndim as usize, shape.len());
                assert_eq!(dl.byte_offset, 0);
                assert_eq!(dl.data.is_null(), shape.contains(&0));
                assert_eq!(dl.strides.is_null(), shape.is_empty());
            }
            // SAFETY: as above.
            let f = unsafe { ForeignTensor::from_legacy(NonNull::new(p).unwrap()) };
            let back = f.into_tensor().unwrap();
            assert_eq!(back.shape(), shape);
        }
        assert_eq!(live_exports(), before);
    }
}
