//! Host exchanges in rounds. Packing every box a rank sends into one buffer writes most of the
//! rank's data to memory once more before MPI reads it again; in rounds, each round packs a
//! slice of every peer's boxes into a buffer that can stay in the cache (written with plain
//! stores, one copy call per peer, being read again at once), then exchanges that slice with
//! one all-to-all-v, straight into the targets where they take the bytes in place. Each round
//! costs a collective call in which every rank waits for the others, so rounds only pay where
//! those calls are cheap against the bytes they move (see [`ROUNDS`]). Every rank takes the
//! same number of rounds, settled after the ranks agree from what each noted there (rank 0's
//! round size, and whether every rank's side is in host memory: see `Stage::settle`).
//!
//! A peer's list of boxes is cut the same way on the rank that sends it and the rank that
//! receives it, from the plan alone: round `k` of `n` takes the elements
//! `[k * total / n, (k + 1) * total / n)` of the list's boxes laid end to end (each in C
//! order), which is what the one-shot exchange packs at those offsets. A piece of a box is a
//! few boxes (at most `2 * ndim - 1`); a box that is one contiguous range of a tensor gives
//! one contiguous range per round, so in-place sends and receives keep working with offsets.

use crate::backend::{backend_for, BoxCopy as Job};
use crate::device::Device;
use crate::error::Result;
use crate::plan::BoxCopy;
use crate::tensor::Tensor;

use super::super::Communicator;
use super::{pack, prefix, Segments, Stage};

/// How host exchanges are cut into rounds. The defaults suit real use; tests shrink them so
/// that small arrays take many rounds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Rounds {
    /// The most bytes one rank sends another per round (about: rounds cut at elements); 0
    /// keeps every exchange in one round.
    pub bytes: usize,
    /// Exchanges in which no rank sends another this many bytes take one round.
    pub min_bytes: usize,
}

/// The rounds of real exchanges: `DLPART_MPI_ROUND_BYTES` bytes per peer and round when set
/// (0 for one round, as by default), read once. The ranks of an exchange take rank 0's
/// (each rank's travels in the agreement), so that a variable set differently on some ranks
/// cannot make them disagree on the number of collective calls.
///
/// One round by default, from `bench --mpi` (rows -> columns, float32, 4 ranks on the 2-vCPU
/// machine while other work loaded it, load average 4-9), median ratios to MPI's `Alltoall`:
/// at 8192², 1 MiB per peer (16 rounds) 0.60 against 0.70 in one round over 12 alternated
/// pairs, but 0.82 against 0.65 over 6 other pairs; 341 KiB per peer (48 rounds)
/// 0.43-0.63 against 0.63-0.73; at 4096², 0.50 (4 rounds) and 0.40 (8) against 0.55. Each
/// round's `Alltoallv` waits for ranks that share a CPU: one of 1 MiB per peer moved
/// 2.0 GB/s, one of 16 MiB 7.5 GB/s. With only the benchmark loading the machine, at 8192²:
/// one round 0.62, 0.71, 0.73; 1 MiB per peer 0.56, 0.67, 0.57 (three alternated pairs,
/// `benches/results/cpu-2vcpu-2026-11-22-mpi-13c1bec.txt`). Not measured where each rank has
/// a CPU of its own.
pub(crate) static ROUNDS: std::sync::LazyLock<Rounds> = std::sync::LazyLock::new(|| Rounds {
    bytes: std::env::var("DLPART_MPI_ROUND_BYTES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0),
    min_bytes: 2 << 20,
});

impl Rounds {
    /// The number of rounds of an exchange in which the busiest pair of ranks moves `largest`
    /// bytes.
    pub fn count(&self, largest: usize) -> usize {
        if self.bytes == 0 || largest < self.min_bytes.max(1) {
            1
        } else {
            largest.div_ceil(self.bytes)
        }
    }
}

/// The element range of round `k` of `n` over `total` elements.
pub(super) fn range(total: usize, k: usize, n: usize) -> (usize, usize) {
    let at = |k: usize| (total as u128 * k as u128 / n as u128) as usize;
    (at(k), at(k + 1))
}

/// The most elements any round of `n` takes from the lists of `totals` elements together.
pub(super) fn largest_round(totals: &[usize], n: usize) -> usize {
    (0..n)
        .map(|k| {
            totals
                .iter()
                .map(|&t| {
                    let (lo, hi) = range(t, k, n);
                    hi - lo
                })
                .sum::<usize>()
        })
        .max()
        .unwrap_or(0)
}

/// A peer's list of boxes, cut into `n` rounds.
pub(super) struct Cut<'a> {
    ops: &'a [BoxCopy],
    /// The element offset at which each box starts in the list, and the total last.
    starts: Vec<usize>,
    n: usize,
}

