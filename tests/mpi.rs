//! dlpart's SPMD collectives across MPI processes through `MpiComm` (feature `mpi`). Run it
//! under mpirun, one process per rank (scripts/test.sh makes mpirun cargo's runner):
//!
//! ```text
//! cargo build --features mpi --test mpi
//! mpirun --oversubscribe -n 4 target/debug/deps/mpi-<hash> [CASES [SEED]]
//! ```
//!
//! Every rank draws the same random global layouts (one seed): uneven grids over 1 to 3 axes,
//! several partitions per rank, a rank with none, targets by split points, block-cyclic and
//! tilings dealt over a process grid. Checked on every rank against ndarray references built
//! here independently of the planner: the local partitions of each result, the target grid
//! and owners, the bytes sent, received and copied locally (boxes that stay on a rank are
//! never sent), the whole assembled on rank 0 and on every rank, repartition_into, gather and
//! scatter with global indices; then `MpiComm`'s own bytes (variable all-gathers, all-to-all-v
//! with overlapping and empty segments), its messages never meeting the program's own, MPI
//! errors and calls from another thread as errors, `host()`, and disagreements between ranks
//! failing every rank with the same error; and that the guide's MPI block for Rust is the
//! example's code.
//!
//! A failed check aborts every rank (MPI_Abort), so none waits; each rank prints
//! `ok <rank>: <checks> checks in <cases> cases` when all passed, and exits 1 when it made no
//! check at all. `DLPART_MPI_MESSAGE_BYTES` cuts the messages (and all-gathers) smaller: the
//! value given is rank 0's, and the other ranks set other values before MPI starts (each
//! learns its rank from the launcher's environment), which they must not use: every
//! communicator's first call, an all-to-all-v before any all-gather, moves the right bytes.

use std::net::{Ipv4Addr, UdpSocket};
use std::panic::{self, AssertUnwindSafe};
use std::sync::atomic::{AtomicUsize, Ordering};

use dlpart::grid::Grid;
use dlpart::mpi::datatype::PartitionMut;
use dlpart::mpi::request;
use dlpart::mpi::topology::SimpleCommunicator;
use dlpart::mpi::traits::*;
use dlpart::spmd::{
    self, from_local, owners, repartition, Communicator as _, LocalParts, MpiComm, Segments,
};
use dlpart::{Device, Error, Layout, PartitionedArray, Tensor};
use ndarray::{ArrayD, IxDyn};

// `random_layout` is the thread tests' (these draw their targets below, to know them).
#[allow(dead_code)]
#[path = "common/spmd.rs"]
mod cases;

use cases::{
    block, check_repartitioned, expected_traffic, local_parts, random_picks, random_source,
    random_splits, reference, take_and_assign, Rng,
};

/// The checks made on this rank.
static CHECKS: AtomicUsize = AtomicUsize::new(0);

/// `assert!`, counted.
macro_rules! check {
    ($cond:expr, $($msg:tt)+) => {{
        assert!($cond, $($msg)+);
        CHECKS.fetch_add(1, Ordering::Relaxed);
    }};
}

/// `assert_eq!`, counted.
macro_rules! check_eq {
    ($got:expr, $want:expr, $($msg:tt)+) => {{
        assert_eq!($got, $want, $($msg)+);
        CHECKS.fetch_add(1, Ordering::Relaxed);
    }};
}

/// This process's rank as the launcher tells it in the environment (Open MPI's, PMIx's or
/// MPICH's variable), readable before MPI starts.
fn launcher_rank() -> Option<usize> {
    ["OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK"]
        .iter()
        .find_map(|v| std::env::var(v).ok()?.trim().parse().ok())
}

