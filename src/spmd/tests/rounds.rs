//! Exchanges in several rounds on small arrays (the round size shrunk to a few bytes), against
//! the same ndarray reference, with the number of all-to-all-v and all-gather calls counted.

use std::sync::atomic::{AtomicUsize, Ordering};

use super::*;
use crate::spmd::exchange::{
    assemble_with, repartition_into_with, repartition_target_with, Rounds,
};

/// A rank of a [`ThreadComm`] group that counts its all-to-all-v and all-gather calls.
struct Counting<'a> {
    comm: &'a ThreadComm,
    calls: AtomicUsize,
    gathers: AtomicUsize,
}

impl<'a> Counting<'a> {
    fn new(comm: &'a ThreadComm) -> Self {
        Counting {
            comm,
            calls: AtomicUsize::new(0),
            gathers: AtomicUsize::new(0),
        }
    }

    /// The all-to-all-v calls since the last time asked.
    fn take(&self) -> usize {
        self.calls.swap(0, Ordering::Relaxed)
    }

    /// The all-gather calls since the last time asked.
    fn take_gathers(&self) -> usize {
        self.gathers.swap(0, Ordering::Relaxed)
    }
}

impl Communicator for Counting<'_> {
    fn rank(&self) -> usize {
        self.comm.rank()
    }

    fn size(&self) -> usize {
        self.comm.size()
    }

    fn all_gather(&self, bytes: &[u8]) -> crate::Result<Vec<Vec<u8>>> {
        self.gathers.fetch_add(1, Ordering::Relaxed);
        self.comm.all_gather(bytes)
    }

    fn all_to_all_v(
        &self,
        send: &[u8],
        recv: &mut [u8],
        segments: &Segments<'_>,
    ) -> crate::Result<()> {
        self.calls.fetch_add(1, Ordering::Relaxed);
        self.comm.all_to_all_v(send, recv, segments)
    }
}

/// The number of rounds of a repartition from `src` to `dst`: the most bytes one rank sends
/// another, from region intersections, over the round size.
fn rounds_of(
    tuning: &Rounds,
    src: &Grid,
    src_owners: &[usize],
    dst: &Grid,
    dst_owners: &[usize],
    ranks: usize,
) -> usize {
    let largest = (0..ranks)
        .flat_map(|r| expected_traffic(src, src_owners, dst, dst_owners, r, ranks).0)
        .max()
        .unwrap_or(0);
    tuning.count(largest as usize)
}

#[test]
fn random_repartitions_in_many_rounds_equal_the_reference() {
    const RANKS: usize = 4;
    // Skipped under Miri by the test command (minutes per case); the in-place test below
    // runs there and covers the unsafe copies of each round.
    let cases: u64 = if cfg!(miri) { 1 } else { 60 };
    let mut several = 0;
    for case in 0..cases {
        let mut rng = Rng(0x51_7cc1_b727_220a ^ (case + 1).wrapping_mul(0x2545_f491_4f6c_dd1d));
        let shape: Vec<usize> = match case % 3 {
            0 => vec![1 + rng.below(5), 1 + rng.below(6), 1 + rng.below(7)],
            _ => vec![1 + rng.below(13), 1 + rng.below(11)],
        };
        let a = reference(&shape);
        let (grid, src_owners) = random_source(&mut rng, &shape, RANKS);
        let layout = random_layout(&mut rng, &shape, case % 4 == 0, RANKS);
        // Rounds of one element up to a few rows' worth.
        let tuning = Rounds {
            bytes: 4 * (1 + rng.below(6)),
            min_bytes: 0,
        };
        let results = ThreadComm::run(RANKS, |comm| {
            let comm = Counting::new(comm);
            let me = comm.rank();
            let parts = local_parts(&a, &grid, &src_owners, me);
            let pa = from_local(&comm, Ok(parts), Some(&shape)).unwrap();
            let target = SpmdTarget::resolve(&layout, &pa, RANKS);
            let (out, traffic) =
                repartition_target_with(&comm, &pa, target, false, &tuning).unwrap();
            let calls = comm.take();
            let (dst_grid, dst_owners) =
                check_repartitioned(&out, &traffic, &a, (&grid, &src_owners), me, case);
            let want_rounds = rounds_of(&tuning, &grid, &src_owners, &dst_grid, &dst_owners, 4);
            assert_eq!(
                calls, want_rounds,
                "case {case}: one all-to-all-v per round"
            );
            let received: Vec<u64> = (0..RANKS)
                .map(|s| {
                    expected_traffic(&grid, &src_owners, &dst_grid, &dst_owners, s, RANKS).0[me]
                })
                .collect();
            assert_eq!(traffic.received, received, "case {case}");
            // Assembled on rank 0 and on every rank (every rank receiving all of it).
            let root = assemble_with(&comm, &out, Some(0), None, false, &tuning).unwrap();
            assert_eq!(root.is_some(), me == 0);
            if let Some(w) = root {
                assert_eq!(w.to_array::<f32>().unwrap(), a, "case {case}");
            }
            let everywhere = assemble_with(&comm, &out, None, None, false, &tuning).unwrap();
            assert_eq!(
                everywhere.unwrap().to_array::<f32>().unwrap(),
                a,
                "case {case}"
            );
            // Back into copies of the source partitions, filled with zeros first.
            let zeros = reference(&shape).mapv(|_| 0.0f32);
            let back_parts = local_parts(&zeros, &grid, &src_owners, me);
            let back = from_local(&comm, Ok(back_parts), Some(&shape)).unwrap();
            comm.take();
            let traffic = repartition_into_with(&comm, &out, &back, false, &tuning).unwrap();
            let back_rounds = rounds_of(&tuning, &dst_grid, &dst_owners, &grid, &src_owners, 4);
            assert_eq!(comm.take(), back_rounds, "case {case}");
            let (sent, _) = expected_traffic(&dst_grid, &dst_owners, &grid, &src_owners, me, 4);
            assert_eq!(traffic.sent, sent, "case {case}");
            for p in back.partitions() {
                if let Some(t) = p.tensor() {
                    let want = block(&a, &p.start, &p.shape);
                    assert_eq!(t.to_array::<f32>().unwrap(), want, "case {case}");
                }
            }
            want_rounds
        });
        several += usize::from(results[0] > 2);
    }
    assert!(
        3 * several as u64 >= cases,
        "only {several} cases took several rounds"
    );
}

