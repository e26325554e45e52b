//! LLaDA (Nie et al., "Large Language Diffusion Models"; model card
//! <https://huggingface.co/GSAI-ML/LLaDA-8B-Instruct>).
//!
//! A bidirectional llama-style transformer in OLMo's checkpoint layout
//! (`model.transformer.blocks.{i}.q_proj.weight`, `ff_proj` = gate, `up_proj`, `ff_out` = down,
//! `model.transformer.ff_out.weight` = untied LM head). Logits are not shifted.

use std::path::Path;

use crate::config_json::Fields;
use crate::lm::Arch;
use crate::transformer::{ConfigNames, TransformerConfig};
use crate::{Error, Result};

/// `config.json` field names as they appear in LLaDA checkpoints.
pub const NAMES: ConfigNames = ConfigNames {
    hidden: "d_model",
    layers: "n_layers",
    heads: "n_heads",
    kv_heads: "n_kv_heads",
    ffn: "mlp_hidden_size",
    vocab: "vocab_size",
    max_len: "max_sequence_length",
};

/// LLaDA-8B-Instruct's `<|eot_id|>` (end of turn), used when a tokenizer is not available.
pub const LLADA_8B_EOT_ID: u32 = 126348;

/// Parse a LLaDA `config.json`. Unknown fields are ignored; a missing required field or an
/// unsupported option is an error naming it.
pub fn config_from_file(path: &Path) -> Result<TransformerConfig> {
    Fields::parse_file(path, config_from_fields)
}

/// Parse LLaDA config fields.
pub fn config_from_fields(f: &Fields) -> Result<TransformerConfig> {
    f.require_str("model_type", &["llada"])?;
    f.require_str("activation_type", &["silu", "swiglu"])?;
    f.require_str("block_type", &["llama"])?;
    f.require_str("layer_norm_type", &["rms"])?;
    f.require_bool("rope", true)?;
    f.require_bool("alibi", false)?;
    f.require_bool("include_bias", false)?;
    f.require_bool("scale_logits", false)?;
    f.require_bool("attention_layer_norm", false)?;
    f.require_bool("input_emb_norm", false)?;
    f.require_bool("multi_query_attention", false)?;
    f.require_no_rope_scaling()?;
    let hidden = f.usize("d_model")?;
    let heads = f.usize("n_heads")?;
    let ffn = match f.opt_usize("mlp_hidden_size")? {
        Some(v) => v,
        None => match f.opt_usize("mlp_ratio")? {
            Some(r) => r * hidden,
            None => {
                return Err(Error::MissingField {
                    field: "mlp_hidden_size".into(),
                })
            }
        },
    };
    let vocab = f.usize("vocab_size")?;
    if vocab == 0 {
        return Err(Error::invalid("vocab_size", "must be positive"));
    }
    let rows = match f.opt_usize("embedding_size")? {
        Some(e) if e < vocab => {
            return Err(Error::invalid(
                "embedding_size",
                format!("{e} is smaller than vocab_size {vocab}"),
            ))
        }
        Some(e) => e,
        None => vocab,
    };
    let cfg = TransformerConfig {
        arch: Arch::Llada,
        hidden_size: hidden,
        num_layers: f.usize("n_layers")?,
        num_heads: heads,
        num_kv_heads: f.opt_usize("n_kv_heads")?.unwrap_or(heads),
        intermediate_size: ffn,
        vocab_size: rows,
        rms_norm_eps: f.f64("rms_norm_eps")?,
        rope_theta: f.f64("rope_theta")?,
        qkv_bias: f.opt_bool("include_qkv_bias")?.unwrap_or(false),
        tie_word_embeddings: f.opt_bool("weight_tying")?.unwrap_or(false),
        shift_logits: false,
        max_seq_len: f.usize("max_sequence_length")?,
        special: f.special_tokens()?,
    };
    cfg.validate(&NAMES)?;
    Ok(cfg)
}

/// Write `cfg` as a LLaDA `config.json` object (the keys the official checkpoint uses).
pub fn config_to_json(cfg: &TransformerConfig) -> serde_json::Value {
    serde_json::json!({
        "architectures": ["LLaDAModelLM"],
        "model_type": "llada",
        "activation_type": "silu",
        "block_type": "llama",
        "layer_norm_type": "rms",
        "alibi": false,
        "rope": true,
        "include_bias": false,
        "include_qkv_bias": cfg.qkv_bias,
        "scale_logits": false,
        "weight_tying": cfg.tie_word_embeddings,
        "d_model": cfg.hidden_size,
        "n_layers": cfg.num_layers,
        "n_heads": cfg.num_heads,
        "n_kv_heads": cfg.num_kv_heads,
        "mlp_hidden_size": cfg.intermediate_size,
        "mlp_ratio": 4,
        "vocab_size": cfg.vocab_size,
        "embedding_size": cfg.vocab_size,
        "rms_norm_eps": cfg.rms_norm_eps,
        "rope_theta": cfg.rope_theta,
        "max_sequence_length": cfg.max_seq_len,
        "mask_token_id": cfg.special.mask,
        "eos_token_id": cfg.special.eos,
        "pad_token_id": cfg.special.pad.unwrap_or(cfg.special.eos),
    })
}

crate::candle_style::candle_style!(Arch::Llada, "LLaDA");
