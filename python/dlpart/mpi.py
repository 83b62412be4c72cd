"""SPMD partitioned arrays over MPI (mpi4py): each rank holds its own partitions of one global
array, and repartitioning moves the boxes between ranks.

Every function here and every method of `SpmdArray` that computes or moves data is
*collective* (the readers of this rank's own view are not: ``tensors()``, ``__distarray__``,
``__partitioned__``, ``partitions``, ``fetch``): all ranks of the communicator call it, in the
same order, with the same global arguments (the layout, the root). Ranks that disagree, or a
rank that fails (bad input, a failed import, a read-only target, a failed allocation or GPU
copy), make every rank raise the same error (`dlpart.ProtocolError`, or the failed rank's error
class, or the nearest built-in one for a class of the program's own, its message prefixed with
``rank N:``) instead of leaving the others waiting. A KeyboardInterrupt or SystemExit raised
on one rank while it checks its arguments is raised again there, the others raising a
RuntimeError that names it (``rank N: KeyboardInterrupt``). The logic
is the Rust crate's (``dlpart::spmd``); this module lends it the mpi4py communicator, whose own
``allgather`` moves the metadata and whose ``Isend`` and ``Irecv`` move the data, only between
ranks that have bytes for each other, each peer's bytes in messages of at most 1 GiB (MPI counts
are C ints; rank 0's ``DLPART_MPI_MESSAGE_BYTES`` sets another size, for tests, handed to
every rank once). They run on dlpart's own duplicate of the communicator, made by the first
dlpart call on it and cached on it, so they never meet the program's own messages.

Device buffers go to MPI directly when it is CUDA-aware (``MPI.Query_cuda_support()``), else
through pinned (page-locked) host memory, which the GPU copies to and from at the bus's rate.
Pinned buffers are kept per device for reuse, up to ``DLPART_PINNED_CACHE_BYTES`` bytes (256 MiB
by default); a staging buffer larger than that is ordinary host memory (pinning a new GiB takes
longer than the copy it speeds up), and when no pinned memory can be had, the exchange stages
through ordinary host memory too.

::

    from mpi4py import MPI
    import dlpart.mpi

    rows = dlpart.mpi.from_local(my_rows, MPI.COMM_WORLD, axis=0)   # row blocks in rank order
    cols = rows.repartition((1, MPI.COMM_WORLD.size))                # one exchange
    whole = cols.assemble(root=0)                                    # a Tensor on rank 0
"""

from __future__ import annotations

from typing import Any, Dict, List, NamedTuple, Optional, Sequence, Union

from . import _core
from ._core import Device, Tensor
from ._location import this_host
from ._types import ArrayLike, DeviceLike, IndicesLike, SplitsLike
from ._partitioned import (
    PartitionedArray,
    _devices_arg,
    _framework_of,
    _opt_block,
    _opt_list,
    _opt_splits,
)
from ._partitioned import from_partitioned as _from_partitioned

__all__ = ["SpmdArray", "Traffic", "from_distarray", "from_local", "from_partitioned"]


class Traffic(NamedTuple):
    """The bytes one collective operation moved on this rank."""

    sent: List[int]
    """Bytes sent to each rank (0 for this rank: local boxes are never sent)."""
    received: List[int]
    """Bytes received from each rank."""
    local: int
    """Bytes copied between this rank's own partitions."""


_KEYVAL = None


def _own(comm, make):
    """dlpart's communicator over ``comm``: ``make(dup)`` over dlpart's duplicate of it, for
    its point-to-point messages, which then never meet the program's own receives (a wildcard
    ``Irecv`` pending on ``comm`` included). Made on first use (``comm.Dup()`` and one
    ``allgather`` of the message size, collective as the dlpart call making it; when ``make``
    raises, the duplicate is freed and nothing is cached) and cached on ``comm``
    as an MPI attribute (its duplicate freed with ``comm``), as MPI libraries do: later calls
    on ``comm`` reuse it and agree on nothing again. An object that is not an mpi4py
    communicator is wrapped as it is, by every call."""
    global _KEYVAL
    from mpi4py import MPI

    if not isinstance(comm, MPI.Comm):
        return make(comm)
    if _KEYVAL is None:
        _KEYVAL = MPI.Comm.Create_keyval(delete_fn=_free_own)
    own = comm.Get_attr(_KEYVAL)
    if own is None:
        dup = comm.Dup()
        try:
            own = make(dup)
        except BaseException:
            dup.Free()  # on every rank: make shares its failures in its collective call
            raise
        comm.Set_attr(_KEYVAL, own)
    return own


