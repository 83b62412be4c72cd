//! The real kernel source, compiled for the host, over the job tables the CUDA backend
//! builds, compared with the CPU backend: every item size, negative and zero strides,
//! unaligned starts, partial tiles, grids smaller than the tile count, shuffled thread order,
//! offsets past 2^31 elements, duplicate and bad indices, and every index dtype.

use std::ffi::c_void;
use std::sync::Arc;

use super::{entries, launch, LaunchError, Region};
use crate::backend::cpu::CpuBackend;
use crate::backend::cuda::args::{CheckArgs, CopyArgs, WinnersArgs};
use crate::backend::cuda::index::winner_table;
use crate::backend::cuda::index_check::{index_value, verdict, Verdict};
use crate::backend::cuda::jobs::{to_launches, Launch, Mode, RawCopy, BLOCK, MAX_JOB_NUMEL, TILE};
use crate::backend::cuda::nvrtc::SOURCES;
use crate::backend::{Backend, BoxCopy};
use crate::{DType, Device, Error, Tensor};

use crate::test_rng::Rng;

/// Host memory standing in for device memory: 16-byte aligned, random bytes.
struct Buf(Vec<u128>, usize);
impl Buf {
    fn random(rng: &mut Rng, len: usize) -> Buf {
        let mut b = Buf(vec![0; len.div_ceil(16) + 1], len);
        b.bytes_mut().iter_mut().for_each(|x| *x = rng.next() as u8);
        b
    }
    fn addr(&self) -> u64 {
        self.0.as_ptr() as u64
    }
    fn bytes(&self) -> &[u8] {
        // SAFETY: the Vec holds at least `self.1` initialised bytes.
        unsafe { std::slice::from_raw_parts(self.0.as_ptr().cast(), self.1) }
    }
    fn bytes_mut(&mut self) -> &mut [u8] {
        // SAFETY: as for `bytes`, borrowed mutably.
        unsafe { std::slice::from_raw_parts_mut(self.0.as_mut_ptr().cast(), self.1) }
    }
    fn region(&self, writable: bool) -> Region {
        Region::new(self.addr(), self.1, writable)
    }
    fn dup(&self) -> Buf {
        Buf(self.0.clone(), self.1)
    }
}

/// An address range reserved but not backed until touched, for offsets past 2^31 elements.
struct Sparse(*mut u8, usize);
impl Sparse {
    fn new(len: usize) -> Sparse {
        // SAFETY: a fresh private anonymous mapping; no existing memory is affected.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                -1,
                0,
            )
        };
        assert_ne!(p, libc::MAP_FAILED, "cannot reserve {len} bytes");
        Sparse(p.cast(), len)
    }
    fn addr(&self) -> u64 {
        self.0 as u64
    }
    fn region(&self) -> Region {
        Region::new(self.addr(), self.1, true)
    }
}
impl Drop for Sparse {
    fn drop(&mut self) {
        // SAFETY: the mapping made in `new`, unmapped once.
        unsafe { libc::munmap(self.0.cast(), self.1) };
    }
}

fn dtype_for(item: usize) -> DType {
    match item {
        1 => DType::UInt8,
        2 => DType::Int16,
        4 => DType::Float32,
        8 => DType::Float64,
        16 => DType::Complex128,
        _ => unreachable!("no dtype of {item} bytes"),
    }
}

/// A host tensor at `addr` (element 0) with `strides`.
///
/// # Safety
/// Every element must lie in memory that outlives the tensor.
unsafe fn tensor_at(addr: u64, shape: &[usize], strides: &[isize], dtype: DType) -> Tensor {
    // SAFETY: the caller's contract.
    unsafe {
        Tensor::from_raw_parts(
            addr as *mut u8,
            shape.to_vec(),
            strides.to_vec(),
            dtype,
            Device::CPU,
            false,
            Arc::new(()),
        )
    }
}

fn cpu() -> Arc<dyn Backend> {
    CpuBackend::shared(Device::CPU)
}

/// How launches are run: the grid cap (the backend's is 8 blocks per SM) and the seed of
/// the thread order (0: in order).
#[derive(Clone, Copy, Debug)]
struct Schedule {
    max_grid: u32,
    seed: u64,
}

fn schedule(rng: &mut Rng) -> Schedule {
    Schedule {
        max_grid: [1, 2, 3, 7, 1056][rng.below(5)],
        seed: rng.next() % 4,
    }
}

