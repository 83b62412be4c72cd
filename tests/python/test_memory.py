"""A host allocation that fails is a `MemoryError`, never an abort of the process.

Each op runs in a child process: before the fix these ended in `memory allocation of ...
bytes failed` and SIGABRT, which must fail a test rather than end the run.

The sizes are chosen to fail on any machine, whatever its overcommit policy: 2^62 bytes is a
valid layout that no address space holds (x86-64 and AArch64 map at most 2^57 bytes), so the
allocator refuses it at once instead of handing out memory that faults in later. Real
allocation failure at ordinary sizes is tested under an address-space limit (RLIMIT_AS).
"""

import json
import re
import subprocess
import sys

import pytest

# Each case builds its inputs from stride-0 numpy views (2^62 bytes over one element) and
# prints one JSON line: the exception type and message, or "ok".
_CHILD = r"""
import json, pickle, sys
import numpy as np
import dlpart

def rep(shape, dtype=np.float32):
    return np.lib.stride_tricks.as_strided(np.zeros(1, dtype), shape=shape,
                                           strides=(0,) * len(shape))

HUGE = (1 << 30, 1 << 30)  # float32: 2^62 bytes
def as_dict(x):
    return {"shape": x.shape, "partition_tiling": (1, 1),
            "partitions": {(0, 0): {"start": (0, 0), "shape": x.shape, "data": x,
                                    "location": [("h", 1, "kDLCPU")]}}}

cases = {
    "Tensor.copy": lambda: dlpart.from_dlpack(rep(HUGE)).copy(),
    "Tensor.to": lambda: dlpart.from_dlpack(rep(HUGE)).to("kDLCPU"),
    "assemble": lambda: dlpart.partition(rep(HUGE), (2, 1)).assemble(),
    "repartition, new layout": lambda: dlpart.partition(rep(HUGE), (2, 1)).repartition((1, 2)),
    "repartition, same layout": lambda: dlpart.partition(rep(HUGE), (2, 1)).repartition((2, 1)),
    "from_partitioned().assemble": lambda: dlpart.from_partitioned(as_dict(rep(HUGE))).assemble(),
    "gather output": lambda: dlpart.gather(rep((2, 1 << 59)), np.array([0, 1])),
    "gather indices": lambda: dlpart.gather(np.zeros(4), rep((1 << 59,), np.int64)),
    "scatter indices": lambda: dlpart.scatter(rep((1 << 59,)), rep((1 << 59,), np.int64),
                                              np.zeros(4, np.float32)),
    # Rows of 2^58 bytes: four of them gathered are 2^60.
    "partitioned gather": lambda: dlpart.partition(rep((4, 1 << 58), np.uint8), (2, 1)).gather(
        np.arange(4)),
    "pickle": lambda: pickle.dumps(dlpart.from_dlpack(rep(HUGE))),
}
for name in sys.argv[1:]:
    print(json.dumps([name, "started"]), flush=True)
    try:
        cases[name]()
        result = "ok"
    except BaseException as e:
        result = f"{type(e).__name__}: {e}"
    print(json.dumps([name, result]), flush=True)
"""

CASES = ["Tensor.copy", "Tensor.to", "assemble", "repartition, new layout",
         "repartition, same layout", "from_partitioned().assemble", "gather output",
         "gather indices", "scatter indices", "partitioned gather", "pickle"]


@pytest.fixture(scope="module")
def outcomes():
    """Every case in one child (an interpreter start each would cost seconds): the result per
    case, and the child's exit status and stderr."""
    r = subprocess.run([sys.executable, "-c", _CHILD, *CASES], capture_output=True, text=True,
                       timeout=120)
    results = dict(json.loads(line) for line in r.stdout.splitlines())
    return results, r.returncode, r.stderr[-2000:]


@pytest.mark.parametrize("case", CASES)
def test_an_output_too_large_for_the_host_is_a_memory_error(outcomes, case):
    results, rc, stderr = outcomes
    got = results.get(case, "never run: an earlier case killed the child")
    assert got != "started", f"the process died in {case} (exit {rc}): {stderr}"
    assert got.startswith("MemoryError: "), (got, rc, stderr)
    if case != "pickle":  # pickle's bytes object may be Python's own allocation
        asked = re.match(r"MemoryError: cannot allocate (\d+) bytes of host memory for ", got)
        assert asked and int(asked[1]) >= 1 << 58, got


_LIMITED = r"""
import resource, numpy as np, dlpart

def vm_size():
    with open("/proc/self/status") as f:
        return next(int(l.split()[1]) * 1024 for l in f if l.startswith("VmSize:"))

a = np.arange(1 << 22, dtype=np.float64)  # 32 MiB
b = np.zeros_like(a)
src, dst = dlpart.partition(a, 4), dlpart.partition(b, 8)
idx = np.arange(1 << 10)[::-1].copy()
out = np.zeros(1 << 10)
soft, hard = resource.getrlimit(resource.RLIMIT_AS)
# Room for nothing new: dlpart's 32 MiB output cannot be had, nor rayon's thread stacks.
resource.setrlimit(resource.RLIMIT_AS, (vm_size() + (1 << 20), hard))
try:
    try:
        src.repartition((8,)).assemble()
        new_output = "ok"
    except MemoryError as e:
        new_output = str(e)
    # Into existing targets nothing is allocated: the copies run on this thread when the
    # thread pool cannot start.
    src.repartition_into(dst)
    dlpart.gather(a, idx, out=out)
    # 2^28 partitions of a 256 MiB stride-0 view: their views, devices and plan are many small
    # allocations that aborted the process when memory ran out half-way.
    rep = np.lib.stride_tricks.as_strided(np.zeros(1, np.uint8), shape=(1 << 14, 1 << 14),
                                          strides=(0, 0))
    fine = (1 << 14, 1 << 14)
    for make in (lambda: dlpart.partition(rep, fine),
                 lambda: dlpart.partition(rep, (2, 2)).repartition(fine)):
        try:
            make()
            many = "ok"
        except MemoryError as e:
            many = str(e)
        assert "structures of 268435456 partitions" in many, many
finally:
    resource.setrlimit(resource.RLIMIT_AS, (soft, hard))
assert np.array_equal(a, b), "repartition_into gave wrong data"
assert np.array_equal(out, a[idx]), "gather gave wrong data"
print(new_output)
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="uses /proc and RLIMIT_AS")
def test_under_an_address_space_limit_allocations_fail_cleanly_and_copies_still_run():
    """Real allocation failure at an ordinary size (32 MiB): a MemoryError naming the bytes;
    when rayon cannot start its threads (it panicked, a PanicException in Python, before the
    fix), the work runs on the calling thread and is right; a grid of more partitions than
    memory holds is a MemoryError before any is made."""
    r = subprocess.run([sys.executable, "-c", _LIMITED], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "cannot allocate" in r.stdout and "bytes of host memory" in r.stdout, r.stdout