impl<'a> Cut<'a> {
    pub fn new(ops: &'a [BoxCopy], n: usize) -> Self {
        let mut starts = Vec::with_capacity(ops.len() + 1);
        starts.push(0);
        starts.extend(ops.iter().scan(0, |at, op| {
            *at += op.numel();
            Some(*at)
        }));
        Cut { ops, starts, n }
    }

    /// The elements of round `k`, as offsets into the list.
    pub fn range(&self, k: usize) -> (usize, usize) {
        range(
            *self.starts.last().expect("a start per box and the total"),
            k,
            self.n,
        )
    }

    /// The copies of round `k`, in the order their elements follow each other in the list.
    pub fn pieces(&self, k: usize) -> Vec<BoxCopy> {
        let (lo, hi) = self.range(k);
        let mut out = Vec::new();
        if lo == hi {
            return out;
        }
        // The first box ending after `lo`.
        let first = self.starts[1..].partition_point(|&end| end <= lo);
        for (b, op) in self.ops.iter().enumerate().skip(first) {
            let (s, e) = (self.starts[b], self.starts[b + 1]);
            if s >= hi {
                break;
            }
            if lo <= s && e <= hi {
                out.push(op.clone());
                continue;
            }
            let mut parts = Vec::new();
            range_boxes(
                &op.shape,
                lo.max(s) - s,
                hi.min(e) - s,
                &mut Vec::new(),
                &mut parts,
            );
            out.extend(parts.into_iter().map(|(start, shape)| BoxCopy {
                src: op.src,
                src_start: add(&op.src_start, &start),
                dst: op.dst,
                dst_start: add(&op.dst_start, &start),
                shape,
            }));
        }
        out
    }
}

fn add(a: &[usize], b: &[usize]) -> Vec<usize> {
    a.iter().zip(b).map(|(x, y)| x + y).collect()
}

/// Appends the elements `[lo, hi)` (C order, `lo < hi`) of the box `shape[at.len()..]` at the
/// index prefix `at` (extent 1 on those axes) to `out` as boxes `(start, shape)` of the whole
/// box, in C order: a partial slab, whole slabs, a partial slab.
pub(super) fn range_boxes(
    shape: &[usize],
    lo: usize,
    hi: usize,
    at: &mut Vec<usize>,
    out: &mut Vec<(Vec<usize>, Vec<usize>)>,
) {
    let d = at.len();
    let inner: usize = shape[d + 1..].iter().product();
    let slab = |at: &[usize], from: usize, to: usize| {
        let mut start = at.to_vec();
        start.push(from);
        start.resize(shape.len(), 0);
        let mut ext = vec![1; d];
        ext.push(to - from);
        ext.extend_from_slice(&shape[d + 1..]);
        (start, ext)
    };
    if lo % inner == 0 && hi % inner == 0 {
        out.push(slab(at, lo / inner, hi / inner));
        return;
    }
    let (a0, a1) = (lo / inner, hi / inner);
    // The elements `[lo, hi)` of the slab at index `a` of this axis.
    let inside = |at: &mut Vec<usize>, a: usize, lo: usize, hi: usize, out: &mut Vec<_>| {
        at.push(a);
        range_boxes(shape, lo, hi, at, out);
        at.pop();
    };
    if a0 == (hi - 1) / inner {
        inside(at, a0, lo - a0 * inner, hi - a0 * inner, out);
        return;
    }
    let mut whole = a0;
    if lo % inner != 0 {
        inside(at, a0, lo % inner, inner, out);
        whole += 1;
    }
    if whole < a1 {
        out.push(slab(at, whole, a1));
    }
    if hi % inner != 0 {
        inside(at, a1, 0, hi % inner, out);
    }
}

