//! Target layouts: how a repartition names the grid it wants (and, for block-cyclic layouts,
//! which device owns each block).

use crate::device::Device;
use crate::error::{tuple_string, Error, Result};
use crate::grid::Grid;

use super::strides;

/// A target layout for repartitioning, resolved against a global shape by [`Layout::resolve`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Layout {
    /// `numpy.array_split` along each axis into this many parts ([`Grid::even`]).
    Tiling(Vec<usize>),
    /// Explicit split points per axis ([`Grid::from_splits`]).
    Splits(Vec<Vec<usize>>),
    /// ScaLAPACK-style block-cyclic: every axis is cut into blocks of `block[axis]` elements
    /// (the last one shorter), and block `(i, j, ...)` goes to process-grid coordinate
    /// `(i mod P0, j mod P1, ...)`, numbered in C order into `devices`. The process grid's
    /// size must equal `devices.len()`; without one, [`default_process_grid`] is used.
    BlockCyclic {
        block: Vec<usize>,
        devices: Vec<Device>,
        process_grid: Option<Vec<usize>>,
    },
}

/// The process grid used when a block-cyclic layout names none: all `n` devices along axis 0
/// for a 1-d array; for 2-d and more, a near-square `P0 x P1` over the first two axes with
/// `P0 <= P1` (`P0` the largest divisor of `n` not above its square root: 4 -> 2x2, 6 -> 2x3,
/// 8 -> 2x4, 7 -> 1x7) and 1 along the other axes; `[]` for a 0-d array.
pub fn default_process_grid(ndim: usize, n: usize) -> Vec<usize> {
    match ndim {
        0 => vec![],
        1 => vec![n],
        _ => {
            let p0 = (1..=n)
                .take_while(|p| p * p <= n)
                .filter(|p| n % p == 0)
                .last()
                .unwrap_or(1);
            let mut g = vec![1; ndim];
            g[0] = p0;
            g[1] = n / p0;
            g
        }
    }
}

impl Layout {
    /// The target grid over `shape` and, for block-cyclic layouts, the owner of every target
    /// partition (C order) as an index into `devices`. Indices rather than devices, because
    /// several ranks may each use a device called `kDLCUDA:0`.
    pub fn resolve(&self, shape: &[usize]) -> Result<(Grid, Option<Vec<usize>>)> {
        match self {
            Layout::Tiling(t) => Ok((Grid::even(shape, t)?, None)),
            Layout::Splits(s) => Ok((Grid::from_splits(shape, s.clone())?, None)),
            Layout::BlockCyclic {
                block,
                devices,
                process_grid,
            } => {
                let pg = process_grid
                    .clone()
                    .unwrap_or_else(|| default_process_grid(shape.len(), devices.len()));
                check_block_cyclic(shape, block, devices, &pg)?;
                let splits = shape
                    .iter()
                    .zip(block)
                    .map(|(&len, &b)| match len {
                        0 => vec![0, 0],
                        _ => (0..len).step_by(b).chain([len]).collect(),
                    })
                    .collect();
                let grid = Grid::from_splits(shape, splits)?;
                let pstrides = strides(&pg);
                let owners = grid
                    .positions()
                    .map(|pos| {
                        pos.iter()
                            .zip(&pg)
                            .zip(&pstrides)
                            .map(|((&i, &p), &s)| (i % p) * s)
                            .sum()
                    })
                    .collect();
                Ok((grid, Some(owners)))
            }
        }
    }
}

