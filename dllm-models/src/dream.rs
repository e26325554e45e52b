//! Dream (Ye et al., "Dream 7B"; model card <https://huggingface.co/Dream-org/Dream-v0-Instruct-7B>).
//!
//! Qwen2.5's layout (`model.layers.{i}.self_attn.q_proj`, GQA, q/k/v biases, untied `lm_head`) run
//! bidirectionally. Dream was adapted from an autoregressive model, so its logits are **shifted**:
//! the prediction for position `i` is the raw output at `i - 1` (position 0 keeps its own); the
//! shared transformer applies this internally.

use std::path::Path;

use crate::config::{ConfigNames, TransformerConfig};
use crate::config_json::Fields;
use crate::lm::{Arch, SpecialTokens};
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

/// Parse Dream config fields (see [`Config::from_fields`]) into the normalised config.
pub fn config_from_fields(f: &Fields) -> Result<TransformerConfig> {
    Config::from_fields(f)?.transformer_config()
}

/// Dream's `config.json` with named fields (the checkpoint's spelling), like candle-transformers'
/// configs: `let cfg: dream::Config = serde_json::from_str(&text)?`, then
/// `cfg.num_hidden_layers`.
///
/// Deserialising runs the same field checks as [`crate::load`] (a message names the field). The
/// fields Dream fixes (`hidden_act`, `use_sliding_window`, `rope_scaling`) are checked and not
/// kept; `num_key_value_heads` defaults to `num_attention_heads`. Build the model with
/// [`Model::new`]; fields edited after parsing are checked again there.
///
/// ```
/// use dllm_models::dream;
///
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// # let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../models/tiny-dream/config.json");
/// let cfg: dream::Config = serde_json::from_str(&std::fs::read_to_string(path)?)?;
/// assert!(cfg.num_key_value_heads < cfg.num_attention_heads); // GQA
/// # Ok(())
/// # }
/// ```
#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    /// Hidden size.
    pub hidden_size: usize,
    /// Transformer blocks.
    pub num_hidden_layers: usize,
    /// Query heads.
    pub num_attention_heads: usize,
    /// Key/value heads.
    pub num_key_value_heads: usize,
    /// MLP hidden size.
    pub intermediate_size: usize,
    /// Rows of the embedding table and the LM head.
    pub vocab_size: usize,
    /// Longest canvas.
    pub max_position_embeddings: usize,
    /// RMSNorm epsilon.
    pub rms_norm_eps: f64,
    /// RoPE base.
    pub rope_theta: f64,
    /// The LM head is the embedding table.
    pub tie_word_embeddings: bool,
    /// The `[MASK]` id.
    pub mask_token_id: u32,
    /// End of sequence.
    pub eos_token_id: u32,
    /// Beginning of sequence, when the config names one.
    pub bos_token_id: Option<u32>,
    /// Padding, when the config names one.
    pub pad_token_id: Option<u32>,
}

impl Config {
    /// Read Dream config fields. Unknown fields are ignored; a missing required field or an
    /// unsupported option is an error naming it.
    pub fn from_fields(f: &Fields) -> Result<Self> {
        f.require_str("model_type", &["dream"])?;
        f.require_str("hidden_act", &["silu"])?;
        f.require_bool("use_sliding_window", false)?;
        f.require_no_rope_scaling()?;
        let heads = f.usize("num_attention_heads")?;
        let special = f.special_tokens()?;
        Ok(Config {
            hidden_size: f.usize("hidden_size")?,
            num_hidden_layers: f.usize("num_hidden_layers")?,
            num_attention_heads: heads,
            num_key_value_heads: f.opt_usize("num_key_value_heads")?.unwrap_or(heads),
            intermediate_size: f.usize("intermediate_size")?,
            vocab_size: f.usize("vocab_size")?,
            max_position_embeddings: f.usize("max_position_embeddings")?,
            rms_norm_eps: f.f64("rms_norm_eps")?,
            rope_theta: f.f64("rope_theta")?,
            tie_word_embeddings: f.opt_bool("tie_word_embeddings")?.unwrap_or(false),
            mask_token_id: special.mask,
            eos_token_id: special.eos,
            bos_token_id: special.bos,
            pad_token_id: special.pad,
        })
    }

    /// The normalised config the model is built from, checked (errors name the field).
    pub fn transformer_config(&self) -> Result<TransformerConfig> {
        let cfg = TransformerConfig {
            arch: Arch::Dream,
            hidden_size: self.hidden_size,
            num_layers: self.num_hidden_layers,
            num_heads: self.num_attention_heads,
            num_kv_heads: self.num_key_value_heads,
            intermediate_size: self.intermediate_size,
            vocab_size: self.vocab_size,
            rms_norm_eps: self.rms_norm_eps,
            rope_theta: self.rope_theta,
            qkv_bias: true,
            tie_word_embeddings: self.tie_word_embeddings,
            shift_logits: true,
            max_seq_len: self.max_position_embeddings,
            special: SpecialTokens {
                mask: self.mask_token_id,
                eos: self.eos_token_id,
                eot: None,
                bos: self.bos_token_id,
                pad: self.pad_token_id,
            },
        };
        cfg.validate(&NAMES)?;
        Ok(cfg)
    }
}

impl<'de> serde::Deserialize<'de> for Config {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        crate::candle_style::deserialize(d, Config::from_fields, Config::transformer_config)
    }
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

crate::candle_style::candle_model!(Arch::Dream, "Dream", "dream", "tiny-dream");
