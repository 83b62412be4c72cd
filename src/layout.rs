//! Target layouts: how a repartition names the grid it wants and the device of every target
//! partition. One [`Layout`] is a [`Cut`] (tiling, split points or fixed-size blocks) and a
//! [`Placement`] (stay where the data is, one device, one device each, or dealt over a
//! process grid ScaLAPACK-style); [`Layout::target`] resolves both against a source grid.

use crate::device::Device;
use crate::error::{tuple_string, Error, Result};
use crate::grid::Grid;

use crate::plan::strides;

/// How the global shape is cut into target partitions.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Cut {
    /// `numpy.array_split` along each axis into this many parts ([`Grid::even`]).
    Tiling(Vec<usize>),
    /// Explicit split points per axis ([`Grid::from_splits`]).
    Splits(Vec<Vec<usize>>),
    /// Blocks of `block[axis]` elements along each axis, the last one shorter.
    Blocks(Vec<usize>),
}

/// Which device each target partition is allocated on.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Placement {
    /// Each target partition stays on the device of the source partition holding its first
    /// element, so that a layout change alone never moves data across devices.
    Stay,
    /// Every target partition on this device.
    On(Device),
    /// One device per target partition, in C order of positions.
    Each(Vec<Device>),
    /// ScaLAPACK-style dealing: partition `(i, j, ...)` goes to process-grid coordinate
    /// `(i mod P0, j mod P1, ...)`, numbered in C order into `devices`. The process grid's size
    /// must equal `devices.len()`; without one, [`default_process_grid`] is used. A 0-d array's
    /// one partition goes to the first device, on the empty process grid (its default).
    Dealt {
        /// The devices the partitions are dealt to.
        devices: Vec<Device>,
        /// The process grid `(P0, P1, ...)`, one entry per axis.
        process_grid: Option<Vec<usize>>,
    },
}

/// A target layout for repartitioning: a [`Cut`] and a [`Placement`].
///
/// The builder methods combine in any order: a process grid
/// ([`process_grid`](Layout::process_grid)) applies to the devices a dealt placement
/// ([`dealt`](Layout::dealt), [`block_cyclic`](Layout::block_cyclic)) names, whether it comes
/// before or after them. A process grid with a placement that deals nothing (the default
/// [`Placement::Stay`], [`on`](Layout::on) or [`devices`](Layout::devices)) is an error at
/// resolution naming both; among the placements themselves the last one given wins.
///
/// ```
/// use dlpart::{Device, Layout};
/// let rows = Layout::tiling(&[4, 1]); // 4 row blocks, each on its source's device
/// let cyclic = Layout::block_cyclic(&[32, 32], vec![Device::CPU; 4]); // 2x2 process grid
/// let here = Layout::splits(vec![vec![0, 3, 8]]).on(Device::CPU);
/// # let _ = (rows, cyclic, here);
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Layout {
    /// How the shape is cut.
    pub cut: Cut,
    /// Where the target partitions go.
    pub placement: Placement,
    /// A process grid given while the placement deals nothing: a dealt placement given later
    /// takes it, and resolution refuses it otherwise (see [`Layout::process_grid`]).
    stray_grid: Option<Vec<usize>>,
}

/// A layout resolved against a source: the target grid and every target partition's device.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Target {
    /// The target grid.
    pub grid: Grid,
    /// The device of every target partition, in C order of positions.
    pub devices: Vec<Device>,
}

