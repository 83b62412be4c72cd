"""Shared fixtures and markers for the Python tests.

Markers (each skips with its reason, shown by `pytest -rs`, when the machine lacks the thing):
  cuda    needs a CUDA device (libcuda loads and reports at least one device)
  oneapi  needs a SYCL device through dpctl (the Intel OpenCL CPU runtime here)
  mpi     needs `mpirun` and mpi4py
"""

from __future__ import annotations

import ctypes
import functools
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

# The same environment scripts/setup.sh exports, for a plain `pytest` in the venv. Must happen before
# jax or dpctl are imported, which is why it sits at module level here.
os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=4")
os.environ.setdefault("HWLOC_PLUGINS_BLACKLIST", "hwloc_opencl.so")
os.environ.setdefault("OMPI_ALLOW_RUN_AS_ROOT", "1")
os.environ.setdefault("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
os.environ.setdefault("RAY_AUTH_MODE", "disabled")
_intelocl = sorted((Path(sys.prefix) / "lib").glob("libintelocl.so*"))
_intelocl = [p for p in _intelocl if not p.name.endswith(".py")]
if _intelocl:
    os.environ.setdefault("OCL_ICD_FILENAMES", str(_intelocl[0]))
# Test modules import shared helpers (dlpack_ctypes, test_props_partitioned) by name.
sys.path.insert(0, os.path.dirname(__file__))


@functools.cache
def cuda_device_count() -> int:
    """Devices the CUDA driver reports; 0 without a driver (no torch or cupy needed)."""
    try:
        cuda = ctypes.CDLL("libcuda.so.1")
    except OSError:
        return 0
    count = ctypes.c_int(0)
    if cuda.cuInit(0) != 0 or cuda.cuDeviceGetCount(ctypes.byref(count)) != 0:
        return 0
    return count.value


@functools.cache
def sycl_devices() -> tuple:
    try:
        import dpctl
    except ImportError:
        return ()
    return tuple(dpctl.get_devices())


def _mpi_missing() -> str | None:
    if shutil.which("mpirun") is None:
        return "mpirun not found (apt-get install openmpi-bin)"
    try:
        import mpi4py  # noqa: F401
    except ImportError:
        return "mpi4py not installed"
    return None


def pytest_configure(config):
    config.addinivalue_line("markers", "cuda: needs a CUDA device")
    config.addinivalue_line("markers", "oneapi: needs a SYCL device through dpctl")
    config.addinivalue_line("markers", "mpi: needs mpirun and mpi4py")
    # dpctl 0.21.1 warns on every `import dpctl.tensor`; the tests use it on purpose.
    config.addinivalue_line("filterwarnings", "ignore:dpctl.tensor is deprecated:DeprecationWarning")


def pytest_collection_modifyitems(config, items):
    reasons = {
        "cuda": None if cuda_device_count() else "no CUDA device (libcuda.so.1 missing or reports 0 devices)",
        "oneapi": None if sycl_devices() else "dpctl sees no SYCL device (is OCL_ICD_FILENAMES set?)",
        "mpi": _mpi_missing(),
    }
    for item in items:
        for marker, reason in reasons.items():
            if reason and marker in item.keywords:
                item.add_marker(pytest.mark.skip(reason=reason))


@pytest.fixture
def rng():
    import numpy as np

    return np.random.default_rng(20240611)


@pytest.fixture(scope="session")
def jax_cpu_devices():
    """The four host devices XLA_FLAGS asks for; skips if jax started with fewer."""
    jax = pytest.importorskip("jax")
    devices = jax.devices("cpu")
    if len(devices) < 4:
        pytest.skip(f"jax has {len(devices)} CPU devices; XLA_FLAGS was set after jax started")
    return devices[:4]


@pytest.fixture(scope="session")
def dask_client():
    """A two-process dask cluster for the whole session (starting one takes seconds)."""
    distributed = pytest.importorskip("distributed")
    with distributed.LocalCluster(
        n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None
    ) as cluster, distributed.Client(cluster) as client:
        yield client


@pytest.fixture(scope="session")
def quick_bench(tmp_path_factory):
    """One `python -m dlpart bench --quick` (every workload, on the best device present) for the
    tests of the command and of its report: (the finished process, its output folder)."""
    out = tmp_path_factory.mktemp("bench") / "out"
    proc = subprocess.run([sys.executable, "-m", "dlpart", "bench", "--quick", "--out", str(out)],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return proc, out


RAY_START_LIMIT_S = 60


class _RayLate(Exception):
    pass


def _ray_alarm(signum, frame):
    raise _RayLate()


@pytest.fixture(scope="session")
def ray_session():
    """One local Ray instance (two CPUs, for xgboost_ray's two actors) for every Ray test: it
    takes 5-10 s to start here. Skips, with the reason, where ray is missing or does not start
    within RAY_START_LIMIT_S; shut down at the end."""
    ray = pytest.importorskip("ray", reason="ray is not installed")
    # ray.init must run in the main thread, so a SIGALRM bounds how long it may take
    previous = signal.signal(signal.SIGALRM, _ray_alarm)
    signal.alarm(RAY_START_LIMIT_S)
    t0 = time.monotonic()
    try:
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    except _RayLate:
        ray.shutdown()
        pytest.skip(f"ray did not start within {RAY_START_LIMIT_S} s here")
    except Exception as e:  # noqa: BLE001 - any failure to start means: no ray on this machine
        ray.shutdown()
        pytest.skip(f"ray cannot start here: {type(e).__name__}: {e}")
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)
    print(f"ray started in {time.monotonic() - t0:.1f} s")
    try:
        yield ray
    finally:
        ray.shutdown()


MPI_SCRIPTS = Path(__file__).parent / "mpi_scripts"
MPI_RANKS = 4  # more than this machine may have cores: mpirun runs --oversubscribe


def ok_ranks(out: str, cases: int | None = None) -> set[str]:
    """The ranks that printed their "ok <rank>" line on mpirun's stdout (followed by `cases` when
    given, as the scripts of mpi_scripts/_cases.py print it)."""
    tail = rf" {cases}\b" if cases is not None else ""
    # The ranks' lines may interleave on mpirun's stdout.
    return set(re.findall(rf"ok (\d+){tail}", out))


@pytest.fixture
def mpirun():
    """Run a Python script under `mpirun -n N --oversubscribe`; fails the test on a non-zero exit."""
    reason = _mpi_missing()
    if reason:
        pytest.skip(reason)

    def run(script, n=2, *args, timeout=120, env=None):
        cmd = ["mpirun", "-n", str(n), "--oversubscribe", sys.executable, str(script), *map(str, args)]
        environ = None if env is None else {**os.environ, **env}
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=REPO,
                              env=environ)
        assert proc.returncode == 0, f"{' '.join(cmd)} exited {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
        return proc.stdout

    return run


@pytest.fixture
def mpirun_cases(mpirun):
    """Run mpi_scripts/NAME with `SEED CASES` on MPI_RANKS ranks (the frame of
    mpi_scripts/_cases.py); fails the test unless every rank passed every case."""

    def run(name, cases, timeout, env=None):
        out = mpirun(MPI_SCRIPTS / name, MPI_RANKS, 20240611, cases, timeout=timeout, env=env)
        assert ok_ranks(out, cases) == {str(r) for r in range(MPI_RANKS)}, out

    return run


def aligned_empty(shape, dtype, align=64):
    """A numpy array whose data starts on an `align`-byte boundary (JAX imports only those
    zero-copy)."""
    import numpy as np

    dtype = np.dtype(dtype)
    n = int(np.prod(shape)) * dtype.itemsize
    buf = np.empty(n + align, dtype=np.uint8)
    off = (-buf.ctypes.data) % align
    return buf[off : off + n].view(dtype).reshape(shape)
