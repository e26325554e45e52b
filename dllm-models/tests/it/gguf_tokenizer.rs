//! Tokenizers from GGUF metadata (`dllm_models::gguf_tokenizer`).
//!
//! * Each pre-tokeniser family, written as llama.cpp names it, rebuilds a byte-level BPE
//!   tokenizer built here the way the models of that name spell their `tokenizer.json` (Llama-3's
//!   `llama-bpe`, LLaDA-8B's `bailingmoe`, Dream's `qwen2` with its NFC normaliser, `starcoder`,
//!   `gpt-2`) token for token: encodings with and without specials, special-token text, decoding.
//! * Malformed metadata is an error naming the key; a file without tokenizer metadata has none.
//! * The loader takes the tokenizer from a GGUF's metadata when no `tokenizer.json` is beside it.

use std::collections::HashMap;
use std::path::PathBuf;

use candle_core::quantized::gguf_file::Value;
use candle_core::quantized::GgmlDType;
use dllm_models::gguf_tokenizer::{tokenizer_from_metadata, GgufVocab};
use dllm_models::gguf_write::{tokenizer_metadata, write_gguf};
use dllm_models::synthetic::{random_weights, tiny_llada};
use dllm_models::{load, Error, LoadOptions, ModelSource, TextTokenizer};
use tokenizers::decoders::byte_level::ByteLevel as ByteLevelDecoder;
use tokenizers::models::bpe::{BpeTrainer, BPE};
use tokenizers::normalizers::NFC;
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::pre_tokenizers::digits::Digits;
use tokenizers::pre_tokenizers::sequence::Sequence;
use tokenizers::pre_tokenizers::split::{Split, SplitPattern};
use tokenizers::processors::template::TemplateProcessing;
use tokenizers::{
    AddedToken, DecoderWrapper, NormalizerWrapper, PostProcessorWrapper, PreTokenizerWrapper,
    SplitDelimiterBehavior, Tokenizer, TokenizerImpl,
};

// The split regexes as the models' tokenizer.json files write them.
const LLAMA3_RE: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
const QWEN2_RE: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
const LING_RE: &str = r"'(?i:[sdmt]|ll|ve|re)|[^\r\n\p{L}\p{N}]?+\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]++[\r\n]*|\s*[\r\n]|\s+(?!\S)|\s+";

/// A family as its models' `tokenizer.json` spells it.
struct Family {
    pre: &'static str,
    split: PreTokenizerWrapper,
    nfc: bool,
    ignore_merges: bool,
    specials: &'static [&'static str],
    /// The special the post-processor puts first (and whether the GGUF says `add_bos_token`).
    bos: Option<&'static str>,
    eos: &'static str,
}

fn regex_split(re: &str) -> PreTokenizerWrapper {
    Sequence::new(vec![
        Split::new(
            SplitPattern::Regex(re.into()),
            SplitDelimiterBehavior::Isolated,
            false,
        )
        .unwrap()
        .into(),
        ByteLevel::new(false, true, false).into(),
    ])
    .into()
}

fn families() -> Vec<Family> {
    vec![
        Family {
            pre: "llama-bpe",
            split: regex_split(LLAMA3_RE),
            nfc: false,
            ignore_merges: true,
            specials: &[
                "<|begin_of_text|>",
                "<|end_of_text|>",
                "<|start_header_id|>",
                "<|end_header_id|>",
                "<|eot_id|>",
            ],
            bos: Some("<|begin_of_text|>"),
            eos: "<|end_of_text|>",
        },
        Family {
            pre: "bailingmoe",
            split: regex_split(LING_RE),
            nfc: false,
            ignore_merges: false,
            specials: &[
                "<|startoftext|>",
                "<|endoftext|>",
                "<|start_header_id|>",
                "<|end_header_id|>",
                "<|eot_id|>",
                "<|mdm_mask|>",
            ],
            bos: Some("<|startoftext|>"),
            eos: "<|endoftext|>",
        },
        Family {
            pre: "qwen2",
            split: regex_split(QWEN2_RE),
            nfc: true,
            ignore_merges: false,
            specials: &["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|mask|>"],
            bos: None,
            eos: "<|endoftext|>",
        },
        Family {
            pre: "starcoder",
            split: Sequence::new(vec![
                Digits::new(true).into(),
                ByteLevel::new(false, true, true).into(),
            ])
            .into(),
            nfc: false,
            ignore_merges: false,
            specials: &["<|endoftext|>", "<fim_prefix>"],
            bos: None,
            eos: "<|endoftext|>",
        },
        Family {
            pre: "gpt-2",
            split: ByteLevel::new(false, true, true).into(),
            nfc: false,
            ignore_merges: false,
            specials: &["<|endoftext|>"],
            bos: Some("<|endoftext|>"),
            eos: "<|endoftext|>",
        },
    ]
}

