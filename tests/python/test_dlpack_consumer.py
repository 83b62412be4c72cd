"""dlpart.from_dlpack as a DLPack consumer, fed field by field through a counted producer."""

import gc

import numpy as np
import pytest

import dlpart
from conftest import cuda_device_count
from dlpart._core import _testing

F32 = (2, 32, 1)


def counted(fn):
    """Runs fn() and returns (result or exception, deleter calls it caused)."""
    gc.collect()
    before = _testing.deleter_calls()
    try:
        out = fn()
    except Exception as e:  # noqa: BLE001 - the caller inspects it
        out = e
    gc.collect()
    return out, _testing.deleter_calls() - before


def f32_bytes(values):
    return np.asarray(values, dtype=np.float32).tobytes()


def test_one_deleter_call_per_import_versioned_and_legacy():
    for version in [(1, 0), (1, 3), (1, 9), None]:
        gc.collect()
        before = _testing.deleter_calls()
        cap = _testing.make_capsule(f32_bytes([1, 2, 3]), [3], strides=[1], version=version)
        t = dlpart.from_dlpack(cap)
        np.testing.assert_array_equal(np.from_dlpack(t), [1, 2, 3])
        gc.collect()
        assert _testing.deleter_calls() == before  # `t` still holds it
        del t, cap
        gc.collect()
        assert _testing.deleter_calls() == before + 1, version


def test_deleter_runs_exactly_once_when_the_last_view_goes():
    gc.collect()
    before = _testing.deleter_calls()
    cap = _testing.make_capsule(f32_bytes(range(6)), [2, 3], strides=[3, 1])
    t = dlpart.from_dlpack(cap)
    views = [np.from_dlpack(t) for _ in range(3)]
    del cap, t
    gc.collect()
    assert _testing.deleter_calls() == before
    del views
    gc.collect()
    assert _testing.deleter_calls() == before + 1


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(version=(2, 0)), "version 2.0"),
        (dict(version=(0, 9)), "version 0.9"),
        (dict(dtype=(2, 32, 4)), "lanes=4"),
        (dict(dtype=(99, 8, 1)), "code=99"),
        (dict(dtype=(2, 24, 1)), "bits=24"),
        (dict(device=(99, 0)), "99"),
        (dict(null_shape=True), "NULL shape"),
        (dict(null_data=True), "NULL data"),
        (dict(ndim=-1), "ndim -1"),
    ],
)
def test_garbage_is_refused_and_still_deleted_once(kwargs, match):
    def run():
        cap = _testing.make_capsule(f32_bytes([1, 2]), [2], strides=[1], **kwargs)
        return dlpart.from_dlpack(cap)

    out, calls = counted(run)
    assert isinstance(out, BufferError), out
    assert match in str(out)
    assert calls == 1


def test_negative_extent_is_refused():
    out, calls = counted(lambda: dlpart.from_dlpack(
        _testing.make_capsule(f32_bytes([1]), [-1], strides=[1])))
    assert isinstance(out, BufferError) and "(-1,)" in str(out)
    assert calls == 1


def test_capsule_consumed_twice_raises():
    cap = _testing.make_capsule(f32_bytes([1]), [1], strides=[1])
    t = dlpart.from_dlpack(cap)
    with pytest.raises(BufferError, match="already consumed"):
        dlpart.from_dlpack(cap)
    np.testing.assert_array_equal(np.from_dlpack(t), [1])


def test_byte_offset_is_applied():
    data = f32_bytes(range(8))
    t = dlpart.from_dlpack(_testing.make_capsule(data, [2, 2], strides=[2, 1], byte_offset=16))
    np.testing.assert_array_equal(np.from_dlpack(t), np.arange(8, dtype=np.float32)[4:].reshape(2, 2))


def test_null_strides_mean_c_order():
    t = dlpart.from_dlpack(_testing.make_capsule(f32_bytes(range(6)), [2, 3], strides=None))
    assert t.strides == (3, 1)
    np.testing.assert_array_equal(np.from_dlpack(t), np.arange(6, dtype=np.float32).reshape(2, 3))


