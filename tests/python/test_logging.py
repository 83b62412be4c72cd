"""Logging through Python's `logging` (the Rust core's records bridged), and the thread count."""

import logging
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import dlpart


def run_python(code, **env):
    """Runs `code` in a fresh interpreter (backends, the thread pool and the once-per-process
    records start anew) and returns its completed process."""
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True,
                          text=True, timeout=120, env={**os.environ, **env})


@pytest.fixture
def dlpart_debug(caplog):
    caplog.set_level(logging.DEBUG, logger="dlpart")
    dlpart.reload_log_levels()  # the Rust side caches each logger's level
    yield caplog
    caplog.set_level(logging.WARNING, logger="dlpart")
    dlpart.reload_log_levels()


def test_host_buffer_cache_use_is_logged_at_debug(dlpart_debug):
    x = np.arange(2048 * 1024, dtype=np.float32).reshape(2048, 1024)
    pa = dlpart.partition(x, (2, 1))
    # 4 MiB targets: above the 2 MiB from which freed host buffers are kept for reuse.
    cols = pa.repartition((1, 2))
    del cols
    again = pa.repartition((1, 2))
    np.testing.assert_array_equal(np.from_dlpack(again.assemble()), x)
    cache = [r for r in dlpart_debug.records if r.name == "dlpart.tensor.cache"]
    assert cache and all(r.levelno == logging.DEBUG for r in cache)
    text = [r.getMessage() for r in cache]
    assert any("keeping 4.0 MiB for reuse" in m for m in text), text
    assert any("reused 4.0 MiB" in m for m in text), text


def test_nothing_reaches_python_below_the_level(caplog):
    caplog.set_level(logging.INFO, logger="dlpart")
    dlpart.reload_log_levels()
    x = np.zeros((1024, 1024), dtype=np.float32)
    dlpart.partition(x, (2, 1)).repartition(splits=[[0, 1024], [0, 768, 1024]])
    assert not [r for r in caplog.records if r.levelno < logging.INFO]


def test_backend_choice_is_logged_once_per_device_at_info():
    r = run_python("""
        import logging, numpy as np, dlpart
        logging.basicConfig(level=logging.DEBUG, format="%(levelname)s %(name)s: %(message)s")
        x = np.arange(64.0).reshape(8, 8)
        for _ in range(3):
            dlpart.partition(x, (4, 1)).repartition((1, 4))
        dlpart.backend_status("cuda:0")
    """)
    assert r.returncode == 0, r.stderr
    chosen = [ln for ln in r.stderr.splitlines() if ln.startswith("INFO dlpart.backend:")]
    assert chosen.count("INFO dlpart.backend: kDLCPU: dlpart's CPU kernels") == 1, r.stderr
    cuda = [ln for ln in chosen if "kDLCUDA:0" in ln]
    reason = dlpart.backend_status("cuda:0")
    assert len(cuda) == 1 and (reason is None or reason in cuda[0]), r.stderr


def test_array_api_fallback_is_logged_at_info(caplog):
    if not os.environ.get("OCL_ICD_FILENAMES"):
        pytest.skip("dpctl needs OCL_ICD_FILENAMES (scripts/setup.sh)")
    pytest.importorskip("dpctl")
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        import dpctl.tensor as dpt
    caplog.set_level(logging.INFO, logger="dlpart")
    pa = dlpart.partition(dpt.asarray(np.arange(48, dtype=np.float32).reshape(6, 8)), (2, 2))
    pa.repartition((1, 4))
    fallback = [r for r in caplog.records if r.name == "dlpart" and "through" in r.getMessage()]
    assert len(fallback) == 1 and fallback[0].levelno == logging.INFO, caplog.records
    msg = fallback[0].getMessage()
    assert "4 partitions on kDLOneAPI:0" in msg and "dpctl.tensor" in msg, msg


def test_thread_count_is_settable_before_the_first_copy_only():
    r = run_python("""
        import numpy as np, dlpart
        dlpart.set_num_threads(1)
        assert dlpart.get_num_threads() == 1
        x = np.arange(4096.0 * 256).reshape(4096, 256)
        dlpart.partition(x, (4, 1)).repartition((1, 4))
        dlpart.set_num_threads(1)  # the size it has: accepted
        try:
            dlpart.set_num_threads(3)
        except RuntimeError as e:
            print(e)
        try:
            dlpart.set_num_threads(0)
        except ValueError as e:
            print(e)
    """)
    assert r.returncode == 0, r.stderr
    late, zero = r.stdout.splitlines()
    assert "set_num_threads(3)" in late and "already runs 1 threads" in late, late
    assert "RAYON_NUM_THREADS=3" in late, late
    assert "got 0" in zero, zero


def test_rayon_num_threads_sets_the_default():
    r = run_python("import dlpart; print(dlpart.get_num_threads())", RAYON_NUM_THREADS="3")
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "3"
