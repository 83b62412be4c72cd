"""`dlpart.prepare_gather` and `dlpart.prepare_scatter` against numpy, called again and again
while the data changes; their errors against those of `dlpart.gather` and `dlpart.scatter`;
the DLPack imports they hold, released exactly once."""

import gc

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import dlpart
from dlpart._core import _testing
from test_gather_scatter import NATIVE, SETTINGS, along, cases, strided
from test_props_partitioned import random_array, same


@settings(max_examples=150, **SETTINGS)
@given(case=cases(names=NATIVE), given_out=st.booleans(), seed=st.integers(0, 2**32 - 1))
def test_prepared_gather_matches_numpy_take_call_after_call(case, given_out, seed):
    name, _, x, axis, idx = case
    rng = np.random.default_rng(seed)
    shape = list(x.shape)
    shape[axis] = len(idx)
    out = random_array(rng, shape, name) if given_out else None
    # negative axes count from the end, as for gather
    g = dlpart.prepare_gather(x, idx, axis=axis - x.ndim if seed % 2 else axis, out=out)
    assert g.axis == axis
    kept = idx.astype(np.int64)
    idx[...] = 0  # read once, at preparation: later changes do not matter
    for _ in range(3):
        x[...] = random_array(rng, x.shape, name)  # new data in the same memory
        assert g() is None
        result = out if given_out else np.from_dlpack(g.out)
        assert same(result, np.take(x, kept, axis=axis))
    if given_out and out.size:
        assert g.out.data_ptr == out.ctypes.data


@settings(max_examples=150, **SETTINGS)
@given(case=cases(names=NATIVE), data=st.data())
def test_prepared_scatter_matches_numpy_fancy_assignment_call_after_call(case, data):
    name, _, out, axis, idx = case
    rng = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1)))
    shape = list(out.shape)
    shape[axis] = len(idx)
    values = strided(data.draw, random_array(rng, shape, name))
    s = dlpart.prepare_scatter(values, idx, out, axis=axis)
    kept = idx.astype(np.int64)
    idx[...] = 0
    for _ in range(3):
        values[...] = random_array(rng, shape, name)
        expect = out.copy()
        expect[along(axis, kept)] = values  # numpy: the last of duplicate indices wins
        assert s() is None
        assert same(out, expect)


@pytest.mark.parametrize("axis", [0, 1, 2])
def test_halo_faces_of_a_strided_cube(axis):
    # The benchmark's use: the two faces along an axis, one prepared gather each, from a cube
    # stored reversed and with gaps, rewritten between steps.
    rng = np.random.default_rng(axis)
    base = rng.random((70, 140, 66)).astype(np.float32)
    x = base[::-1, ::2, 1:-1]
    shape = list(x.shape)
    shape[axis] = 1
    faces = [(i, np.empty(shape, np.float32)) for i in (0, -1)]
    prepared = [dlpart.prepare_gather(x, [i], axis=axis, out=buf) for i, buf in faces]
    for _ in range(3):
        x[...] = rng.random(x.shape).astype(np.float32)
        for g in prepared:
            g()
        for i, buf in faces:
            np.testing.assert_array_equal(buf, np.take(x, [i], axis=axis))


def _error(fn):
    with pytest.raises(Exception) as e:
        fn()
    return e.value


def _same_error(prepared, plain, name):
    """Both raise the same class with the same message (the axis check of the binding names
    its function)."""
    a, b = _error(prepared), _error(plain)
    assert type(a) is type(b), (a, b)
    assert str(a) in (str(b), str(b).replace(f"{name}:", f"prepare_{name}:")), (a, b)
    return a


X = np.arange(24, dtype=np.float32).reshape(4, 6)

GATHERS = {
    "index past the end": ([0, 4], 0, np.zeros((2, 6), np.float32)),
    "index before the start": (np.array([-5, 0], np.int8), 0, None),
    "axis": ([0], 2, None),
    "negative axis": ([0], -3, None),
    "2-d indices": (np.array([[0, 1]]), 0, None),
    "float indices": (np.array([0.0, 1.0]), 0, None),
    "bool indices": ([True], 0, None),
    "out shape": ([0, 1], 0, np.zeros((2, 5), np.float32)),
    "out dtype": ([0, 1], 0, np.zeros((2, 6), np.float64)),
    "read-only out": ([0, 1], 0, np.zeros((2, 6), np.float32)),
}


@pytest.mark.parametrize("what", sorted(GATHERS))
def test_preparing_a_gather_raises_what_gather_raises(what):
    idx, axis, out = GATHERS[what]
    if out is not None:
        out.flags.writeable = what != "read-only out"
        before = out.copy()
    _same_error(lambda: dlpart.prepare_gather(X, idx, axis=axis, out=out),
                lambda: dlpart.gather(X, idx, axis=axis, out=out), "gather")
    if out is not None:
        assert same(out, before), "written before the error"


