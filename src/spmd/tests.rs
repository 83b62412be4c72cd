//! The SPMD logic on threads: every test runs its ranks through [`ThreadComm::run`] and checks
//! each rank's result against an ndarray reference built independently of the planner.

use ndarray::{ArrayD, IxDyn};

use super::*;
use crate::device::Device;
use crate::grid::Grid;
use crate::layout::Layout;
use crate::partitioned::{Data, Location, PartitionedArray};
use crate::tensor::Tensor;

/// The random layouts and references that the MPI test (`tests/mpi.rs`) shares.
#[path = "../../tests/common/spmd.rs"]
mod cases;
mod rounds;

pub(super) use cases::{block, expected_traffic};
use cases::{
    check_repartitioned, local_parts, random_layout, random_picks, random_source, reference,
    take_and_assign, Rng,
};

fn assembled(comm: &ThreadComm, pa: &PartitionedArray) -> Option<ArrayD<f32>> {
    assemble(comm, pa, Some(0), None, false)
        .unwrap()
        .map(|t| t.to_array::<f32>().unwrap())
}

#[test]
fn from_local_agrees_on_one_grid_on_every_rank() {
    let a = reference(&[7, 5]);
    // Rank 0: two boxes, rank 1: none, rank 2: two boxes. Rows [0, 3) [3, 7), cols [0, 2) [2, 5).
    let boxes = [
        (0, [0, 0], [3, 2]),
        (2, [0, 2], [3, 3]),
        (2, [3, 0], [4, 2]),
        (0, [3, 2], [4, 3]),
    ];
    let out = ThreadComm::run(3, |comm| {
        let mine = boxes
            .iter()
            .filter(|b| b.0 == comm.rank())
            .map(|(_, s, n)| (s.to_vec(), Tensor::from(block(&a, s, n))))
            .collect();
        from_local(comm, Ok(LocalParts::Placed(mine)), None).unwrap()
    });
    for (rank, pa) in out.iter().enumerate() {
        assert_eq!(pa.grid().splits(), &[vec![0, 3, 7], vec![0, 2, 5]]);
        let ranks: Vec<usize> = owners(pa).unwrap();
        assert_eq!(ranks, vec![0, 2, 2, 0]);
        let expect_locals: Vec<Vec<usize>> = match rank {
            0 => vec![vec![0, 0], vec![1, 1]],
            1 => vec![],
            _ => vec![vec![0, 1], vec![1, 0]],
        };
        assert_eq!(pa.locals().unwrap(), expect_locals.as_slice());
        for p in pa.partitions() {
            match p.data {
                Data::Tensor(t) => {
                    assert_eq!(t.to_array::<f32>().unwrap(), block(&a, &p.start, &p.shape))
                }
                Data::Remote => assert!(!expect_locals.contains(&p.position)),
                Data::Handle(_) => panic!("no handles here"),
            }
            assert_eq!(p.locations.len(), 1);
            assert_eq!(p.locations[0].device, Device::CPU);
            assert_eq!(p.locations[0].pid, Some(i64::from(std::process::id())));
        }
        assert_eq!(pa.dtype(), Some(crate::DType::Float32));
    }
}

#[test]
fn stacked_partitions_follow_each_other_in_rank_order() {
    let a = reference(&[6, 3]);
    // Rank 0: rows [0, 1) and [1, 3); rank 1: none; rank 2: an empty block then rows [3, 6).
    let out = ThreadComm::run(3, |comm| {
        let rows: &[(usize, usize)] = match comm.rank() {
            0 => &[(0, 1), (1, 2)],
            1 => &[],
            _ => &[(3, 0), (3, 3)],
        };
        let parts = rows
            .iter()
            .map(|&(s, n)| Tensor::from(block(&a, &[s, 0], &[n, 3])))
            .collect();
        let pa = from_stacked(comm, parts, 0).unwrap();
        (pa.grid().splits().to_vec(), assembled(comm, &pa))
    });
    for (splits, _) in &out {
        assert_eq!(splits, &[vec![0, 1, 3, 3, 6], vec![0, 3]]);
    }
    assert_eq!(out[0].1.as_ref().unwrap(), &a);
    assert!(out[1].1.is_none());
}

#[test]
fn a_stacking_axis_beyond_the_partitions_axes_is_an_argument_error_on_every_rank() {
    // Rank 1 holds nothing: it learns of the others' number of axes from the metadata.
    let errors = ThreadComm::run(3, |comm| {
        let parts = match comm.rank() {
            1 => vec![],
            _ => vec![Tensor::from(ndarray::Array2::<f32>::zeros((2, 3)))],
        };
        let e = from_stacked(comm, parts, 2).unwrap_err();
        (e.kind().to_string(), e.to_string())
    });
    for (kind, message) in &errors {
        assert_eq!(kind, "ValueError", "{message}");
        assert_eq!(message, &errors[0].1);
        assert!(message.contains("axis=2"), "{message}");
        assert!(
            message.contains("2-d partitions (0 <= axis < 2)"),
            "{message}"
        );
    }
    // 0-d partitions have no axis at all.
    let errors = ThreadComm::run(2, |comm| {
        let t = Tensor::from(ndarray::arr0(1.0f32).into_dyn());
        from_stacked(comm, vec![t], 0).unwrap_err().to_string()
    });
    assert_same_error(&errors, "0-d partitions have no axis to stack along");
}

/// Every rank's error message, after each rank made its own contribution.
fn errors_of(f: impl Fn(&ThreadComm) -> crate::Result<PartitionedArray> + Sync) -> Vec<String> {
    ThreadComm::run(4, |comm| f(comm).unwrap_err().to_string())
}

/// Every rank got the same error, naming `want`.
fn assert_same_error(errors: &[String], want: &str) {
    assert!(errors.iter().all(|e| e == &errors[0]), "{errors:?}");
    assert!(errors[0].contains(want), "{} lacks {want}", errors[0]);
}

#[test]
fn a_mismatch_on_one_rank_is_the_same_error_on_every_rank() {
    let row = |comm: &ThreadComm, dtype64: bool| {
        let r = comm.rank();
        let t = if dtype64 && r == 2 {
            Tensor::from(ndarray::Array2::<f64>::zeros((1, 4)))
        } else {
            Tensor::from(ndarray::Array2::<f32>::zeros((1, 4)))
        };
        LocalParts::Placed(vec![(vec![r, 0], t)])
    };
    type Case<'a> = Box<dyn Fn(&ThreadComm) -> crate::Result<PartitionedArray> + Sync + 'a>;
    let cases: Vec<(Case<'_>, &str)> = vec![
        (
            Box::new(|c| from_local(c, Ok(row(c, true)), None)),
            "rank 2 gives dtype float64, rank 0 float32",
        ),
        (
            // Rank 3 claims row 2 too: rank 2's row is covered twice.
            Box::new(|c| {
                let r = c.rank().min(2);
                let t = Tensor::from(ndarray::Array2::<f32>::zeros((1, 4)));
                from_local(c, Ok(LocalParts::Placed(vec![(vec![r, 0], t)])), None)
            }),
            "cover the same box",
        ),
        (
            // Rank 1 leaves its row out: a gap.
            Box::new(|c| {
                let parts = if c.rank() == 1 {
                    vec![]
                } else {
                    vec![row(c, false)]
                };
                let p = parts
                    .into_iter()
                    .next()
                    .unwrap_or(LocalParts::Placed(vec![]));
                from_local(c, Ok(p), None)
            }),
            "no partition covers [1, 2) along axis 0",
        ),
        (
            // Rank 3 states another global shape.
            Box::new(|c| {
                let shape: &[usize] = if c.rank() == 3 { &[4, 5] } else { &[4, 4] };
                from_local(c, Ok(row(c, false)), Some(shape))
            }),
            "rank 3 placed partitions in shape (4, 5)",
        ),
        (
            // Rank 2 states another global shape for stacked partitions.
            Box::new(|c| {
                let shape: &[usize] = if c.rank() == 2 { &[4, 5] } else { &[4, 4] };
                let t = Tensor::from(ndarray::Array2::<f32>::zeros((1, 4)));
                from_local(
                    c,
                    Ok(LocalParts::Stacked {
                        axis: 0,
                        parts: vec![t],
                    }),
                    Some(shape),
                )
            }),
            "rank 0 gives partitions stacked along axis 0 in shape (4, 4), rank 2 partitions \
             stacked along axis 0 in shape (4, 5)",
        ),
        (
            // Rank 1 failed before it could give anything.
            Box::new(|c| {
                let parts = match c.rank() {
                    1 => Err(crate::Error::buffer("rank 1 could not import its array")),
                    _ => Ok(row(c, false)),
                };
                from_local(c, parts, None)
            }),
            "rank 1: rank 1 could not import its array",
        ),
    ];
    for (f, want) in cases {
        let errors = errors_of(&*f);
        assert_same_error(&errors, want);
    }
    // The failed rank's error kind travels with it.
    let kinds = ThreadComm::run(2, |c| {
        let parts = match c.rank() {
            1 => Err(crate::Error::buffer("no")),
            _ => Ok(LocalParts::Placed(vec![])),
        };
        from_local(c, parts, None).unwrap_err().kind().to_string()
    });
    assert_eq!(kinds, vec!["BufferError"; 2]);
}

