"""The __partitioned__ protocol: the spec's examples, dicts as real producers write them,
validation, partition/assemble."""

import collections
import gc
import os
import pickle
from collections.abc import Mapping

import numpy as np
import pytest

import dlpart
from dlpart import Location, Partition, PartitionedArray
from dlpart._core import _testing


def blocks(shape, tiling, dtype=np.float32):
    """A numpy reference array and its array_split blocks keyed by position."""
    ref = np.arange(int(np.prod(shape)), dtype=dtype).reshape(shape)
    return ref


def example1():
    ref = np.arange(64, dtype=np.float64)
    ips = ["1.1.1.1", "1.1.1.2", "1.1.1.3", "1.1.1.4"]
    pids = [7755737, 7736336, 64763578, 117264534]
    return ref, {
        "shape": (64,),
        "partition_tiling": (4,),
        "partitions": {
            (i,): {"start": (16 * i,), "shape": (16,), "data": ref[16 * i: 16 * (i + 1)],
                   "location": [(ips[i], pids[i])]}
            for i in range(4)
        },
        "get": lambda x: x,
    }


def example2():
    ref = np.arange(64, dtype=np.int32).reshape(8, 8)
    locs = {(1, 1): ("1.1.1.1", 77463764), (1, 0): ("1.1.1.2", 9174756892),
            (0, 1): ("1.1.1.1", 29384572), (0, 0): ("1.1.1.2", 847236952)}
    return ref, {
        "shape": (8, 8),
        "partition_tiling": (2, 2),
        "partitions": {
            pos: {"start": (4 * pos[0], 4 * pos[1]), "shape": (4, 4),
                  "data": ref[4 * pos[0]: 4 * pos[0] + 4, 4 * pos[1]: 4 * pos[1] + 4],
                  "location": [loc]}
            for pos, loc in locs.items()
        },
        "get": lambda x: x,
    }


def example3():
    ref = np.arange(64, dtype=np.float32).reshape(8, 8)
    hosts = ["1.1.1.1", "1.1.1.2"]
    pids = [29384572, 575812655]
    parts = {}
    for i in range(4):
        rank = i % 2
        parts[(i, 0)] = {
            "start": (2 * i, 0), "shape": (2, 8),
            "data": ref[2 * i: 2 * i + 2] if rank == 0 else None,
            "location": [(hosts[rank], pids[rank], f"kDLOneAPI:{i // 2}")],
        }
    return ref, {"shape": (8, 8), "partition_tiling": (4, 1), "partitions": parts,
                 "get": lambda x: x, "locals": [(0, 0), (2, 0)]}


def normalised_location(loc):
    loc = tuple(loc)
    return loc if len(loc) == 3 else loc + ("kDLCPU",)


@pytest.mark.parametrize("make", [example1, example2, example3])
def test_spec_examples_round_trip_unchanged(make):
    ref, d = make()
    pa = dlpart.from_partitioned(d)
    assert pa.shape == d["shape"] and pa.tiling == d["partition_tiling"]
    out = pa.__partitioned__
    assert out["shape"] == d["shape"]
    assert out["partition_tiling"] == d["partition_tiling"]
    assert set(out["partitions"]) == set(d["partitions"])
    assert out.get("locals") == d.get("locals")
    for pos, entry in d["partitions"].items():
        got = out["partitions"][pos]
        assert got["start"] == entry["start"] and got["shape"] == entry["shape"]
        assert got["location"] == [normalised_location(x) for x in entry["location"]]
        if entry["data"] is None:
            assert got["data"] is None
        else:  # zero-copy: the very same memory
            # numpy in, numpy out (what heat and xgboost_ray can use), over the same memory
            assert isinstance(got["data"], np.ndarray)
            assert got["data"].ctypes.data == entry["data"].ctypes.data
            np.testing.assert_array_equal(np.from_dlpack(got["data"]), entry["data"])
    # and it pickles into a dict that is accepted again, with the same values
    again = dlpart.from_partitioned(pickle.loads(pickle.dumps(out)))
    assert again.__partitioned__["partitions"].keys() == out["partitions"].keys()
    if "locals" not in d:
        np.testing.assert_array_equal(np.from_dlpack(again.assemble()), ref)


def test_heat_shaped_dict_keeps_ranks():
    # heat writes MPI ranks as locations, extra 'dtype'/'device' keys, and None for remote data.
    ref = np.arange(27 * 6, dtype=np.int32).reshape(27, 3, 2)
    bounds = [0, 7, 14, 21, 27]
    rank = 1
    d = {
        "shape": (27, 3, 2),
        "partition_tiling": (4, 1, 1),
        "partitions": {
            (r, 0, 0): {"start": (bounds[r], 0, 0), "shape": (bounds[r + 1] - bounds[r], 3, 2),
                        "data": ref[bounds[r]:bounds[r + 1]] if r == rank else None,
                        "location": [r], "dtype": "torch.int32", "device": "cpu"}
            for r in range(4)
        },
        "locals": [(rank, 0, 0)],
        "get": lambda x: x,
    }
    pa = dlpart.from_partitioned(d)
    assert pa.locals == [(1, 0, 0)]
    assert pa.dtype == "int32"
    for r in range(4):
        p = pa.partitions[(r, 0, 0)]
        assert p.locations == (Location(None, None, dlpart.Device("kDLCPU"), rank=r),)
        assert (p.tensor is not None) == (r == rank)
    np.testing.assert_array_equal(np.from_dlpack(pa.partitions[(1, 0, 0)].tensor), ref[7:14])
    out = pa.__partitioned__
    # heat's own form goes back out as it came: the rank stays an int
    assert out["partitions"][(2, 0, 0)]["location"] == [2]
    with pytest.raises(dlpart.ProtocolError, match=r"\(0, 0, 0\)"):
        pa.assemble()  # another rank's partition is not here


