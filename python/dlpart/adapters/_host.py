"""What the Dask and Ray adapters share: a host partition as a numpy array."""

import numpy as np

from .. import DeviceError


def host_array(t, position, why: str) -> np.ndarray:
    """The host tensor `t` of the partition at `position` as a zero-copy numpy array; `why`
    says, for the error, why this system needs host memory."""
    if t is None:
        raise ValueError(f"partition {position} has no data in this process")
    if t.device.kind != "kDLCPU":
        raise DeviceError(
            f"partition {position} is on {t.device}: {why}; assemble or repartition onto "
            "kDLCPU first"
        )
    return np.from_dlpack(t)
