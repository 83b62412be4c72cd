"""The device a benchmark runs on: how to allocate arrays there, synchronise, and run the
same-run references (memcpy, the array library's own way). The workloads only talk to an
`Env`, so the CPU and CUDA paths share them; `cuda.py` holds the CUDA one."""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from typing import Callable, Dict, List, Sequence, Tuple

import numpy as np


class CpuEnv:
    """kDLCPU with numpy as the array library and reference."""

    kind = "cpu"
    device = "kDLCPU"
    lib = "numpy"
    direct = "numpy-direct"
    concat_split_name = "numpy-concat-split"
    def __init__(self) -> None:
        self.threads = _cpu_count()
        self._pool = ThreadPoolExecutor(max_workers=max(2, self.threads))
        # Ratios printed for copy-bound workloads: dlpart against these references. dlpart uses
        # every core, so on machines with more than two the all-core memcpy is named too.
        all_cores = (f"memcpy{self.threads}",) if self.threads > 2 else ()
        self.memcpy_primary = ("memcpy2",) + all_cores
        self._scratch = None

    def close(self) -> None:
        self._pool.shutdown()

    def info(self) -> Dict[str, object]:
        return {"device": self.device, "array_library": f"numpy {np.__version__}"}

    # -- arrays ----------------------------------------------------------------------------------
    def empty(self, shape: Sequence[int], dtype: str):
        return np.empty(tuple(shape), dtype=dtype)

    def filled(self, shape: Sequence[int], dtype: str):
        return fill_host(shape, dtype)

    def from_host(self, a: np.ndarray):
        return a

    def to_host(self, a) -> np.ndarray:
        return np.asarray(a)

    def view(self, tensor):
        """A zero-copy native view of a dlpart tensor."""
        return np.from_dlpack(tensor)

    def equal(self, a, b) -> bool:
        return bool(np.array_equal(a, b))

    def sync(self) -> None:
        pass

    def clean_cache(self) -> None:
        """Leaves the caches holding clean lines only, by reading twice the last-level cache.
        A copy that follows one that wrote with plain stores otherwise first pays for writing
        back the other's dirty lines (measured here: about 10% of an 8192² float32 repartition
        after numpy's per-block copy)."""
        if self._scratch is None:
            self._scratch = np.ones(max(2 * _llc_bytes(), 16 << 20), dtype=np.uint8)
        self._scratch.sum(dtype=np.uint64)

    # -- references -----------------------------------------------------------------------------
    def memcpy_refs(self, nbytes: int) -> Dict[str, Callable[[], object]]:
        """memcpy of `nbytes` between preallocated contiguous buffers on one and two threads
        (numpy's copyto releases the GIL), on all cores when there are more than two, and on one
        thread into a freshly allocated buffer (what any operation returning new arrays pays for
        page faults)."""
        src = self.filled((nbytes,), "uint8")
        dst = np.empty_like(src)
        refs: Dict[str, Callable[[], object]] = {
            "memcpy1": lambda: np.copyto(dst, src),
            "memcpy2": self._threaded_copy(dst, src, 2),
        }
        if self.threads > 2:
            refs[f"memcpy{self.threads}"] = self._threaded_copy(dst, src, self.threads)
        refs["memcpy1-alloc"] = lambda: np.copyto(np.empty_like(src), src)
        return refs

    def _threaded_copy(self, dst: np.ndarray, src: np.ndarray, n: int) -> Callable[[], None]:
        bounds = [len(src) * k // n for k in range(n + 1)]
        pieces = [(dst[a:b], src[a:b]) for a, b in zip(bounds, bounds[1:])]

        def run() -> None:
            for f in [self._pool.submit(np.copyto, d, s) for d, s in pieces]:
                f.result()

        return run

    def concat_split(self, parts: List, n: int, axis: int) -> List:
        whole = np.concatenate(parts, axis=1 - axis)
        return [np.ascontiguousarray(p) for p in np.array_split(whole, n, axis=axis)]

    def take(self, x, idx):
        return np.take(x, idx)

    def take_out(self, x, idx, out):
        # mode="raise" with out= buffers the whole result; "clip" writes in place.
        return np.take(x, idx, out=out, mode="clip")

    def setitem(self, out, idx, values) -> None:
        out[idx] = values


def fill_host(shape: Sequence[int], dtype: str) -> np.ndarray:
    """A deterministic host array whose elements differ from their neighbours, filled in chunks
    so that no temporary larger than a few MiB exists (the peak-memory workload relies on it)."""
    out = np.empty(tuple(shape), dtype=dtype)
    flat = out.reshape(-1)
    step = 1 << 16
    for i in range(0, flat.size, step):
        n = min(step, flat.size - i)
        flat[i : i + n] = np.arange(i, i + n, dtype=np.int64) % 251
    return out


def _llc_bytes() -> int:
    """The largest CPU cache of this machine in bytes (sysfs), 32 MiB if unknown."""
    import glob

    sizes = []
    for path in glob.glob("/sys/devices/system/cpu/cpu0/cache/index*/size"):
        try:
            text = open(path).read().strip()
        except OSError:
            continue
        scale = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(text[-1:], 1)
        digits = text.rstrip("KMG")
        if digits.isdigit():
            sizes.append(int(digits) * scale)
    return max(sizes, default=32 << 20)


def affinity() -> List[int] | None:
    """The CPUs this process may run on, or None where the system does not say (not Linux)."""
    if not hasattr(os, "sched_getaffinity"):
        return None
    return sorted(os.sched_getaffinity(0))


def _cpu_count() -> int:
    cpus = affinity()
    return len(cpus) if cpus is not None else os.cpu_count() or 1


def select(device: str | None) -> Tuple[object, List[str]]:
    """The env for `device` ("kDLCPU", "kDLCUDA:0"), or the best one present when None. Returns
    it with notes on why a better device was not used."""
    notes: List[str] = []
    if device is not None:
        import dlpart

        try:
            d = dlpart.Device(device)
        except ValueError as e:
            raise SystemExit(f"dlpart bench: --device: {e}") from None
        if d.kind == "kDLCPU":
            return CpuEnv(), notes
        if d.kind == "kDLCUDA":
            from . import cuda

            env, reason = cuda.open_env(d.id)
            if env is None:
                raise SystemExit(f"dlpart bench: device {d} is not usable: {reason}")
            return env, notes
        raise SystemExit(f"dlpart bench: no benchmark env for {d} (kDLCPU or kDLCUDA:N)")
    try:
        from . import cuda

        env, reason = cuda.open_env(0)
    except Exception as e:  # a broken CUDA install must not stop a CPU run
        env, reason = None, f"{type(e).__name__}: {e}"
    if env is not None:
        return env, notes
    notes.append(f"kDLCUDA:0 not used ({reason}); running on kDLCPU")
    return CpuEnv(), notes
