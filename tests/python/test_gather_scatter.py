"""Property tests of `dlpart.gather` and `dlpart.scatter` against numpy.

`gather(x, idx, axis)` must equal `np.take(x, idx, axis)`; `scatter(values, idx, out, axis)`
must equal numpy's `out[..., idx, ...] = values` (the last of duplicate indices wins). Sources
are strided, negative-stride and transposed views of every dtype (bfloat16 and float8 through
counted DLPack capsules, which numpy cannot export); indices are 1-d arrays of every integer
dtype, negative, duplicated, empty or strided. Out-of-range indices raise IndexError and bad
outputs are refused, both before anything is written.
"""

import numpy as np
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

import dlpart
from dlpart import _core
from dlpart._core import _testing
from test_props_partitioned import DTYPES, Producer, random_array, same, to_numpy

SETTINGS = dict(deadline=None, derandomize=True, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])

INDEX_DTYPES = ["int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64"]


def strided(draw, a):
    """`a` (C order) copied into a random layout: C, Fortran, every other element along an axis,
    reversed axes, or transposed storage."""
    layout = draw(st.sampled_from(["C", "F", "step", "negative", "transpose"]))
    if layout == "F":
        return np.asfortranarray(a)
    if layout == "step":
        axis = draw(st.integers(0, a.ndim - 1))
        big = np.zeros(tuple(2 * n if i == axis else n for i, n in enumerate(a.shape)), a.dtype)
        view = big[tuple(slice(None, None, 2) if i == axis else slice(None)
                         for i in range(a.ndim))]
        view[...] = a
        return view
    if layout == "negative":
        flip = tuple(slice(None, None, -1) if draw(st.booleans()) else slice(None)
                     for _ in range(a.ndim))
        return a[flip].copy()[flip]
    if layout == "transpose":
        perm = draw(st.permutations(range(a.ndim)))
        return a.transpose(perm).copy().transpose(np.argsort(perm))
    return a.copy()


@st.composite
def cases(draw, names=tuple(sorted(DTYPES)), empty_axis=False):
    """(name, ref, x, axis, idx): a reference array, a strided copy of it in some layout, an
    axis and 1-d indices into it (negative ones included), in some integer dtype and layout."""
    name = draw(st.sampled_from(names))
    ndim = draw(st.integers(1, 4))
    shape = tuple(draw(st.lists(st.integers(0, 5), min_size=ndim, max_size=ndim)))
    axis = draw(st.integers(0, ndim - 1))
    if shape[axis] == 0 and not empty_axis:
        shape = tuple(1 if a == axis else n for a, n in enumerate(shape))
    ref = random_array(np.random.default_rng(draw(st.integers(0, 2**32 - 1))), shape, name)
    n = shape[axis]
    idx_dtype = draw(st.sampled_from(INDEX_DTYPES))
    lo = 0 if idx_dtype.startswith("uint") else -n
    size = draw(st.integers(0, 8)) if n else 0
    values = draw(st.lists(st.integers(lo, n - 1), min_size=size, max_size=size)) if n else []
    idx = strided(draw, np.array(values, dtype=idx_dtype))
    for what, present in [("duplicates", len(set(values)) < len(values)), ("empty", not values),
                          ("negative", any(v < 0 for v in values))]:
        if present:
            event(f"indices: {what}")
    return name, ref, strided(draw, ref), axis, idx


NATIVE = tuple(sorted(n for n in DTYPES if DTYPES[n][2]))


def dl(a, name):
    """What dlpart is handed for the numpy array `a`: `a` itself where numpy can export it,
    else a DLPack producer of its bytes (a writable copy)."""
    if DTYPES[name][2]:
        return a
    return dlpart.from_dlpack(Producer(a, DTYPES[name][1]))


def along(axis, index):
    return (slice(None),) * axis + (index,)


@settings(max_examples=250, **SETTINGS)
@given(case=cases())
def test_gather_matches_numpy_take(case):
    name, ref, x, axis, idx = case
    got = dlpart.gather(dl(x, name), idx, axis=axis)
    expect = np.take(ref, idx.astype(np.int64), axis=axis)
    assert got.dtype == name and got.shape == expect.shape
    assert same(to_numpy(got, name), expect)
    assert same(x, ref), "the source changed"


@settings(max_examples=150, **SETTINGS)
@given(case=cases(names=NATIVE), step=st.sampled_from([2, -2]))
def test_gather_writes_into_out_in_place(case, step):
    name, ref, x, axis, idx = case
    expect = np.take(ref, idx.astype(np.int64), axis=axis)
    # out: every other element along the last axis (forwards or backwards) of a bigger array,
    # whose other elements must stay as they are
    big = random_array(np.random.default_rng(1), expect.shape[:-1] + (2 * expect.shape[-1],),
                       name)
    before = big.copy()
    pick = (slice(None, None, 2), slice(1, None, 2)) if step == 2 else (
        slice(None, None, -2), slice(-2, None, -2))
    out = big[..., pick[0]]
    got = dlpart.gather(x, idx, axis=axis, out=out)
    assert same(out, expect)
    if out.size:
        assert got.data_ptr == out.ctypes.data and got.shape == out.shape
    assert same(big[..., pick[1]], before[..., pick[1]]), "wrote outside out"


