"""Timing and the result record every workload produces."""

from __future__ import annotations

import gc
import statistics
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Tuple


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
    def quartiles(self) -> Tuple[float, float]:
        """The first and third quartiles of the times (numpy's default linear method; both
        equal the one time of a single run)."""
        if len(self.times) < 2:
            return self.times[0], self.times[0]
        q = statistics.quantiles(self.times, n=4, method="inclusive")
        return q[0], q[2]

    @property
    def iqr(self) -> float:
        """The spread of the times: their interquartile range, in seconds."""
        q1, q3 = self.quartiles
        return q3 - q1

    @property
    def bandwidth(self) -> float:
        """Effective bandwidth in bytes/s at the median time."""
        return self.bytes / self.median if self.median > 0 else float("inf")

    @property
    def bandwidth_iqr(self) -> float:
        """The interquartile range of the bandwidths of the timed runs, in bytes/s."""
        q1, q3 = self.quartiles
        return self.bytes / q1 - self.bytes / q3 if q1 > 0 else float("inf")

    def to_json(self) -> Dict[str, Any]:
        q1, q3 = self.quartiles
        return {
            "times": self.times,
            "median": self.median,
            "min": self.min,
            "q1": q1,
            "q3": q3,
            "iqr": self.iqr,
            "bandwidth": self.bandwidth,
            "bandwidth_iqr": self.bandwidth_iqr,
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


# Seconds between the progress lines of one long measurement.
PROGRESS_EVERY_S = 10.0


def measure(
    fn: Callable[[], Any],
    *,
    repeat: int,
    warmup: int,
    sync: Callable[[], None],
    check: Optional[Callable[[Any], None]] = None,
    progress: Optional[Callable[[str], None]] = None,
) -> List[float]:
    """Times `fn` `repeat` times after `warmup` untimed runs and returns the wall-clock seconds
    of each timed run. `check`, if given, validates the first untimed result (one untimed run is
    made for it even with no warm-up)."""
    checks = {"fn": check} if check is not None else {}
    return measure_together({"fn": fn}, repeat=repeat, warmup=warmup, sync=sync, checks=checks,
                            progress=progress)["fn"]


def measure_together(
    fns: Dict[str, Callable[[], Any]],
    *,
    repeat: int,
    warmup: int,
    sync: Callable[[], None],
    checks: Optional[Dict[str, Callable[[Any], None]]] = None,
    reset: Optional[Callable[[], None]] = None,
    progress: Optional[Callable[[str], None]] = None,
) -> Dict[str, List[float]]:
    """Times every function of `fns` round-robin: `warmup` untimed rounds, then `repeat` timed
    rounds, each calling every function once. On a shared machine, load that comes and goes
    then slows all of them alike, so their ratios stay meaningful where timing one after the
    other would not. `checks[name]` validates the first untimed result of `fns[name]` (one
    untimed round is made for it even with no warm-up). `reset`, if given, runs before every
    timed call, outside the timed region: the env's cache cleaning, so that no function pays
    for the dirty lines the one before it left behind. Each result is dropped before the next
    call, outside the timed region, and the collector is paused so that it cannot fire inside
    one. `progress`, if given, is told how many rounds are done every `PROGRESS_EVERY_S`
    seconds, so that a long measurement shows it is alive."""
    checks = checks or {}
    last_note = time.perf_counter()
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
        for done in range(repeat):
            if progress is not None and time.perf_counter() - last_note > PROGRESS_EVERY_S:
                last_note = time.perf_counter()
                progress(f"{done}/{repeat} timed rounds of {', '.join(fns)}")
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


def fmt_us(seconds: float) -> str:
    """Seconds in microseconds, the one unit of the overhead-bound tables."""
    return f"{seconds * 1e6:.1f}"


def fmt_gbs(bytes_per_s: float) -> str:
    """Bytes/s in GB/s, the one unit of the bandwidth tables."""
    return f"{bytes_per_s / 1e9:.2f}"