def test_negative_and_zero_strides_match_numpy():
    ref = np.arange(12, dtype=np.float32).reshape(3, 4)
    # the last row, read backwards along axis 0 and 1: data points at element [2, 3]
    t = dlpart.from_dlpack(
        _testing.make_capsule(f32_bytes(ref.ravel()), [3, 4], strides=[-4, -1], byte_offset=44)
    )
    np.testing.assert_array_equal(np.from_dlpack(t), ref[::-1, ::-1])
    b = dlpart.from_dlpack(_testing.make_capsule(f32_bytes([7, 8, 9]), [4, 3], strides=[0, 1]))
    np.testing.assert_array_equal(np.from_dlpack(b), np.broadcast_to([7, 8, 9], (4, 3)))


def test_0d_with_null_shape_and_zero_size():
    t = dlpart.from_dlpack(_testing.make_capsule(f32_bytes([4.5]), [], null_shape=True))
    assert t.shape == () and float(np.from_dlpack(t)) == 4.5
    z = dlpart.from_dlpack(_testing.make_capsule(b"", [0, 5], strides=[5, 1], null_data=True))
    assert z.shape == (0, 5) and z.size == 0 and z.data_ptr == 0
    assert np.from_dlpack(z).shape == (0, 5)


def test_unaligned_data():
    raw = np.arange(20, dtype=np.uint8)
    vals = raw[1:17].view(np.uint8)  # 1-byte aligned pointer
    t = dlpart.from_dlpack(
        _testing.make_capsule(vals.tobytes(), [4], strides=[1], dtype=F32, byte_offset=0)
    )
    np.testing.assert_array_equal(np.from_dlpack(t), vals.view(np.float32))
    odd = dlpart.from_dlpack(
        _testing.make_capsule(bytes(range(17)), [4], strides=[1], dtype=F32, byte_offset=1)
    )
    np.testing.assert_array_equal(np.from_dlpack(odd), np.frombuffer(bytes(range(1, 17)), np.float32))


def test_readonly_flag_is_honoured():
    t = dlpart.from_dlpack(_testing.make_capsule(f32_bytes([1, 2]), [2], strides=[1], flags=1))
    assert t.readonly
    with pytest.raises(BufferError):
        t.__dlpack__()  # legacy path cannot carry read-only
    assert not np.from_dlpack(t).flags.writeable


def test_every_dtype_code_round_trips():
    cases = {
        (6, 8): "bool", (0, 8): "int8", (0, 16): "int16", (0, 32): "int32", (0, 64): "int64",
        (1, 8): "uint8", (1, 16): "uint16", (1, 32): "uint32", (1, 64): "uint64",
        (2, 16): "float16", (2, 32): "float32", (2, 64): "float64", (4, 16): "bfloat16",
        (5, 64): "complex64", (5, 128): "complex128", (10, 8): "float8_e4m3fn",
        (12, 8): "float8_e5m2",
    }
    from dlpack_ctypes import read

    for (code, bits), name in cases.items():
        nbytes = bits // 8
        t = dlpart.from_dlpack(
            _testing.make_capsule(bytes(2 * nbytes), [2], strides=[1], dtype=(code, bits, 1))
        )
        assert t.dtype == name and t.itemsize == nbytes
        _, f = read(t.__dlpack__(max_version=(1, 3)))
        assert f["dtype"] == (code, bits, 1)


def test_objects_without_dlpack_raise_type_error():
    for obj in [object(), [1, 2, 3], np.float64(1.0), "kDLCPU"]:
        with pytest.raises(TypeError, match=type(obj).__name__):
            dlpart.from_dlpack(obj)


class Producer:
    """A producer whose __dlpack__ misbehaves in a chosen way."""

    def __init__(self, result=None, device=(1, 0), legacy=False, raises=None):
        self.result, self.device, self.legacy, self.raises, self.calls = result, device, legacy, raises, []

    def __dlpack__(self, **kw):
        self.calls.append(kw)
        if self.legacy and "max_version" in kw:
            raise TypeError("unexpected keyword argument 'max_version'")
        if self.raises:
            raise self.raises
        return self.result() if callable(self.result) else self.result

    def __dlpack_device__(self):
        return self.device