def test_heat_gpu_device_key():
    d = {"shape": (2,), "partition_tiling": (1,),
         "partitions": {(0,): {"start": (0,), "shape": (2,), "data": None, "location": [0],
                               "device": "cuda:1"}},
         "locals": [], "get": lambda x: x}
    pa = dlpart.from_partitioned(d)
    assert pa.partitions[(0,)].locations[0].device == "kDLCUDA:1"


class Handle:
    """A stand-in for a Ray ObjectRef: an opaque token resolved only through `get`."""

    def __init__(self, key):
        self.key = key


def store_get(*blocks):
    """A producer's ``get`` over `Handle(k)` for ``blocks[k]``, and the list of how many handles
    each of its calls was given."""
    calls = []

    def get(handles):
        calls.append(len(handles))
        return [blocks[h.key] for h in handles]

    return get, calls


def test_xgboost_ray_shaped_dict_with_bare_ips_and_handles():
    ref = np.arange(40, dtype=np.float64).reshape(10, 4)
    get, calls = store_get(ref[:6], ref[6:])

    d = {"shape": (10, 4), "partition_tiling": (2, 1),
         "partitions": {(0, 0): {"start": (0, 0), "shape": (6, 4), "data": Handle(0), "location": "10.0.0.1"},
                        (1, 0): {"start": (6, 0), "shape": (4, 4), "data": Handle(1), "location": ["10.0.0.2"]}},
         "get": get}
    pa = dlpart.from_partitioned(d)
    assert calls == []  # nothing fetched until needed
    assert pa.partitions[(0, 0)].locations == (Location("10.0.0.1", None, dlpart.Device("kDLCPU")),)
    assert pa.partitions[(1, 0)].locations[0].host == "10.0.0.2"
    pa.fetch([(1, 0)])
    assert calls == [1] and pa.partitions[(0, 0)].tensor is None
    np.testing.assert_array_equal(np.from_dlpack(pa.assemble()), ref)
    assert calls == [1, 1]


def test_handles_handed_on_unfetched_resolve_through_the_producers_get():
    """A re-export keeps the producer's handles, so its dict's ``get`` must resolve them: data
    resolves to itself, the handles go to the producer's ``get``, in one call."""
    ref = np.arange(35, dtype=np.float32).reshape(7, 5)
    get, calls = store_get(ref[:4], ref[4:])

    lazy = dlpart.from_partitioned({
        "shape": (7, 5), "partition_tiling": (2, 1), "get": get,
        "partitions": {
            (0, 0): {"start": (0, 0), "shape": (4, 5), "data": Handle(0), "location": []},
            (1, 0): {"start": (4, 0), "shape": (3, 5), "data": Handle(1), "location": []}}})
    d = lazy.__partitioned__
    assert isinstance(d["partitions"][(1, 0)]["data"], Handle)
    np.testing.assert_array_equal(np.from_dlpack(dlpart.from_partitioned(d).assemble()), ref)
    assert calls == [2]
    lazy.fetch([(0, 0)])  # one fetched, one handed on: only the handle goes to the producer
    d = lazy.__partitioned__
    got = d["get"]([p["data"] for p in d["partitions"].values()])
    assert calls == [2, 1, 1]
    np.testing.assert_array_equal(np.concatenate(got), ref)
    lazy.fetch()
    assert lazy.__partitioned__["get"] is dlpart.get  # nothing left to hand on


def test_fetched_data_for_a_partition_listed_twice_is_refused_naming_it():
    """The core's ``set_fetched`` (what `PartitionedArray.fetch` puts the fetched data in
    with) refuses a partition listed twice, and keeps nothing: neither while the partition
    holds its handle nor once it holds data (another thread's fetch)."""
    ref = np.arange(8.0).reshape(4, 2)
    get, _ = store_get(ref[:2], ref[2:])
    pa = dlpart.from_partitioned({
        "shape": (4, 2), "partition_tiling": (2, 1), "get": get,
        "partitions": {(i, 0): {"start": (2 * i, 0), "shape": (2, 2), "data": Handle(i),
                                "location": []} for i in range(2)}})
    t = dlpart.from_dlpack(np.zeros((2, 2)))
    for _ in range(2):
        with pytest.raises(ValueError, match=r"partition 1 at \(1, 0\) is listed twice"):
            pa._core.set_fetched([1, 0, 1], [t, t, t])
        if pa.partitions[(0, 0)].tensor is None:
            assert [flat for flat, _ in pa._core.pending()] == [0, 1]
            pa.fetch()
    np.testing.assert_array_equal(np.from_dlpack(pa.assemble()), ref)


