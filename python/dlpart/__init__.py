"""dlpart: partitioned, device-resident arrays exchanged through DLPack and ``__partitioned__``."""

from ._core import (
    BackendUnavailableError,
    Device,
    DeviceError,
    ProtocolError,
    Tensor,
    __version__,
    from_dlpack,
)

__all__ = [
    "BackendUnavailableError",
    "Device",
    "DeviceError",
    "ProtocolError",
    "Tensor",
    "__version__",
    "from_dlpack",
]
