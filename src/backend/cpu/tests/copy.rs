//! Box copies against the naive copy.

use super::*;
use crate::backend::cpu::copy::{copy_boxes_tuned, RawCopy, Stores, SEQUENTIAL, TUNING};
use crate::backend::cpu::{copy_box, copy_strided, pack, unpack};

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