fn kernel_name(l: &Launch) -> String {
    let family = match l.mode {
        Mode::Box => "copy_box",
        Mode::Gather => "gather",
        Mode::Scatter => "scatter",
    };
    format!("{family}_{}", l.word)
}

/// Launches as `CudaBackend::run` does: each job table serialised with `to_bytes`, the
/// grid `ntiles` capped, index kernels given the winner table (of `slots`, 0 for one word a
/// slot of the axis) and the status words.
fn run_launches(
    launches: &[Launch],
    winner: u64,
    slots: u64,
    status: u64,
    s: Schedule,
    regions: &[Region],
) -> Result<(), LaunchError> {
    for l in launches {
        let bytes: Vec<u8> = l.jobs.iter().flat_map(|j| j.to_bytes()).collect();
        let mut table = vec![0u64; bytes.len() / 8];
        for (w, c) in table.iter_mut().zip(bytes.chunks(8)) {
            *w = u64::from_le_bytes(c.try_into().unwrap());
        }
        let mut args = CopyArgs::new(l, table.as_ptr() as u64, winner, status).winner_slots(slots);
        let mut params = args.params();
        let grid = l.ntiles.clamp(1, s.max_grid);
        // SAFETY: the parameters match the kernel (a job table, two u32, and for index
        // kernels the winner table pointer, its u64 slot count and the status pointer); the
        // table and status outlive the launch; the caller's
        // transfers address only `regions`, which the launch enforces.
        unsafe { launch(&kernel_name(l), grid, BLOCK, &mut params, s.seed, regions) }?;
    }
    Ok(())
}

/// `scatter_winners` over `n` indices at `index` into `winner`: zeroed, `len` words when
/// `slots` is 0, else `2 * slots` (a hashed table).
#[allow(clippy::too_many_arguments)]
fn run_winners(
    index: u64,
    n: usize,
    len: usize,
    winner: u64,
    slots: u64,
    status: u64,
    s: Schedule,
    regions: &[Region],
) -> Result<(), LaunchError> {
    let mut args = WinnersArgs {
        index,
        n: n as u64,
        len: len as i64,
        winner,
        slots,
        status,
    };
    let mut params = args.params();
    let grid = (n.div_ceil(BLOCK as usize) as u32).clamp(1, s.max_grid);
    // SAFETY: matches `scatter_winners(const i64*, u64, i64, u64*, u64, u64*)`; the caller's
    // buffers are in `regions`, status is two u64 it owns.
    unsafe { launch("scatter_winners", grid, BLOCK, &mut params, s.seed, regions) }
}

/// A random strided layout for `shape`: permuted, padded, some dims reversed. Returns the
/// strides, the element offset of element 0 from the buffer start, and the buffer length.
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

/// Up to `max_ndim` dims, mostly small, one sometimes long enough for several tiles.
fn random_shape(rng: &mut Rng, max_ndim: usize) -> Vec<usize> {
    let mut shape: Vec<usize> = (0..rng.below(max_ndim + 1))
        .map(|_| 1 + rng.below(4))
        .collect();
    if !shape.is_empty() && rng.below(3) == 0 {
        let d = rng.below(shape.len());
        shape[d] = 1 + rng.below(3 * TILE as usize);
    }
    // At most a few tiles' worth: enough for partial and multiple tiles, quick on one thread.
    while shape.iter().product::<usize>() > 4 * TILE as usize {
        let d = (0..shape.len()).max_by_key(|&d| shape[d]).unwrap();
        shape[d] = shape[d].div_ceil(2);
    }
    shape
}

/// Source strides may be zero (a broadcast source); destinations never overlap themselves.
fn broadcast_some(rng: &mut Rng, strides: &mut [isize]) {
    for s in strides {
        if rng.below(6) == 0 {
            *s = 0;
        }
    }
}

fn max_numel(rng: &mut Rng, case: usize) -> u64 {
    [MAX_JOB_NUMEL, 5, 1 + rng.below(40) as u64, TILE as u64 + 1][case % 4]
}

