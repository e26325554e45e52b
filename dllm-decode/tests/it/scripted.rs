//! What the scripted models of `drafts` and `verify` share: an 8-token vocabulary with the mask
//! at 7, their model description, and logits rows that give one token a chosen probability.

use candle_core::{DType, Device, Tensor};
use dllm_models::{Arch, ModelInfo, SpecialTokens};

pub const VOCAB: usize = 8;
pub const MASK: u32 = 7;
pub const PROMPT: &[u32] = &[1, 2, 3];

/// A one-layer LLaDA-shaped description of a scripted model (nothing is computed from it).
pub fn info() -> ModelInfo {
    ModelInfo {
        arch: Arch::Llada,
        vocab_size: VOCAB,
        hidden_size: 8,
        num_layers: 1,
        num_heads: 1,
        num_kv_heads: 1,
        head_dim: 8,
        intermediate_size: 8,
        max_seq_len: 128,
        shift_logits: false,
        special: SpecialTokens {
            mask: MASK,
            eos: 6,
            eot: None,
            bos: None,
            pad: None,
        },
        dtype: DType::F32,
        num_params: 0,
    }
}

/// A logits row whose softmax gives `token` probability `conf`.
pub fn row(token: usize, conf: f64) -> Vec<f32> {
    // softmax: p(token) = e^x / (e^x + VOCAB - 1) = conf
    let x = (conf * (VOCAB - 1) as f64 / (1.0 - conf)).ln() as f32;
    (0..VOCAB)
        .map(|t| if t == token { x } else { 0.0 })
        .collect()
}

/// Rows as a `(1, rows, VOCAB)` logits tensor.
pub fn logits(rows: &[Vec<f32>]) -> Tensor {
    Tensor::from_vec(rows.concat(), (1, rows.len(), VOCAB), &Device::Cpu).unwrap()
}
