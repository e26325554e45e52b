//! A tokenizer built from a GGUF file's own `tokenizer.ggml.*` metadata, so a `.gguf` alone is a
//! complete model (llama.cpp users receive models that way).
//!
//! Supported: `tokenizer.ggml.model = "gpt2"` (byte-level BPE, what llama.cpp's converter writes
//! for LLaDA and Dream). The keys read, and what each becomes in the `tokenizers` pipeline:
//!
//! * `tokenizer.ggml.tokens` (id = index) and `tokenizer.ggml.merges` (`"a b"`, in rank order):
//!   the BPE model; `tokenizer.ggml.token_type`: `CONTROL` tokens (3) become special added tokens
//!   (matched whole in text, dropped by `decode(.., skip_special = true)`), `USER_DEFINED` (4)
//!   added tokens matched in the raw text, `UNUSED` (5, the converter's `[PAD{id}]` fillers) no
//!   token at all (they decode to nothing, as ids outside a `tokenizer.json` do); the others are
//!   ordinary vocabulary;
//! * `tokenizer.ggml.pre`: the splitting rules ([`crate::gguf_pretok`]);
//! * `tokenizer.ggml.add_bos_token`, `add_sep_token`, `add_eos_token`: the post-processor
//!   (`encode(text, add_special = true)` gives `[bos] text [sep] [eos]`); a pair of texts is
//!   framed the same way, each on its own (GGUF has no pair template);
//! * `tokenizer.ggml.add_space_prefix`: one space before the text (a normaliser) and one leading
//!   space removed when decoding, as llama.cpp's detokeniser does;
//! * `tokenizer.llada_rs.space_after_newline` (this project's key, written by the task suite's
//!   export): every `\n` is followed by a space before tokenisation, and decoding removes it;
//! * `tokenizer.chat_template`: kept as text ([`TextTokenizer::chat_template_source`]); prompts
//!   are framed by the template detected from the vocabulary ([`crate::tokenizer`]).
//!
//! Every key is checked, and a malformed one is an error naming it: wrong types, lengths that
//! disagree, empty or repeated tokens, merges that are not two tokens or whose parts or result
//! are not tokens, special ids (`tokenizer.ggml.*_token_id`) outside the vocabulary, an
//! `add_*_token` without its id. Well-formed metadata this module cannot build — another
//! `tokenizer.ggml.model` (SentencePiece `llama`, ...), an unknown or missing
//! `tokenizer.ggml.pre` — is [`Error::UnsupportedTokenizer`], naming the key: never a guess that
//! would tokenise some text differently from the model's training. The loader then loads the
//! model without a tokenizer and says why in `LoadedModel::warnings` (a prompt given as ids
//! still runs).

use std::collections::HashMap;
use std::path::Path;

use candle_core::quantized::gguf_file::Value;
use tokenizers::decoders::byte_level::ByteLevel as ByteLevelDecoder;
use tokenizers::decoders::sequence::Sequence as DecoderSequence;
use tokenizers::decoders::strip::Strip;
use tokenizers::models::bpe::BPE;
use tokenizers::normalizers::{Prepend, Replace, Sequence as NormalizerSequence};
use tokenizers::processors::template::{SpecialToken, TemplateProcessing};
use tokenizers::{
    AddedToken, DecoderWrapper, NormalizerWrapper, PostProcessorWrapper, PreTokenizerWrapper,
    Tokenizer, TokenizerImpl,
};

use crate::gguf_pretok::{PreTokenizer, KNOWN};
use crate::tokenizer::TextTokenizer;
use crate::{Error, Result};