#[test]
fn every_kernel_of_the_sources_runs_on_the_host() {
    let mut host = entries();
    host.sort();
    let mut listed: Vec<String> = SOURCES
        .iter()
        .flat_map(|s| s.entries)
        .map(|e| e.to_string())
        .collect();
    listed.sort();
    assert_eq!(host, listed);
    let mut params: Vec<*mut c_void> = Vec::new();
    // SAFETY: refused before any kernel runs: no parameter is read.
    let e = unsafe { launch("copy_box_4", 1, BLOCK / 2, &mut params, 0, &[]) };
    assert_eq!(e, Err(LaunchError::BadShape));
    // SAFETY: as above.
    let e = unsafe { launch("copy_box_3", 1, BLOCK, &mut params, 0, &[]) };
    assert_eq!(e, Err(LaunchError::UnknownEntry));
}

#[test]
fn box_copies_match_the_cpu_backend() {
    let mut rng = Rng(42);
    for case in 0..400 {
        let item = [1, 2, 4, 8, 16][case % 5];
        let shape = random_shape(&mut rng, 8);
        let (mut ss, so, slen) = layout(&mut rng, &shape);
        broadcast_some(&mut rng, &mut ss);
        let (ds, dof, dlen) = layout(&mut rng, &shape);
        // Foreign tensors may start at any byte.
        let (smis, dmis) = (
            rng.below(item) * rng.below(2),
            rng.below(item) * rng.below(2),
        );
        let src = Buf::random(&mut rng, slen * item + smis);
        let dst = Buf::random(&mut rng, dlen * item + dmis);
        let (src_at, dst_at) = (
            src.addr() + (so * item + smis) as u64,
            dst.addr() + (dof * item + dmis) as u64,
        );

        let expect = dst.dup();
        let exp_at = expect.addr() + (dof * item + dmis) as u64;
        // SAFETY: the layouts keep every element inside `src` and `expect`.
        let (s, d) = unsafe {
            (
                tensor_at(src_at, &shape, &ss, dtype_for(item)),
                tensor_at(exp_at, &shape, &ds, dtype_for(item)),
            )
        };
        let zeros = vec![0; shape.len()];
        cpu()
            .copy_boxes(&[BoxCopy {
                src: &s,
                src_start: zeros.clone(),
                dst: &d,
                dst_start: zeros,
                shape: shape.clone(),
            }])
            .unwrap();

        let t = RawCopy {
            src: src_at,
            dst: dst_at,
            item,
            shape: shape.clone(),
            src_strides: ss.clone(),
            dst_strides: ds.clone(),
            axis: None,
            index: 0,
            index_len: 0,
        };
        let launches = to_launches(&[t], Mode::Box, max_numel(&mut rng, case)).unwrap();
        let s = schedule(&mut rng);
        let regions = [src.region(false), dst.region(true)];
        run_launches(&launches, 0, 0, 0, s, &regions).unwrap();
        assert!(
            dst.bytes() == expect.bytes(),
            "case {case}: shape {shape:?} item {item} strides {ss:?} -> {ds:?}, {s:?}"
        );
    }
}

