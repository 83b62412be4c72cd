"""Run under mpirun (4 ranks): property tests of SPMD arrays across ranks.

Every rank draws the same random global layouts (a shared seed): uneven grids, several
partitions per rank, a rank with none, targets by split points, tilings, block-cyclic and
process grids. Checked against numpy on every rank: the local partitions of each result, the
whole assembled on rank 0 and on every rank, repartition_into, the byte counts (boxes that stay
on a rank are never sent; computed here from box intersections), the dicts (the same on every
rank but for data and locals), gather and scatter with global indices, `to`, and the errors: a
rank that disagrees or fails makes every rank raise the same error within seconds (one that
cannot learn its node's address when dlpart first uses a communicator included).

usage: spmd_props.py SEED CASES. Prints "ok <rank> <cases>" when every check passed; any
failure aborts every rank (MPI_Abort), so nothing waits.
"""

import inspect
import time

import numpy as np
from mpi4py import MPI

from _cases import run

import dlpart
import dlpart.mpi
from dlpart import _core
from dlpart.adapters.heat import to_heat

comm = MPI.COMM_WORLD
rank, size = comm.Get_rank(), comm.Get_size()
_comm = dlpart.mpi._comm(comm)
DTYPES = [np.float32, np.float64, np.int32, np.uint8, np.int64]


def splits_of(rng, n, parts, allow_empty):
    cuts = np.sort(rng.integers(0, n + 1, size=parts - 1)).tolist()
    s = [0] + cuts + [n]
    return s if allow_empty else sorted(set(s))


def boxes(splits):
    """(flat, start, shape) of every partition of a grid, C order."""
    out = []
    for flat, pos in enumerate(np.ndindex(*[len(s) - 1 for s in splits])):
        start = [s[i] for s, i in zip(splits, pos)]
        shape = [s[i + 1] - s[i] for s, i in zip(splits, pos)]
        out.append((flat, start, shape))
    return out


def region(a, start, shape):
    return a[tuple(slice(s, s + n) for s, n in zip(start, shape))]


def overlap(a_start, a_shape, b_start, b_shape):
    n = 1
    for s0, n0, s1, n1 in zip(a_start, a_shape, b_start, b_shape):
        n *= max(0, min(s0 + n0, s1 + n1) - max(s0, s1))
    return n


def stay_owner(src_splits, src_owner, start):
    """The owner of the source partition holding `start` (the last slab for an end index)."""
    pos = [min(int(np.searchsorted(s, i, side="right")) - 1, len(s) - 2) for s, i in zip(src_splits, start)]
    return src_owner[int(np.ravel_multi_index(pos, [len(s) - 1 for s in src_splits]))]


