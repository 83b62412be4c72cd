//! Partition an ndarray, repartition it, read it back: the Rust tour.
//!
//! Run with `cargo run --example quickstart`.

use dlpart::{DType, Device, Layout, PartitionedArray, Tensor};
use ndarray::{array, s, Array2, Axis};

fn main() -> dlpart::Result<()> {
    let a = Array2::from_shape_fn((8, 6), |(i, j)| (10 * i + j) as f32);
    // Row blocks: zero-copy views of the array's own buffer.
    let rows = PartitionedArray::partition(&Tensor::from(a.clone()), &Layout::tiling(&[4, 1]))?;
    // The same values written in place, block by block, through mutable views of partitions
    // (each claims only its own block, so threads could fill them side by side).
    let filled = Tensor::zeros(&[8, 6], DType::Float32)?;
    for p in PartitionedArray::partition(&filled, &Layout::tiling(&[2, 2]))?.partitions() {
        let mut block = p.tensor().expect("data held here").as_array_mut::<f32>()?;
        for (ix, v) in block.indexed_iter_mut() {
            *v = (10 * (p.start[0] + ix[0]) + p.start[1] + ix[1]) as f32;
        }
    }
    assert_eq!(filled.as_array::<f32>()?, a.view().into_dyn());
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
    // numpy.take with global indices, each served by the partition holding it; the indices
    // as whatever holds them: a slice, a Vec, an ndarray array (one integer drops the axis).
    let picked = cols.gather([5, 0], 1, false)?;
    let want = a.select(Axis(1), &[5, 0]);
    assert_eq!(
        picked.assemble(None, false)?.as_array::<f32>()?,
        want.view().into_dyn()
    );
    // Fancy assignment: columns 5 and 0 of a zeroed 2x2 grid take them back.
    let zeros = Tensor::zeros(&[8, 6], DType::Float32)?;
    let back = PartitionedArray::partition(&zeros, &Layout::tiling(&[2, 2]))?;
    back.scatter(&Tensor::from(want), array![5usize, 0], 1, false)?;
    let mut expect = Array2::<f32>::zeros((8, 6));
    for c in [5, 0] {
        expect.column_mut(c).assign(&a.column(c));
    }
    assert_eq!(
        back.assemble(None, false)?.as_array::<f32>()?,
        expect.into_dyn()
    );
    println!("gathered columns [5, 0] and scattered them back into zeros");
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
