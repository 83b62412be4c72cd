"""The frame every mpirun test script shares: seeded cases from the command line, the failing
case named on stderr, and every rank aborted when one fails, so that none is left waiting; and
the helpers of the heat scripts (heat's split layout over the ranks of COMM_WORLD)."""

import sys
import traceback

import numpy as np
from mpi4py import MPI


def run(check_case, *after):
    """``check_case(case, seed)`` for each case of ``SEED CASES`` (the script's arguments), then
    each of ``after``; prints ``ok <rank> <cases>`` in one write (the ranks share the pipe).
    Any exception prints its traceback and aborts every rank (MPI_Abort)."""
    comm = MPI.COMM_WORLD
    rank = comm.Get_rank()
    try:
        seed, cases = int(sys.argv[1]), int(sys.argv[2])
        for case in range(cases):
            try:
                check_case(case, seed)
            except Exception:
                print(f"rank {rank}: case {case} of seed {seed} failed", file=sys.stderr, flush=True)
                raise
        for step in after:
            step()
        sys.stdout.write(f"ok {rank} {cases}\n")
        sys.stdout.flush()
    except BaseException:  # noqa: BLE001 - abort every rank rather than leave them waiting
        traceback.print_exc()
        sys.stderr.flush()
        comm.Abort(1)


def heat_points(n, size=None):
    """heat's balanced chunks of `n` over `size` ranks (default: COMM_WORLD's) as split points
    (heat's `comm.chunk`: the first `n % size` ranks hold one more), written out here as the
    reference."""
    size = MPI.COMM_WORLD.Get_size() if size is None else size
    counts = [n // size + (1 if r < n % size else 0) for r in range(size)]
    return np.concatenate([[0], np.cumsum(counts)]).tolist()


def one_rank_holds_all(points):
    """heat infers its split axis per rank from the chunk's shape: a rank holding the whole
    (non-empty) axis would take the array as unsplit, and to_heat refuses such a layout."""
    n = points[-1]
    size = MPI.COMM_WORLD.Get_size()
    return size > 1 and n > 0 and any(b - a == n for a, b in zip(points, points[1:]))


def region(a, axis, lo, hi):
    """`a[lo:hi]` along `axis`, whole along the others."""
    return a[tuple(slice(lo, hi) if ax == axis else slice(None) for ax in range(a.ndim))]
