"""dlpart arrays for heat's ``ht.from_partitioned``.

heat reads an MPI rank from each partition's ``location[0]`` (``int(location[0])``) and accepts
only numpy arrays and torch tensors as data. `to_heat` writes a dlpart array's dict in that form:
ranks as locations (this process's rank for the data held here) and numpy (or torch) data over
the partitions' memory. heat's own dicts come back out in their form unchanged: dlpart keeps a
rank as a rank.
"""

from typing import Optional

from .. import PartitionedArray
from .. import from_partitioned as _import

__all__ = ["to_heat"]


def _rank(comm) -> int:
    if comm is not None:
        return comm.Get_rank()
    try:
        from mpi4py import MPI
    except ImportError:
        return 0
    return MPI.COMM_WORLD.Get_rank()


def to_heat(obj, comm=None, framework: Optional[str] = "numpy") -> dict:
    """``obj``'s ``__partitioned__`` dict in heat's form. ``comm`` (an mpi4py communicator,
    default ``COMM_WORLD`` when mpi4py is installed, else rank 0) gives this process's rank."""
    pa: PartitionedArray = _import(obj)
    return pa.to_partitioned(framework=framework, locations="rank", rank=_rank(comm))
