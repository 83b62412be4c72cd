"""SPMD arrays across MPI ranks (`dlpart.mpi`): each test runs a script under `mpirun -n 4`
(oversubscribed: this machine may have fewer cores) with a timeout, so none can hang. The
scripts check their own results on every rank against numpy and print one "ok" line per rank;
any failure aborts every rank. mpi4py.MPI is never imported in this process."""

import pathlib
import re

import pytest

from conftest import MPI_RANKS as RANKS, ok_ranks


@pytest.mark.mpi
def test_ranks_setting_their_own_round_size_or_device_agree(mpirun_cases):
    """DLPART_MPI_ROUND_BYTES set differently on the ranks (unset on one), and assemble on
    every rank with some ranks naming a device and others none: exchanges large enough for
    rounds go through on every rank, equal to numpy, rather than failing as different
    repartitions."""
    mpirun_cases("rank_settings.py", cases=3, timeout=240)


@pytest.mark.mpi
def test_random_layouts_across_ranks_equal_numpy_and_mismatches_fail_every_rank(mpirun_cases):
    """300 random global layouts (uneven, several partitions per rank, a rank with none,
    split points, tilings, block-cyclic and process-grid targets) repartitioned across 4 ranks:
    local partitions, the whole assembled on rank 0 and on every rank, repartition_into, byte
    counts (local boxes never sent), dicts, gather and scatter are checked; then every kind of
    disagreement makes every rank raise the same error within seconds."""
    mpirun_cases("spmd_props.py", cases=300, timeout=240)


@pytest.mark.mpi
def test_messages_go_only_to_plan_peers_in_pieces_and_never_meet_the_programs(mpirun_cases):
    """dlpart's exchanges post point-to-point messages only between ranks with bytes for each
    other (sparse shifts and dense block-cyclic targets), each peer's bytes cut into messages
    of at most rank 0's DLPART_MPI_MESSAGE_BYTES (203 here: cuts inside elements; the script
    gives the other ranks other values) the same way on both sides; a wildcard receive the
    program leaves pending gets the program's message."""
    mpirun_cases("p2p_messages.py", cases=60, timeout=120,
                 env={"DLPART_MPI_MESSAGE_BYTES": "203"})


@pytest.mark.mpi
def test_random_layouts_with_messages_of_a_few_bytes(mpirun_cases):
    """The property cases again with every message cut at 7 bytes, as a segment beyond MPI's
    C-int counts is cut at 1 GiB: repartitions, assembles, gathers and scatters stay equal to
    numpy."""
    mpirun_cases("spmd_props.py", cases=40, timeout=120, env={"DLPART_MPI_MESSAGE_BYTES": "7"})


@pytest.mark.mpi
def test_distarray_arrays_across_ranks_equal_numpy(mpirun_cases):
    """`dlpart.mpi.from_distarray` of random Distributed Array Protocol arrays over process
    grids of the four ranks (irregular blocks with communication and boundary padding, cyclic
    blocks, unstructured index lists, empty shares) holds views of each rank's buffer and
    assembles to numpy; `SpmdArray.__distarray__` of one block per rank describes exactly that
    block and reads back; a rank whose grid coordinates are not its rank fails every rank."""
    mpirun_cases("distarray.py", cases=60, timeout=120)


@pytest.mark.mpi
def test_bench_mpi_quick_runs_under_mpirun(mpirun, tmp_path):
    """`mpirun -n 4 python -m dlpart bench --mpi --quick`: rows -> columns across the ranks
    against MPI's own Alltoall, the result checked, the report written."""
    import json

    # The fixture runs `python SCRIPT ARGS...`: here `python -m dlpart bench ...`.
    out = mpirun("-m", RANKS, "dlpart", "bench", "--mpi", "--quick", "--out", tmp_path, timeout=180)
    assert "x MPI Alltoall" in out, out
    doc = json.loads((tmp_path / "bench-mpi.json").read_text())
    res = doc["results"][0]
    assert res["correct"] and res["name"].startswith("mpi/rows_to_cols/float32/")
    # The run says where, when and how it was made, as the main benchmark's report does.
    machine = doc["machine"]
    assert machine["command"].endswith("dlpart bench --mpi --quick --out " + str(tmp_path))
    assert machine["date"] and "MPI" in machine["mpi_library"] and machine["cpu_count"] >= 1
    # Rank 0 keeps its own quarter of its rows and sends the other three quarters.
    assert res["bytes_sent_by_rank0"] == 3 * res["bytes_local_rank0"] > 0
    # Where the ranks ran: all on this node, which has the CPUs this process may use (mpirun
    # may bind each rank to fewer, but their union is no more than these).
    import os

    cpus = len(os.sched_getaffinity(0))
    where = doc["placement"]
    assert where["nodes"] == 1 and where["ranks_per_node"] == RANKS
    assert 1 <= where["cpus_per_node"] <= cpus
    assert where["oversubscribed"] == (RANKS > where["cpus_per_node"])
    assert ("oversubscribed" in out) == where["oversubscribed"], out
    # Every rank's CPU time per call, for every case; dlpart's ranks spend some.
    cpu = res["cpu_s_per_call"]
    assert set(cpu) == set(res["median_s"])
    for case in cpu.values():
        assert len(case["user"]) == len(case["system"]) == RANKS
        assert min(case["user"] + case["system"]) >= 0
    assert sum(cpu["dlpart_into"]["user"] + cpu["dlpart_into"]["system"]) > 0
    assert "CPU per rank and call" in out, out


@pytest.mark.mpi
def test_guide_spmd_block_is_the_mpi_example_and_runs(mpirun):
    """The guide's MPI block cannot run in this process (no MPI here): it is
    examples/mpi/spmd.py, which runs under mpirun."""
    root = pathlib.Path(__file__).parents[2]
    block = re.search(r"```py\n(.*?)```", (root / "docs" / "guide.md").read_text(), re.S).group(1)
    example = root / "examples" / "mpi" / "spmd.py"
    assert block in example.read_text()
    out = mpirun(example, RANKS, timeout=120)
    assert ok_ranks(out) == {str(r) for r in range(RANKS)}, out