fn main() {
    // The ranks' DLPART_MPI_MESSAGE_BYTES may differ, and every rank must cut by rank 0's:
    // the other ranks are given other values here, while this process has one thread and
    // before MPI starts (which may start threads of its own that read the environment).
    let cut = std::env::var("DLPART_MPI_MESSAGE_BYTES")
        .ok()
        .and_then(|v| v.trim().parse::<usize>().ok());
    let own_cut = cut.map(|n| {
        let r = launcher_rank().expect(
            "DLPART_MPI_MESSAGE_BYTES is set, but no launcher's rank variable \
             (OMPI_COMM_WORLD_RANK, PMIX_RANK, PMI_RANK) gives the ranks their own values",
        );
        let own = n * (r + 1) + r;
        std::env::set_var("DLPART_MPI_MESSAGE_BYTES", own.to_string());
        (r, own)
    });
    let universe = dlpart::mpi::initialize().expect("MPI is initialized once");
    let world = universe.world();
    let mut args = std::env::args()
        .skip(1)
        .filter_map(|a| a.parse::<u64>().ok());
    let cases = args.next().unwrap_or(300);
    let seed = args.next().unwrap_or(20240611);
    let rank = world.rank();
    let run = panic::catch_unwind(AssertUnwindSafe(|| {
        if let (Some((r, own)), Some(n)) = (own_cut, cut) {
            check_eq!(r, rank as usize, "the launcher's rank is MPI's");
            check!(
                rank == 0 || own != n,
                "rank {rank} set its own message size {own}, not rank 0's {n}"
            );
        }
        let comm = MpiComm::new(&world).unwrap();
        check_eq!(
            (comm.rank(), comm.size()),
            (world.rank() as usize, world.size() as usize),
            "MpiComm's rank and size"
        );
        first_call_is_an_all_to_all_v(&comm, cut);
        communicator_bytes(&comm, seed);
        for case in 0..cases {
            let mut rng = Rng(seed ^ (case + 1).wrapping_mul(0x2545_f491_4f6c_dd1d));
            repartitions(&comm, &mut rng, case);
            gathers_and_scatters(&comm, &mut rng, case);
        }
        messages_never_meet_the_programs(&comm, &world);
        errors_on_every_rank(&comm, &world);
        calls_from_another_thread_fail(&comm);
        host_is_this_nodes_address(&comm, &world);
        guide_block_is_the_example();
    }));
    if run.is_err() {
        // The panic's message is out already; the other ranks must not wait for this one.
        eprintln!("rank {rank}: a check failed (seed {seed}): aborting every rank");
        world.abort(1);
    }
    let checks = CHECKS.load(Ordering::Relaxed);
    println!("ok {rank}: {checks} checks in {cases} cases");
    if checks == 0 {
        eprintln!("rank {rank}: no check ran");
        std::process::exit(1);
    }
}

/// Every rank's string, gathered with rsmpi's own collectives (not dlpart's).
fn gather_strings(world: &SimpleCommunicator, s: &str) -> Vec<String> {
    let n = world.size() as usize;
    let mut counts = vec![0i32; n];
    world.all_gather_into(&(s.len() as i32), &mut counts[..]);
    let displs: Vec<i32> = counts
        .iter()
        .scan(0, |at, &c| {
            let d = *at;
            *at += c;
            Some(d)
        })
        .collect();
    let mut buf = vec![0u8; counts.iter().sum::<i32>() as usize];
    {
        let mut part = PartitionMut::new(&mut buf[..], &counts[..], &displs[..]);
        world.all_gather_varcount_into(s.as_bytes(), &mut part);
    }
    (0..n)
        .map(|p| {
            let at = displs[p] as usize;
            String::from_utf8_lossy(&buf[at..at + counts[p] as usize]).into_owned()
        })
        .collect()
}

/// The byte of rank `r`'s send buffer at `i`.
fn byte(r: usize, i: usize) -> u8 {
    (r * 53 + i * 7 + 11) as u8
}

