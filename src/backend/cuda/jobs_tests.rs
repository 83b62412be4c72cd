//! The job building itself: magic division, widening, splitting, the table layout. What the
//! kernels make of the tables is tested by running the kernel source itself (host_kernels.rs,
//! feature `kernel-host-tests`).

use super::*;

use crate::test_rng::Rng;

#[test]
fn magic_division_matches_integer_division() {
    let mut rng = Rng(7);
    let mut divisors: Vec<u32> = vec![1, 2, 3, 5, 7, 255, 256, 257, 1000, 65535, 65536, 65537];
    divisors.extend([(1 << 30) - 1, 1 << 30, (1 << 30) + 1, (1 << 31) - 1]);
    divisors.extend((0..200).map(|_| 1 + (rng.next() % ((1 << 31) - 1)) as u32));
    for &d in &divisors {
        let (m, s) = magic_divider(d);
        let mut ns: Vec<u32> = vec![0, 1, d - 1, d, (1 << 31) - 1];
        ns.extend(d.checked_add(1).filter(|&n| n < 1 << 31));
        ns.extend((0..200).map(|_| (rng.next() % (1 << 31)) as u32));
        for n in ns {
            assert_eq!(magic_div(n, m, s), n / d, "{n} / {d}");
        }
    }
}

#[test]
fn aligned_contiguous_runs_move_in_16_byte_words() {
    // A 2048 x 2048 f32 box of an 8192-wide row-major array into a contiguous block.
    let t = RawCopy {
        src: 256 + 4 * 2048,
        dst: 4096,
        item: 4,
        shape: vec![2048, 2048],
        src_strides: vec![8192, 1],
        dst_strides: vec![2048, 1],
        axis: None,
        index: 0,
        index_len: 0,
    };
    let l = to_launches(std::slice::from_ref(&t), Mode::Box, MAX_JOB_NUMEL).unwrap();
    assert_eq!(l.len(), 1);
    let j = &l[0].jobs[0];
    assert_eq!((l[0].word, j.ndim), (16, 2));
    assert_eq!((j.size[0], j.size[1]), (512, 2048));
    assert_eq!((j.src_stride[1], j.dst_stride[1]), (2048, 512));
    // Shifted by one element the run is only 4-byte aligned: no widening.
    let odd = RawCopy {
        src: t.src + 4,
        ..t.clone()
    };
    assert_eq!(
        to_launches(&[odd], Mode::Box, MAX_JOB_NUMEL).unwrap()[0].word,
        4
    );
    // Both sides contiguous: one flat run.
    let flat = RawCopy {
        src_strides: vec![2048, 1],
        ..t
    };
    let l = to_launches(&[flat], Mode::Box, MAX_JOB_NUMEL).unwrap();
    assert_eq!(
        (l[0].jobs[0].ndim, l[0].jobs[0].size[0]),
        (1, 2048 * 2048 / 4)
    );
}

#[test]
fn gathered_blocks_of_32_floats_move_in_16_byte_words() {
    let t = RawCopy {
        src: 0,
        dst: 1 << 20,
        item: 4,
        shape: vec![1000, 32],
        src_strides: vec![32, 1],
        dst_strides: vec![32, 1],
        axis: Some(0),
        index: 1 << 30,
        index_len: 5000,
    };
    let l = to_launches(&[t], Mode::Gather, MAX_JOB_NUMEL).unwrap();
    let j = &l[0].jobs[0];
    assert_eq!((l[0].word, j.ndim, j.axis), (16, 2, 1));
    assert_eq!((j.size[0], j.size[1], j.src_stride[1]), (8, 1000, 8));
}

