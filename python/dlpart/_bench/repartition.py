"""Workloads 1, 2, 3, 6 and 7: repartitions of 2-d arrays; 9: importing a dict of many
partitions."""

from __future__ import annotations

from functools import partial
from typing import List

from .common import (
    Case,
    Ctx,
    check_repartition,
    direct_setup,
    dlpart,
    even_splits,
    run_pairs,
)
from .timing import Result, fmt_bytes

ROWS_TO_COLS_TARGETS = {"dlpart/memcpy2": 0.8, "dlpart/numpy-direct": 2.0}
# On a GPU, for float32: against cudaMemcpy device-to-device of the same bytes, torch's
# cat + split + contiguous, and the datasheet HBM bandwidth (bytes read + written).
GPU_ROWS_TO_COLS_TARGETS = {
    "dlpart/memcpyD2D": 1.1,
    "dlpart/torch-concat-split": 1.8,
    "dlpart/datasheet": 0.8,
}


def _add_direct_and_memcpy(ctx: Ctx, res: Result, x, src_splits, dst_splits) -> int:
    """Times the array library's direct per-block copy of the same repartition and memcpy of
    the same bytes, after dlpart, and records dlpart's ratios to them. Returns the number of
    block copies the direct reference makes."""
    env = ctx.env
    _, _, pairs = direct_setup(env, x, src_splits, dst_splits)
    copies = len(pairs)
    res.references[env.direct] = ctx.stats(partial(run_pairs, pairs), res.bytes)
    del pairs
    ctx.add_memcpy(res, _nbytes(x))
    res.ratio(env.direct)
    return copies


# -- 1. row blocks -> column blocks ---------------------------------------------------------------
def rows_to_cols_cases(ctx: Ctx) -> List[Case]:
    n = 1024 if ctx.quick else 8192
    sizes = [("", n)]
    if ctx.env.kind == "cuda" and not ctx.quick:
        sizes.append(("-1GiB", 16384))  # 16384² float32: the GPU targets' 1 GiB case
    return [
        Case(
            f"rows_to_cols{'_into' if into else ''}/{dt}{suffix}",
            "1",
            {"shape": [m, m], "dtype": dt, "source_tiling": [4, 1], "target_tiling": [1, 4],
             "targets": "preallocated (repartition_into)" if into else "new (repartition)"},
            partial(_rows_to_cols, into=into),
        )
        for into in (True, False)
        for dt in ("float32", "float64", "uint8")
        for suffix, m in sizes
        if not suffix or dt == "float32"
    ]


def _rows_to_cols(ctx: Ctx, res: Result, into: bool) -> None:
    """Into preallocated targets this compares like with like against numpy's per-block copy
    into preallocated outputs and memcpy; with new targets, the page faults of fresh memory are
    part of the cost, as in the memcpy1-alloc reference."""
    env, p = ctx.env, res.params
    x = env.filled(p["shape"], p["dtype"])
    n, parts = p["shape"][0], 4
    src_splits = [even_splits(n, parts), [0, n]]
    dst_splits = [[0, n], even_splits(n, parts)]
    res.bytes = 2 * _nbytes(x)
    pa = dlpart().partition(x, (parts, 1))
    if into:
        target = pa.repartition(tiling=(1, parts))

        def run():
            return pa.repartition_into(target)
    else:

        def run():
            return pa.repartition(tiling=(1, parts))

    src, _, pairs = direct_setup(env, x, src_splits, dst_splits)
    # The judged ratios come from this case, so dlpart, the per-block copy and the memcpys are
    # timed round-robin in one loop rather than one after the other. References that allocate
    # (concatenate + split, memcpy into a new buffer) are timed afterwards: freeing hundreds
    # of MiB per call sets the kernel compacting and zeroing memory in the background, which
    # on a small machine takes a core from whatever runs next.
    fns = {"dlpart": run, env.direct: partial(run_pairs, pairs)}
    memcpy = env.memcpy_refs(_nbytes(x))
    allocating = {k: memcpy.pop(k) for k in list(memcpy) if k.endswith("-alloc")}
    fns.update(memcpy)
    # Three times the usual timed runs: the medians the judged ratios come from move less.
    stats = ctx.stats_together(fns, res.bytes, check_repartition(env, x, dst_splits), rounds=3)
    del pairs, fns, memcpy
    res.stats = stats.pop("dlpart")
    res.references.update(stats)
    parts_list = [src[(i, 0)] for i in range(parts)]
    allocating[env.concat_split_name] = lambda: env.concat_split(parts_list, parts, axis=1)
    for name, fn in allocating.items():
        res.references[name] = ctx.stats(fn, res.bytes)
    del allocating, parts_list
    for name in env.memcpy_primary:
        res.ratio(name)
    res.ratio(env.direct)
    res.ratio(env.concat_split_name)
    if not into:
        res.ratio("memcpy1-alloc")
    if env.kind == "cpu" and into:
        res.targets = dict(ROWS_TO_COLS_TARGETS)
    if env.kind == "cuda":
        datasheet = env.datasheet()
        if datasheet is not None:
            res.extra["datasheet_bandwidth"] = datasheet
            res.ratios["dlpart/datasheet"] = res.stats.bandwidth / datasheet
        if p["dtype"] == "float32":
            res.targets = dict(GPU_ROWS_TO_COLS_TARGETS)


