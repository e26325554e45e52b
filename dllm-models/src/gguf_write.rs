//! Writing llama.cpp GGUF files from HF-named tensors, in the layout `convert_hf_to_gguf.py`
//! produces (metadata keys, tensor names, LLaDA's q/k row permutation, norms and biases in F32).
//! Used by the benchmarks to run llama.cpp on the same weights, and usable as a converter.
//!
//! [`tokenizer_metadata`] turns a byte-level BPE `tokenizers::Tokenizer` into the
//! `tokenizer.ggml.*` keys llama.cpp's vocabulary loader reads (model `gpt2`, a named
//! pre-tokeniser, tokens, token types, merges), so the file carries its tokenizer.

use std::collections::HashMap;
use std::path::Path;

use candle_core::quantized::gguf_file::{self, Value};
use candle_core::quantized::{GgmlDType, QTensor};
use candle_core::Tensor;
use tokenizers::Tokenizer;

use crate::config::TransformerConfig;
use crate::gguf::permute_rows;
use crate::lm::Arch;
use crate::role::Role;
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

/// llama.cpp's token type of an ordinary token (`LLAMA_TOKEN_TYPE_NORMAL`).
pub const TOKEN_TYPE_NORMAL: i32 = 1;
/// llama.cpp's token type of a special token (`LLAMA_TOKEN_TYPE_CONTROL`): matched whole in
/// text when special tokens are parsed, never produced by BPE merges.
pub const TOKEN_TYPE_CONTROL: i32 = 3;

/// The `tokenizer.ggml.*` metadata of a byte-level BPE tokenizer, for [`write_gguf`]'s `extra`.
///
/// `pre` names llama.cpp's pre-tokeniser (`tokenizer.ggml.pre`) whose split rules equal the
/// tokenizer's own: llama.cpp has no way to express an arbitrary `tokenizer.json` pipeline, so
/// the caller vouches for the match (e.g. `starcoder`: single digits, then GPT-2's regex).
/// Normalisers have no GGUF equivalent either; a prompt fed to llama.cpp must already be in
/// normalised form. Added tokens marked special become control tokens; `add_bos` sets
/// `tokenizer.ggml.add_bos_token` (EOS is never appended).
///
/// Errors name what is unusable: a model other than BPE, ids that do not cover `0..n`, a merge
/// that is not a pair.
pub fn tokenizer_metadata(
    tok: &Tokenizer,
    pre: &str,
    add_bos: bool,
) -> Result<Vec<(String, Value)>> {
    let err = |m: String| Error::Tokenizer(format!("GGUF tokenizer metadata: {m}"));
    let json: serde_json::Value = serde_json::from_str(
        &tok.to_string(false)
            .map_err(|e| err(format!("cannot serialise the tokenizer: {e}")))?,
    )
    .map_err(|e| err(format!("tokenizer JSON: {e}")))?;
    let model = &json["model"];
    if model["type"] != "BPE" {
        return Err(err(format!("model type {} is not BPE", model["type"])));
    }
    let vocab = tok.get_vocab(true);
    let mut tokens: Vec<Option<String>> = vec![None; vocab.len()];
    for (text, &id) in &vocab {
        let slot = tokens.get_mut(id as usize).ok_or_else(|| {
            err(format!(
                "token id {id} ({text:?}) is outside 0..{}",
                vocab.len()
            ))
        })?;
        *slot = Some(text.clone());
    }
    let tokens: Vec<String> = tokens
        .into_iter()
        .enumerate()
        .map(|(i, t)| t.ok_or_else(|| err(format!("no token has id {i}"))))
        .collect::<Result<_>>()?;
    let added = tok.get_added_tokens_decoder();
    let types: Vec<Value> = (0..tokens.len() as u32)
        .map(|id| {
            Value::I32(match added.get(&id) {
                Some(t) if t.special => TOKEN_TYPE_CONTROL,
                _ => TOKEN_TYPE_NORMAL,
            })
        })
        .collect();
    let merges: Vec<Value> = model["merges"]
        .as_array()
        .ok_or_else(|| err("the BPE model has no merges list".into()))?
        .iter()
        .map(|m| match m {
            serde_json::Value::String(s) if s.split(' ').count() == 2 => Ok(s.clone()),
            serde_json::Value::Array(p) if p.len() == 2 => match (p[0].as_str(), p[1].as_str()) {
                (Some(a), Some(b)) => Ok(format!("{a} {b}")),
                _ => Err(err(format!("merge {m} is not a pair of strings"))),
            },
            _ => Err(err(format!("merge {m} is not a pair"))),
        })
        .map(|r| r.map(Value::String))
        .collect::<Result<_>>()?;
    Ok(vec![
        ("tokenizer.ggml.model".into(), Value::String("gpt2".into())),
        ("tokenizer.ggml.pre".into(), Value::String(pre.into())),
        (
            "tokenizer.ggml.tokens".into(),
            Value::Array(tokens.into_iter().map(Value::String).collect()),
        ),
        ("tokenizer.ggml.token_type".into(), Value::Array(types)),
        ("tokenizer.ggml.merges".into(), Value::Array(merges)),
        ("tokenizer.ggml.add_bos_token".into(), Value::Bool(add_bos)),
        ("tokenizer.ggml.add_eos_token".into(), Value::Bool(false)),
    ])
}
