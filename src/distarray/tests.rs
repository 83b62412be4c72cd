//! The Distributed Array Protocol against references built element by element: each process's
//! buffer is filled from a global ndarray through its own list of global indices per axis,
//! and what dlpart reads must put every element back where it came from.

use ndarray::{ArrayD, IxDyn};

use super::*;
use crate::layout::Layout;
use crate::spmd::ThreadComm;
use crate::test_rng::Rng;

fn global(shape: &[usize]) -> ArrayD<f64> {
    let mut k = 0.0;
    ArrayD::from_shape_fn(IxDyn(shape), |_| {
        k += 1.0;
        k
    })
}

/// The buffer a process holds: `a` at the global indices `held[axis]` along each axis.
fn buffer_of(a: &ArrayD<f64>, held: &[Vec<usize>]) -> Tensor {
    let shape: Vec<usize> = held.iter().map(Vec::len).collect();
    let b = ArrayD::from_shape_fn(IxDyn(&shape), |ix| {
        let g: Vec<usize> = (0..held.len()).map(|k| held[k][ix[k]]).collect();
        a[IxDyn(&g)]
    });
    Tensor::from(b)
}

fn whole(pa: &PartitionedArray) -> ArrayD<f64> {
    pa.assemble(None, false).unwrap().to_array::<f64>().unwrap()
}

#[test]
fn a_block_leaves_out_communication_padding_and_keeps_boundary_padding() {
    // 10 over 3 processes; the middle one holds 2..7 with one index of padding each side.
    let middle = DimData::new(
        10,
        Distribution::Block {
            start: 2,
            stop: 7,
            padding: [1, 1],
            periodic: false,
        },
    )
    .on_grid(3, 1);
    let expected = Run {
        global: 3,
        local: 1,
        len: 3,
    };
    assert_eq!(middle.runs(0, 5).unwrap(), [expected]);
    // At the grid's low end the same padding is boundary padding: part of the array.
    let first = DimData {
        proc_grid_rank: 0,
        ..middle.clone()
    };
    let kept = Run {
        global: 2,
        local: 0,
        len: 4,
    };
    assert_eq!(first.runs(0, 5).unwrap(), [kept]);
}

#[test]
fn padding_is_at_most_the_block() {
    let block = |start: isize, stop: usize, padding: [usize; 2], periodic: bool| {
        DimData::new(
            4,
            Distribution::Block {
                start,
                stop,
                padding,
                periodic,
            },
        )
    };
    // One process holding 0..4: boundary padding wider than its 4 indices (at each end, or
    // the two together) is no part of its buffer.
    let bad = [
        (
            block(0, 4, [5, 5], false),
            "padding (5, 5) is 10 wide",
            "start 0, stop 4",
        ),
        (
            block(0, 4, [5, 0], false),
            "padding (5, 0) is 5 wide",
            "start 0, stop 4",
        ),
        (
            block(0, 4, [3, 2], true),
            "padding (3, 2) is 5 wide",
            "start 0, stop 4",
        ),
    ];
    for (d, padding, span) in bad {
        let e = d.runs(0, 4).unwrap_err();
        assert_eq!(e.kind(), "ProtocolError");
        assert_eq!(
            e.to_string(),
            format!(
                "__distarray__ dim_data[0] ('b'): {padding}, wider than the block's 4 indices \
                 along the axis ({span}): the protocol's padding is part of the buffer, at its \
                 two ends"
            )
        );
    }
    // As wide as the block is fine: all of it boundary padding, read as part of the array.
    let whole = Run {
        global: 0,
        local: 0,
        len: 4,
    };
    assert_eq!(block(0, 4, [4, 0], false).runs(0, 4).unwrap(), [whole]);
    assert_eq!(block(0, 4, [2, 2], false).runs(0, 4).unwrap(), [whole]);
    // Between processes: communication padding of 1 and 2 around a block of 2 at 1..3 of 4
    // overlaps itself, and is refused before the neighbours are known.
    let middle = block(1, 3, [1, 2], false).on_grid(3, 1);
    let e = middle.runs(0, 2).unwrap_err().to_string();
    assert!(
        e.ends_with(
            "padding (1, 2) is 3 wide, wider than the block's 2 indices along the axis \
                     (start 1, stop 3): the protocol's padding is part of the buffer, at its two \
                     ends"
        ),
        "{e}"
    );
    let u = usize::MAX;
    let e = block(0, 4, [u, u], false)
        .runs(0, 4)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains(&format!("padding ({u}, {u}) is {} wide", 2 * (u as u128))),
        "{e}"
    );
}

#[test]
fn cyclic_blocks_are_dealt_round_robin() {
    let d = DimData::new(
        7,
        Distribution::Cyclic {
            start: 2,
            block_size: 2,
        },
    )
    .on_grid(2, 1);
    // Indices 2, 3 and 6 (blocks [2, 4) and [6, 7)).
    let runs = d.runs(0, 3).unwrap();
    let got: Vec<(usize, usize, usize)> = runs.iter().map(|r| (r.global, r.local, r.len)).collect();
    assert_eq!(got, [(2, 0, 2), (6, 2, 1)]);
    let e = d.runs(0, 4).unwrap_err().to_string();
    assert!(
        e.contains("give 3 of 7 indices here, the buffer holds 4"),
        "{e}"
    );
}

#[test]
fn one_process_reads_unstructured_and_cyclic_axes_as_views() {
    let a = global(&[5, 4]);
    let rows = vec![3, 4, 0, 1, 2];
    let cols = vec![0, 1, 2, 3];
    let buffer = buffer_of(&a, &[rows.clone(), cols]);
    let dims = [
        DimData::new(5, Distribution::unstructured(rows)),
        DimData::new(
            4,
            Distribution::Cyclic {
                start: 0,
                block_size: 3,
            },
        ),
    ];
    let pa = import(&buffer, &dims).unwrap();
    // Rows: runs [0, 3) and [3, 5); columns: one process holds every block, in order.
    assert_eq!(pa.grid().splits(), &[vec![0, 3, 5], vec![0, 3, 4]]);
    assert_eq!(whole(&pa), a);
    let memory = buffer.data_ptr() as usize..buffer.data_ptr() as usize + buffer.nbytes();
    for p in pa.partitions() {
        let at = p.tensor().unwrap().data_ptr() as usize;
        assert!(
            memory.contains(&at),
            "partition {:?} is not a view",
            p.position
        );
    }
}

#[test]
fn one_process_must_hold_every_index_once() {
    let b = Tensor::from(ndarray::Array1::from(vec![1.0f64, 2.0, 3.0]));
    // Locally unique, as the protocol has them, whatever `one_to_one` says.
    for one_to_one in [false, true] {
        let twice = [DimData::new(
            3,
            Distribution::Unstructured {
                indices: vec![1, 0, 1],
                one_to_one,
            },
        )];
        let e = import(&b, &twice).unwrap_err();
        assert_eq!(e.kind(), "ProtocolError");
        assert_eq!(
            e.to_string(),
            "__distarray__ dim_data[0] ('u'): global index 1 is at positions 0 and 2 of this \
             process's 'indices' (the protocol has them locally unique)"
        );
    }
    let gap = [DimData::new(5, Distribution::unstructured(vec![0, 1, 4]))];
    let e = import(&b, &gap).unwrap_err().to_string();
    assert!(
        e.contains("global indices 2..4 are held by no process"),
        "{e}"
    );
    let short = [DimData::new(4, Distribution::block(0, 3).unwrap())];
    let e = import(&b, &short).unwrap_err().to_string();
    assert!(
        e.contains("global indices 3..4 are held by no process"),
        "{e}"
    );
    let outside = [DimData::new(3, Distribution::unstructured(vec![0, 1, 3]))];
    let e = import(&b, &outside).unwrap_err().to_string();
    assert!(e.contains("index 3 outside [0, 3)"), "{e}");
    let grid = [DimData::new(3, Distribution::unstructured(vec![0, 1, 2])).on_grid(2, 0)];
    let e = import(&b, &grid).unwrap_err().to_string();
    assert_eq!(e, "__distarray__: a process grid of (2,) for 1 process");
}

#[test]
fn an_empty_axis_is_one_empty_partition() {
    let b = Tensor::zeros(&[0, 3], crate::DType::Float64).unwrap();
    let dims = [
        DimData::new(0, Distribution::unstructured(vec![])),
        DimData::new(3, Distribution::block(0, 3).unwrap()),
    ];
    let pa = import(&b, &dims).unwrap();
    assert_eq!(pa.shape(), &[0, 3]);
    assert_eq!(pa.len(), 1);
}

