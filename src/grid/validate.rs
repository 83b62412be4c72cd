//! Validation of `__partitioned__` entries into a [`Grid`] (invariants 1–5).
//!
//! Entries arrive in any order; they are placed into a dense table indexed by the flat C-order
//! position, which finds missing and duplicate positions in one pass. Starts and lengths live in
//! flat `Vec<usize>`s with stride `ndim`, so 65,536 entries cost a few allocations in all.

use super::{inv, next_position, Grid};
use crate::error::{tuple_string, Error, Result};

/// At most this many violations are listed; the rest are counted in one last line.
const MAX_LISTED: usize = 32;

/// Collects violations, listing the first [`MAX_LISTED`].
#[derive(Default)]
pub(crate) struct Violations {
    errors: Vec<Error>,
    unlisted: usize,
}

impl Violations {
    pub(crate) fn push(
        &mut self,
        key: &str,
        position: Option<&[usize]>,
        invariant: u8,
        found: impl FnOnce() -> String,
    ) {
        if self.errors.len() < MAX_LISTED {
            self.errors
                .push(Error::protocol(key, position, found(), Some(invariant)));
        } else {
            self.unlisted += 1;
        }
    }

    /// Lists `e`, a violation that is no numbered invariant (data a consumer could not import).
    pub(crate) fn push_error(&mut self, e: Error) {
        if self.errors.len() < MAX_LISTED {
            self.errors.push(e);
        } else {
            self.unlisted += 1;
        }
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.errors.is_empty()
    }

    /// The violations as one error, or `None` when there are none.
    pub(crate) fn into_error(mut self) -> Option<Error> {
        if self.unlisted > 0 {
            let n = self.unlisted;
            self.errors.push(Error::protocol(
                "partitions",
                None,
                format!("... and {n} more violations"),
                None,
            ));
        }
        Error::from_many(self.errors)
    }

    pub(crate) fn finish(self) -> Result<()> {
        self.into_error().map_or(Ok(()), Err)
    }
}

/// More positions than this beyond the number of entries cannot all be listed as missing, and
/// a dense table for them is not worth allocating.
const MAX_EXTRA_POSITIONS: usize = 1 << 20;

const MISSING: usize = usize::MAX;