@settings(max_examples=250, **SETTINGS)
@given(case=cases(), data=st.data())
def test_scatter_matches_numpy_fancy_assignment(case, data):
    name, ref, out_ref, axis, idx = case
    shape = list(ref.shape)
    shape[axis] = len(idx)
    values_ref = random_array(np.random.default_rng(data.draw(st.integers(0, 99))), shape, name)
    values = strided(data.draw, values_ref)

    expect = ref.copy()
    expect[along(axis, idx.astype(np.int64))] = values_ref
    loop = ref.copy()  # numpy's fancy assignment is "last duplicate wins": check it here
    for i, j in enumerate(idx.astype(np.int64)):
        loop[along(axis, j)] = values_ref[along(axis, i)]
    assert same(expect, loop)

    out = dl(out_ref, name)
    assert dlpart.scatter(dl(values, name), idx, out, axis=axis) is None
    result = out_ref if DTYPES[name][2] else to_numpy(out, name)
    assert same(result, expect)
    assert same(values, values_ref), "values changed"


@settings(max_examples=120, **SETTINGS)
@given(case=cases(empty_axis=True), data=st.data(), negative=st.booleans())
def test_out_of_range_indices_raise_index_error_before_writing(case, data, negative):
    name, ref, x, axis, idx = case
    n = ref.shape[axis]
    bad = -n - 1 - data.draw(st.integers(0, 3)) if negative else n + data.draw(st.integers(0, 3))
    good = data.draw(st.lists(st.integers(-n, n - 1), max_size=3)) if n else []
    where = data.draw(st.integers(0, len(good)))
    idx = np.array(good[:where] + [bad] + good[where:], dtype=np.int64)

    with pytest.raises(IndexError, match=rf"index {bad} is out of bounds for axis {axis} "
                                         rf"with size {n}"):
        dlpart.gather(dl(x, name), idx, axis=axis)

    shape = list(ref.shape)
    shape[axis] = len(idx)
    if DTYPES[name][2]:
        out = random_array(np.random.default_rng(2), shape, name)
        before = out.copy()
        with pytest.raises(IndexError):
            dlpart.gather(x, idx, axis=axis, out=out)
        assert same(out, before), "gather wrote into out before raising"

    values = random_array(np.random.default_rng(3), shape, name)
    target = strided(data.draw, ref) if DTYPES[name][2] else dl(x, name)
    with pytest.raises(IndexError, match=rf"index {bad} is out of bounds"):
        dlpart.scatter(dl(values, name), idx, target, axis=axis)
    assert same(target if DTYPES[name][2] else to_numpy(target, name), ref), \
        "scatter wrote before raising"


def test_bad_outs_are_refused_before_writing():
    x = np.arange(24, dtype=np.float32).reshape(4, 6)
    idx = np.array([3, -1, 3])
    ok = np.zeros((3, 6), np.float32)

    ro = ok.copy()
    ro.flags.writeable = False
    with pytest.raises(BufferError, match="read-only"):
        dlpart.gather(x, idx, axis=0, out=ro)
    for bad in [np.zeros((3, 5), np.float32), np.zeros((6, 3), np.float32),
                np.zeros(18, np.float32)]:
        with pytest.raises(ValueError, match=r"out must have shape \(3, 6\) and dtype float32"):
            dlpart.gather(x, idx, axis=0, out=bad)
        assert not bad.any()
    wide = np.zeros((3, 6), np.float64)
    with pytest.raises(ValueError, match=r"^dtype float64 differs from float32 of the gather's "
                                         r"source \(out must have its dtype\)$"):
        dlpart.gather(x, idx, axis=0, out=wide)
    assert not wide.any()

    values = np.ones((4, 3), np.float32)
    target = x.copy()
    target.flags.writeable = False
    with pytest.raises(BufferError, match="read-only"):
        dlpart.scatter(values, np.array([0, 5, 5]), target, axis=1)
    with pytest.raises(ValueError, match=r"values must have shape \(4, 3\) and dtype float32"):
        dlpart.scatter(np.ones((3, 4), np.float32), np.array([0, 5, 5]), x.copy(), axis=1)
    with pytest.raises(ValueError, match=r"^dtype float64 differs from float32 of the scatter's "
                                         r"out \(values must have its dtype\)$"):
        dlpart.scatter(values.astype(np.float64), np.array([0, 5, 5]), x.copy(), axis=1)
    assert same(target, x)


def _labelled(a, device):
    """A dlpart copy of `a` whose DLPack device is `device` (host memory of that kind)."""
    a = np.ascontiguousarray(a)
    return dlpart.from_dlpack(_testing.make_capsule(a.tobytes(), list(a.shape),
                                                    dtype=(2, 8 * a.itemsize, 1), device=device))