/// Random global layouts over 4 ranks on threads: each axis blocks (with padding, or periodic
/// with a halo that wraps around), cyclic blocks or a dealt permutation (with indices held
/// more than once, or not), over a random process grid; every rank's buffer is built from the
/// global array, and the array read from all of them assembles to it.
#[test]
fn ranks_read_their_shares_into_one_array() {
    for seed in 1..60u64 {
        let mut rng = Rng(seed * 0x9e37_79b9);
        let ndim = 1 + rng.below(2);
        let shape: Vec<usize> = (0..ndim).map(|_| rng.below(9)).collect();
        let procs: Vec<usize> = match ndim {
            1 => vec![4],
            _ => [vec![1, 4], vec![2, 2], vec![4, 1]][rng.below(3)].clone(),
        };
        let a = global(&shape);
        // Per axis and coordinate: the dimension dictionary and the global indices held.
        let axes: Vec<Vec<(DimData, Vec<usize>)>> = shape
            .iter()
            .zip(&procs)
            .map(|(&n, &p)| deal(&mut rng, n, p))
            .collect();
        let results = ThreadComm::run(4, |comm| {
            let mut coords = vec![0; ndim];
            let mut r = comm.rank();
            for k in (0..ndim).rev() {
                coords[k] = r % procs[k];
                r /= procs[k];
            }
            let (dims, held): (Vec<DimData>, Vec<Vec<usize>>) =
                (0..ndim).map(|k| axes[k][coords[k]].clone()).unzip();
            let buffer = buffer_of(&a, &held);
            let pa = import_spmd(comm, &buffer, &dims)?;
            crate::spmd::assemble(comm, &pa, None, None, false)
        });
        for (rank, r) in results.into_iter().enumerate() {
            let t = r.unwrap_or_else(|e| panic!("seed {seed} rank {rank}: {e}"));
            assert_eq!(t.unwrap().to_array::<f64>().unwrap(), a, "seed {seed}");
        }
    }
}

/// One axis of length `n` dealt over `procs` processes in one of the protocol's ways: each
/// coordinate's dictionary and the global indices its buffer holds, in buffer order.
fn deal(rng: &mut Rng, n: usize, procs: usize) -> Vec<(DimData, Vec<usize>)> {
    match rng.below(5) {
        0 => {
            let mut cuts: Vec<usize> = (0..procs - 1).map(|_| rng.below(n + 1)).collect();
            cuts.sort_unstable();
            let points: Vec<usize> = [vec![0], cuts, vec![n]].concat();
            (0..procs)
                .map(|c| {
                    // Communication padding: a neighbour's index on each inner side where both
                    // blocks there hold some (at most as many as the neighbour owns).
                    let held = |k: usize| points[k] < points[k + 1];
                    let left = usize::from(c > 0 && held(c - 1) && held(c));
                    let right = usize::from(c + 1 < procs && held(c + 1) && held(c));
                    let (lo, hi) = (points[c] - left, points[c + 1] + right);
                    let d = DimData::new(
                        n,
                        Distribution::Block {
                            start: lo as isize,
                            stop: hi,
                            padding: [left, right],
                            periodic: false,
                        },
                    );
                    (d.on_grid(procs, c), (lo..hi).collect())
                })
                .collect()
        }
        1 => {
            let b = 1 + rng.below(3);
            (0..procs)
                .map(|c| {
                    let held: Vec<usize> = (c * b..n)
                        .step_by(procs * b)
                        .flat_map(|k| k..(k + b).min(n))
                        .collect();
                    let d = DimData::new(
                        n,
                        Distribution::Cyclic {
                            start: c * b,
                            block_size: b,
                        },
                    );
                    (d.on_grid(procs, c), held)
                })
                .collect()
        }
        2 => {
            // Periodic blocks: boundary k lies before coordinate k, boundary 0 also after the
            // last (wrapping around); its halo is at most as wide as either block beside it.
            let mut cuts: Vec<usize> = (0..procs - 1).map(|_| rng.below(n + 1)).collect();
            cuts.sort_unstable();
            let points: Vec<usize> = [vec![0], cuts, vec![n]].concat();
            let len = |c: usize| points[c + 1] - points[c];
            let widths: Vec<usize> = (0..procs)
                .map(|k| rng.below(1 + len(k).min(len((k + procs - 1) % procs)).min(2)))
                .collect();
            (0..procs)
                .map(|c| {
                    let (left, right) = (widths[c], widths[(c + 1) % procs]);
                    let lo = points[c] as isize - left as isize;
                    let hi = points[c + 1] + right;
                    let d = DimData::new(
                        n,
                        Distribution::Block {
                            start: lo,
                            stop: hi,
                            padding: [left, right],
                            periodic: true,
                        },
                    );
                    let held = (lo..hi as isize)
                        .map(|g| g.rem_euclid(n.max(1) as isize) as usize)
                        .collect();
                    (d.on_grid(procs, c), held)
                })
                .collect()
        }
        k => {
            let mut order: Vec<usize> = (0..n).collect();
            for i in (1..n).rev() {
                order.swap(i, rng.below(i + 1));
            }
            let mut cuts: Vec<usize> = (0..procs - 1).map(|_| rng.below(n + 1)).collect();
            cuts.sort_unstable();
            let points: Vec<usize> = [vec![0], cuts, vec![n]].concat();
            (0..procs)
                .map(|c| {
                    let mut held = order[points[c]..points[c + 1]].to_vec();
                    if k == 4 && n > 0 {
                        // Copies of indices other coordinates hold too, anywhere in the buffer.
                        for _ in 0..rng.below(4) {
                            let g = rng.below(n);
                            if !held.contains(&g) {
                                let at = rng.below(held.len() + 1);
                                held.insert(at, g);
                            }
                        }
                    }
                    let d = DimData::new(n, Distribution::unstructured(held.clone()));
                    (d.on_grid(procs, c), held)
                })
                .collect()
        }
    }
}

#[test]
fn a_rank_with_a_wrong_dictionary_fails_every_rank() {
    let results = ThreadComm::run(4, |comm| {
        let buffer = Tensor::from(ndarray::Array1::from(vec![1.0f64; 2]));
        let r = comm.rank();
        // Rank 2 claims coordinate 1: its dictionary does not match its rank.
        let coord = if r == 2 { 1 } else { r };
        let dims = [
            DimData::new(8, Distribution::block(2 * coord, 2 * coord + 2).unwrap())
                .on_grid(4, coord),
        ];
        import_spmd(comm, &buffer, &dims).map(|_| ())
    });
    for r in results {
        let e = r.unwrap_err();
        assert_eq!(e.kind(), "ProtocolError");
        assert!(
            e.to_string()
                .contains("rank 2: __distarray__: process grid rank (1,) is rank 1"),
            "{e}"
        );
    }
}

#[test]
fn blocks_one_per_rank_describe_themselves_and_read_back() {
    let a = global(&[6, 4]);
    let results = ThreadComm::run(4, |comm| {
        let all = Tensor::from(a.clone());
        // Rank 0 holds the whole array; then each rank gets its block of a 2x2 grid.
        let rows = crate::spmd::from_local(
            comm,
            Ok(LocalParts::Placed(if comm.rank() == 0 {
                vec![(vec![0, 0], all)]
            } else {
                vec![]
            })),
            None,
        )?;
        let layout = Layout::tiling(&[2, 2])
            .dealt(vec![crate::Device::CPU; 4])
            .process_grid(&[2, 2]);
        let (blocks, _) = crate::spmd::repartition(comm, &rows, &layout, false)?;
        let (buffer, dims) = describe(&blocks, comm.rank(), comm.size())?;
        let back = import_spmd(comm, &buffer, &dims)?;
        let t = crate::spmd::assemble(comm, &back, None, None, false)?;
        Ok::<_, Error>((dims, t.unwrap().to_array::<f64>()?))
    });
    for (rank, r) in results.into_iter().enumerate() {
        let (dims, back) = r.unwrap();
        assert_eq!(back, a);
        let (i, j) = (rank / 2, rank % 2);
        assert_eq!(dims[0].proc_grid_rank, i);
        assert_eq!(
            dims[1].distribution,
            Distribution::block(2 * j, 2 * j + 2).unwrap()
        );
    }
}

#[test]
fn describing_asks_for_one_partition_per_process() {
    let t = Tensor::from(global(&[4, 2]));
    let two = PartitionedArray::partition(&t, &Layout::tiling(&[2, 1])).unwrap();
    let e = describe(&two, 0, 1).unwrap_err();
    assert_eq!(e.kind(), "ProtocolError");
    assert_eq!(
        e.to_string(),
        "__distarray__: each process has one buffer: a grid of tiling (2, 1) over 1 process; \
         assemble() makes one"
    );
    // A rank outside the processes is an error, not an index panic.
    let e = describe(&two, 2, 2).unwrap_err();
    assert_eq!(
        e.to_string(),
        "__distarray__: rank 2 is not below the number of processes, 2"
    );
}

#[test]
fn a_cyclic_axis_is_counted_before_it_is_read() {
    // Counting against a brute-force walk over every global index.
    for (size, procs, block) in [(0, 1, 1), (7, 2, 2), (9, 3, 2), (10, 4, 3), (5, 2, 8)] {
        for coord in 0..procs {
            let start = coord * block;
            let held = (0..size).filter(|g| (g / block) % procs == coord).count();
            let d = DimData::new(
                size,
                Distribution::Cyclic {
                    start,
                    block_size: block,
                },
            )
            .on_grid(procs, coord);
            let runs = d.runs(0, held).unwrap();
            assert_eq!(runs.iter().map(|r| r.len).sum::<usize>(), held);
        }
    }
    // A dictionary for more indices than a buffer could hold fails at once.
    let huge = DimData::new(
        usize::MAX / 2,
        Distribution::Cyclic {
            start: 0,
            block_size: 1,
        },
    );
    let e = huge.runs(0, 3).unwrap_err().to_string();
    assert!(e.contains(&format!("give {} of", usize::MAX / 2)), "{e}");
}

