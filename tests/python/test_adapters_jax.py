"""Sharded JAX arrays to dlpart and back, on four emulated CPU devices, shard by shard."""

import gc
import os
import subprocess
import sys
import textwrap

# XLA reads this when the CPU backend starts, which is the first jax.devices() call.
_flags = os.environ.get("XLA_FLAGS", "")
if "xla_force_host_platform_device_count" not in _flags:
    os.environ["XLA_FLAGS"] = (_flags + " --xla_force_host_platform_device_count=4").strip()

import numpy as np  # noqa: E402
import pytest  # noqa: E402

jax = pytest.importorskip("jax", reason="jax is not installed")
import dlpart  # noqa: E402
from dlpart import Device  # noqa: E402
from dlpart.adapters import jax as dj  # noqa: E402
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P  # noqa: E402

from conftest import aligned_empty  # noqa: E402

DEVICES = jax.devices("cpu")
if len(DEVICES) < 4:
    pytest.skip(
        f"needs 4 JAX CPU devices, found {len(DEVICES)} (XLA_FLAGS={os.environ.get('XLA_FLAGS')!r}"
        "; XLA reads it once, when the CPU backend starts)",
        allow_module_level=True,
    )

MESH = Mesh(np.array(DEVICES[:4]).reshape(2, 2), ("x", "y"))


def sharded(shape, spec, dtype=np.float32, seed=0):
    ref = (np.random.default_rng(seed).standard_normal(shape) * 100).astype(dtype)
    return ref, jax.device_put(ref, NamedSharding(MESH, spec))


def box_of(index, shape):
    return tuple(s.indices(n)[0] for s, n in zip(index, shape)), tuple(
        len(range(*s.indices(n))) for s, n in zip(index, shape))


def layout(arr):
    """Which box of the array each device holds."""
    return {d: box_of(i, arr.shape) for d, i in arr.sharding.devices_indices_map(arr.shape).items()}


def pointers(arr):
    return {s.device: s.data.unsafe_buffer_pointer() for s in arr.addressable_shards}


