//! Box copies against the naive copy.

use super::*;
use crate::backend::cpu::copy::{
    copy_box, copy_boxes_tuned, pack, unit_groups, unpack, RawCopy, Stores, SEQUENTIAL, TUNING,
};
use crate::backend::cpu::copy_strided;

const SHAPES: &[&[usize]] = &[
    &[],
    &[0],
    &[1],
    &[7],
    &[3, 0, 2],
    &[4, 5],
    &[1, 9, 1],
    &[2, 3, 4],
    &[3, 1, 5, 2],
    &[6, 7],
    &[2, 2, 2, 3, 2],
];

/// `src` copied into `dst` by the naive copy: the expected destination bytes.
fn expected(src: &Buf, dst: &Buf) -> Vec<u8> {
    let mut out = dst.bytes.clone();
    // SAFETY: both boxes lie inside their buffers (see `Buf::with_strides`).
    unsafe {
        copy_strided(
            src.src().ptr,
            &src.strides,
            out.as_mut_ptr().add(dst.base),
            &dst.strides,
            &src.shape,
            src.itemsize,
        )
    };
    out
}

fn check(src: &Buf, dst: &mut Buf, tuning: &Tuning, stores: Stores) {
    let want = expected(src, dst);
    let job = RawCopy {
        src: src.src(),
        itemsize: src.itemsize,
        dst: dst.dst(),
    };
    // SAFETY: separate buffers; the boxes lie inside them.
    in_pool(|| unsafe { copy_boxes_tuned(&[job], stores, tuning) });
    assert!(
        dst.bytes == want,
        "shape {:?} item {} src strides {:?} dst strides {:?} ({tuning:?}, {stores:?})",
        src.shape,
        src.itemsize,
        src.strides,
        dst.strides
    );
}

#[test]
fn random_layouts_match_the_naive_copy() {
    let mut rng = Rng::new(1);
    for &item in &ITEMSIZES {
        for shape in SHAPES {
            for t in 0..TRIALS {
                let src = Buf::random(&mut rng, shape, item, true);
                let mut dst = Buf::random(&mut rng, shape, item, false);
                let (tuning, stores) = [(TINY, Stores::Plain), (TUNING, Stores::Streaming)][t % 2];
                check(&src, &mut dst, &tuning, stores);
            }
        }
    }
}

#[test]
fn transposes_cover_partial_tiles() {
    let mut rng = Rng::new(2);
    // 40x37 elements (20x19 under Miri, which is slow): words of 2+ bytes get several
    // tiles, with partial ones at both edges.
    let (p, q) = if cfg!(miri) { (20, 19) } else { (40, 37) };
    for &item in &[1, 2, 4, 8, 16] {
        let shape = [p, q];
        let src = Buf::with_strides(&mut rng, &shape, vec![1, p as isize], item);
        let mut dst = Buf::contiguous(&mut rng, &shape, item);
        check(&src, &mut dst, &TINY, Stores::Plain);
        // Pairs of elements transposed, with the pair contiguous on both sides.
        let shape = [9, 11, 2];
        let src = Buf::with_strides(&mut rng, &shape, vec![2, 18, 1], item);
        let mut dst = Buf::contiguous(&mut rng, &shape, item);
        check(&src, &mut dst, &TINY, Stores::Plain);
    }
}

#[test]
#[cfg_attr(miri, ignore)]
fn long_rows_and_runs_are_cut_into_units() {
    let mut rng = Rng::new(3);
    for stores in [Stores::Plain, Stores::Streaming] {
        // A row longer than one segment, and a strided run longer than one segment.
        let src = Buf::contiguous(&mut rng, &[70_001], 4);
        let mut dst = Buf::contiguous(&mut rng, &[70_001], 4);
        check(&src, &mut dst, &TINY, stores);
        let src = Buf::with_strides(&mut rng, &[40_000], vec![3], 2);
        let mut dst = Buf::contiguous(&mut rng, &[40_000], 2);
        check(&src, &mut dst, &TINY, stores);
        let src = Buf::with_strides(&mut rng, &[300, 300], vec![1, 300], 4);
        let mut dst = Buf::contiguous(&mut rng, &[300, 300], 4);
        check(&src, &mut dst, &TINY, stores);
    }
}