/// A periodic block: its end padding either inside `[0, size)` (counted, kept) or the
/// wrap-around neighbour's indices (start below 0, stop beyond size: not counted, left out).
fn periodic(size: usize, start: isize, stop: usize, padding: [usize; 2]) -> DimData {
    DimData::new(
        size,
        Distribution::Block {
            start,
            stop,
            padding,
            periodic: true,
        },
    )
}

#[test]
fn periodic_end_padding_is_read_as_the_sizes_count_it() {
    // One process, 10 indices with one ghost at each end: the ghosts hold indices 9 and 0 again.
    let a = global(&[10]);
    let ring: Vec<usize> = [9].into_iter().chain(0..10).chain([0]).collect();
    let b = buffer_of(&a, &[ring]);
    let wrapped = [periodic(10, -1, 11, [1, 1])];
    let run = Run {
        global: 0,
        local: 1,
        len: 10,
    };
    assert_eq!(wrapped[0].runs(0, 12).unwrap(), [run]);
    let pa = import(&b, &wrapped).unwrap();
    assert_eq!(pa.shape(), &[10]);
    assert_eq!(whole(&pa), a);
    // The ghosts counted in size: they are part of the array, read as the buffer holds them.
    let counted = [periodic(12, 0, 12, [1, 1])];
    let pa = import(&b, &counted).unwrap();
    assert_eq!(whole(&pa), b.to_array::<f64>().unwrap());
    // Each end on its own: the low one wraps, the high one is counted.
    let mixed = periodic(11, -1, 11, [1, 1]);
    let run = Run {
        global: 0,
        local: 1,
        len: 11,
    };
    assert_eq!(mixed.runs(0, 12).unwrap(), [run]);
    // Ends that neither count nor wrap, or wrap where nothing does.
    let bad = [
        (
            periodic(10, 0, 12, [1, 1]),
            "stop 12 (padding (1, 1)) is beyond size 10: the high end of a periodic axis ends \
             at size 10 (its padding counted in size) or at size + padding[1] = 11 (its padding \
             the wrap-around neighbour's indices)",
        ),
        (
            periodic(10, -2, 10, [1, 1]),
            "start -2 (padding (1, 1)) is below 0: the low end of a periodic axis begins at 0 \
             (its padding counted in size) or at -padding[0] = -1 (its padding the wrap-around \
             neighbour's indices)",
        ),
        (
            DimData::new(
                10,
                Distribution::Block {
                    start: -1,
                    stop: 11,
                    padding: [1, 1],
                    periodic: false,
                },
            ),
            "start -1 (padding (1, 1)) is below 0: the axis is not periodic",
        ),
        (
            periodic(10, -1, 11, [1, 1]).on_grid(2, 1),
            "start -1 (padding (1, 1)) is below 0: proc_grid_rank 1 is not the first of 2 \
             processes",
        ),
        (
            periodic(10, 0, 12, [0, 2]).on_grid(2, 0),
            "stop 12 (padding (0, 2)) is beyond size 10: proc_grid_rank 0 is not the last of 2 \
             processes",
        ),
    ];
    for (d, found) in bad {
        let e = d.runs(0, 12).unwrap_err();
        assert_eq!(e.kind(), "ProtocolError");
        assert_eq!(
            e.to_string(),
            format!("__distarray__ dim_data[0] ('b'): {found}")
        );
    }
}

/// Every rank failed with the same `ProtocolError`, `__distarray__ {found}`.
fn failed_everywhere<T: std::fmt::Debug>(results: Vec<Result<T>>, found: &str) {
    for r in results {
        let e = r.unwrap_err();
        assert_eq!(e.kind(), "ProtocolError");
        assert_eq!(e.to_string(), format!("__distarray__ {found}"));
    }
}

/// `f(comm)` on 4 ranks over threads, every rank's result.
fn on_four<T: Send>(f: impl Fn(&dyn Communicator) -> Result<T> + Sync) -> Vec<Result<T>> {
    ThreadComm::run(4, |comm| f(comm))
}

#[test]
fn a_periodic_axis_over_ranks_leaves_out_its_wrap_around_halo() {
    // 8 indices over 4 ranks, two each, with a halo of one each side that wraps around at the
    // ends: rank r's buffer is global indices 2r-1 .. 2r+3, taken modulo 8. The halo is filled
    // with -1, which no element of the array may show.
    let a = global(&[8]);
    let results = on_four(|comm| {
        let r = comm.rank();
        let mut values = vec![-1.0];
        values.extend((2 * r..2 * r + 2).map(|g| a[[g]]));
        values.push(-1.0);
        let buffer = Tensor::from(ndarray::Array1::from(values));
        let d = periodic(8, 2 * r as isize - 1, 2 * r + 3, [1, 1]).on_grid(4, r);
        let pa = import_spmd(comm, &buffer, &[d])?;
        crate::spmd::assemble(comm, &pa, None, None, false)
    });
    for r in results {
        assert_eq!(r.unwrap().unwrap().to_array::<f64>().unwrap(), a);
    }
}

/// 8 indices over 4 ranks along an unstructured axis, several held more than once: rank `r`'s
/// buffer holds `100 * r + g` at index `g`, so the array read says which rank each came from.
const SHARED: [&[usize]; 4] = [&[0, 1, 2, 3], &[2, 3, 4, 5], &[7, 5, 6], &[6, 7, 1]];

fn shared_axis(comm: &dyn Communicator, one_to_one: bool) -> Result<(Tensor, PartitionedArray)> {
    let r = comm.rank();
    let indices = SHARED[r].to_vec();
    let values: Vec<f64> = indices.iter().map(|&g| (100 * r + g) as f64).collect();
    let buffer = Tensor::from(ndarray::Array1::from(values));
    let d = DimData::new(
        8,
        Distribution::Unstructured {
            indices,
            one_to_one,
        },
    )
    .on_grid(4, r);
    let pa = import_spmd(comm, &buffer, &[d])?;
    Ok((buffer, pa))
}

#[test]
fn an_index_several_ranks_hold_is_read_from_the_lowest() {
    let results = on_four(|comm| {
        let (buffer, pa) = shared_axis(comm, false)?;
        let memory = buffer.data_ptr() as usize..buffer.data_ptr() as usize + buffer.nbytes();
        let mut mine = Vec::new();
        for p in pa.locals().unwrap() {
            let part = pa.at(p)?;
            let at = part.tensor().unwrap().data_ptr() as usize;
            assert!(memory.contains(&at), "partition {p:?} is not a view");
            mine.push((part.start.clone(), part.shape.clone()));
        }
        let t = crate::spmd::assemble(comm, &pa, None, None, false)?;
        Ok((mine, t.unwrap().to_array::<f64>()?))
    });
    // Indices 0-3 from rank 0, 4 and 5 from rank 1 (which also holds 2 and 3), 6 and 7 from
    // rank 2; rank 3 holds only indices lower ranks hold too, and reads none.
    let expected = ndarray::arr1(&[0.0, 1.0, 2.0, 3.0, 104.0, 105.0, 206.0, 207.0]).into_dyn();
    let boxes: [&[(usize, usize)]; 4] = [&[(0, 4)], &[(4, 2)], &[(6, 1), (7, 1)], &[]];
    for (rank, r) in results.into_iter().enumerate() {
        let (mine, t) = r.unwrap();
        assert_eq!(t, expected, "rank {rank}");
        let got: Vec<(usize, usize)> = mine.iter().map(|(s, n)| (s[0], n[0])).collect();
        let mut want = boxes[rank].to_vec();
        let mut got_sorted = got.clone();
        want.sort_unstable();
        got_sorted.sort_unstable();
        assert_eq!(got_sorted, want, "rank {rank}");
    }
}

#[test]
fn a_shared_index_is_read_from_the_lowest_rank_across_axes() {
    // 4x4 over a 2x2 grid: rows unstructured (coordinate 0 holds rows 0, 1, 2; coordinate 1
    // rows 2, 3, 1), columns in two blocks. Rank (i, j) = 2i + j holds 100 * rank + 10 * row +
    // column, so each element read names its rank: rows 1 and 2 come from coordinate 0.
    let rows: [Vec<usize>; 2] = [vec![0, 1, 2], vec![2, 3, 1]];
    let results = on_four(|comm| {
        let r = comm.rank();
        let (i, j) = (r / 2, r % 2);
        let cols: Vec<usize> = (2 * j..2 * j + 2).collect();
        let values = ndarray::Array2::from_shape_fn((3, 2), |(k, l)| {
            (100 * r + 10 * rows[i][k] + cols[l]) as f64
        });
        let dims = [
            DimData::new(4, Distribution::unstructured(rows[i].clone())).on_grid(2, i),
            DimData::new(4, Distribution::block(2 * j, 2 * j + 2).unwrap()).on_grid(2, j),
        ];
        let pa = import_spmd(comm, &Tensor::from(values), &dims)?;
        let t = crate::spmd::assemble(comm, &pa, None, None, false)?;
        t.unwrap().to_array::<f64>()
    });
    let expected = ndarray::Array2::from_shape_fn((4, 4), |(row, col)| {
        let i = usize::from(row == 3);
        (100 * (2 * i + col / 2) + 10 * row + col) as f64
    })
    .into_dyn();
    for r in results {
        assert_eq!(r.unwrap(), expected);
    }
}

