"""`PartitionedArray`: the Python face of dlpart's Rust model, and the ``__partitioned__``
protocol produced and consumed.

The model (grid, data, locations, locals, dtype) and every operation live in Rust
(``_core._PartitionedArray``). This layer keeps what needs Python: handles resolved through a
dict's ``get`` (Dask futures, Ray ObjectRefs), the array-API namespace route for devices
without dlpart kernels (kDLOneAPI), and `Partition` objects, made only when asked for.
"""

import itertools
import logging
import operator
from typing import (Any, Callable, Dict, Iterable, List, Mapping, NoReturn, Optional, Sequence,
                    Tuple, Union)

from . import _core
from ._core import Device, DeviceError, ProtocolError, Tensor
from ._location import Location, here, this_host
from ._types import ArrayLike, DeviceLike, IndicesLike, PartitionedDict, SplitsLike

Position = Tuple[int, ...]

# The Rust core's records arrive under child loggers of this one ("dlpart.backend...").
_log = logging.getLogger("dlpart")

__all__ = ["Partition", "PartitionedArray", "from_partitioned", "get", "partition", "validate"]


def get(handles: Any) -> Any:
    """The ``get`` of dicts that dlpart produces: resolves a handle, or a sequence of them.

    dlpart tensors and ``None`` resolve to themselves; Dask futures through their client; Ray
    ObjectRefs through ``ray.get``. A module-level function, so the dict pickles.
    """
    if isinstance(handles, (list, tuple)):
        return [_resolve(h) for h in handles]
    return _resolve(handles)


def _is_data(h) -> bool:
    """Whether a dict's ``data`` is the data itself (or ``None``) rather than a handle."""
    return h is None or isinstance(h, Tensor) or hasattr(h, "__dlpack__")


def _resolve(h):
    if _is_data(h):
        return h
    kind = type(h).__module__.split(".")[0]
    if kind == "distributed":
        return h.result()
    if kind == "ray":
        import ray

        return ray.get(h)
    raise TypeError(f"dlpart.get cannot resolve a handle of type {type(h).__name__}")


class _WithProducerGet:
    """The ``get`` of a dict that hands on its producer's unfetched handles: data (dlpart
    tensors, DLPack arrays, ``None``) resolves to itself, every handle goes to the producer's
    ``get``, all in one call. It pickles where the producer's ``get`` does."""

    def __init__(self, producer: Callable[[Any], Any]):
        self.producer = producer

    def __call__(self, handles: Any) -> Any:
        one = not isinstance(handles, (list, tuple))
        hs = [handles] if one else list(handles)
        out: List[Any] = [None] * len(hs)
        theirs = []
        for i, h in enumerate(hs):
            if _is_data(h):
                out[i] = h
            else:
                theirs.append(i)
        if theirs:
            for i, v in zip(theirs, self.producer([hs[i] for i in theirs])):
                out[i] = v
        return out[0] if one else out


class Partition:
    """One box of the grid: its position, start, shape, data (or a handle to it) and locations."""

    __slots__ = {
        "position": "The grid position, a tuple of ints (C order numbers the partitions).",
        "start": "The global index of the partition's first element.",
        "shape": "The partition's extent along each axis.",
        "locations": "The `Location`s where the data can be reached (several mean replicas).",
        "_tensor": None,
        "_handle": None,
    }

    def __init__(self, position: Sequence[int], start: Sequence[int], shape: Sequence[int],
                 locations: Iterable[Location] = (), tensor: Optional[Tensor] = None,
                 handle: Any = None):
        self.position: Position = tuple(position)
        self.start: Tuple[int, ...] = tuple(start)
        self.shape: Tuple[int, ...] = tuple(shape)
        self.locations: Tuple[Location, ...] = tuple(locations)
        self._tensor: Optional[Tensor] = tensor
        self._handle = handle

    @property
    def tensor(self) -> Optional[Tensor]:
        """The data as a dlpart tensor (None for another rank's partition, or an unfetched
        handle: see `PartitionedArray.fetch`)."""
        return self._tensor

    @property
    def handle(self) -> Any:
        """The producer's handle (a Dask future, a Ray ObjectRef), if the data is not here yet."""
        return self._handle

    @property
    def device(self) -> Optional[Device]:
        """The device of the data held here, else of the first location (None without
        either)."""
        if self._tensor is not None:
            return self._tensor.device
        return self.locations[0].device if self.locations else None

    def __repr__(self) -> str:
        what = "tensor" if self._tensor is not None else ("handle" if self._handle is not None else "None")
        return (
            f"Partition(position={self.position}, start={self.start}, shape={self.shape}, "
            f"data={what}, locations={list(self.locations)})"
        )


def _location_tuple(loc: Location):
    return (loc.host, loc.pid, loc.device, loc.rank)


