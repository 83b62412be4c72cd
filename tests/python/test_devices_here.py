"""A device that does not exist on this machine is a `DeviceError` wherever data is to be put
(a `BufferError` from `__dlpack__`, as the array API asks)."""

import numpy as np
import pytest

import dlpart
from conftest import cuda_device_count

# Other tests note emulated host devices (kDLCPU:1 to kDLCPU:5, as the JAX adapter does for
# JAX's CPU devices); none notes this many.
MISSING_CPU = "kDLCPU:512"


def _places(device):
    """Every call that takes a device to put data on, applied to `device`."""
    x = np.arange(24, dtype=np.float32).reshape(4, 6)
    pa = dlpart.partition(x, (2, 1))
    t = dlpart.from_dlpack(x)
    return {
        "PartitionedArray.to": lambda: pa.to(device),
        "repartition(devices=one)": lambda: pa.repartition((1, 2), devices=device, transfer=True),
        "repartition(devices=list)": lambda: pa.repartition(
            (1, 2), devices=["cpu", device], transfer=True),
        "assemble(device=)": lambda: pa.assemble(device=device, transfer=True),
        "from_partitioned(device=)": lambda: dlpart.from_partitioned(pa, device=device),
        "Tensor.to": lambda: t.to(device),
        "from_dlpack(device=)": lambda: dlpart.from_dlpack(x, device=device),
        "__dlpack__(dl_device=)": lambda: t.__dlpack__(
            dl_device=dlpart.Device(device).to_dlpack(), max_version=(1, 0)),
        "backend_status": lambda: dlpart.backend_status(device),
    }


def _error_for(where):
    """`__dlpack__` raises BufferError for a device it cannot serve, as the array API asks of
    it (consumers catch that to fall back); everything else raises DeviceError."""
    return BufferError if where.startswith("__dlpack__") else dlpart.DeviceError


@pytest.mark.parametrize("where", sorted(_places("cpu")))
def test_a_cpu_id_not_in_use_here_is_a_device_error(where):
    with pytest.raises(_error_for(where)) as info:
        _places(MISSING_CPU)[where]()
    msg = str(info.value)
    assert MISSING_CPU in msg and "kDLCPU:0" in msg, msg


def test_the_name_alone_is_not_checked():
    # A Device names a device, possibly another machine's (a partition's location).
    assert str(dlpart.Device(MISSING_CPU)) == MISSING_CPU
    assert str(dlpart.Device("cuda:7")) == "kDLCUDA:7"


def test_the_cpu_and_the_host_devices_in_use_stay_targets():
    x = np.arange(6.0)
    got = dlpart.partition(x, 2).to("cpu").assemble(device="kDLCPU:0")
    np.testing.assert_array_equal(np.from_dlpack(got), x)
    assert dlpart.backend_status("cpu") is None


@pytest.mark.parametrize("where", sorted(_places("cpu")))
def test_a_cuda_index_past_the_last_gpu_is_a_device_error(where):
    count = cuda_device_count()
    missing = f"cuda:{count}"
    reason = dlpart.backend_status("cuda:0")
    if count == 0:
        # No driver: the explanation of what is missing stays, as for every CUDA device.
        assert reason is not None and "libcuda" in reason, reason
        if where == "backend_status":
            assert "libcuda" in dlpart.backend_status(missing)
            return
        with pytest.raises((dlpart.BackendUnavailableError, BufferError)):
            _places(missing)[where]()
        return
    with pytest.raises(_error_for(where)) as info:
        _places(missing)[where]()
    msg = str(info.value)
    assert f"kDLCUDA:{count}" in msg and f"{count} CUDA device(s)" in msg, msg


def test_data_imported_from_an_emulated_host_device_can_be_copied_where_it_is():
    """A tensor a producer labels ``kDLCPU:7`` (JAX's emulated CPU devices do) makes that
    device present: copies of it onto its own device work without any adapter having named
    the device first. In a fresh process, so that no other test has noted it."""
    import subprocess
    import sys
    import textwrap

    script = textwrap.dedent("""
        import numpy as np
        import dlpart
        from dlpart._core import _testing
        data = np.arange(6, dtype=np.float32)
        cap = lambda: _testing.make_capsule(data.tobytes(), [6], device=(1, 7))
        t = dlpart.from_dlpack(cap())
        assert str(t.device) == "kDLCPU:7", t.device
        for copy in (t.copy(), dlpart.from_dlpack(cap(), copy=True)):
            assert str(copy.device) == "kDLCPU:7" and copy.data_ptr != t.data_ptr
            np.testing.assert_array_equal(np.from_dlpack(copy), data)
        np.testing.assert_array_equal(np.from_dlpack(t, copy=True), data)
        print("ok")
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         timeout=120)
    assert out.stdout.strip() == "ok", out.stdout + out.stderr


def test_an_import_onto_a_device_not_here_raises_what_tensor_to_raises_naming_it():
    """The device is checked before the producer is asked to move its data there: not the
    producer's `BufferError` (numpy's "unsupported device requested"), but the error moving
    the data there with `Tensor.to` gives (`DeviceError` past the last GPU,
    `BackendUnavailableError` without a CUDA driver)."""
    count = cuda_device_count()
    missing = f"cuda:{count}"
    x = np.arange(6.0).reshape(2, 3)
    asked = []

    class Counted:
        def __dlpack__(self, **kw):
            asked.append(kw)
            return x.__dlpack__(**kw)

        def __dlpack_device__(self):
            return x.__dlpack_device__()

    with pytest.raises((dlpart.DeviceError, dlpart.BackendUnavailableError)) as moved:
        dlpart.from_dlpack(x).to(missing)
    d = {"shape": (2, 3), "partition_tiling": (1, 1),
         "partitions": {(0, 0): {"start": (0, 0), "shape": (2, 3), "data": Counted()}}}
    for name, imported in [("from_dlpack", lambda: dlpart.from_dlpack(Counted(), device=missing)),
                           ("from_partitioned", lambda: dlpart.from_partitioned(d, device=missing))]:
        with pytest.raises(Exception) as info:
            imported()
        assert type(info.value) is type(moved.value), (name, info.value)
        assert f"kDLCUDA:{count}" in str(info.value), (name, info.value)
    assert asked == []
    np.testing.assert_array_equal(np.from_dlpack(dlpart.from_partitioned(d).assemble()), x)