HOST_KINDS = {"kDLCUDAHost": (3, 0), "kDLCUDAManaged": (13, 0), "kDLROCMHost": (11, 0)}


@pytest.mark.parametrize("kind", sorted(HOST_KINDS))
def test_host_memory_of_any_kind_is_gathered_and_scattered_in_place(kind):
    x = np.arange(12.0).reshape(4, 3)
    there = _labelled(x, HOST_KINDS[kind])
    assert str(there.device).startswith(kind)
    dlpart.scatter(np.full((2, 3), -1.0), [3, 0], there)  # numpy values, kDLCPU
    expect = x.copy()
    expect[[3, 0]] = -1.0
    np.testing.assert_array_equal(np.from_dlpack(there), expect)
    out = np.zeros((2, 3))
    assert dlpart.gather(there, [1, -1], out=out) is not None
    np.testing.assert_array_equal(out, np.take(expect, [1, -1], 0))
    # Host memory of two other kinds than kDLCPU, both ways.
    other = _labelled(np.zeros((2, 3)), HOST_KINDS["kDLCUDAHost" if kind != "kDLCUDAHost"
                                                   else "kDLROCMHost"])
    dlpart.gather(there, [2, 1], out=other)
    np.testing.assert_array_equal(np.from_dlpack(other), np.take(expect, [2, 1], 0))
    dlpart.scatter(other, [0, 3], there)
    expect[[0, 3]] = expect[[2, 1]]
    np.testing.assert_array_equal(np.from_dlpack(there), expect)


@pytest.mark.parametrize("kind", sorted(HOST_KINDS) + ["kDLCPU:1"])
def test_partitioned_host_memory_of_any_kind_is_scattered_from_host_values_in_place(kind):
    """Host values (numpy arrays, scalars) write partitions in host memory of any kind (JAX's
    emulated kDLCPU:k too) in place, as `dlpart.scatter` writes each such tensor: no move, so
    no ``transfer=True`` to ask for (`dlpart.scatter` has none). A gather that fills a kDLCPU
    partition from such memory needs none either (a copy between kinds of host memory), and
    no CUDA: the rows it picks there go through plain host memory, not new pinned memory."""
    x = np.arange(24.0).reshape(4, 6)
    there = _labelled(x, HOST_KINDS.get(kind, (1, 1)))
    assert str(there.device) in (kind, kind + ":0")
    pa = dlpart.partition(there, (2, 1))
    expect = x.copy()
    pa.scatter(0.0, [3])
    expect[[3]] = 0.0
    dlpart.scatter(np.full(6, -1.0), [-4], pa)
    expect[[-4]] = -1.0
    dlpart.scatter(np.arange(12.0).reshape(2, 6), [2, 1], pa)
    expect[[2, 1]] = np.arange(12.0).reshape(2, 6)
    np.testing.assert_array_equal(np.from_dlpack(there), expect)
    # A kDLCPU partition beside one of this kind, both written from numpy values.
    mixed = dlpart.from_partitioned({
        "shape": (4, 6), "partition_tiling": (2, 1), "partitions": {
            (0, 0): {"start": (0, 0), "shape": (2, 6), "data": np.zeros((2, 6)),
                     "location": [0]},
            (1, 0): {"start": (2, 0), "shape": (2, 6), "data": pa.partitions[(1, 0)].tensor, "location": [0]}}})
    dlpart.scatter(np.full((2, 6), 5.0), [0, 3], mixed)
    expect[[3]] = 5.0
    np.testing.assert_array_equal(np.from_dlpack(there), expect)
    # numpy: the mixed array is rows 0-1 of zeros, row 0 then set to 5, and rows 2-3 of `there`
    whole = np.concatenate([np.zeros((2, 6)), expect[2:]])
    whole[0] = 5.0
    picked = mixed.gather([0, 3, 2])
    assert [str(d) for d in picked.devices] == ["kDLCPU"]  # the device of row 0
    np.testing.assert_array_equal(np.from_dlpack(picked.assemble()), np.take(whole, [0, 3, 2], 0))
    np.testing.assert_array_equal(np.from_dlpack(there), expect)


@pytest.mark.parametrize("kind", ["kDLCUDAManaged", "kDLROCMHost"])
def test_a_gather_of_memory_dlpart_does_not_make_without_out_lands_in_kdlcpu_memory(kind):
    """dlpart allocates no managed or ROCm host memory: a gather from it without ``out`` puts
    the result in kDLCPU memory, as numpy.take of such memory gives an ordinary host array;
    prepare_gather allocates its ``out`` there alike."""
    x = np.arange(24.0).reshape(4, 6)
    there = _labelled(x, HOST_KINDS[kind])
    for indices, axis in (([3, -4, 1], 0), ([5, 0], 1), (-2, 1), (np.array(2), 0)):
        got = dlpart.gather(there, indices, axis)
        assert got.device == "kDLCPU"
        np.testing.assert_array_equal(np.from_dlpack(got), np.take(x, indices, axis))
        g = dlpart.prepare_gather(there, indices, axis)
        g()
        assert g.out.device == "kDLCPU"
        np.testing.assert_array_equal(np.from_dlpack(g.out), np.take(x, indices, axis))
    np.testing.assert_array_equal(np.from_dlpack(there), x)


