//! Every malformed input is an `Err` (never a panic) whose `Display` names the problem: the field,
//! tensor or file at fault.
//!
//! Each case builds its own broken checkpoint in a temporary directory and loads it through the
//! public entry points (`ModelSource::parse` + `dllm_models::load`), under `catch_unwind` so a
//! panic is reported as a failure of that case rather than aborting the table.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::Path;

use candle_core::quantized::GgmlDType;
use candle_core::{DType, Device, Tensor};
use dllm_models::synthetic::{random_weights, tiny_dream, tiny_llada, write_hf};
use dllm_models::{DiffusionLm, ModelSource, Rows, TransformerConfig};
use llada_tests::checkpoint::Checkpoint;
use llada_tests::fixtures::{canvas, load_default, tiny_dir, write_model, TempDir};
use llada_tests::gguf_fixture::{write_gguf, write_gguf_with};
use llada_tests::reference::RefConfig;
use serde_json::{json, Value};

/// Run `f`, require an error, and require its message to contain every keyword.
fn expect_err<T>(case: &str, keywords: &[&str], f: impl FnOnce() -> dllm_models::Result<T>) {
    let msg = match catch_unwind(AssertUnwindSafe(f)) {
        Err(p) => {
            let what = p
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_default();
            panic!("{case}: panicked instead of returning an error: {what}")
        }
        Ok(Ok(_)) => panic!("{case}: loaded without error"),
        Ok(Err(e)) => e.to_string(),
    };
    println!("{case}: {msg}");
    for k in keywords {
        assert!(
            msg.contains(k),
            "{case}: error message does not mention `{k}`:\n  {msg}"
        );
    }
}

fn load(path: &Path) -> dllm_models::Result<()> {
    load_default(path).map(|_| ())
}

fn edit_config(dir: &Path, f: impl FnOnce(&mut serde_json::Map<String, Value>)) {
    let p = dir.join("config.json");
    let mut v: Value = serde_json::from_str(&std::fs::read_to_string(&p).unwrap()).unwrap();
    f(v.as_object_mut().unwrap());
    std::fs::write(&p, serde_json::to_string_pretty(&v).unwrap()).unwrap();
}

