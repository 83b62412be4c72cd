"""Fuzzing of the DLPack import: crafted descriptors, field by field, through
`_testing.make_capsule`.

Each case starts from a descriptor whose elements lie inside its buffer (shapes, strides, byte
offsets, dtypes, devices, versions, flags drawn at random), then perhaps breaks one field (a
huge or negative extent, a stride whose byte arithmetic overflows, a huge offset, an unknown
dtype or device, a version of another major, a NULL shape or data pointer, a negative ndim).
A model below says what must happen: an import that must succeed and read exactly the
elements numpy reads from the same buffer, or one that must be refused with `BufferError`, or
(a layout that fits the address space but not the buffer) one that may do either but is never
read. Any other exception, a panic (`BaseException`) or a crash fails the run.

Derandomised with a fixed seed and no example database: the same cases run every time, and the
`@example`s below keep the inputs that once crashed dlpart.
"""

import numpy as np
import pytest

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import example, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

import dlpart  # noqa: E402
from dlpart._core import _testing  # noqa: E402

I64_MIN, I64_MAX = -(1 << 63), (1 << 63) - 1

# (code, bits): every dtype dlpart reads (lanes 1), by DLPack code.
KNOWN = [(0, 8), (0, 16), (0, 32), (0, 64), (1, 8), (1, 16), (1, 32), (1, 64), (2, 16),
         (2, 32), (2, 64), (4, 16), (5, 64), (5, 128), (6, 8)]
