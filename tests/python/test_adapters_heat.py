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


REF = np.arange(24, dtype=np.float32).reshape(4, 6)


def _producers():
    """(array, its data pointer) of each framework here, holding REF, by framework name."""
    x = REF.copy()
    out = [pytest.param(x, x.ctypes.data, id="numpy")]
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
    numpy (jax's too, which heat would refuse), over the same memory."""
    torch_in = type(x).__module__.startswith("torch")
    d = to_heat(dlpart.partition(x, (2, 1))).__partitioned__
    for i in range(2):
        data = d["partitions"][(i, 0)]["data"]
        assert type(data) is (type(x) if torch_in else np.ndarray), type(data)
        np.testing.assert_array_equal(data.numpy() if torch_in else data, REF[2 * i:2 * i + 2])
        addr = data.data_ptr() if torch_in else data.ctypes.data
        assert addr == ptr + i * REF[:2].nbytes
    # a framework asked for is used as it is
    d = to_heat(dlpart.partition(x), framework="dlpart").__partitioned__
    assert isinstance(d["partitions"][(0, 0)]["data"], dlpart.Tensor)


def test_heat_reads_to_heat_of_numpy_torch_and_jax_arrays():
    if importlib.util.find_spec("heat") is None:  # looked up, not imported (see above)
        pytest.skip("heat is not installed")
    script = textwrap.dedent("""
        import numpy as np, torch, jax.numpy as jnp, heat as ht, dlpart
        from dlpart.adapters.heat import to_heat
        ref = np.arange(24, dtype=np.float32).reshape(4, 6)
        x, t, j = ref.copy(), torch.from_numpy(ref.copy()), jnp.asarray(ref)
        for name, a, ptr in [("numpy", x, x.ctypes.data), ("torch", t, t.data_ptr()),
                             ("jax", j, j.unsafe_buffer_pointer())]:
            y = ht.from_partitioned(to_heat(dlpart.partition(a)))
            assert y.shape == (4, 6) and y.split is None, (name, y.shape, y.split)
            assert y.larray.data_ptr() == ptr, name  # heat holds the producer's memory
            np.testing.assert_array_equal(y.numpy(), ref)
            print(name, "ok")
    """)
    out = subprocess.run([sys.executable, "-c", script],
                         capture_output=True, text=True, timeout=300)
    assert out.stdout.split("\n")[:3] == ["numpy ok", "torch ok", "jax ok"], out.stdout + out.stderr
