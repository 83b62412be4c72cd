"""The Distributed Array Protocol (``__distarray__``, version 0.10): reading a process's local
buffer and dimension dictionaries as dlpart partitions, and describing dlpart arrays in it.

A DAP array gives each process one buffer and, per axis, how the buffer's indices map to global
ones: a block (``'b'``: ``start``/``stop``, with optional ``padding``), cyclic blocks (``'c'``:
``start`` and ``block_size``, dealt round-robin over the process grid) or an explicit index list
(``'u'``). dlpart reads each axis as runs of contiguous global indices held contiguously in the
buffer, and each combination of one run per axis becomes a partition: a view of the buffer
(no copy), placed at its global start. Communication padding (the indices a block shares with
its neighbour) is left out, boundary padding is part of the array, as the protocol counts them.
"""

from __future__ import annotations

import itertools
from typing import Any, Dict, List, Sequence, Tuple

import numpy as np

from ._core import ProtocolError

VERSION = "0.10.0"

# (global start, local start, length) of one run of an axis.
Run = Tuple[int, int, int]


def _read(obj: Any) -> Dict[str, Any]:
    """The DAP dict of ``obj`` (an object with ``__distarray__``, or the dict itself)."""
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
    return d


def _int(dim: dict, key: str, axis: int, default: Any = None) -> int:
    v = dim.get(key, default)
    if v is None:
        raise ProtocolError(f"__distarray__ dim_data[{axis}] ({dim.get('dist_type')!r}) has no "
                            f"{key!r}")
    if isinstance(v, (bool, np.bool_)) or not isinstance(v, (int, np.integer)):
        raise ProtocolError(f"__distarray__ dim_data[{axis}][{key!r}] = {v!r}: not an integer")
    return int(v)


def _runs(dim: dict, axis: int, extent: int) -> Tuple[List[Run], int, int, int]:
    """The runs of one axis, its global size, and the process grid's size and this process's
    rank along it. ``extent`` is the buffer's length along the axis."""
    if not isinstance(dim, dict):
        raise ProtocolError(f"__distarray__ dim_data[{axis}] is a {type(dim).__name__}, not a dict")
    kind = dim.get("dist_type")
    size = _int(dim, "size", axis)
    grid = _int(dim, "proc_grid_size", axis, 1)
    rank = _int(dim, "proc_grid_rank", axis, 0)
    if size < 0 or grid < 1 or not 0 <= rank < grid:
        raise ProtocolError(f"__distarray__ dim_data[{axis}]: size {size}, proc_grid_size "
                            f"{grid}, proc_grid_rank {rank}")
    where = f"__distarray__ dim_data[{axis}] ({kind!r})"
    if kind == "b":
        start, stop = _int(dim, "start", axis), _int(dim, "stop", axis)
        if not 0 <= start <= stop <= size or stop - start != extent:
            raise ProtocolError(f"{where}: start {start}, stop {stop} for size {size} and a "
                                f"buffer of {extent} along the axis")
        pad = dim.get("padding", (0, 0))
        try:
            left, right = (int(p) for p in pad)
        except (TypeError, ValueError):
            raise ProtocolError(f"{where}: padding {pad!r} is not a pair of integers") from None
        # Boundary padding (at the ends of the grid) is part of the array; communication
        # padding is a neighbour's indices.
        left = left if rank > 0 else 0
        right = right if rank < grid - 1 else 0
        if left < 0 or right < 0 or left + right > extent:
            raise ProtocolError(f"{where}: padding {tuple(pad)} on a block of {extent}")
        n = extent - left - right
        return ([(start + left, left, n)] if n else []), size, grid, rank
    if kind == "c":
        start = _int(dim, "start", axis)
        block = _int(dim, "block_size", axis, 1)
        if block < 1 or start < 0:
            raise ProtocolError(f"{where}: start {start}, block_size {block}")
        runs: List[Run] = []
        at, local = start, 0
        while at < size:
            n = min(block, size - at)
            runs.append((at, local, n))
            at, local = at + grid * block, local + n
        if local != extent:
            raise ProtocolError(f"{where}: start {start}, block_size {block} over {grid} "
                                f"processes give {local} of {size} indices here, the buffer "
                                f"holds {extent}")
        return runs, size, grid, rank
    if kind == "u":
        indices = np.asarray(dim.get("indices", ()), dtype=np.int64).reshape(-1)
        if len(indices) != extent:
            raise ProtocolError(f"{where}: {len(indices)} indices for a buffer of {extent}")
        if len(indices) and (indices.min() < 0 or indices.max() >= size):
            raise ProtocolError(f"{where}: indices outside [0, {size}) (dlpart reads global "
                                f"indices of the array, without wrapping)")
        # A run ends wherever the next index is not one more than this one.
        cuts = (np.flatnonzero(np.diff(indices) != 1) + 1).tolist()
        firsts = [0, *cuts] if len(indices) else []
        ends = [*cuts, len(indices)]
        runs = [(int(indices[i]), i, end - i) for i, end in zip(firsts, ends)]
        return runs, size, grid, rank
    raise ProtocolError(f"__distarray__ dim_data[{axis}]['dist_type'] = {kind!r}: dlpart reads "
                        f"'b', 'c' and 'u'")


