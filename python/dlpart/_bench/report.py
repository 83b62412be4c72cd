"""The printed table, the JSON file, the PNG chart and the machine description."""

from __future__ import annotations

import datetime
import json
import os
import platform
import shlex
import subprocess
import sys
from typing import Any, Dict, List, Set, Tuple

from .env import affinity
from .timing import Result, fmt_gbs, fmt_us

TITLES = {
    "1": "row blocks -> column blocks",
    "2": "2x2 blocks -> block-cyclic over 4 device slots",
    "3": "run-length sweep (bandwidth per contiguous run)",
    "4": "halo faces of a cube",
    "5": "gather / scatter",
    "6": "small arrays over a 64x64 grid -> grid shifted by half a block",
    "7": "planning alone vs the whole repartition",
    "8": "peak memory of a repartition",
    "9": "importing a dict of 4,096 numpy partitions",
    "10": "what a user would pick instead: rows -> columns in jax and dask",
}


# -- table ----------------------------------------------------------------------------------------
QUICK_NOTE = ("quick run: small sizes and few runs, so the figures are indicative and targets "
              "are not judged (run without --quick to judge them)")


def table(results: List[Result], judged: bool = True) -> str:
    """One table per workload and unit: bandwidth cases in GB/s, overhead-bound cases in us
    (their ratios are unitless). The spread is the interquartile range of the timed runs.
    Targets are judged (met / MISSED) only when `judged`; otherwise they are only shown."""
    lines: List[str] = [] if judged else [QUICK_NOTE]
    current = None
    for r in results:
        unit = "us" if r.unit == "us" else "GB/s"
        if (r.workload, unit) != current:
            current = (r.workload, unit)
            head = _head(unit)
            lines += ["", f"[{r.workload}] {TITLES.get(r.workload, '')} ({unit})", head,
                      "-" * len(head)]
        if r.skipped or r.failed:
            what = f"skipped: {r.skipped}" if r.skipped else f"FAILED: {r.failed}"
            lines.append(f"{r.name:<30} {what}")
            continue
        s = r.stats
        if unit == "us":
            cells = (fmt_us(s.median), fmt_us(s.min), fmt_us(s.iqr))
        else:
            cells = (fmt_gbs(s.bandwidth), fmt_gbs(s.bytes / s.min), fmt_gbs(s.bandwidth_iqr))
        lines.append(f"{r.name:<30} {cells[0]:>10} {cells[1]:>10} {cells[2]:>10}  " + _refs(r))
        ratios = _ratios(r, judged)
        if ratios:
            lines.append(f"{'':<65}{ratios}")
        note = r.extra.get("note")
        if note:
            lines.append(f"{'':<65}{note}")
    return "\n".join(lines).lstrip("\n")


def _head(unit: str) -> str:
    if unit == "us":
        cols = ("median", "min", "IQR")
    else:
        cols = ("median", "best", "IQR")
    return (f"{'case':<30} {cols[0]:>10} {cols[1]:>10} {cols[2]:>10}  "
            f"references: median (IQR), {unit} / ratios")


def _refs(r: Result) -> str:
    if r.unit == "us":
        return ", ".join(f"{k} {fmt_us(v.median)} ({fmt_us(v.iqr)})"
                         for k, v in r.references.items())
    return ", ".join(f"{k} {fmt_gbs(v.bandwidth)} ({fmt_gbs(v.bandwidth_iqr)})"
                     for k, v in r.references.items())


def _ratios(r: Result, judged: bool = True) -> str:
    out = []
    for k, v in r.ratios.items():
        t = r.targets.get(k)
        if t is None:
            mark = ""
        elif not judged:
            mark = f" (target >= {t:g}, not judged)"
        else:
            mark = f" (target >= {t:g}: " + ("met)" if v >= t else "MISSED)")
        out.append(f"{k} {v:.2f}{mark}")
    return "  ".join(out)


