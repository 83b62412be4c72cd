"""Explicit transfers: Tensor.to, PartitionedArray.to, and what happens without a backend."""

import numpy as np
import pytest

import dlpart
from test_gather_scatter import HOST_KINDS as GATHER_HOST_KINDS, _labelled


def test_to_same_device_is_a_contiguous_copy():
    a = np.arange(24, dtype=np.float64).reshape(4, 6)[:, ::-2]
    t = dlpart.from_dlpack(a)
    c = t.to("kDLCPU")
    assert c.device == "kDLCPU" and c.data_ptr != t.data_ptr
    assert c.strides == (3, 1)
    np.testing.assert_array_equal(np.from_dlpack(c), a)


def test_partitioned_to_keeps_grid_and_values():
    a = np.arange(30, dtype=np.int32).reshape(5, 6)
    pa = dlpart.partition(a, (2, 3)).to("kDLCPU")
    assert pa.tiling == (2, 3)
    for p in pa.partitions.values():
        assert p.locations[0].device == "kDLCPU"
    np.testing.assert_array_equal(np.from_dlpack(pa.assemble()), a)


def test_backend_status_names_the_reason():
    assert dlpart.backend_status("kDLCPU") is None
    reason = dlpart.backend_status("kDLCUDA:0")
    if reason is not None:
        assert "cuda" in reason.lower()
    assert "kDLOneAPI" in dlpart.backend_status("kDLOneAPI:0")


def test_moving_to_cuda_without_a_backend_raises_clearly():
    if dlpart.backend_status("kDLCUDA:0") is None:
        pytest.skip("a CUDA backend is available here; tests/python/test_cuda.py covers it")
    t = dlpart.from_dlpack(np.arange(3.0))
    with pytest.raises(dlpart.BackendUnavailableError, match="cuda"):
        t.to("kDLCUDA:0")


def test_cross_device_repartition_needs_transfer():
    a = np.arange(8.0)
    pa = dlpart.partition(a, (2,))
    with pytest.raises(dlpart.DeviceError, match="kDLCPU -> kDLCUDA:0"):
        pa.repartition((4,), devices="kDLCUDA:0")


def test_devices_may_be_given_as_any_sequence_and_a_pair_is_one_device():
    dlpart._core._note_host_devices(2)  # JAX's emulated host devices, as its adapter notes
    x = np.arange(16.0).reshape(4, 4)
    pa = dlpart.partition(x, (2, 2))
    for devices in (["cpu", "kDLCPU:1"], ("cpu", "kDLCPU:1"), ((1, 0), (1, 1)),
                    np.array(["cpu", "kDLCPU:1"])):
        out = pa.repartition((2, 1), devices=devices, transfer=True)
        assert [str(p.device) for p in out.partitions.values()] == ["kDLCPU", "kDLCPU:1"]
        np.testing.assert_array_equal(np.from_dlpack(out.assemble(device="cpu", transfer=True)),
                                      x)
    one = pa.repartition((2, 1), devices=(1, 1), transfer=True)  # a (type, id) pair
    assert [str(p.device) for p in one.partitions.values()] == ["kDLCPU:1"] * 2


def test_one_torch_device_is_one_device_as_a_list_of_one_is():
    torch = pytest.importorskip("torch")
    dlpart._core._note_host_devices(2)  # JAX's emulated host devices, as its adapter notes
    x = np.arange(12.0).reshape(4, 3)
    pa = dlpart.partition(x, (2, 1))
    for device, name in ((torch.device("cpu"), "kDLCPU"), (torch.device("cpu", 1), "kDLCPU:1")):
        one = pa.repartition((1, 3), devices=device, transfer=True)
        listed = pa.repartition((1, 3), devices=[device] * 3, transfer=True)
        for out in (one, listed):
            assert [str(p.device) for p in out.partitions.values()] == [name] * 3
            np.testing.assert_array_equal(
                np.from_dlpack(out.assemble(device="cpu", transfer=True)), x)
    # What is neither one device nor a sequence of them is still named.
    with pytest.raises(TypeError, match="devices must be a device .* not object"):
        pa.repartition((1, 3), devices=object())


