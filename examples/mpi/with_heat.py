"""heat and dlpart across MPI ranks: `mpirun -n 4 python examples/mpi/with_heat.py` (needs heat).

The block between the markers is the one in docs/guide.md ("SPMD: one process per rank").
"""

# --- guide ---
import heat as ht
import numpy as np
from mpi4py import MPI

import dlpart.mpi
from dlpart.adapters.heat import to_heat

comm = MPI.COMM_WORLD
rank, size = comm.Get_rank(), comm.Get_size()
ref = np.arange(10 * 6, dtype=np.float32).reshape(10, 6)

x = ht.array(ref, split=0)                                # heat's row blocks
rows = dlpart.mpi.from_partitioned(x.__partitioned__, comm)   # heat's int ranks read as ranks
y = ht.from_partitioned(to_heat(rows, split=1))           # dlpart moves them to heat's columns
assert y.split == (1 if size > 1 else None) and (y.numpy() == ref).all()

mine = ref[2 * rank : 2 * rank + 2] if rank < size - 1 else ref[2 * rank :]
z = dlpart.mpi.from_local(mine, comm, axis=0)             # draft-2 locations: not heat's form
w = ht.from_partitioned(to_heat(z))                       # int ranks, over this rank's memory
assert (w.larray.numpy() == mine).all() and (w.numpy() == ref).all()
# --- end ---

print(f"ok {rank}", flush=True)