impl Stage {
    /// The exchange in `self.rounds` rounds (every rank calls this, with or without bytes to
    /// move): each round packs its pieces of every peer's boxes into the round's send buffer
    /// (or sends them from the source in place), exchanges them, and unpacks what arrived
    /// unless it arrived in place. Host memory only.
    pub(super) fn exchange_rounds(&self, comm: &dyn Communicator, dev: Device) -> Result<()> {
        let (me, n, size) = (comm.rank(), self.rounds, self.send_counts.len());
        let (dtype, isz) = (self.dtype, self.dtype.itemsize());
        let backend = backend_for(dev)?;
        let sends: Vec<Cut<'_>> = self.segments.iter().map(|s| Cut::new(s, n)).collect();
        let recvs: Vec<Cut<'_>> = self.recvs.iter().map(|r| Cut::new(r, n)).collect();
        let segment_of = |p: usize| if self.replicated { 0 } else { p };
        let into = match self.recv_in_place {
            true => self.targets.iter().flatten().next().cloned(),
            false => self.recv_buf.clone(),
        };
        let bytes = |ops: &[BoxCopy]| ops.iter().map(BoxCopy::numel).sum::<usize>() * isz;
        for k in 0..n {
            let (mut send_counts, mut send_displs) = (vec![0; size], vec![0; size]);
            if self.send_in_place {
                for p in (0..size).filter(|&p| p != me && self.send_counts[p] > 0) {
                    let (lo, hi) = sends[segment_of(p)].range(k);
                    send_counts[p] = (hi - lo) * isz;
                    send_displs[p] = self.send_displs[p] + lo * isz;
                }
            } else if let Some(buf) = &self.send {
                let pieces: Vec<Vec<BoxCopy>> = sends.iter().map(|c| c.pieces(k)).collect();
                let seg_bytes: Vec<usize> = pieces.iter().map(|s| bytes(s)).collect();
                let seg_start = prefix(&seg_bytes);
                for p in (0..size).filter(|&p| p != me) {
                    send_counts[p] = seg_bytes[segment_of(p)];
                    send_displs[p] = seg_start[segment_of(p)];
                }
                // One call per peer, so that each stays under the streaming-store threshold.
                for (s, list) in pieces.iter().enumerate().filter(|(_, l)| !l.is_empty()) {
                    let view = buf.box_view(seg_start[s], &[seg_bytes[s] / isz]);
                    pack(&*backend, &view, std::slice::from_ref(list), &self.sources)?;
                }
            }
            let pieces: Vec<Vec<BoxCopy>> = recvs.iter().map(|c| c.pieces(k)).collect();
            let recv_counts: Vec<usize> = pieces.iter().map(|r| bytes(r)).collect();
            let recv_displs: Vec<usize> = match self.recv_in_place {
                // A round with nothing to receive may have no buffer at all.
                true => (0..size)
                    .map(|p| match recv_counts[p] {
                        0 => 0,
                        _ => self.recv_displs[p] + recvs[p].range(k).0 * isz,
                    })
                    .collect(),
                false => prefix(&recv_counts),
            };
            let total: usize = recv_counts.iter().sum();
            let segments = Segments {
                send_counts: &send_counts,
                send_displs: &send_displs,
                recv_counts: &recv_counts,
                recv_displs: &recv_displs,
            };
            // Host memory, received into a buffer already made: preparing allocates nothing
            // and stages nothing, so it cannot fail on one rank after the agreement.
            let buffers =
                segments.prepare(comm, self.send.as_ref(), dev, dtype, isz, into.clone())?;
            segments.exchange(comm, buffers)?;
            if let (false, Some(buf), true) = (self.recv_in_place, &into, total > 0) {
                self.unpack(&*backend, buf, &pieces, &recv_displs)?;
            }
        }
        Ok(())
    }

