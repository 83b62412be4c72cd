"""Fuzzing of the `__partitioned__` consumer, and of the planner through the Python API.

Each case starts from a valid dict over a random numpy array (1-3 axes, uneven and empty slabs,
data as arrays, views or handles resolved through `get`, locations in every form found in the
wild), then mutates it up to three times anywhere in its nesting: a key dropped or added, a
value replaced by junk (None, bools, huge ints, floats, strings, deep lists, numpy scalars and
arrays, objects whose every special method raises), an int moved by one or made huge or
negative, an array swapped for another shape, dtype or layout, a `get` that raises or returns
junk, `locals` made inconsistent.

`validate` and `from_partitioned(...).assemble()` must then either give the data a plain numpy
reading of the same dict gives (each element written exactly once), or raise one of dlpart's
error types (or `BufferError`/`MemoryError`): any other exception, a pyo3 `PanicException` (a
`BaseException`) or a crash fails the run. A dict `validate` refuses must not import. Accepted
arrays are also repartitioned into random layouts (the planner) and compared with numpy.

Derandomised with no example database: the same cases run on every run, and the `@example`s
keep the inputs that once failed.
"""

import operator

import numpy as np
import pytest

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, event, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

import dlpart  # noqa: E402

SETTINGS = dict(deadline=None, derandomize=True, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])

# What a consumer of dlpart may be handed for a bad dict; nothing else.
ALLOWED = (dlpart.ProtocolError, dlpart.DeviceError, dlpart.BackendUnavailableError, BufferError,
           MemoryError)


class Boom(Exception):
    """Raised by user objects inside a dict: must arrive wrapped in a dlpart error."""


class Hostile:
    """Every special method dlpart might call raises (its repr only while dlpart runs, so that
    hypothesis can still print the case)."""

    armed = False

    def _boom(self, *args, **kwargs):
        raise Boom("hostile object")

    def __repr__(self):
        if Hostile.armed:
            self._boom()
        return "Hostile()"

    __index__ = __int__ = __float__ = __len__ = __iter__ = __getitem__ = __bool__ = _boom
    __str__ = __dlpack__ = __dlpack_device__ = __array__ = _boom
    __partitioned__ = property(_boom)


class Handle:
    """A handle (as a Dask future or Ray ObjectRef would be): resolved only through `get`."""

    def __init__(self, array):
        self.array = array


def fetch(handles):
    """The dict's `get`: dlpart asks for several handles at once, as `ray.get` takes them."""
    if isinstance(handles, list):
        return [fetch(h) for h in handles]
    return handles.array


def raising_get(handles):
    raise Boom("get failed")


def junk_get(handles):
    return "not an array"


def deep(n):
    x = []
    for _ in range(n):
        x = [x]
    return x


JUNK = st.one_of(
    st.none(), st.booleans(), st.integers(-(2**70), 2**70), st.floats(allow_nan=True),
    st.text(max_size=6), st.binary(max_size=4),
    st.sampled_from([(), [], {}, Hostile(), object(), np.int64(2), np.float32(1.5),
                     np.zeros(2), np.zeros((2, 2), object), deep(300), "kDLCUDA:0",
                     ("h", 1, "kDLCUDA:0"), ("h", True), ("h", 1.0), (1, 2, 3, 4), Handle(None),
                     raising_get, junk_get, fetch, [(0,)], {(0,): {}}]),
    st.recursive(st.integers(-3, 3) | st.none(),
                 lambda c: st.lists(c, max_size=3) | st.tuples(c, c)
                 | st.dictionaries(st.sampled_from(["start", "shape", "data", 0]), c, max_size=2),
                 max_leaves=6),
)

LOCATIONS = [[("127.0.0.1", 0, "kDLCPU")], [("h", 7)], "10.0.0.1", 0, [("h", 1), ("h", 2)],
             [("h", 1, "kDLCPU:0")], []]