def test_gather_and_scatter_fetch_only_the_partitions_holding_an_index():
    """As the guide says, handles are resolved only for the partitions an operation needs: a
    gather or scatter needs the slabs holding its indices (negative ones counted from the
    end); an index out of range raises before anything is fetched."""
    ref = np.arange(7 * 6, dtype=np.float64).reshape(7, 6)
    blocks = [ref[:4, :3].copy(), ref[:4, 3:].copy(), ref[4:, :3].copy(), ref[4:, 3:].copy()]

    def lazy():
        get, calls = store_get(*blocks)
        parts = {(i, j): {"start": (4 * i, 3 * j), "shape": (4 if i == 0 else 3, 3),
                          "data": Handle(2 * i + j), "location": []}
                 for i in range(2) for j in range(2)}
        return dlpart.from_partitioned({"shape": (7, 6), "partition_tiling": (2, 2),
                                        "partitions": parts, "get": get}), calls

    pa, calls = lazy()
    got = pa.gather([5, -1], 0)
    np.testing.assert_array_equal(np.from_dlpack(got.assemble()), ref[[5, -1]])
    assert calls == [2] and pa.partitions[(0, 0)].tensor is None
    pa, calls = lazy()
    np.testing.assert_array_equal(np.from_dlpack(pa.gather([4], 1).assemble()), ref[:, [4]])
    assert calls == [2] and pa.partitions[(0, 0)].tensor is None
    pa, calls = lazy()
    got = pa.gather(np.array([], np.int64), 0)  # no dtype stated: one partition tells it
    assert got.shape == (0, 6) and got.dtype == "float64" and calls == [1]
    pa, calls = lazy()
    with pytest.raises(IndexError, match="index 7 is out of bounds"):
        pa.gather([7], 0)
    assert calls == []
    pa.scatter(-np.ones((7, 1)), [1], axis=1)
    assert calls == [2] and pa.partitions[(0, 1)].tensor is None
    want = ref.copy()
    want[:, 1] = -1
    np.testing.assert_array_equal(np.from_dlpack(pa.assemble()), want)


def test_stated_dtypes_are_read_in_every_form_producers_write_and_others_are_named():
    """heat writes a torch dtype, numpy producers a dtype or a scalar type; a dtype dlpart
    cannot read is a ProtocolError naming it, not silently dropped."""
    import torch

    def read(dt):
        return dlpart.from_partitioned({"shape": (4,), "partition_tiling": (1,), "locals": [],
                                        "partitions": {(0,): {"start": (0,), "shape": (4,),
                                                              "data": None, "location": [1],
                                                              "dtype": dt}}}).dtype

    for dt, name in [(np.float32, "float32"), (np.dtype("int16"), "int16"), ("uint8", "uint8"),
                     (torch.bfloat16, "bfloat16"), (np.bool_, "bool"), (torch.complex64, "complex64"),
                     # what numpy reads as a dtype: array-interface codes, Python's types
                     ("<f4", "float32"), ("u2", "uint16"), (float, "float64"), (bool, "bool"),
                     (complex, "complex128"), (int, np.dtype(int).name)]:
        assert read(dt) == name, dt
    with pytest.raises(dlpart.ProtocolError, match=r"\(0,\): \"dtype\": .*dtype 'no-such-type' is not"):
        read("no-such-type")
    for bad in [object, "O", ">f4", "U3"]:  # numpy reads them, but they are no DLPack dtype
        with pytest.raises(dlpart.ProtocolError, match="is not one dlpart knows"):
            read(bad)

    def entries(*dtypes, data=None):
        return {"shape": (2 * len(dtypes),), "partition_tiling": (len(dtypes),),
                "partitions": {(i,): {"start": (2 * i,), "shape": (2,), "location": [i],
                                      "data": data if i == len(dtypes) - 1 else None,
                                      "dtype": dt} for i, dt in enumerate(dtypes)}}

    # every entry's dtype counts, and a contradiction names the entry's key (as an unreadable
    # dtype is named above) and the first statement
    assert dlpart.from_partitioned(entries("float32", np.float32, torch.float32)).dtype == \
        "float32"
    for check in (dlpart.validate, dlpart.from_partitioned):
        with pytest.raises(dlpart.ProtocolError) as info:
            check(entries("float32", "float32", "int32"))
        assert str(info.value) == ('__partitioned__["partitions"] at position (2,): "dtype": dtype '
                                   'int32 differs from float32, stated at (0,) (grid invariant 6)')
        with pytest.raises(dlpart.ProtocolError) as info:
            check(entries("float32", "float32", data=np.zeros(2)))
        assert str(info.value) == ('__partitioned__["partitions"] at position (0,): "dtype": dtype '
                                   "float32 differs from float64 of the partitions' data "
                                   "(grid invariant 6)")
    part = Partition((0,), (0,), (4,), (), None)
    assert PartitionedArray((4,), [[0, 4]], {(0,): part}, dtype=np.float64).dtype == "float64"
    with pytest.raises(ValueError, match="dtype 'bogus' is not one dlpart knows"):
        PartitionedArray((4,), [[0, 4]], {(0,): part}, dtype="bogus")


def test_numpy_integers_are_ranks_and_pids_as_python_ints_are():
    # heat reads int(location[0]): a rank computed with numpy is a rank; so is a numpy pid.
    # What int() would refuse or change (a bool, a float, an int beyond int64) stays refused.
    def read(location):
        entry = {"start": (0,), "shape": (2,), "data": None, "location": location}
        d = {"shape": (2,), "partition_tiling": (1,), "partitions": {(0,): entry}}
        return dlpart.from_partitioned(d).partitions[(0,)].locations

    cpu = dlpart.Device("kDLCPU")
    for r in (np.int64(3), np.uint8(3), np.int32(3)):
        assert read([r]) == read([3]) == (Location(None, None, cpu, rank=3),)
        assert read(r) == read(3)  # one location, not in a list
    assert read([("10.0.0.1", np.int64(42))]) == (Location("10.0.0.1", 42, cpu),)
    for bad, match in [(np.int64(-1), "negative rank -1"), (np.uint64(2**64 - 1), "int64"),
                       (np.bool_(True), "expected"), (np.float64(1.0), "expected"),
                       (True, "bool")]:
        with pytest.raises(dlpart.ProtocolError, match=match):
            read([bad])
    with pytest.raises(dlpart.ProtocolError, match="pid"):
        read([("10.0.0.1", np.float64(42))])