def default_process_grid(ndim, n):
    if ndim == 1:
        return [n]
    p0 = max(p for p in range(1, n + 1) if p * p <= n and n % p == 0)
    return [p0, n // p0] + [1] * (ndim - 2)


def dealt_owner(pos, pg):
    return int(np.ravel_multi_index([i % p for i, p in zip(pos, pg)], pg))


def same_everywhere(value, what):
    values = comm.allgather(value)
    assert all(v == values[0] for v in values), f"{what} differs between ranks: {values}"


def random_case(case, seed):
    rng = np.random.default_rng([seed, case])
    ndim = int(rng.choice([1, 2, 2, 2, 3]))
    shape = [int(rng.integers(1, 14 if ndim < 3 else 7)) for _ in range(ndim)]
    dtype = DTYPES[int(rng.integers(len(DTYPES)))]
    ref = (np.arange(int(np.prod(shape))) % 251).astype(dtype).reshape(shape)
    src_splits = [splits_of(rng, n, int(rng.integers(1, 5)), False) for n in shape]
    src = boxes(src_splits)
    # Rank 2 owns nothing in most cases.
    src_owner = [int(r) if r != 2 or case % 4 == 0 else 0 for r in rng.integers(0, size, len(src))]
    mine = {tuple(start): region(ref, start, shp).copy() for f, start, shp in src if src_owner[f] == rank}
    a = dlpart.mpi.from_local(mine, comm, shape=shape)
    assert [list(s) for s in a.splits] == src_splits
    assert sorted(map(tuple, a.locals)) == sorted(
        tuple(np.unravel_index(f, [len(s) - 1 for s in src_splits])) for f in range(len(src)) if src_owner[f] == rank)

    kind = case % 4
    if kind == 0:
        block = [int(rng.integers(1, 5)) for _ in shape]
        out = a.repartition(block_cyclic=block)
        dst_splits = [list(range(0, n, b)) + [n] for n, b in zip(shape, block)]
        pg = default_process_grid(ndim, size)
    elif kind == 1 and ndim >= 2:
        tiling = [int(rng.integers(1, 4)) for _ in shape]
        pg = [2, 2] + [1] * (ndim - 2)
        out = a.repartition(tiling, devices=["kDLCPU"] * size, process_grid=pg)
        dst_splits = [list(s) for s in dlpart.split_points(shape, tiling)]
    else:
        dst_splits = [splits_of(rng, n, int(rng.integers(1, 5)), True) for n in shape]
        out = a.repartition(splits=dst_splits)
        pg = None
    assert [list(s) for s in out.splits] == dst_splits, (out.splits, dst_splits)
    dst = boxes(dst_splits)
    dst_pos = [np.unravel_index(f, [len(s) - 1 for s in dst_splits]) for f in range(len(dst))]
    dst_owner = [dealt_owner(p, pg) if pg else stay_owner(src_splits, src_owner, start)
                 for p, (_, start, _) in zip(dst_pos, dst)]

    # The local partitions hold numpy's boxes; the others are None here.
    d = out.__partitioned__
    assert sorted(d["locals"]) == sorted(tuple(int(i) for i in p) for p, o in zip(dst_pos, dst_owner) if o == rank)
    for (f, start, shp), pos, o in zip(dst, dst_pos, dst_owner):
        entry = d["partitions"][tuple(int(i) for i in pos)]
        ip, pid, device = entry["location"][0]
        assert device == "kDLCPU" and isinstance(ip, str) and isinstance(pid, int)
        if o == rank:
            assert pid == __import__("os").getpid()
            np.testing.assert_array_equal(np.asarray(entry["data"]), region(ref, start, shp))
        else:
            assert entry["data"] is None
    same_everywhere([(k, v["start"], v["shape"], v["location"]) for k, v in sorted(d["partitions"].items())],
                    "the dict")

    # Byte counts: what this rank must send to each rank, and copy locally, from intersections.
    item = np.dtype(dtype).itemsize
    sent, local = [0] * size, 0
    for (fs, ss, ns) in src:
        if src_owner[fs] != rank:
            continue
        for (fd, sd, nd), o in zip(dst, dst_owner):
            n = overlap(ss, ns, sd, nd) * item
            if o == rank:
                local += n
            else:
                sent[o] += n
    assert out.traffic.sent == sent and out.traffic.local == local, (out.traffic, sent, local)
    assert out.traffic.sent[rank] == 0 and out.traffic.received[rank] == 0
    assert sum(comm.allgather(sum(out.traffic.sent))) == sum(comm.allgather(sum(out.traffic.received)))

    whole = out.assemble(root=0)
    if rank == 0:
        np.testing.assert_array_equal(np.from_dlpack(whole), ref)
    else:
        assert whole is None
    np.testing.assert_array_equal(np.from_dlpack(out.assemble(root=None)), ref)

    # Back into zeroed copies of the source layout.
    zeros = {k: np.zeros_like(v) for k, v in mine.items()}
    back = dlpart.mpi.from_local(zeros, comm, shape=shape)
    out.repartition_into(back)
    for k, v in zeros.items():
        np.testing.assert_array_equal(v, region(ref, k, mine[k].shape))

    # The dict read back on every rank.
    again = dlpart.mpi.from_partitioned(d, comm)
    np.testing.assert_array_equal(np.from_dlpack(again.assemble(root=None)), ref)

    # Gather and scatter with global indices (negative and repeated ones too).
    ax = int(rng.integers(ndim))
    picks = rng.integers(-shape[ax], shape[ax], size=int(rng.integers(0, 2 * shape[ax] + 1)))
    got = a.gather(picks, axis=ax)
    want = np.take(ref, picks, axis=ax)
    np.testing.assert_array_equal(np.from_dlpack(got.assemble(root=None)), want)
    assert got.traffic.sent[rank] == 0
    blank = {k: np.zeros_like(v) for k, v in mine.items()}
    target = dlpart.mpi.from_local(blank, comm, shape=shape)
    if rng.integers(2):  # read in either byte order, as numpy reads them
        target.scatter(want.astype(want.dtype.newbyteorder()),
                       picks.astype(picks.dtype.newbyteorder()), axis=ax)
    else:
        target.scatter(want, picks, axis=ax)
    expect = np.zeros_like(ref)
    where = [slice(None)] * ndim
    where[ax] = picks
    expect[tuple(where)] = want
    np.testing.assert_array_equal(np.from_dlpack(target.assemble(root=None)), expect)
    # One index drops the axis, as numpy's take and assignment do.
    one = int(rng.integers(-shape[ax], shape[ax])) if shape[ax] else None
    if one is not None:
        got = a.gather(one, axis=ax)
        want = np.take(ref, one, axis=ax)
        assert got.shape == want.shape, (got.shape, want.shape)
        np.testing.assert_array_equal(np.from_dlpack(got.assemble(root=None)), want)
        ones = np.ones_like(np.asarray(want))  # a 0-d array, not a scalar, for a 1-d array
        target.scatter(ones, np.array(one), axis=ax)
        where[ax] = one
        expect[tuple(where)] = ones
        np.testing.assert_array_equal(np.from_dlpack(target.assemble(root=None)), expect)
    # Scalars (numpy's and Python's) broadcast to every element written, as numpy assigns them.
    where[ax] = picks
    for value in (ref.dtype.type(7), 5):
        target.scatter(value, picks, axis=ax)
        expect[tuple(where)] = value
        np.testing.assert_array_equal(np.from_dlpack(target.assemble(root=None)), expect)


def heat_form():
    """heat's dict form, built by hand: int ranks as locations, locals, data None elsewhere."""
    rows = 4 * size + 1
    ref = np.arange(rows * 3, dtype=np.float32).reshape(rows, 3)
    counts = [rows // size + (1 if r < rows % size else 0) for r in range(size)]
    b = np.concatenate([[0], np.cumsum(counts)]).astype(int)
    d = {"shape": ref.shape, "partition_tiling": (size, 1), "locals": [(rank, 0)],
         "partitions": {(r, 0): {"start": (int(b[r]), 0), "shape": (int(b[r + 1] - b[r]), 3),
                                 "data": ref[b[r]:b[r + 1]].copy() if r == rank else None,
                                 "location": [r]} for r in range(size)},
         "get": lambda x: x}
    a = dlpart.mpi.from_partitioned(d, comm)
    cols = a.repartition((1, 3))
    np.testing.assert_array_equal(np.from_dlpack(cols.assemble(root=None)), ref)
    # Each column block starts in row 0, which rank 0 holds: it stays there.
    assert cols.__partitioned__["locals"] == ([(0, 0), (0, 1), (0, 2)] if rank == 0 else [])
    dealt = a.repartition((1, size), devices=["kDLCPU"] * size, process_grid=(1, size))
    assert dealt.__partitioned__["locals"] == [(0, rank)]
    np.testing.assert_array_equal(np.asarray(dealt.__partitioned__["partitions"][(0, rank)]["data"]),
                                  np.array_split(ref, size, axis=1)[rank])
    heat_form_errors(d)


def heat_form_errors(d):
    """Dicts the ranks cannot share fail on every rank when read, not at the next exchange."""
    def changed(location=None, locals_=None, who=1):
        e = {k: dict(v) for k, v in d["partitions"].items()}
        if location is not None and rank == who:
            e[(size - 1, 0)]["location"] = location
        return {**d, "partitions": e, "locals": locals_ if locals_ and rank == who else d["locals"]}

    expect_collective_error("a rank beyond the communicator",
                            lambda: dlpart.mpi.from_partitioned(changed([size], who=rank), comm),
                            dlpart.ProtocolError, f"names rank {size}, but the communicator has {size}")
    expect_collective_error("ranks that disagree on an owner",
                            lambda: dlpart.mpi.from_partitioned(changed([0]), comm),
                            dlpart.ProtocolError, "ranks 0 and 1 asked for different global grids")
    expect_collective_error("locals that hold no data",  # rank 1 lists rank 0's partition
                            lambda: dlpart.mpi.from_partitioned(changed(locals_=[(0, 0)]), comm),
                            dlpart.ProtocolError, 'rank 1: __partitioned__["locals"] at position (0, 0)')
    part = np.zeros((2, 3), np.float32)
    expect_collective_error("a stated shape the stacked partitions do not make",
                            lambda: dlpart.mpi.from_local(part, comm, axis=0, shape=(2 * size + 1, 3)),
                            dlpart.ProtocolError,
                            f"make shape ({2 * size}, 3), not the stated shape ({2 * size + 1}, 3)")


def expect_collective_error(what, make, cls, text):
    """Every rank calls `make`; every rank must raise the same `cls` naming `text`, quickly."""
    t0 = time.monotonic()
    try:
        make()
    except Exception as e:  # noqa: BLE001
        got = (type(e).__name__, str(e))
    else:
        got = ("no error", "")
    took = time.monotonic() - t0
    everyone = comm.allgather(got)
    assert all(g == everyone[0] for g in everyone), f"{what}: ranks raised {everyone}"
    assert got[0] == cls.__name__ and text in got[1], f"{what}: {got}"
    assert took < 10, f"{what}: took {took:.1f} s"


def errors():
    row = np.zeros((1, 4), np.float64 if rank == 3 else np.float32)
    expect_collective_error("dtypes", lambda: dlpart.mpi.from_local(row, comm, axis=0),
                            dlpart.ProtocolError, "rank 3 gives dtype float64, rank 0 float32")
    bad = "not an array" if rank == 1 else np.zeros((1, 4), np.float32)
    try:
        dlpart.from_dlpack("not an array")
    except Exception as e:  # noqa: BLE001 - the class a bad part raises on its own rank
        cls = type(e)
    expect_collective_error("a failed rank", lambda: dlpart.mpi.from_local(bad, comm, axis=0),
                            cls, "rank 1: ")
    claim = {(min(rank, 2), 0): np.zeros((1, 4), np.float32)}
    expect_collective_error("overlap", lambda: dlpart.mpi.from_local(claim, comm),
                            dlpart.ProtocolError, "cover the same box")
    # An axis the arrays lack is an argument error, the same on every rank (rank 2 holds none).
    rows = np.zeros((2, 4), np.float32) if rank != 2 else []
    expect_collective_error("an axis beyond the arrays' axes",
                            lambda: dlpart.mpi.from_local(rows, comm, axis=2), ValueError,
                            "from_local: axis out of range for 2-d partitions (0 <= axis < 2): axis=2")
    a = dlpart.mpi.from_local(np.zeros((2, 4), np.float32), comm, axis=0)
    tiling = (1, 2) if rank == 2 else (2, 1)
    expect_collective_error("layouts", lambda: a.repartition(tiling), dlpart.ProtocolError,
                            "asked for different")
    expect_collective_error("a bad layout on one rank",
                            lambda: a.repartition((2, 1) if rank else (-1, 1)), ValueError, "rank 0: ")
    expect_collective_error("an index out of range", lambda: a.gather([0, 2 * size]), IndexError,
                            f"index {2 * size} is out of bounds")
    expect_collective_error("different indices", lambda: a.gather([rank % 2]), dlpart.ProtocolError,
                            "asked for different gathers")
    expect_collective_error("one index and a list of one", lambda: a.gather(0 if rank else [0]),
                            dlpart.ProtocolError, "asked for different gathers")
    expect_collective_error("different calls", lambda: a.repartition((2, 1)) if rank == 0 else
                            a.gather([0]), dlpart.ProtocolError,
                            "rank 0 called repartition, rank 1 gather: every rank must make")
    ro = np.zeros((2, 4), np.float32)
    ro.flags.writeable = rank != 3
    out = dlpart.mpi.from_local(ro, comm, axis=0)
    a2 = dlpart.mpi.from_local(np.ones((2, 4), np.float32), comm, axis=0)
    expect_collective_error("a read-only target", lambda: a2.repartition_into(out), BufferError, "rank 3: ")
    assert not ro.any(), "nothing is written when one rank fails"
    if size > 1:  # a target over COMM_SELF: rank r's partition is rank 0's there
        mine = np.zeros((2 * size, 4), np.float32)
        alone = dlpart.mpi.from_local(mine, MPI.COMM_SELF, axis=0)
        expect_collective_error("a target over another communicator",
                                lambda: a2.repartition_into(alone), ValueError,
                                "out is over another communicator (size 1, rank 0 here")
        assert not mine.any(), "nothing is written into a target over other ranks"
    dup = comm.Dup()  # the same ranks in the same order: a target there is written
    twin = np.zeros((2, 4), np.float32)
    a2.repartition_into(dlpart.mpi.from_local(twin, dup, axis=0))
    np.testing.assert_array_equal(twin, np.ones((2, 4), np.float32))
    dup.Free()
    one_rank_arguments(a, a2, out, ro)


class MyValueError(ValueError):
    """A program's own error class, which the other ranks cannot make."""


class NoStr(ValueError):
    """A program's error that cannot say what it is."""

    def __str__(self):
        raise RuntimeError("no str")


class BadIndex:
    """A layout entry whose conversion raises `error`."""

    def __init__(self, error):
        self.error = error

    def __index__(self):
        raise self.error


def one_rank_arguments(a, a2, out, ro):
    """Arguments that fail their conversion on one rank only (before the Rust call) still fail
    every rank, with that rank's error class (or its nearest built-in one); the other ranks'
    targets and indices are unaffected."""
    odd = rank == 1
    part = np.zeros((2, 4), np.float32)
    cases = [
        ("a negative root", lambda: a.assemble(root=-1 if odd else 0), ValueError,
         "rank 1: assemble onto one of the"),
        ("a root that is no int", lambda: a.assemble(root="0" if odd else 0), TypeError,
         "rank 1: root must be an integer, not str"),
        ("a transfer flag with no truth value",
         lambda: a.repartition((2, 1), transfer=np.ones(2) if odd else False), ValueError, "rank 1: "),
        ("a shape that is no int", lambda: dlpart.mpi.from_local(
            {(2 * rank, 0): part}, comm, shape=("a", 4) if odd else (2 * size, 4)),
         TypeError, "rank 1: "),
        ("a negative shape", lambda: dlpart.mpi.from_local(
            {(2 * rank, 0): part}, comm, shape=(-1, 4) if odd else (2 * size, 4)),
         ValueError, "rank 1: shape (-1, 4) has the negative entry -1"),
        ("a negative start", lambda: dlpart.mpi.from_local(
            {((-2, 0) if odd else (2 * rank, 0)): part}, comm),
         ValueError, "rank 1: start (-2, 0) has the negative entry -2"),
        ("a numpy target", lambda: a2.repartition_into(ro if odd else out), TypeError,
         "rank 1: repartition_into writes into a dlpart.PartitionedArray"),
        ("a program's ValueError subclass",
         lambda: a.repartition((BadIndex(MyValueError("mine")) if odd else 2, 1)), ValueError,
         "rank 1: MyValueError: mine"),
        ("a built-in class dlpart does not raise itself",
         lambda: a.repartition((BadIndex(ZeroDivisionError("zero")) if odd else 2, 1)),
         ZeroDivisionError, "rank 1: zero"),
        # Rank 0 alone puts rank 1's partition on a GPU (where no GPU is needed to agree).
        ("devices that differ", lambda: a.repartition(
            (size, 1), devices=["cpu", "cuda:0" if rank == 0 else "cpu"] + ["cpu"] * (size - 2),
            process_grid=(size, 1)), dlpart.ProtocolError, "asked for different repartitions"),
        ("an index beyond 64 bits", lambda: a.gather([0, 2**64 - 1]), IndexError,
         "index 18446744073709551615 is out of bounds"),
        # numpy's BufferError for an array DLPack cannot carry is the TypeError of indices that
        # are no integers, naming the dtype.
        ("string indices", lambda: a.gather(np.array(["0"]) if odd else [0]), TypeError,
         "rank 1: indices must be integers, found dtype <U1"),
        ("object indices to scatter",
         lambda: a.scatter(1.0, np.array([0], dtype=object) if odd else [0]), TypeError,
         "rank 1: indices must be integers, found dtype object"),
        # Values pyo3 could not convert failed on that rank alone, before the collective call.
        ("a tiling entry beyond 64 bits", lambda: a.repartition((2**64 if odd else 2, 1)),
         ValueError, "rank 1: tiling (18446744073709551616, 1) has the entry"),
        ("a start beyond 64 bits", lambda: dlpart.mpi.from_local(
            {((2**64, 0) if odd else (2 * rank, 0)): part}, comm), ValueError, "rank 1: start"),
        ("an axis beyond 64 bits", lambda: dlpart.mpi.from_local(
            part, comm, axis=2**64 if odd else 0), ValueError,
         "rank 1: axis 18446744073709551616 does not fit in 64 bits"),
        ("a root beyond 64 bits", lambda: a.assemble(root=-(2**70) if odd else 0), ValueError,
         "rank 1: root -1180591620717411303424 does not fit in 64 bits"),
        ("an axis beyond 64 bits to gather", lambda: a.gather([0], axis=2**70 if odd else 0),
         ValueError, "rank 1: axis 1180591620717411303424 is out of range"),
        ("a program's error whose str() raises",
         lambda: a.repartition((BadIndex(NoStr()) if odd else 2, 1)), ValueError,
         "rank 1: NoStr: (a NoStr whose str() raised)"),
        ("a built-in error that takes more than a message",
         lambda: a.repartition((BadIndex(UnicodeDecodeError("utf-8", b"\xff", 0, 1, "bad"))
                                if odd else 2, 1)), RuntimeError, "rank 1: "),
        ("split= that is no axis on one rank", lambda: to_heat(a, split=-5 if odd else 1),
         ValueError, "rank 1: axis -5 is out of range"),
        # The private calls read their ints naming the argument (not pyo3's bare
        # OverflowError), and one rank's bad argument is every rank's error, not a hang.
        ("a negative start to _spmd_from_local", lambda: _core._spmd_from_local(
            _comm, [((-1 if odd else 2 * rank, 0), _core.from_dlpack(part))], None, None),
         ValueError, "rank 1: parts[0].start[0]: -1 is out of range (expected an int from 0"),
        ("a shape beyond 64 bits to _spmd_from_local", lambda: _core._spmd_from_local(
            _comm, [((2 * rank, 0), _core.from_dlpack(part))], None,
            [2 * size, 2**64 if odd else 4]),
         ValueError, "rank 1: shape[1]: 18446744073709551616 is out of range"),
        ("a negative tiling to _spmd_repartition", lambda: _core._spmd_repartition(
            _comm, a._core, tiling=[-2 if odd else 2, 1]), ValueError,
         "rank 1: tiling[0]: -2 is out of range (expected an int from 0"),
        ("a negative process grid to _spmd_repartition", lambda: _core._spmd_repartition(
            _comm, a._core, tiling=[size, 1], devices=["cpu"] * size,
            process_grid=[-1 if odd else size, 1]), ValueError,
         "rank 1: process_grid[0]: -1 is out of range"),
    ]
    for what, make, cls, text in cases:
        expect_collective_error(what, make, cls, text)
    assert not ro.any(), "nothing is written when one rank fails"
    # Ints that every rank gets wrong fail before any communication, on every rank alike.
    idx = _core._indices_tensor([0])
    one = _core.from_dlpack(np.ones((), np.float32))
    for make, text in [
            (lambda: _core._spmd_gather(_comm, a._core, idx, -1), "axis: -1 is out of range"),
            (lambda: _core._spmd_scatter(_comm, a._core, one, idx, 2**64),
             "axis: 18446744073709551616 is out of range"),
            (lambda: _core._spmd_assemble(_comm, a._core, -1), "root: -1 is out of range")]:
        expect_collective_error(text, make, ValueError, text)
    # The failed rank keeps its own error as the cause of the agreed one.
    for make, own in ((lambda: a.repartition((BadIndex(MyValueError("m")) if odd else 2, 1)),
                       MyValueError),
                      (lambda: dlpart.mpi.from_local({(2 * rank, 0): part}, comm,
                                                     shape=(-1, 4) if odd else (2 * size, 4)),
                       ValueError)):
        try:
            make()
        except ValueError as e:
            assert isinstance(e.__cause__, own) == odd, (e, e.__cause__)
        else:
            raise AssertionError("no error")
    interrupts(a, part)
    # An empty index list picks nothing, on every rank (numpy would make [] float64).
    none = a.gather([])
    assert none.shape == (0, 4), none.shape


def interrupts(a, part):
    """A KeyboardInterrupt or SystemExit on one rank while the others are in the collective
    call: that rank raises it again itself, once the others know of it; they raise RuntimeError
    naming it, quickly, rather than wait for that rank forever."""
    odd = rank == 1
    calls = [
        ("repartition", lambda e: a.repartition((BadIndex(e) if odd else 2, 1))),
        ("from_local", lambda e: dlpart.mpi.from_local(
            {(2 * rank, 0): part}, comm, shape=(BadIndex(e) if odd else 2 * size, 4))),
    ]
    for what, call in calls:
        for error, text in ((KeyboardInterrupt(), "rank 1: KeyboardInterrupt"),
                            (SystemExit(3), "rank 1: SystemExit: 3")):
            t0 = time.monotonic()
            try:
                call(error)
            except BaseException as e:  # noqa: BLE001 - the interrupt itself, on rank 1
                got = e
            else:
                got = None
            took = time.monotonic() - t0
            if odd:
                assert got is error, f"{what}: rank 1 raised {got!r}, not its own {error!r}"
            else:
                assert type(got) is RuntimeError and text in str(got), f"{what}: {got!r}"
            assert took < 10, f"{what}: took {took:.1f} s"
    comm.Barrier()


def communicators_dlpart_cannot_use():
    """An intercommunicator's collectives gather the other group's items: refused on every rank
    (it gave each rank a different array); something that is no communicator is a TypeError."""
    local = comm.Split(rank % 2, rank)
    inter = local.Create_intercomm(0, comm, 1 - rank % 2, 12)
    expect_collective_error("an intercommunicator", lambda: dlpart.mpi.from_local(
        np.zeros((2, 4)), inter, axis=0), TypeError, "need an intracommunicator")
    inter.Free()
    local.Free()
    expect_collective_error("no communicator", lambda: dlpart.mpi.from_local(
        np.zeros((2, 4)), "world", axis=0), TypeError, "mpi4py communicator, not str")


def a_host_one_rank_cannot_resolve():
    """dlpart's first call on a communicator learns this node's address before its first
    collective call: when it fails on one rank (an OSError, a KeyboardInterrupt), every rank
    raises within seconds instead of waiting for that rank in the next collective call; the
    communicator is not kept, and the next call on it, the address found, goes through."""
    fresh = comm.Dup()
    here = dlpart.mpi.this_host
    part = np.full((1, 3), float(rank))
    whole = np.repeat(np.arange(float(size)), 3).reshape(size, 3)
    for error in (OSError("no address for this node"), KeyboardInterrupt()):
        def lost():
            raise error

        if rank == 2:
            dlpart.mpi.this_host = lost
        t0 = time.monotonic()
        try:
            dlpart.mpi.from_local(part, fresh, axis=0)
        except BaseException as e:  # noqa: BLE001 - the interrupt itself, on rank 2
            got = e
        else:
            got = None
        finally:
            dlpart.mpi.this_host = here
        took = time.monotonic() - t0
        if isinstance(error, OSError):
            assert type(got) is OSError and str(got) == "rank 2: no address for this node", got
            if rank == 2:
                assert got.__cause__ is error, got.__cause__
        elif rank == 2:
            assert got is error, f"rank 2 raised {got!r}, not its own {error!r}"
        else:
            assert type(got) is RuntimeError and str(got) == "rank 2: KeyboardInterrupt", got
        assert took < 10, f"{error!r}: took {took:.1f} s"
    a = dlpart.mpi.from_local(part, fresh, axis=0)
    np.testing.assert_array_equal(np.from_dlpack(a.assemble(root=None)), whole)
    fresh.Free()


def moves():
    """SpmdArray.to: each rank's partitions onto a device of its own (the ranks name different
    ones; kDLCPU:1 is an emulated host device, as JAX's), the grid, locals and values kept,
    every rank's dict naming each partition's new device; a device one rank lacks, or ranks
    moving different arrays, fail every rank. SpmdArray.tensors names a partition held
    elsewhere rather than blaming a dict. SpmdArray.comm is dlpart's communicator, as help()
    says, and a dlpart.mpi call takes it."""
    dlpart._core._note_host_devices(2)
    ref = np.arange(2 * size * 3, dtype=np.float32).reshape(2 * size, 3)
    mine = ref[2 * rank:2 * rank + 2].copy()
    a = dlpart.mpi.from_local(mine, comm, axis=0)
    b = a.to(f"kDLCPU:{rank % 2}")
    assert isinstance(b, dlpart.mpi.SpmdArray) and b.comm is a.comm
    # SpmdArray.comm is what its docstring (help()) says: dlpart's communicator over comm, no
    # mpi4py one, with this rank and the ranks' count; a dlpart.mpi call takes it as comm.
    doc = inspect.getdoc(dlpart.mpi.SpmdArray.comm)
    assert not isinstance(a.comm, MPI.Comm) and type(a.comm).__name__ in doc, (type(a.comm), doc)
    assert (a.comm.rank, a.comm.size) == (rank, size) and "rank" in doc and "size" in doc, doc
    assert isinstance(a.comm.comm, MPI.Comm) and a.comm.comm.Get_size() == size
    again = dlpart.mpi.from_local(mine, a.comm, axis=0)
    assert again.comm is a.comm
    np.testing.assert_array_equal(np.from_dlpack(again.assemble(root=None)), ref)
    assert b.splits == a.splits and b.locals == a.locals == [(rank, 0)]
    held = b.partitions[(rank, 0)].tensor
    assert held.device == f"kDLCPU:{rank % 2}"
    np.testing.assert_array_equal(np.asarray(held), ref[2 * rank:2 * rank + 2])
    # kDLCPU data asked onto kDLCPU is shared; onto kDLCPU:1 it is a copy.
    assert (held.data_ptr == a.partitions[(rank, 0)].tensor.data_ptr) == (rank % 2 == 0)
    d = b.__partitioned__
    for (r, _), entry in d["partitions"].items():
        assert dlpart.Device(entry["location"][0][2]) == f"kDLCPU:{r % 2}", (r, entry["location"])
        assert (entry["data"] is None) == (r != rank)
    same_everywhere(sorted((k, v["location"]) for k, v in d["partitions"].items()), "to's dict")
    np.testing.assert_array_equal(
        np.from_dlpack(b.assemble(root=None, device="cpu", transfer=True)), ref)
    back = b.to("cpu")
    assert back.partitions[(rank, 0)].tensor.device == "kDLCPU"
    np.testing.assert_array_equal(np.from_dlpack(back.assemble(root=None)), ref)
    expect_collective_error("a device one rank lacks", lambda: a.to("kDLCPU:7" if rank == 1 else "cpu"),
                            dlpart.DeviceError, 'rank 1: invalid device "kDLCPU:7"')
    expect_collective_error("a device name one rank cannot read",
                            lambda: a.to("nowhere:0" if rank == 1 else "cpu"), dlpart.DeviceError,
                            "rank 1: invalid device")
    other = dlpart.mpi.from_local(mine, comm, axis=1)
    expect_collective_error("ranks moving different arrays",
                            lambda: (other if rank == 1 else a).to("cpu"), dlpart.ProtocolError,
                            "ranks 0 and 1 asked for different arrays")
    if size > 1:
        try:
            a.tensors()
        except ValueError as e:
            assert f"is rank {(rank + 1) % size if rank == 0 else 0}'s" in str(e), e
            assert f"rank {rank} holds only its locals [({rank}, 0)]" in str(e), e
        else:
            raise AssertionError("tensors() of a spread array")


def finish():
    heat_form()
    errors()
    moves()
    communicators_dlpart_cannot_use()
    a_host_one_rank_cannot_resolve()
    comm.Barrier()


if __name__ == "__main__":
    run(random_case, finish)
