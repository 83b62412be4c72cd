"""SPMD arrays across MPI ranks (`dlpart.mpi`): each test runs a script under `mpirun -n 4`
(oversubscribed: this machine may have fewer cores) with a timeout, so none can hang. The
scripts check their own results on every rank against numpy and print one "ok" line per rank;
any failure aborts every rank. mpi4py.MPI is never imported in this process."""

import pathlib

import pytest

SCRIPTS = pathlib.Path(__file__).parent / "mpi_scripts"
RANKS = 4


def ok_ranks(out: str, suffix: str = "") -> set:
    return {line.split()[1] for line in out.splitlines() if line.startswith("ok ") and line.endswith(suffix)}


@pytest.mark.mpi
def test_random_layouts_across_ranks_equal_numpy_and_mismatches_fail_every_rank(mpirun):
    """300 random global layouts (uneven, several partitions per rank, a rank with none,
    split points, tilings, block-cyclic and process-grid targets) repartitioned across 4 ranks:
    local partitions, the whole assembled on rank 0 and on every rank, repartition_into, byte
    counts (local boxes never sent) and dicts are checked; then every kind of disagreement makes
    every rank raise the same error within seconds."""
    cases = 300
    out = mpirun(SCRIPTS / "spmd_props.py", RANKS, 20240611, cases, timeout=240)
    assert ok_ranks(out, f" {cases}") == {str(r) for r in range(RANKS)}, out