/// `(key, Some(value))` sets a key, `(key, None)` removes it.
type Edits = Vec<(&'static str, Option<Value>)>;

fn set(k: &'static str, v: Value) -> (&'static str, Option<Value>) {
    (k, Some(v))
}

fn del(k: &'static str) -> (&'static str, Option<Value>) {
    (k, None)
}

#[test]
fn bad_config_fields_are_named() {
    let llada = tiny_llada();
    let dream = tiny_dream();
    #[rustfmt::skip]
    let cases: Vec<(&str, &TransformerConfig, Edits, &[&str])> = vec![
        ("llada missing d_model", &llada, vec![del("d_model")], &["d_model", "missing"]),
        ("llada missing n_heads", &llada, vec![del("n_heads")], &["n_heads"]),
        ("llada missing mask_token_id", &llada, vec![del("mask_token_id")], &["mask_token_id"]),
        ("llada missing n_layers", &llada, vec![del("n_layers")], &["n_layers"]),
        ("llada d_model is a string", &llada, vec![set("d_model", json!("big"))], &["d_model", "big"]),
        ("llada negative d_model", &llada, vec![set("d_model", json!(-64))], &["d_model"]),
        ("llada zero layers", &llada, vec![set("n_layers", json!(0))], &["n_layers"]),
        ("llada n_heads does not divide d_model", &llada, vec![set("n_heads", json!(5))], &["n_heads", "d_model"]),
        ("llada n_kv_heads does not divide n_heads", &llada, vec![set("n_kv_heads", json!(3))], &["n_kv_heads"]),
        ("llada mask id outside vocab", &llada, vec![set("mask_token_id", json!(256))], &["mask_token_id", "256"]),
        ("llada eos id outside vocab", &llada, vec![set("eos_token_id", json!(1000))], &["eos_token_id", "1000"]),
        ("llada rope disabled", &llada, vec![set("rope", json!(false))], &["rope"]),
        ("llada alibi", &llada, vec![set("alibi", json!(true))], &["alibi"]),
        ("llada rope_theta is text", &llada, vec![set("rope_theta", json!("1e4"))], &["rope_theta"]),
        ("unknown model_type", &llada, vec![set("model_type", json!("gpt2")), del("architectures")], &["model_type", "gpt2"]),
        ("gpt2 model_type, LLaDA architectures", &llada, vec![set("model_type", json!("gpt2"))], &["model_type", "gpt2"]),
        ("dream missing num_attention_heads", &dream, vec![del("num_attention_heads")], &["num_attention_heads"]),
        ("dream missing hidden_size", &dream, vec![del("hidden_size")], &["hidden_size"]),
        ("dream rope_scaling", &dream, vec![set("rope_scaling", json!({"type": "linear", "factor": 2.0}))], &["rope_scaling"]),
        ("dream kv heads do not divide heads", &dream, vec![set("num_key_value_heads", json!(3))], &["num_key_value_heads"]),
        ("dream sliding window", &dream, vec![set("use_sliding_window", json!(true))], &["use_sliding_window"]),
    ];
    for (name, cfg, edits, keys) in cases {
        let dir = tiny_dir("badcfg", cfg, 1).unwrap();
        edit_config(dir.path(), |c| {
            for (k, v) in edits {
                match v {
                    Some(v) => c.insert(k.into(), v),
                    None => c.remove(k),
                };
            }
        });
        expect_err(name, keys, || load(dir.path()));
    }
}

#[test]
fn config_that_is_not_json() {
    let dir = tiny_dir("notjson", &tiny_llada(), 1).unwrap();
    std::fs::write(dir.join("config.json"), "{ \"d_model\": 64, oops").unwrap();
    expect_err("config not JSON", &["config.json", "JSON"], || {
        load(dir.path())
    });
    std::fs::write(dir.join("config.json"), "[1, 2, 3]").unwrap();
    expect_err("config not an object", &["config.json"], || {
        load(dir.path())
    });
    std::fs::remove_file(dir.join("config.json")).unwrap();
    expect_err("config missing", &["config.json"], || load(dir.path()));
}

#[test]
fn missing_and_truncated_weight_files() {
    let dir = tiny_dir("noweights", &tiny_llada(), 1).unwrap();
    std::fs::remove_file(dir.join("model.safetensors")).unwrap();
    expect_err("no weights file", &["model.safetensors"], || {
        load(dir.path())
    });

    let dir = TempDir::new("noshard").unwrap();
    write_model(dir.path(), &tiny_dream(), 1, DType::F32, 3).unwrap();
    std::fs::remove_file(dir.join("model-00002-of-00003.safetensors")).unwrap();
    expect_err(
        "missing shard",
        &["model-00002-of-00003.safetensors", "missing"],
        || load(dir.path()),
    );

    for cfg in [tiny_llada(), tiny_dream()] {
        let dir = tiny_dir("trunc", &cfg, 1).unwrap();
        let p = dir.join("model.safetensors");
        let bytes = std::fs::read(&p).unwrap();
        std::fs::write(&p, &bytes[..bytes.len() / 2]).unwrap();
        expect_err(
            "truncated safetensors",
            &["model.safetensors", "truncated"],
            || load(dir.path()),
        );
        // Cut inside the header too.
        std::fs::write(&p, &bytes[..20]).unwrap();
        expect_err(
            "safetensors cut in its header",
            &["model.safetensors"],
            || load(dir.path()),
        );
    }
}

#[test]
fn wrong_shape_and_missing_tensors_are_named() {
    let cfg = tiny_llada();
    let name = "model.transformer.blocks.1.k_proj.weight";
    let mut w = random_weights(&cfg, 1).unwrap();
    w.insert(
        name.into(),
        Tensor::zeros((32, 64), DType::F32, &Device::Cpu).unwrap(),
    );
    let dir = TempDir::new("shape").unwrap();
    write_hf(dir.path(), &cfg, &w, DType::F32, 1).unwrap();
    expect_err("wrong shape", &[name, "[32, 64]", "[64, 64]"], || {
        load(dir.path())
    });

    let cfg = tiny_dream();
    for name in [
        "model.layers.0.self_attn.v_proj.bias",
        "model.layers.1.mlp.down_proj.weight",
        "lm_head.weight",
        "model.norm.weight",
    ] {
        let mut w = random_weights(&cfg, 1).unwrap();
        assert!(w.remove(name).is_some(), "fixture has {name}");
        let dir = TempDir::new("missing").unwrap();
        write_hf(dir.path(), &cfg, &w, DType::F32, 2).unwrap();
        expect_err("missing tensor", &[name], || load(dir.path()));
    }
}

#[test]
fn bad_gguf_files() {
    let dir = tiny_dir("badgguf", &tiny_llada(), 1).unwrap();
    let path = dir.join("model.gguf");
    write_gguf(dir.path(), &path, GgmlDType::Q8_0).unwrap();
    let bytes = std::fs::read(&path).unwrap();
    std::fs::write(&path, &bytes[..bytes.len() / 2]).unwrap();
    expect_err("truncated gguf", &["model.gguf", "truncated"], || {
        load(&path)
    });
    std::fs::write(&path, &bytes[..64]).unwrap();
    expect_err("gguf cut in its metadata", &["model.gguf"], || load(&path));
    // A file that is neither a directory nor a GGUF.
    std::fs::write(&path, b"not a model").unwrap();
    expect_err("not a gguf", &["model.gguf"], || load(&path));
}

#[test]
fn bad_gguf_metadata_and_tensors_are_named() {
    use candle_core::quantized::gguf_file::Value as G;
    type MetaEdits = Vec<(&'static str, Option<G>)>;
    // (case, metadata to set (Some) or remove (None), tensor to drop, keywords)
    #[rustfmt::skip]
    let cases: Vec<(&str, MetaEdits, Option<&str>, &[&str])> = vec![
        ("llama architecture", vec![("general.architecture", Some(G::String("llama".into())))], None, &["general.architecture", "llama"]),
        ("no architecture", vec![("general.architecture", None)], None, &["general.architecture"]),
        ("no mask id", vec![("tokenizer.ggml.mask_token_id", None)], None, &["tokenizer.ggml.mask_token_id"]),
        ("no embedding_length", vec![("llada.embedding_length", None)], None, &["embedding_length"]),
        ("shift contradicts llada", vec![("diffusion.shift_logits", Some(G::Bool(true)))], None, &["diffusion.shift_logits"]),
        ("kv heads do not divide heads", vec![("llada.attention.head_count_kv", Some(G::U32(3)))], None, &["head_count_kv"]),
        // A zero head count once divided by zero (checking rope.dimension_count) before it was named.
        ("zero heads", vec![("llada.attention.head_count", Some(G::U32(0)))], None, &["llada.attention.head_count", "positive"]),
        ("block_count is text", vec![("llada.block_count", Some(G::String("two".into())))], None, &["block_count"]),
        ("missing tensor", vec![], Some("blk.1.attn_v.weight"), &["blk.1.attn_v.weight"]),
        ("missing embedding", vec![], Some("token_embd.weight"), &["token_embd.weight"]),
    ];
    let dir = tiny_dir("badgguf-meta", &tiny_llada(), 1).unwrap();
    let rcfg = RefConfig::read(dir.path()).unwrap();
    let ck = Checkpoint::read_dir(dir.path()).unwrap();
    for (name, meta_edits, drop, keys) in cases {
        let path = dir.join("model.gguf");
        write_gguf_with(&rcfg, &ck, &path, GgmlDType::F32, |meta, tensors| {
            for (k, v) in meta_edits {
                meta.retain(|(key, _)| key != k);
                if let Some(v) = v {
                    meta.push((k.into(), v));
                }
            }
            tensors.retain(|(n, _)| Some(n.as_str()) != drop);
        })
        .unwrap();
        expect_err(name, keys, || load(&path));
    }
}

#[test]
fn quantized_embedding_rejects_ids_outside_the_vocabulary() {
    let dir = tiny_dir("qemb", &tiny_dream(), 1).unwrap();
    let path = dir.join("model.gguf");
    write_gguf(dir.path(), &path, GgmlDType::Q4_0).unwrap();
    let mut m = load_default(&path).unwrap().model;
    expect_err("quantized embedding, id 300", &["300"], || {
        m.forward_full(&canvas(&[1, 2, 300, 4]), Rows::All)
    });
}

#[test]
fn nonexistent_path_that_is_not_a_hub_id() {
    for spec in [
        "/nonexistent/llada-tests/model",
        "./no/such/dir",
        "no-such-model-dir",
    ] {
        expect_err(spec, &[spec], || ModelSource::parse(spec).map(|_| ()));
    }
}

#[test]
fn bad_canvases_are_errors() {
    let dir = tiny_dir("canvas", &tiny_dream(), 1).unwrap();
    let mut m = load_default(dir.path()).unwrap().model;
    let max = m.info().max_seq_len;
    let long: Vec<u32> = vec![1; max + 1];
    expect_err(
        "canvas longer than max_seq_len",
        &[&(max + 1).to_string(), &max.to_string()],
        || m.forward_full(&canvas(&long), Rows::All),
    );
    // A token id outside the vocabulary.
    expect_err("token id outside the vocabulary", &["300"], || {
        m.forward_full(&canvas(&[1, 2, 300, 4]), Rows::All)
    });
    // Float ids.
    let f = Tensor::zeros((1, 4), DType::F32, &Device::Cpu).unwrap();
    expect_err("float canvas", &["u32"], || m.forward_full(&f, Rows::All));
    // A window past the cache would leave a hole.
    let c = canvas(&[1, 2, 3, 4, 5, 6, 7, 8]);
    expect_err("window past the cache", &["cache"], || {
        m.forward(&c, 3..8, Rows::All)
    });
    // Rows outside the window.
    expect_err("rows outside the window", &["7"], || {
        m.forward(&c, 0..4, Rows::Positions(&[7]))
    });
    expect_err("empty window", &[], || m.forward(&c, 4..4, Rows::All));
}

#[test]
fn invalid_tokenizer_json_is_named() {
    let dir = tiny_dir("badtok", &tiny_llada(), 1).unwrap();
    std::fs::write(dir.join("tokenizer.json"), "{ definitely not").unwrap();
    expect_err("bad tokenizer.json", &["tokenizer.json"], || {
        load(dir.path())
    });
}
