//! The CPU interpreter of the block definition (`block_def.rs`): each op over candle tensors
//! and kernels-cpu, in the order the definition gives.

use candle_core::Tensor;

use super::TransformerWeights;
use crate::block::Block;
use crate::block_def::{BlockOps, HeadOps, Norm, Proj};
use crate::layers::{swiglu, Rope};
use crate::{Error, Result};

/// Where one block's attention reads its keys and where its fresh K/V go.
pub(super) trait AttentionSource {
    /// The block's fresh keys (RoPE applied) and values of every input row, `(1, rows, kv_heads,
    /// head_dim)`: the definition's `cache_kv`.
    fn cache_kv(&mut self, layer: usize, k: Tensor, v: Tensor) -> Result<()>;
    /// Attention of the block's queries `(1, queries, heads, head_dim)`; returns `(1, queries,
    /// heads * head_dim)`. Queries are every input row, except in the last block, where they are
    /// the rows asked for.
    fn attend(&mut self, layer: usize, q: &Tensor) -> Result<Tensor>;
}

/// Act of activations, and whether they are already the requested rows.
pub(super) struct Act {
    pub(super) t: Tensor,
    selected: bool,
}

impl Act {
    pub(super) fn all(t: Tensor) -> Self {
        Act { t, selected: false }
    }
}

/// One block on the CPU. `q_rows` narrows queries (and the block's output) to those rows; the
/// attention source keeps the block's K/V and runs its attention over whatever keys it chooses.
pub(super) struct CpuBlock<'a, 'b> {
    pub(super) w: &'a TransformerWeights,
    pub(super) blk: &'a Block,
    /// `(cos, sin)` of every row.
    pub(super) rope: (&'a Tensor, &'a Tensor),
    pub(super) q_rows: Option<&'a Tensor>,
    pub(super) src: &'b mut dyn AttentionSource,
    /// The block's index in the stack.
    pub(super) layer: usize,
}

fn not_a(role: &'static str) -> Error {
    Error::Internal { what: role }
}

impl HeadOps for CpuBlock<'_, '_> {
    type X = Act;

    fn rms_norm(&mut self, x: &Act, w: Norm) -> Result<Act> {
        let norm = match w {
            Norm::Attn => &self.blk.attn_norm,
            Norm::Ffn => &self.blk.ffn_norm,
            Norm::Final => &self.w.norm,
        };
        Ok(Act {
            t: norm.forward(&x.t, self.w.mode)?,
            selected: x.selected,
        })
    }

    fn linear(&mut self, x: &Act, w: Proj) -> Result<Act> {
        let lin = match w {
            Proj::O => &self.blk.o,
            Proj::Down => &self.blk.down,
            Proj::Head => &self.w.head,
            Proj::Qkv | Proj::GateUp => {
                return Err(not_a("fused projections go through attn_inputs/mlp_inputs"))
            }
        };
        Ok(Act {
            t: lin.forward(&x.t)?,
            selected: x.selected,
        })
    }
}

impl BlockOps for CpuBlock<'_, '_> {
    fn attn_inputs(&mut self, h: &Act) -> Result<(Act, Act, Act)> {
        let (b, n, _) = h.t.dims3()?;
        let c = &self.w.cfg;
        let hd = c.head_dim();
        // Queries only for the requested rows: the rest would be discarded.
        let (q, k, v) = self.blk.project(&h.t, self.q_rows)?;
        let k = k.reshape((b, n, c.num_kv_heads, hd))?;
        let v = v.reshape((b, n, c.num_kv_heads, hd))?;
        let nq = match self.q_rows {
            None => n,
            Some(idx) => idx.dim(0)?,
        };
        let q = match q {
            None => Tensor::zeros((b, 0, c.num_heads, hd), h.t.dtype(), h.t.device())?,
            Some(q) => q.reshape((b, nq, c.num_heads, hd))?,
        };
        Ok((
            Act {
                t: q,
                selected: self.q_rows.is_some(),
            },
            Act::all(k),
            Act::all(v),
        ))
    }

    fn rope(&mut self, x: Act) -> Result<Act> {
        if x.t.dim(1)? == 0 {
            return Ok(x);
        }
        let t = match (x.selected, self.q_rows) {
            (true, Some(idx)) => {
                let (cos, sin) = (
                    self.rope.0.index_select(idx, 0)?,
                    self.rope.1.index_select(idx, 0)?,
                );
                Rope::apply_on(&x.t, &cos, &sin, self.w.mode, &self.w.ops_backend)?
            }
            _ => Rope::apply_on(
                &x.t,
                self.rope.0,
                self.rope.1,
                self.w.mode,
                &self.w.ops_backend,
            )?,
        };
        Ok(Act {
            t,
            selected: x.selected,
        })
    }

    fn cache_kv(&mut self, k: Act, v: Act) -> Result<()> {
        self.src.cache_kv(self.layer, k.t, v.t)
    }

    fn select_rows(&mut self, x: Act) -> Result<Act> {
        match self.q_rows {
            Some(idx) if !x.selected => Ok(Act {
                t: x.t.index_select(idx, 1)?,
                selected: true,
            }),
            _ => Ok(x),
        }
    }

    fn attention(&mut self, q: &Act) -> Result<Act> {
        if q.t.dim(1)? == 0 {
            let (b, _, h, d) = q.t.dims4()?;
            return Ok(Act {
                t: q.t.reshape((b, 0, h * d))?,
                selected: q.selected,
            });
        }
        Ok(Act {
            t: self.src.attend(self.layer, &q.t)?,
            selected: q.selected,
        })
    }

    fn add(&mut self, acc: Act, x: &Act) -> Result<Act> {
        Ok(Act {
            t: crate::layers::add(&acc.t, &x.t, self.w.mode)?,
            selected: acc.selected,
        })
    }

    fn mlp_inputs(&mut self, h: &Act) -> Result<(Act, Act)> {
        let (g, u) = self.blk.gate_up(&h.t)?;
        let s = h.selected;
        Ok((Act { t: g, selected: s }, Act { t: u, selected: s }))
    }

    fn swiglu(&mut self, gate: &Act, up: &Act) -> Result<Act> {
        Ok(Act {
            t: swiglu(&gate.t, &up.t, self.w.mode, &self.w.ops_backend)?,
            selected: gate.selected,
        })
    }

    fn no_rows(&self, x: &Act) -> Result<bool> {
        Ok(x.t.dim(1)? == 0)
    }
}

/// The head on the CPU.
pub(super) struct CpuHead<'a> {
    pub(super) w: &'a TransformerWeights,
}

impl HeadOps for CpuHead<'_> {
    type X = Tensor;

    fn rms_norm(&mut self, x: &Tensor, w: Norm) -> Result<Tensor> {
        match w {
            Norm::Final => self.w.norm.forward(x, self.w.mode),
            _ => Err(not_a("the head has only the final norm")),
        }
    }

    fn linear(&mut self, x: &Tensor, w: Proj) -> Result<Tensor> {
        match w {
            Proj::Head => self.w.head.forward(x),
            _ => Err(not_a("the head has only the LM head matrix")),
        }
    }
}
