//! The small tensors of one layer (its two norm weights and, for Dream, the q/k/v biases), read
//! once per layer by the loader's one walk over the checkpoint's tensor roles and shared by
//! whichever consumer builds the layer: the CPU block, or the NPU stack (which pins them) plus
//! the CPU layers that read its packed bytes.

use candle_core::Tensor;

use crate::config::TransformerConfig;
use crate::linear::dense;
use crate::role::Role;
use crate::weights::WeightSource;
use crate::Result;

/// One layer's norm weights and optional q/k/v biases, dense in the compute dtype.
#[derive(Debug, Clone)]
pub(crate) struct LayerParams {
    pub(crate) attn_norm: Tensor,
    pub(crate) ffn_norm: Tensor,
    /// `(q, k, v)` biases when the model has them.
    pub(crate) qkv_bias: Option<[Tensor; 3]>,
}

impl LayerParams {
    /// Read layer `i`'s norms and biases from `w`.
    pub(crate) fn read(w: &dyn WeightSource, cfg: &TransformerConfig, i: usize) -> Result<Self> {
        let m = cfg.matrix_dims();
        let vec = |role: Role, n: usize| dense(w.get(role, &[n])?, role);
        let qkv_bias = if cfg.qkv_bias {
            Some([
                vec(Role::QBias(i), m.nq)?,
                vec(Role::KBias(i), m.nkv)?,
                vec(Role::VBias(i), m.nkv)?,
            ])
        } else {
            None
        };
        Ok(LayerParams {
            attn_norm: vec(Role::AttnNorm(i), cfg.hidden_size)?,
            ffn_norm: vec(Role::FfnNorm(i), cfg.hidden_size)?,
            qkv_bias,
        })
    }

    /// The bias of the q (0), k (1) or v (2) projection.
    #[cfg_attr(not(feature = "hexagon"), allow(dead_code))]
    pub(crate) fn bias(&self, j: usize) -> Option<&Tensor> {
        self.qkv_bias.as_ref().map(|b| &b[j])
    }
}
