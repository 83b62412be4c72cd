"""What dlpart produces, consumed the way the two real consumers of ``__partitioned__`` consume
it: xgboost_ray (``numpy.concatenate(get(handles))``, locality from ``location[0]`` as an IP)
and heat (numpy or torch data only, ``int(location[0])`` as the MPI rank)."""

import os
import socket

import numpy as np
import pytest

import dlpart
from dlpart.adapters import heat
from dlpart.adapters import xgboost_ray as xgboost_ray_form


def rows():
    x = np.arange(12 * 4, dtype=np.float64).reshape(12, 4)
    return x, dlpart.partition(x, (3, 1))


def test_produced_data_is_numpy_over_the_same_memory():
    x, pa = rows()
    d = pa.__partitioned__
    parts = [d["partitions"][(i, 0)] for i in range(3)]
    data = d["get"]([p["data"] for p in parts])
    assert all(isinstance(a, np.ndarray) for a in data)
    assert data[1].ctypes.data == x[4:8].ctypes.data  # zero-copy
    np.testing.assert_array_equal(np.concatenate(data), x)  # what xgboost_ray runs
    # data dlpart made itself goes out as numpy too
    made = pa.repartition((1, 2)).__partitioned__
    assert isinstance(made["partitions"][(0, 1)]["data"], np.ndarray)
    explicit = pa.to_partitioned(framework="dlpart")["partitions"][(0, 0)]["data"]
    assert isinstance(explicit, dlpart.Tensor)
    with pytest.raises(ValueError, match="framework='tensorflow'"):
        pa.to_partitioned(framework="tensorflow")


def test_xgboost_ray_form_has_bare_node_addresses():
    x, pa = rows()
    d = xgboost_ray_form.partitioned(pa, store=False).__partitioned__
    for p in d["partitions"].values():
        ip = p["location"][0]
        assert isinstance(ip, str)
        socket.inet_aton(ip)  # an IPv4 address, as Ray reports a node's
        assert isinstance(p["data"], np.ndarray)
    np.testing.assert_array_equal(
        np.concatenate(d["get"]([d["partitions"][(i, 0)]["data"] for i in range(3)])), x)


def _interface_addresses() -> list:
    """The IPv4 address of every interface, read with ``SIOCGIFADDR`` (no traffic is sent): a
    reference independent of dlpart's ``getifaddrs``."""
    import fcntl
    import struct

    out = []
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        for _, name in socket.if_nameindex():
            try:
                packed = fcntl.ioctl(s.fileno(), 0x8915, struct.pack("256s", name[:15].encode()))
                out.append(socket.inet_ntoa(packed[20:24]))
            except OSError:
                continue
    return out


def test_node_address_is_the_host_name_s_or_an_interface_s_and_not_loopback():
    from dlpart._location import this_host

    try:
        named = [i[4][0] for i in socket.getaddrinfo(socket.gethostname(), None, socket.AF_INET)]
    except OSError:
        named = []
    others = [ip for ip in named + _interface_addresses() if not ip.startswith("127.")]
    if not others:
        pytest.skip("no network interface with an address other than loopback here")
    assert this_host() == others[0]
    _, pa = rows()
    host, pid, dev = pa.__partitioned__["partitions"][(0, 0)]["location"][0]
    assert (host, pid, dev) == (this_host(), os.getpid(), "kDLCPU")


