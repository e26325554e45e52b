//! One transformer block's layers and its projections. The projections come in two shapes: one
//! linear layer per checkpoint matrix (q, k, v, gate, up: every CPU model), or fused the way the
//! NPU runs them (q/k/v stacked, gate/up stacked): the CPU copy of a model whose stack the NPU
//! holds reads the NPU module's packed bytes in place, so there is no second copy of the weights.

use candle_core::{Tensor, D};

use crate::layers::{Linear, RmsNorm};
use crate::Result;

/// The attention input projections.
#[derive(Debug)]
pub(crate) enum Qkv {
    /// One layer each.
    Split { q: Linear, k: Linear, v: Linear },
    /// One layer whose outputs are `nq` query, `nkv` key and `nkv` value features.
    // Built only by the NPU sequence paths (`npu_load.rs`, the `hexagon` feature).
    #[cfg_attr(not(feature = "hexagon"), allow(dead_code))]
    Fused { qkv: Linear, nq: usize, nkv: usize },
}

/// The MLP input projections.
#[derive(Debug)]
pub(crate) enum GateUp {
    /// One layer each.
    Split { gate: Linear, up: Linear },
    /// One layer whose outputs are `ffn` gate then `ffn` up features.
    // Built only by the NPU sequence paths (`npu_load.rs`, the `hexagon` feature).
    #[cfg_attr(not(feature = "hexagon"), allow(dead_code))]
    Fused { gate_up: Linear, ffn: usize },
}

#[derive(Debug)]
pub(crate) struct Block {
    pub(crate) attn_norm: RmsNorm,
    pub(crate) qkv: Qkv,
    pub(crate) o: Linear,
    pub(crate) ffn_norm: RmsNorm,
    pub(crate) gate_up: GateUp,
    pub(crate) down: Linear,
}

impl Block {
    /// The normalised input `h` `(b, n, hidden)` projected: keys and values of every row, and the
    /// queries of `q_rows` (every row when `None`; no query when `q_rows` is empty).
    pub(crate) fn project(
        &self,
        h: &Tensor,
        q_rows: Option<&Tensor>,
    ) -> Result<(Option<Tensor>, Tensor, Tensor)> {
        let wants_q = q_rows.map_or(Ok(true), |r| r.dim(0).map(|n| n > 0))?;
        match &self.qkv {
            Qkv::Split { q, k, v } => {
                let query = if wants_q {
                    Some(match q_rows {
                        None => q.forward(h)?,
                        Some(idx) => q.forward(&h.index_select(idx, 1)?)?,
                    })
                } else {
                    None
                };
                Ok((query, k.forward(h)?, v.forward(h)?))
            }
            Qkv::Fused { qkv, nq, nkv } => {
                // Queries of every row come with the fused matmul; the rows asked for are kept.
                let all = qkv.forward(h)?;
                let query = if wants_q {
                    let q = all.narrow(D::Minus1, 0, *nq)?;
                    Some(match q_rows {
                        None => q,
                        Some(idx) => q.contiguous()?.index_select(idx, 1)?,
                    })
                } else {
                    None
                };
                Ok((
                    query,
                    all.narrow(D::Minus1, *nq, *nkv)?,
                    all.narrow(D::Minus1, nq + nkv, *nkv)?,
                ))
            }
        }
    }

    /// Gate and up projections of the normalised `h`.
    pub(crate) fn gate_up(&self, h: &Tensor) -> Result<(Tensor, Tensor)> {
        match &self.gate_up {
            GateUp::Split { gate, up } => Ok((gate.forward(h)?, up.forward(h)?)),
            GateUp::Fused { gate_up, ffn } => {
                let gu = gate_up.forward(h)?;
                Ok((
                    gu.narrow(D::Minus1, 0, *ffn)?.contiguous()?,
                    gu.narrow(D::Minus1, *ffn, *ffn)?.contiguous()?,
                ))
            }
        }
    }

    /// The block's linear layers.
    pub(crate) fn linears(&self) -> Vec<&Linear> {
        let mut v = match &self.qkv {
            Qkv::Split { q, k, v } => vec![q, k, v],
            Qkv::Fused { qkv, .. } => vec![qkv],
        };
        v.push(&self.o);
        match &self.gate_up {
            GateUp::Split { gate, up } => v.extend([gate, up]),
            GateUp::Fused { gate_up, .. } => v.push(gate_up),
        }
        v.push(&self.down);
        v
    }
}
