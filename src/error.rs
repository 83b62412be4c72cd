//! The one error type of dlpart.
//!
//! Every variant carries the offending values as fields, so that callers can match on them and
//! messages can name them. The Python layer maps variants onto exception classes:
//! [`Error::Buffer`], [`Error::DLPackField`], [`Error::UnsupportedDType`],
//! [`Error::UnsupportedDevice`] and [`Error::NoNewMemory`] become `BufferError`; [`Error::Protocol`] becomes `dlpart.ProtocolError` (a `ValueError`);
//! [`Error::InvalidDevice`] and [`Error::DeviceMismatch`] become `dlpart.DeviceError` (a
//! `ValueError`); [`Error::IndexOutOfRange`] becomes `IndexError`; [`Error::BackendUnavailable`]
//! becomes `dlpart.BackendUnavailableError` (a `RuntimeError`); [`Error::OutOfMemory`] becomes
//! `MemoryError`.

use std::fmt;

use crate::device::Device;

/// A grid position, printed like a Python tuple: `(0, 1)`.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Default)]
pub struct Position(
    /// The index along each axis of the grid.
    pub Vec<usize>,
);

impl fmt::Display for Position {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write_tuple(f, &self.0)
    }
}

/// Writes `items` as a Python tuple literal: `()`, `(3,)`, `(2, 4)`.
pub(crate) fn write_tuple<T: fmt::Display>(f: &mut fmt::Formatter<'_>, items: &[T]) -> fmt::Result {
    f.write_str("(")?;
    for (i, x) in items.iter().enumerate() {
        if i > 0 {
            f.write_str(", ")?;
        }
        write!(f, "{x}")?;
    }
    if items.len() == 1 {
        f.write_str(",")?;
    }
    f.write_str(")")
}

/// Formats a slice as a Python tuple literal: `()`, `(3,)`, `(2, 4)`.
pub fn tuple_string<T: fmt::Display>(items: &[T]) -> String {
    struct T<'a, U>(&'a [U]);
    impl<U: fmt::Display> fmt::Display for T<'_, U> {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            write_tuple(f, self.0)
        }
    }
    T(items).to_string()
}

/// The devices an [`Error::DeviceMismatch`] names.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Devices {
    /// Data that would move, `(from, to)` per crossing: printed `a -> b, c -> d`.
    Moves(Vec<(Device, Device)>),
    /// Data on the first device where the second was required: printed `a and b`.
    Apart(Device, Device),
    /// Devices that had to be one and are not: printed `a, b, c`.
    Several(Vec<Device>),
}

impl Devices {
    /// One crossing, `from -> to`.
    pub fn move_(from: Device, to: Device) -> Self {
        Devices::Moves(vec![(from, to)])
    }
}

impl fmt::Display for Devices {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Devices::Moves(moves) => {
                for (i, (from, to)) in moves.iter().enumerate() {
                    if i > 0 {
                        f.write_str(", ")?;
                    }
                    write!(f, "{from} -> {to}")?;
                }
                Ok(())
            }
            Devices::Apart(a, b) => write!(f, "{a} and {b}"),
            Devices::Several(all) => {
                for (i, d) in all.iter().enumerate() {
                    if i > 0 {
                        f.write_str(", ")?;
                    }
                    write!(f, "{d}")?;
                }
                Ok(())
            }
        }
    }
}