/// Random gathers or scatters along a random axis, duplicates included (later ones win).
/// With `hashed`, scatters go through the hashed winner table (sized by the number of
/// indices) instead of one word per slot of the axis.
fn check_indexed(mode: Mode, seed: u64, hashed: bool) {
    let mut rng = Rng(seed);
    for case in 0..300 {
        let item = [1, 2, 4, 8, 16][case % 5];
        let mut shape = random_shape(&mut rng, 6);
        if shape.is_empty() {
            shape.push(1 + rng.below(40));
        }
        let axis = rng.below(shape.len());
        let longest = if rng.below(2) == 0 {
            5
        } else {
            2 * TILE as usize
        };
        let len = 1 + rng.below(longest);
        let n = shape[axis];
        let indices: Vec<i64> = (0..n).map(|_| rng.below(len) as i64).collect();
        let mut indexed = shape.clone();
        indexed[axis] = len;
        let (src_shape, dst_shape) = match mode {
            Mode::Gather => (indexed, shape.clone()),
            _ => (shape.clone(), indexed),
        };
        let (mut ss, so, slen) = layout(&mut rng, &src_shape);
        broadcast_some(&mut rng, &mut ss);
        let (ds, dof, dlen) = layout(&mut rng, &dst_shape);
        let (smis, dmis) = (
            rng.below(item) * rng.below(2),
            rng.below(item) * rng.below(2),
        );
        let src = Buf::random(&mut rng, slen * item + smis);
        let dst = Buf::random(&mut rng, dlen * item + dmis);
        let (src_at, dst_at) = (
            src.addr() + (so * item + smis) as u64,
            dst.addr() + (dof * item + dmis) as u64,
        );
        let idx = Tensor::from_slice(&indices, &[n]).unwrap();

        let expect = dst.dup();
        let exp_at = expect.addr() + (dof * item + dmis) as u64;
        // SAFETY: the layouts keep every element inside `src` and `expect`.
        let (s, d) = unsafe {
            (
                tensor_at(src_at, &src_shape, &ss, dtype_for(item)),
                tensor_at(exp_at, &dst_shape, &ds, dtype_for(item)),
            )
        };
        match mode {
            Mode::Gather => cpu().gather(&s, &idx, axis, &d),
            _ => cpu().scatter(&s, &idx, axis, &d),
        }
        .unwrap();

        let t = RawCopy {
            src: src_at,
            dst: dst_at,
            item,
            shape: shape.clone(),
            src_strides: ss.clone(),
            dst_strides: ds.clone(),
            axis: Some(axis),
            index: idx.data_ptr() as u64,
            index_len: len,
        };
        let launches = to_launches(&[t], mode, max_numel(&mut rng, case)).unwrap();
        let s = schedule(&mut rng);
        let mut status = [0u64; 2];
        let slots = match hashed {
            true => (2 * n).max(2).next_power_of_two(),
            false => 0,
        };
        let winner = vec![0u64; if hashed { 2 * slots } else { len }];
        let (wp, sp) = (winner.as_ptr() as u64, status.as_mut_ptr() as u64);
        let regions = [
            src.region(false),
            dst.region(true),
            Region::new(idx.data_ptr() as u64, n * 8, false),
            Region::new(wp, winner.len() * 8, true),
            Region::new(sp, 16, true),
        ];
        if mode == Mode::Scatter {
            run_winners(
                idx.data_ptr() as u64,
                n,
                len,
                wp,
                slots as u64,
                sp,
                s,
                &regions,
            )
            .unwrap();
        }
        run_launches(&launches, wp, slots as u64, sp, s, &regions).unwrap();
        assert_eq!(status, [0, 0], "case {case}");
        assert!(
            dst.bytes() == expect.bytes(),
            "case {case}: {mode:?} shape {shape:?} axis {axis} len {len} item {item}, {s:?}"
        );
    }
}

#[test]
fn gathers_match_the_cpu_backend() {
    check_indexed(Mode::Gather, 3, false);
}

#[test]
fn scatters_match_the_cpu_backend_with_the_last_duplicate_winning() {
    check_indexed(Mode::Scatter, 5, false);
}

/// The hashed winner table, which the backend uses when it is smaller than one word per slot
/// of the axis: the same results, duplicates (many, with axes shorter than the index array)
/// included.
#[test]
fn scatters_through_a_hashed_winner_table_match_the_cpu_backend() {
    check_indexed(Mode::Scatter, 6, true);
}

#[test]
fn the_winner_table_grows_with_the_indices_not_the_axis() {
    // One word per slot while that is smaller; then 2 words per slot of a table of at least
    // twice as many slots as indices.
    assert_eq!(winner_table(4, 10), (0, 80));
    assert_eq!(winner_table(1000, 100), (0, 800));
    assert_eq!(winner_table(1, 1 << 30), (2, 32));
    assert_eq!(winner_table(5, 100_000), (16, 256));
    assert_eq!(winner_table(3_000, 1 << 30), (8192, 8192 * 16));
    assert_eq!(winner_table(1 << 40, 1 << 40), (0, 8 << 40));
}

