//! The CPU kernels' threads: rayon's global pool, which dlpart's copies share with the
//! calling thread (see `copy::shared_loop`).
//!
//! rayon builds its global pool once, on the first parallel copy, with `RAYON_NUM_THREADS`
//! threads when that variable is set and one per logical CPU otherwise; from then on its size
//! is fixed for the life of the process. In a Python process the pool is dlpart's own (every
//! Rust extension links its own rayon).

use crate::error::{Error, Result};

/// The number of threads the CPU kernels use: the calling thread and `n - 1` of rayon's.
/// Reading it starts rayon's pool, fixing its size.
pub fn num_threads() -> usize {
    rayon::current_num_threads()
}

/// Sets the number of threads the CPU kernels use (`n >= 1`). It must come before the first
/// parallel copy (or [`num_threads`]) of the process, which starts rayon's pool at its
/// default size; later, asking for the size it already has succeeds and any other size is
/// [`Error::Backend`] naming both, because rayon's global pool cannot be rebuilt.
pub fn set_num_threads(n: usize) -> Result<()> {
    if n == 0 {
        return Err(Error::shape(
            "set_num_threads: the thread count must be >= 1",
            "0",
        ));
    }
    let built = rayon::ThreadPoolBuilder::new()
        .num_threads(n)
        .thread_name(|i| format!("dlpart-{i}"))
        .build_global();
    match built {
        Ok(()) => {
            log::info!("CPU kernels: {n} threads");
            Ok(())
        }
        Err(_) if num_threads() == n => Ok(()),
        Err(_) => Err(Error::Backend {
            backend: "cpu",
            op: format!("set_num_threads({n})"),
            message: format!(
                "the thread pool already runs {} threads: it starts with the first parallel \
                 copy and cannot be resized; call set_num_threads before any other dlpart \
                 call, or set RAYON_NUM_THREADS={n} before the program starts",
                num_threads()
            ),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn zero_threads_is_refused() {
        assert!(matches!(set_num_threads(0), Err(Error::Shape { .. })));
    }

    #[test]
    #[cfg_attr(
        miri,
        ignore = "rayon's pool trips Miri inside crossbeam (see copy::Tuning::run)"
    )]
    fn a_running_pool_keeps_its_size_and_the_error_says_so() {
        let n = num_threads(); // starts the pool if no other test has
        assert!(set_num_threads(n).is_ok());
        let e = set_num_threads(n + 1).unwrap_err().to_string();
        assert!(e.contains(&format!("already runs {n} threads")), "{e}");
    }
}
