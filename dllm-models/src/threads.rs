//! Thread counts for the CPU kernels, as explicit configuration: nothing here touches the
//! process environment.
//!
//! A model built with `threads` ([`crate::CpuOptions::threads`], `LoadOptions::threads`) owns a
//! pool of that many threads ([`pool`]) and runs every forward, refresh and re-score in it: the
//! kernels-cpu GEMMs and attention, and candle's gemm, all of which split their work over the
//! *current* rayon pool. A model without one runs in the caller's current pool, rayon's global
//! pool unless the caller installed another; [`configure`] sizes that global pool once, at
//! start-up. Two models in one process can use different counts.
//!
//! candle reads `RAYON_NUM_THREADS` / `CANDLE_NUM_THREADS` for how many pieces it splits a gemm
//! into (not for where they run), and for the private pool of its aarch64 quantized `QMatMul`
//! kernels (the `CpuLinears::Candle` path and GGUF types kernels-cpu has no kernel for): this
//! library no longer sets them; an application that wants to bound that pool sets them in its
//! environment before it starts.

use std::sync::Arc;

use crate::Result;

pub use kernels_cpu::threads::MAX_THREADS;

/// A new pool of `n` threads (in `1..=MAX_THREADS`; another count is an error naming it) for one
/// model's CPU kernels.
pub fn pool(n: usize) -> Result<Arc<rayon::ThreadPool>> {
    kernels_cpu::threads::validate(n)?;
    let p = rayon::ThreadPoolBuilder::new()
        .num_threads(n)
        .thread_name(|i| format!("dllm-cpu-{i}"))
        .build()
        .map_err(|e| kernels_cpu::Error::Pool(format!("cannot start {n} threads: {e}")))?;
    Ok(Arc::new(p))
}

/// Size rayon's global pool — where the kernels of a model without its own pool run — to `n`
/// threads (in `1..=MAX_THREADS`). Call it at start-up, before any parallel work; calling it
/// again with the same `n` is a no-op, with another `n` an error (a started pool cannot be
/// resized). It sets no environment variable.
pub fn configure(n: usize) -> Result<()> {
    kernels_cpu::threads::configure(n)?;
    Ok(())
}