/// A gather or scatter kernel handed an out-of-range index (the check before it bypassed)
/// reports it and moves nothing through it; the other rows still move.
#[test]
fn bad_indices_are_reported_and_never_followed() {
    let mut rng = Rng(11);
    let (n, len, cols) = (9usize, 6usize, 3usize);
    for mode in [Mode::Gather, Mode::Scatter] {
        for item in [1, 2, 4, 8, 16] {
            for bad in [len as i64, len as i64 + 1000, -1, i64::MIN, i64::MAX] {
                let at = rng.below(n);
                let mut indices: Vec<i64> = (0..n).map(|p| ((p * 5) % len) as i64).collect();
                indices[at] = bad;
                let (src_rows, dst_rows) = match mode {
                    Mode::Gather => (len, n),
                    _ => (n, len),
                };
                let src = Buf::random(&mut rng, src_rows * cols * item);
                let dst = Buf::random(&mut rng, dst_rows * cols * item);
                let before = dst.dup();
                let t = RawCopy {
                    src: src.addr(),
                    dst: dst.addr(),
                    item,
                    shape: vec![n, cols],
                    src_strides: vec![cols as isize, 1],
                    dst_strides: vec![cols as isize, 1],
                    axis: Some(0),
                    index: indices.as_ptr() as u64,
                    index_len: len,
                };
                let launches = to_launches(&[t], mode, MAX_JOB_NUMEL).unwrap();
                let mut status = [0u64; 2];
                let winner = vec![0u64; len];
                let (wp, sp) = (winner.as_ptr() as u64, status.as_mut_ptr() as u64);
                let regions = [
                    src.region(false),
                    dst.region(true),
                    Region::new(indices.as_ptr() as u64, n * 8, false),
                    Region::new(wp, len * 8, true),
                    Region::new(sp, 16, true),
                ];
                let s = schedule(&mut rng);
                if mode == Mode::Scatter {
                    run_winners(indices.as_ptr() as u64, n, len, wp, 0, sp, s, &regions).unwrap();
                    assert_eq!(status, [1, bad as u64], "winners, bad {bad}");
                    status = [0, 0];
                }
                run_launches(&launches, wp, 0, sp, s, &regions).unwrap();
                assert_eq!(status, [1, bad as u64], "{mode:?} item {item} bad {bad}");
                let row = cols * item;
                let mut expect = before.bytes().to_vec();
                for (p, &t) in indices.iter().enumerate() {
                    if p == at {
                        continue;
                    }
                    let (s, d) = match mode {
                        Mode::Gather => (t as usize, p),
                        _ => (p, t as usize),
                    };
                    expect[d * row..(d + 1) * row]
                        .copy_from_slice(&src.bytes()[s * row..(s + 1) * row]);
                }
                assert!(dst.bytes() == expect, "{mode:?} item {item} bad {bad}");
            }
        }
    }
}

/// `check_indices_*` against the CPU backend's `normalise_indices`: every integer dtype,
/// strides of both signs, negative indices, and bad values at random positions.
#[test]
fn index_checks_match_the_cpu_backend() {
    let mut rng = Rng(17);
    let dtypes = [
        DType::Int8,
        DType::UInt8,
        DType::Int16,
        DType::UInt16,
        DType::Int32,
        DType::UInt32,
        DType::Int64,
        DType::UInt64,
    ];
    for case in 0..320 {
        let dtype = dtypes[case % dtypes.len()];
        let (item, signed) = (
            dtype.itemsize(),
            matches!(dtype.name(), n if n.starts_with("int")),
        );
        let most = if rng.below(2) == 0 {
            8
        } else {
            3 * BLOCK as usize
        };
        let n = 1 + rng.below(most);
        let len = 1 + rng.below(100);
        let stride: isize = [1, 1, 2, -1, -3][rng.below(5)];
        let nbad = [0, 0, 1, 3][rng.below(4)];
        let mut values: Vec<i128> = (0..n)
            .map(|_| {
                let v = rng.below(len) as i128;
                if signed && rng.below(3) == 0 {
                    v - len as i128
                } else {
                    v
                }
            })
            .collect();
        for _ in 0..nbad {
            let bits = 8 * item as u32;
            let (min, max) = if signed {
                (-(1i128 << (bits - 1)), (1i128 << (bits - 1)) - 1)
            } else {
                (0, (1i128 << bits) - 1)
            };
            let choices = [len as i128, max, -(len as i128) - 1, min, len as i128 + 1];
            let v = choices[rng.below(choices.len())];
            if (min..=max).contains(&v) && !(-(len as i128)..len as i128).contains(&v) {
                values[rng.below(n)] = v;
            }
        }
        let span = (n - 1) * stride.unsigned_abs() + 1;
        let mut buf = Buf::random(&mut rng, span * item);
        let origin = if stride < 0 { span - 1 } else { 0 };
        for (p, v) in values.iter().enumerate() {
            let e = (origin as isize + p as isize * stride) as usize;
            buf.bytes_mut()[e * item..(e + 1) * item].copy_from_slice(&v.to_le_bytes()[..item]);
        }
        let at = buf.addr() + (origin * item) as u64;
        // SAFETY: `n` items `stride` apart from `at` lie inside `buf`.
        let t = unsafe { tensor_at(at, &[n], &[stride], dtype) };
        let want = cpu().normalise_indices(&t, 0, len);

        for with_out in [false, true] {
            let mut status = [0u64; 2];
            let mut out = vec![i64::MIN; n];
            let stp = status.as_mut_ptr() as u64;
            let mut args = CheckArgs {
                indices: at,
                stride: stride as i64,
                n: n as u64,
                len: len as i64,
                signed: u32::from(signed),
                out: if with_out { out.as_mut_ptr() as u64 } else { 0 },
                status: stp,
            };
            let mut params = args.params();
            let s = schedule(&mut rng);
            let grid = (n.div_ceil(BLOCK as usize) as u32).clamp(1, s.max_grid);
            let regions = [buf.region(false), Region::new(stp, 16, true)];
            // SAFETY: matches `check_indices_W(const uW*, i64, u64, i64, u32, i64*, u64*)`;
            // the indices are in `regions`, `out` holds `n` int64, `status` two zeroed u64.
            unsafe {
                launch(
                    &format!("check_indices_{item}"),
                    grid,
                    BLOCK,
                    &mut params,
                    s.seed,
                    &regions,
                )
            }
            .unwrap();
            let ctx = format!("case {case}: {dtype} n {n} len {len} stride {stride}, {s:?}");
            match (&want, verdict(status, n)) {
                (Ok(norm), Verdict::Valid { negative }) => {
                    assert_eq!(negative, values.iter().any(|&v| v < 0), "{ctx}");
                    let norm: Vec<i64> = norm.to_array::<i64>().unwrap().iter().copied().collect();
                    if with_out {
                        assert_eq!(out, norm, "{ctx}");
                    }
                }
                (Err(Error::IndexOutOfRange { index, .. }), Verdict::Bad { position }) => {
                    let e = (origin as isize + position as isize * stride) as usize;
                    let got = index_value(&buf.bytes()[e * item..(e + 1) * item], dtype);
                    assert_eq!(got, *index, "{ctx}: position {position}");
                    let first = values
                        .iter()
                        .position(|&v| !(-(len as i128)..len as i128).contains(&v));
                    assert_eq!(Some(position), first, "{ctx}");
                }
                (w, v) => panic!("{ctx}: CPU {w:?}, kernel {v:?}"),
            }
        }
    }
}

