//! Effective bandwidth of the CPU kernels next to references measured in the same run.
//!
//! `cargo run --release --features bench-internals --example cpu_copy_bench [runs] [what...]`, with `what` among
//! `memcpy rowcol rowcol-f64 rowcol-u8 stores transpose gather scatter tiny` (default: all
//! but `stores` and the f64/u8 row-column cases). Bandwidth = (bytes read + bytes written by
//! the minimal algorithm) / time; time = median of `runs` (default 11) after one warm-up run,
//! the cases of one table timed round-robin so that a busy machine slows them alike.

use std::time::Instant;

use dlpart::__bench::{self as cpu, DstView, RawCopy, SrcView, Stores};

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// One measured workload: `bytes` moved per call of `f`.
struct Case<'a> {
    name: String,
    bytes: usize,
    f: Box<dyn FnMut() + 'a>,
}

/// Times the cases round-robin (so that a busy machine slows all of them alike): one warm-up
/// call each, then `runs` rounds; prints the median of each, and its ratio to case 0 when
/// `ratio` is set. Returns the GB/s of each case.
fn interleaved(runs: usize, cases: &mut [Case<'_>], ratio: bool) -> Vec<f64> {
    let mut times = vec![Vec::new(); cases.len()];
    for round in 0..=runs {
        for (c, t) in cases.iter_mut().zip(&mut times) {
            let start = Instant::now();
            (c.f)();
            if round > 0 {
                t.push(start.elapsed().as_secs_f64());
            }
        }
    }
    let mut gbs = Vec::new();
    for (c, t) in cases.iter().zip(times) {
        let secs = median(t);
        let g = c.bytes as f64 / secs / 1e9;
        let r = match gbs.first() {
            Some(r0) if ratio => format!("  {:.2}x {}", g / r0, cases[0].name),
            _ => String::new(),
        };
        println!("{:<46} {:>9.3} ms {g:>7.2} GB/s{r}", c.name, secs * 1e3);
        gbs.push(g);
    }
    gbs
}

/// A buffer of `n` bytes, touched so that its pages exist.
fn buffer(n: usize) -> Vec<u8> {
    (0..n).map(|i| (i * 7 + 3) as u8).collect()
}

/// memcpy of `src` into `dst` on `threads` rayon threads (1 or 2): the reference for copies.
fn memcpy_case<'a>(src: &'a [u8], dst: &'a mut [u8], threads: usize) -> Case<'a> {
    let n = src.len();
    Case {
        name: format!("memcpy {} KiB, {threads} thread(s)", n >> 10),
        bytes: 2 * n,
        f: Box::new(move || {
            if threads == 1 {
                dst.copy_from_slice(src);
            } else {
                let (d0, d1) = dst.split_at_mut(n / 2);
                let (s0, s1) = src.split_at(n / 2);
                rayon::join(|| d0.copy_from_slice(s0), || d1.copy_from_slice(s1));
            }
        }),
    }
}

/// `side x side` row blocks (4 partitions of side/4 rows) into column blocks (4 of side/4
/// columns): 16 box copies whose rows are contiguous on both sides. Compared with memcpy of
/// the same bytes on two threads.
fn rowcol(runs: usize, side: usize, item: usize) {
    let part = side / 4;
    let rows: Vec<Vec<u8>> = (0..4).map(|_| buffer(part * side * item)).collect();
    let mut cols: Vec<Vec<u8>> = (0..4).map(|_| buffer(side * part * item)).collect();
    let (src_strides, dst_strides, shape) = ([side as isize, 1], [part as isize, 1], [part, part]);
    let dst_ptrs: Vec<*mut u8> = cols.iter_mut().map(|c| c.as_mut_ptr()).collect();
    let mut jobs = Vec::new();
    for (r, row) in rows.iter().enumerate() {
        for (c, &col) in dst_ptrs.iter().enumerate() {
            jobs.push(RawCopy {
                src: SrcView {
                    ptr: row.as_ptr().wrapping_add(c * part * item),
                    shape: &shape,
                    strides: &src_strides,
                },
                dst: DstView {
                    ptr: col.wrapping_add(r * part * part * item),
                    shape: &shape,
                    strides: &dst_strides,
                },
                itemsize: item,
            });
        }
    }
    let (msrc, mut mdst) = (buffer(side * side * item), buffer(side * side * item));
    let mut cases = vec![memcpy_case(&msrc, &mut mdst, 2)];
    for stores in [Stores::Auto, Stores::Plain, Stores::Streaming] {
        let jobs = &jobs;
        cases.push(Case {
            name: format!("rows->cols {side}^2 x{item}B {stores:?}"),
            bytes: 2 * side * side * item,
            // SAFETY: every job's boxes lie inside live, separate buffers; destinations tile
            // the column buffers without overlap.
            f: Box::new(move || unsafe { cpu::copy_boxes_with(jobs, stores) }),
        });
    }
    interleaved(runs, &mut cases, true);
}

/// A full `side x side` transpose of 4-byte elements (the tile kernel), next to memcpy.
fn transpose(runs: usize, side: usize) {
    let n = side * side * 4;
    let (src, mut dst) = (buffer(n), buffer(n));
    let (msrc, mut mdst) = (buffer(n), buffer(n));
    let shape = [side, side];
    let (ss, ds) = ([1, side as isize], [side as isize, 1]);
    let job = RawCopy {
        src: SrcView {
            ptr: src.as_ptr(),
            shape: &shape,
            strides: &ss,
        },
        dst: DstView {
            ptr: dst.as_mut_ptr(),
            shape: &shape,
            strides: &ds,
        },
        itemsize: 4,
    };
    let mut cases = vec![
        memcpy_case(&msrc, &mut mdst, 2),
        Case {
            name: format!("transpose {side}^2 x4B"),
            bytes: 2 * n,
            // SAFETY: both boxes lie inside their separate live buffers.
            f: Box::new(move || unsafe { cpu::copy_boxes(&[job]) }),
        },
    ];
    interleaved(runs, &mut cases, true);
}

/// Deterministic pseudo-random numbers below `n`.
fn random(m: usize, n: usize) -> Vec<i64> {
    let mut x = 0x9E37_79B9_7F4A_7C15u64;
    (0..m)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x % n as u64) as i64
        })
        .collect()
}

