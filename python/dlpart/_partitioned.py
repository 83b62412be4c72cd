"""`PartitionedArray`: the `__partitioned__` protocol, produced and consumed."""

import itertools
from typing import Any, Callable, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple

from . import _core
from ._core import Device, DeviceError, ProtocolError, Tensor
from ._location import Location, framework_device, here, normalise

Position = Tuple[int, ...]

__all__ = ["Partition", "PartitionedArray", "from_partitioned", "get", "partition", "validate"]


def get(handles):
    """The ``get`` of dicts that dlpart produces: resolves a handle, or a sequence of them.

    dlpart tensors and ``None`` resolve to themselves; Dask futures through their client; Ray
    ObjectRefs through ``ray.get``. A module-level function, so the dict pickles.
    """
    if isinstance(handles, (list, tuple)):
        return [_resolve(h) for h in handles]
    return _resolve(handles)


def _resolve(h):
    if h is None or isinstance(h, Tensor) or hasattr(h, "__dlpack__"):
        return h
    kind = type(h).__module__.split(".")[0]
    if kind == "distributed":
        return h.result()
    if kind == "ray":
        import ray

        return ray.get(h)
    raise TypeError(f"dlpart.get cannot resolve a handle of type {type(h).__name__}")


class Partition:
    """One box of the grid: its position, start, shape, data (or a handle to it) and locations."""

    __slots__ = ("position", "start", "shape", "locations", "_tensor", "_handle", "_namespace")

    def __init__(self, position, start, shape, locations=(), tensor=None, handle=None):
        self.position: Position = tuple(position)
        self.start: Tuple[int, ...] = tuple(start)
        self.shape: Tuple[int, ...] = tuple(shape)
        self.locations: Tuple[Location, ...] = tuple(locations)
        self._tensor: Optional[Tensor] = tensor
        self._handle = handle
        self._namespace = None  # the producer's array-API namespace, for non-native devices

    @property
    def tensor(self) -> Optional[Tensor]:
        """The data as a dlpart tensor (None for another rank's partition, or an unfetched
        handle: see `PartitionedArray.fetch`)."""
        return self._tensor

    @property
    def handle(self):
        """The producer's handle (a Dask future, a Ray ObjectRef), if the data is not here yet."""
        return self._handle

    @property
    def device(self) -> Optional[Device]:
        if self._tensor is not None:
            return self._tensor.device
        return self.locations[0].device if self.locations else None

    def __repr__(self) -> str:
        what = "tensor" if self._tensor is not None else ("handle" if self._handle is not None else "None")
        return (
            f"Partition(position={self.position}, start={self.start}, shape={self.shape}, "
            f"data={what}, locations={list(self.locations)})"
        )