def test_device_memory_against_host_memory_is_a_device_error():
    x = np.arange(12.0).reshape(4, 3)
    gpu = _labelled(np.zeros((1, 3)), (2, 0))  # host bytes labelled kDLCUDA:0, never touched
    with pytest.raises(dlpart.DeviceError, match=r"kDLCPU -> kDLCUDA:0"):
        dlpart.gather(x, [0], out=gpu)
    with pytest.raises(dlpart.DeviceError, match=r"kDLCUDA:0 -> kDLCPU"):
        dlpart.scatter(gpu, [0], x)
    with pytest.raises(dlpart.DeviceError, match=r"kDLCUDA:0 -> kDLCUDAHost"):
        dlpart.scatter(gpu, [0], _labelled(x, (3, 0)))
    assert same(x, np.arange(12.0).reshape(4, 3))


WRITES = ("scatter", "prepared", "partitioned")


def scatter_by(write, values, indices, out, axis=0, tiling=None):
    """Scatters through one of the three entry points of `WRITES`: `dlpart.scatter`, a
    prepared scatter, or the scatter of a partition of `out` (cut by `tiling`, at most two
    blocks along each axis by default)."""
    if write == "scatter":
        dlpart.scatter(values, indices, out, axis=axis)
    elif write == "prepared":
        dlpart.prepare_scatter(values, indices, out, axis=axis)()
    else:
        tiling = tiling or tuple(min(2, max(n, 1)) for n in out.shape)
        dlpart.partition(out, tiling).scatter(values, indices, axis)


@settings(max_examples=150, **SETTINGS)
@given(case=cases(names=NATIVE), data=st.data())
def test_one_index_drops_the_axis_as_numpy_does(case, data):
    """A Python int, a numpy integer or a 0-d array selects one slice without its axis, in
    every form of gather and scatter: `np.take(x, i, axis)` and `out[.., i, ..] = values`."""
    name, ref, x, axis, _ = case
    n = ref.shape[axis]
    i = data.draw(st.integers(-n, n - 1))
    form = data.draw(st.sampled_from(["int", "numpy int", "0-d array"]))
    dtype = data.draw(st.sampled_from(INDEX_DTYPES if i >= 0 else INDEX_DTYPES[:4]))
    index = {"int": i, "numpy int": np.dtype(dtype).type(i), "0-d array": np.array(i, dtype)}[form]
    expect = np.take(ref, i, axis=axis)
    assert expect.ndim == ref.ndim - 1
    assert same(np.from_dlpack(dlpart.gather(x, index, axis=axis)), expect)
    out = np.zeros_like(expect)
    dlpart.gather(x, index, axis=axis, out=out)
    assert same(out, expect)
    g = dlpart.prepare_gather(x, index, axis=axis)
    g()
    assert same(np.from_dlpack(g.out), expect)
    pa = dlpart.partition(x, tuple(min(2, max(k, 1)) for k in ref.shape))
    assert same(np.from_dlpack(pa.gather(index, axis=axis).assemble()), expect)

    values = random_array(np.random.default_rng(i % 7), expect.shape, name)
    assigned = ref.copy()
    assigned[along(axis, i)] = values
    for write in WRITES:
        target = ref.copy()
        scatter_by(write, values, index, target, axis, tiling=(2,) + (1,) * (ref.ndim - 1))
        assert same(target, assigned), write
    # Values with the axis kept broadcast where numpy's assignment to the slice broadcasts
    # them (a leading axis of extent 1 is dropped), and are refused where it refuses them.
    # (The trailing `...` makes numpy assign to a view even where the slice is one element,
    # rather than convert the values to a scalar, which it refuses for arrays of ndim > 0.)
    kept = np.expand_dims(values, axis)
    assigned = ref.copy()
    try:
        assigned[along(axis, i) + (Ellipsis,)] = kept
    except ValueError:
        with pytest.raises(ValueError, match="values must have shape"):
            dlpart.scatter(kept, index, ref.copy(), axis=axis)
    else:
        target = ref.copy()
        dlpart.scatter(kept, index, target, axis=axis)
        assert same(target, assigned)


