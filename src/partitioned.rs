//! `PartitionedArray`: a [`Grid`] whose partitions are tensors (or handles not fetched yet)
//! with their locations. [`PartitionedArray::new`] checks invariants 2, 4, 6, 7, 9 and 10 of
//! [`crate::grid`]; [`Location::parse_device`] checks 8.
//!
//! What counts as a violation:
//! - 6: two partitions holding data with different dtypes.
//! - 7: a partition's tensor whose shape differs from the partition's shape.
//! - 8: a location whose device string does not parse ([`Location::parse_device`]).
//! - 9: a partition holding data and listing at least one location, where no location names
//!   the tensor's device. dlpart plans transfers from these devices, so a dict that misstates
//!   them is refused rather than trusted. Importers that fetch a handle through `get` into
//!   another process or device therefore record where the fetched copy lives, and normalisers
//!   of location forms without a device (a bare IP, an MPI rank) use the tensor's device.
//!   Partitions without data, or without locations, are not checked.
//! - 10: a `locals` position outside the grid, or listed twice. A local partition need not hold
//!   data yet (it may be fetched through `get` later).

use std::collections::BTreeSet;
use std::fmt;

use crate::device::Device;
use crate::dtype::DType;
use crate::error::{tuple_string, Error, Result};
use crate::grid::validate::Violations;
use crate::grid::{inv, Grid};
use crate::tensor::Tensor;

/// Where a partition can be accessed without communication: a process on a host, a device in
/// it, and, for MPI-like producers, a rank.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Location {
    /// Host address (IP string); empty when the producer gave only a rank.
    pub host: String,
    pub pid: Option<i64>,
    pub device: Device,
    pub rank: Option<i64>,
}

impl Location {
    /// A draft-2 location `(host, pid, device)`.
    pub fn new(host: impl Into<String>, pid: i64, device: Device) -> Self {
        Location {
            host: host.into(),
            pid: Some(pid),
            device,
            rank: None,
        }
    }

    /// Parses the device string of a location, citing invariant 8 on failure.
    pub fn parse_device(text: &str, position: &[usize]) -> Result<Device> {
        text.parse().map_err(|e| {
            Error::protocol(
                "location",
                Some(position),
                format!("{e}"),
                Some(inv::LOCATION),
            )
        })
    }
}

/// Writes `s` as a Python string literal in single quotes.
fn write_py_str(f: &mut fmt::Formatter<'_>, s: &str) -> fmt::Result {
    f.write_str("'")?;
    for c in s.chars() {
        match c {
            '\\' => f.write_str("\\\\")?,
            '\'' => f.write_str("\\'")?,
            c => write!(f, "{c}")?,
        }
    }
    f.write_str("'")
}

/// Prints the draft-2 tuple, `('1.1.1.1', 7755737, 'kDLCUDA:0')`, with `None` for a missing
/// pid. The rank is not part of the protocol's tuple and is not printed.
impl fmt::Display for Location {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("(")?;
        write_py_str(f, &self.host)?;
        match self.pid {
            Some(pid) => write!(f, ", {pid}, ")?,
            None => f.write_str(", None, ")?,
        }
        write_py_str(f, &self.device.to_string())?;
        f.write_str(")")
    }
}

/// One partition: its grid position, its box, its data when held here, and its locations
/// (several mean replicas).
#[derive(Clone, Debug)]
pub struct Partition {
    pub position: Vec<usize>,
    pub start: Vec<usize>,
    pub shape: Vec<usize>,
    pub tensor: Option<Tensor>,
    pub locations: Vec<Location>,
}

/// A validated partitioned array. `partitions` are in C order of their positions.
#[derive(Clone, Debug)]
pub struct PartitionedArray {
    grid: Grid,
    dtype: Option<DType>,
    partitions: Vec<Partition>,
    locals: Option<Vec<Vec<usize>>>,
}