class PartitionedArray:
    """A logical n-d array cut into a rectilinear grid of partitions, each a DLPack tensor on
    some device (or a handle to one, or nothing for another rank's partition in SPMD mode)."""

    def __init__(self, shape, splits, partitions: Mapping[Position, Partition], *, dtype=None,
                 locals=None, get=None):
        self._shape = tuple(int(n) for n in shape)
        self._splits = tuple(tuple(s) for s in splits)
        self._partitions: Optional[Dict[Position, Partition]] = dict(partitions)
        self._lazy = None
        self._locals = None if locals is None else [tuple(p) for p in locals]
        self._get = get
        self._dtype = dtype
        try:
            self._check_data()
        except BaseException:
            self._partitions = {}  # a traceback keeps `self` alive: let go of the tensors now
            raise

    @classmethod
    def _of_tensors(cls, shape, splits, tensors: List[Tensor], devices: Sequence[Device],
                    dtype) -> "PartitionedArray":
        """An array over ``splits`` whose partitions are ``tensors`` (C order) on ``devices``,
        all made by dlpart for exactly these boxes, so unchecked. The `Partition` objects are
        built on first use: for grids of tens of thousands of small partitions they would cost
        more than the copy that made the tensors."""
        self = cls.__new__(cls)
        self._shape = tuple(shape)
        self._splits = tuple(tuple(s) for s in splits)
        self._partitions = None
        self._lazy = (list(tensors), list(devices))
        self._locals = None
        self._get = None
        self._dtype = dtype
        return self

    def _parts(self) -> Dict[Position, Partition]:
        if self._partitions is None:
            tensors, devices = self._lazy
            self._partitions = _partitions_of(self._splits, tensors, devices)
            self._lazy = None
        return self._partitions

    def _check_data(self):
        """Invariants 6, 7 and 9 of the grid (see the Rust `grid` module) for the data held."""
        # Raised here rather than in the loop: a traceback keeps the raising frame's locals
        # (a tensor) alive for as long as the caller holds the error.
        problem = self._data_problem()
        if problem is not None:
            raise ProtocolError(problem)

    def _data_problem(self) -> Optional[str]:
        for p in self._parts().values():
            t = p._tensor
            if t is None:
                continue
            if t.shape != p.shape:
                return (
                    f"__partitioned__['partitions'] at position {p.position}: data of shape "
                    f"{t.shape} for an entry of shape {p.shape} (grid invariant 7)"
                )
            if self._dtype is None:
                self._dtype = t.dtype
            elif t.dtype != self._dtype:
                return (
                    f"__partitioned__['partitions'] at position {p.position}: dtype {t.dtype} "
                    f"differs from {self._dtype} (grid invariant 6)"
                )
        return None

    # -- the model -----------------------------------------------------------------------------
    @property
    def shape(self) -> Tuple[int, ...]:
        return self._shape

    @property
    def ndim(self) -> int:
        return len(self._shape)

    @property
    def dtype(self) -> Optional[str]:
        """The element type, as a name like ``'float32'`` (None until some data is here)."""
        return self._dtype

    @property
    def tiling(self) -> Tuple[int, ...]:
        return tuple(len(s) - 1 for s in self._splits)

    @property
    def splits(self) -> Tuple[Tuple[int, ...], ...]:
        """Per axis, the split points ``0 = b0 <= b1 <= ... <= bk = shape[axis]``."""
        return self._splits

    @property
    def partitions(self) -> Mapping[Position, Partition]:
        return self._parts()

    @property
    def locals(self) -> Optional[List[Position]]:
        """The positions this rank owns (SPMD), or None when not SPMD."""
        return None if self._locals is None else list(self._locals)

    @property
    def devices(self) -> List[Device]:
        """The distinct devices the partitions live on, in order of first appearance."""
        seen = []
        if self._lazy is not None:
            return list(dict.fromkeys(self._lazy[1]))
        for p in self._parts().values():
            d = p.device
            if d is not None and d not in seen:
                seen.append(d)
        return seen

    def __repr__(self) -> str:
        return (
            f"dlpart.PartitionedArray(shape={self._shape}, dtype={self._dtype!r}, "
            f"tiling={self.tiling}, devices={[str(d) for d in self.devices]})"
        )

    # -- producing -----------------------------------------------------------------------------
    @property
    def __partitioned__(self) -> dict:
        """The draft-2 ``__partitioned__`` dict. It pickles: tensors by value, handles as handles."""
        parts = {}
        for pos, p in self._parts().items():
            data = p._tensor if p._tensor is not None else p._handle
            locs = p.locations or ((here(p._tensor.device),) if p._tensor is not None else ())
            parts[pos] = {
                "start": p.start,
                "shape": p.shape,
                "data": data,
                "location": [loc.to_tuple() for loc in locs],
            }
        d = {
            "shape": self._shape,
            "partition_tiling": self.tiling,
            "partitions": parts,
            "get": get,
        }
        if self._locals is not None:
            d["locals"] = list(self._locals)
        return d

    # -- handles ---------------------------------------------------------------------------------
    def fetch(self, positions: Optional[Iterable[Position]] = None) -> "PartitionedArray":
        """Resolves the handles of ``positions`` (default: all) through ``get`` in one call and
        imports their data through DLPack. Returns self."""
        if self._lazy is not None:
            return self  # every partition holds a tensor
        parts = self._parts()
        wanted = [parts[tuple(p)] for p in positions] if positions is not None else list(
            parts.values())
        pending = [p for p in wanted if p._tensor is None and p._handle is not None]
        if not pending:
            return self
        getter = self._get or get
        raw = getter([p._handle for p in pending])
        if not isinstance(raw, (list, tuple)) or len(raw) != len(pending):
            raw = [getter(p._handle) for p in pending]
        imported = []
        try:
            for p, obj in zip(pending, raw):
                imported.append(_import_data(obj, p.position, None, None))
            new = dict(zip((p.position for p in pending), imported))
            dtype = self._dtype  # with no data here yet, the first fetched tensor sets it
            for pos, t in new.items():
                if t.shape != parts[pos].shape:
                    raise ProtocolError(
                        f"__partitioned__['partitions'] at position {pos}: fetched data of shape "
                        f"{t.shape} for an entry of shape {parts[pos].shape} "
                        "(grid invariant 7)"
                    )
                if dtype is None:
                    dtype = t.dtype
                elif t.dtype != dtype:
                    raise ProtocolError(
                        f"__partitioned__['partitions'] at position {pos}: fetched dtype "
                        f"{t.dtype} differs from {dtype} (grid invariant 6)"
                    )
        except BaseException:
            # The traceback keeps this frame alive: let go of every tensor taken so far.
            imported.clear()
            new = t = None  # noqa: F841
            raise
        for p in pending:
            t = new[p.position]
            p._tensor, p._handle = t, None
            if self._dtype is None:
                self._dtype = t.dtype
        return self

    def tensors(self) -> List[Tensor]:
        """Every partition's tensor in C order of positions (fetching handles first)."""
        if self._lazy is not None:
            return list(self._lazy[0])
        self.fetch()
        parts, out = self._parts(), []
        for pos in itertools.product(*(range(n) for n in self.tiling)):
            t = parts[pos]._tensor
            if t is None:
                raise ProtocolError(
                    f"__partitioned__['partitions'] at position {pos}: no data here (another "
                    "rank's partition in SPMD mode)"
                )
            out.append(t)
        return out

    # -- operations ----------------------------------------------------------------------------
    def repartition(self, tiling: Optional[Sequence[int]] = None, *, splits=None, block_cyclic=None,
                    devices=None, process_grid=None, transfer: bool = False) -> "PartitionedArray":
        """The same array over another grid: new partitions (dlpart tensors), each element copied
        once from its source partition straight into its target partition, on the device where
        the data is.

        Give exactly one target: ``tiling`` (even split, like `numpy.array_split`), ``splits``
        (split points per axis) or ``block_cyclic`` (block size, an int or one per axis; the
        blocks are dealt round-robin over ``devices`` laid out on ``process_grid``, ScaLAPACK
        style). ``devices`` may also name one device for every target partition or one per
        partition; by default each target partition stays on the device of the source partition
        holding its first element. A layout that moves data across devices raises
        `dlpart.DeviceError` unless ``transfer=True``.

        Host partitions under 2 MiB share one allocation per device, which is released when
        the last of them is dropped (a large array cut into small blocks then costs one
        allocation instead of thousands).
        """
        return _repartition(self, tiling, splits, block_cyclic, devices, process_grid, transfer)

    def repartition_into(self, out: "PartitionedArray", *, transfer: bool = False) -> "PartitionedArray":
        """Copies this array into ``out``'s existing partitions (its grid is the target layout),
        reusing the caller's buffers. ``out`` must have the same shape and dtype and writable
        partitions; nothing is written unless every check passes. Returns ``out``."""
        if tuple(out.shape) != self._shape:
            raise ValueError(f"repartition_into: out has shape {out.shape}, this array {self._shape}")
        src, dst = self.tensors(), out.tensors()
        kinds = {t.device.kind for t in src} | {t.device.kind for t in dst}
        if not kinds <= _NATIVE:
            raise _core.BackendUnavailableError(
                f"repartition_into on {sorted(kinds)}: needs dlpart kernels for every device")
        _core._repartition_into(src, list(self._shape), [list(s) for s in self._splits], dst,
                                [list(s) for s in out.splits], transfer)
        return out

    def to(self, device) -> "PartitionedArray":
        """Every partition copied onto ``device`` (an explicit transfer), same grid."""
        target = Device(device)
        moved = [t if t.device == target else t.to(target) for t in self.tensors()]
        return PartitionedArray._of_tensors(self._shape, self._splits, moved,
                                            [target] * len(moved), self._dtype)

    # -- unmaking ----------------------------------------------------------------------------------
    def assemble(self, *, device=None, transfer: bool = False) -> Tensor:
        """The whole array as one tensor on the partitions' common device.

        Partitions on different devices need ``device=`` and ``transfer=True``; otherwise
        `dlpart.DeviceError` names the devices.
        """
        tensors = self.tensors()
        devices = sorted({str(t.device) for t in tensors})
        target = Device(device) if device is not None else None
        if target is None:
            if len(devices) > 1:
                raise DeviceError(
                    f"assemble: partitions live on several devices {devices}; pass device= and "
                    "transfer=True to move them"
                )
            target = tensors[0].device if tensors else Device("kDLCPU")
        moving = sorted({str(t.device) for t in tensors if t.device != target})
        if moving and not transfer:
            raise DeviceError(
                f"assemble: partitions on {moving} would be moved to {target}; pass transfer=True"
            )
        if moving:
            tensors = [t if t.device == target else t.to(target) for t in tensors]
        # One target partition covering everything: the repartition path, on the target device.
        whole = [[0, n] for n in self._shape]
        if target.kind not in _NATIVE:
            return _repartition_by_namespace(self, tensors, whole, [target], transfer)[0]
        return _core._repartition(tensors, list(self._shape), [list(s) for s in self._splits],
                                  whole, [target])[0]