def test_indices_must_be_one_index_or_a_1d_integer_array():
    x = np.arange(6.0)
    # numpy.take puts the shape of such indices in place of the axis; dlpart does not.
    for idx in [np.array([[0, 1]]), [[0], [1]]]:
        with pytest.raises(ValueError, match=r"indices must be one index \(0-d\) or a 1-d list: "
                                             r"indices of more axes.* are not supported"):
            dlpart.gather(x, idx)
        with pytest.raises(ValueError, match="are not supported"):
            dlpart.partition(x, (2,)).gather(idx)
        with pytest.raises(ValueError, match="are not supported"):
            dlpart.scatter(np.zeros((1, 2)), idx, x.copy())
    # Indices that are no integers: numpy.take raises TypeError for a float index array (it
    # will not cast it), and so does dlpart, for arrays and Python sequences alike, on every
    # path (a bool array, which fancy indexing reads as a mask, is refused alike).
    with pytest.raises(TypeError):
        np.take(x, np.array([0.0, 1.0]))
    floats = [np.array([0.0, 1.0]), np.array(1.0), np.array([1.0], np.float32),
              dlpart.from_dlpack(np.array([0.0, 1.0])), [0.0, 1.0], 1.0]
    for idx in floats + [np.array([True]), np.array([1 + 0j]), [True], True]:
        pa = dlpart.partition(x.copy(), (2,))
        for call in (lambda: dlpart.gather(x, idx), lambda: pa.gather(idx),
                     lambda: dlpart.scatter(0.0, idx, x.copy()), lambda: pa.scatter(0.0, idx),
                     lambda: dlpart.prepare_gather(x, idx),
                     lambda: dlpart.prepare_scatter(0.0, idx, x.copy())):
            with pytest.raises(TypeError, match="integer"):
                call()
        assert (np.from_dlpack(pa.assemble()) == x).all()
    with pytest.raises(ValueError, match="axis 1 is out of range"):
        dlpart.gather(x, np.array([0]), axis=1)


def test_index_arrays_of_dtypes_dlpack_cannot_carry_are_type_errors_naming_the_dtype():
    """numpy refuses to export strings, bytes, objects and datetimes through DLPack with a
    BufferError that says nothing of indices: dlpart raises the TypeError of any index array
    that is no integer one, naming the dtype, on every path, writing nothing; numpy's error
    is the cause."""
    x = np.arange(6.0)
    with pytest.raises(TypeError):
        np.take(x, np.array(["0"]))  # numpy will not cast strings into indices either
    for idx, name in [(np.array(["0", "1"]), "<U1"), (np.array([b"0"]), "|S1"),
                      (np.array([0, 1], dtype=object), "object"),
                      (np.array(["2020-01-01"], dtype="datetime64[D]"), "datetime64[D]"),
                      (np.array(["0"], dtype=">U1"), ">U1"), (np.array("1"), "<U1")]:
        pa = dlpart.partition(x.copy(), (2,))
        out = x.copy()
        for call in (lambda: dlpart.gather(x, idx), lambda: _core.gather(x, idx, 0, None),
                     lambda: pa.gather(idx), lambda: dlpart.gather(x, idx, out=np.zeros(1)),
                     lambda: dlpart.scatter(-1.0, idx, out), lambda: pa.scatter(-1.0, idx),
                     lambda: dlpart.prepare_gather(x, idx),
                     lambda: dlpart.prepare_scatter(-1.0, idx, out)):
            with pytest.raises(TypeError) as e:
                call()
            assert str(e.value) == f"indices must be integers, found dtype {name}", e.value
            assert isinstance(e.value.__cause__, BufferError), e.value.__cause__
        assert (np.from_dlpack(pa.assemble()) == x).all() and (out == x).all()


def test_indices_that_are_no_integers_are_refused_in_one_wording_naming_dtype_and_value():
    """A Python sequence and an array of the same non-integer values are refused with the same
    words, naming the dtype (numpy's reading of the sequence), and the sequence as given; on
    every path, writing nothing."""
    x = np.arange(6.0)
    long = [0.5] * 100
    for seq, name in [(["0", "1"], "<U1"), ([1.5], "float64"), ([True, False], "bool"),
                      ([None], "object"), ([b"0"], "|S1"), (2.5, "float64"),
                      (long, "float64")]:
        arr = np.asarray(seq)
        assert str(arr.dtype) == name or arr.dtype.str == name, (arr.dtype, name)
        shown = repr(seq) if len(repr(seq)) <= 80 else repr(seq)[:80] + "..."
        for idx, want in [(arr, f"indices must be integers, found dtype {name}"),
                          (seq, f"indices must be integers, found dtype {name} in {shown}")]:
            pa = dlpart.partition(x.copy(), (2,))
            out = x.copy()
            for call in (lambda: dlpart.gather(x, idx), lambda: _core.gather(x, idx, 0, None),
                         lambda: pa.gather(idx), lambda: dlpart.scatter(-1.0, idx, out),
                         lambda: pa.scatter(-1.0, idx), lambda: dlpart.prepare_gather(x, idx),
                         lambda: dlpart.prepare_scatter(-1.0, idx, out)):
                with pytest.raises(TypeError) as e:
                    call()
                assert str(e.value) == want, (seq, str(e.value))
            assert (np.from_dlpack(pa.assemble()) == x).all() and (out == x).all()


