"""SPMD arrays across MPI ranks: `mpirun -n 4 python examples/mpi/spmd.py`.

The block between the markers is the one in docs/guide.md ("SPMD: one process per rank").
"""

# --- guide ---
import numpy as np
from mpi4py import MPI

import dlpart
import dlpart.mpi

comm = MPI.COMM_WORLD
rank, size = comm.Get_rank(), comm.Get_size()
x = np.arange(8 * size * 6, dtype=np.float32).reshape(8 * size, 6)   # the global array
mine = x[8 * rank : 8 * (rank + 1)]                                   # this rank's rows

rows = dlpart.mpi.from_local(mine, comm, axis=0)        # one allgather agrees the grid
d = rows.__partitioned__                                # locals, data=None elsewhere
assert d["locals"] == [(rank, 0)]
assert all((e["data"] is None) == (pos != (rank, 0)) for pos, e in d["partitions"].items())

cyclic = rows.repartition(block_cyclic=(4, 3))          # one exchange, blocks dealt over ranks
assert cyclic.traffic.sent[rank] == 0                   # boxes that stay are never sent
whole = cyclic.assemble(root=0)                         # a Tensor on rank 0, None elsewhere
if rank == 0:
    assert (np.from_dlpack(whole) == x).all()

try:                                                    # ranks that disagree all raise
    rows.repartition((2, 1) if rank else (1, 2))
except dlpart.ProtocolError as e:
    assert "asked for different" in str(e)
else:
    assert size == 1
# --- end ---

print(f"ok {rank}", flush=True)
