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