/// Index lists for `n` elements: random, sorted random, and random blocks of 32 / 256.
fn index_sets(n: usize) -> Vec<(&'static str, Vec<i64>)> {
    let random = random(n, n);
    let mut sorted = random.clone();
    sorted.sort_unstable();
    let blocks = |b: usize| {
        let starts = self::random(n / b, n / b);
        (0..n)
            .map(|i| starts[i / b] * b as i64 + (i % b) as i64)
            .collect()
    };
    vec![
        ("random", random),
        ("sorted", sorted),
        ("blocks of 32", blocks(32)),
        ("blocks of 256", blocks(256)),
    ]
}

/// Gather (or scatter) of `n` 4-byte elements along a 1-d array, next to the one-thread loop
/// numpy's `take` runs. Bytes: index (8) + element read (4) + element written (4) per index.
fn index_op(runs: usize, n: usize, scatter: bool) {
    let src: Vec<u32> = (0..n as u32).collect();
    let mut out = vec![0u32; n];
    let mut out2 = vec![0u32; n];
    let shape = [n];
    let op = if scatter { "scatter" } else { "gather" };
    for (name, idx) in index_sets(n) {
        let (src, idx, shape) = (&src, &idx, &shape);
        let out2 = &mut out2;
        let s = SrcView {
            ptr: src.as_ptr() as *const u8,
            shape,
            strides: &[1],
        };
        let d = DstView {
            ptr: out.as_mut_ptr() as *mut u8,
            shape,
            strides: &[1],
        };
        let mut cases = vec![
            Case {
                name: format!("{op} {}M x4B {name}: plain loop", n >> 20),
                bytes: 16 * n,
                f: Box::new(move || {
                    if scatter {
                        for (i, &j) in idx.iter().enumerate() {
                            out2[j as usize] = src[i];
                        }
                    } else {
                        for (o, &j) in out2.iter_mut().zip(idx) {
                            *o = src[j as usize];
                        }
                    }
                }),
            },
            Case {
                name: format!("{op} {}M x4B {name}: dlpart", n >> 20),
                bytes: 16 * n,
                // SAFETY: separate live buffers of `n` elements; indices are in range.
                f: Box::new(move || unsafe {
                    if scatter {
                        cpu::scatter(s, idx, 0, d, 4).unwrap()
                    } else {
                        cpu::gather(s, idx, 0, d, 4).unwrap()
                    }
                }),
            },
        ];
        interleaved(runs, &mut cases, true);
    }
}

