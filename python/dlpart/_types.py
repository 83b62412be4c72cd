"""The type aliases of dlpart's public signatures."""

from typing import Any, Dict, Sequence, Tuple, Union

from ._core import Device

#: A device: a `Device`, a DLPack name (``'kDLCUDA:0'``), a framework's name (``'cpu'``,
#: ``'cuda:1'``; a ``torch.device`` is read by its string too), or a DLPack ``(type, id)`` pair.
DeviceLike = Union[Device, str, Tuple[int, int]]

#: Any array dlpart reads through DLPack (numpy, torch, cupy, jax, dpctl, a `dlpart.Tensor`).
#: Typed as ``Any``: DLPack producers share a method, not a base class, and their
#: ``__dlpack__`` signatures differ in ways a ``Protocol`` would reject.
ArrayLike = Any

#: Indices for gather and scatter: a 1-d integer array of any DLPack producer, a Python
#: sequence of ints, or one index (an int or a 0-d array), which drops the axis as in numpy.
IndicesLike = Any

#: A ``__partitioned__`` dict. Its values differ by key (a shape tuple, a dict of partitions,
#: a ``get`` function, ...), which a ``TypedDict`` cannot express for the forms in the wild.
PartitionedDict = Dict[str, Any]

#: Split points per axis, ``[[0, 3, 8], [0, 8]]``.
SplitsLike = Sequence[Sequence[int]]