/// `tokenizer.ggml.model`.
pub const KEY_MODEL: &str = "tokenizer.ggml.model";
/// `tokenizer.ggml.pre`.
pub const KEY_PRE: &str = "tokenizer.ggml.pre";
/// `tokenizer.ggml.tokens`.
pub const KEY_TOKENS: &str = "tokenizer.ggml.tokens";
/// `tokenizer.ggml.token_type`.
pub const KEY_TOKEN_TYPE: &str = "tokenizer.ggml.token_type";
/// `tokenizer.ggml.merges`.
pub const KEY_MERGES: &str = "tokenizer.ggml.merges";
/// `tokenizer.ggml.add_bos_token`.
pub const KEY_ADD_BOS: &str = "tokenizer.ggml.add_bos_token";
/// `tokenizer.ggml.add_eos_token`.
pub const KEY_ADD_EOS: &str = "tokenizer.ggml.add_eos_token";
/// `tokenizer.ggml.add_sep_token`.
pub const KEY_ADD_SEP: &str = "tokenizer.ggml.add_sep_token";
/// `tokenizer.ggml.add_space_prefix`.
pub const KEY_ADD_SPACE_PREFIX: &str = "tokenizer.ggml.add_space_prefix";
/// `tokenizer.llada_rs.space_after_newline`: this project's key for a `\n` -> `\n ` normaliser
/// (undone when decoding), which llama.cpp's keys cannot express.
pub const KEY_SPACE_AFTER_NEWLINE: &str = "tokenizer.llada_rs.space_after_newline";
/// `tokenizer.chat_template`.
pub const KEY_CHAT_TEMPLATE: &str = "tokenizer.chat_template";
/// `tokenizer.ggml.bos_token_id`.
pub const KEY_BOS: &str = "tokenizer.ggml.bos_token_id";
/// `tokenizer.ggml.eos_token_id`.
pub const KEY_EOS: &str = "tokenizer.ggml.eos_token_id";
/// `tokenizer.ggml.seperator_token_id` (llama.cpp's spelling).
pub const KEY_SEP: &str = "tokenizer.ggml.seperator_token_id";

/// llama.cpp's token types (`tokenizer.ggml.token_type`).
pub mod token_type {
    /// No type given.
    pub const UNDEFINED: i32 = 0;
    /// An ordinary token.
    pub const NORMAL: i32 = 1;
    /// The unknown token.
    pub const UNKNOWN: i32 = 2;
    /// A control (special) token.
    pub const CONTROL: i32 = 3;
    /// A token added by the user (matched in text, not special).
    pub const USER_DEFINED: i32 = 4;
    /// An id with no token (converters fill holes of the vocabulary with these).
    pub const UNUSED: i32 = 5;
    /// A byte token (SentencePiece byte fallback).
    pub const BYTE: i32 = 6;
}

/// The tokenizer metadata of a GGUF file, read and checked.
#[derive(Debug, Clone)]
pub struct GgufVocab {
    /// `tokenizer.ggml.pre`.
    pub pre: String,
    /// `tokenizer.ggml.tokens`, index = id.
    pub tokens: Vec<String>,
    /// `tokenizer.ggml.token_type` (all `NORMAL` when absent).
    pub types: Vec<i32>,
    /// `tokenizer.ggml.merges`, split into their two parts, in rank order.
    pub merges: Vec<(String, String)>,
    /// BOS id.
    pub bos: Option<u32>,
    /// EOS id.
    pub eos: Option<u32>,
    /// Separator id.
    pub sep: Option<u32>,
    /// `add_bos_token` (default: the pre-tokeniser's, as llama.cpp).
    pub add_bos: bool,
    /// `add_eos_token` (default false).
    pub add_eos: bool,
    /// `add_sep_token` (default false).
    pub add_sep: bool,
    /// `add_space_prefix` (default false).
    pub add_space_prefix: bool,
    /// `tokenizer.llada_rs.space_after_newline` (default false).
    pub space_after_newline: bool,
    /// `tokenizer.chat_template`.
    pub chat_template: Option<String>,
}

/// Metadata lookups whose errors name the key.
struct Md<'a>(&'a HashMap<String, Value>);

fn type_name(v: &Value) -> &'static str {
    match v {
        Value::U8(_) => "u8",
        Value::I8(_) => "i8",
        Value::U16(_) => "u16",
        Value::I16(_) => "i16",
        Value::U32(_) => "u32",
        Value::I32(_) => "i32",
        Value::U64(_) => "u64",
        Value::I64(_) => "i64",
        Value::F32(_) => "f32",
        Value::F64(_) => "f64",
        Value::Bool(_) => "a bool",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
    }
}

fn int_of(v: &Value) -> Option<i128> {
    Some(match v {
        Value::U8(x) => *x as i128,
        Value::I8(x) => *x as i128,
        Value::U16(x) => *x as i128,
        Value::I16(x) => *x as i128,
        Value::U32(x) => *x as i128,
        Value::I32(x) => *x as i128,
        Value::U64(x) => *x as i128,
        Value::I64(x) => *x as i128,
        _ => return None,
    })
}

