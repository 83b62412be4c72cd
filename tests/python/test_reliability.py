"""Bad input never crashes the process or gives an answer that depends on what came before."""

import numpy as np
import pytest

import dlpart


def one_part(location):
    return {"shape": (2,), "partition_tiling": (1,),
            "partitions": {(0,): {"start": (0,), "shape": (2,), "data": np.zeros(2),
                                  "location": location}}}


@pytest.mark.parametrize("order", [["good", "bool", "float"], ["bool", "good", "float"],
                                   ["float", "bool", "good"]])
def test_validation_gives_the_same_answer_in_any_order(order):
    """A bool or float pid is refused whatever was validated before (True == 1 == 1.0)."""
    dicts = {"good": one_part([("h", 1)]), "bool": one_part([("h", True)]),
             "float": one_part([("h", 1.0)])}
    for name in order:
        for check in (dlpart.validate, dlpart.from_partitioned):
            if name == "good":
                check(dicts[name])
            else:
                with pytest.raises(dlpart.ProtocolError, match=r"\(0,\)"):
                    check(dicts[name])


def test_a_dict_that_changes_while_it_is_read_raises_no_panic():
    """A key whose __index__ inserts entries into the partitions being read."""
    parts = {}

    class Sneaky:
        def __init__(self, i):
            self.i = i

        def __index__(self):
            parts[(len(parts) + 10,)] = {"start": (0,), "shape": (1,), "data": None}
            return self.i

        def __hash__(self):
            return hash(("sneaky", self.i))

    parts[(Sneaky(0),)] = {"start": (0,), "shape": (2,), "data": np.zeros(2), "location": []}
    d = {"shape": (2,), "partition_tiling": (1,), "partitions": parts}
    try:
        dlpart.from_partitioned(d)
    except dlpart.ProtocolError:
        pass  # refusing it is fine; a PanicException (a BaseException) is not


def _halves(first, second):
    """A 1-d array of 8 over two given 4-element arrays, in that order."""
    parts = {(0,): dlpart.Partition((0,), (0,), (4,), (), dlpart.from_dlpack(first)),
             (1,): dlpart.Partition((1,), (4,), (4,), (), dlpart.from_dlpack(second))}
    return dlpart.PartitionedArray((8,), [[0, 4, 8]], parts)


def test_repartition_into_targets_that_overlap_the_sources_is_right():
    """Swapping the two halves of one buffer: each target is the other copy's source."""
    buf = np.arange(8.0)
    src = dlpart.partition(buf, 2)
    src.repartition_into(_halves(buf[4:], buf[:4]))
    np.testing.assert_array_equal(buf, [4, 5, 6, 7, 0, 1, 2, 3])


def test_repartition_into_targets_that_share_memory_is_refused_naming_both():
    buf = np.zeros(8)
    before = buf.copy()
    with pytest.raises(BufferError, match=r"\(0,\) and \(1,\) share memory"):
        dlpart.partition(np.arange(8.0), 2).repartition_into(_halves(buf[:4], buf[2:6]))
    np.testing.assert_array_equal(buf, before)  # nothing written
    repeated = np.lib.stride_tricks.as_strided(buf, shape=(4,), strides=(0,), writeable=True)
    with pytest.raises(BufferError, match=r"\(0,\) refers to some element more than once"):
        dlpart.partition(np.arange(8.0), 2).repartition_into(_halves(repeated, buf[4:]))


def test_gather_and_scatter_into_a_target_that_repeats_an_element_are_refused():
    """A zero stride makes every element of a target one element, which several threads would
    write at once: refused before anything is written, as repartition_into refuses it."""
    buf = np.full(8, -1.0)
    repeated = np.lib.stride_tricks.as_strided(buf[4:], shape=(4,), strides=(0,), writeable=True)
    with pytest.raises(BufferError, match=r"out .*strides=\(0,\).* refers to some element more"):
        dlpart.gather(np.arange(8.0), [0, 1, 2, 3], out=repeated)
    with pytest.raises(BufferError, match=r"out .*strides=\(0,\).* refers to some element more"):
        dlpart.scatter(np.arange(4.0), [0, 1, 2, 3], repeated)
    # Partition (0,) would be written before (1,): it is refused before either.
    with pytest.raises(BufferError, match=r"partition \(1,\) .* refers to some element more"):
        _halves(buf[:4], repeated).scatter(np.arange(4.0), [0, 1, 6, 7])
    np.testing.assert_array_equal(buf, np.full(8, -1.0))
    # Elements that are distinct, however strided, are written (numpy as the reference).
    out = np.zeros((4, 3))[:, ::-2]
    dlpart.gather(np.arange(8.0).reshape(4, 2), [3, 0, 2, 1], out=out)
    np.testing.assert_array_equal(out, np.take(np.arange(8.0).reshape(4, 2), [3, 0, 2, 1], axis=0))


