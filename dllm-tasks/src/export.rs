//! A suite model as a llama.cpp GGUF file, tokenizer included.
//!
//! The weights go through `dllm_models::gguf_write` (llama.cpp's converter layout: LLaDA's q/k
//! rows permuted for its interleaved RoPE, norms in F32, matrices in the chosen type); the
//! suite's byte-level BPE tokenizer becomes `tokenizer.ggml.*` metadata with pre-tokeniser
//! `starcoder` ([`GGUF_PRE_TOKENIZER`]), whose rules (each digit alone, then GPT-2's split) are
//! the suite tokenizer's. The normaliser and post-processor are written as
//! `tokenizer.ggml.add_space_prefix`, `add_sep_token` (and, for the long suite,
//! `tokenizer.llada_rs.space_after_newline`), from which `dllm_models::gguf_tokenizer` rebuilds
//! the `tokenizer.json` token for token, so the `.gguf` alone is a complete model for this
//! project's loader. llama.cpp's BPE tokeniser applies neither key to a prompt, so the file also
//! carries a chat template ([`GGUF_CHAT_TEMPLATE`]) that does their work: it prepends the one
//! space the normaliser adds and appends `<sep>` (llama.cpp adds `<bos>`), so
//! `llama-diffusion-cli -p "QUESTION"` sees exactly the prompt block `<bos> QUESTION <sep>` the
//! model was trained on.

use std::collections::HashMap;
use std::path::Path;

use candle_core::quantized::gguf_file::Value;
use candle_core::quantized::GgmlDType;
use candle_core::{Device, Tensor};
use dllm_models::gguf_write::{tokenizer_metadata, write_gguf};
use dllm_models::source::{read_config, weight_files};
use tokenizers::Tokenizer;

use crate::tokenizer::{check_special_tokens, BOS_ID, PAD_ID, SEP_ID, UNK_ID};
use crate::{Error, Result};

/// llama.cpp's pre-tokeniser whose split rules equal the suite tokenizers' (single digits,
/// then GPT-2's regex).
pub const GGUF_PRE_TOKENIZER: &str = "starcoder";

/// The chat template written to `tokenizer.chat_template`: the user's text after one space,
/// then `<sep>` (the suite's prompt block, without the `<bos>` llama.cpp adds itself).
pub const GGUF_CHAT_TEMPLATE: &str = "{% for message in messages %}{% if message['role'] == 'user' %}{{ ' ' + message['content'] }}{% endif %}{% endfor %}{% if add_generation_prompt %}<sep>{% endif %}";

/// The GGUF weight types [`export_gguf`] writes, by the names llama.cpp uses.
pub fn parse_gguf_type(name: &str) -> Result<GgmlDType> {
    match name.to_ascii_lowercase().as_str() {
        "f32" => Ok(GgmlDType::F32),
        "f16" => Ok(GgmlDType::F16),
        "q8_0" => Ok(GgmlDType::Q8_0),
        "q4_0" => Ok(GgmlDType::Q4_0),
        other => Err(Error::InvalidArgument(format!(
            "GGUF type `{other}` (expected f32, f16, q8_0 or q4_0)"
        ))),
    }
}