/// The first call of a new `MpiComm`, an all-to-all-v before any all-gather, cuts its
/// messages by rank 0's `DLPART_MPI_MESSAGE_BYTES` (`cut`, where given) as every later call
/// does, whatever the other ranks set: segments of several messages each, cut at other
/// points than any other rank's own value would cut them, arrive whole on every rank.
fn first_call_is_an_all_to_all_v(comm: &MpiComm, cut: Option<usize>) {
    let (me, n) = (comm.rank(), comm.size());
    // Rank `f` sends rank `t` `len(f, t)` bytes (none to itself): at least three messages
    // of rank 0's size when it is small.
    let len = |f: usize, t: usize| {
        if f == t {
            0
        } else {
            3 * cut.unwrap_or(8).min(64) + 5 * f + 3 * t + 1
        }
    };
    let displs = |counts: &[usize]| -> Vec<usize> {
        counts
            .iter()
            .scan(0, |at, &c| {
                let d = *at;
                *at += c;
                Some(d)
            })
            .collect()
    };
    let send_counts: Vec<usize> = (0..n).map(|t| len(me, t)).collect();
    let recv_counts: Vec<usize> = (0..n).map(|f| len(f, me)).collect();
    let (send_displs, recv_displs) = (displs(&send_counts), displs(&recv_counts));
    // Rank f's send buffer holds byte(f, i) at i: what rank t receives from f is the run at
    // f's displacement for t.
    let send: Vec<u8> = (0..send_counts.iter().sum()).map(|i| byte(me, i)).collect();
    let mut recv = vec![0xeeu8; recv_counts.iter().sum()];
    let segments = Segments {
        send_counts: &send_counts,
        send_displs: &send_displs,
        recv_counts: &recv_counts,
        recv_displs: &recv_displs,
    };
    comm.all_to_all_v(&send, &mut recv, &segments).unwrap();
    let mut want = Vec::new();
    for f in 0..n {
        let at: usize = (0..me).map(|t| len(f, t)).sum();
        want.extend((at..at + len(f, me)).map(|i| byte(f, i)));
    }
    check_eq!(recv, want, "the first call, an all-to-all-v");
}

/// `MpiComm`'s all-gather and all-to-all-v themselves, against the bytes each rank knows the
/// others hold.
fn communicator_bytes(comm: &MpiComm, seed: u64) {
    let (me, n) = (comm.rank(), comm.size());
    for round in 0..6u64 {
        let mut rng = Rng(seed ^ (round + 99).wrapping_mul(0x9e37_79b9_7f4a_7c15));
        // Variable lengths, rank 1 (and everyone in round 0) with none.
        let lens: Vec<usize> = (0..n)
            .map(|r| match (round, r) {
                (0, _) | (_, 1) => 0,
                _ => rng.below(40 * round as usize),
            })
            .collect();
        let mine: Vec<u8> = (0..lens[me]).map(|i| byte(me, i)).collect();
        let all = comm.all_gather(&mine).unwrap();
        let want: Vec<Vec<u8>> = (0..n)
            .map(|r| (0..lens[r]).map(|i| byte(r, i)).collect())
            .collect();
        check_eq!(all, want, "all_gather, round {round}");

        // counts[from][to], none to itself, some pairs with nothing for each other.
        let counts: Vec<Vec<usize>> = (0..n)
            .map(|f| {
                (0..n)
                    .map(|t| match (f == t, rng.below(3)) {
                        (true, _) | (_, 0) => 0,
                        _ => rng.below(30 * round as usize + 1),
                    })
                    .collect()
            })
            .collect();
        // Each rank's send segments start anywhere in a buffer of 64 bytes past its longest
        // one, so they overlap (the same bytes to several ranks); the receive segments follow
        // each other with gaps, which must stay untouched.
        let send_len = counts.iter().flatten().max().copied().unwrap_or(0) + 64;
        let send_displs: Vec<Vec<usize>> = (0..n)
            .map(|_| (0..n).map(|_| rng.below(65)).collect())
            .collect();
        let gaps: Vec<usize> = (0..n).map(|_| rng.below(5)).collect();
        let mut recv_displs = Vec::new();
        let mut end = 0;
        for p in 0..n {
            recv_displs.push(end + gaps[p]);
            end += gaps[p] + counts[p][me];
        }
        let send: Vec<u8> = (0..send_len).map(|i| byte(me, i)).collect();
        let mut recv = vec![0xeeu8; end + 3];
        let send_counts: Vec<usize> = counts[me].clone();
        let recv_counts: Vec<usize> = (0..n).map(|p| counts[p][me]).collect();
        let segments = Segments {
            send_counts: &send_counts,
            send_displs: &send_displs[me],
            recv_counts: &recv_counts,
            recv_displs: &recv_displs,
        };
        comm.all_to_all_v(&send, &mut recv, &segments).unwrap();
        let mut want = vec![0xeeu8; end + 3];
        for p in 0..n {
            for k in 0..counts[p][me] {
                want[recv_displs[p] + k] = byte(p, send_displs[p][me] + k);
            }
        }
        check_eq!(recv, want, "all_to_all_v, round {round}");
    }
    // A segment outside the buffers on every rank: an error before any message.
    let zeros = vec![0usize; n];
    let mut over = vec![0usize; n];
    over[(me + 1) % n] = 9;
    let segments = Segments {
        send_counts: &over,
        send_displs: &zeros,
        recv_counts: &zeros,
        recv_displs: &zeros,
    };
    let e = comm
        .all_to_all_v(&[0u8; 8], &mut [], &segments)
        .unwrap_err();
    check!(
        e.to_string()
            .contains(&format!("rank {me}: segment {} lies outside", (me + 1) % n)),
        "{e}"
    );
    // A message to a rank the communicator does not have: MPI's error, as an Error.
    let mut counts = vec![0usize; n + 1];
    counts[n] = 1;
    let displs = vec![0usize; n + 1];
    let segments = Segments {
        send_counts: &counts,
        send_displs: &displs,
        recv_counts: &displs,
        recv_displs: &displs,
    };
    let e = comm.all_to_all_v(&[7u8], &mut [], &segments).unwrap_err();
    let text = e.to_string();
    check!(
        matches!(e, Error::Backend { backend: "mpi", .. })
            && text.contains(&format!("mpi error in MPI_Isend of bytes 0..1 to rank {n}"))
            && text.to_lowercase().contains("invalid rank"),
        "{text}"
    );
}

