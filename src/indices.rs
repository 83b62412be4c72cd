//! The indices a gather or scatter takes, in the forms a Rust caller has them.
//!
//! Every function that takes indices ([`ops::gather`](crate::ops::gather),
//! [`ops::scatter`](crate::ops::scatter),
//! [`ops::normalise_indices`](crate::ops::normalise_indices),
//! [`PreparedGather`](crate::PreparedGather), [`PreparedScatter`](crate::PreparedScatter),
//! [`PartitionedArray::gather`](crate::PartitionedArray::gather),
//! [`scatter`](crate::PartitionedArray::scatter) and
//! [`serving`](crate::PartitionedArray::serving), [`spmd::gather`](crate::spmd::gather) and
//! [`spmd::scatter`](crate::spmd::scatter)) takes `indices: impl AsIndices`:
//!
//! | form | example | what the function sees |
//! |---|---|---|
//! | a [`Tensor`], or a reference to one | `&idx` | that tensor itself, on its device, of any integer dtype, not copied |
//! | a slice, `Vec` or array of integers, or a reference to one | `[3, 1, 4]`, `&[3, 1, 4]`, `&v`, `v` | a 1-d host tensor of them |
//! | an ndarray array or view of integers (owned, viewed, shared), or a reference to one | `&a`, `a.view()` | a host tensor of its shape, in its logical order |
//! | one integer | `2`, `-1i64`, `k` | a 0-d tensor: one index, which drops the axis, as `numpy.take(x, 2, 0)` is `x[2]` |
//!
//! The integers are any of [`IndexElement`]: `i8` to `i64`, `u8` to `u64`, `isize` and
//! `usize`. They keep their values: a `usize` or `u64` index is read as the unsigned integer
//! it is, so one above `i64::MAX` is [`Error::IndexOutOfRange`](crate::Error::IndexOutOfRange)
//! naming it, never a negative index counting from the end. Negative indices (of the signed
//! types) count from the end, as in numpy. An ndarray array of two or more axes is accepted
//! here and refused by the operation, with its shape, as a 2-d index tensor is.
//!
//! Forms other than a tensor are copied once into a host tensor of their own: the operations
//! then read each index once, from that copy, into the int64 copy they check, as they do for
//! any index tensor ([`ops::normalise_indices`](crate::ops::normalise_indices)). Indices
//! already in a tensor, on a device or not, are passed as the tensor.
//!
//! An array literal passes as well by value as by reference; clippy's
//! `needless_borrows_for_generic_args` prefers it by value (`ops::gather(&src, [3, 1, 4], 0,
//! None)`), as for any generic argument.
//!
//! ```
//! use dlpart::{ops, Tensor};
//! use ndarray::{array, s, Array1, Axis};
//!
//! let x = array![[0, 1], [10, 11], [20, 21], [30, 31], [40, 41]];
//! let src = Tensor::from(x.clone());
//! let want = x.select(Axis(0), &[3, 1, 4]);
//! let taken = |t: Tensor| t.to_array::<i32>().unwrap();
//!
//! // The same three rows, however the indices are held.
//! assert_eq!(taken(ops::gather(&src, [3, 1, 4], 0, None)?), want.clone().into_dyn());
//! assert_eq!(taken(ops::gather(&src, &[3, 1, 4], 0, None)?), want.clone().into_dyn());
//! assert_eq!(taken(ops::gather(&src, &[3i64, -4, -1], 0, None)?), want.clone().into_dyn());
//! let rows: Vec<usize> = vec![3, 1, 4];
//! assert_eq!(taken(ops::gather(&src, &rows, 0, None)?), want.clone().into_dyn());
//! assert_eq!(taken(ops::gather(&src, &rows[..], 0, None)?), want.clone().into_dyn());
//! let a: Array1<i32> = array![0, 3, 1, 4];
//! assert_eq!(taken(ops::gather(&src, a.slice(s![1..]), 0, None)?), want.clone().into_dyn());
//! let t = Tensor::from_slice(&[3i64, 1, 4], &[3])?;
//! assert_eq!(taken(ops::gather(&src, &t, 0, None)?), want.into_dyn());
//!
//! // One index drops the axis: row 2 itself.
//! assert_eq!(taken(ops::gather(&src, 2usize, 0, None)?), x.row(2).into_dyn());
//!
//! // A usize above i64::MAX is out of range, never a negative index.
//! let e = ops::gather(&src, [1usize << 63], 0, None).unwrap_err();
//! assert!(e.to_string().contains("9223372036854775808"), "{e}");
//! # Ok::<(), dlpart::Error>(())
//! ```

use std::borrow::Cow;

use ndarray::{ArrayBase, ArrayRef, Data, Dimension};

