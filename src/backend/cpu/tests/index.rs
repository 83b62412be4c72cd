//! Gather and scatter against naive loops.

use super::*;
use crate::backend::cpu::copy::TUNING;
use crate::backend::cpu::index::{gather_tuned, scatter_tuned};
use crate::error::Error;

/// Shapes for the random cases (fewer under Miri, which is slow).
const SHAPES: &[&[usize]] = if cfg!(miri) {
    &[&[5], &[4, 6], &[3, 5, 2]]
} else {
    &[
        &[5],
        &[20],
        &[4, 6],
        &[3, 5, 2],
        &[1, 7],
        &[16, 1, 4],
        &[2, 3, 2, 3],
    ]
};

/// `m` indices in `[0, len)` of a random kind: random with repeats, sorted with repeats,
/// strictly increasing, blocks of consecutive indices (long enough to be copied as runs), or
/// all equal.
fn indices(rng: &mut Rng, m: usize, len: usize) -> Vec<i64> {
    let len = len as i64;
    match rng.below(5) {
        0 => (0..m).map(|_| rng.below(len as usize) as i64).collect(),
        4 => {
            let mut v: Vec<i64> = (0..m).map(|_| rng.below(len as usize) as i64).collect();
            v.sort_unstable();
            v
        }
        1 => {
            let mut v: Vec<i64> = (0..len).filter(|_| rng.below(2) == 0).collect();
            v.truncate(m);
            v
        }
        2 => {
            let mut v = Vec::new();
            while v.len() < m {
                let start = rng.below(len as usize) as i64;
                v.extend((start..len).take(1 + rng.below(12)));
            }
            v.truncate(m);
            v
        }
        _ => vec![rng.below(len as usize) as i64; m],
    }
}

pub(super) fn naive_gather(src: &Buf, idx: &[i64], axis: usize, dst: &mut Buf) {
    let shape = dst.shape.clone();
    for_each_index(&shape, |ix| {
        let mut sx = ix.to_vec();
        sx[axis] = idx[ix[axis]] as usize;
        dst.set(ix, src.item(&sx));
    });
}

/// C order visits the values of one destination slot in increasing `i`: later ones win.
pub(super) fn naive_scatter(values: &Buf, idx: &[i64], axis: usize, dst: &mut Buf) {
    for_each_index(&values.shape, |ix| {
        let mut dx = ix.to_vec();
        dx[axis] = idx[ix[axis]] as usize;
        dst.set(&dx, values.item(ix));
    });
}

pub(super) fn with_len(shape: &[usize], axis: usize, m: usize) -> Vec<usize> {
    let mut s = shape.to_vec();
    s[axis] = m;
    s
}

fn check_gather(
    rng: &mut Rng,
    shape: &[usize],
    axis: usize,
    idx: &[i64],
    item: usize,
    tuning: &Tuning,
) {
    let src = Buf::random(rng, shape, item, true);
    let mut dst = Buf::random(rng, &with_len(shape, axis, idx.len()), item, false);
    let mut want = dst.clone();
    naive_gather(&src, idx, axis, &mut want);
    // SAFETY: separate buffers; the boxes lie inside them.
    in_pool(|| unsafe { gather_tuned(src.src(), idx, axis, dst.dst(), item, tuning) }).unwrap();
    assert!(
        dst.bytes == want.bytes,
        "gather {shape:?} axis {axis} item {item} idx {idx:?} src {:?} dst {:?}",
        src.strides,
        dst.strides
    );
}

fn check_scatter(
    rng: &mut Rng,
    shape: &[usize],
    axis: usize,
    idx: &[i64],
    item: usize,
    tuning: &Tuning,
) {
    let values = Buf::random(rng, &with_len(shape, axis, idx.len()), item, true);
    let mut dst = Buf::random(rng, shape, item, false);
    let mut want = dst.clone();
    naive_scatter(&values, idx, axis, &mut want);
    // SAFETY: separate buffers; the boxes lie inside them.
    in_pool(|| unsafe { scatter_tuned(values.src(), idx, axis, dst.dst(), item, tuning) }).unwrap();
    assert!(
        dst.bytes == want.bytes,
        "scatter {shape:?} axis {axis} item {item} idx {idx:?} values {:?} dst {:?}",
        values.strides,
        dst.strides
    );
}