/// The near-square process grid a block-cyclic layout deals over by default, written out.
fn process_grid(ndim: usize, n: usize) -> Vec<usize> {
    match ndim {
        1 => vec![n],
        _ => {
            let p0 = (1..=n).filter(|p| p * p <= n && n % p == 0).max().unwrap();
            let mut g = vec![p0, n / p0];
            g.resize(ndim, 1);
            g
        }
    }
}

/// The target of a case, as the test knows it.
enum Target {
    Splits(Vec<Vec<usize>>),
    Cyclic(Vec<usize>),
    /// Tiling, dealt over a process grid.
    Dealt(Vec<usize>, Vec<usize>),
}

impl Target {
    fn layout(&self, ranks: usize) -> Layout {
        match self {
            Target::Splits(s) => Layout::splits(s.clone()),
            Target::Cyclic(b) => Layout::block_cyclic(b, vec![Device::CPU; ranks]),
            Target::Dealt(t, pg) => Layout::tiling(t)
                .dealt(vec![Device::CPU; ranks])
                .process_grid(pg),
        }
    }

    /// The target's split points: numpy's `array_split` rule for a tiling (the first
    /// `len % parts` parts one longer), and every `block` elements for blocks.
    fn splits(&self, shape: &[usize]) -> Vec<Vec<usize>> {
        match self {
            Target::Splits(s) => s.clone(),
            Target::Cyclic(b) => shape
                .iter()
                .zip(b)
                .map(|(&n, &b)| {
                    let mut s: Vec<usize> = (0..n).step_by(b).collect();
                    s.push(n);
                    s
                })
                .collect(),
            Target::Dealt(t, _) => shape
                .iter()
                .zip(t)
                .map(|(&n, &t)| {
                    let mut s = vec![0];
                    for i in 0..t {
                        s.push(s[i] + n / t + usize::from(i < n % t));
                    }
                    s
                })
                .collect(),
        }
    }

    /// The rank of each target partition: dealt round-robin over the process grid, or the
    /// rank of the source partition holding the target's first element (the last slab for
    /// an index at the end).
    fn owners(&self, dst: &Grid, src: &Grid, src_owners: &[usize], ranks: usize) -> Vec<usize> {
        let pg = match self {
            Target::Splits(_) => None,
            Target::Cyclic(_) => Some(process_grid(dst.ndim(), ranks)),
            Target::Dealt(_, pg) => Some(pg.clone()),
        };
        dst.positions()
            .map(|pos| match &pg {
                Some(pg) => pos.iter().zip(pg).fold(0, |f, (&i, &p)| f * p + i % p),
                None => {
                    let start = dst.region(&pos).unwrap().start;
                    let at: Vec<usize> = start
                        .iter()
                        .zip(src.splits())
                        .map(|(&i, s)| {
                            let slab = s.iter().filter(|&&b| b <= i).count() - 1;
                            slab.min(s.len() - 2)
                        })
                        .collect();
                    src_owners[src.flat_index(&at).unwrap()]
                }
            })
            .collect()
    }
}