impl PartitionedArray {
    /// Checks `partitions` against `grid` and each other and returns the array; every
    /// violation is reported. The dtype is that of the partitions holding data (`None` when
    /// none does).
    pub fn new(
        grid: Grid,
        partitions: Vec<Partition>,
        locals: Option<Vec<Vec<usize>>>,
    ) -> Result<Self> {
        let mut v = Violations::default();
        if partitions.len() != grid.num_partitions() {
            v.push("partitions", None, inv::POSITIONS, || {
                format!(
                    "{} partitions for partition_tiling {}, which has {} positions",
                    partitions.len(),
                    tuple_string(&grid.tiling()),
                    grid.num_partitions()
                )
            });
            return Err(v.into_error().expect("one violation"));
        }
        let mut dtype: Option<(DType, &[usize])> = None;
        for (flat, p) in partitions.iter().enumerate() {
            let expected = grid.position(flat);
            if p.position != expected {
                v.push("partitions", Some(&p.position), inv::POSITIONS, || {
                    format!(
                        "found at index {flat}, where C order puts {}",
                        tuple_string(&expected)
                    )
                });
                continue;
            }
            let region = grid.region_at(flat);
            for (key, found, want) in [
                ("start", &p.start, &region.start),
                ("shape", &p.shape, &region.shape),
            ] {
                if found != want {
                    v.push(key, Some(&p.position), inv::RECTILINEAR, || {
                        format!(
                            "found {}, the grid's split points give {}",
                            tuple_string(found),
                            tuple_string(want)
                        )
                    });
                }
            }
            let Some(t) = &p.tensor else { continue };
            match dtype {
                None => dtype = Some((t.dtype(), &p.position)),
                Some((d, first)) if d != t.dtype() => {
                    v.push("data", Some(&p.position), inv::DTYPE, || {
                        format!(
                            "dtype {} differs from {d} of partition {}",
                            t.dtype(),
                            tuple_string(first)
                        )
                    })
                }
                Some(_) => {}
            }
            if t.shape() != p.shape.as_slice() {
                v.push("data", Some(&p.position), inv::TENSOR_SHAPE, || {
                    format!(
                        "tensor of shape {} for a partition of shape {}",
                        tuple_string(t.shape()),
                        tuple_string(&p.shape)
                    )
                });
            }
            if !p.locations.is_empty() && p.locations.iter().all(|l| l.device != t.device()) {
                v.push("location", Some(&p.position), inv::DEVICE, || {
                    let named: Vec<String> =
                        p.locations.iter().map(|l| l.device.to_string()).collect();
                    format!(
                        "data lives on {} but the locations name {}",
                        t.device(),
                        named.join(", ")
                    )
                });
            }
        }
        if let Some(locals) = &locals {
            check_locals(&grid, locals, &mut v);
        }
        v.finish()?;
        let dtype = dtype.map(|(d, _)| d);
        Ok(PartitionedArray {
            grid,
            dtype,
            partitions,
            locals,
        })
    }

