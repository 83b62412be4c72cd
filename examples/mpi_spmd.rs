//! SPMD arrays across MPI ranks, one process each, through `MpiComm` (feature `mpi`): the Rust
//! twin of examples/mpi/spmd.py.
//!
//! `cargo build --features mpi --example mpi_spmd && mpirun -n 4 target/debug/examples/mpi_spmd`
//!
//! The code below is the block in docs/guide.md ("From Rust, over MPI"); tests/mpi.rs checks
//! that they stay the same.

use dlpart::spmd::{self, Communicator, MpiComm};
use dlpart::{Device, Layout, Tensor};
use ndarray::{s, Array2};

fn main() -> Result<(), dlpart::Error> {
    let universe = dlpart::mpi::initialize().expect("MPI is initialized once");
    let comm = MpiComm::new(&universe.world())?; // dlpart's duplicate of the world
    let (rank, size) = (comm.rank(), comm.size());
    let x = Array2::from_shape_fn((8 * size, 6), |(i, j)| (6 * i + j) as f32); // the global array
    let mine = x.slice(s![8 * rank..8 * (rank + 1), ..]).to_owned(); // this rank's rows

    // One all-gather agrees the grid; the other ranks' rows have no data here.
    let rows = spmd::from_stacked(&comm, vec![Tensor::from(mine)], 0)?;
    assert_eq!(rows.locals(), Some(&[vec![rank, 0]][..]));
    assert!(rows
        .partitions()
        .all(|p| p.tensor().is_some() == (p.position == [rank, 0])));

    let layout = Layout::block_cyclic(&[4, 3], vec![Device::CPU; size]);
    let (cyclic, traffic) = spmd::repartition(&comm, &rows, &layout, false)?; // one exchange
    assert_eq!(traffic.sent[rank], 0); // boxes that stay are never sent
    if let Some(whole) = spmd::assemble(&comm, &cyclic, Some(0), None, false)? {
        assert_eq!(whole.as_array::<f32>()?, x.view().into_dyn()); // on rank 0 only
    }

    // Ranks that disagree all fail, with the same error.
    let tiling = if rank == 0 { [1, 2] } else { [2, 1] };
    match spmd::repartition(&comm, &rows, &Layout::tiling(&tiling), false) {
        Err(e) => {
            assert!(e.to_string().contains("asked for different"), "{e}");
            let all = comm.all_gather(e.to_string().as_bytes())?;
            assert!(all.iter().all(|m| m == &all[0]));
        }
        Ok(_) => assert_eq!(size, 1),
    }

    println!(
        "ok {rank}: holds {:?}, sent {:?} bytes, copied {} locally",
        cyclic.locals().unwrap_or_default(),
        traffic.sent,
        traffic.local
    );
    Ok(())
}
