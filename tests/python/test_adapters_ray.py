"""Ray ObjectRefs as partition handles, on the session's local Ray instance."""

import os
import pickle

import numpy as np
import pytest

os.environ.setdefault("RAY_AUTH_MODE", "disabled")
ray = pytest.importorskip("ray", reason="ray is not installed")
import dlpart  # noqa: E402
from dlpart.adapters import ray as dr  # noqa: E402

REF = np.random.default_rng(3).standard_normal((6, 8))


@pytest.fixture(scope="module")
def session(ray_session):
    """The addresses of the live nodes of the session's Ray instance."""
    return {n["NodeManagerAddress"] for n in ray.nodes() if n["Alive"]}


class Counting:
    def __init__(self):
        self.calls = []

    def __call__(self, handles):
        self.calls.append(list(handles))
        return dr.get(handles)


def test_blocks_through_the_object_store(session):
    pa = dlpart.partition(REF, (2, 2))
    refs = dr.to_refs(pa)
    assert sorted(refs) == [(0, 0), (0, 1), (1, 0), (1, 1)]
    for pos, ref in refs.items():
        np.testing.assert_array_equal(ray.get(ref), REF[pos[0] * 3:pos[0] * 3 + 3,
                                                        pos[1] * 4:pos[1] * 4 + 4])
    d = dr.partitioned_dict_from_refs(refs, REF.shape, splits=pa.splits, dtype="float64")
    assert d["get"] is dr.get and d["partition_tiling"] == (2, 2)
    for pos, entry in d["partitions"].items():
        assert entry["data"] is refs[pos]
        # created by this process with ray.put: this process owns them, on this node
        assert entry["location"] == [(ip, os.getpid(), "kDLCPU") for ip in session]
    counting = Counting()
    got = dlpart.from_partitioned(dict(d, get=counting))
    assert got.dtype == "float64" and counting.calls == []
    got.fetch([(1, 1)])
    assert counting.calls == [[refs[(1, 1)]]]
    assert sum(p.tensor is None for p in got.partitions.values()) == 3
    np.testing.assert_array_equal(np.from_dlpack(got.assemble()), REF)
    assert len(counting.calls) == 2 and len(counting.calls[1]) == 3


def test_grid_from_nesting_flat_lists_and_uneven_splits(session):
    blocks = [[REF[:3, :5], REF[:3, 5:]], [REF[3:, :5], REF[3:, 5:]]]
    nested = [[ray.put(b) for b in row] for row in blocks]
    with pytest.raises(ValueError, match="do not fill the grid"):
        dr.partitioned_dict_from_refs(nested, REF.shape, splits=[[0, 3, 6], [0, 5, 7, 8]])
    d = dr.partitioned_dict_from_refs(nested, REF.shape, splits=[[0, 3, 6], [0, 5, 8]])
    np.testing.assert_array_equal(np.from_dlpack(dlpart.from_partitioned(d).assemble()), REF)
    flat = [ray.put(REF[i * 2:i * 2 + 2]) for i in range(3)]
    d = dr.partitioned_dict_from_refs(flat, REF.shape, tiling=(3, 1))
    assert [e["shape"] for e in d["partitions"].values()] == [(2, 8)] * 3
    np.testing.assert_array_equal(np.from_dlpack(dlpart.from_partitioned(d).assemble()), REF)
    with pytest.raises(ValueError, match=r"3 refs for a grid of tiling \(2, 2\)"):
        dr.partitioned_dict_from_refs(flat, REF.shape, tiling=(2, 2))
    with pytest.raises(ValueError, match=r"a ref at position \(0,\) of a 2-d array of shape "
                                         r"\(6, 8\): .*a flat list with tiling="):
        dr.partitioned_dict_from_refs(flat, REF.shape)


def test_pid_is_the_owner_when_it_is_this_process(session):
    @ray.remote
    def produce():
        return np.full((3, 8), 2.0)

    @ray.remote
    def produce_and_own():
        return ray.put(np.full((3, 8), 3.0))

    returned = produce.remote()  # the submitter owns a task's return value
    owned_elsewhere = ray.get(produce_and_own.remote())  # owned by the worker that put it
    d = dr.partitioned_dict_from_refs([returned, owned_elsewhere], (6, 8), tiling=(2, 1))
    assert d["partitions"][(0, 0)]["location"] == [(ip, os.getpid(), "kDLCPU") for ip in session]
    assert d["partitions"][(1, 0)]["location"] == [(ip, -1, "kDLCPU") for ip in session]
    out = np.from_dlpack(dlpart.from_partitioned(d).assemble())
    np.testing.assert_array_equal(out, np.concatenate([np.full((3, 8), 2.0), np.full((3, 8), 3.0)]))


def test_dict_pickles_and_refs_pass_through(session):
    produced = dr.partitioned_dict(dlpart.partition(REF, (3, 1)))
    # Ray frees an object when its owner drops the last ref it tracks; refs pickled out of band
    # are not tracked, so the producer keeps its dict while the copy is used.
    d = pickle.loads(pickle.dumps(produced))
    counting = Counting()
    pa = dlpart.from_partitioned(dict(d, get=counting))
    again = dr.to_refs(pa)  # unfetched refs are handed on, not fetched and put again
    assert counting.calls == []
    assert [again[pos] for pos in sorted(again)] == [d["partitions"][pos]["data"]
                                                     for pos in sorted(d["partitions"])]
    np.testing.assert_array_equal(np.from_dlpack(pa.assemble()), REF)