    /// Cuts `t` along `grid` into zero-copy views that share its memory. The partitions list no
    /// locations: their tensors say where they are.
    pub fn from_tensor(t: &Tensor, grid: Grid) -> Result<Self> {
        if t.shape() != grid.shape() {
            return Err(Error::shape(
                format!("grid over {} for a tensor", tuple_string(grid.shape())),
                format!("shape {}", tuple_string(t.shape())),
            ));
        }
        let partitions = grid
            .positions()
            .map(|position| {
                let r = grid.region(&position)?;
                Ok(Partition {
                    tensor: Some(t.view(&r.start, &r.shape)?),
                    position,
                    start: r.start,
                    shape: r.shape,
                    locations: Vec::new(),
                })
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(PartitionedArray {
            grid,
            dtype: Some(t.dtype()),
            partitions,
            locals: None,
        })
    }

    pub fn grid(&self) -> &Grid {
        &self.grid
    }

    /// The global shape.
    pub fn shape(&self) -> &[usize] {
        self.grid.shape()
    }

    pub fn dtype(&self) -> Option<DType> {
        self.dtype
    }

    /// The partitions in C order of their positions.
    pub fn partitions(&self) -> &[Partition] {
        &self.partitions
    }

    /// The partition at `position`.
    pub fn partition(&self, position: &[usize]) -> Result<&Partition> {
        Ok(&self.partitions[self.grid.flat_index(position)?])
    }

    /// The positions owned by this process (SPMD producers only).
    pub fn locals(&self) -> Option<&[Vec<usize>]> {
        self.locals.as_deref()
    }

    /// The parts, for callers that rebuild an array (through [`PartitionedArray::new`]).
    pub fn into_parts(self) -> (Grid, Vec<Partition>, Option<Vec<Vec<usize>>>) {
        (self.grid, self.partitions, self.locals)
    }

    /// The distinct devices in use, sorted: each held tensor's device, and the location devices
    /// of partitions that hold no data here.
    pub fn devices(&self) -> Vec<Device> {
        let mut set = BTreeSet::new();
        for p in &self.partitions {
            match &p.tensor {
                Some(t) => {
                    set.insert(t.device());
                }
                None => set.extend(p.locations.iter().map(|l| l.device)),
            }
        }
        set.into_iter().collect()
    }
}

fn check_locals(grid: &Grid, locals: &[Vec<usize>], v: &mut Violations) {
    let mut seen = vec![false; grid.num_partitions()];
    for pos in locals {
        if pos.len() != grid.ndim() {
            v.push("locals", None, inv::NDIM, || {
                format!(
                    "position {} has {} axes, expected {}",
                    tuple_string(pos),
                    pos.len(),
                    grid.ndim()
                )
            });
            continue;
        }
        match grid.flat_index(pos) {
            Err(_) => v.push("locals", None, inv::LOCALS, || {
                format!(
                    "position {} is outside partition_tiling {}",
                    tuple_string(pos),
                    tuple_string(&grid.tiling())
                )
            }),
            Ok(flat) if seen[flat] => v.push("locals", Some(pos), inv::LOCALS, || {
                "listed twice".to_string()
            }),
            Ok(flat) => seen[flat] = true,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::device::DeviceType;

    fn invariants(e: &Error) -> Vec<(String, Option<Vec<usize>>, u8)> {
        match e {
            Error::ProtocolMany { errors } => errors.iter().flat_map(invariants).collect(),
            Error::Protocol {
                key,
                position,
                invariant,
                ..
            } => {
                vec![(
                    key.clone(),
                    position.as_ref().map(|p| p.0.clone()),
                    invariant.unwrap_or(0),
                )]
            }
            other => panic!("not a protocol error: {other}"),
        }
    }

    fn global(rows: usize, cols: usize) -> (Tensor, ndarray::ArrayD<i32>) {
        let vals: Vec<i32> = (0..(rows * cols) as i32).collect();
        let t = Tensor::from_slice(&vals, &[rows, cols]).unwrap();
        let a = ndarray::ArrayD::from_shape_vec(ndarray::IxDyn(&[rows, cols]), vals).unwrap();
        (t, a)
    }

    #[test]
    fn from_tensor_makes_views_matching_ndarray_slices() {
        let (t, a) = global(7, 5);
        let grid = Grid::even(&[7, 5], &[3, 2]).unwrap();
        let pa = PartitionedArray::from_tensor(&t, grid).unwrap();
        assert_eq!(pa.partitions().len(), 6);
        // array_split(7, 3) = 3, 2, 2; array_split(5, 2) = 3, 2.
        let rows = [0..3, 3..5, 5..7];
        let cols = [0..3, 3..5];
        for p in pa.partitions() {
            let (r, c) = (rows[p.position[0]].clone(), cols[p.position[1]].clone());
            let expect = a.slice(ndarray::s![r, c]).into_dyn().to_owned();
            let view = p.tensor.as_ref().unwrap();
            assert_eq!(
                view.to_array::<i32>().unwrap(),
                expect,
                "partition {:?}",
                p.position
            );
            assert!(std::sync::Arc::ptr_eq(view.owner(), t.owner()));
        }
        assert_eq!(pa.devices(), vec![Device::CPU]);
        assert_eq!(pa.dtype(), Some(DType::Int32));
        // Rebuilding through the validating constructor accepts it unchanged.
        let (g, parts, locals) = pa.into_parts();
        assert!(PartitionedArray::new(g, parts, locals).is_ok());
        assert!(PartitionedArray::from_tensor(&t, Grid::even(&[5, 7], &[1, 1]).unwrap()).is_err());
    }

    #[test]
    fn new_reports_dtype_shape_device_and_locals_violations() {
        let (t, _) = global(4, 4);
        let grid = Grid::even(&[4, 4], &[2, 2]).unwrap();
        let (_, mut parts, _) = PartitionedArray::from_tensor(&t, grid.clone())
            .unwrap()
            .into_parts();
        let as_f32 = Tensor::zeros(&[2, 2], DType::Float32).unwrap();
        parts[1].tensor = Some(as_f32);
        parts[2].tensor = Some(t.view(&[0, 0], &[2, 3]).unwrap());
        parts[3].locations = vec![Location::new("1.1.1.1", 7, Device::cuda(0))];
        parts[0].locations = vec![
            Location::new("1.1.1.1", 7, Device::cuda(0)),
            Location::new("1.1.1.1", 8, Device::CPU),
        ];
        let locals = vec![vec![1, 1], vec![2, 0], vec![1, 1], vec![0]];
        let e = PartitionedArray::new(grid, parts, Some(locals)).unwrap_err();
        let got = invariants(&e);
        let expect: Vec<(String, Option<Vec<usize>>, u8)> = vec![
            ("data".into(), Some(vec![0, 1]), 6),
            ("data".into(), Some(vec![1, 0]), 7),
            ("location".into(), Some(vec![1, 1]), 9),
            ("locals".into(), None, 10),
            ("locals".into(), Some(vec![1, 1]), 10),
            ("locals".into(), None, 1),
        ];
        assert_eq!(got, expect, "{e}");
        let msg = e.to_string();
        assert!(msg.contains("float32 differs from int32"), "{msg}");
        assert!(
            msg.contains("kDLCPU but the locations name kDLCUDA:0"),
            "{msg}"
        );
    }

    #[test]
    fn new_refuses_partitions_out_of_order_or_off_the_grid() {
        let (t, _) = global(4, 6);
        let grid = Grid::even(&[4, 6], &[2, 2]).unwrap();
        let (_, mut parts, _) = PartitionedArray::from_tensor(&t, grid.clone())
            .unwrap()
            .into_parts();
        parts.swap(0, 1);
        parts[3].start = vec![2, 2];
        let e = PartitionedArray::new(grid.clone(), parts.clone(), None).unwrap_err();
        let got = invariants(&e);
        assert_eq!(got[0], ("partitions".into(), Some(vec![0, 1]), 2));
        assert_eq!(got[1], ("partitions".into(), Some(vec![0, 0]), 2));
        assert_eq!(got[2], ("start".into(), Some(vec![1, 1]), 4));
        assert!(
            e.to_string()
                .contains("found (2, 2), the grid's split points give (2, 3)"),
            "{e}"
        );
        parts.pop();
        let e = PartitionedArray::new(grid, parts, None).unwrap_err();
        assert_eq!(invariants(&e), vec![("partitions".into(), None, 2)]);
    }

    #[test]
    fn locations_print_like_python_tuples_and_parse_devices() {
        let l = Location::new("1.1.1.1", 7755737, Device::cuda(0));
        assert_eq!(l.to_string(), "('1.1.1.1', 7755737, 'kDLCUDA:0')");
        let rank_only = Location {
            host: String::new(),
            pid: None,
            device: Device::CPU,
            rank: Some(3),
        };
        assert_eq!(rank_only.to_string(), "('', None, 'kDLCPU')");
        let odd = Location::new("it's\\", 1, Device::CPU);
        assert_eq!(odd.to_string(), r"('it\'s\\', 1, 'kDLCPU')");
        assert_eq!(
            Location::parse_device("kDLOneAPI:1", &[0]).unwrap().kind,
            DeviceType::OneApi
        );
        let e = Location::parse_device("cuda:0", &[2, 1]).unwrap_err();
        assert_eq!(
            invariants(&e),
            vec![("location".into(), Some(vec![2, 1]), 8)]
        );
        assert!(e.to_string().contains("\"cuda:0\""), "{e}");
    }

    #[test]
    fn devices_lists_tensor_devices_then_locations_of_remote_partitions() {
        let grid = Grid::even(&[4], &[2]).unwrap();
        let parts = vec![
            Partition {
                position: vec![0],
                start: vec![0],
                shape: vec![2],
                tensor: None,
                locations: vec![
                    Location::new("a", 1, Device::cuda(1)),
                    Location::new("b", 2, Device::cuda(0)),
                ],
            },
            Partition {
                position: vec![1],
                start: vec![2],
                shape: vec![2],
                tensor: Some(Tensor::zeros(&[2], DType::Float64).unwrap()),
                locations: vec![],
            },
        ];
        let pa = PartitionedArray::new(grid, parts, Some(vec![vec![1]])).unwrap();
        assert_eq!(
            pa.devices(),
            vec![Device::CPU, Device::cuda(0), Device::cuda(1)]
        );
        assert_eq!(pa.dtype(), Some(DType::Float64));
        assert_eq!(pa.locals(), Some(&[vec![1]][..]));
        assert_eq!(pa.partition(&[1]).unwrap().start, vec![2]);
    }
}
