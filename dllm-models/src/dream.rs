//! Dream (Ye et al., "Dream 7B"; model card <https://huggingface.co/Dream-org/Dream-v0-Instruct-7B>).
//!
//! Qwen2.5's layout (`model.layers.{i}.self_attn.q_proj`, GQA, q/k/v biases, untied `lm_head`) run
//! bidirectionally. Dream was adapted from an autoregressive model, so its logits are **shifted**:
//! the prediction for position `i` is the raw output at `i - 1` (position 0 keeps its own); the
//! shared transformer applies this internally.

use std::path::Path;

use crate::config_json::Fields;
use crate::lm::Arch;
use crate::transformer::{ConfigNames, TransformerConfig};
use crate::Result;

/// `config.json` field names as they appear in Dream checkpoints.
pub const NAMES: ConfigNames = ConfigNames {
    hidden: "hidden_size",
    layers: "num_hidden_layers",
    heads: "num_attention_heads",
    kv_heads: "num_key_value_heads",
    ffn: "intermediate_size",
    vocab: "vocab_size",
    max_len: "max_position_embeddings",
};

/// Parse a Dream `config.json`. Unknown fields are ignored; a missing required field or an
/// unsupported option is an error naming it.
pub fn config_from_file(path: &Path) -> Result<TransformerConfig> {
    Fields::parse_file(path, config_from_fields)
}

/// Parse Dream config fields.
pub fn config_from_fields(f: &Fields) -> Result<TransformerConfig> {
    f.require_str("model_type", &["dream"])?;
    f.require_str("hidden_act", &["silu"])?;
    f.require_bool("use_sliding_window", false)?;
    f.require_no_rope_scaling()?;
    let heads = f.usize("num_attention_heads")?;
    let cfg = TransformerConfig {
        arch: Arch::Dream,
        hidden_size: f.usize("hidden_size")?,
        num_layers: f.usize("num_hidden_layers")?,
        num_heads: heads,
        num_kv_heads: f.opt_usize("num_key_value_heads")?.unwrap_or(heads),
        intermediate_size: f.usize("intermediate_size")?,
        vocab_size: f.usize("vocab_size")?,
        rms_norm_eps: f.f64("rms_norm_eps")?,
        rope_theta: f.f64("rope_theta")?,
        qkv_bias: true,
        tie_word_embeddings: f.opt_bool("tie_word_embeddings")?.unwrap_or(false),
        shift_logits: true,
        max_seq_len: f.usize("max_position_embeddings")?,
        special: f.special_tokens()?,
    };
    cfg.validate(&NAMES)?;
    Ok(cfg)
}

/// Write `cfg` as a Dream `config.json` object.
pub fn config_to_json(cfg: &TransformerConfig) -> serde_json::Value {
    serde_json::json!({
        "architectures": ["DreamModel"],
        "model_type": "Dream",
        "hidden_act": "silu",
        "hidden_size": cfg.hidden_size,
        "num_hidden_layers": cfg.num_layers,
        "num_attention_heads": cfg.num_heads,
        "num_key_value_heads": cfg.num_kv_heads,
        "intermediate_size": cfg.intermediate_size,
        "vocab_size": cfg.vocab_size,
        "rms_norm_eps": cfg.rms_norm_eps,
        "rope_theta": cfg.rope_theta,
        "rope_scaling": null,
        "sliding_window": null,
        "use_sliding_window": false,
        "tie_word_embeddings": cfg.tie_word_embeddings,
        "max_position_embeddings": cfg.max_seq_len,
        "mask_token_id": cfg.special.mask,
        "eos_token_id": cfg.special.eos,
        "bos_token_id": cfg.special.bos.unwrap_or(cfg.special.eos),
        "pad_token_id": cfg.special.pad.unwrap_or(cfg.special.eos),
    })
}

crate::candle_style::candle_style!(Arch::Dream, "Dream");
