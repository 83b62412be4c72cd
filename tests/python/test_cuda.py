"""CUDA: zero-copy interop with torch/cupy/jax, device-local kernels, stream ordering.

Skipped (with the reason) unless dlpart was built with the `cuda` feature and a GPU is present;
benches/gpu/run.sh runs these on a GPU machine.
"""

import os

import numpy as np
import pytest

import dlpart

pytestmark = pytest.mark.cuda

_REASON = dlpart.backend_status("kDLCUDA:0")
if _REASON is not None:
    if os.environ.get("DLPART_REQUIRE_CUDA"):
        # benches/gpu/run.sh sets this on the GPU machine: there a missing backend is a failure.
        raise RuntimeError(f"DLPART_REQUIRE_CUDA is set but there is no CUDA backend: {_REASON}")
    pytest.skip(f"no CUDA backend: {_REASON}", allow_module_level=True)

DTYPES = ["bool", "int8", "uint8", "int16", "float16", "int32", "float32", "int64", "float64",
          "complex64", "complex128"]


def _torch():
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("torch sees no CUDA device")
    return torch


def _cupy():
    cp = pytest.importorskip("cupy")
    return cp


def random_array(shape, dtype, seed=0):
    rng = np.random.default_rng(seed)
    return (rng.standard_normal(shape) * 100).astype(dtype)


def test_torch_round_trip_is_zero_copy():
    torch = _torch()
    x = torch.arange(24, dtype=torch.float32, device="cuda").reshape(4, 6)
    t = dlpart.from_dlpack(x)
    assert t.device == "kDLCUDA:0" and t.data_ptr == x.data_ptr()
    y = torch.from_dlpack(t)
    assert y.data_ptr() == x.data_ptr()
    assert torch.equal(y, x)


def test_cupy_round_trip_is_zero_copy():
    cp = _cupy()
    x = cp.arange(24, dtype=cp.float64).reshape(4, 6)[:, ::2]
    t = dlpart.from_dlpack(x)
    assert t.data_ptr == x.data.ptr
    y = cp.from_dlpack(t)
    assert y.data.ptr == x.data.ptr
    cp.testing.assert_array_equal(y, x)


def test_jax_cuda_round_trip():
    jax = pytest.importorskip("jax")
    try:
        gpu = jax.devices("gpu")[0]
    except RuntimeError:
        pytest.skip("jax sees no GPU")
    x = jax.device_put(jax.numpy.arange(64, dtype=jax.numpy.float32), gpu)
    t = dlpart.from_dlpack(x)
    assert t.data_ptr == x.unsafe_buffer_pointer()
    # JAX's legacy capsule carries no read-only flag, so the import is read-only, and JAX asks
    # for a legacy capsule back, which cannot say so: refused, and a copy goes instead.
    assert t.readonly
    with pytest.raises(BufferError, match="max_version"):
        jax.numpy.from_dlpack(t)
    y = jax.numpy.from_dlpack(t.copy())
    assert y.devices() == {gpu}
    np.testing.assert_array_equal(np.asarray(y), np.arange(64, dtype=np.float32))


def test_jax_gpu_partitions_go_back_to_jax_on_their_gpu():
    """JAX's arrays import read-only (legacy capsules carry no flag), which JAX cannot take back
    through DLPack: the dict hands out copies on the same GPU, equal to the data."""
    jax = pytest.importorskip("jax")
    try:
        gpu = jax.devices("gpu")[0]
    except RuntimeError:
        pytest.skip("jax sees no GPU")
    ref = np.arange(8 * 6, dtype=np.float32).reshape(8, 6)
    for tiling in ((2, 1), (2, 2)):  # contiguous blocks, strided ones
        pa = dlpart.partition(jax.device_put(ref, gpu), tiling)
        for e in pa.__partitioned__["partitions"].values():
            assert isinstance(e["data"], jax.Array) and e["data"].devices() == {gpu}
            (r0, c0), (nr, nc) = e["start"], e["shape"]
            np.testing.assert_array_equal(np.asarray(e["data"]), ref[r0:r0 + nr, c0:c0 + nc])


@pytest.mark.parametrize("dtype", DTYPES)
def test_repartition_on_gpu_matches_numpy(dtype):
    cp = _cupy()
    ref = random_array((37, 53), dtype, seed=1)
    x = cp.asarray(ref)
    pa = dlpart.partition(x, (3, 2))
    out = pa.repartition(splits=[[0, 5, 36, 37], [0, 1, 20, 53]])
    for p in out.partitions.values():
        assert p.tensor.device == "kDLCUDA:0"
    got = cp.asnumpy(cp.from_dlpack(out.assemble()))
    np.testing.assert_array_equal(got, ref)
    bc = pa.repartition(block_cyclic=(8, 16), devices=["kDLCUDA:0"] * 4)
    np.testing.assert_array_equal(cp.asnumpy(cp.from_dlpack(bc.assemble())), ref)


@pytest.mark.parametrize("dtype", DTYPES)
def test_gather_scatter_on_gpu_match_numpy(dtype):
    cp = _cupy()
    ref = random_array((50, 7), dtype, seed=2)
    idx = np.random.default_rng(3).integers(-50, 50, size=80)
    x = cp.asarray(ref)
    got = cp.asnumpy(cp.from_dlpack(dlpart.gather(x, cp.asarray(idx), axis=0)))
    np.testing.assert_array_equal(got, np.take(ref, idx, axis=0))
    out_ref = np.zeros_like(ref)
    vals = random_array((7, 80), dtype, seed=4).T.copy()
    out_ref[idx] = vals
    out = cp.zeros_like(x)
    dlpart.scatter(cp.asarray(vals), cp.asarray(idx), out, axis=0)
    np.testing.assert_array_equal(cp.asnumpy(out), out_ref)


def test_poisoned_output_is_fully_overwritten():
    cp = _cupy()
    ref = random_array((64, 64), "float32", seed=5)
    pa = dlpart.partition(cp.asarray(ref), (4, 1))
    out = pa.repartition((1, 4))
    whole = cp.full((64, 64), cp.nan, dtype=cp.float32)
    for p in out.partitions.values():
        r0, c0 = p.start
        whole[r0:r0 + p.shape[0], c0:c0 + p.shape[1]] = cp.from_dlpack(p.tensor)
    np.testing.assert_array_equal(cp.asnumpy(whole), ref)


def test_producer_stream_is_respected():
    torch = _torch()
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        a = torch.ones(4096, 4096, device="cuda")
        for _ in range(20):  # long-running work queued on the producer's stream
            a = a @ a / 4096
        a.fill_(7.0)
        t = dlpart.from_dlpack(a)  # dlpart hands its own stream; torch must order it
    out = dlpart.partition(t, (2, 1)).repartition((1, 2))
    got = torch.cat([torch.from_dlpack(p.tensor) for p in out.partitions.values()], dim=1)
    torch.cuda.synchronize()
    assert bool((got == 7.0).all())


def test_transfers_round_trip():
    ref = np.arange(1000, dtype=np.float32).reshape(10, 100)[:, ::3]
    t = dlpart.from_dlpack(ref)
    d = t.to("kDLCUDA:0")
    assert d.device == "kDLCUDA:0"
    back = d.to("kDLCPU")
    np.testing.assert_array_equal(np.from_dlpack(back), ref)
    with pytest.raises(dlpart.DeviceError):
        dlpart.partition(t, (2, 1)).repartition((1, 2), devices="kDLCUDA:0")