#[test]
fn huge_copies_split_below_2_pow_31_elements() {
    let n = 5usize << 31;
    let t = RawCopy {
        src: 0,
        dst: 1 << 40,
        item: 1,
        shape: vec![n],
        src_strides: vec![3],
        dst_strides: vec![1],
        axis: None,
        index: 0,
        index_len: 0,
    };
    let l = to_launches(&[t], Mode::Box, MAX_JOB_NUMEL).unwrap();
    let jobs: Vec<&CudaJob> = l.iter().flat_map(|l| &l.jobs).collect();
    assert_eq!(
        jobs.iter().map(|j| u64::from(j.numel)).sum::<u64>(),
        n as u64
    );
    let mut next = 0u64;
    for j in jobs {
        assert!(u64::from(j.numel) <= MAX_JOB_NUMEL);
        assert_eq!((j.src, j.dst), (3 * next, (1 << 40) + next));
        next += u64::from(j.numel);
    }
}

#[test]
fn empty_boxes_launch_nothing_and_bad_items_are_named() {
    let t = RawCopy {
        src: 0,
        dst: 0,
        item: 4,
        shape: vec![3, 0],
        src_strides: vec![1, 1],
        dst_strides: vec![1, 1],
        axis: None,
        index: 0,
        index_len: 0,
    };
    assert!(
        to_launches(std::slice::from_ref(&t), Mode::Box, MAX_JOB_NUMEL)
            .unwrap()
            .is_empty()
    );
    let e = to_launches(
        &[RawCopy {
            item: 3,
            shape: vec![2],
            ..t
        }],
        Mode::Box,
        MAX_JOB_NUMEL,
    );
    assert!(e.unwrap_err().to_string().contains("item size 3"));
}

#[test]
fn constants_match_the_kernel_header() {
    let header = super::super::nvrtc::COMMON;
    let define = |name: &str| -> String {
        let line = header
            .lines()
            .find(|l| l.starts_with(&format!("#define {name} ")))
            .unwrap_or_else(|| panic!("{name} not defined in common.cuh"));
        line.split_whitespace().nth(2).unwrap().to_string()
    };
    assert_eq!(define("DLP_MAX_DIMS"), MAX_DIMS.to_string());
    assert_eq!(define("DLP_BLOCK"), BLOCK.to_string());
    assert_eq!(define("DLP_UNROLL"), UNROLL.to_string());
    assert_eq!(define("DLP_NO_AXIS"), format!("{NO_AXIS:#x}u"));
    assert!(header.contains(&format!(
        "sizeof(DlpJob) == {}",
        std::mem::size_of::<CudaJob>()
    )));
}

#[test]
fn job_bytes_follow_the_c_layout() {
    use std::mem::offset_of;
    let j = CudaJob {
        src: 1,
        dst: 2,
        index: 3,
        index_len: -4,
        tile_start: 5,
        numel: 6,
        ndim: 7,
        axis: 8,
        size: [9; MAX_DIMS],
        magic: [10; MAX_DIMS],
        shift: [11; MAX_DIMS],
        src_stride: [-12; MAX_DIMS],
        dst_stride: [13; MAX_DIMS],
    };
    let b = j.to_bytes();
    assert_eq!(b.len(), std::mem::size_of::<CudaJob>());
    let u64_at = |o: usize| i64::from_le_bytes(b[o..o + 8].try_into().unwrap());
    let u32_at = |o: usize| u32::from_le_bytes(b[o..o + 4].try_into().unwrap());
    // Offsets of DlpJob in kernels/common.cuh, by hand: 4 x 8-byte words, 4 x u32, then
    // three u32[6] arrays and two i64[6] arrays.
    let c_offsets = [(0, 1), (8, 2), (16, 3), (24, -4), (120, -12), (168, 13)];
    for (o, v) in c_offsets {
        assert_eq!(u64_at(o), v, "offset {o}");
    }
    for (o, v) in [
        (32, 5),
        (36, 6),
        (40, 7),
        (44, 8),
        (48, 9),
        (72, 10),
        (96, 11),
    ] {
        assert_eq!(u32_at(o), v, "offset {o}");
    }
    // And rustc's repr(C) layout agrees.
    assert_eq!(
        [
            offset_of!(CudaJob, tile_start),
            offset_of!(CudaJob, size),
            offset_of!(CudaJob, src_stride)
        ],
        [32, 48, 120]
    );
}