# -- 2. 2x2 blocks -> block-cyclic ----------------------------------------------------------------
def block_cyclic_cases(ctx: Ctx) -> List[Case]:
    n = 1024 if ctx.quick else 8192
    return [
        Case(
            f"block_cyclic/b{b}",
            "2",
            {"shape": [n, n], "dtype": "float32", "source_tiling": [2, 2], "block": [b, b],
             "devices": 4},
            _block_cyclic,
        )
        for b in (256, 32)
    ]


def _block_cyclic(ctx: Ctx, res: Result) -> None:
    env, p = ctx.env, res.params
    x = _source(ctx, p["shape"], p["dtype"])
    n, b = p["shape"][0], p["block"][0]
    devices = [env.device] * p["devices"]
    res.params["devices"] = devices
    src_splits = [even_splits(n, 2)] * 2
    dst_splits = [list(range(0, n, b)) + [n]] * 2
    res.params["target_partitions"] = (len(dst_splits[0]) - 1) ** 2
    res.bytes = 2 * _nbytes(x)
    pa = dlpart().partition(x, (2, 2))
    res.stats = ctx.stats(
        lambda: pa.repartition(block_cyclic=(b, b), devices=devices),
        res.bytes,
        check_repartition(env, x, dst_splits),
    )
    _add_direct_and_memcpy(ctx, res, x, src_splits, dst_splits)
    if b == 32 and env.kind == "cpu":
        res.targets = {"dlpart/memcpy2": 0.6}


# -- 3. run-length sweep --------------------------------------------------------------------------
def run_length_cases(ctx: Ctx) -> List[Case]:
    if ctx.quick:
        total, ncols, runs = 2 << 20, 4, [4, 64, 1024, 65536]
    else:
        total, ncols, runs = 64 << 20, 16, [4 << k for k in range(15)]
    cases = []
    for run in runs:
        width = run // 4
        rows = total // 4 // (ncols * width)
        cases.append(Case(
            f"run_length/{fmt_bytes(run).replace(' ', '')}",
            "3",
            {"run_bytes": run, "shape": [rows, ncols * width], "dtype": "float32",
             "source_tiling": [4, 1], "target_tiling": [1, ncols],
             "layout": "row blocks -> column blocks whose width is the run length, so every "
                       "source row contributes one contiguous run of run_bytes to each target"},
            _run_length,
        ))
    return cases


def _run_length(ctx: Ctx, res: Result) -> None:
    env, p = ctx.env, res.params
    x = env.filled(p["shape"], p["dtype"])
    (rows, cols), ncols = p["shape"], p["target_tiling"][1]
    src_splits = [even_splits(rows, 4), [0, cols]]
    dst_splits = [[0, rows], even_splits(cols, ncols)]
    res.bytes = 2 * _nbytes(x)
    pa = dlpart().partition(x, (4, 1))
    res.stats = ctx.stats(
        lambda: pa.repartition(tiling=(1, ncols)), res.bytes, check_repartition(env, x, dst_splits)
    )
    _add_direct_and_memcpy(ctx, res, x, src_splits, dst_splits)


