"""dlpart arrays for heat's ``ht.from_partitioned``.

heat reads SPMD dicts only: ``locals`` lists this rank's one partition, ``int(location[0])`` is
each partition's MPI rank, and the data must be a numpy array or a torch tensor. `to_heat` wraps
a dlpart array so that its ``__partitioned__`` has exactly that form, over the partitions' memory
(no copy): ranks as locations (this process's rank for the data held here), ``locals`` (the
partitions held here, unless the array has its own), and numpy data (torch for arrays that came
from torch, as heat's own do). heat's own dicts come back out in their form unchanged: dlpart
keeps a rank as a rank.
"""

import sys
from typing import Any, Optional

from .. import PartitionedArray
from .. import from_partitioned as _import
from .._types import PartitionedDict

__all__ = ["HeatPartitioned", "to_heat"]


def _rank(comm) -> int:
    """``comm``'s rank; else ``COMM_WORLD``'s when the program has initialised MPI (dlpart never
    initialises it: that would tie the process to an MPI job it may not be part of); else 0."""
    if comm is not None:
        return comm.Get_rank()
    MPI = sys.modules.get("mpi4py.MPI")
    if MPI is not None and MPI.Is_initialized() and not MPI.Is_finalized():
        return MPI.COMM_WORLD.Get_rank()
    return 0


class HeatPartitioned:
    """An object whose ``__partitioned__`` is ``array``'s dict in heat's form."""

    def __init__(self, array: PartitionedArray, rank: int, framework: Optional[str] = None):
        self.array = array
        self.rank = rank
        self.framework = framework

    @property
    def __partitioned__(self) -> PartitionedDict:
        d = self.array.to_partitioned(framework=self.framework, locations="rank", rank=self.rank)
        if "locals" not in d:
            d["locals"] = [pos for pos, p in self.array.partitions.items()
                           if p.tensor is not None]
        return d


def to_heat(obj: Any, comm: Any = None, framework: Optional[str] = None) -> HeatPartitioned:
    """``obj`` (a `PartitionedArray`, or anything `dlpart.from_partitioned` takes) for
    ``ht.from_partitioned``. ``comm`` (an mpi4py communicator; default ``COMM_WORLD`` once the
    program has initialised MPI, else rank 0) gives this process's rank; ``framework`` the data's
    (default: the producer's, numpy for host data dlpart made)."""
    return HeatPartitioned(_import(obj), _rank(comm), framework)
