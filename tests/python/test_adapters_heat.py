"""`dlpart.adapters.heat.to_heat` in one process: the data is what heat takes (numpy arrays and
torch tensors), whatever framework the array came from. The real heat runs in a child process:
importing heat initialises MPI, after which mpirun refuses to start jobs from this process (the
MPI tests run in it too). heat across ranks: test_mpi_heat.py."""

import importlib.util
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import dlpart
from dlpart.adapters.heat import to_heat
# REF in host memory labelled as another device's (never read there: on this machine every
# such read below is faked or refused first).
from test_gather_scatter import _labelled


REF = np.arange(24, dtype=np.float32).reshape(4, 6)


def _producers():
    """(array, its data pointer) of each framework here, holding REF, by framework name; a
    read-only numpy array too."""
    x = REF.copy()
    frozen = REF.copy()
    frozen.flags.writeable = False
    out = [pytest.param(x, x.ctypes.data, id="numpy"),
           pytest.param(frozen, frozen.ctypes.data, id="numpy-read-only")]
    try:
        import torch
    except ImportError:
        pass
    else:
        t = torch.from_numpy(REF.copy())
        out.append(pytest.param(t, t.data_ptr(), id="torch"))
    try:
        import jax.numpy as jnp
    except ImportError:
        pass
    else:
        j = jnp.asarray(REF)
        out.append(pytest.param(j, j.unsafe_buffer_pointer(), id="jax"))
    return out


@pytest.mark.parametrize("x, ptr", _producers())
def test_heat_data_is_numpy_or_torch_for_torch_arrays(x, ptr):
    """torch arrays stay torch (heat takes them as they are); every other framework's go as
    numpy (jax's too, which heat would refuse), over the same memory where it is writable, and
    as writable copies where it is read-only (jax arrays, read-only numpy arrays): heat writes
    into what it is given."""
    torch_in = type(x).__module__.startswith("torch")
    readonly = not torch_in and not (isinstance(x, np.ndarray) and x.flags.writeable)
    d = to_heat(dlpart.partition(x, (2, 1))).__partitioned__
    for i in range(2):
        data = d["partitions"][(i, 0)]["data"]
        assert type(data) is (type(x) if torch_in else np.ndarray), type(data)
        np.testing.assert_array_equal(data.numpy() if torch_in else data, REF[2 * i:2 * i + 2])
        addr = data.data_ptr() if torch_in else data.ctypes.data
        if readonly:
            assert data.flags.writeable and data.flags.owndata is False
            assert not ptr <= addr < ptr + REF.nbytes, "a copy, not the producer's memory"
            data[...] = -1  # heat may write it; the producer's array is unchanged
            np.testing.assert_array_equal(np.asarray(x), REF)
        else:
            assert addr == ptr + i * REF[:2].nbytes
            assert torch_in or data.flags.writeable
    # a framework asked for is used as it is
    d = to_heat(dlpart.partition(x), framework="dlpart").__partitioned__
    assert isinstance(d["partitions"][(0, 0)]["data"], dlpart.Tensor)


def test_heat_reads_to_heat_of_numpy_torch_and_jax_arrays():
    """heat holds writable memory in every case: the producer's own where it is writable
    (writing through heat writes it), a copy where it is read-only (a jax array, a read-only
    numpy array: writing through heat leaves it unchanged, and torch does not warn of a
    read-only numpy array)."""
    if importlib.util.find_spec("heat") is None:  # looked up, not imported (see above)
        pytest.skip("heat is not installed")
    script = textwrap.dedent("""
        import warnings
        import numpy as np, torch, jax.numpy as jnp, heat as ht, dlpart
        from dlpart.adapters.heat import to_heat
        ref = np.arange(24, dtype=np.float32).reshape(4, 6)
        x, t, j = ref.copy(), torch.from_numpy(ref.copy()), jnp.asarray(ref)
        frozen = ref.copy()
        frozen.flags.writeable = False
        for name, a, ptr, shared in [
                ("numpy", x, x.ctypes.data, True), ("torch", t, t.data_ptr(), True),
                ("jax", j, j.unsafe_buffer_pointer(), False),
                ("numpy-read-only", frozen, frozen.ctypes.data, False)]:
            with warnings.catch_warnings():
                warnings.simplefilter("error", UserWarning)  # torch's, for read-only numpy
                y = ht.from_partitioned(to_heat(dlpart.partition(a)))
            assert y.shape == (4, 6) and y.split is None, (name, y.shape, y.split)
            # heat holds the producer's memory where it may write it, a copy elsewhere
            assert (y.larray.data_ptr() == ptr) == shared, name
            np.testing.assert_array_equal(y.numpy(), ref)
            y[1, 2] = -5.0  # written through heat
            want = ref.copy()
            want[1, 2] = -5.0
            np.testing.assert_array_equal(y.numpy(), want)
            np.testing.assert_array_equal(np.asarray(a), want if shared else ref)
            print(name, "ok")
        # The element types to_heat refuses are exactly those heat has no type for.
        from dlpart.adapters.heat import _HEAT_DTYPES
        from heat.core.types import canonical_heat_type
        for dt in [torch.bool, torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64,
                   torch.uint16, torch.uint32, torch.uint64, torch.float16, torch.bfloat16,
                   torch.float32, torch.float64, torch.complex64, torch.complex128]:
            try:
                canonical_heat_type(dt)
                heat_has = True
            except TypeError:
                heat_has = False
            assert heat_has == (str(dt).removeprefix("torch.") in _HEAT_DTYPES), dt
        print("dtypes ok")
    """)
    out = subprocess.run([sys.executable, "-c", script],
                         capture_output=True, text=True, timeout=300)
    assert out.stdout.split("\n")[:5] == ["numpy ok", "torch ok", "jax ok", "numpy-read-only ok",
                                         "dtypes ok"], out.stdout + out.stderr


