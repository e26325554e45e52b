//! The suite's BPE tokenizer: training, the prompt format, encoding and decoding helpers.
//!
//! Pipeline (all serialised in `tokenizer.json`, so any `tokenizers` user reproduces it):
//! - normaliser: prepend one space, so the first word of any text is tokenised like every
//!   other word (the response's `B` is the prompt's ` B`);
//! - pre-tokeniser: every digit is its own piece (`Digits(individual)`), then GPT-2
//!   byte-level splitting and byte-to-char mapping, so any UTF-8 text is representable;
//! - model: BPE over the 256 byte symbols, trained on the suite's train stream;
//! - decoder: byte-level, then strip the one space the normaliser added. Decoding is
//!   lossless: `decode(encode(s)) == s` for every string.
//! - post-processor: `encode(prompt, add_special_tokens = true)` gives `<bos> prompt <sep>`,
//!   the exact prompt block the models are trained on, and the pair form
//!   `encode((prompt, response), true)` gives `<bos> prompt <sep> response <eos>`.
//!
//! Special tokens have fixed ids that the models and decoders rely on: see [`PAD_ID`] ...
//! [`MASK_ID`] and [`check_special_tokens`].
//!
//! Each suite has its own tokenizer ([`build_tokenizer`]): the short suite's
//! ([`build_suite_tokenizer`], 913 tokens) is trained on short-suite text; the long suite's
//! ([`build_long_suite_tokenizer`]) on long-suite text, with one addition for its multi-line
//! answers: the normaliser writes every `\n` as `\n ` and the decoder undoes it, so the first
//! word of a line is the same token as the word anywhere else (` Ben`, not `Ben`). Both use
//! the same pre-tokenisation as llama.cpp's `starcoder` pre-tokeniser (single digits, then
//! GPT-2's split), which is what lets the GGUF export carry them.
//!
//! Training rows are `<bos> prompt <sep> response <eos> <eos> ...`: the response is padded
//! with EOS (as LLaDA's SFT does) up to the generation length; [`sft_row`] builds one.

use std::collections::HashSet;
use std::path::Path;

use tokenizers::decoders::sequence::Sequence as DecoderSequence;
use tokenizers::decoders::strip::Strip;
use tokenizers::models::bpe::{BpeTrainer, BPE};
use tokenizers::normalizers::replace::Replace;
use tokenizers::normalizers::{Prepend, Sequence as NormalizerSequence};
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::pre_tokenizers::digits::Digits;
use tokenizers::pre_tokenizers::sequence::Sequence as PreSequence;
use tokenizers::processors::template::TemplateProcessing;
use tokenizers::{
    AddedToken, DecoderWrapper, NormalizerWrapper, PostProcessorWrapper, PreTokenizerWrapper,
    Tokenizer, TokenizerImpl,
};

use crate::error::{Error, Result};
use crate::tasks::{suite_train_stream, Suite};

/// Padding. Id 0.
pub const PAD: &str = "<pad>";
/// Unknown (never produced by the byte-level model; kept for a stable id layout). Id 1.
pub const UNK: &str = "<unk>";
/// Beginning of sequence, first token of every prompt block. Id 2.
pub const BOS: &str = "<bos>";
/// End of sequence; also pads responses up to the generation length. Id 3.
pub const EOS: &str = "<eos>";
/// Separates the prompt from the response. Id 4.
pub const SEP: &str = "<sep>";
/// The masked-diffusion mask token. Id 5.
pub const MASK: &str = "[MASK]";

/// Id of [`PAD`].
pub const PAD_ID: u32 = 0;
/// Id of [`UNK`].
pub const UNK_ID: u32 = 1;
/// Id of [`BOS`].
pub const BOS_ID: u32 = 2;
/// Id of [`EOS`].
pub const EOS_ID: u32 = 3;
/// Id of [`SEP`].
pub const SEP_ID: u32 = 4;
/// Id of [`MASK`].
pub const MASK_ID: u32 = 5;

/// The special tokens, index = id.
pub const SPECIAL_TOKENS: [&str; 6] = [PAD, UNK, BOS, EOS, SEP, MASK];

/// Vocabulary cap for [`build_suite_tokenizer`]. The suite's closed vocabulary saturates BPE
/// well below it (every word becomes one token and merging stops), so the real size is set by
/// the suite, not by this number; see [`tokenizer_vocab_size`] for the measured size.
pub const DEFAULT_VOCAB_SIZE: usize = 1024;

