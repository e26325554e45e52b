//! Attention helpers: the fused op in candle-nn's `(b, s, h, d)` convention and in candle's usual
//! `(b, h, s, d)` layout.
//!
//! The kernel reads `(b, s, h, d)` rows directly. A model that computes `q`, `k`, `v` as
//! `(b, s, h * d)` projections only reshapes to `(b, s, h, d)` and calls [`flash_attn`] — no
//! transpose at all. A model written for candle's `(b, h, s, d)` layout (`q.matmul(&k.t())`
//! style) calls [`flash_attn_bhsd`], which is `transpose(1, 2)` on the way in and out: each
//! transpose is one strided copy on the host (the op stages contiguous inputs anyway), so prefer
//! the `(b, s, h, d)` path when writing new code.

use candle_core::Tensor;

use crate::device::HexagonDevice;
use crate::error::Result;
use crate::ops::attention::{flash_attn_with, AttnOptions};

/// `softmax(scale q k^T + mask) v` over `q (b, q_len, heads, d)`, `k, v (b, kv_len, kv_heads, d)`,
/// returning `(b, q_len, heads, d)` (GQA, mask and causal rules in [`crate::ops::attention`]).
pub fn flash_attn(
    dev: &HexagonDevice,
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    opts: &AttnOptions,
) -> Result<Tensor> {
    flash_attn_with(dev, q, k, v, opts)
}

/// [`flash_attn`] for candle's `(b, heads, s, d)` layout: `q (b, heads, q_len, d)`,
/// `k, v (b, kv_heads, kv_len, d)`, returning `(b, heads, q_len, d)`. A mask keeps its
/// `(q_len, kv_len)` / `(b or 1, heads or 1, q_len, kv_len)` shape.
pub fn flash_attn_bhsd(
    dev: &HexagonDevice,
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    opts: &AttnOptions,
) -> Result<Tensor> {
    let bshd = |t: &Tensor| t.transpose(1, 2);
    let o = flash_attn_with(dev, &bshd(q)?, &bshd(k)?, &bshd(v)?, opts)?;
    Ok(o.transpose(1, 2)?.contiguous()?)
}
