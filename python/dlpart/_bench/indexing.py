"""Workloads 4 and 5: halo faces, through `dlpart.prepare_gather` (with `dlpart.gather` as a
reference), and gather/scatter, through `dlpart.gather` and `dlpart.scatter`."""

from __future__ import annotations

from typing import List

import numpy as np

from .common import Case, Ctx, dlpart
from .timing import Result

FACE_METHOD = (
    "one dlpart.prepare_gather per face (a one-element index along the face's axis, into a "
    "preallocated contiguous buffer), made once before the timed runs as numpy's slices are, "
    "and called each run; dlpart.gather with the same arguments per call is timed alongside "
    "(partition + repartition with split points would copy the interior as well, so gather is "
    "the API's minimal way to pack a face)"
)

# The halo cases' second reference: `dlpart.gather` called per face with the same arguments.
PLAIN = "dlpart.gather"

# Timed rounds of the halo cases per repeat of the run (see `_halo`).
HALO_ROUNDS = 20


# -- 4. halo faces --------------------------------------------------------------------------------
def halo_cases(ctx: Ctx) -> List[Case]:
    n = 64 if ctx.quick else 512
    return [
        Case(
            f"halo_faces/{which}",
            "4",
            {"shape": [n, n, n], "dtype": "float32", "faces": which, "method": FACE_METHOD},
            _halo,
            needs=("gather", "prepare_gather"),
        )
        for which in ("all6", "axis0", "axis1", "axis2")
    ]


def _halo(ctx: Ctx, res: Result) -> None:
    env, p = ctx.env, res.params
    key = "halo_src"
    if key not in ctx.cache:
        ctx.cache[key] = env.filled(p["shape"], p["dtype"])
    x = ctx.cache[key]
    n = p["shape"][0]
    axes = [0, 1, 2] if p["faces"] == "all6" else [int(p["faces"][-1])]
    faces = []
    for a in axes:
        for i in (0, n - 1):
            sl = [slice(None)] * 3
            sl[a] = slice(i, i + 1)
            shape = [n, n, n]
            shape[a] = 1
            idx = env.from_host(np.array([i], dtype=np.int64))
            faces.append((a, idx, tuple(sl), env.empty(shape, p["dtype"])))
    res.bytes = sum(2 * 4 * n * n for _ in faces)
    # Made once, as a halo exchange makes them once for all its time steps: each call is the
    # copy alone. `dlpart.gather` imports x, the indices and out through DLPack on every call.
    prepared = [dlpart().prepare_gather(x, idx, axis=a, out=buf) for a, idx, _, buf in faces]
    gather = dlpart().gather

    def run():
        for g in prepared:
            g()

    def plain():
        for a, idx, _, buf in faces:
            gather(x, idx, axis=a, out=buf)

    def check(_):
        for a, _, sl, buf in faces:
            if not env.equal(buf, x[sl]):
                raise AssertionError(f"face along axis {a} at {sl[a]} holds the wrong data")

    def direct():
        for _, _, sl, buf in faces:
            buf[...] = x[sl]

    # Round-robin, in cache (faces are gathered near their last use): load that comes and
    # goes on a shared machine then slows all three alike. A round takes a fraction of a
    # millisecond, so HALO_ROUNDS times the run's repeat count are timed: with 10 rounds the
    # median still held the first, slower rounds after the cube was written (one 2-vCPU
    # machine, axis 0: medians 37-49 GB/s for both dlpart and numpy, ratios 0.95-1.06; with
    # 200, 53-67 GB/s, ratios 1.01-1.04).
    stats = ctx.stats_together({"dlpart": run, env.direct: direct, PLAIN: plain}, res.bytes,
                               check, clean=False, rounds=HALO_ROUNDS)
    res.stats = stats["dlpart"]
    res.references[env.direct] = stats[env.direct]
    res.references[PLAIN] = stats[PLAIN]
    res.ratio(env.direct)
    res.ratio(PLAIN)
    res.ratios[f"{PLAIN}/{env.direct}"] = stats[env.direct].median / stats[PLAIN].median
    if p["faces"] == "axis0" and env.kind == "cpu":
        res.targets = {f"dlpart/{env.direct}": 1.0}


# -- 5. gather / scatter --------------------------------------------------------------------------
PATTERNS = ("random", "sorted", "block32", "block256")


