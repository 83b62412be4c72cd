"""dlpart: partitioned, device-resident arrays exchanged through DLPack and ``__partitioned__``."""

from ._core import (
    BackendUnavailableError,
    Device,
    DeviceError,
    PreparedGather,
    PreparedScatter,
    ProtocolError,
    Tensor,
    __version__,
    backend_status,
    from_dlpack,
    get_num_threads,
    reload_log_levels,
    set_num_threads,
    split_points,
)
from ._functions import gather, prepare_gather, prepare_scatter, scatter
from . import adapters
from ._location import Location
from ._partitioned import (
    Partition,
    PartitionedArray,
    from_distarray,
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
    "PreparedGather",
    "PreparedScatter",
    "ProtocolError",
    "Tensor",
    "__version__",
    "backend_status",
    "from_distarray",
    "from_dlpack",
    "from_partitioned",
    "gather",
    "get",
    "get_num_threads",
    "partition",
    "prepare_gather",
    "prepare_scatter",
    "reload_log_levels",
    "scatter",
    "set_num_threads",
    "split_points",
    "validate",
]
