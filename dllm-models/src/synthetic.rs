//! Random checkpoints in the exact Hugging Face layouts, for tests and benchmarks (no weights can be
//! downloaded on the machines this project is developed on).
//!
//! Values come from a fixed SplitMix64 stream, so a `(config, seed)` pair always yields the same
//! files regardless of crate versions.

use std::collections::HashMap;
use std::path::Path;

use candle_core::{DType, Device, Tensor};

use crate::config::TransformerConfig;
use crate::lm::{Arch, SpecialTokens};
use crate::role::Role;
use crate::{dream, llada, Error, Result};

/// A tiny LLaDA config (vocabulary 256 with `[MASK]` = 255, EOS = 254).
pub fn tiny_llada() -> TransformerConfig {
    TransformerConfig {
        arch: Arch::Llada,
        hidden_size: 64,
        num_layers: 2,
        num_heads: 4,
        num_kv_heads: 4,
        intermediate_size: 160,
        vocab_size: 256,
        rms_norm_eps: 1e-5,
        rope_theta: 10_000.0,
        qkv_bias: false,
        tie_word_embeddings: false,
        shift_logits: false,
        max_seq_len: 512,
        special: SpecialTokens {
            mask: 255,
            eos: 254,
            eot: None,
            bos: Some(253),
            pad: Some(254),
        },
    }
}

/// A tiny Dream config (GQA 4:2, q/k/v biases, shifted logits).
pub fn tiny_dream() -> TransformerConfig {
    TransformerConfig {
        arch: Arch::Dream,
        num_kv_heads: 2,
        qkv_bias: true,
        shift_logits: true,
        rms_norm_eps: 1e-6,
        rope_theta: 1_000_000.0,
        ..tiny_llada()
    }
}

/// A ~100M-parameter (97.5M) LLaDA-shaped config (for benchmarks): d 768, 12 layers, 12 heads,
/// MLP 2048, vocabulary 8192.
pub fn bench_llada_100m() -> TransformerConfig {
    TransformerConfig {
        hidden_size: 768,
        num_layers: 12,
        num_heads: 12,
        num_kv_heads: 12,
        intermediate_size: 2048,
        vocab_size: 8192,
        max_seq_len: 4096,
        special: SpecialTokens {
            mask: 8191,
            eos: 8190,
            eot: None,
            bos: Some(8189),
            pad: Some(8190),
        },
        ..tiny_llada()
    }
}

/// LLaDA-8B's matrix shapes with 2 of its 32 layers (for benchmarks at the real model's shapes
/// without its 16 GB): d 4096, 32 heads of 128, MLP 12288, vocabulary 126464 with LLaDA-8B's
/// special ids, rotary base 500000. 1.47B parameters, most of them in the embedding and the head.
pub fn bench_llada_8b_shaped() -> TransformerConfig {
    TransformerConfig {
        hidden_size: 4096,
        num_layers: 2,
        num_heads: 32,
        num_kv_heads: 32,
        intermediate_size: 12288,
        vocab_size: 126464,
        rope_theta: 500_000.0,
        max_seq_len: 4096,
        special: SpecialTokens {
            mask: crate::gguf::LLADA_8B_MASK_ID,
            eos: 126081,
            eot: Some(crate::special::LLADA_8B_EOT_ID),
            bos: Some(126080),
            pad: Some(126081),
        },
        ..tiny_llada()
    }
}

/// LLaDA-8B at full depth: [`bench_llada_8b_shaped`] with all 32 layers (8.0B parameters;
/// 4.5 GB as Q4_0). Written by [`crate::gguf_write::write_random_gguf`] tensor by tensor.
pub fn llada_8b() -> TransformerConfig {
    TransformerConfig {
        num_layers: 32,
        ..bench_llada_8b_shaped()
    }
}

/// Dream-v0-7B's shapes (Qwen2.5-7B's): d 3584, 28 layers, 28 query heads over 4 K/V heads of
/// 128, MLP 18944, vocabulary 152064, q/k/v biases, shifted logits, rotary base 10^6, Dream's
/// mask id 151666 (7.6B parameters; 4.3 GB as Q4_0).
pub fn dream_7b() -> TransformerConfig {
    TransformerConfig {
        arch: Arch::Dream,
        hidden_size: 3584,
        num_layers: 28,
        num_heads: 28,
        num_kv_heads: 4,
        intermediate_size: 18944,
        vocab_size: 152064,
        rms_norm_eps: 1e-6,
        rope_theta: 1_000_000.0,
        qkv_bias: true,
        tie_word_embeddings: false,
        shift_logits: true,
        max_seq_len: 4096,
        special: SpecialTokens {
            mask: 151666,
            eos: 151643,
            eot: None,
            bos: Some(151643),
            pad: Some(151643),
        },
    }
}

