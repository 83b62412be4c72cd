"""repartition / repartition_into: values against numpy, reuse of the caller's buffers, refusals."""

import numpy as np
import pytest

import dlpart


def test_rows_to_columns_into_preallocated_numpy_outputs():
    a = np.arange(12 * 10, dtype=np.float32).reshape(12, 10)
    out = np.full_like(a, np.nan)
    target = dlpart.partition(out, (1, 3))
    res = dlpart.partition(a, (4, 1)).repartition_into(target)
    assert res is target
    np.testing.assert_array_equal(out, a)  # written in place, into the caller's memory


def test_block_cyclic_owners_follow_the_device_list():
    a = np.arange(8 * 8, dtype=np.int64).reshape(8, 8)
    devs = ["kDLCPU", "kDLCPU", "kDLCPU", "kDLCPU"]
    out = dlpart.partition(a, (2, 2)).repartition(block_cyclic=(2, 4), devices=devs)
    assert out.tiling == (4, 2)
    assert out.splits == ((0, 2, 4, 6, 8), (0, 4, 8))
    np.testing.assert_array_equal(np.from_dlpack(out.assemble()), a)
    with pytest.raises(ValueError, match="devices"):
        dlpart.partition(a, (2, 2)).repartition(block_cyclic=2)


def test_read_only_sources_are_fine_and_read_only_targets_refused():
    a = np.arange(20, dtype=np.int16).reshape(4, 5)
    a.flags.writeable = False
    out = dlpart.partition(a, (2, 1)).repartition((1, 5))
    np.testing.assert_array_equal(np.from_dlpack(out.assemble()), a)
    ro = np.zeros_like(a)
    ro.flags.writeable = False
    with pytest.raises(BufferError, match=r"read-only"):
        dlpart.partition(a, (2, 1)).repartition_into(dlpart.partition(ro, (1, 1)))
    assert not ro.any()


def test_refusals_leave_the_target_untouched():
    a = np.arange(6, dtype=np.float64)
    out = np.zeros(6, np.float32)
    with pytest.raises(ValueError, match="float64"):
        dlpart.partition(a, (2,)).repartition_into(dlpart.partition(out, (3,)))
    assert not out.any()
    with pytest.raises(ValueError, match="shape"):
        dlpart.partition(a, (2,)).repartition_into(dlpart.partition(np.zeros(5), (1,)))


def test_exactly_one_target_layout():
    pa = dlpart.partition(np.zeros((4, 4)), (2, 2))
    with pytest.raises(ValueError, match="exactly one"):
        pa.repartition((2, 2), splits=[[0, 4], [0, 4]])
    with pytest.raises(ValueError, match="exactly one"):
        pa.repartition()


def test_a_repartition_result_builds_its_partitions_on_first_use():
    a = np.arange(7 * 9, dtype=np.float64).reshape(7, 9)
    out = dlpart.partition(a, (2, 3)).repartition(splits=[[0, 3, 7], [0, 2, 5, 9]])
    # Before any Partition object exists: the tensors, devices and a round trip through repartition.
    tensors = out.tensors()
    assert [t.shape for t in tensors] == [(3, 2), (3, 3), (3, 4), (4, 2), (4, 3), (4, 4)]
    assert out.devices == [dlpart.Device("kDLCPU")]
    np.testing.assert_array_equal(np.from_dlpack(out.repartition(tiling=(1, 1)).assemble()), a)
    # The partitions, built now, hold the same tensors at the right boxes.
    parts = out.partitions
    assert sorted(parts) == [(i, j) for i in range(2) for j in range(3)]
    for (i, j), p in parts.items():
        assert p.position == (i, j)
        assert p.start == ((0, 3)[i], (0, 2, 5)[j])
        assert p.tensor is tensors[3 * i + j]
        assert p.locations[0].device == dlpart.Device("kDLCPU")
        r0, c0 = p.start
        h, w = p.shape
        np.testing.assert_array_equal(np.from_dlpack(p.tensor), a[r0:r0 + h, c0:c0 + w])
    assert [t for t in out.tensors()] == tensors
    d = out.__partitioned__
    assert d["partition_tiling"] == (2, 3) and d["partitions"][(1, 2)]["start"] == (3, 5)


def test_split_points_cut_like_array_split_and_name_what_is_wrong():
    assert dlpart.split_points([7, 4], [3, 2]) == [[0, 3, 5, 7], [0, 2, 4]]
    assert [list(np.cumsum([0] + [len(p) for p in np.array_split(np.arange(7), 3)]))] == \
        dlpart.split_points([7], [3])
    assert dlpart.split_points([5], splits=[[0, 1, 5]]) == [[0, 1, 5]]
    with pytest.raises(ValueError, match="needs tiling or splits"):
        dlpart.split_points([5, 3])
    with pytest.raises(ValueError, match="not both"):
        dlpart.split_points([5], [1], splits=[[0, 5]])
    with pytest.raises(ValueError, match=r"shape must hold non-negative ints, not \(-1,\)"):
        dlpart.split_points([-1], [1])
    with pytest.raises(ValueError, match=r"tiling must hold non-negative ints"):
        dlpart.split_points([4], [-2])