#[test]
fn shared_indices_that_break_the_protocol_fail_every_rank() {
    let expect_all = |results: Vec<Result<PartitionedArray>>, found: &str| {
        failed_everywhere(results, &format!("dim_data[0] ('u'): {found}"))
    };
    // one_to_one true: an index two processes hold names both.
    expect_all(
        on_four(|comm| shared_axis(comm, true).map(|(_, pa)| pa)),
        "global index 1 is held by the processes at proc_grid_rank 0 and 3 along it, and \
         one_to_one is True",
    );
    // An index no process holds.
    expect_all(
        on_four(|comm| {
            let r = comm.rank();
            let held: Vec<usize> = if r == 1 { vec![] } else { vec![r] };
            let buffer = Tensor::from(ndarray::Array1::from(vec![1.0f64; held.len()]));
            let d = DimData::new(5, Distribution::unstructured(held)).on_grid(4, r);
            import_spmd(comm, &buffer, &[d])
        }),
        "global indices 1..2 are held by no process",
    );
    // one_to_one speaks for the whole axis.
    expect_all(
        on_four(|comm| {
            let r = comm.rank();
            let buffer = Tensor::from(ndarray::Array1::from(vec![1.0f64]));
            let d = DimData::new(
                4,
                Distribution::Unstructured {
                    indices: vec![r],
                    one_to_one: r != 2,
                },
            )
            .on_grid(4, r);
            import_spmd(comm, &buffer, &[d])
        }),
        "one_to_one is True at proc_grid_rank 0 but False at proc_grid_rank 2: it speaks for \
         the whole axis",
    );
    // The processes at one coordinate (along the other axis) must give the same indices.
    expect_all(
        on_four(|comm| {
            let r = comm.rank();
            let (i, j) = (r / 2, r % 2);
            let rows = if r == 1 {
                vec![1, 0]
            } else {
                vec![2 * i, 2 * i + 1]
            };
            let buffer = Tensor::from(ndarray::Array2::from_elem((2, 1), 1.0f64));
            let dims = [
                DimData::new(4, Distribution::unstructured(rows)).on_grid(2, i),
                DimData::new(2, Distribution::block(j, j + 1).unwrap()).on_grid(2, j),
            ];
            import_spmd(comm, &buffer, &dims)
        }),
        "ranks 0 and 1, both at proc_grid_rank 0 along it, give different 'indices' or \
         'one_to_one'",
    );
    // Every rank reads the axis as unstructured, or none does.
    failed_everywhere(
        on_four(|comm| {
            let r = comm.rank();
            let buffer = Tensor::from(ndarray::Array1::from(vec![1.0f64]));
            let d = match r {
                2 => DimData::new(4, Distribution::block(2, 3).unwrap()),
                _ => DimData::new(4, Distribution::unstructured(vec![r])),
            };
            import_spmd(comm, &buffer, &[d.on_grid(4, r)])
        }),
        "dim_data[0]: dist_type is 'u' at proc_grid_rank 0 (rank 0) but 'b' at proc_grid_rank 2 \
         (rank 2): an axis has one dist_type on every process",
    );
}

#[test]
fn ranks_reading_different_process_grids_fail_together() {
    // Rank 3 reads a grid of (4, 1), the others (2, 2): each is consistent with its own rank.
    let results = on_four(|comm| {
        let r = comm.rank();
        let (grid, coords) = if r == 3 {
            ([4, 1], [3, 0])
        } else {
            ([2, 2], [r / 2, r % 2])
        };
        let dims: Vec<DimData> = (0..2)
            .map(|a| DimData::undistributed(1).on_grid(grid[a], coords[a]))
            .collect();
        let buffer = Tensor::from(ndarray::Array2::from_elem((1, 1), 1.0f64));
        import_spmd(comm, &buffer, &dims)
    });
    for r in results {
        let e = r.unwrap_err();
        assert_eq!(e.kind(), "ProtocolError");
        assert_eq!(
            e.to_string(),
            "__distarray__: rank 0 reads a process grid of (2, 2), rank 3 (4, 1): every \
             process reads the same"
        );
    }
}

#[test]
fn a_block_start_beyond_isize_max_is_refused_as_given() {
    let start = (1usize << 63) + 1;
    let e = Distribution::block(start, start).unwrap_err();
    assert_eq!(e.kind(), "ProtocolError");
    assert_eq!(
        e.to_string(),
        "__distarray__: block start 9223372036854775809 (stop 9223372036854775809) is beyond \
         isize::MAX = 9223372036854775807, the largest start a block holds"
    );
    // The largest start a block holds is kept as given.
    let last = Distribution::block(isize::MAX as usize, usize::MAX).unwrap();
    let expected = Distribution::Block {
        start: isize::MAX,
        stop: usize::MAX,
        padding: [0, 0],
        periodic: false,
    };
    assert_eq!(last, expected);
}

/// Every rank's partitions of `pa` as sorted `(global start, length)` pairs of a 1-d array.
fn boxes_1d(pa: &PartitionedArray) -> Vec<(usize, usize)> {
    let mut out: Vec<(usize, usize)> = pa
        .locals()
        .unwrap()
        .iter()
        .map(|p| {
            let part = pa.at(p).unwrap();
            (part.start[0], part.shape[0])
        })
        .collect();
    out.sort_unstable();
    out
}

/// A communicator that records the bytes this rank puts into each all-gather.
struct Counting<'a> {
    inner: &'a dyn Communicator,
    gathered: std::sync::Mutex<Vec<usize>>,
}

impl Communicator for Counting<'_> {
    fn rank(&self) -> usize {
        self.inner.rank()
    }

    fn size(&self) -> usize {
        self.inner.size()
    }

    fn all_gather(&self, bytes: &[u8]) -> Result<Vec<Vec<u8>>> {
        self.gathered.lock().unwrap().push(bytes.len());
        self.inner.all_gather(bytes)
    }

    fn all_to_all_v(
        &self,
        send: &[u8],
        recv: &mut [u8],
        segments: &crate::spmd::Segments<'_>,
    ) -> Result<()> {
        self.inner.all_to_all_v(send, recv, segments)
    }
}

#[test]
fn long_index_lists_cost_metadata_by_their_runs() {
    // 4 ranks, each listing 1.5 * N consecutive indices from r * N on (the last cut at the
    // axis's end), in order: one run each, overlapping the next rank's. What the ranks
    // all-gather stays a few hundred bytes, where the indices are megabytes.
    const N: usize = 1 << 18;
    let size = 4 * N;
    let results = on_four(|comm| {
        let counting = Counting {
            inner: comm,
            gathered: Default::default(),
        };
        let r = comm.rank();
        let indices: Vec<usize> = (r * N..(r * N + 3 * N / 2).min(size)).collect();
        let buffer = Tensor::zeros(&[indices.len()], crate::DType::UInt8)?;
        let d = DimData::new(size, Distribution::unstructured(indices)).on_grid(4, r);
        let clock = std::time::Instant::now();
        let pa = import_spmd(&counting, &buffer, &[d])?;
        let took = clock.elapsed();
        let gathered = counting.gathered.into_inner().unwrap();
        Ok((boxes_1d(&pa), gathered, took))
    });
    for (r, result) in results.into_iter().enumerate() {
        let (boxes, gathered, took) = result.unwrap();
        eprintln!(
            "rank {r}: import_spmd of {} indices took {took:?}",
            3 * N / 2
        );
        // Each index from the lowest rank holding it: rank r reads from r * N + N / 2 on
        // (rank 0 from 0), up to where rank r + 1's own begin.
        let lo = if r == 0 { 0 } else { r * N + N / 2 };
        let hi = (r * N + 3 * N / 2).min(size);
        assert_eq!(boxes, [(lo, hi - lo)], "rank {r}");
        let most = gathered.iter().max().copied().unwrap_or(0);
        assert!(
            most < 512,
            "rank {r} put {gathered:?} bytes into its all-gathers"
        );
    }
}

/// Each index's holders among `lists` (coordinates, ascending), by brute force over every
/// index: `import_spmd` must read it from the lowest.
fn holders(size: usize, lists: &[Vec<usize>]) -> Vec<Vec<usize>> {
    let mut held = vec![Vec::new(); size];
    for (c, list) in lists.iter().enumerate() {
        for &g in list {
            held[g].push(c);
        }
    }
    held
}

/// Runs of consecutive buffer positions holding consecutive indices, of the positions `keep`
/// takes, by brute force: `(global start, length)`.
fn kept_runs(list: &[usize], keep: impl Fn(usize) -> bool) -> Vec<(usize, usize)> {
    let mut out: Vec<(usize, usize, usize)> = Vec::new();
    for (k, &g) in list.iter().enumerate() {
        if !keep(g) {
            continue;
        }
        match out.last_mut() {
            Some((start, local, len)) if *local + *len == k && *start + *len == g => *len += 1,
            _ => out.push((g, k, 1)),
        }
    }
    let mut runs: Vec<(usize, usize)> = out.into_iter().map(|(g, _, n)| (g, n)).collect();
    runs.sort_unstable();
    runs
}

