"""dlpart arrays for heat's ``ht.from_partitioned``.

heat reads SPMD dicts only: ``locals`` lists this rank's one partition, ``int(location[0])`` is
each partition's MPI rank, and the data must be a numpy array or a torch tensor. `to_heat` wraps
a dlpart array so that its ``__partitioned__`` has exactly that form, over the partitions' memory
(no copy): ranks as locations (this process's rank for the data held here), ``locals`` (the
partitions held here, unless the array has its own), and numpy data for host memory (torch for
arrays that came from torch, as heat's own do), torch tensors on their GPU for GPU memory
(heat is built on torch). heat's own dicts come back out in their form unchanged: dlpart keeps
a rank as a rank.

heat wraps a numpy array with ``torch.from_numpy`` and writes into it, so read-only partitions
(JAX arrays, read-only numpy arrays) go to heat as writable copies, and only those: heat then
never writes memory its producer does not allow written.

Over MPI, heat also needs one partition per rank, rank ``r`` holding the ``r``-th slab along one
split axis (or one partition with a copy on every rank: heat's replicated ``split=None``, as
`dlpart.mpi.from_partitioned` reads it from heat), and memory a torch tensor can hold.
`to_heat` checks a `dlpart.mpi.SpmdArray` for both (collective: every rank reaches the same
verdict, so none is left waiting after heat raised on another), and with ``split=k`` first
repartitions it into heat's own balanced chunks along axis ``k`` (one ``Alltoallv``).
"""

import sys
from typing import Any, Callable, List, Optional, Sequence

from .. import DeviceError, PartitionedArray, ProtocolError, Tensor
from .. import from_partitioned as _import
from .._partitioned import _HOST, _TORCH_GPUS, _converter, _rank_arg, _to_numpy, _to_torch
from .._types import PartitionedDict

__all__ = ["HeatPartitioned", "heat_splits", "to_heat"]


def _rank(comm) -> int:
    """``comm``'s rank; else ``COMM_WORLD``'s when the program has initialised MPI (dlpart never
    initialises it: that would tie the process to an MPI job it may not be part of); else 0."""
    if comm is not None:
        return comm.Get_rank()
    MPI = sys.modules.get("mpi4py.MPI")
    if MPI is not None and MPI.Is_initialized() and not MPI.Is_finalized():
        return MPI.COMM_WORLD.Get_rank()
    return 0


# The element types heat has (``heat.core.types``): it refuses the others (bfloat16, float8,
# uint16 to uint64) when it wraps the data, on the ranks that hold some, with a TypeError
# that does not say which partition.
_HEAT_DTYPES = ("bool", "uint8", "int8", "int16", "int32", "int64", "float16", "float32",
                "float64", "complex64", "complex128")


def _check_heat_dtype(dtype: Optional[str]) -> None:
    if dtype is not None and dtype not in _HEAT_DTYPES:
        raise TypeError(f"heat has no type for {dtype} data (its types: "
                        f"{', '.join(_HEAT_DTYPES)}): convert the array to one of them first")


def _writable_numpy(t: Tensor) -> Any:
    """Host data as numpy for heat: a view of ``t``, or of a kDLCPU copy of it where ``t`` is
    read-only (heat writes into what it is given, through ``torch.from_numpy``)."""
    return _to_numpy(t.to("cpu") if t.readonly else t)


def _torch_device_of_heat() -> Any:
    """The torch device of heat's default device, where the program has imported heat (dlpart
    never imports it: that initialises MPI); else None."""
    heat = sys.modules.get("heat")
    if heat is None:
        return None
    import torch

    try:
        return torch.device(heat.get_device().torch_device)
    except Exception:  # a heat dlpart does not know: nothing to compare with
        return None


def _gpu_torch(t: Tensor) -> Any:
    """GPU data as a torch tensor on its GPU, through DLPack (a copy there where ``t`` is
    read-only), for heat, which holds every chunk as a torch tensor; a `dlpart.DeviceError`
    naming the device and the way out where torch cannot take it, or where heat's default
    device is another one (heat labels the array with its default device, not the data's)."""
    try:
        x = _to_torch(t)
    except (RuntimeError, AssertionError, BufferError, TypeError, ImportError) as e:
        raise DeviceError(
            f"heat holds each partition as a torch tensor, and torch cannot take the data on "
            f"{t.device} here ({type(e).__name__}: {e}); copy the array to the host first "
            f"(its .to('cpu'))") from e
    heat_device = _torch_device_of_heat()
    if heat_device is not None and x.device != heat_device:
        raise DeviceError(
            f"data on {t.device} is torch device {x.device}, but heat's default device is "
            f"{heat_device}, which heat would label the array with: call ht.use_device('gpu') "
            f"on the GPU the data is on before ht.from_partitioned, or copy the array to the "
            f"host first (its .to('cpu'))")
    return x