def test_a_location_list_mixing_hosts_and_ranks_or_naming_a_device_as_host_is_refused():
    # ['10.0.0.5', 4242, 'kDLCPU'] is one draft-2 location written as a list: read as a list of
    # locations it would be three replicas (an IP, MPI rank 4242, a host named 'kDLCPU').
    def entry(location):
        return {"start": (2,), "shape": (2,), "data": None, "location": location}

    def read(location):
        d = {"shape": (4,), "partition_tiling": (2,),
             "partitions": {(0,): {"start": (0,), "shape": (2,), "data": None, "location": [0]},
                            (1,): entry(location)}}
        return dlpart.from_partitioned(d).partitions[(1,)].locations

    at = '__partitioned__["location"] at position (1,): '
    for loc, found in [
        (["10.0.0.5", 4242, "kDLCPU"],
         "['10.0.0.5', 4242, 'kDLCPU'] mixes a host string and a rank: it reads as one "
         "location (ip, pid[, device]) written as a list; give it as a tuple in a list: "
         "[('10.0.0.5', 4242, 'kDLCPU')]"),
        (["10.0.0.5", np.int64(7)],
         f"{['10.0.0.5', np.int64(7)]!r} mixes a host string and a rank: it reads as one "
         "location (ip, pid[, device]) written as a list; give it as a tuple in a list: "
         f"[{('10.0.0.5', np.int64(7))!r}]"),
        ((3, "10.0.0.5"),
         "(3, '10.0.0.5') mixes host strings and ranks (the host '10.0.0.5' at entry 1, the "
         "rank 3 at entry 0): one array names its locations one way"),
        (["kDLCPU"], "'kDLCPU' is a device name where a host is expected (a location is a "
                     "host string, a rank, or a tuple (ip, pid[, device]))"),
        ("kDLCUDA:1", "'kDLCUDA:1' is a device name where a host is expected (a location is "
                      "a host string, a rank, or a tuple (ip, pid[, device]))"),
        ([("kDLCPU", 11, "kDLCPU")], "'kDLCPU' is a device name where a host is expected"),
    ]:
        with pytest.raises(dlpart.ProtocolError) as info:
            read(loc)
        assert str(info.value).startswith(at + found), str(info.value)
    # Every form a producer writes still reads: one location, or a list of one form each.
    cpu, cuda = dlpart.Device("kDLCPU"), dlpart.Device("kDLCUDA:0")
    for loc, want in [
        (("10.0.0.5", 4242, "kDLCUDA:0"), [Location("10.0.0.5", 4242, cuda)]),
        ([("10.0.0.5", 4242, "kDLCUDA:0")], [Location("10.0.0.5", 4242, cuda)]),
        ([["10.0.0.5", 4242, "kDLCUDA:0"]], [Location("10.0.0.5", 4242, cuda)]),
        ([("10.0.0.5", 1), ("10.0.0.6", 2)],
         [Location("10.0.0.5", 1, cpu), Location("10.0.0.6", 2, cpu)]),
        (["10.0.0.5", "10.0.0.6"], [Location("10.0.0.5", None, cpu),
                                    Location("10.0.0.6", None, cpu)]),
        (["Alice", "1.1.1.2:55667"], [Location("Alice", None, cpu),
                                      Location("1.1.1.2:55667", None, cpu)]),
        (["10.0.0.8", ("10.0.0.7", 11)], [Location("10.0.0.8", None, cpu),
                                          Location("10.0.0.7", 11, cpu)]),
        ([0, 1], [Location(None, None, cpu, rank=0), Location(None, None, cpu, rank=1)]),
        ((0, np.int64(1)), [Location(None, None, cpu, rank=0),
                            Location(None, None, cpu, rank=1)]),
        ("kdl-node-1", [Location("kdl-node-1", None, cpu)]),
    ]:
        assert list(read(loc)) == want, loc


def test_locations_shared_between_entries_read_per_entry():
    # One location object repeated across entries (as dlpart's own dicts do) must give each
    # entry what reading it alone gives, including the device taken from the entry.
    pair, triple, host = ("10.0.0.7", 11), ("10.0.0.7", 11, "kDLCUDA:1"), "10.0.0.8"
    devices = ["cpu", "cuda:0", "cuda:1", None]
    locs = [[pair], [pair, triple], triple, [host, pair]]
    parts = {}
    for i, (dev, loc) in enumerate(zip(devices, locs)):
        parts[(i,)] = {"start": (i,), "shape": (1,), "data": None, "location": loc}
        if dev is not None:
            parts[(i,)]["device"] = dev
    pa = dlpart.from_partitioned({"shape": (4,), "partition_tiling": (4,), "partitions": parts})
    got = [[(l.host, l.pid, str(l.device)) for l in pa.partitions[(i,)].locations] for i in range(4)]
    assert got == [
        [("10.0.0.7", 11, "kDLCPU")],
        [("10.0.0.7", 11, "kDLCUDA:0"), ("10.0.0.7", 11, "kDLCUDA:1")],
        [("10.0.0.7", 11, "kDLCUDA:1")],
        [("10.0.0.8", None, "kDLCPU"), ("10.0.0.7", 11, "kDLCPU")],
    ]