fn random_shape(rng: &mut Rng) -> Vec<usize> {
    let ndim = [1, 2, 2, 2, 3][rng.below(5)];
    let max = if ndim < 3 { 13 } else { 6 };
    (0..ndim).map(|_| 1 + rng.below(max)).collect()
}

/// This rank's partitions of `a` over `grid` placed, as one array over every rank.
fn spread(
    comm: &MpiComm,
    a: &ArrayD<f32>,
    grid: &Grid,
    owners: &[usize],
) -> dlpart::Result<PartitionedArray> {
    let parts = local_parts(a, grid, owners, comm.rank());
    from_local(comm, Ok(parts), Some(a.shape()))
}

fn repartitions(comm: &MpiComm, rng: &mut Rng, case: u64) {
    let (me, n) = (comm.rank(), comm.size());
    let shape = random_shape(rng);
    let a = reference(&shape);
    let (grid, src_owners) = random_source(rng, &shape, n);
    let pa = spread(comm, &a, &grid, &src_owners).unwrap();
    check_eq!(pa.grid(), &grid, "case {case}: the agreed grid");
    let mine: Vec<Vec<usize>> = grid
        .positions()
        .zip(&src_owners)
        .filter(|(_, &o)| o == me)
        .map(|(p, _)| p)
        .collect();
    check_eq!(pa.locals(), Some(mine.as_slice()), "case {case}: locals");

    let target = match case % 4 {
        0 => Target::Cyclic(shape.iter().map(|_| 1 + rng.below(4)).collect()),
        1 if shape.len() >= 2 && n == 4 => {
            let mut pg = vec![2, 2];
            pg.resize(shape.len(), 1);
            Target::Dealt(shape.iter().map(|_| 1 + rng.below(3)).collect(), pg)
        }
        _ => Target::Splits(
            shape
                .iter()
                .map(|&len| {
                    let parts = 1 + rng.below(4);
                    random_splits(rng, len, parts)
                })
                .collect(),
        ),
    };
    let (out, traffic) = repartition(comm, &pa, &target.layout(n), false).unwrap();
    check_eq!(
        out.grid().splits(),
        target.splits(&shape).as_slice(),
        "case {case}: target splits"
    );
    let want_owners = target.owners(out.grid(), &grid, &src_owners, n);
    check_eq!(
        owners(&out).unwrap(),
        want_owners,
        "case {case}: target owners"
    );
    // Local partitions hold the reference's boxes; sent and copied locally: the plan's.
    let (dst, dst_owners) = check_repartitioned(&out, &traffic, &a, (&grid, &src_owners), me, case);
    CHECKS.fetch_add(1, Ordering::Relaxed);
    let received: Vec<u64> = (0..n)
        .map(|p| expected_traffic(&grid, &src_owners, &dst, &dst_owners, p, n).0[me])
        .collect();
    // The expected counts to and from this rank itself are 0: local boxes are never sent.
    check_eq!(traffic.received, received, "case {case}: bytes received");
    // Where the partitions live: their owner's host and process.
    let hosts: Vec<String> = comm
        .all_gather(comm.host().as_bytes())
        .unwrap()
        .into_iter()
        .map(|h| String::from_utf8(h).unwrap())
        .collect();
    for (f, &o) in dst_owners.iter().enumerate() {
        let l = &out.locations(f)[0];
        check_eq!(
            (l.rank, l.host.as_deref()),
            (Some(o as i64), Some(hosts[o].as_str())),
            "case {case}: location of partition {f}"
        );
    }

    // The whole on rank 0, and on every rank.
    let whole = spmd::assemble(comm, &out, Some(0), None, false).unwrap();
    check_eq!(
        whole.is_some(),
        me == 0,
        "case {case}: assembled on rank 0 only"
    );
    if let Some(w) = whole {
        check_eq!(w.to_array::<f32>().unwrap(), a, "case {case}: assembled");
    }
    let everywhere = spmd::assemble(comm, &out, None, None, false).unwrap();
    check_eq!(
        everywhere.unwrap().to_array::<f32>().unwrap(),
        a,
        "case {case}: assembled everywhere"
    );
    // Back into zeros over the source grid.
    let zeros = ArrayD::<f32>::zeros(IxDyn(&shape));
    let back = spread(comm, &zeros, &grid, &src_owners).unwrap();
    spmd::repartition_into(comm, &out, &back, false).unwrap();
    for p in back.partitions() {
        if let Some(t) = p.tensor() {
            check_eq!(
                t.to_array::<f32>().unwrap(),
                block(&a, &p.start, &p.shape),
                "case {case}: repartition_into, partition {:?}",
                p.position
            );
        }
    }
}