#[test]
fn streaming_rows_of_every_length_and_alignment() {
    let mut rng = Rng::new(4);
    let lens: &[usize] = if cfg!(miri) {
        &[255, 300]
    } else {
        &[1, 100, 255, 256, 300, 1000, 4097]
    };
    for &len in lens {
        for _ in 0..TRIALS {
            let shape = [3, len];
            let src = Buf::with_strides(&mut rng, &shape, vec![len as isize + 5, 1], 1);
            let mut dst = Buf::with_strides(&mut rng, &shape, vec![len as isize + 3, 1], 1);
            check(&src, &mut dst, &SEQUENTIAL, Stores::Streaming);
        }
    }
}

/// 8192 elements at least: too slow for Miri, and the naive copy it falls back to is the
/// reference every other test runs under Miri anyway.
#[test]
#[cfg_attr(miri, ignore)]
fn boxes_with_more_dims_than_a_plan_holds() {
    let mut rng = Rng::new(5);
    let shape = [2usize; 13];
    // Neighbouring dims swapped in memory, so that no two neighbours merge.
    let s: Vec<isize> = (0..13).map(|i| 1 << (12 - (i ^ 1).min(12))).collect();
    let src = Buf::with_strides(&mut rng, &shape, s, 4);
    let mut dst = Buf::random(&mut rng, &shape, 4, false);
    check(&src, &mut dst, &TINY, Stores::Plain);
}

#[test]
fn many_tiny_boxes_in_one_pass() {
    let mut rng = Rng::new(6);
    // An r x c source cut into 3x2 blocks, each copied to its place in a column-major
    // destination: (r / 3) * (c / 2) tiny jobs (200, or 40 under Miri, which is slow).
    let (r, c) = if cfg!(miri) { (12, 20) } else { (30, 40) };
    let src = Buf::contiguous(&mut rng, &[r, c], 4);
    let mut dst = Buf::with_strides(&mut rng, &[r, c], vec![1, r as isize], 4);
    let (sp, dp) = (src.src().ptr, dst.dst().ptr);
    let (ss, ds) = ([c as isize, 1], [1, r as isize]);
    let mut jobs = Vec::new();
    for_each_index(&[r / 3, c / 2], |b| {
        let (i, j) = (b[0] * 3, b[1] * 2);
        jobs.push(RawCopy {
            src: SrcView {
                ptr: sp.wrapping_add((i * c + j) * 4),
                shape: &[3, 2],
                strides: &ss,
            },
            dst: DstView {
                ptr: dp.wrapping_add((j * r + i) * 4),
                shape: &[3, 2],
                strides: &ds,
            },
            itemsize: 4,
        })
    });
    // Bytes outside the boxes keep a fill; every element of the array gets its source value.
    let mut want = vec![0xAAu8; dst.bytes.len()];
    for_each_index(&[r, c], |ix| {
        let o = dst.offset(ix);
        want[o..o + 4].copy_from_slice(src.item(ix));
    });
    for tuning in [TINY, REVERSED, TUNING] {
        dst.bytes.iter_mut().for_each(|b| *b = 0xAA);
        // SAFETY: the jobs' boxes tile the two buffers, which stay alive and unaliased.
        in_pool(|| unsafe { copy_boxes_tuned(&jobs, Stores::Auto, &tuning) });
        assert_eq!(dst.bytes, want, "{tuning:?}");
    }
}

