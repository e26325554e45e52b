//! Drop-in layers for an ordinary candle model, mirroring candle-nn: build them from the same
//! `candle_nn::VarBuilder` with the same names and argument order, plus the device as the last
//! argument, and they run on the NPU where it takes them and on the CPU otherwise.
//!
//! | candle-nn | here | on the NPU | when it stays on the CPU |
//! |---|---|---|---|
//! | `linear(in, out, vb)`, `linear_no_bias`, `linear_b` | [`linear()`], [`linear_no_bias`], [`linear_b`] | fp16 HMX weight tiles, packed once | holds the candle-nn [`candle_nn::Linear`] and the [`crate::Reason`] |
//! | `RmsNorm`, `rms_norm(size, eps, vb)` | [`RmsNorm`], [`rms_norm`] | `RMS_NORM` | candle-nn's fused `rms_norm` |
//! | `attention::flash_attn` (CPU, `(b, s, h, d)` in, `(b, h, s, d)` out) | [`flash_attn`] (`(b, s, h, d)` in and out), [`flash_attn_bhsd`] (`(b, h, s, d)` in and out), with [`AttnOptions`] (scale, additive mask, causal) | `FLASH_ATTN` | candle-nn's CPU flash attention |
//!
//! Every layer implements `candle_core::Module`; every call is routed by
//! [`crate::HexagonDevice::supports`] and counted, so [`crate::HexagonDevice::routing_report`]
//! shows what ran where.
//!
//! **fp16 on the NPU path.** The DSP's matrix unit multiplies fp16: a linear layer's weights are
//! stored as fp16 and its f32 activations are rounded to fp16 when they are packed into activation
//! tiles (accumulation is f32, the output f32); attention rounds K and V to fp16 (Q, scores,
//! softmax and output stay f32). RMSNorm computes in f32. Measured against the f32 CPU layers on
//! random inputs (`tests/it/fp16_error.rs`, numbers in the crate README): relative errors of a few
//! 1e-4 — the size of fp16's 2^-11 rounding. Compare NPU and CPU outputs with a tolerance, not
//! bit for bit.

pub mod attention;
pub mod linear;
pub mod norm;

pub use crate::ops::attention::{causal_mask, AttnOptions};
pub use attention::{flash_attn, flash_attn_bhsd};
pub use linear::{linear, linear_b, linear_no_bias, Linear};
pub use norm::{rms_norm, RmsNorm};
