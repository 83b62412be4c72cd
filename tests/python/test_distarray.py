"""The Distributed Array Protocol (``__distarray__``, 0.10) in one process: arrays read by
`dlpart.from_distarray` against numpy, the dict `PartitionedArray.__distarray__` gives, and
dicts that break the protocol. Arrays spread over MPI ranks: mpi_scripts/distarray.py."""

import numpy as np
import pytest

import dlpart


def dim(kind, size, **keys):
    return {"dist_type": kind, "size": size, "proc_grid_size": 1, "proc_grid_rank": 0, **keys}


# The end of an int out of range, as every int argument words it.
I64 = r"\(expected an int from -9223372036854775808 to 9223372036854775807\)"
U64 = r"\(expected an int from 0 to 18446744073709551615\)"


def dap(buffer, *dims, version="0.10.0"):
    return {"__version__": version, "buffer": buffer, "dim_data": tuple(dims)}


def test_one_process_blocks_keep_their_boundary_padding_and_are_views():
    x = np.arange(18.0 * 4).reshape(18, 4)
    # Padding at the grid's ends is boundary padding: part of the array (counted in size).
    pa = dlpart.from_distarray(dap(x, dim("b", 18, start=0, stop=18, padding=(1, 1)),
                                   dim("b", 4, start=0, stop=4)))
    assert pa.shape == (18, 4) and pa.tiling == (1, 1)
    assert pa.partitions[(0, 0)].tensor.data_ptr == x.ctypes.data
    np.testing.assert_array_equal(np.from_dlpack(pa.assemble()), x)
    # Each end its own width, on an axis that is not periodic.
    pa = dlpart.from_distarray(dap(x, dim("b", 18, start=0, stop=18, padding=(2, 0)), {}))
    np.testing.assert_array_equal(np.from_dlpack(pa.assemble()), x)


@pytest.mark.parametrize("flag", [True, np.True_])
def test_a_periodic_axis_leaves_out_end_padding_that_wraps_around(flag):
    # 10 values with one ghost at each end holding the far end's values (indices 9 and 0):
    # start -1 and stop 11 say so, and size 10 does not count them.
    g = np.arange(10.0) * 3
    buf = np.concatenate([g[-1:], g, g[:1]])
    pa = dlpart.from_distarray(dap(buf, dim("b", 10, start=-1, stop=11, padding=(1, 1),
                                            periodic=flag)))
    assert pa.shape == (10,) and pa.tiling == (1,)
    np.testing.assert_array_equal(np.from_dlpack(pa.assemble()), g)
    assert np.shares_memory(np.from_dlpack(pa.partitions[(0,)].tensor), buf)


def test_a_periodic_axis_keeps_end_padding_its_size_counts():
    # The same buffer, its ghosts counted in size (start 0, stop 12 = size): part of the array.
    # One end of each kind: the low ghost wraps (start -1), the high one is counted.
    g = np.arange(10.0) * 3
    buf = np.concatenate([g[-1:], g, g[:1]])
    counted = dlpart.from_distarray(dap(buf, dim("b", 12, start=0, stop=12, padding=(1, 1),
                                                 periodic=True)))
    np.testing.assert_array_equal(np.from_dlpack(counted.assemble()), buf)
    mixed = dlpart.from_distarray(dap(buf, dim("b", 11, start=-1, stop=11, padding=(1, 1),
                                               periodic=True)))
    np.testing.assert_array_equal(np.from_dlpack(mixed.assemble()), buf[1:])
    # Ends counted in size are part of the array, each as wide as it likes (2 and 1 here), as
    # is one counted end (2 wide) against one that wraps (1 wide, its ghost left out).
    buf = np.arange(13.0) * 3
    uneven = dlpart.from_distarray(dap(buf, dim("b", 13, start=0, stop=13, padding=(2, 1),
                                                periodic=True)))
    np.testing.assert_array_equal(np.from_dlpack(uneven.assemble()), buf)
    ring = dlpart.from_distarray(dap(buf, dim("b", 12, start=0, stop=13, padding=(2, 1),
                                              periodic=True)))
    np.testing.assert_array_equal(np.from_dlpack(ring.assemble()), buf[:12])
    buf = np.concatenate([g[-1:], g, g[:1]])
    # periodic False (or None) with the same numbers as counted: the same array.
    for flag in (False, None):
        plain = dlpart.from_distarray(dap(buf, dim("b", 12, start=0, stop=12, padding=(1, 1),
                                                   periodic=flag)))
        np.testing.assert_array_equal(np.from_dlpack(plain.assemble()), buf)


