"""dlpart arrays for xgboost_ray's ``RayDMatrix``.

xgboost_ray reads ``__partitioned__`` itself: it keys locality on ``location[0]`` as a bare IP
string and runs ``numpy.concatenate`` over what ``get`` returns. `partitioned` wraps an array so
that its dict has exactly that form: numpy data and the node address of each partition.

xgboost_ray hands each training actor the whole dict. With Ray running, the partitions are
therefore put into Ray's object store once (at the first ``__partitioned__``), and the dict
holds their ObjectRefs: each actor fetches only its shards, from the node that holds them.
Without Ray, or with ``store=False``, the data are numpy arrays over the partitions' memory.

Use ``RayDMatrix``'s default distributed loading: its central loading (``distributed=False``)
asserts that the object it was given is a dict, which no object with ``__partitioned__`` is, so
it fails for every producer (xgboost_ray 0.1.19).
"""

from typing import Any, Optional, Tuple

from .. import PartitionedArray
from .. import from_partitioned as _import
from .._location import ray_running
from .._types import PartitionedDict

__all__ = ["Partitioned", "partitioned"]


class Partitioned:
    """An object whose ``__partitioned__`` is ``array``'s dict in xgboost_ray's form."""

    def __init__(self, array: PartitionedArray, framework: Optional[str] = "numpy",
                 store: Optional[bool] = None):
        self.array = array
        self.framework = framework
        self.store = store
        self._stored: Optional[PartitionedArray] = None

    @property
    def __partitioned__(self) -> PartitionedDict:
        array = self.array
        if ray_running() if self.store is None else self.store:
            if self._stored is None:
                from . import ray as dray

                self._stored = _import(dray.partitioned_dict(self.array))
            array = self._stored
        return array.to_partitioned(framework=self.framework, locations="ip")

    @property
    def shape(self) -> Tuple[int, ...]:
        return self.array.shape


def partitioned(obj: Any, framework: Optional[str] = "numpy",
                store: Optional[bool] = None) -> Partitioned:
    """``obj`` (a `PartitionedArray`, or anything `dlpart.from_partitioned` takes) wrapped for
    ``RayDMatrix``: locations as bare IP strings; data as ObjectRefs in Ray's object store when
    ``store`` is true (default: when Ray is running), else numpy arrays (see the module docs)."""
    return Partitioned(_import(obj), framework, store)
