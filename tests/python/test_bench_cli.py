"""`python -m dlpart bench`: the quick run end to end, and the pieces its references rely on."""

import itertools
import json
import math
import random

import numpy as np
import pytest

import dlpart
from dlpart import _bench
from dlpart._bench.common import boxes, direct_setup, even_splits, run_pairs
from dlpart._bench.cuda import _CudaEnvBase
from dlpart._bench.env import CpuEnv
from dlpart._bench.indexing import HALO_ROUNDS, indices

WORKLOADS = {str(k) for k in range(1, 11)}


def _missing(reason):
    """True if a skip reason names a dlpart attribute that really is absent, or an operation
    dlpart itself reports as unimplemented on this device."""
    if reason.startswith("not implemented in dlpart: "):
        return True
    prefix, suffix = "dlpart.", " is missing"
    if not (reason.startswith(prefix) and reason.endswith(suffix)):
        return False
    obj = dlpart
    for part in reason[len(prefix) : -len(suffix)].split("."):
        obj = getattr(obj, part, None)
    return obj is None


def test_quick_run_exits_cleanly_and_writes_every_file(quick_bench):
    proc, out = quick_bench
    for name in ("bench.json", "bench.txt"):
        assert (out / name).stat().st_size > 0
    assert (out / "bench.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_quick_run_json_has_every_workload_with_positive_times(quick_bench):
    proc, out = quick_bench
    doc = json.loads((out / "bench.json").read_text())
    machine = doc["machine"]
    for key in ("cpu_count", "platform", "numpy", "dlpart", "git_commit", "date", "command"):
        assert key in machine
    assert machine["numpy"] == np.__version__
    assert machine["dlpart"] == dlpart.__version__
    assert "bench" in machine["command"]
    cases = doc["workloads"]
    assert {c["workload"] for c in cases.values()} == WORKLOADS
    for name, c in cases.items():
        assert "failed" not in c, (name, c.get("failed"))
        assert name in proc.stdout  # every case has a row in the printed table
        if "skipped" in c:
            # Only a dlpart API piece that is really absent may skip a case (or, on a GPU, the
            # host-RSS workload and the host-only alternatives).
            assert _missing(c["skipped"]) or (c["workload"] in ("8", "10") and
                                              doc["config"]["device"] != "kDLCPU"), \
                (name, c["skipped"])
            continue
        # The judged row->column cases take three times the timed runs, the halo cases (whose
        # rounds are short) HALO_ROUNDS times.
        rounds = (3 if name.startswith("rows_to_cols")
                  else HALO_ROUNDS if name.startswith("halo_faces") else 1)
        assert len(c["times"]) == rounds * doc["config"]["repeat"] or c["workload"] == "8"
        assert all(t > 0 for t in c["times"]), name
        assert c["median"] > 0 and c["bandwidth"] > 0 and c["bytes"] > 0, name
        assert c["min"] <= c["median"]
        assert c["references"], name
        for ref, r in c["references"].items():
            assert r["median"] > 0 and r["bandwidth"] > 0, (name, ref)
        for key, v in c["ratios"].items():
            assert math.isfinite(v) and v >= 0, (name, key, v)


def test_quick_run_reports_the_brief_ratios(quick_bench):
    _, out = quick_bench
    cases = json.loads((out / "bench.json").read_text())["workloads"]
    c = cases["rows_to_cols/float32"]
    if "skipped" in c:
        pytest.skip(c["skipped"])
    if "memcpy2" in c["references"]:  # CPU run
        assert set(c["ratios"]) >= {"dlpart/memcpy2", "dlpart/numpy-direct"}
        assert c["ratios"]["dlpart/memcpy2"] == pytest.approx(
            c["references"]["memcpy2"]["median"] / c["median"])
        assert {"memcpy1", "numpy-concat-split"} <= set(c["references"])


def test_missing_api_is_skipped_not_failed(tmp_path, monkeypatch):
    monkeypatch.delattr(dlpart, "partition", raising=False)
    rc = _bench.main(["--quick", "--device", "kDLCPU", "--only", "rows_to_cols/uint8",
                      "--out", str(tmp_path)])
    assert rc == 0
    cases = json.loads((tmp_path / "bench.json").read_text())["workloads"]
    assert list(cases) == ["rows_to_cols/uint8"]
    assert cases["rows_to_cols/uint8"]["skipped"] == "dlpart.partition is missing"


def test_only_filters_by_substring(capsys):
    assert _bench.main(["--quick", "--device", "kDLCPU", "--list", "--only", "gather/"]) == 0
    names = capsys.readouterr().out.split()
    assert names == [f"gather/{p}" for p in ("random", "sorted", "block32", "block256")]
    assert _bench.main(["--quick", "--device", "kDLCPU", "--only", "no-such-case"]) == 2


def test_direct_reference_copies_every_element_once():
    """The numpy per-block reference against plain slicing, on random uneven grids (empty
    partitions included)."""
    rng = random.Random(7)
    env = CpuEnv()

    def splits(n):
        return [0] + sorted(rng.randint(0, n) for _ in range(rng.randint(0, 4))) + [n]

    try:
        for _ in range(200):
            shape = [rng.randint(0, 9) for _ in range(rng.randint(1, 3))]
            x = np.arange(int(np.prod(shape))).reshape(shape)
            src_splits = [splits(n) for n in shape]
            dst_splits = [splits(n) for n in shape]
            _, dst, pairs = direct_setup(env, x, src_splits, dst_splits)
            for d in dst.values():
                d[...] = -1
            run_pairs(pairs)
            for pos, sl in boxes(dst_splits):
                np.testing.assert_array_equal(dst[pos], x[sl])
            # Each element is copied exactly once: the pieces' sizes add up to the array's.
            assert sum(int(np.prod(d[dsl].shape)) for d, dsl, _, _ in pairs) == x.size
    finally:
        env.close()


def test_even_splits_match_numpy_array_split():
    for n, k in itertools.product(range(0, 12), range(1, 6)):
        sizes = [len(p) for p in np.array_split(np.arange(n), k)]
        assert np.diff(even_splits(n, k)).tolist() == sizes


@pytest.mark.parametrize("pattern", ["random", "sorted", "block32", "block256"])
def test_index_patterns(pattern):
    n = 4096
    idx = indices(pattern, n)
    assert idx.dtype == np.int64 and idx.shape == (n,)
    assert idx.min() >= 0 and idx.max() < n
    if pattern == "sorted":
        assert np.all(np.diff(idx) >= 0)
    if pattern.startswith("block"):
        b = int(pattern[5:])
        runs = idx.reshape(-1, b)
        assert np.all(runs[:, 0] % b == 0)
        assert np.all(np.diff(runs, axis=1) == 1)


def test_measure_together_runs_round_robin_with_a_reset_before_each_timed_call():
    from dlpart._bench.timing import measure_together

    log = []
    fns = {name: (lambda n=name: log.append(n)) for name in ("a", "b", "c")}
    checked = []
    times = measure_together(
        fns, repeat=3, warmup=2, sync=lambda: None,
        checks={"b": lambda r: checked.append(r)}, reset=lambda: log.append("reset"),
    )
    untimed = ["a", "b", "c"] * 2  # warm-up rounds: no reset
    timed = ["reset", "a", "reset", "b", "reset", "c"] * 3
    assert log == untimed + timed
    assert checked == [None]
    assert {k: len(v) for k, v in times.items()} == {"a": 3, "b": 3, "c": 3}
    assert all(t >= 0 for v in times.values() for t in v)


def test_cpu_clean_cache_reads_at_least_twice_the_largest_cache():
    from dlpart._bench.env import _llc_bytes

    env = CpuEnv()
    try:
        env.clean_cache()
        assert env._scratch.nbytes >= 2 * _llc_bytes()
    finally:
        env.close()


@pytest.mark.parametrize("name, expected", [
    ("NVIDIA H100 80GB HBM3", 3.35e12),
    ("NVIDIA H100 PCIe", 2.0e12),
    ("NVIDIA H100 NVL", 3.9e12),
    ("NVIDIA H200", 4.8e12),
    ("NVIDIA GH200 480GB", 4.0e12),
    ("NVIDIA A100-SXM4-80GB", 2.039e12),
    ("NVIDIA A100-PCIE-40GB", 1.555e12),
    ("NVIDIA GeForce RTX 4090", None),
])
def test_datasheet_bandwidth_by_gpu_name(name, expected):
    from dlpart._bench.cuda import datasheet_bandwidth

    assert datasheet_bandwidth(name) == expected


class _FakeCudaEnv(CpuEnv):
    """numpy standing in for a CUDA env, to check how the GPU targets are wired on a machine
    without a GPU: the names and ratios, not the figures."""

    kind = "cuda"
    lib = "torch"
    direct = "torch-direct"
    concat_split_name = "torch-concat-split"

    def __init__(self):
        super().__init__()
        self.memcpy_primary = ("memcpyD2D", "copy-kernel")

    def info(self):
        return {"device": "kDLCPU", "gpu": "NVIDIA H100 80GB HBM3"}

    datasheet = _CudaEnvBase.datasheet  # the real lookup, by the name info() reports

    def memcpy_refs(self, nbytes):
        refs = super().memcpy_refs(nbytes)
        return {"memcpyD2D": refs["memcpy1"], "copy-kernel": refs["memcpy2"]}


def test_gpu_targets_are_set_on_the_cases_the_issue_names():
    from dlpart._bench import workloads
    from dlpart._bench.common import Ctx
    from dlpart._bench.timing import Result

    env = _FakeCudaEnv()
    try:
        full = Ctx(env=env, repeat=1, warmup=0, quick=False)
        names = {c.name for make in workloads() for c in make(full)}
        assert {"rows_to_cols_into/float32-1GiB", "rows_to_cols/float32-1GiB"} <= names
        assert "rows_to_cols_into/float64-1GiB" not in names

        ctx = Ctx(env=env, repeat=1, warmup=0, quick=True)
        cases = {c.name: c for make in workloads() for c in make(ctx)}
        res = Result("rows_to_cols_into/float32", "1", dict(cases["rows_to_cols_into/float32"].params))
        cases["rows_to_cols_into/float32"].run(ctx, res)
        assert set(res.targets) == {"dlpart/memcpyD2D", "dlpart/torch-concat-split",
                                    "dlpart/datasheet"}
        assert set(res.targets) <= set(res.ratios)
        assert res.ratios["dlpart/datasheet"] == pytest.approx(res.stats.bandwidth / 3.35e12)
        assert res.ratios["dlpart/memcpyD2D"] == pytest.approx(
            res.references["memcpyD2D"].median / res.stats.median)

        res = Result("gather/block32", "5", dict(cases["gather/block32"].params))
        cases["gather/block32"].run(ctx, res)
        assert res.targets == {"dlpart/memcpyD2D": 0.6}
        assert "dlpart/memcpyD2D" in res.ratios
    finally:
        env.close()