/// Everything that can go wrong in dlpart.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A tensor cannot be exchanged as asked (DLPack rules, read-only data, copy refused, ...).
    #[error("{reason}")]
    Buffer {
        /// What was asked and why it cannot be done.
        reason: String,
    },

    /// A DLPack data type dlpart does not handle.
    #[error("unsupported DLPack dtype (code={code}, bits={bits}, lanes={lanes}): {reason}")]
    UnsupportedDType {
        /// The `DLDataTypeCode`.
        code: u8,
        /// Bits per lane.
        bits: u8,
        /// Vector lanes (dlpart takes only 1).
        lanes: u16,
        /// Why it is refused.
        reason: &'static str,
    },

    /// An operation that the device cannot do (in this build or at all).
    #[error("{op} is not supported on device {device}")]
    UnsupportedDevice {
        /// The device (or device pair, `a -> b`), as printed by [`crate::Device`].
        device: String,
        /// What was asked of it.
        op: String,
    },

    /// New memory asked for on a device whose memory dlpart does not make (managed and ROCm
    /// host memory): data there is read and written in place, but a new tensor there would be
    /// plain memory mislabelled as that kind. `advice` says what the calling operation can do
    /// instead (see [`Error::advise`]).
    #[error(
        "cannot allocate new memory on {device}: dlpart makes only kDLCPU, kDLCUDA and pinned \
         kDLCUDAHost memory; {advice}"
    )]
    NoNewMemory {
        /// The device asked for.
        device: Device,
        /// How to get the result on a device dlpart allocates on.
        advice: String,
    },

    /// A device string or `(type, id)` pair that does not name a DLPack device.
    #[error("invalid device {text:?}: {reason}")]
    InvalidDevice {
        /// The text (or code) as given.
        text: String,
        /// What is wrong with it.
        reason: String,
    },

    /// Data would have to cross devices and the caller did not ask for it.
    #[error("{op}: {reason} (devices: {devices})")]
    DeviceMismatch {
        /// The operation.
        op: String,
        /// The devices at fault.
        devices: Devices,
        /// Why it is refused, and how to allow it.
        reason: String,
    },

    /// A DLPack tensor whose fields break the DLPack rules (or ask for what dlpart does not
    /// read): the field, its value, and what is wrong with it.
    #[error("DLPack tensor with {field} {value}: {problem}")]
    DLPackField {
        /// The field at fault: `"version"`, `"device"`, `"ndim"`, `"shape"`, `"strides"`,
        /// `"byte_offset"` or `"data"`.
        field: &'static str,
        /// Its value, as printed (shapes and strides as tuples).
        value: String,
        /// What is wrong with it.
        problem: String,
    },

    /// A `__partitioned__` dict or layout that breaks the protocol.
    /// `invariant` is the number of the [`crate::grid`] invariant that was violated, if any.
    #[error("{}", protocol_message(key, position.as_ref(), found, *invariant))]
    Protocol {
        /// The dict key at fault (`"shape"`, `"partitions"`, `"locals"`, ...).
        key: String,
        /// The grid position of the partition at fault, when one is.
        position: Option<Position>,
        /// The values found, and what was expected.
        found: String,
        /// The number of the violated [`crate::grid`] invariant (see [`crate::grid::inv`]).
        invariant: Option<u8>,
    },

    /// A Distributed Array Protocol (`__distarray__`) dict that dlpart cannot read, or an
    /// array it cannot describe in it.
    #[error("__distarray__{at}: {found}")]
    DistArray {
        /// Where: `" dim_data[0] ('b')"` for one axis's dictionary, empty for the whole dict.
        at: String,
        /// The values found, and what was expected.
        found: String,
    },

    /// Several protocol violations, reported together.
    #[error("{} protocol violations:\n{}", errors.len(), join_lines(errors))]
    ProtocolMany {
        /// Each violation, in the order found.
        errors: Vec<Error>,
    },

    /// Indices of a dtype that is no integer type (a float, bool or complex array): a
    /// `TypeError` in Python, as `numpy.take` raises for such an index array.
    #[error("{}", index_dtype_message(found))]
    IndexDType {
        /// The dtype of the indices given.
        found: crate::dtype::DType,
    },

    /// An index outside `[-len, len)`.
    #[error("index {index} is out of bounds for axis {axis} with size {len}")]
    IndexOutOfRange {
        /// The first offending index, as given.
        index: i128,
        /// The axis indexed.
        axis: usize,
        /// The length of that axis.
        len: usize,
    },

    /// Two dtypes that must agree and do not (sources and targets of a copy, the partitions of
    /// one array, values and output of a scatter).
    #[error("dtype {found} differs from {expected} of {of}")]
    DTypeMismatch {
        /// The dtype found.
        found: crate::dtype::DType,
        /// The dtype it must equal.
        expected: crate::dtype::DType,
        /// What holds the expected dtype (e.g. "partition (0, 1)").
        of: String,
    },

    /// Shapes, axes or other arguments that do not fit together.
    #[error("{what}: {found}")]
    Shape {
        /// What was expected.
        what: String,
        /// The values found.
        found: String,
    },

    /// A write into data that is read-only.
    #[error("{what} is read-only")]
    ReadOnly {
        /// The data written to (usually a tensor's `Debug` form).
        what: String,
    },

    /// A backend that is not compiled in or cannot be loaded on this machine.
    #[error("the {backend} backend is unavailable: {reason}")]
    BackendUnavailable {
        /// The backend's name (`"cuda"`).
        backend: &'static str,
        /// Why: compiled out, library not found, no device, ...
        reason: String,
    },

    /// An allocation that failed, or whose size cannot be allocated at all (beyond
    /// `isize::MAX` bytes, or not even computable): an error value, never an abort.
    #[error("cannot allocate {} of {device} memory for {what}", bytes_text(*bytes))]
    OutOfMemory {
        /// The bytes asked for (`usize::MAX` when the size itself overflows).
        bytes: usize,
        /// What the memory was for ("a tensor of shape (4, 5) float32", ...).
        what: String,
        /// Where: `"host"`, or a device as printed by [`crate::Device`].
        device: String,
    },

    /// A failure reported by a device runtime (CUDA driver, NVRTC, ...).
    #[error("{backend} error in {op}: {message}")]
    Backend {
        /// The backend's name (`"cuda"`).
        backend: &'static str,
        /// The runtime call or step that failed.
        op: String,
        /// The runtime's message.
        message: String,
    },

    /// A collective operation (SPMD, [`crate::spmd`]) that failed on some rank: every rank
    /// returns this same error, so that none waits for the others forever.
    #[error("rank {rank}: {message}")]
    Collective {
        /// The lowest rank that failed.
        rank: usize,
        /// The kind of its error, as [`Error::kind`] names it (the Python exception class).
        kind: String,
        /// Its message.
        message: String,
    },
}

