//! The seed inputs: valid checkpoints of a very small LLaDA and Dream (one block, hidden 32,
//! vocabulary 32) in every layout the loaders read, built in memory once per run. Every mutant is
//! one of these files with a few changes, so it reaches deep into the loaders instead of failing
//! at the first byte.

use std::path::Path;

use anyhow::{Context, Result};
use candle_core::quantized::GgmlDType;
use candle_core::DType;
use dllm_models::synthetic::{random_weights, tiny_dream, tiny_llada, write_hf};
use dllm_models::TransformerConfig;

/// What a seed is, which decides how its files are laid out and loaded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Layout {
    /// `config.json` + `model.safetensors` (+ tokenizer, generation config).
    Single,
    /// `config.json` + `model.safetensors.index.json` + two shards.
    Sharded,
    /// `model.gguf` (+ `tokenizer.json` beside it).
    Gguf,
}

/// One seed checkpoint: its layout and its files (name -> bytes).
#[derive(Debug, Clone)]
pub struct Seed {
    /// A name for reports (`llada-single`, ...).
    pub name: String,
    /// How it is loaded.
    pub layout: Layout,
    /// File name -> content, in a fixed order.
    pub files: Vec<(String, Vec<u8>)>,
}

impl Seed {
    /// The file to load: the directory for HF layouts, `model.gguf` otherwise.
    pub fn entry(&self, dir: &Path) -> std::path::PathBuf {
        match self.layout {
            Layout::Gguf => dir.join("model.gguf"),
            _ => dir.to_path_buf(),
        }
    }
}

/// The smallest shapes that still exercise every code path (GQA and biases for Dream).
fn small(mut cfg: TransformerConfig) -> TransformerConfig {
    cfg.hidden_size = 32;
    cfg.num_layers = 1;
    cfg.num_heads = 2;
    cfg.num_kv_heads = if cfg.qkv_bias { 1 } else { 2 };
    cfg.intermediate_size = 32;
    cfg.vocab_size = 32;
    cfg.max_seq_len = 64;
    cfg.special.mask = 31;
    cfg.special.eos = 30;
    cfg.special.bos = Some(29);
    cfg.special.pad = Some(30);
    cfg
}

/// A WordLevel `tokenizer.json` spelling all 32 ids (words `w0..w28`, then BOS, EOS, mask).
pub fn tokenizer_json() -> String {
    let mut vocab = serde_json::Map::new();
    for i in 0..29 {
        vocab.insert(format!("w{i}"), i.into());
    }
    let special = |id: u32, s: &str| {
        serde_json::json!({"id": id, "content": s, "single_word": false, "lstrip": false,
                           "rstrip": false, "normalized": false, "special": true})
    };
    serde_json::json!({
        "version": "1.0", "truncation": null, "padding": null,
        "added_tokens": [special(29, "<s>"), special(30, "</s>"), special(31, "<mask>")],
        "normalizer": null, "pre_tokenizer": {"type": "Whitespace"},
        "post_processor": null, "decoder": null,
        "model": {"type": "WordLevel", "vocab": vocab, "unk_token": "w0"}
    })
    .to_string()
}

fn read_dir(dir: &Path) -> Result<Vec<(String, Vec<u8>)>> {
    let mut files = Vec::new();
    for e in std::fs::read_dir(dir)? {
        let e = e?;
        files.push((
            e.file_name().to_string_lossy().into_owned(),
            std::fs::read(e.path())?,
        ));
    }
    files.sort();
    Ok(files)
}

/// Build every seed, using `scratch` as a work directory.
pub fn seeds(scratch: &Path) -> Result<Vec<Seed>> {
    let mut out = Vec::new();
    for (arch, cfg) in [
        ("llada", small(tiny_llada())),
        ("dream", small(tiny_dream())),
    ] {
        let w = random_weights(&cfg, 7)?;
        let gen = serde_json::json!({
            "bos_token_id": 29, "eos_token_id": 30, "gen_length": 8, "block_length": 4, "steps": 4
        })
        .to_string();
        for (layout, shards, dtype) in [
            (Layout::Single, 1, DType::F32),
            (Layout::Single, 1, DType::BF16),
            (Layout::Sharded, 2, DType::F16),
        ] {
            let dir = scratch.join(format!("seed-{arch}-{shards}-{dtype:?}"));
            let _ = std::fs::remove_dir_all(&dir);
            write_hf(&dir, &cfg, &w, dtype, shards)?;
            std::fs::write(dir.join("tokenizer.json"), tokenizer_json())?;
            std::fs::write(dir.join("generation_config.json"), &gen)?;
            out.push(Seed {
                name: format!("{arch}-{layout:?}-{dtype:?}").to_lowercase(),
                layout,
                files: read_dir(&dir).with_context(|| dir.display().to_string())?,
            });
            std::fs::remove_dir_all(&dir)?;
        }
        for (tag, q) in [
            ("f32", GgmlDType::F32),
            ("q8_0", GgmlDType::Q8_0),
            ("q4_0", GgmlDType::Q4_0),
        ] {
            let dir = scratch.join(format!("seed-{arch}-{tag}"));
            std::fs::create_dir_all(&dir)?;
            // Rows of 32 are one Q4_0/Q8_0 block.
            dllm_models::gguf_write::write_gguf(&dir.join("model.gguf"), &cfg, &w, q, &[])?;
            std::fs::write(dir.join("tokenizer.json"), tokenizer_json())?;
            out.push(Seed {
                name: format!("{arch}-gguf-{tag}"),
                layout: Layout::Gguf,
                files: read_dir(&dir)?,
            });
            std::fs::remove_dir_all(&dir)?;
        }
    }
    Ok(out)
}
