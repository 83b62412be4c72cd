"""Run under mpirun (4 ranks), with neither heat nor torch: heat's SPMD dict form, built by hand
on every rank, goes through `dlpart.mpi` and back out in heat's form.

heat's form (heat 1.8, `DNDarray.create_partition_interface`): one partition per rank, rank
`r` holding the `r`-th slab along the split axis; `location` is `[r]` (an int MPI rank);
`locals` lists this rank's position; `data` is this rank's array and None elsewhere; extra
keys `dtype` and `device`; `get` is the identity (a quarter of the cases write the ranks as
numpy integers). Each case draws a global shape, a split axis
and uneven slab sizes (heat's own balanced chunks or random ones, empty slabs included), then
checks on every rank against numpy: the SpmdArray read from the dict (locals, zero-copy local
data), a cross-rank repartition assembled on rank 0 and on every rank, and the dict that
`dlpart.adapters.heat.to_heat` produces, read by the rules heat's `from_partitioned` applies
(`read_like_heat` below), which must give back the input's grid and memory; then a layout heat
cannot read, or a rank's reversed view that torch cannot hold, raises `dlpart.ProtocolError` on
every rank, and `to_heat(split=k)` repartitions into heat's balanced chunks. heat's replicated form (`split=None`) is read too.

usage: heat_form.py SEED CASES. Prints "ok <rank> <cases>" when every check passed; any
failure aborts every rank (MPI_Abort), so nothing waits.
"""


import numpy as np
from mpi4py import MPI

from _cases import heat_points, one_rank_holds_all, region, run

import dlpart
import dlpart.mpi
from dlpart._location import this_host
from dlpart.adapters.heat import to_heat

comm = MPI.COMM_WORLD
rank, size = comm.Get_rank(), comm.Get_size()
DTYPES = [np.float32, np.float64, np.int64, np.int32]


def slab_points(rng, n):
    """Split points of `n` over the ranks: heat's balanced chunks or random (empty ones too)."""
    if rng.random() < 0.5:
        return heat_points(n)
    return [0, *np.sort(rng.integers(0, n + 1, size=size - 1)).tolist(), n]


def heat_dict(ref, split, points, as_rank=int):
    """What heat's `__partitioned__` is on this rank, with numpy data instead of torch; ranks
    made by `as_rank` (heat's `int(location[0])` reads a numpy integer as well)."""
    parts = {}
    for r in range(size):
        pos = tuple(r if axis == split else 0 for axis in range(ref.ndim))
        start = tuple(points[r] if axis == split else 0 for axis in range(ref.ndim))
        shape = tuple(points[r + 1] - points[r] if axis == split else n
                      for axis, n in enumerate(ref.shape))
        data = None
        if r == rank:
            data = ref[tuple(slice(s, s + n) for s, n in zip(start, shape))].copy()
        parts[pos] = {"start": start, "shape": shape, "data": data, "location": [as_rank(r)],
                      "dtype": ref.dtype, "device": "cpu"}
    local = tuple(rank if axis == split else 0 for axis in range(ref.ndim))
    return {"shape": ref.shape, "partition_tiling": tuple(size if a == split else 1
                                                          for a in range(ref.ndim)),
            "partitions": parts, "locals": [local], "get": lambda x: x}


def refused(make, why):
    try:
        make()
    except dlpart.ProtocolError as e:
        assert why in str(e), str(e)
    else:
        raise AssertionError(f"to_heat accepted a layout heat cannot read ({why})")


def read_like_heat(d):
    """The checks heat 1.8's `from_partitioned` makes (factories.__from_partition_dict_helper),
    and the local array and split axis it would build the DNDarray from."""
    assert "locals" in d and len(d["locals"]) == 1, d.get("locals")
    local = d["get"](d["partitions"][d["locals"][0]]["data"])
    assert isinstance(local, np.ndarray), type(local)  # heat: numpy or torch, nothing else
    assert all(s >= 0 for s in local.strides), local.strides  # torch.from_numpy's own check
    diff = [g - n for g, n in zip(d["shape"], local.shape)]
    nonzero = [axis for axis, x in enumerate(diff) if x]
    assert len(nonzero) <= 1, diff
    ranks = {int(p["location"][0]): p for p in d["partitions"].values()}
    assert sorted(ranks) == list(range(size)), sorted(ranks)
    return local, (nonzero[0] if nonzero else None)