def test_a_process_grid_without_devices_asks_for_one_device_per_cell():
    x = np.arange(12.0).reshape(4, 3)
    pa = dlpart.partition(x, (2, 1))
    with pytest.raises(ValueError) as e:
        pa.repartition((1, 3), process_grid=(1, 3))
    assert str(e.value).startswith(
        "process grid (1, 3) deals the partitions over a list of devices (Layout::dealt; "
        "devices=[...] in Python)")
    assert str(e.value).endswith("no devices were given (the partitions would stay where their "
                                 "data is)")
    dealt = pa.repartition((1, 3), devices=["cpu"] * 3, process_grid=(1, 3))
    np.testing.assert_array_equal(np.from_dlpack(dealt.assemble()), x)


@pytest.mark.parametrize("kind", [13, 11])  # kDLCUDAManaged, kDLROCMHost
def test_new_memory_on_managed_or_rocm_host_memory_names_each_operations_way_out(kind):
    """dlpart makes no managed or ROCm host memory: each operation that would make some says
    what its caller can pass instead (transfer=True alone is not it), and that works without
    transfer=True, as a copy between kinds of host memory."""
    import re

    ref = np.arange(12, dtype=np.float32).reshape(3, 4)
    t = dlpart.from_dlpack(dlpart._core._testing.make_capsule(
        ref.tobytes(), [3, 4], strides=[4, 1], device=(kind, 0)))
    pa = dlpart.partition(t, (3, 1))
    repartition = ("repartition onto one of them (devices='cpu' in Python, a layout "
                   "`.on(Device::CPU)` in Rust; a move between kinds of host memory needs no "
                   "transfer)")
    assemble = ("assemble onto one of them (device='cpu' in Python, `Some(Device::CPU)` in "
                "Rust; a move between kinds of host memory needs no transfer)")
    cases = [
        (lambda: pa.repartition((1, 2)), repartition),
        (lambda: pa.repartition((1, 2), transfer=True), repartition),
        (lambda: pa.assemble(), assemble),
        (lambda: pa.assemble(transfer=True), assemble),
        (lambda: t.copy(), "copy it onto one of them instead (t.to('cpu'))"),
        (lambda: pa.gather([0], transfer=True), "copy the data onto one of them first (`to('cpu')`"),
        (lambda: dlpart.partition(ref, (3, 1)).to(t.device), "name one of them as the target"),
        (lambda: dlpart.from_dlpack(ref).to(t.device), "name one of them as the target"),
    ]
    for make, advice in cases:
        with pytest.raises(BufferError, match=re.escape(advice)) as e:
            make()
        assert str(e.value).startswith(f"cannot allocate new memory on {t.device}: dlpart makes "
                                       "only kDLCPU, kDLCUDA and pinned kDLCUDAHost memory")
    # The ways named work, as named (no transfer=True).
    cols = pa.repartition((1, 2), devices="cpu")
    assert cols.devices == ["kDLCPU"]
    np.testing.assert_array_equal(np.from_dlpack(cols.assemble()), ref)
    np.testing.assert_array_equal(np.from_dlpack(pa.assemble(device="cpu")), ref)
    np.testing.assert_array_equal(np.from_dlpack(t.to("cpu").copy()), ref)
    np.testing.assert_array_equal(np.from_dlpack(pa.to("cpu").gather([2, 0]).assemble()),
                                  ref[[2, 0]])


def _on_oneapi(ref):
    """``ref`` (float32) as a kDLOneAPI tensor: host memory behind the pointer, which dlpart
    never reads under that label (it has no kernels for the device)."""
    return dlpart.from_dlpack(dlpart._core._testing.make_capsule(
        ref.tobytes(), list(ref.shape), device=(14, 0)))


class _IgnoresDlDevice:
    """A producer on kDLOneAPI that takes the DLPack keywords but never moves its data."""

    def __init__(self, t):
        self.t = t

    def __dlpack_device__(self):
        return self.t.__dlpack_device__()

    def __dlpack__(self, **kw):
        kw.pop("dl_device", None)
        return self.t.__dlpack__(**kw)