_NATIVE = {"kDLCPU", "kDLCUDAHost", "kDLROCMHost", "kDLCUDAManaged", "kDLCUDA"}


def _prod(xs) -> int:
    n = 1
    for x in xs:
        n *= x
    return n


def _repartition(pa: "PartitionedArray", tiling, splits, block_cyclic, devices, process_grid,
                 transfer) -> "PartitionedArray":
    given = [name for name, v in (("tiling", tiling), ("splits", splits),
                                   ("block_cyclic", block_cyclic)) if v is not None]
    if len(given) != 1:
        raise ValueError(f"repartition takes exactly one of tiling, splits, block_cyclic; got {given}")
    shape = list(pa.shape)
    if tiling is not None:
        dst_splits = _core._even_splits(shape, list(tiling))
        owners = None
    elif splits is not None:
        dst_splits = _core._check_splits(shape, [list(s) for s in splits])
        owners = None
    else:
        if devices is None or isinstance(devices, (str, Device)):
            raise ValueError("block_cyclic needs devices=[...], the devices the blocks are dealt to")
        block = [block_cyclic] * len(shape) if isinstance(block_cyclic, int) else list(block_cyclic)
        dst_splits, owners = _core._block_cyclic(shape, block, len(devices), process_grid)
    n = _prod(len(s) - 1 for s in dst_splits)
    src = pa.tensors()
    if owners is not None:
        dealt = [Device(d) for d in devices]
        dst_devs = [dealt[o] for o in owners]
    elif devices is None:
        dst_devs = _default_devices(pa, src, dst_splits)
    elif isinstance(devices, (str, Device, tuple)):
        dst_devs = [Device(devices)] * n
    else:
        dst_devs = [Device(d) for d in devices]
        if len(dst_devs) != n:
            raise ValueError(f"devices has {len(dst_devs)} entries for {n} target partitions")
    src_devs = {t.device.kind for t in src}
    if src_devs | {d.kind for d in dst_devs} <= _NATIVE:
        out = _core._repartition(src, shape, [list(s) for s in pa.splits], dst_splits, dst_devs,
                                 transfer)
    else:
        out = _repartition_by_namespace(pa, src, dst_splits, dst_devs, transfer)
    return PartitionedArray._of_tensors(pa.shape, dst_splits, out, dst_devs, pa.dtype)


