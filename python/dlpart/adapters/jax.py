"""Sharded ``jax.Array`` <-> `dlpart.PartitionedArray`, shard by shard through DLPack.

Each distinct shard box becomes one partition; shards with the same box on several devices
(replicas) become one partition with one location per device. A location's ``rank`` holds the
JAX device id (``jax.Device.id``, unique across processes): DLPack device ids are per process
(``local_hardware_id``), so the JAX id is what names the device to JAX again, also on another
host. JAX 0.10 writes ``kDLCPU:<local_hardware_id>`` into the DLPack capsules of CPU devices
(while ``__dlpack_device__`` says ``kDLCPU:0``), so dlpart sees the emulated CPU devices as
distinct devices, as JAX does; locations use the capsule's form, which is what a partition's
tensor reports, and a tensor on ``kDLCPU:<k>`` goes back to CPU device ``k`` without a copy.
"""

import os
from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec, Sharding

from .. import Device, DeviceError, Location, Partition, PartitionedArray, ProtocolError, Tensor
from .. import from_dlpack, split_points
from .. import _core
from .. import from_partitioned as _import

__all__ = ["from_partitioned", "sharding_for", "to_partitioned"]

Box = Tuple[Tuple[int, ...], Tuple[int, ...]]

_KINDS = {"cpu": "kDLCPU", "cuda": "kDLCUDA", "gpu": "kDLCUDA", "rocm": "kDLROCM"}
_PLATFORMS = {"kDLCPU": "cpu", "kDLCUDA": "gpu", "kDLROCM": "gpu"}


def _dl_device(d) -> Device:
    """The DLPack device a JAX device's buffers report (also for devices of other processes)."""
    kind = _KINDS.get(d.platform)
    if kind is None:
        raise DeviceError(f"JAX device {d} (platform {d.platform!r}) has no DLPack device type")
    hw = d.local_hardware_id
    return Device(f"{kind}:{hw if hw is not None else 0}")


def _note_cpu_devices() -> None:
    """Makes JAX's host devices (``kDLCPU:<local_hardware_id>``) valid dlpart targets here."""
    try:
        cpus = jax.local_devices(backend="cpu")
    except RuntimeError:  # a JAX without its CPU backend
        return
    ids = [d.local_hardware_id for d in cpus if d.local_hardware_id is not None]
    _core._note_host_devices(max(ids, default=0) + 1)


_note_cpu_devices()


def _box(index, shape) -> Box:
    start, size = [], []
    for axis, (sl, n) in enumerate(zip(index, shape)):
        a, b, step = sl.indices(n)
        if step != 1:
            raise ProtocolError(f"JAX shard index {index} has step {step} on axis {axis}")
        start.append(a)
        size.append(max(b - a, 0))
    return tuple(start), tuple(size)


def to_partitioned(arr: jax.Array) -> PartitionedArray:
    """A sharded ``jax.Array`` as a `PartitionedArray` whose partitions alias the shards.

    Shards are imported through DLPack without copying. In a multi-process JAX program the
    shards of other processes become partitions without data, and ``locals`` lists this
    process's positions (SPMD). Its ``__partitioned__`` dict hands out JAX arrays, each on its
    shard's device over the shard's memory (the producer's framework, as for a plain
    ``jax.Array`` given to `dlpart.partition`).
    """
    shape = tuple(int(n) for n in arr.shape)
    holders: Dict[Box, List] = {}
    for d, index in arr.sharding.devices_indices_map(shape).items():
        holders.setdefault(_box(index, shape), []).append(d)
    splits = [sorted({start[a] for start, _ in holders}) + [shape[a]] for a in range(len(shape))]
    entries = []
    for start, size in holders:
        pos = tuple(splits[a].index(start[a]) for a in range(len(shape)))
        entries.append((pos, start, size))
    # Checked again with every box by the constructor below: a gap or an overlap between
    # shards makes a box that differs from what these split points give.
    splits = split_points(shape, splits=splits)
    shards = {s.device: s for s in arr.addressable_shards}
    me = Location.here("kDLCPU")
    parts = {}
    try:
        for pos, start, size in entries:
            devices = sorted(holders[(start, size)], key=lambda d: d.id)
            local = sorted((shards[d] for d in devices if d in shards),
                           key=lambda s: (s.replica_id != 0, s.device.id))
            tensor = from_dlpack(local[0].data) if local else None
            locations = []
            for d in devices:
                dev = tensor.device if local and d == local[0].device else _dl_device(d)
                if d in shards:
                    locations.append(Location(me.host, me.pid, dev, rank=d.id))
                else:
                    locations.append(Location(None, None, dev, rank=d.id))
            parts[pos] = Partition(pos, start, size, locations, tensor)
    except BaseException:
        # the traceback keeps this frame alive: let go of the shards taken so far
        parts.clear()
        tensor = None  # noqa: F841
        raise
    local_positions = None
    if not arr.is_fully_addressable:
        local_positions = [pos for pos, p in parts.items() if p.tensor is not None]
    dtype = None if any(p.tensor is not None for p in parts.values()) else str(arr.dtype)
    pa = PartitionedArray(shape, splits, parts, dtype=dtype, locals=local_positions)
    pa._framework = "jax"  # the producer's: its dict hands out JAX arrays, as for plain ones
    return pa


def _jax_device_of(loc: Location, by_id):
    """The JAX device a location names, if the location came from this process's JAX."""
    if loc.rank is None or loc.pid != os.getpid():
        return None
    d = by_id.get(loc.rank)
    return d if d is not None and _dl_device(d) == loc.device else None


def _pool(kind: str) -> list:
    try:
        return jax.devices(_PLATFORMS.get(kind, None))
    except RuntimeError:
        return jax.devices()


