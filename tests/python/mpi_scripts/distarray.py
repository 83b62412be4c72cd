"""Run under mpirun (4 ranks): arrays of the Distributed Array Protocol (``__distarray__``, 0.10)
read by `dlpart.mpi.from_distarray` and described by `SpmdArray.__distarray__`.

Each case draws a global numpy array (1-d or 2-d), a process grid of the four ranks, and for
each axis a distribution the protocol names: irregular blocks (with communication padding
that repeats the neighbours' values, and boundary padding), periodic blocks (whose end
padding holds the wrap-around neighbour's values, start below 0 and stop beyond size), cyclic
blocks of a random block size, or unstructured index lists (a random permutation dealt to the
grid's coordinates, empty shares included, and with one_to_one absent, copies of indices other
coordinates hold). Every rank builds its buffer from the global array as the protocol lays it
out, and checks against numpy: the array read from it (shape, partitions that are views of the
buffer), assembled on rank 0 and repartitioned; then the array put in one block per rank over
the same process grid, whose ``__distarray__`` must describe exactly that block and read back
the same. Afterwards: an index several ranks hold, with different values, is read from the
lowest rank, and is an error on every rank when one_to_one is True; long index lists of a
million consecutive indices per rank, overlapping, are read from the lowest rank too;
communication padding wider than the neighbour's indices, padding unequal to the neighbour's
across a boundary (the wrap-around of a periodic axis included), ranks disagreeing on
periodic or on an axis's dist_type, ranks at one proc_grid_rank of a cyclic axis giving
different starts, cyclic blocks holding an index twice, ranks at one proc_grid_rank of a block
axis owning different indices, an undistributed axis not owned whole or given different sizes,
and a rank whose process-grid coordinates disagree with its rank make every rank raise
`dlpart.ProtocolError`.

usage: distarray.py SEED CASES. Prints "ok <rank> <cases>" when every check passed; any
failure aborts every rank (MPI_Abort), so nothing waits.
"""

import numpy as np
from mpi4py import MPI

from _cases import run

import dlpart
import dlpart.mpi

