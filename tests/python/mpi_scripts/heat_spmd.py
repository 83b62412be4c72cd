"""Run under mpirun (4 ranks) with heat: heat DNDarrays and dlpart SPMD arrays exchanged across
the ranks, in both directions, checked against numpy built on every rank from the same seed.

- heat -> dlpart: a DNDarray split along axis 0 or 1 (uneven sizes; heat's balanced chunks and
  an unbalanced `is_split` array) read by `dlpart.mpi.from_partitioned(x.__partitioned__,
  comm)` (int ranks as locations), repartitioned across the ranks to the other axis, assembled
  on rank 0: equal to numpy and to `x.numpy()`; now and then an unsplit (`split=None`) one,
  which every rank holds whole, and which goes back into heat unsplit.
- dlpart -> heat: `dlpart.mpi.from_local` row or column blocks of random uneven sizes (one rank
  may hold none), through `dlpart.adapters.heat.to_heat` into `ht.from_partitioned`: heat's
  local chunk is this rank's memory, `numpy()` and (after `split=` put the data in heat's
  balanced chunks) `resplit` equal numpy. The SpmdArray's own draft-2 dict is not heat's form:
  heat's `int(location[0])` fails on it, which is why the adapter exists.

- dlpart's one-process reader on SPMD dicts, on COMM_WORLD and on each rank's COMM_SELF (a
  one-rank heat array is unsplit): heat reads a dlpart array made by `dlpart.from_partitioned`
  of a hand-built SPMD dict, and a heat array goes through `dlpart.from_partitioned` and back
  into heat; zero-copy both ways, ranks stay ranks and torch stays torch.

Then the guide's heat block runs: examples/mpi/with_heat.py, in this launch (starting heat on
every rank takes seconds).

usage: heat_spmd.py SEED CASES. Prints "ok <rank> <cases>" when every check passed; any
failure aborts every rank (MPI_Abort), so nothing waits.
"""

import contextlib
import io
import pathlib
import runpy

import heat as ht
import numpy as np
import torch
from mpi4py import MPI

from _cases import heat_points, one_rank_holds_all, region, run

import dlpart
import dlpart.mpi
from dlpart.adapters.heat import to_heat

comm = MPI.COMM_WORLD
rank, size = comm.Get_rank(), comm.Get_size()
DTYPES = [np.float32, np.float64, np.int64, np.int32]


def replicated_heat_to_dlpart(ref):
    """An unsplit DNDarray (split=None): every rank's whole copy is its local data, read as one
    partition on the rank heat's dict names (the last), and it assembles to the array."""
    x = ht.array(torch.from_numpy(ref.copy()), split=None)
    a = dlpart.mpi.from_partitioned(x.__partitioned__, comm)
    assert a.locals == [(0,) * ref.ndim], a.locals
    local = np.from_dlpack(a.partitions[a.locals[0]].tensor)
    assert local.ctypes.data == x.larray.data_ptr() or local.size == 0, "zero-copy from heat"
    np.testing.assert_array_equal(np.from_dlpack(a.assemble(root=None)), ref)
    # and back into heat, unsplit again, over every rank's own copy
    back = ht.from_partitioned(to_heat(a))
    assert back.split is None and back.shape == ref.shape, (back.split, back.shape)
    assert back.larray.data_ptr() == x.larray.data_ptr() or ref.size == 0, "zero-copy to heat"
    np.testing.assert_array_equal(back.numpy(), ref)
    # One partition that only rank 0 holds is not heat's replicated form: every rank refuses.
    alone = dlpart.mpi.from_local({(0, 0): ref} if rank == 0 else {}, comm)
    try:
        to_heat(alone)
    except dlpart.ProtocolError as e:
        assert size == 1 or "as replicated (split=None), a copy on every rank" in str(e), str(e)
    else:
        assert size == 1, "to_heat accepted one partition held by rank 0 alone"


def heat_to_dlpart(rng, ref, split):
    if rng.random() < 0.25:
        replicated_heat_to_dlpart(ref)
    if rng.random() < 0.5:
        x = ht.array(torch.from_numpy(ref.copy()), split=split)  # heat's balanced chunks
    else:  # an unbalanced heat array: each rank's slab of random size
        pts = [0, *np.sort(rng.integers(0, ref.shape[split] + 1, size=size - 1)).tolist(),
               ref.shape[split]]
        x = ht.array(torch.from_numpy(region(ref, split, pts[rank], pts[rank + 1]).copy()),
                     is_split=split)
    a = dlpart.mpi.from_partitioned(x.__partitioned__, comm)
    assert a.locals == x.__partitioned__["locals"], (a.locals, x.__partitioned__["locals"])
    local = np.from_dlpack(a.partitions[a.locals[0]].tensor)
    assert local.ctypes.data == x.larray.data_ptr() or local.size == 0, "zero-copy from heat"
    other = 1 - split
    moved = a.repartition(tuple(size if ax == other else 1 for ax in range(ref.ndim)))
    whole = moved.assemble(root=0)
    gathered = x.numpy()  # collective: every rank
    if rank == 0:
        np.testing.assert_array_equal(np.from_dlpack(whole), ref)
        np.testing.assert_array_equal(np.from_dlpack(whole), gathered)
    # and back into heat, along the other axis, in torch as it came
    if one_rank_holds_all(heat_points(ref.shape[other])):
        return
    back = ht.from_partitioned(to_heat(moved, split=other))
    assert back.split == (other if size > 1 else None) and isinstance(back.larray, torch.Tensor)
    np.testing.assert_array_equal(back.numpy(), ref)