/// Validates `n_entries` entries, entry `k` being `entry(k) = (position, start, shape)`.
pub(super) fn grid_from_entries<'a>(
    shape: &[i64],
    tiling: &[i64],
    n_entries: usize,
    entry: impl Fn(usize) -> (&'a [i64], &'a [i64], &'a [i64]),
) -> Result<Grid> {
    let mut v = Violations::default();
    // The header first: everything else is measured against it.
    if shape.len() != tiling.len() {
        v.push("partition_tiling", None, inv::NDIM, || {
            format!(
                "{} has {} axes but shape {} has {}",
                tuple_string(tiling),
                tiling.len(),
                tuple_string(shape),
                shape.len()
            )
        });
    }
    if let Some(a) = shape.iter().position(|&n| n < 0) {
        v.push("shape", None, inv::EXTENTS, || {
            format!(
                "{} has the negative length {} on axis {a}",
                tuple_string(shape),
                shape[a]
            )
        });
    }
    if let Some(a) = tiling.iter().position(|&n| n < 1) {
        v.push("partition_tiling", None, inv::POSITIONS, || {
            format!(
                "{} has {} partitions on axis {a}; every axis needs at least 1",
                tuple_string(tiling),
                tiling[a]
            )
        });
    }
    if !v.is_empty() {
        return Err(v.into_error().expect("violations were found"));
    }
    let nd = shape.len();
    let gshape: Vec<usize> = shape.iter().map(|&n| n as usize).collect();
    let tiles: Vec<usize> = tiling.iter().map(|&n| n as usize).collect();
    let count = super::checked_product(&tiles)
        .filter(|&c| {
            c <= super::MAX_PARTITIONS && c <= n_entries.saturating_add(MAX_EXTRA_POSITIONS)
        })
        .ok_or_else(|| {
            Error::protocol(
                "partition_tiling",
                None,
                format!(
                    "{} has more positions than can be checked against {} entries",
                    tuple_string(tiling),
                    n_entries
                ),
                Some(inv::POSITIONS),
            )
        })?;

    // Place every entry at its flat position; bad entries are reported and left out.
    let mut slot = vec![MISSING; count];
    let mut valid = vec![false; count];
    let mut starts = vec![0usize; count * nd];
    let mut lens = vec![0usize; count * nd];
    let mut pos = vec![0usize; nd];
    for k in 0..n_entries {
        let (position, start, pshape) = entry(k);
        if position.len() != nd {
            v.push("partitions", None, inv::NDIM, || {
                format!(
                    "position {} has {} axes, expected {nd}",
                    tuple_string(position),
                    position.len()
                )
            });
            continue;
        }
        if (0..nd).any(|a| position[a] < 0 || position[a] >= tiling[a]) {
            v.push("partitions", None, inv::POSITIONS, || {
                format!(
                    "position {} is outside partition_tiling {}",
                    tuple_string(position),
                    tuple_string(tiling)
                )
            });
            continue;
        }
        let mut flat = 0;
        for a in 0..nd {
            pos[a] = position[a] as usize;
            flat = flat * tiles[a] + pos[a];
        }
        if slot[flat] != MISSING {
            let first = slot[flat];
            v.push("partitions", Some(&pos), inv::POSITIONS, || {
                format!("listed twice (entries {first} and {k})")
            });
            continue;
        }
        slot[flat] = k;
        let mut ok = true;
        for (key, vals) in [("start", start), ("shape", pshape)] {
            if vals.len() != nd {
                v.push(key, Some(&pos), inv::NDIM, || {
                    format!(
                        "{} has {} axes, expected {nd}",
                        tuple_string(vals),
                        vals.len()
                    )
                });
                ok = false;
            } else if vals.iter().any(|&x| x < 0) {
                v.push(key, Some(&pos), inv::EXTENTS, || {
                    format!("{} has a negative entry", tuple_string(vals))
                });
                ok = false;
            }
        }
        if ok && (0..nd).any(|a| start[a].checked_add(pshape[a]).is_none()) {
            v.push("shape", Some(&pos), inv::EXTENTS, || {
                format!(
                    "start {} + shape {} overflows",
                    tuple_string(start),
                    tuple_string(pshape)
                )
            });
            ok = false;
        }
        if ok {
            valid[flat] = true;
            for a in 0..nd {
                starts[flat * nd + a] = start[a] as usize;
                lens[flat * nd + a] = pshape[a] as usize;
            }
        }
    }
    for (flat, &k) in slot.iter().enumerate() {
        if k == MISSING {
            let p = position_of(flat, &tiles);
            v.push("partitions", Some(&p), inv::POSITIONS, || {
                format!(
                    "missing; partition_tiling {} needs every position",
                    tuple_string(tiling)
                )
            });
        }
    }

    let splits = split_points(&gshape, &tiles, &valid, &starts, &lens, &mut v);
    v.finish()?;
    Ok(Grid::new_unchecked(
        gshape,
        splits.expect("all axes checked when no violation was found"),
    ))
}

fn position_of(mut flat: usize, tiles: &[usize]) -> Vec<usize> {
    let mut p = vec![0; tiles.len()];
    for a in (0..tiles.len()).rev() {
        p[a] = flat % tiles[a];
        flat /= tiles[a];
    }
    p
}

/// The (start, length) that a slab's partitions agree on, and the partition that holds it.
#[derive(Clone, Copy, PartialEq)]
struct Slab {
    start: usize,
    len: usize,
    flat: usize,
}

/// Checks invariants 4 and 5 on the valid entries; returns the split points when every slab of
/// every axis has at least one valid entry.
fn split_points(
    gshape: &[usize],
    tiles: &[usize],
    valid: &[bool],
    starts: &[usize],
    lens: &[usize],
    v: &mut Violations,
) -> Option<Vec<Vec<usize>>> {
    let nd = gshape.len();
    // Reference per slab: the first valid entry in C order.
    let mut slabs: Vec<Vec<Option<Slab>>> = tiles.iter().map(|&n| vec![None; n]).collect();
    let mut disputed: Vec<Vec<bool>> = tiles.iter().map(|&n| vec![false; n]).collect();
    let mut any_disputed = false;
    let mut pos = vec![0usize; nd];
    for flat in 0..valid.len() {
        if valid[flat] {
            for a in 0..nd {
                let (start, len) = (starts[flat * nd + a], lens[flat * nd + a]);
                match &slabs[a][pos[a]] {
                    None => slabs[a][pos[a]] = Some(Slab { start, len, flat }),
                    Some(s) if s.start != start || s.len != len => {
                        disputed[a][pos[a]] = true;
                        any_disputed = true;
                    }
                    Some(_) => {}
                }
            }
        }
        next_position(&mut pos, tiles);
    }
    if any_disputed {
        settle_disputes(tiles, valid, starts, lens, &disputed, &mut slabs);
        report_disputes(tiles, valid, starts, lens, &slabs, v);
    }

    let mut splits = Vec::with_capacity(nd);
    for a in 0..nd {
        if slabs[a].iter().any(Option::is_none) {
            continue; // every entry of a slab is missing or malformed: reported already
        }
        let mut end = 0usize;
        let mut points = Vec::with_capacity(tiles[a] + 1);
        for (i, s) in slabs[a]
            .iter()
            .map(|s| s.expect("checked above"))
            .enumerate()
        {
            if s.start != end {
                let p = position_of(s.flat, tiles);
                v.push("start", Some(&p), inv::COVER, || {
                    if s.start > end {
                        format!("gap on axis {a}: slab {i} starts at {} but the previous one ends at {end}", s.start)
                    } else {
                        format!("overlap on axis {a}: slab {i} starts at {} but the previous one ends at {end}", s.start)
                    }
                });
            }
            points.push(s.start);
            end = s.start + s.len;
        }
        if end != gshape[a] {
            let last = slabs[a][tiles[a] - 1].expect("checked above");
            let p = position_of(last.flat, tiles);
            v.push("shape", Some(&p), inv::COVER, || {
                format!(
                    "the partitions along axis {a} end at {end} but shape[{a}] is {}",
                    gshape[a]
                )
            });
        }
        points.push(end);
        splits.push(points);
    }
    (splits.len() == nd).then_some(splits)
}

