//! The location and device forms found in `__partitioned__` dicts in the wild, read into
//! [`Location`]s: draft 2's `[(ip, pid, device), ...]` and `[(ip, pid), ...]`, draft 1's lists
//! of IP strings (`'1.1.1.2:55667'` worker addresses too), xgboost_ray's bare IP string, heat's
//! MPI rank ints, and heat's extra `device` key (`'cpu'`, `'cuda:1'`, a `torch.device`).

use pyo3::prelude::*;
use pyo3::types::{PyBool, PyInt, PyList, PyString, PyTuple};

use crate::device::Device;
use crate::error::Error;
use crate::grid::inv;
use crate::partitioned::Location;

use super::errors::to_py;

fn bad(position: &[usize], found: String) -> PyErr {
    to_py(Error::protocol(
        "location",
        Some(position),
        found,
        Some(inv::LOCATION),
    ))
}

fn repr(obj: &Bound<'_, PyAny>) -> String {
    obj.repr()
        .map(|r| r.to_string())
        .unwrap_or_else(|_| "<unprintable>".into())
}

/// Every location `value` names, for the partition at `position`. `fallback` is the device for
/// forms that carry none (the partition's data device, or heat's `device` key).
pub(crate) fn normalise(
    value: Option<&Bound<'_, PyAny>>,
    position: &[usize],
    fallback: Device,
) -> PyResult<Vec<Location>> {
    let Some(value) = value.filter(|v| !v.is_none()) else {
        return Ok(Vec::new());
    };
    let one = value.is_instance_of::<PyString>()
        || (value.is_instance_of::<PyInt>() && !value.is_instance_of::<PyBool>())
        || value
            .cast::<PyTuple>()
            .is_ok_and(|t| t.get_item(0).is_ok_and(|x| x.is_instance_of::<PyString>()));
    if one {
        return Ok(vec![location(value, position, fallback)?]);
    }
    let items: Vec<Bound<'_, PyAny>> = if let Ok(l) = value.cast::<PyList>() {
        l.iter().collect()
    } else if let Ok(t) = value.cast::<PyTuple>() {
        t.iter().collect()
    } else {
        return Err(bad(
            position,
            format!("expected a list of locations, found {}", repr(value)),
        ));
    };
    items
        .iter()
        .map(|item| location(item, position, fallback))
        .collect()
}

fn location(item: &Bound<'_, PyAny>, position: &[usize], fallback: Device) -> PyResult<Location> {
    if item.is_instance_of::<PyBool>() {
        return Err(bad(
            position,
            format!("a location cannot be a bool, found {}", repr(item)),
        ));
    }
    if item.is_instance_of::<PyInt>() {
        let rank: i64 = item.extract().map_err(|_| {
            bad(
                position,
                format!("rank {} does not fit an int64", repr(item)),
            )
        })?;
        if rank < 0 {
            return Err(bad(position, format!("negative rank {rank}")));
        }
        return Ok(Location::rank(rank, fallback));
    }
    if let Ok(s) = item.cast::<PyString>() {
        let host: String = s.extract()?;
        if host.is_empty() {
            return Err(bad(position, "empty host string".into()));
        }
        return Ok(Location {
            host: Some(host),
            pid: None,
            device: fallback,
            rank: None,
        });
    }
    let fields: Option<Vec<Bound<'_, PyAny>>> = if let Ok(t) = item.cast::<PyTuple>() {
        Some(t.iter().collect())
    } else if let Ok(l) = item.cast::<PyList>() {
        Some(l.iter().collect())
    } else {
        None
    };
    let Some(fields) = fields.filter(|f| (2..=3).contains(&f.len())) else {
        return Err(bad(
            position,
            format!(
                "expected (ip, pid[, device]), an IP string or a rank, found {}",
                repr(item)
            ),
        ));
    };
    let shape_error = || {
        bad(
            position,
            format!(
                "expected (ip: str, pid: int[, device: str]), found {}",
                repr(item)
            ),
        )
    };
    let host = fields[0].cast::<PyString>().map_err(|_| shape_error())?;
    let pid = &fields[1];
    if !pid.is_instance_of::<PyInt>() || pid.is_instance_of::<PyBool>() {
        return Err(shape_error());
    }
    let pid: i64 = pid.extract().map_err(|_| shape_error())?;
    let device = match fields.get(2) {
        None => fallback,
        Some(d) => {
            let text = d.cast::<PyString>().map_err(|_| {
                bad(
                    position,
                    format!("device must be a string, found {}", repr(d)),
                )
            })?;
            Location::parse_device(&text.extract::<String>()?, position).map_err(to_py)?
        }
    };
    Ok(Location {
        host: Some(host.extract::<String>()?),
        pid: Some(pid),
        device,
        rank: None,
    })
}

/// A device given by a framework's own name (heat's extra `device` key: `'cpu'`, `'cuda:1'`,
/// a `torch.device`) or a `kDL` name, or `None` when there is none.
pub(crate) fn framework_device(
    obj: Option<&Bound<'_, PyAny>>,
    key: &str,
    position: &[usize],
) -> PyResult<Option<Device>> {
    let Some(obj) = obj.filter(|o| !o.is_none()) else {
        return Ok(None);
    };
    let text = obj.str()?.to_string();
    parse_framework_device(&text)
        .map(Some)
        .map_err(|why| to_py(Error::protocol(key, Some(position), why, None)))
}

/// `'cpu'`, `'cuda'`, `'cuda:1'`, `'gpu:0'`, `'xpu:0'` or a `kDL` name, as a [`Device`].
pub(crate) fn parse_framework_device(text: &str) -> Result<Device, String> {
    if text.starts_with("kDL") {
        return text.parse().map_err(|e: Error| e.to_string());
    }
    let (name, index) = text.split_once(':').unwrap_or((text, ""));
    let kind = match name {
        "cpu" => "kDLCPU",
        "cuda" | "gpu" => "kDLCUDA",
        "xpu" => "kDLOneAPI",
        _ => return Err(format!("unknown device {text:?}")),
    };
    if !index.is_empty() && !index.bytes().all(|b| b.is_ascii_digit()) {
        return Err(format!("unknown device {text:?}"));
    }
    let id = if index.is_empty() { "0" } else { index };
    format!("{kind}:{id}")
        .parse()
        .map_err(|e: Error| e.to_string())
}
