"""Conventions users know from numpy and the frameworks, wherever dlpart looks like them."""

import re

import numpy as np
import pytest

import dlpart
from dlpart import Location, _core


@pytest.mark.parametrize("name, expect", [
    ("cpu", "kDLCPU"), ("cuda", "kDLCUDA:0"), ("cuda:1", "kDLCUDA:1"), ("gpu:2", "kDLCUDA:2"),
    ("xpu:0", "kDLOneAPI:0"), ("kDLCUDA:3", "kDLCUDA:3"), ((2, 1), "kDLCUDA:1"),
])
def test_device_names_users_know(name, expect):
    assert dlpart.Device(name) == dlpart.Device(expect)
    assert str(dlpart.Device(name)) == expect


@pytest.mark.parametrize("bad", ["tpu:0", "cuda:x", "cuda:-1", "", "kDLcuda:0"])
def test_unknown_device_names_say_what_is_accepted(bad):
    with pytest.raises(dlpart.DeviceError) as info:
        dlpart.Device(bad)
    assert repr(bad) in str(info.value) or f'"{bad}"' in str(info.value)


def test_framework_device_names_work_where_devices_are_taken():
    x = np.arange(12.0).reshape(3, 4)
    pa = dlpart.partition(x, (3, 1))
    out = pa.repartition((1, 2), devices="cpu")
    assert out.devices == [dlpart.Device("kDLCPU")]
    np.testing.assert_array_equal(np.from_dlpack(out.assemble(device="cpu")), x)
    cyclic = pa.repartition(block_cyclic=1, devices=["cpu", "kDLCPU"])
    np.testing.assert_array_equal(np.from_dlpack(cyclic.assemble()), x)
    # equality with strings stays with the DLPack names (hash-consistent)
    assert dlpart.Device("cpu") == "kDLCPU" and dlpart.Device("cpu") != "cpu"


def test_gather_and_scatter_take_negative_axes_sequences_and_partitioned_arrays():
    x = np.arange(4 * 5, dtype=np.float32).reshape(4, 5)
    np.testing.assert_array_equal(np.from_dlpack(dlpart.gather(x, [4, -1, 0], axis=-1)),
                                  np.take(x, [4, -1, 0], axis=-1))
    np.testing.assert_array_equal(np.from_dlpack(dlpart.gather(x, (2,))), x[[2]])
    pa = dlpart.partition(x, (2, 2))
    got = dlpart.gather(pa, [3, 0, -4], axis=-2)
    np.testing.assert_array_equal(np.from_dlpack(got.assemble()), np.take(x, [3, 0, -4], axis=0))
    y = np.zeros_like(x)
    dlpart.scatter(x[:, :2], [-1, 1], y, axis=-1)
    expect = np.zeros_like(x)
    expect[:, [-1, 1]] = x[:, :2]
    np.testing.assert_array_equal(y, expect)
    target = dlpart.partition(np.zeros_like(x), (3, 1))
    dlpart.scatter(x[:2], [-1, 0], target)
    np.testing.assert_array_equal(np.from_dlpack(target.assemble())[[3, 0]], x[:2])
    with pytest.raises(ValueError, match="axis -3 is out of range for the 2-d"):
        dlpart.gather(x, [0], axis=-3)
    with pytest.raises(TypeError, match="integers"):
        dlpart.gather(x, [0.5])
    with pytest.raises(IndexError, match="index 4 is out of bounds"):
        dlpart.gather(pa, [4])


def test_int_tiling_for_1d_and_negative_entries_named():
    v = np.arange(10)
    pa = dlpart.partition(v, 4)
    assert pa.splits == ((0, 3, 6, 8, 10),)
    assert pa.repartition(2).splits == ((0, 5, 10),)
    with pytest.raises(ValueError, match=r"tiling \(-1, 1\) has the negative entry -1"):
        dlpart.partition(np.zeros((2, 2)), (-1, 1))
    with pytest.raises(ValueError, match="split points"):
        dlpart.partition(v, splits=[[0, -2, 10]])
    # numpy integer scalars are ints, as everywhere in numpy's own API
    assert dlpart.partition(v, np.int64(4)).splits == pa.splits
    assert pa.repartition(block_cyclic=np.uint8(3), devices=["cpu"]).splits == ((0, 3, 6, 9, 10),)
    # and so are numpy arrays of ints, as lists
    grid = dlpart.partition(np.zeros((6, 4)), np.array([2, 2]))
    assert grid.splits == ((0, 3, 6), (0, 2, 4))
    assert dlpart.partition(np.zeros((6, 4)), splits=[np.array([0, 1, 6]), np.array([0, 4])]).splits \
        == ((0, 1, 6), (0, 4))
    assert grid.repartition(block_cyclic=np.array([2, 2]), devices=["cpu"]).tiling == (3, 2)
    with pytest.raises(TypeError, match="devices must be a device .* not int 0"):
        pa.repartition(2, devices=0)


