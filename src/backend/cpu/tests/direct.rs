//! The gather from the caller's indices (`direct.rs`), through `ops::gather` as users call
//! it, against a naive loop: every row size (the word sizes and two byte rows), random,
//! sorted, blocked and negative indices, with and without `out`, and bad indices.

use super::*;
use crate::backend::cpu::direct::{DIRECT_MIN, LAST_FIRST};
use crate::error::Error;
use crate::ops;
use crate::tensor::Tensor;

/// Long enough for the direct path, in several ranges of several check steps.
fn count() -> usize {
    DIRECT_MIN + 37
}

/// `n` indices into `len` rows: random, sorted, runs of 32 consecutive ones (the kernel's
/// run copies and their prefetch), or random with a third of them negative.
fn pattern(rng: &mut Rng, kind: usize, n: usize, len: usize) -> Vec<i64> {
    let mut v: Vec<i64> = (0..n).map(|_| rng.below(len) as i64).collect();
    match kind {
        0 => {}
        1 => v.sort_unstable(),
        2 => {
            for (i, x) in v.iter_mut().enumerate() {
                *x = ((i / 32 * 7919 * 32) % (len - 32) + i % 32) as i64;
            }
        }
        _ => {
            for x in v.iter_mut().filter(|_| rng.below(3) == 0) {
                *x -= len as i64;
            }
        }
    }
    v
}

/// `out[i] = src[idx[i]]` over rows of `row` bytes, negative indices counted from the end.
fn naive(src: &[u8], row: usize, idx: &[i64]) -> Vec<u8> {
    let len = (src.len() / row.max(1)) as i64;
    let mut out = Vec::with_capacity(idx.len() * row);
    for &i in idx {
        let j = if i < 0 { i + len } else { i } as usize;
        out.extend_from_slice(&src[j * row..(j + 1) * row]);
    }
    out
}

/// A pool of one thread, where the ranges run one after the other on the calling thread.
fn one_thread() -> rayon::ThreadPool {
    rayon::ThreadPoolBuilder::new()
        .num_threads(1)
        .build()
        .unwrap()
}

fn bytes(t: &Tensor) -> Vec<u8> {
    t.to_array::<u8>().unwrap().into_raw_vec_and_offset().0
}

#[test]
fn long_index_lists_match_a_naive_loop() {
    let mut rng = Rng(17);
    let len = 1000;
    for row in [1, 2, 4, 8, 16, 3, 12] {
        let data: Vec<u8> = (0..len * row).map(|_| rng.next() as u8).collect();
        // Rows of a matrix (axis 0), and the same behind a leading axis of extent 1.
        for (shape, axis) in [(vec![len, row], 0), (vec![1, len, row], 1)] {
            let src = Tensor::from_slice(&data, &shape).unwrap();
            for kind in 0..4 {
                if cfg!(miri) && (kind + row + axis) % 2 == 1 {
                    continue; // half the cases under Miri, every pattern for some row size
                }
                let idx = pattern(&mut rng, kind, count(), len);
                let want = naive(&data, row, &idx);
                let it = Tensor::from_slice(&idx, &[idx.len()]).unwrap();
                let got = in_pool(|| ops::gather(&src, &it, axis, None)).unwrap();
                let mut out_shape = shape.clone();
                out_shape[axis] = idx.len();
                assert_eq!(got.shape(), &out_shape[..]);
                assert_eq!(bytes(&got), want, "row {row}, axis {axis}, pattern {kind}");
                // Into a given `out` (through a buffer of the gather's own up to 8 bytes a row,
                // the copied indices above).
                let out = Tensor::zeros(&out_shape, got.dtype()).unwrap();
                in_pool(|| ops::gather(&src, &it, axis, Some(&out))).unwrap();
                assert_eq!(bytes(&out), want, "into out: row {row}, pattern {kind}");
            }
        }
    }
}

/// A long gather from pinned (`kDLCUDAHost`) memory into an `out` of plain host memory goes
/// through a buffer of the gather's own, which is dlpart's scratch memory: plain host memory
/// too, not new pinned memory, so the gather needs no CUDA (where CUDA is missing, asking
/// for pinned memory fails).
#[test]
fn a_long_gather_from_pinned_memory_into_host_memory_makes_no_pinned_memory() {
    let len = 40;
    let data: Vec<u8> = (0..len as u8).map(|k| k.wrapping_mul(3)).collect();
    let backing = Tensor::from_slice(&data, &[len]).unwrap();
    let pinned = crate::device::Device::new(crate::device::DeviceType::CudaHost, 0).unwrap();
    // SAFETY: `backing`'s memory, whose owner the view shares, labelled as pinned host memory,
    // which the CPU reads as it reads any host memory.
    let src = unsafe { backing.labelled(pinned) };
    let mut rng = Rng(23);
    let idx = pattern(&mut rng, 3, count(), len);
    let it = Tensor::from_slice(&idx, &[idx.len()]).unwrap();
    let out = Tensor::from_slice(&vec![0xAB_u8; idx.len()], &[idx.len()]).unwrap();
    in_pool(|| ops::gather(&src, &it, 0, Some(&out))).unwrap();
    assert_eq!(bytes(&out), naive(&data, 1, &idx));
}

