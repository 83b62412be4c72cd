"""Run under mpirun: heat reads dlpart arrays, and dlpart re-exports of heat arrays, on every rank.

Prints "ok <rank>" when every check passed.
"""

import sys

import numpy as np
import heat as ht
import torch
from mpi4py import MPI

from _cases import heat_points

import dlpart
from dlpart.adapters.heat import to_heat

comm = MPI.COMM_WORLD
rank, size = comm.Get_rank(), comm.Get_size()
rows, cols = 4 * size + 1, 3
ref = np.arange(rows * cols, dtype=np.float32).reshape(rows, cols)
bounds = heat_points(rows)  # heat's own balanced split

# 1. A dlpart SPMD array (this rank's row block here, the others' None) read by heat.
mine = ref[bounds[rank]:bounds[rank + 1]].copy()
spmd = {
    "shape": ref.shape, "partition_tiling": (size, 1), "locals": [(rank, 0)],
    "partitions": {(r, 0): {"start": (int(bounds[r]), 0), "shape": (int(bounds[r + 1] - bounds[r]), cols),
                            "data": mine if r == rank else None, "location": [r]}
                   for r in range(size)},
    "get": dlpart.get,
}
pa = dlpart.from_partitioned(spmd)
x = ht.from_partitioned(to_heat(pa, comm))
assert x.shape == ref.shape and x.split == (0 if size > 1 else None)
local = x.larray.numpy()
np.testing.assert_array_equal(local, mine)
assert local.ctypes.data == mine.ctypes.data, "zero-copy: heat holds dlpart's memory"
np.testing.assert_array_equal(x.numpy(), ref)

# 2. A heat array through dlpart and back into heat: ranks stay ranks, torch stays torch.
h = ht.array(torch.arange(rows * cols, dtype=torch.float32).reshape(rows, cols), split=0)
through = dlpart.from_partitioned(h)
assert through.locals == [(rank, 0)]
back = ht.from_partitioned(to_heat(through, comm))
assert (back == h).all()
assert back.larray.data_ptr() == h.larray.data_ptr(), "zero-copy both ways"
d = through.__partitioned__
assert all(isinstance(p["location"][0], int) for p in d["partitions"].values())
assert isinstance(d["partitions"][(rank, 0)]["data"], torch.Tensor)
sys.stdout.write(f"ok {rank}\n")  # one write: ranks share the pipe
sys.stdout.flush()
