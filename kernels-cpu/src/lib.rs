//! # kernels-cpu
//!
//! The CPU twin of `kernels-dsp`: pure-Rust kernels over plain slices, used by the CPU backend of
//! `dllm-models` and by the CPU paths of `candle-hexagon` (fallbacks and the sparse refresh path),
//! so that both read the same packed weight layouts and run the same arithmetic.
//!
//! It knows nothing of candle, tokens or models: inputs are slices with explicit shapes, outputs
//! are written into caller-provided slices, and work is split over output tiles on the current
//! rayon pool (so results do not depend on the number of threads).

#![warn(missing_docs)]

pub mod attention;
mod error;

pub use error::{Error, Result};