#[test]
fn random_repartitions_across_ranks_equal_the_reference() {
    const RANKS: usize = 4;
    for case in 0..40u64 {
        let mut rng = Rng(0x9e37_79b9_7f4a_7c15 ^ (case + 1).wrapping_mul(0x2545_f491_4f6c_dd1d));
        let shape = vec![1 + rng.below(13), 1 + rng.below(9)];
        let a = reference(&shape);
        let (grid, src_owners) = random_source(&mut rng, &shape, RANKS);
        let use_cyclic = case % 3 == 0;
        let layout = random_layout(&mut rng, &shape, use_cyclic, RANKS);
        ThreadComm::run(RANKS, |comm| {
            let me = comm.rank();
            let parts = local_parts(&a, &grid, &src_owners, me);
            let pa = from_local(comm, Ok(parts), Some(&shape)).unwrap();
            assert_eq!(pa.grid(), &grid);
            let (out, traffic) = repartition(comm, &pa, &layout, false).unwrap();
            // The local ones hold the reference's boxes, and the bytes moved are the plan's.
            let (got_grid, dst_owners) =
                check_repartitioned(&out, &traffic, &a, (&grid, &src_owners), me, case);
            // Each target partition on the rank the placement names.
            let (dst_grid, dealt) = layout.resolve(&shape).unwrap();
            assert_eq!(got_grid, dst_grid, "case {case}");
            let want_owners = dealt
                .unwrap_or_else(|| crate::layout::stay_by(&grid, &dst_grid, &|i| src_owners[i]));
            assert_eq!(dst_owners, want_owners, "case {case}");
            assert_eq!(traffic.sent[me] + traffic.received[me], 0);
            // Assembled on rank 0, and on every rank.
            let whole = assembled(comm, &out);
            assert_eq!(whole.is_some(), me == 0);
            if let Some(w) = whole {
                assert_eq!(w, a, "case {case}");
            }
            let everywhere = assemble(comm, &out, None, None, false).unwrap().unwrap();
            assert_eq!(everywhere.to_array::<f32>().unwrap(), a, "case {case}");
            // Back into the source layout, into the original partitions' copies.
            let back_parts = local_parts(&reference(&shape).mapv(|_| 0.0), &grid, &src_owners, me);
            let back = from_local(comm, Ok(back_parts), Some(&shape)).unwrap();
            repartition_into(comm, &out, &back, false).unwrap();
            for p in back.partitions() {
                if let Some(t) = p.tensor() {
                    assert_eq!(t.to_array::<f32>().unwrap(), block(&a, &p.start, &p.shape));
                }
            }
        });
    }
}

#[test]
fn ranks_asking_for_different_layouts_all_fail() {
    let a = reference(&[8, 4]);
    let errors = ThreadComm::run(3, |comm| {
        let me = comm.rank();
        let parts = vec![Tensor::from(block(&a, &[0, 0], &[8, 4]))];
        let pa = from_stacked(comm, if me == 0 { parts } else { vec![] }, 0).unwrap();
        let tiling = if me == 2 { [1, 2] } else { [2, 1] };
        repartition(comm, &pa, &Layout::tiling(&tiling), false)
            .unwrap_err()
            .to_string()
    });
    assert_same_error(&errors, "ranks 0 and 2 asked for different");
}

#[test]
fn ranks_placing_a_partition_on_different_devices_all_fail() {
    // Rank 0 alone deals rank 1's row block to a GPU: a GPU is never touched (rank 0 holds no
    // target there), and the ranks' dicts would disagree on where it lives.
    let a = reference(&[6, 4]);
    let errors = ThreadComm::run(3, |comm| {
        let me = comm.rank();
        let parts = vec![Tensor::from(block(&a, &[2 * me, 0], &[2, 4]))];
        let pa = from_stacked(comm, parts, 0).unwrap();
        let mut devices = vec![Device::CPU; 3];
        if me == 0 {
            devices[1] = Device::cuda(0);
        }
        let layout = Layout::tiling(&[3, 1]).dealt(devices).process_grid(&[3, 1]);
        repartition(comm, &pa, &layout, false)
            .unwrap_err()
            .to_string()
    });
    assert_same_error(&errors, "ranks 0 and 1 asked for different repartitions");
}

#[test]
fn a_rank_failing_before_the_exchange_fails_every_rank() {
    let a = reference(&[4, 4]);
    let errors = ThreadComm::run(2, |comm| {
        let pa = from_stacked(
            comm,
            vec![Tensor::from(block(&a, &[2 * comm.rank(), 0], &[2, 4]))],
            0,
        )
        .unwrap();
        // Rank 1's target is read-only: it fails its checks, rank 0 passes its own.
        let mut target = reference(&[2, 4]);
        target.fill(0.0);
        let t = Tensor::from(target);
        let t = if comm.rank() == 1 {
            t.with_readonly(true).unwrap()
        } else {
            t
        };
        let out = from_stacked(comm, vec![t], 0).unwrap();
        let e = repartition_into(comm, &pa, &out, false).unwrap_err();
        let untouched = out.data()[comm.rank()]
            .tensor()
            .unwrap()
            .to_array::<f32>()
            .unwrap();
        assert!(untouched.iter().all(|&x| x == 0.0));
        (e.kind().to_string(), e.to_string())
    });
    assert_eq!(errors[0], errors[1]);
    assert_eq!(errors[0].0, "BufferError");
    assert!(errors[0].1.starts_with("rank 1: "), "{}", errors[0].1);
}

#[test]
fn a_rank_failing_after_an_exchange_fails_every_rank_once_confirmed() {
    let out = ThreadComm::run(3, |comm| {
        let outcome = match comm.rank() {
            1 => Err(crate::Error::buffer("rank 1 could not unpack")),
            r => Ok(r),
        };
        let e = exchange::confirmed(comm, outcome, "exchanges").unwrap_err();
        let fine = exchange::confirmed(comm, Ok(comm.rank()), "exchanges").unwrap();
        (e.kind().to_string(), e.to_string(), fine == comm.rank())
    });
    assert!(out.iter().all(|o| o == &out[0]), "{out:?}");
    let want = (
        "BufferError".to_string(),
        "rank 1: rank 1 could not unpack".to_string(),
    );
    assert_eq!(
        (out[0].0.clone(), out[0].1.clone(), out[0].2),
        (want.0, want.1, true)
    );
}

/// heat's SPMD form as rank `me` of `size` reads it: row `r` of `a` (one row per rank) held
/// here when `r == me`, remote otherwise, located at rank `owner(r)`; `locals` as given.
fn heat_rows(
    a: &ArrayD<f32>,
    me: usize,
    owner: impl Fn(usize) -> i64,
    locals: Vec<Vec<usize>>,
) -> crate::Result<PartitionedArray> {
    let (size, cols) = (a.shape()[0], a.shape()[1]);
    let grid = Grid::from_splits(a.shape(), vec![(0..=size).collect(), vec![0, cols]])?;
    let data = (0..size)
        .map(|r| match r == me {
            true => Data::Tensor(Tensor::from(block(a, &[r, 0], &[1, cols]))),
            false => Data::Remote,
        })
        .collect();
    let locations = (0..size)
        .map(|r| vec![Location::rank(owner(r), Device::CPU)])
        .collect();
    PartitionedArray::new(grid, data, locations, Some(locals))
}

