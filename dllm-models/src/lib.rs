#![doc = include_str!("../README.md")]
#![warn(missing_docs)]

mod block;
mod candle_style;
pub mod config;
pub mod config_json;
pub mod dream;
mod error;
pub mod files;
pub mod gguf;
pub mod gguf_check;
pub mod gguf_write;
#[cfg(not(feature = "hexagon"))]
pub mod hexagon_off;
#[cfg(feature = "hub")]
pub mod hub;
pub mod kv_cache;
pub mod layers;
mod layout;
pub mod limits;
pub mod linear;
pub mod llada;
pub mod lm;
#[cfg(feature = "hexagon")]
mod npu_seq;
pub mod recorder;
pub mod safetensors_header;
pub mod source;
pub mod synthetic;
pub mod threads;
pub mod tokenizer;
pub mod transformer;
pub mod weights;
mod weights_model;

/// candle, whose types appear in this crate's signatures.
pub use candle_core;
pub use error::{Error, Result};
#[cfg(feature = "hub")]
pub use hub::HubRepo;
/// The Hexagon device [`Backend::Hexagon`] holds (an uninhabited stand-in without the `hexagon`
/// feature).
pub use layers::HexagonDevice;
pub use layers::{Backend, OpMode};
pub use linear::CpuLinears;
pub use lm::{
    Arch, DiffusionLm, DualPathTiming, ModelInfo, Refresh, RefreshRequest, Rows, SpecialTokens,
};
pub use source::{load, read_config, DecodeDefaults, LoadOptions, LoadedModel, ModelSource};
pub use tokenizer::{ChatTemplate, Message, TextTokenizer};
/// The tokenizers crate, whose `Tokenizer` [`TextTokenizer`] wraps.
pub use tokenizers;
pub use transformer::{
    CpuLinearBytes, DiffusionTransformer, TransformerConfig, TransformerWeights,
};
pub use weights::HfWeights;