impl Md<'_> {
    fn string(&self, key: &str) -> Result<Option<&str>> {
        match self.0.get(key) {
            None => Ok(None),
            Some(Value::String(s)) => Ok(Some(s)),
            Some(v) => Err(Error::invalid(
                key,
                format!("expected a string, found {}", type_name(v)),
            )),
        }
    }

    fn boolean(&self, key: &str) -> Result<Option<bool>> {
        match self.0.get(key) {
            None => Ok(None),
            Some(Value::Bool(b)) => Ok(Some(*b)),
            Some(v) => Err(Error::invalid(
                key,
                format!("expected a bool, found {}", type_name(v)),
            )),
        }
    }

    fn array(&self, key: &str) -> Result<Option<&[Value]>> {
        match self.0.get(key) {
            None => Ok(None),
            Some(Value::Array(a)) => Ok(Some(a)),
            Some(v) => Err(Error::invalid(
                key,
                format!("expected an array, found {}", type_name(v)),
            )),
        }
    }

    fn strings(&self, key: &str) -> Result<Option<Vec<&str>>> {
        let Some(a) = self.array(key)? else {
            return Ok(None);
        };
        a.iter()
            .enumerate()
            .map(|(i, v)| match v {
                Value::String(s) => Ok(s.as_str()),
                v => Err(Error::invalid(
                    key,
                    format!(
                        "expected an array of strings, element {i} is {}",
                        type_name(v)
                    ),
                )),
            })
            .collect::<Result<Vec<_>>>()
            .map(Some)
    }

    /// A token id: an integer below `n_tokens`.
    fn id(&self, key: &str, n_tokens: usize) -> Result<Option<u32>> {
        let Some(v) = self.0.get(key) else {
            return Ok(None);
        };
        let x = int_of(v).ok_or_else(|| {
            Error::invalid(
                key,
                format!("expected an integer token id, found {}", type_name(v)),
            )
        })?;
        if x < 0 || x >= n_tokens as i128 {
            return Err(Error::invalid(
                key,
                format!("{x} is outside the vocabulary of {n_tokens} tokens (`{KEY_TOKENS}`)"),
            ));
        }
        Ok(Some(x as u32))
    }
}

/// The tokens, checked: non-empty, no token empty or repeated.
fn read_tokens(md: &Md) -> Result<Vec<String>> {
    let tokens = md.strings(KEY_TOKENS)?.ok_or_else(|| Error::MissingField {
        field: KEY_TOKENS.into(),
    })?;
    if tokens.is_empty() {
        return Err(Error::invalid(KEY_TOKENS, "the vocabulary is empty"));
    }
    if tokens.len() > u32::MAX as usize {
        return Err(Error::invalid(KEY_TOKENS, "more tokens than 32-bit ids"));
    }
    let mut seen: HashMap<&str, usize> = HashMap::with_capacity(tokens.len());
    for (i, t) in tokens.iter().enumerate() {
        if t.is_empty() {
            return Err(Error::invalid(KEY_TOKENS, format!("token {i} is empty")));
        }
        if let Some(j) = seen.insert(t, i) {
            return Err(Error::invalid(
                KEY_TOKENS,
                format!("token {i} {t:?} repeats token {j}"),
            ));
        }
    }
    Ok(tokens.into_iter().map(str::to_owned).collect())
}

/// The token types: int32, one per token, each a llama.cpp type.
fn read_types(md: &Md, n_tokens: usize) -> Result<Vec<i32>> {
    let Some(a) = md.array(KEY_TOKEN_TYPE)? else {
        return Ok(vec![token_type::NORMAL; n_tokens]);
    };
    if a.len() != n_tokens {
        return Err(Error::invalid(
            KEY_TOKEN_TYPE,
            format!(
                "{} types for {n_tokens} tokens (`{KEY_TOKENS}`): one per token",
                a.len()
            ),
        ));
    }
    a.iter()
        .enumerate()
        .map(|(i, v)| match v {
            Value::I32(t) if (token_type::UNDEFINED..=token_type::BYTE).contains(t) => Ok(*t),
            Value::I32(t) => Err(Error::invalid(
                KEY_TOKEN_TYPE,
                format!("token {i} has type {t}, which is not a llama.cpp token type (0..=6)"),
            )),
            v => Err(Error::invalid(
                KEY_TOKEN_TYPE,
                format!(
                    "expected an array of int32, element {i} is {}",
                    type_name(v)
                ),
            )),
        })
        .collect()
}