fn gathers_and_scatters(comm: &MpiComm, rng: &mut Rng, case: u64) {
    let (me, n) = (comm.rank(), comm.size());
    let shape = random_shape(rng);
    let a = reference(&shape);
    let (grid, src_owners) = random_source(rng, &shape, n);
    let axis = rng.below(shape.len());
    let picks = random_picks(rng, shape[axis]);
    let (taken, values, assigned) = take_and_assign(&a, &picks, axis);
    let pa = spread(comm, &a, &grid, &src_owners).unwrap();
    let idx = Tensor::from_slice(&picks, &[picks.len()]).unwrap();
    let (got, traffic) = spmd::gather(comm, &pa, &idx, axis).unwrap();
    check_eq!(
        traffic.sent[me],
        0,
        "case {case}: a gather sends nothing to itself"
    );
    let whole = spmd::assemble(comm, &got, None, None, false).unwrap();
    check_eq!(
        whole.unwrap().to_array::<f32>().unwrap(),
        taken,
        "case {case}: gather of {picks:?} along {axis}"
    );
    let zeros = ArrayD::<f32>::zeros(IxDyn(&shape));
    let target = spread(comm, &zeros, &grid, &src_owners).unwrap();
    spmd::scatter(comm, &target, &Tensor::from(values), &idx, axis).unwrap();
    let whole = spmd::assemble(comm, &target, None, None, false).unwrap();
    check_eq!(
        whole.unwrap().to_array::<f32>().unwrap(),
        assigned,
        "case {case}: scatter at {picks:?} along {axis}"
    );
}

/// dlpart's messages travel on its own duplicate of the communicator: a wildcard receive the
/// program leaves pending on the world across dlpart's exchanges gets the program's message.
fn messages_never_meet_the_programs(comm: &MpiComm, world: &SimpleCommunicator) {
    let (me, n) = (comm.rank(), comm.size());
    let a = reference(&[4 * n, 5]);
    let mut got = [0u64; 2];
    let status = request::scope(|scope| {
        let pending = world.any_process().immediate_receive_into(scope, &mut got);
        let rows = block(&a, &[4 * me, 0], &[4, 5]);
        let pa = spmd::from_stacked(comm, vec![Tensor::from(rows)], 0).unwrap();
        let cols = Layout::tiling(&[1, n]).dealt(vec![Device::CPU; n]);
        let cols = cols.process_grid(&[1, n]);
        let (out, _) = repartition(comm, &pa, &cols, false).unwrap();
        let whole = spmd::assemble(comm, &out, None, None, false).unwrap();
        check_eq!(
            whole.unwrap().to_array::<f32>().unwrap(),
            a,
            "under a wildcard receive"
        );
        world
            .process_at_rank(((me + 1) % n) as i32)
            .send_with_tag(&[me as u64, 4242][..], 7);
        pending.wait()
    });
    check_eq!(
        (got, status.tag(), status.source_rank()),
        (
            [((me + n - 1) % n) as u64, 4242],
            7,
            ((me + n - 1) % n) as i32
        ),
        "the program's message, not dlpart's"
    );
}

