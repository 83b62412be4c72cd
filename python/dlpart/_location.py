"""Locations of partitions. The location forms found in the wild are read in Rust
(``src/python/location.rs``); this module gives them their Python type and finds this node's
address."""

import os
import socket
from functools import lru_cache
from typing import NamedTuple, Optional, Tuple

from ._core import Device


class Location(NamedTuple):
    """Where a partition lives: a node, a process and a device (draft 2), or an SPMD rank."""

    host: Optional[str]
    pid: Optional[int]
    device: Device
    rank: Optional[int] = None

    def to_tuple(self) -> Tuple[str, int, str]:
        """The draft-2 form ``(ip, pid, device)``.

        A location known only by its MPI rank is written ``('rank:<r>', -1, device)``, so the
        rank is not lost.
        """
        host = self.host if self.host is not None else f"rank:{self.rank}"
        pid = self.pid if self.pid is not None else -1
        return (host, pid, str(self.device))

    @staticmethod
    def here(device) -> "Location":
        """The location of data held by this process on ``device``."""
        return Location(this_host(), os.getpid(), Device(device))

    def __repr__(self) -> str:
        parts = [repr(self.host), repr(self.pid), repr(str(self.device))]
        if self.rank is not None:
            parts.append(f"rank={self.rank}")
        return f"Location({', '.join(parts)})"


@lru_cache(maxsize=1)
def this_host() -> str:
    """This node's address."""
    try:
        return socket.gethostbyname(socket.gethostname())
    except OSError:
        return "127.0.0.1"


def here(device) -> Location:
    """The location of data held by this process on ``device``."""
    return Location.here(device)
