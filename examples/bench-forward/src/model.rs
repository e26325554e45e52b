//! The benchmark model: a ~100M-parameter random LLaDA (d 768, 12 layers, 12 heads, MLP 2048,
//! vocabulary 8192), in memory or written as a GGUF with a placeholder vocabulary llama.cpp
//! accepts.

use std::path::Path;

use anyhow::{Context, Result};
use candle_core::quantized::GgmlDType;
use candle_core::{DType, Device, Tensor};
use dllm_models::synthetic::{bench_llada_100m, bench_llada_8b_shaped, random_weights};
use dllm_models::weights::HfWeights;
use dllm_models::{
    Backend, CpuLinears, CpuOptions, DiffusionTransformer, LoadOptions, ModelSource, OpMode,
    TransformerConfig,
};

/// The config and its random f32 weights (seed 0).
pub fn synthetic() -> Result<(TransformerConfig, std::collections::HashMap<String, Tensor>)> {
    let cfg = bench_llada_100m();
    let w = random_weights(&cfg, 0)?;
    Ok((cfg, w))
}

/// The in-memory f32 model.
pub fn in_memory(which: CpuLinears) -> Result<DiffusionTransformer> {
    let (cfg, w) = synthetic()?;
    let src = HfWeights::from_tensors(w, cfg.arch, DType::F32, &Device::Cpu);
    let cpu = CpuOptions {
        linears: which,
        threads: None,
        kv_dtype: None,
    };
    Ok(DiffusionTransformer::new_with(
        cfg,
        &src,
        OpMode::Fused,
        &Backend::Cpu,
        cpu,
    )?)
}

/// A GGUF file through the public loader, with a K/V cache of `kv_dtype` (`None`: f32).
pub fn load_gguf(
    path: &Path,
    which: CpuLinears,
    kv_dtype: Option<DType>,
) -> Result<DiffusionTransformer> {
    let opts = LoadOptions {
        cpu_linears: which,
        kv_dtype,
        ..Default::default()
    };
    Ok(
        dllm_models::load(&ModelSource::Gguf(path.to_path_buf()), &opts)
            .with_context(|| format!("loading {}", path.display()))?
            .model,
    )
}

/// A model of the side-by-side table: its name in the tables and how to get its f32 weights.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BenchModel {
    /// The ~100M random LLaDA.
    Random100m,
    /// The shipped 1.1M LLaDA, `models/tiny-llada`.
    Shipped,
    /// LLaDA-8B's shapes with 2 layers (random, 1.47B parameters).
    Shaped8b,
    /// LLaDA-8B's shapes at full depth (32 layers, random, 8.0B parameters), written Q8_0 or
    /// Q4_0 directly by the project's streaming writer.
    Full8b,
}

impl BenchModel {
    /// Parse a `--models` entry.
    pub fn parse(s: &str) -> Result<Self> {
        match s {
            "100m" => Ok(Self::Random100m),
            "shipped" => Ok(Self::Shipped),
            "8b" => Ok(Self::Shaped8b),
            "8b-full" => Ok(Self::Full8b),
            other => anyhow::bail!("--models: `{other}` (expected 100m, shipped, 8b or 8b-full)"),
        }
    }

    /// The name in the tables.
    pub fn name(self) -> &'static str {
        match self {
            Self::Random100m => "97.5M random",
            Self::Shipped => "1.1M shipped",
            Self::Shaped8b => "8B-shaped, 2 layers",
            Self::Full8b => "8B-shaped, 32 layers",
        }
    }

    /// The stem of its GGUF files.
    pub fn stem(self) -> &'static str {
        match self {
            Self::Random100m => "bench100m",
            Self::Shipped => "shipped-tiny-llada",
            Self::Shaped8b => "bench8b-2layers",
            Self::Full8b => "llada8b-full",
        }
    }

    /// Its config and f32 weights (HF names).
    pub fn weights(self) -> Result<(TransformerConfig, std::collections::HashMap<String, Tensor>)> {
        match self {
            Self::Random100m => synthetic(),
            Self::Shaped8b => {
                let cfg = bench_llada_8b_shaped();
                let w = random_weights(&cfg, 0)?;
                Ok((cfg, w))
            }
            Self::Full8b => {
                anyhow::bail!("the full-depth 8B is written by the streaming writer, never held")
            }
            Self::Shipped => {
                let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../models/tiny-llada");
                let cfg = dllm_models::source::read_config(&dir.join("config.json"))
                    .with_context(|| format!("reading {}", dir.display()))?;
                let w =
                    candle_core::safetensors::load(dir.join("model.safetensors"), &Device::Cpu)?
                        .into_iter()
                        .map(|(k, v)| Ok((k, v.to_dtype(DType::F32)?)))
                        .collect::<Result<_>>()?;
                Ok((cfg, w))
            }
        }
    }
}

/// Write the synthetic model as a GGUF with 2-D weights in `dtype` (the project's writer).
pub fn write_gguf(path: &Path, dtype: GgmlDType) -> Result<()> {
    write_model_gguf(BenchModel::Random100m, path, dtype)
}

/// Write `model` as a GGUF with 2-D weights in `dtype` (the project's writer; the full-depth 8B
/// with its streaming writer, tensor by tensor, seed 0).
pub fn write_model_gguf(model: BenchModel, path: &Path, dtype: GgmlDType) -> Result<()> {
    if model == BenchModel::Full8b {
        let cfg = dllm_models::synthetic::llada_8b();
        let how = dllm_models::gguf_write::RandomGguf {
            extra: dllm_models::gguf_write::placeholder_vocab(cfg.vocab_size),
            ..dllm_models::gguf_write::RandomGguf::new(dtype, 0)
        };
        dllm_models::gguf_write::write_random_gguf(path, &cfg, &how)
            .with_context(|| format!("writing {}", path.display()))?;
        return Ok(());
    }
    let (cfg, w) = model.weights()?;
    dllm_models::gguf_write::write_gguf(
        path,
        &cfg,
        &w,
        dtype,
        &dllm_models::gguf_write::placeholder_vocab(cfg.vocab_size),
    )
    .with_context(|| format!("writing {}", path.display()))?;
    Ok(())
}

/// A deterministic `(1, len)` canvas of ids below `vocab - 3`.
pub fn canvas(len: usize, vocab: usize) -> Result<Tensor> {
    let ids: Vec<u32> = (0..len as u32)
        .map(|i| (i * 7919 + 13) % (vocab as u32 - 3))
        .collect();
    Ok(Tensor::from_vec(ids, (1, len), &Device::Cpu)?)
}