#[test]
fn with_ranks_reads_heat_s_form_and_every_rank_refuses_what_one_rank_cannot_use() {
    let a = reference(&[3, 4]);
    // heat's own form: each rank finds the same owners, and assembles the array.
    let out = ThreadComm::run(3, |comm| {
        let me = comm.rank();
        let pa = with_ranks(comm, heat_rows(&a, me, |r| r as i64, vec![vec![me, 0]])).unwrap();
        let hosts: Vec<_> = (0..3)
            .map(|f| {
                let l = &pa.locations(f)[0];
                (l.host.as_deref().map(str::to_owned), l.pid)
            })
            .collect();
        (owners(&pa).unwrap(), assembled(comm, &pa), hosts)
    });
    let this = Some(i64::from(std::process::id()));
    for (me, (owners, whole, hosts)) in out.iter().enumerate() {
        // The ranks' host and pid fill in the locations that named a rank alone.
        assert!(hosts.iter().all(|h| *h == (Some("127.0.0.1".into()), this)));
        assert_eq!(owners, &[0, 1, 2]);
        assert_eq!(whole.as_ref(), (me == 0).then_some(&a), "rank {me}");
    }
    // Every dict names rank 3 for row 2: no rank of three has it.
    let errors = ThreadComm::run(3, |comm| {
        let me = comm.rank();
        let pa = heat_rows(&a, me, |r| r as i64 + i64::from(r == 2), vec![vec![me, 0]]);
        with_ranks(comm, pa).unwrap_err().to_string()
    });
    assert_same_error(
        &errors,
        "names rank 3, but the communicator has 3 ranks (0 to 2)",
    );
    assert!(errors[0].contains("(2, 0)"), "{}", errors[0]);
    // Rank 1 lists row 0 as its own but holds no data there: every rank learns of it.
    let errors = ThreadComm::run(3, |comm| {
        let me = comm.rank();
        let locals = vec![vec![if me == 1 { 0 } else { me }, 0]];
        with_ranks(comm, heat_rows(&a, me, |r| r as i64, locals))
            .unwrap_err()
            .to_string()
    });
    assert_same_error(&errors, "rank 1: ");
    assert!(errors[0].contains("holds no data here"), "{}", errors[0]);
    // Rank 0's dict places row 1 on rank 2, the others' on rank 1: the dicts disagree.
    let errors = ThreadComm::run(3, |comm| {
        let me = comm.rank();
        let owner = |r: usize| if me == 0 && r == 1 { 2 } else { r as i64 };
        with_ranks(comm, heat_rows(&a, me, owner, vec![vec![me, 0]]))
            .unwrap_err()
            .to_string()
    });
    assert_same_error(&errors, "asked for different global grids");
}

#[test]
fn a_check_one_rank_fails_alone_fails_every_rank() {
    let out = ThreadComm::run(3, |comm| {
        let passed = check_together(comm, Ok(())).is_ok();
        let outcome = match comm.rank() {
            2 => Err(crate::Error::protocol(
                "data",
                None,
                "rank 2's own view",
                None,
            )),
            _ => Ok(()),
        };
        let e = check_together(comm, outcome).unwrap_err();
        (passed, e.kind().to_string(), e.to_string())
    });
    assert!(out.iter().all(|o| o == &out[0]), "{out:?}");
    assert!(out[0].0, "every rank passed, and every rank was told so");
    assert_eq!(out[0].1, "ProtocolError");
    assert!(
        out[0].2.starts_with("rank 2: ") && out[0].2.contains("rank 2's own view"),
        "{}",
        out[0].2
    );
}

#[test]
fn arrays_without_ranks_are_refused_by_name() {
    let t = Tensor::from(reference(&[2, 2]));
    let pa = PartitionedArray::partition(&t, &Layout::tiling(&[2, 1])).unwrap();
    let e = owners(&pa).unwrap_err().to_string();
    assert!(
        e.contains("position (0, 0)") && e.contains("names no rank"),
        "{e}"
    );
}

#[test]
fn rows_to_columns_and_back_in_place() {
    // Rows -> columns receives each peer's box straight into the target (contiguous there);
    // columns -> rows sends straight from the source. Both against the reference.
    let a = reference(&[8, 12]);
    ThreadComm::run(4, |comm| {
        let me = comm.rank();
        let rows = from_stacked(
            comm,
            vec![Tensor::from(block(&a, &[2 * me, 0], &[2, 12]))],
            0,
        )
        .unwrap();
        let dealt = |t: &[usize]| {
            Layout::tiling(t)
                .dealt(vec![Device::CPU; 4])
                .process_grid(t)
        };
        let (cols, traffic) = repartition(comm, &rows, &dealt(&[1, 4]), false).unwrap();
        let mine = cols.at(&[0, me]).unwrap();
        let want = block(&a, &[0, 3 * me], &[8, 3]);
        assert_eq!(mine.tensor().unwrap().to_array::<f32>().unwrap(), want);
        assert_eq!(traffic.received.iter().sum::<u64>(), 3 * 6 * 4);
        let (back, _) = repartition(comm, &cols, &dealt(&[4, 1]), false).unwrap();
        let mine = back.at(&[me, 0]).unwrap();
        let want = block(&a, &[2 * me, 0], &[2, 12]);
        assert_eq!(mine.tensor().unwrap().to_array::<f32>().unwrap(), want);
    });
}

#[test]
fn random_gathers_and_scatters_across_ranks_equal_the_reference() {
    const RANKS: usize = 3;
    for case in 0..30u64 {
        let mut rng = Rng(0x2545_f491_4f6c_dd1d ^ (case + 7).wrapping_mul(0x9e37_79b9_7f4a_7c15));
        let shape = vec![1 + rng.below(9), 1 + rng.below(7)];
        let a = reference(&shape);
        let (grid, src_owners) = random_source(&mut rng, &shape, RANKS);
        let axis = rng.below(2);
        let picks = random_picks(&mut rng, shape[axis]);
        let (want, values, assigned) = take_and_assign(&a, &picks, axis);
        ThreadComm::run(RANKS, |comm| {
            let me = comm.rank();
            let pa = from_local(
                comm,
                Ok(local_parts(&a, &grid, &src_owners, me)),
                Some(&shape),
            )
            .unwrap();
            let idx = Tensor::from_slice(&picks, &[picks.len()]).unwrap();
            let (got, traffic) = gather(comm, &pa, &idx, axis).unwrap();
            assert_eq!(traffic.sent[me], 0);
            let whole = assemble(comm, &got, None, None, false).unwrap().unwrap();
            assert_eq!(whole.to_array::<f32>().unwrap(), want, "case {case}");
            let zeros = assigned.mapv(|_| 0.0);
            let target = from_local(
                comm,
                Ok(local_parts(&zeros, &grid, &src_owners, me)),
                Some(&shape),
            )
            .unwrap();
            scatter(comm, &target, &Tensor::from(values.clone()), &idx, axis).unwrap();
            let whole = assemble(comm, &target, None, None, false).unwrap().unwrap();
            assert_eq!(whole.to_array::<f32>().unwrap(), assigned, "case {case}");
        });
    }
}

#[test]
fn one_index_drops_the_axis_across_ranks_as_numpy_does() {
    let a = reference(&[6, 4]);
    ThreadComm::run(3, |comm| {
        let me = comm.rank();
        let rows = Tensor::from(block(&a, &[2 * me, 0], &[2, 4]));
        let pa = from_stacked(comm, vec![rows], 0).unwrap();
        let one = |i: i64| Tensor::from_slice(&[i], &[]).unwrap();
        // numpy.take(a, -3, 0) is a[3], served by rank 1.
        let (got, _) = gather(comm, &pa, one(-3), 0).unwrap();
        assert_eq!(got.shape(), &[4]);
        let whole = assemble(comm, &got, None, None, false).unwrap().unwrap();
        assert_eq!(
            whole.to_array::<f32>().unwrap(),
            a.slice(ndarray::s![3, ..]).into_dyn()
        );
        // a[:, 1] = values, values without the axis, on every rank.
        let values = Tensor::from(ArrayD::<f32>::from_elem(IxDyn(&[6]), -1.0));
        scatter(comm, &pa, &values, one(1), 1).unwrap();
        let mut want = a.clone();
        want.slice_mut(ndarray::s![.., 1]).fill(-1.0);
        assert_eq!(assembled(comm, &pa).unwrap_or_else(|| want.clone()), want);
        let e = scatter(comm, &pa, &values, one(1), 0).unwrap_err();
        assert!(e.to_string().contains("must have shape (4,)"), "{e}");
    });
}

