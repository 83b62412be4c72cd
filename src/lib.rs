//! # dlpart
//!
//! Partitioned, device-resident arrays exchanged between frameworks without copying, through
//! DLPack and the `__partitioned__` protocol, and repartitioned on the device where the data
//! already is.
//!
//! ```
//! use dlpart::{Layout, PartitionedArray, Tensor};
//! use ndarray::{s, Array2};
//!
//! let a = Array2::from_shape_fn((8, 6), |(i, j)| (10 * i + j) as f32);
//! let rows = PartitionedArray::partition(&Tensor::from(a.clone()), &Layout::tiling(&[4, 1]))?;
//! let cols = rows.repartition(&Layout::tiling(&[1, 3]), false)?;
//! let middle = cols.at(&[0, 1])?;
//! let view = middle.tensor().unwrap().as_array::<f32>()?;
//! assert_eq!(view, a.slice(s![.., 2..4]).into_dyn());
//! # Ok::<(), dlpart::Error>(())
//! ```
//!
//! | layer | module | what it holds |
//! |---|---|---|
//! | types | [`device`], [`dtype`], [`error`] | `Device` (`kDLCUDA:0`), `DType`, the one `Error` |
//! | data | [`tensor`], [`dlpack`] | `Tensor` views with a shared owner; ndarray in without copying; DLPack import/export |
//! | model | [`grid`], [`partitioned`] | `Grid` with numbered invariants; `PartitionedArray`, the one model |
//! | planning | [`layout`], [`plan`] | target `Layout`s (a cut and a placement); `Plan`: the box copies between two grids |
//! | kernels | [`backend`] | the `Backend` trait; CPU kernels; CUDA behind the `cuda` feature (a stub without it) |
//! | operations | [`ops`], [`prepared`], [`indices`] | repartition, gather, scatter on tensors: validate, then copy; gathers and scatters validated once and run again and again; the forms their indices take (tensors, slices, `Vec`s, ndarray arrays, one integer) |
//! | protocols | [`distarray`] | the Distributed Array Protocol (`__distarray__`): buffers and dimension dictionaries in and out |
//! | ranks | [`spmd`] | SPMD arrays over a `Communicator` (MPI, threads): agreed grids, exchanges between ranks |
//! | bindings | `python` (feature `python`) | the `dlpart._core` extension module |
//!
//! ## Glossary
//!
//! One name per concept, in every layer:
//! - **grid**: a global shape and per-axis split points ([`Grid`]); its boxes are the
//!   **partitions**, numbered in C order of their **positions**.
//! - **partitioned array**: a grid whose partitions hold [`Data`] (a tensor, a [`Handle`], or
//!   nothing for another rank's partition) and [`Location`]s ([`PartitionedArray`]).
//! - **layout**: how a repartition names its target: a cut (tiling, split points, blocks) and a
//!   placement of the target partitions on devices ([`Layout`], module [`layout`]).
//! - **plan**: the box copies between a source grid and a target grid ([`Plan`]); planning is
//!   pure and stores per-axis pieces only.
//! - **box copy**: one rectangular copy between two partitions, one type from the planner to the
//!   backends: [`BoxCopy`] names the partitions by index in the plan, and the backends receive
//!   the same type with the tensors themselves ([`backend::BoxCopy`]). Each backend then
//!   *lowers* it for its kernels: the CPU backend to raw views and loop nests
//!   (`backend::cpu::lower`), the CUDA backend to job tables (`backend::cuda::jobs`).
//! - **prepared** gather or scatter: one checked once and then run again and again between
//!   the same tensors ([`PreparedGather`], [`PreparedScatter`]), as MPI's persistent requests
//!   or FFTW's plans are; "plan" stays the name of the box copies between two grids.
//! - **backend**: the kernels of one device kind ([`backend::Backend`]); a **transfer** is a
//!   copy between devices, which only happens when the caller passes `transfer = true`; a
//!   copy between host memory of any kinds (`kDLCPU`, `kDLCPU:k`, pinned `kDLCUDAHost`,
//!   `kDLCUDAManaged`, `kDLROCMHost`) is a plain copy, not a transfer (`ops::one_memory`),
//!   in every operation, in one process and across ranks;
//!   **staging** memory is the host memory a device's data passes through on its way to code
//!   that reads host memory only, an MPI that is not CUDA-aware, or to and from host
//!   partitions in a repartition with `transfer`: one policy for both
//!   (`backend::staging_buffer`): pinned on CUDA ([`backend::Backend::empty_staging`]) up to
//!   [`backend::cuda::pinned_cache_limit`] and when it can be had, ordinary host memory
//!   otherwise.
//! - **non-temporal stores**: CPU stores that bypass the cache (`backend::cpu::nontemporal`);
//!   a **stream** is only ever a CUDA stream (`backend::cuda`).

// The SPMD unit tests share helpers with the integration tests (tests/common/spmd.rs), which
// name the crate `dlpart`.
#[cfg(test)]
extern crate self as dlpart;

mod access;
pub mod backend;
pub mod device;
pub mod distarray;
pub mod dlpack;
pub mod dtype;
pub mod error;
pub mod grid;
#[cfg(any(feature = "mpi", feature = "python", test))]
mod host;
pub mod indices;
pub mod layout;
pub mod ops;
mod overlap;
pub mod partitioned;
pub mod plan;
pub mod prepared;
pub mod spmd;
pub mod tensor;
#[cfg(test)]
mod test_rng;

#[cfg(feature = "python")]
mod python;

pub use device::{Device, DeviceType};
pub use dtype::DType;
pub use error::{Devices, Error, Result};
pub use grid::{Grid, Region};
pub use indices::{AsIndices, IndexElement};
pub use layout::{Cut, Layout, Placement, Target};
pub use partitioned::{Data, Handle, Location, Partition, PartitionedArray};
pub use plan::{BoxCopy, Plan};
pub use prepared::{PreparedGather, PreparedScatter};
pub use tensor::{Element, HostView, HostViewMut, Tensor};

/// The `num-complex` crate (the one ndarray uses): `num_complex::Complex<f32>` and
/// `Complex<f64>` are the [`Element`] types of complex64 and complex128 tensors.
pub use num_complex;

/// The `half` crate (feature `half`): `half::f16` and `half::bf16` are the
/// [`Element`] types of float16 and bfloat16 tensors.
#[cfg(feature = "half")]
pub use half;

/// The `mpi` crate (rsmpi; feature `mpi`), whose communicators [`spmd::MpiComm`] wraps:
/// `dlpart::mpi::initialize()` starts MPI with the version dlpart was built against.
#[cfg(feature = "mpi")]
pub use mpi;

/// The README's Rust code blocks, run as doc tests.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;

/// The guide's Rust code blocks, run as doc tests.
#[cfg(doctest)]
#[doc = include_str!("../docs/guide.md")]
pub struct GuideDoctests;

#[cfg(feature = "bench-internals")]
#[doc(hidden)]
pub use backend::cpu::__bench;
