"""dlpart arrays for xgboost_ray's ``RayDMatrix``.

xgboost_ray reads ``__partitioned__`` itself: it keys locality on ``location[0]`` as a bare IP
string and runs ``numpy.concatenate`` over what ``get`` returns. `partitioned` wraps an array so
that its dict has exactly that form: numpy data (over the partitions' memory, no copy) and the
node address of each partition.
"""

from typing import Any, Optional, Tuple

from .. import PartitionedArray
from .. import from_partitioned as _import
from .._types import PartitionedDict

__all__ = ["Partitioned", "partitioned"]


class Partitioned:
    """An object whose ``__partitioned__`` is ``array``'s dict in xgboost_ray's form."""

    def __init__(self, array: PartitionedArray, framework: Optional[str] = "numpy"):
        self.array = array
        self.framework = framework

    @property
    def __partitioned__(self) -> PartitionedDict:
        return self.array.to_partitioned(framework=self.framework, locations="ip")

    @property
    def shape(self) -> Tuple[int, ...]:
        return self.array.shape


def partitioned(obj: Any, framework: Optional[str] = "numpy") -> Partitioned:
    """``obj`` (a `PartitionedArray`, or anything `dlpart.from_partitioned` takes) wrapped for
    ``RayDMatrix``: data as numpy arrays, locations as bare IP strings."""
    return Partitioned(_import(obj), framework)