def test_type_error_fallback_to_legacy_call():
    p = Producer(lambda: _testing.make_capsule(f32_bytes([1, 2]), [2], strides=[1], version=None), legacy=True)
    t = dlpart.from_dlpack(p)
    assert p.calls[0]["max_version"] == (1, 3) and "max_version" not in p.calls[-1]
    np.testing.assert_array_equal(np.from_dlpack(t), [1, 2])


def test_keywords_passed_to_the_producer():
    def cap():
        return _testing.make_capsule(f32_bytes([1, 2]), [2], strides=[1])

    cases = [
        ({}, {"stream": None, "max_version": (1, 3)}),
        ({"copy": True}, {"stream": None, "max_version": (1, 3), "copy": True}),
        ({"copy": False}, {"stream": None, "max_version": (1, 3), "copy": False}),
    ]
    for kwargs, expected in cases:
        p = Producer(cap)
        dlpart.from_dlpack(p, **kwargs)
        assert p.calls == [expected], kwargs
        assert type(p.calls[0]["max_version"]) is tuple
    # A producer on another host-accessible device is asked to move its data here.
    p = Producer(cap, device=(3, 0))
    dlpart.from_dlpack(p, device="kDLCPU")
    assert p.calls[0] == {"stream": HOST_STREAM, "max_version": (1, 3), "dl_device": (1, 0)}


# Pinned (kDLCUDAHost) and managed (kDLCUDAManaged) memory, which CUDA kernels write and the
# host reads directly: where CUDA is, the producer is handed the legacy stream (1) and the
# host waits for that stream before reading; without CUDA no producer can have GPU work
# queued, and the stream stays None.
CUDA_HERE = dlpart.backend_status("kDLCUDA:0") is None
HOST_STREAM = 1 if CUDA_HERE else None


@pytest.mark.parametrize("device", [(3, 0), (13, 0)])
def test_host_memory_cuda_writes_is_imported_after_the_legacy_stream(device):
    p = Producer(lambda: _testing.make_capsule(f32_bytes([1, 2]), [2], strides=[1]), device=device)
    t = dlpart.from_dlpack(p)
    assert p.calls == [{"stream": HOST_STREAM, "max_version": (1, 3)}]
    np.testing.assert_array_equal(np.from_dlpack(t), [1, 2])


def test_numpy_arrays_and_subclasses_import_through_dlpack():
    class Sub(np.ndarray):
        calls = 0

        def __dlpack__(self, **kw):
            Sub.calls += 1
            return super().__dlpack__(**kw)

    base = np.arange(6, dtype=np.float32).reshape(2, 3)
    for x in [base, base[:, 1:], base.T, base.view(Sub)]:
        t = dlpart.from_dlpack(x)
        assert t.shape == x.shape and t.data_ptr == x.ctypes.data
        np.testing.assert_array_equal(np.from_dlpack(t), x)
    assert Sub.calls == 1  # a subclass's own __dlpack__ is called
    ro = base.copy()
    ro.flags.writeable = False
    assert dlpart.from_dlpack(ro).readonly
    with pytest.raises(cuda_refusal()):
        dlpart.from_dlpack(base, copy=False, device="kDLCUDA:0")


def test_copy_is_done_here_when_a_legacy_producer_cannot():
    data = np.arange(2, dtype=np.float32)
    p = Producer(lambda: _testing.make_capsule(data.tobytes(), [2], strides=[1], version=None), legacy=True)
    t = dlpart.from_dlpack(p, copy=True)
    np.testing.assert_array_equal(np.from_dlpack(t), data)


@pytest.mark.parametrize(
    "result, exc, match",
    [
        (42, TypeError, "not a DLPack capsule"),
        (None, TypeError, "not a DLPack capsule"),
    ],
)
def test_garbage_return_values(result, exc, match):
    with pytest.raises(exc, match=match):
        dlpart.from_dlpack(Producer(result))


