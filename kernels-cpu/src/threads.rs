//! How many threads the kernels use.
//!
//! Kernels split work over output tiles on the *current* rayon pool, and every output element
//! is computed by one task with a fixed order of operations, so results are bit-identical for
//! any thread count. [`configure`] sizes the global pool once, at start-up; callers that also
//! drive other libraries (candle reads its own environment variables) configure those beside it.

use crate::{Error, Result};

/// The largest thread count [`configure`] accepts. More threads than logical CPUs only adds
/// scheduling overhead, and no machine this crate targets has more than 256 logical CPUs; an
/// absurd request (a typo such as `--threads 10000`) is an error instead of thousands of OS
/// threads.
pub const MAX_THREADS: usize = 256;

/// Check `n` against `1..=MAX_THREADS`.
pub fn validate(n: usize) -> Result<usize> {
    if n == 0 || n > MAX_THREADS {
        return Err(Error::Threads {
            requested: n,
            max: MAX_THREADS,
        });
    }
    Ok(n)
}

/// Size rayon's global pool to `n` threads. Call it before any parallel work; calling it again
/// with the same `n` is a no-op, with another `n` an [`Error::Pool`] (a started pool cannot be
/// resized).
pub fn configure(n: usize) -> Result<()> {
    validate(n)?;
    match rayon::ThreadPoolBuilder::new()
        .num_threads(n)
        .build_global()
    {
        Ok(()) => Ok(()),
        Err(_) if rayon::current_num_threads() == n => Ok(()),
        Err(e) => Err(Error::Pool(format!(
            "cannot use {n} threads: the global pool already runs {} ({e})",
            rayon::current_num_threads()
        ))),
    }
}

/// Threads of the pool the kernels would run on if called here.
pub fn current() -> usize {
    rayon::current_num_threads()
}
