//! The one stack loop: embeddings through every block to the last block's requested rows, with
//! the attention of each block read from an [`AttentionSource`] — where the fresh K/V go and which
//! keys each query sees is the source's business, never the loop's.
//!
//! Two sources exist: [`FreshOnly`] (a whole-sequence forward with no cache: training), and
//! [`super::parts::Parts`] (any number of sequences, each with its cache, a main set of rows — a
//! window whose K/V are written into the cache's free rows, or a sparse refresh whose K/V are
//! returned — and groups of rows that see everything but their own positions: verification
//! shadows and re-scores).

use candle_core::Tensor;

use super::cpu_ops::{Act, AttentionSource, CpuBlock};
use super::TransformerWeights;
use crate::block_def;
use crate::layers::attention_on;
use crate::Result;

impl TransformerWeights {
    /// Every block over `x` `(1, rows, hidden)` whose rows sit at the positions of `rope` (`(cos,
    /// sin)` per row); the last block keeps only `last_rows` (all rows when `None`).
    pub(super) fn stack(
        &self,
        mut x: Tensor,
        rope: (&Tensor, &Tensor),
        last_rows: Option<&Tensor>,
        src: &mut dyn AttentionSource,
    ) -> Result<Tensor> {
        let last = self.blocks.len() - 1;
        for (layer, blk) in self.blocks.iter().enumerate() {
            let mut ops = CpuBlock {
                w: self,
                blk,
                rope,
                q_rows: if layer == last { last_rows } else { None },
                src: &mut *src,
                layer,
            };
            x = block_def::block(&mut ops, Act::all(x))?.t;
        }
        Ok(x)
    }
}

/// Attention over the call's own rows only (no cache), differentiable in
/// [`crate::OpMode::Differentiable`]: the training forward.
pub(super) struct FreshOnly<'a> {
    pub(super) w: &'a TransformerWeights,
    pub(super) kv: Option<(Tensor, Tensor)>,
}

impl AttentionSource for FreshOnly<'_> {
    fn cache_kv(&mut self, _: usize, k: Tensor, v: Tensor) -> Result<()> {
        self.kv = Some((k, v));
        Ok(())
    }

    fn attend(&mut self, _: usize, q: &Tensor) -> Result<Tensor> {
        let (k, v) = self.kv.as_ref().ok_or(crate::Error::Internal {
            what: "attention before the block's K/V were cached",
        })?;
        let w = self.w;
        attention_on(q, k, v, w.scale(), w.mode, &w.ops_backend)
    }
}