HOST = {1, 3, 11}  # kDLCPU, kDLCUDAHost, kDLROCMHost
FLAG_READ_ONLY = 1
EXTREME = [I64_MIN, I64_MIN // 2, I64_MIN // 4, I64_MIN // 8, -(1 << 40), (1 << 40),
           I64_MAX // 8 + 1, I64_MAX // 4 + 1, I64_MAX // 2, I64_MAX]


def checked(*values):
    """None if any value leaves the int64 range (Rust's checked arithmetic), else the last."""
    return None if any(v < I64_MIN or v > I64_MAX for v in values) else values[-1]


def model(shape, strides, itemsize, byte_offset, buflen, null_data):
    """'ok' (inside the buffer: must import and read right), 'refuse' (must be BufferError)
    or 'any' (the arithmetic fits, the buffer does not: import may do either; never read)."""
    if any(n < 0 for n in shape):
        return "refuse"
    numel = 1
    extent = 1  # the product of the non-zero axes: ndarray's (and numpy's) limit, zero or not
    for n in shape:
        numel *= n
        extent *= max(n, 1)
    if extent > I64_MAX or numel * itemsize > I64_MAX:
        return "refuse"
    if numel == 0:
        return "ok"
    if null_data or byte_offset > I64_MAX:
        return "refuse"
    lo, hi = byte_offset, checked(byte_offset + itemsize)
    if hi is None:
        return "refuse"
    for n, s in zip(shape, strides):
        step = checked((n - 1) * s, (n - 1) * s * itemsize)
        if step is None:
            return "refuse"
        if step < 0:
            lo = checked(lo + step)
        else:
            hi = checked(hi + step)
        if lo is None or hi is None:
            return "refuse"
    if hi - lo > I64_MAX:
        return "refuse"
    if lo >= 0 and hi <= buflen and numel <= 1 << 16:
        return "ok"
    return "any"


@st.composite
def descriptors(draw):
    ndim = draw(st.integers(0, 4))
    shape = draw(st.lists(st.integers(0, 4), min_size=ndim, max_size=ndim))
    code, bits = draw(st.sampled_from(KNOWN))
    itemsize = bits // 8
    null_strides = ndim > 0 and draw(st.booleans())
    if null_strides:
        strides, contiguous = None, []
        acc = 1
        for n in reversed(shape):
            contiguous.insert(0, acc)
            acc *= n
        eff = contiguous
    else:
        strides = draw(st.lists(st.integers(-6, 6), min_size=ndim, max_size=ndim))
        eff = strides
    lo = sum(min(0, (n - 1) * s) * itemsize for n, s in zip(shape, eff) if n > 0)
    hi = itemsize + sum(max(0, (n - 1) * s) * itemsize for n, s in zip(shape, eff) if n > 0)
    byte_offset = -lo + draw(st.integers(0, 2 * itemsize))  # sometimes unaligned
    buflen = byte_offset + hi + draw(st.integers(0, 8))
    buf = draw(st.binary(min_size=buflen, max_size=buflen))
    d = dict(data=buf, shape=shape, strides=strides, dtype=(code, bits, 1), device=(1, 0),
             byte_offset=byte_offset, version=draw(st.sampled_from([(1, 0), (1, 1), (1, 3),
                                                                    (1, 9), None])),
             flags=draw(st.sampled_from([0, FLAG_READ_ONLY, 2, 3])))
    # Break at most one thing.
    what = draw(st.sampled_from(["none"] * 4 + ["shape", "stride", "offset", "dtype", "device",
                                                 "version", "flags", "null_shape", "null_data",
                                                 "ndim"]))
    if what == "shape" and ndim:
        i = draw(st.integers(0, ndim - 1))
        d["shape"] = list(shape)
        d["shape"][i] = draw(st.sampled_from([-1, I64_MIN, 1 << 31, 1 << 40, 1 << 62, I64_MAX]))
    elif what == "stride" and ndim:
        i = draw(st.integers(0, ndim - 1))
        d["strides"] = list(eff)
        d["strides"][i] = draw(st.sampled_from(EXTREME))
    elif what == "offset":
        d["byte_offset"] = draw(st.sampled_from([1 << 40, I64_MAX, I64_MAX + 1, (1 << 64) - 1]))
    elif what == "dtype":
        d["dtype"] = draw(st.tuples(st.integers(0, 255), st.sampled_from([0, 1, 7, 8, 16, 24, 32,
                                                                          64, 128, 256]),
                                    st.sampled_from([0, 1, 2, 4])))
    elif what == "device":
        d["device"] = draw(st.tuples(st.sampled_from([0, 2, 3, 4, 7, 11, 13, 14, 99, 1 << 20]),
                                     st.sampled_from([0, 1, -1, 1 << 30])))
    elif what == "version":
        d["version"] = draw(st.sampled_from([(0, 0), (0, 9), (2, 0), (1 << 31, 0)]))
    elif what == "flags":
        d["flags"] = draw(st.integers(0, (1 << 64) - 1))
    elif what == "null_shape":
        d["null_shape"] = True
    elif what == "null_data":
        d["null_data"] = True
    elif what == "ndim":
        # Never above len(shape): the helper would read past its own arrays.
        d["ndim"] = draw(st.sampled_from([-1, -(1 << 31)] + list(range(ndim + 1))))
    return d


def expectation(d):
    """(outcome, shape, strides) the model expects for the descriptor `d`."""
    code, bits, lanes = d["dtype"]
    if (code, bits) not in KNOWN or lanes != 1:
        return "refuse", None, None
    if d["version"] is not None and d["version"][0] != 1:
        return "refuse", None, None
    device, dev_id = d["device"]
    if device not in {1, 2, 3, 4, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17} or dev_id < 0:
        return "any", None, None  # dlpart's device table decides; never read
    ndim = d.get("ndim", len(d["shape"]))
    if ndim < 0:
        return "refuse", None, None
    if ndim > 0 and d.get("null_shape"):
        return "refuse", None, None
    shape = d["shape"][:ndim]
    if d["strides"] is None or ndim == 0:
        strides, acc = [], 1
        for n in reversed(shape):
            strides.insert(0, acc)
            acc *= n
    else:
        strides = d["strides"][:ndim]
    outcome = model(shape, strides, bits // 8, d["byte_offset"], len(d["data"]),
                    d.get("null_data", False))
    if device not in HOST and outcome == "ok":
        outcome = "any"  # imported as device memory: dlpart never reads it here
    return outcome, shape, strides


def expected_bytes(d, shape, strides):
    itemsize = d["dtype"][1] // 8
    if 0 in shape:
        return b""
    view = np.ndarray(tuple(shape), dtype=f"V{itemsize}", buffer=bytearray(d["data"]),
                      offset=d["byte_offset"], strides=tuple(s * itemsize for s in strides))
    return view.tobytes()


def run_case(d):
    outcome, shape, strides = expectation(d)
    before = _testing.deleter_calls()
    cap = _testing.make_capsule(**d)
    try:
        t = dlpart.from_dlpack(cap)
    except BufferError:
        assert outcome in ("refuse", "any"), f"refused a valid descriptor {d}"
        del cap  # no cycles: the capsule goes, and calls the deleter, here
        assert _testing.deleter_calls() == before + 1
        return
    assert outcome in ("ok", "any"), f"accepted {d}"
    if outcome == "ok":
        assert list(t.shape) == shape
        assert t.readonly == (d["version"] is None or bool(d["flags"] & FLAG_READ_ONLY))
        # Read through dlpart's own copy kernel (contiguous bytes, C order), and once more
        # through a strided re-export, then compare with numpy's reading of the same buffer.
        want = expected_bytes(d, shape, strides)
        assert t.__reduce__()[1][0] == want
        # Host memory of another kind (pinned, ROCm host) is copied to kDLCPU: dlpart makes
        # no such memory without its runtime.
        on_cpu = d["device"][0] == 1
        copied = t.copy() if on_cpu else dlpart.from_dlpack(t, device="kDLCPU", copy=True)
        assert copied.__reduce__()[1][0] == want
        assert t.nbytes == len(want)
    del t, cap
    assert _testing.deleter_calls() == before + 1


@settings(max_examples=1000, deadline=None, derandomize=True, database=None)
@given(descriptors())
# The extent (2 - 1) * stride * 4 bytes == isize::MIN, whose abs() overflowed.
@example(dict(data=bytes(8), shape=[2], strides=[-(1 << 61)], dtype=(2, 32, 1), device=(1, 0),
              byte_offset=0, version=(1, 3), flags=0))
# numel fits, numel * itemsize does not: Tensor.nbytes wrapped to 0.
@example(dict(data=bytes(8), shape=[1 << 62], strides=[0], dtype=(2, 32, 1), device=(1, 0),
              byte_offset=0, version=(1, 3), flags=0))
# byte_offset + itemsize overflows.
@example(dict(data=bytes(8), shape=[1], strides=[1], dtype=(2, 32, 1), device=(1, 0),
              byte_offset=I64_MAX, version=(1, 3), flags=0))
# A zero in the shape, the other axes overflowing: refused in any order of the axes.
@example(dict(data=b"", shape=[1 << 62, 0, 0, 2], strides=None, dtype=(0, 8, 1), device=(1, 0),
              byte_offset=0, version=(1, 0), flags=0))
@example(dict(data=b"", shape=[1 << 40, 1 << 40, 0], strides=None, dtype=(0, 8, 1),
              device=(1, 0), byte_offset=0, version=(1, 0), flags=0))
# numel itself overflows: was a ValueError, not the BufferError DLPack asks for.
@example(dict(data=bytes(8), shape=[2, 1 << 62], strides=[0, 0], dtype=(2, 32, 1),
              device=(1, 0), byte_offset=0, version=(1, 3), flags=0))
def test_crafted_descriptors_import_right_or_raise_buffer_error(d):
    run_case(d)
