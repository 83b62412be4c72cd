//! DLPack import and export.
//!
//! * [`ForeignTensor`] owns one foreign `DLManagedTensor(Versioned)` and calls its deleter exactly
//!   once, when dropped. [`ForeignTensor::into_tensor`] validates the struct into a [`Tensor`](crate::Tensor)
//!   whose owner is the `ForeignTensor`; a rejected tensor is dropped, so its deleter still runs.
//! * [`export_versioned`] / [`export_legacy`] hand a [`Tensor`](crate::Tensor) out as a heap-allocated managed
//!   tensor whose private part owns the shape, the strides and a clone of the tensor; the
//!   deleter frees all of it.

mod export;
mod import;

pub use dlpack_rs::ffi;
pub use export::{export_legacy, export_versioned, live_exports};
pub use import::ForeignTensor;

/// `DLPACK_FLAG_BITMASK_READ_ONLY`.
pub const FLAG_READ_ONLY: u64 = ffi::DLPACK_FLAG_BITMASK_READ_ONLY;
/// `DLPACK_FLAG_BITMASK_IS_COPIED`.
pub const FLAG_IS_COPIED: u64 = ffi::DLPACK_FLAG_BITMASK_IS_COPIED;
/// The DLPack version dlpart produces.
pub const VERSION: (u32, u32) = (1, 3);
