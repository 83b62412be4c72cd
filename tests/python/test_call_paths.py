"""The short paths of a call on numpy arrays: numpy's `__dlpack__` asked through its method,
indices converted by the extension, small gathers and scatters that keep the GIL. Each import
must still release what it took exactly once, also when the call fails after it."""

import gc
import sys
import threading

import numpy as np
import pytest

import dlpart
from dlpart import _core
from dlpart._core import _testing

F32 = np.float32


def refcounts(*arrays):
    gc.collect()
    return [sys.getrefcount(a) for a in arrays]


def test_a_numpy_import_is_released_once_and_keeps_the_write_flag():
    a = np.arange(12, dtype=F32).reshape(3, 4)[:, 1:3]
    frozen = np.arange(6.0)
    frozen.flags.writeable = False
    before = refcounts(a, frozen)
    t, r = dlpart.from_dlpack(a), dlpart.from_dlpack(frozen)
    assert not t.readonly and r.readonly
    assert t.data_ptr == a.ctypes.data and t.shape == (3, 2) and t.strides == (4, 1)
    np.testing.assert_array_equal(np.from_dlpack(t), a)
    assert refcounts(a, frozen)[0] > before[0]  # the export holds the array
    del t, r
    assert refcounts(a, frozen) == before


def test_a_numpy_subclass_is_asked_through_its_own_method():
    calls = []

    class Logged(np.ndarray):
        def __dlpack__(self, **kwargs):
            calls.append(sorted(kwargs))
            return super().__dlpack__(**kwargs)

    x = np.arange(4.0).view(Logged)
    np.testing.assert_array_equal(np.from_dlpack(dlpart.from_dlpack(x)), np.arange(4.0))
    assert calls and "max_version" in calls[0]


@pytest.mark.parametrize("face", [8, 256])  # under and over the bytes gathered with the GIL
def test_gathers_and_scatters_release_every_import_also_when_they_fail(face):
    x = np.arange(4 * face * face, dtype=F32).reshape(4, face, face)
    idx = np.array([-1], dtype=np.int64)
    out = np.empty((1, face, face), F32)
    bad = np.array([4], dtype=np.int64)
    frozen = np.empty_like(out)
    frozen.flags.writeable = False
    before = refcounts(x, idx, out, bad, frozen)
    for _ in range(3):
        got = dlpart.gather(x, idx, axis=0, out=out)
        assert got.data_ptr == out.ctypes.data
        del got
    np.testing.assert_array_equal(out, x[-1:])
    with pytest.raises(IndexError, match="4"):
        dlpart.gather(x, bad, axis=0, out=out)
    with pytest.raises(Exception, match="(?i)read-only|readonly"):
        dlpart.gather(x, idx, axis=0, out=frozen)
    with pytest.raises(IndexError, match="4"):
        dlpart.scatter(out, bad, x, axis=0)
    expect = x.copy()
    expect[-1] = -7
    dlpart.scatter(np.full_like(out, -7), idx, x, axis=0)
    np.testing.assert_array_equal(x, expect)
    assert refcounts(x, idx, out, bad, frozen) == before


def test_indices_that_are_no_array_are_converted_by_the_extension():
    x = np.arange(20.0).reshape(5, 4)
    for indices in ([0, -1, 2], (3,), range(2), 4, np.int32(-2)):
        want = np.take(x, indices, axis=0)  # one index drops the axis
        np.testing.assert_array_equal(np.from_dlpack(dlpart.gather(x, indices)), want)
        np.testing.assert_array_equal(np.from_dlpack(_core.gather(x, indices, 0, None)), want)
    out = np.zeros(4)
    dlpart.scatter(np.array([9.0]), [2], out)
    np.testing.assert_array_equal(out, [0, 0, 9, 0])
    for bad in ([1.5], ["a"], [True]):
        with pytest.raises(TypeError, match="indices must be integers"):
            dlpart.gather(x, bad)


def test_python_index_sequences_keep_their_values_or_raise():
    """Python ints are never cast into other values: numpy alone would make [] float64, a mix
    of negative and above-int64 ints float64, and 2**64 - 1 cast to int64 -1 (the last row)."""
    x = np.arange(20.0).reshape(5, 4)
    for empty in ([], ()):
        got = np.from_dlpack(dlpart.gather(x, empty))
        np.testing.assert_array_equal(got, np.take(x, np.array([], np.intp), axis=0))
        out = x.copy()
        dlpart.scatter(np.zeros((0, 4)), empty, out)
        np.testing.assert_array_equal(out, x)
    for huge in ([2**64 - 1], [0, 2**63], [-1, 2**63], [-(2**70)]):
        out = x.copy()
        with pytest.raises(IndexError, match="out of bounds"):
            dlpart.gather(x, huge)
        with pytest.raises(IndexError, match="out of bounds"):
            dlpart.scatter(np.full((len(huge), 4), -1.0), huge, out)
        np.testing.assert_array_equal(out, x)
    with pytest.raises(IndexError, match="out of bounds"):
        dlpart.gather(x, 2**64 - 1)
    with pytest.raises(ValueError, match=r"indices must be one index \(0-d\) or a 1-d list: .* "
                                         r"not supported .*: shape \(2, 2\)"):
        dlpart.gather(x, [[0, 1], [2, 3]])


def test_a_failed_index_conversion_still_releases_the_source_once():
    gc.collect()
    before = _testing.deleter_calls()
    cap = _testing.make_capsule(np.arange(6, dtype=F32).tobytes(), [6], strides=[1])
    with pytest.raises(TypeError, match="indices must be integers"):
        dlpart.gather(cap, [0.5])
    del cap
    gc.collect()
    assert _testing.deleter_calls() == before + 1


def test_small_gathers_from_many_threads_are_right():
    x = np.arange(64 * 16 * 16, dtype=F32).reshape(64, 16, 16)
    errors = []

    def work(k):
        out = np.empty((1, 16, 16), F32)
        idx = np.array([k], dtype=np.int64)
        for _ in range(200):
            dlpart.gather(x, idx, axis=0, out=out)
            if not np.array_equal(out[0], x[k]):
                errors.append(k)
                return

    threads = [threading.Thread(target=work, args=(k,)) for k in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
