//! GGUF export: a suite model written with its tokenizer loads back (weights through the
//! project's GGUF loader, metadata as llama.cpp's vocabulary loader reads it), F16 matches the
//! safetensors model, Q4_0 stays close, and impossible exports are named errors.

use std::fs::File;
use std::io::BufReader;
use std::path::{Path, PathBuf};

use candle_core::quantized::gguf_file::{Content, Value};
use candle_core::quantized::GgmlDType;
use candle_core::{DType, Device, Tensor};
use dllm_models::lm::Arch;
use dllm_models::synthetic::{random_weights, write_hf};
use dllm_models::{load, DiffusionLm, LoadOptions, ModelSource, Rows};
use dllm_tasks::export::{export_gguf, parse_gguf_type, GGUF_CHAT_TEMPLATE, GGUF_PRE_TOKENIZER};
use dllm_tasks::tokenizer::{self as tk, build_long_suite_tokenizer, encode_prompt};
use dllm_tasks::train::{suite_config, ModelShape};
use dllm_tasks::{test_set, TaskKind, BOS_ID, EOS_ID, MASK_ID, PAD_ID, SEP_ID};

fn model_dir(name: &str, hidden: usize) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("dllm-export-{}-{name}", std::process::id()));
    let tok = build_long_suite_tokenizer().unwrap();
    let shape = ModelShape {
        arch: Arch::Llada,
        hidden,
        layers: 2,
        heads: 2,
        kv_heads: 2,
        ffn: 3 * hidden,
    };
    let cfg = suite_config(shape, tok.get_vocab_size(true)).unwrap();
    write_hf(&dir, &cfg, &random_weights(&cfg, 7).unwrap(), DType::F32, 1).unwrap();
    tk::save(&tok, dir.join("tokenizer.json")).unwrap();
    dir
}

fn metadata(path: &Path) -> Content {
    Content::read(&mut BufReader::new(File::open(path).unwrap())).unwrap()
}

fn strings(v: &Value) -> Vec<String> {
    v.to_vec()
        .unwrap()
        .iter()
        .map(|s| s.to_string().unwrap().clone())
        .collect()
}

/// Logits of the first long-math question's canvas (prompt + 32 masks), all rows.
fn logits(source: &str, tokenizer: &Path) -> Tensor {
    let opts = LoadOptions {
        tokenizer: Some(tokenizer.to_path_buf()),
        ..Default::default()
    };
    let mut m = load(&ModelSource::parse(source).unwrap(), &opts).unwrap();
    let tok = m.tokenizer.clone().unwrap();
    let mut ids = encode_prompt(tok.inner(), &test_set(TaskKind::LongMath)[0].prompt).unwrap();
    ids.resize(ids.len() + 32, MASK_ID);
    let canvas = Tensor::new(ids.as_slice(), &Device::Cpu)
        .unwrap()
        .unsqueeze(0)
        .unwrap();
    m.model
        .forward_full(&canvas, Rows::All)
        .unwrap()
        .squeeze(0)
        .unwrap()
}

fn rel_err(a: &Tensor, b: &Tensor) -> f32 {
    let d = (a - b)
        .unwrap()
        .sqr()
        .unwrap()
        .sum_all()
        .unwrap()
        .to_scalar::<f32>()
        .unwrap();
    let n = a
        .sqr()
        .unwrap()
        .sum_all()
        .unwrap()
        .to_scalar::<f32>()
        .unwrap();
    (d / n).sqrt()
}

