//! LLaDA (Nie et al., "Large Language Diffusion Models"; model card
//! <https://huggingface.co/GSAI-ML/LLaDA-8B-Instruct>).
//!
//! A bidirectional llama-style transformer in OLMo's checkpoint layout
//! (`model.transformer.blocks.{i}.q_proj.weight`, `ff_proj` = gate, `up_proj`, `ff_out` = down,
//! `model.transformer.ff_out.weight` = untied LM head). Logits are not shifted.

use std::path::Path;

use crate::config::{ConfigNames, TransformerConfig};
use crate::config_json::Fields;
use crate::lm::{Arch, SpecialTokens};
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

pub use crate::special::LLADA_8B_EOT_ID;

/// Parse a LLaDA `config.json`. Unknown fields are ignored; a missing required field or an
/// unsupported option is an error naming it.
pub fn config_from_file(path: &Path) -> Result<TransformerConfig> {
    Fields::parse_file(path, config_from_fields)
}

/// Parse LLaDA config fields (see [`Config::from_fields`]) into the normalised config.
pub fn config_from_fields(f: &Fields) -> Result<TransformerConfig> {
    Config::from_fields(f)?.transformer_config()
}

/// LLaDA's `config.json` with named fields (the checkpoint's spelling), like candle-transformers'
/// configs: `let cfg: llada::Config = serde_json::from_str(&text)?`, then `cfg.n_layers`.
///
/// Deserialising runs the same field checks as [`crate::load`] (a message names the field). The
/// fields LLaDA fixes (`activation_type`, `block_type`, `rope`, `alibi`, ...) are checked and not
/// kept; optional ones are filled as `load()` fills them (`n_kv_heads` = `n_heads`,
/// `mlp_hidden_size` = `mlp_ratio * d_model`, `embedding_size` = `vocab_size`). Build the model
/// with [`Model::new`]; fields edited after parsing are checked again there.
///
/// ```
/// use dllm_models::llada;
///
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// # let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../models/tiny-llada/config.json");
/// let cfg: llada::Config = serde_json::from_str(&std::fs::read_to_string(path)?)?;
/// assert_eq!((cfg.n_layers, cfg.d_model, cfg.mask_token_id), (4, 128, 5));
///
/// let mut bad = serde_json::from_str::<serde_json::Value>(&std::fs::read_to_string(path)?)?;
/// bad["n_heads"] = serde_json::json!(3); // 128 is not a multiple of 3
/// let e = serde_json::from_value::<llada::Config>(bad).unwrap_err();
/// assert!(e.to_string().contains("n_heads"), "{e}");
/// # Ok(())
/// # }
/// ```
#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    /// Hidden size.
    pub d_model: usize,
    /// Transformer blocks.
    pub n_layers: usize,
    /// Query heads.
    pub n_heads: usize,
    /// Key/value heads (`n_heads` without GQA).
    pub n_kv_heads: usize,
    /// MLP hidden size.
    pub mlp_hidden_size: usize,
    /// Vocabulary size.
    pub vocab_size: usize,
    /// Rows of the embedding table and the LM head (at least `vocab_size`).
    pub embedding_size: usize,
    /// Longest canvas.
    pub max_sequence_length: usize,
    /// RMSNorm epsilon.
    pub rms_norm_eps: f64,
    /// RoPE base.
    pub rope_theta: f64,
    /// q/k/v projections carry biases.
    pub include_qkv_bias: bool,
    /// The LM head is the embedding table.
    pub weight_tying: bool,
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
    /// Read LLaDA config fields. Unknown fields are ignored; a missing required field or an
    /// unsupported option is an error naming it.
    pub fn from_fields(f: &Fields) -> Result<Self> {
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
        let d_model = f.usize("d_model")?;
        let n_heads = f.usize("n_heads")?;
        let mlp_hidden_size = match f.opt_usize("mlp_hidden_size")? {
            Some(v) => v,
            None => match f.opt_usize("mlp_ratio")? {
                Some(r) => r.checked_mul(d_model).ok_or_else(|| {
                    Error::invalid("mlp_ratio", format!("{r} * d_model {d_model} overflows"))
                })?,
                None => {
                    return Err(Error::MissingField {
                        field: "mlp_hidden_size".into(),
                    })
                }
            },
        };
        let vocab_size = f.usize("vocab_size")?;
        if vocab_size == 0 {
            return Err(Error::invalid("vocab_size", "must be positive"));
        }
        let special = f.special_tokens()?;
        Ok(Config {
            d_model,
            n_layers: f.usize("n_layers")?,
            n_heads,
            n_kv_heads: f.opt_usize("n_kv_heads")?.unwrap_or(n_heads),
            mlp_hidden_size,
            vocab_size,
            embedding_size: f.opt_usize("embedding_size")?.unwrap_or(vocab_size),
            max_sequence_length: f.usize("max_sequence_length")?,
            rms_norm_eps: f.f64("rms_norm_eps")?,
            rope_theta: f.f64("rope_theta")?,
            include_qkv_bias: f.opt_bool("include_qkv_bias")?.unwrap_or(false),
            weight_tying: f.opt_bool("weight_tying")?.unwrap_or(false),
            mask_token_id: special.mask,
            eos_token_id: special.eos,
            bos_token_id: special.bos,
            pad_token_id: special.pad,
        })
    }

    /// The normalised config the model is built from, checked (errors name the field).
    pub fn transformer_config(&self) -> Result<TransformerConfig> {
        if self.embedding_size < self.vocab_size {
            return Err(Error::invalid(
                "embedding_size",
                format!(
                    "{} is smaller than vocab_size {}",
                    self.embedding_size, self.vocab_size
                ),
            ));
        }
        let cfg = TransformerConfig {
            arch: Arch::Llada,
            hidden_size: self.d_model,
            num_layers: self.n_layers,
            num_heads: self.n_heads,
            num_kv_heads: self.n_kv_heads,
            intermediate_size: self.mlp_hidden_size,
            vocab_size: self.embedding_size,
            rms_norm_eps: self.rms_norm_eps,
            rope_theta: self.rope_theta,
            qkv_bias: self.include_qkv_bias,
            tie_word_embeddings: self.weight_tying,
            shift_logits: false,
            max_seq_len: self.max_sequence_length,
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

crate::candle_style::candle_model!(Arch::Llada, "LLaDA", "llada", "tiny-llada");