#[test]
fn runs_shared_by_ranks_are_read_from_the_lowest_against_each_index() {
    // Random lists of long runs over 4 ranks, overlapping each other, in random buffer order,
    // sometimes leaving indices out: what each rank reads (or the error every rank returns)
    // against each index's holders found one by one.
    for seed in 1..80u64 {
        let mut rng = Rng(seed * 0x9e37_79b9 + 7);
        let size = 1 + rng.below(60);
        let one_to_one = rng.below(3) == 0;
        let lists: Vec<Vec<usize>> = (0..4)
            .map(|_| {
                let mut mine = vec![false; size];
                for _ in 0..rng.below(4) {
                    let start = rng.below(size);
                    let len = 1 + rng.below(size - start);
                    mine[start..start + len].iter_mut().for_each(|m| *m = true);
                }
                // The runs of the list in a random order, some of them reversed.
                let mut runs: Vec<Vec<usize>> = Vec::new();
                for g in (0..size).filter(|&g| mine[g]) {
                    match runs.last_mut() {
                        Some(run) if *run.last().unwrap() + 1 == g => run.push(g),
                        _ => runs.push(vec![g]),
                    }
                }
                for i in (1..runs.len()).rev() {
                    runs.swap(i, rng.below(i + 1));
                }
                for run in &mut runs {
                    if rng.below(4) == 0 {
                        run.reverse();
                    }
                }
                runs.concat()
            })
            .collect();
        let held = holders(size, &lists);
        let fault = (0..size).find(|&g| held[g].is_empty() || one_to_one && held[g].len() > 1);
        let expected: std::result::Result<Vec<Vec<(usize, usize)>>, String> = match fault {
            Some(g) if held[g].is_empty() => {
                let next = (g..size).find(|&h| !held[h].is_empty()).unwrap_or(size);
                Err(format!("global indices {g}..{next} are held by no process"))
            }
            Some(g) => {
                let coords: Vec<String> = held[g].iter().map(ToString::to_string).collect();
                let (last, head) = coords.split_last().unwrap();
                Err(format!(
                    "global index {g} is held by the processes at proc_grid_rank {} and {last} \
                     along it, and one_to_one is True",
                    head.join(", ")
                ))
            }
            None => Ok((0..4)
                .map(|c| kept_runs(&lists[c], |g| held[g][0] == c))
                .collect()),
        };
        let results = on_four(|comm| {
            let r = comm.rank();
            let values: Vec<f64> = lists[r].iter().map(|&g| (1000 * r + g) as f64).collect();
            let buffer = Tensor::from(ndarray::Array1::from(values));
            let d = DimData::new(
                size,
                Distribution::Unstructured {
                    indices: lists[r].clone(),
                    one_to_one,
                },
            )
            .on_grid(4, r);
            let pa = import_spmd(comm, &buffer, &[d])?;
            let t = crate::spmd::assemble(comm, &pa, None, None, false)?;
            Ok((boxes_1d(&pa), t.unwrap().to_array::<f64>()?))
        });
        for (r, result) in results.into_iter().enumerate() {
            match (&expected, result) {
                (Ok(boxes), Ok((got, t))) => {
                    assert_eq!(got, boxes[r], "seed {seed} rank {r}");
                    let want: Vec<f64> =
                        (0..size).map(|g| (1000 * held[g][0] + g) as f64).collect();
                    assert_eq!(t.as_slice().unwrap(), want, "seed {seed} rank {r}");
                }
                (Err(found), Err(e)) => assert_eq!(
                    e.to_string(),
                    format!("__distarray__ dim_data[0] ('u'): {found}"),
                    "seed {seed} rank {r}"
                ),
                (want, got) => panic!(
                    "seed {seed} rank {r}: expected {want:?}, got {:?}",
                    got.map(|g| g.0)
                ),
            }
        }
    }
}

#[test]
fn an_index_twice_in_one_list_is_named_with_its_first_two_positions() {
    // Random lists of runs with repeats, against the smallest repeated index and its first two
    // positions found one by one.
    for seed in 1..200u64 {
        let mut rng = Rng(seed * 0x2545_f491 + 3);
        let size = 2 + rng.below(30);
        let mut list: Vec<usize> = Vec::new();
        for _ in 0..1 + rng.below(5) {
            let start = rng.below(size);
            let len = 1 + rng.below((size - start).min(8));
            list.extend(start..start + len);
        }
        let mut positions = vec![Vec::new(); size];
        for (k, &g) in list.iter().enumerate() {
            positions[g].push(k);
        }
        let twice = (0..size).find(|&g| positions[g].len() > 1);
        let d = DimData::new(size, Distribution::unstructured(list.clone()));
        match (twice, d.runs(0, list.len())) {
            (None, Ok(runs)) => assert_eq!(runs.iter().map(|r| r.len).sum::<usize>(), list.len()),
            (Some(g), Err(e)) => assert_eq!(
                e.to_string(),
                format!(
                    "__distarray__ dim_data[0] ('u'): global index {g} is at positions {} and {} \
                     of this process's 'indices' (the protocol has them locally unique)",
                    positions[g][0], positions[g][1]
                ),
                "seed {seed}: {list:?}"
            ),
            (want, got) => panic!("seed {seed}: {list:?}: expected {want:?}, got {got:?}"),
        }
    }
}

#[test]
fn wrap_around_padding_on_one_process_is_at_most_what_it_owns() {
    // 2 indices, with 3 of padding at an end that wraps around: wider than the 2 indices its
    // neighbour (this process) owns. As wide as them is fine.
    let bad = [
        (
            periodic(2, -3, 5, [3, 3]),
            8,
            "start -3, stop 5, padding (3, 3): the communication padding of 3 at the low end",
        ),
        (
            periodic(2, 0, 5, [0, 3]),
            5,
            "start 0, stop 5, padding (0, 3): the communication padding of 3 at the high end",
        ),
    ];
    for (d, extent, found) in bad {
        let e = d.runs(0, extent).unwrap_err();
        assert_eq!(e.kind(), "ProtocolError");
        assert_eq!(
            e.to_string(),
            format!(
                "__distarray__ dim_data[0] ('b'): {found} (the wrap-around neighbour's indices) \
                 is wider than the 2 indices its neighbour owns (this process, the only one \
                 along the axis; the protocol has it at most that)"
            )
        );
    }
    let run = Run {
        global: 0,
        local: 2,
        len: 2,
    };
    assert_eq!(periodic(2, -2, 4, [2, 2]).runs(0, 6).unwrap(), [run]);
}

#[test]
fn padding_wider_than_the_neighbours_share_fails_every_rank() {
    // 8 indices, two per rank, periodic with a halo of one that wraps around; rank 0's halo
    // is 3 wide, its neighbours own 2.
    failed_everywhere(
        on_four(|comm| {
            let r = comm.rank();
            let d = match r {
                0 => periodic(8, -3, 5, [3, 3]),
                _ => periodic(8, 2 * r as isize - 1, 2 * r + 3, [1, 1]),
            };
            let buffer = Tensor::zeros(&[if r == 0 { 8 } else { 4 }], crate::DType::Float64)?;
            import_spmd(comm, &buffer, &[d.on_grid(4, r)])
        }),
        "dim_data[0] ('b'): rank 0 (proc_grid_rank 0 along it) has padding (3, 3): the \
         communication padding of 3 at its low end is wider than the 2 indices its neighbour \
         owns, rank 3 at proc_grid_rank 3 (the protocol has it at most that)",
    );
    // Irregular blocks [0, 3), [3, 4), [4, 6), [6, 8): rank 2's padding reaches past rank 1,
    // which owns 1 index, into rank 0's.
    failed_everywhere(
        on_four(|comm| {
            let r = comm.rank();
            let points = [0, 3, 4, 6, 8];
            let (start, padding) = if r == 2 {
                (2, [2, 0])
            } else {
                (points[r], [0, 0])
            };
            let d = DimData::new(
                8,
                Distribution::Block {
                    start: start as isize,
                    stop: points[r + 1],
                    padding,
                    periodic: false,
                },
            );
            let buffer = Tensor::zeros(&[points[r + 1] - start], crate::DType::Float64)?;
            import_spmd(comm, &buffer, &[d.on_grid(4, r)])
        }),
        "dim_data[0] ('b'): rank 2 (proc_grid_rank 2 along it) has padding (2, 0): the \
         communication padding of 2 at its low end is wider than the 1 index its neighbour \
         owns, rank 1 at proc_grid_rank 1 (the protocol has it at most that)",
    );
    // A 2x2 grid, periodic rows [0, 5) and [5, 6): the first's halo of 2 wraps around to the
    // second, which owns 1. The neighbour of rank 0 along the rows is rank 2.
    failed_everywhere(
        on_four(|comm| {
            let r = comm.rank();
            let (i, j) = (r / 2, r % 2);
            let (start, stop, padding) = if i == 0 {
                (-2, 5, [2, 0])
            } else {
                (5, 6, [0, 0])
            };
            let rows = periodic(6, start, stop, padding);
            let dims = [
                rows.on_grid(2, i),
                DimData::new(2, Distribution::block(j, j + 1).unwrap()).on_grid(2, j),
            ];
            let buffer = Tensor::zeros(
                &[(stop as isize - start) as usize, 1],
                crate::DType::Float64,
            )?;
            import_spmd(comm, &buffer, &dims)
        }),
        "dim_data[0] ('b'): rank 0 (proc_grid_rank 0 along it) has padding (2, 0): the \
         communication padding of 2 at its low end is wider than the 1 index its neighbour \
         owns, rank 2 at proc_grid_rank 1 (the protocol has it at most that)",
    );
    // periodic speaks for the whole axis.
    failed_everywhere(
        on_four(|comm| {
            let r = comm.rank();
            let d = DimData::new(
                8,
                Distribution::Block {
                    start: 2 * r as isize,
                    stop: 2 * r + 2,
                    padding: [0, 0],
                    periodic: r == 2,
                },
            );
            let buffer = Tensor::zeros(&[2], crate::DType::Float64)?;
            import_spmd(comm, &buffer, &[d.on_grid(4, r)])
        }),
        "dim_data[0] ('b'): periodic is False at proc_grid_rank 0 (rank 0) but True at \
         proc_grid_rank 2 (rank 2): it speaks for the whole axis",
    );
}

