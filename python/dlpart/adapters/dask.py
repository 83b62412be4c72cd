"""Dask arrays on a ``distributed`` cluster <-> dlpart, with futures as the handles.

A produced dict's ``data`` are `distributed.Future`s of the persisted chunks, its ``location``
lists, for every worker holding a chunk, ``(worker host, worker pid, device)``, and its ``get``
is the module-level `gather`, so the dict pickles. A consumer resolves only the chunks it
needs, through ``get``.
"""

import os
import uuid
from typing import Any, Dict, List, Optional

import dask.array as da
import distributed
import numpy as np
from distributed.comm import get_address_host

from .. import Device, PartitionedArray
from .. import from_partitioned as _import
from .._types import PartitionedDict
from ._host import host_array

__all__ = ["DaskPartitioned", "from_partitioned", "gather", "partitioned_dict"]


def gather(handles: Any) -> Any:
    """Resolves a future, or a list of futures in one ``gather``: the ``get`` of produced dicts.

    Futures unpickled outside a client's context have no client; they are bound to the
    current one (`distributed.get_client`).
    """
    single = not isinstance(handles, (list, tuple))
    futures = [handles] if single else list(handles)
    if not futures:
        return []
    client = next((f.client for f in futures if f.client is not None), None)
    if client is None:
        client = distributed.get_client()
    for f in futures:
        if f.client is None:
            f.bind_client(client)
    out = client.gather(futures)
    return out[0] if single else out


def _device_of(chunk) -> str:
    """Runs on the worker holding ``chunk``: its DLPack device, as a draft-2 device string."""
    return str(Device.from_dlpack(tuple(int(v) for v in chunk.__dlpack_device__())))


def _dtype_of(chunk) -> str:
    return str(chunk.dtype)


def _chunk_devices(client, futures) -> List[str]:
    """The device of each chunk, asked of the workers that hold them (no data moves)."""
    return client.gather(client.map(_device_of, futures, pure=False))


def _key_at(keys, pos):
    for i in pos:
        keys = keys[i]
    return keys[0] if isinstance(keys, list) else keys  # a 0-d array's keys are [key]


def partitioned_dict(x: da.Array, client: Optional[distributed.Client] = None) -> PartitionedDict:
    """Persists ``x`` on the cluster and describes its chunks as a draft-2 ``__partitioned__``.

    Each entry also carries ``'dtype'`` so that a consumer knows the element type before
    fetching anything. Chunks whose meta is a numpy array are on ``kDLCPU``; for other chunk
    types (CuPy) the workers are asked for each chunk's DLPack device.

    The futures in the dict keep the chunks on the cluster. A pickled copy's futures do not:
    keep the original dict alive while a copy is in use, or the scheduler may release the chunks
    and the copy's ``get`` waits for data that no longer exists.
    """
    client = client or distributed.get_client()
    x = client.persist(x)
    futures = {f.key: f for f in distributed.futures_of(x)}
    distributed.wait(list(futures.values()))
    if any(np.isnan(c) for cs in x.chunks for c in cs):
        x = x.compute_chunk_sizes()
    keys = x.__dask_keys__()
    positions = list(np.ndindex(*x.numblocks))
    ordered = [futures[_key_at(keys, pos)] for pos in positions]
    who = client.who_has(ordered)
    workers = sorted({w for f in ordered for w in who[f.key]})
    pids = client.run(os.getpid, workers=workers) if workers else {}
    if isinstance(x._meta, np.ndarray):
        devices = ["kDLCPU"] * len(ordered)
    else:
        devices = _chunk_devices(client, ordered)
    offsets = [np.concatenate([[0], np.cumsum(c)]).astype(int).tolist() for c in x.chunks]
    parts = {}
    for pos, f, dev in zip(positions, ordered, devices):
        parts[pos] = {
            "start": tuple(offsets[a][i] for a, i in enumerate(pos)),
            "shape": tuple(int(x.chunks[a][i]) for a, i in enumerate(pos)),
            "data": f,
            "location": [(get_address_host(w), int(pids[w]), dev) for w in sorted(who[f.key])],
            "dtype": str(x.dtype),
        }
    return {
        "shape": tuple(int(n) for n in x.shape),
        "partition_tiling": tuple(x.numblocks),
        "partitions": parts,
        "get": gather,
    }


class DaskPartitioned:
    """A dask array that exposes ``__partitioned__`` (persisted on first access, then cached:
    the dict's futures keep the chunks on the cluster while this wrapper lives)."""

    def __init__(self, x: da.Array, client: Optional[distributed.Client] = None):
        self.array = x
        self.client = client
        self._dict: Optional[dict] = None

    @property
    def __partitioned__(self) -> PartitionedDict:
        if self._dict is None:
            self._dict = partitioned_dict(self.array, self.client)
        return self._dict


def from_partitioned(obj: Any, client: Optional[distributed.Client] = None) -> da.Array:
    """A dask array with one chunk per partition of a `PartitionedArray` (or anything
    `dlpart.from_partitioned` takes).

    Partitions still held as futures stay futures: nothing is gathered. Partitions with data
    here become numpy views of it (no copy) embedded in the graph, or, with a ``client``, are
    scattered to its workers.
    """
    pa: PartitionedArray = _import(obj)
    parts = pa.partitions
    positions = list(np.ndindex(*pa.tiling))
    futures: Dict[tuple, distributed.Future] = {
        pos: parts[pos].handle for pos in positions
        if parts[pos].tensor is None and isinstance(parts[pos].handle, distributed.Future)
    }
    local = [pos for pos in positions if pos not in futures]
    pa.fetch(local)
    why = "the dask adapter wraps host partitions as numpy arrays"
    arrays = {pos: host_array(parts[pos].tensor, pos, why) for pos in local}
    if client is not None and local:
        futures.update(zip(local, client.scatter([arrays.pop(pos) for pos in local])))
    dtype = pa.dtype
    if dtype is None and futures:
        f = next(iter(futures.values()))
        dtype = (f.client or distributed.get_client()).submit(_dtype_of, f, pure=False).result()
    dtype = np.dtype(dtype or "float64")
    meta = np.empty((0,) * pa.ndim, dtype=dtype)
    blocks = {}
    for pos in positions:
        if pos in futures:
            blocks[pos] = da.from_delayed(futures[pos], shape=parts[pos].shape, dtype=dtype,
                                          meta=meta)
        else:
            blocks[pos] = _wrap(arrays[pos], meta)
    return da.block(_nest(blocks, pa.tiling, ()))


def _wrap(a: np.ndarray, meta) -> da.Array:
    """A one-chunk dask array whose chunk is ``a`` itself (`da.from_array` would copy it)."""
    name = f"dlpart-{uuid.uuid4().hex}"
    return da.Array({(name,) + (0,) * a.ndim: a}, name, tuple((n,) for n in a.shape), meta=meta)


def _nest(blocks, tiling, prefix):
    if len(prefix) == len(tiling):
        return blocks[prefix]
    return [_nest(blocks, tiling, prefix + (i,)) for i in range(tiling[len(prefix)])]