def test_sharded_round_trip_is_zero_copy():
    ref, a = sharded((8, 12), P("x", "y"))
    pa = dj.to_partitioned(a)
    assert pa.shape == (8, 12) and pa.tiling == (2, 2) and pa.dtype == "float32"
    assert pa.splits == ((0, 4, 8), (0, 6, 12))
    for s in a.addressable_shards:
        start, shape = box_of(s.index, a.shape)
        p = pa.partitions[(start[0] // 4, start[1] // 6)]
        assert (p.start, p.shape) == (start, shape)
        assert p.tensor.data_ptr == s.data.unsafe_buffer_pointer()
        np.testing.assert_array_equal(np.from_dlpack(p.tensor), ref[s.index])
        (loc,) = p.locations
        assert (loc.pid, loc.rank) == (os.getpid(), s.device.id)
        assert loc.device == Device.from_dlpack((1, s.device.id)) == p.tensor.device
    b = dj.from_partitioned(pa)
    assert layout(b) == layout(a) and b.dtype == a.dtype
    assert pointers(b) == pointers(a)
    np.testing.assert_array_equal(np.asarray(b), ref)


@pytest.mark.parametrize("tiling", [(2, 1), (1, 2)])
def test_jax_data_on_cpu_device_2_is_handed_out_there_and_reads_back(tiling):
    """A plain JAX array on CPU device 2, cut by dlpart: the dict hands out JAX arrays on device 2,
    as its locations say, and dlpart reads its own dict back. Row blocks (64-byte rows, so
    aligned) share the array's memory; column blocks, strided, are copies."""
    ref = np.arange(8 * 16, dtype=np.float32).reshape(8, 16)
    pa = dlpart.partition(jax.device_put(ref, DEVICES[2]), tiling)
    d = pa.__partitioned__
    for pos, e in d["partitions"].items():
        assert isinstance(e["data"], jax.Array)
        assert e["data"].devices() == {DEVICES[2]}
        assert [loc[2] for loc in e["location"]] == ["kDLCPU:2"]
        shared = e["data"].unsafe_buffer_pointer() == pa.partitions[pos].tensor.data_ptr
        assert shared == (tiling == (2, 1))
        (r0, c0), (nr, nc) = e["start"], e["shape"]
        np.testing.assert_array_equal(np.asarray(e["data"]), ref[r0:r0 + nr, c0:c0 + nc])
    back = dlpart.from_partitioned(d)
    assert back.devices == [Device("kDLCPU:2")]
    np.testing.assert_array_equal(np.from_dlpack(back.assemble(device="cpu", transfer=True)), ref)


@pytest.mark.parametrize("framework", ["jax", None])
def test_shards_go_to_jax_on_their_own_devices_without_a_copy(framework):
    """By default too: JAX is the producer's framework, as for a plain jax.Array."""
    ref, a = sharded((8, 12), P("x", "y"))
    pa = dj.to_partitioned(a)
    d = pa.to_partitioned(framework=framework)
    for s in a.addressable_shards:
        start, _ = box_of(s.index, a.shape)
        data = d["partitions"][(start[0] // 4, start[1] // 6)]["data"]
        assert isinstance(data, jax.Array) and data.devices() == {s.device}
        assert data.unsafe_buffer_pointer() == s.data.unsafe_buffer_pointer()
    back = dlpart.from_partitioned(d)
    assert back.devices == pa.devices
    np.testing.assert_array_equal(np.from_dlpack(back.assemble(device="cpu", transfer=True)), ref)


def test_data_on_a_cpu_device_jax_lacks_is_a_device_error_naming_it():
    """In a child process: importing data on kDLCPU:7 makes that host device known to dlpart
    for the rest of the process."""
    script = textwrap.dedent("""
        import numpy as np, dlpart
        from dlpart._core import _testing
        data = np.arange(6, dtype=np.float32)
        pa = dlpart.partition(_testing.make_capsule(data.tobytes(), [6], device=(1, 7)))
        try:
            pa.to_partitioned(framework="jax")
        except dlpart.DeviceError as e:
            print(e)
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         timeout=120)
    assert out.stdout.startswith("JAX has no CPU device 7 for data on kDLCPU:7 (its CPU devices: "
                                 "0, 1, 2, 3;"), out.stdout + out.stderr


class _Ref:
    """A handle to a shard, resolved only by the dict's ``get``."""

    def __init__(self, shard):
        self.shard = shard


def _third_party_dict(a, device, handles=False, rows=2):
    """A draft-2 dict another library might make of ``a``'s row shards, each located at
    ``(ip, pid, device(shard))`` in this process."""
    me = (dlpart._location.this_host(), os.getpid())
    parts = {}
    for s in a.addressable_shards:
        r0 = s.index[0].start or 0
        parts[(r0 // rows, 0)] = {
            "start": (r0, 0), "shape": (rows, a.shape[1]),
            "data": _Ref(s.data) if handles else s.data, "location": [me + (device(s),)]}
    d = {"shape": a.shape, "partition_tiling": (a.shape[0] // rows, 1), "partitions": parts}
    if handles:
        d["get"] = lambda hs: [h.shard for h in hs] if isinstance(hs, list) else hs.shard
    return d


@pytest.mark.parametrize("handles", [False, True])
def test_locations_may_name_the_device_jax_shards_report(handles):
    """JAX writes kDLCPU:k into the capsules of CPU device k while each shard's own
    __dlpack_device__() says (kDLCPU, 0): a dict locating its shards at 'kDLCPU', as that method
    has it, is as valid as one naming kDLCPU:k; the data stays on kDLCPU:k, zero-copy."""
    ref = np.arange(8 * 6, dtype=np.float32).reshape(8, 6)
    a = jax.device_put(ref, NamedSharding(Mesh(np.array(DEVICES), ("x",)), P("x", None)))
    assert {tuple(map(int, s.data.__dlpack_device__())) for s in a.addressable_shards} == {(1, 0)}
    for name in (lambda s: "kDLCPU", lambda s: f"kDLCPU:{s.device.local_hardware_id}"):
        d = _third_party_dict(a, name, handles)
        if not handles:
            dlpart.validate(d)
        pa = dlpart.from_partitioned(d).fetch()
        for s in a.addressable_shards:
            p = pa.partitions[((s.index[0].start or 0) // 2, 0)]
            assert p.tensor.device == Device(f"kDLCPU:{s.device.local_hardware_id}")
            assert p.tensor.data_ptr == s.data.unsafe_buffer_pointer()
            assert [loc.device for loc in p.locations] == [Device(name(s))]  # as given
        np.testing.assert_array_equal(np.from_dlpack(pa.assemble(device="cpu", transfer=True)),
                                      ref)
        # and its own dict reads back
        again = dlpart.from_partitioned(pa.__partitioned__)
        assert again.devices == pa.devices


@pytest.mark.parametrize("handles", [False, True])
def test_a_location_naming_another_device_than_either_still_contradicts_the_data(handles):
    ref = np.arange(8 * 6, dtype=np.float32).reshape(8, 6)
    a = jax.device_put(ref, NamedSharding(Mesh(np.array(DEVICES), ("x",)), P("x", None)))
    # the shard on device 1 located on device 3
    d = _third_party_dict(
        a, lambda s: "kDLCPU:3" if s.device.local_hardware_id == 1 else "kDLCPU", handles)
    want = (r"at position \(1, 0\): .*data lives on kDLCPU:1 \(its producer's __dlpack_device__ "
            r"names kDLCPU\) but the locations in this process name kDLCPU:3")
    with pytest.raises(dlpart.ProtocolError, match=want):
        dlpart.from_partitioned(d).fetch()
    if not handles:
        with pytest.raises(dlpart.ProtocolError, match=want):
            dlpart.validate(d)


def test_heat_form_writes_this_rank_not_jax_device_ids():
    """A location's rank holds the JAX device id; heat reads int(location[0]) as an MPI rank,
    so the shards this process holds are written on this process's rank."""
    from dlpart.adapters.heat import to_heat

    ref, a = sharded((8, 12), P("x", "y"))
    pa = dj.to_partitioned(a)
    assert sorted(loc.rank for p in pa.partitions.values() for loc in p.locations) == [0, 1, 2, 3]
    d = to_heat(pa).__partitioned__
    assert [p["location"] for p in d["partitions"].values()] == [[0]] * 4
    assert sorted(d["locals"]) == sorted(pa.partitions)
    assert [p["location"] for p in pa.to_partitioned(locations="rank", rank=3)[
        "partitions"].values()] == [[3]] * 4


@pytest.mark.parametrize("spec", [P("x", None), P(None, "y"), P()])
def test_replicas_become_one_partition_with_several_locations(spec):
    ref, a = sharded((4, 6), spec, dtype=np.int32)
    pa = dj.to_partitioned(a)
    holders = {}
    for d, index in a.sharding.devices_indices_map(a.shape).items():
        holders.setdefault(box_of(index, a.shape), set()).add(d.id)
    assert len(pa.partitions) == len(holders)
    primary = {box_of(s.index, a.shape): s for s in a.addressable_shards if s.replica_id == 0}
    for p in pa.partitions.values():
        assert [loc.rank for loc in p.locations] == sorted(holders[(p.start, p.shape)])
        assert p.tensor.data_ptr == primary[(p.start, p.shape)].data.unsafe_buffer_pointer()
        np.testing.assert_array_equal(np.from_dlpack(p.tensor),
                                      ref[tuple(slice(s, s + n) for s, n in zip(p.start, p.shape))])
    b = dj.from_partitioned(pa)
    assert layout(b) == layout(a)
    np.testing.assert_array_equal(np.asarray(b), ref)
    # the replica each partition was taken from goes back without a copy; the others are copies
    before = pointers(a)
    for s in a.addressable_shards:
        if s.replica_id == 0:
            assert pointers(b)[s.device] == before[s.device]


def test_partitions_keep_the_shards_alive():
    ref, a = sharded((8, 4), P("x", None), dtype=np.int16)
    pa = dj.to_partitioned(a)
    del a
    gc.collect()
    reuse = [jax.device_put(np.full((4, 4), 7, np.int16), d) for d in DEVICES for _ in range(4)]
    out = np.from_dlpack(pa.assemble(device="kDLCPU", transfer=True))
    np.testing.assert_array_equal(out, ref)
    assert all(int(r[0, 0]) == 7 for r in reuse)


def test_dlpart_grid_to_jax_in_device_order():
    x = aligned_empty((8, 8), np.float32)
    x[:] = np.arange(64).reshape(8, 8)
    pa = dlpart.partition(x, (4, 1))  # row blocks: contiguous and 64-byte aligned
    b = dj.from_partitioned(pa)
    np.testing.assert_array_equal(np.asarray(b), x)
    assert [s.device for s in sorted(b.addressable_shards, key=lambda s: s.index[0].start)] == \
        DEVICES[:4]
    # the block already on kDLCPU:0 is taken as it is; JAX copies the others onto devices 1-3
    first = next(s for s in b.addressable_shards if s.device == DEVICES[0])
    assert first.data.unsafe_buffer_pointer() == x.ctypes.data


def test_partitions_placed_by_dlpart_go_to_jax_without_a_copy():
    x = np.arange(64, dtype=np.float32).reshape(8, 8)
    devices = [f"kDLCPU:{d.id}" for d in DEVICES[:4]]
    pa = dlpart.partition(x, (1, 1)).repartition(tiling=(2, 2), devices=devices, transfer=True)
    b = dj.from_partitioned(pa, NamedSharding(MESH, P("x", "y")))
    for s in b.addressable_shards:
        start, shape = box_of(s.index, b.shape)
        p = pa.partitions[(start[0] // 4, start[1] // 4)]
        assert s.device.id == p.tensor.device.id
        assert s.data.unsafe_buffer_pointer() == p.tensor.data_ptr
    np.testing.assert_array_equal(np.asarray(b), x)


def test_other_layouts_are_repartitioned_first():
    x = np.arange(8 * 12, dtype=np.int32).reshape(8, 12)
    pa = dlpart.partition(x, (4, 1))
    columns = NamedSharding(Mesh(np.array(DEVICES[:4]), ("c",)), P(None, "c"))
    b = dj.from_partitioned(pa, columns)
    assert b.sharding == columns
    for s in b.addressable_shards:
        np.testing.assert_array_equal(np.asarray(s.data), x[s.index])
    c = dj.from_partitioned(pa, MESH)  # array axis i over mesh axis i
    assert layout(c) == layout(jax.device_put(x.astype(np.int32), NamedSharding(MESH, P("x", "y"))))
    np.testing.assert_array_equal(np.asarray(c), x)


def test_uneven_and_oversized_grids_are_refused():
    with pytest.raises(ValueError, match=r"axis 0 of length 10 is split at \[0, 3, 6, 8, 10\]"):
        dj.from_partitioned(dlpart.partition(np.arange(10.0), (4,)))
    with pytest.raises(ValueError, match=r"tiling \(8,\) needs 8 JAX devices, found 4"):
        dj.from_partitioned(dlpart.partition(np.arange(16.0), (8,)))


class _OtherProcessesHold:
    """A sharded array as one process of a multi-process JAX program sees it: only the shards
    on ``mine`` are addressable."""

    def __init__(self, arr, mine):
        self.shape, self.dtype, self.sharding = arr.shape, arr.dtype, arr.sharding
        self.addressable_shards = [s for s in arr.addressable_shards if s.device in mine]
        self.is_fully_addressable = False


def test_shards_of_other_processes_become_empty_partitions_with_locals():
    ref, a = sharded((8, 8), P("x", "y"))
    mine = set(DEVICES[:2])
    pa = dj.to_partitioned(_OtherProcessesHold(a, mine))
    assert pa.tiling == (2, 2)
    held = {box_of(s.index, a.shape): s for s in a.addressable_shards if s.device in mine}
    assert sorted(pa.locals) == sorted(pa.partitions[pos].position for pos in pa.partitions
                                       if (pa.partitions[pos].start, pa.partitions[pos].shape)
                                       in held)
    assert len(pa.locals) == 2
    for p in pa.partitions.values():
        (loc,) = p.locations
        if (p.start, p.shape) in held:
            assert p.tensor.data_ptr == held[(p.start, p.shape)].data.unsafe_buffer_pointer()
            assert loc.pid == os.getpid()
        else:
            assert p.tensor is None
            assert (loc.host, loc.pid) == (None, None) and loc.rank in {2, 3}
    d = pa.__partitioned__
    assert sorted(d["locals"]) == sorted(pa.locals)