def _free_own(comm, keyval, own) -> None:
    from mpi4py import MPI

    if not MPI.Is_finalized() and own.comm != MPI.COMM_NULL:
        own.comm.Free()


def _comm(comm) -> _core._MpiComm:
    if isinstance(comm, _core._MpiComm):
        return comm
    if not callable(getattr(comm, "Get_rank", None)):
        raise TypeError(f"comm must be an mpi4py communicator, not {type(comm).__name__}")
    from mpi4py import MPI  # loaded already: the caller holds one of its communicators

    if isinstance(comm, MPI.Comm) and comm.Is_inter():
        # Its collectives gather the remote group's items, not this group's.
        raise TypeError("dlpart's collective calls need an intracommunicator: merge the "
                        "intercommunicator's groups first (comm.Merge())")

    def make(own):
        cuda_aware = False
        query = getattr(MPI, "Query_cuda_support", None)
        if query is not None:
            try:
                cuda_aware = bool(query())
            except Exception:  # noqa: BLE001 - an MPI without the extension is not CUDA-aware
                cuda_aware = False
        # This rank's address before any collective call: when it cannot be had, the others
        # learn of it in the first one rather than wait for this rank in it.
        host, failed = "", None
        try:
            host = this_host()
        except BaseException as e:  # noqa: BLE001 - every rank must learn of this rank's failure
            failed = e
        # Collective: one allgather of every rank's DLPART_MPI_MESSAGE_BYTES (rank 0's is the
        # cut of every exchange) and failure, which every rank then raises.
        return _agreed(failed, lambda error: _core._MpiComm(own, host, cuda_aware, error))

    return _own(comm, make)


def _same_ranks(a: _core._MpiComm, b: _core._MpiComm) -> bool:
    """Whether the communicators hold the same processes in the same order (mpi4py's
    ``Compare`` is ``IDENT`` or ``CONGRUENT``; a local call): rank ``r`` of one is rank ``r``
    of the other."""
    if a is b:
        return True
    from mpi4py import MPI

    x, y = a.comm, b.comm
    if isinstance(x, MPI.Comm) and isinstance(y, MPI.Comm):
        return MPI.Comm.Compare(x, y) in (MPI.IDENT, MPI.CONGRUENT)
    return x is y


def _error(e: BaseException):
    """``(class name, message)`` of this rank's error for the other ranks, which raise it
    again: the nearest class they can make (a built-in or one of dlpart's own), the error's
    own class named in front of the message when it is another (a user's ValueError subclass
    arrives as ValueError)."""
    import builtins

    own = (_core.ProtocolError, _core.DeviceError, _core.BackendUnavailableError)
    # BaseException, a built-in, ends every class's MRO.
    cls = next(c for c in type(e).__mro__
               if c in own or getattr(builtins, c.__name__, None) is c)
    try:
        text = str(e)
    except Exception:  # noqa: BLE001 - a program's error whose __str__ raises
        text = f"(a {type(e).__qualname__} whose str() raised)"
    if not isinstance(e, Exception):
        # KeyboardInterrupt, SystemExit: not the other ranks' to raise; they raise RuntimeError.
        return ("RuntimeError", f"{type(e).__qualname__}: {text}" if text else type(e).__qualname__)
    if cls is type(e):
        return (cls.__name__, text)
    return (cls.__name__, f"{type(e).__qualname__}: {text}")


def _agreed(failed: Optional[BaseException], call):
    """``call(error)``, a collective call told this rank's own error (or None); when it raises
    the error the ranks agreed on, this rank's original error is its ``__cause__``. A
    KeyboardInterrupt or SystemExit here is raised again itself once the others know of it."""
    try:
        return call(None if failed is None else _error(failed))
    except Exception as agreed:
        if failed is None:
            raise
        if not isinstance(failed, Exception):
            raise failed from None
        raise agreed from failed