/// Examples of the train stream in [`build_suite_tokenizer`]'s corpus.
pub const CORPUS_EXAMPLES: usize = 20_000;

/// Train-stream seed of [`build_suite_tokenizer`]'s corpus.
pub const CORPUS_SEED: u64 = 0x70C0_0001;

/// Most tokens of any suite prompt block, `<bos> prompt <sep>` included (measured: 23, for
/// math; tested on the whole test set and a large train sample). A trainer can size its
/// rows as `MAX_PROMPT_TOKENS + gen_len`.
pub const MAX_PROMPT_TOKENS: usize = 24;

/// Most tokens of any suite response, without EOS (measured: 16, every math response).
/// A generation length of at least `MAX_RESPONSE_TOKENS + 1` leaves room for the EOS that
/// ends the answer; the evaluator's default of 24 leaves room for it.
pub const MAX_RESPONSE_TOKENS: usize = 16;

/// Most tokens of any long-suite prompt block, `<bos>`/`<sep>` included (measured: 112, a
/// twelve-step `long-math` problem; tested like [`MAX_PROMPT_TOKENS`]).
pub const LONG_MAX_PROMPT_TOKENS: usize = 112;

/// Fewest tokens of any long-suite response, without EOS (measured; tested).
pub const LONG_MIN_RESPONSE_TOKENS: usize = 64;

/// Most tokens of any long-suite response, without EOS (measured; tested). The long suite
/// generates 128 positions, which leaves room for the EOS.
pub const LONG_MAX_RESPONSE_TOKENS: usize = 127;

/// Vocabulary size of [`build_long_suite_tokenizer`] (specials included; tested): the short
/// suite's 913 tokens and the long suite's additions.
pub const LONG_VOCAB_SIZE: usize = 1016;

/// Generation length of the long suite (4 blocks of 32).
pub const LONG_GEN_LENGTH: usize = 128;

/// The most tokens of a prompt block of `suite`.
pub fn max_prompt_tokens(suite: Suite) -> usize {
    match suite {
        Suite::Short => MAX_PROMPT_TOKENS,
        Suite::Long => LONG_MAX_PROMPT_TOKENS,
    }
}

/// The most tokens of a response of `suite` (without EOS).
pub fn max_response_tokens(suite: Suite) -> usize {
    match suite {
        Suite::Short => MAX_RESPONSE_TOKENS,
        Suite::Long => LONG_MAX_RESPONSE_TOKENS,
    }
}

fn single_template() -> Result<TemplateProcessing> {
    TemplateProcessing::builder()
        .try_single(format!("{BOS} $A {SEP}"))
        .and_then(|b| b.try_pair(format!("{BOS} $A {SEP} $B:1 {EOS}:1")))
        .map_err(|e| Error::Tokenizer(e.into()))?
        .special_tokens(vec![(BOS, BOS_ID), (EOS, EOS_ID), (SEP, SEP_ID)])
        .build()
        .map_err(|e| Error::Tokenizer(e.into()))
}

/// Trains the short suite's tokenizer pipeline on `corpus` (one text per item).
///
/// `vocab_size` caps the vocabulary, specials and the 256 byte symbols included; BPE stops
/// earlier when no pair occurs twice. Deterministic: the same corpus gives the same
/// `tokenizer.json` bytes.
pub fn train_tokenizer(
    vocab_size: usize,
    corpus: impl Iterator<Item = String>,
) -> Result<Tokenizer> {
    train_suite_tokenizer(Suite::Short, vocab_size, corpus)
}

/// The line-start normalisation of the long suite: `\n` is written `\n ` before
/// tokenisation, and the decoder turns `\n ` back into `\n`.
const NEWLINE: &str = "\n";
const NEWLINE_SPACED: &str = "\n ";

