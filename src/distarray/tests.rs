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
        DimData::new(5, Distribution::Unstructured(rows)),
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
    let twice = [DimData::new(3, Distribution::Unstructured(vec![0, 0, 1]))];
    let e = import(&b, &twice).unwrap_err();
    assert_eq!(e.kind(), "ProtocolError");
    assert_eq!(
        e.to_string(),
        "__distarray__ dim_data[0] ('u'): global index 0 is held twice"
    );
    let gap = [DimData::new(5, Distribution::Unstructured(vec![0, 1, 4]))];
    let e = import(&b, &gap).unwrap_err().to_string();
    assert!(
        e.contains("global indices 2..4 are held by no process"),
        "{e}"
    );
    let short = [DimData::new(
        4,
        Distribution::Block {
            start: 0,
            stop: 3,
            padding: [0, 0],
        },
    )];
    let e = import(&b, &short).unwrap_err().to_string();
    assert!(
        e.contains("global indices 3..4 are held by no process"),
        "{e}"
    );
    let outside = [DimData::new(3, Distribution::Unstructured(vec![0, 1, 3]))];
    let e = import(&b, &outside).unwrap_err().to_string();
    assert!(e.contains("index 3 outside [0, 3)"), "{e}");
    let grid = [DimData::new(3, Distribution::Unstructured(vec![0, 1, 2])).on_grid(2, 0)];
    let e = import(&b, &grid).unwrap_err().to_string();
    assert_eq!(e, "__distarray__: a process grid of (2,) for 1 process");
}

#[test]
fn an_empty_axis_is_one_empty_partition() {
    let b = Tensor::zeros(&[0, 3], crate::DType::Float64).unwrap();
    let dims = [
        DimData::new(0, Distribution::Unstructured(vec![])),
        DimData::new(
            3,
            Distribution::Block {
                start: 0,
                stop: 3,
                padding: [0, 0],
            },
        ),
    ];
    let pa = import(&b, &dims).unwrap();
    assert_eq!(pa.shape(), &[0, 3]);
    assert_eq!(pa.len(), 1);
}

/// Random global layouts over 4 ranks on threads: each axis blocks (with padding), cyclic
/// blocks or a dealt permutation, over a random process grid; every rank's buffer is built
/// from the global array, and the array read from all of them assembles to it.
#[test]
fn ranks_read_their_shares_into_one_array() {
    for seed in 1..40u64 {
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
    match rng.below(3) {
        0 => {
            let mut cuts: Vec<usize> = (0..procs - 1).map(|_| rng.below(n + 1)).collect();
            cuts.sort_unstable();
            let points: Vec<usize> = [vec![0], cuts, vec![n]].concat();
            (0..procs)
                .map(|c| {
                    // Communication padding: a neighbour's index on each inner side, if any.
                    let left = usize::from(c > 0 && points[c] > 0 && points[c] < points[c + 1]);
                    let right = usize::from(
                        c + 1 < procs && points[c + 1] < n && points[c] < points[c + 1],
                    );
                    let (lo, hi) = (points[c] - left, points[c + 1] + right);
                    let d = DimData::new(
                        n,
                        Distribution::Block {
                            start: lo,
                            stop: hi,
                            padding: [left, right],
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
        _ => {
            let mut order: Vec<usize> = (0..n).collect();
            for i in (1..n).rev() {
                order.swap(i, rng.below(i + 1));
            }
            let mut cuts: Vec<usize> = (0..procs - 1).map(|_| rng.below(n + 1)).collect();
            cuts.sort_unstable();
            let points: Vec<usize> = [vec![0], cuts, vec![n]].concat();
            (0..procs)
                .map(|c| {
                    let held = order[points[c]..points[c + 1]].to_vec();
                    let d = DimData::new(n, Distribution::Unstructured(held.clone()));
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
        let dims = [DimData::new(
            8,
            Distribution::Block {
                start: 2 * coord,
                stop: 2 * coord + 2,
                padding: [0, 0],
            },
        )
        .on_grid(4, coord)];
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
            Distribution::Block {
                start: 2 * j,
                stop: 2 * j + 2,
                padding: [0, 0]
            }
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
