//! Checks the job tables by running them through a host model of the kernels (same tile
//! walk, magic division and offset rules as kernels/common.cuh) over a fake address space,
//! and comparing with naive strided loops.

use super::*;

/// xorshift64*: deterministic, no dependency.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

/// Byte regions at fake device addresses; every access is bounds-checked.
struct Memory(Vec<(u64, Vec<u8>)>);
impl Memory {
    fn region(&mut self, addr: u64, len: usize) -> &mut [u8] {
        for (base, bytes) in &mut self.0 {
            if addr >= *base && addr + len as u64 <= *base + bytes.len() as u64 {
                let o = (addr - *base) as usize;
                return &mut bytes[o..o + len];
            }
        }
        panic!("access of {len} bytes at {addr:#x} is outside every buffer");
    }
    fn read_i64(&mut self, addr: u64) -> i64 {
        i64::from_le_bytes(self.region(addr, 8).try_into().unwrap())
    }
}

/// The kernels' algorithm: tiles, binary search, per-element offsets, the winner rule.
fn run_model(mem: &mut Memory, launches: &[Launch], index: u64, nindex: usize) {
    for l in launches {
        let mut winner = std::collections::HashMap::new();
        if l.mode == Mode::Scatter {
            for p in 0..nindex {
                let a = index + 8 * p as u64;
                winner.insert(mem.read_i64(a), a); // later positions overwrite
            }
        }
        for tile in 0..l.ntiles {
            let j = l.jobs.partition_point(|j| j.tile_start <= tile) - 1;
            let job = &l.jobs[j];
            for t in 0..TILE {
                let i = (tile - job.tile_start) * TILE + t;
                if i < job.numel {
                    copy_element(mem, l, job, i, &winner);
                }
            }
        }
    }
}

fn copy_element(
    mem: &mut Memory,
    l: &Launch,
    job: &CudaJob,
    mut i: u32,
    winner: &std::collections::HashMap<i64, u64>,
) {
    let (mut s, mut d) = (0i64, 0i64);
    for k in 0..job.ndim as usize {
        let mut c = i;
        if k + 1 < job.ndim as usize {
            let q = magic_div(i, job.magic[k], job.shift[k]);
            c = i - q * job.size[k];
            i = q;
        }
        assert!(
            c < job.size[k],
            "coordinate {c} outside dim of size {}",
            job.size[k]
        );
        let (mut cs, mut cd) = (i64::from(c), i64::from(c));
        if k as u32 == job.axis {
            let a = job.index + 8 * u64::from(c);
            assert_eq!(a % 8, 0, "misaligned index");
            let t = mem.read_i64(a);
            assert!((0..job.index_len).contains(&t), "index {t}");
            if l.mode == Mode::Scatter && winner[&t] != a {
                return;
            }
            if l.mode == Mode::Gather {
                cs = t;
            } else {
                cd = t;
            }
        }
        s += cs * job.src_stride[k];
        d += cd * job.dst_stride[k];
    }
    let w = l.word as i64;
    let (sa, da) = (
        job.src.wrapping_add((s * w) as u64),
        job.dst.wrapping_add((d * w) as u64),
    );
    // The GPU faults on misaligned words.
    assert!(
        sa % w as u64 == 0 && da % w as u64 == 0,
        "misaligned {w}-byte word"
    );
    let v = mem.region(sa, l.word).to_vec();
    mem.region(da, l.word).copy_from_slice(&v);
}

const SRC: u64 = 1 << 32;
const DST: u64 = 2 << 32;
const IDX: u64 = 3 << 32;

/// A random strided layout for `shape`: permuted, padded, some dims reversed. Returns the
/// strides and the element offset of element 0 from the buffer start, and the buffer length.
fn layout(rng: &mut Rng, shape: &[usize]) -> (Vec<isize>, usize, usize) {
    let mut order: Vec<usize> = (0..shape.len()).collect();
    if rng.below(3) == 0 {
        for i in (1..order.len()).rev() {
            order.swap(i, rng.below(i + 1));
        }
    }
    let mut strides = vec![0isize; shape.len()];
    let mut acc = 1usize;
    for &d in order.iter().rev() {
        strides[d] = acc as isize;
        acc *= shape[d] + rng.below(2);
    }
    let mut origin = rng.below(3);
    for d in 0..shape.len() {
        if rng.below(4) == 0 {
            origin += (shape[d] - 1) * strides[d] as usize;
            strides[d] = -strides[d];
        }
    }
    (strides, origin, acc + origin + 2)
}