/// Ranks that disagree, or one that fails, make every rank fail with the same error.
fn errors_on_every_rank(comm: &MpiComm, world: &SimpleCommunicator) {
    let (me, n) = (comm.rank(), comm.size());
    if n < 2 {
        return;
    }
    let last = n - 1;
    let row = |dtype64: bool| {
        let t = match dtype64 {
            true => Tensor::from(ndarray::Array2::<f64>::zeros((1, 4))),
            false => Tensor::from(ndarray::Array2::<f32>::zeros((1, 4))),
        };
        LocalParts::Placed(vec![(vec![me, 0], t)])
    };
    let same = |e: Error, want: &str| {
        let text = format!("{}: {e}", e.kind());
        let all = gather_strings(world, &text);
        check!(
            all.iter().all(|t| t == &all[0]) && text.contains(want),
            "every rank's error names {want:?}: {all:?}"
        );
    };
    let e = from_local(comm, Ok(row(me == last)), None).unwrap_err();
    same(
        e,
        &format!("rank {last} gives dtype float64, rank 0 float32"),
    );
    let shape: &[usize] = if me == last { &[n, 5] } else { &[n, 4] };
    let e = from_local(comm, Ok(row(false)), Some(shape)).unwrap_err();
    same(
        e,
        &format!("rank {last} placed partitions in shape ({n}, 5)"),
    );
    let parts = match me {
        1 => Err(Error::buffer("rank 1 could not import its array")),
        _ => Ok(row(false)),
    };
    let e = from_local(comm, parts, None).unwrap_err();
    same(e, "BufferError: rank 1: rank 1 could not import its array");
    let pa = from_local(comm, Ok(row(false)), None).unwrap();
    let tiling = if me == last { [1, 2] } else { [2, 1] };
    let e = repartition(comm, &pa, &Layout::tiling(&tiling), false).unwrap_err();
    same(e, &format!("ranks 0 and {last} asked for different"));
    let idx = Tensor::from_slice(&[0i64, n as i64], &[2]).unwrap();
    let e = spmd::gather(comm, &pa, &idx, 0).unwrap_err();
    same(
        e,
        &format!("IndexError: rank 0: index {n} is out of bounds for axis 0 with size {n}"),
    );
}

/// Below MPI's `Serialized` thread level (what `mpi::initialize` asks for), a call from a
/// thread other than MPI's main one is an error, not a call MPI forbids.
fn calls_from_another_thread_fail(comm: &MpiComm) {
    let e = std::thread::scope(|s| s.spawn(|| comm.all_gather(b"x")).join().unwrap());
    let text = e.unwrap_err().to_string();
    check!(
        text.contains("mpi error in MPI_Allgather: called from a thread other than"),
        "{text}"
    );
}

/// This machine's own IPv4 addresses as Linux lists them (the `/32 host LOCAL` entries of
/// `/proc/net/fib_trie`), or `None` where that file cannot be read.
fn local_addresses() -> Option<Vec<Ipv4Addr>> {
    let trie = std::fs::read_to_string("/proc/net/fib_trie").ok()?;
    let lines: Vec<&str> = trie.lines().map(str::trim).collect();
    let mut out: Vec<Ipv4Addr> = lines
        .windows(2)
        .filter(|w| w[1] == "/32 host LOCAL")
        .filter_map(|w| w[0].strip_prefix("|-- ")?.parse().ok())
        .collect();
    out.sort();
    out.dedup();
    Some(out)
}

/// `host()` is an address of this machine (one it can bind; not loopback when it has another
/// address), the same on every rank of a node.
fn host_is_this_nodes_address(comm: &MpiComm, world: &SimpleCommunicator) {
    let host = comm.host();
    let ip: Ipv4Addr = host.parse().unwrap();
    check!(
        UdpSocket::bind((ip, 0)).is_ok(),
        "{host} is not this machine's"
    );
    if let Some(local) = local_addresses() {
        let outside: Vec<&Ipv4Addr> = local.iter().filter(|a| !a.is_loopback()).collect();
        check!(
            match outside.is_empty() {
                true => ip == Ipv4Addr::LOCALHOST,
                false => outside.contains(&&ip),
            },
            "host {host}, this machine's addresses {local:?}"
        );
    }
    let node = dlpart::mpi::environment::processor_name().unwrap();
    let nodes = gather_strings(world, &node);
    let hosts = gather_strings(world, &host);
    for (r, h) in hosts.iter().enumerate() {
        if nodes[r] == node {
            check_eq!(h, &host, "rank {r} on {node}");
        }
    }
}

/// The guide's MPI block for Rust cannot run as a doc test (no MPI there): it is the code of
/// examples/mpi_spmd.rs, which scripts/test.sh runs under mpirun.
fn guide_block_is_the_example() {
    let guide = include_str!("../docs/guide.md");
    let section = &guide[guide.find("### From Rust, over MPI").unwrap()..];
    let block = section
        .split("```rust,ignore\n")
        .nth(1)
        .and_then(|b| b.split("```").next())
        .unwrap();
    let example = include_str!("../examples/mpi_spmd.rs");
    check!(
        example.ends_with(block) && block.contains("MpiComm::new"),
        "the guide's block is not the end of examples/mpi_spmd.rs:\n{block}"
    );
}