def _boxes(splits):
    """``(position, start, shape)`` of every box of a grid, in C order."""
    positions = itertools.product(*(range(len(s) - 1) for s in splits))
    starts = itertools.product(*(s[:-1] for s in splits))
    shapes = itertools.product(*([b - a for a, b in zip(s, s[1:])] for s in splits))
    return zip(positions, starts, shapes)


def _partitions_of(splits, tensors, devices) -> Dict[Position, Partition]:
    """Partitions over ``splits`` holding ``tensors`` (C order), located here on ``devices``
    (the tensors' devices, known to the caller: asking each tensor costs more than the copy
    for small partitions)."""
    locations: Dict[Device, tuple] = {}
    parts = {}
    for (pos, start, shape), t, dev in zip(_boxes(splits), tensors, devices):
        loc = locations.get(dev)
        if loc is None:
            loc = locations[dev] = (here(dev),)
        parts[pos] = Partition(pos, start, shape, loc, t)
    return parts


def _default_devices(pa, src, dst_splits) -> List[Device]:
    """Each target partition stays on the device of the source partition holding its first
    element, so a layout change alone never moves data."""
    import bisect

    n = _prod(len(s) - 1 for s in dst_splits)
    if len({str(t.device) for t in src}) <= 1:
        return [src[0].device if src else Device("kDLCPU")] * n
    tiling = pa.tiling
    strides = [_prod(tiling[a + 1:]) for a in range(len(tiling))]
    out = []
    for pos in itertools.product(*(range(len(s) - 1) for s in dst_splits)):
        flat = 0
        for a, i in enumerate(pos):
            start = dst_splits[a][i]
            j = max(0, min(bisect.bisect_right(pa.splits[a], start) - 1, tiling[a] - 1))
            flat += j * strides[a]
        out.append(src[flat].device if src else Device("kDLCPU"))
    return out