class PartitionedArray:
    """A logical n-d array cut into a rectilinear grid of partitions, each a DLPack tensor on
    some device (or a handle to one, or nothing for another rank's partition in SPMD mode).

    ``PartitionedArray(shape, splits, partitions)`` builds one from `Partition` objects keyed
    by position (every position of the grid once); the grid and the data are validated.
    """

    __slots__ = ("_core", "_get", "_namespace", "_partitions", "_tensors", "_framework",
                 "_import")

    def __init__(self, shape: Sequence[int], splits: SplitsLike,
                 partitions: Mapping[Position, Partition], *, dtype: Optional[str] = None,
                 locals: Optional[Iterable[Sequence[int]]] = None,
                 get: Optional[Callable[[Any], Any]] = None):
        parts = [(p.position, p.start, p.shape, p._tensor, p._handle,
                  [_location_tuple(loc) for loc in p.locations]) for p in partitions.values()]
        core = _core._PartitionedArray.from_parts(
            [int(n) for n in shape], [list(s) for s in splits], parts,
            dtype,
            None if locals is None else [list(p) for p in locals])
        self._init(core, get, None)
        held = next((p._tensor for p in partitions.values() if p._tensor is not None), None)
        self._framework = None if held is None else _framework_of(held)

    def _init(self, core, get_fn, namespace, framework=None) -> "PartitionedArray":
        self._core = core
        self._get = get_fn
        self._namespace = namespace
        self._framework: Optional[str] = framework  # the producer's, for what goes back out
        self._partitions: Optional[Dict[Position, Partition]] = None
        self._tensors: Optional[List[Tensor]] = None  # one Python object per tensor, kept
        # `from_partitioned`'s device and copy, applied to the data of handles when fetched.
        self._import: Tuple[Optional[DeviceLike], Optional[bool]] = (None, None)
        return self

    @classmethod
    def _wrap(cls, core, get_fn=None, namespace=None, framework=None) -> "PartitionedArray":
        return cls.__new__(cls)._init(core, get_fn, namespace, framework)

    # -- the model -----------------------------------------------------------------------------
    @property
    def shape(self) -> Tuple[int, ...]:
        """The global shape of the whole array."""
        return self._core.shape

    @property
    def ndim(self) -> int:
        """The number of axes."""
        return len(self._core.shape)

    @property
    def dtype(self) -> Optional[str]:
        """The element type, as a name like ``'float32'`` (None until some data is here)."""
        return self._core.dtype

    @property
    def tiling(self) -> Tuple[int, ...]:
        """The number of partitions along each axis (the ``partition_tiling``)."""
        return tuple(len(s) - 1 for s in self._core.splits)

    @property
    def splits(self) -> Tuple[Tuple[int, ...], ...]:
        """Per axis, the split points ``0 = b0 <= b1 <= ... <= bk = shape[axis]``."""
        return self._core.splits

    @property
    def partitions(self) -> Mapping[Position, Partition]:
        """Every partition by position. Made on first use: an array of tens of thousands of
        small partitions never pays for these objects unless they are asked for."""
        if self._partitions is None:
            made = {}
            homes: Dict[str, tuple] = {}
            known = self._tensors
            for flat, (pos, start, shape, data, locs) in enumerate(self._core.entries()):
                if known is not None:
                    data = known[flat]
                tensor = data if isinstance(data, Tensor) else None
                handle = data if tensor is None else None
                if locs:
                    locations = tuple(Location(h, p, d, rank=r) for h, p, d, r in locs)
                elif tensor is not None:
                    key = str(tensor.device)
                    locations = homes.get(key)
                    if locations is None:
                        locations = homes[key] = (here(tensor.device),)
                else:
                    locations = ()
                made[tuple(pos)] = Partition(pos, start, shape, locations, tensor, handle)
            self._partitions = made
        return self._partitions

    @property
    def locals(self) -> Optional[List[Position]]:
        """The positions this rank owns (SPMD), or None when not SPMD."""
        loc = self._core.locals
        return None if loc is None else [tuple(p) for p in loc]

    @property
    def devices(self) -> List[Device]:
        """The distinct devices the partitions live on, in order of first appearance."""
        return self._core.devices

    def __array__(self, dtype: Any = None, copy: Optional[bool] = None) -> NoReturn:
        raise TypeError(
            "a dlpart.PartitionedArray is not one array in memory: call .assemble() for the "
            "whole array as one tensor (np.from_dlpack(pa.assemble())), or use .partitions")

    def __repr__(self) -> str:
        return (
            f"dlpart.PartitionedArray(shape={self.shape}, dtype={self.dtype!r}, "
            f"tiling={self.tiling}, devices={[str(d) for d in self.devices]})"
        )

    # -- producing -----------------------------------------------------------------------------
    def __distarray__(self) -> Dict[str, Any]:
        """The Distributed Array Protocol's (0.10) dict: this process's buffer, over the
        partition's memory, and a block dimension dictionary per axis. In one process that
        needs an array of one partition (`assemble` makes one); `dlpart.mpi.SpmdArray` gives
        each rank its own partition."""
        from . import _distarray

        return _distarray.describe(self, 0, 1)

    @property
    def __partitioned__(self) -> PartitionedDict:
        """The draft-2 ``__partitioned__`` dict (see `to_partitioned` for the choices). It
        pickles: arrays by value, handles as handles."""
        return self.to_partitioned()

    def to_partitioned(self, *, framework: Optional[str] = None, locations: str = "draft2",
                       rank: Optional[int] = None) -> PartitionedDict:
        """The ``__partitioned__`` dict, with each partition's data as an array of the framework
        a consumer knows, over the same memory.

        ``framework`` (``'numpy'``, ``'torch'``, ``'cupy'``, ``'jax'``, ``'dpctl'`` or
        ``'dlpart'``): by default the producer's own framework for partitions that came from
        one (numpy views for numpy input), numpy for host data dlpart made itself, and
        `dlpart.Tensor` for device data dlpart made itself; read-only data goes to torch,
        which has no read-only tensors, as a copy (and so do views with negative strides, which
        torch cannot hold); to JAX, each array goes on the JAX device its data is on
        (``kDLCPU:k`` is JAX's CPU device ``k``, a `dlpart.DeviceError` where JAX has none),
        strided views as C-contiguous copies, read-only GPU data as a copy on its GPU, and
        64-bit types follow ``jax_enable_x64`` (without it JAX makes 32-bit copies).
        ``locations``: ``'draft2'``
        (``(ip, pid, device)`` tuples; a location given as an MPI rank or a bare address is
        kept as it came), ``'ip'`` (bare addresses, as xgboost_ray reads them; this host's for the data held
        here when its locations name a rank) or ``'rank'``
        (MPI ranks, as heat reads them; ``rank`` is this process's, written for the data held here
        when its locations name a host rather than a rank).
        """
        rank = _rank_arg(rank)
        return self._dict(_converter(framework or self._framework), locations, rank)

    def _dict(self, convert: Optional[Callable[[Tensor], Any]], locations: str,
              rank: Optional[int]) -> PartitionedDict:
        """`to_partitioned` with each partition's data handed out by ``convert`` (None: the
        `dlpart.Tensor` itself), for adapters whose consumer needs its own rules."""
        getter = get
        if self._get is not None and self._core.pending(None):
            getter = _WithProducerGet(self._get)
        return self._core.to_dict(getter, this_host(), convert, locations, rank)

    # -- handles ---------------------------------------------------------------------------------
    def fetch(self, positions: Optional[Iterable[Position]] = None) -> "PartitionedArray":
        """Resolves the handles of ``positions`` (default: all) through ``get`` in one call and
        imports their data through DLPack. Returns self."""
        wanted = None if positions is None else [list(p) for p in positions]
        pending = self._core.pending(wanted)
        if not pending:
            return self
        getter = self._get or get
        handles = [h for _, h in pending]
        with _blamed("get", [self._position(flat) for flat, _ in pending]):
            raw = getter(handles)
        if isinstance(raw, (list, tuple)) and len(raw) != len(pending):
            raise ProtocolError(
                f"__partitioned__['get'] returned {len(raw)} items for {len(pending)} handles "
                f"(positions {[self._position(flat) for flat, _ in pending]})")
        if not isinstance(raw, (list, tuple)):
            # A get that resolves one handle at a time.
            raw = []
            for flat, h in pending:
                with _blamed("get", [self._position(flat)]):
                    raw.append(getter(h))
        tensors: List[Tensor] = []
        device, copy = self._import
        try:
            for (flat, _), obj in zip(pending, raw):
                tensors.append(_import_data(obj, self._position(flat), device, copy))
            # The tensors in place: another thread's, where it fetched a partition first.
            tensors = self._core.set_fetched([flat for flat, _ in pending], tensors,
                                             device is not None, list(raw))
        except BaseException:
            # The traceback keeps this frame alive: let go of every tensor imported so far.
            tensors.clear()
            raw = obj = None  # noqa: F841
            raise
        if self._framework is None:
            self._framework = _framework_of(raw[0])
        if self._partitions is not None:  # Partition objects handed out see the data too
            for (flat, _), t in zip(pending, tensors):
                p = self._partitions[self._position(flat)]
                p._tensor, p._handle = t, None
        return self

    def _position(self, flat: int) -> Position:
        pos = []
        for n in reversed(self.tiling):
            flat, i = divmod(flat, n)
            pos.append(i)
        return tuple(reversed(pos))

    def tensors(self) -> List[Tensor]:
        """Every partition's tensor in C order of positions (fetching handles first)."""
        self.fetch()
        if self._tensors is None:
            parts = self._partitions
            if parts is not None and all(p._tensor is not None for p in parts.values()):
                self._tensors = [p._tensor for p in parts.values()]
            else:
                self._tensors = self._core.tensors()
        return list(self._tensors)

    # -- operations ----------------------------------------------------------------------------
    def repartition(self, tiling: Optional[Sequence[int]] = None, *,
                    splits: Optional[SplitsLike] = None,
                    block_cyclic: Union[int, Sequence[int], None] = None,
                    devices: Union[DeviceLike, Sequence[DeviceLike], None] = None,
                    process_grid: Optional[Sequence[int]] = None,
                    transfer: bool = False) -> "PartitionedArray":
        """The same array over another grid: new partitions (dlpart tensors), each element that
        stays on its device copied once from its source partition straight into its target
        partition, on the device where the data is.

        Give exactly one target: ``tiling`` (even split, like `numpy.array_split`), ``splits``
        (split points per axis) or ``block_cyclic`` (block size, an int or one per axis; the
        blocks are dealt round-robin over ``devices`` laid out on ``process_grid``, ScaLAPACK
        style; a 0-d array's one partition goes to the first device). ``devices`` may also name
        one device for every target partition or one per partition; by default each target
        partition stays on the device of the source partition holding its first element. A
        layout that moves data to or from device memory (a GPU) raises `dlpart.DeviceError`
        unless ``transfer=True``; moves between host memory of any kinds (``kDLCPU``, JAX's
        ``kDLCPU:k``, pinned, managed) are plain copies and need none. With ``transfer=True``
        only the pieces the new layout needs cross (host to GPU, GPU to host, GPU to GPU): for
        each pair of devices, packed into one buffer where they are, moved in one transfer and
        unpacked into the new partitions there; everything is allocated and moved before any
        partition is written.

        Host partitions under 2 MiB share one allocation per device, which is released when
        the last of them is dropped (a large array cut into small blocks then costs one
        allocation instead of thousands).
        """
        self.fetch()
        layout = dict(tiling=_opt_list(tiling), splits=_opt_splits(splits),
                      block_cyclic=_opt_block(block_cyclic), devices=_devices_arg(devices),
                      process_grid=_opt_list(process_grid, "process_grid"))
        if self._core.native and _native_devices(layout["devices"]):
            return PartitionedArray._wrap(self._core.repartition(**layout, transfer=transfer))
        dst_splits, dst_devs = self._core.target(**layout)
        out = _repartition_by_namespace(self, dst_splits, dst_devs, transfer, "repartition")
        result = PartitionedArray(self.shape, dst_splits, {
            pos: Partition(pos, start, shape, (), t)
            for (pos, start, shape), t in zip(_boxes(dst_splits), out)})
        # The new partitions live where the old ones did: the same namespace serves them.
        result._namespace, result._framework = self._namespace, self._framework
        return result

    def repartition_into(self, out: "PartitionedArray", *, transfer: bool = False) -> "PartitionedArray":
        """Copies this array into ``out``'s existing partitions (its grid is the target layout),
        reusing the caller's buffers. ``out`` must have the same shape and dtype and writable
        partitions; nothing is written unless every check passes. Partitions of ``out`` on
        another device than the data they receive need ``transfer=True``, unless both are host
        memory (of any kinds); with it, only the pieces each partition receives cross, as in
        `repartition`, and none is written before all have arrived. Returns ``out``."""
        if not isinstance(out, PartitionedArray):
            raise TypeError(f"repartition_into writes into a dlpart.PartitionedArray, not "
                            f"{type(out).__name__} (partition it first: dlpart.partition(out, ...))")
        if tuple(out.shape) != self.shape:
            raise ValueError(f"repartition_into: out has shape {out.shape}, this array {self.shape}")
        self.fetch()
        out.fetch()
        if not (self._core.native and out._core.native):
            kinds = sorted({str(d) for d in self.devices} | {str(d) for d in out.devices})
            raise _core.BackendUnavailableError(
                f"repartition_into on {kinds}: needs dlpart kernels for every device")
        self._core.repartition_into(out._core, transfer)
        return out

    def to(self, device: DeviceLike) -> "PartitionedArray":
        """Every partition copied onto ``device`` (an explicit transfer), same grid. Data on a
        device without dlpart kernels (kDLOneAPI) raises `dlpart.BackendUnavailableError`:
        only its own library can move it."""
        self.fetch()
        return PartitionedArray._wrap(self._core.to(Device(device)))

    def gather(self, indices: IndicesLike, axis: int = 0, *,
               transfer: bool = False) -> "PartitionedArray":
        """``numpy.take(self, indices, axis)`` with global indices, each served by the partition
        that holds it, on its device. The result keeps this array's split points on the other
        axes and has one slab along ``axis``; one index (an int, a 0-d array) drops the axis,
        as numpy does. Each result partition lives on the device of the partition holding its
        first index; serving partitions on another device need ``transfer=True``, unless both
        are host memory (JAX's ``kDLCPU:k``, pinned, managed: read in place, needing no CUDA).
        Of an array of handles, only the partitions holding an index are fetched."""
        idx = _core._indices_tensor(indices)  # read once, for the serving check and the gather
        self._fetch_serving(idx, axis, "gather")
        return PartitionedArray._wrap(self._core.gather(idx, axis, transfer))

    def _fetch_serving(self, indices, axis, op: str) -> None:
        """Fetches the handles of the partitions holding ``indices`` along ``axis``, the only
        ones a gather or scatter reads or writes (an index out of range raises first)."""
        pending = self._core.pending(None)
        if pending:
            serving = self._core.serving(indices, axis, op)
            if not serving and self._core.dtype is None:
                # No index, but the result's dtype comes from some partition's data.
                serving = [self._position(pending[0][0])]
            self.fetch(serving)

    def scatter(self, values: ArrayLike, indices: IndicesLike, axis: int = 0, *,
                transfer: bool = False) -> None:
        """``self[.., indices, ..] = values`` along ``axis`` with global indices (the last of
        duplicate indices wins), written by the partitions that hold them; nothing is written
        unless every index is in range. For one index (an int, a 0-d array) ``values`` has the
        array's shape without ``axis``, as numpy takes it. ``values`` of another shape that
        broadcasts to the one written are broadcast, and scalars read, as `dlpart.scatter`
        does (a Python scalar takes the array's dtype). ``values`` on another device than a
        partition written need ``transfer=True``; host values (numpy arrays, scalars) write
        partitions in host memory of any kind (JAX's ``kDLCPU:k``, pinned, managed, ROCm
        host memory) in place without it, as `dlpart.scatter` writes such an array, and a
        scalar (or a 0-d host array) writes partitions on any device without it, a GPU's
        too: its one element is copied to each device written once and broadcast there.
        Partitions written that share memory raise `BufferError`, as in `repartition_into`.
        ``values`` may view this array's own memory: they are read as they were before the
        call, as numpy's fancy assignment does. Of an array of handles, only the partitions
        holding an index are fetched."""
        idx = _core._indices_tensor(indices)  # read once, for the serving check and the scatter
        self._fetch_serving(idx, axis, "scatter")
        self._core.scatter(values, idx, axis, transfer)

    # -- unmaking ----------------------------------------------------------------------------------
    def assemble(self, *, device: Optional[DeviceLike] = None, transfer: bool = False) -> Tensor:
        """The whole array as one tensor on the partitions' common device.

        Partitions on different devices need ``device=``, and ``transfer=True`` where data
        moves to or from device memory (a GPU); between host memory of any kinds (``kDLCPU``,
        JAX's ``kDLCPU:k``, pinned, managed) it is a plain copy and needs none. Otherwise
        `dlpart.DeviceError` names the devices.
        """
        self.fetch()
        target = Device(device) if device is not None else None
        if self._core.native and (target is None or target.kind in _NATIVE):
            return self._core.assemble(target, transfer)
        tensors = self._core.tensors()
        devices = sorted({str(t.device) for t in tensors})
        if target is None:
            if len(devices) > 1:
                raise DeviceError(
                    f"assemble: partitions live on several devices {devices}; pass device= and "
                    "transfer=True to move them"
                )
            target = tensors[0].device
        whole = [[0, n] for n in self.shape]
        return _repartition_by_namespace(self, whole, [target], transfer, "assemble")[0]


