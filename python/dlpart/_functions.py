"""`gather` and `scatter` with numpy's conventions: negative axes, Python sequences as indices,
and partitioned arrays as well as single arrays; `prepare_gather` and `prepare_scatter` for
the same copy made again and again between the same arrays."""

from typing import Any, Optional, Union, overload

from . import _core
from ._core import PreparedGather, PreparedScatter, Tensor
from ._partitioned import PartitionedArray

__all__ = ["gather", "prepare_gather", "prepare_scatter", "scatter"]


def _native(a):
    """``a``, or for an array whose bytes are not in native order (which DLPack cannot carry) a
    copy in native order: for arguments read once, as numpy's own functions read them."""
    dtype = getattr(a, "dtype", None)
    if getattr(dtype, "isnative", True) is False:
        return a.astype(dtype.newbyteorder("="))
    return a


def _values(values, dtype: Optional[str]):
    """A scatter's ``values`` as an array, the way numpy's ``out[idx] = values`` reads them:
    DLPack arrays as given (in native byte order, `_native`); a numpy scalar
    (``np.float32(3)``) as the 0-d array of its dtype it stands for; a Python scalar (bool,
    int, float, complex), which has no dtype of its own, as a 0-d array of the target's
    ``dtype`` (or numpy's default where that is not known yet), converted as numpy converts it
    on assignment (its errors too: ``300`` into uint8 raises `OverflowError`). A dtype numpy
    cannot hand over through DLPack (bfloat16, the float8 types) is converted by the package
    that gives numpy the type (ml_dtypes, as ``import jax`` loads it) and returned as a 0-d
    `Tensor`; without such a package it raises `TypeError`. A 0-d value is broadcast to
    every element written. Anything else is returned as it is, for the caller's import to
    refuse by name."""
    if isinstance(values, Tensor) or hasattr(values, "__dlpack__"):
        return _native(values)
    import numpy as np

    if isinstance(values, np.generic):
        return np.asarray(values)
    if not isinstance(values, (bool, int, float, complex)):
        return values
    if dtype is None:
        return np.asarray(values)
    try:
        target = np.dtype(dtype)
    except TypeError:
        raise TypeError(f"a Python scalar is written in the target's dtype {dtype}, which numpy "
                        f"has no type for: pass values as a 0-d array of {dtype}") from None
    a = np.empty((), target)
    a[()] = values
    if target.isbuiltin != 1:
        # A dtype numpy knows only through a package that adds it (ml_dtypes' bfloat16 and
        # float8 types, which `import jax` loads): numpy's DLPack export refuses it, so the
        # converted bytes go in as a dlpart tensor of that dtype.
        return _core._tensor_from_bytes(a.tobytes(), (), dtype, "kDLCPU", False)
    return a


def _indices(indices):
    """Indices that are no DLPack array, as the extension's reader of indices hands them over
    (it reads index arrays itself: one whose bytes are not in native order through a copy, one
    that is no integer array refused naming its dtype as the caller wrote it): one index (a
    Python or numpy int) as a 0-d int64 array, which drops the axis as numpy does; Python
    sequences of ints as an int64 array; other sequences as the 1-d array numpy makes of them,
    which the extension refuses unless it is an integer one."""
    import numpy as np

    one = isinstance(indices, int) and not isinstance(indices, bool)
    if one or isinstance(indices, (list, tuple, range)) and all(
            isinstance(i, int) and not isinstance(i, bool) for i in indices):
        # Python ints (numpy would make [] float64, mix int64 and uint64 into float64, and
        # wrap on a cast): int64, each checked to fit; one that does not is beyond any axis.
        big = next((i for i in ([indices] if one else indices)
                    if not -(2**63) <= i < 2**63), None)
        if big is not None:
            raise IndexError(f"index {big} is out of bounds: indices must fit in 64 bits")
        return np.array(indices, dtype=np.int64)
    arr = np.asarray(indices)
    if arr.ndim > 1:
        raise ValueError(
            "indices must be one index (0-d) or a 1-d list: indices of more axes, whose shape "
            "numpy.take puts in place of the axis, are not supported (flatten them, and "
            f"reshape the result): shape {arr.shape}")
    # An array of no integer dtype is returned as it is: the extension refuses it, naming the
    # dtype and the value given, in the words of every index array of no integer dtype.
    return arr if arr.ndim == 0 else np.ascontiguousarray(arr)


@overload
def gather(x: "PartitionedArray", indices: Any, axis: int = 0,
           out: None = None) -> "PartitionedArray": ...
@overload
def gather(x: Any, indices: Any, axis: int = 0, out: Optional[Any] = None) -> Tensor: ...