@settings(max_examples=100, **SETTINGS)
@given(case=cases(names=NATIVE), data=st.data())
def test_aliased_operands_behave_as_if_copied_first(case, data):
    name, ref, x, axis, _ = case
    n = ref.shape[axis]
    idx = np.array(data.draw(st.lists(st.integers(-n, n - 1), min_size=n, max_size=n)), np.int64)
    # gather into its own source
    expect = np.take(ref, idx, axis=axis)
    dlpart.gather(x, idx, axis=axis, out=x)
    assert same(x, expect)
    # scatter from a reversed view of its own output (numpy copies overlapping operands first)
    out = strided(data.draw, ref)
    expect = ref.copy()
    expect[along(axis, idx)] = ref[along(axis, slice(None, None, -1))]
    dlpart.scatter(out[along(axis, slice(None, None, -1))], idx, out, axis=axis)
    assert same(out, expect)


@pytest.mark.parametrize("order", [">", "<"])
def test_arrays_in_either_byte_order_are_read_and_outs_must_be_native(order):
    """DLPack carries native byte order only: indices and values, read once, are read through
    a native copy, as np.take reads them; an out, written in place, is refused by name."""
    native = np.dtype(order + "f8").isnative
    x = np.arange(12.0).reshape(4, 3)
    idx = np.array([2, -4, 2], order + "i8")
    want = np.take(x, idx, 0)
    for source in [x, x.astype(order + "f8")]:
        np.testing.assert_array_equal(np.from_dlpack(dlpart.gather(source, idx)), want)
        np.testing.assert_array_equal(np.from_dlpack(dlpart.gather(source, idx[0])), want[0])
    pa = dlpart.partition(x.copy(), (2, 1))
    np.testing.assert_array_equal(np.from_dlpack(pa.gather(idx).assemble()), want)
    g = dlpart.prepare_gather(x, idx)
    g()
    np.testing.assert_array_equal(np.from_dlpack(g.out), want)
    values = np.array([[-1.0] * 3, [-2.0] * 3, [-3.0] * 3], order + "f8")
    expect = x.copy()
    expect[idx] = values
    for target in ["array", "partitioned"]:
        out = x.copy()
        if target == "array":
            dlpart.scatter(values, idx, out)
        else:
            dlpart.partition(out, (2, 1)).scatter(values, idx)
        np.testing.assert_array_equal(out, expect)
    if native:
        return
    f8 = order + "f8"
    swapped_out = np.zeros((3, 3), f8)
    with pytest.raises(BufferError, match=rf"out has dtype {f8}, whose bytes are not in native "
                                          r"order.*gather writes out in place"):
        dlpart.gather(x, idx, out=swapped_out)
    target = x.astype(f8)
    with pytest.raises(BufferError, match=rf"^out has dtype {f8}.*scatter writes out in place"):
        dlpart.scatter(values, idx, target)
    np.testing.assert_array_equal(target, x)
    # Prepared operations keep x and values themselves: no copy can stand in for them.
    with pytest.raises(BufferError, match=rf"^x has dtype {f8}.*reads x itself at each call"):
        dlpart.prepare_gather(x.astype(f8), idx)
    with pytest.raises(BufferError, match=rf"^values has dtype {f8}.*reads values itself"):
        dlpart.prepare_scatter(values, idx, x.copy())
    with pytest.raises(BufferError, match=rf"^out has dtype {f8}.*writes out itself"):
        dlpart.prepare_gather(x, idx, out=swapped_out)
    assert not swapped_out.any()


def test_huge_unsigned_index_is_named_with_its_axis():
    with pytest.raises(IndexError, match=r"index 9223372036854775813 is out of bounds for axis 1 "
                                         r"with size 3"):
        dlpart.gather(np.zeros((2, 3)), np.array([2**63 + 5], np.uint64), axis=1)