def test_method_form_and_extra_keys_are_accepted():
    class Producer:
        def __partitioned__(self):
            _, d = example1()
            for e in d["partitions"].values():
                e["dtype"] = "float64"
            return d

    assert dlpart.from_partitioned(Producer()).shape == (64,)


def test_partition_and_assemble_are_zero_copy_views():
    a = np.arange(7 * 5, dtype=np.int16).reshape(7, 5)
    pa = dlpart.partition(a, (3, 2))
    assert pa.splits == ((0, 3, 5, 7), (0, 3, 5))
    p = pa.partitions[(1, 1)]
    assert p.start == (3, 3) and p.shape == (2, 2)
    v = np.from_dlpack(p.tensor)
    np.testing.assert_array_equal(v, a[3:5, 3:5])
    assert v.ctypes.data == a[3:5, 3:5].ctypes.data
    assert p.locations[0].pid == os.getpid()
    np.testing.assert_array_equal(np.from_dlpack(pa.assemble()), a)
    pb = dlpart.partition(a, splits=[[0, 1, 7], [0, 5]])
    assert pb.tiling == (2, 1)
    with pytest.raises(ValueError, match=r"\(0, 8\)"):
        dlpart.partition(a, splits=[[0, 8], [0, 5]])


def test_several_partitions_per_device_and_replicas():
    _, d = example1()
    d["partitions"][(0,)]["location"] = [("1.1.1.1", 1, "kDLCPU"), ("1.1.1.2", 2, "kDLCPU")]
    pa = dlpart.from_partitioned(d)
    assert len(pa.partitions[(0,)].locations) == 2
    assert pa.devices == [dlpart.Device("kDLCPU")]


def test_assemble_across_devices_needs_transfer():
    dpctl = pytest.importorskip("dpctl")
    if not os.environ.get("OCL_ICD_FILENAMES"):
        pytest.skip("dpctl needs OCL_ICD_FILENAMES (scripts/setup.sh)")
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        import dpctl.tensor as dpt
    del dpctl
    d = {"shape": (4,), "partition_tiling": (2,),
         "partitions": {(0,): {"start": (0,), "shape": (2,), "data": np.arange(2.0), "location": []},
                        (1,): {"start": (2,), "shape": (2,), "data": dpt.arange(2, 4, dtype="float64"),
                               "location": []}}}
    pa = dlpart.from_partitioned(d)
    with pytest.raises(dlpart.DeviceError, match="kDLOneAPI:0"):
        pa.assemble()


# -- validation ---------------------------------------------------------------------------------

def valid():
    _, d = example2()
    return d


@pytest.mark.parametrize(
    "mutate, key, position",
    [
        (lambda d: d["partitions"].pop((1, 0)), "partitions", "(1, 0)"),
        (lambda d: d["partitions"].__setitem__((2, 0), dict(d["partitions"][(1, 0)])), "partitions", "(2, 0)"),
        (lambda d: d.__setitem__("partition_tiling", (2, 2, 1)), "partition_tiling", None),
        (lambda d: d["partitions"][(0, 1)].__setitem__("start", (0, 5)), "start", "(0, 1)"),
        (lambda d: d["partitions"][(0, 1)].__setitem__("shape", (4, 3)), "shape", "(0, 1)"),
        (lambda d: d["partitions"][(1, 1)].__setitem__("start", (-4, 4)), "start", "(1, 1)"),
        (lambda d: d["partitions"][(1, 1)].__setitem__("start", (2**62, 4)), "start", "(1, 1)"),
        (lambda d: d["partitions"][(0, 0)].__setitem__("location", [("1.1.1.1", 1, "cuda")]), "location", "(0, 0)"),
        (lambda d: d["partitions"][(0, 0)].__setitem__("location", [("1.1.1.1", 1, "kDLCUDA:x")]), "location", "(0, 0)"),
        (lambda d: d["partitions"][(0, 0)].__setitem__("data", np.zeros((4, 4), np.float64)), "partitions", "(0, 0)"),
        (lambda d: d["partitions"][(0, 0)].__setitem__("data", np.zeros((3, 4), np.int32)), "partitions", "(0, 0)"),
        (lambda d: d.pop("shape"), "shape", None),
        (lambda d: d.__setitem__("locals", [(5, 5)]), "locals", None),
        (lambda d: d["partitions"][(0, 0)].pop("start"), "start", "(0, 0)"),
    ],
)
def test_violations_name_key_and_position(mutate, key, position):
    d = valid()
    mutate(d)
    with pytest.raises(dlpart.ProtocolError) as info:
        dlpart.from_partitioned(d)
    msg = str(info.value)
    assert key in msg, msg
    if position:
        assert position in msg, msg
    assert isinstance(info.value, ValueError)
    # validate finds the same problem, those of the data too
    with pytest.raises(dlpart.ProtocolError) as info:
        dlpart.validate(d)
    assert str(info.value) == msg