/// For slabs whose entries disagree, the value most entries hold becomes the reference, so that
/// one bad entry is blamed rather than every entry that disagrees with it.
fn settle_disputes(
    tiles: &[usize],
    valid: &[bool],
    starts: &[usize],
    lens: &[usize],
    disputed: &[Vec<bool>],
    slabs: &mut [Vec<Option<Slab>>],
) {
    let nd = tiles.len();
    for a in 0..nd {
        let mut votes: Vec<Vec<Slab>> = vec![Vec::new(); tiles[a]];
        let mut pos = vec![0usize; nd];
        for flat in 0..valid.len() {
            if valid[flat] && disputed[a][pos[a]] {
                let (start, len) = (starts[flat * nd + a], lens[flat * nd + a]);
                votes[pos[a]].push(Slab { start, len, flat });
            }
            next_position(&mut pos, tiles);
        }
        for (i, mut vs) in votes
            .into_iter()
            .enumerate()
            .filter(|(_, vs)| !vs.is_empty())
        {
            // Stable sort keeps C order within equal values; ties go to the earliest entry.
            vs.sort_by_key(|s| (s.start, s.len));
            let mut best = (0usize, usize::MAX, vs[0]);
            for run in vs.chunk_by(|x, y| (x.start, x.len) == (y.start, y.len)) {
                let first = run
                    .iter()
                    .map(|s| s.flat)
                    .min()
                    .expect("runs are non-empty");
                if run.len() > best.0 || (run.len() == best.0 && first < best.1) {
                    best = (run.len(), first, run[0]);
                }
            }
            slabs[a][i] = Some(best.2);
        }
    }
}

/// Reports every entry whose start or length differs from its slab's reference (invariant 4).
fn report_disputes(
    tiles: &[usize],
    valid: &[bool],
    starts: &[usize],
    lens: &[usize],
    slabs: &[Vec<Option<Slab>>],
    v: &mut Violations,
) {
    let nd = tiles.len();
    let mut pos = vec![0usize; nd];
    for flat in 0..valid.len() {
        if valid[flat] {
            let reference = |a: usize| slabs[a][pos[a]].expect("a valid entry sets its slab");
            let found_start = &starts[flat * nd..(flat + 1) * nd];
            let found_len = &lens[flat * nd..(flat + 1) * nd];
            if (0..nd).any(|a| reference(a).start != found_start[a]) {
                let expected: Vec<usize> = (0..nd).map(|a| reference(a).start).collect();
                v.push("start", Some(&pos), inv::RECTILINEAR, || {
                    format!(
                        "found {}, expected {} from the other partitions in its slabs",
                        tuple_string(found_start),
                        tuple_string(&expected)
                    )
                });
            }
            if (0..nd).any(|a| reference(a).len != found_len[a]) {
                let expected: Vec<usize> = (0..nd).map(|a| reference(a).len).collect();
                v.push("shape", Some(&pos), inv::RECTILINEAR, || {
                    format!(
                        "found {}, expected {} from the other partitions in its slabs",
                        tuple_string(found_len),
                        tuple_string(&expected)
                    )
                });
            }
        }
        next_position(&mut pos, tiles);
    }
}
