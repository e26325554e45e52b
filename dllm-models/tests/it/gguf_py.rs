//! GGUF vocabularies written by llama.cpp's own tooling: `tests/gguf_py/write_gguf.py` writes them
//! with the `gguf` package (llama.cpp's gguf-py) the way `convert_hf_to_gguf.py` writes LLaDA's and
//! Dream's (`get_vocab_base`, `_set_vocab_gpt2`, `SpecialVocab`), from Hugging Face directories
//! shaped like theirs: a LLaDA-8B-like tokenizer (Ling's split, `<|startoftext|>` added by the
//! post-processor, LLaDA's chat tokens, an embedding padded past the vocabulary) and a Dream-like
//! one (Qwen2's split and NFC, `<|im_start|>` turns, no BOS). The tokenizer rebuilt from each file
//! must be its `tokenizer.json` token for token, and keep the chat template.
//!
//! Needs `python3` with `gguf` (pinned in `tests/gguf_py/requirements.txt`, installed by
//! `.ci/install-test-deps`): skipped without it, a failure under `CI=true`.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use candle_core::quantized::gguf_file::{Content, Value};
use dllm_models::gguf_tokenizer::{read_tokenizer, GgufVocab};
use dllm_models::TextTokenizer;
use tokenizers::decoders::byte_level::ByteLevel as ByteLevelDecoder;
use tokenizers::models::bpe::{BpeTrainer, BPE};
use tokenizers::normalizers::NFC;
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::pre_tokenizers::sequence::Sequence;
use tokenizers::pre_tokenizers::split::{Split, SplitPattern};
use tokenizers::processors::template::TemplateProcessing;
use tokenizers::{
    AddedToken, DecoderWrapper, NormalizerWrapper, PostProcessorWrapper, PreTokenizerWrapper,
    SplitDelimiterBehavior, Tokenizer, TokenizerImpl,
};

const QWEN2_RE: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
const LING_RE: &str = r"'(?i:[sdmt]|ll|ve|re)|[^\r\n\p{L}\p{N}]?+\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]++[\r\n]*|\s*[\r\n]|\s+(?!\S)|\s+";

/// LLaDA-8B-Instruct's chat template (`tokenizer_config.json`).
const LLADA_TEMPLATE: &str = "{% set loop_messages = messages %}{% for message in loop_messages %}{% set content = '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'+ message['content'] | trim + '<|eot_id|>' %}{% if loop.index0 == 0 %}{% set content = bos_token + content %}{% endif %}{{ content }}{% endfor %}{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}";
/// Qwen2's chat template, shortened.
const QWEN_TEMPLATE: &str = "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}";

fn script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/gguf_py/write_gguf.py")
}

/// Whether `python3` can import `gguf`; without it: skipped locally, a failure under `CI=true`.
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

