//! The trainable model: config for the suite's vocabulary, seeded initialisation into a
//! `candle_nn::VarMap`, and the inference copy used for evaluation during training.

use candle_core::{DType, Device, Tensor, Var};
use candle_nn::{VarBuilder, VarMap};
use dllm_models::lm::{Arch, SpecialTokens};
use dllm_models::weights::HfWeights;
use dllm_models::{dream, llada, DiffusionTransformer, OpMode, TransformerConfig};

use crate::rng::Rng;
use crate::tokenizer::{BOS_ID, EOS_ID, MASK_ID, PAD_ID};
use crate::{Error, Result};

/// Shape of a suite model.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ModelShape {
    /// LLaDA or Dream layout.
    pub arch: Arch,
    /// Hidden size.
    pub hidden: usize,
    /// Blocks.
    pub layers: usize,
    /// Query heads.
    pub heads: usize,
    /// Key/value heads.
    pub kv_heads: usize,
    /// MLP hidden size.
    pub ffn: usize,
}

/// Longest canvas a suite model accepts (prompt <= 24 tokens plus generous generation lengths).
pub const SUITE_MAX_SEQ_LEN: usize = 256;

/// The full config of a suite model with `vocab` tokens and the suite's special ids.
pub fn suite_config(shape: ModelShape, vocab: usize) -> Result<TransformerConfig> {
    let dream = shape.arch == Arch::Dream;
    let cfg = TransformerConfig {
        arch: shape.arch,
        hidden_size: shape.hidden,
        num_layers: shape.layers,
        num_heads: shape.heads,
        num_kv_heads: shape.kv_heads,
        intermediate_size: shape.ffn,
        vocab_size: vocab,
        rms_norm_eps: if dream { 1e-6 } else { 1e-5 },
        rope_theta: 10_000.0,
        qkv_bias: dream,
        tie_word_embeddings: false,
        shift_logits: dream,
        max_seq_len: SUITE_MAX_SEQ_LEN,
        special: SpecialTokens {
            mask: MASK_ID,
            eos: EOS_ID,
            eot: None,
            bos: Some(BOS_ID),
            pad: Some(PAD_ID),
        },
    };
    cfg.validate(if dream { &dream::NAMES } else { &llada::NAMES })?;
    Ok(cfg)
}

fn is_output_projection(name: &str) -> bool {
    name.contains("attn_out")
        || name.contains("o_proj")
        || name.contains("down_proj")
        || (name.contains(".blocks.") && name.ends_with("ff_out.weight"))
}

fn is_vocab_matrix(name: &str) -> bool {
    name.contains("wte")
        || name.contains("embed_tokens")
        || name == "model.transformer.ff_out.weight"
        || name == "lm_head.weight"
}

/// Seeded initialisation (candle's CPU RNG cannot be seeded): embedding and LM head N(0, 0.02),
/// other matrices N(0, 1/fan_in), the residual outputs (attention out, MLP down) further scaled by
/// 1/sqrt(2 layers); norms 1, biases 0. Inserts every parameter into `varmap` under its HF name.
pub fn init_varmap(varmap: &VarMap, cfg: &TransformerConfig, seed: u64) -> Result<()> {
    let shapes: std::collections::HashMap<String, Vec<usize>> = cfg
        .param_shapes()
        .into_iter()
        .map(|(role, dims)| (role.hf_name(cfg.arch), dims))
        .collect();
    let mut rng = Rng::new(seed);
    let mut names: Vec<&String> = shapes.keys().collect();
    names.sort();
    let mut data = varmap
        .data()
        .lock()
        .map_err(|_| Error::Train("variable map lock poisoned".into()))?;
    for name in names {
        let dims = shapes[name].clone();
        let n: usize = dims.iter().product();
        let values: Vec<f32> = if name.ends_with("norm.weight") || name.ends_with("ln_f.weight") {
            vec![1.0; n]
        } else if dims.len() == 1 {
            vec![0.0; n]
        } else {
            let std = if is_vocab_matrix(name) {
                0.02
            } else {
                let base = 1.0 / (dims[1] as f64).sqrt();
                if is_output_projection(name) {
                    base / (2.0 * cfg.num_layers as f64).sqrt()
                } else {
                    base
                }
            };
            (0..n).map(|_| (rng.normal() * std) as f32).collect()
        };
        let t = Tensor::from_vec(values, dims, &Device::Cpu)?;
        data.insert(name.clone(), Var::from_tensor(&t)?);
    }
    Ok(())
}

/// The model over the variables of `varmap`, with differentiable ops.
pub fn trainable(varmap: &VarMap, cfg: &TransformerConfig) -> Result<DiffusionTransformer> {
    let vb = VarBuilder::from_varmap(varmap, DType::F32, &Device::Cpu);
    Ok(DiffusionTransformer::new(
        cfg.clone(),
        &HfWeights::from_var_builder(vb, cfg.arch),
        OpMode::Differentiable,
    )?)
}

/// A fused-op inference copy of the current weights (for evaluation during training).
pub fn inference_copy(varmap: &VarMap, cfg: &TransformerConfig) -> Result<DiffusionTransformer> {
    let data = varmap
        .data()
        .lock()
        .map_err(|_| Error::Train("variable map lock poisoned".into()))?;
    let map = data
        .iter()
        .map(|(k, v)| (k.clone(), v.as_tensor().detach()))
        .collect();
    let w = HfWeights::from_tensors(map, cfg.arch, DType::F32, &Device::Cpu);
    Ok(DiffusionTransformer::new(cfg.clone(), &w, OpMode::Fused)?)
}

/// `(name, variable)` pairs of `varmap`, sorted by name.
pub fn named_vars(varmap: &VarMap) -> Result<Vec<(String, Var)>> {
    let data = varmap
        .data()
        .lock()
        .map_err(|_| Error::Train("variable map lock poisoned".into()))?;
    let mut v: Vec<(String, Var)> = data.iter().map(|(k, v)| (k.clone(), v.clone())).collect();
    v.sort_by(|a, b| a.0.cmp(&b.0));
    Ok(v)
}