def dlpart_to_heat(rng, ref, split):
    n = ref.shape[split]
    pts = [0, *np.sort(rng.integers(0, n + 1, size=size - 1)).tolist(), n]
    mine = region(ref, split, pts[rank], pts[rank + 1])
    a = dlpart.mpi.from_local(mine, comm, axis=split)
    if one_rank_holds_all(pts):
        try:
            to_heat(a)
        except dlpart.ProtocolError as e:
            assert "holds all" in str(e), str(e)
        else:
            raise AssertionError(f"to_heat accepted a rank holding all of {pts}")
    else:
        dlpart_layout_to_heat(a, ref, split, mine)
    if one_rank_holds_all(heat_points(n)):
        return
    # heat 1.8's resplit fails on unbalanced arrays (MPI_ERR_TRUNCATE, with heat's own
    # is_split arrays too): split= hands heat its balanced chunks, moved by dlpart.
    y = ht.from_partitioned(to_heat(a, split=split))
    lo, hi = heat_points(n)[rank:rank + 2]
    assert y.is_balanced() and y.lshape == region(ref, split, lo, hi).shape, y.lshape
    np.testing.assert_array_equal(y.resplit(1 - split).numpy(), ref)


def dlpart_layout_to_heat(a, ref, split, mine):
    try:
        ht.from_partitioned(a)  # draft-2 (ip, pid, device) locations: not heat's form
    except TypeError as e:
        assert "int()" in str(e), str(e)
    else:
        raise AssertionError("heat read draft-2 locations")
    x = ht.from_partitioned(to_heat(a))
    assert x.shape == ref.shape and x.split == (split if size > 1 else None), (x.shape, x.split)
    np.testing.assert_array_equal(x.larray.numpy(), mine)
    assert mine.size == 0 or x.larray.data_ptr() == mine.ctypes.data, "zero-copy into heat"
    np.testing.assert_array_equal(x.numpy(), ref)


def check_case(case, seed):
    rng = np.random.default_rng([seed, case])  # the same draws on every rank
    shape = tuple(int(n) for n in rng.integers(1, 14, size=2))
    ref = (np.arange(shape[0] * shape[1]).reshape(shape) * 7 - 3).astype(DTYPES[case % 4])
    split = case % 2
    heat_to_dlpart(rng, ref, split)
    dlpart_to_heat(rng, ref, split)


def plain_dicts_through_heat(world):
    """heat and dlpart's one-process `from_partitioned` (no communicator) on `world`'s ranks."""
    r, n = world.Get_rank(), world.Get_size()
    hcomm = ht.MPICommunication(world)
    rows, cols = 4 * n + 1, 3
    ref = np.arange(rows * cols, dtype=np.float32).reshape(rows, cols)
    bounds = heat_points(rows, n)  # heat's own balanced split

    # A dlpart array of an SPMD dict (this rank's row block here, the others' None) read by heat.
    mine = ref[bounds[r]:bounds[r + 1]].copy()
    spmd = {
        "shape": ref.shape, "partition_tiling": (n, 1), "locals": [(r, 0)],
        "partitions": {(q, 0): {"start": (bounds[q], 0), "shape": (bounds[q + 1] - bounds[q], cols),
                                "data": mine if q == r else None, "location": [q]}
                       for q in range(n)},
        "get": dlpart.get,
    }
    pa = dlpart.from_partitioned(spmd)
    x = ht.from_partitioned(to_heat(pa, world), comm=hcomm)
    assert x.shape == ref.shape and x.split == (0 if n > 1 else None), (x.shape, x.split)
    local = x.larray.numpy()
    np.testing.assert_array_equal(local, mine)
    assert local.ctypes.data == mine.ctypes.data, "zero-copy: heat holds dlpart's memory"
    np.testing.assert_array_equal(x.numpy(), ref)

    # A heat array through dlpart and back into heat: ranks stay ranks, torch stays torch.
    h = ht.array(torch.arange(rows * cols, dtype=torch.float32).reshape(rows, cols), split=0,
                 comm=hcomm)
    through = dlpart.from_partitioned(h)
    assert through.locals == [(r, 0)], through.locals
    back = ht.from_partitioned(to_heat(through, world), comm=hcomm)
    assert (back == h).all()
    assert back.larray.data_ptr() == h.larray.data_ptr(), "zero-copy both ways"
    d = through.__partitioned__
    assert all(isinstance(p["location"][0], int) for p in d["partitions"].values())
    assert isinstance(d["partitions"][(r, 0)]["data"], torch.Tensor)


def run_plain_dicts_through_heat():
    plain_dicts_through_heat(comm)
    plain_dicts_through_heat(MPI.COMM_SELF)


def run_guide_example():
    example = pathlib.Path(__file__).parents[3] / "examples" / "mpi" / "with_heat.py"
    with contextlib.redirect_stdout(io.StringIO()):  # its own "ok <rank>" line, not ours
        runpy.run_path(str(example), run_name="example")


if __name__ == "__main__":
    run(check_case, run_plain_dicts_through_heat, run_guide_example)