/// `mib` MiB of f32 spread over a 64x64 grid of separate partitions, assembled into one
/// array: 4096 small jobs in one call (overhead-bound); also prints microseconds.
fn tiny(runs: usize, mib: usize) {
    let side = ((mib << 20) / 4).isqrt() / 64 * 64;
    let part = side / 64;
    let parts: Vec<Vec<u8>> = (0..64 * 64).map(|_| buffer(part * part * 4)).collect();
    let mut dst = buffer(side * side * 4);
    let (src_strides, dst_strides) = ([part as isize, 1], [side as isize, 1]);
    let shape = [part, part];
    let dptr = dst.as_mut_ptr();
    let jobs: Vec<RawCopy<'_>> = parts
        .iter()
        .enumerate()
        .map(|(k, p)| RawCopy {
            src: SrcView {
                ptr: p.as_ptr(),
                shape: &shape,
                strides: &src_strides,
            },
            dst: DstView {
                ptr: dptr.wrapping_add(((k / 64) * part * side + (k % 64) * part) * 4),
                shape: &shape,
                strides: &dst_strides,
            },
            itemsize: 4,
        })
        .collect();
    let bytes = 2 * side * side * 4;
    let (msrc, mut mdst) = (buffer(side * side * 4), buffer(side * side * 4));
    let jobs = &jobs;
    let mut cases = vec![
        memcpy_case(&msrc, &mut mdst, 2),
        Case {
            name: format!("assemble 64x64 grid of {part}x{part} f32"),
            bytes,
            // SAFETY: the jobs read separate live partitions and tile the live `dst`.
            f: Box::new(move || unsafe { cpu::copy_boxes(jobs) }),
        },
    ];
    let g = interleaved(runs, &mut cases, true);
    println!(
        "{:<46} {:>9.1} us",
        "  (4096 jobs, one call)",
        bytes as f64 / g[1] / 1e3
    );
}

/// Plain against streaming stores for contiguous copies of several sizes (how
/// `cpu::STREAM_MIN_BYTES` was chosen).
fn stores(runs: usize) {
    for kib in [256usize, 1024, 2048, 4096, 16384, 65536] {
        let n = kib << 10;
        let (src, mut dst) = (buffer(n), buffer(n));
        let (msrc, mut mdst) = (buffer(n), buffer(n));
        let shape = [n / 4];
        let job = RawCopy {
            src: SrcView {
                ptr: src.as_ptr(),
                shape: &shape,
                strides: &[1],
            },
            dst: DstView {
                ptr: dst.as_mut_ptr(),
                shape: &shape,
                strides: &[1],
            },
            itemsize: 4,
        };
        let mut cases = vec![memcpy_case(&msrc, &mut mdst, 2)];
        for st in [Stores::Plain, Stores::Streaming] {
            cases.push(Case {
                name: format!("copy {kib} KiB {st:?}"),
                bytes: 2 * n,
                // SAFETY: both boxes lie inside their separate live buffers.
                f: Box::new(move || unsafe { cpu::copy_boxes_with(&[job], st) }),
            });
        }
        interleaved(runs, &mut cases, true);
    }
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let runs = args.first().and_then(|a| a.parse().ok()).unwrap_or(11);
    let what: Vec<&str> = args
        .iter()
        .filter(|a| a.parse::<usize>().is_err())
        .map(|s| s.as_str())
        .collect();
    let on = |w: &str| what.contains(&w) || (what.is_empty() && !w.starts_with("rowcol-"));
    println!(
        "rayon threads: {}; runs: {runs} (median after warm-up)",
        rayon::current_num_threads()
    );
    let side = 8192;
    if on("memcpy") {
        let n = side * side * 4;
        let (src, mut d1, mut d2) = (buffer(n), buffer(n), buffer(n));
        let mut cases = vec![memcpy_case(&src, &mut d1, 1), memcpy_case(&src, &mut d2, 2)];
        interleaved(runs, &mut cases, false);
    }
    for (w, item) in [("rowcol", 4), ("rowcol-f64", 8), ("rowcol-u8", 1)] {
        if on(w) {
            rowcol(runs, side, item);
        }
    }
    if what.contains(&"stores") {
        stores(runs);
    }
    if on("transpose") {
        transpose(runs, side);
    }
    if on("gather") {
        index_op(runs, 64 << 20, false);
    }
    if on("scatter") {
        index_op(runs, 64 << 20, true);
    }
    if on("tiny") {
        let mibs: Vec<usize> = std::env::var("TINY_MIB")
            .map(|v| v.split(',').filter_map(|x| x.parse().ok()).collect())
            .unwrap_or_else(|_| vec![1, 4, 16]);
        for mib in mibs {
            tiny(runs, mib);
        }
    }
}