def test_heat_form_has_rank_ints_and_heat_dicts_come_back_unchanged():
    x, pa = rows()
    d = heat.to_heat(pa).__partitioned__
    assert d["locals"] == [(0, 0), (1, 0), (2, 0)]  # one process holds them all
    for p in d["partitions"].values():
        assert isinstance(p["location"][0], int)  # heat runs int(location[0])
        assert isinstance(p["data"], np.ndarray)  # heat accepts numpy and torch only
    # A dict in heat's own form (ranks, extra keys, another rank's data None) passes through
    # dlpart and back out in the same form.
    theirs = {"shape": (12, 4), "partition_tiling": (2, 1), "locals": [(0, 0)],
              "partitions": {(0, 0): {"start": (0, 0), "shape": (6, 4), "data": x[:6],
                                      "location": [0], "dtype": "float64", "device": "cpu"},
                             (1, 0): {"start": (6, 0), "shape": (6, 4), "data": None,
                                      "location": [1], "dtype": "float64", "device": "cpu"}},
              "get": lambda h: h}
    back = dlpart.from_partitioned(theirs).__partitioned__
    assert [back["partitions"][(i, 0)]["location"] for i in range(2)] == [[0], [1]]
    assert back["locals"] == [(0, 0)]
    assert back["partitions"][(0, 0)]["data"].ctypes.data == x.ctypes.data
    assert back["partitions"][(1, 0)]["data"] is None


def test_heat_form_refuses_a_partition_without_a_rank():
    """heat runs int(location[0]) on every partition: one held elsewhere with an empty location
    is a ProtocolError naming it, not heat's IndexError."""
    x = np.zeros((8, 6))
    pa = dlpart.from_partitioned({
        "shape": (8, 6), "partition_tiling": (2, 1), "locals": [(0, 0)],
        "partitions": {(0, 0): {"start": (0, 0), "shape": (4, 6), "data": x[:4], "location": []},
                       (1, 0): {"start": (4, 0), "shape": (4, 6), "data": None, "location": []}}})
    with pytest.raises(dlpart.ProtocolError, match=r"partition \(1, 0\) .* names no rank"):
        heat.to_heat(pa).__partitioned__


def test_heat_form_writes_this_rank_for_data_held_here_whatever_host_it_names():
    """A draft-2 location names a host and pid, not a rank: data held here is on this rank; a
    partition held elsewhere is refused, naming its location."""
    x = np.arange(8.0)
    far = ("192.0.2.7", 99, "kDLCPU")  # a documentation address: never this host
    d = {"shape": (8,), "partition_tiling": (2,),
         "partitions": {(0,): {"start": (0,), "shape": (4,), "data": x[:4], "location": [far]},
                        (1,): {"start": (4,), "shape": (4,), "data": x[4:], "location": [far]}}}
    out = heat.to_heat(dlpart.from_partitioned(d)).__partitioned__
    assert [out["partitions"][(i,)]["location"] for i in range(2)] == [[0], [0]]
    np.testing.assert_array_equal(np.concatenate([out["partitions"][(i,)]["data"]
                                                  for i in range(2)]), x)
    d["partitions"][(1,)]["data"] = None
    with pytest.raises(dlpart.ProtocolError,
                       match=r"partition \(1,\) is not held here and its location .*192\.0\.2\.7.* "
                             r"is not an MPI rank"):
        heat.to_heat(dlpart.from_partitioned(d)).__partitioned__


def test_xgboost_ray_form_writes_this_host_for_data_held_here_whatever_rank_it_names():
    """A dict read from heat names ranks: data held here is on this host; a partition held by
    another rank has no address to write, and the error says where to find one."""
    from dlpart._location import this_host

    x = np.arange(8.0)
    d = {"shape": (8,), "partition_tiling": (2,), "locals": [(0,), (1,)],
         "partitions": {(0,): {"start": (0,), "shape": (4,), "data": x[:4], "location": [0]},
                        (1,): {"start": (4,), "shape": (4,), "data": x[4:], "location": [1]}}}
    out = dlpart.from_partitioned(d).to_partitioned(locations="ip")
    assert [out["partitions"][(i,)]["location"] for i in range(2)] == [[this_host()]] * 2
    np.testing.assert_array_equal(np.concatenate([out["partitions"][(i,)]["data"]
                                                  for i in range(2)]), x)
    d["partitions"][(1,)]["data"] = None
    d["locals"] = [(0,)]
    with pytest.raises(ValueError, match=r"partition \(1,\) has no host address to write: it "
                                         r"names rank 1 alone; .*dlpart\.mpi\.from_partitioned"):
        dlpart.from_partitioned(d).to_partitioned(locations="ip")