#[test]
fn ranks_giving_an_axis_different_dist_types_fail_together() {
    // 8 indices, two per rank: blocks on ranks 0, 1 and 3, cyclic blocks of 2 on rank 2, which
    // deal it the same indices 4 and 5. Numbers that agree are no distribution: refused.
    let a = global(&[8]);
    let mixed = |comm: &dyn Communicator, cyclic_at: usize| {
        let r = comm.rank();
        let buffer = buffer_of(&a, &[vec![2 * r, 2 * r + 1]]);
        let distribution = if r == cyclic_at {
            Distribution::Cyclic {
                start: 2 * r,
                block_size: 2,
            }
        } else {
            Distribution::block(2 * r, 2 * r + 2).unwrap()
        };
        let pa = import_spmd(
            comm,
            &buffer,
            &[DimData::new(8, distribution).on_grid(4, r)],
        )?;
        crate::spmd::assemble(comm, &pa, None, None, false).map(|_| pa)
    };
    failed_everywhere(
        on_four(|comm| mixed(comm, 2)),
        "dim_data[0]: dist_type is 'b' at proc_grid_rank 0 (rank 0) but 'c' at proc_grid_rank 2 \
         (rank 2): an axis has one dist_type on every process",
    );
    // Along the second axis of a 2x2 grid, rank 0 itself the odd one out.
    failed_everywhere(
        on_four(|comm| {
            let r = comm.rank();
            let (i, j) = (r / 2, r % 2);
            let columns = if r == 0 {
                Distribution::Cyclic {
                    start: 0,
                    block_size: 1,
                }
            } else {
                Distribution::block(j, j + 1).unwrap()
            };
            let dims = [
                DimData::new(2, Distribution::block(i, i + 1).unwrap()).on_grid(2, i),
                DimData::new(2, columns).on_grid(2, j),
            ];
            let buffer = Tensor::zeros(&[1, 1], crate::DType::Float64)?;
            import_spmd(comm, &buffer, &dims)
        }),
        "dim_data[1]: dist_type is 'c' at proc_grid_rank 0 (rank 0) but 'b' at proc_grid_rank 1 \
         (rank 1): an axis has one dist_type on every process",
    );
    // One dist_type everywhere: read.
    let cyclic = ThreadComm::run(4, |comm| {
        let r = comm.rank();
        let buffer = buffer_of(&a, &[vec![2 * r, 2 * r + 1]]);
        let d = DimData::new(
            8,
            Distribution::Cyclic {
                start: 2 * r,
                block_size: 2,
            },
        );
        let pa = import_spmd(comm, &buffer, &[d.on_grid(4, r)])?;
        crate::spmd::assemble(comm, &pa, None, None, false)
    });
    for r in cyclic {
        assert_eq!(r.unwrap().unwrap().to_array::<f64>().unwrap(), a);
    }
}

/// The dictionary of a block `[lo, hi)` of 8 (padding included) over 4 processes, at
/// coordinate `coord`, with `padding`.
fn padded(lo: isize, hi: usize, padding: [usize; 2], periodic: bool, coord: usize) -> DimData {
    let block = Distribution::Block {
        start: lo,
        stop: hi,
        padding,
        periodic,
    };
    DimData::new(8, block).on_grid(4, coord)
}

/// On 4 ranks, rank `r` holding two of 8 indices, `2r..2r+2`, and the padding `pads[r]` on
/// either side (wrapping around on a periodic axis, else boundary padding at the ends): what
/// every rank reads, assembled.
fn halo(pads: [[usize; 2]; 4], periodic: bool) -> Vec<Result<ArrayD<f64>>> {
    let a = global(&[8]);
    ThreadComm::run(4, |comm| {
        let r = comm.rank();
        let [left, right] = pads[r];
        // At the ends of an axis that is not periodic, the padding is inside the array.
        let left_in = if periodic || r > 0 { left } else { 0 };
        let right_in = if periodic || r < 3 { right } else { 0 };
        let lo = (2 * r) as isize - left_in as isize;
        let hi = 2 * r + 2 + right_in;
        let held: Vec<usize> = (lo..hi as isize)
            .map(|g| g.rem_euclid(8) as usize)
            .collect();
        let d = padded(lo, hi, pads[r], periodic, r);
        let pa = import_spmd(comm, &buffer_of(&a, &[held]), &[d])?;
        crate::spmd::assemble(comm, &pa, None, None, false)
            .map(|t| t.unwrap().to_array::<f64>().unwrap())
    })
}

#[test]
fn padding_unequal_to_its_neighbours_across_a_boundary_fails_every_rank() {
    let a = global(&[8]);
    // Halos of equal widths on both sides of each boundary: read as the array.
    for (pads, periodic) in [
        ([[2, 1], [1, 2], [2, 0], [0, 2]], true),
        ([[0, 1], [1, 2], [2, 0], [0, 0]], false),
    ] {
        for r in halo(pads, periodic) {
            assert_eq!(r.unwrap(), a, "{pads:?}");
        }
    }
    // Boundary padding at the ends of an axis that is not periodic: each end its own width
    // (the first 2 indices and the last one are boundary padding, part of the array).
    let a_boundary = global(&[8]);
    let results = ThreadComm::run(4, |comm| {
        let r = comm.rank();
        let (lo, hi, pads) = match r {
            0 => (0, 2, [2, 0]),
            3 => (6, 8, [0, 1]),
            _ => (2 * r, 2 * r + 2, [0, 0]),
        };
        let d = padded(lo as isize, hi, pads, false, r);
        let held: Vec<usize> = (lo..hi).collect();
        let pa = import_spmd(comm, &buffer_of(&a_boundary, &[held]), &[d])?;
        crate::spmd::assemble(comm, &pa, None, None, false)
    });
    for r in results {
        assert_eq!(r.unwrap().unwrap().to_array::<f64>().unwrap(), a_boundary);
    }
    // Between ranks 1 and 2: 2 wide on rank 1's side, 1 on rank 2's (each at most what the
    // other owns).
    let found = "dim_data[0] ('b'): rank 1 (proc_grid_rank 1 along it) has padding (1, 2) and \
                 its neighbour, rank 2 at proc_grid_rank 2, has padding (1, 0): the \
                 communication padding between them is 2 wide at the high end of rank 1 and 1 \
                 at the low end of rank 2 (the protocol has the two equal)";
    for periodic in [false, true] {
        let pads = [[0, 1], [1, 2], [1, 0], [0, 0]];
        failed_everywhere(halo(pads, periodic), found);
    }
    // Across the wrap-around of a periodic axis: rank 3's high end against rank 0's low end.
    let found = "dim_data[0] ('b'): rank 3 (proc_grid_rank 3 along it) has padding (1, 1) and \
                 its neighbour across the wrap-around of the periodic axis, rank 0 at \
                 proc_grid_rank 0, has padding (2, 1): the communication padding between them \
                 is 1 wide at the high end of rank 3 and 2 at the low end of rank 0 (the \
                 protocol has the two equal)";
    failed_everywhere(halo([[2, 1], [1, 1], [1, 1], [1, 1]], true), found);
    // An end of a periodic axis counted in size (start 0) is part of the array, as boundary
    // padding is, and as wide as it likes: rank 0's low padding of 1 (index 0, inside the
    // array) against rank 3's high end of 0 is read, every index once.
    let a = global(&[8]);
    for r in on_four(|comm| {
        let r = comm.rank();
        let pads = if r == 0 { [1, 0] } else { [0, 0] };
        let d = padded((2 * r) as isize, 2 * r + 2, pads, true, r);
        let held: Vec<usize> = (2 * r..2 * r + 2).collect();
        let pa = import_spmd(comm, &buffer_of(&a, &[held]), &[d])?;
        crate::spmd::assemble(comm, &pa, None, None, false)
            .map(|t| t.unwrap().to_array::<f64>().unwrap())
    }) {
        assert_eq!(r.unwrap(), a);
    }
    // A 2x2 grid: rows [0, 3) and [3, 6) with a halo of 1 between them in the first column,
    // and on one side only in the second; the neighbour of rank 1 along the rows is rank 3.
    failed_everywhere(
        on_four(|comm| {
            let r = comm.rank();
            let (i, j) = (r / 2, r % 2);
            let (start, stop, padding) = match (i, j) {
                (0, _) => (0, 4, [0, 1]),
                (1, 0) => (2, 6, [1, 0]),
                _ => (3, 6, [0, 0]),
            };
            let rows = DimData::new(
                6,
                Distribution::Block {
                    start,
                    stop,
                    padding,
                    periodic: false,
                },
            );
            let dims = [
                rows.on_grid(2, i),
                DimData::new(2, Distribution::block(j, j + 1).unwrap()).on_grid(2, j),
            ];
            let buffer = Tensor::zeros(
                &[(stop as isize - start) as usize, 1],
                crate::DType::Float64,
            )?;
            import_spmd(comm, &buffer, &dims)
        }),
        "dim_data[0] ('b'): rank 1 (proc_grid_rank 0 along it) has padding (0, 1) and its \
         neighbour, rank 3 at proc_grid_rank 1, has padding (0, 0): the communication padding \
         between them is 1 wide at the high end of rank 1 and 0 at the low end of rank 3 (the \
         protocol has the two equal)",
    );
}

