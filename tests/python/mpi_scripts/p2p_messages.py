"""Run under mpirun (4 ranks): the messages of dlpart's exchanges.

- Only the ranks that have bytes for each other exchange messages: on a communicator that
  counts its ``Isend`` and ``Irecv`` calls, each rank sends to exactly the ranks its byte
  counts (``traffic``) name, in as many messages as ``DLPART_MPI_MESSAGE_BYTES`` cuts each
  peer's bytes into (the script is run with a few hundred bytes per message, so that every
  segment travels as several messages, cut at odd offsets), and the data equals numpy's.
  The caller's value is rank 0's; the script gives every other rank another before dlpart
  reads it, and every rank cuts by rank 0's, as the receives must match the sends.
- The ranks agree on that size once, by one ``allgather`` of every rank's size (and of what
  failed on it, nothing here) when dlpart first uses the communicator, rank 0's taken (and
  never again: later calls reuse dlpart's communicator over it), and every other ``allgather``
  carries this rank's bytes alone (a ``bytes`` object, no message size); nothing is
  broadcast.
- dlpart's messages never meet the program's own: a wildcard ``Irecv`` (any source, any tag)
  left pending on COMM_WORLD across dlpart's exchanges receives the program's message, not
  dlpart's, and dlpart's results are right.

usage: p2p_messages.py SEED CASES (DLPART_MPI_MESSAGE_BYTES set by the caller). Prints
"ok <rank> <cases>" when every check passed; any failure aborts every rank.
"""

import os

import numpy as np
from mpi4py import MPI

from _cases import run

import dlpart.mpi

world = MPI.COMM_WORLD
rank, size = world.Get_rank(), world.Get_size()
MESSAGE = int(os.environ["DLPART_MPI_MESSAGE_BYTES"])
# Read by dlpart once, when its first communicator is made: another cut on each other rank.
OWN = MESSAGE * (rank + 1) + rank
os.environ["DLPART_MPI_MESSAGE_BYTES"] = str(OWN)


class Counting(MPI.Intracomm):
    """COMM_WORLD's duplicate counting the messages posted on it and its collective calls
    (dlpart's own duplicate of it is a Counting too: mpi4py's Dup keeps the class)."""

    sends: list = []
    recvs: list = []
    gathers: list = []
    made: list = []
    bcasts: list = []

    def allgather(self, sendobj):
        got = super().allgather(sendobj)
        # The bytes of dlpart's calls, and apart, what anything else gathered (and rank 0's).
        if type(sendobj) is bytes:
            Counting.gathers.append(sendobj)
        else:
            Counting.made.append((sendobj, got[0]))
        return got

    def bcast(self, obj, root=0):
        got = super().bcast(obj, root)
        Counting.bcasts.append((obj, root, got))
        return got

    def Isend(self, buf, dest, tag=0):
        Counting.sends.append((dest, len(memoryview(buf[0]).cast("B"))))
        return super().Isend(buf, dest, tag)

    def Irecv(self, buf, source=MPI.ANY_SOURCE, tag=MPI.ANY_TAG):
        Counting.recvs.append((source, len(memoryview(buf[0]).cast("B"))))
        return super().Irecv(buf, source, tag)


counting = Counting(world.Dup())


def expected(counts):
    """The (peer, bytes) messages that byte counts per peer make."""
    out = []
    for p, n in enumerate(counts):
        out += [(p, min(MESSAGE, n - at)) for at in range(0, n, MESSAGE)]
    return sorted(out)


def check_case(case, seed):
    rng = np.random.default_rng([seed, case])
    n, m = int(rng.integers(size, 40)), int(rng.integers(1, 9))
    whole = rng.standard_normal((n, m)).astype(rng.choice([np.float32, np.float64, np.int16]))
    # Row blocks; the target shifts every cut by a random amount, so each rank talks to one
    # or two neighbours (a sparse plan), or deals blocks round-robin (a dense one).
    points = np.linspace(0, n, size + 1).astype(int)
    Counting.gathers.clear()
    a = dlpart.mpi.from_local(whole[points[rank]:points[rank + 1]], counting, axis=0)
    # One allgather of metadata, this rank's bytes alone; the message size was gathered once,
    # rank 0's taken, by the first case's from_local (this rank offering its own, no failure).
    assert len(Counting.gathers) == 1, Counting.gathers
    assert Counting.made == [((OWN, None), (MESSAGE, None))], Counting.made
    assert Counting.bcasts == [], Counting.bcasts
    Counting.sends.clear()
    Counting.recvs.clear()
    if case % 2:
        shift = int(rng.integers(0, max(1, n // size)))
        target = [0] + [min(n, int(p) + shift) for p in points[1:-1]] + [n]
        out = a.repartition(splits=[target, [0, m]], devices=["kDLCPU"] * size,
                            process_grid=[size, 1])
    else:
        out = a.repartition(block_cyclic=(int(rng.integers(1, 4)), m))
    sent, received = list(out.traffic.sent), list(out.traffic.received)
    sends, recvs = sorted(Counting.sends), sorted(Counting.recvs)
    assert sends == expected(sent), (sends, sent)
    assert recvs == expected(received), (recvs, received)
    assert sent[rank] == received[rank] == 0
    got = out.assemble(root=None)
    assert np.array_equal(np.asarray(got), whole)
    assert len(Counting.made) == 1 and Counting.bcasts == [], (Counting.made, Counting.bcasts)


def program_messages_stay_the_programs():
    """A wildcard receive pending on COMM_WORLD across dlpart's exchanges gets the program's
    own message; dlpart's results are right."""
    box = np.zeros(3, np.int64)
    pending = world.Irecv([box, MPI.INT64_T], source=MPI.ANY_SOURCE, tag=MPI.ANY_TAG)
    whole = np.arange(10 * size * 3, dtype=np.int64).reshape(-1, 3)
    rows = len(whole) // size
    a = dlpart.mpi.from_local(whole[rank * rows:(rank + 1) * rows], world, axis=0)
    cols = a.repartition(block_cyclic=(2, 3))
    assert np.array_equal(np.asarray(cols.assemble(root=None)), whole)
    world.Send([np.array([rank, 7, 11], np.int64), MPI.INT64_T], dest=(rank + 1) % size, tag=5)
    status = MPI.Status()
    pending.Wait(status)
    assert (status.Get_source(), status.Get_tag()) == ((rank - 1) % size, 5), status
    assert box.tolist() == [(rank - 1) % size, 7, 11], box


run(check_case, program_messages_stay_the_programs)
