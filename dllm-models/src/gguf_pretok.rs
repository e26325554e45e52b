//! llama.cpp's pre-tokeniser names (`tokenizer.ggml.pre`) and the Hugging Face pipelines they
//! stand for.
//!
//! A GGUF names its pre-tokeniser instead of spelling it out; llama.cpp keeps one regex list per
//! name (`llama-vocab.cpp`). Each family here is the pipeline the models of that name carry in
//! their `tokenizer.json` (the regex as written there, `Split` with `Isolated`, then byte-level
//! mapping), so a tokenizer built from the GGUF gives the `tokenizer.json`'s tokens:
//!
//! | `tokenizer.ggml.pre` | split rules | also |
//! |---|---|---|
//! | `gpt-2` | GPT-2's regex | |
//! | `starcoder`, `refact` | every digit alone, then GPT-2's regex | |
//! | `llama3`, `llama-v3`, `llama-bpe` | Llama-3's regex (digits in runs of up to 3) | BPE ignores merges for whole-vocabulary words; BOS by default |
//! | `smaug-bpe`, `dbrx` | Llama-3's regex | |
//! | `bailingmoe`, `bailingmoe2`, `llada-moe` | Ling's regex (single digits, one newline per piece) | the family of LLaDA-8B's own tokenizer (126,464 ids) |
//! | `qwen2` | Qwen2's regex (single digits) | NFC normaliser, as Qwen2's `tokenizer.json` has (Dream) |
//!
//! Any other name is an error naming `tokenizer.ggml.pre`: a guessed regex would tokenise some
//! text differently from the model's training without a word of warning.

use tokenizers::normalizers::NFC;
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::pre_tokenizers::digits::Digits;
use tokenizers::pre_tokenizers::sequence::Sequence;
use tokenizers::pre_tokenizers::split::{Split, SplitPattern};
use tokenizers::{NormalizerWrapper, PreTokenizerWrapper, SplitDelimiterBehavior};

/// Llama-3's split regex, as its `tokenizer.json` writes it.
const LLAMA3: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
/// Qwen2's split regex (Llama-3's with single digits), as its `tokenizer.json` writes it.
const QWEN2: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
/// Ling's (BailingMoE) split regex, as its `tokenizer.json` writes it (possessive quantifiers).
const BAILING: &str = r"'(?i:[sdmt]|ll|ve|re)|[^\r\n\p{L}\p{N}]?+\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]++[\r\n]*|\s*[\r\n]|\s+(?!\S)|\s+";

/// The pre-tokeniser names accepted, for error messages.
pub const KNOWN: &[&str] = &[
    "gpt-2",
    "starcoder",
    "refact",
    "llama3",
    "llama-v3",
    "llama-bpe",
    "smaug-bpe",
    "dbrx",
    "bailingmoe",
    "bailingmoe2",
    "llada-moe",
    "qwen2",
];

/// How one family of pre-tokenisers splits text.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Rules {
    /// GPT-2's regex inside the byte-level pre-tokeniser.
    Gpt2,
    /// Every digit alone, then GPT-2's regex.
    DigitsGpt2,
    /// One regex (`Split`, `Isolated`), then byte-level mapping without a regex of its own.
    Regex(&'static str),
}

/// What a `tokenizer.ggml.pre` name stands for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PreTokenizer {
    split: Rules,
    /// NFC-normalise before splitting (Qwen2's `tokenizer.json` does).
    nfc: bool,
    /// A word the vocabulary holds whole is one token, whatever the merges say (Llama-3's
    /// `ignore_merges`, which llama.cpp sets for these names).
    pub ignore_merges: bool,
    /// Whether BOS is added when the GGUF has no `tokenizer.ggml.add_bos_token` (llama.cpp's
    /// default for the name).
    pub default_add_bos: bool,
}

impl PreTokenizer {
    /// The family of a `tokenizer.ggml.pre` name, or `None` for a name this loader does not know.
    pub fn by_name(name: &str) -> Option<Self> {
        let plain = |split| Self {
            split,
            nfc: false,
            ignore_merges: false,
            default_add_bos: false,
        };
        Some(match name {
            "gpt-2" => plain(Rules::Gpt2),
            "starcoder" | "refact" => plain(Rules::DigitsGpt2),
            "llama3" | "llama-v3" | "llama-bpe" => Self {
                ignore_merges: true,
                default_add_bos: true,
                ..plain(Rules::Regex(LLAMA3))
            },
            "smaug-bpe" | "dbrx" => plain(Rules::Regex(LLAMA3)),
            "bailingmoe" | "bailingmoe2" | "llada-moe" => plain(Rules::Regex(BAILING)),
            "qwen2" => Self {
                nfc: true,
                ..plain(Rules::Regex(QWEN2))
            },
            _ => return None,
        })
    }

    /// The normaliser the family applies before any the GGUF asks for (Qwen2's NFC).
    pub fn normalizer(&self) -> Option<NormalizerWrapper> {
        self.nfc.then(|| NFC.into())
    }

    /// The pre-tokeniser (splitting, then the byte-to-character mapping of byte-level BPE).
    pub fn pre_tokenizer(&self) -> Result<PreTokenizerWrapper, String> {
        Ok(match self.split {
            Rules::Gpt2 => ByteLevel::new(false, true, true).into(),
            Rules::DigitsGpt2 => Sequence::new(vec![
                Digits::new(true).into(),
                ByteLevel::new(false, true, true).into(),
            ])
            .into(),
            Rules::Regex(re) => Sequence::new(vec![
                Split::new(
                    SplitPattern::Regex(re.into()),
                    SplitDelimiterBehavior::Isolated,
                    false,
                )
                .map_err(|e| format!("the split regex does not compile: {e}"))?
                .into(),
                ByteLevel::new(false, true, false).into(),
            ])
            .into(),
        })
    }
}