/// The suite tokenizer's `tokenizer.ggml.*` metadata: vocabulary, merges, token types, the
/// `starcoder` pre-tokeniser, BOS added by the tokenizer, the `<sep>` / `<unk>` ids (the
/// weight writer adds BOS, EOS, PAD and MASK from the model config) and the prompt-block chat
/// template; and what makes the file's tokenizer the `tokenizer.json`'s token for token
/// (`dllm_models::gguf_tokenizer`): `add_sep_token` (the post-processor's `<sep>` after the
/// text), `add_space_prefix` (the normaliser's leading space, which the decoder strips) and,
/// for the long suite, `tokenizer.llada_rs.space_after_newline` (its `\n` -> `\n `
/// normaliser). llama.cpp reads `add_space_prefix` of a BPE vocabulary only when detokenising
/// (it strips the leading space, as the suite's decoder does) and `add_sep_token` only for
/// embedding and reranking inputs, so its prompts still come from the chat template.
pub fn suite_tokenizer_metadata(tok: &Tokenizer) -> Result<Vec<(String, Value)>> {
    check_special_tokens(tok)?;
    let newline = suite_normalizer(tok)?;
    let mut md = tokenizer_metadata(tok, GGUF_PRE_TOKENIZER, true)?;
    md.push(("tokenizer.ggml.add_sep_token".into(), Value::Bool(true)));
    md.push(("tokenizer.ggml.add_space_prefix".into(), Value::Bool(true)));
    if newline {
        md.push((
            "tokenizer.llada_rs.space_after_newline".into(),
            Value::Bool(true),
        ));
    }
    md.push((
        "tokenizer.ggml.seperator_token_id".into(),
        Value::U32(SEP_ID),
    ));
    md.push(("tokenizer.ggml.unknown_token_id".into(), Value::U32(UNK_ID)));
    md.push((
        "tokenizer.chat_template".into(),
        Value::String(GGUF_CHAT_TEMPLATE.into()),
    ));
    Ok(md)
}

/// Which of the suite's two normalisers `tok` has: `false` for the short suite's (one space
/// before the text), `true` for the long suite's (also a space after every `\n`); anything else
/// has no GGUF spelling and is an error.
fn suite_normalizer(tok: &Tokenizer) -> Result<bool> {
    let normalized = |text: &str| -> Result<String> {
        let mut s = tokenizers::NormalizedString::from(text);
        if let Some(n) = tok.get_normalizer() {
            tokenizers::Normalizer::normalize(n, &mut s)?;
        }
        Ok(s.get().to_string())
    };
    match normalized("a\nb")?.as_str() {
        " a\nb" => Ok(false),
        " a\n b" => Ok(true),
        other => Err(Error::InvalidArgument(format!(
            "the tokenizer's normaliser turns \"a\\nb\" into {other:?}: neither suite's, and \
             GGUF metadata cannot carry it"
        ))),
    }
}

/// Writes the suite model in the HF directory `model_dir` (config.json, safetensors,
/// tokenizer.json) as a GGUF file with matrices in `dtype`. Quantized types need every matrix's
/// input width to be a multiple of the type's block (32 for Q4_0/Q8_0): an error otherwise.
pub fn export_gguf(model_dir: &Path, out: &Path, dtype: GgmlDType) -> Result<()> {
    let mut cfg = read_config(&model_dir.join("config.json"))?;
    // LLaDA's config.json has no BOS/PAD ids (generation_config.json does); the suite's are
    // fixed, and llama.cpp would otherwise assume GPT-2's defaults.
    for (name, slot, id) in [
        ("bos_token_id", &mut cfg.special.bos, BOS_ID),
        ("pad_token_id", &mut cfg.special.pad, PAD_ID),
    ] {
        match *slot {
            None => *slot = Some(id),
            Some(x) if x == id => {}
            Some(x) => {
                return Err(Error::InvalidArgument(format!(
                    "config.json: {name} {x} is not the suite's {id}"
                )))
            }
        }
    }
    let block = dtype.block_size();
    for (what, width) in [
        ("hidden size", cfg.hidden_size),
        ("MLP size", cfg.intermediate_size),
        (
            "attention width (heads x head dim)",
            cfg.num_heads * cfg.head_dim(),
        ),
    ] {
        if !width.is_multiple_of(block) {
            return Err(Error::InvalidArgument(format!(
                "{dtype:?} needs matrix rows of whole {block}-element blocks, but the model's {what} is {width}"
            )));
        }
    }
    let tok = crate::tokenizer::load(model_dir.join("tokenizer.json"))?;
    let extra = suite_tokenizer_metadata(&tok)?;
    let mut tensors: HashMap<String, Tensor> = HashMap::new();
    for file in weight_files(model_dir)? {
        let t = candle_core::safetensors::load(&file, &Device::Cpu)
            .map_err(|e| Error::InvalidArgument(format!("{}: {e}", file.display())))?;
        tensors.extend(t);
    }
    write_gguf(out, &cfg, &tensors, dtype, &extra)?;
    Ok(())
}