# Memory the host reads and writes directly (`Device::is_host_accessible` in Rust).
_HOST = {"kDLCPU", "kDLCUDAHost", "kDLROCMHost", "kDLCUDAManaged"}

_NATIVE = _HOST | {"kDLCUDA"}

# The GPUs whose memory torch holds.
_TORCH_GPUS = {"kDLCUDA", "kDLROCM"}


def _crosses(a: Device, b: Device) -> bool:
    """Whether data moving from ``a`` to ``b`` crosses devices, and so needs ``transfer=True``:
    another device, unless both are host memory (of any kinds), between which data moves by a
    plain copy."""
    return a != b and not (a.kind in _HOST and b.kind in _HOST)


def _native_devices(devices) -> bool:
    if devices is None:
        return True
    items = devices if isinstance(devices, list) else [devices]
    return all(Device(d).kind in _NATIVE for d in items)


def _rank_arg(rank) -> Optional[int]:
    """``rank`` (None, or an MPI rank as any integer) as an int, checked."""
    if rank is None:
        return None
    r = None if isinstance(rank, bool) else _int_scalar(rank)
    if r is None:
        raise TypeError(f"rank must be an integer, not {type(rank).__name__} {rank!r}")
    if not 0 <= r < 1 << 63:
        raise ValueError(f"rank {r} is not an MPI rank (0 <= rank < 2**63)")
    return r