/// The merges: each two tokens separated by a space (split at the first space after the first
/// character, as llama.cpp does), whose concatenation is a token too.
fn read_merges(md: &Md, tokens: &[String]) -> Result<Vec<(String, String)>> {
    let merges = md.strings(KEY_MERGES)?.ok_or_else(|| Error::MissingField {
        field: KEY_MERGES.into(),
    })?;
    let vocab: std::collections::HashSet<&str> = tokens.iter().map(String::as_str).collect();
    merges
        .iter()
        .enumerate()
        .map(|(i, m)| {
            let bad = |why: String| Error::invalid(KEY_MERGES, format!("merge {i} {m:?} {why}"));
            let split = m
                .char_indices()
                .skip(1)
                .find(|&(_, c)| c == ' ')
                .map(|(at, _)| (&m[..at], &m[at + 1..]));
            let (a, b) = match split {
                Some((a, b)) if !b.is_empty() && !b.contains(' ') => (a, b),
                _ => return Err(bad("is not two tokens separated by one space".into())),
            };
            for part in [a, b] {
                if !vocab.contains(part) {
                    return Err(bad(format!("names {part:?}, which is not a token")));
                }
            }
            if !vocab.contains(format!("{a}{b}").as_str()) {
                return Err(bad(format!(
                    "makes {:?}, which is not a token",
                    format!("{a}{b}")
                )));
            }
            Ok((a.to_owned(), b.to_owned()))
        })
        .collect()
}

impl GgufVocab {
    /// Read the tokenizer metadata of a GGUF file's key-value pairs: `Ok(None)` when the file
    /// carries no tokenizer (neither `tokenizer.ggml.model` nor `tokenizer.ggml.tokens`), an error
    /// naming the key when it carries a malformed or unsupported one.
    pub fn from_metadata(metadata: &HashMap<String, Value>) -> Result<Option<Self>> {
        let md = Md(metadata);
        let model = md.string(KEY_MODEL)?;
        if model.is_none() && !metadata.contains_key(KEY_TOKENS) {
            return Ok(None);
        }
        let unsupported = |field: &str, what: String| Error::UnsupportedTokenizer {
            field: field.into(),
            reason: format!("{what}; pass the model's tokenizer.json instead (--tokenizer)"),
        };
        match model {
            None => {
                return Err(Error::MissingField {
                    field: KEY_MODEL.into(),
                })
            }
            Some("gpt2") => {}
            Some(other) => {
                return Err(unsupported(
                    KEY_MODEL,
                    format!(
                        "`{other}` is not supported, only `gpt2` (byte-level BPE, as LLaDA's and \
                         Dream's GGUF files carry)"
                    ),
                ))
            }
        }
        let pre = md.string(KEY_PRE)?.ok_or_else(|| {
            unsupported(
                KEY_PRE,
                "missing: the file does not say how its text is split".into(),
            )
        })?;
        let family = PreTokenizer::by_name(pre).ok_or_else(|| {
            unsupported(
                KEY_PRE,
                format!(
                    "`{pre}` is not a pre-tokenizer this loader knows ({})",
                    KNOWN.join(", ")
                ),
            )
        })?;
        let tokens = read_tokens(&md)?;
        let n = tokens.len();
        let types = read_types(&md, n)?;
        let merges = read_merges(&md, &tokens)?;
        // Every special id the file names must be a token, used here or not.
        let mut id_keys: Vec<&String> = metadata
            .keys()
            .filter(|k| k.starts_with("tokenizer.ggml.") && k.ends_with("_token_id"))
            .collect();
        id_keys.sort();
        for k in id_keys {
            md.id(k, n)?;
        }
        let flag =
            |key: &str, default: bool| -> Result<bool> { Ok(md.boolean(key)?.unwrap_or(default)) };
        let v = Self {
            pre: pre.to_owned(),
            bos: md.id(KEY_BOS, n)?,
            eos: md.id(KEY_EOS, n)?,
            sep: md.id(KEY_SEP, n)?,
            add_bos: flag(KEY_ADD_BOS, family.default_add_bos)?,
            add_eos: flag(KEY_ADD_EOS, false)?,
            add_sep: flag(KEY_ADD_SEP, false)?,
            add_space_prefix: flag(KEY_ADD_SPACE_PREFIX, false)?,
            space_after_newline: flag(KEY_SPACE_AFTER_NEWLINE, false)?,
            chat_template: md.string(KEY_CHAT_TEMPLATE)?.map(str::to_owned),
            tokens,
            types,
            merges,
        };
        for (add, add_key, id, id_key) in [
            (v.add_bos, KEY_ADD_BOS, v.bos, KEY_BOS),
            (v.add_eos, KEY_ADD_EOS, v.eos, KEY_EOS),
            (v.add_sep, KEY_ADD_SEP, v.sep, KEY_SEP),
        ] {
            if add && id.is_none() {
                return Err(Error::invalid(
                    add_key,
                    format!("is true, but the file has no `{id_key}`"),
                ));
            }
        }
        Ok(Some(v))
    }

