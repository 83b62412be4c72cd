"""`python -m dlpart bench`: times dlpart's repartition, gather and scatter on one device
against references measured in the same run (memcpy of the same bytes, and the array library's
own best way), prints a table, and writes bench.json, bench.png and bench.txt.

Effective bandwidth = (bytes read + bytes written by the minimal algorithm) / median time.
Ratios are dlpart's bandwidth over a reference's: above 1, dlpart is faster.

Workloads: 1 row blocks -> column blocks (float32, float64, uint8);
2 2x2 blocks -> block-cyclic (blocks of 256 and 32); 3 run-length sweep; 4 halo faces of a
cube; 5 gather/scatter (random, sorted, runs of 32/256); 6 small arrays over a 64x64 grid;
7 planning alone vs the repartition; 8 peak memory of a repartition; 9 `from_partitioned` of a
dict of 4,096 numpy partitions against a bare `np.from_dlpack` loop; 10 what a user would pick
instead of dlpart for rows -> columns: jax resharding (`jax.device_put` to a new
`NamedSharding` over 4 CPU devices) and dask's `rechunk` (computed), timed in the same loop.

Tables keep one unit each: bandwidth cases in GB/s (median, best and the interquartile range
of the timed runs), overhead-bound cases in microseconds. Targets are judged (met / MISSED)
only on full runs; `--quick` prints the figures and says so. Progress goes to stderr: one line
per case, with the time left estimated from the cases so far, and a line every 10 s inside a
long measurement.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import traceback
from typing import List, Optional

from .common import Case, Ctx, log
from .timing import Result, fmt_bw, fmt_time

OUTPUT_FILES = ("bench.json", "bench.png", "bench.txt")


def workloads():
    """Every workload's case list, in run order (numbered as in the module docstring)."""
    from .alternatives import alternatives_cases
    from .indexing import gather_scatter_cases, halo_cases
    from .memory import peak_memory_cases
    from .repartition import (
        block_cyclic_cases,
        import_cases,
        plan_cases,
        rows_to_cols_cases,
        run_length_cases,
        small_grid_cases,
    )

    return [rows_to_cols_cases, block_cyclic_cases, run_length_cases, halo_cases,
            gather_scatter_cases, small_grid_cases, plan_cases, peak_memory_cases, import_cases,
            alternatives_cases]


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--quick", action="store_true",
                   help="small sizes and 3 timed runs after 1 warm-up (CI; the whole run takes "
                        "seconds); prints the figures but judges no target")
    p.add_argument("--only", metavar="NAME", action="append",
                   help="run only cases whose name contains NAME (repeatable; e.g. rows_to_cols, "
                        "float64, gather/random)")
    p.add_argument("--repeat", type=int, metavar="N",
                   help="timed runs per measurement; the median and min are reported "
                        "(default 10, 3 with --quick; the judged rows -> columns cases take "
                        "3 times as many, the halo cases 20 times)")
    p.add_argument("--warmup", type=int, metavar="N",
                   help="untimed runs before timing (default 2, 1 with --quick)")
    p.add_argument("--device", metavar="DEV",
                   help="kDLCPU or kDLCUDA:N (default: kDLCUDA:0 if dlpart's CUDA backend works "
                        "there, else kDLCPU)")
    p.add_argument("--out", metavar="DIR", default="bench-out",
                   help="directory for bench.json, bench.png and bench.txt (default bench-out/)")
    p.add_argument("--list", action="store_true", help="list the case names and exit")
    p.add_argument("--mpi", action="store_true",
                   help="under mpirun: row blocks -> column blocks across the ranks against MPI's "
                        "own Alltoall of the same bytes (see dlpart/_bench/mpi.py)")
    p.add_argument("--mpi-size", type=int, metavar="N",
                   help="with --mpi: the N x N array (default 8192, 512 with --quick)")


def _missing(case: Case) -> Optional[str]:
    import dlpart

    for need in case.needs:
        obj = dlpart
        for part in need.split("."):
            obj = getattr(obj, part, None)
        if obj is None:
            return f"dlpart.{need} is missing"
    return None


def _unimplemented(e: Exception) -> bool:
    """An operation dlpart has no kernel for yet on this device: a skip, not a failure."""
    import dlpart

    unavailable = getattr(dlpart, "BackendUnavailableError", ())
    return isinstance(e, (NotImplementedError, unavailable)) or "not yet implemented" in str(e)


