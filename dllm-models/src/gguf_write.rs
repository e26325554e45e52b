//! Writing llama.cpp GGUF files from HF-named tensors, in the layout `convert_hf_to_gguf.py`
//! produces (metadata keys, tensor names, LLaDA's q/k row permutation, norms and biases in F32).
//! Used by the benchmarks to run llama.cpp on the same weights, and usable as a converter.

use std::collections::HashMap;
use std::path::Path;

use candle_core::quantized::gguf_file::{self, Value};
use candle_core::quantized::{GgmlDType, QTensor};
use candle_core::Tensor;

use crate::gguf::permute_rows;
use crate::lm::Arch;
use crate::transformer::TransformerConfig;
use crate::weights::Role;
use crate::{Error, Result};

fn roles(cfg: &TransformerConfig) -> Vec<Role> {
    cfg.param_shapes()
        .into_iter()
        .map(|(role, _)| role)
        .collect()
}

/// Write `tensors` (HF names of `cfg.arch`) as a GGUF with 2-D weights in `dtype` and `extra`
/// metadata appended (e.g. a vocabulary).
pub fn write_gguf(
    path: &Path,
    cfg: &TransformerConfig,
    tensors: &HashMap<String, Tensor>,
    dtype: GgmlDType,
    extra: &[(String, Value)],
) -> Result<()> {
    let arch = cfg.arch.to_string();
    let k = |s: &str| format!("{arch}.{s}");
    let u32v = |x: usize| Value::U32(x as u32);
    let mut md: Vec<(String, Value)> = vec![
        ("general.architecture".into(), Value::String(arch.clone())),
        (
            "general.name".into(),
            Value::String(format!("llada-rs {arch}")),
        ),
        (k("block_count"), u32v(cfg.num_layers)),
        (k("context_length"), u32v(cfg.max_seq_len)),
        (k("embedding_length"), u32v(cfg.hidden_size)),
        (k("feed_forward_length"), u32v(cfg.intermediate_size)),
        (k("attention.head_count"), u32v(cfg.num_heads)),
        (k("attention.head_count_kv"), u32v(cfg.num_kv_heads)),
        (k("rope.freq_base"), Value::F32(cfg.rope_theta as f32)),
        (k("rope.dimension_count"), u32v(cfg.head_dim())),
        (
            k("attention.layer_norm_rms_epsilon"),
            Value::F32(cfg.rms_norm_eps as f32),
        ),
        (k("vocab_size"), u32v(cfg.vocab_size)),
        (k("attention.causal"), Value::Bool(false)),
        (
            "diffusion.shift_logits".into(),
            Value::Bool(cfg.shift_logits),
        ),
        (
            "tokenizer.ggml.mask_token_id".into(),
            Value::U32(cfg.special.mask),
        ),
        (
            "tokenizer.ggml.eos_token_id".into(),
            Value::U32(cfg.special.eos),
        ),
    ];
    if let Some(b) = cfg.special.bos {
        md.push(("tokenizer.ggml.bos_token_id".into(), Value::U32(b)));
    }
    if let Some(p) = cfg.special.pad {
        md.push(("tokenizer.ggml.padding_token_id".into(), Value::U32(p)));
    }
    md.extend(extra.iter().cloned());
    let mut qs: Vec<(String, QTensor)> = Vec::new();
    for role in roles(cfg) {
        let hf = role.hf_name(cfg.arch);
        let t = tensors
            .get(&hf)
            .ok_or_else(|| Error::MissingTensor {
                name: hf.clone(),
                source_desc: "the tensors to convert".into(),
            })?
            .to_dtype(candle_core::DType::F32)?;
        let q = if t.rank() == 1 {
            QTensor::quantize(&t, GgmlDType::F32)?
        } else {
            let q = QTensor::quantize(&t, dtype)?;
            match (cfg.arch, role) {
                (Arch::Llada, Role::Q(_)) => permute_rows(&q, cfg.num_heads)?,
                (Arch::Llada, Role::K(_)) => permute_rows(&q, cfg.num_kv_heads)?,
                _ => q,
            }
        };
        qs.push((role.gguf_name(), q));
    }
    let mut f =
        std::io::BufWriter::new(std::fs::File::create(path).map_err(|e| Error::file(path, e))?);
    let md_refs: Vec<(&str, &Value)> = md.iter().map(|(k, v)| (k.as_str(), v)).collect();
    let t_refs: Vec<(&str, &QTensor)> = qs.iter().map(|(k, v)| (k.as_str(), v)).collect();
    gguf_file::write(&mut f, &md_refs, &t_refs).map_err(|e| Error::file(path, e))?;
    Ok(())
}