def test_validate_reports_every_violation_of_the_grid_before_importing():
    d = valid()
    d["partitions"][(0, 1)]["start"] = (0, 5)
    d["partitions"].pop((1, 1))

    class Boom:
        def __dlpack__(self, **kw):
            raise AssertionError("the grid is checked before any data is imported")

    d["partitions"][(0, 0)]["data"] = Boom()
    with pytest.raises(dlpart.ProtocolError) as info:
        dlpart.validate(d)
    assert "(0, 1)" in str(info.value) and "(1, 1)" in str(info.value)
    dlpart.validate(valid())


HERE = ("127.0.0.1", os.getpid())


def rows(datas, location=lambda i: []):
    """A dict of one (2, 3) partition per item of `datas` (its data), stacked along axis 0."""
    return {"shape": (2 * len(datas), 3), "partition_tiling": (len(datas), 1),
            "partitions": {(i, 0): {"start": (2 * i, 0), "shape": (2, 3), "data": data,
                                    "location": location(i)} for i, data in enumerate(datas)}}


def test_validate_checks_the_data_held_here_as_from_partitioned_does():
    x = np.arange(12.0).reshape(4, 3)
    on_gpu = lambda i: [(*HERE, "kDLCUDA:0")] if i == 1 else []  # noqa: E731
    cases = [
        (rows([x[:2], x[2:3]]), '__partitioned__["partitions"] at position (1, 0): tensor of '
                                'shape (1, 3) for a partition of shape (2, 3) (grid invariant 7)'),
        (rows([x[:2], x[2:].astype(np.float32)]),
         '__partitioned__["partitions"] at position (1, 0): dtype float32 differs from float64 '
         'of partition (0, 0) (grid invariant 6)'),
        (rows([x[:2], x[2:]], on_gpu),
         '__partitioned__["location"] at position (1, 0): data lives on kDLCPU but the '
         'locations in this process name kDLCUDA:0 (grid invariant 9)'),
    ]
    for d, expected in cases:
        for check in (dlpart.validate, dlpart.from_partitioned):
            with pytest.raises(dlpart.ProtocolError) as info:
                check(d)
            assert str(info.value) == expected
    dlpart.validate(rows([x[:2], x[2:]]))


def test_validate_lists_every_problem_of_the_data_at_once():
    x = np.arange(12.0).reshape(4, 3)

    class Unexportable:
        """A producer whose export fails, on a device its location contradicts."""

        def __dlpack__(self, **kw):
            raise RuntimeError("export failed")

        def __dlpack_device__(self):
            return (2, 0)

    d = rows([x[:2], x[2:3], x[:2].astype(np.float32), x[:2], Unexportable()],
             lambda i: [(*HERE, "kDLCUDA:0" if i == 3 else "kDLCPU")])
    with pytest.raises(dlpart.ProtocolError) as info:
        dlpart.validate(d)
    at = '  - __partitioned__["{}"] at position ({}, 0): '.format
    assert str(info.value).splitlines() == [
        "5 protocol violations:",
        at("partitions", 1) + "tensor of shape (1, 3) for a partition of shape (2, 3) "
                              "(grid invariant 7)",
        at("partitions", 2) + "dtype float32 differs from float64 of partition (0, 0) "
                              "(grid invariant 6)",
        at("location", 3) + "data lives on kDLCPU but the locations in this process name "
                            "kDLCUDA:0 (grid invariant 9)",
        at("partitions", 4) + '"data": RuntimeError: export failed',
        at("location", 4) + "data lives on kDLCUDA:0 but the locations in this process name "
                            "kDLCPU (grid invariant 9)",
    ]
    assert isinstance(info.value.__cause__, RuntimeError)
    # from_partitioned stops at what keeps it from importing
    with pytest.raises(dlpart.ProtocolError, match=r"\(4, 0\): \"data\": RuntimeError"):
        dlpart.from_partitioned(d)


def test_validate_releases_the_data_it_imports():
    ref = np.arange(16, dtype=np.float32).reshape(4, 4)
    d = {"shape": (4, 4), "partition_tiling": (4, 1),
         "partitions": {(i, 0): {"start": (i, 0), "shape": (1, 4),
                                 "data": counted_array(ref[i:i + 1]), "location": []}
                        for i in range(4)}}
    for bad in (False, True):
        if bad:
            d["partitions"][(3, 0)]["data"] = counted_array(ref[:2])
        gc.collect()
        before = _testing.deleter_calls()
        try:
            dlpart.validate(d)
        except dlpart.ProtocolError as e:
            assert bad and "(3, 0)" in str(e)
        else:
            assert not bad, "the partition of the wrong shape is reported"
        gc.collect()
        assert _testing.deleter_calls() - before == 4  # each taken once, and given back


class ReadOnlyView(Mapping):
    """A mapping over `d` that is no dict, counting the reads of each key; reading a key of
    `failing` raises."""

    def __init__(self, d, failing=()):
        self.d, self.failing, self.reads = d, failing, collections.Counter()

    def __getitem__(self, key):
        self.reads[key] += 1
        if key in self.failing:
            raise RuntimeError(f"cannot read {key}")
        return self.d[key]

    def __iter__(self):
        return iter(self.d)

    def __len__(self):
        return len(self.d)


def handles_dict(ref, cls=dict):
    get, _ = store_get(ref[:1], ref[1:])
    return cls(shape=ref.shape, partition_tiling=(2, 1), get=get, partitions=cls({
        (i, 0): cls(start=(i, 0), shape=(1, 3), data=Handle(i), location=[]) for i in range(2)}))


