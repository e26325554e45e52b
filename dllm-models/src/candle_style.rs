//! candle-style construction beside [`crate::load`]: a deserialisable config per model
//! ([`crate::llada::Config`], [`crate::dream::Config`]) and `new(&cfg, vb)` over a candle
//! [`VarBuilder`] holding the checkpoint's tensors under their Hugging Face names, as
//! candle-transformers' models are built.
//!
//! Parsing a config runs the same field checks as `load()` (errors name the field), and the model
//! gets the same special-token rules ([`crate::source`]'s completion: LLaDA-8B's EoT when the
//! vocabulary is LLaDA-8B's, the mask never doubling as another special token). What `load()` adds
//! on top — a tokenizer's EoT, `generation_config.json`'s BOS and decoding defaults — needs files
//! a `VarBuilder` does not carry; set them with
//! [`DiffusionTransformer::set_special_tokens`] if you have them.

use candle_nn::VarBuilder;
use serde::de::Error as _;

use crate::config_json::Fields;
use crate::layers::OpMode;
use crate::lm::{Arch, DiffusionLm};
use crate::transformer::{DiffusionTransformer, TransformerConfig};
use crate::weights::HfWeights;
use crate::Result;

/// Deserialise any JSON value through `parse` (the crate's field-by-field parser).
pub(crate) fn deserialize<'de, D: serde::Deserializer<'de>>(
    d: D,
    parse: fn(&Fields) -> Result<TransformerConfig>,
) -> std::result::Result<TransformerConfig, D::Error> {
    let v = <serde_json::Value as serde::Deserialize>::deserialize(d)?;
    let f = Fields::from_value(v).map_err(D::Error::custom)?;
    parse(&f).map_err(D::Error::custom)
}

/// Build an inference model (CPU backend) from `vb` and complete its special tokens.
pub(crate) fn build(
    cfg: &TransformerConfig,
    vb: VarBuilder<'static>,
    arch: Arch,
) -> Result<DiffusionTransformer> {
    let w = HfWeights::from_var_builder(vb, arch);
    let mut model = DiffusionTransformer::new(cfg.clone(), &w, OpMode::Fused)?;
    let special = crate::source::complete_special(model.info(), None, None)?;
    model.set_special_tokens(special)?;
    Ok(model)
}

macro_rules! candle_style {
    ($arch:expr, $name:literal) => {
        #[doc = concat!(
            $name, "'s `config.json` as a serde type, like candle-transformers' configs \
             (`serde_json::from_str::<Config>(&text)?`). Deserialising runs the same field \
             checks as [`crate::load`]; the parsed config is [`Config::0`]."
        )]
        #[derive(Debug, Clone, PartialEq)]
        pub struct Config(pub crate::transformer::TransformerConfig);

        impl<'de> serde::Deserialize<'de> for Config {
            fn deserialize<D: serde::Deserializer<'de>>(
                d: D,
            ) -> std::result::Result<Self, D::Error> {
                crate::candle_style::deserialize(d, config_from_fields).map(Config)
            }
        }

        #[doc = concat!(
            "The ", $name, " model type (`new` builds it; `forward` is [`crate::DiffusionLm::forward`])."
        )]
        pub type Model = crate::transformer::DiffusionTransformer;

        #[doc = concat!(
            "Build ", $name, " for inference from a [`candle_nn::VarBuilder`] with the checkpoint's \
             tensors under their Hugging Face names (e.g. \
             `unsafe { VarBuilder::from_mmaped_safetensors(&files, DType::F32, &Device::Cpu) }`), \
             candle style. Special tokens follow [`crate::load`]'s rules."
        )]
        pub fn new(cfg: &Config, vb: candle_nn::VarBuilder<'static>) -> crate::Result<Model> {
            crate::candle_style::build(&cfg.0, vb, $arch)
        }
    };
}
pub(crate) use candle_style;