def test_numpy_on_a_partitioned_array_says_to_assemble():
    pa = dlpart.partition(np.arange(6.0), 2)
    with pytest.raises(TypeError, match=r"assemble\(\)"):
        np.asarray(pa)


def test_what_numpy_cannot_hold_and_what_has_no_axis_are_named():
    torch = pytest.importorskip("torch")
    t = dlpart.from_dlpack(torch.arange(3, dtype=torch.bfloat16))
    with pytest.raises(TypeError, match="numpy has no bfloat16 type"):
        np.asarray(t)
    pa = dlpart.partition(torch.zeros(4, dtype=torch.bfloat16), 2)
    with pytest.raises(TypeError, match="numpy has no bfloat16 type"):
        pa.to_partitioned(framework="numpy")
    assert torch.equal(torch.from_dlpack(t), torch.arange(3, dtype=torch.bfloat16))
    with pytest.raises(ValueError, match="the source is 0-d, so it has no axis 0"):
        dlpart.gather(np.array(1.0), [0])
    with pytest.raises(TypeError, match="writes into a dlpart.PartitionedArray, not ndarray"):
        dlpart.partition(np.zeros((3, 4)), (2, 1)).repartition_into(np.zeros((3, 4)))


I64 = r"\(expected an int from -9223372036854775808 to 9223372036854775807\)"
U64 = r"\(expected an int from 0 to 18446744073709551615\)"


