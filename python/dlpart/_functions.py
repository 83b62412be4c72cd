"""`gather` and `scatter` with numpy's conventions: negative axes, Python sequences as indices,
and partitioned arrays as well as single arrays."""

from typing import Any, Optional, Union, overload

from . import _core
from ._core import Tensor
from ._partitioned import PartitionedArray

__all__ = ["gather", "scatter"]


def _indices(indices):
    """Index arrays as given (any DLPack array), or a Python sequence / scalar as int64."""
    if hasattr(indices, "__dlpack__") or isinstance(indices, Tensor):
        return indices
    import numpy as np

    arr = np.asarray(indices)
    if arr.dtype.kind not in "iub" or arr.dtype.kind == "b":
        raise TypeError(f"indices must be integers, found {arr.dtype} in {indices!r}")
    return np.ascontiguousarray(arr.reshape(-1).astype(np.int64, copy=False))


@overload
def gather(x: "PartitionedArray", indices: Any, axis: int = 0,
           out: None = None) -> "PartitionedArray": ...
@overload
def gather(x: Any, indices: Any, axis: int = 0, out: Optional[Any] = None) -> Tensor: ...


def gather(x: Any, indices: Any, axis: int = 0,
           out: Optional[Any] = None) -> "Union[Tensor, PartitionedArray]":
    """``numpy.take(x, indices, axis)``: ``out[.., i, ..] = x[.., indices[i], ..]``.

    ``x`` is any DLPack array (the result is a `dlpart.Tensor` on its device, or ``out``) or a
    `dlpart.PartitionedArray` (the result is partitioned; see `PartitionedArray.gather`).
    ``indices`` may be any integer DLPack array or a Python sequence; negative indices and
    axes count from the end. An out-of-range index raises `IndexError` before anything is
    written (numpy's ``mode='raise'``).
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
    assignment: the last of duplicate indices wins. ``out`` is any writable DLPack array or a
    `dlpart.PartitionedArray`; nothing is written unless every index is in range."""
    if isinstance(out, PartitionedArray):
        out.scatter(values, indices, axis)
        return None
    return _core.scatter(values, indices, out, axis)  # indices as in `gather`