/// The process grid used when a dealt placement names none: all `n` devices along axis 0
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
    /// The layout of `cut` and `placement`.
    pub fn new(cut: Cut, placement: Placement) -> Self {
        Layout {
            cut,
            placement,
            stray_grid: None,
        }
    }

    /// Each axis split evenly into `tiling[axis]` parts, like `numpy.array_split`.
    pub fn tiling(tiling: &[usize]) -> Self {
        Layout::new(Cut::Tiling(tiling.to_vec()), Placement::Stay)
    }

    /// Explicit split points per axis: `splits[axis]` runs from 0 to the axis length.
    pub fn splits(splits: Vec<Vec<usize>>) -> Self {
        Layout::new(Cut::Splits(splits), Placement::Stay)
    }

    /// ScaLAPACK-style block-cyclic: blocks of `block[axis]` elements dealt round-robin over
    /// `devices`, laid out on [`default_process_grid`] unless [`Layout::process_grid`] says
    /// otherwise.
    pub fn block_cyclic(block: &[usize], devices: Vec<Device>) -> Self {
        Layout::new(
            Cut::Blocks(block.to_vec()),
            Placement::Dealt {
                devices,
                process_grid: None,
            },
        )
    }

    /// Every target partition on `device`. A process grid given before or after makes the
    /// layout an error at resolution (a process grid deals over several devices).
    pub fn on(self, device: Device) -> Self {
        self.placed(Placement::On(device))
    }

    /// One device per target partition, in C order of positions. A process grid given before
    /// or after makes the layout an error at resolution (use [`dealt`](Layout::dealt)).
    pub fn devices(self, devices: Vec<Device>) -> Self {
        self.placed(Placement::Each(devices))
    }

    /// Target partitions dealt over `devices` on a process grid (ScaLAPACK-style): the one
    /// [`process_grid`](Layout::process_grid) gives, before or after this call, or else
    /// [`default_process_grid`].
    pub fn dealt(self, devices: Vec<Device>) -> Self {
        self.placed(Placement::Dealt {
            devices,
            process_grid: None,
        })
    }

    /// The process grid of a dealt placement ([`dealt`](Layout::dealt),
    /// [`block_cyclic`](Layout::block_cyclic)), given before or after it. Without a dealt
    /// placement (none given, or [`on`](Layout::on) or [`devices`](Layout::devices)) the
    /// layout is an error at resolution, naming the grid and the placement.
    pub fn process_grid(mut self, grid: &[usize]) -> Self {
        match &mut self.placement {
            Placement::Dealt { process_grid, .. } => *process_grid = Some(grid.to_vec()),
            _ => self.stray_grid = Some(grid.to_vec()),
        }
        self
    }

    /// `placement` in place of the current one, keeping a process grid given so far: a
    /// dealt placement takes it, another keeps it aside for resolution to refuse.
    fn placed(mut self, mut placement: Placement) -> Self {
        let given = match &mut self.placement {
            Placement::Dealt { process_grid, .. } => process_grid.take(),
            _ => None,
        }
        .or(self.stray_grid.take());
        match &mut placement {
            Placement::Dealt { process_grid, .. } => *process_grid = given,
            _ => self.stray_grid = given,
        }
        self.placement = placement;
        self
    }

    /// Refuses a process grid given with a placement that deals nothing, naming both.
    fn check_stray_grid(&self) -> Result<()> {
        let Some(grid) = &self.stray_grid else {
            return Ok(());
        };
        let placement = match &self.placement {
            Placement::Dealt { .. } => return Ok(()),
            Placement::Stay => "no devices were given (the partitions would stay where their \
                                data is)"
                .to_string(),
            Placement::On(d) => format!("the placement puts every partition on {d}"),
            Placement::Each(ds) => format!(
                "the placement names one device per partition, {} in all",
                ds.len()
            ),
        };
        Err(Error::shape(
            format!(
                "process grid {} deals the partitions over a list of devices (Layout::dealt; \
                 devices=[...] in Python)",
                tuple_string(grid)
            ),
            placement,
        ))
    }

    /// The target grid over `shape` and, for dealt placements, the owner of every target
    /// partition (C order) as an index into the dealt devices. Indices rather than devices,
    /// because several ranks may each use a device called `kDLCUDA:0`.
    pub fn resolve(&self, shape: &[usize]) -> Result<(Grid, Option<Vec<usize>>)> {
        self.check_stray_grid()?;
        let grid = match &self.cut {
            Cut::Tiling(t) => Grid::even(shape, t)?,
            Cut::Splits(s) => Grid::from_splits(shape, s.clone())?,
            Cut::Blocks(block) => {
                check_blocks(shape, block)?;
                let splits = shape
                    .iter()
                    .zip(block)
                    .map(|(&len, &b)| match len {
                        0 => vec![0, 0],
                        _ => (0..len).step_by(b).chain([len]).collect(),
                    })
                    .collect();
                Grid::from_splits(shape, splits)?
            }
        };
        crate::grid::check_room(grid.num_partitions())?;
        let owners = match &self.placement {
            Placement::Dealt {
                devices,
                process_grid,
            } => {
                if devices.is_empty() {
                    return Err(no_devices(shape, process_grid.as_deref()));
                }
                let pg = process_grid
                    .clone()
                    .unwrap_or_else(|| default_process_grid(shape.len(), devices.len()));
                check_process_grid(shape, devices, &pg)?;
                let pstrides = strides(&pg);
                Some(
                    grid.positions()
                        .map(|pos| {
                            pos.iter()
                                .zip(&pg)
                                .zip(&pstrides)
                                .map(|((&i, &p), &s)| (i % p) * s)
                                .sum()
                        })
                        .collect(),
                )
            }
            _ => None,
        };
        Ok((grid, owners))
    }

    /// The target grid and the device of every target partition, for a source over `source`
    /// whose partition `i` (C order) lives on `source_device(i)`.
    pub fn target(&self, source: &Grid, source_device: &dyn Fn(usize) -> Device) -> Result<Target> {
        let (grid, owners) = self.resolve(source.shape())?;
        let n = grid.num_partitions();
        let devices = match (&self.placement, owners) {
            (Placement::Dealt { devices, .. }, Some(owners)) => {
                owners.into_iter().map(|o| devices[o]).collect()
            }
            (Placement::On(d), _) => vec![*d; n],
            (Placement::Each(ds), _) => {
                if ds.len() != n {
                    return Err(Error::shape(
                        format!("one device for each of the {n} target partitions"),
                        format!("{} devices", ds.len()),
                    ));
                }
                ds.clone()
            }
            _ => stay(source, &grid, source_device),
        };
        Ok(Target { grid, devices })
    }
}

