//! The location and device forms found in `__partitioned__` dicts in the wild, read into
//! [`Location`]s: draft 2's `[(ip, pid, device), ...]` and `[(ip, pid), ...]`, draft 1's lists
//! of IP strings (`'1.1.1.2:55667'` worker addresses too), xgboost_ray's bare IP string, heat's
//! MPI rank ints, and heat's extra `device` key (`'cpu'`, `'cuda:1'`, a `torch.device`).
//! What none of them writes is refused rather than guessed at: a list mixing bare host
//! strings and ranks (one draft-2 location written as a list, `['10.0.0.5', 4242,
//! 'kDLCPU']`), and a DLPack device name in a host's place.

use std::sync::Arc;

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

/// An integer as heat's `int(location[0])` reads one: a Python int but not a bool, or an
/// object that converts to one exactly (`__index__`), such as `np.int64(2)` (numpy's bool has
/// no `__index__`). The other location forms (strings, tuples, lists) are told apart by their
/// type alone, so reading them costs no attribute lookup.
fn integer(obj: &Bound<'_, PyAny>) -> bool {
    if obj.is_instance_of::<PyInt>() {
        return !obj.is_instance_of::<PyBool>();
    }
    !(obj.is_instance_of::<PyString>()
        || obj.is_instance_of::<PyTuple>()
        || obj.is_instance_of::<PyList>())
        && obj.hasattr("__index__").unwrap_or(false)
}

fn repr(obj: &Bound<'_, PyAny>) -> String {
    obj.repr()
        .map(|r| r.to_string())
        .unwrap_or_else(|_| "<unprintable>".into())
}