def test_a_dict_is_read_for_its_items_whatever_its_class_overrides():
    ref = np.arange(6.0).reshape(2, 3)

    class Overriding(dict):
        def get(self, *args):
            raise RuntimeError("get")

        def __getitem__(self, key):
            raise RuntimeError("getitem")

    d = handles_dict(ref, Overriding)
    dlpart.validate(d)
    np.testing.assert_array_equal(np.from_dlpack(dlpart.from_partitioned(d).assemble()), ref)
    # A defaultdict is not asked for the optional keys it lacks: it would make them up.
    d = collections.defaultdict(lambda: "made up", handles_dict(ref))
    np.testing.assert_array_equal(np.from_dlpack(dlpart.from_partitioned(d).assemble()), ref)
    dlpart.validate(d)
    assert set(d) == {"shape", "partition_tiling", "get", "partitions"}


def test_a_mapping_is_read_once_and_its_errors_name_the_key():
    ref = np.arange(6.0).reshape(2, 3)
    view = ReadOnlyView(handles_dict(ref))
    pa = dlpart.from_partitioned(view)
    assert set(view.reads.values()) == {1}, view.reads  # one reading, shared by every layer
    np.testing.assert_array_equal(np.from_dlpack(pa.assemble()), ref)
    for key in ("shape", "partitions", "get", "locals"):
        for check in (dlpart.validate, dlpart.from_partitioned):
            with pytest.raises(dlpart.ProtocolError) as info:
                check(ReadOnlyView(handles_dict(ref), failing=(key,)))
            assert str(info.value) == f'__partitioned__["{key}"]: RuntimeError: cannot read {key}'
            assert str(info.value.__cause__) == f"cannot read {key}"


def test_a_user_exception_reading_ints_is_the_cause():
    class Hostile:
        def __index__(self):
            raise RuntimeError("index")

        def __iter__(self):
            raise RuntimeError("iter")

    for bad in [(Hostile(), 3), Hostile()]:
        d = rows([np.zeros((2, 3))])
        d["shape"] = bad
        with pytest.raises(dlpart.ProtocolError, match=r'\["shape"\]: expected a tuple of ints'
                           ) as info:
            dlpart.from_partitioned(d)
        assert isinstance(info.value.__cause__, RuntimeError)


def counted_array(values):
    class Counted:
        def __dlpack__(self, **kw):
            return _testing.make_capsule(np.ascontiguousarray(values, np.float32).tobytes(),
                                         list(values.shape), strides=None)

        def __dlpack_device__(self):
            return (1, 0)

    return Counted()


def test_failure_half_way_releases_every_tensor_taken():
    ref = np.arange(16, dtype=np.float32).reshape(4, 4)
    d = {"shape": (4, 4), "partition_tiling": (4, 1),
         "partitions": {(i, 0): {"start": (i, 0), "shape": (1, 4), "data": counted_array(ref[i:i + 1]),
                                 "location": []} for i in range(4)}}
    d["partitions"][(3, 0)]["data"] = counted_array(ref[:2])  # wrong shape, imported last
    gc.collect()
    before = _testing.deleter_calls()
    with pytest.raises(dlpart.ProtocolError, match=r"\(3, 0\)"):
        dlpart.from_partitioned(d)
    gc.collect()
    assert _testing.deleter_calls() - before == 4


def test_not_partitioned():
    with pytest.raises(TypeError, match="list"):
        dlpart.from_partitioned([1, 2])
    with pytest.raises(dlpart.ProtocolError, match="dict"):
        dlpart.from_partitioned(type("X", (), {"__partitioned__": property(lambda s: 3)})())


def test_oneapi_partitions_repartition_on_their_own_device():
    if not os.environ.get("OCL_ICD_FILENAMES"):
        pytest.skip("dpctl needs OCL_ICD_FILENAMES (scripts/setup.sh)")
    pytest.importorskip("dpctl")
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        import dpctl.tensor as dpt
    ref = np.arange(6 * 8, dtype=np.float32).reshape(6, 8)
    x = dpt.asarray(ref)
    pa = dlpart.partition(x, (2, 2))
    assert pa.devices == [dlpart.Device("kDLOneAPI:0")]
    out = pa.repartition((1, 4))
    for p in out.partitions.values():
        assert p.tensor.device == "kDLOneAPI:0"
        np.testing.assert_array_equal(dpt.asnumpy(dpt.from_dlpack(p.tensor)),
                                      ref[:, p.start[1]:p.start[1] + p.shape[1]])
    whole = pa.assemble()
    assert whole.device == "kDLOneAPI:0"
    np.testing.assert_array_equal(dpt.asnumpy(dpt.from_dlpack(whole)), ref)
    # dpctl makes memory only on its own devices: no transfer could take the data to the host.
    for transfer in (False, True):
        with pytest.raises(dlpart.BackendUnavailableError, match="kDLOneAPI:0 -> kDLCPU"):
            pa.repartition((3, 1), devices="kDLCPU", transfer=transfer)
    with pytest.raises(dlpart.BackendUnavailableError, match="no kernels for kDLOneAPI:0"):
        pa.to("cpu")
    # The result goes on through dpctl as its source did; dlpart's own kernels are not there.
    np.testing.assert_array_equal(dpt.asnumpy(dpt.from_dlpack(out.assemble())), ref)
    with pytest.raises(dlpart.BackendUnavailableError, match="no kernels for kDLOneAPI:0"):
        pa.gather([0])


