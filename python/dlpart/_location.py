"""Locations of partitions, and the normalisation of every location form found in the wild."""

import os
import socket
from functools import lru_cache
from typing import Any, NamedTuple, Optional, Tuple

from ._core import Device, DeviceError, ProtocolError


class Location(NamedTuple):
    """Where a partition lives: a node, a process and a device (draft 2), or an SPMD rank."""

    host: Optional[str]
    pid: Optional[int]
    device: Device
    rank: Optional[int] = None

    def to_tuple(self) -> Tuple[str, int, str]:
        """The draft-2 form ``(ip, pid, device)``.

        A location known only by its MPI rank is written ``('rank:<r>', -1, device)``, so the
        rank is not lost; the MPI adapter fills in real addresses where it can.
        """
        host = self.host if self.host is not None else f"rank:{self.rank}"
        pid = self.pid if self.pid is not None else -1
        return (host, pid, str(self.device))

    def __repr__(self) -> str:
        parts = [repr(self.host), repr(self.pid), repr(str(self.device))]
        if self.rank is not None:
            parts.append(f"rank={self.rank}")
        return f"Location({', '.join(parts)})"


@lru_cache(maxsize=1)
def _this_host() -> str:
    try:
        return socket.gethostbyname(socket.gethostname())
    except OSError:
        return "127.0.0.1"


def here(device) -> Location:
    """The location of data held by this process on ``device``."""
    return Location(_this_host(), os.getpid(), Device(device))


def framework_device(obj: Any, key: str, position) -> Optional[Device]:
    """A device given by a framework's own name (heat's extra ``device`` key: ``'cpu'``,
    ``'cuda:1'``, a ``torch.device``), or None if there is none."""
    if obj is None:
        return None
    text = str(obj)
    if text.startswith("kDL"):
        try:
            return Device(text)
        except DeviceError as e:
            raise ProtocolError(f"__partitioned__[{key!r}] at position {position}: {e}") from None
    name, _, index = text.partition(":")
    kinds = {"cpu": "kDLCPU", "cuda": "kDLCUDA", "gpu": "kDLCUDA", "xpu": "kDLOneAPI"}
    if name in kinds and (index == "" or index.isdigit()):
        return Device(f"{kinds[name]}:{index or 0}")
    raise ProtocolError(
        f"__partitioned__[{key!r}] at position {position}: unknown device {obj!r}"
    )


_CACHE: dict = {}


def normalise(value: Any, position, fallback: Optional[Device]) -> Tuple[Location, ...]:
    """`_normalise`, memoised: dicts with many partitions repeat a few location values."""
    try:
        items = tuple(value) if isinstance(value, list) else (value,)
        # types are part of the key: True == 1, but a bool is no rank
        key = (items, tuple(map(type, items)), fallback)
        hit = _CACHE.get(key)
    except TypeError:  # unhashable parts: no caching
        return _normalise(value, position, fallback)
    if hit is None:
        hit = _normalise(value, position, fallback)
        if len(_CACHE) > 4096:
            _CACHE.clear()
        _CACHE[key] = hit
    return hit


def _normalise(value: Any, position, fallback: Optional[Device]) -> Tuple[Location, ...]:
    """Every location form in the wild, as `Location`s.

    Accepted: draft-2 ``[(ip, pid, device), ...]`` and ``[(ip, pid), ...]``; draft-1 lists of IP
    strings (``'1.1.1.2:55667'`` worker addresses too) and a bare IP string (xgboost_ray); MPI
    rank ints (heat). ``fallback`` is the device for forms that carry none (the partition's data
    device or heat's ``device`` key), else ``kDLCPU``.
    """
    device = fallback if fallback is not None else Device("kDLCPU")
    where = f"__partitioned__['partitions'][{position}]['location']"
    if value is None:
        return ()
    if isinstance(value, (str, int)) and not isinstance(value, bool):
        value = [value]
    if isinstance(value, tuple) and value and isinstance(value[0], str):
        value = [value]  # a single (ip, pid[, device]) tuple instead of a list of them
    if not isinstance(value, (list, tuple)):
        raise ProtocolError(f"{where}: expected a list of locations, found {value!r}")
    out = []
    for item in value:
        if isinstance(item, bool):
            raise ProtocolError(f"{where}: a location cannot be a bool, found {item!r}")
        if isinstance(item, int):
            if item < 0:
                raise ProtocolError(f"{where}: negative rank {item}")
            out.append(Location(None, None, device, rank=item))
        elif isinstance(item, str):
            if not item:
                raise ProtocolError(f"{where}: empty host string")
            out.append(Location(item, None, device))
        elif isinstance(item, (tuple, list)) and 2 <= len(item) <= 3:
            host, pid = item[0], item[1]
            if not isinstance(host, str) or not isinstance(pid, int) or isinstance(pid, bool):
                raise ProtocolError(
                    f"{where}: expected (ip: str, pid: int[, device: str]), found {tuple(item)!r}"
                )
            dev = device
            if len(item) == 3:
                if not isinstance(item[2], str):
                    raise ProtocolError(f"{where}: device must be a string, found {item[2]!r}")
                try:
                    dev = Device(item[2])
                except DeviceError as e:
                    raise ProtocolError(f"{where}: {e}") from None
            out.append(Location(host, pid, dev))
        else:
            raise ProtocolError(
                f"{where}: expected (ip, pid[, device]), an IP string or a rank, found {item!r}"
            )
    return tuple(out)
