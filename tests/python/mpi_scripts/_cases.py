"""The frame every mpirun test script shares: seeded cases from the command line, the failing
case named on stderr, and every rank aborted when one fails, so that none is left waiting."""

import sys
import traceback

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
