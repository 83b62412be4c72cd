//! Planner and validator costs at the protocol's large end: 65,536 partitions.
//!
//! `cargo bench --bench plan`. These measure host-side bookkeeping only; no data moves.

use std::hint::black_box;

use criterion::{criterion_group, criterion_main, Criterion};
use dlpart::grid::{Entry, Grid};
use dlpart::plan::Plan;
use dlpart::Device;

const N: usize = 8192;

/// The entries of `g` in a fixed pseudo-random order, as a dict might hand them over.
fn shuffled_entries(g: &Grid) -> Vec<Entry> {
    let i = |v: &[usize]| v.iter().map(|&x| x as i64).collect::<Vec<i64>>();
    let mut entries: Vec<Entry> = g
        .positions()
        .map(|p| {
            let r = g.region(&p).unwrap();
            (i(&p), i(&r.start), i(&r.shape))
        })
        .collect();
    let mut state = 0x2545_F491_4F6C_DD1Du64;
    for k in (1..entries.len()).rev() {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        entries.swap(k, (state % (k as u64 + 1)) as usize);
    }
    entries
}

fn validate(c: &mut Criterion) {
    let g = Grid::even(&[N, N], &[256, 256]).unwrap();
    let entries = shuffled_entries(&g);
    let (shape, tiling) = ([N as i64, N as i64], [256i64, 256]);
    c.bench_function("from_entries 256x256 (65,536 shuffled entries)", |b| {
        b.iter(|| {
            Grid::from_entries(black_box(&shape), black_box(&tiling), black_box(&entries)).unwrap()
        })
    });
}

fn plan(c: &mut Criterion) {
    let src = Grid::even(&[N, N], &[256, 256]).unwrap();
    let dst = Grid::even(&[N, N], &[255, 257]).unwrap();
    c.bench_function("plan 256x256 -> 255x257 over 8192^2", |b| {
        b.iter(|| Plan::new(black_box(&src), black_box(&dst)).unwrap())
    });
    let plan = Plan::new(&src, &dst).unwrap();
    println!("{} copies", plan.len());
    c.bench_function("materialise every copy of that plan", |b| {
        b.iter(|| plan.ops().map(|op| op.numel()).sum::<usize>())
    });
    c.bench_function(
        "visit every copy of that plan (no allocation per copy)",
        |b| {
            b.iter(|| {
                let mut n = 0usize;
                plan.ops().visit(|op| n += op.numel());
                n
            })
        },
    );
    let devices: Vec<Device> = (0..4).map(Device::cuda).collect();
    c.bench_function("bytes_by_device_pair of that plan (4 devices)", |b| {
        b.iter(|| plan.bytes_by_device_pair(4, &|i| devices[i % 4], &|j| devices[j / 7 % 4]))
    });
}

criterion_group!(benches, validate, plan);
criterion_main!(benches);