#[test]
fn a_bad_index_or_a_read_only_partition_fails_every_rank_before_any_write() {
    let a = reference(&[6, 2]);
    let out = ThreadComm::run(3, |comm| {
        let me = comm.rank();
        let rows = block(&a, &[2 * me, 0], &[2, 2]);
        let t = Tensor::from(rows);
        let t = if me == 2 {
            t.with_readonly(true).unwrap()
        } else {
            t
        };
        let pa = from_stacked(comm, vec![t], 0).unwrap();
        let bad = Tensor::from_slice(&[0i64, 6], &[2]).unwrap();
        let e1 = gather(comm, &pa, &bad, 0).unwrap_err();
        let idx = Tensor::from_slice(&[0i64, 5], &[2]).unwrap();
        let values = Tensor::from(ArrayD::<f32>::zeros(IxDyn(&[2, 2])));
        let e2 = scatter(comm, &pa, &values, &idx, 0).unwrap_err();
        let mine = pa.data()[me].tensor().unwrap().to_array::<f32>().unwrap();
        assert_eq!(mine, block(&a, &[2 * me, 0], &[2, 2]), "nothing written");
        (e1.kind().to_string(), e2.to_string())
    });
    assert!(out.iter().all(|o| o == &out[0]), "{out:?}");
    assert_eq!(out[0].0, "IndexError");
    assert!(
        out[0].1.starts_with("rank 2: ") && out[0].1.contains("read-only"),
        "{}",
        out[0].1
    );
}

/// Each of 2 ranks holds rows `4r..4r + 4` of a 8x2 array as two row blocks viewing one
/// buffer; the scatter writes rows 1 and 2 from values that view rows 0 and 1 of rank 0's
/// buffer, and must write their old contents (numpy's fancy assignment), though writing row 1
/// changes what row 2 is read from. A written partition that repeats an element (stride 0) is
/// refused on every rank before anything is written.
/// Host values write host partitions of any kind (pinned, managed, ROCm host memory, an
/// emulated `kDLCPU:k`) in place, on every rank, as `PartitionedArray::scatter` does.
#[test]
fn scatter_writes_host_partitions_of_any_kind_from_host_values() {
    use crate::DeviceType;
    let a = reference(&[4, 2]);
    for (kind, id) in [
        (DeviceType::CudaHost, 0),
        (DeviceType::CudaManaged, 0),
        (DeviceType::RocmHost, 0),
        (DeviceType::Cpu, 1),
    ] {
        let out = ThreadComm::run(2, |comm| {
            let me = comm.rank();
            let buffer = Tensor::from(block(&a, &[2 * me, 0], &[2, 2]));
            let device = Device::new(kind, id).unwrap();
            // SAFETY: the buffer's four elements, in C order, labelled as host memory of
            // another kind, which the CPU reads and writes alike.
            let there = unsafe { crate::partitioned::tests::view_2x2(&buffer, [2, 1], device) };
            let pa = from_stacked(comm, vec![there], 0).unwrap();
            let values = Tensor::from(ArrayD::<f32>::from_elem(IxDyn(&[2, 2]), -1.0));
            let rows = Tensor::from_slice(&[3i64, 0], &[2]).unwrap();
            scatter(comm, &pa, &values, &rows, 0).unwrap();
            buffer.to_array::<f32>().unwrap()
        });
        let mut want = a.clone();
        for row in [0, 3] {
            want.slice_mut(ndarray::s![row, ..]).fill(-1.0);
        }
        for (rank, mine) in out.iter().enumerate() {
            assert_eq!(mine, &block(&want, &[2 * rank, 0], &[2, 2]), "{kind:?}");
        }
    }
}

/// Values broadcast to the rows written, as numpy's fancy assignment broadcasts them: a 0-d
/// value at every element, a column with one value per index.
#[test]
fn scatter_broadcasts_values_on_every_rank() {
    let a = reference(&[4, 2]);
    for (vals, shape) in [(vec![-1.0f32], vec![]), (vec![-1.0f32, -2.0], vec![2, 1])] {
        let out = ThreadComm::run(2, |comm| {
            let me = comm.rank();
            let buffer = Tensor::from(block(&a, &[2 * me, 0], &[2, 2]));
            let pa = from_stacked(comm, vec![buffer.clone()], 0).unwrap();
            let values = Tensor::from_slice(&vals, &shape).unwrap();
            let rows = Tensor::from_slice(&[3i64, 0], &[2]).unwrap();
            scatter(comm, &pa, &values, &rows, 0).unwrap();
            buffer.to_array::<f32>().unwrap()
        });
        // numpy: a[[3, 0]] = values
        let mut want = a.clone();
        for (k, row) in [3, 0].into_iter().enumerate() {
            want.slice_mut(ndarray::s![row, ..])
                .fill(vals[k % vals.len()]);
        }
        for (rank, mine) in out.iter().enumerate() {
            assert_eq!(mine, &block(&want, &[2 * rank, 0], &[2, 2]), "{shape:?}");
        }
    }
}

/// Two partitions of rank 1 over the same memory: a scatter into both would leave what the one
/// written last was given, not numpy's last duplicate. Refused on every rank, nothing written.
#[test]
fn scatter_into_partitions_sharing_memory_fails_every_rank() {
    let a = reference(&[8, 2]);
    let out = ThreadComm::run(2, |comm| {
        let me = comm.rank();
        let buffer = Tensor::from(block(&a, &[4 * me, 0], &[2, 2]));
        let second = match me {
            1 => buffer.clone(),
            _ => Tensor::from(block(&a, &[4 * me + 2, 0], &[2, 2])),
        };
        let parts = vec![
            (vec![4 * me, 0], buffer.clone()),
            (vec![4 * me + 2, 0], second),
        ];
        let pa = from_local(comm, Ok(LocalParts::Placed(parts)), None).unwrap();
        let values = Tensor::from(ArrayD::<f32>::zeros(IxDyn(&[2, 2])));
        let rows = Tensor::from_slice(&[6i64, 4], &[2]).unwrap();
        let e = scatter(comm, &pa, &values, &rows, 0).unwrap_err();
        (e.to_string(), buffer.to_array::<f32>().unwrap())
    });
    for (rank, (e, mine)) in out.iter().enumerate() {
        assert_eq!(
            e,
            "rank 1: target partitions (2, 0) and (3, 0) of rank 1 share memory: their copies \
             would race"
        );
        assert_eq!(mine, &block(&a, &[4 * rank, 0], &[2, 2]), "nothing written");
    }
}

#[test]
fn scatter_reads_values_that_view_the_partitions_before_writing_them() {
    let a = reference(&[8, 2]);
    let out = ThreadComm::run(2, |comm| {
        let me = comm.rank();
        let buffer = Tensor::from(block(&a, &[4 * me, 0], &[4, 2]));
        let halves = |t: &Tensor| {
            vec![
                (vec![4 * me, 0], t.view(&[0, 0], &[2, 2]).unwrap()),
                (vec![4 * me + 2, 0], t.view(&[2, 0], &[2, 2]).unwrap()),
            ]
        };
        let pa = from_local(comm, Ok(LocalParts::Placed(halves(&buffer))), None).unwrap();
        let values = buffer.view(&[0, 0], &[2, 2]).unwrap();
        let idx = Tensor::from_slice(&[1i64, 2], &[2]).unwrap();
        scatter(comm, &pa, &values, &idx, 0).unwrap();
        // Rows 1 and 6 into an array whose second block on rank 1 repeats an element.
        let fresh = Tensor::from(block(&a, &[4 * me, 0], &[4, 2]));
        let mut parts = halves(&fresh);
        if me == 1 {
            // SAFETY: stride 0 along rows stays within the buffer's first row.
            parts[1].1 =
                unsafe { crate::partitioned::tests::view_2x2(&fresh, [0, 1], crate::Device::CPU) };
        }
        let pb = from_local(comm, Ok(LocalParts::Placed(parts)), None).unwrap();
        let rows_1_and_6 = Tensor::from_slice(&[1i64, 6], &[2]).unwrap();
        let e = scatter(comm, &pb, &values, &rows_1_and_6, 0).unwrap_err();
        let untouched = fresh.to_array::<f32>().unwrap();
        (buffer.to_array::<f32>().unwrap(), e.to_string(), untouched)
    });
    let mut expected = block(&a, &[0, 0], &[4, 2]);
    let old = expected.clone();
    for (row, from) in [(1, 0), (2, 1)] {
        for j in 0..2 {
            expected[[row, j]] = old[[from, j]];
        }
    }
    assert_eq!(out[0].0, expected);
    assert_eq!(
        out[1].0,
        block(&a, &[4, 0], &[4, 2]),
        "rank 1 holds no index"
    );
    for (rank, (_, e, untouched)) in out.iter().enumerate() {
        assert!(
            e.starts_with("rank 1: ") && e.contains("more than once"),
            "{e}"
        );
        assert_eq!(
            untouched,
            &block(&a, &[4 * rank, 0], &[4, 2]),
            "nothing written"
        );
    }
}