def test_one_to_one_changes_nothing_on_one_process():
    buf = np.arange(5.0) * 10
    perm = np.array([4, 2, 0, 1, 3])
    ref = np.empty(5)
    ref[perm] = buf
    for flag in (True, False, np.False_, None):
        pa = dlpart.from_distarray(dap(buf, dim("u", 5, indices=perm, one_to_one=flag)))
        np.testing.assert_array_equal(np.from_dlpack(pa.assemble()), ref)


def test_unstructured_indices_become_runs_of_views():
    buf = np.arange(9.0) * 10
    perm = np.array([3, 4, 5, 0, 1, 2, 8, 6, 7])
    pa = dlpart.from_distarray(dap(buf, dim("u", 9, indices=perm)))
    ref = np.empty(9)
    ref[perm] = buf
    assert pa.tiling == (4,)  # runs [0, 3), [3, 6), [6, 8), [8, 9)
    np.testing.assert_array_equal(np.from_dlpack(pa.assemble()), ref)
    assert all(np.shares_memory(np.from_dlpack(p.tensor), buf) for p in pa.partitions.values())


def test_cyclic_on_one_process_is_the_whole_axis():
    x = np.arange(7.0)
    pa = dlpart.from_distarray(dap(x, dim("c", 7, start=0, block_size=3)))
    np.testing.assert_array_equal(np.from_dlpack(pa.assemble()), x)


def test_an_empty_dimension_dictionary_is_an_undistributed_axis():
    # The protocol's alias (section 1.6.3): {} is one block over the buffer's whole axis.
    x = np.arange(12.0).reshape(3, 4)
    pa = dlpart.from_distarray(dap(x, {}, dim("c", 4, start=0, block_size=2)))
    assert pa.shape == (3, 4) and pa.tiling == (1, 2)
    np.testing.assert_array_equal(np.from_dlpack(pa.assemble()), x)


def test_a_zero_dimensional_array_is_one_partition():
    pa = dlpart.from_distarray(dap(np.array(5.0)))
    assert pa.shape == () and len(pa.partitions) == 1
    assert float(np.from_dlpack(pa.assemble())) == 5.0


def test_a_one_partition_array_describes_itself_and_reads_back():
    y = np.arange(12.0).reshape(3, 4)
    pa = dlpart.partition(y, (1, 1))
    d = pa.__distarray__()
    assert d["__version__"] == "0.10.0"
    assert d["dim_data"] == tuple(dim("b", n, start=0, stop=n, padding=(0, 0)) for n in y.shape)
    assert np.shares_memory(d["buffer"], y)
    back = dlpart.from_distarray(pa)
    assert back.partitions[(0, 0)].tensor.data_ptr == y.ctypes.data
    with pytest.raises(dlpart.ProtocolError, match=r"tiling \(2, 1\) over 1 process; assemble"):
        dlpart.partition(y, (2, 1)).__distarray__()