def _repartition_by_namespace(pa, src, dst_splits, dst_devs, transfer) -> List[Tensor]:
    """Repartitions partitions on devices without dlpart kernels (kDLOneAPI) through the
    producer's array-API namespace, on the data's own device."""
    crossing = sorted({f"{t.device} -> {d}" for t in src for d in dst_devs if t.device != d})
    if crossing and not transfer:
        raise DeviceError(
            f"repartition: the target layout moves data between devices ({', '.join(crossing)}); "
            "pass transfer=True"
        )
    xp = None
    for p in pa.partitions.values():
        xp = xp or p._namespace
    if xp is None:
        raise _core.BackendUnavailableError(
            f"repartition on {sorted({str(t.device) for t in src})}: no dlpart kernels for these "
            "devices and the partitions came without an array-API namespace"
        )
    native = [xp.from_dlpack(t) for t in src]
    by_device = {}
    for t, arr in zip(src, native):
        by_device.setdefault(str(t.device), arr.device)
    dtype = native[0].dtype if native else None
    outs = []
    for k, pos in enumerate(itertools.product(*(range(len(s) - 1) for s in dst_splits))):
        shape = tuple(dst_splits[a][i + 1] - dst_splits[a][i] for a, i in enumerate(pos))
        dev = by_device.get(str(dst_devs[k]))
        if dev is None:
            raise DeviceError(f"repartition: no partition lives on {dst_devs[k]} to allocate there")
        outs.append(xp.empty(shape, dtype=dtype, device=dev))
    for s, s_start, d, d_start, shape in _core._plan_ops(
            list(pa.shape), [list(x) for x in pa.splits], dst_splits):
        dst_box = tuple(slice(a, a + n) for a, n in zip(d_start, shape))
        src_box = tuple(slice(a, a + n) for a, n in zip(s_start, shape))
        outs[d][dst_box] = native[s][src_box]
    return [_core.from_dlpack(o) for o in outs]


def _import_data(obj, position, device, copy) -> Tensor:
    if isinstance(obj, Tensor) and device is None and not copy:
        return obj
    if not hasattr(obj, "__dlpack__"):
        raise ProtocolError(
            f"__partitioned__['partitions'] at position {position}: 'data' of type "
            f"{type(obj).__name__} is neither None, a DLPack array nor a handle that 'get' resolves"
        )
    return _core.from_dlpack(obj, device=device, copy=copy)


def _as_dict(obj) -> dict:
    if isinstance(obj, Mapping):
        return obj
    attr = getattr(obj, "__partitioned__", None)
    if attr is None:
        raise TypeError(
            f"objects of type {type(obj).__name__} do not implement __partitioned__"
        )
    d = attr() if callable(attr) else attr
    if not isinstance(d, Mapping):
        raise ProtocolError(f"__partitioned__ returned {type(d).__name__}, not a dict")
    return d


def _tuple_of_ints(value, key) -> Tuple[int, ...]:
    import operator

    try:
        items = (value,) if isinstance(value, int) else tuple(value)
        if any(isinstance(x, bool) for x in items):
            raise TypeError
        return tuple(operator.index(x) for x in items)
    except TypeError:
        raise ProtocolError(f"__partitioned__[{key!r}]: expected a tuple of ints, found {value!r}") from None


class _Parsed:
    __slots__ = ("shape", "tiling", "entries", "splits", "locals", "get")

    def boxes(self):
        """``(position, start, shape, entry)`` of every entry; start and shape come from the
        validated split points, which they equal."""
        sp = self.splits
        for pos, entry in self.entries:
            yield (pos, tuple(sp[a][i] for a, i in enumerate(pos)),
                   tuple(sp[a][i + 1] - sp[a][i] for a, i in enumerate(pos)), entry)


def _parse(d: Mapping) -> _Parsed:
    """Checks the dict's structure and its grid (in Rust), importing no data."""
    out = _Parsed()
    shape, out.splits, out.entries = _core._grid_from_dict(d)
    out.shape = tuple(shape)
    out.tiling = tuple(len(s) - 1 for s in out.splits)
    loc = d.get("locals")
    if loc is not None:
        if not isinstance(loc, (list, tuple)):
            raise ProtocolError(f"__partitioned__['locals']: expected a list of positions, found {loc!r}")
        locs = [_tuple_of_ints(p, "locals") for p in loc]
        tiling = out.tiling
        for p in locs:
            if len(p) != len(tiling) or any(not 0 <= i < n for i, n in zip(p, tiling)):
                raise ProtocolError(
                    f"__partitioned__['locals']: position {p} is not in a grid of tiling {tiling} "
                    "(grid invariant 10)"
                )
        if len(set(locs)) != len(locs):
            raise ProtocolError(f"__partitioned__['locals']: a position is listed twice in {locs} (grid invariant 10)")
        out.locals = locs
    else:
        out.locals = None
    g = d.get("get")
    if g is not None and not callable(g):
        raise ProtocolError(f"__partitioned__['get']: expected a callable, found {g!r}")
    out.get = g
    return out