    /// The pre-tokeniser family of [`Self::pre`].
    fn family(&self) -> Result<PreTokenizer> {
        PreTokenizer::by_name(&self.pre)
            .ok_or_else(|| Error::invalid(KEY_PRE, format!("`{}` is not known", self.pre)))
    }

    /// The post-processor: `[bos] $A [sep] [eos]` (a pair: both framed so), or none.
    fn post_processor(&self) -> Result<Option<TemplateProcessing>> {
        // (`from_metadata` checked that every `add_*` flag set has its id.)
        let used: Vec<(&str, u32)> = [
            ("bos", self.add_bos, self.bos),
            ("sep", self.add_sep, self.sep),
            ("eos", self.add_eos, self.eos),
        ]
        .into_iter()
        .filter_map(|(name, add, id)| id.filter(|_| add).map(|id| (name, id)))
        .collect();
        if used.is_empty() {
            return Ok(None);
        }
        // The template names the pieces `bos`, `sep`, `eos` (a token's own text could hold a
        // space or a colon, which the template syntax splits on).
        let frame = |seq: &str, type_id: u32| -> String {
            let mut pieces = Vec::new();
            for &(name, _) in &used {
                if name != "bos" && pieces.iter().all(|p: &String| !p.starts_with('$')) {
                    pieces.push(format!("{seq}:{type_id}"));
                }
                pieces.push(format!("{name}:{type_id}"));
            }
            if pieces.iter().all(|p| !p.starts_with('$')) {
                pieces.push(format!("{seq}:{type_id}"));
            }
            pieces.join(" ")
        };
        let err = |e: String| Error::Tokenizer(format!("GGUF post-processor: {e}"));
        let tokens = used
            .iter()
            .map(|&(name, id)| {
                SpecialToken::new(
                    name.into(),
                    vec![id],
                    vec![self.tokens[id as usize].clone()],
                )
                .map_err(|e| err(e.to_string()))
            })
            .collect::<Result<Vec<_>>>()?;
        let single = frame("$A", 0);
        let pair = format!("{single} {}", frame("$B", 1));
        TemplateProcessing::builder()
            .try_single(single)
            .map_err(err)?
            .try_pair(pair)
            .map_err(err)?
            .special_tokens(tokens)
            .build()
            .map(Some)
            .map_err(|e| err(e.to_string()))
    }

    fn normalizer(&self, family: &PreTokenizer) -> Result<Option<NormalizerWrapper>> {
        let mut steps: Vec<NormalizerWrapper> = family.normalizer().into_iter().collect();
        if self.space_after_newline {
            steps.push(
                Replace::new("\n", "\n ")
                    .map_err(|e| Error::Tokenizer(e.to_string()))?
                    .into(),
            );
        }
        if self.add_space_prefix {
            steps.push(Prepend::new(" ".into()).into());
        }
        Ok(match steps.len() {
            0 => None,
            1 => steps.pop(),
            _ => Some(NormalizerSequence::new(steps).into()),
        })
    }

    fn decoder(&self) -> Result<DecoderWrapper> {
        let mut steps: Vec<DecoderWrapper> = vec![ByteLevelDecoder::new(false, true, true).into()];
        if self.space_after_newline {
            steps.push(
                Replace::new("\n ", "\n")
                    .map_err(|e| Error::Tokenizer(e.to_string()))?
                    .into(),
            );
        }
        if self.add_space_prefix {
            steps.push(Strip::new(' ', 1, 0).into());
        }
        Ok(if steps.len() == 1 {
            steps.remove(0)
        } else {
            DecoderSequence::new(steps).into()
        })
    }

