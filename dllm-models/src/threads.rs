//! One thread count for every CPU kernel a model runs: the kernels-cpu GEMMs (rayon's global
//! pool) and candle's own ops (its pools size themselves from `RAYON_NUM_THREADS` /
//! `CANDLE_NUM_THREADS` when they first start).

use crate::Result;

pub use kernels_cpu::threads::MAX_THREADS;

/// Use `n` threads (in `1..=MAX_THREADS`) for every CPU kernel. Call it at start-up, before any
/// tensor work and before other threads exist (it sets process environment variables candle
/// reads); a count outside the range is an error naming it.
pub fn configure(n: usize) -> Result<()> {
    kernels_cpu::threads::validate(n)?;
    std::env::set_var("RAYON_NUM_THREADS", n.to_string());
    std::env::set_var("CANDLE_NUM_THREADS", n.to_string());
    kernels_cpu::threads::configure(n)?;
    Ok(())
}