def test_a_rank_written_for_heat_is_a_non_negative_integer():
    x, pa = rows()
    far = {"shape": (4,), "partition_tiling": (1,), "partitions": {(0,): {
        "start": (0,), "shape": (4,), "data": np.zeros(4), "location": [("192.0.2.7", 9, "kDLCPU")]}}}
    held = dlpart.from_partitioned(far)
    assert held.to_partitioned(locations="rank", rank=np.int64(2))["partitions"][(0,)]["location"] == [2]
    with pytest.raises(ValueError, match=r"partition \(0,\) has no rank to write: .*pass rank="):
        held.to_partitioned(locations="rank")
    with pytest.raises(ValueError, match="rank -1 is not an MPI rank"):
        held.to_partitioned(locations="rank", rank=-1)
    with pytest.raises(TypeError, match="rank must be an integer, not bool"):
        held.to_partitioned(locations="rank", rank=True)


def test_jax_input_goes_back_out_as_jax():
    jax = pytest.importorskip("jax")
    import jax.numpy as jnp

    x = jnp.arange(16.0).reshape(4, 4)
    pa = dlpart.partition(x, (2, 1))
    data = pa.__partitioned__["partitions"][(1, 0)]["data"]
    assert isinstance(data, jax.Array)
    np.testing.assert_array_equal(np.asarray(data), np.asarray(x[2:]))


def test_xgboost_ray_trains_on_a_dlpart_array(ray_session):
    """The real client: RayDMatrix over dlpart row blocks, label by column name, trains; every
    partition is located on the node Ray reports, so each actor's shard is local."""
    ray = ray_session
    xgboost_ray = pytest.importorskip("xgboost_ray")
    import xgboost
    from xgboost_ray.data_sources.partitioned import Partitioned

    rng = np.random.default_rng(0)
    X = rng.normal(size=(400, 5))
    y = (X[:, 0] > 0).astype(np.float64)
    pa = dlpart.partition(np.concatenate([X, y[:, None]], axis=1), (4, 1))
    obj = xgboost_ray_form.partitioned(pa)
    node = ray.util.get_node_ip_address()
    d = obj.__partitioned__
    assert {p["location"][0] for p in d["partitions"].values()} == {node}
    # With Ray running the partitions sit in the object store, put once: xgboost_ray ships
    # the dict to every actor, which then fetches only its own shards.
    assert all(isinstance(p["data"], ray.ObjectRef) for p in d["partitions"].values())
    assert obj.__partitioned__["partitions"][(0, 0)]["data"] == d["partitions"][(0, 0)]["data"]
    import cloudpickle
    assert len(cloudpickle.dumps(d)) < 16 << 10  # refs, not the 16 KB of data
    by_value = xgboost_ray_form.partitioned(pa, store=False).__partitioned__
    assert len(cloudpickle.dumps(by_value)) > X.nbytes
    # what the loader makes of the partitions equals the array
    frame = Partitioned.load_data(obj.__partitioned__)
    np.testing.assert_array_equal(frame.to_numpy(), np.from_dlpack(pa.assemble()))
    dm = xgboost_ray.RayDMatrix(obj, label="f5")  # numpy partitions: columns f0..f5
    bst = xgboost_ray.train(
        {"objective": "binary:logistic", "eval_metric": "error"}, dm, num_boost_round=5,
        ray_params=xgboost_ray.RayParams(num_actors=2, cpus_per_actor=1))
    assert bst.num_boosted_rounds() == 5
    features = xgboost.DMatrix(X, feature_names=[f"f{i}" for i in range(5)])
    assert ((bst.predict(features) > 0.5) == (y > 0.5)).mean() > 0.9


