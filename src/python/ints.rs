//! Python ints read into Rust integers, for arguments.
//!
//! pyo3's conversions raise a bare `OverflowError` for an int outside the Rust type's range
//! ("Python int too large to convert to C long", "can't convert negative int to unsigned"),
//! naming neither the value nor the argument. The readers here take the same ints and raise a
//! `ValueError` naming both instead (an `IndexError` for positions, as for any position
//! outside the grid); what is no int at all keeps the conversion's `TypeError`, which pyo3
//! prefixes with the argument's name. They cost what pyo3's conversion costs: the argument is
//! looked at again only when that conversion overflowed.
//!
//! Arguments declare them with `#[pyo3(from_py_with = ...)]`, through a reader that names
//! the argument (see [`axis`]).

use pyo3::exceptions::{PyIndexError, PyOverflowError, PyValueError};
use pyo3::prelude::*;

/// A Rust integer type arguments are read into, and its range.
pub(crate) trait Int: for<'a, 'py> FromPyObject<'a, 'py, Error = PyErr> {
    /// The smallest and the largest value.
    const RANGE: (i128, i128);
}

macro_rules! ints {
    ($($t:ty),*) => {
        $(impl Int for $t {
            const RANGE: (i128, i128) = (<$t>::MIN as i128, <$t>::MAX as i128);
        })*
    };
}
ints!(i32, i64, isize, usize);

/// What an argument out of range raises.
#[derive(Clone, Copy)]
pub(crate) enum Refusal {
    /// `ValueError`: a size, a count, an axis, a version.
    Value,
    /// `IndexError`: a position in a grid.
    Index,
}

/// `"(expected an int from {lo} to {hi})"`, the end of every out-of-range message.
pub(crate) fn expected_range(lo: impl std::fmt::Display, hi: impl std::fmt::Display) -> String {
    format!("(expected an int from {lo} to {hi})")
}

/// The error for `obj`, an int the argument `name` reads as a `T` and which `T` does not
/// hold, with the conversion's `OverflowError` as its cause.
fn out_of_range<T: Int>(obj: &Bound<'_, PyAny>, name: &str, how: Refusal, cause: PyErr) -> PyErr {
    let value = obj
        .str()
        .map_or_else(|_| super::partitioned::described(obj), |s| s.to_string());
    let (lo, hi) = T::RANGE;
    let msg = format!("{name}: {value} is out of range {}", expected_range(lo, hi));
    let e = match how {
        Refusal::Value => PyValueError::new_err(msg),
        Refusal::Index => PyIndexError::new_err(msg),
    };
    e.set_cause(obj.py(), Some(cause));
    e
}

/// `result`, pyo3's reading of an argument, unless it overflowed: then what `locate` finds,
/// the named error of the entry that overflowed (the overflow itself where it finds none).
pub(crate) fn located<T>(
    result: PyResult<T>,
    py: Python<'_>,
    locate: impl FnOnce() -> PyResult<()>,
) -> PyResult<T> {
    match result {
        Err(e) if e.is_instance_of::<PyOverflowError>(py) => Err(locate().err().unwrap_or(e)),
        r => r,
    }
}

/// `obj` as a `T`, for the argument `name` (see the module docs).
pub(crate) fn int<T: Int>(obj: &Bound<'_, PyAny>, name: &str, how: Refusal) -> PyResult<T> {
    obj.extract::<T>().map_err(|e| {
        if e.is_instance_of::<PyOverflowError>(obj.py()) {
            out_of_range::<T>(obj, name, how, e)
        } else {
            e
        }
    })
}

/// The entries of the sequence `obj` checked as [`int`] reads them, entry `i` named
/// `name[i]`: what [`located`] looks for after a conversion of `obj` overflowed.
fn locate_ints<T: Int>(obj: &Bound<'_, PyAny>, name: &str, how: Refusal) -> PyResult<()> {
    for (i, x) in obj.try_iter()?.enumerate() {
        int::<T>(&x?, &format!("{name}[{i}]"), how)?;
    }
    Ok(())
}

/// The sequence `obj` as `T`s, for the argument `name`: an entry out of range is named
/// `name[i]`.
pub(crate) fn ints<T: Int>(obj: &Bound<'_, PyAny>, name: &str, how: Refusal) -> PyResult<Vec<T>> {
    located(obj.extract(), obj.py(), || locate_ints::<T>(obj, name, how))
}

/// The sequence of sequences `obj` as `T`s, for the argument `name`: an entry out of range
/// is named `name[i][j]`.
pub(crate) fn int_lists<T: Int>(
    obj: &Bound<'_, PyAny>,
    name: &str,
    how: Refusal,
) -> PyResult<Vec<Vec<T>>> {
    located(obj.extract(), obj.py(), || {
        for (i, x) in obj.try_iter()?.enumerate() {
            locate_ints::<T>(&x?, &format!("{name}[{i}]"), how)?;
        }
        Ok(())
    })
}

/// `None` for `None`, else `read(obj)`: for optional arguments, whose reader pyo3 also calls
/// for an explicit `None`.
pub(crate) fn optional<'py, T>(
    obj: &Bound<'py, PyAny>,
    read: impl FnOnce(&Bound<'py, PyAny>) -> PyResult<T>,
) -> PyResult<Option<T>> {
    match obj.is_none() {
        true => Ok(None),
        false => read(obj).map(Some),
    }
}

/// An `axis` argument.
pub(crate) fn axis(obj: &Bound<'_, PyAny>) -> PyResult<i64> {
    int(obj, "axis", Refusal::Value)
}

/// A `max_version` argument: `None` or a `(major, minor)` tuple, as pyo3 reads it.
/// (An overflow means pyo3 read a tuple of two ints, whose entries [`locate_ints`] then names.)
pub(crate) fn max_version(obj: &Bound<'_, PyAny>) -> PyResult<Option<(i64, i64)>> {
    located(obj.extract(), obj.py(), || {
        locate_ints::<i64>(obj, "max_version", Refusal::Value)
    })
}