def _heat_data(t: Tensor) -> Any:
    """``t`` as heat takes it: numpy over host memory (a writable copy of read-only data), a
    torch tensor on its GPU for GPU memory; a `dlpart.DeviceError` for other devices, whose
    memory torch cannot hold."""
    kind = t.device.kind
    if kind in _HOST:
        return _writable_numpy(t)
    if kind in _TORCH_GPUS:
        return _gpu_torch(t)
    raise DeviceError(
        f"heat holds each partition as a torch tensor, which cannot hold data on {t.device}: "
        f"copy it to the host or a GPU torch can use with its own library first")


def _heat_converter(framework: Optional[str], array_framework: Optional[str]
                    ) -> Optional[Callable[[Tensor], Any]]:
    """What hands each partition to heat: ``framework``'s converter where one is named (numpy
    writable as in `_writable_numpy`), torch for arrays that came from torch (copies of
    read-only data, as `_to_torch` makes; GPU data checked as `_gpu_torch` checks it), and
    `_heat_data` otherwise."""
    if framework == "numpy":
        return _writable_numpy
    if framework is not None:
        return _converter(framework)
    if array_framework == "torch":
        return lambda t: _gpu_torch(t) if t.device.kind in _TORCH_GPUS else _to_torch(t)
    return _heat_data


class HeatPartitioned:
    """An object whose ``__partitioned__`` is ``array``'s dict in heat's form. ``framework``:
    the data's (None: torch for arrays that came from torch; for the others numpy for host
    memory, a writable copy of read-only data, and torch on its GPU for GPU memory)."""

    def __init__(self, array: PartitionedArray, rank: int, framework: Optional[str] = None):
        self.array = array
        self.rank = rank
        self.framework = framework

    @property
    def __partitioned__(self) -> PartitionedDict:
        # Data held here is written on this rank; any other partition needs its rank.
        for pos, p in self.array.partitions.items():
            rankless = [loc for loc in p.locations if loc.rank is None]
            if p.tensor is None and (rankless or not p.locations):
                where = (f"its location {rankless[0]} is not an MPI rank" if rankless
                         else "its location is empty")
                raise ProtocolError(
                    f"heat reads each partition's rank as int(location[0]): partition {pos} "
                    f"is not held here and {where}, so it names no rank")
        # heat takes numpy arrays and torch tensors, nothing else.
        convert = _heat_converter(self.framework, self.array._framework)
        d = self.array._dict(convert, "rank", _rank_arg(self.rank))
        if "locals" not in d:
            d["locals"] = [pos for pos, p in self.array.partitions.items()
                           if p.tensor is not None]
        return d


