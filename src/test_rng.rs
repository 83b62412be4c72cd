//! The tests' random numbers: xorshift64*, deterministic and without a dependency, so a
//! failing case is found again from its seed. Test modules add the draws they need (bytes,
//! tensors) in `impl Rng` blocks of their own.

pub(crate) struct Rng(pub(crate) u64);

impl Rng {
    pub(crate) fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    pub(crate) fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}