fn run_script(args: &[&str]) {
    let out = Command::new("python3")
        .arg(script())
        .args(args)
        .output()
        .expect("run python3");
    assert!(
        out.status.success(),
        "write_gguf.py {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

fn split(re: &str) -> PreTokenizerWrapper {
    Sequence::new(vec![
        Split::new(
            SplitPattern::Regex(re.into()),
            SplitDelimiterBehavior::Isolated,
            false,
        )
        .unwrap()
        .into(),
        ByteLevel::new(false, false, false).into(),
    ])
    .into()
}

fn corpus(seed: u64, n: usize) -> Vec<String> {
    let words = [
        "What",
        "is",
        "12",
        "+",
        "7",
        "?",
        "The",
        "answer",
        "I'm",
        "don't",
        "WE'LL",
        "naïve",
        "cafe\u{301}",
        "北京",
        "🚀",
        "  ",
        "\n",
        "\n\n",
        "3456",
        "x=y",
        "(a)",
        "--",
        "Привет",
    ];
    let mut s = seed;
    let mut next = || {
        s = s
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (s >> 33) as usize
    };
    (0..n)
        .map(|_| {
            let mut t = String::new();
            for i in 0..1 + next() % 12 {
                if i > 0 && next() % 4 != 0 {
                    t.push(' ');
                }
                t.push_str(words[next() % words.len()]);
            }
            t
        })
        .collect()
}

/// A trained byte-level BPE tokenizer with `specials` (the first `n_special` special, the rest
/// plain added tokens) and an optional BOS post-processor.
fn train(
    split_re: &str,
    nfc: bool,
    specials: &[&str],
    n_special: usize,
    bos: Option<&str>,
) -> Tokenizer {
    let mut trainer = BpeTrainer::builder()
        .vocab_size(500)
        .min_frequency(2)
        .show_progress(false)
        .special_tokens(
            specials[..n_special]
                .iter()
                .map(|s| AddedToken::from(*s, true))
                .collect(),
        )
        .initial_alphabet(ByteLevel::alphabet().into_iter().collect())
        .build();
    let mut tok: TokenizerImpl<
        BPE,
        NormalizerWrapper,
        PreTokenizerWrapper,
        PostProcessorWrapper,
        DecoderWrapper,
    > = TokenizerImpl::new(BPE::default());
    if nfc {
        tok.with_normalizer(Some(NFC)).unwrap();
    }
    tok.with_pre_tokenizer(Some(split(split_re)));
    tok.with_decoder(Some(ByteLevelDecoder::default()));
    let texts = corpus(1, 2000);
    tok.train(&mut trainer, texts.iter()).unwrap();
    tok.add_tokens(
        specials[n_special..]
            .iter()
            .map(|s| AddedToken::from(*s, false)),
    )
    .unwrap();
    if let Some(bos) = bos {
        let id = tok.token_to_id(bos).unwrap();
        tok.with_post_processor(Some(
            TemplateProcessing::builder()
                .try_single(format!("{bos} $A"))
                .unwrap()
                .try_pair(format!("{bos} $A {bos}:1 $B:1"))
                .unwrap()
                .special_tokens(vec![(bos, id)])
                .build()
                .unwrap(),
        ));
    }
    Tokenizer::from(tok)
}

/// An HF directory: tokenizer.json, tokenizer_config.json, config.json (vocab_size padded past
/// the tokenizer, as LLaDA-8B's and Dream-7B's embeddings are).
fn hf_dir(tag: &str, tok: &Tokenizer, tokenizer_config: serde_json::Value, arch: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("gguf-py-{}-{tag}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    tok.save(dir.join("tokenizer.json"), false).unwrap();
    std::fs::write(
        dir.join("tokenizer_config.json"),
        tokenizer_config.to_string(),
    )
    .unwrap();
    let config = serde_json::json!({
        "model_type": arch,
        "vocab_size": tok.get_vocab_size(true) + 37,
    });
    std::fs::write(dir.join("config.json"), config.to_string()).unwrap();
    dir
}

fn assert_identical(what: &str, hf: &TextTokenizer, gg: &TextTokenizer) {
    assert_eq!(hf.template(), gg.template(), "{what}");
    assert_eq!(
        hf.id_bound(),
        gg.id_bound(),
        "{what}: the [PAD] fillers are no tokens"
    );
    for id in 0..hf.id_bound() as u32 + 37 {
        assert_eq!(
            hf.inner().id_to_token(id),
            gg.inner().id_to_token(id),
            "{what}: {id}"
        );
        assert_eq!(
            hf.decode(&[id], true).unwrap(),
            gg.decode(&[id], true).unwrap(),
            "{what}: decode [{id}]"
        );
    }
    let mut texts = corpus(7, 300);
    texts.extend(
        [
            "<|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>",
            "<|im_start|>a<|im_end|>",
            "",
        ]
        .map(String::from),
    );
    for t in &texts {
        for special in [false, true] {
            let ids = hf.encode(t, special).unwrap();
            assert_eq!(
                ids,
                gg.encode(t, special).unwrap(),
                "{what}: encode({t:?}, {special})"
            );
            for skip in [false, true] {
                assert_eq!(
                    hf.decode(&ids, skip).unwrap(),
                    gg.decode(&ids, skip).unwrap(),
                    "{what}: decode of {t:?}"
                );
            }
        }
    }
    let chat = [dllm_models::Message::user("What is 12 + 7?")];
    assert_eq!(
        hf.encode_chat(&chat).unwrap(),
        gg.encode_chat(&chat).unwrap(),
        "{what}"
    );
}

#[test]
fn vocabularies_written_by_llama_cpp_tooling_are_their_tokenizer_json() {
    if !have_gguf_py() {
        return;
    }
    let llada_specials = [
        "<|startoftext|>",
        "<|endoftext|>",
        "<|start_header_id|>",
        "<|end_header_id|>",
        "<|eot_id|>",
        "<|mdm_mask|>",
        "<role>",
    ];
    let llada = train(LING_RE, false, &llada_specials, 6, Some("<|startoftext|>"));
    let dream_specials = [
        "<|endoftext|>",
        "<|im_start|>",
        "<|im_end|>",
        "<|mask|>",
        "<tool_call>",
    ];
    let dream = train(QWEN2_RE, true, &dream_specials, 4, None);
    let cases = [
        (
            "llada",
            "bailingmoe",
            &llada,
            serde_json::json!({
                "tokenizer_class": "PreTrainedTokenizerFast",
                "bos_token": "<|startoftext|>",
                "eos_token": "<|endoftext|>",
                "add_bos_token": true,
                "chat_template": LLADA_TEMPLATE,
            }),
            LLADA_TEMPLATE,
        ),
        (
            "dream",
            "qwen2",
            &dream,
            serde_json::json!({
                "tokenizer_class": "PreTrainedTokenizerFast",
                "bos_token": null,
                "eos_token": "<|endoftext|>",
                "add_bos_token": false,
                "chat_template": QWEN_TEMPLATE,
            }),
            QWEN_TEMPLATE,
        ),
    ];
    for (arch, pre, tok, tokenizer_config, template) in cases {
        let dir = hf_dir(arch, tok, tokenizer_config, arch);
        let gguf = dir.join("vocab.gguf");
        run_script(&[
            "vocab",
            dir.to_str().unwrap(),
            gguf.to_str().unwrap(),
            pre,
            arch,
        ]);
        let gg = read_tokenizer(&gguf).unwrap().expect("a vocabulary");
        let hf = TextTokenizer::from_file(&dir.join("tokenizer.json")).unwrap();
        assert_identical(arch, &hf, &gg);
        assert_eq!(gg.chat_template_source(), Some(template), "{arch}");
        // What the converter's SpecialVocab wrote, as read back.
        let md = gguf_metadata(&gguf);
        let v = GgufVocab::from_metadata(&md).unwrap().unwrap();
        assert_eq!(v.eos, tok.token_to_id("<|endoftext|>"), "{arch}");
        assert_eq!(v.add_bos, arch == "llada", "{arch}");
        assert_eq!(
            v.tokens.len(),
            tok.get_vocab_size(true) + 37,
            "{arch}: padded"
        );
        let _ = std::fs::remove_dir_all(&dir);
    }
}

/// The metadata of a GGUF file, as candle reads it.
fn gguf_metadata(path: &Path) -> HashMap<String, Value> {
    let mut f = std::io::BufReader::new(std::fs::File::open(path).unwrap());
    Content::read(&mut f).unwrap().metadata
}