fn random_shape(rng: &mut Rng, max_ndim: usize) -> Vec<usize> {
    (0..rng.below(max_ndim + 1))
        .map(|_| 1 + rng.below(4))
        .collect()
}

fn random_bytes(rng: &mut Rng, n: usize) -> Vec<u8> {
    (0..n).map(|_| rng.next() as u8).collect()
}

/// Offset of multi-index `idx` with `strides`, in elements.
fn offset(idx: &[usize], strides: &[isize]) -> isize {
    idx.iter().zip(strides).map(|(&i, &s)| i as isize * s).sum()
}

fn for_each_index(shape: &[usize], mut f: impl FnMut(&[usize])) {
    if shape.contains(&0) {
        return;
    }
    let mut idx = vec![0usize; shape.len()];
    loop {
        f(&idx);
        let Some(d) = (0..shape.len()).rev().find(|&d| idx[d] + 1 < shape[d]) else {
            return;
        };
        idx[d] += 1;
        idx[d + 1..].iter_mut().for_each(|x| *x = 0);
    }
}

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
fn box_copies_match_naive_strided_loops() {
    let mut rng = Rng(42);
    for case in 0..400 {
        let item = WORDS[rng.below(WORDS.len())];
        let shape = random_shape(&mut rng, 8);
        let (ss, so, slen) = layout(&mut rng, &shape);
        let (ds, dof, dlen) = layout(&mut rng, &shape);
        // Foreign tensors may start at any byte.
        let (smis, dmis) = (
            rng.below(item) * rng.below(2),
            rng.below(item) * rng.below(2),
        );
        let src = random_bytes(&mut rng, slen * item + smis);
        let dst = random_bytes(&mut rng, dlen * item + dmis);
        let mut expect = dst.clone();
        for_each_index(&shape, |idx| {
            let s = (so as isize + offset(idx, &ss)) as usize * item + smis;
            let d = (dof as isize + offset(idx, &ds)) as usize * item + dmis;
            expect[d..d + item].copy_from_slice(&src[s..s + item]);
        });
        let t = Transfer {
            src: SRC + (so * item + smis) as u64,
            dst: DST + (dof * item + dmis) as u64,
            item,
            shape: shape.clone(),
            src_strides: ss,
            dst_strides: ds,
            axis: None,
            index: 0,
            index_len: 0,
        };
        let max_numel = [MAX_JOB_NUMEL, 5, 1 + rng.below(40) as u64][case % 3];
        let launches = plan(&[t], Mode::Box, max_numel).unwrap();
        for l in &launches {
            assert!(l
                .jobs
                .iter()
                .all(|j| u64::from(j.numel) <= max_numel && j.ndim as usize <= MAX_DIMS));
        }
        let mut mem = Memory(vec![(SRC, src), (DST, dst)]);
        run_model(&mut mem, &launches, 0, 0);
        assert_eq!(
            mem.0[1].1, expect,
            "case {case}: shape {shape:?}, item {item}"
        );
    }
}