# `devices` holds jax.Device objects, typed Any: jaxlib defines that class in compiled code
# whose type pyright cannot read.
def sharding_for(pa: PartitionedArray, devices: Optional[Sequence[Any]] = None) -> NamedSharding:
    """The `NamedSharding` that reproduces ``pa``'s grid: one mesh axis ``a<i>`` per array axis
    (its size the tiling), plus an axis ``replica`` when every partition has the same number
    (> 1) of replicas on distinct JAX devices.

    Each partition goes to the JAX device its location names (the one holding its data, so
    the import is zero-copy); when locations name none, to ``devices`` (default: JAX's devices
    of the data's platform) in C order of positions. JAX needs every axis split evenly.
    """
    tiling = pa.tiling
    for axis, (n, s) in enumerate(zip(pa.shape, pa.splits)):
        k = len(s) - 1
        if n % k or any(b != i * (n // k) for i, b in enumerate(s)):
            raise ValueError(
                f"JAX shards every axis evenly: axis {axis} of length {n} is split at {list(s)}; "
                f"repartition to a tiling that divides {tuple(pa.shape)} or pass a sharding"
            )
    positions = sorted(pa.partitions)
    n = len(positions)
    by_id = {d.id: d for d in jax.devices()}
    chosen = []
    for pos in positions:
        p = pa.partitions[pos]
        named = [_jax_device_of(loc, by_id) for loc in p.locations]
        chosen.append([d for d in named if d is not None])
    replicas = len(chosen[0]) if chosen else 0
    flat = [d for ds in chosen for d in ds]
    names = tuple(f"a{i}" for i in range(len(tiling)))
    if devices is None and replicas > 0 and all(len(ds) == replicas for ds in chosen) \
            and len(set(flat)) == len(flat):
        grid = np.empty(n * replicas, dtype=object)
        grid[:] = flat
        if replicas > 1:
            return NamedSharding(Mesh(grid.reshape(tuple(tiling) + (replicas,)),
                                      names + ("replica",)), PartitionSpec(*names))
        return NamedSharding(Mesh(grid.reshape(tiling), names), PartitionSpec(*names))
    if devices is None:
        kinds = [p.device.kind for p in pa.partitions.values() if p.device is not None]
        devices = _pool(kinds[0] if kinds else "kDLCPU")
    if len(devices) < n:
        raise ValueError(
            f"a grid of tiling {tuple(tiling)} needs {n} JAX devices, found {len(devices)}: "
            "repartition to fewer partitions or pass a sharding"
        )
    grid = np.empty(n, dtype=object)
    grid[:] = list(devices)[:n]
    return NamedSharding(Mesh(grid.reshape(tiling), names), PartitionSpec(*names))


def _sharding(pa: PartitionedArray, mesh_or_sharding) -> Sharding:
    if mesh_or_sharding is None:
        return sharding_for(pa)
    if isinstance(mesh_or_sharding, Mesh):
        # array axis i is split over mesh axis i; extra mesh axes hold replicas
        names = list(mesh_or_sharding.axis_names)[: pa.ndim]
        return NamedSharding(mesh_or_sharding, PartitionSpec(*names))
    if isinstance(mesh_or_sharding, Sharding):
        return mesh_or_sharding
    raise TypeError(f"expected a jax Mesh or Sharding, found {type(mesh_or_sharding).__name__}")


def _place(t: Tensor, d) -> "jax.Array":
    """The tensor as a single-device JAX array on ``d``: zero-copy when it already lives there,
    is C-contiguous and 64-byte aligned (else JAX, or dlpart for strided views, copies)."""
    if not t.is_contiguous:
        t = t.copy()  # JAX imports only compact strides
    try:
        return jnp.from_dlpack(t, device=d)
    except BufferError:
        # JAX asks for the legacy capsule, which dlpart refuses for read-only data.
        if t.device.kind != "kDLCPU":
            raise
        return jax.device_put(np.from_dlpack(t), d)


def from_partitioned(obj: Any, mesh_or_sharding: Union[Mesh, Sharding, None] = None) -> jax.Array:
    """A `PartitionedArray` (or anything `dlpart.from_partitioned` takes) as a sharded JAX array.

    Without ``mesh_or_sharding`` the sharding is `sharding_for` the grid. With a ``Mesh``, array
    axis ``i`` is split over mesh axis ``i``. When the sharding's boxes differ from the grid,
    the partitions are first repartitioned by dlpart to match (moving data between devices).
    64-bit element types follow JAX's ``jax_enable_x64``: without it JAX converts them to
    32 bits (a copy).
    """
    pa = _import(obj)
    sharding = _sharding(pa, mesh_or_sharding)
    shape = pa.shape
    here_map = sharding.addressable_devices_indices_map(shape)
    wanted = {d: _box(idx, shape) for d, idx in here_map.items()}
    by_box = {(p.start, p.shape): p for p in pa.partitions.values()}
    if any(b not in by_box for b in wanted.values()):
        boxes = [_box(idx, shape) for idx in sharding.devices_indices_map(shape).values()]
        splits = [sorted({start[a] for start, _ in boxes}) + [shape[a]] for a in range(len(shape))]
        pa = pa.repartition(splits=splits, transfer=True)
        by_box = {(p.start, p.shape): p for p in pa.partitions.values()}
    pa.fetch(sorted({by_box[b].position for b in wanted.values()}))
    arrays = []
    for d, b in wanted.items():
        t = by_box[b].tensor
        if t is None:
            raise ValueError(f"partition {by_box[b].position} for JAX device {d} has no data here")
        arrays.append(_place(t, d))
    return jax.make_array_from_single_device_arrays(shape, sharding, arrays)