#[test]
fn gather_and_scatter_match_naive_loops() {
    let mut rng = Rng::new(11);
    for &item in &ITEMSIZES {
        for shape in SHAPES {
            for axis in 0..shape.len() {
                for t in 0..TRIALS {
                    let m = rng.below(if t % 2 == 0 { 9 } else { 40 });
                    let tuning = [TINY, TUNING][t % 2];
                    let idx = indices(&mut rng, m, shape[axis]);
                    check_gather(&mut rng, shape, axis, &idx, item, &tuning);
                    let idx = indices(&mut rng, m, shape[axis]);
                    check_scatter(&mut rng, shape, axis, &idx, item, &tuning);
                }
            }
        }
    }
}

#[test]
fn scatter_keeps_the_last_duplicate_in_every_parallel_mode() {
    let mut rng = Rng::new(12);
    // Sorted indices (split where the index changes), many outer slices (split by slice),
    // few slices with repeats and inner boxes of 64 bytes or more (split by destination
    // window), or less (one thread); each also with the pieces run last first, which breaks
    // any split that separates repeats.
    // Extents of the indexed axis (smaller under Miri, which is slow).
    let n = if cfg!(miri) { 10 } else { 30 };
    let cases: [(Vec<usize>, usize); 5] = [
        (vec![12, 6], 1),
        (vec![2, n], 1),
        (vec![n], 0),
        (vec![n, 2], 0),
        (vec![n, 20], 0),
    ];
    // Under Miri pieces run in order on one thread anyway: only the reversed order is new.
    let tunings: &[Tuning] = if cfg!(miri) {
        &[REVERSED]
    } else {
        &[TINY, REVERSED]
    };
    for tuning in tunings {
        let increasing: Vec<i64> = (0..40).step_by(3).collect();
        check_scatter(&mut rng, &[3, 40], 1, &increasing, 4, tuning);
        for (shape, axis) in &cases {
            let (shape, axis) = (&shape[..], *axis);
            let len = shape[axis];
            let mut idx: Vec<i64> = (0..3 * len).map(|_| rng.below(len) as i64).collect();
            check_scatter(&mut rng, shape, axis, &idx, 8, tuning);
            if !cfg!(miri) {
                check_scatter(&mut rng, shape, axis, &idx, 3, tuning);
            }
            idx.sort_unstable();
            check_scatter(&mut rng, shape, axis, &idx, 4, tuning);
            let blocks: Vec<i64> = (0..3 * len as i64)
                .map(|i| (i / 2 + i % 5) % len as i64)
                .collect();
            check_scatter(&mut rng, shape, axis, &blocks, 2, tuning);
        }
    }
}