#[test]
fn rows_to_columns_in_rounds_send_and_receive_in_place() {
    // Rows -> columns receives each peer's one box straight into the target, columns -> rows
    // sends it straight from the source: every round at its offset in that box.
    let a = reference(&[8, 12]);
    // Under Miri (minutes per exchange of many rounds), one size with rounds cutting rows.
    let sizes: &[usize] = if cfg!(miri) { &[20] } else { &[4, 12, 20, 40] };
    for &bytes in sizes {
        let tuning = Rounds {
            bytes,
            min_bytes: 0,
        };
        ThreadComm::run(4, |comm| {
            let comm = Counting::new(comm);
            let me = comm.rank();
            let rows = from_stacked(
                &comm,
                vec![Tensor::from(block(&a, &[2 * me, 0], &[2, 12]))],
                0,
            )
            .unwrap();
            let dealt = |t: &[usize]| {
                let layout = Layout::tiling(t)
                    .dealt(vec![Device::CPU; 4])
                    .process_grid(t);
                SpmdTarget::resolve(&layout, &rows, 4)
            };
            comm.take_gathers();
            let (cols, traffic) =
                repartition_target_with(&comm, &rows, dealt(&[1, 4]), false, &tuning).unwrap();
            // Each rank sends each other rank a box of 2 x 3 float32.
            assert_eq!(comm.take(), (6 * 4usize).div_ceil(bytes));
            // The agreement only: a host exchange cannot fail on one rank after it, and is
            // not confirmed.
            assert_eq!(comm.take_gathers(), 1);
            let mine = cols.at(&[0, me]).unwrap();
            let want = block(&a, &[0, 3 * me], &[8, 3]);
            assert_eq!(mine.tensor().unwrap().to_array::<f32>().unwrap(), want);
            assert_eq!(traffic.received.iter().sum::<u64>(), 3 * 6 * 4);
            let back = from_stacked(
                &comm,
                vec![Tensor::from(
                    block(&a, &[2 * me, 0], &[2, 12]).mapv(|_| 0.0f32),
                )],
                0,
            )
            .unwrap();
            repartition_into_with(&comm, &cols, &back, false, &tuning).unwrap();
            let mine = back.at(&[me, 0]).unwrap();
            let want = block(&a, &[2 * me, 0], &[2, 12]);
            assert_eq!(mine.tensor().unwrap().to_array::<f32>().unwrap(), want);
        });
    }
}

#[test]
fn a_rank_failing_before_an_exchange_in_rounds_leaves_every_target_untouched() {
    let a = reference(&[8, 6]);
    let tuning = Rounds {
        bytes: 8,
        min_bytes: 0,
    };
    let errors = ThreadComm::run(3, |comm| {
        let me = comm.rank();
        let rows = [(0, 3), (3, 3), (6, 2)][me];
        let pa = from_stacked(
            comm,
            vec![Tensor::from(block(&a, &[rows.0, 0], &[rows.1, 6]))],
            0,
        )
        .unwrap();
        // Columns, rank 2's read-only: it fails its checks, the others pass theirs.
        let t = Tensor::from(reference(&[8, 2]).mapv(|_| 0.0f32));
        let t = if me == 2 {
            t.with_readonly(true).unwrap()
        } else {
            t
        };
        let out = from_local(
            comm,
            Ok(LocalParts::Placed(vec![(vec![0, 2 * me], t)])),
            None,
        )
        .unwrap();
        let e = repartition_into_with(comm, &pa, &out, false, &tuning).unwrap_err();
        let untouched = out.data()[me].tensor().unwrap().to_array::<f32>().unwrap();
        assert!(untouched.iter().all(|&x| x == 0.0));
        (e.kind().to_string(), e.to_string())
    });
    assert!(errors.iter().all(|e| e == &errors[0]), "{errors:?}");
    assert!(errors[0].1.starts_with("rank 2: "), "{}", errors[0].1);
}

