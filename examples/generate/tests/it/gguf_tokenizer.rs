//! `generate --model model.gguf --prompt ...` with no `--tokenizer` and no `tokenizer.json` beside
//! the file: the tokenizer comes from the GGUF's metadata, and every shipped model exported to
//! GGUF gives the same prompt ids, tokens and text as its model directory. A GGUF without
//! tokenizer metadata keeps the clear error, and `--tokenizer` still overrides.

use std::path::{Path, PathBuf};
use std::process::Command;

use candle_core::quantized::GgmlDType;
use dllm_models::synthetic::{random_weights, tiny_llada};

const SHIPPED: [&str; 4] = [
    "tiny-llada",
    "tiny-dream",
    "tiny-llada-long",
    "tiny-dream-long",
];

fn model_dir(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../models")
        .join(name)
}

/// A fresh directory for `name`'s files (and nothing else).
fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("generate-gguf-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn run(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_generate"))
        .args(args)
        .output()
        .expect("run generate")
}

/// `generate --json` on `model` (explicit decoding settings: a GGUF carries no
/// generation_config.json), which must succeed.
fn json(model: &str, prompt: &str, extra: &[&str]) -> serde_json::Value {
    let args = [
        &[
            "--model",
            model,
            "--prompt",
            prompt,
            "--gen-length",
            "32",
            "--block-length",
            "8",
            "--strategy",
            "vanilla",
            "--steps",
            "32",
            "--json",
        ][..],
        extra,
    ]
    .concat();
    let out = run(&args);
    assert!(
        out.status.success(),
        "{model}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

#[test]
fn a_shipped_model_exported_to_gguf_generates_without_a_tokenizer_file() {
    let prompts = [
        "Tom has 23 apples. He buys 5 more. How many apples does Tom have now?",
        "Which of these is a fruit? A. violin B. yellow C. rake D. banana",
    ];
    for name in SHIPPED {
        let dir = scratch(name);
        let gguf = dir.join("model.gguf");
        dllm_tasks::export::export_gguf(&model_dir(name), &gguf, GgmlDType::F32).unwrap();
        assert!(!dir.join("tokenizer.json").exists());
        for prompt in prompts {
            let from_dir = json(model_dir(name).to_str().unwrap(), prompt, &[]);
            let from_gguf = json(gguf.to_str().unwrap(), prompt, &[]);
            for key in ["prompt_ids", "generated_ids", "text"] {
                assert_eq!(
                    from_dir[key], from_gguf[key],
                    "{name}: `{key}` for {prompt:?}"
                );
            }
            assert!(from_gguf["text"].is_string(), "{name}: {from_gguf}");
        }
        let _ = std::fs::remove_dir_all(&dir);
    }
}

#[test]
fn a_gguf_without_tokenizer_metadata_names_the_missing_tokenizer_and_tokenizer_overrides() {
    let dir = scratch("bare");
    let gguf = dir.join("bare.gguf");
    let cfg = tiny_llada();
    let w = random_weights(&cfg, 5).unwrap();
    dllm_models::gguf_write::write_gguf(&gguf, &cfg, &w, GgmlDType::F32, &[]).unwrap();
    let g = gguf.to_str().unwrap();
    let out = run(&["--model", g, "--prompt", "hello", "--json"]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("has no tokenizer") && err.contains("--tokenizer"),
        "{err}"
    );
    // Raw ids need no tokenizer.
    let out = run(&[
        "--model",
        g,
        "--prompt-ids",
        "1,2,3",
        "--gen-length",
        "8",
        "--block-length",
        "8",
        "--json",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    // A shipped model's GGUF with another model's tokenizer given explicitly: that one is used.
    let own = dir.join("own.gguf");
    dllm_tasks::export::export_gguf(&model_dir("tiny-llada-long"), &own, GgmlDType::F32).unwrap();
    let long_tok = model_dir("tiny-llada-long").join("tokenizer.json");
    let short_tok = model_dir("tiny-llada").join("tokenizer.json");
    let prompt = "Tom has 23 apples.\nHe buys 5 more.";
    let o = own.to_str().unwrap();
    let via_meta = json(o, prompt, &[]);
    let via_long = json(o, prompt, &["--tokenizer", long_tok.to_str().unwrap()]);
    let via_short = json(o, prompt, &["--tokenizer", short_tok.to_str().unwrap()]);
    assert_eq!(via_meta["prompt_ids"], via_long["prompt_ids"]);
    assert_ne!(
        via_meta["prompt_ids"], via_short["prompt_ids"],
        "the short suite's tokenizer spells the newline differently"
    );
    let _ = std::fs::remove_dir_all(&dir);
}