def run(args: argparse.Namespace) -> int:
    from . import env as envmod
    from . import report

    if getattr(args, "mpi", False):
        from . import mpi

        return mpi.run(args)

    repeat = args.repeat if args.repeat is not None else (3 if args.quick else 10)
    warmup = args.warmup if args.warmup is not None else (1 if args.quick else 2)
    if repeat < 1 or warmup < 0:
        log("dlpart bench: --repeat must be >= 1 and --warmup >= 0")
        return 2
    env, notes = envmod.select(args.device)
    ctx = Ctx(env=env, repeat=repeat, warmup=warmup, quick=args.quick)
    cases = [c for make in workloads() for c in make(ctx)]
    if args.only:
        cases = [c for c in cases if any(o in c.name for o in args.only)]
    if args.list:
        print("\n".join(c.name for c in cases))
        return 0
    if not cases:
        log(f"dlpart bench: no case matches --only {args.only}; see --list")
        return 2
    for note in notes:
        log(note)
    log(f"dlpart bench on {env.device}: {len(cases)} cases, {warmup} warm-up + {repeat} timed "
        f"runs each{' (quick)' if args.quick else ''}")

    results: List[Result] = []
    t_start, workload, interrupted = time.perf_counter(), None, False
    try:
        for i, case in enumerate(cases, 1):
            if case.workload != workload:
                workload = case.workload
                ctx.cache.clear()
            counter = f"[{i:>{len(str(len(cases)))}}/{len(cases)}]"
            eta = ""
            if i > 1:
                elapsed = time.perf_counter() - t_start
                left = elapsed / (i - 1) * (len(cases) - i + 1)
                eta = f" ({_duration(elapsed)} so far, about {_duration(left)} left)"
            results.append(_run_case(ctx, case, counter, eta))
    except KeyboardInterrupt:
        interrupted = True
        log("interrupted; writing the results so far")
    finally:
        ctx.cache.clear()
        env.close()

    machine = report.machine_info(env)
    config = {"device": env.device, "quick": args.quick, "repeat": repeat, "warmup": warmup,
              "only": args.only, "seconds": time.perf_counter() - t_start, "notes": notes,
              "targets_judged": not args.quick}
    os.makedirs(args.out, exist_ok=True)
    paths = [os.path.join(args.out, f) for f in OUTPUT_FILES]
    text = report.table(results, judged=not args.quick)
    print(text)
    report.write_json(paths[0], report.to_json(results, machine, config))
    why = report.write_png(paths[1], results, machine)
    with open(paths[2], "w") as f:
        f.write(text + "\n")
    log(f"wrote {paths[0]}, {paths[2]}" + (f", {paths[1]}" if not why else f" (no PNG: {why})"))
    failed = [r.name for r in results if r.failed]
    if failed:
        log(f"{len(failed)} case(s) failed: {', '.join(failed)}")
    return 130 if interrupted else (1 if failed else 0)


def _duration(seconds: float) -> str:
    m, s = divmod(int(seconds + 0.5), 60)
    return f"{m}m{s:02d}s" if m else f"{s}s"


def _run_case(ctx: Ctx, case: Case, counter: str, eta: str = "") -> Result:
    res = Result(case.name, case.workload, dict(case.params))
    res.skipped = _missing(case)
    log(f"{counter} {case.name} ...{eta}")
    if res.skipped:
        log(f"{' ' * len(counter)}   skipped: {res.skipped}")
        return res
    t0 = time.perf_counter()
    try:
        case.run(ctx, res)
    except KeyboardInterrupt:
        raise
    except Exception as e:  # one broken case must not lose the others' results
        res.stats = None
        res.references.clear()
        if _unimplemented(e):
            res.skipped = f"not implemented in dlpart: {e}"
        else:
            res.failed = f"{type(e).__name__}: {e}"
            traceback.print_exc(file=sys.stderr)
    pad = " " * len(counter)
    if res.failed:
        log(f"{pad}   FAILED: {res.failed}")
    elif res.skipped:
        log(f"{pad}   skipped: {res.skipped}")
    else:
        log(f"{pad}   dlpart {fmt_time(res.stats.median)} {fmt_bw(res.stats.bandwidth)} "
            f"({time.perf_counter() - t0:.1f} s)")
    return res


def main(argv: Optional[List[str]] = None) -> int:
    p = argparse.ArgumentParser(prog="python -m dlpart bench", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(p)
    return run(p.parse_args(argv))