/// Row blocks of an `r x c` source (rows flipped or not) copied into column blocks, as a
/// repartition does it: the jobs of one source block continue one another's rows, so they
/// run row by row together. Every element must land in its place whatever the grouping.
#[test]
fn row_groups_match_the_naive_copy() {
    let mut rng = Rng::new(9);
    // Uneven blocks: 3 row blocks and 4 column blocks of differing sizes.
    // Rows of 18 or more bytes: shorter ones that are machine words are moved as elements.
    let (r, c) = if cfg!(miri) { (30, 72) } else { (50, 150) };
    let row_cuts = [0, r / 3, 2 * r / 3 + 1, r];
    let col_cuts = [0, c / 4, c / 2 + 1, 3 * c / 4, c];
    // Miri is slow: two cases there.
    let cases: Vec<(usize, bool)> = if cfg!(miri) {
        vec![(4, true), (3, false)]
    } else {
        ITEMSIZES
            .iter()
            .flat_map(|&i| [(i, false), (i, true)])
            .collect()
    };
    for (item, flip) in cases {
        let src_strides = if flip {
            vec![-(c as isize), 1]
        } else {
            vec![c as isize, 1]
        };
        let src = Buf::with_strides(&mut rng, &[r, c], src_strides, item);
        // One destination buffer per column block, each C-order.
        let widths: Vec<usize> = col_cuts.windows(2).map(|w| w[1] - w[0]).collect();
        let mut dsts: Vec<Buf> = widths
            .iter()
            .map(|&w| Buf::contiguous(&mut rng, &[r, w], item))
            .collect();
        let (shapes, strides): (Vec<[usize; 2]>, Vec<[isize; 2]>) = row_cuts
            .windows(2)
            .flat_map(|rw| widths.iter().map(move |&w| [rw[1] - rw[0], w]))
            .map(|sh| (sh, [src.strides[0], 1]))
            .unzip();
        let dst_strides: Vec<[isize; 2]> = widths.iter().map(|&w| [w as isize, 1]).collect();
        let mut jobs = Vec::new();
        for (bi, rw) in row_cuts.windows(2).enumerate() {
            for (bj, cw) in col_cuts.windows(2).enumerate() {
                let k = bi * widths.len() + bj;
                jobs.push(RawCopy {
                    src: SrcView {
                        ptr: src.src().ptr.wrapping_offset(
                            (rw[0] as isize * src.strides[0] + cw[0] as isize) * item as isize,
                        ),
                        shape: &shapes[k],
                        strides: &strides[k],
                    },
                    dst: DstView {
                        ptr: dsts[bj].dst().ptr.wrapping_add(rw[0] * widths[bj] * item),
                        shape: &shapes[k],
                        strides: &dst_strides[bj],
                    },
                    itemsize: item,
                });
            }
        }
        // With the tiny tuning (3 threads) every job is big enough to be planned, so each
        // source block is one group of 4.
        let groups = in_pool(|| unit_groups(&jobs, &TINY));
        assert_eq!(groups, vec![4; 3], "item {item} flip {flip}");
        let mut want: Vec<Vec<u8>> = dsts.iter().map(|d| d.bytes.clone()).collect();
        for_each_index(&[r, c], |ix| {
            let bj = col_cuts.windows(2).position(|w| ix[1] < w[1]).unwrap();
            let o = dsts[bj].offset(&[ix[0], ix[1] - col_cuts[bj]]);
            want[bj][o..o + item].copy_from_slice(src.item(ix));
        });
        // Pieces of two source rows, so that a piece runs several rows of its group.
        let two_rows = Tuning {
            piece_min: 2 * c * item,
            piece_max: 2 * c * item,
            ..TINY
        };
        let two_rows_reversed = Tuning {
            reverse: true,
            ..two_rows
        };
        assert_eq!(in_pool(|| unit_groups(&jobs, &two_rows)), vec![4; 3]);
        let tunings = if cfg!(miri) {
            vec![two_rows, two_rows_reversed]
        } else {
            vec![TINY, REVERSED, TUNING, two_rows, two_rows_reversed]
        };
        for tuning in tunings {
            for d in &mut dsts {
                d.bytes.iter_mut().for_each(|b| *b = 0xAA);
            }
            let mut want = want.clone();
            for (w, d) in want.iter_mut().zip(&dsts) {
                // Bytes outside the boxes keep the fill.
                let (lo, hi) = (d.base, d.base + d.shape.iter().product::<usize>() * item);
                w[..lo].iter_mut().for_each(|b| *b = 0xAA);
                w[hi..].iter_mut().for_each(|b| *b = 0xAA);
            }
            // SAFETY: the jobs' boxes tile the source and the destination buffers, which
            // stay alive and unaliased for the call.
            in_pool(|| unsafe { copy_boxes_tuned(&jobs, Stores::Auto, &tuning) });
            for (bj, d) in dsts.iter().enumerate() {
                assert!(
                    d.bytes == want[bj],
                    "item {item} flip {flip} block {bj} {tuning:?}"
                );
            }
        }
    }
}