/// heat's replicated form over 3 ranks: one 4x3 partition located at rank 2, each rank
/// holding its own copy (`locals` lists it everywhere).
fn replicated(a: &ArrayD<f32>) -> crate::Result<PartitionedArray> {
    let grid = Grid::from_splits(a.shape(), vec![vec![0, 4], vec![0, 3]])?;
    PartitionedArray::new(
        grid,
        vec![Data::Tensor(Tensor::from(a.clone()))],
        vec![vec![Location::rank(2, Device::CPU)]],
        Some(vec![vec![0, 0]]),
    )
}

/// A scatter into a replicated array writes every rank's copy; repartition_into refuses a
/// replicated target on every rank, writing nothing, as it writes only the owner's copy.
#[test]
fn scatter_writes_every_copy_of_a_replicated_array() {
    let a = reference(&[4, 3]);
    let out = ThreadComm::run(3, |comm| {
        let pa = with_ranks(comm, replicated(&a)).unwrap();
        let values = Tensor::from(ArrayD::from_elem(IxDyn(&[4, 2]), -1.0f32));
        let idx = Tensor::from_slice(&[2i64, 0], &[2]).unwrap();
        scatter(comm, &pa, &values, &idx, 1).unwrap();
        let copy = pa.data()[0].tensor().unwrap().to_array::<f32>().unwrap();
        let rows = Layout::splits(vec![vec![0, 1, 2, 3, 4], vec![0, 3]]);
        let (src, _) = repartition(comm, &pa, &rows, false).unwrap();
        let into = with_ranks(comm, replicated(&a.mapv(|x| -x))).unwrap();
        let e = repartition_into(comm, &src, &into, false).unwrap_err();
        let kept = into.data()[0].tensor().unwrap().to_array::<f32>().unwrap();
        (copy, e.to_string(), kept)
    });
    let mut expected = a.clone();
    for r in 0..4 {
        expected[[r, 0]] = -1.0;
        expected[[r, 2]] = -1.0;
    }
    for (rank, (copy, e, kept)) in out.iter().enumerate() {
        assert_eq!(copy, &expected, "rank {rank}'s copy");
        assert!(e.contains("rank 0 holds a copy of it"), "{e}");
        assert_eq!(kept, &a.mapv(|x| -x), "rank {rank}: nothing written");
    }
}

/// Ranks making different collective calls (a program's bug) all get one error naming the
/// calls, whatever the calls read from each other's bytes; a rank failing alone joins any.
#[test]
fn ranks_making_different_calls_are_told_which() {
    let a = reference(&[6, 2]);
    let errors = ThreadComm::run(3, |comm| {
        let me = comm.rank();
        let rows = LocalParts::Stacked {
            axis: 0,
            parts: vec![Tensor::from(block(&a, &[2 * me, 0], &[2, 2]))],
        };
        let pa = from_local(comm, Ok(rows), None).unwrap();
        let idx = Tensor::from_slice(&[0i64], &[1]).unwrap();
        let e = match me {
            0 => repartition(comm, &pa, &Layout::tiling(&[1, 2]), false).map(|_| ()),
            1 => gather(comm, &pa, &idx, 0).map(|_| ()),
            _ => from_local(comm, Ok(LocalParts::Placed(Vec::new())), None).map(|_| ()),
        };
        e.unwrap_err().to_string()
    });
    assert_same_error(
        &errors,
        "rank 0 called repartition, rank 1 gather: every rank must make the same collective \
         calls, in the same order",
    );
    let errors = ThreadComm::run(2, |comm| {
        let e = crate::Error::buffer("rank 1's own");
        match comm.rank() {
            0 => from_local(comm, Ok(LocalParts::Placed(Vec::new())), None)
                .unwrap_err()
                .to_string(),
            _ => fail_together(comm, e).to_string(),
        }
    });
    assert_same_error(&errors, "rank 1's own");
}

/// A communicator whose all-gather returns no parts: a broken transport, refused by name.
struct Silent;

impl Communicator for Silent {
    fn rank(&self) -> usize {
        0
    }

    fn size(&self) -> usize {
        2
    }

    fn all_gather(&self, _bytes: &[u8]) -> crate::Result<Vec<Vec<u8>>> {
        Ok(Vec::new())
    }

    fn all_to_all_v(&self, _: &[u8], _: &mut [u8], _: &Segments<'_>) -> crate::Result<()> {
        Ok(())
    }
}

#[test]
fn an_all_gather_of_the_wrong_count_is_an_error_not_a_panic() {
    let t = Tensor::from(reference(&[2, 2]));
    let e = from_stacked(&Silent, vec![t], 0).unwrap_err().to_string();
    assert!(
        e.contains("each of the 2 ranks") && e.contains("0 parts"),
        "{e}"
    );
    let e = check_together(&Silent, Ok(())).unwrap_err().to_string();
    assert!(e.contains("0 parts"), "{e}");
}

/// `f` on `ranks` ranks, or a panic when they have not all returned within a minute: a rank
/// left waiting in a collective fails the test instead of hanging it.
pub(super) fn within_a_minute<T: Send + 'static>(
    ranks: usize,
    f: impl Fn(&ThreadComm) -> T + Send + Sync + 'static,
) -> Vec<T> {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(ThreadComm::run(ranks, f));
    });
    let limit = if cfg!(miri) { 1800 } else { 60 }; // Miri interprets, far slower
    rx.recv_timeout(std::time::Duration::from_secs(limit))
        .expect("every rank returns")
}

/// An 8 x 8 array over 4 ranks as row blocks, and zeros as its column blocks to repartition
/// into: this rank's columns contiguous, or a strided view (`strided`), received in place or
/// unpacked. Returns the array, the rows, this rank's columns and the column array.
fn rows_to_columns(
    comm: &ThreadComm,
    strided: bool,
) -> (ArrayD<f32>, PartitionedArray, Tensor, PartitionedArray) {
    let r = comm.rank();
    let a = ArrayD::from_shape_fn(IxDyn(&[8, 8]), |i| (i[0] * 10 + i[1]) as f32);
    let rows = Tensor::from(block(&a, &[2 * r, 0], &[2, 8]));
    let src = from_stacked(comm, vec![rows], 0).unwrap();
    let cols = match strided {
        false => Tensor::zeros(&[8, 2], crate::DType::Float32).unwrap(),
        true => Tensor::zeros(&[8, 4], crate::DType::Float32)
            .unwrap()
            .view(&[0, 1], &[8, 2])
            .unwrap(),
    };
    let placed = LocalParts::Placed(vec![(vec![0, 2 * r], cols.clone())]);
    let dst = from_local(comm, Ok(placed), None).unwrap();
    (a, src, cols, dst)
}