    /// Build the `tokenizers` pipeline the metadata describes.
    pub fn build(&self) -> Result<TextTokenizer> {
        // The tokenizers crate panics on some inputs instead of returning its error; a bad file
        // must not abort the program.
        std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| self.build_pipeline()))
            .unwrap_or_else(|_| {
                Err(Error::Tokenizer(
                    "the tokenizers library failed on this GGUF vocabulary".into(),
                ))
            })
    }

    fn build_pipeline(&self) -> Result<TextTokenizer> {
        let family = self.family()?;
        let vocab: tokenizers::models::bpe::Vocab = self
            .tokens
            .iter()
            .zip(&self.types)
            .enumerate()
            .filter(|(_, (_, &t))| t != token_type::UNUSED)
            .map(|(id, (tok, _))| (tok.clone(), id as u32))
            .collect();
        let bpe = BPE::builder()
            .vocab_and_merges(vocab, self.merges.clone())
            .ignore_merges(family.ignore_merges)
            .build()
            .map_err(|e| Error::invalid(KEY_MERGES, e.to_string()))?;
        let mut tok: TokenizerImpl<
            BPE,
            NormalizerWrapper,
            PreTokenizerWrapper,
            PostProcessorWrapper,
            DecoderWrapper,
        > = TokenizerImpl::new(bpe);
        tok.with_normalizer(self.normalizer(&family)?)
            .map_err(|e| Error::Tokenizer(e.to_string()))?;
        tok.with_pre_tokenizer(Some(
            family
                .pre_tokenizer()
                .map_err(|e| Error::invalid(KEY_PRE, e))?,
        ));
        tok.with_post_processor(self.post_processor()?);
        tok.with_decoder(Some(self.decoder()?));
        let mut tok = Tokenizer::from(tok);
        let added = |ty: i32, special: bool| -> Vec<AddedToken> {
            self.tokens
                .iter()
                .zip(&self.types)
                .filter(|(_, &t)| t == ty)
                .map(|(s, _)| AddedToken::from(s.clone(), special).normalized(false))
                .collect()
        };
        tok.add_special_tokens(added(token_type::CONTROL, true))
            .and_then(|_| tok.add_tokens(added(token_type::USER_DEFINED, false)))
            .map_err(|e| Error::invalid(KEY_TOKEN_TYPE, e.to_string()))?;
        Ok(TextTokenizer::new(tok).with_chat_template_source(self.chat_template.clone()))
    }
}

/// The tokenizer a GGUF file's metadata describes (`Ok(None)` when it carries none); see the
/// [module docs](self).
pub fn tokenizer_from_metadata(metadata: &HashMap<String, Value>) -> Result<Option<TextTokenizer>> {
    GgufVocab::from_metadata(metadata)?
        .map(|v| v.build())
        .transpose()
}

/// Read the tokenizer of the GGUF file at `path` (its header checked as [`crate::gguf`] does;
/// no tensor is read). Errors name the file and the key.
pub fn read_tokenizer(path: &Path) -> Result<Option<TextTokenizer>> {
    let (_, content) = crate::gguf::read_content(path)?;
    tokenizer_from_metadata(&content.metadata).map_err(|e| in_file(path, e))
}

/// A metadata error, naming the file it came from.
pub(crate) fn in_file(path: &Path, e: Error) -> Error {
    match e {
        e @ (Error::MissingField { .. }
        | Error::InvalidField { .. }
        | Error::UnsupportedTokenizer { .. }
        | Error::Tokenizer(_)) => Error::file(path, e),
        e => e,
    }
}

/// The tokenizer of a GGUF file's metadata for the loader: `Ok(None)` with a warning when the
/// metadata is well formed but unsupported ([`Error::UnsupportedTokenizer`]: the model still
/// loads, and a prompt given as ids still runs); malformed metadata is an error naming the file
/// and the key.
pub(crate) fn for_loader(
    path: &Path,
    metadata: &HashMap<String, Value>,
    warnings: &mut Vec<String>,
) -> Result<Option<TextTokenizer>> {
    match tokenizer_from_metadata(metadata) {
        Ok(t) => Ok(t),
        Err(e @ Error::UnsupportedTokenizer { .. }) => {
            warnings.push(format!(
                "{}: its tokenizer metadata is not used ({e}), so the model has no tokenizer",
                path.display()
            ));
            Ok(None)
        }
        Err(e) => Err(in_file(path, e)),
    }
}