def _opt_list(x, what: str = "tiling"):
    """A list of non-negative ints; an int is a one-entry list (numpy's 1-d shorthand). An
    entry below 0 or beyond 64 bits is a `ValueError` naming ``what`` and the entry."""
    if x is None:
        return None
    v = _int_scalar(x)
    items = [v] if v is not None else list(x)
    out = []
    for v in items:
        v = operator.index(v)
        if v < 0:
            raise ValueError(f"{what} {tuple(items)} has the negative entry {v}: every entry "
                             "must be >= 0")
        if v >= 1 << 64:
            raise ValueError(f"{what} {tuple(items)} has the entry {v}, which does not fit in "
                             "64 bits")
        out.append(v)
    return out


def _opt_splits(x):
    return None if x is None else [_opt_list(s, "split points") for s in x]


def _int_scalar(x) -> Optional[int]:
    """``x`` as an int when it is an integer scalar (a Python or numpy int), else None.
    Arrays have ``__index__`` too, but `operator.index` refuses all but 0-d ones."""
    try:
        return operator.index(x)
    except TypeError:
        return None


def _opt_block(x):
    if x is None:
        return x
    items = _opt_list(x, "block_cyclic")
    return items[0] if _int_scalar(x) is not None else items


def _devices_arg(devices):
    """One device (any `DeviceLike`: a name, a `Device`, a DLPack pair, a ``torch.device``) or
    a sequence of them (a tuple too, unless it is a ``(type, id)`` pair of ints)."""
    if devices is None or isinstance(devices, (str, Device)) or _is_device_pair(devices):
        return devices
    try:
        return list(devices)
    except TypeError:
        pass
    # Not a sequence: one device, if the one-device parser reads it (a torch.device).
    try:
        Device(devices)
    except DeviceError:
        raise TypeError(f"devices must be a device (a name such as 'cuda:0', a dlpart.Device, a "
                        f"DLPack (type, id) pair, a torch.device) or a list of them, not "
                        f"{type(devices).__name__} {devices!r}") from None
    return devices