fn protocol_message(
    key: &str,
    position: Option<&Position>,
    found: &str,
    inv: Option<u8>,
) -> String {
    let mut s = format!("__partitioned__[{key:?}]");
    if let Some(p) = position {
        s.push_str(&format!(" at position {p}"));
    }
    s.push_str(": ");
    s.push_str(found);
    if let Some(n) = inv {
        s.push_str(&format!(" (grid invariant {n})"));
    }
    s
}

/// The message of [`Error::IndexDType`] for indices of dtype `found`; also that of the
/// Python layer for index arrays of dtypes dlpart has no type for (numpy's strings, objects)
/// and for Python sequences that are no integers, which it follows with the value given
/// (`"... in ['a']"`): the one wording of indices that are no integers.
pub(crate) fn index_dtype_message(found: &dyn fmt::Display) -> String {
    format!("indices must be integers, found dtype {found}")
}

fn bytes_text(bytes: usize) -> String {
    if bytes == usize::MAX {
        "more bytes than the address space holds".into()
    } else {
        format!("{bytes} bytes")
    }
}

fn join_lines(errors: &[Error]) -> String {
    errors
        .iter()
        .map(|e| format!("  - {e}"))
        .collect::<Vec<_>>()
        .join("\n")
}

impl Error {
    /// Shorthand for [`Error::DistArray`].
    pub fn dist_array(at: impl Into<String>, found: impl Into<String>) -> Self {
        Error::DistArray {
            at: at.into(),
            found: found.into(),
        }
    }

    /// Shorthand for [`Error::Buffer`].
    pub fn buffer(reason: impl Into<String>) -> Self {
        Error::Buffer {
            reason: reason.into(),
        }
    }

    /// [`Error::NoNewMemory`] on `device`, with the advice any caller can follow: copy the
    /// data onto a device dlpart allocates on first.
    pub fn no_new_memory(device: Device) -> Self {
        Error::NoNewMemory {
            device,
            advice: "copy the data onto one of them first (`to('cpu')` in Python, \
                     `ops::to_device` or `PartitionedArray::to` in Rust)"
                .into(),
        }
    }

    /// This error with `advice` in place of an [`Error::NoNewMemory`]'s own: the operation that
    /// asked for the memory knows which of its options puts the result elsewhere. Other errors
    /// are returned unchanged.
    pub fn advise(self, advice: &str) -> Self {
        match self {
            Error::NoNewMemory { device, .. } => Error::NoNewMemory {
                device,
                advice: advice.into(),
            },
            e => e,
        }
    }

    /// Shorthand for [`Error::Shape`].
    pub fn shape(what: impl Into<String>, found: impl Into<String>) -> Self {
        Error::Shape {
            what: what.into(),
            found: found.into(),
        }
    }

