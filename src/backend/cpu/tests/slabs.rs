//! Gathers and scatters of few big slabs (`slabs.rs`): the faces of a cube along every axis,
//! on the calling thread and split among threads, against the naive loops.

use super::index::{naive_gather, naive_scatter, with_len};
use super::*;
use crate::backend::cpu::copy::TUNING;
use crate::backend::cpu::index::{gather_tuned, scatter_tuned};
use crate::backend::cpu::slabs::{here, plan_of};

/// How the cube is laid out in memory.
#[derive(Clone, Copy, Debug)]
enum Layout {
    /// C order, as numpy's arrays and the halo benchmark's cube.
    Contiguous,
    /// A view of a C-ordered array 3 elements larger along every axis (the interior of a
    /// field with ghost layers): rows stay contiguous, with gaps between them.
    Interior,
    /// Dims in random order, with gaps, some flipped (see [`Buf::random`]).
    Random,
}

fn buf(rng: &mut Rng, shape: &[usize], item: usize, layout: Layout) -> Buf {
    match layout {
        Layout::Contiguous => Buf::contiguous(rng, shape, item),
        Layout::Interior => {
            let outer: Vec<usize> = shape.iter().map(|&n| n + 3).collect();
            let strides = crate::tensor::contiguous_strides(&outer);
            Buf::with_strides(rng, shape, strides, item)
        }
        Layout::Random => Buf::random(rng, shape, item, false),
    }
}

/// Gathers slabs `idx` along `axis` of a `shape` source into a buffer, and scatters a buffer
/// of values into slabs `idx` of a `shape` destination; both laid out as `layout` (the
/// buffers in C order), with `tuning`, against the naive loops.
fn check(rng: &mut Rng, shape: &[usize], axis: usize, idx: &[i64], item: usize, layout: Layout) {
    for tuning in [TUNING, TINY] {
        let what = format!("{shape:?} axis {axis} idx {idx:?} item {item} {layout:?}");
        let src = buf(rng, shape, item, layout);
        let mut out = Buf::contiguous(rng, &with_len(shape, axis, idx.len()), item);
        let mut want = out.clone();
        naive_gather(&src, idx, axis, &mut want);
        // SAFETY: separate buffers; the boxes lie inside them.
        in_pool(|| unsafe { gather_tuned(src.src(), idx, axis, out.dst(), item, &tuning) })
            .unwrap();
        assert!(out.bytes == want.bytes, "gather {what} {tuning:?}");

        let values = Buf::contiguous(rng, &with_len(shape, axis, idx.len()), item);
        let mut dst = buf(rng, shape, item, layout);
        let mut want = dst.clone();
        naive_scatter(&values, idx, axis, &mut want);
        // SAFETY: separate buffers; the boxes lie inside them.
        in_pool(|| unsafe { scatter_tuned(values.src(), idx, axis, dst.dst(), item, &tuning) })
            .unwrap();
        assert!(dst.bytes == want.bytes, "scatter {what} {tuning:?}");
    }
}

/// The halo faces of a 64³ cube (slabs of 4096 elements, the fewest this path takes) along
/// every axis: one face, both faces, and a repeated index (the scatter's later slab wins).
/// Along axis 1 the faces are 64 rows of 64 items; along axis 2 single strided items.
#[test]
#[cfg_attr(
    miri,
    ignore = "64³ cubes take minutes under Miri; see a_face_of_strided_rows"
)]
fn cube_faces_along_every_axis() {
    let mut rng = Rng::new(23);
    let n = 64;
    for layout in [Layout::Contiguous, Layout::Interior, Layout::Random] {
        for axis in 0..3 {
            for idx in [&[0][..], &[n - 1], &[n - 1, 0], &[5, 2, 5]] {
                for item in [4, 1, 8, 3] {
                    check(&mut rng, &[n as usize; 3], axis, idx, item, layout);
                }
            }
        }
    }
}

