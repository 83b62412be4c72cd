"""dlpart.Tensor as a DLPack producer: capsule kinds, flags, stream/copy/device arguments."""

import gc

import numpy as np
import pytest

import dlpart
from dlpart._core import _testing
from dlpack_ctypes import IS_COPIED, READ_ONLY, read


def tensor(a):
    return dlpart.from_dlpack(a)


def test_versioned_capsule_when_max_version_allows():
    a = np.arange(6, dtype=np.int16).reshape(2, 3)
    cap = tensor(a).__dlpack__(max_version=(1, 0))
    name, f = read(cap)
    assert name == "dltensor_versioned"
    assert f["version"][0] == 1 and f["version"][1] >= 0
    assert f["flags"] & (READ_ONLY | IS_COPIED) == 0
    assert f["data"] == a.ctypes.data
    assert f["shape"] == a.shape
    assert f["strides"] == tuple(s // a.itemsize for s in a.strides)
    assert f["dtype"] == (0, 16, 1)
    assert f["device"] == (1, 0)
    assert f["byte_offset"] == 0


@pytest.mark.parametrize("max_version", [None, (0, 8)])
def test_legacy_capsule_otherwise(max_version):
    a = np.arange(4.0)
    cap = tensor(a).__dlpack__(max_version=max_version)
    name, f = read(cap)
    assert name == "dltensor"
    assert f["data"] == a.ctypes.data and f["strides"] == (1,)


def test_readonly_flag_and_legacy_refusal():
    a = np.arange(4.0)
    a.flags.writeable = False
    t = tensor(a)
    assert t.readonly
    _, f = read(t.__dlpack__(max_version=(1, 3)))
    assert f["flags"] & READ_ONLY
    with pytest.raises(BufferError, match="read-only"):
        t.__dlpack__()
    back = np.from_dlpack(t)
    assert not back.flags.writeable
    assert back.ctypes.data == a.ctypes.data


def test_copy_true_sets_is_copied_and_copies():
    a = np.arange(12, dtype=np.float32).reshape(3, 4)[:, ::2]
    cap = tensor(a).__dlpack__(max_version=(1, 3), copy=True)
    _, f = read(cap)
    assert f["flags"] & IS_COPIED
    assert f["data"] != a.ctypes.data
    b = np.from_dlpack(dlpart.from_dlpack(cap))
    np.testing.assert_array_equal(b, a)


def test_copy_false_is_zero_copy():
    a = np.arange(5, dtype=np.uint8)
    _, f = read(tensor(a).__dlpack__(max_version=(1, 3), copy=False))
    assert f["data"] == a.ctypes.data and not f["flags"] & IS_COPIED


def test_dl_device_cpu_is_accepted_and_others_refused():
    a = np.arange(3.0)
    t = tensor(a)
    _, f = read(t.__dlpack__(max_version=(1, 3), dl_device=(1, 0)))
    assert f["data"] == a.ctypes.data
    # A device this producer cannot serve is a BufferError, as the array API asks, whether
    # or not a copy is allowed (numpy raises the same); a malformed one is the caller's error.
    for copy in (None, True, False):
        with pytest.raises(BufferError, match="kDLCUDA:0"):
            t.__dlpack__(max_version=(1, 3), dl_device=(2, 0), copy=copy)
        with pytest.raises(BufferError, match="kDLCPU:1000"):
            t.__dlpack__(max_version=(1, 3), dl_device=(1, 1000), copy=copy)
    with pytest.raises(dlpart.DeviceError):
        t.__dlpack__(max_version=(1, 3), dl_device=(5, 0))
    # Another host device here (JAX's kDLCPU:1, as its adapter notes) is served by a copy,
    # unless copy=False.
    dlpart._core._note_host_devices(2)
    with pytest.raises(BufferError, match="copy=False"):
        t.__dlpack__(max_version=(1, 3), dl_device=(1, 1), copy=False)
    for copy in (None, True):
        _, f = read(t.__dlpack__(max_version=(1, 3), dl_device=(1, 1), copy=copy))
        assert f["data"] != a.ctypes.data and f["flags"] & IS_COPIED, f


def test_stream_rules_on_cpu():
    t = tensor(np.arange(3.0))
    t.__dlpack__(stream=None)
    t.__dlpack__(stream=-1)
    with pytest.raises(BufferError, match="stream=3"):
        t.__dlpack__(stream=3)
    with pytest.raises(TypeError, match="'s'"):
        t.__dlpack__(stream="s")
    # An int that is no stream is named as one, not as "not an int".
    with pytest.raises(ValueError, match=f"stream={2**70} is not a stream"):
        t.__dlpack__(stream=2**70)


def test_dlpack_device_and_strides_always_filled():
    a = np.arange(24, dtype=np.complex64).reshape(2, 3, 4)
    t = tensor(a)
    assert t.__dlpack_device__() == (1, 0)
    _, f = read(t.__dlpack__())
    assert f["strides"] == (12, 4, 1)
    _, f0 = read(tensor(np.array(2.5)).__dlpack__(max_version=(1, 0)))
    assert f0["ndim"] == 0
    _, fz = read(tensor(np.zeros((0, 3))).__dlpack__(max_version=(1, 0)))
    assert fz["data"] == 0 and fz["shape"] == (0, 3) and fz["strides"] is not None


def test_unconsumed_capsule_releases_its_export():
    gc.collect()  # exports an earlier test left in garbage are not this test's
    before = _testing.live_exports()
    t = tensor(np.arange(10.0))
    caps = [t.__dlpack__(max_version=(1, 0)) for _ in range(5)] + [t.__dlpack__()]
    assert _testing.live_exports() == before + 6
    del caps
    gc.collect()
    assert _testing.live_exports() == before


def test_consumed_capsule_is_released_by_the_consumer_once():
    gc.collect()  # exports an earlier test left in garbage are not this test's
    before = _testing.live_exports()
    t = tensor(np.arange(10.0))
    b = np.from_dlpack(t)
    assert _testing.live_exports() == before + 1
    del b
    gc.collect()
    assert _testing.live_exports() == before


def test_repr_names_everything():
    a = np.arange(6, dtype=np.float32).reshape(2, 3)
    a.flags.writeable = False
    r = repr(tensor(a[:, ::-1]))
    assert r == (
        "dlpart.Tensor(shape=(2, 3), dtype='float32', device='kDLCPU', strides=(3, -1), "
        "readonly=True)"
    )