@st.composite
def valid_dicts(draw):
    """(dict, reference array): a valid `__partitioned__` dict and the array it holds."""
    ndim = draw(st.integers(1, 3))
    shape = tuple(draw(st.lists(st.integers(0, 5), min_size=ndim, max_size=ndim)))
    dtype = draw(st.sampled_from([np.int32, np.float64, np.uint8, np.bool_]))
    ref = (np.arange(int(np.prod(shape))) % 251).astype(dtype).reshape(shape)
    splits = []
    for n in shape:
        k = draw(st.integers(1, 3))
        splits.append([0, *sorted(draw(st.lists(st.integers(0, n), min_size=k - 1,
                                                 max_size=k - 1))), n])
    tiling = tuple(len(s) - 1 for s in splits)
    handles = draw(st.booleans())
    parts = {}
    for pos in np.ndindex(*tiling):
        start = tuple(splits[a][i] for a, i in enumerate(pos))
        size = tuple(splits[a][i + 1] - splits[a][i] for a, i in enumerate(pos))
        block = ref[tuple(slice(s, s + n) for s, n in zip(start, size))]
        form = draw(st.sampled_from(["view", "copy", "fortran", "readonly"]))
        if form == "copy":
            block = block.copy()
        elif form == "fortran":
            block = np.asfortranarray(block)
        elif form == "readonly":
            block = block.copy()
            block.flags.writeable = False
        parts[tuple(int(i) for i in pos)] = {
            "start": start, "shape": size, "data": Handle(block) if handles else block,
            "location": draw(st.sampled_from(LOCATIONS))}
    d = {"shape": shape, "partition_tiling": tiling, "partitions": parts}
    if handles:
        d["get"] = fetch
    return d, ref


def mutate_value(draw, x, depth=0):
    """`x` changed somewhere inside (new containers: the original stays as it was); at
    depth -1 (the dict itself) never replaced as a whole."""
    if depth > 4 or depth >= 0 and draw(st.integers(0, 5)) == 0:
        return draw(JUNK)
    if isinstance(x, bool):
        return not x
    if isinstance(x, int):
        return draw(st.sampled_from([x + 1, x - 1, -x - 1, 2**63, 2**64, float(x), True, None]))
    if isinstance(x, np.ndarray):
        return draw(st.sampled_from([
            x.T, x[::-1] if x.ndim else x, x.astype(np.int64), x.astype(object),
            x.reshape(-1), np.zeros(x.shape + (1,), x.dtype), x[..., :1] if x.ndim else x,
            np.lib.stride_tricks.as_strided(x, x.shape, (0,) * x.ndim)]))
    if isinstance(x, Handle):
        return Handle(mutate_value(draw, x.array, depth + 1))
    if isinstance(x, dict):
        x = dict(x)
        action = draw(st.sampled_from(["change", "change", "drop", "add"]))
        keys = list(x)
        if action == "add" or not keys:
            key = draw(st.one_of(st.sampled_from(["start", "shape", "data", "location", "get",
                                                 "locals", "extra", "device", "dtype", None,
                                                 True, 1.5, Hostile(), (0, 0), ("a",)]),
                                 st.tuples(st.integers(-1, 3)), st.integers(-2, 2**64)))
            x[key] = draw(JUNK)
        elif action == "drop":
            del x[draw(st.sampled_from(keys))]
        else:
            # Mostly into the partitions: most of what can go wrong is there.
            inner = depth < 0 and "partitions" in x and draw(st.booleans())
            key = "partitions" if inner else draw(st.sampled_from(keys))
            x[key] = mutate_value(draw, x[key], depth + 1)
        return x
    if isinstance(x, (list, tuple)):
        items = list(x)
        action = draw(st.sampled_from(["change", "change", "drop", "append", "repeat"]))
        if action == "append" or not items:
            items.append(draw(JUNK))
        elif action == "drop":
            del items[draw(st.integers(0, len(items) - 1))]
        elif action == "repeat":
            items.append(items[draw(st.integers(0, len(items) - 1))])
        else:
            i = draw(st.integers(0, len(items) - 1))
            items[i] = mutate_value(draw, items[i], depth + 1)
        return type(x)(items)
    return draw(JUNK)


def reference(d):
    """The array a plain numpy reading of `d` gives, each element written exactly once; None
    when numpy cannot read it that way."""
    def ints(x):  # a bare int stands for a 1-tuple, as numpy reads shapes (and dlpart too)
        try:
            return (operator.index(x),)
        except TypeError:
            return tuple(operator.index(n) for n in x)

    try:
        shape = ints(d["shape"])
        out, seen = None, np.zeros(shape, np.int64)
        for entry in d["partitions"].values():
            data = entry["data"]
            if isinstance(data, Handle):
                data = d["get"](data)
            block = np.asarray(data)
            region = tuple(slice(s, s + n)
                           for s, n in zip(ints(entry["start"]), ints(entry["shape"]),
                                           strict=True))
            if out is None:
                out = np.zeros(shape, block.dtype)
            out[region] = block
            seen[region] += 1
        if out is None:
            return None if seen.size else np.zeros(shape)
        return out if (seen == 1).all() else None
    except Exception:  # noqa: BLE001 - the reference gives up; dlpart must then refuse
        return None


