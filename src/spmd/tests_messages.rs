//! Errors of the SPMD calls that name the offending value.

use super::*;
use crate::device::Device;
use crate::grid::Grid;
use crate::partitioned::{Data, Location, PartitionedArray};
use crate::tensor::Tensor;

/// A location with a negative rank names that rank, not "no rank".
#[test]
fn a_negative_rank_is_named() {
    let grid = Grid::even(&[2], &[1]).unwrap();
    let data = vec![Data::Tensor(Tensor::from_slice(&[1i32, 2], &[2]).unwrap())];
    let at = vec![vec![Location::rank(-1, Device::CPU)]];
    let pa = PartitionedArray::new(grid, data, at, None).unwrap();
    let e = owners(&pa).unwrap_err();
    assert!(matches!(e, Error::Protocol { .. }), "{e}");
    let e = e.to_string();
    assert!(
        e.contains("position (0,)") && e.contains("names rank -1, which is no rank"),
        "{e}"
    );
}