    /// Shorthand for [`Error::Protocol`].
    pub fn protocol(
        key: impl Into<String>,
        position: Option<&[usize]>,
        found: impl Into<String>,
        invariant: Option<u8>,
    ) -> Self {
        Error::Protocol {
            key: key.into(),
            position: position.map(|p| Position(p.to_vec())),
            found: found.into(),
            invariant,
        }
    }

    /// Shorthand for [`Error::OutOfMemory`] in host memory.
    pub fn host_oom(bytes: usize, what: impl Into<String>) -> Self {
        Error::OutOfMemory {
            bytes,
            what: what.into(),
            device: "host".into(),
        }
    }

    /// The name of the Python exception class this error becomes (`"ProtocolError"`,
    /// `"DeviceError"`, `"BufferError"`, `"IndexError"`, `"TypeError"`, `"ValueError"`,
    /// `"BackendUnavailableError"`, `"MemoryError"`, `"RuntimeError"`), which is also how an SPMD
    /// rank tells the others what kind of error it had.
    pub fn kind(&self) -> &str {
        match self {
            Error::Buffer { .. }
            | Error::DLPackField { .. }
            | Error::UnsupportedDType { .. }
            | Error::UnsupportedDevice { .. }
            | Error::NoNewMemory { .. }
            | Error::ReadOnly { .. } => "BufferError",
            Error::Protocol { .. } | Error::ProtocolMany { .. } | Error::DistArray { .. } => {
                "ProtocolError"
            }
            Error::InvalidDevice { .. } | Error::DeviceMismatch { .. } => "DeviceError",
            Error::IndexOutOfRange { .. } => "IndexError",
            Error::IndexDType { .. } => "TypeError",
            Error::OutOfMemory { .. } => "MemoryError",
            Error::BackendUnavailable { .. } => "BackendUnavailableError",
            Error::Shape { .. } | Error::DTypeMismatch { .. } => "ValueError",
            Error::Backend { .. } => "RuntimeError",
            Error::Collective { kind, .. } => kind,
        }
    }

    /// Folds a list of violations into one error: the error itself when there is one.
    pub fn from_many(mut errors: Vec<Error>) -> Option<Self> {
        match errors.len() {
            0 => None,
            1 => errors.pop(),
            _ => Some(Error::ProtocolMany { errors }),
        }
    }
}

/// `Result` with [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// How an error tells the caller to allow a move across devices, in both languages' spelling
/// of the `transfer` argument.
pub(crate) const ALLOW_TRANSFER: &str = "allow the move with transfer (transfer=True in Python, \
                                         `true` in Rust)";

/// The [`Error::NoNewMemory`] advice of a repartition (Python's `repartition`, Rust's
/// `repartition` with a [`crate::Layout`]). The memory without new allocations is host
/// memory, so the move to `kDLCPU` is a plain copy, which needs no `transfer`.
pub(crate) const REPARTITION_ELSEWHERE: &str =
    "repartition onto one of them (devices='cpu' in Python, a layout `.on(Device::CPU)` in \
     Rust; a move between kinds of host memory needs no transfer)";

/// The [`Error::NoNewMemory`] advice of an assemble.
pub(crate) const ASSEMBLE_ELSEWHERE: &str =
    "assemble onto one of them (device='cpu' in Python, `Some(Device::CPU)` in Rust; a move \
     between kinds of host memory needs no transfer)";

/// The [`Error::NoNewMemory`] advice of a move whose target is such a device.
pub(crate) const TARGET_ELSEWHERE: &str = "name one of them as the target instead";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tuples_print_like_python() {
        assert_eq!(tuple_string::<usize>(&[]), "()");
        assert_eq!(tuple_string(&[3]), "(3,)");
        assert_eq!(tuple_string(&[2, 4]), "(2, 4)");
    }

    #[test]
    fn an_allocation_failure_names_the_bytes() {
        assert_eq!(
            Error::host_oom(1 << 40, "a tensor").to_string(),
            "cannot allocate 1099511627776 bytes of host memory for a tensor"
        );
        assert!(Error::host_oom(usize::MAX, "x")
            .to_string()
            .contains("more bytes than the address space holds"));
    }

    #[test]
    fn protocol_message_names_key_position_and_invariant() {
        let e = Error::protocol(
            "start",
            Some(&[0, 1]),
            "expected (0, 4), found (0, 5)",
            Some(4),
        );
        assert_eq!(
            e.to_string(),
            "__partitioned__[\"start\"] at position (0, 1): expected (0, 4), found (0, 5) (grid invariant 4)"
        );
    }
}
