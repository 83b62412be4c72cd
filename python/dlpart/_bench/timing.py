"""Timing and the result record every workload produces."""

from __future__ import annotations

import gc
import statistics
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional


@dataclass
class Stats:
    """The timings of one implementation of a case: all timed runs, median and min."""

    times: List[float]
    bytes: int

    @property
    def median(self) -> float:
        return statistics.median(self.times)

    @property
    def min(self) -> float:
        return min(self.times)

    @property
    def bandwidth(self) -> float:
        """Effective bandwidth in bytes/s at the median time."""
        return self.bytes / self.median if self.median > 0 else float("inf")

    def to_json(self) -> Dict[str, Any]:
        return {
            "times": self.times,
            "median": self.median,
            "min": self.min,
            "bandwidth": self.bandwidth,
        }


@dataclass
class Result:
    """One case of a workload: dlpart's timings, the references measured in the same run and the
    ratios between them (dlpart bandwidth / reference bandwidth, so above 1 means dlpart is
    faster)."""

    name: str
    workload: str
    params: Dict[str, Any]
    bytes: int = 0
    stats: Optional[Stats] = None
    references: Dict[str, Stats] = field(default_factory=dict)
    ratios: Dict[str, float] = field(default_factory=dict)
    targets: Dict[str, float] = field(default_factory=dict)
    extra: Dict[str, Any] = field(default_factory=dict)
    unit: str = "GB/s"
    skipped: Optional[str] = None
    failed: Optional[str] = None

    def ratio(self, ref: str, key: Optional[str] = None) -> None:
        """Records dlpart's speed relative to reference `ref` (a bandwidth ratio)."""
        if self.stats is not None and ref in self.references:
            r = self.references[ref]
            self.ratios[key or f"dlpart/{ref}"] = r.median / self.stats.median

    def to_json(self) -> Dict[str, Any]:
        out: Dict[str, Any] = {"workload": self.workload, "params": self.params}
        if self.skipped is not None:
            out["skipped"] = self.skipped
        if self.failed is not None:
            out["failed"] = self.failed
        if self.stats is not None:
            out["bytes"] = self.bytes
            out.update(self.stats.to_json())
            out["unit"] = self.unit
        out["references"] = {k: v.to_json() for k, v in self.references.items()}
        out["ratios"] = self.ratios
        if self.targets:
            out["targets"] = self.targets
        if self.extra:
            out["extra"] = self.extra
        return out


def measure(
    fn: Callable[[], Any],
    *,
    repeat: int,
    warmup: int,
    sync: Callable[[], None],
    check: Optional[Callable[[Any], None]] = None,
) -> List[float]:
    """Times `fn` `repeat` times after `warmup` untimed runs and returns the wall-clock seconds
    of each timed run. `check`, if given, validates the first untimed result (one untimed run is
    made for it even with no warm-up)."""
    checks = {"fn": check} if check is not None else {}
    return measure_together({"fn": fn}, repeat=repeat, warmup=warmup, sync=sync, checks=checks)["fn"]


def measure_together(
    fns: Dict[str, Callable[[], Any]],
    *,
    repeat: int,
    warmup: int,
    sync: Callable[[], None],
    checks: Optional[Dict[str, Callable[[Any], None]]] = None,
    reset: Optional[Callable[[], None]] = None,
) -> Dict[str, List[float]]:
    """Times every function of `fns` round-robin: `warmup` untimed rounds, then `repeat` timed
    rounds, each calling every function once. On a shared machine, load that comes and goes
    then slows all of them alike, so their ratios stay meaningful where timing one after the
    other would not. `checks[name]` validates the first untimed result of `fns[name]` (one
    untimed round is made for it even with no warm-up). `reset`, if given, runs before every
    timed call, outside the timed region: the env's cache cleaning, so that no function pays
    for the dirty lines the one before it left behind. Each result is dropped before the next
    call, outside the timed region, and the collector is paused so that it cannot fire inside
    one."""
    checks = checks or {}
    gc.collect()
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        for i in range(max(warmup, 1 if checks else 0)):
            for name, fn in fns.items():
                r = fn()
                sync()
                if i == 0 and name in checks:
                    checks[name](r)
                r = None
        times: Dict[str, List[float]] = {name: [] for name in fns}
        for _ in range(repeat):
            for name, fn in fns.items():
                if reset is not None:
                    reset()
                t0 = time.perf_counter()
                r = fn()
                sync()
                times[name].append(time.perf_counter() - t0)
                r = None
        return times
    finally:
        if was_enabled:
            gc.enable()


def fmt_time(seconds: float) -> str:
    if seconds < 1e-3:
        return f"{seconds * 1e6:.1f} us"
    if seconds < 1.0:
        return f"{seconds * 1e3:.2f} ms"
    return f"{seconds:.3f} s"


def fmt_bytes(n: float) -> str:
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= size:
            v = n / size
            return f"{v:.0f} {unit}" if v == int(v) else f"{v:.1f} {unit}"
    return f"{int(n)} B"


def fmt_bw(bytes_per_s: float) -> str:
    return f"{bytes_per_s / 1e9:.2f} GB/s"