def test_read_only_partitions_go_to_torch_as_copies():
    """torch has no read-only tensors and ignores DLPack's flag: a view would let the consumer
    write into a read-only numpy array (or a JAX array)."""
    torch = pytest.importorskip("torch")
    x = np.arange(8.0)
    x.flags.writeable = False
    w = np.arange(8.0)
    for src, shared in ((x, False), (w, True)):
        d = dlpart.partition(src, 2).to_partitioned(framework="torch")
        part = d["partitions"][(1,)]["data"]
        assert isinstance(part, torch.Tensor)
        assert (part.data_ptr() == src[4:].ctypes.data) == shared
        np.testing.assert_array_equal(part.numpy(), src[4:])
        part[:] = -1.0
    np.testing.assert_array_equal(x, np.arange(8.0))  # the read-only array is untouched
    assert (w[4:] == -1.0).all()  # a writable one is shared


def test_partitions_with_negative_strides_go_to_torch_as_copies():
    """torch aborts the process on a negative stride: such views go to it copied."""
    torch = pytest.importorskip("torch")
    x = np.arange(12.0).reshape(3, 4)[::-1]
    d = dlpart.partition(x, (1, 2)).to_partitioned(framework="torch")
    for (i, j), p in d["partitions"].items():
        assert isinstance(p["data"], torch.Tensor)
        np.testing.assert_array_equal(p["data"].numpy(), x[:, 2 * j:2 * j + 2])


def test_a_jax_array_imported_and_exported_again_cannot_be_written():
    """jax hands out legacy capsules (no read-only flag) of immutable buffers: dlpart imports
    them read-only and keeps the flag on every re-export."""
    pytest.importorskip("jax")
    import jax.numpy as jnp

    x = jnp.arange(8.0)
    t = dlpart.from_dlpack(x)
    assert t.readonly
    out = np.from_dlpack(t)
    assert not out.flags.writeable
    with pytest.raises(ValueError, match="read-only"):
        out[0] = 42.0
    pa = dlpart.partition(x, 2)
    view = pa.to_partitioned(framework="numpy")["partitions"][(1,)]["data"]
    assert not view.flags.writeable
    assert float(x[0]) == 0.0


def test_host_tensors_convert_with_numpy_asarray_without_a_copy():
    x = np.arange(12.0).reshape(3, 4)
    t = dlpart.from_dlpack(x[1:])
    a = np.asarray(t)
    assert a.ctypes.data == x[1:].ctypes.data and (a == x[1:]).all()
    made = dlpart.partition(x, (1, 2)).repartition((3, 1)).assemble()
    assert np.asarray(made).ctypes.data == made.data_ptr  # dlpart's own memory, no copy
    as32 = np.asarray(t, dtype=np.float32)
    assert as32.dtype == np.float32 and (as32 == x[1:]).all()
    # copy=False: the same memory or a ValueError, as numpy's own arrays answer
    same = np.asarray(t, dtype=np.float64, copy=False)
    assert same.ctypes.data == x[1:].ctypes.data
    with pytest.raises(ValueError):
        np.asarray(x[1:], dtype=np.float32, copy=False)
    with pytest.raises(ValueError, match="copy cannot be avoided"):
        np.asarray(t, dtype=np.float32, copy=False)
    frozen = x.copy()
    frozen.flags.writeable = False
    ro = np.asarray(dlpart.from_dlpack(frozen))
    assert not ro.flags.writeable  # read-only stays read-only


def test_strided_partitions_go_to_jax_as_contiguous_arrays():
    """JAX imports only C-contiguous tensors: column blocks of a C-order array (strided views)
    go to it as copies, contiguous ones as they are; both equal numpy's blocks."""
    pytest.importorskip("jax")
    import jax

    x = np.arange(48, dtype=np.float32).reshape(8, 6)
    for tiling in ((1, 2), (2, 2), (2, 1)):
        pa = dlpart.partition(x, tiling)
        d = pa.to_partitioned(framework="jax")
        for pos, p in d["partitions"].items():
            assert isinstance(p["data"], jax.Array)
            (r0, c0), (nr, nc) = p["start"], p["shape"]
            np.testing.assert_array_equal(np.asarray(p["data"]), x[r0:r0 + nr, c0:c0 + nc])