def _is_device_pair(value) -> bool:
    """Whether ``value`` is a DLPack ``(type, id)`` pair of ints (IntEnums and numpy ints too)."""
    return (isinstance(value, tuple) and len(value) == 2
            and all(_int_scalar(v) is not None for v in value))


def _boxes(splits):
    """``(position, start, shape)`` of every box of a grid, in C order."""
    positions = itertools.product(*(range(len(s) - 1) for s in splits))
    starts = itertools.product(*(s[:-1] for s in splits))
    shapes = itertools.product(*([b - a for a, b in zip(s, s[1:])] for s in splits))
    return zip(positions, starts, shapes)


def _repartition_by_namespace(pa, dst_splits, dst_devs, transfer, op) -> List[Tensor]:
    """Repartitions partitions on devices without dlpart kernels (kDLOneAPI) through the
    producer's array-API namespace, on the data's own device."""
    src = pa.tensors()
    ops = pa._core.plan_ops([list(x) for x in dst_splits])
    # The partitions' own library makes memory only on the devices they are on: a target
    # elsewhere is beyond any transfer dlpart could make, and is said so before transfer=True
    # is asked for.
    held = {str(t.device) for t in src}
    beyond = sorted({str(d) for d in dst_devs} - held)
    if beyond:
        moves = sorted({f"{src[s].device} -> {dst_devs[d]}" for s, _, d, _, _ in ops
                        if str(dst_devs[d]) in beyond})
        foreign = sorted(d for d in held | set(beyond) if Device(d).kind not in _NATIVE)
        raise _core.BackendUnavailableError(
            f"{op}: dlpart has no kernels for {', '.join(foreign)}; such data is copied by its "
            f"own library, which makes memory only on the devices the partitions are on "
            f"({', '.join(sorted(held))}), not on {', '.join(beyond)}"
            f"{' (' + ', '.join(moves) + ')' if moves else ''}: move the data with that "
            f"library first")
    # Only the boxes the plan copies cross devices, not every pair of source and target; a
    # copy between host memory of two kinds is a plain copy, not a crossing (dlpart's one rule).
    crossing = sorted({f"{src[s].device} -> {dst_devs[d]}" for s, _, d, _, _ in ops
                       if _crosses(src[s].device, Device(dst_devs[d]))})
    if crossing and not transfer:
        raise DeviceError(
            f"{op}: the target layout moves data between devices ({', '.join(crossing)}); "
            "pass transfer=True"
        )
    xp = pa._namespace
    if xp is None:
        raise _core.BackendUnavailableError(
            f"{op} on {sorted({str(t.device) for t in src})}: no dlpart kernels for these "
            "devices and the partitions came without an array-API namespace"
        )
    if _log.isEnabledFor(logging.INFO):
        _log.info(
            "%s of %d partitions on %s through %s (no dlpart kernels for these devices; "
            "the data stays on its device)",
            op, len(src), ", ".join(sorted({str(t.device) for t in src})),
            getattr(xp, "__name__", type(xp).__name__))
    native = [xp.from_dlpack(t) for t in src]
    by_device = {}
    for t, arr in zip(src, native):
        by_device.setdefault(str(t.device), arr.device)
    dtype = native[0].dtype if native else None
    outs = []
    for k, (pos, start, shape) in enumerate(_boxes(dst_splits)):
        dev = by_device[str(dst_devs[k])]  # every target device holds a partition (above)
        outs.append(xp.empty(tuple(shape), dtype=dtype, device=dev))
    for s, s_start, d, d_start, shape in ops:
        dst_box = tuple(slice(a, a + n) for a, n in zip(d_start, shape))
        src_box = tuple(slice(a, a + n) for a, n in zip(s_start, shape))
        outs[d][dst_box] = native[s][src_box]
    return [_core.from_dlpack(o) for o in outs]