SCATTERS = {
    "index": (np.ones((4, 2), np.float32), [0, 6], 1),
    "axis": (np.ones((4, 2), np.float32), [0, 1], -3),
    "values shape": (np.ones((3, 4), np.float32), [0, 5], 1),
    "values dtype": (np.ones((4, 2), np.float64), [0, 5], 1),
    "read-only out": (np.ones((4, 2), np.float32), [0, 5], 1),
    "float indices": (np.ones((4, 2), np.float32), [0.5, 1], 1),
}


@pytest.mark.parametrize("what", sorted(SCATTERS))
def test_preparing_a_scatter_raises_what_scatter_raises(what):
    values, idx, axis = SCATTERS[what]
    out = X.copy()
    out.flags.writeable = what != "read-only out"
    _same_error(lambda: dlpart.prepare_scatter(values, idx, out, axis=axis),
                lambda: dlpart.scatter(values, idx, out, axis=axis), "scatter")
    assert same(out, X), "written before the error"


class OnDevice:
    """A copy of `a` whose capsules claim `device` (pinned host memory is host memory)."""

    def __init__(self, a, device):
        self.a, self.device = np.ascontiguousarray(a), device

    def __dlpack__(self, *, stream=None, max_version=None, dl_device=None, copy=None):
        return _testing.make_capsule(self.a.tobytes(), list(self.a.shape), device=self.device)

    def __dlpack_device__(self):
        return self.device


PINNED, CUDA = (3, 0), (2, 0)


def test_device_errors_are_those_of_gather_and_scatter():
    # Device memory against host memory: a DeviceError naming both, before anything is read.
    err = _same_error(
        lambda: dlpart.prepare_scatter(OnDevice(np.ones((4, 2), np.float32), CUDA), [0, 1],
                                       X.copy(), axis=1),
        lambda: dlpart.scatter(OnDevice(np.ones((4, 2), np.float32), CUDA), [0, 1], X.copy(),
                               axis=1), "scatter")
    assert isinstance(err, dlpart.DeviceError) and "kDLCUDA:0 -> kDLCPU" in str(err)
    gpu_out = OnDevice(np.zeros((1, 6), np.float32), CUDA)
    err = _same_error(lambda: dlpart.prepare_gather(X, [0], out=gpu_out),
                      lambda: dlpart.gather(X, [0], out=gpu_out), "gather")
    assert isinstance(err, dlpart.DeviceError) and "kDLCPU -> kDLCUDA:0" in str(err)
    if dlpart.backend_status("kDLCUDA:0") is None:
        return  # a real CUDA backend: host bytes must not pass for device memory there
    err = _same_error(lambda: dlpart.prepare_gather(OnDevice(X, CUDA), [0]),
                      lambda: dlpart.gather(OnDevice(X, CUDA), [0]), "gather")
    assert isinstance(err, dlpart.BackendUnavailableError)


@pytest.mark.parametrize("device", [PINNED, (13, 0), (11, 0)])  # pinned, managed, ROCm host
def test_host_memory_of_any_kind_is_read_and_written_in_place(device):
    there = dlpart.from_dlpack(OnDevice(X, device))  # dlpart's copy of X, labelled `device`
    s = dlpart.prepare_scatter(np.full((1, 6), -1, np.float32), [2], there)
    s()
    expect = X.copy()
    expect[2] = -1
    np.testing.assert_array_equal(np.from_dlpack(there), expect)
    out = np.zeros((2, 6), np.float32)
    g = dlpart.prepare_gather(there, [2, 0], out=out)
    g()
    np.testing.assert_array_equal(out, expect[[2, 0]])
    assert g.out.data_ptr == out.ctypes.data


def test_operands_sharing_memory_are_refused_and_disjoint_views_run():
    x = X.copy()
    with pytest.raises(BufferError, match="shares memory with the source"):
        dlpart.prepare_gather(x, [0, 1], out=x[2:])
    with pytest.raises(BufferError, match="shares memory with the values"):
        dlpart.prepare_scatter(x[::-1], [0, 1, 2, 3], x)
    with pytest.raises(BufferError, match="more than once"):
        dlpart.prepare_gather(X, [0], out=np.lib.stride_tricks.as_strided(x, (1, 6), (0, 0)))
    assert same(x, X)
    # A periodic halo inside one array: ghost rows 0 and 3 from interior rows 2 and 1.
    g = dlpart.prepare_gather(x[1:3], [1, 0])
    s = dlpart.prepare_scatter(g.out, [0, 3], x)
    g()
    s()
    np.testing.assert_array_equal(x[[0, 3]], X[[2, 1]])