#[test]
fn f16_and_q4_0_carry_the_model_and_its_tokenizer() {
    let dir = model_dir("ok", 64);
    let tok = build_long_suite_tokenizer().unwrap();
    let reference = logits(dir.to_str().unwrap(), &dir.join("tokenizer.json"));
    for (dtype, tol) in [(GgmlDType::F16, 2e-3), (GgmlDType::Q4_0, 0.25)] {
        let path = dir.join(format!("model-{dtype:?}.gguf"));
        export_gguf(&dir, &path, dtype).unwrap();

        let c = metadata(&path);
        let md = &c.metadata;
        assert_eq!(md["general.architecture"].to_string().unwrap(), "llada");
        assert_eq!(md["tokenizer.ggml.model"].to_string().unwrap(), "gpt2");
        assert_eq!(
            md["tokenizer.ggml.pre"].to_string().unwrap(),
            GGUF_PRE_TOKENIZER
        );
        let tokens = strings(&md["tokenizer.ggml.tokens"]);
        assert_eq!(tokens.len(), tok.get_vocab_size(true));
        for (i, t) in tokens.iter().enumerate() {
            assert_eq!(
                tok.id_to_token(i as u32).as_deref(),
                Some(t.as_str()),
                "id {i}"
            );
        }
        let types: Vec<i32> = md["tokenizer.ggml.token_type"]
            .to_vec()
            .unwrap()
            .iter()
            .map(|v| v.to_i32().unwrap())
            .collect();
        assert_eq!(types.len(), tokens.len());
        assert!(
            types[..6].iter().all(|&t| t == 3),
            "specials are control tokens"
        );
        assert!(types[6..].iter().all(|&t| t == 1));
        let merges = strings(&md["tokenizer.ggml.merges"]);
        assert!(merges.len() > 100 && merges.iter().all(|m| m.split(' ').count() == 2));
        // Every merged token is a vocabulary entry.
        assert!(merges.iter().all(|m| tokens.contains(&m.replace(' ', ""))));
        assert_eq!(
            md["tokenizer.ggml.mask_token_id"].to_u32().unwrap(),
            MASK_ID
        );
        assert_eq!(
            md["tokenizer.ggml.seperator_token_id"].to_u32().unwrap(),
            SEP_ID
        );
        // LLaDA's config.json names no BOS / PAD: the suite's ids must be written, or llama.cpp
        // would fall back to GPT-2's.
        for (key, id) in [
            ("tokenizer.ggml.bos_token_id", BOS_ID),
            ("tokenizer.ggml.eos_token_id", EOS_ID),
            ("tokenizer.ggml.padding_token_id", PAD_ID),
        ] {
            assert_eq!(md[key].to_u32().unwrap(), id, "{key}");
        }
        assert!(md["tokenizer.ggml.add_bos_token"].to_bool().unwrap());
        assert_eq!(
            md["tokenizer.chat_template"].to_string().unwrap(),
            GGUF_CHAT_TEMPLATE
        );
        assert_eq!(c.tensor_infos["blk.0.attn_q.weight"].ggml_dtype, dtype);
        assert_eq!(
            c.tensor_infos["blk.0.attn_norm.weight"].ggml_dtype,
            GgmlDType::F32
        );

        let got = logits(path.to_str().unwrap(), &dir.join("tokenizer.json"));
        let err = rel_err(&reference, &got);
        assert!(err < tol, "{dtype:?}: relative error {err}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn impossible_exports_are_named_errors() {
    // Q4_0 needs 32-element blocks: a hidden size of 48 cannot be written in it (F16 can).
    let dir = model_dir("odd", 48);
    let err = export_gguf(&dir, &dir.join("q.gguf"), GgmlDType::Q4_0).unwrap_err();
    assert!(err.to_string().contains("hidden size is 48"), "{err}");
    export_gguf(&dir, &dir.join("f.gguf"), GgmlDType::F16).unwrap();
    std::fs::remove_file(dir.join("tokenizer.json")).unwrap();
    let err = export_gguf(&dir, &dir.join("f.gguf"), GgmlDType::F16).unwrap_err();
    assert!(err.to_string().contains("tokenizer.json"), "{err}");
    let err = parse_gguf_type("q3_k").unwrap_err();
    assert!(err.to_string().contains("q3_k"), "{err}");
    let _ = std::fs::remove_dir_all(&dir);
}
