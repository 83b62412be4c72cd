//! The SPMD scatter's all-or-nothing writes.

use ndarray::{Array2, ArrayD};

use super::*;
use crate::partitioned::PartitionedArray;
use crate::tensor::Tensor;

/// Rows `4r..4r + 4` of an 8x2 array of zeros on each of the ranks of `comm` as two row
/// blocks of its own, the array over them, and a scatter's values for rows 0, 3, 4 and 7
/// (rows of every block): the blocks, the array, the values and the rows.
fn two_blocks_per_rank(comm: &dyn Communicator) -> (Vec<Tensor>, PartitionedArray, Tensor, Tensor) {
    let blocks: Vec<Tensor> = (0..2)
        .map(|_| Tensor::from(Array2::<i32>::zeros((2, 2))))
        .collect();
    let pa = from_stacked(comm, blocks.clone(), 0).unwrap();
    let values = Tensor::from(ndarray::array![[1, 1], [2, 2], [3, 3], [4, 4]]);
    let rows = Tensor::from_slice(&[0i64, 3, 4, 7], &[4]).unwrap();
    (blocks, pa, values, rows)
}

/// What the blocks hold now.
fn held(blocks: &[Tensor]) -> Vec<ArrayD<i32>> {
    blocks
        .iter()
        .map(|b| b.to_array::<i32>().unwrap())
        .collect()
}

/// numpy: `a = zeros((8, 2)); a[[0, 3, 4, 7]] = values`: block `j` of rank `rank`, rows
/// `4 * rank + 2 * j` and the next.
fn want(rank: usize, j: usize) -> ArrayD<i32> {
    let mut a = Array2::<i32>::zeros((8, 2));
    for (k, row) in [0, 3, 4, 7].into_iter().enumerate() {
        a.row_mut(row).fill(k as i32 + 1);
    }
    let r0 = 4 * rank + 2 * j;
    a.slice(ndarray::s![r0..r0 + 2, ..]).to_owned().into_dyn()
}

/// Each of 2 ranks holds rows `4r..4r + 4` of an 8x2 array as two row blocks; rank 0's second
/// block is being read (a view held, as another thread reading it would). A scatter into rows
/// of every block is refused on every rank, and no rank writes any block, not even those
/// before the one in use.
#[test]
fn scatter_refused_by_a_partition_in_use_writes_nothing_on_any_rank() {
    let out = ThreadComm::run(2, |comm| {
        let me = comm.rank();
        let (blocks, pa, values, rows) = two_blocks_per_rank(comm);
        let reader = (me == 0).then(|| blocks[1].as_array::<i32>().unwrap());
        let e = scatter(comm, &pa, &values, &rows, 0).unwrap_err();
        drop(reader);
        let refused = held(&blocks);
        // Once the reader is gone the same scatter writes every row asked.
        scatter(comm, &pa, &values, &rows, 0).unwrap();
        (e.to_string(), refused, held(&blocks))
    });
    let zeros = Array2::<i32>::zeros((2, 2)).into_dyn();
    for (rank, (e, held, after)) in out.iter().enumerate() {
        // Named: the scatter, the partition at fault (rank 0's second block, partition 1),
        // the view.
        assert!(
            e.starts_with("rank 0: scatter: cannot write its partition 1, Tensor(shape=(2, 2)")
                && e.contains("being read at the same time by as_array (its live view)"),
            "rank {rank}: {e}"
        );
        for b in held {
            assert_eq!(b, &zeros, "rank {rank}: nothing written");
        }
        for (j, b) in after.iter().enumerate() {
            assert_eq!(b, &want(rank, j), "rank {rank} block {j}");
        }
    }
}

/// Each of 2 ranks holds rows `4r..4r + 4` of an 8x2 array as two row blocks; rank 0's second
/// write fails as a device's would, after the ranks agreed. Every rank returns rank 0's
/// error, and the blocks hold what `scatter`'s docs say: rank 0's first block the new
/// values, its second the old ones, rank 1's both the new values.
#[test]
fn a_write_failing_after_the_agreement_fails_every_rank_as_documented() {
    let out = super::tests::within_a_minute(2, |comm| {
        let me = comm.rank();
        let (blocks, pa, values, rows) = two_blocks_per_rank(comm);
        if me == 0 {
            super::take::WRITES_BEFORE_FAILURE.with(|w| w.set(Some(1)));
        }
        let e = scatter(comm, &pa, &values, &rows, 0).unwrap_err();
        let failed = held(&blocks);
        // The ranks are in step: the same scatter goes through now.
        scatter(comm, &pa, &values, &rows, 0).unwrap();
        (e.kind().to_string(), e.to_string(), failed)
    });
    let zeros = Array2::<i32>::zeros((2, 2)).into_dyn();
    for (rank, (kind, e, held)) in out.iter().enumerate() {
        assert_eq!(kind, "RuntimeError", "rank {rank}");
        assert_eq!(e, &out[0].1, "rank {rank}: the same error");
        assert!(
            e.starts_with("rank 0: ") && e.contains("made to fail by the test"),
            "{e}"
        );
        for (j, b) in held.iter().enumerate() {
            let w = if (rank, j) == (0, 1) {
                zeros.clone()
            } else {
                want(rank, j)
            };
            assert_eq!(b, &w, "rank {rank} block {j}");
        }
    }
}