struct SplitMix(u64);

impl SplitMix {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    /// Uniform in [-1, 1).
    fn unit(&mut self) -> f32 {
        ((self.next() >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
    }
}

/// The random values of a checkpoint, tensor after tensor in [`TransformerConfig::param_shapes`]
/// order, from one SplitMix64 stream: what [`random_weights`] holds at once, produced a slice at
/// a time (the streaming GGUF writer quantizes rows as they come, so no whole tensor is held).
pub struct RandomValues(SplitMix);

impl RandomValues {
    /// The stream of `seed`.
    pub fn new(seed: u64) -> Self {
        RandomValues(SplitMix(seed))
    }

    /// The next `out.len()` values of a tensor of `role` and `shape`: matrices uniform with std
    /// `1/sqrt(fan_in)`, the embedding with std 1, norms around 1, biases small.
    pub fn fill(&mut self, role: Role, shape: &[usize], out: &mut [f32]) {
        // uniform [-a, a) has std a / sqrt(3)
        let (center, amp) = match role {
            Role::Embed => (0.0, 3f32.sqrt()),
            Role::FinalNorm | Role::AttnNorm(_) | Role::FfnNorm(_) => (1.0, 0.2),
            Role::QBias(_) | Role::KBias(_) | Role::VBias(_) => (0.0, 0.1),
            _ => (0.0, (3.0 / shape[1] as f32).sqrt()),
        };
        for x in out.iter_mut() {
            *x = center + amp * self.0.unit();
        }
    }
}

/// Every parameter of `cfg` under its HF name, with deterministic random values: matrices uniform
/// with std `1/sqrt(fan_in)`, the embedding with std 1, norms around 1, biases small.
pub fn random_weights(cfg: &TransformerConfig, seed: u64) -> Result<HashMap<String, Tensor>> {
    let mut rng = RandomValues::new(seed);
    let mut out = HashMap::new();
    for (role, shape) in cfg.param_shapes() {
        let n: usize = shape.iter().product();
        let mut data = vec![0f32; n];
        rng.fill(role, &shape, &mut data);
        out.insert(
            role.hf_name(cfg.arch),
            Tensor::from_vec(data, shape, &Device::Cpu)?,
        );
    }
    Ok(out)
}

/// Write `config.json` and the weights of `cfg` into `dir` in the architecture's HF layout, stored as
/// `dtype`, in `shards` files (with `model.safetensors.index.json` when more than one).
pub fn write_hf(
    dir: &Path,
    cfg: &TransformerConfig,
    weights: &HashMap<String, Tensor>,
    dtype: DType,
    shards: usize,
) -> Result<()> {
    std::fs::create_dir_all(dir).map_err(|e| Error::file(dir, e))?;
    let config = match cfg.arch {
        Arch::Llada => llada::config_to_json(cfg),
        Arch::Dream => dream::config_to_json(cfg),
    };
    let text = serde_json::to_string_pretty(&config).expect("json");
    std::fs::write(dir.join("config.json"), text)
        .map_err(|e| Error::file(dir.join("config.json"), e))?;
    let mut names: Vec<&String> = weights.keys().collect();
    names.sort();
    let shards = shards.clamp(1, names.len().max(1));
    if shards == 1 {
        let conv: HashMap<String, Tensor> = weights
            .iter()
            .map(|(k, t)| Ok((k.clone(), t.to_dtype(dtype)?)))
            .collect::<Result<_>>()?;
        let path = dir.join("model.safetensors");
        candle_core::safetensors::save(&conv, &path).map_err(|e| Error::file(&path, e))?;
        return Ok(());
    }
    let mut weight_map = serde_json::Map::new();
    let per = names.len().div_ceil(shards);
    let mut total = 0usize;
    for (s, chunk) in names.chunks(per).enumerate() {
        let file = format!("model-{:05}-of-{:05}.safetensors", s + 1, shards);
        let mut part = HashMap::new();
        for name in chunk {
            let t = weights[*name].to_dtype(dtype)?;
            total += t.elem_count() * dtype.size_in_bytes();
            part.insert((*name).clone(), t);
            weight_map.insert((*name).clone(), serde_json::Value::String(file.clone()));
        }
        let path = dir.join(&file);
        candle_core::safetensors::save(&part, &path).map_err(|e| Error::file(&path, e))?;
    }
    let index =
        serde_json::json!({ "metadata": { "total_size": total }, "weight_map": weight_map });
    let path = dir.join("model.safetensors.index.json");
    std::fs::write(&path, serde_json::to_string_pretty(&index).expect("json"))
        .map_err(|e| Error::file(&path, e))?;
    Ok(())
}