# -- JSON -----------------------------------------------------------------------------------------
def to_json(results: List[Result], machine: Dict[str, Any], config: Dict[str, Any]) -> Dict:
    return {
        "machine": machine,
        "config": config,
        "units": {"times": "s", "bandwidth": "bytes/s (read + written by the minimal algorithm)",
                  "q1, q3, iqr": "s: first and third quartiles of the timed runs, and their "
                                 "difference (bandwidth_iqr: the same spread in bytes/s)",
                  "ratios": "dlpart bandwidth / reference bandwidth unless named otherwise"},
        "workload_titles": TITLES,
        "workloads": {r.name: r.to_json() for r in results},
    }


def write_json(path: str, doc: Dict) -> None:
    with open(path, "w") as f:
        json.dump(doc, f, indent=1, default=str)
        f.write("\n")


def machine_info(env=None) -> Dict[str, Any]:
    """The machine, the versions, the commit, the date and the command of a run; `env`'s
    device and array library when given (the MPI benchmark has none: host memory, numpy)."""
    import numpy as np

    import dlpart

    info: Dict[str, Any] = {
        "cpu_count": os.cpu_count(),
        "cpu_affinity": _affinity_count(),
        "cpu_model": _cpu_model(),
        "memory_bytes": _mem_total(),
        "platform": platform.platform(),
        "python": sys.version.split()[0],
        "numpy": np.__version__,
        "dlpart": getattr(dlpart, "__version__", "unknown"),
        "git_commit": _git_commit(),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "command": shlex.join([sys.executable, "-m", "dlpart", *sys.argv[1:]]),
    }
    info.update(env.info() if env is not None else {"device": "kDLCPU"})
    return info


def _affinity_count():
    cpus = affinity()
    return len(cpus) if cpus is not None else None


def _cpu_model():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or None


def _mem_total():
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemTotal:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def _git_commit():
    """The commit of the dlpart checkout (when run from one), else of the working directory."""
    import dlpart

    here = os.path.dirname(os.path.abspath(dlpart.__file__))
    for cwd in (here, os.getcwd()):
        try:
            out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=cwd, capture_output=True,
                                 text=True, timeout=10)
        except (OSError, subprocess.SubprocessError):
            return None
        if out.returncode == 0:
            return out.stdout.strip()
    return None