#[test]
fn a_view_one_rank_holds_of_its_target_fails_every_rank_before_any_write() {
    // Rows to columns, the target received in place (contiguous columns) or unpacked (a
    // strided view): rank 1 still reads its own target through a view.
    for strided in [false, true] {
        let out = within_a_minute(4, move |comm| {
            let (_, src, cols, dst) = rows_to_columns(comm, strided);
            let view = (comm.rank() == 1).then(|| cols.as_array::<f32>().unwrap());
            let e = repartition_into(comm, &src, &dst, false).map(|_| ());
            drop(view);
            let untouched = cols.to_array::<f32>().unwrap().iter().all(|&v| v == 0.0);
            (e.map_err(|e| e.to_string()), untouched)
        });
        for (rank, (e, untouched)) in out.iter().enumerate() {
            let e = e.as_ref().expect_err("every rank fails");
            // Named: the exchange, its target partition at fault, the view.
            assert!(
                e.starts_with("rank 1: exchange: cannot write its target partition ")
                    && e.contains("being read at the same time by as_array (its live view)"),
                "{e}"
            );
            assert!(untouched, "strided {strided}: rank {rank} wrote its target");
        }
    }
}

/// A rank's communicator that, as its all-to-all starts, asks another thread of its process
/// to read `target` (which the exchange writes): whether that thread was refused.
struct ReadsDuringExchange<'a> {
    inner: &'a ThreadComm,
    target: Tensor,
    refused: std::sync::Mutex<Option<bool>>,
}

impl Communicator for ReadsDuringExchange<'_> {
    fn rank(&self) -> usize {
        self.inner.rank()
    }

    fn size(&self) -> usize {
        self.inner.size()
    }

    fn all_gather(&self, bytes: &[u8]) -> crate::Result<Vec<Vec<u8>>> {
        self.inner.all_gather(bytes)
    }

    fn all_to_all_v(
        &self,
        send: &[u8],
        recv: &mut [u8],
        segments: &Segments<'_>,
    ) -> crate::Result<()> {
        let t = self.target.clone();
        let read = std::thread::spawn(move || t.as_array::<f32>().map(drop).is_ok());
        *self.refused.lock().unwrap() = Some(!read.join().unwrap());
        self.inner.all_to_all_v(send, recv, segments)
    }
}

#[test]
fn another_thread_cannot_claim_a_target_between_the_agreement_and_the_writes() {
    // Rows to columns, received in place (contiguous columns) or unpacked after the
    // all-to-all (a strided view): either way the target stays claimed from the check before
    // the ranks agree until it is written, so another thread's view of it is refused rather
    // than making this rank fail alone after the others went on.
    for strided in [false, true] {
        let out = within_a_minute(4, move |comm| {
            let (a, src, cols, dst) = rows_to_columns(comm, strided);
            let pest = ReadsDuringExchange {
                inner: comm,
                target: cols.clone(),
                refused: std::sync::Mutex::new(None),
            };
            let done = repartition_into(&pest, &src, &dst, false).map(|_| ());
            let want = block(&a, &[0, 2 * comm.rank()], &[8, 2]);
            let refused = pest.refused.into_inner().unwrap();
            (
                done.map_err(|e| e.to_string()),
                refused,
                cols.to_array::<f32>().unwrap() == want,
            )
        });
        for (rank, (done, refused, right)) in out.into_iter().enumerate() {
            done.unwrap();
            assert_eq!(refused, Some(true), "strided {strided}: rank {rank}");
            assert!(right, "strided {strided}: rank {rank}'s columns");
        }
    }
}

/// A rank's communicator whose first all-gather (the agreement of the collective it is lent
/// to) takes a view of `tensor` where one is given, as a program's own code that its
/// communicator runs on the collective's thread might, and keeps it until asked whether it
/// was refused.
struct ViewsInCall<'a> {
    inner: &'a ThreadComm,
    tensor: Option<&'a Tensor>,
    view: std::sync::Mutex<Option<crate::tensor::HostView<'a, f32>>>,
    refused: std::sync::Mutex<Option<bool>>,
}

impl<'a> ViewsInCall<'a> {
    fn new(inner: &'a ThreadComm, tensor: Option<&'a Tensor>) -> Self {
        ViewsInCall {
            inner,
            tensor,
            view: std::sync::Mutex::new(None),
            refused: std::sync::Mutex::new(None),
        }
    }

    /// Whether the view was refused (`None` where no tensor was given); drops a view taken.
    fn refused(self) -> Option<bool> {
        drop(self.view.into_inner().unwrap());
        self.refused.into_inner().unwrap()
    }
}

impl Communicator for ViewsInCall<'_> {
    fn rank(&self) -> usize {
        self.inner.rank()
    }

    fn size(&self) -> usize {
        self.inner.size()
    }

    fn all_gather(&self, bytes: &[u8]) -> crate::Result<Vec<Vec<u8>>> {
        let mut refused = self.refused.lock().unwrap();
        if let (Some(t), None) = (self.tensor, *refused) {
            match t.as_array::<f32>() {
                Ok(v) => {
                    *self.view.lock().unwrap() = Some(v);
                    *refused = Some(false);
                }
                Err(_) => *refused = Some(true),
            }
        }
        drop(refused);
        self.inner.all_gather(bytes)
    }

    fn all_to_all_v(
        &self,
        send: &[u8],
        recv: &mut [u8],
        segments: &Segments<'_>,
    ) -> crate::Result<()> {
        self.inner.all_to_all_v(send, recv, segments)
    }
}

#[test]
fn a_communicators_own_code_cannot_view_memory_the_exchange_holds() {
    // Rows to columns, rank 1's columns received in place: its communicator's view of them,
    // taken on the collective's own thread during the agreement, would refuse the exchange's
    // write on rank 1 alone, after the others went on into the all-to-all.
    let out = within_a_minute(4, |comm| {
        let (a, src, cols, dst) = rows_to_columns(comm, false);
        let pest = ViewsInCall::new(comm, (comm.rank() == 1).then_some(&cols));
        let done = repartition_into(&pest, &src, &dst, false).map(|_| ());
        let refused = pest.refused();
        let want = block(&a, &[0, 2 * comm.rank()], &[8, 2]);
        let right = cols.to_array::<f32>().unwrap() == want;
        (done.map_err(|e| e.to_string()), refused, right)
    });
    for (rank, (done, refused, right)) in out.into_iter().enumerate() {
        done.unwrap();
        assert_eq!(refused, (rank == 1).then_some(true), "rank {rank}");
        assert!(right, "rank {rank}'s columns");
    }
}

#[test]
fn a_communicators_own_code_cannot_view_a_partition_a_scatter_writes() {
    // Rank r holds rows 4r..4r + 4 of an 8x2 array; rank 0's communicator views its block
    // while the ranks agree, which would refuse rank 0's write after the agreement.
    let out = within_a_minute(2, |comm| {
        let me = comm.rank();
        let rows = Tensor::from(ndarray::Array2::<f32>::zeros((4, 2)));
        let pa = from_stacked(comm, vec![rows.clone()], 0).unwrap();
        let values = Tensor::from(ndarray::array![[1.0f32, 1.0], [2.0, 2.0]]);
        let idx = Tensor::from_slice(&[1i64, 6], &[2]).unwrap();
        let pest = ViewsInCall::new(comm, (me == 0).then_some(&rows));
        let done = scatter(&pest, &pa, &values, &idx, 0);
        let refused = pest.refused();
        (
            done.map_err(|e| e.to_string()),
            refused,
            rows.to_array::<f32>().unwrap(),
        )
    });
    // numpy: a[[1, 6]] = values.
    let mut want = ndarray::Array2::<f32>::zeros((8, 2));
    want.row_mut(1).fill(1.0);
    want.row_mut(6).fill(2.0);
    for (rank, (done, refused, rows)) in out.into_iter().enumerate() {
        done.unwrap();
        assert_eq!(refused, (rank == 0).then_some(true), "rank {rank}");
        let w = want.slice(ndarray::s![4 * rank..4 * rank + 4, ..]);
        assert_eq!(rows, w.to_owned().into_dyn(), "rank {rank}");
    }
}