# -- index arrays rewritten by another thread -------------------------------------------------

_RACE = r"""
import sys, threading
import numpy as np
import dlpart

op = sys.argv[1]
n = 1 << 16
src = np.arange(64, dtype=np.float32)
idx = np.arange(n, dtype=np.int64) % 64
last = int(idx[-1])
stop = False
# The GIL changes hands every 0.1 ms rather than 5 ms: the loop below would otherwise wait for
# the flipping thread to give the GIL back after every call, and the two interleave more often.
sys.setswitchinterval(1e-4)

def flip():
    # Rewrites one index of the caller's array, again and again, while dlpart works on it
    # (the GIL is released): most of the time every index is in range.
    while not stop:
        idx[-1] = 1 << 40
        idx[-1] = last

t = threading.Thread(target=flip)
t.start()
errors = 0
try:
    for _ in range(600):
        try:
            if op == "gather":
                out = np.from_dlpack(dlpart.gather(src, idx))
                assert ((out >= 0) & (out < 64)).all()
            else:
                out = np.zeros(64, dtype=np.float32)
                try:
                    dlpart.scatter(np.ones(n, dtype=np.float32), idx, out)
                except IndexError:
                    # An out-of-range index is an error before anything is written.
                    assert not out.any(), "scatter wrote, then raised IndexError"
                    raise
                assert out.all()
        except IndexError:
            errors += 1
finally:
    stop = True
    t.join()
print("ok", errors)
"""