# -- PNG ------------------------------------------------------------------------------------------
def write_png(path: str, results: List[Result], machine: Dict[str, Any]) -> str:
    """Draws the chart; returns '' or why it was not drawn."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "matplotlib is not installed (pip install dlpart[bench])"
    ok = [r for r in results if r.stats is not None]
    bars = [r for r in ok if r.unit != "us" and r.workload not in ("3", "8")]
    sweep = [r for r in ok if r.workload == "3"]
    small = [r for r in ok if r.unit == "us"]
    panels = [p for p in (bars, sweep, small) if p]
    if not panels:
        panels = [[]]
    heights = [max(2.5, 0.32 * len(bars)) if p is bars else 3.0 for p in panels]
    fig, axes = plt.subplots(len(panels), 1, figsize=(11, sum(heights) + 1.2),
                             gridspec_kw={"height_ratios": heights}, squeeze=False)
    for ax, p in zip(axes[:, 0], panels):
        if p is bars and bars:
            _bar_panel(ax, bars)
        elif p is sweep and sweep:
            _sweep_panel(ax, sweep)
        elif p is small and small:
            _small_panel(ax, small)
        else:
            ax.text(0.5, 0.5, "no results", ha="center", va="center")
            ax.set_axis_off()
    fig.suptitle(f"dlpart bench on {machine.get('device')} - {machine.get('cpu_model') or ''} "
                 f"({machine.get('cpu_affinity')} cores), {machine.get('date')}", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return ""


def _main_refs(r: Result) -> List[str]:
    """dlpart and the references named in its ratios, so the chart shows what is compared."""
    names = []
    for key in r.ratios:
        ref = key.split("/", 1)[1] if key.startswith("dlpart/") else None
        if ref in r.references:
            names.append(ref)
    return names[:3]


def target_marks(r: Result) -> List[Tuple[str, float]]:
    """Where each target of `r` puts dlpart, in the case's own unit: (ratio name, GB/s) for a
    bandwidth case, (ratio name, us) for an overhead-bound one. A target ``dlpart/ref >= t``
    is ``t`` times the reference's bandwidth, or its time divided by ``t``. Targets on a ratio
    that is not against a measured reference (or the datasheet) have no place on the axis."""
    marks = []
    for key, t in r.targets.items():
        ref = key.split("/", 1)[1] if key.startswith("dlpart/") else None
        if ref in r.references:
            stats = r.references[ref]
            value = stats.median / t * 1e6 if r.unit == "us" else t * stats.bandwidth / 1e9
        elif ref == "datasheet" and r.extra.get("datasheet_bandwidth"):
            value = t * r.extra["datasheet_bandwidth"] / 1e9
        else:
            continue
        marks.append((key, value))
    return marks


def _bar_panel(ax, rows: List[Result]) -> None:
    """One group of bars per case: dlpart and the references its ratios name, one colour per
    implementation across the whole chart."""
    colours: Dict[str, str] = {}
    palette = [f"C{i}" for i in range(10)]
    drawn: Set[str] = set()
    for i, r in enumerate(rows):
        names = ["dlpart"] + _main_refs(r)
        h = 0.8 / len(names)
        for k, name in enumerate(names):
            stats = r.stats if name == "dlpart" else r.references[name]
            first = name not in colours
            colours.setdefault(name, palette[len(colours) % len(palette)])
            ax.barh(i - 0.4 + (k + 0.5) * h, stats.bandwidth / 1e9, height=h,
                    color=colours[name], label=name if first else None)
        for key, gbs in target_marks(r):
            ax.vlines(gbs, i - 0.45, i + 0.45, colors="k", linestyles="--", linewidth=1.2,
                      label=None if "target" in drawn else "target (dlpart at least)")
            ax.annotate(key.split("/", 1)[1], (gbs, i - 0.45), fontsize=5, ha="left", va="bottom")
            drawn.add("target")
    ax.set_yticks(range(len(rows)))
    ax.set_yticklabels([r.name for r in rows], fontsize=7)
    ax.set_ylim(len(rows) - 0.5, -0.5)
    ax.set_xlabel("effective bandwidth (GB/s, read + write)")
    ax.legend(fontsize=7, loc="lower right")
    ax.grid(axis="x", alpha=0.3)


def _sweep_panel(ax, rows: List[Result]) -> None:
    xs = [r.params["run_bytes"] for r in rows]
    ax.plot(xs, [r.stats.bandwidth / 1e9 for r in rows], "o-", label="dlpart")
    for name in rows[0].references:
        if all(name in r.references for r in rows) and not name.endswith("-alloc"):
            ax.plot(xs, [r.references[name].bandwidth / 1e9 for r in rows], ".--", label=name)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("contiguous run (bytes)")
    ax.set_ylabel("GB/s")
    ax.set_title("run-length sweep", fontsize=9)
    ax.legend(fontsize=7)
    ax.grid(alpha=0.3)


def _small_panel(ax, rows: List[Result]) -> None:
    import numpy as np

    names = ["dlpart"] + [n for n in rows[0].references if all(n in r.references for r in rows)]
    x = np.arange(len(rows))
    w = 0.8 / len(names)
    for k, name in enumerate(names):
        vals = [(r.stats.median if name == "dlpart" else r.references[name].median) * 1e6
                for r in rows]
        ax.bar(x + k * w, vals, width=w, label=name)
    drawn = False
    for i, r in enumerate(rows):
        for key, us in target_marks(r):
            # over the dlpart bar: the target is a time dlpart should stay under
            ax.hlines(us, x[i] - w / 2, x[i] + w / 2, colors="k", linestyles="--", linewidth=1.2,
                      label=None if drawn else "target (dlpart at most)")
            drawn = True
    ax.set_xticks(x + 0.4 - w / 2)
    ax.set_xticklabels([r.name for r in rows], fontsize=7)
    ax.set_yscale("log")
    ax.set_ylabel("time (us, log)")
    ax.set_title("overhead-bound cases", fontsize=9)
    ax.legend(fontsize=7)
    ax.grid(axis="y", alpha=0.3)