fn check_block_cyclic(
    shape: &[usize],
    block: &[usize],
    devices: &[Device],
    pg: &[usize],
) -> Result<()> {
    if block.len() != shape.len() || block.contains(&0) {
        return Err(Error::shape(
            format!(
                "block-cyclic blocks (each >= 1) for shape {}",
                tuple_string(shape)
            ),
            tuple_string(block),
        ));
    }
    if pg.len() != shape.len() || pg.contains(&0) || pg.iter().product::<usize>() != devices.len() {
        return Err(Error::shape(
            format!(
                "block-cyclic process grid with {} axes and {} devices in all",
                shape.len(),
                devices.len()
            ),
            tuple_string(pg),
        ));
    }
    // Count the blocks before allocating split points for them.
    let blocks: Vec<usize> = shape
        .iter()
        .zip(block)
        .map(|(&n, &b)| n.div_ceil(b).max(1))
        .collect();
    crate::grid::check_count(&blocks)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn block_cyclic_assigns_blocks_like_scalapack() {
        let devices: Vec<Device> = (0..4).map(Device::cuda).collect();
        let layout = Layout::BlockCyclic {
            block: vec![3, 2],
            devices,
            process_grid: None,
        };
        let (grid, owners) = layout.resolve(&[10, 7]).unwrap();
        assert_eq!(grid.splits(), &[vec![0, 3, 6, 9, 10], vec![0, 2, 4, 6, 7]]);
        // 2x2 process grid: owner of block (i, j) is 2 * (i % 2) + j % 2.
        #[rustfmt::skip]
        let expect = vec![
            0, 1, 0, 1,
            2, 3, 2, 3,
            0, 1, 0, 1,
            2, 3, 2, 3,
        ];
        assert_eq!(owners.unwrap(), expect);

        let layout = Layout::BlockCyclic {
            block: vec![2, 2],
            devices: vec![Device::CPU; 6],
            process_grid: Some(vec![3, 2]),
        };
        let (grid, owners) = layout.resolve(&[8, 4]).unwrap();
        assert_eq!(grid.tiling(), vec![4, 2]);
        assert_eq!(owners.unwrap(), vec![0, 1, 2, 3, 4, 5, 0, 1]);

        let layout = Layout::BlockCyclic {
            block: vec![4],
            devices: vec![Device::CPU; 3],
            process_grid: None,
        };
        let (grid, owners) = layout.resolve(&[18]).unwrap();
        assert_eq!(grid.splits()[0], vec![0, 4, 8, 12, 16, 18]);
        assert_eq!(owners.unwrap(), vec![0, 1, 2, 0, 1]);
    }

    #[test]
    fn default_process_grids_are_near_square() {
        assert_eq!(default_process_grid(1, 5), vec![5]);
        assert_eq!(default_process_grid(2, 4), vec![2, 2]);
        assert_eq!(default_process_grid(2, 6), vec![2, 3]);
        assert_eq!(default_process_grid(2, 8), vec![2, 4]);
        assert_eq!(default_process_grid(2, 7), vec![1, 7]);
        assert_eq!(default_process_grid(3, 9), vec![3, 3, 1]);
        assert_eq!(default_process_grid(0, 1), Vec::<usize>::new());
    }

    #[test]
    fn block_cyclic_refuses_mismatched_process_grids() {
        let devices = vec![Device::CPU; 4];
        let bad = |block: Vec<usize>, pg: Option<Vec<usize>>| {
            Layout::BlockCyclic {
                block,
                devices: devices.clone(),
                process_grid: pg,
            }
            .resolve(&[8, 8])
            .unwrap_err()
            .to_string()
        };
        assert!(bad(vec![2, 2], Some(vec![3, 1])).contains("(3, 1)"));
        assert!(bad(vec![2], None).contains("(2,)"));
        assert!(bad(vec![2, 0], None).contains("(2, 0)"));
        assert!(Layout::Tiling(vec![2]).resolve(&[8, 8]).is_err());
        let none = Layout::BlockCyclic {
            block: vec![2, 2],
            devices: vec![],
            process_grid: None,
        };
        assert!(none
            .resolve(&[8, 8])
            .unwrap_err()
            .to_string()
            .contains("0 devices"));
        let tiny = Layout::BlockCyclic {
            block: vec![1],
            devices: vec![Device::CPU],
            process_grid: None,
        };
        let e = tiny.resolve(&[1 << 40]).unwrap_err().to_string();
        assert!(e.contains("too many partitions"), "{e}");
        assert!(Layout::Splits(vec![vec![0, 8], vec![0, 3, 8]])
            .resolve(&[8, 8])
            .is_ok());
    }
}
