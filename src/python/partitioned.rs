//! Bindings for the partitioned layer: grid validation and split points.
//!
//! The `__partitioned__` dicts themselves are read and written in Python
//! (`python/dlpart/_partitioned.py`); what must be fast or safe happens here.

use pyo3::prelude::*;
use pyo3::types::{PyBool, PyDict, PyString, PyTuple};

use crate::grid::{Entry, Grid};

use super::errors::{to_py, ProtocolError};

/// Validates `(position, start, shape)` entries (grid invariants 1-5) and returns the split
/// points; for adapters that derive entries from a framework's own layout.
#[pyfunction]
fn _grid_from_entries(
    py: Python<'_>,
    shape: Vec<i64>,
    tiling: Vec<i64>,
    entries: Vec<Entry>,
) -> PyResult<Vec<Vec<usize>>> {
    let grid = py
        .detach(|| Grid::from_entries(&shape, &tiling, &entries))
        .map_err(to_py)?;
    Ok(grid.splits().to_vec())
}

fn ints(obj: &Bound<'_, PyAny>, key: &str, position: Option<&[i64]>) -> PyResult<Vec<i64>> {
    let bad = || {
        let at = position
            .map(|p| format!(" at position {}", crate::error::tuple_string(p)))
            .unwrap_or_default();
        let found = obj.repr().map(|r| r.to_string()).unwrap_or_default();
        ProtocolError::new_err(format!(
            "__partitioned__[{key:?}]{at}: expected a tuple of ints, found {found}"
        ))
    };
    let item = |x: Bound<'_, PyAny>| -> PyResult<i64> {
        if x.is_instance_of::<PyBool>() {
            return Err(bad());
        }
        x.extract::<i64>().map_err(|_| bad())
    };
    if let Ok(t) = obj.cast::<PyTuple>() {
        return t.iter().map(item).collect();
    }
    if obj.is_instance_of::<PyString>() || obj.is_instance_of::<PyBool>() {
        return Err(bad());
    }
    if let Ok(i) = obj.extract::<i64>() {
        return Ok(vec![i]);
    }
    let seq = obj.try_iter().map_err(|_| bad())?;
    seq.map(|x| item(x?)).collect()
}

/// Reads the grid of a `__partitioned__` dict: checks every entry's keys, reads positions,
/// starts and shapes, and validates them (grid invariants 1-5), reporting every violation.
/// Returns the shape, the split points and the `(position, entry)` pairs.
#[allow(clippy::type_complexity)]
#[pyfunction]
fn _grid_from_dict<'py>(
    py: Python<'py>,
    d: &Bound<'py, PyAny>,
) -> PyResult<(
    Vec<i64>,
    Vec<Vec<usize>>,
    Vec<(Bound<'py, PyTuple>, Bound<'py, PyAny>)>,
)> {
    let get = |key: &str| -> PyResult<Bound<'py, PyAny>> {
        d.get_item(key).map_err(|_| {
            ProtocolError::new_err(format!("__partitioned__ is missing the key {key:?}"))
        })
    };
    let shape = ints(&get("shape")?, "shape", None)?;
    let tiling = ints(&get("partition_tiling")?, "partition_tiling", None)?;
    let parts = get("partitions")?;
    let parts = parts.cast::<PyDict>().map_err(|_| {
        ProtocolError::new_err(format!(
            "__partitioned__[\"partitions\"]: expected a dict, found {}",
            parts
                .get_type()
                .name()
                .map(|n| n.to_string())
                .unwrap_or_default()
        ))
    })?;
    let mut entries = Vec::with_capacity(parts.len());
    let mut items = Vec::with_capacity(parts.len());
    for (key, entry) in parts.iter() {
        let pos = ints(&key, "partitions", None)?;
        let at = crate::error::tuple_string(&pos);
        let entry_dict = entry.cast::<PyDict>().map_err(|_| {
            ProtocolError::new_err(format!(
                "__partitioned__[\"partitions\"] at position {at}: expected a dict, found {}",
                entry
                    .get_type()
                    .name()
                    .map(|n| n.to_string())
                    .unwrap_or_default()
            ))
        })?;
        let field = |k: &str| -> PyResult<Bound<'py, PyAny>> {
            entry_dict.get_item(k)?.ok_or_else(|| {
                ProtocolError::new_err(format!(
                    "__partitioned__[\"partitions\"] at position {at}: missing {k:?}"
                ))
            })
        };
        let start = ints(&field("start")?, "start", Some(&pos))?;
        let pshape = ints(&field("shape")?, "shape", Some(&pos))?;
        field("data")?;
        let key = PyTuple::new(py, &pos)?;
        entries.push((pos, start, pshape));
        items.push((key, entry));
    }
    let grid = py
        .detach(|| Grid::from_entries(&shape, &tiling, &entries))
        .map_err(to_py)?;
    Ok((shape, grid.splits().to_vec(), items))
}

/// Split points cutting each axis like `numpy.array_split`.
#[pyfunction]
fn _even_splits(shape: Vec<usize>, tiling: Vec<usize>) -> PyResult<Vec<Vec<usize>>> {
    Ok(Grid::even(&shape, &tiling)
        .map_err(to_py)?
        .splits()
        .to_vec())
}

/// Checks explicit split points against a shape.
#[pyfunction]
fn _check_splits(shape: Vec<usize>, splits: Vec<Vec<usize>>) -> PyResult<Vec<Vec<usize>>> {
    Ok(Grid::from_splits(&shape, splits)
        .map_err(to_py)?
        .splits()
        .to_vec())
}

pub(super) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(_grid_from_dict, m)?)?;
    m.add_function(wrap_pyfunction!(_grid_from_entries, m)?)?;
    m.add_function(wrap_pyfunction!(_even_splits, m)?)?;
    m.add_function(wrap_pyfunction!(_check_splits, m)?)?;
    Ok(())
}