def _checked(comm, make):
    """``make()``, or, when it raises, this rank's error raised on every rank: the others are
    making the collective call this rank cannot make, and learn of the error there (a
    KeyboardInterrupt or SystemExit as a RuntimeError naming it; this rank raises it again)."""
    try:
        return make()
    except BaseException as e:  # noqa: BLE001 - every rank must learn of this rank's failure
        _agreed(e, lambda error: _core._spmd_fail(comm, *error))
        raise  # not reached: _spmd_fail always raises


def _index(x, what: str) -> int:
    """``x`` as an int (anything with ``__index__``) within 64 bits, or a TypeError naming the
    argument (a ValueError naming it and the value beyond 64 bits)."""
    import operator

    try:
        v = operator.index(x)
    except TypeError:
        raise TypeError(f"{what} must be an integer, not {type(x).__name__} {x!r}") from None
    if not -(1 << 63) <= v < 1 << 64:
        raise ValueError(f"{what} {v} does not fit in 64 bits")
    return v


def _axis(axis, ndim: int) -> int:
    """``axis`` in ``[0, ndim)``, negative ones counted from the end, as numpy does."""
    import operator

    a = operator.index(axis)
    if not -ndim <= a < ndim:
        raise ValueError(f"axis {axis} is out of range for the {ndim}-d array")
    return a + ndim if a < 0 else a


def _as_tensor(x) -> Tensor:
    return x if isinstance(x, Tensor) else _core.from_dlpack(x)


def _local_items(parts, axis):
    """This rank's ``(start or None, tensor)`` pairs, and the first array (for its framework)."""
    if parts is None:
        return [], None
    if axis is not None:
        arrays = list(parts) if isinstance(parts, (list, tuple)) else [parts]
        return [(None, _as_tensor(a)) for a in arrays], (arrays[0] if arrays else None)
    if not isinstance(parts, (dict, list, tuple)):
        raise TypeError(
            f"from_local without axis= takes (start, array) pairs or a dict {{start: array}}, "
            f"not {type(parts).__name__}; pass axis= to stack arrays in rank order")
    pairs = list(parts.items()) if isinstance(parts, dict) else list(parts)
    out = []
    for pair in pairs:
        try:
            start, array = pair
        except (TypeError, ValueError):
            raise TypeError(
                f"from_local without axis= takes (start, array) pairs or a dict {{start: array}}; "
                f"got {type(pair).__name__}") from None
        out.append((_opt_list(start, "start"), _as_tensor(array)))
    return out, (pairs[0][1] if pairs else None)


def from_local(parts: Any, comm: Any, *, axis: Optional[int] = None,
               shape: Optional[Sequence[int]] = None) -> "SpmdArray":
    """An SPMD array from every rank's own partitions (collective).

    ``parts`` is this rank's share, any DLPack arrays: with ``axis=k``, one array or a list of
    them, stacked along axis ``k`` after the lower ranks' (like ``numpy.concatenate`` of every
    rank's list in rank order); without ``axis``, ``(start, array)`` pairs or a dict ``{start:
    array}`` giving each partition's global offset. ``None`` or ``[]`` when the rank has none.
    ``shape`` states the global shape (by default, the bounding box of all partitions). In
    the placed form, partitions of zero extent at one offset along an axis share a slab there;
    stack them with ``axis=`` to give each its own.

    One ``allgather`` of metadata; then every rank builds and checks the same global grid.
    The result's ``__partitioned__`` has ``locals`` (this rank's positions), ``data = None``
    for the other ranks' partitions and draft-2 locations ``(ip, pid, device)``: the same
    dict on every rank but for ``data`` and ``locals``.
    """
    c = _comm(comm)
    items: list = []
    first = failed = ax = dims = None
    try:
        items, first = _local_items(parts, axis)
        if axis is not None:
            ax = _index(axis, "axis")
            if ax < 0:
                raise ValueError(f"axis={axis}: give a non-negative axis")
        dims = _opt_list(shape, "shape")
    except BaseException as e:  # noqa: BLE001 - every rank must learn of this rank's failure
        failed, items, first, ax, dims = e, [], None, None, None
    core = _agreed(failed, lambda error: _core._spmd_from_local(c, items, ax, dims, error))
    return SpmdArray._spmd(core, c, None, _framework_of(first) if first is not None else None)