def big_int_calls(big):
    """``(call, error class, message)`` for each int argument the extension reads into a Rust
    integer, given the int ``big`` (2**70 or -(2**70)), which no Rust integer type holds."""
    x = np.arange(12.0).reshape(3, 4)
    t = dlpart.from_dlpack(x)
    pa = dlpart.partition(x.copy(), (3, 1))
    one = dlpart.from_dlpack(np.zeros(3))

    def part(position=(0,), start=(0,), shape=(3,), locations=()):
        return {tuple(position): dlpart.Partition(position, start, shape, locations, one)}

    def made(shape=(3,), splits=((0, 3),), partitions=None, locals=None):
        return lambda: dlpart.PartitionedArray(shape, splits, partitions or part(),
                                               locals=locals)

    b, v = big, re.escape(str(big))
    neg = big < 0
    in_u64 = "" if neg else rf"(\w+ )?{v}.*64 bits"  # what _opt_list says of a large entry
    return [
        (lambda: dlpart.gather(x, [0], axis=b), ValueError, rf"^axis: {v} is out of range {I64}$"),
        (lambda: dlpart.scatter(0.0, [0], x.copy(), axis=b), ValueError, rf"^axis: {v} "),
        (lambda: dlpart.prepare_gather(x, [0], axis=b), ValueError, rf"^axis: {v} "),
        (lambda: dlpart.prepare_scatter(0.0, [0], x.copy(), axis=b), ValueError, rf"^axis: {v} "),
        (lambda: pa.gather([0], axis=b), ValueError, rf"^axis: {v} "),
        (lambda: pa.scatter(0.0, [0], axis=b), ValueError, rf"^axis: {v} "),
        (lambda: t.__dlpack__(max_version=(b, 0)), ValueError,
         rf"^max_version\[0\]: {v} is out of range {I64}$"),
        (lambda: t.__dlpack__(max_version=(1, b)), ValueError, rf"^max_version\[1\]: {v} is out"),
        (lambda: t.__dlpack__(max_version=(1, 0), dl_device=(1, b)), dlpart.DeviceError,
         rf"the device id {v} does not fit in 32 bits"),
        (lambda: t.__dlpack__(max_version=(1, 0), dl_device=(b, 0)), dlpart.DeviceError,
         rf"the device type {v} does not fit in 32 bits"),
        (lambda: dlpart.Device((1, b)), dlpart.DeviceError,
         rf'^invalid device "\(1, {v}\)": the device id {v} does not fit in 32 bits$'),
        (lambda: dlpart.Device.from_dlpack((b, 0)), dlpart.DeviceError,
         rf"the device type {v} does not fit"),
        (lambda: dlpart.from_dlpack(x, device=(1, b)), dlpart.DeviceError, rf"device id {v} "),
        (lambda: t.to((1, b)), dlpart.DeviceError, rf"device id {v} "),
        (lambda: dlpart.backend_status((1, b)), dlpart.DeviceError, rf"device id {v} "),
        (lambda: t.view((b, 0), (1, 1)), ValueError, rf"^start\[0\]: {v} is out of range {I64}$"),
        (lambda: t.view((0, 0), (1, b)), ValueError, rf"^shape\[1\]: {v} is out of range"),
        (lambda: dlpart.set_num_threads(b), ValueError, rf"^n: {v} is out of range"),
        (lambda: dlpart.split_points((b,), (1,)), ValueError, rf"^shape\[0\]: {v} is out"),
        (lambda: dlpart.split_points((4,), (b,)), ValueError, rf"^tiling\[0\]: {v} is out"),
        (lambda: dlpart.split_points((4,), splits=[[0, b, 4]]), ValueError,
         rf"^splits\[0\]\[1\]: {v} is out of range {U64}$"),
        (lambda: pa.fetch([(0, 0), (b, 0)]), IndexError,
         rf"^positions\[1\]\[0\]: {v} is out of range {U64}$"),
        (lambda: _core._tensor_from_bytes(b"", (b,), "float64", "kDLCPU", False), ValueError,
         rf"^shape\[0\]: {v} is out"),
        (lambda: _core._note_host_devices(b), ValueError, rf"^count: {v} is out of range"),
        (made(shape=(b,)), ValueError, rf"^shape\[0\]: {v} is out of range {U64}$"),
        (made(splits=((0, b),)), ValueError, rf"^splits\[0\]\[1\]: {v} is out"),
        (made(partitions=part(start=(b,))), ValueError,
         rf"^partitions\[\(0,\)\]\.start\[0\]: {v} is out of range {U64}$"),
        (made(partitions=part(shape=(b,))), ValueError, rf"^partitions\[\(0,\)\]\.shape\[0\]: "),
        (made(partitions=part(position=(b,))), IndexError,
         rf"^partitions\[\({v},\)\]\.position\[0\]: {v} is out"),
        (made(partitions=part(locations=[Location("h", b, dlpart.Device("cpu"))])), ValueError,
         rf"^partitions\[\(0,\)\]\.locations\[0\]\.pid: {v} is out of range {I64}$"),
        (made(partitions=part(locations=[Location(None, None, dlpart.Device("cpu"), b)])),
         ValueError, rf"^partitions\[\(0,\)\]\.locations\[0\]\.rank: {v} is out"),
        (made(locals=[(b,)]), ValueError, rf"^locals\[0\]\[0\]: {v} is out"),
        # Read in Python first: negative entries and entries beyond 64 bits named there.
        (lambda: dlpart.partition(x, (b, 1)), ValueError, rf"^tiling \({v}, 1\) has the {in_u64}"),
        (lambda: pa.repartition((b, 1)), ValueError, rf"^tiling \({v}, 1\) has the "),
        (lambda: pa.repartition(splits=[[0, b, 3], [0, 4]]), ValueError,
         rf"^split points \(0, {v}, 3\) has the "),
        (lambda: pa.repartition(block_cyclic=b, devices=["cpu"]), ValueError,
         rf"^block_cyclic \({v},\) has the "),
        (lambda: pa.repartition((3, 1), devices=["cpu"], process_grid=(b, 1)), ValueError,
         rf"^process_grid \({v}, 1\) has the "),
    ]


@pytest.mark.parametrize("big", [2**70, -(2**70)])
def test_ints_beyond_the_rust_types_are_named_errors_not_overflow_errors(big):
    """pyo3's conversion of an int too large for its Rust type raises a bare OverflowError
    ("Python int too large to convert to C long"): every int argument is read so that such an
    int is a ValueError (an IndexError for positions, a DeviceError in a device) naming the
    argument and the value."""
    for call, cls, message in big_int_calls(big):
        with pytest.raises(Exception) as info:
            call()
        e = info.value
        assert type(e) is cls and re.search(message, str(e)), (message, repr(e))
    # What is no int at all is still pyo3's TypeError, naming the argument.
    with pytest.raises(TypeError, match="argument 'axis': 'float' object cannot be interpreted"):
        dlpart.gather(np.zeros(3), [0], axis=1.0)
    with pytest.raises(TypeError, match="argument 'max_version': 'list' object cannot be cast"):
        dlpart.from_dlpack(np.zeros(3)).__dlpack__(max_version=[1, 0])


