"""Locations of partitions. The location forms found in the wild are read in Rust
(``src/python/location.rs``); this module gives them their Python type and finds this node's
address."""

import os
import sys
from functools import lru_cache
from typing import TYPE_CHECKING, NamedTuple, Optional, Tuple

from . import _core
from ._core import Device

if TYPE_CHECKING:  # _types imports nothing from here; the guard only keeps imports light
    from ._types import DeviceLike


class Location(NamedTuple):
    """Where a partition lives: a node, a process and a device (draft 2), or an SPMD rank."""

    host: Optional[str]
    pid: Optional[int]
    device: Device
    rank: Optional[int] = None

    def to_tuple(self) -> Tuple[str, int, str]:
        """The draft-2 form ``(ip, pid, device)``; ``-1`` stands for an unknown pid.

        A location without a host (one known only by its MPI rank, as heat writes them) has no
        such form: `ValueError`. ``PartitionedArray.to_partitioned(locations='rank')`` writes
        ranks, and `dlpart.mpi.from_partitioned` learns every rank's host.
        """
        if self.host is None:
            what = f"rank {self.rank}" if self.rank is not None else "no rank either"
            raise ValueError(f"{self!r} has no host for the draft-2 form (ip, pid, device): it "
                             f"names {what}")
        pid = self.pid if self.pid is not None else -1
        return (self.host, pid, str(self.device))

    @staticmethod
    def here(device: "DeviceLike") -> "Location":
        """The location of data held by this process on ``device``."""
        return Location(this_host(), os.getpid(), Device(device))

    def __repr__(self) -> str:
        parts = [repr(self.host), repr(self.pid), repr(str(self.device))]
        if self.rank is not None:
            parts.append(f"rank={self.rank}")
        return f"Location({', '.join(parts)})"


def ray_running() -> bool:
    """Whether this process has started (or joined) Ray: never imports it."""
    ray = sys.modules.get("ray")
    return ray is not None and getattr(ray, "is_initialized", lambda: False)()


def this_host() -> str:
    """This node's address, as other nodes reach it: Ray's node address when Ray runs here, else
    the address of a network interface that is not loopback, else ``127.0.0.1``."""
    if ray_running():
        try:
            return sys.modules["ray"].util.get_node_ip_address()
        except Exception:  # noqa: BLE001 - any failure falls back to the interfaces
            pass
    return _interface_address()


@lru_cache(maxsize=1)
def _interface_address() -> str:
    """The first IPv4 address of the host name or of a network interface that is not loopback,
    else ``127.0.0.1``: the address Rust's ``MpiComm`` names too."""
    return _core._this_host()


def here(device: "DeviceLike") -> Location:
    """The location of data held by this process on ``device``."""
    return Location.here(device)
