//! How a caller's index tensor becomes the checked int64 indices the gather and scatter
//! kernels read: where the indices must be, which check kernel runs, and what its status
//! words say. Pure host decisions, no driver calls, so they are tested without a GPU; the
//! launches are in `index.rs`.

use crate::device::Device;
use crate::dtype::DType;
use crate::error::{tuple_string, Devices, Error, Result};
use crate::tensor::Tensor;

/// Where the indices of a gather or scatter come from, for a backend on some device.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum IndexHome {
    /// On the backend's device: copied once into dlpart's memory there, and checked in the
    /// copy.
    Resident,
    /// In host memory: copied to the backend's device first, then checked there.
    Upload,
}

/// Where `indices` stand for the backend of `backend`: 1-d, and on that device or in host
/// memory. Indices on another device are refused rather than moved behind the caller's back.
pub(crate) fn index_home(backend: Device, indices: &Tensor) -> Result<IndexHome> {
    if indices.ndim() != 1 {
        return Err(Error::shape(
            "indices must be 1-d",
            format!("shape {}", tuple_string(indices.shape())),
        ));
    }
    let here = indices.device();
    if here == backend {
        Ok(IndexHome::Resident)
    } else if here.is_host_accessible() {
        Ok(IndexHome::Upload)
    } else {
        Err(Error::DeviceMismatch {
            op: "indices".into(),
            devices: Devices::Apart(here, backend),
            reason: "indices must be in host memory or on the device of the data".into(),
        })
    }
}

/// The check of indices on the device: `check_indices_{word}` of kernels/index.cu.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct IndexCheck {
    /// The item size, which picks the kernel.
    pub word: usize,
    /// Whether values are sign-extended (int*) or zero-extended (uint*).
    pub signed: bool,
    /// The data does not start at a multiple of `word`, as a DLPack producer may hand out:
    /// the kernel reads aligned words, so the indices are first copied to a fresh tensor.
    pub stage: bool,
    /// Contiguous, aligned int64: when dlpart owns them (uploaded from the host), checked
    /// where they are and used as they are unless some index is negative.
    pub in_place: bool,
}

/// The check for `n` indices of `dtype` at device address `addr`, `stride` elements apart.
pub(crate) fn index_check(dtype: DType, addr: u64, stride: isize, n: usize) -> Result<IndexCheck> {
    let signed = dtype.index_signed()?;
    let word = dtype.itemsize();
    let stage = addr % word as u64 != 0;
    Ok(IndexCheck {
        word,
        signed,
        stage,
        in_place: dtype == DType::Int64 && !stage && (stride == 1 || n <= 1),
    })
}

/// What the check kernel's two status words say about `n` indices.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Verdict {
    /// Every index is in range; `negative` when some count from the end.
    Valid { negative: bool },
    /// The first out-of-range index is at `position`.
    Bad { position: usize },
}

/// Reads the status words: `[n - first bad position (0: none), any negative]`.
pub(crate) fn verdict(status: [u64; 2], n: usize) -> Verdict {
    match status[0] {
        0 => Verdict::Valid {
            negative: status[1] != 0,
        },
        w => Verdict::Bad {
            position: n - w as usize,
        },
    }
}