/// Each target partition on the device of the source partition holding its first element
/// (for an empty target partition: the source slab where it starts, or the last one).
fn stay(source: &Grid, target: &Grid, source_device: &dyn Fn(usize) -> Device) -> Vec<Device> {
    if source.num_partitions() == 0 {
        return vec![Device::CPU; target.num_partitions()];
    }
    stay_by(source, target, source_device)
}

/// For each target partition, `of(i)` of the source partition `i` holding its first element
/// (for an empty target partition: the source slab where it starts, or the last one): its
/// device, or its rank across SPMD ranks. The source grid has at least one partition.
pub(crate) fn stay_by<T: Copy + PartialEq>(
    source: &Grid,
    target: &Grid,
    source_device: &dyn Fn(usize) -> T,
) -> Vec<T> {
    let n = target.num_partitions();
    let m = source.num_partitions();
    let first = source_device(0);
    if (1..m).all(|i| source_device(i) == first) {
        return vec![first; n];
    }
    let tiling = source.tiling();
    let src_strides = strides(&tiling);
    // Per axis, per target slab: the flat-index contribution of the source slab holding the
    // target slab's first element.
    let per_axis: Vec<Vec<usize>> = (0..source.ndim())
        .map(|a| {
            let s = &source.splits()[a];
            target.splits()[a][..target.splits()[a].len() - 1]
                .iter()
                .map(|&start| {
                    let j = s.partition_point(|&b| b <= start).saturating_sub(1);
                    j.min(tiling[a] - 1) * src_strides[a]
                })
                .collect()
        })
        .collect();
    target
        .positions()
        .map(|pos| {
            let flat: usize = pos.iter().enumerate().map(|(a, &i)| per_axis[a][i]).sum();
            source_device(flat)
        })
        .collect()
}