def from_distarray(obj: Any, comm: Any) -> "SpmdArray":
    """An SPMD array from every rank's share of a Distributed Array Protocol array (an object
    with ``__distarray__``, or its dict), collective: each run of contiguous indices of the
    rank's buffer becomes one of its partitions, a view (no copy), placed at its global start
    (see `from_local`). The dimension dictionaries' process grid must be the communicator's,
    its coordinates the ranks' in C order. Communication padding is left out, boundary
    padding kept (on a ``periodic`` axis, as `dlpart.from_distarray` says). An index of an
    unstructured axis that several ranks hold (``one_to_one`` absent or False) is read from the
    lowest rank holding it (its value, where the copies differ), the others' copies left out;
    with ``one_to_one=True`` it is a `dlpart.ProtocolError` on every rank. So is
    communication padding wider than the indices the neighbouring rank owns, or unequal to the
    neighbour's padding facing it (across the wrap-around too, on a ``periodic`` axis), ranks
    that disagree on ``periodic``, ranks that give one axis different ``dist_type`` or
    ``size`` values, ranks at one ``proc_grid_rank`` of a block axis that own different
    indices (``start`` to ``stop`` less communication padding: boundary padding may differ),
    blocks that own an index twice or not at all (so an undistributed axis, ``{}`` included, is
    owned whole by every rank), ranks at one ``proc_grid_rank`` of a cyclic axis that give
    different ``start`` or ``block_size`` values, and cyclic blocks that hold an index twice or
    not at all. The ranks exchange each index list as its runs of consecutive indices: the
    metadata grows with the runs, not with the indices."""
    from . import _distarray

    c = _comm(comm)
    buffer = dims = failed = None
    try:
        buffer, dims = _distarray.read(obj)
    except BaseException as e:  # noqa: BLE001 - every rank must learn of this rank's failure
        failed = e
    core = _agreed(failed, lambda error: _core._spmd_from_distarray(c, buffer, dims, error))
    return SpmdArray._spmd(core, c, None, "numpy")


def from_partitioned(obj: Any, comm: Any) -> "SpmdArray":
    """An SPMD array from a producer's ``__partitioned__`` dict (or object), read on every rank
    (collective): heat's int-rank locations and draft-2 ``(ip, pid, device)`` locations of the
    ranks' processes both name the owning rank. Every rank must read the same global grid."""
    c = _comm(comm)
    failed = None
    try:
        pa = _from_partitioned(obj)
        core, framework = pa._core, pa._framework
    except BaseException as e:  # noqa: BLE001 - every rank must learn of this rank's failure
        core, framework, failed = None, None, e
    core = _agreed(failed, lambda error: _core._spmd_with_ranks(c, core, error))
    return SpmdArray._spmd(core, c, None, framework)