/// Element offsets past 2^31 (and byte offsets past 2^32) in reserved, mostly untouched
/// address space: huge strides of either sign, jobs split across them, indices above 2^31.
#[test]
fn offsets_past_2_pow_31_elements() {
    let big: usize = (1 << 31) + 3;
    let (rows, cols) = (3usize, 5usize);
    for item in [1, 4, 16] {
        for negative in [false, true] {
            for max in [MAX_JOB_NUMEL, 4] {
                // Source rows `big` elements apart; destination contiguous.
                let sparse = Sparse::new(((rows - 1) * big + cols) * item);
                let origin = if negative { (rows - 1) * big } else { 0 };
                let stride = if negative {
                    -(big as isize)
                } else {
                    big as isize
                };
                for r in 0..rows {
                    for b in 0..cols * item {
                        let e = (origin as isize + r as isize * stride) as usize * item + b;
                        // SAFETY: `e` is inside the mapping.
                        unsafe { *sparse.0.add(e) = (r * 37 + b) as u8 };
                    }
                }
                let mut rng = Rng(item as u64);
                let dst = Buf::random(&mut rng, rows * cols * item);
                let expect = dst.dup();
                let src_at = sparse.addr() + (origin * item) as u64;
                let (ss, ds) = (vec![stride, 1], vec![cols as isize, 1]);
                // SAFETY: every element of both boxes is inside its buffer.
                let (s, d) = unsafe {
                    (
                        tensor_at(src_at, &[rows, cols], &ss, dtype_for(item)),
                        tensor_at(expect.addr(), &[rows, cols], &ds, dtype_for(item)),
                    )
                };
                cpu()
                    .copy_boxes(&[BoxCopy {
                        src: &s,
                        src_start: vec![0, 0],
                        dst: &d,
                        dst_start: vec![0, 0],
                        shape: vec![rows, cols],
                    }])
                    .unwrap();
                let t = RawCopy {
                    src: src_at,
                    dst: dst.addr(),
                    item,
                    shape: vec![rows, cols],
                    src_strides: ss,
                    dst_strides: ds,
                    axis: None,
                    index: 0,
                    index_len: 0,
                };
                let launches = to_launches(&[t], Mode::Box, max).unwrap();
                let regions = [sparse.region(), dst.region(true)];
                let s = Schedule {
                    max_grid: 2,
                    seed: 1,
                };
                run_launches(&launches, 0, 0, 0, s, &regions).unwrap();
                assert!(
                    dst.bytes() == expect.bytes(),
                    "item {item} negative {negative} max {max}"
                );
            }
        }
    }

    // Gather from and scatter into an axis of 2^32 + 5 int16, indices on both sides of 2^31.
    let len: usize = (1 << 32) + 5;
    let indices: Vec<i64> = vec![
        len as i64 - 1,
        0,
        1 << 31,
        (1 << 31) - 1,
        1 << 32,
        3,
        len as i64 - 1,
        1 << 31,
    ];
    let n = indices.len();
    let idx = Tensor::from_slice(&indices, &[n]).unwrap();
    let long = Sparse::new(len * 2);
    for (p, &t) in indices.iter().enumerate() {
        // SAFETY: every index is below `len`.
        unsafe { *long.0.cast::<i16>().add(t as usize) = 100 + p as i16 };
    }
    let mut rng = Rng(99);
    let small = Buf::random(&mut rng, n * 2);
    let expect = small.dup();
    // SAFETY: both tensors lie inside their buffers.
    let (l, e) = unsafe {
        (
            tensor_at(long.addr(), &[len], &[1], DType::Int16),
            tensor_at(expect.addr(), &[n], &[1], DType::Int16),
        )
    };
    cpu().gather(&l, &idx, 0, &e).unwrap();
    let gather = RawCopy {
        src: long.addr(),
        dst: small.addr(),
        item: 2,
        shape: vec![n],
        src_strides: vec![1],
        dst_strides: vec![1],
        axis: Some(0),
        index: idx.data_ptr() as u64,
        index_len: len,
    };
    let gather_again = gather.clone();
    let mut status = [0u64; 2];
    let sp = status.as_mut_ptr() as u64;
    let idx_region = Region::new(idx.data_ptr() as u64, n * 8, false);
    let launches = to_launches(&[gather_again], Mode::Gather, MAX_JOB_NUMEL).unwrap();
    let s = Schedule {
        max_grid: 1,
        seed: 2,
    };
    let status_region = Region::new(sp, 16, true);
    let regions = [long.region(), small.region(true), idx_region, status_region];
    run_launches(&launches, 0, 0, sp, s, &regions).unwrap();
    assert_eq!(status, [0, 0]);
    assert!(small.bytes() == expect.bytes(), "gather past 2^31");

    // Scatter the gathered values back into a fresh axis, through the winner table the
    // backend would take (hashed: a few slots, not 2^32 words).
    let out = Sparse::new(len * 2);
    let cpu_out = Sparse::new(len * 2);
    let (slots, winner_bytes) = winner_table(n, len);
    assert!(
        slots > 0 && winner_bytes < 1024,
        "{slots} slots, {winner_bytes} bytes"
    );
    let winner = Sparse::new(winner_bytes);
    // SAFETY: both tensors lie inside their buffers.
    let (v, o) = unsafe {
        (
            tensor_at(small.addr(), &[n], &[1], DType::Int16),
            tensor_at(cpu_out.addr(), &[len], &[1], DType::Int16),
        )
    };
    cpu().scatter(&v, &idx, 0, &o).unwrap();
    let scatter = RawCopy {
        src: small.addr(),
        dst: out.addr(),
        ..gather
    };
    let launches = to_launches(&[scatter], Mode::Scatter, MAX_JOB_NUMEL).unwrap();
    let regions = [
        out.region(),
        small.region(false),
        idx_region,
        winner.region(),
        status_region,
    ];
    let wp = winner.addr();
    run_winners(idx.data_ptr() as u64, n, len, wp, slots, sp, s, &regions).unwrap();
    run_launches(&launches, wp, slots, sp, s, &regions).unwrap();
    assert_eq!(status, [0, 0]);
    for &t in &indices {
        // SAFETY: every index is below `len` in both mappings.
        let (got, want) = unsafe {
            (
                *out.0.cast::<i16>().add(t as usize),
                *cpu_out.0.cast::<i16>().add(t as usize),
            )
        };
        assert_eq!(got, want, "scatter to {t}");
    }
}