/// `to` puts each rank's partitions on the device that rank names (the ranks naming different
/// ones: kDLCPU:1 is a framework's emulated host device), keeping the grid, owners and
/// `locals`; every rank's locations name each partition's new device, partitions already there
/// are shared rather than copied, and the moved array assembles to the reference.
#[test]
fn to_puts_each_ranks_partitions_on_its_own_device_and_every_rank_learns_them() {
    crate::backend::note_host_devices(2);
    let a = reference(&[6, 3]);
    let emulated = |r: usize| Device::new(crate::DeviceType::Cpu, (r % 2) as i32).unwrap();
    let out = ThreadComm::run(3, |comm| {
        let me = comm.rank();
        let rows = Tensor::from(block(&a, &[2 * me, 0], &[2, 3]));
        let pa = from_stacked(comm, vec![rows.clone()], 0).unwrap();
        let moved = to(comm, &pa, emulated(me)).unwrap();
        let mine = moved.data()[me].tensor().unwrap().clone();
        let remote = (0..3)
            .filter(|&f| matches!(moved.data()[f], Data::Remote))
            .count();
        let locations: Vec<(Option<i64>, Device)> = (0..moved.len())
            .map(|f| (moved.locations(f)[0].rank, moved.locations(f)[0].device))
            .collect();
        let whole = assemble(comm, &moved, Some(0), Some(Device::CPU), true)
            .unwrap()
            .map(|t| t.to_array::<f32>().unwrap());
        (
            moved.grid().splits().to_vec(),
            moved.locals().unwrap().to_vec(),
            (mine.device(), mine.to_array::<f32>().unwrap()),
            (mine.data_ptr() == rows.data_ptr(), remote),
            locations,
            whole,
        )
    });
    for (r, (splits, locals, (device, values), (shared, remote), locations, whole)) in
        out.iter().enumerate()
    {
        assert_eq!(splits, &[vec![0, 2, 4, 6], vec![0, 3]]);
        assert_eq!(locals, &[vec![r, 0]]);
        assert_eq!(*device, emulated(r));
        assert_eq!(values, &block(&a, &[2 * r, 0], &[2, 3]));
        // kDLCPU data asked onto kDLCPU is shared; onto kDLCPU:1 it is copied.
        assert_eq!(*shared, r % 2 == 0, "rank {r}");
        assert_eq!(*remote, 2, "rank {r}: the others' partitions stay remote");
        let want: Vec<(Option<i64>, Device)> =
            (0..3).map(|o| (Some(o as i64), emulated(o))).collect();
        assert_eq!(locations, &want, "rank {r}'s locations");
        assert_eq!(whole.as_ref(), (r == 0).then_some(&a));
    }
}

/// A rank that cannot move its partitions (a device it lacks, data on a device without dlpart
/// kernels) and ranks moving different arrays fail every rank with the same error.
#[test]
fn to_fails_every_rank_when_one_rank_cannot_move() {
    let a = reference(&[6, 2]);
    let cases: [(&str, &str); 3] = [
        ("DeviceError", "rank 1: invalid device \"kDLCPU:99\""),
        (
            "BackendUnavailableError",
            "rank 2: the kDLOneAPI backend is unavailable",
        ),
        ("ProtocolError", "ranks 0 and 1 asked for different arrays"),
    ];
    for (case, (kind, want)) in cases.iter().enumerate() {
        let errors = ThreadComm::run(3, |comm| {
            let me = comm.rank();
            let mut rows = Tensor::from(block(&a, &[2 * me, 0], &[2, 2]));
            if case == 1 && me == 2 {
                // SAFETY: the 2x2 view with rows.strides() covers exactly `rows`' memory.
                rows = unsafe {
                    crate::partitioned::tests::view_2x2(
                        &rows,
                        [2, 1],
                        Device::new(crate::DeviceType::OneApi, 0).unwrap(),
                    )
                };
            }
            let pa = from_stacked(comm, vec![rows.clone()], 0).unwrap();
            // The same blocks side by side: another grid, which rank 1 moves in case 2.
            let pb = from_stacked(comm, vec![rows], 1).unwrap();
            let device = match (case, me) {
                (0, 1) => Device::new(crate::DeviceType::Cpu, 99).unwrap(),
                _ => Device::CPU,
            };
            let which = if (case, me) == (2, 1) { &pb } else { &pa };
            let e = to(comm, which, device).unwrap_err();
            (e.kind().to_string(), e.to_string())
        });
        for (k, message) in &errors {
            assert_eq!(message, &errors[0].1);
            assert_eq!(k, kind, "{message}");
            assert!(message.contains(want), "{message} lacks {want}");
        }
    }
}

/// Rank 1's own partition (rows 2-3) holds no data there (`Data::Remote`): every collective
/// refuses the array on every rank, with one error naming the partition, before anything
/// moves. A gather whose index falls in that partition (and one that does not touch it) once
/// panicked on rank 1 and left rank 0 waiting.
#[test]
fn a_rank_missing_its_own_partition_fails_every_collective_on_every_rank() {
    let out = within_a_minute(2, |comm| {
        let me = comm.rank();
        let f32 = crate::DType::Float32;
        let data = vec![
            match me {
                0 => Data::Tensor(Tensor::zeros(&[2, 2], f32).unwrap()),
                _ => Data::Remote,
            },
            Data::Remote,
        ];
        let locs = vec![
            vec![Location::rank(0, Device::CPU)],
            vec![Location::rank(1, Device::CPU)],
        ];
        let grid = Grid::even(&[4, 2], &[2, 1]).unwrap();
        let pa = PartitionedArray::new(grid, data, locs, None)
            .unwrap()
            .with_dtype(f32)
            .unwrap();
        let idx = |i: &[i64]| Tensor::from_slice(i, &[i.len()]).unwrap();
        let values = Tensor::zeros(&[1, 2], f32).unwrap();
        let errors = [
            gather(comm, &pa, idx(&[3]), 0).map(|_| ()),
            gather(comm, &pa, idx(&[0]), 0).map(|_| ()),
            gather(comm, &pa, idx(&[]), 0).map(|_| ()),
            scatter(comm, &pa, &values, idx(&[0]), 0),
            repartition(comm, &pa, &Layout::tiling(&[1, 2]), false).map(|_| ()),
            assemble(comm, &pa, None, None, false).map(|_| ()),
        ];
        errors.map(|e| {
            let e = e.unwrap_err();
            format!("{}: {e}", e.kind())
        })
    });
    for errors in [&out[0], &out[1]] {
        for e in errors {
            assert_eq!(
                e, "BufferError: rank 1: partition (1, 0) is rank 1's but holds no data here",
                "{out:?}"
            );
        }
    }
}

/// A target device of negative id, or one absent here (`kDLCPU:1000`), named for a rank's new
/// partitions fails every rank before anything moves; so does one named for an assemble's
/// root.
#[test]
fn a_target_device_that_is_not_here_fails_every_rank() {
    let a = reference(&[4, 2]);
    let bad = Device {
        kind: crate::DeviceType::Cpu,
        id: -5,
    };
    let absent = Device {
        kind: crate::DeviceType::Cpu,
        id: 1000,
    };
    let out = within_a_minute(2, move |comm| {
        let me = comm.rank();
        let rows = vec![Tensor::from(block(&a, &[2 * me, 0], &[2, 2]))];
        let pa = from_stacked(comm, rows, 0).unwrap();
        let cols = Layout::tiling(&[1, 2]);
        let errors = [
            repartition(comm, &pa, &cols.clone().on(bad), true).map(drop),
            repartition(comm, &pa, &cols.clone().on(absent), true).map(drop),
            repartition(comm, &pa, &cols.dealt(vec![Device::CPU, bad]), true).map(drop),
            assemble(comm, &pa, Some(1), Some(bad), true).map(drop),
        ];
        errors.map(|e| e.unwrap_err().to_string())
    });
    assert_eq!(out[0], out[1]);
    let e = &out[0];
    for (i, rank) in [(0, 0), (2, 1), (3, 1)] {
        assert_eq!(
            e[i],
            format!("rank {rank}: invalid device \"kDLCPU:-5\": the device id must be >= 0")
        );
    }
    assert!(
        e[1].starts_with("rank 0: invalid device \"kDLCPU:1000\""),
        "{}",
        e[1]
    );
}

/// Scatter values of another dtype than the array's are a dtype mismatch on every rank; of
/// another shape, a shape error naming the shape wanted.
#[test]
fn scatter_values_of_another_dtype_or_shape_fail_every_rank() {
    let a = reference(&[4, 2]);
    let out = within_a_minute(2, move |comm| {
        let me = comm.rank();
        let rows = vec![Tensor::from(block(&a, &[2 * me, 0], &[2, 2]))];
        let pa = from_stacked(comm, rows, 0).unwrap();
        let idx = Tensor::from_slice(&[3i64], &[1]).unwrap();
        let wide = Tensor::zeros(&[1, 2], crate::DType::Float64).unwrap();
        let long = Tensor::zeros(&[2, 2], crate::DType::Float32).unwrap();
        [wide, long].map(|v| {
            let e = scatter(comm, &pa, &v, &idx, 0).unwrap_err();
            format!("{}: {e}", e.kind())
        })
    });
    assert_eq!(out[0], out[1]);
    assert_eq!(
        out[0][0],
        "ValueError: rank 0: dtype float64 differs from float32 of the partitioned array \
         (ranks 1 failed too)"
    );
    assert!(
        out[0][1].starts_with(
            "ValueError: rank 0: scatter values must have shape (1, 2) (or values that \
             broadcast to it, as in numpy): "
        ),
        "{}",
        out[0][1]
    );
}