def test_every_transfer_path_reports_a_device_without_kernels_as_backend_unavailable():
    """Data moving from or to a device dlpart has no kernels for (kDLOneAPI) raises
    BackendUnavailableError naming the device on every path, as PartitionedArray.to does, not
    a BufferError that reads like a bad request; nothing is written. The DLPack entry points,
    whose callers the array API promises a BufferError, raise that with the
    BackendUnavailableError as its cause."""
    ref = np.arange(6, dtype=np.float32).reshape(2, 3)
    there = _on_oneapi(ref)
    host = dlpart.from_dlpack(ref.copy())
    no_kernels = "no kernels for kDLOneAPI:0"
    for make, move in ((lambda: there.to("cpu"), "kDLOneAPI:0 -> kDLCPU"),
                       (lambda: host.to("kDLOneAPI:0"), "kDLCPU -> kDLOneAPI:0"),
                       (lambda: dlpart.partition(ref, (2, 1)).to("kDLOneAPI:0"), None)):
        with pytest.raises(dlpart.BackendUnavailableError, match=no_kernels) as e:
            make()
        if move is not None:
            assert f"transfer {move}" in str(e.value), e.value
    imports = [
        (lambda: dlpart.from_dlpack(there, device="cpu"), "kDLOneAPI:0 onto kDLCPU"),
        (lambda: dlpart.from_dlpack(host, device="kDLOneAPI:0"), "kDLCPU onto kDLOneAPI:0"),
        # A producer that leaves the move to dlpart.
        (lambda: dlpart.from_dlpack(_IgnoresDlDevice(there), device="cpu"),
         "kDLOneAPI:0 onto kDLCPU"),
        # numpy refuses dl_device=kDLOneAPI itself, and dlpart cannot make the move either.
        (lambda: dlpart.from_dlpack(ref, device="kDLOneAPI:0"), "kDLCPU onto kDLOneAPI:0"),
        # __dlpack__ answers a consumer as DLPack asks.
        (lambda: there.__dlpack__(dl_device=(1, 0), max_version=(1, 0)), None),
    ]
    for make, move in imports:
        with pytest.raises(BufferError, match=no_kernels) as e:
            make()
        assert isinstance(e.value.__cause__, dlpart.BackendUnavailableError), repr(e.value)
        assert no_kernels in str(e.value.__cause__)
        if move is not None:
            assert f"cannot place a tensor on {move}" in str(e.value), e.value
    # numpy's own refusal is named, and chained under the cause.
    with pytest.raises(BufferError, match=r"ndarray.__dlpack__ refused the move") as e:
        dlpart.from_dlpack(ref, device="kDLOneAPI:0")
    assert type(e.value.__cause__.__cause__) is BufferError
    # With copy=False no copy could serve, whoever made it: refused as dlpart refuses the
    # request for its own tensors, numpy's refusal chained as the cause.
    for source, cause in ((host, type(None)), (ref, BufferError)):
        with pytest.raises(BufferError) as e:
            dlpart.from_dlpack(source, device="kDLOneAPI:0", copy=False)
        assert no_kernels not in str(e.value)
        assert type(e.value.__cause__) is cause
    assert str(e.value) == ("cannot place a tensor on kDLCPU onto kDLOneAPI:0: copy=False "
                            "forbids the copy this needs")
    # Gather and scatter between host memory and such a device.
    out = np.full((1, 3), -1.0, np.float32)
    one_api_row = there.view([0, 0], [1, 3])
    for make in (lambda: dlpart.gather(host, [1], out=one_api_row),
                 lambda: dlpart.scatter(one_api_row, [0], out),
                 lambda: dlpart.gather(host, _on_oneapi(np.zeros(1, np.float32)).view([0], [0])),
                 lambda: dlpart.partition(out, (1, 1)).scatter(one_api_row, [0]),
                 lambda: dlpart.partition(out, (1, 1)).scatter(one_api_row, [0], transfer=True)):
        with pytest.raises(dlpart.BackendUnavailableError, match=no_kernels):
            make()
    np.testing.assert_array_equal(out, -1.0)
    np.testing.assert_array_equal(np.from_dlpack(host), ref)


# Host memory of kinds other than plain kDLCPU: ordinary memory labelled so (the CPU reads
# and writes every kind alike), and JAX's emulated host device kDLCPU:1.
HOST_KINDS = {**GATHER_HOST_KINDS, "kDLCPU:1": (1, 1)}


def _mixed(x, device):
    """``x`` (6 rows) in two row blocks: rows 0-2 a numpy array (kDLCPU), rows 3-5 in memory
    of ``device``."""
    return dlpart.from_partitioned({
        "shape": x.shape, "partition_tiling": (2, 1), "partitions": {
            (0, 0): {"start": (0, 0), "shape": (3, x.shape[1]), "data": x[:3].copy(),
                     "location": [0]},
            (1, 0): {"start": (3, 0), "shape": (3, x.shape[1]),
                     "data": _labelled(x[3:], device), "location": [0]}}})