/// Deterministic text with what pre-tokenisers disagree on: digit runs, contractions in both
/// cases, runs of spaces and newlines, punctuation, accents (composed and not), CJK, emoji.
fn text(seed: u64, n: usize) -> Vec<String> {
    let words = [
        "the",
        "apple",
        "Tom",
        "buys",
        "more",
        "how",
        "many",
        "I'm",
        "we'VE",
        "he's",
        "THEY'LL",
        "naïve",
        "cafe\u{301}",
        "café",
        "北京",
        "東京タワー",
        "🚀",
        "🦙🦙",
        "12",
        "3456",
        "7",
        "1,234.50",
        "--",
        "==>",
        "?!",
        "(x)",
        "don't",
        "it'S",
        "\t",
        "  ",
        "\n",
        "\n\n",
        " \n ",
        "\r\n",
        "Привет",
        "мир",
        "αβγ",
        "x=y+z",
        "<tag>",
        "a_b",
        "CamelCase",
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
            let len = 1 + next() % 14;
            let mut t = String::new();
            for i in 0..len {
                if i > 0 && next() % 3 != 0 {
                    t.push(' ');
                }
                t.push_str(words[next() % words.len()]);
            }
            t
        })
        .collect()
}

/// A byte-level BPE tokenizer trained here, with `f`'s pipeline.
fn hf_tokenizer(f: &Family) -> Tokenizer {
    let mut trainer = BpeTrainer::builder()
        .vocab_size(600)
        .min_frequency(2)
        .show_progress(false)
        .special_tokens(
            f.specials
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
    if f.nfc {
        tok.with_normalizer(Some(NFC)).unwrap();
    }
    tok.with_pre_tokenizer(Some(f.split.clone()));
    tok.with_decoder(Some(ByteLevelDecoder::default()));
    let corpus = text(1, 3000);
    tok.train(&mut trainer, corpus.iter()).unwrap();
    if let Some(bos) = f.bos {
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
    // `ignore_merges` is a model option the trainer does not set.
    let mut json: serde_json::Value = serde_json::from_str(&tok.to_string(false).unwrap()).unwrap();
    json["model"]["ignore_merges"] = serde_json::Value::Bool(f.ignore_merges);
    json.to_string().parse().unwrap()
}

/// `tok` as GGUF metadata, as the converter writes it (special ids included).
fn metadata(tok: &Tokenizer, f: &Family) -> HashMap<String, Value> {
    let mut md: HashMap<String, Value> = tokenizer_metadata(tok, f.pre, f.bos.is_some())
        .unwrap()
        .into_iter()
        .collect();
    md.insert(
        "tokenizer.ggml.eos_token_id".into(),
        Value::U32(tok.token_to_id(f.eos).unwrap()),
    );
    if let Some(bos) = f.bos {
        md.insert(
            "tokenizer.ggml.bos_token_id".into(),
            Value::U32(tok.token_to_id(bos).unwrap()),
        );
    }
    md
}

/// `gg` gives `hf`'s ids, pieces and text on `texts`.
fn assert_identical(what: &str, hf: &TextTokenizer, gg: &TextTokenizer, texts: &[String]) {
    assert_eq!(hf.vocab_size(), gg.vocab_size(), "{what}: vocabulary");
    assert_eq!(hf.template(), gg.template(), "{what}: chat template");
    for id in 0..hf.id_bound() as u32 {
        assert_eq!(
            hf.inner().id_to_token(id),
            gg.inner().id_to_token(id),
            "{what}: {id}"
        );
    }
    for t in texts {
        for special in [false, true] {
            let ids = hf.encode(t, special).unwrap();
            assert_eq!(
                ids,
                gg.encode(t, special).unwrap(),
                "{what}: encode({t:?}, {special})"
            );
            assert_eq!(
                hf.encode_user_text(t, special).unwrap(),
                gg.encode_user_text(t, special).unwrap(),
                "{what}: encode_user_text({t:?}, {special})"
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
}

#[test]
fn each_pre_tokenizer_family_rebuilds_its_tokenizer_json_token_for_token() {
    let mut texts = text(2, 400);
    for f in families() {
        for s in f.specials {
            texts.push(format!("a{s}b {s} 12{s}"));
        }
    }
    for f in families() {
        let tok = hf_tokenizer(&f);
        let gg = tokenizer_from_metadata(&metadata(&tok, &f))
            .unwrap()
            .expect("tokenizer metadata");
        let hf = TextTokenizer::new(tok);
        assert_identical(f.pre, &hf, &gg, &texts);
        // Specials are matched whole in text and framed by the post-processor as the file says.
        let first = hf.token_id(f.specials[0]).unwrap();
        assert_eq!(
            gg.encode(f.specials[0], false).unwrap(),
            vec![first],
            "{}",
            f.pre
        );
        let with = gg.encode("hello", true).unwrap();
        match f.bos {
            Some(b) => assert_eq!(with[0], gg.token_id(b).unwrap(), "{}", f.pre),
            None => assert_eq!(with, gg.encode("hello", false).unwrap(), "{}", f.pre),
        }
    }
}

#[test]
fn the_pre_tokenizer_name_decides_the_split() {
    // The same vocabulary under another family's name splits digits differently: the name is
    // not decoration.
    let f = &families()[0];
    let tok = hf_tokenizer(f);
    let mut md = metadata(&tok, f);
    let llama = tokenizer_from_metadata(&md).unwrap().unwrap();
    md.insert("tokenizer.ggml.pre".into(), Value::String("qwen2".into()));
    let qwen = tokenizer_from_metadata(&md).unwrap().unwrap();
    let digits = "3456 1,234.50";
    assert_ne!(
        llama.encode(digits, false).unwrap(),
        qwen.encode(digits, false).unwrap()
    );
    // Qwen2's NFC: a decomposed accent is the composed one.
    assert_eq!(
        qwen.encode("cafe\u{301}", false).unwrap(),
        qwen.encode("café", false).unwrap()
    );
}

/// Valid metadata to break: the `llama-bpe` family's.
fn valid() -> HashMap<String, Value> {
    let f = &families()[0];
    metadata(&hf_tokenizer(f), f)
}

/// The error of `md` with `edit` applied.
fn error_after(edit: impl FnOnce(&mut HashMap<String, Value>)) -> Error {
    let mut md = valid();
    edit(&mut md);
    match tokenizer_from_metadata(&md) {
        Ok(_) => panic!("accepted"),
        Err(e) => e,
    }
}

fn array_mut<'a>(md: &'a mut HashMap<String, Value>, key: &str) -> &'a mut Vec<Value> {
    match md.get_mut(key) {
        Some(Value::Array(a)) => a,
        _ => panic!("{key} is not an array"),
    }
}

#[test]
fn malformed_tokenizer_metadata_is_an_error_naming_the_key() {
    const TOKENS: &str = "tokenizer.ggml.tokens";
    const TYPES: &str = "tokenizer.ggml.token_type";
    const MERGES: &str = "tokenizer.ggml.merges";
    type Edit = Box<dyn FnOnce(&mut HashMap<String, Value>)>;
    let set = |k: &'static str, v: Value| -> Edit {
        Box::new(move |md| {
            md.insert(k.into(), v);
        })
    };
    let cases: Vec<(&str, Edit, &str)> = vec![
        ("tokens not an array", set(TOKENS, Value::U32(3)), TOKENS),
        (
            "a token that is no string",
            Box::new(|md| array_mut(md, TOKENS)[7] = Value::I32(7)),
            TOKENS,
        ),
        (
            "an empty token",
            Box::new(|md| array_mut(md, TOKENS)[7] = Value::String(String::new())),
            TOKENS,
        ),
        (
            "a repeated token",
            Box::new(|md| {
                let t = array_mut(md, TOKENS);
                t[8] = t[7].clone();
            }),
            TOKENS,
        ),
        (
            "an empty vocabulary",
            set(TOKENS, Value::Array(vec![])),
            TOKENS,
        ),
        (
            "fewer types than tokens",
            Box::new(|md| {
                array_mut(md, TYPES).pop();
            }),
            TYPES,
        ),
        (
            "types of another integer type",
            Box::new(|md| array_mut(md, TYPES)[3] = Value::U32(1)),
            TYPES,
        ),
        (
            "a type llama.cpp does not have",
            Box::new(|md| array_mut(md, TYPES)[3] = Value::I32(9)),
            TYPES,
        ),
        (
            "a merge of a token that does not exist",
            Box::new(|md| array_mut(md, MERGES)[0] = Value::String("Ġapple zzzz".into())),
            MERGES,
        ),
        (
            "a merge that is not a pair",
            Box::new(|md| array_mut(md, MERGES)[0] = Value::String("abc".into())),
            MERGES,
        ),
        (
            "a merge whose result is not a token",
            Box::new(|md| array_mut(md, MERGES)[0] = Value::String("~ ~".into())),
            MERGES,
        ),
        (
            "merges missing",
            Box::new(|md| drop(md.remove(MERGES))),
            MERGES,
        ),
        (
            "a BOS id past the vocabulary",
            set("tokenizer.ggml.bos_token_id", Value::U32(100_000)),
            "tokenizer.ggml.bos_token_id",
        ),
        (
            "a negative EOS id",
            set("tokenizer.ggml.eos_token_id", Value::I32(-1)),
            "tokenizer.ggml.eos_token_id",
        ),
        (
            "a mask id past the vocabulary",
            set("tokenizer.ggml.mask_token_id", Value::U64(1 << 40)),
            "tokenizer.ggml.mask_token_id",
        ),
        (
            "an id that is a string",
            set("tokenizer.ggml.padding_token_id", Value::String("0".into())),
            "tokenizer.ggml.padding_token_id",
        ),
        (
            "add_bos_token that is not a bool",
            set("tokenizer.ggml.add_bos_token", Value::U8(1)),
            "tokenizer.ggml.add_bos_token",
        ),
        (
            "add_sep_token without a separator id",
            set("tokenizer.ggml.add_sep_token", Value::Bool(true)),
            "tokenizer.ggml.add_sep_token",
        ),
        (
            "an unknown pre-tokenizer",
            set("tokenizer.ggml.pre", Value::String("tekken".into())),
            "tokenizer.ggml.pre",
        ),
        (
            "no pre-tokenizer",
            Box::new(|md| drop(md.remove("tokenizer.ggml.pre"))),
            "tokenizer.ggml.pre",
        ),
        (
            "a SentencePiece vocabulary",
            set("tokenizer.ggml.model", Value::String("llama".into())),
            "tokenizer.ggml.model",
        ),
        (
            "tokens without a model",
            Box::new(|md| drop(md.remove("tokenizer.ggml.model"))),
            "tokenizer.ggml.model",
        ),
        (
            "a chat template that is not text",
            set("tokenizer.chat_template", Value::Bool(true)),
            "tokenizer.chat_template",
        ),
    ];
    // Well-formed metadata this crate cannot build a tokenizer from is told apart from malformed.
    let unsupported = [
        "an unknown pre-tokenizer",
        "no pre-tokenizer",
        "a SentencePiece vocabulary",
    ];
    for (what, edit, key) in cases {
        let e = error_after(edit);
        let msg = e.to_string();
        assert!(msg.contains(key), "{what}: `{msg}` does not name {key}");
        if unsupported.contains(&what) {
            assert!(
                matches!(e, Error::UnsupportedTokenizer { .. }),
                "{what}: {e:?}"
            );
        } else {
            assert!(
                matches!(e, Error::InvalidField { .. } | Error::MissingField { .. }),
                "{what}: {e:?}"
            );
        }
    }
    // Without any tokenizer key there is no tokenizer, and no error.
    let mut md = valid();
    md.retain(|k, _| !k.starts_with("tokenizer."));
    md.insert("general.architecture".into(), Value::String("llada".into()));
    assert!(GgufVocab::from_metadata(&md).unwrap().is_none());
}

/// A tiny LLaDA written as GGUF with `tok` as its metadata, in a directory of its own.
fn gguf_with(
    tag: &str,
    tok: &Tokenizer,
    f: &Family,
    edit: impl FnOnce(&mut Vec<(String, Value)>),
) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("gguf-tok-load-{}-{tag}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let mut cfg = tiny_llada();
    cfg.vocab_size = tok.get_vocab_size(true);
    cfg.special.mask = tok.token_to_id(f.specials[5]).unwrap();
    cfg.special.eos = tok.token_to_id(f.eos).unwrap();
    cfg.special.bos = f.bos.and_then(|b| tok.token_to_id(b));
    cfg.special.pad = None;
    let mut extra: Vec<(String, Value)> = tokenizer_metadata(tok, f.pre, true).unwrap();
    edit(&mut extra);
    let path = dir.join("model.gguf");
    let w = random_weights(&cfg, 3).unwrap();
    write_gguf(&path, &cfg, &w, GgmlDType::F32, &extra).unwrap();
    path
}

#[test]
fn the_loader_takes_the_tokenizer_from_the_gguf_and_names_bad_metadata() {
    let f = &families()[1]; // LLaDA-8B's family
    let tok = hf_tokenizer(f);
    let path = gguf_with("ok", &tok, f, |_| {});
    let source = ModelSource::parse(path.to_str().unwrap()).unwrap();
    let loaded = load(&source, &LoadOptions::default()).unwrap();
    let gg = loaded.tokenizer.expect("the GGUF's own tokenizer");
    assert_identical(f.pre, &TextTokenizer::new(tok.clone()), &gg, &text(9, 50));
    assert!(
        gg.has_chat_template(),
        "LLaDA's headers are in the vocabulary"
    );

    let bad = gguf_with("bad", &tok, f, |md| {
        for (k, v) in md.iter_mut() {
            if k == "tokenizer.ggml.merges" {
                if let Value::Array(a) = v {
                    a[2] = Value::String("Ġnot_a_token Ġx".into());
                }
            }
        }
    });
    let e = load(
        &ModelSource::parse(bad.to_str().unwrap()).unwrap(),
        &LoadOptions::default(),
    )
    .unwrap_err()
    .to_string();
    assert!(
        e.contains("tokenizer.ggml.merges") && e.contains(bad.to_str().unwrap()),
        "{e}"
    );
    // Unsupported (well-formed) metadata: the model loads without a tokenizer, and says why.
    let tekken = gguf_with("tekken", &tok, f, |md| {
        for (k, v) in md.iter_mut() {
            if k == "tokenizer.ggml.pre" {
                *v = Value::String("tekken".into());
            }
        }
    });
    let loaded = load(
        &ModelSource::parse(tekken.to_str().unwrap()).unwrap(),
        &LoadOptions::default(),
    )
    .unwrap();
    assert!(loaded.tokenizer.is_none());
    assert!(
        loaded
            .warnings
            .iter()
            .any(|w| w.contains("tokenizer.ggml.pre") && w.contains("tekken")),
        "{:?}",
        loaded.warnings
    );
    // An explicit tokenizer is used instead, and the bad metadata is not read.
    let json = bad.with_file_name("explicit.json");
    tok.save(&json, false).unwrap();
    let loaded = load(
        &ModelSource::parse(bad.to_str().unwrap()).unwrap(),
        &LoadOptions {
            tokenizer: Some(json),
            ..Default::default()
        },
    )
    .unwrap();
    assert!(loaded.tokenizer.is_some());
    for p in [path, bad, tekken] {
        let _ = std::fs::remove_dir_all(p.parent().unwrap());
    }
}
