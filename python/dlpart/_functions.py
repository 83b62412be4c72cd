"""`gather` and `scatter` with numpy's conventions: negative axes, Python sequences as indices,
and partitioned arrays as well as single arrays."""

from typing import TYPE_CHECKING, Any, Optional, Union, overload

from . import _core
from ._core import Tensor

if TYPE_CHECKING:  # imported at run time inside the functions: _partitioned imports this module
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


def _axis(axis: int, ndim: int, what: str) -> int:
    """``axis`` in ``[0, ndim)``, counting negative ones from the end, as numpy does."""
    import operator

    a = operator.index(axis)
    if not -ndim <= a < ndim:
        raise ValueError(f"axis {axis} is out of range for the {ndim}-d {what}")
    return a + ndim if a < 0 else a


def _ndim(x) -> int:
    nd = getattr(x, "ndim", None)
    if nd is None:
        nd = _core.from_dlpack(x).ndim
    return nd


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
    from ._partitioned import PartitionedArray

    if isinstance(x, PartitionedArray):
        if out is not None:
            raise TypeError("gather of a PartitionedArray returns a new one; out= is not taken")
        return x.gather(_indices(indices), _axis(axis, x.ndim, "array"))
    return _core.gather(x, _indices(indices), _axis(axis, _ndim(x), "source"), out)


def scatter(values: Any, indices: Any, out: Any, axis: int = 0) -> None:
    """``out[.., indices[i], ..] = values[.., i, ..]`` along ``axis``, like numpy's fancy
    assignment: the last of duplicate indices wins. ``out`` is any writable DLPack array or a
    `dlpart.PartitionedArray`; nothing is written unless every index is in range."""
    from ._partitioned import PartitionedArray

    if isinstance(out, PartitionedArray):
        out.scatter(values, _indices(indices), _axis(axis, out.ndim, "output"))
        return None
    return _core.scatter(values, _indices(indices), out, _axis(axis, _ndim(out), "output"))