def replicated_dict(ref, local):
    """heat's dict for an unsplit DNDarray (`split=None`): every rank holds the whole array,
    and heat's loop over the ranks writes the one key (0, ..) each time, so the last rank's
    location stays, with this rank's own data, listed in `locals` on every rank."""
    zero = (0,) * ref.ndim
    return {"shape": ref.shape, "partition_tiling": (1,) * ref.ndim,
            "partitions": {zero: {"start": zero, "shape": ref.shape, "data": local,
                                  "location": [size - 1], "dtype": ref.dtype, "device": "cpu"}},
            "locals": [zero], "get": lambda x: x}


def check_replicated(ref, rng):
    """heat's replicated form is read as one partition owned by the last rank (the location
    heat writes), each rank's own copy its local data: it assembles to the array and deals
    over the ranks like any SPMD array."""
    local = ref.copy()
    a = dlpart.mpi.from_partitioned(replicated_dict(ref, local), comm)
    assert a.shape == ref.shape and a.locals == [(0,) * ref.ndim], (a.shape, a.locals)
    here = np.from_dlpack(a.partitions[a.locals[0]].tensor)
    assert local.size == 0 or here.ctypes.data == local.ctypes.data, "zero-copy import"
    np.testing.assert_array_equal(np.from_dlpack(a.assemble(root=None)), ref)
    axis = int(rng.integers(0, ref.ndim))
    dealt = a.repartition(tuple(size if ax == axis else 1 for ax in range(ref.ndim)),
                          process_grid=tuple(size if ax == axis else 1 for ax in range(ref.ndim)))
    (mine,) = dealt.locals
    lo, hi = dealt.splits[axis][mine[axis]], dealt.splits[axis][mine[axis] + 1]
    np.testing.assert_array_equal(np.from_dlpack(dealt.partitions[mine].tensor),
                                  region(ref, axis, lo, hi))
    # A scatter writes every rank's copy; repartition_into refuses to write one copy alone.
    if ref.shape[axis] > 0:
        rows = rng.integers(0, ref.shape[axis], size=2)
        vals = np.take(ref, rows, axis=axis) + 1
        a.scatter(vals, rows, axis)
        want = ref.copy()
        want[(slice(None),) * axis + (rows,)] = vals
        np.testing.assert_array_equal(local, want)
    try:
        dealt.repartition_into(a)
    except BufferError as e:
        assert "holds a copy of it" in str(e), str(e)
    else:
        assert size == 1, "repartition_into wrote one copy of a replicated array"


def reversed_views_are_refused(rng, ref, split, points):
    """A rank passing `from_local` a view with a negative stride (its slab, as values, held in
    reverse along axis 0): torch, and so heat, cannot hold it. `to_heat` raises a ProtocolError
    naming that rank on every rank (heat would raise on that rank alone); `split=` hands heat new
    memory holding the same values."""
    slab = [region(ref, split, points[r], points[r + 1]) for r in range(size)]
    candidates = [r for r in range(size) if slab[r].shape[0] >= 2 and slab[r].size > 0]
    if one_rank_holds_all(points) or not candidates:
        return
    flipper = candidates[int(rng.integers(0, len(candidates)))]
    mine = slab[rank]
    if rank == flipper:
        mine = mine[::-1].copy()[::-1]  # the same values, a negative stride along axis 0
        assert mine.strides[0] < 0, (mine.shape, mine.strides, mine.dtype)
    a = dlpart.mpi.from_local(mine, comm, axis=split)
    try:
        to_heat(a)
    except dlpart.ProtocolError as e:
        assert str(e).startswith(f"rank {flipper}: partition ") and "negative stride" in str(e), e
    else:
        raise AssertionError(f"to_heat took rank {flipper}'s reversed view")
    expect = heat_points(ref.shape[split])
    if not one_rank_holds_all(expect):
        local, _ = read_like_heat(to_heat(a, split=split).__partitioned__)
        np.testing.assert_array_equal(local, region(ref, split, expect[rank], expect[rank + 1]))