def test_partitioned_arrays_are_refused():
    p = dlpart.partition(X, tiling=(2, 1))
    with pytest.raises(TypeError, match="prepare_gather takes single arrays"):
        dlpart.prepare_gather(p, [0])
    with pytest.raises(TypeError, match="prepare_scatter takes single arrays"):
        dlpart.prepare_scatter(np.zeros((1, 6), np.float32), [0], p)


def test_repr_properties_and_call():
    g = dlpart.prepare_gather(X, [3, -1], axis=0)
    assert repr(g) == ("dlpart.PreparedGather(axis=0, indices=2, source=(4, 6), out=(2, 6), "
                       "dtype='float32', device='kDLCPU')")
    assert isinstance(g, dlpart.PreparedGather) and isinstance(g.out, dlpart.Tensor)
    out = np.zeros((4, 6), np.float32)
    s = dlpart.prepare_scatter(np.ones((4, 1), np.float32), [2], out, axis=-1)
    assert repr(s) == ("dlpart.PreparedScatter(axis=1, indices=1, values=(4, 1), out=(4, 6), "
                       "dtype='float32', device='kDLCPU')")
    assert s.axis == 1 and s.out.data_ptr == out.ctypes.data
    with pytest.raises(TypeError):
        g(1)  # type: ignore[call-arg]
    with pytest.raises(TypeError):
        dlpart.PreparedGather()  # type: ignore[call-arg]


class Counted:
    """A producer whose capsules carry counted deleters (`_testing.deleter_calls`)."""

    def __init__(self, a):
        self.a = np.ascontiguousarray(a)

    def __dlpack__(self, *, stream=None, max_version=None, dl_device=None, copy=None):
        return _testing.make_capsule(self.a.tobytes(), list(self.a.shape),
                                     dtype={"f": (2, 32, 1), "i": (0, 64, 1)}[self.a.dtype.kind])

    def __dlpack_device__(self):
        return (1, 0)


def test_each_import_is_held_until_the_object_goes_and_deleted_once():
    gc.collect()
    before = _testing.deleter_calls()
    x, idx, out = (Counted(X), Counted(np.array([3, 0])), Counted(np.zeros((2, 6), np.float32)))
    g = dlpart.prepare_gather(x, idx, out=out)
    gc.collect()
    # The indices were copied into dlpart's memory: their import is released at once.
    assert _testing.deleter_calls() == before + 1
    g()
    np.testing.assert_array_equal(np.from_dlpack(g.out), X[[3, 0]])
    s = dlpart.prepare_scatter(Counted(np.ones((1, 6), np.float32)), [1], g.out)
    del x, idx, out
    gc.collect()
    assert _testing.deleter_calls() == before + 1, "the objects hold their imports"
    s()
    del g
    gc.collect()
    assert _testing.deleter_calls() == before + 2, "x released; out still held by s"
    np.testing.assert_array_equal(np.from_dlpack(s.out)[1], np.ones(6))
    del s
    gc.collect()
    assert _testing.deleter_calls() == before + 4, "values and out, once each"


def test_jax_arrays_are_sources_as_for_gather_and_refused_as_outs():
    jnp = pytest.importorskip("jax.numpy")
    x = jnp.arange(24, dtype=jnp.float32).reshape(4, 6)
    g = dlpart.prepare_gather(x, jnp.array([3, -4]), axis=0)
    g()
    np.testing.assert_array_equal(np.from_dlpack(g.out), np.asarray(x)[[3, 0]])
    out = jnp.zeros((1, 6), jnp.float32)
    err = _same_error(lambda: dlpart.prepare_gather(x, [0], out=out),
                      lambda: dlpart.gather(x, [0], out=out), "gather")
    assert isinstance(err, BufferError) and "read-only" in str(err)


def test_array_api_strict_arrays_work_as_for_gather():
    xp = pytest.importorskip("array_api_strict")
    x = xp.reshape(xp.arange(12, dtype=xp.float64), (3, 4))
    out = xp.zeros((2, 4), dtype=xp.float64)
    g = dlpart.prepare_gather(x, xp.asarray([2, -3]), axis=0, out=out)
    g()
    np.testing.assert_array_equal(np.asarray(out), np.arange(12.0).reshape(3, 4)[[2, 0]])
    target = xp.zeros((3, 4), dtype=xp.float64)
    dlpart.prepare_scatter(out, [1, 1], target)()
    np.testing.assert_array_equal(np.asarray(target)[1], np.arange(4.0))