@pytest.mark.parametrize("bad", [-1, 2**64, -(2**70)])
def test_private_calls_name_the_int_argument_pyo3_could_not_convert(bad):
    """The extension's private calls, which the Python layer calls with ints it has checked,
    read their ints as the public ones do: a negative int or one beyond 64 bits where a size
    or an index is taken is a ValueError (an IndexError for a partition's flat index) naming
    the argument and the value, not pyo3's bare OverflowError ("can't convert negative int to
    unsigned"). The public calls above them say so first, in their own words."""
    x = np.arange(12.0).reshape(3, 4)
    pa = dlpart.partition(x.copy(), (3, 1))
    c = pa._core
    v = re.escape(str(bad))
    some = [[0, 3], [0, 4]]
    calls = [
        (lambda: _core._PartitionedArray.partition(x, [bad, 1], None), ValueError,
         rf"^tiling\[0\]: {v} is out of range {U64}$"),
        (lambda: _core._PartitionedArray.partition(x, None, [[0, 3], [0, bad]]), ValueError,
         rf"^splits\[1\]\[1\]: {v} is out of range {U64}$"),
        (lambda: c.target(tiling=[bad, 1]), ValueError, rf"^tiling\[0\]: {v} is out"),
        (lambda: c.repartition(splits=[[0, bad], [0, 4]]), ValueError, rf"^splits\[0\]\[1\]: "),
        (lambda: c.repartition(tiling=[3, 1], devices=["cpu"] * 3, process_grid=[bad, 1]),
         ValueError, rf"^process_grid\[0\]: {v} is out of range {U64}$"),
        (lambda: c.repartition(block_cyclic=bad, devices=["cpu"]), ValueError,
         rf"^block_cyclic: {v} is out of range {U64}$"),
        (lambda: c.repartition(block_cyclic=[1, bad], devices=["cpu"]), ValueError,
         rf"^block_cyclic\[1\]: {v} is out"),
        (lambda: c.set_fetched([0, bad], []), IndexError, rf"^flats\[1\]: {v} is out of range"),
        (lambda: c.plan_ops([[0, 3], [0, bad]]), ValueError, rf"^dst_splits\[1\]\[1\]: {v} "),
        (lambda: _core._plan_stats([3, bad], some, some), ValueError, rf"^shape\[1\]: {v} is"),
        (lambda: _core._plan_stats([3, 4], some, [[0, bad], [0, 4]]), ValueError,
         rf"^dst_splits\[0\]\[1\]: {v} is out"),
        (lambda: _core._distarray_describe(c, bad, 1), ValueError, rf"^rank: {v} is out"),
        (lambda: _core._distarray_describe(c, 0, bad), ValueError, rf"^nprocs: {v} is out"),
    ]
    if bad != -1:  # an i64, where -1 is a rank the Python layer has refused
        calls.append((lambda: c.to_dict(None, "h", None, "rank", bad), ValueError,
                      rf"^rank: {v} is out of range {I64}$"))
    for call, cls, message in calls:
        with pytest.raises(Exception) as info:
            call()
        e = info.value
        assert type(e) is cls and re.search(message, str(e)), (message, repr(e))
    # The public calls check first, naming the argument as the user wrote it.
    for call, message in [
            (lambda: dlpart.partition(x, (bad, 1)), rf"^tiling \({v}, 1\) has the"),
            (lambda: pa.repartition(splits=[[0, bad], [0, 4]]), rf"^split points \(0, {v}\) has"),
            (lambda: pa.repartition(block_cyclic=[1, bad], devices=["cpu"]),
             rf"^block_cyclic \(1, {v}\) has the"),
            (lambda: pa.repartition((3, 1), devices=["cpu"] * 3, process_grid=(bad, 1)),
             rf"^process_grid \({v}, 1\) has the")]:
        with pytest.raises(ValueError, match=message):
            call()
    assert (np.from_dlpack(pa.assemble()) == x).all()