fn check_blocks(shape: &[usize], block: &[usize]) -> Result<()> {
    if block.len() != shape.len() || block.contains(&0) {
        return Err(Error::shape(
            format!(
                "block-cyclic blocks (each >= 1) for shape {}",
                tuple_string(shape)
            ),
            tuple_string(block),
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

/// The error of a dealt placement with no devices to deal over: a process grid given alone,
/// or blocks dealt over an empty list.
fn no_devices(shape: &[usize], process_grid: Option<&[usize]>) -> Error {
    let Some(pg) = process_grid else {
        return Error::shape(
            "block-cyclic blocks are dealt over devices: give at least one (devices=[...] in \
             Python, Layout::block_cyclic's devices in Rust)",
            "no devices",
        );
    };
    let cells = pg
        .iter()
        .try_fold(1usize, |n, &k| n.checked_mul(k))
        .filter(|_| pg.len() == shape.len());
    let cells = cells.map_or(String::new(), |n| format!(" ({n} in all)"));
    Error::shape(
        format!(
            "a process grid deals the target partitions over devices, one per process-grid \
             cell{cells}: give them (devices=[...] in Python, Layout::dealt or \
             Layout::block_cyclic in Rust)"
        ),
        format!("process grid {} and no devices", tuple_string(pg)),
    )
}

/// Checks a dealt placement: `devices` to deal over, and a process grid `pg` with one entry
/// per axis of `shape` and as many coordinates as devices.
fn check_process_grid(shape: &[usize], devices: &[Device], pg: &[usize]) -> Result<()> {
    // A 0-d array's one partition has the one coordinate of the empty process grid, which
    // deals it to the first device, however many there are (as a 1-element 1-d array's one
    // block goes to the first).
    if shape.is_empty() && pg.is_empty() {
        return Ok(());
    }
    let count = pg.iter().try_fold(1usize, |n, &k| n.checked_mul(k));
    if pg.len() != shape.len() || pg.contains(&0) || count != Some(devices.len()) {
        return Err(Error::shape(
            format!(
                "block-cyclic process grid with {} axes (one per axis of shape {}) and {} \
                 devices in all",
                shape.len(),
                tuple_string(shape),
                devices.len()
            ),
            tuple_string(pg),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_process_grid_whose_product_overflows_is_refused() {
        let layout = Layout::block_cyclic(&[2, 2], vec![Device::CPU]).process_grid(&[1 << 63, 2]);
        let err = layout.resolve(&[4, 4]).unwrap_err().to_string();
        assert!(err.contains(&format!("({}, 2)", 1usize << 63)), "{err}");
    }

    #[test]
    fn block_cyclic_assigns_blocks_like_scalapack() {
        let devices: Vec<Device> = (0..4).map(Device::cuda).collect();
        let layout = Layout::block_cyclic(&[3, 2], devices);
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

        let layout = Layout::block_cyclic(&[2, 2], vec![Device::CPU; 6]).process_grid(&[3, 2]);
        let (grid, owners) = layout.resolve(&[8, 4]).unwrap();
        assert_eq!(grid.tiling(), vec![4, 2]);
        assert_eq!(owners.unwrap(), vec![0, 1, 2, 3, 4, 5, 0, 1]);

        let layout = Layout::block_cyclic(&[4], vec![Device::CPU; 3]);
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
            match pg {
                Some(pg) => Layout::block_cyclic(&block, devices.clone()).process_grid(&pg),
                None => Layout::block_cyclic(&block, devices.clone()),
            }
            .resolve(&[8, 8])
            .unwrap_err()
            .to_string()
        };
        assert!(bad(vec![2, 2], Some(vec![3, 1])).contains("(3, 1)"));
        assert!(bad(vec![2], None).contains("(2,)"));
        assert!(bad(vec![2, 0], None).contains("(2, 0)"));
        assert!(Layout::tiling(&[2]).resolve(&[8, 8]).is_err());
        let none = Layout::block_cyclic(&[2, 2], vec![]);
        assert!(none
            .resolve(&[8, 8])
            .unwrap_err()
            .to_string()
            .contains("dealt over devices: give at least one"));
        // A 0-d array's one partition goes to the first device, however many there are.
        let scalar = |n: usize| Layout::block_cyclic(&[], vec![Device::CPU; n]).resolve(&[]);
        for n in [1, 2, 5] {
            let (grid, owners) = scalar(n).unwrap();
            assert_eq!((grid.num_partitions(), owners), (1, Some(vec![0])), "{n}");
        }
        let tiny = Layout::block_cyclic(&[1], vec![Device::CPU]);
        let e = tiny.resolve(&[1 << 40]).unwrap_err().to_string();
        assert!(e.contains("too many partitions"), "{e}");
        assert!(Layout::splits(vec![vec![0, 8], vec![0, 3, 8]])
            .resolve(&[8, 8])
            .is_ok());
    }

    /// A 0-d array has one partition, at the one coordinate of the empty process grid: dealt
    /// over several devices, it goes to the first, as a 1-element 1-d array's one block does.
    /// A process grid with an axis the array lacks is refused, naming it.
    #[test]
    fn a_0d_array_dealt_over_several_devices_goes_to_the_first() {
        let source = Grid::even(&[], &[]).unwrap();
        let devs = vec![Device::cuda(1), Device::cuda(0), Device::cuda(2)];
        let layouts = [
            Layout::block_cyclic(&[], devs.clone()),
            Layout::tiling(&[]).dealt(devs.clone()),
            Layout::tiling(&[]).dealt(devs.clone()).process_grid(&[]),
        ];
        for layout in &layouts {
            let t = layout.target(&source, &|_| Device::CPU).unwrap();
            assert_eq!((t.grid.num_partitions(), t.devices), (1, vec![devs[0]]));
        }
        let one = Layout::block_cyclic(&[1], devs.clone()).process_grid(&[3]);
        assert_eq!(one.resolve(&[1]).unwrap().1, Some(vec![0]));
        let e = Layout::block_cyclic(&[], devs.clone())
            .process_grid(&[3])
            .resolve(&[])
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("0 axes (one per axis of shape ())") && e.ends_with(": (3,)"),
            "{e}"
        );
    }

    #[test]
    fn stay_places_each_target_on_the_source_holding_its_first_element() {
        // Source: rows [0, 2) on cuda:0, [2, 2) empty on cuda:1, [2, 6) on cuda:2.
        let src = Grid::from_splits(&[6, 4], vec![vec![0, 2, 2, 6], vec![0, 4]]).unwrap();
        let devs = [Device::cuda(0), Device::cuda(1), Device::cuda(2)];
        let t = Layout::splits(vec![vec![0, 1, 2, 5, 6, 6], vec![0, 1, 4]])
            .target(&src, &|i| devs[i])
            .unwrap();
        let rows = [0, 0, 2, 2, 2]; // the empty last target starts at 6: the last source slab
        let expect: Vec<Device> = rows.iter().flat_map(|&r| [devs[r], devs[r]]).collect();
        assert_eq!(t.devices, expect);
        let on = Layout::tiling(&[2, 2])
            .on(Device::CPU)
            .target(&src, &|i| devs[i])
            .unwrap();
        assert_eq!(on.devices, vec![Device::CPU; 4]);
        let each = Layout::tiling(&[1, 2]).devices(vec![Device::CPU]);
        assert!(each
            .target(&src, &|i| devs[i])
            .unwrap_err()
            .to_string()
            .contains("1 devices"));
        let dealt = Layout::tiling(&[2, 2])
            .dealt(devs.to_vec())
            .process_grid(&[1, 3]);
        let expect = vec![devs[0], devs[1], devs[0], devs[1]];
        assert_eq!(dealt.target(&src, &|i| devs[i]).unwrap().devices, expect);
        let no_devices = Layout::tiling(&[2, 2]).process_grid(&[1, 1]);
        let e = no_devices.target(&src, &|i| devs[i]).unwrap_err();
        assert!(
            e.to_string()
                .starts_with("process grid (1, 1) deals the partitions")
                && e.to_string().ends_with(
                    "no devices were given (the partitions would stay where their data is)"
                ),
            "{e}"
        );
    }

    /// A process grid given before the devices it deals over is the same layout as one given
    /// after them: the 8x8 array's 2x2 blocks go round the 1x4 grid along the columns.
    #[test]
    fn a_process_grid_applies_whichever_comes_first() {
        let devs: Vec<Device> = (0..4).map(Device::cuda).collect();
        let after = Layout::tiling(&[4, 4])
            .dealt(devs.clone())
            .process_grid(&[1, 4]);
        let before = Layout::tiling(&[4, 4])
            .process_grid(&[1, 4])
            .dealt(devs.clone());
        let through = Layout::tiling(&[4, 4])
            .on(Device::CPU)
            .process_grid(&[1, 4])
            .dealt(devs.clone());
        let cols: Vec<usize> = (0..16).map(|k| k % 4).collect();
        for layout in [&after, &before, &through] {
            assert_eq!(layout.resolve(&[8, 8]).unwrap().1.as_ref(), Some(&cols));
            assert_eq!(
                layout.placement,
                Placement::Dealt {
                    devices: devs.clone(),
                    process_grid: Some(vec![1, 4])
                }
            );
        }
        // Dealt again over other devices: the grid stays.
        let redealt = before.dealt(vec![Device::CPU; 4]);
        assert_eq!(redealt.resolve(&[8, 8]).unwrap().1, Some(cols));
        let cyclic = Layout::block_cyclic(&[2, 2], devs.clone());
        assert_eq!(
            cyclic.process_grid(&[4, 1]),
            Layout::new(Cut::Blocks(vec![2, 2]), Placement::Stay)
                .process_grid(&[4, 1])
                .dealt(devs.clone())
        );
    }

    /// A process grid with a placement that deals nothing is refused, in either order, by an
    /// error naming both; so is one left behind by a later placement.
    #[test]
    fn a_process_grid_without_a_dealt_placement_is_refused_in_either_order() {
        let cpu = Device::CPU;
        let devs = vec![Device::cuda(0), Device::cuda(1)];
        let tiles = || Layout::tiling(&[2, 2]);
        let on = format!("the placement puts every partition on {cpu}");
        let each = "the placement names one device per partition, 2 in all";
        let cases = [
            (tiles().on(cpu).process_grid(&[1, 1]), on.as_str()),
            (tiles().process_grid(&[1, 1]).on(cpu), on.as_str()),
            (
                tiles().dealt(devs.clone()).process_grid(&[1, 1]).on(cpu),
                on.as_str(),
            ),
            (tiles().devices(devs.clone()).process_grid(&[1, 1]), each),
            (tiles().process_grid(&[1, 1]).devices(devs.clone()), each),
        ];
        for (layout, placement) in cases {
            let e = layout.resolve(&[4, 4]).unwrap_err();
            assert_eq!(e.kind(), "ValueError");
            assert_eq!(
                e.to_string(),
                format!(
                    "process grid (1, 1) deals the partitions over a list of devices \
                     (Layout::dealt; devices=[...] in Python): {placement}"
                ),
                "{layout:?}"
            );
        }
        // Without a process grid, the last placement wins as before.
        let last = tiles().dealt(devs.clone()).on(cpu);
        assert_eq!(last.placement, Placement::On(cpu));
        assert!(last.resolve(&[4, 4]).is_ok());
    }
}