def gather(x: Any, indices: Any, axis: int = 0,
           out: Optional[Any] = None) -> "Union[Tensor, PartitionedArray]":
    """``numpy.take(x, indices, axis)``: ``out[.., i, ..] = x[.., indices[i], ..]``.

    ``x`` is any DLPack array (the result is ``out``, or a new `dlpart.Tensor` on ``x``'s
    device: for ``x`` in ``kDLCUDAManaged`` or ``kDLROCMHost`` memory, which dlpart does not
    allocate, in ``kDLCPU`` memory, which the host reads as it reads ``x``, as ``numpy.take``
    of such memory gives an ordinary host array) or a `dlpart.PartitionedArray` (the result
    is partitioned; see `PartitionedArray.gather`).
    ``indices`` may be any 1-d integer DLPack array or a Python sequence, or one index (a
    Python or numpy int, a 0-d array), which drops the axis as numpy does: ``gather(x, 2)`` is
    ``x[2]``, and ``out`` then has ``x``'s shape without the axis. Indices of more axes raise
    `ValueError`; indices that are no integers (floats, bools, and arrays of the strings,
    bytes, objects and datetimes DLPack cannot carry), in an array or a sequence, raise
    `TypeError` as ``numpy.take`` raises for a float index array, in one wording naming the
    dtype (numpy's reading of a sequence) and a sequence as given: ``indices must be
    integers, found dtype float64 in [1.5]``. Negative
    indices and axes count from the end. An out-of-range index raises
    `IndexError` before anything is written (numpy's ``mode='raise'``); an ``out`` that refers
    to some element more than once (a zero stride) raises `BufferError`, as it would make
    threads race. ``out`` is on ``x``'s device, or in host memory of any kind where ``x`` is
    (``kDLCPU``, pinned ``kDLCUDAHost``, ``kDLCUDAManaged``, ``kDLROCMHost``: written in place
    alike); device memory against host memory raises `dlpart.DeviceError`. ``x`` and
    ``indices`` whose bytes are not in native order, which DLPack cannot carry, are read
    through a copy in native order; such an ``out`` raises `BufferError`.
    """
    # The extension checks the axis (negative ones count from the end) against the array it
    # imports, and turns indices that are no DLPack array into one (`_indices`): a call on
    # arrays costs one call into it, which halo exchanges make per face.
    if isinstance(x, PartitionedArray):
        if out is not None:
            raise TypeError("gather of a PartitionedArray returns a new one; out= is not taken")
        return x.gather(indices, axis)
    return _core.gather(x, indices, axis, out)


def scatter(values: Any, indices: Any, out: Any, axis: int = 0) -> None:
    """``out[.., indices[i], ..] = values[.., i, ..]`` along ``axis``, like numpy's fancy
    assignment: the last of duplicate indices wins; for one index (as in `gather`) ``values``
    has ``out``'s shape without the axis. ``values`` of another shape that broadcasts to the one
    written are broadcast, as numpy broadcasts them: a scalar or a 0-d array is written at
    every element, a row in every row. A numpy scalar is the 0-d array of its dtype, which
    must be ``out``'s, as an array's must; a Python scalar takes ``out``'s dtype, converted as
    numpy's assignment converts it (into bfloat16 or a float8 dtype, which numpy knows only
    once ml_dtypes is loaded, as ``import jax`` loads it, by ml_dtypes' conversion; without
    it, `TypeError` asks for a 0-d array of that dtype). A scalar (or a 0-d host array)
    writes ``out`` on any device, GPU memory too: its one element is copied there once and
    broadcast there. ``out`` is any writable DLPack array or a
    `dlpart.PartitionedArray` whose elements are distinct (a zero stride, or partitions
    written that share memory, raise `BufferError`);
    nothing is written unless every index is in range. Other ``values`` are on ``out``'s
    device, or in host memory of any kind where ``out`` is (for a `dlpart.PartitionedArray`,
    where each partition written is: host values write partitions on JAX's ``kDLCPU:k``,
    pinned or managed memory in place), and in either byte order (as for `gather`)."""
    if isinstance(out, PartitionedArray):
        out.scatter(values, indices, axis)
        return None
    return _core.scatter(values, indices, out, axis)  # indices as in `gather`


def _single(x: Any, func: str) -> None:
    if isinstance(x, PartitionedArray):
        raise TypeError(f"{func} takes single arrays; a PartitionedArray has its own gather and "
                        "scatter")


def prepare_gather(x: Any, indices: Any, axis: int = 0,
                   out: Optional[Any] = None) -> PreparedGather:
    """`gather` checked once, for the same copy made again and again (the faces of a halo
    exchange, at every time step): ``g = prepare_gather(x, indices, axis, out)``, then each
    ``g()`` does ``out[.., i, ..] = x[.., indices[i], ..]`` and returns ``None`` (for one
    index, as in `gather`, ``out`` has no such axis).

    Everything `gather` checks is checked here, once, with the same errors: the axis, each
    index (read once into dlpart's own memory, so later changes to ``indices`` do not
    matter), ``out``'s shape, dtype, device and writability. ``out`` is allocated where
    `gather` allocates it when not given (``g.out``: on ``x``'s device, or in ``kDLCPU``
    memory for managed or ROCm host memory); an ``out`` that shares memory with ``x`` raises
    `BufferError`, and so do ``x`` and ``out`` in non-native byte order (no copy can stand in
    for them). The object holds ``x`` and ``out`` themselves (their DLPack imports: the
    producers' memory stays valid until the object is dropped), so the caller may change the
    data of ``x`` between calls, and each call copies what is there then; the shapes cannot
    change. A call imports nothing and checks only what safety needs (a few comparisons):
    it costs the copy and well under a microsecond more.
    """
    _single(x, "prepare_gather")
    return _core.prepare_gather(x, indices, axis, out)


def prepare_scatter(values: Any, indices: Any, out: Any, axis: int = 0) -> PreparedScatter:
    """`scatter` checked once, for the same copy made again and again: ``s =
    prepare_scatter(values, indices, out, axis)``, then each ``s()`` does ``out[..,
    indices[i], ..] = values[.., i, ..]`` (the last of duplicate indices wins) and returns
    ``None``.

    Everything `scatter` checks is checked here, once, with the same errors, and ``values``
    broadcast as there (a scalar is a constant: the object keeps its 0-d array); ``values``
    that share memory with ``out`` raise `BufferError`, and so do ``values`` and ``out`` in
    non-native byte order. The object holds ``values``, ``out`` and
    its own copy of the indices, so the caller may change the data of ``values`` between
    calls (not the shapes), and each call copies what is there then.
    """
    _single(out, "prepare_scatter")
    return _core.prepare_scatter(values, indices, out, axis)