def parts(obj: Any, rank: int, nprocs: int) -> Tuple[List[Tuple[Tuple[int, ...], Any]],
                                                      Tuple[int, ...]]:
    """This process's partitions of a DAP array, ``(global start, view of the buffer)`` pairs,
    and the global shape. ``rank`` and ``nprocs``: this process's rank and the number of
    processes, which the dimension dictionaries' process grid must match."""
    d = _read(obj)
    buffer = np.asarray(d["buffer"])
    dims = d["dim_data"]
    if not isinstance(dims, (list, tuple)):
        raise ProtocolError(f"__distarray__ dim_data is a {type(dims).__name__}, not a tuple")
    if len(dims) != buffer.ndim:
        raise ProtocolError(f"__distarray__ dim_data has {len(dims)} entries for a "
                            f"{buffer.ndim}-d buffer")
    axes = [_runs(dim, axis, buffer.shape[axis]) for axis, dim in enumerate(dims)]
    grid = [g for _, _, g, _ in axes]
    coords = [r for _, _, _, r in axes]
    if int(np.prod(grid, dtype=object)) != nprocs:
        raise ProtocolError(f"__distarray__: a process grid of {tuple(grid)} for {nprocs} "
                            f"process{'es' if nprocs != 1 else ''}")
    at = int(np.ravel_multi_index(coords, grid)) if grid else 0
    if at != rank:
        raise ProtocolError(f"__distarray__: process grid rank {tuple(coords)} is rank {at} in "
                            f"C order, but this process is rank {rank}")
    out = []
    for combo in itertools.product(*(runs for runs, _, _, _ in axes)):
        start = tuple(g for g, _, _ in combo)
        view = buffer[tuple(slice(l, l + n) for _, l, n in combo)]
        out.append((start, view))
    return out, tuple(size for _, size, _, _ in axes)


def partitioned_dict(placed: Sequence[Tuple[Tuple[int, ...], Any]],
                     shape: Sequence[int]) -> Dict[str, Any]:
    """A one-process ``__partitioned__`` dict over ``placed`` boxes, their split points the
    union of the boxes' edges (the boxes must then be the grid's cells)."""
    ndim = len(shape)
    splits = []
    for axis in range(ndim):
        edges = {0, shape[axis]}
        for start, view in placed:
            edges.update((start[axis], start[axis] + view.shape[axis]))
        splits.append(sorted(edges))
    slab = [{edge: i for i, edge in enumerate(points)} for points in splits]
    partitions = {}
    for start, view in placed:
        pos = tuple(slab[a][start[a]] for a in range(ndim))
        partitions[pos] = {"start": start, "shape": tuple(view.shape), "data": view,
                           "location": []}
    return {"shape": tuple(shape), "partition_tiling": tuple(len(s) - 1 for s in splits),
            "partitions": partitions}


def describe(array: Any, rank: int, nprocs: int, owners: List[List[int]]) -> Dict[str, Any]:
    """The ``__distarray__`` dict of this process's share of ``array``: block dimensions over a
    process grid that is the partition grid, partition ``f`` (C order) on rank ``f`` alone.
    ``owners``: each partition's ranks, in C order."""
    tiling = tuple(array.tiling)
    hint = ("; assemble() makes one" if nprocs == 1
            else "; repartition it to one partition per process first")
    count = int(np.prod(tiling, dtype=object))
    if count != nprocs:
        raise ProtocolError(f"__distarray__ gives each process one buffer: a grid of tiling "
                            f"{tiling} over {nprocs} process{'es' if nprocs != 1 else ''}{hint}")
    for f, ranks in enumerate(owners):
        if ranks != [f]:
            raise ProtocolError(f"__distarray__ places partition {f} (C order) on rank {f} "
                                f"alone, as its process grid does; it is on ranks {ranks}{hint}")
    held = array.partitions[tuple(int(i) for i in np.unravel_index(rank, tiling))]
    if held.tensor is None:
        raise ProtocolError(f"__distarray__: rank {rank} holds no data for its partition")
    t = held.tensor
    if t.device.kind != "kDLCPU":
        raise ProtocolError(f"__distarray__ buffers are host memory (PEP 3118): partition "
                            f"{held.position} is on {t.device}; move it with .to('cpu') first")
    dims = tuple(
        {"dist_type": "b", "size": int(array.shape[a]), "proc_grid_size": tiling[a],
         "proc_grid_rank": held.position[a], "start": held.start[a],
         "stop": held.start[a] + held.shape[a], "padding": (0, 0)}
        for a in range(array.ndim))
    return {"__version__": VERSION, "buffer": np.from_dlpack(t), "dim_data": dims}
