//! The shipped models exported to GGUF carry their tokenizer: the one `dllm_models` rebuilds from
//! the file's `tokenizer.ggml.*` metadata is the model's `tokenizer.json` token for token — on
//! every suite prompt and response of the held-out sets and a train-stream sample, with and
//! without special tokens, on special-token text, and back through decoding. The same holds after
//! llama.cpp's own tooling (gguf-py, `dllm-models/tests/gguf_py/write_gguf.py`) has read and
//! rewritten the files.

use std::path::{Path, PathBuf};
use std::process::Command;

use candle_core::quantized::GgmlDType;
use dllm_models::gguf_tokenizer::read_tokenizer;
use dllm_models::{load, LoadOptions, ModelSource, TextTokenizer};
use dllm_tasks::export::export_gguf;
use dllm_tasks::tasks::{suite_train_stream, test_set, Suite, TaskKind};
use dllm_tasks::tokenizer::SPECIAL_TOKENS;

const SHIPPED: [(&str, Suite); 4] = [
    ("tiny-llada", Suite::Short),
    ("tiny-dream", Suite::Short),
    ("tiny-llada-long", Suite::Long),
    ("tiny-dream-long", Suite::Long),
];

fn model_dir(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../models")
        .join(name)
}

/// A fresh directory holding the model exported to `model.gguf`, and nothing else (one per
/// test: `tag`, as tests run in parallel).
fn export(tag: &str, name: &str) -> PathBuf {
    let out = std::env::temp_dir().join(format!("gguf-tok-{}-{tag}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&out);
    std::fs::create_dir_all(&out).unwrap();
    let gguf = out.join("model.gguf");
    export_gguf(&model_dir(name), &gguf, GgmlDType::F32).unwrap();
    gguf
}

/// Prompts and responses of `suite`'s held-out sets and of its train stream, plus text that
/// stresses the pipeline (specials spelled out, unicode, digits, spacing, newlines).
fn corpus(suite: Suite) -> Vec<String> {
    let mut texts: Vec<String> = Vec::new();
    for kind in suite.tasks() {
        for e in test_set(kind) {
            texts.push(e.prompt);
            texts.push(e.response);
        }
    }
    for e in suite_train_stream(suite, 0x5EED).take(500) {
        texts.push(e.prompt);
        texts.push(e.response);
    }
    let odd = [
        "",
        " ",
        "  two leading spaces",
        "trailing spaces   ",
        "Tom has 123456 apples.",
        "line one\nline two\n\n  indented\n",
        "\n",
        "tabs\tand\r\ncarriage returns",
        "I've been told he's there, 'RE you sure? We'Ve a'lL",
        "naïve café, 北京, emoji 🚀🦙 and ZWJ 😶\u{200d}🌫️",
        "<bos> <sep> <eos> [MASK] <pad> <unk>",
        "x<sep>y [MASK]z",
        "3.3 3..3 3...3 ------======= ??????",
    ];
    texts.extend(odd.iter().map(|s| s.to_string()));
    texts
}

fn assert_identical(name: &str, hf: &TextTokenizer, gg: &TextTokenizer, texts: &[String]) {
    assert_eq!(hf.vocab_size(), gg.vocab_size(), "{name}: vocabulary size");
    assert_eq!(hf.id_bound(), gg.id_bound(), "{name}: id bound");
    assert_eq!(hf.template(), gg.template(), "{name}: chat template");
    for id in 0..hf.id_bound() as u32 {
        assert_eq!(
            hf.inner().id_to_token(id),
            gg.inner().id_to_token(id),
            "{name}: token {id}"
        );
        for skip in [false, true] {
            assert_eq!(
                hf.decode(&[id], skip).unwrap(),
                gg.decode(&[id], skip).unwrap(),
                "{name}: decode [{id}] skip_special={skip}"
            );
        }
    }
    let mut compared = 0;
    for t in texts {
        for special in [false, true] {
            let ids = hf.encode(t, special).unwrap();
            assert_eq!(
                ids,
                gg.encode(t, special).unwrap(),
                "{name}: encode({t:?}, {special})"
            );
            assert_eq!(
                hf.encode_user_text(t, special).unwrap(),
                gg.encode_user_text(t, special).unwrap(),
                "{name}: encode_user_text({t:?}, {special})"
            );
            for skip in [false, true] {
                let text = gg.decode(&ids, skip).unwrap();
                assert_eq!(
                    hf.decode(&ids, skip).unwrap(),
                    text,
                    "{name}: decode(encode({t:?}, {special}), skip_special={skip})"
                );
                if skip && !SPECIAL_TOKENS.iter().any(|s| t.contains(s)) {
                    assert_eq!(&text, t, "{name}: round trip of {t:?}");
                }
            }
            compared += 1;
        }
        assert_eq!(
            hf.encode_prompt(t, false).unwrap(),
            gg.encode_prompt(t, false).unwrap(),
            "{name}: encode_prompt({t:?})"
        );
    }
    // Each special token is matched whole (control tokens), and framed by the post-processor.
    for (id, s) in SPECIAL_TOKENS.iter().enumerate() {
        assert_eq!(gg.encode(s, false).unwrap(), vec![id as u32], "{name}: {s}");
        assert_eq!(hf.encode(s, false).unwrap(), vec![id as u32], "{name}: {s}");
    }
    assert!(
        compared > 1000,
        "{name}: only {compared} encodings compared"
    );
}

#[test]
fn shipped_models_exported_to_gguf_carry_their_tokenizer_token_for_token() {
    for (name, suite) in SHIPPED {
        let gguf = export("identity", name);
        let gg = read_tokenizer(&gguf)
            .unwrap()
            .unwrap_or_else(|| panic!("{name}: the export carries no tokenizer"));
        let hf = TextTokenizer::from_file(&model_dir(name).join("tokenizer.json")).unwrap();
        assert_identical(name, &hf, &gg, &corpus(suite));
        assert_eq!(
            gg.chat_template_source(),
            Some(dllm_tasks::export::GGUF_CHAT_TEMPLATE),
            "{name}: the chat template is kept"
        );
        let _ = std::fs::remove_dir_all(gguf.parent().unwrap());
    }
}

#[test]
fn a_gguf_alone_loads_with_its_own_tokenizer() {
    let name = "tiny-dream-long";
    let gguf = export("alone", name);
    let loaded = load(
        &ModelSource::parse(gguf.to_str().unwrap()).unwrap(),
        &LoadOptions::default(),
    )
    .unwrap();
    assert!(loaded.warnings.is_empty(), "{:?}", loaded.warnings);
    let tok = loaded
        .tokenizer
        .expect("no tokenizer.json beside the file: the GGUF's own");
    let hf = TextTokenizer::from_file(&model_dir(name).join("tokenizer.json")).unwrap();
    let q = &test_set(TaskKind::LongMath)[0].prompt;
    assert_eq!(
        tok.encode_prompt(q, false).unwrap(),
        hf.encode_prompt(q, false).unwrap()
    );

    // A tokenizer.json beside the file wins over the metadata; an explicit one over both.
    let other = model_dir("tiny-llada").join("tokenizer.json");
    std::fs::copy(&other, gguf.with_file_name("tokenizer.json")).unwrap();
    let beside = load(
        &ModelSource::parse(gguf.to_str().unwrap()).unwrap(),
        &LoadOptions::default(),
    )
    .unwrap();
    assert_eq!(beside.tokenizer.unwrap().vocab_size(), 913);
    let explicit = load(
        &ModelSource::parse(gguf.to_str().unwrap()).unwrap(),
        &LoadOptions {
            tokenizer: Some(model_dir(name).join("tokenizer.json")),
            ..Default::default()
        },
    )
    .unwrap();
    assert_eq!(explicit.tokenizer.unwrap().vocab_size(), hf.vocab_size());
    let _ = std::fs::remove_dir_all(gguf.parent().unwrap());
}

/// Whether `python3` can import llama.cpp's `gguf`; without it: skipped locally, a failure under
/// `CI=true` (`.ci/install-test-deps` installs it).
fn have_gguf_py() -> bool {
    let ok = Command::new("python3")
        .args(["-c", "import gguf"])
        .output()
        .map(|o| o.status.success())
        .unwrap_or(false);
    if !ok {
        let install = "python3 -m pip install -r dllm-models/tests/gguf_py/requirements.txt";
        if std::env::var("CI").is_ok_and(|v| v == "true" || v == "1") {
            panic!("python3 cannot import gguf and CI=true: run .ci/install-test-deps ({install})");
        }
        eprintln!(
            "SKIPPED: python3 cannot import gguf ({install}; .ci/install-test-deps installs it)"
        );
    }
    ok
}

#[test]
fn the_exports_rewritten_by_gguf_py_keep_their_tokenizer_and_load() {
    if !have_gguf_py() {
        return;
    }
    let script =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../dllm-models/tests/gguf_py/write_gguf.py");
    for (name, suite) in SHIPPED {
        let gguf = export("gguf-py", name);
        let rewritten = gguf.with_file_name("rewritten.gguf");
        let out = Command::new("python3")
            .arg(&script)
            .args([
                "rewrite",
                gguf.to_str().unwrap(),
                rewritten.to_str().unwrap(),
            ])
            .output()
            .expect("run python3");
        assert!(
            out.status.success(),
            "{name}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let gg = read_tokenizer(&rewritten).unwrap().expect("a tokenizer");
        let hf = TextTokenizer::from_file(&model_dir(name).join("tokenizer.json")).unwrap();
        assert_identical(name, &hf, &gg, &corpus(suite));
        std::fs::remove_file(&gguf).unwrap();
        let loaded = load(
            &ModelSource::parse(rewritten.to_str().unwrap()).unwrap(),
            &LoadOptions::default(),
        )
        .unwrap();
        assert!(loaded.tokenizer.is_some(), "{name}");
        let _ = std::fs::remove_dir_all(gguf.parent().unwrap());
    }
}