    /// Copies each peer's `pieces`, packed in `buf` from `displs[peer]` on, into the targets.
    fn unpack(
        &self,
        backend: &dyn crate::backend::Backend,
        buf: &Tensor,
        pieces: &[Vec<BoxCopy>],
        displs: &[usize],
    ) -> Result<()> {
        let mut views = Vec::new();
        for (p, ops) in pieces.iter().enumerate() {
            let shapes = ops.iter().map(|op| &op.shape);
            views.extend(buf.box_views(displs[p], shapes).zip(ops));
        }
        let jobs: Vec<Job<'_>> = views
            .iter()
            .map(|(view, op)| Job {
                src: view,
                src_start: vec![0; op.shape.len()],
                dst: self.targets[op.dst]
                    .as_ref()
                    .expect("a target of this rank"),
                dst_start: op.dst_start.clone(),
                shape: op.shape.clone(),
            })
            .collect();
        // SAFETY: the planner's target boxes are disjoint, and so are their pieces; the
        // targets were allocated here or checked disjoint (repartition_into), and the received
        // bytes are a buffer of our own.
        unsafe { backend.copy_boxes_unchecked(&jobs)? };
        backend.synchronize()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The C-order offsets of every element of the boxes, in order.
    fn offsets(shape: &[usize], boxes: &[(Vec<usize>, Vec<usize>)]) -> Vec<usize> {
        let mut out = Vec::new();
        for (start, ext) in boxes {
            let numel: usize = ext.iter().product();
            for mut i in 0..numel {
                let mut idx = vec![0; shape.len()];
                for a in (0..shape.len()).rev() {
                    idx[a] = start[a] + i % ext[a];
                    i /= ext[a];
                }
                out.push(idx.iter().zip(shape).fold(0, |acc, (&x, &n)| acc * n + x));
            }
        }
        out
    }

    #[test]
    fn every_element_range_of_a_box_is_its_elements_in_order() {
        for shape in [
            vec![7],
            vec![3, 5],
            vec![2, 3, 4],
            vec![1, 4, 1, 3],
            vec![2, 1, 3, 2],
        ] {
            let numel: usize = shape.iter().product();
            for lo in 0..numel {
                for hi in lo + 1..=numel {
                    let mut boxes = Vec::new();
                    range_boxes(&shape, lo, hi, &mut Vec::new(), &mut boxes);
                    assert_eq!(offsets(&shape, &boxes), (lo..hi).collect::<Vec<_>>());
                    assert!(
                        boxes.len() < 2 * shape.len(),
                        "{shape:?} {lo}..{hi}: {boxes:?}"
                    );
                }
            }
        }
    }

    #[test]
    fn rounds_cover_a_list_once_in_order() {
        let op = |shape: Vec<usize>, src: usize| BoxCopy {
            src,
            src_start: vec![1; shape.len()],
            dst: 2 * src,
            dst_start: vec![2; shape.len()],
            shape,
        };
        let ops = vec![op(vec![2, 3], 0), op(vec![1, 1], 1), op(vec![4, 5], 2)];
        for n in 1..=30 {
            let cut = Cut::new(&ops, n);
            let mut seen: Vec<(usize, usize, usize)> = Vec::new();
            for k in 0..n {
                let (lo, hi) = cut.range(k);
                let pieces = cut.pieces(k);
                assert_eq!(pieces.iter().map(BoxCopy::numel).sum::<usize>(), hi - lo);
                for p in pieces {
                    assert_eq!(p.dst, 2 * p.src);
                    let d: Vec<usize> = p.src_start.iter().map(|s| s + 1).collect();
                    assert_eq!(p.dst_start, d, "source and target starts move together");
                    let whole = &ops[p.src];
                    let local: Vec<usize> = p.src_start.iter().map(|s| s - 1).collect();
                    for o in offsets(&whole.shape, &[(local, p.shape.clone())]) {
                        seen.push((p.src, o / whole.shape[1], o % whole.shape[1]));
                    }
                }
            }
            let want: Vec<(usize, usize, usize)> = ops
                .iter()
                .flat_map(|o| {
                    let (r, c, s) = (o.shape[0], o.shape[1], o.src);
                    (0..r).flat_map(move |i| (0..c).map(move |j| (s, i, j)))
                })
                .collect();
            assert_eq!(seen, want, "{n} rounds");
        }
    }

    #[test]
    fn small_exchanges_take_one_round() {
        let some = Rounds {
            bytes: 1 << 20,
            min_bytes: 4 << 20,
        };
        assert_eq!((some.count(0), some.count((4 << 20) - 1)), (1, 1));
        assert_eq!((some.count(4 << 20), some.count((4 << 20) + 1)), (4, 5));
        let all = Rounds {
            bytes: 10,
            min_bytes: 0,
        };
        assert_eq!(
            (all.count(0), all.count(1), all.count(10), all.count(11)),
            (1, 1, 1, 2)
        );
        let none = Rounds {
            bytes: 0,
            min_bytes: 0,
        };
        assert_eq!(none.count(1 << 40), 1);
        assert_eq!(largest_round(&[10, 3], 4), 4);
    }
}
