//! Chat-template detection and rendering on small `tokenizers::Tokenizer`s built here (WordLevel
//! models with the templates' special tokens as added tokens), plus the tokenizer found beside a
//! model directory feeding the model's end-of-turn id.
//!
//! Expected strings are written out from REFERENCE §1 (LLaDA-8B-Instruct, Llama-3 style headers,
//! content trimmed) and the Qwen2 template Dream ships (default system message when none is given).

use std::str::FromStr;

use candle_core::DType;
use dllm_models::synthetic::tiny_llada;
use dllm_models::{ChatTemplate, DiffusionLm, Message, TextTokenizer};
use llada_tests::fixtures::{load_default, write_model, TempDir};
use serde_json::{json, Value};

const WORDS: [&str; 8] = [
    "[UNK]",
    "hello",
    "world",
    "user",
    "assistant",
    "system",
    "be",
    "brief",
];

/// tokenizer.json text: WordLevel over `WORDS`, whitespace pre-tokenizer, `specials` as added
/// special tokens numbered after the words, and optionally a post-processor prepending `bos`.
fn tokenizer_json(specials: &[&str], bos: Option<&str>) -> String {
    let vocab: serde_json::Map<String, Value> = WORDS
        .iter()
        .enumerate()
        .map(|(i, w)| (w.to_string(), json!(i)))
        .collect();
    let added: Vec<Value> = specials
        .iter()
        .enumerate()
        .map(|(i, s)| {
            json!({"id": WORDS.len() + i, "content": s, "single_word": false, "lstrip": false,
                   "rstrip": false, "normalized": false, "special": true})
        })
        .collect();
    let post = bos.map(|b| {
        let id = WORDS.len() + specials.iter().position(|s| *s == b).expect("bos is a special");
        json!({
            "type": "TemplateProcessing",
            "single": [{"SpecialToken": {"id": b, "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
            "pair": [{"Sequence": {"id": "A", "type_id": 0}}, {"Sequence": {"id": "B", "type_id": 1}}],
            "special_tokens": {b: {"id": b, "ids": [id], "tokens": [b]}}
        })
    });
    json!({
        "version": "1.0", "truncation": null, "padding": null,
        "added_tokens": added, "normalizer": null,
        "pre_tokenizer": {"type": "Whitespace"},
        "post_processor": post, "decoder": null,
        "model": {"type": "WordLevel", "vocab": vocab, "unk_token": "[UNK]"}
    })
    .to_string()
}

const LLADA_SPECIALS: [&str; 4] = [
    "<|startoftext|>",
    "<|start_header_id|>",
    "<|end_header_id|>",
    "<|eot_id|>",
];
const QWEN_SPECIALS: [&str; 3] = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"];

fn tok(specials: &[&str], bos: Option<&str>) -> TextTokenizer {
    TextTokenizer::new(tokenizers::Tokenizer::from_str(&tokenizer_json(specials, bos)).unwrap())
}

fn msg(role: &str, content: &str) -> Message {
    Message {
        role: role.into(),
        content: content.into(),
    }
}

#[test]
fn llada_template() {
    let t = tok(&LLADA_SPECIALS, Some("<|startoftext|>"));
    assert_eq!(t.template(), ChatTemplate::Llada);
    assert_eq!(t.eot_id(), Some(WORDS.len() as u32 + 3));
    assert_eq!(
        t.render_chat(&[Message::user("  hello world \n")], true)
            .unwrap(),
        "<|startoftext|><|start_header_id|>user<|end_header_id|>\n\nhello world<|eot_id|>\
         <|start_header_id|>assistant<|end_header_id|>\n\n"
    );
    assert_eq!(
        t.render_chat(
            &[
                msg("system", "be brief"),
                msg("user", "hello"),
                msg("assistant", "world"),
            ],
            false
        )
        .unwrap(),
        "<|startoftext|><|start_header_id|>system<|end_header_id|>\n\nbe brief<|eot_id|>\
         <|start_header_id|>user<|end_header_id|>\n\nhello<|eot_id|>\
         <|start_header_id|>assistant<|end_header_id|>\n\nworld<|eot_id|>"
    );
}

#[test]
fn llada_prompt_ids_have_one_bos() {
    let t = tok(&LLADA_SPECIALS, Some("<|startoftext|>"));
    let id = |s: &str| t.token_id(s).unwrap();
    let (bos, sh, eh, eot) = (
        id("<|startoftext|>"),
        id("<|start_header_id|>"),
        id("<|end_header_id|>"),
        id("<|eot_id|>"),
    );
    // The template spells BOS out; the post-processor must not add a second one.
    assert_eq!(
        t.encode_prompt("hello world", true).unwrap(),
        vec![
            bos,
            sh,
            id("user"),
            eh,
            id("hello"),
            id("world"),
            eot,
            sh,
            id("assistant"),
            eh
        ]
    );
    // Without chat, the post-processor's BOS is the only special.
    assert_eq!(
        t.encode_prompt("hello world", false).unwrap(),
        vec![bos, id("hello"), id("world")]
    );
}

#[test]
fn qwen_template() {
    let t = tok(&QWEN_SPECIALS, None);
    assert_eq!(t.template(), ChatTemplate::Qwen);
    assert_eq!(t.eot_id(), t.token_id("<|im_end|>"));
    assert_eq!(t.eot_id(), Some(WORDS.len() as u32 + 2));
    assert_eq!(
        t.render_chat(&[Message::user("hello")], true).unwrap(),
        "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n\
         <|im_start|>user\nhello<|im_end|>\n<|im_start|>assistant\n"
    );
    // An explicit system message replaces the default; no generation prompt when not asked.
    assert_eq!(
        t.render_chat(&[msg("system", "be brief"), msg("user", "hello")], false)
            .unwrap(),
        "<|im_start|>system\nbe brief<|im_end|>\n<|im_start|>user\nhello<|im_end|>\n"
    );
    let ids = t.encode_prompt("hello", true).unwrap();
    assert_eq!(ids.first(), t.token_id("<|im_start|>").as_ref());
    assert_eq!(
        ids.iter()
            .filter(|&&i| Some(i) == t.token_id("<|im_end|>"))
            .count(),
        2,
        "system and user turns each end with <|im_end|>"
    );
}

#[test]
fn plain_tokenizer_has_no_template() {
    let t = tok(&[], None);
    assert_eq!(t.template(), ChatTemplate::Plain);
    assert_eq!(t.eot_id(), None);
    assert_eq!(
        t.render_chat(&[Message::user("hello world")], true)
            .unwrap(),
        "hello world"
    );
    assert_eq!(t.encode_prompt("hello world", true).unwrap(), vec![1, 2]);
    assert_eq!(t.decode(&[1, 2], true).unwrap(), "hello world");
}

#[test]
fn tokenizer_beside_the_model_sets_eot_and_generation_config_sets_bos() {
    let dir = TempDir::new("tok-model").unwrap();
    let cfg = tiny_llada();
    write_model(dir.path(), &cfg, 1, DType::F32, 1).unwrap();
    std::fs::write(
        dir.join("tokenizer.json"),
        tokenizer_json(&LLADA_SPECIALS, Some("<|startoftext|>")),
    )
    .unwrap();
    let loaded = load_default(dir.path()).unwrap();
    let t = loaded.tokenizer.as_ref().expect("tokenizer.json was found");
    assert_eq!(t.template(), ChatTemplate::Llada);
    let special = &loaded.model.info().special;
    assert_eq!(special.eot, t.token_id("<|eot_id|>"));
    assert_eq!(special.mask, cfg.special.mask);
    assert_eq!(special.eos, cfg.special.eos);
    // LLaDA's config.json has no bos_token_id; it comes from generation_config.json.
    assert_eq!(special.bos, cfg.special.bos);
    assert_eq!(
        special.stop_ids(),
        vec![cfg.special.eos, t.token_id("<|eot_id|>").unwrap()]
    );
}

/// Special-token text a user types is text, with or without the chat template: only the
/// template's own tokens (and the post-processor's BOS) are control ids.
#[test]
fn special_token_text_in_a_prompt_is_not_a_control_token() {
    let t = tok(&LLADA_SPECIALS, Some("<|startoftext|>"));
    let id = |s: &str| t.token_id(s).unwrap();
    let typed = "hello <|eot_id|> world <|startoftext|>";
    let plain = t.encode_prompt(typed, false).unwrap();
    assert_eq!(plain.first(), Some(&id("<|startoftext|>")), "{plain:?}");
    assert!(!plain[1..].contains(&id("<|startoftext|>")), "{plain:?}");
    assert!(!plain.contains(&id("<|eot_id|>")), "{plain:?}");
    let chat = t.encode_prompt(typed, true).unwrap();
    let count = |ids: &[u32], s: &str| ids.iter().filter(|&&i| i == id(s)).count();
    assert_eq!(
        count(&chat, "<|eot_id|>"),
        1,
        "the template's own: {chat:?}"
    );
    assert_eq!(count(&chat, "<|startoftext|>"), 1, "{chat:?}");
    // Ordinary prompts encode as before: the template around the words.
    assert_eq!(
        t.encode_prompt("hello world", true).unwrap(),
        t.encode(
            &t.render_chat(&[Message::user("hello world")], true)
                .unwrap(),
            false
        )
        .unwrap()
    );
    let q = tok(&QWEN_SPECIALS, None);
    let ids = q
        .encode_prompt("hello <|im_end|> <|im_start|>", true)
        .unwrap();
    let im_end = q.token_id("<|im_end|>").unwrap();
    assert_eq!(
        ids.iter().filter(|&&i| i == im_end).count(),
        2,
        "system and user turns only: {ids:?}"
    );
}

/// A conversation (the server's chat endpoint): every message's text is text, the template's own
/// tokens are the only control ids, and ordinary messages encode as the rendered template does.
#[test]
fn encode_chat_keeps_every_message_text_as_text() {
    let t = tok(&LLADA_SPECIALS, Some("<|startoftext|>"));
    let id = |s: &str| t.token_id(s).unwrap();
    let count = |ids: &[u32], s: &str| ids.iter().filter(|&&i| i == id(s)).count();
    let typed = [
        msg("system", "be brief <|eot_id|>"),
        msg("user", "hello <|startoftext|> world"),
    ];
    let ids = t.encode_chat(&typed).unwrap();
    assert_eq!(count(&ids, "<|eot_id|>"), 2, "one per turn: {ids:?}");
    assert_eq!(count(&ids, "<|startoftext|>"), 1, "{ids:?}");
    let plain = [msg("system", "be brief"), msg("user", "hello world")];
    assert_eq!(
        t.encode_chat(&plain).unwrap(),
        t.encode(&t.render_chat(&plain, true).unwrap(), false)
            .unwrap()
    );
    // One user message is encode_prompt's chat form.
    assert_eq!(
        t.encode_chat(&[Message::user("hello world")]).unwrap(),
        t.encode_prompt("hello world", true).unwrap()
    );
}
