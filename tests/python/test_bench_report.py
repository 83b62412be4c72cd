"""The benchmark's report: spread, one unit per table, targets judged only on full runs and
drawn in the PNG, progress on stderr, and the same-run alternatives (jax, dask)."""

import json
import re

import pytest

from dlpart._bench import report
from dlpart._bench.timing import Result, Stats


def _result(name, unit, times, refs, targets):
    r = Result(name, "1", {}, bytes=1000, stats=Stats(times, 1000), unit=unit)
    for ref, t in refs.items():
        r.references[ref] = Stats(t, 1000)
        r.ratio(ref)
    r.targets = targets
    return r


def test_quartiles_and_spread_match_numpy():
    import numpy as np

    times = [5.0, 1.0, 4.0, 2.0, 3.0, 9.0, 7.0]
    s = Stats(times, 100)
    q1, q3 = np.percentile(times, [25, 75])
    assert s.quartiles == pytest.approx((q1, q3))
    assert s.iqr == pytest.approx(q3 - q1)
    assert s.bandwidth_iqr == pytest.approx(100 / q1 - 100 / q3)
    assert Stats([2.0], 10).iqr == 0


def test_quick_run_judges_no_target_and_says_so(quick_bench):
    proc, out = quick_bench
    text = proc.stdout
    assert text.startswith(report.QUICK_NOTE)
    assert "MISSED" not in text and ": met)" not in text
    assert "not judged" in text  # the targets are still shown
    doc = json.loads((out / "bench.json").read_text())
    assert doc["config"]["targets_judged"] is False


def test_full_runs_judge_targets():
    r = _result("a", "GB/s", [1.0, 1.0, 1.0], {"ref": [2.0, 2.0, 2.0]}, {"dlpart/ref": 1.5})
    text = report.table([r], judged=True)
    assert "dlpart/ref 2.00 (target >= 1.5: met)" in text
    r.targets = {"dlpart/ref": 3}
    assert "(target >= 3: MISSED)" in report.table([r], judged=True)


def test_each_table_has_one_unit(quick_bench):
    proc, _ = quick_bench
    tables = re.split(r"\n(?=\[\d+\] )", proc.stdout)
    units = set()
    for t in tables[1:]:
        head, rows = t.split("\n", 1)
        unit = re.search(r"\((us|GB/s)\)$", head).group(1)
        units.add(unit)
        other = "GB/s" if unit == "us" else " us"
        assert other not in rows, t
    assert units == {"us", "GB/s"}


def test_every_timed_case_reports_its_spread(quick_bench):
    _, out = quick_bench
    cases = json.loads((out / "bench.json").read_text())["workloads"]
    for name, c in cases.items():
        if "skipped" in c:
            continue
        for s in [c, *c["references"].values()]:
            assert s["q1"] <= s["median"] <= s["q3"], name
            assert s["iqr"] == pytest.approx(s["q3"] - s["q1"]), name


def test_progress_lines_go_to_stderr(quick_bench):
    proc, _ = quick_bench
    lines = proc.stderr.splitlines()
    assert any(re.match(r"\[ *1/\d+\] ", ln) for ln in lines), proc.stderr
    assert any(re.search(r"\[ *2/\d+\] .*so far, about \d+s left", ln) for ln in lines), proc.stderr


def test_jax_and_dask_are_timed_in_the_same_run(quick_bench):
    pytest.importorskip("jax")
    pytest.importorskip("dask.array")
    _, out = quick_bench
    c = json.loads((out / "bench.json").read_text())["workloads"]["instead/rows_to_cols/float32"]
    assert c["params"]["shape"] == [1024, 1024]
    for ref in ("jax-device_put", "dask-rechunk"):
        assert len(c["references"][ref]["times"]) == len(c["times"])
        assert c["ratios"][f"dlpart/{ref}"] == pytest.approx(
            c["references"][ref]["median"] / c["median"])


def test_targets_are_placed_in_the_case_unit():
    bw = _result("a", "GB/s", [1.0], {"ref": [4.0]}, {"dlpart/ref": 2.0, "plan/repartition": 1})
    # ref moves 1000 bytes in 4 s: 250 B/s; dlpart must reach 2x that.
    assert report.target_marks(bw) == [("dlpart/ref", pytest.approx(2 * 250 / 1e9))]
    us = _result("b", "us", [1.0], {"ref": [8e-6]}, {"dlpart/ref": 4.0})
    # ref takes 8 us; dlpart must take at most a quarter of that.
    assert report.target_marks(us) == [("dlpart/ref", pytest.approx(2.0))]


def test_png_draws_the_targets(tmp_path, monkeypatch):
    pytest.importorskip("matplotlib")
    drawn = []
    import matplotlib.axes

    monkeypatch.setattr(matplotlib.axes.Axes, "vlines",
                        lambda self, x, *a, **k: drawn.append(("v", x)))
    monkeypatch.setattr(matplotlib.axes.Axes, "hlines",
                        lambda self, y, *a, **k: drawn.append(("h", y)))
    bw = _result("a", "GB/s", [1.0], {"ref": [4.0]}, {"dlpart/ref": 2.0})
    us = _result("b", "us", [1.0], {"ref": [8e-6]}, {"dlpart/ref": 4.0})
    assert report.write_png(str(tmp_path / "b.png"), [bw, us], {}) == ""
    assert ("v", pytest.approx(5e-7)) in drawn and ("h", pytest.approx(2.0)) in drawn