@pytest.mark.parametrize("op", ["gather", "scatter"])
def test_indices_rewritten_by_another_thread_never_reach_the_kernel(op):
    """Each index is read once, into dlpart's memory, and checked there: a thread that rewrites
    the caller's index array after the check cannot make the kernel read or write outside the
    array (in a child process: a crash must fail the test, not end the run)."""
    import subprocess
    import sys

    r = subprocess.run([sys.executable, "-c", _RACE, op], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0 and r.stdout.startswith("ok"), (r.returncode, r.stderr[-2000:])
    # The race was run, not missed: some calls saw the out-of-range index (about half here).
    assert int(r.stdout.split()[1]) > 0, r.stdout


# -- layout arithmetic on untrusted descriptors ------------------------------------------------

def test_an_extent_of_exactly_isize_min_is_refused():
    """(2 - 1) * stride * 4 bytes == isize::MIN: its abs() overflows; checked, it is refused."""
    from dlpart._core import _testing

    data = np.arange(2, dtype=np.float32).tobytes()
    for shape, strides in [([2], [-(1 << 61)]), ([2, 2], [-(1 << 60), -(1 << 60)])]:
        cap = _testing.make_capsule(data, shape, strides=strides)
        with pytest.raises(BufferError, match="overflow"):
            dlpart.from_dlpack(cap)


def test_a_byte_count_that_overflows_is_refused_at_import():
    """numel fits a usize, numel * itemsize does not: Tensor.nbytes would wrap to 0."""
    from dlpart._core import _testing

    cap = _testing.make_capsule(b"\0" * 8, [1 << 62], strides=[0])
    with pytest.raises(BufferError, match="bytes"):
        dlpart.from_dlpack(cap)


# -- the pickle constructor --------------------------------------------------------------------

def test_a_tiny_pickle_declaring_a_huge_shape_allocates_nothing():
    from dlpart._core import _tensor_from_bytes

    with pytest.raises(ValueError, match="do not fill"):
        _tensor_from_bytes(b"abcd", [1 << 40, 1 << 20], "float32", "kDLCPU", False)
    with pytest.raises(ValueError, match="do not fill"):
        _tensor_from_bytes(b"abcd", [1 << 62, 8], "float32", "kDLCPU", False)
    with pytest.raises(ValueError, match="non-negative"):
        _tensor_from_bytes(b"abcd", [-1], "float32", "kDLCPU", False)


def test_bytes_come_back_only_as_host_memory():
    import pickle

    from dlpart._core import _tensor_from_bytes

    for device in ["kDLCUDA:0", "kDLOneAPI:0", "kDLROCM:1"]:
        with pytest.raises(ValueError, match=device):
            _tensor_from_bytes(b"\0" * 8, [2], "float32", device, False)
    t = _tensor_from_bytes(np.arange(3, dtype=np.float64).tobytes(), [3], "float64", "kDLCPU",
                           True)
    assert str(t.device) == "kDLCPU" and t.readonly
    back = pickle.loads(pickle.dumps(t))
    assert str(back.device) == "kDLCPU" and back.readonly and back.nbytes == 24
    np.testing.assert_array_equal(np.from_dlpack(back), [0.0, 1.0, 2.0])


# -- the keyword fallback ----------------------------------------------------------------------

def test_a_type_error_that_is_not_about_keywords_is_not_retried():
    calls = []

    class Producer:
        def __dlpack_device__(self):
            return (1, 0)

        def __dlpack__(self, **kwargs):
            calls.append(kwargs)
            raise TypeError("this array cannot be exported")

    with pytest.raises(TypeError, match="cannot be exported"):
        dlpart.from_dlpack(Producer())
    assert len(calls) == 1


def test_a_producer_without_the_new_keywords_is_still_imported():
    calls = []
    a = np.arange(3.0)

    class Old:
        def __dlpack_device__(self):
            return (1, 0)

        def __dlpack__(self, stream=None):
            calls.append(stream)
            return a.__dlpack__()

    np.testing.assert_array_equal(np.from_dlpack(dlpart.from_dlpack(Old())), a)
    assert len(calls) == 1


# -- negative numbers to dlpart's own API ------------------------------------------------------

def test_negative_numbers_say_which_argument_is_wrong():
    t = dlpart.from_dlpack(np.arange(6.0).reshape(2, 3))
    with pytest.raises(ValueError, match="max_version"):
        t.__dlpack__(max_version=(-1, 0))
    with pytest.raises(ValueError, match="max_version"):
        t.__dlpack__(max_version=(1, -3))
    with pytest.raises(ValueError, match="start"):
        t.view([-1, 0], [1, 1])
    with pytest.raises(ValueError, match="shape"):
        t.view([0, 0], [1, -1])
    with pytest.raises(ValueError, match="axis -3"):
        dlpart._core.gather(t, np.array([0]), -3)
    np.testing.assert_array_equal(np.from_dlpack(dlpart._core.gather(t, np.array([2]), -1)),
                                  [[2.0], [5.0]])


# -- exceptions of user objects inside a dict --------------------------------------------------

def _dict(data, **extra):
    entry = {"start": (0,), "shape": (2,), "data": data, **extra}
    return {"shape": (2,), "partition_tiling": (1,), "partitions": {(0,): entry}}


class _Raises:
    def __init__(self, exc):
        self.exc = exc

    def __dlpack_device__(self):
        return (1, 0)

    def __dlpack__(self, **kwargs):
        raise self.exc


@pytest.mark.parametrize("exc, kind", [(RuntimeError("no export"), dlpart.ProtocolError),
                                       (BufferError("no export"), BufferError),
                                       (KeyError("no export"), dlpart.ProtocolError)])
def test_a_producer_that_raises_is_named_with_its_position(exc, kind):
    with pytest.raises(kind, match=r"position \(0,\).*'data'|position \(0,\).*\"data\"") as e:
        dlpart.from_partitioned(_dict(_Raises(exc)))
    assert e.value.__cause__ is exc


def test_numpy_object_arrays_are_named_with_their_position():
    with pytest.raises(BufferError, match=r"position \(0,\)") as e:
        dlpart.from_partitioned(_dict(np.array([None, 1], dtype=object)))
    assert isinstance(e.value.__cause__, BufferError)


def test_a_device_key_that_raises_is_a_protocol_error():
    class BadStr:
        def __str__(self):
            raise RuntimeError("no str")

    for check in (dlpart.validate, dlpart.from_partitioned):
        with pytest.raises(dlpart.ProtocolError, match=r"position \(0,\).*device") as e:
            check(_dict(np.zeros(2), device=BadStr()))
        assert isinstance(e.value.__cause__, RuntimeError)
        with pytest.raises(dlpart.ProtocolError, match=r"position \(0,\)"):
            check(_dict(np.zeros(2), device="kDLNowhere:0"))


@pytest.mark.parametrize("key", ["location", "device", "dtype"])
def test_an_entry_key_whose_comparison_raises_is_a_protocol_error(key, monkeypatch):
    """An entry key that collides with one dlpart looks up and raises when compared fails the
    import with the position and the key named, the original error as its cause."""

    class Collides:
        armed = False

        def __hash__(self):
            return hash(key)

        def __eq__(self, other):
            if Collides.armed:
                raise RuntimeError("no comparison")
            return False

    for check in (dlpart.validate, dlpart.from_partitioned):
        # No key of that name: the lookup meets the colliding key and compares it.
        d = _dict(np.zeros(2), **({} if key == "location" else {"location": [("h", 1)]}))
        d["partitions"][(0,)][Collides()] = None
        monkeypatch.setattr(Collides, "armed", True)
        with pytest.raises(dlpart.ProtocolError, match=rf"position \(0,\).*{key}") as e:
            check(d)
        assert isinstance(e.value.__cause__, RuntimeError)
        monkeypatch.setattr(Collides, "armed", False)


class _Key(str):
    pass


def _built(s):
    """`s` as a string object of its own, equal to the literal but not the interned one."""
    return "".join(list(s))


@pytest.mark.parametrize("make", [str, _built, _Key], ids=["literal", "built", "subclass"])
@pytest.mark.parametrize("extra", [False, True], ids=["", "extra-key"])
def test_entry_keys_are_found_whatever_string_objects_they_are(make, extra):
    """Entry keys equal to the names dlpart reads are found whatever string objects they are
    (the interned literals, strings built at run time, str subclasses), extra keys or not."""
    literal = "start"
    assert _built(literal) is not literal and _built(literal) == literal
    x = np.arange(12.0).reshape(3, 4)

    def entry(lo, hi, **more):
        e = {make("start"): (lo, 0), make("shape"): (hi - lo, 4), make("data"): x[lo:hi],
             **{make(k): v for k, v in more.items()}}
        if extra:
            e["note"] = "not read"
        return e

    d = {"shape": (3, 4), "partition_tiling": (2, 1),
         "partitions": {(0, 0): entry(0, 1, device="kDLCPU"), (1, 0): entry(1, 3)}}
    dlpart.validate(d)
    pa = dlpart.from_partitioned(d)
    assert pa.tiling == (2, 1)
    np.testing.assert_array_equal(np.from_dlpack(pa.assemble()), x)
    # A missing key is named.
    del d["partitions"][(1, 0)][make("shape")]
    for check in (dlpart.validate, dlpart.from_partitioned):
        with pytest.raises(dlpart.ProtocolError, match=r'position \(1, 0\): missing "shape"'):
            check(d)


def test_a_get_that_raises_names_the_positions():
    class Handle:
        pass

    def get(handles):
        raise RuntimeError("store is down")

    d = _dict(Handle())
    d["get"] = get
    pa = dlpart.from_partitioned(d)
    with pytest.raises(dlpart.ProtocolError, match=r"position \(0,\).*'get'") as e:
        pa.assemble()
    assert isinstance(e.value.__cause__, RuntimeError)


class _Ref:
    """A handle: the key of a row block of ``x`` in a store that ``get`` reads."""

    def __init__(self, k):
        self.k = k


def _handles_dict(x, location=None):
    """``x`` as two row blocks held behind handles, resolved by slicing ``x`` (views)."""
    calls = []

    def get(handles):
        calls.append(len(handles) if isinstance(handles, list) else 1)
        one = not isinstance(handles, list)
        out = [x[2 * h.k:2 * h.k + 2] for h in ([handles] if one else handles)]
        return out[0] if one else out

    parts = {(k, 0): {"start": (2 * k, 0), "shape": (2, x.shape[1]), "data": _Ref(k),
                      **({"location": [location]} if location else {})} for k in range(2)}
    return {"shape": x.shape, "partition_tiling": (2, 1), "partitions": parts, "get": get}, calls


def test_from_partitioned_copy_and_device_apply_to_the_data_of_handles_too():
    """``copy=True`` copies what ``get`` returns when it is fetched, as it copies data given in
    the dict; ``device=`` puts it there, refused alike when the device is missing."""
    x = np.arange(8.0).reshape(4, 2)
    d, _ = _handles_dict(x)
    pa = dlpart.from_partitioned(d, copy=True)
    pa.scatter(np.full((1, 2), -1.0), [3], axis=0)
    np.testing.assert_array_equal(x, np.arange(8.0).reshape(4, 2))  # x itself is untouched
    moved = dlpart.from_partitioned(d, device="cpu").fetch()
    assert all(not p.locations or str(p.locations[0].device) == "kDLCPU"
               for p in moved.partitions.values())
    inline = {**d, "partitions": {pos: {**e, "data": x[2 * pos[0]:2 * pos[0] + 2]}
                                  for pos, e in d["partitions"].items()}}
    with pytest.raises(Exception) as given:
        dlpart.from_partitioned(inline, device="kDLCPU:512")
    with pytest.raises(type(given.value), match="kDLCPU:512"):
        dlpart.from_partitioned(d, device="kDLCPU:512").assemble()


def test_fetched_data_must_live_where_its_locations_in_this_process_say():
    """Rule 9 holds for data ``get`` returns as for data in the dict: a location in this
    process naming kDLCUDA:0 for host data is refused, naming both devices."""
    import os

    from dlpart._location import this_host

    x = np.arange(8.0).reshape(4, 2)
    d, _ = _handles_dict(x, location=(this_host(), os.getpid(), "kDLCUDA:0"))
    pa = dlpart.from_partitioned(d)
    with pytest.raises(dlpart.ProtocolError,
                       match=r"position \(0, 0\): fetched data lives on kDLCPU but the "
                             r"locations in this process name kDLCUDA:0"):
        pa.fetch()


def test_a_get_that_returns_the_wrong_number_of_items_is_named():
    x = np.arange(8.0).reshape(4, 2)
    d, calls = _handles_dict(x)
    d["get"] = lambda handles: [x[:2]]
    with pytest.raises(dlpart.ProtocolError, match=r"'get'\] returned 1 items for 2 handles"):
        dlpart.from_partitioned(d).fetch()
    d, calls = _handles_dict(x)
    np.testing.assert_array_equal(np.from_dlpack(dlpart.from_partitioned(d).assemble()), x)
    assert calls == [2], "one call for both handles"


def test_a_non_callable_get_whose_repr_raises_is_a_protocol_error():
    class Odd:
        def __repr__(self):
            raise RuntimeError("no repr")

    d = _dict(np.zeros(2))
    d["get"] = Odd()
    with pytest.raises(dlpart.ProtocolError, match="get"):
        dlpart.from_partitioned(d)


@pytest.mark.parametrize("data", ["a string", 1.5, 3, {"k": 1}, [1, 2], b"xy"])
def test_plain_values_are_no_data_and_no_handle(data):
    for check in (dlpart.validate, dlpart.from_partitioned):
        with pytest.raises(dlpart.ProtocolError, match=r"position \(0,\).*\"data\""):
            check(_dict(data))


@pytest.mark.parametrize("key", ["dtype", "device", "location", "start"])
def test_deep_nesting_is_a_protocol_error_naming_the_key(key):
    """A value nested 100,000 deep makes repr() and str() raise RecursionError."""
    deep = []
    for _ in range(100_000):
        deep = [deep]
    entry = {"start": (0,), "shape": (2,), "data": np.zeros(2), key: deep}
    d = {"shape": (2,), "partition_tiling": (1,), "partitions": {(0,): entry}}
    for check in (dlpart.validate, dlpart.from_partitioned):
        named = rf"position \(0,\).*{key}|{key}.*position \(0,\)"
        with pytest.raises(dlpart.ProtocolError, match=named):
            check(d)


def test_fetches_in_one_thread_never_disturb_operations_running_in_another():
    """Threads share one array of handles: one thread's fetch lands while another's assemble
    runs with the GIL released. Each sees the array as it was when its operation began (a
    fetch replaces it), so every call returns the data; none fails on a borrow."""
    import threading
    import time

    x = np.arange(1000 * 400, dtype=np.float64).reshape(1000, 400)

    class Ref:
        def __init__(self, k):
            self.k = k

    def get(handles):
        if threading.current_thread().name.startswith("slow"):
            time.sleep(0.2)  # fetched while the fast thread is inside assemble
        return [x[500 * h.k:500 * h.k + 500] for h in handles]

    lazy = dlpart.from_partitioned({
        "shape": x.shape, "partition_tiling": (2, 1), "get": get,
        "partitions": {(i, 0): {"start": (500 * i, 0), "shape": (500, 400), "data": Ref(i),
                                "location": []} for i in range(2)}})
    errors = []

    def assemble(until):
        while True:
            try:
                np.testing.assert_array_equal(np.from_dlpack(lazy.assemble()), x)
            except Exception as e:  # noqa: BLE001 - collected for the assertion below
                errors.append(repr(e))
            if time.monotonic() > until:
                return

    end = time.monotonic() + 0.8
    threads = [threading.Thread(target=assemble, args=(0,), name=f"slow{i}") for i in range(4)]
    threads.append(threading.Thread(target=assemble, args=(end,), name="fast"))
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []


def test_two_threads_fetching_one_partition_agree_on_its_data():
    """A get that returns copies, called by two threads for the same handles: the array keeps
    the first data set, and the Partition objects handed out show that same data."""
    import threading
    import time

    a = np.arange(12, dtype=np.int32).reshape(4, 3)
    calls = []

    class H:
        def __init__(self, i):
            self.i = i

    def get(handles):
        calls.append(1)
        time.sleep(0.3 if len(calls) == 1 else 0.02)  # the first caller lands last
        return [a[2 * h.i:2 * h.i + 2].copy() for h in handles]

    pa = dlpart.from_partitioned({
        "shape": (4, 3), "partition_tiling": (2, 1), "get": get,
        "partitions": {(i, 0): {"start": (2 * i, 0), "shape": (2, 3), "data": H(i),
                                "location": []} for i in range(2)}})
    parts = pa.partitions  # Partition objects handed out before the fetches
    threads = [threading.Thread(target=pa.fetch) for _ in range(2)]
    threads[0].start()
    time.sleep(0.1)
    threads[1].start()
    for t in threads:
        t.join()
    assert len(calls) == 2
    np.from_dlpack(parts[(0, 0)].tensor)[...] = -7
    np.testing.assert_array_equal(np.from_dlpack(pa.assemble())[:2], -7)
    assert parts[(1, 0)].tensor.data_ptr == pa.partitions[(1, 0)].tensor.data_ptr


def test_threads_writing_their_own_column_blocks_do_not_refuse_each_other():
    # The blocks' byte spans meet, their elements do not: no thread is told its writes race.
    import threading

    x = np.zeros((256, 8), np.float32)
    pa = dlpart.partition(x, (1, 4))
    errors = []

    def work(k):
        out = pa.partitions[(0, k)].tensor
        values = np.full((256, 1), k + 1, np.float32)
        prepared = dlpart.prepare_scatter(values, [1], out, axis=1)
        for _ in range(300):
            try:
                prepared()
                dlpart.scatter(values, [0], out, axis=1)
            except BufferError as e:
                errors.append(str(e))

    threads = [threading.Thread(target=work, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    np.testing.assert_array_equal(x, np.repeat(np.arange(1, 5, dtype=np.float32), 2)[None, :]
                                  .repeat(256, axis=0))