@pytest.mark.parametrize("d, match", [
    (dap(np.zeros(4), dim("b", 4, start=0, stop=4), version="1.0.0"), "reads 0.x"),
    ({"__version__": "0.10.0", "buffer": np.zeros(4)}, "no 'dim_data'"),
    (dap(np.zeros(4), dim("x", 4)), "'x'"),
    (dap(np.zeros(4), dim("b", 4, start=0, stop=3)), "start 0, stop 3"),
    (dap(np.zeros(4), dim("b", 4, start=0)), "no 'stop'"),
    (dap(np.zeros(4), dim("b", True, start=0, stop=4)), r"'size': True is not an int \(a bool\)"),
    (dap(np.zeros(4), dim("c", 5, start=0)), "give 5 of 5 indices here, the buffer holds 4"),
    (dap(np.zeros(3), dim("u", 3, indices=[0, 1, 3])), r"outside \[0, 3\)"),
    (dap(np.zeros(3), dim("u", 3, indices=[0, 1])), "2 indices for a buffer of 3"),
    (dap(np.zeros((2, 2)), dim("b", 2, start=0, stop=2)), "1 entries for a 2-d buffer"),
    (dap(np.zeros(4), {**dim("b", 4, start=0, stop=4), "proc_grid_size": 2}),
     r"process grid of \(2,\) for 1 process"),
    (dap(np.zeros(3), dim("u", 3, indices=[0, 0, 1])),
     "global index 0 is at positions 0 and 1 of this process's 'indices'"),
    (dap(np.zeros(3), dim("u", 3, indices=[2, 0, 2], one_to_one=False)),
     r"global index 2 is at positions 0 and 2 .*locally unique"),
    # The optional bools in the words of the ints: the key, the value and its type.
    (dap(np.zeros(3), dim("u", 3, indices=[0, 1, 2], one_to_one=1)),
     r"'one_to_one': 1 is not a bool \(an int\)$"),
    (dap(np.zeros(4), dim("b", 4, start=0, stop=4, periodic="yes")),
     r"'periodic': 'yes' is not a bool \(a str\)$"),
    (dap(np.zeros(4), dim("b", 4, start=0, stop=4, periodic=np.int64(1))),
     r"'periodic': (np\.int64\()?1\)? is not a bool \(a numpy\.int64\)$"),
    # What is no int is named with the conversion's words; ints out of range (beyond 64 bits,
    # or negative where an index or a count is read) in the words of every other int argument
    # (tests/python/test_conventions.py), the value named.
    (dap(np.zeros(4), dim("b", 4, start=0.0, stop=4)),
     r"'start': 0.0 is not an int \('float' object cannot be interpreted as an integer\)$"),
    (dap(np.zeros(4), dim("b", 4, start=0, stop="4")), r"'stop': '4' is not an int \("),
    (dap(np.zeros(4), dim("b", 4, start=2**70, stop=4)),
     rf"'start': 1180591620717411303424 is out of range {I64}$"),
    (dap(np.zeros(4), dim("b", 4, start=-(2**70), stop=4)),
     rf"'start': -1180591620717411303424 is out of range {I64}$"),
    (dap(np.zeros(4), dim("b", 4, start=0, stop=2**64)),
     rf"'stop': 18446744073709551616 is out of range {U64}$"),
    (dap(np.zeros(4), dim("b", 2**70, start=0, stop=4)),
     rf"'size': 1180591620717411303424 is out of range {U64}$"),
    # A numpy uint64 is read as its value (in range of a count), then checked as any size.
    (dap(np.zeros(4), dim("b", np.uint64(2**63), start=0, stop=4)),
     r"global indices 4\.\.9223372036854775808 are held by no process"),
    (dap(np.zeros(4), dim("b", 4, start=0, stop=4, padding=(0, 2**70))),
     rf"'padding'\[1\]: 1180591620717411303424 is out of range {U64}$"),
    (dap(np.zeros(4), dim("b", 4, start=0, stop=4, padding=(-1, 0))),
     rf"'padding'\[0\]: -1 is out of range {U64}$"),
    (dap(np.zeros(4), dim("c", 4, start=0, block_size=2**70)),
     rf"'block_size': 1180591620717411303424 is out of range {U64}$"),
    (dap(np.zeros(4), {**dim("b", 4, start=0, stop=4), "proc_grid_size": 2**70}),
     rf"'proc_grid_size': 1180591620717411303424 is out of range {U64}$"),
    (dap(np.zeros(2), dim("u", 2, indices=[0, 2**70])),
     rf"'indices'\[1\]: 1180591620717411303424 is out of range {U64}$"),
    (dap(np.zeros(3), dim("u", 3, indices=[0, -1, 2])), rf"'indices'\[1\]: -1 is out of range {U64}$"),
    (dap(np.zeros(3), dim("u", 3, indices=[0, 1, "2"])), r"'indices'\[2\]: '2' is not an int \("),
    (dap(np.zeros(3), dim("u", 3, indices=5)), r"'indices': 5 is not a sequence of ints \("),
    # A bool is no int in 'indices' either, as in every int key.
    (dap(np.zeros(3), dim("u", 3, indices=[True, False, 2])),
     r"'indices'\[0\]: True is not an int \(a bool\)$"),
    (dap(np.zeros(3), dim("u", 3, indices=(2, 0, False))),
     r"'indices'\[2\]: False is not an int \(a bool\)$"),
    (dap(np.zeros(2), dim("u", 2, indices=np.array([True, False]))),
     r"'indices'\[0\]: (np\.)?True_? is not an int \("),
    (dap(np.zeros(2), dim("u", 2, indices=np.array([0, 2**63], dtype=np.uint64))),
     r"index 9223372036854775808 outside \[0, 2\)"),
    # Wrap-around padding wider than the block (its own neighbour on one process) owns.
    (dap(np.zeros(8), dim("b", 2, start=-3, stop=5, padding=(3, 3), periodic=True)),
     r"start -3, stop 5, padding \(3, 3\): the communication padding of 3 at the low end .* "
     r"wider than the 2 indices its neighbour owns"),
    # Padding is part of the buffer: together at most the block, boundary padding too.
    (dap(np.zeros(4), dim("b", 4, start=0, stop=4, padding=(5, 5))),
     r"dim_data\[0\] \('b'\): padding \(5, 5\) is 10 wide, wider than the block's 4 indices "
     r"along the axis \(start 0, stop 4\)"),
    (dap(np.zeros(4), dim("b", 3, start=-1, stop=3, padding=(1, 0))),
     r"start -1 \(padding \(1, 0\)\) is below 0: the axis is not periodic"),
    (dap(np.zeros(4), dim("b", 3, start=-2, stop=2, padding=(1, 0), periodic=True)),
     r"start -2 .* periodic axis begins at 0 .* or at -padding\[0\] = -1"),
    (dap(np.zeros(6), dim("b", 4, start=0, stop=6, padding=(1, 1), periodic=True)),
     r"stop 6 \(padding \(1, 1\)\) is beyond size 4: .* or at size \+ padding\[1\] = 5"),
    # The two ends of a periodic axis face each other across the wrap-around (on one process,
    # the block's own): as wide as each other where both wrap.
    (dap(np.zeros(13), dim("b", 10, start=-2, stop=11, padding=(2, 1), periodic=True)),
     r"padding \(2, 1\) on a periodic axis: the communication padding across the wrap-around "
     r"is 1 wide at the high end of proc_grid_rank 0 and 2 at the low end of its neighbour"),
    (dap(np.zeros(3), dim("u", 4, indices=[0, 1, 3])), r"global indices 2\.\.3 are held by no"),
    (dap(np.zeros(3), dim("u", 3, indices=np.array([0, -1, 2]))),
     rf"'indices'\[1\]: -1 is out of range {U64}$"),
    (dap(np.zeros(3), dim("u", 3, indices=np.array([0.0, 1.0, 2.0]))),
     r"'indices'\[0\]: np.float64\(0.0\) is not an int \("),
    (dap(np.zeros(4), dim("b", -4, start=0, stop=4)), rf"'size': -4 is out of range {U64}$"),
    (dap(np.zeros(4), dim("b", 4, start=0, stop=4, padding=3)), "padding 3 is not a pair"),
    (dap(np.zeros(4), [1, 2]), r"dim_data\[0\] is a list, not a dict"),
    ({"__version__": "0.10.0", "buffer": np.zeros(4), "dim_data": 4}, "dim_data is a int"),
])
def test_dicts_that_break_the_protocol_name_what_is_wrong(d, match):
    with pytest.raises(dlpart.ProtocolError, match=match):
        dlpart.from_distarray(d)


def test_an_object_without_the_protocol_is_a_type_error():
    with pytest.raises(TypeError, match="do not implement __distarray__"):
        dlpart.from_distarray(np.zeros(3))