def test_wrongly_named_capsule_is_refused():
    import ctypes

    ctypes.pythonapi.PyCapsule_New.restype = ctypes.py_object
    ctypes.pythonapi.PyCapsule_New.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]
    cap = ctypes.pythonapi.PyCapsule_New(ctypes.c_void_p(1234), b"not_dltensor", None)
    with pytest.raises(BufferError, match="not_dltensor"):
        dlpart.from_dlpack(Producer(cap))


def test_producer_errors_propagate():
    with pytest.raises(BufferError, match="nope"):
        dlpart.from_dlpack(Producer(raises=BufferError("nope")))


def test_bad_dlpack_device_is_refused():
    # the message names the producer's type and what it returned
    with pytest.raises(BufferError, match=r"Producer.__dlpack_device__\(\) returned \(77, 0\): "
                                          r"an unknown device"):
        dlpart.from_dlpack(Producer(device=(77, 0)))
    for bad in ["cpu", (1,), (1.5, 0), None, (2**40, 0)]:
        with pytest.raises(BufferError, match=r"returned .*: not a \(type, id\) pair of ints"):
            dlpart.from_dlpack(Producer(device=bad))


def test_copy_false_refuses_a_producer_that_copied():
    p = Producer(lambda: _testing.make_capsule(f32_bytes([1]), [1], strides=[1], flags=2))
    out, calls = counted(lambda: dlpart.from_dlpack(p, copy=False))
    assert isinstance(out, BufferError) and calls == 1


def test_device_argument_is_parsed_and_checked():
    a = np.arange(3.0)
    assert dlpart.from_dlpack(a, device="kDLCPU").data_ptr == a.ctypes.data
    assert dlpart.from_dlpack(a, device=dlpart.Device("kDLCPU")).data_ptr == a.ctypes.data
    with pytest.raises(dlpart.DeviceError, match="'cudaa'|\"cudaa\""):
        dlpart.from_dlpack(a, device="cudaa")
    # 'cuda' names kDLCUDA:0, as in torch and cupy: numpy refuses to put its data there, so
    # dlpart copies it there where a GPU is, and names the device where no CUDA driver is.
    for name in ("cuda", "kDLCUDA:0"):
        if cuda_device_count():
            c = dlpart.from_dlpack(a, device=name)
            assert str(c.device) == "kDLCUDA:0"
            np.testing.assert_array_equal(np.from_dlpack(c.to("cpu")), a)
            continue
        with pytest.raises(dlpart.BackendUnavailableError, match="kDLCUDA:0"):
            dlpart.from_dlpack(a, device=name)


def cuda_refusal():
    """What importing numpy's data onto kDLCUDA:0 with copy=False raises: numpy's `BufferError`
    where the GPU is here (a move is a copy), `BackendUnavailableError` (asked of no producer)
    where no CUDA driver is."""
    return BufferError if cuda_device_count() else dlpart.BackendUnavailableError


def test_big_endian_is_refused():
    with pytest.raises(BufferError):
        dlpart.from_dlpack(np.arange(3, dtype=">i4"))


def test_many_cycles_leave_memory_flat():
    import resource

    a = np.arange(1024, dtype=np.float32)
    gc.collect()  # exports an earlier test left in garbage are not this test's
    exports = _testing.live_exports()

    def cycles(n):
        for _ in range(n):
            b = np.from_dlpack(dlpart.from_dlpack(a))
            assert b.ctypes.data == a.ctypes.data

    cycles(5000)  # warm up allocator pools
    gc.collect()
    rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    cycles(50_000)
    gc.collect()
    rss1 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    assert _testing.live_exports() == exports
    # 50,000 leaked exports would be several MiB; allow allocator noise only.
    assert rss1 - rss0 < 2048, (rss0, rss1)


