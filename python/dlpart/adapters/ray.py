"""Ray ObjectRefs as the handles of partitions.

Locations say what Ray knows: one ``(node ip, pid, 'kDLCPU')`` per node whose object store
holds a copy (Ray's object store is host shared memory, readable by every process of that
node). The pid is that of the process that *owns* the ref (created it with ``ray.put`` or
submitted the task returning it, and keeps it alive), given on the owner's node when the owner
is this process; Ray does not expose the pid of other owners, so there it is -1.

Ray frees an object once its owner holds no ref to it that Ray tracks; refs inside a dict
pickled with plain `pickle` are not tracked, so the producer must keep its dict (or the refs)
while a pickled copy is in use, or ``get`` on the copy waits for an object that is gone.
"""

import itertools
import os
from typing import Any, Dict, Mapping, Optional, Sequence, Tuple

import ray

from .. import PartitionedArray, split_points
from .. import from_partitioned as _import
from .._types import PartitionedDict, SplitsLike
from ._host import host_array

__all__ = ["get", "partitioned_dict", "partitioned_dict_from_refs", "to_refs"]

Position = Tuple[int, ...]


def get(handles: Any) -> Any:
    """Resolves an ObjectRef, or a list of them in one ``ray.get``: the ``get`` of produced
    dicts."""
    if isinstance(handles, (list, tuple)):
        return ray.get(list(handles))
    return ray.get(handles)


def _owner(ref) -> Tuple[Optional[str], int]:
    """The owner's node ip, and its pid if the owner is this process (else -1)."""
    try:
        from ray.core.generated.common_pb2 import Address

        owner = Address.FromString(ref.owner_address())
    except Exception:  # noqa: BLE001 - a Ray without this message: the owner is unknown
        return None, -1
    mine = owner.worker_id.hex() == ray.get_runtime_context().get_worker_id()
    return owner.ip_address or None, (os.getpid() if mine else -1)


def _object_locations(refs: Sequence) -> dict:
    """`ray.experimental.get_object_locations`, one owner and at most 1000 refs per call:
    a call that sends several requests can complete its promise twice and abort the process
    (ray-project/ray#65523)."""
    groups: Dict[bytes, list] = {}
    for ref in refs:
        groups.setdefault(ref.owner_address(), []).append(ref)
    found = {}
    for group in groups.values():
        for i in range(0, len(group), 1000):
            batch = group[i:i + 1000]
            found.update(ray.experimental.get_object_locations(batch, timeout_ms=60_000))
    return found


def _locations(refs: Sequence) -> list:
    ray.wait(list(refs), num_returns=len(refs), fetch_local=False)
    found = _object_locations(refs)
    ips = {n["NodeID"]: n["NodeManagerAddress"] for n in ray.nodes()}
    out = []
    for ref in refs:
        owner_ip, pid = _owner(ref)
        hosts = [ips[n] for n in found.get(ref, {}).get("node_ids", []) if n in ips]
        if not hosts and owner_ip is not None:
            hosts = [owner_ip]  # in the owner's memory store only (a small object)
        out.append([(h, pid if h == owner_ip else -1, "kDLCPU") for h in hosts])
    return out


def _positions(refs, tiling) -> Dict[Position, object]:
    if isinstance(refs, Mapping):
        return {tuple(int(i) for i in pos): r for pos, r in refs.items()}
    flat = list(refs)
    if tiling is not None and all(not isinstance(r, (list, tuple)) for r in flat):
        grid = list(itertools.product(*(range(n) for n in tiling)))
        if len(grid) != len(flat):
            raise ValueError(f"{len(flat)} refs for a grid of tiling {tuple(tiling)}")
        return dict(zip(grid, flat))
    out = {}

    def walk(node, prefix):
        if isinstance(node, (list, tuple)):
            for i, child in enumerate(node):
                walk(child, prefix + (i,))
        else:
            out[prefix] = node

    walk(refs, ())
    return out


def partitioned_dict_from_refs(refs: Any, shape: Sequence[int], *,
                               tiling: Optional[Sequence[int]] = None,
                               splits: Optional[SplitsLike] = None,
                               dtype: Optional[str] = None) -> PartitionedDict:
    """A draft-2 ``__partitioned__`` dict over ObjectRefs of array blocks.

    ``refs``: a dict position -> ref, nested lists (one level per axis), or a flat list in C
    order of positions with ``tiling``. The grid is ``splits`` (split points per axis) or the
    even ``tiling`` (like `numpy.array_split`; default: the nesting of ``refs``). Waits until
    the refs exist, so that their locations are known. ``dtype`` is added to each entry.
    """
    shape = tuple(int(n) for n in shape)
    by_pos = _positions(refs, tiling)
    bad = next((pos for pos in by_pos if len(pos) != len(shape)), None)
    if bad is not None:
        raise ValueError(
            f"a ref at position {bad} of a {len(shape)}-d array of shape {shape}: give a dict "
            f"of {len(shape)}-d positions, lists nested {len(shape)} deep, or a flat list "
            f"with tiling="
        )
    if splits is not None:
        splits = split_points(list(shape), splits=[list(s) for s in splits])
    else:
        if tiling is None:
            tiling = [max(p[a] for p in by_pos) + 1 for a in range(len(shape))]
        splits = split_points(list(shape), list(tiling))
    grid = list(itertools.product(*(range(len(s) - 1) for s in splits)))
    if sorted(by_pos) != grid:
        raise ValueError(
            f"refs at positions {sorted(by_pos)} do not fill the grid of tiling "
            f"{tuple(len(s) - 1 for s in splits)}"
        )
    locations = _locations([by_pos[pos] for pos in grid])
    parts = {}
    for pos, loc in zip(grid, locations):
        entry = {
            "start": tuple(splits[a][i] for a, i in enumerate(pos)),
            "shape": tuple(splits[a][i + 1] - splits[a][i] for a, i in enumerate(pos)),
            "data": by_pos[pos],
            "location": loc,
        }
        if dtype is not None:
            entry["dtype"] = str(dtype)
        parts[pos] = entry
    return {
        "shape": shape,
        "partition_tiling": tuple(len(s) - 1 for s in splits),
        "partitions": parts,
        "get": get,
    }


def to_refs(obj: Any) -> Dict[Position, "ray.ObjectRef[Any]"]:
    """Puts every partition of a `PartitionedArray` (or anything `dlpart.from_partitioned`
    takes) into the object store; partitions still held as ObjectRefs are passed on as they
    are, without a round trip through this process."""
    pa: PartitionedArray = _import(obj)
    parts = pa.partitions
    out = {}
    local = []
    for pos in sorted(parts):
        p = parts[pos]
        if p.tensor is None and isinstance(p.handle, ray.ObjectRef):
            out[pos] = p.handle
        else:
            local.append(pos)
    pa.fetch(local)
    for pos in local:
        why = "Ray's object store holds host memory"
        out[pos] = ray.put(host_array(parts[pos].tensor, pos, why))
    return dict(sorted(out.items()))


def partitioned_dict(obj: Any) -> PartitionedDict:
    """`to_refs`, described as a draft-2 dict with the same grid."""
    pa: PartitionedArray = _import(obj)
    return partitioned_dict_from_refs(to_refs(pa), pa.shape, splits=pa.splits, dtype=pa.dtype)
