"""Property tests of the `__partitioned__` protocol (issue 3).

Random grids (1-4 axes, uneven splits, empty slabs, several partitions per process) are built
as dicts, consumed, produced again, pickled and consumed once more; the result must assemble to
the numpy reference byte for byte. Random corruptions of valid dicts must raise
`dlpart.ProtocolError` naming the key (and position), and every DLPack capsule handed out must
be deleted exactly once.

numpy cannot export bfloat16 or float8 arrays through DLPack (it raises BufferError for
ml_dtypes), so those dtypes travel in `_testing.make_capsule` capsules over raw bytes, and the
reference is the same bytes held in an unsigned integer array of the same item size.
"""

import ctypes
import gc
import itertools
import pickle
import re

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

import dlpart
from dlpart._core import _testing
from dlpack_ctypes import read

SETTINGS = dict(deadline=None, derandomize=True, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                       HealthCheck.function_scoped_fixture])

# name -> (numpy storage dtype, DLPack (code, bits, lanes), numpy exports it through DLPack)
DTYPES = {
    "bool": (np.bool_, (6, 8, 1), True),
    **{f"int{b}": (np.dtype(f"int{b}"), (0, b, 1), True) for b in (8, 16, 32, 64)},
    **{f"uint{b}": (np.dtype(f"uint{b}"), (1, b, 1), True) for b in (8, 16, 32, 64)},
    **{f"float{b}": (np.dtype(f"float{b}"), (2, b, 1), True) for b in (16, 32, 64)},
    "complex64": (np.complex64, (5, 64, 1), True),
    "complex128": (np.complex128, (5, 128, 1), True),
    "bfloat16": (np.uint16, (4, 16, 1), False),
    **{name: (np.uint8, (code, 8, 1), False) for code, name in enumerate(
        ["float8_e3m4", "float8_e4m3", "float8_e4m3b11fnuz", "float8_e4m3fn", "float8_e4m3fnuz",
         "float8_e5m2", "float8_e5m2fnuz", "float8_e8m0fnu"], start=7)},
}


def random_array(rng, shape, name):
    storage = np.dtype(DTYPES[name][0])
    if name == "bool":
        return rng.integers(0, 2, size=shape).astype(bool)
    raw = rng.integers(0, 256, size=int(np.prod(shape)) * storage.itemsize, dtype=np.uint8)
    return raw.view(storage).reshape(shape)


def laid_out(a, layout):
    """`a` copied into a C, Fortran, reversed (negative strides) or step-2 strided layout."""
    if layout == "F":
        return np.asfortranarray(a)
    if layout == "reversed":
        return np.ascontiguousarray(a[(slice(None, None, -1),) * a.ndim])[
            (slice(None, None, -1),) * a.ndim]
    if layout == "step2":
        big = np.zeros((2 * a.shape[0],) + a.shape[1:], a.dtype)
        big[::2] = a
        return big[::2]
    return np.ascontiguousarray(a)