/// Contiguous layouts, where consecutive indices become one copy: blocks of several lengths,
/// overlapping blocks (repeats), runs cut by piece and window edges.
#[test]
fn runs_of_consecutive_indices() {
    let mut rng = Rng::new(17);
    for (shape, axis, item) in [
        (&[40][..], 0, 4),
        (&[40, 3], 0, 2),
        (&[2, 40], 1, 16),
        (&[40, 2, 2], 0, 3),
    ] {
        let len = shape[axis];
        for t in 0..TRIALS {
            let mut idx = Vec::new();
            while idx.len() < if cfg!(miri) { 30 } else { 60 } {
                let start = rng.below(len);
                idx.extend((start..len).take(1 + rng.below(16)).map(|j| j as i64));
            }
            let tuning = [TINY, REVERSED, TUNING][t % 3];
            let mut sorted = idx.clone();
            sorted.sort_unstable();
            for idx in [idx, sorted] {
                let values = Buf::contiguous(&mut rng, &with_len(shape, axis, idx.len()), item);
                let mut dst = Buf::contiguous(&mut rng, shape, item);
                let mut want = dst.clone();
                naive_scatter(&values, &idx, axis, &mut want);
                // SAFETY: separate buffers; the boxes lie inside them.
                in_pool(|| unsafe {
                    scatter_tuned(values.src(), &idx, axis, dst.dst(), item, &tuning)
                })
                .unwrap();
                assert!(
                    dst.bytes == want.bytes,
                    "scatter {shape:?} axis {axis} idx {idx:?} {tuning:?}"
                );
                let src = Buf::contiguous(&mut rng, shape, item);
                let mut out = Buf::contiguous(&mut rng, &with_len(shape, axis, idx.len()), item);
                let mut want = out.clone();
                naive_gather(&src, &idx, axis, &mut want);
                // SAFETY: separate buffers; the boxes lie inside them.
                in_pool(|| unsafe {
                    gather_tuned(src.src(), &idx, axis, out.dst(), item, &tuning)
                })
                .unwrap();
                assert!(
                    out.bytes == want.bytes,
                    "gather {shape:?} axis {axis} idx {idx:?} {tuning:?}"
                );
            }
        }
    }
}

#[test]
#[cfg_attr(miri, ignore)]
fn large_random_and_blocked_indices() {
    let mut rng = Rng::new(13);
    let n = 200_000;
    let random: Vec<i64> = (0..n).map(|_| rng.below(n) as i64).collect();
    let blocked: Vec<i64> = (0..n as i64)
        .map(|i| (i / 32 * 7919 % (n as i64 / 32)) * 32 + i % 32)
        .collect();
    for idx in [&random, &blocked] {
        check_gather(&mut rng, &[n], 0, idx, 4, &TUNING);
        check_scatter(&mut rng, &[n], 0, idx, 4, &TUNING);
        check_gather(
            &mut rng,
            &[n / 100, 100],
            0,
            &idx[..1000].iter().map(|i| i / 100).collect::<Vec<_>>(),
            8,
            &TUNING,
        );
    }
}

fn gather_err(idx: &[i64], len: usize, other: usize) -> Error {
    let mut rng = Rng::new(14);
    let src = Buf::contiguous(&mut rng, &[len, other], 4);
    let mut dst = Buf::contiguous(&mut rng, &[idx.len(), other], 4);
    // SAFETY: separate buffers; the boxes lie inside them.
    unsafe { gather_tuned(src.src(), idx, 0, dst.dst(), 4, &TINY) }.unwrap_err()
}

fn scatter_err(idx: &[i64], len: usize, other: usize) -> Error {
    let mut rng = Rng::new(15);
    let values = Buf::contiguous(&mut rng, &[idx.len(), other], 4);
    let mut dst = Buf::contiguous(&mut rng, &[len, other], 4);
    // SAFETY: separate buffers; the boxes lie inside them.
    unsafe { scatter_tuned(values.src(), idx, 0, dst.dst(), 4, &TINY) }.unwrap_err()
}

#[test]
fn bad_indices_are_reported_with_their_value() {
    let cases: &[(&[i64], usize, usize, i64)] = &[
        (&[0, 5, 1], 5, 3, 5),
        (&[2, -1], 5, 1, -1),
        (&[7, 8, 9, 10], 10, 1, 10), // a run running off the end
        (&[3, 11], 4, 0, 11),        // nothing to copy, still checked
    ];
    for &(idx, len, other, bad) in cases {
        for e in [gather_err(idx, len, other), scatter_err(idx, len, other)] {
            assert!(
                matches!(e, Error::IndexOutOfRange { index, axis: 0, len: l } if index == bad as i128 && l == len),
                "{idx:?}: {e}"
            );
        }
    }
}