class _blamed:
    """Re-raises an exception of user code met while ``key`` of the entries at ``positions`` was
    read as a `ProtocolError` naming them, the original chained as its cause. dlpart's own
    errors and `BufferError` (a DLPack failure) keep their class, with the names added;
    `MemoryError` and what is no `Exception` (`KeyboardInterrupt`) pass through unchanged."""

    def __init__(self, key: str, positions):
        self.key, self.positions = key, positions

    def __enter__(self):
        return self

    def __exit__(self, kind, e, tb):
        if e is None or not isinstance(e, Exception) or isinstance(e, (MemoryError, ProtocolError)):
            return False
        where = ", ".join(str(p) for p in self.positions[:8])
        if len(self.positions) > 8:
            where += f", ... ({len(self.positions)} partitions)"
        try:
            what = str(e)
        except Exception:  # noqa: BLE001 - a str() that raises is reported as such
            what = "(an exception whose str() raised)"
        msg = (f"__partitioned__['partitions'] at position {where}: {self.key!r}: "
               f"{type(e).__name__}: {what}")
        kind = next((k for k in (DeviceError, _core.BackendUnavailableError, BufferError)
                     if isinstance(e, k)), ProtocolError)
        raise kind(msg) from e


def _import_data(obj, position, device=None, copy=None) -> Tensor:
    """The data ``get`` returned for the partition at ``position``, imported as
    `from_dlpack` (``device``, ``copy``) would."""
    if isinstance(obj, Tensor) and device is None and not copy:
        return obj
    if not hasattr(obj, "__dlpack__"):
        raise ProtocolError(
            f"__partitioned__['partitions'] at position {position}: 'get' returned "
            f"{type(obj).__name__}, which is not a DLPack array"
        )
    with _blamed("data", [position]):
        return _core.from_dlpack(obj, device=device, copy=copy)


