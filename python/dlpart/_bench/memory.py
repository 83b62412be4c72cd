"""Workload 8: peak memory of a repartition. Each method runs once in a fresh process, which
reports its peak resident set (VmHWM) before and after; the growth over the target
partitions' size shows whether a second whole array was allocated on the way.

Run as `python -m dlpart._bench.memory METHOD N DTYPE` for one measurement (prints JSON)."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from typing import List

from .common import Case, Ctx
from .timing import Result, Stats

METHODS = ("dlpart", "numpy-direct", "numpy-concat-split")


def peak_memory_cases(ctx: Ctx) -> List[Case]:
    n = 1024 if ctx.quick else 8192
    return [Case(
        "peak_memory/float32",
        "8",
        {"shape": [n, n], "dtype": "float32", "source_tiling": [4, 1], "target_tiling": [1, 4],
         "measure": "VmHWM growth in a fresh process per method (ru_maxrss where /proc is "
                    "missing)"},
        _peak_memory,
    )]


def _peak_memory(ctx: Ctx, res: Result) -> None:
    if ctx.env.kind != "cpu":
        res.skipped = "peak memory is measured as host RSS, only for kDLCPU"
        return
    n, dtype = res.params["shape"][0], res.params["dtype"]
    growth, target, reset = {}, 0, True
    for method in METHODS:
        out = _child(method, n, dtype)
        target, reset = out["target_bytes"], reset and out["peak_reset"]
        growth[method] = out["after"] - out["before"]
        stats = Stats([out["seconds"]], 2 * target)
        if method == "dlpart":
            res.stats = stats
        else:
            res.references[method] = stats
    res.bytes = 2 * target
    res.extra = {"target_bytes": target, "peak_growth": growth, "peak_reset": reset}
    for method, g in growth.items():
        res.ratios[f"{method} growth/target"] = g / target
    if not reset:
        res.extra["note"] = "VmHWM could not be reset: setup temporaries may hide the growth"


def _child(method: str, n: int, dtype: str) -> dict:
    cmd = [sys.executable, "-m", "dlpart._bench.memory", method, str(n), dtype]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed: {proc.stderr.strip()[-2000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def peak_rss() -> int:
    """Peak resident set size of this process in bytes."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    import resource

    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak if sys.platform == "darwin" else peak * 1024


def reset_peak_rss() -> bool:
    """Lowers VmHWM to the current RSS (Linux >= 4.0), so that temporaries freed during setup
    cannot hide the operation's growth. False where that is not possible."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def _measure(method: str, n: int, dtype: str) -> dict:
    import numpy as np

    from .env import fill_host

    x = fill_host((n, n), dtype)  # chunked fill: no whole-size temporary
    rows = [n * k // 4 for k in range(5)]
    src = [x[a:b] for a, b in zip(rows, rows[1:])]
    if method == "dlpart":
        import dlpart

        pa = dlpart.partition(x, (4, 1))

        def op():
            return pa.repartition(tiling=(1, 4))
    elif method == "numpy-direct":

        def op():
            outs = [np.empty((n, b - a), dtype) for a, b in zip(rows, rows[1:])]
            for j, (c0, c1) in enumerate(zip(rows, rows[1:])):
                for i, (r0, r1) in enumerate(zip(rows, rows[1:])):
                    outs[j][r0:r1] = src[i][:, c0:c1]
            return outs
    else:

        def op():
            whole = np.concatenate(src, axis=0)
            return [np.ascontiguousarray(p) for p in np.array_split(whole, 4, axis=1)]

    reset = reset_peak_rss()
    before = peak_rss()
    t0 = time.perf_counter()
    result = op()
    seconds = time.perf_counter() - t0
    after = peak_rss()
    del result
    return {"before": before, "after": after, "seconds": seconds,
            "target_bytes": int(x.nbytes), "peak_reset": reset}


if __name__ == "__main__":
    method, n, dtype = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    if method not in METHODS:
        raise SystemExit(f"unknown method {method!r}; one of {METHODS}")
    print(json.dumps(_measure(method, n, dtype)))
