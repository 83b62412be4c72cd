"""The Distributed Array Protocol (``__distarray__``, version 0.10) in Python: the dict read and
written here; the dimension dictionaries are read, checked and turned into partitions by the
Rust core (``dlpart::distarray``, which documents the rules).
"""

from __future__ import annotations

from typing import Any, Dict, Tuple

import numpy as np

from . import _core
from ._core import ProtocolError, Tensor

VERSION = _core.DISTARRAY_VERSION


def read(obj: Any) -> Tuple[Tensor, Any]:
    """The buffer of the DAP dict of ``obj`` (an object with ``__distarray__``, or the dict
    itself) as a tensor (a PEP 3118 buffer, read through numpy), and its ``dim_data``."""
    method = getattr(obj, "__distarray__", None)
    d = method() if callable(method) else obj
    if not isinstance(d, dict):
        raise TypeError(f"objects of type {type(obj).__name__} do not implement __distarray__")
    for key in ("__version__", "buffer", "dim_data"):
        if key not in d:
            raise ProtocolError(f"__distarray__ dict has no {key!r} key")
    version = str(d["__version__"])
    if version.split(".")[0] != "0":
        raise ProtocolError(f"__distarray__['__version__'] = {version!r}: dlpart reads 0.x")
    return _core.from_dlpack(np.asarray(d["buffer"])), d["dim_data"]


def describe(array: Any, rank: int, nprocs: int) -> Dict[str, Any]:
    """The ``__distarray__`` dict of this process's share of ``array`` (a `PartitionedArray`):
    block dimensions over a process grid that is the partition grid, partition ``f`` (C order)
    on rank ``f`` alone."""
    buffer, dims = _core._distarray_describe(array._core, rank, nprocs)
    return {"__version__": VERSION, "buffer": np.from_dlpack(buffer), "dim_data": dims}