/// [`train_tokenizer`] with the pipeline of `suite` (the long suite adds the line-start
/// normalisation described in the module docs).
pub fn train_suite_tokenizer(
    suite: Suite,
    vocab_size: usize,
    corpus: impl Iterator<Item = String>,
) -> Result<Tokenizer> {
    let min = SPECIAL_TOKENS.len() + ByteLevel::alphabet().len();
    if vocab_size < min {
        return Err(Error::InvalidArgument(format!(
            "vocab_size {vocab_size} is below the {min} specials and byte symbols"
        )));
    }
    let alphabet: HashSet<char> = ByteLevel::alphabet().into_iter().collect();
    let mut trainer = BpeTrainer::builder()
        .vocab_size(vocab_size)
        .min_frequency(2)
        .show_progress(false)
        .special_tokens(
            SPECIAL_TOKENS
                .iter()
                .map(|s| AddedToken::from(*s, true))
                .collect(),
        )
        .initial_alphabet(alphabet)
        .build();

    let mut tok: TokenizerImpl<
        BPE,
        NormalizerWrapper,
        PreTokenizerWrapper,
        PostProcessorWrapper,
        DecoderWrapper,
    > = TokenizerImpl::new(BPE::default());
    let prepend = Prepend::new(" ".to_string());
    match suite {
        Suite::Short => tok.with_normalizer(Some(prepend))?,
        Suite::Long => tok.with_normalizer(Some(NormalizerSequence::new(vec![
            Replace::new(NEWLINE, NEWLINE_SPACED)?.into(),
            prepend.into(),
        ])))?,
    };
    tok.with_pre_tokenizer(Some(PreSequence::new(vec![
        Digits::new(true).into(),
        // No prefix space here: the normaliser already added exactly one.
        ByteLevel::new(false, false, true).into(),
    ])));
    let mut decoders: Vec<DecoderWrapper> = vec![ByteLevel::new(false, false, true).into()];
    if suite == Suite::Long {
        decoders.push(Replace::new(NEWLINE_SPACED, NEWLINE)?.into());
    }
    decoders.push(Strip::new(' ', 1, 0).into());
    tok.with_decoder(Some(DecoderSequence::new(decoders)));
    tok.with_post_processor(Some(single_template()?));
    // `TokenizerImpl::train` wants a `Send` iterator; collecting lets callers pass any.
    let texts: Vec<String> = corpus.collect();
    tok.train(&mut trainer, texts.iter())?;
    let tok = Tokenizer::from(tok);
    check_special_tokens(&tok)?;
    Ok(tok)
}

/// The corpus of [`build_suite_tokenizer`]: prompts and responses of the first `n`
/// examples of the train stream (so no held-out prompt), two texts per example.
pub fn default_corpus(n: usize) -> impl Iterator<Item = String> {
    suite_corpus(Suite::Short, n)
}

/// The corpus of [`build_tokenizer`]`(suite)`: prompts and responses of the first `n`
/// examples of the suite's train stream, two texts per example.
pub fn suite_corpus(suite: Suite, n: usize) -> impl Iterator<Item = String> {
    suite_train_stream(suite, CORPUS_SEED)
        .take(n)
        .flat_map(|e| [e.prompt, e.response])
}

/// The short suite's tokenizer, shipped with `tiny-llada` and `tiny-dream`:
/// [`train_tokenizer`] on [`default_corpus`]`(`[`CORPUS_EXAMPLES`]`)` with
/// [`DEFAULT_VOCAB_SIZE`]. Deterministic.
pub fn build_suite_tokenizer() -> Result<Tokenizer> {
    train_tokenizer(DEFAULT_VOCAB_SIZE, default_corpus(CORPUS_EXAMPLES))
}

pub use crate::long_tokenizer::build_long_suite_tokenizer;

/// The tokenizer of `suite`.
pub fn build_tokenizer(suite: Suite) -> Result<Tokenizer> {
    match suite {
        Suite::Short => build_suite_tokenizer(),
        Suite::Long => build_long_suite_tokenizer(),
    }
}

/// Which suite's tokenizer `tok` is: [`Suite::Long`] when its vocabulary is exactly the long
/// suite tokenizer's, else [`Suite::Short`] (the historical check: the special tokens at
/// their ids). An error if the special tokens are not where the models expect them.
pub fn suite_of(tok: &Tokenizer) -> Result<Suite> {
    check_special_tokens(tok)?;
    // Building the long tokenizer to compare with takes seconds; a size mismatch settles it.
    if tok.get_vocab_size(true) != LONG_VOCAB_SIZE {
        return Ok(Suite::Short);
    }
    type Vocab = std::collections::HashMap<String, u32>;
    static LONG_VOCAB: std::sync::OnceLock<std::result::Result<Vocab, String>> =
        std::sync::OnceLock::new();
    let long = LONG_VOCAB.get_or_init(|| {
        build_long_suite_tokenizer()
            .map(|t| t.get_vocab(true))
            .map_err(|e| e.to_string())
    });
    match long {
        Ok(v) if *v == tok.get_vocab(true) => Ok(Suite::Long),
        Ok(_) => Ok(Suite::Short),
        Err(e) => Err(Error::InvalidArgument(format!(
            "cannot build the long-suite tokenizer to compare with: {e}"
        ))),
    }
}

