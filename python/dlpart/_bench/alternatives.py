"""Workload 10: what a user would pick instead of dlpart for the same layout change, timed in
the same loop as dlpart: row blocks -> column blocks of a float32 square over 4 devices (or
chunks), as jax resharding (`jax.device_put` to a new `NamedSharding` over 4 CPU devices) and as
dask's `rechunk`, computed (`persist` on the threaded scheduler: the chunks stay in memory, not
concatenated into one array)."""

from __future__ import annotations

import os
import sys
from typing import Any, Callable, Dict, List, Optional, Tuple

import numpy as np

from .common import Case, Ctx, _progress, check_repartition, dlpart, even_splits
from .timing import Result, Stats, measure_together

PARTS = 4


def alternatives_cases(ctx: Ctx) -> List[Case]:
    n = 1024 if ctx.quick else 8192
    return [Case("instead/rows_to_cols/float32", "10",
                 {"shape": [n, n], "dtype": "float32", "source_tiling": [PARTS, 1],
                  "target_tiling": [1, PARTS]},
                 _instead)]


def _instead(ctx: Ctx, res: Result) -> None:
    env, p = ctx.env, res.params
    if env.kind != "cpu":
        res.skipped = "CPU only: jax's and dask's counterparts run over host devices here"
        return
    n = p["shape"][0]
    x = env.filled(p["shape"], p["dtype"])
    res.bytes = 2 * x.nbytes
    pa = dlpart().partition(x, (PARTS, 1))
    fns: Dict[str, Callable[[], Any]] = {"dlpart": lambda: pa.repartition(tiling=(1, PARTS))}
    checks: Dict[str, Callable[[Any], None]] = {
        "dlpart": check_repartition(env, x, [[0, n], even_splits(n, PARTS)])}
    missing = []
    for name, make in (("jax-device_put", _jax), ("dask-rechunk", _dask)):
        made, why = make(x)
        if made is None:
            missing.append(f"{name}: {why}")
            continue
        fns[name], checks[name] = made
    times = measure_together(fns, repeat=ctx.repeat, warmup=ctx.warmup, sync=env.sync,
                             checks=checks, reset=env.clean_cache, progress=_progress)
    res.stats = Stats(times.pop("dlpart"), res.bytes)
    for name, t in times.items():
        res.references[name] = Stats(t, res.bytes)
        res.ratio(name)
    if missing:
        res.extra["note"] = "not timed: " + "; ".join(missing)


def _equal_to(x: np.ndarray) -> Callable[[Any], None]:
    def check(got: np.ndarray) -> None:
        if not np.array_equal(got, x):
            raise AssertionError("the alternative's result differs from the source")
    return check


def _jax(x: np.ndarray) -> Tuple[Optional[Tuple[Callable[[], Any], Callable[[Any], None]]], str]:
    """jax resharding rows -> columns over 4 CPU devices, and its check."""
    flag = f"--xla_force_host_platform_device_count={PARTS}"
    if "jax" not in sys.modules and "xla_force_host_platform_device_count" not in \
            os.environ.get("XLA_FLAGS", ""):
        # Before jax starts: its CPU backend reads the device count once.
        os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} {flag}".strip()
    try:
        import jax
        from jax.sharding import Mesh, NamedSharding, PartitionSpec
    except ImportError as e:
        return None, f"jax is not installed ({e})"
    devices = jax.devices("cpu")
    if len(devices) < PARTS:
        return None, f"jax has {len(devices)} CPU device(s), needs {PARTS} (XLA_FLAGS={flag})"
    mesh = Mesh(np.array(devices[:PARTS]), ("d",))
    rows = jax.device_put(x, NamedSharding(mesh, PartitionSpec("d", None)))
    rows.block_until_ready()
    cols = NamedSharding(mesh, PartitionSpec(None, "d"))
    check = _equal_to(x)
    return (lambda: jax.device_put(rows, cols).block_until_ready(),
            lambda r: check(np.asarray(r))), ""


def _dask(x: np.ndarray) -> Tuple[Optional[Tuple[Callable[[], Any], Callable[[Any], None]]], str]:
    """dask's rechunk rows -> columns, persisted on the threaded scheduler, and its check."""
    try:
        import dask.array as da
    except ImportError as e:
        return None, f"dask is not installed ({e})"
    n = x.shape[0]
    rows = da.from_array(x, chunks=(n // PARTS, n)).persist(scheduler="threads")
    target = (n, n // PARTS)
    check = _equal_to(x)
    return (lambda: rows.rechunk(target).persist(scheduler="threads"),
            lambda r: check(r.compute(scheduler="threads"))), ""