def check_case(case, seed):
    rng = np.random.default_rng([seed, case])  # the same draws on every rank
    ndim = int(rng.integers(1, 4))
    shape = tuple(int(n) for n in rng.integers(1, 12, size=ndim))
    split = int(rng.integers(0, ndim))
    dtype = DTYPES[case % len(DTYPES)]
    ref = np.arange(int(np.prod(shape)), dtype=dtype).reshape(shape) * 3 + 1
    points = slab_points(rng, shape[split])
    d = heat_dict(ref, split, points, np.int64 if rng.random() < 0.25 else int)
    mine = d["partitions"][d["locals"][0]]["data"]
    check_replicated(ref, rng)
    reversed_views_are_refused(rng, ref, split, points)

    # heat -> dlpart: ranks as locations, this rank's slab local and zero-copy.
    a = dlpart.mpi.from_partitioned(d, comm)
    assert a.shape == ref.shape and a.dtype == str(np.dtype(dtype)), (a.shape, a.dtype)
    assert a.locals == d["locals"], (a.locals, d["locals"])
    (t,) = [a.partitions[p].tensor for p in a.locals]
    here = np.from_dlpack(t)
    np.testing.assert_array_equal(here, mine)
    assert mine.size == 0 or here.ctypes.data == mine.ctypes.data, "zero-copy import"
    # Every rank learnt every rank's host: xgboost_ray's form names each partition's.
    ips = a.to_partitioned(locations="ip")["partitions"]
    hosts = comm.allgather(this_host())
    assert all(p["location"] == [hosts[int(d["partitions"][k]["location"][0])]]
               for k, p in ips.items()), ips

    # Across the ranks: another axis (or block-cyclic), assembled on rank 0 and everywhere.
    other = (split + 1) % ndim
    target = (a.repartition(block_cyclic=int(rng.integers(1, 4))) if other == split
              else a.repartition(tuple(size if ax == other else 1 for ax in range(ndim))))
    whole = target.assemble(root=0)
    if rank == 0:
        np.testing.assert_array_equal(np.from_dlpack(whole), ref)
    else:
        assert whole is None
    np.testing.assert_array_equal(np.from_dlpack(target.assemble(root=None)), ref)

    # dlpart -> heat's form: the same grid, int ranks, this rank's memory, read as heat reads.
    if one_rank_holds_all(points):
        refused(lambda: to_heat(a), "holds all")
        return
    out = to_heat(a).__partitioned__
    local, heat_split = read_like_heat(out)
    assert local.ctypes.data == mine.ctypes.data or mine.size == 0, "zero-copy export"
    np.testing.assert_array_equal(local, mine)
    assert heat_split == (split if size > 1 and ref.shape[split] > 0 else None), heat_split
    assert out["locals"] == d["locals"] and out["partition_tiling"] == d["partition_tiling"]
    for pos, p in d["partitions"].items():
        q = out["partitions"][pos]
        assert (q["start"], q["shape"], q["location"]) == (p["start"], p["shape"], p["location"])
        assert (q["data"] is None) == (p["data"] is None), pos
    again = dlpart.mpi.from_partitioned(out, comm)  # and round again
    assert again.splits == a.splits and again.locals == a.locals

    # Layouts heat cannot read are refused on every rank; split= makes heat's own.
    unreadable = [a.repartition(tuple(2 * size if ax == split else 1 for ax in range(ndim)))]
    if other != split and size > 1:
        unreadable.append(target)  # every slab on the rank holding the first row
    for bad in unreadable:
        refused(lambda: to_heat(bad), "split=")
    expect = heat_points(shape[other])
    if one_rank_holds_all(expect):
        refused(lambda: to_heat(target, split=other), "holds all")
        return
    balanced = to_heat(target, split=other)
    local, heat_split = read_like_heat(balanced.__partitioned__)
    assert heat_split == (other if size > 1 and shape[other] > 0 else None), heat_split
    np.testing.assert_array_equal(local, region(ref, other, expect[rank], expect[rank + 1]))
    assert balanced.array.traffic is not None  # moved across the ranks by dlpart, not by heat


if __name__ == "__main__":
    run(check_case)
