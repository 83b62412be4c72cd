"""dlpart in a few lines: cut an array into partitions, change the layout, hand it on.

Run with `python examples/python/quickstart.py` after `scripts/test.sh build-ext` (or
`source scripts/setup.sh && dlpart_build_extension`).
"""

import pickle

import numpy as np

import dlpart

# Any DLPack array (numpy, jax, torch, cupy, dpctl, pyarrow ...) becomes a dlpart tensor without a copy.
x = np.arange(8 * 6, dtype=np.float32).reshape(8, 6)
t = dlpart.from_dlpack(x)
assert t.data_ptr == x.ctypes.data
print(t)

# Cut it into a 4x1 grid of zero-copy views: row blocks.
rows = dlpart.partition(x, (4, 1))
print(rows, rows.splits)

# Repartition into column blocks, on the device where the data is (here the CPU).
cols = rows.repartition((1, 3))
for pos, part in cols.partitions.items():
    np.testing.assert_array_equal(np.from_dlpack(part.tensor), x[:, part.start[1]:part.start[1] + part.shape[1]])

# Blocks dealt round-robin over a device list, ScaLAPACK style.
cyclic = rows.repartition(block_cyclic=(2, 2), devices=["kDLCPU"] * 4)
print("block-cyclic tiling:", cyclic.tiling)

# Reuse your own buffers: repartition into preallocated partitions.
out = np.empty_like(x)
rows.repartition_into(dlpart.partition(out, (2, 2)))
np.testing.assert_array_equal(out, x)

# The __partitioned__ protocol: produce a dict, pickle it, consume it anywhere.
d = cols.__partitioned__
print("location of (0, 0):", d["partitions"][(0, 0)]["location"])
again = dlpart.from_partitioned(pickle.loads(pickle.dumps(d)))
np.testing.assert_array_equal(np.from_dlpack(again.assemble()), x)

# Gather and scatter along an axis, like numpy.take and fancy assignment.
idx = np.array([5, -1, 0])
np.testing.assert_array_equal(np.from_dlpack(dlpart.gather(x, idx, axis=1)), np.take(x, idx, axis=1))
y = np.zeros_like(x)
dlpart.scatter(x[:3], np.array([7, 0, 3]), y)
np.testing.assert_array_equal(y[[7, 0, 3]], x[:3])

# The same copy at every time step (a halo face): prepared once, each call only copies.
last_row = np.empty((1, 6), np.float32)
pack = dlpart.prepare_gather(y, [-1], axis=0, out=last_row)
for step in range(3):
    y[-1] += 1  # the step changes the data, never the shape
    pack()
np.testing.assert_array_equal(last_row[0], y[-1])

# The same on a partitioned array, with global indices: each index is served by the partition
# that holds it, on its device.
picked = rows.gather(np.array([6, 1]), axis=0)
np.testing.assert_array_equal(np.from_dlpack(picked.assemble()), x[[6, 1]])
target = dlpart.partition(np.zeros_like(x), (2, 3))
target.scatter(x[:2], np.array([-1, 3]), axis=0)
np.testing.assert_array_equal(np.from_dlpack(target.assemble())[[7, 3]], x[:2])

# Mistakes are named precisely.
bad = dict(d, partition_tiling=(1, 2))
try:
    dlpart.validate(bad)
except dlpart.ProtocolError as e:
    print("ProtocolError:", e)
print("ok")