#[test]
fn mismatched_shapes_are_refused() {
    let mut rng = Rng::new(16);
    let src = Buf::contiguous(&mut rng, &[4, 3], 4);
    let mut dst = Buf::contiguous(&mut rng, &[2, 4], 4);
    // SAFETY: the shapes are refused before any access.
    let e = unsafe { gather_tuned(src.src(), &[0, 1], 0, dst.dst(), 4, &TINY) }.unwrap_err();
    assert!(e.to_string().contains("(4, 3) and (2, 4)"), "{e}");
    // SAFETY: as above.
    let e = unsafe { scatter_tuned(src.src(), &[0], 2, dst.dst(), 4, &TINY) }.unwrap_err();
    assert!(e.to_string().contains("axis 2"), "{e}");
}

/// Few indices over slabs of 4096 elements or more run as box copies (`slabs::gather_slabs`):
/// every axis, random layouts and item sizes, against the naive loop.
#[test]
#[cfg_attr(
    miri,
    ignore = "slabs of 4096 elements take minutes under Miri; the box copies this path runs \
              are covered there by the copy tests"
)]
fn few_indices_over_big_slabs() {
    let mut rng = Rng::new(17);
    let cases: &[(&[usize], usize)] = &[
        (&[5, 64, 70], 0),
        (&[64, 3, 80], 1),
        (&[64, 70, 3], 2),
        (&[2, 4096], 0),
    ];
    let (items, counts): (&[usize], &[usize]) = (&[4, 1, 2, 8, 16, 3, 12], &[1, 3, 64]);
    for &(shape, axis) in cases {
        for &m in counts {
            // The largest count with one item size: the naive loop is slow in debug builds.
            for &item in if m > 3 { &items[..1] } else { items } {
                let idx = indices(&mut rng, m, shape[axis]);
                for tuning in [TINY, TUNING] {
                    check_gather(&mut rng, shape, axis, &idx, item, &tuning);
                }
            }
        }
    }
}

/// Few indices over C-contiguous slabs (the faces along axis 0, rows of a matrix) take the
/// one-memcpy-per-slab path; repeated and reversed indices included.
#[test]
#[cfg_attr(miri, ignore = "slabs of 4096 elements take minutes under Miri")]
fn few_indices_over_contiguous_slabs() {
    let mut rng = Rng::new(19);
    for (shape, idx) in [
        (&[6, 64, 64][..], &[0, 5][..]),
        (&[6, 64, 64], &[5, 5, 0, 3]),
        (&[3, 4096], &[2, 1, 0]),
    ] {
        for item in [1, 4, 8] {
            let src = Buf::contiguous(&mut rng, shape, item);
            let mut dst = Buf::contiguous(&mut rng, &with_len(shape, 0, idx.len()), item);
            let mut want = dst.clone();
            naive_gather(&src, idx, 0, &mut want);
            // SAFETY: separate buffers; the boxes lie inside them.
            unsafe { gather_tuned(src.src(), idx, 0, dst.dst(), item, &TUNING) }.unwrap();
            assert!(dst.bytes == want.bytes, "{shape:?} {idx:?} item {item}");
        }
    }
}

/// A bad index among few over big slabs is reported before anything is written.
#[test]
fn a_bad_index_over_big_slabs_writes_nothing() {
    let mut rng = Rng::new(18);
    let src = Buf::contiguous(&mut rng, &[5, 4096], 4);
    let mut dst = Buf::contiguous(&mut rng, &[2, 4096], 4);
    let before = dst.bytes.clone();
    // SAFETY: separate buffers; the boxes lie inside them.
    let e = unsafe { gather_tuned(src.src(), &[1, 5], 0, dst.dst(), 4, &TINY) }.unwrap_err();
    assert!(
        matches!(
            e,
            Error::IndexOutOfRange {
                index: 5,
                axis: 0,
                len: 5
            }
        ),
        "{e}"
    );
    assert!(dst.bytes == before);
}