def gather_scatter_cases(ctx: Ctx) -> List[Case]:
    n = (1 << 20) if ctx.quick else (64 << 20)
    cases = []
    for pattern in PATTERNS:
        for op in ("gather", "scatter"):
            cases.append(Case(
                f"{op}/{pattern}",
                "5",
                {"elements": n, "dtype": "float32", "index_dtype": "int64", "pattern": pattern},
                _gather if op == "gather" else _scatter,
                needs=(op,),
            ))
    return cases


def indices(pattern: str, n: int, seed: int = 0) -> np.ndarray:
    """`n` indices into a length-`n` array: uniform random (with repeats), the same sorted, or
    runs of 32/256 consecutive indices starting at random multiples of the run length."""
    rng = np.random.default_rng(seed)
    if pattern in ("random", "sorted"):
        idx = rng.integers(0, n, n, dtype=np.int64)
        if pattern == "sorted":
            idx.sort()
        return idx
    b = int(pattern[len("block"):])
    starts = rng.integers(0, n // b, n // b, dtype=np.int64) * b
    return (starts[:, None] + np.arange(b, dtype=np.int64)).reshape(-1)


def _inputs(ctx: Ctx, res: Result):
    """The source array and this pattern's indices, shared by the gather and scatter cases."""
    env, p = ctx.env, res.params
    n = p["elements"]
    if "x" not in ctx.cache:
        ctx.cache["x"] = env.filled((n,), p["dtype"])
    if ctx.cache.get("pattern") != p["pattern"]:
        ctx.cache.pop("idx", None)
        ctx.cache.pop("values", None)
        host = indices(p["pattern"], n)
        ctx.cache["idx"] = env.from_host(host)
        ctx.cache["values"] = env.from_host((host & 0xFFFF).astype(np.float32))
        ctx.cache["pattern"] = p["pattern"]
        del host
    # Indices read (8 B), values read (4 B), values written (4 B) per element.
    res.bytes = n * (8 + 4 + 4)
    return ctx.cache["x"], ctx.cache["idx"], ctx.cache["values"]


def _gather(ctx: Ctx, res: Result) -> None:
    env = ctx.env
    x, idx, _ = _inputs(ctx, res)
    n = res.params["elements"]
    out, ref_out = env.empty((n,), "float32"), env.empty((n,), "float32")
    gather = dlpart().gather

    def check(_):
        if not env.equal(out, env.take(x, idx)):
            raise AssertionError("dlpart.gather differs from take")

    name = f"{env.lib}-take"
    res.params["reference"] = (
        "np.take(x, idx, out=out, mode='clip') (mode='raise' with out= buffers the result)"
        if env.lib == "numpy" else f"{env.lib} take into a preallocated output"
    )
    # Round-robin, as the other cases: timed one after the other, a shared machine's load
    # came and went between dlpart's runs and the reference's.
    stats = ctx.stats_together({"dlpart": lambda: gather(x, idx, axis=0, out=out),
                                name: lambda: env.take_out(x, idx, ref_out)},
                               res.bytes, check, clean=False)
    res.stats, res.references[name] = stats["dlpart"], stats[name]
    res.ratio(name)
    if res.params["pattern"] == "random" and env.kind == "cpu":
        res.targets = {f"dlpart/{name}": 1.0}
    if res.params["pattern"] == "block32" and env.kind == "cuda":
        # The GPU target: gather's bandwidth (indices and values) against a plain copy's.
        ctx.add_memcpy(res, n * 4)
        res.targets = {"dlpart/memcpyD2D": 0.6}


def _scatter(ctx: Ctx, res: Result) -> None:
    env = ctx.env
    _, idx, values = _inputs(ctx, res)
    n = res.params["elements"]
    out, ref_out = env.empty((n,), "float32"), env.empty((n,), "float32")
    out[...] = 0
    ref_out[...] = 0
    scatter = dlpart().scatter
    # Each value depends only on its index, so whichever duplicate wins the result is the same.
    res.params["values"] = "index & 0xFFFF, so duplicate indices write equal values"

    def check(_):
        env.setitem(ref_out, idx, values)
        if not env.equal(out, ref_out):
            raise AssertionError("dlpart.scatter differs from out[idx] = values")

    name = f"{env.lib}-setitem"
    stats = ctx.stats_together({"dlpart": lambda: scatter(values, idx, out, axis=0),
                                name: lambda: env.setitem(ref_out, idx, values)},
                               res.bytes, check, clean=False)
    res.stats, res.references[name] = stats["dlpart"], stats[name]
    res.ratio(name)