/// Random gather (or scatter) along a random axis; duplicates allowed, later ones win.
fn check_indexed(mode: Mode, seed: u64) {
    let mut rng = Rng(seed);
    for case in 0..300 {
        let item = WORDS[rng.below(WORDS.len())];
        let mut shape = random_shape(&mut rng, 7);
        if shape.is_empty() {
            shape.push(3);
        }
        let axis = rng.below(shape.len());
        let len = 1 + rng.below(5); // extent of the indexed side
        let n = shape[axis]; // number of indices
        let indices: Vec<i64> = (0..n).map(|_| rng.below(len) as i64).collect();
        let mut indexed = shape.clone();
        indexed[axis] = len;
        let (src_shape, dst_shape) = match mode {
            Mode::Gather => (indexed, shape.clone()),
            _ => (shape.clone(), indexed),
        };
        let (ss, so, slen) = layout(&mut rng, &src_shape);
        let (ds, dof, dlen) = layout(&mut rng, &dst_shape);
        // Foreign tensors may start at any byte.
        let (smis, dmis) = (
            rng.below(item) * rng.below(2),
            rng.below(item) * rng.below(2),
        );
        let src = random_bytes(&mut rng, slen * item + smis);
        let dst = random_bytes(&mut rng, dlen * item + dmis);
        let mut expect = dst.clone();
        for_each_index(&shape, |idx| {
            let mut si = idx.to_vec();
            let mut di = idx.to_vec();
            match mode {
                Mode::Gather => si[axis] = indices[idx[axis]] as usize,
                _ => di[axis] = indices[idx[axis]] as usize,
            }
            let s = (so as isize + offset(&si, &ss)) as usize * item + smis;
            let d = (dof as isize + offset(&di, &ds)) as usize * item + dmis;
            expect[d..d + item].copy_from_slice(&src[s..s + item]);
        });
        let t = Transfer {
            src: SRC + (so * item + smis) as u64,
            dst: DST + (dof * item + dmis) as u64,
            item,
            shape: shape.clone(),
            src_strides: ss,
            dst_strides: ds,
            axis: Some(axis),
            index: IDX,
            index_len: len,
        };
        let max_numel = [MAX_JOB_NUMEL, 3, 1 + rng.below(30) as u64][case % 3];
        let launches = plan(&[t], mode, max_numel).unwrap();
        let idx_bytes = indices.iter().flat_map(|i| i.to_le_bytes()).collect();
        let mut mem = Memory(vec![(SRC, src), (DST, dst), (IDX, idx_bytes)]);
        run_model(&mut mem, &launches, IDX, n);
        assert_eq!(
            mem.0[1].1, expect,
            "case {case}: {mode:?} shape {shape:?} axis {axis}"
        );
    }
}

#[test]
fn gathers_match_naive_loops() {
    check_indexed(Mode::Gather, 3);
}

#[test]
fn scatters_match_naive_loops_with_last_duplicate_winning() {
    check_indexed(Mode::Scatter, 5);
}

#[test]
fn aligned_contiguous_runs_move_in_16_byte_words() {
    // A 2048 x 2048 f32 box of an 8192-wide row-major array into a contiguous block.
    let t = Transfer {
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
    let l = plan(std::slice::from_ref(&t), Mode::Box, MAX_JOB_NUMEL).unwrap();
    assert_eq!(l.len(), 1);
    let j = &l[0].jobs[0];
    assert_eq!((l[0].word, j.ndim), (16, 2));
    assert_eq!((j.size[0], j.size[1]), (512, 2048));
    assert_eq!((j.src_stride[1], j.dst_stride[1]), (2048, 512));
    // Shifted by one element the run is only 4-byte aligned: no widening.
    let odd = Transfer {
        src: t.src + 4,
        ..t.clone()
    };
    assert_eq!(plan(&[odd], Mode::Box, MAX_JOB_NUMEL).unwrap()[0].word, 4);
    // Both sides contiguous: one flat run.
    let flat = Transfer {
        src_strides: vec![2048, 1],
        ..t
    };
    let l = plan(&[flat], Mode::Box, MAX_JOB_NUMEL).unwrap();
    assert_eq!(
        (l[0].jobs[0].ndim, l[0].jobs[0].size[0]),
        (1, 2048 * 2048 / 4)
    );
}

#[test]
fn gathered_blocks_of_32_floats_move_in_16_byte_words() {
    let t = Transfer {
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
    let l = plan(&[t], Mode::Gather, MAX_JOB_NUMEL).unwrap();
    let j = &l[0].jobs[0];
    assert_eq!((l[0].word, j.ndim, j.axis), (16, 2, 1));
    assert_eq!((j.size[0], j.size[1], j.src_stride[1]), (8, 1000, 8));
}

#[test]
fn huge_copies_split_below_2_pow_31_elements() {
    let n = 5usize << 31;
    let t = Transfer {
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
    let l = plan(&[t], Mode::Box, MAX_JOB_NUMEL).unwrap();
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
    let t = Transfer {
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
    assert!(plan(std::slice::from_ref(&t), Mode::Box, MAX_JOB_NUMEL)
        .unwrap()
        .is_empty());
    let e = plan(
        &[Transfer {
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