#[test]
fn the_ends_of_a_periodic_axis_on_one_process_are_as_wide_as_each_other() {
    // 10 indices with a halo that wraps around, 2 wide at the low end and 1 at the high end:
    // the two ends face each other across the wrap-around. So do a wrapping end and one 0 wide.
    let bad = [
        (
            periodic(10, -2, 11, [2, 1]),
            13,
            "start -2, stop 11, padding (2, 1)",
            1,
            2,
        ),
        (
            periodic(11, -1, 11, [1, 0]),
            12,
            "start -1, stop 11, padding (1, 0)",
            0,
            1,
        ),
    ];
    for (d, extent, given, high, low) in bad {
        let e = d.runs(0, extent).unwrap_err();
        assert_eq!(e.kind(), "ProtocolError");
        assert_eq!(
            e.to_string(),
            format!(
                "__distarray__ dim_data[0] ('b'): {given} on a periodic axis: the communication \
                 padding across the wrap-around is {high} wide at the high end of \
                 proc_grid_rank 0 and {low} at the low end of its neighbour, proc_grid_rank 0 \
                 (this process, the only one along the axis; the protocol has the two equal)"
            )
        );
        let b = Tensor::zeros(&[extent], crate::DType::Float64).unwrap();
        assert_eq!(import(&b, &[d]).unwrap_err().to_string(), e.to_string());
    }
    // The same numbers counted in size (start 0, stop size): part of the array, as boundary
    // padding is, each end as wide as it likes.
    let a = global(&[13]);
    let b = buffer_of(&a, &[(0..13).collect()]);
    assert_eq!(
        whole(&import(&b, &[periodic(13, 0, 13, [2, 1])]).unwrap()),
        a
    );
    // One end counted in size (2 wide) and one wrapping around (1 wide): read, the wrapping
    // ghost (index 0 again) left out.
    let a = global(&[12]);
    let ring: Vec<usize> = (0..12).chain([0]).collect();
    let pa = import(&buffer_of(&a, &[ring]), &[periodic(12, 0, 13, [2, 1])]).unwrap();
    assert_eq!(whole(&pa), a);
    // Not periodic: the ends are boundary padding, each its own width, part of the array.
    let a = global(&[13]);
    let b = buffer_of(&a, &[(0..13).collect()]);
    let plain = DimData::new(
        13,
        Distribution::Block {
            start: 0,
            stop: 13,
            padding: [2, 1],
            periodic: false,
        },
    );
    assert_eq!(whole(&import(&b, &[plain]).unwrap()), a);
    // Equal ends, one wrapping and one counted in size: read (the low ghost left out).
    let ring: Vec<usize> = [10].into_iter().chain(0..11).collect();
    let a = global(&[11]);
    let pa = import(&buffer_of(&a, &[ring]), &[periodic(11, -1, 11, [1, 1])]).unwrap();
    assert_eq!(whole(&pa), a);
}

/// On 4 ranks, a 2 x 8 array over a 2 x 2 grid, cyclic blocks along the columns: rank `r`
/// (row `r / 2`, column coordinate `r % 2`) deals its columns from `start(r)` in blocks of
/// `block_size(r)`, its buffer holding exactly the columns its dictionary names. What every
/// rank reads, assembled.
fn cyclic_columns(
    start: impl Fn(usize) -> usize + Sync,
    block_size: impl Fn(usize) -> usize + Sync,
) -> Vec<Result<ArrayD<f64>>> {
    let a = global(&[2, 8]);
    ThreadComm::run(4, |comm| {
        let r = comm.rank();
        let (i, j) = (r / 2, r % 2);
        let (s, b) = (start(r), block_size(r));
        let columns: Vec<usize> = (s..8)
            .step_by(2 * b)
            .flat_map(|k| k..(k + b).min(8))
            .collect();
        let buffer = buffer_of(&a, &[vec![i], columns]);
        let dims = [
            DimData::new(2, Distribution::block(i, i + 1).unwrap()).on_grid(2, i),
            DimData::new(
                8,
                Distribution::Cyclic {
                    start: s,
                    block_size: b,
                },
            )
            .on_grid(2, j),
        ];
        let pa = import_spmd(comm, &buffer, &dims)?;
        let whole = crate::spmd::assemble(comm, &pa, None, None, false)?;
        Ok(whole.map_or_else(|| a.clone(), |t| t.to_array::<f64>().unwrap()))
    })
}

#[test]
fn ranks_at_one_cyclic_coordinate_give_the_same_start_and_block_size() {
    // The dealt columns, as every rank at a coordinate gives them alike: read.
    let a = global(&[2, 8]);
    for b in [1, 2, 3] {
        for r in cyclic_columns(|r| (r % 2) * b, |_| b) {
            assert_eq!(r.unwrap(), a, "block_size {b}");
        }
    }
    // Row 1 deals its columns the other way round (start 1 at coordinate 0, 0 at coordinate
    // 1): every element is still held once, but the dictionaries at one proc_grid_rank differ.
    failed_everywhere(
        cyclic_columns(|r| if r / 2 == 1 { 1 - r % 2 } else { r % 2 }, |_| 1),
        "dim_data[1] ('c'): ranks 0 and 2, both at proc_grid_rank 0 along it, give start 0, \
         block_size 1 and start 1, block_size 1 (the protocol has the dimension dictionaries at \
         one proc_grid_rank identical)",
    );
    // Rank 3 deals blocks of 1 from 1 where rank 1, at the same coordinate, deals blocks of 2
    // from 2 (both hold 4 columns).
    failed_everywhere(
        cyclic_columns(
            |r| if r == 3 { 1 } else { (r % 2) * 2 },
            |r| if r == 3 { 1 } else { 2 },
        ),
        "dim_data[1] ('c'): ranks 1 and 3, both at proc_grid_rank 1 along it, give start 2, \
         block_size 2 and start 1, block_size 1 (the protocol has the dimension dictionaries at \
         one proc_grid_rank identical)",
    );
    // One block size per coordinate, but two along the axis.
    failed_everywhere(
        cyclic_columns(|r| [0, 1, 0, 1][r], |r| [2, 1, 2, 1][r]),
        "dim_data[1] ('c'): block_size is 2 at proc_grid_rank 0 (rank 0) but 1 at \
         proc_grid_rank 1 (rank 1): the blocks dealt round-robin along an axis are of one size",
    );
}

#[test]
fn cyclic_blocks_must_hold_every_index_once() {
    // 8 indices over 4 ranks in blocks of `b`, rank r dealing from `starts[r]`: what every
    // rank reads, assembled.
    let a = global(&[8]);
    let dealt = |starts: [usize; 4], b: usize, size: usize| {
        on_four(|comm| {
            let r = comm.rank();
            let s = starts[r];
            let held: Vec<usize> = (s..size)
                .step_by(4 * b)
                .flat_map(|k| k..(k + b).min(size))
                .collect();
            let buffer = buffer_of(&a, &[held]);
            let d = DimData::new(
                size,
                Distribution::Cyclic {
                    start: s,
                    block_size: b,
                },
            );
            let pa = import_spmd(comm, &buffer, &[d.on_grid(4, r)])?;
            crate::spmd::assemble(comm, &pa, None, None, false)
        })
    };
    // Any order of the coordinates' first blocks covers the axis once: read.
    for (starts, b) in [([0, 1, 2, 3], 1), ([3, 2, 0, 1], 1), ([2, 0, 6, 4], 2)] {
        for r in dealt(starts, b, 8) {
            assert_eq!(r.unwrap().unwrap().to_array::<f64>().unwrap(), a);
        }
    }
    // Rank 1 starts where rank 0 does: 0 and 4 held twice, 1 and 5 by no one.
    failed_everywhere(
        dealt([0, 0, 2, 3], 1, 8),
        "dim_data[0] ('c'): global index 0 is held by the processes at proc_grid_rank 0 and 1 \
         along it (start 0 and 0, block_size 1): cyclic blocks hold each index once",
    );
    // Rank 3 starts a period late: 3 is held by no one (and 7 by rank 3 alone).
    failed_everywhere(
        dealt([0, 1, 2, 7], 1, 8),
        "dim_data[0] ('c'): global indices 3..4 are held by no process (starts (0, 1, 2, 7) at \
         proc_grid_rank 0 to 3 along it, block_size 1)",
    );
    // Blocks of 2 overlapping at 3 (and leaving 6..8 out): the overlap comes first.
    failed_everywhere(
        dealt([0, 3, 2, 4], 2, 8),
        "dim_data[0] ('c'): global index 3 is held by the processes at proc_grid_rank 1 and 2 \
         along it (start 3 and 2, block_size 2): cyclic blocks hold each index once",
    );
    // An axis shorter than the period: the coordinates starting beyond it hold nothing.
    let short = global(&[3]);
    let results = on_four(|comm| {
        let r = comm.rank();
        let s = [2, 0, 5, 1][r];
        let held: Vec<usize> = (s..3).take(1).collect();
        let buffer = buffer_of(&short, &[held]);
        let d = DimData::new(
            3,
            Distribution::Cyclic {
                start: s,
                block_size: 1,
            },
        );
        let pa = import_spmd(comm, &buffer, &[d.on_grid(4, r)])?;
        crate::spmd::assemble(comm, &pa, None, None, false)
    });
    for r in results {
        assert_eq!(r.unwrap().unwrap().to_array::<f64>().unwrap(), short);
    }
}