def _as_dict(obj) -> Mapping:
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


def validate(d: Any) -> None:
    """Checks a ``__partitioned__`` dict (or an object exposing one) as `from_partitioned`
    would read it, keeping nothing.

    Checks the keys, the grid (rules 1-5), locations (8) and ``locals`` (10), and the data held
    in this process: each array is imported through DLPack as it is (zero-copy, as
    `from_partitioned` imports it) and released, so that its dtype (6), shape (7) and device
    (9) are checked against the dict, and an array that cannot be imported is itself a
    problem (its device, from ``__dlpack_device__``, is still checked). Handles are not
    resolved through ``get``. Raises `dlpart.ProtocolError` naming the key, the grid position
    and the values found; the problems of the grid, and those of the data and ``locals``, are
    each listed at once (a key that cannot be read at all, or a malformed location or dtype,
    is reported where it is met), the exception of the first failed import as ``__cause__``.
    """
    _core._validate_dict(_as_dict(d))


def from_distarray(obj: Any) -> PartitionedArray:
    """Imports an array of the Distributed Array Protocol (an object with ``__distarray__``, or
    its dict) held by this one process (every ``proc_grid_size`` 1; `dlpart.mpi.from_distarray`
    reads one spread over MPI ranks): one partition per run of contiguous indices, each a view
    of the buffer (no copy). Communication padding is left out, boundary padding kept; on a
    ``periodic`` axis, end padding counted in ``size`` is kept, end padding written as the
    wrap-around neighbour's indices (``start = -padding[0]``, ``stop = size + padding[1]``)
    left out, and at most as wide as the indices the block owns (its own neighbour there);
    the two ends of a periodic axis are as wide as each other where both wrap around, facing
    each other there; the padding at the two ends is together at most the block's extent
    (docs/guide.md)."""
    from . import _distarray

    buffer, dims = _distarray.read(obj)
    return PartitionedArray._wrap(_core._distarray_import(buffer, dims), None, None, "numpy")


def from_partitioned(obj: Any, *, device: Optional[DeviceLike] = None,
                     copy: Optional[bool] = None) -> PartitionedArray:
    """Imports a partitioned array: an object with ``__partitioned__`` (property or method), or
    the dict itself.

    Partitions whose ``data`` is an array are imported through DLPack (zero-copy unless
    ``device``/``copy`` ask otherwise); handles stay handles until needed and are resolved only
    through the dict's ``get`` (`PartitionedArray.fetch`); ``device`` and ``copy`` apply to the
    data ``get`` returns too. On any error every tensor taken so far
    is released.
    """
    if isinstance(obj, PartitionedArray) and device is None and not copy:
        return obj
    d = _as_dict(obj)
    # The dict is read once, in Rust: `get` and the first array come from that reading.
    core, namespace, get_fn, first = _core._PartitionedArray.from_dict(d, device, copy)
    framework = None
    if first is not None and device is None and not copy:
        framework = _framework_of(first)
    pa = PartitionedArray._wrap(core, get_fn, namespace, framework)
    pa._import = (device, copy)
    return pa


