"""`mpirun -n N python -m dlpart bench --mpi`: repartitioning across MPI ranks.

Row blocks -> column blocks of an N x N float32 array spread over the ranks (one row block per
rank), with dlpart (`dlpart.mpi`: pack with dlpart's kernels, exchange, unpack), against
MPI's own ``Alltoall`` of the same bytes (each rank sends an equal share of its rows to every
rank, from and into contiguous numpy buffers: no packing), timed round-robin in the same run so
that a shared machine's load slows both alike. Each timing is the slowest rank's, between two
barriers; the median of the timed runs is reported. Bandwidth = the array's bytes / time; the
judged ratio is dlpart's bandwidth over ``Alltoall``'s (the project's target is >= 0.7x), with
dlpart writing into preallocated column blocks (``repartition_into``), as ``Alltoall`` writes
into a preallocated buffer. ``repartition`` into new column blocks is timed too.

A second reference is the same repartition done by MPI alone: ``Alltoall`` with a strided
column-block datatype (the classic transpose exchange), received into the column block.

Rank 0 prints the table and writes bench-mpi.json and bench-mpi.txt into --out.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import time

import numpy as np

from .env import affinity

TARGET = 0.7


def _cpu() -> tuple:
    """This process's user and system CPU seconds so far (every thread), or zeros where
    `resource` is missing."""
    try:
        import resource
    except ImportError:  # not a Unix
        return (0.0, 0.0)
    r = resource.getrusage(resource.RUSAGE_SELF)
    return (r.ru_utime, r.ru_stime)


def _timed(comm, fn) -> tuple:
    """The slowest rank's time for `fn` (between barriers) and this rank's user and system
    CPU seconds in it."""
    comm.Barrier()
    c0 = _cpu()
    t0 = time.perf_counter()
    fn()
    took = time.perf_counter() - t0
    c1 = _cpu()
    return comm.allreduce(took, op=_max()), c1[0] - c0[0], c1[1] - c0[1]


def _max():
    from mpi4py import MPI

    return MPI.MAX


def placement(comm) -> dict:
    """How the ranks sit on the nodes: the most ranks on one node, the CPUs they may run on
    there (the union of those ranks' CPU affinities), and whether any node has more ranks than
    CPUs. Oversubscribed ranks time-share CPUs, so a timing is the CPU time of every rank's
    copies and busy-waiting over the CPUs, not the time of one rank's exchange (collective)."""
    from mpi4py import MPI

    node = comm.Split_type(MPI.COMM_TYPE_SHARED)
    try:
        mine = affinity()
        affinities = node.allgather(mine)
        if all(a is not None for a in affinities):
            cpus = len(set().union(*affinities))
        else:
            cpus = os.cpu_count() or 1
        here = (node.Get_size(), cpus)
    finally:
        node.Free()
    nodes = comm.allgather(here)
    return {
        "nodes": len(set(comm.allgather(MPI.Get_processor_name()))),
        "ranks_per_node": max(r for r, _ in nodes),
        "cpus_per_node": min(c for _, c in nodes),
        "oversubscribed": any(r > c for r, c in nodes),
    }


def rows_to_cols(comm, n: int, repeat: int, warmup: int) -> dict:
    import dlpart
    import dlpart.mpi

    rank, size = comm.Get_rank(), comm.Get_size()
    n -= n % size  # equal shares for Alltoall
    rows = n // size
    mine = (np.arange(rows * n, dtype=np.float32) + rank * rows * n).reshape(rows, n)
    a = dlpart.mpi.from_local(mine, comm, axis=0)
    send = np.ascontiguousarray(mine).reshape(-1)
    recv = np.empty_like(send)

    devices = ["kDLCPU"] * size  # column block j to rank j

    def run_dlpart():
        run_dlpart.out = a.repartition((1, size), devices=devices, process_grid=(1, size))

    def run_alltoall():
        comm.Alltoall(send, recv)

    into = a.repartition((1, size), devices=devices, process_grid=(1, size))

    def run_into():
        a.repartition_into(into)

    # The same repartition done by MPI alone: a strided column-block datatype (the classic
    # transpose exchange), received straight into this rank's column block.
    from mpi4py import MPI

    cols = n // size
    vec = MPI.FLOAT.Create_vector(rows, cols, n).Create_resized(0, cols * 4)
    vec.Commit()
    block = np.empty((n, cols), np.float32)

    def run_alltoall_datatype():
        comm.Alltoall([mine, 1, vec], [block, rows * cols, MPI.FLOAT])

    times = {"dlpart_into": [], "dlpart": [], "alltoall": [], "alltoall_datatype": []}
    cpu = {k: [0.0, 0.0] for k in times}
    runs = (("dlpart_into", run_into), ("dlpart", run_dlpart), ("alltoall", run_alltoall),
            ("alltoall_datatype", run_alltoall_datatype))
    for i in range(warmup + repeat):
        for name, fn in runs:
            t, user, system = _timed(comm, fn)
            if i >= warmup:
                times[name].append(t)
                cpu[name][0] += user
                cpu[name][1] += system
    # Each rank's mean CPU time per timed call: with more ranks than CPUs the wall time is
    # about the sum of every rank's, over the CPUs.
    per_rank = comm.allgather({k: [u / repeat, s / repeat] for k, (u, s) in cpu.items()})
    # The columns are right: this rank's block equals numpy's.
    out = run_dlpart.out
    whole = np.arange(n * n, dtype=np.float32).reshape(n, n)
    lo, hi = (np.array_split(np.arange(n), size)[rank][[0, -1]] + [0, 1]).tolist()
    got = np.asarray(out.__partitioned__["partitions"][(0, rank)]["data"])
    got_into = np.asarray(into.__partitioned__["partitions"][(0, rank)]["data"])
    ok = bool(np.array_equal(got, whole[:, lo:hi]) and np.array_equal(got_into, whole[:, lo:hi])
              and np.array_equal(block, whole[:, lo:hi]))
    vec.Free()
    ok = all(comm.allgather(ok))
    nbytes = n * n * 4
    med = {k: statistics.median(v) for k, v in times.items()}
    return {
        "name": f"mpi/rows_to_cols/float32/{n}x{n}/{size}ranks",
        "bytes": nbytes,
        "bytes_sent_by_rank0": sum(out.traffic.sent),
        "bytes_local_rank0": out.traffic.local,
        "median_s": med,
        "min_s": {k: min(v) for k, v in times.items()},
        "cpu_s_per_call": {k: {"user": [r[k][0] for r in per_rank],
                               "system": [r[k][1] for r in per_rank]} for k in times},
        "bandwidth": {k: nbytes / t for k, t in med.items()},
        "ratio_vs_alltoall": med["alltoall"] / med["dlpart_into"],
        "ratio_new_targets_vs_alltoall": med["alltoall"] / med["dlpart"],
        "ratio_vs_alltoall_datatype": med["alltoall_datatype"] / med["dlpart_into"],
        "target": TARGET,
        "correct": ok,
    }


def run(args) -> int:
    try:
        from mpi4py import MPI
    except ImportError:
        print("dlpart bench --mpi needs mpi4py", file=sys.stderr)
        return 2
    comm = MPI.COMM_WORLD
    rank, size = comm.Get_rank(), comm.Get_size()
    repeat = args.repeat if args.repeat is not None else (3 if args.quick else 10)
    warmup = args.warmup if args.warmup is not None else (1 if args.quick else 2)
    n = args.mpi_size or (512 if args.quick else 8192)
    if rank == 0:
        print(f"dlpart bench --mpi: {size} ranks, {n}x{n} float32, {warmup} warm-up + {repeat} "
              f"timed runs", file=sys.stderr, flush=True)
    where = placement(comm)
    res = rows_to_cols(comm, n, repeat, warmup)
    if rank != 0:
        return 0 if res["correct"] else 1
    gb = {k: v / 1e9 for k, v in res["bandwidth"].items()}
    lines = [
        f"{res['name']}: {res['bytes'] / 2**20:.0f} MiB, rank 0 sent {res['bytes_sent_by_rank0'] / 2**20:.1f} "
        f"MiB and copied {res['bytes_local_rank0'] / 2**20:.1f} MiB locally",
        f"  dlpart repartition_into {res['median_s']['dlpart_into'] * 1e3:8.2f} ms  "
        f"{gb['dlpart_into']:6.2f} GB/s",
        f"  dlpart repartition      {res['median_s']['dlpart'] * 1e3:8.2f} ms  {gb['dlpart']:6.2f} GB/s"
        f"  (new column blocks: {res['ratio_new_targets_vs_alltoall']:.2f}x Alltoall)",
        f"  Alltoall                {res['median_s']['alltoall'] * 1e3:8.2f} ms  {gb['alltoall']:6.2f} GB/s",
        f"  Alltoall with a column datatype (MPI does the repartition) "
        f"{res['median_s']['alltoall_datatype'] * 1e3:8.2f} ms  {gb['alltoall_datatype']:6.2f} GB/s",
        f"  ratio (repartition_into) {res['ratio_vs_alltoall']:.2f}x MPI Alltoall of contiguous blocks (target >= {TARGET}x), "
        f"{res['ratio_vs_alltoall_datatype']:.2f}x Alltoall with the column datatype"
        f"{'' if res['correct'] else '  RESULT WRONG'}",
        "  CPU per rank and call, user + system, mean of the ranks: " + ", ".join(
            f"{k} {statistics.mean(c['user']) * 1e3:.1f} + "
            f"{statistics.mean(c['system']) * 1e3:.1f} ms"
            for k, c in res["cpu_s_per_call"].items()),
        f"  placement: {where['ranks_per_node']} ranks on {where['cpus_per_node']} CPUs per node, "
        f"{where['nodes']} node{'s' if where['nodes'] > 1 else ''}"
        + ("  (oversubscribed: the ranks time-share the CPUs, so each time is the CPU time "
           "all ranks spend in that side's copies and waiting, over the CPUs)"
           if where["oversubscribed"] else ""),
    ]
    text = "\n".join(lines)
    print(text, flush=True)
    os.makedirs(args.out, exist_ok=True)
    from .report import machine_info

    machine = machine_info()
    machine["mpi_library"] = MPI.Get_library_version().rstrip("\x00").splitlines()[0].strip()
    doc = {"machine": machine, "ranks": size, "placement": where, "repeat": repeat,
           "warmup": warmup, "results": [res]}
    with open(os.path.join(args.out, "bench-mpi.json"), "w") as f:
        json.dump(doc, f, indent=1)
    with open(os.path.join(args.out, "bench-mpi.txt"), "w") as f:
        f.write(text + "\n")
    return 0 if res["correct"] else 1