/// On 4 ranks, a 4 x 4 array over a 2 x 2 grid, blocks along both axes: rank `r` (grid row
/// `r / 2`, column coordinate `r % 2`) gives axis 0 the block `rows(r)` (`start`, `stop`,
/// `padding`, `periodic`), its buffer holding those rows (taken modulo 4 where they wrap
/// around) and columns `2 * (r % 2)..2 * (r % 2) + 2`. What every rank reads, assembled.
fn block_rows(
    rows: impl Fn(usize) -> (isize, usize, [usize; 2], bool) + Sync,
) -> Vec<Result<ArrayD<f64>>> {
    let a = global(&[4, 4]);
    ThreadComm::run(4, |comm| {
        let r = comm.rank();
        let (i, j) = (r / 2, r % 2);
        let (start, stop, padding, periodic) = rows(r);
        let held = (start..stop as isize)
            .map(|g| g.rem_euclid(4) as usize)
            .collect();
        let buffer = buffer_of(&a, &[held, (2 * j..2 * j + 2).collect()]);
        let row = Distribution::Block {
            start,
            stop,
            padding,
            periodic,
        };
        let dims = [
            DimData::new(4, row).on_grid(2, i),
            DimData::new(4, Distribution::block(2 * j, 2 * j + 2).unwrap()).on_grid(2, j),
        ];
        let pa = import_spmd(comm, &buffer, &dims)?;
        let whole = crate::spmd::assemble(comm, &pa, None, None, false)?;
        Ok(whole.map_or_else(|| a.clone(), |t| t.to_array::<f64>().unwrap()))
    })
}

#[test]
fn ranks_at_one_block_coordinate_own_the_same_indices() {
    let a = global(&[4, 4]);
    let plain = |r: usize| [(0, 2), (0, 2), (2, 4), (2, 4)][r];
    let rows = |r: usize| {
        let (lo, hi) = plain(r);
        (lo as isize, hi, [0, 0], false)
    };
    for r in block_rows(rows) {
        assert_eq!(r.unwrap(), a);
    }
    // Boundary padding, at the ends of the grid, differs between the two columns (the
    // protocol allows it): the same rows are owned at each coordinate, so it is read.
    let bounded = |r: usize| {
        let (lo, hi) = plain(r);
        (lo as isize, hi, [[1, 0], [0, 0], [0, 2], [0, 0]][r], false)
    };
    for r in block_rows(bounded) {
        assert_eq!(r.unwrap(), a);
    }
    // A periodic axis with a halo of 1 at every boundary: the low end wraps around in column
    // 0 (start -1) and is counted in size in column 1 (start 0); the high end wraps in both.
    // Different starts at proc_grid_rank 0, but the same rows owned: read.
    let ends = |r: usize| match r {
        0 => (-1, 3, [1, 1], true),
        1 => (0, 3, [1, 1], true),
        _ => (1, 5, [1, 1], true),
    };
    for r in block_rows(ends) {
        assert_eq!(r.unwrap(), a);
    }
    // Column 1 gives its two rows' ranges the other way round: every element is still held
    // once, but the dictionaries at one proc_grid_rank differ.
    let swapped = |r: usize| {
        let (lo, hi) = plain([0, 3, 2, 1][r]);
        (lo as isize, hi, [0, 0], false)
    };
    failed_everywhere(
        block_rows(swapped),
        "dim_data[0] ('b'): ranks 0 and 1, both at proc_grid_rank 0 along it, give start 0, \
         stop 2, padding (0, 0) and start 2, stop 4, padding (0, 0), which own global indices \
         0..2 and 2..4 (the protocol has the dimension dictionaries at one proc_grid_rank \
         identical)",
    );
    // The same start and stop at proc_grid_rank 1, but in column 0 row 1 is communication
    // padding (the neighbour's, as wide as the neighbour's padding facing it): the two ranks
    // there own different rows.
    let padded = |r: usize| match r {
        0 => (0, 3, [0, 1], false),
        1 => (0, 2, [0, 0], false),
        2 => (1, 4, [1, 0], false),
        _ => (1, 4, [0, 0], false),
    };
    failed_everywhere(
        block_rows(padded),
        "dim_data[0] ('b'): ranks 2 and 3, both at proc_grid_rank 1 along it, give start 1, \
         stop 4, padding (1, 0) and start 1, stop 4, padding (0, 0), which own global indices \
         2..4 and 1..4 (the protocol has the dimension dictionaries at one proc_grid_rank \
         identical)",
    );
}

#[test]
fn blocks_must_own_every_index_once() {
    // 8 indices over 4 ranks, rank r holding the block `blocks[r]`: what every rank reads,
    // assembled.
    let a = global(&[8]);
    let dealt = |blocks: [(usize, usize); 4]| {
        on_four(|comm| {
            let r = comm.rank();
            let (lo, hi) = blocks[r];
            let buffer = buffer_of(&a, &[(lo..hi).collect()]);
            let d = DimData::new(8, Distribution::block(lo, hi)?);
            let pa = import_spmd(comm, &buffer, &[d.on_grid(4, r)])?;
            crate::spmd::assemble(comm, &pa, None, None, false)
        })
    };
    // Blocks that tile the axis, empty ones and any order included: read.
    for blocks in [
        [(0, 2), (2, 4), (4, 6), (6, 8)],
        [(0, 3), (3, 3), (3, 8), (8, 8)],
        [(2, 4), (0, 2), (6, 8), (4, 6)],
    ] {
        for r in dealt(blocks) {
            assert_eq!(r.unwrap().unwrap().to_array::<f64>().unwrap(), a);
        }
    }
    failed_everywhere(
        dealt([(0, 3), (2, 4), (4, 6), (6, 8)]),
        "dim_data[0] ('b'): global index 2 is owned by the processes at proc_grid_rank 0 and 1 \
         along it (global indices 0..3 and 2..4): blocks own each index once",
    );
    failed_everywhere(
        dealt([(0, 2), (3, 4), (4, 6), (6, 8)]),
        "dim_data[0] ('b'): global indices 2..3 are owned by no process (proc_grid_rank 0 to 3 \
         own 0..2, 3..4, 4..6, 6..8 of size 8)",
    );
    failed_everywhere(
        dealt([(0, 2), (2, 4), (4, 6), (6, 7)]),
        "dim_data[0] ('b'): global indices 7..8 are owned by no process (proc_grid_rank 0 to 3 \
         own 0..2, 2..4, 4..6, 6..7 of size 8)",
    );
}

#[test]
fn an_undistributed_axis_is_owned_whole_by_every_rank() {
    // A 4 x 4 array over a 4 x 1 grid: rank r holds row r and, along the undistributed axis
    // 1, `cols(r)` (`size`, `start`, `stop`), its buffer exactly those columns. What every
    // rank reads, assembled.
    let a = global(&[4, 4]);
    let read = |cols: &(dyn Fn(usize) -> DimData + Sync)| {
        on_four(|comm| {
            let r = comm.rank();
            let d = cols(r);
            let Distribution::Block { start, stop, .. } = d.distribution else {
                unreachable!()
            };
            let held = (start as usize..stop).collect();
            let buffer = buffer_of(&a, &[vec![r], held]);
            let rows = DimData::new(4, Distribution::block(r, r + 1)?).on_grid(4, r);
            let pa = import_spmd(comm, &buffer, &[rows, d])?;
            crate::spmd::assemble(comm, &pa, None, None, false)
        })
    };
    let part = |lo: usize, hi: usize| DimData::new(4, Distribution::block(lo, hi).unwrap());
    // The protocol's empty dictionary (the whole buffer), or one block of all 4: read.
    for r in read(&|_| DimData::undistributed(4)) {
        assert_eq!(r.unwrap().unwrap().to_array::<f64>().unwrap(), a);
    }
    for r in read(&|_| part(0, 4)) {
        assert_eq!(r.unwrap().unwrap().to_array::<f64>().unwrap(), a);
    }
    // Every rank gives columns 0..2 of 4: the one process along the axis does not own it all.
    failed_everywhere(
        read(&|_| part(0, 2)),
        "dim_data[1] ('b'): global indices 2..4 are owned by no process (proc_grid_rank 0, the \
         only process along it, owns 0..2 of size 4)",
    );
    // Rank 2 alone gives part of it.
    failed_everywhere(
        read(&|r| if r == 2 { part(0, 2) } else { part(0, 4) }),
        "dim_data[1] ('b'): ranks 0 and 2, both at proc_grid_rank 0 along it, give start 0, \
         stop 4, padding (0, 0) and start 0, stop 2, padding (0, 0), which own global indices \
         0..4 and 0..2 (the protocol has the dimension dictionaries at one proc_grid_rank \
         identical)",
    );
    // Rank 3's buffer is one column short, and its empty dictionary says an axis of 3.
    failed_everywhere(
        read(&|r| DimData::undistributed(if r == 3 { 3 } else { 4 })),
        "dim_data[1] ('b'): size 4 on rank 0, 3 on rank 3",
    );
}
