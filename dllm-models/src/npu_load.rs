//! Placing a model on the NPU's block-level module: the whole stack packed into device memory at
//! load ([`place_blocks`]), and the CPU layers the sparse refresh runs over the module's own packed
//! bytes ([`shared_block`], [`shared_head`]; no second copy of the matrices). The sequence paths
//! over the placed module are in `npu_seq.rs`.

use candle_core::Tensor;
use candle_hexagon::{
    BlockWeights, HexTransformer, HexTransformerConfig, HexagonDevice, PackedFormat, PackedWeight,
    Placed, WeightRef,
};

use crate::block::{GateUp, Qkv};
use crate::config::{MatrixDims, TransformerConfig};
use crate::layers::{CpuLinear, Linear, Param};
use crate::linear::{dense, TileFormat};
use crate::role::Role;
use crate::weights::WeightSource;
use crate::{Error, Result};

/// Pack the whole stack into the NPU's block-level module when the device takes it (`None` keeps
/// the per-op path; the decision and its reason are counted by the device).
pub(crate) fn place_blocks(
    dev: &HexagonDevice,
    cfg: &TransformerConfig,
    w: &dyn WeightSource,
) -> Result<Option<HexTransformer>> {
    let (h, hd) = (cfg.hidden_size, cfg.head_dim());
    let MatrixDims {
        nq,
        nkv,
        ff,
        vocab: v,
    } = cfg.matrix_dims();
    struct Owned {
        attn_norm: Tensor,
        ffn_norm: Tensor,
        mats: [Param; 7],
        bias: [Option<Tensor>; 3],
    }
    let norm = |role: Role| -> Result<Tensor> { dense(w.get(role, &[h])?, role) };
    let mut owned = Vec::with_capacity(cfg.num_layers);
    for i in 0..cfg.num_layers {
        let bias = |role: Role, n: usize| -> Result<Option<Tensor>> {
            if cfg.qkv_bias {
                Ok(Some(dense(w.get(role, &[n])?, role)?))
            } else {
                Ok(None)
            }
        };
        owned.push(Owned {
            attn_norm: norm(Role::AttnNorm(i))?,
            ffn_norm: norm(Role::FfnNorm(i))?,
            mats: [
                w.get(Role::Q(i), &[nq, h])?,
                w.get(Role::K(i), &[nkv, h])?,
                w.get(Role::V(i), &[nkv, h])?,
                w.get(Role::O(i), &[h, nq])?,
                w.get(Role::Gate(i), &[ff, h])?,
                w.get(Role::Up(i), &[ff, h])?,
                w.get(Role::Down(i), &[h, ff])?,
            ],
            bias: [
                bias(Role::QBias(i), nq)?,
                bias(Role::KBias(i), nkv)?,
                bias(Role::VBias(i), nkv)?,
            ],
        });
    }
    let final_norm = norm(Role::FinalNorm)?;
    let head = if cfg.tie_word_embeddings {
        w.get(Role::Embed, &[v, h])?
    } else {
        w.get(Role::Head, &[v, h])?
    };
    fn r(p: &Param) -> WeightRef<'_> {
        match p {
            Param::Dense(t) => WeightRef::Dense(t),
            Param::Quant(q) => WeightRef::Quant(q),
        }
    }
    let blocks = owned
        .iter()
        .map(|o| BlockWeights {
            attn_norm: &o.attn_norm,
            q: r(&o.mats[0]),
            k: r(&o.mats[1]),
            v: r(&o.mats[2]),
            q_bias: o.bias[0].as_ref(),
            k_bias: o.bias[1].as_ref(),
            v_bias: o.bias[2].as_ref(),
            o: r(&o.mats[3]),
            ffn_norm: &o.ffn_norm,
            gate: r(&o.mats[4]),
            up: r(&o.mats[5]),
            down: r(&o.mats[6]),
        })
        .collect();
    let hcfg = HexTransformerConfig {
        hidden: h,
        heads: cfg.num_heads,
        kv_heads: cfg.num_kv_heads,
        head_dim: hd,
        ffn: ff,
        vocab: v,
        rope_theta: cfg.rope_theta,
        rms_eps: cfg.rms_norm_eps as f32,
        max_positions: cfg.max_seq_len,
    };
    let weights = candle_hexagon::TransformerWeights {
        blocks,
        final_norm: &final_norm,
        lm_head: Some(r(&head)),
    };
    Ok(match HexTransformer::new(dev, &hcfg, &weights)? {
        Placed::Npu(t) => Some(t),
        Placed::Cpu(_) => None,
    })
}

/// A CPU layer over the NPU module's packed bytes (read in place by kernels-cpu).
fn shared(p: PackedWeight, bias: Option<&Tensor>) -> Result<Linear> {
    let format = match p.format {
        PackedFormat::F16Tiles => TileFormat::F16Hmx,
        PackedFormat::Q4_0Tiles => TileFormat::Q4_0,
    };
    Ok(Linear::Cpu(CpuLinear::from_shared_tiles(
        format, p.n, p.k, p.bytes, bias,
    )?))
}

/// Block `i`'s CPU layers for the paths that run beside the NPU (the sparse refresh), reading
/// the NPU module's packed weights: fused q/k/v (with the fused `qkv_bias`), o, fused gate/up,
/// down. Returns `(qkv, o, gate_up, down)`.
pub(crate) fn shared_block(
    hex: &HexTransformer,
    i: usize,
    cfg: &TransformerConfig,
    qkv_bias: Option<&Tensor>,
) -> Result<(Qkv, Linear, GateUp, Linear)> {
    let p = hex.packed_block(i).ok_or_else(|| Error::NpuBlock {
        block: i,
        blocks: hex.num_blocks(),
    })?;
    let MatrixDims {
        nq, nkv, ff: ffn, ..
    } = cfg.matrix_dims();
    if p.qkv.n != nq + 2 * nkv || p.gate_up.n != 2 * ffn {
        return Err(Error::Shape {
            what: format!("block {i}: the NPU's (fused q/k/v, fused gate/up) outputs"),
            expected: vec![nq + 2 * nkv, 2 * ffn],
            got: vec![p.qkv.n, p.gate_up.n],
        });
    }
    Ok((
        Qkv::Fused {
            qkv: shared(p.qkv, qkv_bias)?,
            nq,
            nkv,
        },
        shared(p.o, None)?,
        GateUp::Fused {
            gate_up: shared(p.gate_up, None)?,
            ffn,
        },
        shared(p.down, None)?,
    ))
}

/// The LM head over the NPU module's packed head, when the head is on the NPU.
pub(crate) fn shared_head(hex: &HexTransformer) -> Result<Option<Linear>> {
    hex.packed_head().map(|p| shared(p, None)).transpose()
}