# -- 6. small arrays over a 64x64 grid, shifted by half a block -----------------------------------
def small_grid_cases(ctx: Ctx) -> List[Case]:
    sizes = [1] if ctx.quick else [1, 4, 16]
    cases = []
    for mib in sizes:
        side = int(round(((mib << 20) // 4) ** 0.5))
        cases.append(Case(
            f"small_grid/{mib}MiB",
            "6",
            {"shape": [side, side], "dtype": "float32", "source_tiling": [64, 64],
             "target": "64x64 grid with split points shifted by half a block"},
            _small_grid,
        ))
    return cases


def _small_grid(ctx: Ctx, res: Result) -> None:
    env, p = ctx.env, res.params
    x = env.filled(p["shape"], p["dtype"])
    side = p["shape"][0]
    block = side // 64
    src = even_splits(side, 64)
    # 0, b/2, 3b/2, ..., then the end: 64 partitions per axis, every interior split point half
    # a block away from the source's, so most targets gather from four sources.
    shifted = [0] + [block // 2 + k * block for k in range(63)] + [side]
    dst_splits = [shifted, shifted]
    res.params["target_splits"] = shifted
    res.unit = "us"
    res.bytes = 2 * _nbytes(x)
    pa = dlpart().partition(x, (64, 64))
    res.stats = ctx.stats(
        lambda: pa.repartition(splits=dst_splits), res.bytes, check_repartition(env, x, dst_splits)
    )
    res.params["copies"] = _add_direct_and_memcpy(ctx, res, x, [src, src], dst_splits)
    if side * side * 4 == 1 << 20 and env.kind == "cpu":
        res.targets = {f"dlpart/{env.direct}": 8.0}


# -- 9. importing a dict of many partitions -------------------------------------------------------
def import_cases(ctx: Ctx) -> List[Case]:
    if ctx.env.kind != "cpu":
        return []  # the reference is numpy's own DLPack import
    return [Case(
        "from_partitioned/4096",
        "9",
        {"shape": [512, 512], "dtype": "float32", "tiling": [64, 64],
         "reference": "np.from_dlpack over every partition's data"},
        _import,
        needs=("from_partitioned",),
    )]


def _import(ctx: Ctx, res: Result) -> None:
    import numpy as np

    p = res.params
    x = ctx.env.filled(p["shape"], p["dtype"])
    d = dlpart().partition(x, tuple(p["tiling"])).__partitioned__
    # A producer's dict: numpy views as data, draft-2 locations.
    for pos, entry in d["partitions"].items():
        start, shape = entry["start"], entry["shape"]
        entry["data"] = x[tuple(slice(a, a + n) for a, n in zip(start, shape))]
    datas = [e["data"] for e in d["partitions"].values()]
    res.unit = "us"
    res.bytes = _nbytes(x)  # made available without a copy; the time is what is judged
    from_partitioned = dlpart().from_partitioned

    def check(pa):
        if pa.tiling != tuple(p["tiling"]):
            raise AssertionError(f"imported a grid of tiling {pa.tiling}")

    # Round-robin: on a shared machine, load that comes and goes slows both alike (timed one
    # after the other, the ratio swung between 0.2 and 0.45 from run to run under load).
    stats = ctx.stats_together(
        {"dlpart": lambda: from_partitioned(d),
         "np.from_dlpack-loop": lambda: [np.from_dlpack(a) for a in datas]},
        res.bytes, check, clean=False)
    res.stats = stats["dlpart"]
    res.references["np.from_dlpack-loop"] = stats["np.from_dlpack-loop"]
    res.ratio("np.from_dlpack-loop")
    # dlpart at most 2x the bare loop's time: its speed at least 0.5x the loop's.
    res.targets = {"dlpart/np.from_dlpack-loop": 0.5}


# -- 7. planning alone vs the copy ----------------------------------------------------------------
def plan_cases(ctx: Ctx) -> List[Case]:
    n, a, b, c = (1024, 32, 31, 33) if ctx.quick else (8192, 256, 255, 257)
    return [Case(
        f"plan/{a}x{a}->{b}x{c}",
        "7",
        {"shape": [n, n], "dtype": "float32", "source_tiling": [a, a], "target_tiling": [b, c]},
        _plan,
        needs=("partition", "_core._plan_stats"),
    )]


def _plan(ctx: Ctx, res: Result) -> None:
    env, p = ctx.env, res.params
    x = _source(ctx, p["shape"], p["dtype"])
    shape = p["shape"]
    src_splits = [even_splits(n, t) for n, t in zip(shape, p["source_tiling"])]
    dst_splits = [even_splits(n, t) for n, t in zip(shape, p["target_tiling"])]
    plan_stats = dlpart()._core._plan_stats
    plan_times, copies = [], 0
    for i in range(ctx.warmup + ctx.repeat):
        copies, seconds = _call_plan_stats(plan_stats, shape, src_splits, dst_splits)
        if i >= ctx.warmup:
            plan_times.append(seconds)
    res.bytes = 2 * _nbytes(x)
    pa = dlpart().partition(x, tuple(p["source_tiling"]))
    tiling = tuple(p["target_tiling"])
    res.stats = ctx.stats(
        lambda: pa.repartition(tiling=tiling), res.bytes, check_repartition(env, x, dst_splits)
    )
    plan_median = sorted(plan_times)[len(plan_times) // 2]
    res.extra = {"plan_times": plan_times, "plan_median": plan_median, "copies": copies}
    res.ratios["plan/repartition"] = plan_median / res.stats.median
    ctx.add_memcpy(res, _nbytes(x))
    res.extra["note"] = (
        f"{copies} box copies; planning {plan_median * 1e3:.2f} ms = "
        f"{100 * plan_median / res.stats.median:.1f}% of the repartition"
    )


def _call_plan_stats(fn, shape, src_splits, dst_splits):
    """`_plan_stats(shape, src, dst)`, or the `(src, dst)` form that omits the shape."""
    try:
        return fn(list(shape), src_splits, dst_splits)
    except TypeError:
        return fn(src_splits, dst_splits)


# -- helpers --------------------------------------------------------------------------------------
def _source(ctx: Ctx, shape, dtype):
    """A source array shared by the cases of one workload."""
    key = f"src{tuple(shape)}{dtype}"
    if key not in ctx.cache:
        ctx.cache.clear()
        ctx.cache[key] = ctx.env.filled(shape, dtype)
    return ctx.cache[key]


def _nbytes(x) -> int:
    n = getattr(x, "nbytes", None)
    if n is None:  # torch
        n = x.numel() * x.element_size()
    return int(n)


__all__ = [
    "rows_to_cols_cases",
    "block_cyclic_cases",
    "run_length_cases",
    "small_grid_cases",
    "plan_cases",
    "import_cases",
]
