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
    repeated = np.lib.stride_tricks.as_strided(buf, shape=(4,), strides=(0,))
    repeated.flags.writeable = True
    with pytest.raises(BufferError, match=r"\(0,\) refers to some element more than once"):
        dlpart.partition(np.arange(8.0), 2).repartition_into(_halves(repeated, buf[4:]))
