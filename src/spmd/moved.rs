//! [`to`]: every rank's partitions moved onto a device of its own, the ranks agreeing on the
//! outcome and learning each other's devices, so that the global metadata stays the same on
//! every rank.

use crate::device::Device;
use crate::error::Result;
use crate::partitioned::{Data, PartitionedArray};
use crate::tensor::Tensor;

use super::agree::agree;
use super::wire::{fingerprint, Writer};
use super::Communicator;

/// The SPMD array `pa` with every partition this rank holds copied onto `device` (an explicit
/// transfer; partitions already there are shared, not copied), over the same grid and
/// owners, with the same `locals` (a collective call). Each rank names its own device (rank
/// `r`'s `kDLCUDA:0` is its own GPU; the ranks may name different ones); every rank learns
/// the others', so each partition's locations name its rank's new device on every rank. A
/// failure on any rank (a device not here, data on a device without dlpart kernels, memory
/// running out) is the same error on every rank, and `pa` is unchanged everywhere.
pub fn to(
    comm: &dyn Communicator,
    pa: &PartitionedArray,
    device: Device,
) -> Result<PartitionedArray> {
    to_in(comm, pa, Ok(device))
}

/// [`to`] with this rank's device, or the error it had reading it (which every rank then
/// returns).
pub(crate) fn to_in(
    comm: &dyn Communicator,
    pa: &PartitionedArray,
    device: Result<Device>,
) -> Result<PartitionedArray> {
    let moved = device.and_then(|d| {
        crate::backend::check_present(d)?;
        let held: Vec<(usize, &Tensor)> = pa
            .data()
            .iter()
            .enumerate()
            .filter_map(|(flat, data)| data.tensor().map(|t| (flat, t)))
            .collect();
        let tensors: Vec<&Tensor> = held.iter().map(|&(_, t)| t).collect();
        let copies = crate::partitioned::moved_to_device(&tensors, d)?;
        Ok((
            d,
            held.into_iter()
                .map(|(flat, _)| flat)
                .zip(copies)
                .collect::<Vec<_>>(),
        ))
    });
    // The ranks must be moving the same array: its grid is compared, the devices are not.
    let mut w = Writer::default();
    w.usizes(pa.shape());
    for s in pa.grid().splits() {
        w.usizes(s);
    }
    let note = moved.as_ref().map_or(String::new(), |(d, _)| d.to_string());
    let peers = agree(
        comm,
        "to",
        moved.as_ref().map(|_| fingerprint(&w.0)),
        "arrays (global grids)",
        &note,
    )?;
    let (_, copies) = moved.expect("every rank succeeded");
    let devices = peers
        .notes
        .iter()
        .map(|n| n.parse::<Device>())
        .collect::<Result<Vec<_>>>()?;
    let mut data: Vec<Data> = pa.data().to_vec();
    for (flat, t) in copies {
        data[flat] = Data::Tensor(t);
    }
    let locations = (0..pa.len())
        .map(|flat| {
            let mut locs = pa.locations(flat).to_vec();
            for l in &mut locs {
                let rank = l.rank.and_then(|r| usize::try_from(r).ok());
                if let Some(&d) = rank.and_then(|r| devices.get(r)) {
                    l.device = d;
                }
            }
            locs
        })
        .collect();
    let locals = pa.locals().map(<[Vec<usize>]>::to_vec);
    let out = PartitionedArray::new(pa.grid().clone(), data, locations, locals)?;
    match pa.dtype() {
        Some(d) => out.with_dtype(d),
        None => Ok(out),
    }
}
