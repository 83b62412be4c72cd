"""torch on the CPU as a DLPack producer and consumer of dlpart tensors and partitions.

``scripts/test.sh`` installs torch with heat unless ``DLPART_WITH_HEAT=0``; without it these
tests skip. Its CUDA side is in ``test_cuda.py``."""

import numpy as np
import pytest

import dlpart

torch = pytest.importorskip("torch", reason="torch is not installed (scripts/test.sh installs "
                            "it unless DLPART_WITH_HEAT=0)")

DTYPES = ["bool", "int8", "uint8", "int16", "int32", "int64", "float16", "bfloat16",
          "float32", "float64", "complex64", "complex128"]


@pytest.mark.parametrize("name", DTYPES)
def test_torch_tensors_round_trip_without_a_copy(name):
    dtype = getattr(torch, name)
    a = (torch.arange(35, dtype=torch.float64).reshape(5, 7) * 3 - 40).to(dtype)
    t = dlpart.from_dlpack(a)
    assert t.shape == (5, 7) and t.data_ptr == a.data_ptr()
    b = torch.from_dlpack(t)
    assert b.dtype == dtype and b.data_ptr() == a.data_ptr()
    assert torch.equal(b, a)


@pytest.mark.parametrize("view", [lambda a: a.t(), lambda a: a[::2, 1:], lambda a: a[1::3, ::2]])
def test_torch_strided_views_keep_their_strides(view):
    a = torch.arange(60, dtype=torch.float32).reshape(6, 10)
    v = view(a)
    t = dlpart.from_dlpack(v)
    assert t.strides == v.stride() and t.data_ptr == v.data_ptr()
    np.testing.assert_array_equal(np.from_dlpack(t), v.numpy())


def test_dlpart_tensors_are_written_through_by_torch():
    x = np.zeros(6, dtype=np.int32)
    b = torch.from_dlpack(dlpart.from_dlpack(x))
    b += 7
    assert (x == 7).all()


def test_torch_partitions_repartition_and_read_back():
    a = torch.arange(10 * 12, dtype=torch.int32).reshape(10, 12)
    pa = dlpart.partition(a, (2, 3))
    r = pa.repartition((3, 2))
    parts = r.__partitioned__["partitions"]
    splits = [np.array_split(np.arange(n), k) for n, k in zip((10, 12), (3, 2))]
    for (i, j), entry in parts.items():
        got = torch.from_dlpack(entry["data"])
        rows, cols = splits[0][i], splits[1][j]
        assert torch.equal(got, a[rows[0]:rows[-1] + 1, cols[0]:cols[-1] + 1])
    assert torch.equal(torch.from_dlpack(r.assemble()), a)


def test_a_dict_of_torch_partitions_is_imported_in_place():
    """heat's data form: torch tensors as partitions, an int rank as location."""
    a = torch.arange(8 * 6, dtype=torch.float64).reshape(8, 6)
    halves = [a[:4], a[4:]]
    d = {"shape": (8, 6), "partition_tiling": (2, 1), "locals": [(0, 0), (1, 0)],
         "partitions": {(k, 0): {"start": (4 * k, 0), "shape": (4, 6), "data": h,
                                 "location": [0], "dtype": "torch.float64"}
                        for k, h in enumerate(halves)}}
    pa = dlpart.from_partitioned(d)
    for k, h in enumerate(halves):
        data = pa.__partitioned__["partitions"][(k, 0)]["data"]
        assert torch.from_dlpack(data).data_ptr() == h.data_ptr()
    assert torch.equal(torch.from_dlpack(pa.assemble()), a)


def test_gather_takes_torch_indices_and_gives_torch_what_it_reads():
    src = torch.arange(200, dtype=torch.float32).reshape(100, 2)
    idx = torch.tensor([3, -1, 50, 0])
    got = torch.from_dlpack(dlpart.gather(src, idx, axis=0))
    assert torch.equal(got, src[idx])
    with pytest.raises(IndexError):
        dlpart.gather(src, torch.tensor([100]), axis=0)


@pytest.mark.parametrize("rows", [1_000, 5_000_000])
def test_an_expanded_torch_target_is_refused_however_big(rows):
    # torch's expand gives a writable view with a zero stride; past a few million address
    # ranges dlpart judges such a target by its strides, not by listing its elements.
    out = torch.zeros(1, dtype=torch.uint8).expand(rows, 2)
    src = dlpart.partition(np.ones((rows, 2), dtype=np.uint8), (1, 1))
    with pytest.raises(BufferError, match="refers to some element more than once"):
        src.repartition_into(dlpart.partition(out, (1, 1)))
    assert int(out[0, 0]) == 0


def test_an_axis_of_extent_one_with_any_stride_is_gathered_and_scattered():
    # DLPack leaves the stride of an extent-1 axis free; torch makes such tensors.
    x = torch.as_strided(torch.arange(4, dtype=torch.float32), (1, 4), (2**62, 1))
    want = x.numpy()[[0, 0]]
    np.testing.assert_array_equal(np.from_dlpack(dlpart.gather(x, np.array([0, 0]), axis=0)),
                                  want)
    got = dlpart.partition(x, (1, 2)).gather(np.array([0]), axis=0).assemble()
    np.testing.assert_array_equal(np.from_dlpack(got), x.numpy())
    base = torch.zeros(4)
    out = torch.as_strided(base, (1, 4), (2**62, 1))
    dlpart.scatter(torch.arange(4.0).reshape(1, 4), np.array([0]), out, axis=0)
    np.testing.assert_array_equal(base.numpy(), np.arange(4.0))