/// One face along axis 1 of a small box, 4 rows of 1 KiB with gaps between them, against
/// rows copied by hand: the strided rows the calling thread copies, small enough for Miri
/// (whose time the naive loops would take).
#[test]
fn a_face_of_strided_rows() {
    let mut rng = Rng::new(24);
    let (shape, face, row) = ([4, 3, 1024], [4, 1, 1024], 1024);
    let strides = vec![3 * 1030, 1030, 1];
    let src = Buf::with_strides(&mut rng, &shape, strides.clone(), 1);
    let mut out = Buf::contiguous(&mut rng, &face, 1);
    // SAFETY: separate buffers; the boxes lie inside them.
    unsafe { gather_tuned(src.src(), &[2], 1, out.dst(), 1, &TUNING) }.unwrap();
    for t in 0..4 {
        let (o, s) = (out.offset(&[t, 0, 0]), src.offset(&[t, 2, 0]));
        assert!(
            out.bytes[o..o + row] == src.bytes[s..s + row],
            "gathered row {t}"
        );
    }
    let values = Buf::contiguous(&mut rng, &face, 1);
    let mut dst = Buf::with_strides(&mut rng, &shape, strides, 1);
    let mut want = dst.bytes.clone();
    for t in 0..4 {
        let (d, v) = (dst.offset(&[t, 1, 0]), values.offset(&[t, 0, 0]));
        want[d..d + row].copy_from_slice(&values.bytes[v..v + row]);
    }
    // SAFETY: as above.
    unsafe { scatter_tuned(values.src(), &[1], 1, dst.dst(), 1, &TUNING) }.unwrap();
    assert!(dst.bytes == want, "scattered rows");
}

/// Edge sizes around the faces along axis 1: no indices, empty and single-element dims,
/// a source extent of 1 along the axis, rows of one item, rows just under and at a cache
/// line (48 and 64 bytes), and the slab size just under the path's threshold.
#[test]
#[cfg_attr(miri, ignore = "slabs of 4096 elements take minutes under Miri")]
fn face_edge_sizes() {
    let mut rng = Rng::new(25);
    let cases: &[(&[usize], &[i64], usize)] = &[
        (&[64, 5, 64], &[], 4),
        (&[0, 5, 4096], &[1], 4),
        (&[64, 5, 0], &[1, 4], 4),
        (&[64, 1, 64], &[0], 4),
        (&[1, 3, 4096], &[2], 4),
        (&[4096, 2, 1], &[1], 4),
        (&[342, 2, 12], &[1, 0], 4),
        (&[256, 2, 16], &[0, 1], 4),
        (&[64, 2, 63], &[1], 4),
    ];
    for &(shape, idx, item) in cases {
        for layout in [Layout::Contiguous, Layout::Interior, Layout::Random] {
            check(&mut rng, shape, 1, idx, item, layout);
        }
    }
}

/// Which slabs the calling thread copies alone: the halo faces of a 512³ float32 cube along
/// axes 0 and 1 (1 MiB each, rows of 2 KiB or one run), not along axis 2 (single items 2 KiB
/// apart), nor more than the limit in all, nor rows shorter than a cache line.
#[test]
fn slabs_copied_on_the_calling_thread() {
    let n = 512usize;
    let cube = crate::tensor::contiguous_strides(&[n, n, n]);
    let face = |axis: usize| {
        let mut s = [n; 3];
        s[axis] = 1;
        s
    };
    let decide = |shape: &[usize], src: &[isize], m: usize| {
        let out = crate::tensor::contiguous_strides(shape);
        here(&plan_of(shape, src, &out, 4), m, &TUNING)
    };
    assert!(decide(&face(0), &cube, 2));
    assert!(decide(&face(1), &cube, 2));
    assert!(!decide(&face(2), &cube, 2));
    // 4 MiB in all is the limit: four faces are copied here, five are not.
    assert!(decide(&face(1), &cube, 4));
    assert!(!decide(&face(1), &cube, 5));
    // Rows of 15 and 16 float32 (60 and 64 bytes).
    let rows = |w: usize| {
        let shape = [4096, 1, w];
        decide(&shape, &crate::tensor::contiguous_strides(&[4096, 8, w]), 1)
    };
    assert!(!rows(15));
    assert!(rows(16));
}
