"""What the workloads share: the run context, the case record, even split points, the
per-block reference copy and the check that a repartition gave the right data."""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Sequence, Tuple

from .timing import Result, Stats, measure, measure_together


@dataclass
class Case:
    """One benchmark case; `run` is only called if the name passes `--only` and every dlpart
    attribute named in `needs` exists."""

    name: str
    workload: str
    params: Dict[str, Any]
    run: Callable[["Ctx", Result], None]
    needs: Tuple[str, ...] = ("partition",)


@dataclass
class Ctx:
    env: Any
    repeat: int
    warmup: int
    quick: bool
    # Per-workload scratch (source arrays, index arrays), cleared between workloads.
    cache: Dict[str, Any] = field(default_factory=dict)
    _memcpy: Dict[int, Dict[str, Stats]] = field(default_factory=dict)

    def stats(self, fn: Callable[[], Any], nbytes: int, check=None) -> Stats:
        times = measure(fn, repeat=self.repeat, warmup=self.warmup, sync=self.env.sync, check=check,
                        progress=_progress)
        return Stats(times, nbytes)

    def stats_together(
        self, fns: Dict[str, Callable[[], Any]], nbytes: int, check=None, rounds: int = 1,
        clean: bool = True,
    ) -> Dict[str, Stats]:
        """Stats of every function of `fns`, timed round-robin (see `measure_together`),
        `rounds` times the run's repeat count, from a clean cache unless `clean` is False (for
        cases whose data is meant to be in cache); `check` validates the result of
        `fns["dlpart"]`."""
        checks = {"dlpart": check} if check is not None else {}
        times = measure_together(
            fns,
            repeat=self.repeat * rounds,
            warmup=self.warmup,
            sync=self.env.sync,
            checks=checks,
            reset=self.env.clean_cache if clean else None,
            progress=_progress,
        )
        return {name: Stats(t, nbytes) for name, t in times.items()}

    def memcpy(self, nbytes: int) -> Dict[str, Stats]:
        """The env's memcpy references for `nbytes` (each moves 2 * nbytes: read and write),
        measured once per size per run."""
        if nbytes not in self._memcpy:
            refs = self.env.memcpy_refs(nbytes)
            self._memcpy[nbytes] = {k: self.stats(f, 2 * nbytes) for k, f in refs.items()}
            del refs
        return self._memcpy[nbytes]

    def add_memcpy(self, res: Result, nbytes: int) -> None:
        res.references.update(self.memcpy(nbytes))
        for name in self.env.memcpy_primary:
            res.ratio(name)


def dlpart():
    import dlpart as mod

    return mod


def even_splits(n: int, k: int) -> List[int]:
    """Split points of `numpy.array_split(range(n), k)`."""
    q, r = divmod(n, k)
    return [i * q + min(i, r) for i in range(k + 1)]


def boxes(splits: Sequence[Sequence[int]]):
    """(position, slices) of every box of a grid given by split points, C order."""
    import itertools

    for pos in itertools.product(*(range(len(s) - 1) for s in splits)):
        yield pos, tuple(slice(s[i], s[i + 1]) for s, i in zip(splits, pos))


def axis_overlaps(src: Sequence[int], dst: Sequence[int]) -> List[List[Tuple[int, int, int]]]:
    """For each target interval of one axis, the (source index, lo, hi) intervals it overlaps,
    found by one merge-like sweep over both split-point lists."""
    out: List[List[Tuple[int, int, int]]] = [[] for _ in range(len(dst) - 1)]
    i = 0
    for j in range(len(dst) - 1):
        lo, hi = dst[j], dst[j + 1]
        while i < len(src) - 2 and src[i + 1] <= lo:
            i += 1
        k = i
        while k < len(src) - 1 and src[k] < hi:
            a, b = max(lo, src[k]), min(hi, src[k + 1])
            if a < b:
                out[j].append((k, a, b))
            k += 1
    return out


def direct_pairs(src: Dict, src_splits, dst: Dict, dst_splits) -> List[tuple]:
    """For numpy's best direct repartition: every (target, target slices, source, source slices)
    intersection of two grids, computed before timing so that only the copies are timed."""
    import itertools

    per_axis = [axis_overlaps(s, d) for s, d in zip(src_splits, dst_splits)]
    pairs = []
    for dpos, dsl in boxes(dst_splits):
        for pieces in itertools.product(*(per_axis[a][j] for a, j in enumerate(dpos))):
            spos = tuple(k for k, _, _ in pieces)
            pairs.append((
                dst[dpos],
                tuple(slice(a - d.start, b - d.start) for (_, a, b), d in zip(pieces, dsl)),
                src[spos],
                tuple(slice(a - src_splits[ax][k], b - src_splits[ax][k])
                      for ax, (k, a, b) in enumerate(pieces)),
            ))
    return pairs


def run_pairs(pairs) -> None:
    for d, dsl, s, ssl in pairs:
        d[dsl] = s[ssl]


def direct_setup(env, x, src_splits, dst_splits):
    """Source views, preallocated targets and the copy pairs between them."""
    src = {pos: x[sl] for pos, sl in boxes(src_splits)}
    dst = {}
    for pos, sl in boxes(dst_splits):
        dst[pos] = env.empty([s.stop - s.start for s in sl], str(x.dtype).replace("torch.", ""))
    return src, dst, direct_pairs(src, src_splits, dst, dst_splits)


def check_repartition(env, x, splits) -> Callable[[Any], None]:
    """A check that a repartition result has the grid `splits` and holds x's data."""

    def check(r) -> None:
        got = [list(s) for s in r.splits]
        if got != [list(s) for s in splits]:
            raise AssertionError(f"repartition gave split points {got}, expected {splits}")
        for pos, sl in boxes(splits):
            p = r.partitions[pos]
            if tuple(p.start) != tuple(s.start for s in sl):
                raise AssertionError(f"partition {pos} starts at {p.start}")
            if not env.equal(env.view(p.tensor), x[sl]):
                raise AssertionError(f"partition {pos} holds the wrong data")

    return check


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def _progress(msg: str) -> None:
    log(f"      ... {msg}")