/// The vocabulary size, special tokens included (the embedding table's row count).
pub fn tokenizer_vocab_size(tok: &Tokenizer) -> usize {
    tok.get_vocab_size(true)
}

/// Verifies that `tok` maps every special token to the id the project relies on.
pub fn check_special_tokens(tok: &Tokenizer) -> Result<()> {
    for (id, name) in SPECIAL_TOKENS.iter().enumerate() {
        let found = tok.token_to_id(name);
        if found != Some(id as u32) {
            return Err(Error::SpecialToken {
                name,
                expected: id as u32,
                found,
            });
        }
    }
    Ok(())
}

/// The prompt block `<bos> prompt <sep>` as ids.
pub fn encode_prompt(tok: &Tokenizer, prompt: &str) -> Result<Vec<u32>> {
    Ok(tok.encode(prompt, true)?.get_ids().to_vec())
}

/// `text` as ids, without any special token (e.g. a response).
pub fn encode_response(tok: &Tokenizer, response: &str) -> Result<Vec<u32>> {
    Ok(tok.encode(response, false)?.get_ids().to_vec())
}

/// Decodes ids to text, dropping special tokens.
pub fn decode(tok: &Tokenizer, ids: &[u32]) -> Result<String> {
    Ok(tok.decode(ids, true)?)
}

/// The ids of a generated response up to (excluding) its first EOS.
pub fn truncate_at_eos(ids: &[u32]) -> &[u32] {
    ids.iter()
        .position(|&i| i == EOS_ID)
        .map_or(ids, |p| &ids[..p])
}

/// Decodes a generated response: cut at the first EOS, then decoded without specials
/// (so a stray `[MASK]` or `<pad>` left by a decoder does not show up as text).
pub fn decode_response(tok: &Tokenizer, ids: &[u32]) -> Result<String> {
    decode(tok, truncate_at_eos(ids))
}

/// One SFT row: `<bos> prompt <sep> response <eos> ... <eos>` with the response part
/// exactly `gen_len` tokens long (response, then EOS padding; at least one EOS), and the
/// prompt block's length (the index where the response starts).
pub fn sft_row(
    tok: &Tokenizer,
    prompt: &str,
    response: &str,
    gen_len: usize,
) -> Result<(Vec<u32>, usize)> {
    let mut ids = encode_prompt(tok, prompt)?;
    let prompt_len = ids.len();
    let resp = encode_response(tok, response)?;
    if resp.len() + 1 > gen_len {
        return Err(Error::TooLong {
            what: "response + EOS",
            len: resp.len() + 1,
            max: gen_len,
        });
    }
    ids.extend_from_slice(&resp);
    ids.resize(prompt_len + gen_len, EOS_ID);
    Ok((ids, prompt_len))
}

/// The tokenizer as `tokenizer.json` text (pretty-printed; byte-identical for identical
/// tokenizers).
pub fn to_json(tok: &Tokenizer) -> Result<String> {
    Ok(tok.to_string(true)?)
}

/// Writes `tokenizer.json`.
pub fn save(tok: &Tokenizer, path: impl AsRef<Path>) -> Result<()> {
    let path = path.as_ref();
    let json = to_json(tok)?;
    std::fs::write(path, json).map_err(|source| Error::Io {
        path: path.display().to_string(),
        source,
    })
}

/// Reads a `tokenizer.json` and checks its special-token ids.
pub fn load(path: impl AsRef<Path>) -> Result<Tokenizer> {
    let path = path.as_ref();
    // A regular file within the size limit (not a FIFO, a device or a symlink loop).
    let json =
        dllm_models::files::read_text(path, "tokenizer", dllm_models::files::MAX_TOKENIZER_BYTES)?;
    let tok: Tokenizer = json.parse()?;
    check_special_tokens(&tok)?;
    Ok(tok)
}
