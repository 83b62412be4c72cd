//! Tests of the CPU kernels against the naive element-by-element copy and naive index loops,
//! on random layouts: permuted dims, gaps, negative strides, zero source strides, unaligned
//! bases, odd item sizes. Sizes stay small so that Miri can run them; larger cases carry
//! `#[cfg_attr(miri, ignore)]`.

mod backend;
mod copy;
mod direct;
mod index;
mod repart;
mod slabs;

use std::sync::OnceLock;

use super::copy::{DstView, SrcView, Tuning};

/// Work cut into pieces of a few elements, so that tiny boxes take the parallel paths.
const TINY: Tuning = Tuning {
    parallel_min: 0,
    rows_parallel_min: 0,
    slabs_here_max: 0,
    piece_min: 1,
    piece_max: 96,
    reverse: false,
};

/// As [`TINY`], the pieces run last first on the calling thread: results that depend on the
/// order of pieces (repeated scatter indices split across pieces) come out wrong.
const REVERSED: Tuning = Tuning {
    reverse: true,
    ..TINY
};

/// Random trials per case (fewer under Miri, which is slow).
const TRIALS: usize = if cfg!(miri) { 1 } else { 8 };

/// Item sizes the kernels move as words, and two they move as byte runs.
const ITEMSIZES: [usize; 7] = [1, 2, 4, 8, 16, 3, 12];

/// Runs `f` in a 3-thread pool, so that the parallel paths run even on one core (under Miri
/// on this thread: the kernels then run their pieces in order, see `copy::par_steps`).
fn in_pool<R: Send>(f: impl FnOnce() -> R + Send) -> R {
    if cfg!(miri) {
        f()
    } else {
        pool().install(f)
    }
}

fn pool() -> &'static rayon::ThreadPool {
    static POOL: OnceLock<rayon::ThreadPool> = OnceLock::new();
    POOL.get_or_init(|| {
        rayon::ThreadPoolBuilder::new()
            .num_threads(3)
            .build()
            .unwrap()
    })
}

use crate::test_rng::Rng;

impl Rng {
    fn new(seed: u64) -> Self {
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }
    fn bytes(&mut self, n: usize) -> Vec<u8> {
        let mut v = vec![0u8; n];
        for chunk in v.chunks_mut(8) {
            chunk.copy_from_slice(&self.next().to_le_bytes()[..chunk.len()]);
        }
        v
    }
}

/// A strided box inside an owned byte buffer.
#[derive(Clone, Debug)]
struct Buf {
    bytes: Vec<u8>,
    /// Byte offset of element `[0, ..., 0]`.
    base: usize,
    shape: Vec<usize>,
    strides: Vec<isize>,
    itemsize: usize,
}

impl Buf {
    /// A random layout of `shape`: dims in random order, with gaps, some flipped; with
    /// `zero_ok` some dims get stride 0 (reading one element many times).
    fn random(rng: &mut Rng, shape: &[usize], itemsize: usize, zero_ok: bool) -> Buf {
        let nd = shape.len();
        let mut order: Vec<usize> = (0..nd).collect();
        for i in (1..nd).rev() {
            order.swap(i, rng.below(i + 1));
        }
        let mut strides = vec![0isize; nd];
        let mut step = 1isize;
        for &k in &order {
            if zero_ok && rng.below(6) == 0 {
                continue;
            }
            strides[k] = step;
            step = step * shape[k].max(1) as isize + rng.below(3) as isize;
        }
        for s in &mut strides {
            if rng.below(3) == 0 {
                *s = -*s;
            }
        }
        Buf::with_strides(rng, shape, strides, itemsize)
    }

    /// C-order layout.
    fn contiguous(rng: &mut Rng, shape: &[usize], itemsize: usize) -> Buf {
        let strides = crate::tensor::contiguous_strides(shape);
        Buf::with_strides(rng, shape, strides, itemsize)
    }

    /// Random bytes around a box of the given strides, at a random (often unaligned) base.
    fn with_strides(rng: &mut Rng, shape: &[usize], strides: Vec<isize>, itemsize: usize) -> Buf {
        let (mut lo, mut hi) = (0isize, 0isize);
        for (&n, &s) in shape.iter().zip(&strides) {
            let ext = (n.max(1) as isize - 1) * s;
            if ext < 0 {
                lo += ext;
            } else {
                hi += ext;
            }
        }
        let misalign = rng.below(8);
        let base = misalign + (-lo) as usize * itemsize;
        let len = base + (hi + 1) as usize * itemsize + rng.below(4);
        Buf {
            bytes: rng.bytes(len),
            base,
            shape: shape.to_vec(),
            strides,
            itemsize,
        }
    }

    fn src(&self) -> SrcView<'_> {
        SrcView {
            // SAFETY: `base` is inside `bytes` (see `with_strides`).
            ptr: unsafe { self.bytes.as_ptr().add(self.base) },
            shape: &self.shape,
            strides: &self.strides,
        }
    }

    fn dst(&mut self) -> DstView<'_> {
        DstView {
            // SAFETY: `base` is inside `bytes` (see `with_strides`).
            ptr: unsafe { self.bytes.as_mut_ptr().add(self.base) },
            shape: &self.shape,
            strides: &self.strides,
        }
    }

    /// Byte offset of element `ix` in `bytes`.
    fn offset(&self, ix: &[usize]) -> usize {
        let el: isize = ix
            .iter()
            .zip(&self.strides)
            .map(|(&i, &s)| i as isize * s)
            .sum();
        (self.base as isize + el * self.itemsize as isize) as usize
    }

    /// The item at `ix`.
    fn item(&self, ix: &[usize]) -> &[u8] {
        let o = self.offset(ix);
        &self.bytes[o..o + self.itemsize]
    }

    fn set(&mut self, ix: &[usize], v: &[u8]) {
        let o = self.offset(ix);
        self.bytes[o..o + self.itemsize].copy_from_slice(v);
    }
}

/// Calls `f` with every index of `shape` in C order.
fn for_each_index(shape: &[usize], mut f: impl FnMut(&[usize])) {
    if shape.contains(&0) {
        return;
    }
    let mut ix = vec![0usize; shape.len()];
    loop {
        f(&ix);
        let mut d = shape.len();
        loop {
            if d == 0 {
                return;
            }
            d -= 1;
            ix[d] += 1;
            if ix[d] < shape[d] {
                break;
            }
            ix[d] = 0;
        }
    }
}
