//! The default model compiled into the binary (`models/tiny-llada`, trained by `train-tiny`).

use anyhow::Result;
use dllm_models::{LoadOptions, LoadedModel};

#[cfg(embedded_model)]
mod files {
    pub const CONFIG: &str = include_str!(concat!(env!("LLADA_RS_EMBEDDED_DIR"), "/config.json"));
    pub const WEIGHTS: &[u8] =
        include_bytes!(concat!(env!("LLADA_RS_EMBEDDED_DIR"), "/model.safetensors"));
    pub const TOKENIZER: &str =
        include_str!(concat!(env!("LLADA_RS_EMBEDDED_DIR"), "/tokenizer.json"));
    pub const GENERATION: &str = include_str!(concat!(
        env!("LLADA_RS_EMBEDDED_DIR"),
        "/generation_config.json"
    ));
}

/// Load the embedded model.
#[cfg(embedded_model)]
pub fn load(opts: &LoadOptions) -> Result<LoadedModel> {
    Ok(dllm_models::source::load_from_memory(
        files::CONFIG,
        files::WEIGHTS,
        files::TOKENIZER,
        Some(files::GENERATION),
        "embedded tiny-llada",
        opts,
    )?)
}

/// No model was embedded at build time.
#[cfg(not(embedded_model))]
pub fn load(_opts: &LoadOptions) -> Result<LoadedModel> {
    anyhow::bail!("this build has no embedded model (models/tiny-llada was missing at build time): pass --model <dir|file.gguf|owner/name>")
}