def validate(d) -> None:
    """Checks a ``__partitioned__`` dict (or an object exposing one) without importing data.

    Raises `dlpart.ProtocolError` naming the key, the grid position and the values found.
    """
    p = _parse(_as_dict(d))
    for pos, entry in p.entries:
        normalise(entry.get("location"), pos, framework_device(entry.get("device"), "device", pos))


def from_partitioned(obj, *, device=None, copy: Optional[bool] = None) -> PartitionedArray:
    """Imports a partitioned array: an object with ``__partitioned__`` (property or method), or
    the dict itself.

    Partitions whose ``data`` is an array are imported through DLPack (zero-copy unless
    ``device``/``copy`` ask otherwise); handles stay handles until needed and are resolved only
    through the dict's ``get`` (`PartitionedArray.fetch`). On any error every tensor taken so far
    is released.
    """
    if isinstance(obj, PartitionedArray) and device is None and not copy:
        return obj
    d = _as_dict(obj)
    parsed = _parse(d)
    target = Device(device) if device is not None else None
    parts = {}
    taken = []
    namespace = None
    try:
        for pos, start, shape, entry in parsed.boxes():
            data = entry["data"]
            extra = framework_device(entry.get("device"), "device", pos)
            tensor = handle = None
            if data is not None:
                if hasattr(data, "__dlpack__"):
                    tensor = _import_data(data, pos, target, copy)
                    taken.append(tensor)
                    namespace = getattr(data, "__array_namespace__", None)
                else:
                    handle = data
            fallback = tensor.device if tensor is not None else extra
            if target is not None and tensor is not None:
                # the data was moved: its locality is here now
                locations = (here(tensor.device),)
            else:
                locations = normalise(entry.get("location"), pos, fallback)
            parts[pos] = Partition(pos, start, shape, locations, tensor, handle)
            if tensor is not None and namespace is not None and tensor.device.kind not in _NATIVE:
                parts[pos]._namespace = namespace()
            namespace = None
        dtype = _entry_dtype(d)
        return PartitionedArray(parsed.shape, parsed.splits, parts, dtype=dtype,
                                locals=parsed.locals, get=parsed.get)
    except BaseException:
        # The traceback keeps this frame alive: drop every reference to imported data.
        taken.clear()
        parts.clear()
        tensor = None  # noqa: F841
        raise


def _entry_dtype(d) -> Optional[str]:
    """A dtype stated by the producer without data (heat's extra ``dtype`` key), if any."""
    for entry in d["partitions"].values():
        dt = entry.get("dtype") if isinstance(entry, Mapping) else None
        if dt is not None:
            name = str(dt).replace("torch.", "")
            return name
    return None


def partition(x, tiling: Optional[Sequence[int]] = None, *, splits=None) -> PartitionedArray:
    """Cuts any DLPack array into a grid of zero-copy views on its device.

    ``tiling`` splits each axis evenly like `numpy.array_split`; ``splits`` gives the split
    points per axis explicitly (``[[0, 3, 8], [0, 8]]``). Default: one partition.
    """
    t = x if isinstance(x, Tensor) else _core.from_dlpack(x)
    namespace = getattr(x, "__array_namespace__", None)
    if splits is not None:
        if tiling is not None:
            raise ValueError("pass tiling or splits, not both")
        sp = _core._check_splits(t.shape, [list(s) for s in splits])
    else:
        tiling = tuple(tiling) if tiling is not None else (1,) * t.ndim
        sp = _core._even_splits(t.shape, list(tiling))
    parts = {}
    loc = (here(t.device),)
    for pos, start, shape in _boxes(sp):
        parts[pos] = Partition(pos, start, shape, loc, t.view(start, shape))
        if namespace is not None and t.device.kind not in _NATIVE:
            parts[pos]._namespace = namespace()
    return PartitionedArray(t.shape, sp, parts, dtype=t.dtype)