@pytest.mark.parametrize("kind", sorted(HOST_KINDS))
def test_moves_between_host_memory_kinds_need_no_transfer(kind):
    """dlpart's one transfer rule: data moving between host memory of any kinds (kDLCPU, JAX's
    kDLCPU:k, pinned, managed, ROCm host memory) is a plain copy, which needs no
    transfer=True, in every operation; none of these copies needs CUDA either."""
    dlpart._core._note_host_devices(2)
    x = np.arange(24.0).reshape(6, 4)
    pa = _mixed(x, HOST_KINDS[kind])
    assert set(pa.devices) == {dlpart.Device("kDLCPU"), dlpart.Device(kind)}
    # repartition onto kDLCPU, and from kDLCPU onto the emulated host device
    cols = pa.repartition((1, 2), devices="cpu")
    assert cols.devices == ["kDLCPU"]
    np.testing.assert_array_equal(np.from_dlpack(cols.assemble()), x)
    there = cols.repartition((3, 1), devices="kDLCPU:1")
    assert there.devices == ["kDLCPU:1"]
    np.testing.assert_array_equal(np.from_dlpack(there.assemble()), x)
    # repartition_into targets in kDLCPU memory, and into targets of this kind
    out = dlpart.partition(np.zeros_like(x), (1, 2))
    pa.repartition_into(out)
    np.testing.assert_array_equal(np.from_dlpack(out.assemble()), x)
    target = _labelled(np.zeros_like(x), HOST_KINDS[kind])
    cols.repartition_into(dlpart.partition(target, (2, 2)))
    np.testing.assert_array_equal(np.from_dlpack(target), x)
    # assemble onto a named host device; with none named, a device is asked for, no transfer
    np.testing.assert_array_equal(np.from_dlpack(pa.assemble(device="cpu")), x)
    with pytest.raises(dlpart.DeviceError, match="pass a device") as e:
        pa.assemble()
    assert "transfer" not in str(e.value)
    # gather: the result lives on kDLCPU, the device of row 1
    picked = pa.gather([1, 4, -1, 0])
    assert picked.devices == ["kDLCPU"]
    np.testing.assert_array_equal(np.from_dlpack(picked.assemble()), np.take(x, [1, 4, -1, 0], 0))
    # scatter of values in memory of this kind into both partitions
    values = -np.arange(12.0).reshape(3, 4) - 1
    pa.scatter(_labelled(values, HOST_KINDS[kind]), [5, 1, 3])
    expect = x.copy()
    expect[[5, 1, 3]] = values
    np.testing.assert_array_equal(np.from_dlpack(pa.assemble(device="cpu")), expect)


def test_moves_from_or_to_device_memory_still_need_transfer():
    """The other half of the rule: data moving to or from device memory (here host bytes
    labelled kDLCUDA:0, never touched: every move is refused first) needs transfer=True."""
    x = np.arange(24.0).reshape(6, 4)
    gpu = _mixed(x, (2, 0))
    host = dlpart.partition(x.copy(), (2, 1))
    moves = [
        (lambda: gpu.repartition((1, 2), devices="cpu"), "kDLCUDA:0 -> kDLCPU"),
        (lambda: host.repartition((1, 2), devices="kDLCUDA:0"), "kDLCPU -> kDLCUDA:0"),
        (lambda: gpu.repartition_into(dlpart.partition(np.zeros_like(x), (1, 2))),
         "kDLCUDA:0 -> kDLCPU"),
        (lambda: gpu.assemble(device="cpu"), "kDLCUDA:0 -> kDLCPU"),
        (lambda: gpu.gather([1, 4]), "kDLCUDA:0 -> kDLCPU"),
        (lambda: host.scatter(_labelled(x[:2], (2, 0)), [1, 4]), "kDLCUDA:0 -> kDLCPU"),
    ]
    for make, moved in moves:
        with pytest.raises(dlpart.DeviceError, match="transfer=True") as e:
            make()
        assert moved in str(e.value), str(e.value)
    with pytest.raises(dlpart.DeviceError, match="transfer=True"):
        gpu.assemble()  # several devices, one of them device memory
    np.testing.assert_array_equal(np.from_dlpack(host.assemble()), x)
