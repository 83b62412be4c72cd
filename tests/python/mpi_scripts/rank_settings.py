"""Run under mpirun (4 ranks): what each rank may set or name on its own.

- ``DLPART_MPI_ROUND_BYTES`` set differently on the ranks (1 MiB on rank 0, unset on rank 1,
  4 KiB and 3 MiB on ranks 2 and 3, before dlpart reads it): every rank takes rank 0's, so an
  exchange in which each rank sends each other 2 MiB (the least that takes rounds) goes in
  two rounds on every rank rather than failing every rank as different repartitions.
- ``assemble(root=None, device=...)`` with ranks 0 and 2 naming the host and ranks 1 and 3
  naming no device (their first partition's, the host too).

Each case: an n x n float64 array (n from 2048) as row blocks, repartitioned to column blocks,
copied back into row blocks of zeros, and assembled on rank 0 and on every rank, each
checked against numpy.

usage: rank_settings.py SEED CASES. Prints "ok <rank> <cases>" when every check passed; any
failure aborts every rank.
"""

import os

from mpi4py import MPI

world = MPI.COMM_WORLD
rank, size = world.Get_rank(), world.Get_size()
# Read by dlpart once, at its first exchange.
ROUND_BYTES = [1 << 20, None, 4096, 3 << 20][rank % 4]
if ROUND_BYTES is None:
    os.environ.pop("DLPART_MPI_ROUND_BYTES", None)
else:
    os.environ["DLPART_MPI_ROUND_BYTES"] = str(ROUND_BYTES)

import numpy as np  # noqa: E402

from _cases import run  # noqa: E402

import dlpart.mpi  # noqa: E402


def check_case(case, seed):
    rng = np.random.default_rng([seed, case])
    n = 2048 + size * int(rng.integers(0, 8))
    whole = rng.standard_normal((n, n))
    points = np.linspace(0, n, size + 1).astype(int).tolist()
    mine = slice(points[rank], points[rank + 1])
    rows = dlpart.mpi.from_local(whole[mine], world, axis=0)
    cols = rows.repartition(splits=[[0, n], points], devices=["kDLCPU"] * size,
                            process_grid=[1, size])
    assert cols.locals == [(0, rank)], cols.locals
    got = np.from_dlpack(cols.partitions[(0, rank)].tensor)
    assert np.array_equal(got, whole[:, mine])
    # Each rank sent each other an (n / 4) x (n / 4) block of float64: at least 2 MiB.
    assert all(b >= 2 << 20 for p, b in enumerate(cols.traffic.sent) if p != rank)
    zeros = np.zeros_like(whole[mine])
    back = dlpart.mpi.from_local(zeros, world, axis=0)
    cols.repartition_into(back)
    assert np.array_equal(np.from_dlpack(back.partitions[(rank, 0)].tensor), whole[mine])
    at_root = cols.assemble(root=0)
    assert (at_root is None) == (rank != 0)
    if at_root is not None:
        assert np.array_equal(np.asarray(at_root), whole)
    device = "kDLCPU" if rank % 2 == 0 else None
    everywhere = cols.assemble(root=None, device=device)
    assert np.array_equal(np.asarray(everywhere), whole)


run(check_case)