class SpmdArray(PartitionedArray):
    """A `dlpart.PartitionedArray` spread over the ranks of an MPI communicator: this rank holds
    the partitions in ``locals``; the others are ``None`` here. ``repartition``,
    ``repartition_into``, ``assemble``, ``gather``, ``scatter`` and ``to`` are collective.
    ``traffic`` holds the bytes the operation that made this array moved on this rank
    (`Traffic`), or None."""

    __slots__ = {
        "comm": "dlpart's communicator over the mpi4py one the array was made on (an "
                "`_MpiComm`, not an mpi4py communicator): ``rank`` and ``size`` are this rank "
                "and the ranks' count, ``comm`` dlpart's own duplicate of the mpi4py "
                "communicator, which its messages use. The array's collective calls run on "
                "it; `dlpart.mpi`'s functions take it where they take a communicator.",
        "traffic": "The bytes the operation that made this array moved on this rank "
                   "(`Traffic`), or None.",
    }

    @classmethod
    def _spmd(cls, core, comm, traffic, framework) -> "SpmdArray":
        a = cls._wrap(core, None, None, framework)
        a.comm = comm
        a.traffic = None if traffic is None else Traffic(*traffic)
        return a

    def __distarray__(self) -> Dict[str, Any]:
        """The Distributed Array Protocol's (0.10) dict of this rank's share: its one
        partition's memory as the buffer, a block dimension dictionary per axis. The partition
        grid is the process grid, so partition ``f`` (C order) must be on rank ``f`` alone
        (`repartition` with ``process_grid=`` makes such a layout). Not collective: every
        rank reads the same global layout, so all raise or none does."""
        from . import _distarray

        return _distarray.describe(self, self.comm.rank, self.comm.size)

    def _rank_devices(self) -> List[str]:
        """The device of each rank's first partition (the host for a rank without one)."""
        found = {}
        for _, _, _, _, locs in self._core.entries():
            for _, _, device, rank in locs:
                if rank is not None:
                    found.setdefault(rank, str(device))
        return [found.get(r, "kDLCPU") for r in range(self.comm.size)]

    def tensors(self) -> List[Tensor]:
        """Every partition's tensor in C order, where this rank holds them all (one rank, or a
        replicated array such as heat's ``split=None``); otherwise a ValueError naming a
        partition held elsewhere. This rank's own are ``[a.partitions[p].tensor for p in
        a.locals]``. Not collective."""
        for pos, _, _, data, locs in self._core.entries():
            if data is None:
                owner = next((r for *_, r in locs if r is not None), None)
                raise ValueError(
                    f"SpmdArray.tensors: partition {tuple(pos)} is rank {owner}'s, and rank "
                    f"{self.comm.rank} holds only its locals {self.locals}: take those with "
                    f"[a.partitions[p].tensor for p in a.locals], or assemble the array")
        return super().tensors()

    def to(self, device: DeviceLike) -> "SpmdArray":
        """Every partition this rank holds copied onto ``device`` (an explicit transfer;
        partitions already there are shared, not copied), over the same grid and ranks, with
        the same ``locals`` (collective). Each rank names its own device and the ranks may
        name different ones (``f"cuda:{comm.rank % gpus}"``); every rank learns the others',
        so the result's locations name each partition's new device on every rank. A failure
        on any rank (a device not here, data on a device without dlpart kernels) is raised on
        every rank, and nothing changes."""
        core = _core._spmd_to(self.comm, self._core, device)
        return SpmdArray._spmd(core, self.comm, None, None)

    def repartition(self, tiling: Optional[Sequence[int]] = None, *,
                    splits: Optional[SplitsLike] = None,
                    block_cyclic: Union[int, Sequence[int], None] = None,
                    devices: Union[DeviceLike, Sequence[DeviceLike], None] = None,
                    process_grid: Optional[Sequence[int]] = None,
                    transfer: bool = False) -> "SpmdArray":
        """The same array over another grid, across the ranks (collective): one exchange.

        The target is named as for `dlpart.PartitionedArray.repartition`. Each target
        partition goes to the rank (and device) of the source partition holding its first
        element; ``block_cyclic`` (or ``devices`` with ``process_grid``) deals the partitions
        over the ranks instead, ``devices`` then listing one device per rank (by default each
        rank's own; a 0-d array's one partition goes to rank 0). Boxes that stay on a rank are copied there, never sent (see ``traffic``).
        Targets on another device than a rank's sources need ``transfer=True``, unless both
        are host memory (of any kinds: a plain copy), as in one process.
        New partitions are the memory their device names, as in one process: pinned memory
        from CUDA on ``kDLCUDAHost``, and a BufferError on every rank for managed or ROCm host
        memory, which dlpart does not make.
        """
        def layout():
            devs = devices
            if devs is None and (block_cyclic is not None or process_grid is not None):
                devs = self._rank_devices()
            return dict(tiling=_opt_list(tiling), splits=_opt_splits(splits),
                        block_cyclic=_opt_block(block_cyclic), devices=_devices_arg(devs),
                        process_grid=_opt_list(process_grid, "process_grid"))

        def args():
            return dict(layout(), transfer=bool(transfer))

        core, traffic = _core._spmd_repartition(self.comm, self._core, **_checked(self.comm, args))
        return SpmdArray._spmd(core, self.comm, traffic, self._framework)

    def repartition_into(self, out: PartitionedArray, *, transfer: bool = False) -> PartitionedArray:
        """Copies this array into the SPMD array ``out``'s partitions (collective); nothing is
        written on any rank unless every rank's checks pass; a replicated ``out`` (heat's
        ``split=None``) is refused. Returns ``out``, whose
        ``traffic`` then holds this exchange's byte counts."""
        def target():
            if not isinstance(out, PartitionedArray):
                raise TypeError(f"repartition_into writes into a dlpart.PartitionedArray (an "
                                f"SpmdArray), not {type(out).__name__}")
            if isinstance(out, SpmdArray) and not _same_ranks(self.comm, out.comm):
                raise ValueError(f"repartition_into needs out over this array's ranks, in the "
                                 f"same order: out is over another communicator (size "
                                 f"{out.comm.size}, rank {out.comm.rank} here; this array's: "
                                 f"size {self.comm.size}, rank {self.comm.rank})")
            return out._core, bool(transfer)

        core, move = _checked(self.comm, target)
        traffic = _core._spmd_repartition_into(self.comm, self._core, core, move)
        if isinstance(out, SpmdArray):
            out.traffic = Traffic(*traffic)
        return out

    def assemble(self, *, root: Optional[int] = 0, device: Optional[DeviceLike] = None,
                 transfer: bool = False) -> Optional[Tensor]:
        """The whole array as one tensor on rank ``root`` (None on the other ranks), or on every
        rank with ``root=None`` (collective). ``device`` defaults to the device of the receiving
        rank's first partition; with a ``root`` it is a global argument, the same on every rank,
        and with ``root=None`` each rank names the device of its own copy (or none), whatever
        the others name. Another device than a rank's partitions needs ``transfer=True``,
        unless both are host memory (of any kinds)."""
        def args():
            at = None if root is None else _index(root, "root")
            if at is not None and not 0 <= at < self.comm.size:
                raise ValueError(f"assemble onto one of the {self.comm.size} ranks: rank {root}")
            return at, None if device is None else Device(device), bool(transfer)

        at, dev, move = _checked(self.comm, args)
        return _core._spmd_assemble(self.comm, self._core, at, dev, move)

    def gather(self, indices: IndicesLike, axis: int = 0, *, transfer: bool = False) -> "SpmdArray":
        """``numpy.take(self, indices, axis)`` across the ranks (collective; every rank passes the
        same indices): each index is served by the rank holding it, the picked slabs travel in
        one exchange. The result keeps this array's split points on the other axes, one
        slab along ``axis`` (none for one index, which drops the axis as numpy does); each
        partition goes to the rank of the source partition holding its first element. An
        index out of range raises on every rank before anything moves. A rank's partitions
        live on one device, host memory of any kinds counting as one (``transfer`` is
        accepted for the signature)."""
        idx, ax = _checked(self.comm, lambda: (_core._indices_tensor(indices),
                                               _axis(axis, self.ndim)))
        core, traffic = _core._spmd_gather(self.comm, self._core, idx, ax)
        return SpmdArray._spmd(core, self.comm, traffic, self._framework)

    def scatter(self, values: ArrayLike, indices: IndicesLike, axis: int = 0, *, transfer: bool = False) -> None:
        """``self[.., indices, ..] = values`` along ``axis`` across the ranks (collective; every
        rank passes the same indices and the whole ``values``): each rank writes the indices
        in the partitions it holds (its copy too, in a replicated array such as heat's
        ``split=None``), so nothing travels. Checked, and each partition's rows picked, on
        every rank before the ranks agree: an error there, anywhere, writes nothing anywhere.
        Only a GPU's failing write can fail after that: every rank then raises that rank's
        error, its partitions before the failed one (C order) hold the new values, the
        failed one may hold some, the later ones their old values, and the other ranks'
        partitions the new values. The ranks compare the indices and the values'
        shape and dtype, not the values' contents (that would cost a pass over them): each
        rank writes from its own ``values``. ``values`` broadcast as `dlpart.scatter`
        broadcasts them, and scalars are read as it reads them; they are on each rank's
        device, or host values writing host memory of any kind in place, or a scalar (or a
        0-d host array), which writes partitions on any device, its one element copied to
        each rank's device once (``transfer`` is accepted for the signature)."""
        from ._functions import _values

        v, idx, ax = _checked(self.comm, lambda: (_as_tensor(_values(values, self.dtype)),
                                                  _core._indices_tensor(indices),
                                                  _axis(axis, self.ndim)))
        _core._spmd_scatter(self.comm, self._core, v, idx, ax)

    def __repr__(self) -> str:
        return (f"SpmdArray(shape={self.shape}, tiling={self.tiling}, dtype={self.dtype}, "
                f"rank={self.comm.rank} of {self.comm.size}, locals={self.locals})")