@pytest.mark.parametrize("where", [0, (1 << 21) // 2, (1 << 21) - 1])
@pytest.mark.parametrize("bad", ["past_end", "before_start", "negative_ok"])
def test_long_index_arrays_are_checked_in_parallel_pieces(where, bad):
    # 2M int64 indices: the range check runs in parallel chunks (1M and up), and one index at
    # the start, the middle or the end decides between the fast path, the fix-up of negative
    # indices and an IndexError raised before anything is written.
    rng = np.random.default_rng(where)
    x = rng.random(1000).astype(np.float32)
    idx = rng.integers(0, 1000, 1 << 21)
    idx[where] = {"past_end": 1000, "before_start": -1001, "negative_ok": -3}[bad]
    out = np.full(1 << 21, np.nan, np.float32)
    if bad == "negative_ok":
        dlpart.gather(x, idx, axis=0, out=out)
        np.testing.assert_array_equal(out, np.take(x, idx))
    else:
        with pytest.raises(IndexError, match=str(idx[where])):
            dlpart.gather(x, idx, axis=0, out=out)
        assert np.isnan(out).all()


@pytest.mark.parametrize("axis", [0, 1, 2])
def test_faces_of_a_strided_cube_match_numpy_take(axis):
    # Few indices over slabs of 4096+ elements run as box copies: faces, a repeated index and
    # a negative one, from a cube stored reversed and with gaps.
    rng = np.random.default_rng(axis)
    base = rng.random((70, 140, 66)).astype(np.float32)
    x = base[::-1, ::2, 1:-1]  # negative, stepped and offset strides: shape (70, 70, 64)
    idx = np.array([0, x.shape[axis] - 1, -1, 3, 3])
    out_shape = list(x.shape)
    out_shape[axis] = len(idx)
    out = np.full(out_shape, np.nan, np.float32)
    dlpart.gather(x, idx, axis=axis, out=out)
    np.testing.assert_array_equal(out, np.take(x, idx, axis=axis))


@settings(max_examples=150, **SETTINGS)
@given(rows=st.integers(1, 12), cols=st.integers(1, 3), tiles=st.integers(1, 4),
       data=st.data())
def test_partitioned_scatter_of_values_that_view_its_own_memory(rows, cols, tiles, data):
    """``pa.scatter(values, idx)`` where ``values`` is a view of the memory ``pa``'s partitions
    view: every partition must read the values as they were before any was written, as numpy's
    fancy assignment does (it copies overlapping values first)."""
    x = np.arange(float(rows * cols)).reshape(rows, cols)
    k = data.draw(st.integers(1, rows))
    lo = data.draw(st.integers(0, rows - k))
    values = x[lo:lo + k][::data.draw(st.sampled_from([1, -1]))]
    idx = np.array(data.draw(st.lists(st.integers(-rows, rows - 1), min_size=k, max_size=k)))
    expect = x.copy()
    expect[idx] = values.copy()
    pa = dlpart.partition(x, (tiles, 1))  # views of x
    pa.scatter(values, idx, axis=0)
    assert same(x, expect)


def test_partitioned_scatter_refuses_partitions_that_share_memory():
    """Written one after the other, partitions over the same memory would keep what the last
    one written was given, where numpy's last duplicate index wins: refused as
    repartition_into refuses such targets, before anything is written."""
    z = np.zeros((2, 3))
    pa = dlpart.PartitionedArray((4, 3), [[0, 2, 4], [0, 3]], {
        (0, 0): dlpart.Partition((0, 0), (0, 0), (2, 3), tensor=dlpart.from_dlpack(z)),
        (1, 0): dlpart.Partition((1, 0), (2, 0), (2, 3), tensor=dlpart.from_dlpack(z))})
    values = np.array([[1.0] * 3, [2.0] * 3])
    with pytest.raises(BufferError, match=r"target partitions \(0, 0\) and \(1, 0\) share "
                                          r"memory: their copies would race"):
        pa.scatter(values, [2, 0])
    with pytest.raises(BufferError, match="share memory"):
        dlpart.scatter(values, [2, 0], pa)
    assert not z.any()
    with pytest.raises(BufferError, match="share memory"):
        dlpart.partition(np.ones((4, 3)), (1, 1)).repartition_into(pa)
    pa.scatter(values, [1, 0])  # one of them alone: written as numpy would
    np.testing.assert_array_equal(z, values[::-1])


@st.composite
def broadcast_shape(draw, shape):
    """A shape that broadcasts to `shape` as numpy's assignment broadcasts values: axes of
    extent 1 in place of some, leading ones left out or leading axes of extent 1 added."""
    out = [n if draw(st.booleans()) else 1 for n in shape]
    out = out[draw(st.integers(0, len(out))):]
    return (1,) * draw(st.integers(0, 2)) + tuple(out)


@settings(max_examples=200, **SETTINGS)
@given(case=cases(names=NATIVE), data=st.data())
def test_scatter_values_broadcast_and_scalars_assign_as_numpy_does(case, data):
    """Values of any shape numpy's ``out[.., idx, ..] = values`` broadcasts, a numpy scalar,
    a Python scalar and a 0-d array, written by every scatter as numpy writes them; a shape
    numpy refuses is refused by all."""
    name, ref, _, axis, idx = case
    idx = idx.astype(np.int64)
    written = list(ref.shape)
    written[axis] = len(idx)
    rng = np.random.default_rng(data.draw(st.integers(0, 99)))
    form = data.draw(st.sampled_from(["broadcast", "numpy scalar", "python scalar", "0-d",
                                      "not broadcast"]))
    if form == "broadcast":
        values = random_array(rng, data.draw(broadcast_shape(written)), name)
    elif form == "not broadcast":
        bad = list(written) or [1]
        k = data.draw(st.integers(0, len(bad) - 1))
        bad[k] = bad[k] + 2 if bad[k] > 1 else 2 + bad[k] + 1
        values = random_array(rng, tuple(bad), name)
    else:
        zero_d = random_array(rng, (), name)
        values = {"numpy scalar": zero_d[()], "python scalar": zero_d.item(), "0-d": zero_d}[form]
    expect = ref.copy()
    try:
        expect[along(axis, idx)] = values
    except ValueError:
        expect = None
    for write in WRITES:
        target = ref.copy()
        if expect is None:
            with pytest.raises(ValueError, match="values must have shape"):
                scatter_by(write, values, idx, target, axis)
            assert same(target, ref), write
        else:
            scatter_by(write, values, idx, target, axis)
            assert same(target, expect), (write, form)


def test_a_scalar_takes_the_targets_dtype_as_numpy_assigns_it():
    """A Python scalar has no dtype: it is converted to the target's as numpy's assignment
    converts it (3.7 into int32 is 3, 300 into uint8 an OverflowError, in both); a numpy
    scalar has its dtype, which must be the target's, as an array's must."""
    for dtype, value in (("int32", 3.7), ("float16", 1 / 3), ("bool", 2), ("complex64", 1.5),
                         ("uint8", True), ("int64", 2**40)):
        expect = np.zeros((4, 3), dtype)
        expect[[2, 0]] = value
        for write in WRITES:
            out = np.zeros((4, 3), dtype)
            scatter_by(write, value, [2, 0], out, tiling=(2, 1))
            assert same(out, expect), (dtype, value, write)
    out = np.zeros(3, np.uint8)
    with pytest.raises(OverflowError):
        np.zeros(3, np.uint8)[[0]] = 300
    for run in (lambda: dlpart.scatter(300, [0], out),
                lambda: dlpart.partition(out, (1,)).scatter(300, [0])):
        with pytest.raises(OverflowError):
            run()
    assert not out.any()
    with pytest.raises(ValueError, match="dtype float64 differs from float32"):
        dlpart.scatter(np.float64(1), [0], np.zeros(3, np.float32))
    with pytest.raises(TypeError, match="do not support DLPack"):
        dlpart.scatter("1", [0], np.zeros(3, np.float32))


@pytest.mark.parametrize("dtype", ["bfloat16", "float8_e4m3fn", "float8_e5m2"])
def test_a_scalar_into_a_dtype_numpy_knows_through_ml_dtypes_is_converted_as_it_assigns(dtype):
    """bfloat16 and float8 targets: numpy knows those types once ml_dtypes is loaded (``import
    jax`` loads it), but its DLPack export refuses them; a Python scalar is converted by
    ml_dtypes all the same, as numpy's assignment converts it, in every scatter."""
    ml_dtypes = pytest.importorskip("ml_dtypes")
    torch = pytest.importorskip("torch")
    np_dtype = np.dtype(getattr(ml_dtypes, dtype))
    bits = {1: np.uint8, 2: np.uint16}[np_dtype.itemsize]
    for value in (2.0, 1.1, -3, True, 1e40):
        expect = np.zeros((4, 3), np_dtype)
        expect[[2, 0]] = value
        for write in WRITES:
            out = torch.zeros((4, 3), dtype=getattr(torch, dtype))
            scatter_by(write, value, [2, 0], out, tiling=(2, 1))
            got = out.view(torch.uint8).numpy().view(bits)
            np.testing.assert_array_equal(got, expect.view(bits), err_msg=f"{value} {write}")
    # torch's own assignment writes the same bfloat16.
    out, ref = torch.ones(3, dtype=torch.bfloat16), torch.ones(3, dtype=torch.bfloat16)
    dlpart.scatter(1.1, [0], out)
    ref[[0]] = 1.1
    assert torch.equal(out, ref)
    # A value numpy's assignment refuses is refused alike, and nothing is written.
    out = torch.zeros(3, dtype=getattr(torch, dtype))
    with pytest.raises(TypeError):
        np.zeros(3, np_dtype)[[0]] = 1 + 2j
    with pytest.raises(TypeError):
        dlpart.scatter(1 + 2j, [0], out)
    assert not out.view(torch.uint8).any()


def test_a_scalar_into_bfloat16_without_ml_dtypes_is_a_type_error():
    """Without ml_dtypes numpy has no bfloat16: the scalar cannot be converted, and the
    TypeError says what to pass instead."""
    import subprocess
    import sys

    pytest.importorskip("torch")  # the bfloat16 target

    code = """if True:
        import sys, torch, dlpart
        out = torch.ones(3, dtype=torch.bfloat16)
        try:
            dlpart.scatter(2.0, [0], out)
        except TypeError as e:
            print("ml_dtypes" in sys.modules, e)
        """
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120)
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == (
        "False a Python scalar is written in the target's dtype bfloat16, which numpy has no "
        "type for: pass values as a 0-d array of bfloat16"), run.stdout


def test_partitioned_scatter_names_the_shape_it_wants_and_the_one_it_got():
    pa = dlpart.partition(np.zeros((3, 2)), (2, 1))
    with pytest.raises(ValueError, match=r"values must have shape \(0, 2\) \(or values that "
                                         r"broadcast to it, as in numpy\): values of shape "
                                         r"\(2, 2\)"):
        pa.scatter(np.zeros((2, 2)), [])
    assert (np.from_dlpack(pa.assemble()) == 0).all()
