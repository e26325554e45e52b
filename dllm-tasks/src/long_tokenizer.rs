//! The long suite's tokenizer: the short suite's, extended.
//!
//! The long suite's model starts from `tiny-llada`'s weights (see `models/tiny-llada-long`), so
//! its tokenizer keeps every id of the short suite's tokenizer (913 tokens) and appends one
//! token per long-suite word the short vocabulary lacks (months, `taller`, `+`, ...). The
//! extension is built the way BPE would have learnt it: every word of a long-suite corpus that
//! the short tokenizer splits into several tokens gets merges appended that join its pieces
//! left to right, after every existing merge. Because every short-suite word is already one
//! token (tested in the short suite), no new merge can change how short-suite text is
//! tokenized: short-suite text gets the same ids from both tokenizers (tested).
//!
//! On top of the short pipeline the long tokenizer adds the line-start normalisation: `\n` is
//! written `\n ` before tokenisation and the decoder undoes it, so the first word of a line is
//! the same token as the word anywhere else.

use std::collections::HashMap;

use serde_json::{json, Value};
use tokenizers::Tokenizer;

use crate::error::{Error, Result};
use crate::tasks::{suite_train_stream, Suite};
use crate::tokenizer::{
    build_suite_tokenizer, check_special_tokens, train_suite_tokenizer, CORPUS_EXAMPLES,
    CORPUS_SEED, DEFAULT_VOCAB_SIZE,
};

/// Fraction of small (training-only) instances in the extension corpus, so their words are
/// covered too.
const CORPUS_SMALL_FRACTION: f64 = 0.5;

fn tok_err(m: impl Into<String>) -> Error {
    Error::InvalidArgument(format!("extending the suite tokenizer: {}", m.into()))
}

/// Splits `word` (byte-level symbols) with `ranks`, as BPE does: repeatedly merge the adjacent
/// pair of lowest rank.
fn bpe(word: &str, ranks: &HashMap<(String, String), usize>) -> Vec<String> {
    let mut parts: Vec<String> = word.chars().map(String::from).collect();
    loop {
        let best = parts
            .windows(2)
            .enumerate()
            .filter_map(|(i, w)| ranks.get(&(w[0].clone(), w[1].clone())).map(|&r| (r, i)))
            .min();
        let Some((_, i)) = best else { return parts };
        let merged = format!("{}{}", parts[i], parts[i + 1]);
        parts.splice(i..i + 2, [merged]);
    }
}

fn merge_pair(m: &Value) -> Result<(String, String)> {
    match m {
        Value::String(s) => s
            .split_once(' ')
            .map(|(a, b)| (a.to_string(), b.to_string()))
            .ok_or_else(|| tok_err(format!("merge {s:?} is not a pair"))),
        Value::Array(p) if p.len() == 2 => match (p[0].as_str(), p[1].as_str()) {
            (Some(a), Some(b)) => Ok((a.to_string(), b.to_string())),
            _ => Err(tok_err(format!("merge {m} is not a pair of strings"))),
        },
        _ => Err(tok_err(format!("merge {m} is not a pair"))),
    }
}

/// The long suite's tokenizer: [`build_suite_tokenizer`]'s vocabulary and merges, then one
/// merge chain per long-suite word it splits (words of a corpus of [`CORPUS_EXAMPLES`] long
/// train-stream examples, half of them small instances, taken in order of first appearance),
/// with the line-start normalisation. Deterministic.
pub fn build_long_suite_tokenizer() -> Result<Tokenizer> {
    let short = build_suite_tokenizer()?;
    let corpus: Vec<String> = suite_train_stream(Suite::Long, CORPUS_SEED)
        .with_small_fraction(CORPUS_SMALL_FRACTION)?
        .take(CORPUS_EXAMPLES)
        .flat_map(|e| [e.prompt, e.response])
        .collect();
    // A throwaway tokenizer with the long pipeline, used only to split the corpus into
    // pre-tokenized words (its own vocabulary is discarded).
    let splitter = train_suite_tokenizer(Suite::Long, DEFAULT_VOCAB_SIZE, corpus.iter().cloned())?;
    let mut words: Vec<String> = Vec::new();
    let mut seen: HashMap<String, usize> = HashMap::new();
    for text in &corpus {
        let enc = splitter.encode(text.as_str(), false)?;
        let mut current: Option<(u32, String)> = None;
        for (tok, wid) in enc.get_tokens().iter().zip(enc.get_word_ids()) {
            let wid = wid.ok_or_else(|| tok_err("a corpus token has no word"))?;
            match &mut current {
                Some((w, s)) if *w == wid => s.push_str(tok),
                _ => {
                    if let Some((_, s)) = current.take() {
                        *seen.entry(s.clone()).or_insert_with(|| {
                            words.push(s);
                            0
                        }) += 1;
                    }
                    current = Some((wid, tok.clone()));
                }
            }
        }
        if let Some((_, s)) = current {
            *seen.entry(s.clone()).or_insert_with(|| {
                words.push(s);
                0
            }) += 1;
        }
    }

    let mut json: Value = serde_json::from_str(&short.to_string(false)?)
        .map_err(|e| tok_err(format!("short tokenizer JSON: {e}")))?;
    let long_json: Value = serde_json::from_str(&splitter.to_string(false)?)
        .map_err(|e| tok_err(format!("long pipeline JSON: {e}")))?;
    let model = json.get_mut("model").ok_or_else(|| tok_err("no model"))?;
    let mut vocab: Vec<(String, u64)> = model["vocab"]
        .as_object()
        .ok_or_else(|| tok_err("no vocab"))?
        .iter()
        .map(|(k, v)| Ok((k.clone(), v.as_u64().ok_or_else(|| tok_err("bad id"))?)))
        .collect::<Result<_>>()?;
    vocab.sort_by_key(|(_, id)| *id);
    let mut known: HashMap<String, u64> = vocab.iter().cloned().collect();
    let mut merges: Vec<(String, String)> = model["merges"]
        .as_array()
        .ok_or_else(|| tok_err("no merges"))?
        .iter()
        .map(merge_pair)
        .collect::<Result<_>>()?;
    let mut ranks: HashMap<(String, String), usize> = merges
        .iter()
        .cloned()
        .enumerate()
        .map(|(i, m)| (m, i))
        .collect();
    // Ids continue after every id in use (specials included).
    let mut next_id = short.get_vocab_size(true) as u64;
    for word in words.iter().filter(|w| seen[*w] >= 2) {
        let mut parts = bpe(word, &ranks);
        while parts.len() > 1 {
            let (a, b) = (parts[0].clone(), parts[1].clone());
            let joined = format!("{a}{b}");
            ranks.insert((a.clone(), b.clone()), merges.len());
            merges.push((a, b));
            if !known.contains_key(&joined) {
                known.insert(joined.clone(), next_id);
                vocab.push((joined.clone(), next_id));
                next_id += 1;
            }
            parts.splice(0..2, [joined]);
        }
    }
    model["vocab"] = Value::Object(vocab.into_iter().map(|(k, id)| (k, json!(id))).collect());
    model["merges"] = Value::Array(merges.into_iter().map(|(a, b)| json!([a, b])).collect());
    json["normalizer"] = long_json["normalizer"].clone();
    json["decoder"] = long_json["decoder"].clone();
    let tok: Tokenizer = json.to_string().parse()?;
    check_special_tokens(&tok)?;
    Ok(tok)
}