#[test]
fn pack_and_unpack_round_trip() {
    let mut rng = Rng::new(7);
    for &item in &ITEMSIZES {
        for shape in SHAPES {
            let src = Buf::random(&mut rng, shape, item, true);
            let mut packed = Buf::contiguous(&mut rng, shape, item);
            let want = expected(&src, &packed);
            // SAFETY: `packed` holds the box in C order.
            unsafe { pack(src.src(), packed.dst().ptr, item) };
            assert_eq!(packed.bytes, want, "pack {shape:?} item {item}");
            let mut back = Buf::random(&mut rng, shape, item, false);
            let want = expected(&packed, &back);
            // SAFETY: as above.
            unsafe { unpack(packed.src().ptr, back.dst(), item) };
            assert_eq!(back.bytes, want, "unpack {shape:?} item {item}");
        }
    }
}

#[test]
fn a_destination_overlapping_itself_gets_one_of_the_values() {
    let mut rng = Rng::new(8);
    let src = Buf::contiguous(&mut rng, &[5, 3], 4);
    let mut dst = Buf::with_strides(&mut rng, &[5, 3], vec![0, 1], 4);
    // SAFETY: separate buffers; the destination box (3 elements) lies inside its buffer.
    in_pool(|| unsafe { copy_box(src.src(), dst.dst(), 4) });
    for c in 0..3 {
        let got = dst.item(&[0, c]).to_vec();
        assert!(
            (0..5).any(|r| src.item(&[r, c]) == got.as_slice()),
            "column {c}"
        );
    }
}

#[test]
fn run_visits_every_start_once() {
    use std::sync::Mutex;
    for (n, step) in [(0, 1), (1, 1), (5, 7), (7, 7), (8, 7), (100, 3), (1000, 1)] {
        for pooled in [false, true] {
            let seen = Mutex::new(Vec::new());
            let go = || {
                TUNING.run(n, step, |s| {
                    seen.lock().unwrap().push(s);
                    Ok::<(), ()>(())
                })
            };
            let done = if pooled { in_pool(go) } else { go() };
            assert_eq!(done, Ok(()));
            let mut seen = seen.into_inner().unwrap();
            seen.sort_unstable();
            let want: Vec<usize> = (0..n).step_by(step).collect();
            assert_eq!(seen, want, "n {n} step {step} pooled {pooled}");
        }
    }
}

#[test]
fn run_stops_at_an_error_and_returns_it() {
    use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};
    let calls = AtomicUsize::new(0);
    let got = in_pool(|| {
        TUNING.run(10_000, 1, |s| {
            calls.fetch_add(1, Relaxed);
            if s >= 10 {
                Err(s)
            } else {
                Ok(())
            }
        })
    });
    let bad = got.expect_err("starts from 10 on fail");
    assert!(bad >= 10, "returned the error of start {bad}");
    // Each thread stops at the first failure it sees: at most one more call per thread.
    assert!(calls.load(Relaxed) < 100, "{} calls", calls.load(Relaxed));
}

#[test]
#[cfg_attr(miri, ignore)]
fn run_shares_the_work_between_the_caller_and_the_pool() {
    use std::collections::HashSet;
    use std::sync::Mutex;
    use std::time::{Duration, Instant};
    // Every start waits (up to 10 s) until two threads have taken starts, so the test passes
    // only if a second thread joins the caller while the caller is still working.
    let threads = Mutex::new(HashSet::new());
    in_pool(|| {
        TUNING.run(4, 1, |_| {
            threads.lock().unwrap().insert(std::thread::current().id());
            let t0 = Instant::now();
            while threads.lock().unwrap().len() < 2 && t0.elapsed() < Duration::from_secs(10) {
                std::thread::sleep(Duration::from_millis(1));
            }
            Ok::<(), ()>(())
        })
    })
    .unwrap();
    assert!(threads.into_inner().unwrap().len() >= 2);
}