def partition(x: ArrayLike, tiling: Union[int, Sequence[int], None] = None, *,
              splits: Optional[SplitsLike] = None) -> PartitionedArray:
    """Cuts any DLPack array into a grid of zero-copy views on its device.

    ``tiling`` splits each axis evenly like `numpy.array_split`; ``splits`` gives the split
    points per axis explicitly (``[[0, 3, 8], [0, 8]]``). Default: one partition.
    """
    core = _core._PartitionedArray.partition(x, _opt_list(tiling), _opt_splits(splits))
    namespace = None
    if not core.native:
        ns = getattr(x, "__array_namespace__", None)
        namespace = ns() if ns is not None else None
    return PartitionedArray._wrap(core, None, namespace, _framework_of(x))


_FRAMEWORKS = ("numpy", "torch", "cupy", "jax", "jaxlib", "dpctl")


def _framework_of(x) -> Optional[str]:
    """The framework whose array ``x`` is, if it is one dlpart hands data back out in."""
    root = type(x).__module__.split(".")[0]
    if root == "jaxlib":
        return "jax"
    return root if root in _FRAMEWORKS else None


def _to_numpy(t):
    if t.device.kind not in _HOST:
        raise DeviceError(f"numpy cannot hold data on {t.device}: name the device's framework")
    return t.__array__()  # a view; a dtype numpy lacks is a TypeError saying so


def _host_numpy_else_tensor(t):
    """numpy for host data numpy can hold; the tensor itself otherwise (device data, and dtypes
    numpy has no type for, such as bfloat16)."""
    if t.device.kind != "kDLCPU" or not _numpy_has(t.dtype):
        return t
    return _to_numpy(t)


def _numpy_has(dtype: str) -> bool:
    return dtype != "bfloat16" and not dtype.startswith("float8_")


def _to_jax(t):
    """A JAX array over ``t``'s memory where JAX can take it, on the JAX device ``t``'s device
    names: ``kDLCPU:k`` is JAX's CPU device ``k`` (an emulated host device), ``kDLCUDA:k`` its
    GPU ``k``. JAX imports only C-contiguous tensors, so a strided view is copied first; and
    it asks for the legacy capsule, which dlpart refuses for read-only data (as imports of
    JAX's own arrays are): read-only host data goes through a read-only numpy view, which
    ``jax.device_put`` aliases where JAX can (64-byte aligned data) and copies otherwise, and
    read-only GPU data as a copy on its GPU."""
    import jax
    import jax.numpy as jnp

    if not t.is_contiguous:
        t = t.copy()
    if t.device.kind == "kDLCPU":
        device = _jax_cpu_device(t.device)
        if t.readonly:
            return jax.device_put(_to_numpy(t), device)
    elif t.readonly and t.device.kind in _TORCH_GPUS:
        t = t.copy()
    # JAX places what it imports on the device `__dlpack_device__` names.
    return jnp.from_dlpack(t)


def _jax_cpu_device(device: Device):
    """JAX's CPU device for dlpart's ``kDLCPU:k``."""
    import jax

    cpus = jax.local_devices(backend="cpu")
    for d in cpus:
        if d.local_hardware_id == device.id:
            return d
    raise DeviceError(
        f"JAX has no CPU device {device.id} for data on {device} (its CPU devices: "
        f"{', '.join(str(d.local_hardware_id) for d in cpus)}; XLA_FLAGS="
        f"--xla_force_host_platform_device_count sets how many there are)")


def _to_torch(t):
    """``t`` as a torch tensor: over the same memory, or a copy of read-only data and of views
    with negative strides. torch has no read-only tensors and ignores DLPack's read-only flag,
    so a view would let the consumer write into memory its producer does not allow written (a
    JAX array, a read-only map); and torch aborts the process on a negative stride."""
    import torch

    copy = t.readonly or any(s < 0 for s in t.strides)
    return torch.from_dlpack(t.copy() if copy else t)


def _converter(framework: Optional[str]):
    """The function that hands a tensor out in ``framework`` (None: numpy for host data,
    `dlpart.Tensor` elsewhere)."""
    if framework is None:
        return _host_numpy_else_tensor
    if framework == "dlpart":
        return None
    if framework == "numpy":
        return _to_numpy
    if framework == "torch":
        return _to_torch
    if framework == "cupy":
        import cupy

        return cupy.from_dlpack
    if framework == "jax":
        return _to_jax
    if framework == "dpctl":
        import dpctl.tensor as dpt

        return dpt.from_dlpack
    raise ValueError(
        f"framework={framework!r}: expected 'numpy', 'torch', 'cupy', 'jax', 'dpctl' or 'dlpart'")
