//! Partition an ndarray, repartition it, read it back: the Rust tour.
//!
//! Run with `cargo run --example quickstart`.

use dlpart::{Device, Layout, PartitionedArray, Tensor};
use ndarray::{s, Array2};

fn main() -> dlpart::Result<()> {
    let a = Array2::from_shape_fn((8, 6), |(i, j)| (10 * i + j) as f32);
    // Row blocks: zero-copy views of the array's own buffer.
    let rows = PartitionedArray::partition(&Tensor::from(a.clone()), &Layout::tiling(&[4, 1]))?;
    // Column blocks: each element copied once, on the device where it lives.
    let cols = rows.repartition(&Layout::tiling(&[1, 3]), false)?;
    for p in cols.partitions() {
        let block = p.tensor().expect("data held here").as_array::<f32>()?;
        let (start, width) = (p.start[1], p.shape[1]);
        assert_eq!(block, a.slice(s![.., start..start + width]).into_dyn());
        let device = p.device().expect("held data has a device");
        println!(
            "{:?}: columns {start}..{} on {device}",
            p.position,
            start + width
        );
    }
    // Block-cyclic over four (here: host) devices, then the whole array back in one tensor.
    let cyclic = cols.repartition(&Layout::block_cyclic(&[3, 2], vec![Device::CPU; 4]), false)?;
    let whole = cyclic.assemble(None, false)?;
    assert_eq!(whole.as_array::<f32>()?, a.into_dyn());
    println!(
        "{} block-cyclic partitions, assembled back: equal",
        cyclic.len()
    );
    Ok(())
}