class OneApiStandIn:
    """A kDLOneAPI array of a stand-in array library (host memory behind the pointer, which
    dlpart never reads: it copies through the namespace below)."""

    def __init__(self, a, dev):
        self.a, self.device = a, dev

    shape = property(lambda self: self.a.shape)
    dtype = property(lambda self: self.a.dtype)

    def __getitem__(self, k):
        return OneApiStandIn(self.a[k], self.device)

    def __setitem__(self, k, v):
        self.a[k] = v.a

    def __dlpack_device__(self):
        return (14, self.device)

    def __dlpack__(self, **kw):
        c = np.ascontiguousarray(self.a)
        return _testing.make_capsule(c.tobytes(), list(c.shape), dtype=(2, 64, 1),
                                     device=(14, self.device))

    def __array_namespace__(self, **kw):
        return OneApiNamespace


class OneApiNamespace:
    @staticmethod
    def from_dlpack(t):  # float64, contiguous: what the stand-in exports
        import ctypes

        buf = (ctypes.c_char * t.nbytes).from_address(t.data_ptr)
        return OneApiStandIn(np.frombuffer(buf, np.float64).reshape(t.shape).copy(), t.device.id)

    @staticmethod
    def empty(shape, dtype=None, device=None):
        return OneApiStandIn(np.empty(shape, dtype), device)


def test_devices_without_kernels_cross_only_where_the_plan_copies():
    """Rows on two kDLOneAPI devices: a layout that keeps every element on its device (the
    same rows, split into columns) needs no transfer; one that moves rows names only the
    pairs it crosses."""
    x = np.arange(24.0).reshape(4, 6)
    two = dlpart.from_partitioned({"shape": (4, 6), "partition_tiling": (2, 1), "partitions": {
        (i, 0): {"start": (2 * i, 0), "shape": (2, 6), "data": OneApiStandIn(x[2 * i:2 * i + 2].copy(), i),
                 "location": []} for i in range(2)}})
    cols = two.repartition((2, 3))
    assert [cols.partitions[(i, j)].tensor.device for i in range(2) for j in range(3)] == \
        ["kDLOneAPI:0"] * 3 + ["kDLOneAPI:1"] * 3
    for (i, j), p in cols.partitions.items():
        got = OneApiNamespace.from_dlpack(p.tensor).a
        np.testing.assert_array_equal(got, x[2 * i:2 * i + 2, 2 * j:2 * j + 2])
    with pytest.raises(dlpart.DeviceError, match=r"\(kDLOneAPI:1 -> kDLOneAPI:0\); pass transfer"):
        two.repartition(splits=[[0, 1, 4], [0, 6]])
    np.testing.assert_array_equal(
        OneApiNamespace.from_dlpack(cols.repartition((1, 1), devices="kDLOneAPI:0",
                                                     transfer=True).assemble()).a, x)
    with pytest.raises(BufferError, match="kDLOneAPI:0; copy it to host memory with its own"):
        np.asarray(cols.partitions[(0, 0)].tensor)


def test_devices_without_kernels_are_not_told_to_pass_transfer_where_it_cannot_help():
    """dlpart cannot move data off a device it has no kernels for: `to` and a layout or
    assemble onto a device no partition is on raise BackendUnavailableError, with or
    without transfer=True, instead of asking for transfer=True and then refusing it."""
    x = np.arange(24.0).reshape(4, 6)
    pa = dlpart.from_partitioned({"shape": (4, 6), "partition_tiling": (2, 1), "partitions": {
        (i, 0): {"start": (2 * i, 0), "shape": (2, 6), "data": OneApiStandIn(x[2 * i:2 * i + 2].copy(), 0),
                 "location": []} for i in range(2)}})
    with pytest.raises(dlpart.BackendUnavailableError, match="no kernels for kDLOneAPI:0"):
        pa.to("cpu")
    for transfer in (False, True):
        for make in (lambda: pa.assemble(device="cpu", transfer=transfer),
                     lambda: pa.repartition((1, 2), devices="cpu", transfer=transfer),
                     lambda: pa.repartition((1, 2), devices="kDLOneAPI:1", transfer=transfer)):
            with pytest.raises(dlpart.BackendUnavailableError,
                               match=r"makes memory only on the devices the partitions are on "
                                     r"\(kDLOneAPI:0\), not on kDLCPU|not on kDLOneAPI:1") as e:
                make()
            assert "transfer=True" not in str(e.value) and "kDLOneAPI:0 -> " in str(e.value)
    # Onto the device they are on, the library's own copies still serve.
    np.testing.assert_array_equal(OneApiNamespace.from_dlpack(pa.assemble()).a, x)


def test_location_tuples_are_draft_2_and_read_back_the_same():
    cpu = dlpart.Device("kDLCPU")
    here = Location("10.0.0.5", 42, cpu)
    d = {"shape": (2,), "partition_tiling": (1,), "locals": [],
         "partitions": {(0,): {"start": (0,), "shape": (2,), "data": None,
                               "location": [here.to_tuple()]}}}
    assert here.to_tuple() == ("10.0.0.5", 42, "kDLCPU")
    assert dlpart.from_partitioned(d).partitions[(0,)].locations == (here,)
    with pytest.raises(ValueError, match="has no host for the draft-2 form .* names rank 3"):
        Location(None, None, cpu, rank=3).to_tuple()
