//! # dllm-models
//!
//! LLaDA and Dream — masked-diffusion language models — as candle modules, with loaders for
//! Hugging Face safetensors directories (single or sharded), llama.cpp GGUF files (F32, F16, Q8_0,
//! Q4_0, ...) and Hugging Face model ids (through `hf-hub`'s cache, offline-capable), tokenizers
//! and chat templates.
//!
//! Every model implements [`DiffusionLm`], the small trait decoders use: a forward over any window
//! of the canvas against an explicit KV cache, logits only for the rows asked for, commits of
//! window K/V into the cache, sparse refreshes of cached positions, and cache rollback. See
//! [`lm`] for the exact semantics.
//!
//! Every size a file declares is checked before it is used (see [`gguf_check`],
//! [`safetensors_header`], [`limits`]): a malformed, truncated, oversized or inconsistent
//! checkpoint, config or tokenizer is an [`Error`] naming the file, field or tensor, never a panic,
//! an abort or a hang; NaN/inf weights and logits are reported. The `llada-fuzz` crate holds this to
//! 100,000 mutated inputs in CI.
//!
//! This crate knows nothing of schedules, windows policies or token states (that is `dllm-decode`).

#![warn(missing_docs)]

pub mod config;
pub mod config_json;
pub mod dream;
mod error;
pub mod gguf;
pub mod gguf_check;
pub mod gguf_write;
pub mod hub;
pub mod kv_cache;
pub mod layers;
mod layout;
pub mod limits;
pub mod linear;
pub mod llada;
pub mod lm;
mod npu_seq;
pub mod safetensors_header;
pub mod source;
pub mod synthetic;
pub mod threads;
pub mod tokenizer;
pub mod transformer;
pub mod weights;
mod weights_model;

pub use error::{Error, Result};
pub use layers::{Backend, OpMode};
pub use linear::CpuLinears;
pub use lm::{
    Arch, DiffusionLm, DualPathTiming, ModelInfo, Refresh, RefreshRequest, Rows, SpecialTokens,
};
pub use source::{load, LoadOptions, LoadedModel, ModelSource};
pub use tokenizer::{ChatTemplate, Message, TextTokenizer};
pub use transformer::{DiffusionTransformer, TransformerConfig, TransformerWeights};
