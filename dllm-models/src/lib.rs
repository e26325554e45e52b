#![doc = include_str!("../README.md")]
#![warn(missing_docs)]

mod ask;
mod backend;
mod block;
mod block_def;
mod candle_style;
pub mod config;
pub mod config_json;
pub mod dream;
mod error;
pub mod files;
pub mod gguf;
pub mod gguf_check;
pub mod gguf_pretok;
pub mod gguf_raw;
pub mod gguf_tokenizer;
pub mod gguf_write;
#[cfg(not(feature = "hexagon"))]
pub mod hexagon_off;
#[cfg(feature = "hub")]
pub mod hub;
pub mod kv_cache;
mod layer_params;
pub mod layers;
mod layout;
pub mod limits;
pub mod linear;
pub mod llada;
pub mod lm;
#[cfg(feature = "hexagon")]
mod npu_load;
#[cfg(not(feature = "hexagon"))]
mod npu_load_off;
#[cfg(feature = "hexagon")]
mod npu_seq;
#[cfg(not(feature = "hexagon"))]
mod npu_seq_off;
pub mod recorder;
mod role;
pub mod safetensors_header;
mod shift;
pub mod source;
mod special;
pub mod synthetic;
pub mod threads;
pub mod tokenizer;
pub mod transformer;
pub mod weights;
mod weights_model;

pub use ask::{Answer, Ask};
/// candle, whose types appear in this crate's signatures.
pub use candle_core;
/// candle-nn, whose `VarBuilder` the candle-style constructors take (`llada::Model::new(&cfg, vb)`):
/// an app that builds its `VarBuilder` through this re-export cannot end up with a second
/// candle-nn version.
pub use candle_nn;
pub use candle_style::safetensors_var_builder;
pub use error::{
    AskDefect, CanvasDefect, Error, KvCacheDefect, PositionDefect, RefreshDefect, Result,
    WindowDefect,
};
#[cfg(feature = "hub")]
pub use hub::HubRepo;
/// The Hexagon device [`Backend::Hexagon`] holds (an uninhabited stand-in without the `hexagon`
/// feature).
pub use layers::HexagonDevice;
pub use layers::{Backend, OpMode};
pub use linear::{CpuLinears, CpuOptions};
pub use lm::{
    answer_with, Arch, DiffusionLm, DualPathTiming, ModelId, ModelInfo, Refresh, RefreshRequest,
    Rows, SequenceId, SequenceToken, SpecialTokens,
};
pub use source::{load, read_config, DecodeDefaults, LoadOptions, LoadedModel, ModelSource};
pub use tokenizer::{ChatTemplate, Message, TextTokenizer};
/// The tokenizers crate, whose `Tokenizer` [`TextTokenizer`] wraps.
pub use tokenizers;
pub use transformer::{
    CpuLinearBytes, DiffusionTransformer, TransformerConfig, TransformerWeights,
};
pub use weights::HfWeights;

/// The names an app uses most: `use dllm_models::prelude::*;` brings the loader, the models (both
/// ways of building them), the [`DiffusionLm`] trait (for `info()` and the windowed forwards) and
/// the candle types their signatures use.
///
/// ```
/// use dllm_models::prelude::*;
///
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// # let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../models/tiny-llada");
/// let loaded = load(&ModelSource::parse(dir)?, &LoadOptions::default())?;
/// assert_eq!(loaded.model.info().num_layers, 4);
/// let ids = Tensor::new(&[[2u32, 10, 11, 5]], &Device::Cpu)?;
/// assert_eq!(loaded.model.new_sequence()?.forward_full(&ids, Rows::All)?.dims()[1], 4);
/// # Ok(())
/// # }
/// ```
pub mod prelude {
    pub use crate::candle_core::{DType, Device, Tensor};
    pub use crate::candle_nn::VarBuilder;
    pub use crate::{
        dream, llada, load, DiffusionLm, DiffusionTransformer, LoadOptions, LoadedModel,
        ModelSource, Rows, TextTokenizer,
    };
}
