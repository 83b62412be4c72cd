"""heat and dlpart's SPMD arrays across MPI ranks, both ways, under `mpirun -n 4` with a
timeout. Each script checks many cases on every rank against numpy and prints one "ok" line per
rank; any failure aborts every rank. Neither mpi4py.MPI nor heat is imported in this process
(importing heat initialises MPI, after which mpirun refuses to start jobs from here)."""

import importlib.util
import pathlib
import re

import pytest


@pytest.mark.mpi
def test_heat_dict_form_built_by_hand_goes_through_dlpart_mpi_and_back(mpirun_cases):
    """No heat or torch needed: heat's SPMD dict (int ranks, `locals`, numpy data here and None
    elsewhere, uneven and empty slabs along a random split axis of 1-3 d arrays) read by
    `dlpart.mpi.from_partitioned`, repartitioned across the ranks and assembled equals numpy;
    `to_heat` gives back heat's form over the same memory, read by heat's own rules; layouts heat
    cannot read raise `dlpart.ProtocolError` on every rank; `split=` makes heat's chunks."""
    mpirun_cases("heat_form.py", cases=100, timeout=120)


@pytest.mark.mpi
def test_heat_and_dlpart_spmd_arrays_exchange_across_ranks(mpirun_cases):
    """The real heat: DNDarrays split along axis 0 or 1 (balanced and not) read by
    `dlpart.mpi.from_partitioned`, repartitioned and assembled equal numpy and `x.numpy()`;
    dlpart SPMD arrays of random uneven blocks read by `ht.from_partitioned(to_heat(a))` hold
    the same memory and equal numpy, and after `split=` heat's `resplit` does too; dlpart's
    one-process `from_partitioned` of SPMD dicts, heat's and its own, goes into heat and back
    on all four ranks and on one (COMM_SELF). The same launch runs the guide's heat example
    (examples/mpi/with_heat.py): starting heat on every rank takes seconds, so one launch
    serves all of these."""
    if importlib.util.find_spec("heat") is None:  # looked up, not imported (see above)
        pytest.skip("heat is not installed (scripts/test.sh installs it unless DLPART_WITH_HEAT=0)")
    mpirun_cases("heat_spmd.py", cases=12, timeout=240)


def test_guide_heat_block_is_the_heat_example():
    """The guide's heat-over-MPI block cannot run in this process (no MPI, no heat here): it is
    examples/mpi/with_heat.py, which heat_spmd.py runs under mpirun after its own cases."""
    root = pathlib.Path(__file__).parents[2]
    guide = (root / "docs" / "guide.md").read_text()
    section = guide[guide.index("### heat over MPI"):]
    block = re.search(r"```py\n(.*?)```", section, re.S).group(1)
    assert block in (root / "examples" / "mpi" / "with_heat.py").read_text()