/// What one rank's collective call gave: every partition it holds as (position, device,
/// elements) and the device every partition's location names, or its error as (class,
/// message).
type HeldOrError =
    std::result::Result<(Vec<(Vec<usize>, Device, ArrayD<f32>)>, Vec<Device>), (String, String)>;

fn held_or_error(r: crate::Result<PartitionedArray>) -> HeldOrError {
    match r {
        Ok(pa) => {
            let held = pa
                .partitions()
                .filter_map(|p| {
                    let t = p.data.tensor()?;
                    Some((p.position.clone(), t.device(), t.to_array::<f32>().unwrap()))
                })
                .collect();
            let named = pa.partitions().map(|p| p.locations[0].device).collect();
            Ok((held, named))
        }
        Err(e) => Err((e.kind().to_string(), e.to_string())),
    }
}

/// New partitions in host memory of another kind than `kDLCPU` are memory of that kind, as a
/// single-process repartition allocates them, or the same error on every rank: a repartition
/// onto such a device, one dealt over the ranks onto it, one that stays where sources in such
/// memory are, and a gather from them. dlpart makes no managed or ROCm host memory (a
/// `BufferError` naming the device and the way out); pinned `kDLCUDAHost` memory comes from
/// CUDA where it loads (`BackendUnavailableError` where it does not). Plain host memory
/// labelled so would fail the rank holding it alone, after the exchange.
#[test]
fn new_partitions_in_other_host_memory_are_of_that_kind_or_fail_every_rank() {
    use crate::DeviceType;
    let a = reference(&[4, 2]);
    for kind in [
        DeviceType::CudaHost,
        DeviceType::CudaManaged,
        DeviceType::RocmHost,
    ] {
        let dev = Device::new(kind, 0).unwrap();
        let src = a.clone();
        let out = within_a_minute(2, move |comm| {
            let me = comm.rank();
            let mine = || Tensor::from(block(&src, &[2 * me, 0], &[2, 2]));
            let rows = from_stacked(comm, vec![mine()], 0).unwrap();
            let buffer = mine();
            // SAFETY: the buffer's four elements, in C order, labelled as host memory of
            // another kind, which the CPU reads and writes alike.
            let there = unsafe { crate::partitioned::tests::view_2x2(&buffer, [2, 1], dev) };
            let labelled = from_stacked(comm, vec![there], 0).unwrap();
            let cols = Layout::tiling(&[1, 2]);
            let picks = Tensor::from_slice(&[3i64, 0], &[2]).unwrap();
            [
                repartition(comm, &rows, &cols.clone().on(dev), true).map(|r| r.0),
                repartition(comm, &rows, &cols.clone().dealt(vec![dev; 2]), true).map(|r| r.0),
                repartition(comm, &labelled, &cols, false).map(|r| r.0),
                gather(comm, &labelled, &picks, 0).map(|r| r.0),
            ]
            .map(held_or_error)
        });
        // Column blocks on rank 0, dealt over ranks 0 and 1, staying on rank 0; the gather's
        // one partition goes to rank 1, which holds row 3 (numpy.take(a, [3, 0], 0)).
        let col = |j: usize| (vec![0, j], block(&a, &[0, j], &[4, 1]));
        let picked = ndarray::concatenate![
            ndarray::Axis(0),
            block(&a, &[3, 0], &[1, 2]),
            block(&a, &[0, 0], &[1, 2])
        ];
        let want = [
            [vec![col(0), col(1)], vec![]],
            [vec![col(0)], vec![col(1)]],
            [vec![col(0), col(1)], vec![]],
            [vec![], vec![(vec![0, 0], picked)]],
        ];
        let advice = [
            "repartition onto one of them",
            "repartition onto one of them",
            "repartition onto one of them",
            "copy the data onto one of them first",
        ];
        let cuda_here = out[0][0].is_ok();
        for (op, want) in want.iter().enumerate() {
            for (rank, results) in out.iter().enumerate() {
                match (&results[op], kind) {
                    (Ok((held, named)), DeviceType::CudaHost) if cuda_here => {
                        let expect: Vec<_> = want[rank]
                            .iter()
                            .map(|(pos, v)| (pos.clone(), dev, v.clone()))
                            .collect();
                        assert_eq!(held, &expect, "op {op}, rank {rank}");
                        assert!(named.iter().all(|&d| d == dev), "{named:?}");
                    }
                    (Err((class, message)), _) => {
                        assert_eq!(results[op], out[0][op], "op {op}: the same on every rank");
                        if kind == DeviceType::CudaHost {
                            assert_eq!(class, "BackendUnavailableError", "{message}");
                            assert!(message.contains("new kDLCUDAHost memory"), "{message}");
                        } else {
                            assert_eq!(class, "BufferError", "{message}");
                            let name = format!("cannot allocate new memory on {dev}");
                            assert!(message.contains(&name), "{message}");
                            assert!(message.contains(advice[op]), "{message}");
                        }
                    }
                    (other, _) => panic!("{kind:?}, op {op}, rank {rank}: {other:?}"),
                }
            }
        }
    }
}

/// A 0-d array dealt over the ranks (one device per rank, as every SPMD deal takes) has one
/// partition, which goes to rank 0, as the first device of a single-process deal: dealt from
/// rank 1, it arrives on rank 0 alone and assembles on rank 2. A process grid with an axis
/// the array lacks is the same error on every rank, naming it.
#[test]
fn a_0d_array_dealt_over_the_ranks_goes_to_rank_0() {
    let out = within_a_minute(3, |comm| {
        let me = comm.rank();
        let parts = match me {
            1 => vec![(vec![], Tensor::from(ndarray::arr0(7.5f32).into_dyn()))],
            _ => vec![],
        };
        let pa = from_local(comm, Ok(LocalParts::Placed(parts)), None).unwrap();
        let cpus = vec![Device::CPU; 3];
        let mut dealt = Vec::new();
        for layout in [
            Layout::block_cyclic(&[], cpus.clone()),
            Layout::tiling(&[]).dealt(cpus.clone()).process_grid(&[]),
        ] {
            let (moved, traffic) = repartition(comm, &pa, &layout, false).unwrap();
            let held = moved.data()[0]
                .tensor()
                .map(|t| t.to_array::<f32>().unwrap());
            let whole = assemble(comm, &moved, Some(2), None, false).unwrap();
            let whole = whole.map(|t| t.to_array::<f32>().unwrap());
            dealt.push((owners(&moved).unwrap(), held, traffic, whole));
        }
        let gridded = Layout::block_cyclic(&[], cpus).process_grid(&[3]);
        let e = repartition(comm, &pa, &gridded, false).unwrap_err();
        (dealt, e.to_string())
    });
    let seven = ndarray::arr0(7.5f32).into_dyn();
    for (rank, (dealt, e)) in out.iter().enumerate() {
        for (owners, held, traffic, whole) in dealt {
            assert_eq!(owners, &[0]);
            assert_eq!(held.as_ref(), (rank == 0).then_some(&seven), "rank {rank}");
            let sent: &[u64] = if rank == 1 { &[4, 0, 0] } else { &[0; 3] };
            let received: &[u64] = if rank == 0 { &[0, 4, 0] } else { &[0; 3] };
            assert_eq!((&traffic.sent[..], &traffic.received[..]), (sent, received));
            assert_eq!(whole.as_ref(), (rank == 2).then_some(&seven), "rank {rank}");
        }
        assert_eq!(e, &out[0].1);
        assert!(
            e.starts_with("rank 0: ") && e.contains("0 axes (one per axis of shape ())"),
            "{e}"
        );
        assert!(e.contains("in all: (3,)"), "{e}");
    }
}