def test_a_device_dlpart_cannot_place_on_is_a_buffer_error_whatever_copy_says():
    # The array API's from_dlpack: a device that cannot be served is a BufferError; one that
    # can is served by a copy unless copy=False.
    t = dlpart.from_dlpack(np.arange(3.0))
    for copy in (None, False, True):
        with pytest.raises(BufferError, match="kDLOpenCL:0"):
            dlpart.from_dlpack(t, device="kDLOpenCL:0", copy=copy)
    dlpart._core._note_host_devices(2)  # JAX's emulated host devices, as its adapter notes
    with pytest.raises(BufferError, match="copy=False"):
        dlpart.from_dlpack(t, device="kDLCPU:1", copy=False)
    for copy in (None, True):
        c = dlpart.from_dlpack(t, device="kDLCPU:1", copy=copy)
        assert str(c.device) == "kDLCPU:1" and c.data_ptr != t.data_ptr
        np.testing.assert_array_equal(np.frombuffer(c.__reduce__()[1][0]), np.arange(3.0))
    assert str(t.to("kDLCPU:1").device) == "kDLCPU:1"


def test_a_producer_refusing_to_move_its_data_is_imported_where_it_is_and_moved_by_dlpart():
    """numpy refuses every `dl_device` but its own with a BufferError, as the array API lets a
    producer do: the consumer then takes the data where it is and copies it itself, as it would
    for a producer that ignored the request."""
    dlpart._core._note_host_devices(2)  # JAX's emulated host devices, as its adapter notes
    x = np.arange(6.0).reshape(2, 3)
    with pytest.raises(BufferError):
        x.__dlpack__(dl_device=(1, 1))  # the producer's own refusal
    for copy in (None, True):
        c = dlpart.from_dlpack(x, device="kDLCPU:1", copy=copy)
        assert str(c.device) == "kDLCPU:1" and c.data_ptr != x.ctypes.data
        np.testing.assert_array_equal(np.from_dlpack(c.to("cpu")), x)
    # A move is a copy: refused as dlpart refuses it for its own tensors, naming both devices,
    # numpy's refusal chained as the cause.
    for source, cause in ((dlpart.from_dlpack(x), type(None)), (x, BufferError)):
        with pytest.raises(BufferError) as e:
            dlpart.from_dlpack(source, device="kDLCPU:1", copy=False)
        assert str(e.value) == ("cannot place a tensor on kDLCPU onto kDLCPU:1: copy=False "
                                "forbids the copy this needs"), e.value
        assert type(e.value.__cause__) is cause


def test_a_producer_refusing_a_move_dlpart_makes_without_a_copy_is_read_where_it_is():
    """Pinned host memory is read as kDLCPU without a copy: a producer that refuses to move it
    there itself (copy=False) is asked again for the data where it is, which dlpart relabels,
    as it does for its own tensors."""
    dlpart._core._note_host_devices(2)  # JAX's emulated host devices, as its adapter notes
    x = np.arange(6.0).reshape(2, 3)
    pinned = dlpart.from_dlpack(_testing.make_capsule(x.tobytes(), [2, 3], dtype=(2, 64, 1),
                                                      device=(3, 0)))

    class Refusing:
        calls = []

        def __dlpack__(self, **kw):
            Refusing.calls.append(kw)
            if kw.get("dl_device") is not None:
                raise BufferError("unsupported device requested")
            return pinned.__dlpack__(**kw)

        def __dlpack_device__(self):
            return pinned.__dlpack_device__()

    mine = dlpart.from_dlpack(pinned, device="cpu", copy=False)
    got = dlpart.from_dlpack(Refusing(), device="cpu", copy=False)
    for c in (mine, got):
        assert str(c.device) == "kDLCPU" and c.data_ptr == pinned.data_ptr
        np.testing.assert_array_equal(np.from_dlpack(c), x)
    assert [kw.get("dl_device") for kw in Refusing.calls] == [(1, 0), None]
    assert Refusing.calls[1]["copy"] is False
    # Onto another device than kDLCPU a copy is needed: refused as dlpart refuses it.
    with pytest.raises(BufferError) as e:
        dlpart.from_dlpack(Refusing(), device="kDLCPU:1", copy=False)
    assert str(e.value) == ("cannot place a tensor on kDLCUDAHost onto kDLCPU:1: copy=False "
                            "forbids the copy this needs"), e.value
    assert str(e.value.__cause__) == "unsupported device requested"