@pytest.mark.parametrize("dtype", ["bfloat16", "uint16", "uint32", "uint64", "float8_e4m3fn"])
def test_a_dtype_heat_has_no_type_for_is_a_type_error_naming_it(dtype):
    torch = pytest.importorskip("torch")
    pa = dlpart.partition(torch.from_numpy(REF).to(getattr(torch, dtype)), (2, 1))
    assert pa.dtype == dtype
    with pytest.raises(TypeError, match=f"heat has no type for {dtype} data"):
        to_heat(pa)
    to_heat(dlpart.partition(REF, (2, 1)))  # float32: heat has it


@pytest.mark.parametrize("device", [(2, 0), (10, 1)], ids=["kDLCUDA:0", "kDLROCM:1"])
def test_gpu_partitions_go_to_heat_as_torch_tensors_through_dlpack(device, monkeypatch):
    """GPU data (cupy, JAX or torch on a GPU, dlpart's own CUDA results) goes to heat as torch
    tensors on its GPU, through DLPack, not as numpy (which cannot hold it): heat is built on
    torch. No GPU here: the partitions are host memory labelled as GPU memory, and torch's
    import of them is recorded instead of run."""
    torch = pytest.importorskip("torch")
    seen = []

    def from_dlpack(x):
        seen.append((str(x.device), x.data_ptr))
        return torch.zeros(x.shape)  # stands in for the tensor on the GPU

    monkeypatch.setattr(torch, "from_dlpack", from_dlpack)
    t = _labelled(REF, device)
    d = to_heat(dlpart.partition(t, (2, 1))).__partitioned__
    for i in range(2):
        assert isinstance(d["partitions"][(i, 0)]["data"], torch.Tensor)
    # The partitions themselves, not copies (they are writable).
    assert seen == [(str(t.device), t.data_ptr + i * REF[:2].nbytes) for i in range(2)]
    # numpy, asked for, cannot hold them, and says so.
    with pytest.raises(dlpart.DeviceError, match=f"numpy cannot hold data on {t.device}"):
        to_heat(dlpart.partition(t, (2, 1)), framework="numpy").__partitioned__


def test_gpu_partitions_heat_is_not_on_are_a_device_error_naming_the_way_out(monkeypatch):
    """heat labels an array with its default device, not the data's: where the program has
    imported heat (a stand-in here: importing heat initialises MPI) and heat's device is not
    the GPU the data is on, `dlpart.DeviceError` names both and the way out; heat on that
    device takes the data."""
    import types

    torch = pytest.importorskip("torch")
    monkeypatch.setattr(torch, "from_dlpack", lambda x: torch.zeros(x.shape, device="meta"))
    on = {"device": "cpu"}
    fake_heat = types.SimpleNamespace(
        get_device=lambda: types.SimpleNamespace(torch_device=on["device"]))
    monkeypatch.setitem(sys.modules, "heat", fake_heat)
    pa = dlpart.partition(_labelled(REF, (2, 0)), (2, 1))
    with pytest.raises(dlpart.DeviceError) as e:
        to_heat(pa).__partitioned__
    assert str(e.value) == (
        "data on kDLCUDA:0 is torch device meta, but heat's default device is cpu, which heat "
        "would label the array with: call ht.use_device('gpu') on the GPU the data is on "
        "before ht.from_partitioned, or copy the array to the host first (its .to('cpu'))")
    on["device"] = "meta"
    d = to_heat(pa).__partitioned__
    assert d["partitions"][(0, 0)]["data"].device == torch.device("meta")


def test_data_torch_cannot_take_is_a_device_error_naming_the_device():
    """Where torch cannot take a partition's device (a GPU without a driver; kDLOneAPI
    memory, which dlpart hands heat no way of holding), `dlpart.DeviceError` names the device
    and the way out, rather than numpy's refusal."""
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():  # else the labelled host memory would go to the GPU
        with pytest.raises(dlpart.DeviceError) as e:
            to_heat(dlpart.partition(_labelled(REF, (2, 0)), (2, 1))).__partitioned__
        message = str(e.value)
        assert message.startswith("heat holds each partition as a torch tensor, and torch "
                                  "cannot take the data on kDLCUDA:0 here ("), message
        assert message.endswith("copy the array to the host first (its .to('cpu'))"), message
    oneapi = dlpart.partition(_labelled(REF, (14, 0)), (2, 1))
    with pytest.raises(dlpart.DeviceError) as e:
        to_heat(oneapi).__partitioned__
    assert str(e.value) == ("heat holds each partition as a torch tensor, which cannot hold "
                            "data on kDLOneAPI:0: copy it to the host or a GPU torch can use "
                            "with its own library first")