#[test]
fn ranks_naming_a_device_or_not_assemble_everywhere_in_the_same_rounds() {
    // Rows of an 8x12 array assembled on every rank in rounds of 8 bytes: ranks 0 and 2 name
    // the host as their device, ranks 1 and 3 leave it to their first partition's (the host
    // too). Each rank sends the others its 96 bytes: 12 rounds everywhere, settled without a
    // second collective call.
    let a = reference(&[8, 12]);
    let tuning = Rounds {
        bytes: 8,
        min_bytes: 0,
    };
    let out = within_a_minute(4, move |comm| {
        let comm = Counting::new(comm);
        let me = comm.rank();
        let mine = Tensor::from(block(&a, &[2 * me, 0], &[2, 12]));
        let rows = from_stacked(&comm, vec![mine], 0).unwrap();
        comm.take_gathers();
        let device = (me % 2 == 0).then_some(Device::CPU);
        let whole = assemble_with(&comm, &rows, None, device, false, &tuning)
            .map(|t| t.expect("every rank assembles").to_array::<f32>().unwrap());
        let calls = (comm.take(), comm.take_gathers());
        (whole.map_err(|e| e.to_string()), calls, a.clone())
    });
    for (rank, (whole, calls, a)) in out.into_iter().enumerate() {
        assert_eq!(whole.unwrap(), a, "rank {rank}");
        assert_eq!(calls, (12, 1), "rank {rank}: all-to-alls and all-gathers");
    }
}

#[test]
fn ranks_given_different_round_sizes_take_rank_0s() {
    // Rows to columns of an 8x12 array over 4 ranks (each rank sends each other a 2x3 box of
    // float32, 24 bytes), each rank given a round size of its own, as DLPART_MPI_ROUND_BYTES
    // set differently on the ranks: every rank takes rank 0's, and the ranks whose guess was
    // another make their buffers again and confirm that, one all-gather more.
    let a = reference(&[8, 12]);
    // Under Miri, the first case only (all three round sizes and none, differing).
    let cases = [[8, 0, 4, 1 << 20], [0, 8, 8, 4], [8, 8, 8, 8]];
    for sizes in &cases[..if cfg!(miri) { 1 } else { 3 }] {
        let sizes = *sizes;
        let a = a.clone();
        let out = within_a_minute(4, move |comm| {
            let comm = Counting::new(comm);
            let me = comm.rank();
            let tuning = Rounds {
                bytes: sizes[me],
                min_bytes: 0,
            };
            let mine = Tensor::from(block(&a, &[2 * me, 0], &[2, 12]));
            let rows = from_stacked(&comm, vec![mine], 0).unwrap();
            let layout = Layout::tiling(&[1, 4])
                .dealt(vec![Device::CPU; 4])
                .process_grid(&[1, 4]);
            let target = SpmdTarget::resolve(&layout, &rows, 4);
            comm.take_gathers();
            let (cols, _) = repartition_target_with(&comm, &rows, target, false, &tuning).unwrap();
            let there = (comm.take(), comm.take_gathers());
            let got = cols
                .at(&[0, me])
                .unwrap()
                .tensor()
                .unwrap()
                .to_array::<f32>();
            assert_eq!(got.unwrap(), block(&a, &[0, 3 * me], &[8, 3]), "rank {me}");
            // Back into zeros, and the whole onto rank 0 (each other rank sends it 96 bytes).
            let zeros = Tensor::from(block(&a, &[2 * me, 0], &[2, 12]).mapv(|_| 0.0f32));
            let back = from_stacked(&comm, vec![zeros.clone()], 0).unwrap();
            comm.take_gathers();
            repartition_into_with(&comm, &cols, &back, false, &tuning).unwrap();
            let back_calls = (comm.take(), comm.take_gathers());
            let want = block(&a, &[2 * me, 0], &[2, 12]);
            assert_eq!(zeros.to_array::<f32>().unwrap(), want, "rank {me}");
            let whole = assemble_with(&comm, &cols, Some(0), None, false, &tuning).unwrap();
            if let Some(w) = whole {
                assert_eq!(w.to_array::<f32>().unwrap(), a);
            }
            (there, back_calls, (comm.take(), comm.take_gathers()))
        });
        let agree = usize::from(sizes.iter().any(|&s| s != sizes[0]));
        let rounds = |bytes: usize| {
            Rounds {
                bytes: sizes[0],
                min_bytes: 0,
            }
            .count(bytes)
        };
        for (rank, calls) in out.into_iter().enumerate() {
            let want = (
                (rounds(24), 1 + agree),
                (rounds(24), 1 + agree),
                (rounds(96), 1 + agree),
            );
            assert_eq!(calls, want, "sizes {sizes:?}: rank {rank}");
        }
    }
}