class LegacyProducer:
    """A producer of the DLPack 0.x protocol: no `max_version`, legacy capsules only."""

    def __init__(self, a):
        self.a = a

    def __dlpack__(self, stream=None):
        return self.a.__dlpack__(stream=stream)

    def __dlpack_device__(self):
        return self.a.__dlpack_device__()


def test_data_of_a_legacy_producer_is_read_only_and_a_write_says_why():
    y = np.zeros((2, 3))
    assert dlpart.from_dlpack(LegacyProducer(y)).readonly
    assert not dlpart.from_dlpack(y).readonly  # numpy's versioned capsule says it is writable
    with pytest.raises(BufferError, match=r"readonly=True \(imported from a producer without "
                                          r"DLPack 1\.x versioned capsules.*\) is read-only"):
        dlpart.scatter(np.ones((1, 3)), [0], LegacyProducer(y))
    assert (y == 0).all()  # nothing written
    dlpart.scatter(np.ones((1, 3)), [0], y)
    np.testing.assert_array_equal(y, [[1, 1, 1], [0, 0, 0]])
    # a repartition into such data says so too, and writes nothing
    z = np.zeros((2, 3))
    target = dlpart.PartitionedArray((2, 3), [[0, 2], [0, 3]], {(0, 0): dlpart.Partition(
        (0, 0), (0, 0), (2, 3), tensor=dlpart.from_dlpack(LegacyProducer(z)))})
    with pytest.raises(BufferError, match=r"target partition \(0, 0\) .*readonly=True \(imported "
                                          r"from a producer without DLPack 1\.x"):
        dlpart.partition(np.ones((2, 3)), (1, 1)).repartition_into(target)
    assert (z == 0).all()


def test_an_array_in_non_native_byte_order_is_refused_naming_its_dtype_and_the_fix():
    """DLPack carries native byte order only, and an import keeps the caller's memory, so it
    makes no native copy: numpy's own refusal says neither which dtype nor what to do; dlpart's
    BufferError (the same class, numpy's chained as its cause) names both, on every import."""
    import re

    swapped = ">" if np.dtype("<f4").isnative else "<"
    ref = np.arange(12, dtype=np.float32).reshape(3, 4)
    x = ref.astype(swapped + "f4")
    assert not x.dtype.isnative
    dtype = x.dtype.str  # '>f4' on a little-endian host
    d = {"shape": (3, 4), "partition_tiling": (1, 1),
         "partitions": {(0, 0): {"start": (0, 0), "shape": (3, 4), "data": x, "location": []}}}
    imports = [lambda: dlpart.from_dlpack(x), lambda: dlpart.from_dlpack(x, copy=True),
               lambda: dlpart.from_dlpack(x, device="cpu"), lambda: dlpart.partition(x, (3, 1)),
               lambda: dlpart.from_partitioned(d)]
    for make in imports:
        with pytest.raises(BufferError) as e:
            make()
        msg = str(e.value)
        assert f"has dtype {dtype}, whose bytes are not in native order" in msg, msg
        assert "x.astype(x.dtype.newbyteorder('='))" in msg, msg
        assert re.search(r"ndarray to import", msg), msg
    with pytest.raises(BufferError) as e:
        dlpart.from_dlpack(x)
    assert type(e.value.__cause__) is BufferError  # numpy's own refusal
    # The conversion named makes it importable, with the same values.
    fixed = x.astype(x.dtype.newbyteorder("="))
    np.testing.assert_array_equal(np.from_dlpack(dlpart.from_dlpack(fixed)), ref)
    np.testing.assert_array_equal(np.from_dlpack(dlpart.partition(fixed, (3, 1)).assemble()), ref)
