"""Property tests of `PartitionedArray.repartition` (issue 4).

Random sources (1-4 axes, every dtype, strided, negative-stride, transposed and read-only
views; cut evenly, by explicit splits or given as a `__partitioned__` dict) are repartitioned
into random targets (tilings, explicit splits with empty slabs, block-cyclic layouts) and must
assemble to the source byte for byte, into new writable tensors, leaving the source untouched.
"""

import bisect
import itertools

import numpy as np
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

import dlpart
from test_props_partitioned import DTYPES, Producer, boxes, random_array, region, same, to_numpy

SETTINGS = dict(deadline=None, derandomize=True, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


def random_splits(draw, n, max_parts):
    k = draw(st.integers(1, max_parts))
    return [0, *sorted(draw(st.lists(st.integers(0, n), min_size=k - 1, max_size=k - 1))), n]


def even_splits(n, k):
    """`numpy.array_split` boundaries: the first n % k parts are one longer."""
    sizes = [n // k + 1] * (n % k) + [n // k] * (k - n % k)
    return [0, *itertools.accumulate(sizes)]


def block_splits(n, b):
    return [0, 0] if n == 0 else [*range(0, n, b), n]


@st.composite
def sources(draw):
    """(x, ref, name, src): a numpy view `x` in some layout, a C-order copy, the dtype name, and
    what is handed to dlpart (the view itself, or a read-through DLPack producer of it)."""
    name = draw(st.sampled_from(sorted(DTYPES)))
    ndim = draw(st.integers(1, 4))
    shape = tuple(draw(st.lists(st.integers(0, 7 - ndim), min_size=ndim, max_size=ndim)))
    ref = random_array(np.random.default_rng(draw(st.integers(0, 2**32 - 1))), shape, name)
    layout = draw(st.sampled_from(["C", "F", "step", "negative", "transpose"]))
    event(f"layout {layout}")
    if layout == "F":
        x = np.asfortranarray(ref)
    elif layout == "step":
        axis = draw(st.integers(0, ndim - 1))
        big = np.zeros(tuple(2 * n if a == axis else n for a, n in enumerate(shape)), ref.dtype)
        x = big[tuple(slice(None, None, 2) if a == axis else slice(None) for a in range(ndim))]
        x[...] = ref
    elif layout == "negative":
        flip = tuple(slice(None, None, -1) if draw(st.booleans()) else slice(None)
                     for _ in range(ndim))
        x = ref[flip].copy()[flip]
    elif layout == "transpose":
        perm = draw(st.permutations(range(ndim)))
        x = ref.transpose(perm).copy().transpose(np.argsort(perm))
    else:
        x = ref.copy()
    assert same(x, ref)
    readonly = draw(st.booleans())
    if readonly:
        x.flags.writeable = False
    native = DTYPES[name][2]
    src = x if native and draw(st.booleans()) else Producer(x, DTYPES[name][1], readonly=readonly)
    return x, ref, name, src


def partitioned(draw, x, name, src):
    how = draw(st.sampled_from(["tiling", "splits", "dict"]))
    event(f"source {how}")
    if how == "tiling":
        return dlpart.partition(src, tuple(draw(st.integers(1, 3)) for _ in x.shape))
    splits = [random_splits(draw, n, 3) for n in x.shape]
    if how == "splits":
        return dlpart.partition(src, splits=splits)
    native = DTYPES[name][2]
    parts = {pos: {"start": start, "shape": shape,
                   "data": x[region(start, shape)] if native
                   else Producer(x[region(start, shape)], DTYPES[name][1])}
             for pos, start, shape in boxes(splits)}
    return dlpart.from_partitioned({"shape": x.shape, "partition_tiling": tuple(
        len(s) - 1 for s in splits), "partitions": parts})


def target(draw, shape):
    """Keyword arguments of a random target layout and the split points expected."""
    how = draw(st.sampled_from(["tiling", "splits", "block", "blocks"]))
    event(f"target {how}")
    if how == "tiling":
        tiling = tuple(draw(st.integers(1, 4)) for _ in shape)
        return {"tiling": tiling}, [even_splits(n, k) for n, k in zip(shape, tiling)]
    if how == "splits":
        splits = [random_splits(draw, n, 4) for n in shape]
        return {"splits": splits}, splits
    blocks = [draw(st.integers(1, 4))] * len(shape) if how == "block" else [
        draw(st.integers(1, 4)) for _ in shape]
    k = draw(st.integers(1, 4))
    kwargs = {"block_cyclic": blocks[0] if how == "block" else blocks,
              "devices": ["kDLCPU"] * k}
    if len(shape) > 1 and draw(st.booleans()):
        grid = [1] * len(shape)
        grid[draw(st.integers(0, len(shape) - 1))] = k
        kwargs["process_grid"] = grid
    return kwargs, [block_splits(n, b) for n, b in zip(shape, blocks)]


def span(t):
    """The byte range [lo, hi) that a non-empty tensor's elements occupy."""
    lo = sum(min(0, (n - 1) * s) for n, s in zip(t.shape, t.strides))
    hi = sum(max(0, (n - 1) * s) for n, s in zip(t.shape, t.strides)) + 1
    return t.data_ptr + lo * t.itemsize, t.data_ptr + hi * t.itemsize


def check_target(out, ref, name, splits, sources_):
    assert out.shape == ref.shape and out.dtype == name
    assert [list(s) for s in out.splits] == splits
    src_spans = [span(t) for t in sources_ if t.size]
    for pos, start, shape in boxes(splits):
        t = out.partitions[pos].tensor
        assert out.partitions[pos].start == start and t.shape == shape, pos
        assert not t.readonly and str(t.device) == "kDLCPU"
        assert same(to_numpy(t, name), ref[region(start, shape)]), pos
        if t.size:
            lo, hi = span(t)
            assert all(hi <= a or b <= lo for a, b in src_spans), "a target aliases the source"
    assert same(to_numpy(out.assemble(), name), ref)


@settings(max_examples=400, **SETTINGS)
@given(source=sources(), data=st.data())
def test_repartition_assembles_to_the_source_in_new_tensors(source, data):
    x, ref, name, src = source
    pa = partitioned(data.draw, x, name, src)
    kwargs, splits = target(data.draw, x.shape)
    out = pa.repartition(**kwargs)
    source_tensors = pa.tensors()
    check_target(out, ref, name, splits, source_tensors)
    if DTYPES[name][2]:
        for t in out.tensors():  # targets are writable, and writing them leaves the source be
            np.from_dlpack(t)[...] = np.zeros((), x.dtype)
    assert same(x, ref), "the source changed"
    assert same(to_numpy(pa.assemble(), name), ref)


# kDLCPU:1 to kDLCPU:5 stand for a framework's emulated host devices (JAX's CPU devices, which
# the JAX adapter notes the same way): distinct devices whose memory the test can read. New
# pinned kDLCUDAHost memory comes from CUDA: a target only where CUDA is.
CUDA_HERE = dlpart.backend_status("kDLCUDA:0") is None
HOST = ["kDLCPU", "kDLCPU:1", "kDLCPU:2"] + (["kDLCUDAHost"] if CUDA_HERE else [])
dlpart._core._note_host_devices(6)


@pytest.mark.parametrize("device", ["kDLCUDAHost", "kDLCUDAManaged", "kDLROCMHost"])
def test_new_memory_is_never_plain_memory_labelled_pinned_or_managed(device):
    x = np.arange(12.0).reshape(4, 3)
    pa = dlpart.partition(x, (2, 1))
    if device == "kDLCUDAHost" and CUDA_HERE:
        out = pa.repartition((1, 1), devices=[device], transfer=True)
        assert str(out.devices[0]) == "kDLCUDAHost:0"
        np.testing.assert_array_equal(np.from_dlpack(out.assemble(device="kDLCPU",
                                                                  transfer=True)), x)
        return
    # pinned memory without CUDA, or a kind dlpart does not allocate: refused, naming it
    expected = (dlpart.BackendUnavailableError if device == "kDLCUDAHost" else BufferError)
    for call in (lambda: pa.repartition((1, 1), devices=[device], transfer=True),
                 lambda: pa.to(device), lambda: pa.assemble(device=device, transfer=True)):
        with pytest.raises(expected, match=device):
            call()


@settings(max_examples=200, **SETTINGS)
@given(source=sources(), data=st.data())
def test_explicit_devices_and_transfers(source, data):
    x, ref, name, src = source
    pa = partitioned(data.draw, x, name, src)
    kwargs, splits = target(data.draw, x.shape)
    for key in ("block_cyclic", "process_grid", "devices"):
        kwargs.pop(key, None)
    if "tiling" not in kwargs and "splits" not in kwargs:
        kwargs["splits"] = splits
    n = int(np.prod([len(s) - 1 for s in splits]))
    devices = data.draw(st.lists(st.sampled_from(HOST + ["kDLCUDA:0"]), min_size=n, max_size=n))
    sizes = [int(np.prod(shape)) for _, _, shape in boxes(splits)]
    # Data moving to device memory crosses devices; data moving between host memory of any
    # kinds (kDLCPU:k, pinned) is a plain copy, which needs no transfer=True.
    crossing = {d for d, size in zip(devices, sizes) if size and d not in HOST}

    event("crossing" if crossing else "no crossing")
    if crossing:
        # without transfer=True: refused before anything is allocated or written
        with pytest.raises(dlpart.DeviceError) as e:
            pa.repartition(devices=devices, **kwargs)
        for d in crossing:
            assert f"kDLCPU -> {d}" in str(e.value), str(e.value)
        assert same(x, ref)
    if "kDLCUDA:0" in devices:
        return  # a CUDA target needs the cuda build and a GPU
    # empty partitions move no data, and host targets get theirs by plain copies: neither
    # needs transfer=True
    transfer = data.draw(st.booleans())
    out = pa.repartition(devices=devices, transfer=transfer, **kwargs)
    assert [str(p.device) for p in out.partitions.values()] == devices
    for (pos, start, shape), t in zip(boxes(splits), out.tensors()):
        on_cpu = dlpart.from_dlpack(t, device="kDLCPU")  # host memory, read in place
        assert same(to_numpy(on_cpu, name), ref[region(start, shape)]), pos
    if len(set(devices)) > 1:
        with pytest.raises(dlpart.DeviceError):
            out.assemble()
    assert same(to_numpy(out.assemble(device="kDLCPU", transfer=transfer), name), ref)

    # Without devices=, each target partition stays on the device of the source partition
    # holding its first element.
    tiling = tuple(data.draw(st.integers(1, 3)) for _ in x.shape)
    back = out.repartition(tiling=tiling, transfer=transfer)
    new_splits = [even_splits(n, k) for n, k in zip(x.shape, tiling)]
    dev_of = dict(zip((pos for pos, _, _ in boxes(splits)), devices))
    for pos, start, shape in boxes(new_splits):
        t = back.partitions[pos].tensor
        if t.size:
            home = tuple(bisect.bisect_right(s, i) - 1 for s, i in zip(splits, start))
            assert str(t.device) == dev_of[home], (pos, home)
        assert same(to_numpy(dlpart.from_dlpack(t, device="kDLCPU"), name),
                    ref[region(start, shape)]), pos
    assert same(x, ref)


def default_process_grid(ndim, k):
    """As documented for `block_cyclic`: all devices along axis 0 in 1-d; else a near-square
    P0 x P1 over the first two axes, P0 <= P1 the largest divisor of k not above sqrt(k)."""
    if ndim == 1:
        return [k]
    p0 = max(p for p in range(1, k + 1) if k % p == 0 and p * p <= k)
    return [p0, k // p0] + [1] * (ndim - 2)


@settings(max_examples=150, **SETTINGS)
@given(source=sources(), data=st.data())
def test_block_cyclic_deals_blocks_round_robin_over_the_process_grid(source, data):
    x, ref, name, src = source
    pa = partitioned(data.draw, x, name, src)
    ndim, k = x.ndim, data.draw(st.integers(1, 6))
    blocks = [data.draw(st.integers(1, 3)) for _ in range(ndim)]
    grid = None
    if data.draw(st.booleans()):  # a random factorisation of k over the axes
        grid, rest = [], k
        for _ in range(ndim - 1):
            grid.append(data.draw(st.sampled_from([p for p in range(1, rest + 1)
                                                   if rest % p == 0])))
            rest //= grid[-1]
        grid = data.draw(st.permutations(grid + [rest]))
    devices = [f"kDLCPU:{i}" for i in range(k)]  # distinct, host memory: owners can be read
    out = pa.repartition(block_cyclic=blocks, devices=devices, process_grid=grid,
                         transfer=True)
    pg = grid or default_process_grid(ndim, k)
    splits = [block_splits(n, b) for n, b in zip(x.shape, blocks)]
    assert [list(s) for s in out.splits] == splits
    for pos, start, shape in boxes(splits):
        owner = 0
        for i, p in zip(pos, pg):
            owner = owner * p + i % p
        t = out.partitions[pos].tensor
        assert str(t.device) == str(dlpart.Device(devices[owner])), (pos, pg)
        assert same(to_numpy(dlpart.from_dlpack(t, device="kDLCPU"), name),
                    ref[region(start, shape)]), pos
    assert same(x, ref)
