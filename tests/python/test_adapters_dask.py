"""Dask arrays on a real two-process LocalCluster, to dlpart through futures and back."""

import os
import pickle

import numpy as np
import pytest

da = pytest.importorskip("dask.array", reason="dask[array] is not installed")
distributed = pytest.importorskip("distributed", reason="distributed is not installed")
import dlpart  # noqa: E402
from dlpart.adapters import dask as dd  # noqa: E402

REF = np.random.default_rng(7).standard_normal((8, 10))
CHUNKS = ((3, 3, 2), (4, 6))
OFFSETS = ((0, 3, 6, 8), (0, 4, 10))


@pytest.fixture(scope="module")
def client():
    cluster = distributed.LocalCluster(n_workers=2, processes=True, threads_per_worker=1,
                                       dashboard_address=None)
    c = distributed.Client(cluster)
    try:
        yield c
    finally:
        c.close()
        cluster.close()


@pytest.fixture
def x(client):
    # computed on the workers, so the chunks only exist there
    return da.from_array(REF, chunks=CHUNKS) * 2 + 1


def block(pos):
    return REF[OFFSETS[0][pos[0]]:OFFSETS[0][pos[0] + 1], OFFSETS[1][pos[1]]:OFFSETS[1][pos[1] + 1]]


def holders(client):
    """Which worker process holds which keys, as the workers themselves report it."""
    report = client.run(lambda dask_worker: (os.getpid(), list(dask_worker.data.keys())))
    return {key: pid for pid, keys in report.values() for key in keys}


class Counting:
    def __init__(self):
        self.calls = []

    def __call__(self, handles):
        self.calls.append(list(handles))
        return dd.gather(handles)


def test_dict_describes_the_persisted_chunks(client, x):
    d = dd.partitioned_dict(x, client)
    assert d["shape"] == (8, 10) and d["partition_tiling"] == (3, 2)
    assert d["get"] is dd.gather
    where = holders(client)
    for pos, entry in d["partitions"].items():
        assert entry["start"] == (OFFSETS[0][pos[0]], OFFSETS[1][pos[1]])
        assert entry["shape"] == block(pos).shape
        assert isinstance(entry["data"], distributed.Future)
        ((host, pid, device),) = entry["location"]
        assert (host, device) == ("127.0.0.1", "kDLCPU")
        assert pid == where[entry["data"].key] != os.getpid()
    assert {pid for e in d["partitions"].values() for _, pid, _ in e["location"]} <= set(
        where.values())


def test_consumer_fetches_only_what_it_needs(client, x):
    d = dd.partitioned_dict(x, client)
    counting = Counting()
    pa = dlpart.from_partitioned(dict(d, get=counting))
    assert pa.dtype == "float64" and counting.calls == []
    assert all(p.tensor is None and p.handle is not None for p in pa.partitions.values())
    loc = pa.partitions[(1, 0)].locations[0]
    assert loc.pid == holders(client)[d["partitions"][(1, 0)]["data"].key]
    pa.fetch([(1, 0)])
    assert counting.calls == [[d["partitions"][(1, 0)]["data"]]]
    np.testing.assert_array_equal(np.from_dlpack(pa.partitions[(1, 0)].tensor),
                                  block((1, 0)) * 2 + 1)
    assert sum(p.tensor is None for p in pa.partitions.values()) == 5
    np.testing.assert_array_equal(np.from_dlpack(pa.assemble()), x.compute())
    assert len(counting.calls) == 2 and len(counting.calls[1]) == 5


def test_wrapper_exposes_partitioned(client, x):
    w = dd.DaskPartitioned(x, client)
    assert w.__partitioned__ is w.__partitioned__  # persisted once
    np.testing.assert_array_equal(np.from_dlpack(dlpart.from_partitioned(w).assemble()),
                                  REF * 2 + 1)


def test_dict_pickles_and_get_binds_unbound_futures(client, x):
    # The producer keeps its dict (and so its futures) alive while the pickled copy is used:
    # unpickled futures do not hold the keys on the scheduler, which may release them otherwise.
    original = dd.partitioned_dict(x, client)
    d = pickle.loads(pickle.dumps(original))
    assert d["get"] is dd.gather
    assert all(e["data"].client is None for e in d["partitions"].values())
    np.testing.assert_array_equal(np.from_dlpack(dlpart.from_partitioned(d).assemble()),
                                  REF * 2 + 1)


def test_devices_are_asked_of_the_workers(client, x):
    futures = [e["data"] for e in dd.partitioned_dict(x, client)["partitions"].values()]
    assert dd._chunk_devices(client, futures) == ["kDLCPU"] * 6


def test_futures_go_back_to_dask_without_gathering(client, x):
    d = dd.partitioned_dict(x, client)
    counting = Counting()
    y = dd.from_partitioned(dict(d, get=counting))
    assert counting.calls == []
    assert y.chunks == CHUNKS and y.dtype == np.float64
    produced = {e["data"].key for e in d["partitions"].values()}
    assert {f.key for f in distributed.futures_of(y)} == produced
    np.testing.assert_array_equal(y.compute(), REF * 2 + 1)


def test_local_partitions_become_chunks_without_a_copy():
    pa = dlpart.partition(REF, (2, 3))
    y = dd.from_partitioned(pa)
    assert y.chunks == ((4, 4), (4, 3, 3)) and y.dtype == REF.dtype
    chunks = [v for v in dict(y.__dask_graph__()).values() if isinstance(v, np.ndarray)]
    assert len(chunks) == 6 and all(np.shares_memory(c, REF) for c in chunks)
    np.testing.assert_array_equal(y.compute(scheduler="sync"), REF)


def test_local_partitions_are_scattered_with_a_client(client):
    pa = dlpart.partition(REF.astype(np.float32), (2, 2))
    y = dd.from_partitioned(pa, client)
    futures = distributed.futures_of(y)
    assert len(futures) == 4
    assert set(client.who_has(futures)) == {f.key for f in futures}
    np.testing.assert_array_equal(y.compute(), REF.astype(np.float32))
    # and back: the scattered chunks are the partitions of a new dict
    back = dlpart.from_partitioned(dd.partitioned_dict(y, client))
    np.testing.assert_array_equal(np.from_dlpack(back.assemble()), REF.astype(np.float32))


def test_dask_and_ray_refuse_partitions_that_are_not_host_arrays():
    from types import SimpleNamespace

    from dlpart.adapters._host import host_array

    with pytest.raises(ValueError, match=r"partition \(1, 0\) has no data in this process"):
        host_array(None, (1, 0), "why")
    gpu = SimpleNamespace(device=dlpart.Device("kDLCUDA:1"))  # a tensor's device, no data
    with pytest.raises(dlpart.DeviceError, match=r"\(0, 2\) is on kDLCUDA:1: the reason; assemble"):
        host_array(gpu, (0, 2), "the reason")
    a = np.arange(6.0).reshape(2, 3)
    view = host_array(dlpart.from_dlpack(a), (0, 0), "why")
    assert np.shares_memory(view, a)