use crate::error::Result;
use crate::tensor::{Element, Tensor};

/// Indices for a gather or scatter: a [`Tensor`], a slice, `Vec` or array of integers, an
/// ndarray array or view of integers, one integer (a 0-d index, which drops the axis), or a
/// reference to any of these. See [the module](crate::indices) for what each form means.
///
/// Implement it for a type of your own that holds indices by returning them as a tensor
/// (a host tensor of an integer dtype, or one on the device of the data).
pub trait AsIndices {
    /// The indices as a tensor: the tensor itself when they are one, otherwise a new host
    /// tensor of them (1-d for a list, 0-d for one index, the array's shape for an ndarray
    /// array).
    fn index_tensor(&self) -> Result<Cow<'_, Tensor>>;
}

impl<T: AsIndices + ?Sized> AsIndices for &T {
    fn index_tensor(&self) -> Result<Cow<'_, Tensor>> {
        (**self).index_tensor()
    }
}

impl AsIndices for Tensor {
    fn index_tensor(&self) -> Result<Cow<'_, Tensor>> {
        Ok(Cow::Borrowed(self))
    }
}

impl<T: IndexElement> AsIndices for [T] {
    fn index_tensor(&self) -> Result<Cow<'_, Tensor>> {
        host_tensor(&[self.len()], self.iter().copied())
    }
}

impl<T: IndexElement> AsIndices for Vec<T> {
    fn index_tensor(&self) -> Result<Cow<'_, Tensor>> {
        self.as_slice().index_tensor()
    }
}

impl<T: IndexElement, const N: usize> AsIndices for [T; N] {
    fn index_tensor(&self) -> Result<Cow<'_, Tensor>> {
        self.as_slice().index_tensor()
    }
}

impl<T: IndexElement, D: Dimension> AsIndices for ArrayRef<T, D> {
    fn index_tensor(&self) -> Result<Cow<'_, Tensor>> {
        host_tensor(self.shape(), self.iter().copied())
    }
}

impl<T: IndexElement, S: Data<Elem = T>, D: Dimension> AsIndices for ArrayBase<S, D> {
    fn index_tensor(&self) -> Result<Cow<'_, Tensor>> {
        host_tensor(self.shape(), self.iter().copied())
    }
}

/// A new host tensor of `shape` holding `values` (as many as `shape` has elements, in C
/// order), each as its [`IndexElement::Stored`] value.
fn host_tensor<'a, T: IndexElement>(
    shape: &[usize],
    values: impl Iterator<Item = T>,
) -> Result<Cow<'a, Tensor>> {
    let t = Tensor::zeros(shape, <T::Stored as Element>::DTYPE)?;
    {
        let mut host = t.as_array_mut::<T::Stored>()?;
        for (slot, v) in host.iter_mut().zip(values) {
            *slot = v.stored();
        }
    }
    Ok(Cow::Owned(t))
}

/// An integer type whose values are indices ([`AsIndices`]): `i8`, `i16`, `i32`, `i64`,
/// `isize`, `u8`, `u16`, `u32`, `u64`, `usize`. Each is kept in a tensor of the integer
/// dtype that holds every value of it (`usize` as uint64, `isize` as int64), so no index
/// changes on its way to the operation.
///
/// Sealed: implemented for these types only.
pub trait IndexElement: Copy + sealed::Sealed {
    /// The element type of the tensor that holds such indices.
    #[doc(hidden)]
    type Stored: Element;
    /// The index as that type: the same value.
    #[doc(hidden)]
    fn stored(self) -> Self::Stored;
}

mod sealed {
    /// Implemented only here, so that no type outside dlpart can be an
    /// [`IndexElement`](super::IndexElement).
    pub trait Sealed {}
}

macro_rules! index_element {
    ($($t:ty => $s:ty),*) => { $(
        impl sealed::Sealed for $t {}
        impl IndexElement for $t {
            type Stored = $s;
            fn stored(self) -> $s {
                // Lossless: `$s` holds every value of `$t` (`usize` and `isize` are at most
                // 64 bits wide on every target Rust supports).
                self as $s
            }
        }
        /// One index: a 0-d tensor, for which a gather or scatter drops the axis.
        impl AsIndices for $t {
            fn index_tensor(&self) -> Result<Cow<'_, Tensor>> {
                host_tensor(&[], std::iter::once(*self))
            }
        }
    )* };
}
index_element!(i8 => i8, i16 => i16, i32 => i32, i64 => i64, isize => i64,
    u8 => u8, u16 => u16, u32 => u32, u64 => u64, usize => u64);

#[cfg(test)]
#[path = "indices_tests.rs"]
mod tests;