/// Reads the location forms into [`Location`]s, reusing what it read for earlier entries of
/// the same dict: producers repeat one location tuple (dlpart's own dicts share one tuple
/// object per location) or one host string across their entries, and re-reading each cost
/// about 0.3 us per entry (string extraction, device parsing, a `String` per host).
///
/// Reuse is by object identity, or for exact `str` objects by equality (producers that make
/// a new string per entry: comparing two strings allocates nothing, where extracting the text
/// makes a bytes object under the stable ABI), and only of immutable objects that the reader
/// holds a reference to, so an address cannot be recycled for another object and a reused
/// value is exactly what reading again would give.
#[derive(Default)]
pub(crate) struct LocationReader<'py> {
    /// The last tuple read, the fallback device it was read with, and what it gave.
    tuple: Option<(Bound<'py, PyTuple>, Device, Location)>,
    /// The last host string read and its text.
    host: Option<(Bound<'py, PyString>, Arc<str>)>,
    /// The last device string read and the device it names.
    device: Option<(Bound<'py, PyString>, Device)>,
}

impl<'py> LocationReader<'py> {
    /// Appends to `out` every location `value` names, for the partition at `position`.
    /// `fallback` is the device for forms that carry none (the partition's data device, or
    /// heat's `device` key).
    pub(crate) fn read(
        &mut self,
        value: Option<&Bound<'py, PyAny>>,
        position: &[usize],
        fallback: Device,
        out: &mut Vec<Location>,
    ) -> PyResult<()> {
        let Some(value) = value.filter(|v| !v.is_none()) else {
            return Ok(());
        };
        let one = value.is_instance_of::<PyString>()
            || integer(value)
            || value
                .cast::<PyTuple>()
                .is_ok_and(|t| t.get_item(0).is_ok_and(|x| x.is_instance_of::<PyString>()));
        if one {
            out.push(self.location(value, position, fallback)?);
        } else if let Ok(l) = value.cast::<PyList>() {
            unmixed(value, l.iter(), position)?;
            for item in l.iter() {
                out.push(self.location(&item, position, fallback)?);
            }
        } else if let Ok(t) = value.cast::<PyTuple>() {
            unmixed(value, t.iter(), position)?;
            for item in t.iter() {
                out.push(self.location(&item, position, fallback)?);
            }
        } else {
            return Err(bad(
                position,
                format!("expected a list of locations, found {}", repr(value)),
            ));
        }
        Ok(())
    }

    /// The text of a host string, shared with the previous entry when it is the same object.
    /// A DLPack device name (`'kDLCPU'`, `'kDLCUDA:0'`) is no host: a device in the host's
    /// place is a location misread, refused rather than taken as a machine of that name.
    fn host(&mut self, s: &Bound<'py, PyString>, position: &[usize]) -> PyResult<Arc<str>> {
        if let Some((last, text)) = &self.host {
            if same_str(last, s) {
                return Ok(text.clone());
            }
        }
        let text: Arc<str> = s.to_cow()?.into();
        if text.starts_with("kDL") && Device::from_dlpack_name(&text).is_ok() {
            return Err(bad(
                position,
                format!(
                    "{} is a device name where a host is expected (a location is a host \
                     string, a rank, or a tuple (ip, pid[, device]))",
                    repr(s)
                ),
            ));
        }
        self.host = Some((s.clone(), text.clone()));
        Ok(text)
    }

    /// The device a location's device string names.
    fn device(&mut self, s: &Bound<'py, PyString>, position: &[usize]) -> PyResult<Device> {
        if let Some((last, d)) = &self.device {
            if same_str(last, s) {
                return Ok(*d);
            }
        }
        let d = Location::parse_device(&s.to_cow()?, position).map_err(to_py)?;
        self.device = Some((s.clone(), d));
        Ok(d)
    }

    fn location(
        &mut self,
        item: &Bound<'py, PyAny>,
        position: &[usize],
        fallback: Device,
    ) -> PyResult<Location> {
        if item.is_instance_of::<PyBool>() {
            return Err(bad(
                position,
                format!("a location cannot be a bool, found {}", repr(item)),
            ));
        }
        if integer(item) {
            return Self::rank(item, position, fallback);
        }
        if let Ok(s) = item.cast::<PyString>() {
            let host = self.host(s, position)?;
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
        if let Ok(t) = item.cast::<PyTuple>() {
            if let Some((last, d, loc)) = &self.tuple {
                if last.is(t) && *d == fallback {
                    return Ok(loc.clone());
                }
            }
            let fields: Vec<Bound<'py, PyAny>> = t.iter().collect();
            let loc = self.fields(item, &fields, position, fallback)?;
            self.tuple = Some((t.clone(), fallback, loc.clone()));
            return Ok(loc);
        }
        if let Ok(l) = item.cast::<PyList>() {
            let fields: Vec<Bound<'py, PyAny>> = l.iter().collect();
            return self.fields(item, &fields, position, fallback);
        }
        Err(bad(
            position,
            format!(
                "expected (ip, pid[, device]), an IP string or a rank, found {}",
                repr(item)
            ),
        ))
    }

    /// heat's form: an MPI rank, any `integer`.
    fn rank(item: &Bound<'py, PyAny>, position: &[usize], fallback: Device) -> PyResult<Location> {
        let rank: i64 = item.extract().map_err(|_| {
            bad(
                position,
                format!("rank {} does not fit an int64", repr(item)),
            )
        })?;
        if rank < 0 {
            return Err(bad(position, format!("negative rank {rank}")));
        }
        Ok(Location::rank(rank, fallback))
    }

    /// `(ip, pid[, device])` given as the tuple or list `item` of `fields`.
    fn fields(
        &mut self,
        item: &Bound<'py, PyAny>,
        fields: &[Bound<'py, PyAny>],
        position: &[usize],
        fallback: Device,
    ) -> PyResult<Location> {
        if !(2..=3).contains(&fields.len()) {
            return Err(bad(
                position,
                format!(
                    "expected (ip, pid[, device]), an IP string or a rank, found {}",
                    repr(item)
                ),
            ));
        }
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
        if !integer(pid) {
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
                self.device(text, position)?
            }
        };
        Ok(Location {
            host: Some(self.host(host, position)?),
            pid: Some(pid),
            device,
            rank: None,
        })
    }
}

/// Refuses a list (or tuple) of locations that holds both bare host strings and bare ranks:
/// one array comes from one system, which names its locations one way (draft 1's IPs or
/// worker names, heat's ranks). Such a list is most likely one draft-2 location written as a
/// list, `['10.0.0.5', 4242, 'kDLCPU']`, which would otherwise read as a host, rank 4242 and
/// a host named `kDLCPU`: the error says so, and how to write it.
fn unmixed<'py>(
    value: &Bound<'py, PyAny>,
    items: impl ExactSizeIterator<Item = Bound<'py, PyAny>>,
    position: &[usize],
) -> PyResult<()> {
    // One entry (the common case: one location, or heat's one rank) mixes nothing.
    if items.len() < 2 {
        return Ok(());
    }
    let (mut host, mut rank) = (None, None);
    let items: Vec<Bound<'py, PyAny>> = items.collect();
    for (k, item) in items.iter().enumerate() {
        if item.is_instance_of::<PyString>() {
            host = host.or(Some(k));
        } else if !item.is_instance_of::<PyBool>() && integer(item) {
            rank = rank.or(Some(k));
        }
    }
    let (Some(host), Some(rank)) = (host, rank) else {
        return Ok(());
    };
    let draft2 = (2..=3).contains(&items.len())
        && host == 0
        && rank == 1
        && items.get(2).is_none_or(|d| d.is_instance_of::<PyString>());
    let found = if draft2 {
        let tuple = PyTuple::new(value.py(), &items)?;
        format!(
            "{} mixes a host string and a rank: it reads as one location (ip, pid[, device]) \
             written as a list; give it as a tuple in a list: [{}]",
            repr(value),
            repr(tuple.as_any())
        )
    } else {
        format!(
            "{} mixes host strings and ranks (the host {} at entry {host}, the rank {} at \
             entry {rank}): one array names its locations one way",
            repr(value),
            repr(&items[host]),
            repr(&items[rank])
        )
    };
    Err(bad(position, found))
}

/// Whether `a` and `b` are one string: the same object, or two exact `str` objects (no
/// subclass, whose `__eq__` could run Python code) with equal text.
fn same_str(a: &Bound<'_, PyString>, b: &Bound<'_, PyString>) -> bool {
    if a.is(b) {
        return true;
    }
    if !(a.is_exact_instance_of::<PyString>() && b.is_exact_instance_of::<PyString>()) {
        return false;
    }
    // SAFETY: both are live exact `str` objects; comparing two of them runs no Python code and
    // cannot fail, so no error is left set (-1 is treated as "not equal" all the same).
    unsafe { pyo3::ffi::PyObject_RichCompareBool(a.as_ptr(), b.as_ptr(), pyo3::ffi::Py_EQ) == 1 }
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
    text.parse::<Device>()
        .map(Some)
        .map_err(|e| to_py(Error::protocol(key, Some(position), e.to_string(), None)))
}
