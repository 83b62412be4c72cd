//! # dlpart
//!
//! Partitioned, device-resident arrays exchanged between frameworks without copying, through
//! DLPack and the `__partitioned__` protocol.
//!
//! | layer | module | what it holds |
//! |---|---|---|
//! | types | [`device`], [`dtype`], [`error`] | `Device` (`kDLCUDA:0`), `DType`, the one `Error` |
//! | data | [`tensor`], [`dlpack`] | `Tensor` views with a shared owner; ndarray in without copying; DLPack import/export |
//! | model | [`grid`], [`partitioned`] | `Grid` with numbered invariants; `PartitionedArray` |
//! | planning | [`plan`] | `Plan`: box copies between two grids; target `Layout`s |
//! | kernels | [`backend`] | the `Backend` trait; CPU kernels; CUDA behind the `cuda` feature |
//! | operations | [`ops`] | repartition, gather, scatter: validate, then copy |
//! | bindings | `python` (feature `python`) | the `dlpart._core` extension module |

pub mod backend;
pub mod device;
pub mod dlpack;
pub mod dtype;
pub mod error;
pub mod grid;
pub mod ops;
pub mod partitioned;
pub mod plan;
pub mod tensor;

#[cfg(feature = "python")]
mod python;

pub use device::{Device, DeviceType};
pub use dtype::DType;
pub use error::{Error, Result};
pub use grid::{Grid, Region};
pub use partitioned::{Data, Handle, Location, Partition, PartitionedArray};
pub use plan::{CopyOp, Layout, Placement, Plan};
pub use tensor::Tensor;

#[cfg(feature = "bench-internals")]
#[doc(hidden)]
pub use backend::cpu::__bench;
