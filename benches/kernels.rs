//! Criterion benches of the CPU kernels (Throughput = bytes read + bytes written). Kept short:
//! `cargo bench --features bench-internals --bench kernels`; `examples/cpu_copy_bench.rs` prints the same workloads as
//! GB/s next to a memcpy / plain-loop reference.

use std::time::Duration;

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use dlpart::__bench::{self as cpu, DstView, RawCopy, SrcView, Stores};

const SIDE: usize = 8192;

fn buffer(n: usize) -> Vec<u8> {
    (0..n).map(|i| (i * 7 + 3) as u8).collect()
}

fn copies(c: &mut Criterion) {
    let mut g = c.benchmark_group("copy");
    g.sample_size(10)
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(3));
    let n = SIDE * SIDE * 4;
    let src = buffer(n);
    let mut dst = buffer(n);
    g.throughput(Throughput::Bytes(2 * n as u64));
    g.bench_function("memcpy two threads (reference)", |b| {
        b.iter(|| {
            std::thread::scope(|s| {
                for (d, c) in dst.chunks_mut(n / 2).zip(src.chunks(n / 2)) {
                    s.spawn(move || d.copy_from_slice(c));
                }
            })
        })
    });
    // Row blocks (4 x 2048 rows) into column blocks (4 x 2048 columns) of the same buffers.
    let part = SIDE / 4;
    let (ss, ds, shape) = ([SIDE as isize, 1], [part as isize, 1], [part, part]);
    let dptr = dst.as_mut_ptr();
    let mut jobs = Vec::new();
    for r in 0..4 {
        for col in 0..4 {
            jobs.push(RawCopy {
                src: SrcView {
                    ptr: src
                        .as_ptr()
                        .wrapping_add((r * part * SIDE + col * part) * 4),
                    shape: &shape,
                    strides: &ss,
                },
                dst: DstView {
                    ptr: dptr.wrapping_add((col * SIDE * part + r * part * part) * 4),
                    shape: &shape,
                    strides: &ds,
                },
                itemsize: 4,
            });
        }
    }
    for stores in [Stores::Auto, Stores::Plain, Stores::Streaming] {
        g.bench_with_input(
            BenchmarkId::new("8192^2 f32 rows->cols", format!("{stores:?}")),
            &stores,
            |b, &st| {
                // SAFETY: the jobs tile two separate live buffers.
                b.iter(|| unsafe { cpu::copy_boxes_with(&jobs, st) })
            },
        );
    }
    let t = RawCopy {
        src: SrcView {
            ptr: src.as_ptr(),
            shape: &[SIDE, SIDE],
            strides: &[1, SIDE as isize],
        },
        dst: DstView {
            ptr: dptr,
            shape: &[SIDE, SIDE],
            strides: &[SIDE as isize, 1],
        },
        itemsize: 4,
    };
    g.bench_function("8192^2 f32 transpose", |b| {
        // SAFETY: both boxes lie inside separate live buffers.
        b.iter(|| unsafe { cpu::copy_boxes(&[t]) })
    });
    g.finish();
}

fn tiny_boxes(c: &mut Criterion) {
    let mut g = c.benchmark_group("tiny boxes");
    g.sample_size(20)
        .warm_up_time(Duration::from_millis(300))
        .measurement_time(Duration::from_secs(2));
    // 4 MiB of f32 on a 64x64 grid of separate 16x16 partitions, assembled into one array:
    // 4096 jobs in one call.
    let (side, part) = (1024usize, 16usize);
    let parts: Vec<Vec<u8>> = (0..64 * 64).map(|_| buffer(part * part * 4)).collect();
    let mut dst = buffer(side * side * 4);
    let dptr = dst.as_mut_ptr();
    let (ss, ds, shape) = ([part as isize, 1], [side as isize, 1], [part, part]);
    let jobs: Vec<RawCopy<'_>> = parts
        .iter()
        .enumerate()
        .map(|(k, p)| RawCopy {
            src: SrcView {
                ptr: p.as_ptr(),
                shape: &shape,
                strides: &ss,
            },
            dst: DstView {
                ptr: dptr.wrapping_add(((k / 64) * part * side + (k % 64) * part) * 4),
                shape: &shape,
                strides: &ds,
            },
            itemsize: 4,
        })
        .collect();
    g.throughput(Throughput::Bytes(2 * (side * side * 4) as u64));
    g.bench_function("assemble 64x64 grid, 4 MiB f32", |b| {
        // SAFETY: the jobs read separate live partitions and tile the live `dst`.
        b.iter(|| unsafe { cpu::copy_boxes(&jobs) })
    });
    g.finish();
}

fn index_ops(c: &mut Criterion) {
    let mut g = c.benchmark_group("gather/scatter 16M f32");
    g.sample_size(10)
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(3));
    let n = 16usize << 20;
    let src: Vec<u32> = (0..n as u32).collect();
    let mut out = vec![0u32; n];
    let mut x = 0x9E37_79B9_7F4A_7C15u64;
    let random: Vec<i64> = (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x % n as u64) as i64
        })
        .collect();
    let mut sorted = random.clone();
    sorted.sort_unstable();
    let blocks: Vec<i64> = (0..n)
        .map(|i| random[i / 256] / 256 * 256 + (i % 256) as i64)
        .collect();
    // Bytes: index (8) + element read (4) + element written (4).
    g.throughput(Throughput::Bytes(16 * n as u64));
    let shape = [n];
    let s = SrcView {
        ptr: src.as_ptr() as *const u8,
        shape: &shape,
        strides: &[1],
    };
    let d = DstView {
        ptr: out.as_mut_ptr() as *mut u8,
        shape: &shape,
        strides: &[1],
    };
    for (name, idx) in [
        ("random", &random),
        ("sorted", &sorted),
        ("blocks of 256", &blocks),
    ] {
        g.bench_function(BenchmarkId::new("gather", name), |b| {
            // SAFETY: separate live buffers of `n` elements; indices are in range.
            b.iter(|| unsafe { cpu::gather(s, idx, 0, d, 4).unwrap() })
        });
        g.bench_function(BenchmarkId::new("scatter", name), |b| {
            // SAFETY: separate live buffers of `n` elements; indices are in range.
            b.iter(|| unsafe { cpu::scatter(s, idx, 0, d, 4).unwrap() })
        });
    }
    g.finish();
}

criterion_group!(benches, copies, tiny_boxes, index_ops);
criterion_main!(benches);
