"""dlpart: partitioned, device-resident arrays exchanged through DLPack and ``__partitioned__``."""

from ._core import (
    BackendUnavailableError,
    Device,
    DeviceError,
    ProtocolError,
    Tensor,
    __version__,
    backend_status,
    from_dlpack,
    split_points,
)
from ._functions import gather, scatter
from . import adapters
from ._location import Location
from ._partitioned import (
    Partition,
    PartitionedArray,
    from_partitioned,
    get,
    partition,
    validate,
)

__all__ = [
    "adapters",
    "BackendUnavailableError",
    "Device",
    "DeviceError",
    "Location",
    "Partition",
    "PartitionedArray",
    "ProtocolError",
    "Tensor",
    "__version__",
    "backend_status",
    "from_dlpack",
    "from_partitioned",
    "gather",
    "get",
    "partition",
    "scatter",
    "split_points",
    "validate",
]