def heat_splits(shape: Sequence[int], split: int, size: int) -> List[List[int]]:
    """The split points of heat's balanced distribution of ``shape`` over ``size`` ranks along
    axis ``split`` (heat's ``comm.chunk``: the first ``n % size`` ranks hold one more)."""
    n = shape[split]
    counts = [n // size + (1 if r < n % size else 0) for r in range(size)]
    points = [0]
    for c in counts:
        points.append(points[-1] + c)
    return [points if axis == split else [0, m] for axis, m in enumerate(shape)]


def _replicated(array: Any) -> bool:
    """Whether ``array`` is one partition over several ranks, which heat reads as replicated
    (``split=None``) when every rank holds a copy (see `_check_heat_memory`)."""
    return array.comm.size > 1 and all(n == 1 for n in array.tiling)


def _check_heat_layout(array: Any) -> None:
    """Raises `dlpart.ProtocolError` unless each rank of ``array.comm`` holds exactly one
    partition, the ``r``-th along at most one tiled axis on rank ``r``, none of them the whole
    (non-empty) axis, or the array is one partition (heat's replicated form): what heat reads.
    heat infers its split axis from where a rank's chunk is shorter than the whole, so a rank
    holding all of it would take the array as unsplit while the others split it. Only global
    metadata is read: every rank raises or none does."""
    if _replicated(array):
        return
    size = array.comm.size
    tiled = [axis for axis, n in enumerate(array.tiling) if n > 1]
    axis = tiled[0] if tiled else 0
    hint = "; pass split= to repartition into heat's layout"
    if len(tiled) > 1 or array.tiling[axis] != size:
        raise ProtocolError(f"heat reads one partition per rank along one axis: tiling "
                            f"{tuple(array.tiling)} over {size} ranks{hint}")
    # C order: with one tiled axis, the n-th entry is the n-th slab along it.
    entries = array._core.entries()
    for pos, (_, _, _, _, locs) in enumerate(entries):
        ranks = [rank for _, _, _, rank in locs]
        if ranks != [pos]:
            raise ProtocolError(f"heat reads the partitions in rank order: partition {pos} "
                                f"along axis {axis} is on ranks {ranks}, not [{pos}]{hint}")
    for pos, (_, _, shape, _, _) in enumerate(entries):
        if size > 1 and shape[axis] == array.shape[axis] > 0:
            raise ProtocolError(f"heat infers the split axis from each rank's chunk: rank {pos} "
                                f"holds all {shape[axis]} of axis {axis}, so heat would take it "
                                f"as unsplit there and split on the other ranks")


def _check_heat_memory(array: Any) -> None:
    """Raises `dlpart.ProtocolError` on every rank (one collective call) when a rank holds a
    partition heat cannot take over: a view with a negative stride, or, for heat's replicated
    form, no copy of the one partition. heat holds each rank's chunk as a torch tensor, and
    torch has no negative strides, so heat would raise on that rank alone while the others went
    on to their next collective call and waited there."""
    from .. import _core
    from ..mpi import _agreed

    failed = None
    if _replicated(array) and not array.locals:
        failed = ProtocolError(
            f"heat reads one partition over {array.comm.size} ranks as replicated (split=None), "
            f"a copy on every rank, and rank {array.comm.rank} holds none; pass split= to "
            f"repartition into heat's layout")
    for pos in array.locals:
        t = array.partitions[pos].tensor
        if t is not None and any(s < 0 for s in t.strides):
            failed = ProtocolError(
                f"partition {pos} is a view with strides {tuple(t.strides)}: heat holds each "
                f"rank's chunk as a torch tensor, which cannot have a negative stride; pass "
                f"split= to give heat new memory, or pass from_local a copy")
            break
    _agreed(failed, lambda error: _core._spmd_check(array.comm, error, "to_heat"))


def to_heat(obj: Any, comm: Any = None, framework: Optional[str] = None,
            split: Optional[int] = None) -> HeatPartitioned:
    """``obj`` (a `PartitionedArray`, or anything `dlpart.from_partitioned` takes) for
    ``ht.from_partitioned``. ``comm`` (an mpi4py communicator; default ``COMM_WORLD`` once the
    program has initialised MPI, else rank 0) gives this process's rank; ``framework`` the data's
    (default: torch for arrays that came from torch; for all others numpy over host memory and
    torch tensors on their GPU for GPU memory (cupy, JAX or dlpart data on a CUDA device), as
    heat takes nothing else; numpy holds host data only). heat writes into what it is given:
    read-only partitions (JAX arrays, read-only numpy arrays) go to it as writable copies,
    and only those. GPU data needs heat on that GPU (``ht.use_device('gpu')``, as heat labels
    the array with its default device): `dlpart.DeviceError` says so where heat is on another
    device, or where torch cannot take the data, naming the device and the way out. An element
    type heat has no type for (bfloat16, float8, uint16 to uint64) is a TypeError naming it.

    For a `dlpart.mpi.SpmdArray` the call is collective. The array must already be in heat's
    layout (one partition per rank, in rank order along one axis), over memory torch can hold
    (no negative strides), or `dlpart.ProtocolError` is raised on every rank; or ``split=k``
    repartitions it there first: heat's balanced chunks along axis ``k``, the ``r``-th on rank
    ``r``, in new memory. Its own communicator gives the rank (``comm`` is not needed)."""
    # no MPI needed: the module loads mpi4py only for a communicator
    from ..mpi import SpmdArray, _axis, _checked

    array = obj if isinstance(obj, SpmdArray) else _import(obj)
    _check_heat_dtype(array.dtype)  # global: every rank of an SpmdArray raises alike
    if isinstance(array, SpmdArray):
        if split is not None:
            # Checked on every rank (one bad rank must not leave the others in the exchange).
            split = _checked(array.comm, lambda: _axis(split, array.ndim))
            size = array.comm.size
            grid = [size if axis == split else 1 for axis in range(array.ndim)]
            array = array.repartition(splits=heat_splits(array.shape, split, size),
                                      process_grid=grid)
        _check_heat_layout(array)
        _check_heat_memory(array)
        return HeatPartitioned(array, array.comm.rank, framework)
    if split is not None:
        raise TypeError(f"to_heat(split={split}) repartitions a dlpart.mpi.SpmdArray across "
                        f"the ranks, not a {type(array).__name__}")
    return HeatPartitioned(array, _rank(comm), framework)
