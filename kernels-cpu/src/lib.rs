//! # kernels-cpu
//!
//! The CPU twin of `kernels-dsp`: pure-Rust kernels over plain slices, used by the CPU backend of
//! `dllm-models` and by the CPU paths of `candle-hexagon` (fallbacks and the sparse refresh path),
//! so that both read the same packed weight layouts and run the same arithmetic.
//!
//! It knows nothing of candle, tokens or models: inputs are slices with explicit shapes, outputs
//! are written into caller-provided slices, and work is split over output tiles on the current
//! rayon pool (so results do not depend on the number of threads).
//!
//! - [`QuantView`] / [`QuantMatrix`]: GEMM over quantized weights (Q4_0, Q8_0, Q4_K, Q6_K)
//!   repacked once into 32-row tiles ([`qlayout`]; Q4_0 is byte for byte the NPU's
//!   `KDSP_LAYOUT_Q4_0_TILES`), activations quantized per call to Q8_0 / Q8_K (by the tasks that
//!   use them, into per-thread buffers kept across calls).
//! - [`DenseView`] / [`DenseMatrix`]: GEMM over f32 / f16 / bf16 weights in the NPU's HMX
//!   weight-tile order (for f16, byte for byte `KDSP_LAYOUT_HMX_WEIGHT_TILES`), half-precision
//!   weights widened in registers, f32 accumulation.
//! - [`ggml`]: the GGUF block formats and their reference dequantization.
//! - [`Isa`]: the SIMD path (portable; on x86-64 AVX2, AVX-VNNI, AVX-512, AVX-512 VNNI; on
//!   AArch64 NEON, NEON + dotprod, NEON + i8mm), detected at run time; every kernel also takes an
//!   explicit path for tests and benchmarks.
//! - [`threads`]: the thread count every kernel uses.
//! - [`attention`]: attention over KV-cache segments (skip ranges, GQA, f32/f16/bf16 storage).
//! - [`pointwise`]: SwiGLU and the residual add between the GEMMs, split over the pool.

#![warn(missing_docs)]

#[cfg(target_arch = "aarch64")]
mod aarch64;
mod act;
mod act_row;
#[cfg(target_arch = "x86_64")]
mod act_x86;
mod aligned;
pub mod attention;
mod attention_ref;
#[cfg(target_arch = "x86_64")]
mod attention_x86;
pub mod dense;
mod error;
mod expf;
pub mod ggml;
pub mod isa;
mod par;
pub mod pointwise;
mod qgemm;
mod qgemm_rows;
pub mod qlayout;
mod scratch;
mod simd;
pub mod threads;
mod work_buf;

pub use dense::{DenseMatrix, DenseType, DenseView};
pub use error::{Error, Result};
pub use ggml::GgmlType;
pub use isa::Isa;
pub use qgemm::{QuantMatrix, QuantView};
pub use qlayout::QFormat;