def attempt(f):
    """(result, None) or (None, error) for a dlpart error; anything else propagates."""
    Hostile.armed = True
    try:
        return f(), None
    except ALLOWED as e:
        return None, e
    finally:
        Hostile.armed = False


def check(d):
    """("accepted", the data) or ("refused: <error type>", None); fails on anything else."""
    _, refused = attempt(lambda: dlpart.validate(d))
    pa, err = attempt(lambda: dlpart.from_partitioned(d))
    if refused is not None:
        assert err is not None, f"validate refused ({refused!r}), from_partitioned accepted"
    got = None
    if pa is not None:
        got, err = attempt(lambda: np.asarray(pa.assemble()))
    if got is None:
        cause = f" from {type(err.__cause__).__name__}" if err.__cause__ else ""
        return f"refused: {type(err).__name__}{cause}", None
    want = reference(d)
    assert want is not None, f"dlpart accepted a dict numpy cannot read: {d!r}"
    assert got.shape == want.shape and (got.size == 0 or np.array_equal(got, want)), d
    return "accepted", want


@settings(max_examples=1000, **SETTINGS)
@given(base=valid_dicts(), data=st.data())
def test_mutated_dicts_give_the_right_data_or_a_dlpart_error(base, data):
    d, ref = base
    outcome, got = check(d)
    assert outcome == "accepted", f"the unmutated dict was {outcome}"
    assert np.array_equal(got, ref)
    for _ in range(data.draw(st.integers(1, 3))):
        d = mutate_value(data.draw, d, depth=-1)
    event(check(d)[0])


@settings(max_examples=150, **SETTINGS)
@given(base=valid_dicts(), data=st.data())
def test_repartitioning_an_imported_dict_matches_numpy(base, data):
    """The planner on random source grids (the dict's) and target grids: tilings, explicit
    split points (empty slabs included), and arguments that are not a layout at all."""
    d, ref = base
    pa = dlpart.from_partitioned(d)
    ndim = ref.ndim
    kind = data.draw(st.sampled_from(["tiling", "splits", "bad"]))
    if kind == "tiling":
        args = dict(tiling=tuple(data.draw(st.lists(st.integers(1, 6), min_size=ndim,
                                                    max_size=ndim))))
    elif kind == "splits":
        args = dict(splits=[[0, *sorted(data.draw(st.lists(st.integers(0, n), max_size=3))), n]
                            for n in ref.shape])
    else:
        args = data.draw(st.sampled_from([
            dict(tiling=(0,) * ndim), dict(tiling=(-1,) * ndim), dict(tiling=(1,) * (ndim + 1)),
            dict(tiling=(2**40,) * ndim), dict(tiling=(2**64,) * ndim),
            dict(splits=[[0, n + 1] for n in ref.shape]), dict(splits=[[1, 0]] * ndim),
            dict(splits=[[0, -1, n] for n in ref.shape]), dict(splits=[[0]] * ndim),
            dict(splits=[[0, 2**64, n] for n in ref.shape])]))
    try:
        out = pa.repartition(**args)
    except (ValueError, TypeError, OverflowError) as e:
        # Not a layout for this array: a plain argument error, as numpy gives for bad args.
        assert kind == "bad" or "tiling" in args and 0 in ref.shape, (args, e)
        return
    np.testing.assert_array_equal(np.asarray(out.assemble()), ref)


def _one(**changes):
    entry = {"start": (0,), "shape": (3,), "data": np.arange(3), "location": [("h", 0, "kDLCPU")]}
    d = {"shape": (3,), "partition_tiling": (1,), "partitions": {(0,): entry}}
    for key, value in changes.items():
        (entry if key in entry or key in ("dtype", "device") else d)[key] = value
    return d


# Inputs the fuzzer found, kept as a fixed corpus: each must give the right data or a dlpart
# error, whatever the random cases above happen to draw.
CORPUS = {
    # The repr() of a non-list `locals` raised through validate and from_partitioned.
    "locals whose repr raises": _one(locals=Hostile()),
    # A bare int shape is read as numpy reads it: a 1-tuple.
    "shape as a bare int": _one(shape=3),
    "junk get": {**_one(data=Handle(np.arange(3))), "get": junk_get},
    "raising get": {**_one(data=Handle(np.arange(3))), "get": raising_get},
    "hostile data behind a handle": {**_one(data=Handle(Hostile())), "get": fetch},
    "hostile device": _one(device=Hostile()),
}


@pytest.mark.parametrize("name", sorted(CORPUS))
def test_the_corpus_gives_the_right_data_or_a_dlpart_error(name):
    check(CORPUS[name])