#[test]
fn float_rows_match_a_naive_loop() {
    let mut rng = Rng(5);
    let (len, inner) = (300, 3);
    let values: Vec<f32> = (0..len * inner).map(|k| k as f32 * 0.5).collect();
    let src = Tensor::from_slice(&values, &[len, inner]).unwrap();
    let idx = pattern(&mut rng, 3, count(), len);
    let it = Tensor::from_slice(&idx, &[idx.len()]).unwrap();
    let got = in_pool(|| ops::gather(&src, &it, 0, None)).unwrap();
    let got = got.to_array::<f32>().unwrap().into_raw_vec_and_offset().0;
    let want: Vec<f32> = idx
        .iter()
        .flat_map(|&i| {
            let j = if i < 0 { i + len as i64 } else { i } as usize;
            values[j * inner..(j + 1) * inner].to_vec()
        })
        .collect();
    assert_eq!(got, want);
}

#[test]
fn the_first_bad_index_in_order_is_reported_and_out_is_untouched() {
    let len = 50;
    let data: Vec<u8> = (0..len as u8).collect();
    let src = Tensor::from_slice(&data, &[len]).unwrap();
    let n = count();
    // Bad indices late in the list and early in a later range: the earliest one is named,
    // whichever thread finds its own first.
    for (first, second) in [
        (n - 1, n - 1),
        (n / 2, n - 3),
        (3, n / 2),
        (n / 5, n / 5 + 1),
    ] {
        for (bad1, bad2) in [(50i64, -51i64), (-51, i64::MAX), (i64::MIN, 50)] {
            let mut idx: Vec<i64> = (0..n).map(|i| (i % len) as i64).collect();
            idx[second] = bad2;
            idx[first] = bad1;
            let it = Tensor::from_slice(&idx, &[n]).unwrap();
            let out = Tensor::from_slice(&vec![0xAB_u8; n], &[n]).unwrap();
            for (o, last_first) in [(None, false), (Some(&out), false), (None, true)] {
                let gather = || ops::gather(&src, &it, 0, o);
                let got = if last_first {
                    // On one thread, later ranges first: both bad indices are found. The flag
                    // is the running thread's own, so it is set on the thread that gathers.
                    let last_first = || {
                        LAST_FIRST.with(|f| f.set(true));
                        let got = gather();
                        LAST_FIRST.with(|f| f.set(false));
                        got
                    };
                    // (Miri runs the ranges on this thread anyway, and cannot build a pool.)
                    if cfg!(miri) {
                        last_first()
                    } else {
                        one_thread().install(last_first)
                    }
                } else {
                    in_pool(gather)
                };
                match got {
                    Err(Error::IndexOutOfRange {
                        index,
                        axis: 0,
                        len: 50,
                    }) => assert_eq!(index, bad1 as i128, "bad at {first} and {second}"),
                    other => panic!("expected {bad1} out of range, got {other:?}"),
                }
            }
            assert!(bytes(&out).iter().all(|&b| b == 0xAB), "out was written");
        }
    }
}

#[test]
fn empty_rows_and_an_empty_axis_still_check_every_index() {
    let n = count();
    let mut idx: Vec<i64> = vec![1; n];
    let it = Tensor::from_slice(&idx, &[n]).unwrap();
    // Rows of zero bytes: nothing to copy, the indices are checked all the same.
    let src = Tensor::zeros(&[4, 0], crate::dtype::DType::Float32).unwrap();
    let got = ops::gather(&src, &it, 0, None).unwrap();
    assert_eq!(got.shape(), &[n, 0]);
    idx[n - 2] = -5;
    let bad = Tensor::from_slice(&idx, &[n]).unwrap();
    assert!(matches!(
        ops::gather(&src, &bad, 0, None),
        Err(Error::IndexOutOfRange {
            index: -5,
            len: 4,
            ..
        })
    ));
    // An axis of length 0: the first index is already out of range.
    let empty = Tensor::zeros(&[0, 3], crate::dtype::DType::Float32).unwrap();
    assert!(matches!(
        ops::gather(&empty, &it, 0, None),
        Err(Error::IndexOutOfRange {
            index: 1,
            len: 0,
            ..
        })
    ));
}

#[test]
fn the_prefetch_ahead_stays_inside_the_index_list() {
    // Ranges of a multiple of eight indices, the last ending at the list's end, with runs of
    // consecutive indices: a run's prefetch looks furthest ahead, to the list's last index
    // and no further (Miri reports a read past the list).
    let n = 96 * (DIRECT_MIN.div_ceil(96)).max(6);
    let len = 4096;
    let data: Vec<u8> = (0..len).map(|k| (k * 7) as u8).collect();
    let src = Tensor::from_slice(&data, &[len]).unwrap();
    let idx: Vec<i64> = (0..n)
        .map(|i| ((i / 32 * 97 * 32 + i % 32) % len) as i64)
        .collect();
    let it = Tensor::from_slice(&idx, &[n]).unwrap();
    let got = in_pool(|| ops::gather(&src, &it, 0, None)).unwrap();
    assert_eq!(bytes(&got), naive(&data, 1, &idx));
}