comm = MPI.COMM_WORLD
rank, size = comm.Get_rank(), comm.Get_size()
GRIDS = {1: [(size,)], 2: [(1, size), (2, size // 2), (size, 1)]}


class Producer:
    """An object with ``__distarray__``, as a producing library hands it over."""

    def __init__(self, d):
        self.d = d

    def __distarray__(self):
        return self.d


def refusal(accepted, read, *args):
    """The message of the `dlpart.ProtocolError` that `read(*args)` raises; else an
    AssertionError saying `accepted`."""
    try:
        read(*args)
    except dlpart.ProtocolError as e:
        return str(e)
    raise AssertionError(accepted)


def block(rng, n, procs, coord):
    """Irregular blocks of `n` over `procs` (none empty when `n` allows), with communication
    padding (the same width on both sides of a boundary, at most either block's length) and
    boundary padding: this coordinate's dim dict and its buffer's global indices."""
    cuts = np.sort(rng.choice(np.arange(1, n), size=procs - 1, replace=False)) if n >= procs \
        else np.sort(rng.integers(0, n + 1, size=procs - 1))
    points = [0, *cuts.tolist(), n]
    lens = np.diff(points)
    widths = [0, *(int(rng.integers(0, min(lens[k - 1], lens[k]) + 1)) for k in range(1, procs)),
              0]
    bounds = [int(rng.integers(0, 3)) if lens[0] > 2 else 0,
              int(rng.integers(0, 3)) if lens[-1] > 2 else 0]
    lo, hi = points[coord] - widths[coord], points[coord + 1] + widths[coord + 1]
    left = widths[coord] if coord > 0 else bounds[0]
    right = widths[coord + 1] if coord < procs - 1 else bounds[1]
    dim = {"dist_type": "b", "size": n, "proc_grid_size": procs, "proc_grid_rank": coord,
           "start": lo, "stop": hi, "padding": (left, right)}
    if left == right == 0 and rng.random() < 0.5:
        del dim["padding"]  # optional
    return dim, list(range(lo, hi))


def periodic_block(rng, n, procs, coord):
    """Irregular blocks of `n` on a periodic axis with a halo at every boundary, the one
    before coordinate 0 shared with the last coordinate (wrapping around): at most as wide as
    either block beside it. This coordinate's dim dict and its buffer's global indices."""
    cuts = np.sort(rng.integers(0, n + 1, size=procs - 1))
    points = [0, *cuts.tolist(), n]
    lens = np.diff(points)
    widths = [int(rng.integers(0, min(lens[k], lens[k - 1], 2) + 1)) for k in range(procs)]
    left, right = widths[coord], widths[(coord + 1) % procs]
    lo, hi = points[coord] - left, points[coord + 1] + right
    dim = {"dist_type": "b", "size": n, "proc_grid_size": procs, "proc_grid_rank": coord,
           "start": lo, "stop": hi, "padding": (left, right), "periodic": True}
    return dim, [g % n for g in range(lo, hi)]


def cyclic(rng, n, procs, coord):
    b = int(rng.integers(1, 4))
    dim = {"dist_type": "c", "size": n, "proc_grid_size": procs, "proc_grid_rank": coord,
           "start": coord * b}
    if b > 1 or rng.random() < 0.5:
        dim["block_size"] = b
    mine = [g for k in range(coord * b, n, procs * b) for g in range(k, min(k + b, n))]
    return dim, mine


def unstructured(rng, n, procs, coord):
    order = rng.permutation(n)
    cuts = np.sort(rng.integers(0, n + 1, size=procs - 1))
    mine = np.split(order, cuts)[coord]
    # Copies of indices the other coordinates hold (one_to_one absent, so allowed), drawn the
    # same by every coordinate, each keeping its own row.
    extra = rng.integers(0, max(n, 1), size=(procs, 3))[coord] if n else []
    copies, one_to_one = rng.random(2) < 0.5  # drawn before the draws that depend on coord
    if copies:
        mine = np.concatenate([mine, np.setdiff1d(np.unique(extra), mine)]).astype(np.int64)
    mine = mine[rng.permutation(len(mine))]
    dim = {"dist_type": "u", "size": n, "proc_grid_size": procs, "proc_grid_rank": coord,
           "indices": mine.astype(np.int64)}
    if not copies and one_to_one:
        dim["one_to_one"] = True
    return dim, mine.tolist()


def check_case(case, seed):
    rng = np.random.default_rng([seed, case])
    ndim = int(rng.integers(1, 3))
    grid = GRIDS[ndim][int(rng.integers(0, len(GRIDS[ndim])))]
    shape = tuple(int(rng.integers(0 if rng.random() < 0.05 else 1, 13)) for _ in range(ndim))
    dtype = [np.float64, np.int32, np.float32][case % 3]
    g = (rng.standard_normal(shape) * 100).astype(dtype)
    coords = np.unravel_index(rank, grid)
    kinds = [[block, periodic_block, cyclic, unstructured][int(rng.integers(0, 4))]
             for _ in range(ndim)]
    dims, local = [], []
    for axis in range(ndim):
        # Every rank draws every coordinate's share, so that all agree on the distribution.
        draws = [kinds[axis](np.random.default_rng([seed, case, axis]), shape[axis], grid[axis], c)
                 for c in range(grid[axis])]
        dim, mine = draws[coords[axis]]
        dims.append(dim)
        local.append(mine)
    buffer = np.ascontiguousarray(g[np.ix_(*local)])
    d = {"__version__": "0.10.0", "buffer": buffer, "dim_data": tuple(dims)}
    a = dlpart.mpi.from_distarray(Producer(d) if case % 2 else d, comm)
    assert a.shape == shape and a.dtype == np.dtype(dtype).name, (a.shape, a.dtype)
    for pos in a.locals:
        view = np.from_dlpack(a.partitions[pos].tensor)
        assert view.size == 0 or np.shares_memory(view, buffer), pos  # no copy
    whole = a.assemble(root=0)
    if rank == 0:
        np.testing.assert_array_equal(np.from_dlpack(whole), g)
    moved = a.repartition([max(1, n // 3) for n in shape]).assemble(root=None)
    np.testing.assert_array_equal(np.from_dlpack(moved), g)

    # One block per rank over the same process grid, described and read back.
    blocks = a.repartition(list(grid), process_grid=list(grid))
    out = blocks.__distarray__()
    mine = blocks.partitions[blocks.locals[0]]
    assert blocks.locals == [tuple(int(c) for c in coords)], (blocks.locals, coords)
    for axis, dim in enumerate(out["dim_data"]):
        assert dim == {"dist_type": "b", "size": shape[axis], "proc_grid_size": grid[axis],
                       "proc_grid_rank": int(coords[axis]), "start": mine.start[axis],
                       "stop": mine.start[axis] + mine.shape[axis], "padding": (0, 0)}, dim
    box = tuple(slice(s, s + n) for s, n in zip(mine.start, mine.shape))
    np.testing.assert_array_equal(out["buffer"], g[box])
    assert out["buffer"].size == 0 or np.shares_memory(out["buffer"], np.from_dlpack(mine.tensor))
    again = dlpart.mpi.from_distarray(blocks, comm).assemble(root=None)
    np.testing.assert_array_equal(np.from_dlpack(again), g)


def shared_indices_are_read_from_the_lowest_rank():
    # 8 indices over the 4 ranks, several held twice; rank r holds 100 * r + g at index g, so
    # the array read names the rank each index came from.
    shared = [[0, 1, 2, 3], [2, 3, 4, 5], [7, 5, 6], [6, 7, 1]][rank]
    buffer = 100.0 * rank + np.array(shared, dtype=np.float64)

    def d(**keys):
        return {"__version__": "0.10.0", "buffer": buffer,
                "dim_data": ({"dist_type": "u", "size": 8, "proc_grid_size": size,
                              "proc_grid_rank": rank, "indices": np.array(shared), **keys},)}

    a = dlpart.mpi.from_distarray(d(), comm)
    np.testing.assert_array_equal(np.from_dlpack(a.assemble(root=None)),
                                  [0, 1, 2, 3, 104, 105, 206, 207])
    if rank == 3:
        assert a.locals == [], a.locals  # every index it holds, a lower rank holds too
    e = refusal("an index held twice was accepted with one_to_one True",
                dlpart.mpi.from_distarray, d(one_to_one=True), comm)
    assert "global index 1 is held by the processes at proc_grid_rank 0 and 3" in e, e


def long_contiguous_lists_are_read_as_runs():
    # Each rank lists 1.5 * N consecutive indices from rank * N on (the last cut at the end),
    # overlapping the next rank's: each index is read from the lowest rank holding it, and
    # the ranks exchange runs, not 12 MB of indices each.
    n = 1 << 20
    total = size * n
    indices = np.arange(rank * n, min(rank * n + 3 * n // 2, total), dtype=np.int64)
    buffer = np.zeros(len(indices), dtype=np.uint8)
    d = {"__version__": "0.10.0", "buffer": buffer,
         "dim_data": ({"dist_type": "u", "size": total, "proc_grid_size": size,
                       "proc_grid_rank": rank, "indices": indices},)}
    a = dlpart.mpi.from_distarray(d, comm)
    lo = 0 if rank == 0 else rank * n + n // 2
    mine = [(a.partitions[p].start, a.partitions[p].shape) for p in a.locals]
    assert mine == [((lo,), (int(indices[-1]) + 1 - lo,))], mine


def padding_wider_than_the_neighbours_share_fails_every_rank():
    # 8 indices, two per rank, periodic with a halo of one wrapping around; rank 0's halo is 3
    # wide, where each neighbour owns 2.
    lo, hi, pad = (-3, 5, (3, 3)) if rank == 0 else (2 * rank - 1, 2 * rank + 3, (1, 1))
    d = {"__version__": "0.10.0", "buffer": np.zeros(hi - lo),
         "dim_data": ({"dist_type": "b", "size": 2 * size, "proc_grid_size": size,
                       "proc_grid_rank": rank, "start": lo, "stop": hi, "padding": pad,
                       "periodic": True},)}
    e = refusal("padding wider than the neighbour's indices was accepted",
                dlpart.mpi.from_distarray, d, comm)
    assert ("rank 0 (proc_grid_rank 0 along it) has padding (3, 3): the communication "
            "padding of 3 at its low end is wider than the 2 indices its neighbour owns, "
            f"rank {size - 1}") in e, e
    # Ranks that disagree on periodic.
    d = {"__version__": "0.10.0", "buffer": np.zeros(2),
         "dim_data": ({"dist_type": "b", "size": 2 * size, "proc_grid_size": size,
                       "proc_grid_rank": rank, "start": 2 * rank, "stop": 2 * rank + 2,
                       "periodic": rank == 1},)}
    e = refusal("ranks disagreeing on periodic were accepted", dlpart.mpi.from_distarray, d, comm)
    assert "periodic is False at proc_grid_rank 0 (rank 0) but True at proc_grid_rank 1" in e, e


def unequal_padding_across_a_boundary_fails_every_rank():
    # 8 indices, two per rank; a halo between ranks 1 and 2, 2 wide on rank 1's side and 1 on
    # rank 2's (each at most what the other owns): the two sides of a boundary are as wide.
    pads = [(0, 1), (1, 2), (1, 0), (0, 0)][rank] if size == 4 else (0, 0)
    lo, hi = 2 * rank - pads[0], 2 * rank + 2 + pads[1]
    d = {"__version__": "0.10.0", "buffer": np.zeros(hi - lo),
         "dim_data": ({"dist_type": "b", "size": 2 * size, "proc_grid_size": size,
                       "proc_grid_rank": rank, "start": lo, "stop": hi, "padding": pads},)}
    if size == 4:
        e = refusal("unequal padding across a boundary was accepted",
                    dlpart.mpi.from_distarray, d, comm)
        assert e == (
            "__distarray__ dim_data[0] ('b'): rank 1 (proc_grid_rank 1 along it) has "
            "padding (1, 2) and its neighbour, rank 2 at proc_grid_rank 2, has padding "
            "(1, 0): the communication padding between them is 2 wide at the high end of "
            "rank 1 and 1 at the low end of rank 2 (the protocol has the two equal)"), e
    # Periodic, a halo of 1 everywhere but 2 at rank 0's low end, across the wrap-around.
    pads = (2, 1) if rank == 0 else (1, 1)
    lo, hi = 2 * rank - pads[0], 2 * rank + 2 + pads[1]
    x = np.arange(2.0 * size)
    d = {"__version__": "0.10.0", "buffer": x[np.arange(lo, hi) % (2 * size)],
         "dim_data": ({"dist_type": "b", "size": 2 * size, "proc_grid_size": size,
                       "proc_grid_rank": rank, "start": lo, "stop": hi, "padding": pads,
                       "periodic": True},)}
    e = refusal("unequal padding across the wrap-around was accepted",
                dlpart.mpi.from_distarray, d, comm)
    assert (f"rank {size - 1} (proc_grid_rank {size - 1} along it) has padding (1, 1) and "
            "its neighbour across the wrap-around of the periodic axis, rank 0 at "
            "proc_grid_rank 0, has padding (2, 1)") in e, e
    # The same with rank 0's low end 1 wide: read, the halos left out.
    pads = (1, 1)
    lo, hi = 2 * rank - 1, 2 * rank + 3
    d["buffer"], d["dim_data"][0]["start"], d["dim_data"][0]["padding"] = \
        x[np.arange(lo, hi) % (2 * size)], lo, pads
    got = dlpart.mpi.from_distarray(d, comm).assemble(root=None)
    np.testing.assert_array_equal(np.from_dlpack(got), x)


def mixed_dist_types_fail_every_rank():
    # Two indices per rank, blocks everywhere but on rank 1: cyclic blocks of 2, which deal it
    # the same indices. Still no one distribution: refused on every rank.
    x = np.arange(2.0 * size)
    dim = {"dist_type": "b", "size": 2 * size, "proc_grid_size": size, "proc_grid_rank": rank,
           "start": 2 * rank, "stop": 2 * rank + 2}
    if rank == 1:
        dim = {**dim, "dist_type": "c", "block_size": 2}
        del dim["stop"]
    d = {"__version__": "0.10.0", "buffer": x[2 * rank:2 * rank + 2], "dim_data": (dim,)}
    e = refusal("an axis read as blocks and as cyclic blocks was accepted",
                dlpart.mpi.from_distarray, d, comm)
    assert e == (
        "__distarray__ dim_data[0]: dist_type is 'b' at proc_grid_rank 0 (rank 0) but 'c' "
        "at proc_grid_rank 1 (rank 1): an axis has one dist_type on every process"), e


def cyclic_starts_that_break_the_protocol_fail_every_rank():
    # Cyclic blocks of 1 over a 2 x (size / 2) grid, the columns dealt along the second axis.
    cols = size // 2
    x = np.arange(2.0 * 2 * cols).reshape(2, 2 * cols)
    i, j = divmod(rank, cols)

    def read(start):
        d = {"__version__": "0.10.0", "buffer": x[i:i + 1, start::cols],
             "dim_data": ({"dist_type": "b", "size": 2, "proc_grid_size": 2,
                           "proc_grid_rank": i, "start": i, "stop": i + 1},
                          {"dist_type": "c", "size": 2 * cols, "proc_grid_size": cols,
                           "proc_grid_rank": j, "start": start})}
        return dlpart.mpi.from_distarray(d, comm)

    # Row 1 deals its columns in the other order: every element is held once, but the ranks
    # at one proc_grid_rank along the columns give different starts.
    e = refusal("ranks at one proc_grid_rank with different starts were accepted",
                read, cols - 1 - j if i == 1 else j)
    assert e == (
        f"__distarray__ dim_data[1] ('c'): ranks 0 and {cols}, both at proc_grid_rank 0 "
        f"along it, give start 0, block_size 1 and start {cols - 1}, block_size 1 (the "
        "protocol has the dimension dictionaries at one proc_grid_rank identical)"), e
    # Coordinate 1 starts where coordinate 0 does: index 0 held twice, refused on every rank.
    e = refusal("cyclic blocks holding an index twice were accepted", read, 0 if j == 1 else j)
    assert e == (
        "__distarray__ dim_data[1] ('c'): global index 0 is held by the processes at "
        "proc_grid_rank 0 and 1 along it (start 0 and 0, block_size 1): cyclic blocks "
        "hold each index once"), e
    got = read(j).assemble(root=None)
    np.testing.assert_array_equal(np.from_dlpack(got), x)


def block_ranges_that_break_the_protocol_fail_every_rank():
    # Blocks of two rows over a 2 x (size / 2) grid, one column per rank along the second axis.
    cols = size // 2
    x = np.arange(4.0 * cols).reshape(4, cols)
    i, j = divmod(rank, cols)

    def read(row):
        d = {"__version__": "0.10.0", "buffer": x[2 * row:2 * row + 2, j:j + 1],
             "dim_data": ({"dist_type": "b", "size": 4, "proc_grid_size": 2,
                           "proc_grid_rank": i, "start": 2 * row, "stop": 2 * row + 2},
                          {"dist_type": "b", "size": cols, "proc_grid_size": cols,
                           "proc_grid_rank": j, "start": j, "stop": j + 1})}
        return dlpart.mpi.from_distarray(d, comm)

    # The last column gives its two rows' ranges the other way round: every element is still
    # held once, but the ranks at one proc_grid_rank along the rows own different rows.
    e = refusal("ranks at one proc_grid_rank owning different rows were accepted",
                read, 1 - i if j == cols - 1 else i)
    assert e == (
        f"__distarray__ dim_data[0] ('b'): ranks 0 and {cols - 1}, both at proc_grid_rank "
        "0 along it, give start 0, stop 2, padding (0, 0) and start 2, stop 4, padding "
        "(0, 0), which own global indices 0..2 and 2..4 (the protocol has the dimension "
        "dictionaries at one proc_grid_rank identical)"), e
    got = read(i).assemble(root=None)
    np.testing.assert_array_equal(np.from_dlpack(got), x)

    # An undistributed axis, one row per rank: each rank owns all of it, and gives one size.
    y = np.arange(3.0 * size).reshape(size, 3)

    def read_whole(axis1, n=3):
        d = {"__version__": "0.10.0", "buffer": y[rank:rank + 1, :n],
             "dim_data": ({"dist_type": "b", "size": size, "proc_grid_size": size,
                           "proc_grid_rank": rank, "start": rank, "stop": rank + 1}, axis1)}
        return dlpart.mpi.from_distarray(d, comm)

    e = refusal("an undistributed axis no process owns all of was accepted",
                read_whole, {"dist_type": "b", "size": 3, "start": 0, "stop": 2}, 2)
    assert e == (
        "__distarray__ dim_data[1] ('b'): global indices 2..3 are owned by no process "
        "(proc_grid_rank 0, the only process along it, owns 0..2 of size 3)"), e
    # The protocol's empty dictionary is the whole buffer: the last rank's is a column short.
    e = refusal("ranks giving an undistributed axis different sizes were accepted",
                read_whole, {}, 2 if rank == size - 1 else 3)
    assert e == (
        f"__distarray__ dim_data[1] ('b'): size 3 on rank 0, 2 on rank {size - 1}"), e
    got = read_whole({}).assemble(root=None)
    np.testing.assert_array_equal(np.from_dlpack(got), y)


def disagreeing_grid_rank_fails_every_rank():
    x = np.arange(8.0)
    coord = 3 - rank if rank in (1, 2) else rank  # ranks 1 and 2 swap coordinates
    d = {"__version__": "0.10.0", "buffer": x[2 * rank:2 * rank + 2],
         "dim_data": ({"dist_type": "b", "size": 8, "proc_grid_size": size,
                       "proc_grid_rank": coord, "start": 2 * rank, "stop": 2 * rank + 2},)}
    e = refusal("a grid rank that is not the process's rank was accepted",
                dlpart.mpi.from_distarray, d, comm)
    assert "process grid rank" in e, e


def layouts_without_one_block_per_rank_are_refused():
    a = dlpart.mpi.from_local({(2 * rank,): np.arange(2.0)}, comm)
    two = a.repartition([2 * size])  # two partitions per rank
    e = refusal("a layout of two partitions per rank was described", two.__distarray__)
    assert "one buffer" in e, e


run(check_case, shared_indices_are_read_from_the_lowest_rank,
    long_contiguous_lists_are_read_as_runs,
    padding_wider_than_the_neighbours_share_fails_every_rank,
    unequal_padding_across_a_boundary_fails_every_rank, mixed_dist_types_fail_every_rank,
    cyclic_starts_that_break_the_protocol_fail_every_rank,
    block_ranges_that_break_the_protocol_fail_every_rank, disagreeing_grid_rank_fails_every_rank,
    layouts_without_one_block_per_rank_are_refused)
