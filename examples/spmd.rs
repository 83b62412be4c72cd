//! SPMD partitioned arrays on four ranks, each a thread of this process (`ThreadComm`); under
//! MPI the same calls run one per process through `dlpart.mpi`.
//!
//! `cargo run --example spmd`

use dlpart::spmd::{self, Communicator, ThreadComm};
use dlpart::{Device, Layout, Tensor};
use ndarray::{s, Array2, Axis};

fn main() -> Result<(), dlpart::Error> {
    let (rows, cols) = (8, 6);
    let whole = Array2::from_shape_fn((rows, cols), |(i, j)| (10 * i + j) as f32);
    let results = ThreadComm::run(4, |comm| -> Result<String, dlpart::Error> {
        let rank = comm.rank();
        // Each rank holds two rows, stacked in rank order: one collective call agrees the grid.
        let mine = whole.slice(s![2 * rank..2 * rank + 2, ..]).to_owned();
        let a = spmd::from_stacked(comm, vec![Tensor::from(mine)], 0)?;
        // Rows -> 2x2 blocks dealt block-cyclically over the ranks: one all-to-all-v.
        let layout = Layout::block_cyclic(&[4, 3], vec![Device::CPU; comm.size()]);
        let (blocks, traffic) = spmd::repartition(comm, &a, &layout, false)?;
        let back = spmd::assemble(comm, &blocks, Some(0), None, false)?;
        if let Some(t) = back {
            assert_eq!(t.as_array::<f32>()?, whole.view().into_dyn());
        }
        // numpy.take across the ranks, every rank passing the same global indices: each row
        // is served by the rank holding it, and the picks travel in one all-to-all-v.
        let picks: Vec<usize> = vec![7, 0, 4];
        let (picked, _) = spmd::gather(comm, &blocks, &picks, 0)?;
        if let Some(t) = spmd::assemble(comm, &picked, Some(0), None, false)? {
            assert_eq!(
                t.as_array::<f32>()?,
                whole.select(Axis(0), &picks).into_dyn()
            );
        }
        Ok(format!(
            "rank {rank}: holds {:?}, sent {:?} bytes, copied {} locally",
            blocks.locals().unwrap_or_default(),
            traffic.sent,
            traffic.local
        ))
    });
    for line in results {
        println!("{}", line?);
    }
    Ok(())
}