class Producer:
    """A DLPack producer whose capsules come from `_testing.make_capsule` (counted deleters),
    carrying a copy of the memory under the numpy view `a` with `a`'s strides."""

    handed = 0

    def __init__(self, a, code, readonly=False):
        self.shape, self.code, self.readonly = list(a.shape), code, readonly
        item = a.itemsize
        if a.size == 0:
            self.data, self.offset, self.strides = b"", 0, [1] * a.ndim
            return
        lo = sum(min(0, (n - 1) * s) for n, s in zip(a.shape, a.strides))
        hi = sum(max(0, (n - 1) * s) for n, s in zip(a.shape, a.strides)) + item
        self.data = ctypes.string_at(a.ctypes.data + lo, hi - lo)
        self.offset = -lo
        self.strides = [s // item for s in a.strides]

    def __dlpack__(self, *, stream=None, max_version=None, dl_device=None, copy=None):
        Producer.handed += 1
        versioned = max_version is not None and max_version[0] >= 1
        return _testing.make_capsule(
            self.data, self.shape, strides=self.strides, dtype=self.code, byte_offset=self.offset,
            version=(1, 3) if versioned else None, flags=1 if self.readonly and versioned else 0)

    def __dlpack_device__(self):
        return (1, 0)


class Handle:
    """A future-like handle: no DLPack, resolved only through the dict's `get`."""

    def __init__(self, obj):
        self.obj = obj


def resolve(handles):
    return [h.obj for h in handles] if isinstance(handles, (list, tuple)) else handles.obj


def to_numpy(t, name):
    """A numpy copy of the dlpart tensor `t` (read through ctypes for dtypes numpy lacks)."""
    storage, _, native = DTYPES[name]
    if native:
        return np.from_dlpack(t).copy()
    cap = t.__dlpack__(max_version=(1, 3))
    _, f = read(cap)
    shape, item = f["shape"], np.dtype(storage).itemsize
    if int(np.prod(shape)) == 0:
        return np.empty(shape, storage)
    strides = f["strides"] or tuple(int(np.prod(shape[a + 1:])) for a in range(len(shape)))
    lo = sum(min(0, (n - 1) * s) for n, s in zip(shape, strides))
    hi = sum(max(0, (n - 1) * s) for n, s in zip(shape, strides)) + 1
    base = np.frombuffer(ctypes.string_at(f["data"] + f["byte_offset"] + lo * item,
                                          (hi - lo) * item), storage)
    return np.lib.stride_tricks.as_strided(
        base[-lo:], shape, [s * item for s in strides]).copy()


@pytest.fixture(autouse=True)
def _no_earlier_garbage():
    """A full collection once per test, so that capsules dropped by earlier tests are not
    counted in an example's deleter calls; examples collect only the young generations
    (a full collection costs ~0.1 s with hypothesis loaded)."""
    gc.collect()


def mark():
    gc.collect(1)
    return _testing.deleter_calls(), Producer.handed


def all_released(since):
    """Whether exactly the capsules handed out since `since` (a `mark()`) were deleted."""
    deleted, handed = since
    for generation in (1, 2):
        gc.collect(generation)
        if _testing.deleter_calls() - deleted == Producer.handed - handed:
            return True
    return False


def same(a, b):
    return a.shape == b.shape and a.tobytes() == b.tobytes()


@st.composite
def split_points(draw, max_ndim=4, max_len=6):
    ndim = draw(st.integers(1, max_ndim))
    max_k = {1: 5, 2: 4, 3: 3, 4: 2}[ndim]
    splits = []
    for _ in range(ndim):
        n = draw(st.integers(0, max_len))
        k = draw(st.integers(1, max_k))
        cuts = sorted(draw(st.lists(st.integers(0, n), min_size=k - 1, max_size=k - 1)))
        splits.append([0, *cuts, n])
    return splits


def boxes(splits):
    """(position, start, shape) of every partition, C order."""
    for pos in itertools.product(*(range(len(s) - 1) for s in splits)):
        start = tuple(splits[a][i] for a, i in enumerate(pos))
        shape = tuple(splits[a][i + 1] - splits[a][i] for a, i in enumerate(pos))
        yield pos, start, shape


def region(start, shape):
    return tuple(slice(s, s + n) for s, n in zip(start, shape))


def location(proc, device="kDLCPU:0"):
    return (f"10.0.0.{proc + 1}", 4000 + proc, device)


def make_dict(draw, splits, name, kinds, seed):
    """A valid dict over `splits`; returns it, the reference array and the locations given."""
    shape = tuple(s[-1] for s in splits)
    ref = random_array(np.random.default_rng(seed), shape, name)
    view = laid_out(ref, draw(st.sampled_from(["C", "F", "reversed", "step2"])))
    code = DTYPES[name][1]
    nprocs = draw(st.integers(1, 3))
    as_int = draw(st.sampled_from([int, np.int64, np.int32]))
    entries, locs = [], {}
    for pos, start, pshape in boxes(splits):
        part = view[region(start, pshape)]
        usable = kinds if DTYPES[name][2] else [k for k in kinds if k != "numpy"]
        kind = draw(st.sampled_from(usable))
        data = {"numpy": lambda: part,
                "producer": lambda: Producer(part, code),
                "tensor": lambda: dlpart.from_dlpack(Producer(part, code)),
                "handle": lambda: Handle(Producer(part, code))}[kind]()
        procs = draw(st.lists(st.integers(0, nprocs - 1), min_size=1, max_size=2, unique=True))
        locs[pos] = [location(p, draw(st.sampled_from(["kDLCPU", "kDLCPU:0"]))) for p in procs]
        entries.append((tuple(as_int(i) for i in pos), {
            "start": tuple(as_int(i) for i in start),
            "shape": list(pshape) if draw(st.booleans()) else pshape,
            "data": data,
            "location": locs[pos],
        }))
    order = draw(st.permutations(range(len(entries))))
    d = {"shape": shape, "partition_tiling": tuple(len(s) - 1 for s in splits),
         "partitions": dict(entries[i] for i in order), "get": resolve}
    return d, ref, locs


def check_array(pa, splits, name, ref, locs):
    shape = tuple(s[-1] for s in splits)
    assert pa.shape == shape and pa.dtype == name
    assert pa.tiling == tuple(len(s) - 1 for s in splits)
    assert [list(s) for s in pa.splits] == splits
    for pos, start, pshape in boxes(splits):
        p = pa.partitions[pos]
        assert p.start == start and p.shape == pshape
        assert same(to_numpy(p.tensor, name), ref[region(start, pshape)]), pos
        got = [(l.host, l.pid, l.device) for l in p.locations]
        assert got == [(h, pid, dlpart.Device(dev)) for h, pid, dev in locs[pos]], pos
    out = pa.assemble()
    assert out.dtype == name and out.shape == shape and not out.readonly
    assert same(to_numpy(out, name), ref)


@settings(max_examples=120, **SETTINGS)
@given(splits=split_points(), name=st.sampled_from(sorted(DTYPES)), seed=st.integers(0, 2**32 - 1),
       data=st.data())
def test_produce_pickle_consume_assembles_to_the_reference(splits, name, seed, data):
    since = mark()
    d, ref, locs = make_dict(data.draw, splits, name, ["numpy", "producer", "tensor", "handle"],
                             seed)
    pa = dlpart.from_partitioned(d)
    handles = {plain(k) for k, e in d["partitions"].items() if isinstance(e["data"], Handle)}
    assert {pos for pos, p in pa.partitions.items() if p.tensor is None} == handles
    assert all(p.handle is not None for p in pa.partitions.values() if p.tensor is None)
    assert pa.fetch() is pa
    views = [(plain(k), e["data"]) for k, e in d["partitions"].items()
             if isinstance(e["data"], np.ndarray) and e["data"].size]
    for pos, view in views:
        # numpy partitions are imported zero-copy
        assert pa.partitions[pos].tensor.data_ptr == view.ctypes.data
    check_array(pa, splits, name, ref, locs)

    produced = pa.__partitioned__
    dlpart.validate(produced)
    again = dlpart.from_partitioned(pickle.loads(pickle.dumps(produced)))
    check_array(again, splits, name, ref, locs)
    # the consumer of the pickled dict produces an equivalent dict once more
    third = dlpart.from_partitioned(pickle.loads(pickle.dumps(again.__partitioned__)))
    check_array(third, splits, name, ref, locs)

    del d, views, pa, produced, again, third
    assert all_released(since)


# -- corruptions ---------------------------------------------------------------------------------

class IntLike:
    """An int for `operator.index` that is not equal to the int: two positions made of these
    and of ints are distinct dict keys naming the same grid position."""

    def __init__(self, i):
        self.i = i

    def __index__(self):
        return self.i

    def __repr__(self):
        return repr(self.i)


ANY = "any position"
# Where a corruption is found: while parsing (no data imported), in the locations (`validate`
# finds it; `from_partitioned` checks each entry's location after importing its data), or only
# once the data is imported (shape and dtype of the data).
PARSE, LOCATIONS, DATA = "parse", "locations", "data"


def plain(position):
    return tuple(int(i) for i in position)

BAD_INTS = ["a", 1.5, None, True, np.float64(2.0), "3", 2**63, -(2**64), 10**30]
BAD_DEVICES = ["kDLFoo:0", "kDLCPU:x", "kDLCUDA:-1", "", "cuda:0", "kDLCPU:0:1", 7, None]


def like(old, producer):
    return Handle(producer) if isinstance(old, Handle) else producer


def corrupt(kind, draw, d, splits, name, seed):
    """Breaks `d` in place in one random way. Returns (keys, positions, stage): the message must
    quote one of `keys` and, unless `positions` is None, name one of `positions` (ANY: some grid
    position); `stage` says where it is found (PARSE, LOCATIONS or DATA)."""
    parts = d["partitions"]
    order = [plain(k) for k in parts]
    pos = draw(st.sampled_from(order))
    entry = parts[pos]
    nd = len(splits)
    axis = draw(st.integers(0, nd - 1))
    tiling = d["partition_tiling"]
    if kind in ("duplicate", "mixed_dtype"):
        assume(len(order) > 1)

    def replace(t, v):
        return tuple(v if a == axis else x for a, x in enumerate(t))

    if kind == "drop":
        del parts[pos]
        return ("partitions",), {pos}, PARSE
    if kind == "duplicate":
        other = draw(st.sampled_from([p for p in order if p != pos]))
        parts[tuple(IntLike(i) for i in other)] = parts.pop(pos)
        return ("partitions",), {pos, other}, PARSE
    if kind in ("shift_start", "change_shape"):
        key = "start" if kind == "shift_start" else "shape"
        old = tuple(entry[key])
        entry[key] = replace(old, old[axis] + draw(st.sampled_from([-2, -1, 1, 2])))
        return ("start", "shape"), ANY, PARSE
    if kind == "wrong_ndim":
        how = draw(st.sampled_from(["start+", "start-", "shape+", "shape-", "key+", "key-",
                                    "global", "tiling"]))
        if how[:-1] in ("start", "shape"):
            old = tuple(entry[how[:-1]])
            entry[how[:-1]] = old + (0,) if how[-1] == "+" else old[:-1]
            return (how[:-1],), {pos}, PARSE
        if how.startswith("key"):
            new = pos + (0,) if how == "key+" else pos[:-1]
            parts[new] = parts.pop(pos)
            return ("partitions",), {pos, new}, PARSE
        if how == "global":
            d["shape"] = tuple(d["shape"]) + (1,)
        else:
            d["partition_tiling"] = tuple(tiling)[:-1]
        return ("partition_tiling", "shape"), None, PARSE
    if kind == "negative":
        how = draw(st.sampled_from(["start", "shape", "global", "tiling", "key"]))
        v = draw(st.integers(-3, -1))
        if how in ("start", "shape"):
            entry[how] = replace(tuple(entry[how]), v)
            return (how,), {pos}, PARSE
        if how == "global":
            d["shape"] = replace(d["shape"], v)
            return ("shape",), None, PARSE
        if how == "tiling":
            d["partition_tiling"] = replace(tiling, v + 1)
            return ("partition_tiling",), None, PARSE
        new = replace(pos, v)
        parts[new] = parts.pop(pos)
        return ("partitions",), {pos, new}, PARSE
    if kind == "bad_device":
        bad = draw(st.sampled_from(BAD_DEVICES + ["tpu:1", "cpu:x"]))
        if isinstance(bad, str) and bad[:3] in ("tpu", "cpu"):
            entry["device"] = bad  # heat's extra key, in a framework's own spelling
            return ("device",), {pos}, LOCATIONS
        entry["location"] = [location(0), ("10.0.0.9", 12, bad)]
        return ("location",), {pos}, LOCATIONS
    if kind == "data_shape":
        shape = list(entry["shape"])
        shape[axis] += draw(st.integers(1, 2))
        rng = np.random.default_rng(seed)
        entry["data"] = like(entry["data"], Producer(random_array(rng, shape, name),
                                                      DTYPES[name][1]))
        return ("partitions",), {pos}, DATA
    if kind == "mixed_dtype":
        other = draw(st.sampled_from(sorted(n for n in DTYPES if n != name)))
        rng = np.random.default_rng(seed)
        entry["data"] = like(entry["data"], Producer(
            random_array(rng, tuple(entry["shape"]), other), DTYPES[other][1]))
        # the first data imported sets the dtype: arrays as the dict is read, then handles
        handle = [isinstance(e["data"], Handle) for e in parts.values()]
        seq = sorted(range(len(order)), key=lambda i: handle[i])
        second = order[seq[1]] if order[seq[0]] == pos else pos
        return ("partitions",), {pos, second}, DATA
    if kind == "non_int":
        bad = draw(st.sampled_from(BAD_INTS))
        how = draw(st.sampled_from(["start", "shape", "global", "tiling", "key", "whole", "pid"]))
        if how in ("start", "shape"):
            entry[how] = replace(tuple(entry[how]), bad)
            return (how,), {pos}, PARSE
        if how == "whole":
            entry["start"] = draw(st.sampled_from([3.5, None, object(), "ab"]))
            return ("start",), {pos}, PARSE
        if how == "pid":
            entry["location"] = [("10.0.0.1", draw(st.sampled_from(["12", 1.0, None])),
                                  "kDLCPU")]
            return ("location",), {pos}, LOCATIONS
        if how == "key":
            parts[replace(pos, bad)] = parts.pop(pos)
            return ("partitions",), None, PARSE
        key = "shape" if how == "global" else "partition_tiling"
        d[key] = replace(tuple(d[key]), bad)
        return (key,), None, PARSE
    if kind == "locals":
        how = draw(st.sampled_from(["outside", "negative", "ndim", "twice", "not_list", "big"]))
        bad = {"outside": replace(pos, tiling[axis]), "negative": replace(pos, -1),
               "ndim": pos + (0,), "big": replace(pos, 2**64)}.get(how)
        if how == "twice":
            d["locals"] = [pos, pos]
            return ("locals",), {pos}, PARSE
        if how == "not_list":
            d["locals"] = draw(st.sampled_from([3, "a", 1.5]))
            return ("locals",), None, PARSE
        d["locals"] = [p for p in order if p != pos][:1] + [bad]
        return ("locals",), None if how == "big" else {bad}, PARSE
    if kind == "missing_key":
        key = draw(st.sampled_from(["shape", "partition_tiling", "partitions", "start", "e_shape",
                                    "data"]))
        if key in ("start", "e_shape", "data"):
            del entry[key.replace("e_", "")]
            return (key.replace("e_", ""),), {pos}, PARSE
        del d[key]
        return (key,), None, PARSE
    # not_mapping
    how = draw(st.sampled_from(["partitions", "entry", "get"]))
    if how == "partitions":
        d["partitions"] = list(parts.values())
        return ("partitions",), None, PARSE
    if how == "entry":
        parts[pos] = [entry["start"], entry["shape"]]
        return ("partitions",), {pos}, PARSE
    d["get"] = 5
    return ("get",), None, PARSE


def raised(f):
    """The exception `f()` raises (its traceback included), or None."""
    try:
        f()
    except Exception as e:  # noqa: BLE001 - the test is that only ProtocolError arrives
        return e
    return None


CORRUPTIONS = ["drop", "duplicate", "shift_start", "change_shape", "wrong_ndim", "negative",
               "bad_device", "data_shape", "mixed_dtype", "non_int", "locals", "missing_key",
               "not_mapping"]


@pytest.mark.parametrize("kind", CORRUPTIONS)
@settings(max_examples=40, **SETTINGS)
@given(splits=split_points(max_ndim=3, max_len=5), name=st.sampled_from(sorted(DTYPES)),
       seed=st.integers(0, 2**32 - 1), data=st.data())
def test_corrupted_dicts_raise_protocol_error_and_release_every_capsule(kind, splits, name, seed,
                                                                        data):
    d, _, _ = make_dict(data.draw, splits, name, ["producer", "handle"], seed)
    keys, positions, stage = corrupt(kind, data.draw, d, splits, name, seed)

    since = mark()
    err = raised(lambda: dlpart.validate(d))
    if stage == PARSE:
        assert Producer.handed == since[1], "the dict's structure is checked before any import"
    # validate imports the arrays held here to check them: it finds what from_partitioned
    # finds in them (behind handles it cannot look), and keeps none of them.
    if stage != DATA or not any(isinstance(e["data"], Handle) for e in d["partitions"].values()):
        assert type(err) is dlpart.ProtocolError, repr(err)
    assert all_released(since), "validate keeps no capsule"
    del err

    # The error is held (as pytest.raises or a REPL would) while the capsules are counted:
    # nothing in its traceback may keep imported data alive. Handles are imported by fetch,
    # whose traceback rightly keeps the array (and the data imported before) alive.
    pa, err = None, raised(lambda: dlpart.from_partitioned(d))
    if err is None:
        pa = dlpart.from_partitioned(d)
        fetching = mark()
        err = raised(pa.fetch)
    assert type(err) is dlpart.ProtocolError, repr(err)
    msg = str(err)
    assert any(re.search(rf"""['"]{k}['"]""", msg) for k in keys), (keys, msg)
    if positions == ANY:
        assert re.search(r"at position \(", msg), msg
    elif positions is not None:
        assert any(str(p) in msg for p in positions), (positions, msg)
    if stage == PARSE:
        assert Producer.handed == since[1], "the dict's structure is checked before any import"
    assert all_released(since if pa is None else fetching), msg
    del err, pa
    assert all_released(since), msg


def test_ints_outside_64_bits_and_bools_are_protocol_errors():
    """Not OverflowError from the conversion to i64, and bools are not lengths."""
    x = np.arange(4.0)

    def make(**entry):
        return {"shape": (4,), "partition_tiling": (1,),
                "partitions": {(0,): {"start": (0,), "shape": (4,), "data": x, **entry}}}

    for entry, key in [({"start": (2**63,)}, "start"), ({"shape": (10**30,)}, "shape"),
                       ({"start": (False,)}, "start"), ({"shape": (np.bool_(True),)}, "shape")]:
        with pytest.raises(dlpart.ProtocolError,
                           match=rf"""\[['"]{key}['"]\] at position \(0,\)"""):
            dlpart.from_partitioned(make(**entry))
    d = make()
    d["shape"] = (2**64,)
    with pytest.raises(dlpart.ProtocolError,
                       match=r"""\[['"]shape['"]\]: .*18446744073709551616"""):
        dlpart.from_partitioned(d)