/// The value of one index of `dtype` from its little-endian bytes (`dtype.itemsize()` of
/// them), for [`Error::IndexOutOfRange`].
pub(crate) fn index_value(bytes: &[u8], dtype: DType) -> i128 {
    let mut b = [0u8; 8];
    b[..bytes.len()].copy_from_slice(bytes);
    let u = u64::from_le_bytes(b);
    match dtype {
        DType::Int8 => u as i8 as i128,
        DType::Int16 => u as i16 as i128,
        DType::Int32 => u as i32 as i128,
        DType::Int64 => u as i64 as i128,
        _ => u as i128,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A tensor tagged as living on `device`, over host memory that is never read.
    fn tagged(shape: &[usize], strides: &[isize], dtype: DType, device: Device) -> Tensor {
        let buf = Tensor::zeros(&[64], DType::UInt8).unwrap();
        // SAFETY: the tests only inspect the descriptor; nothing dereferences the pointer.
        unsafe {
            Tensor::from_raw_parts(
                buf.data_ptr(),
                shape.to_vec(),
                strides.to_vec(),
                dtype,
                device,
                false,
                buf.owner().clone(),
            )
        }
    }

    #[test]
    fn indices_are_checked_where_the_backend_is() {
        let gpu = Device::cuda(1);
        let on = |d: Device| tagged(&[4], &[1], DType::Int64, d);
        assert_eq!(index_home(gpu, &on(gpu)).unwrap(), IndexHome::Resident);
        assert_eq!(
            index_home(gpu, &on(Device::CPU)).unwrap(),
            IndexHome::Upload
        );
        let pinned = "kDLCUDAHost".parse().unwrap();
        assert_eq!(index_home(gpu, &on(pinned)).unwrap(), IndexHome::Upload);
        let e = index_home(gpu, &on(Device::cuda(0)))
            .unwrap_err()
            .to_string();
        assert!(e.contains("kDLCUDA:0 and kDLCUDA:1"), "{e}");
        let flat = tagged(&[2, 2], &[2, 1], DType::Int64, gpu);
        let e = index_home(gpu, &flat).unwrap_err().to_string();
        assert!(e.contains("1-d") && e.contains("(2, 2)"), "{e}");
    }

    #[test]
    fn only_aligned_contiguous_int64_is_checked_in_place() {
        let c = |dtype, addr, stride, n| index_check(dtype, addr, stride, n).unwrap();
        let i64_at = |addr, stride, n| c(DType::Int64, addr, stride, n);
        assert!(i64_at(0x1000, 1, 100).in_place);
        assert!(i64_at(0x1000, -3, 1).in_place); // one index: the stride is never used
        assert!(!i64_at(0x1000, 2, 100).in_place);
        assert!(!i64_at(0x1000, -1, 100).in_place);
        let odd = i64_at(0x1004, 1, 100);
        assert!(odd.stage && !odd.in_place);
        let i32s = c(DType::Int32, 0x1004, 1, 100);
        assert_eq!((i32s.word, i32s.signed, i32s.stage), (4, true, false));
        assert!(!i32s.in_place);
        let u16s = c(DType::UInt16, 0x1001, 5, 100);
        assert_eq!((u16s.word, u16s.signed, u16s.stage), (2, false, true));
        assert_eq!(c(DType::UInt8, 0x1001, 1, 9).word, 1);
        let e = index_check(DType::Float32, 0, 1, 1)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("indices must be integers, found dtype float32"),
            "{e}"
        );
        assert!(index_check(DType::Bool, 0, 1, 1).is_err());
    }

    #[test]
    fn status_words_name_the_first_bad_position() {
        assert_eq!(verdict([0, 0], 10), Verdict::Valid { negative: false });
        assert_eq!(verdict([0, 1], 10), Verdict::Valid { negative: true });
        assert_eq!(verdict([10, 1], 10), Verdict::Bad { position: 0 });
        assert_eq!(verdict([1, 0], 10), Verdict::Bad { position: 9 });
    }

    #[test]
    fn bad_values_are_decoded_by_dtype() {
        assert_eq!(index_value(&[0xff], DType::Int8), -1);
        assert_eq!(index_value(&[0xff], DType::UInt8), 255);
        assert_eq!(index_value(&[0x00, 0x80], DType::Int16), -32768);
        assert_eq!(index_value(&7i32.to_le_bytes(), DType::Int32), 7);
        assert_eq!(index_value(&(-9i64).to_le_bytes(), DType::Int64), -9);
        assert_eq!(index_value(&[0xff; 8], DType::UInt64), u64::MAX as i128);
    }
}
