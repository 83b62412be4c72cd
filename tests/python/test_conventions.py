"""Conventions users know from numpy and the frameworks, wherever dlpart looks like them."""

import numpy as np
import pytest

import dlpart


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
