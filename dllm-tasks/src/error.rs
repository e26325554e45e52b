//! The crate's single error type.

use thiserror::Error;

/// Errors from task parsing, tokenizer training, loading and encoding.
#[derive(Debug, Error)]
pub enum Error {
    /// A task name that is not one of the short suite's (`math`, `yesno`, `choice`, `completion`)
    /// or the long suite's (`long-math`, `long-yesno`, `long-choice`, `long-story`).
    #[error(
        "unknown task {0:?} (expected one of: math, yesno, choice, completion (the short suite), \
         long-math, long-yesno, long-choice, long-story (the long suite))"
    )]
    UnknownTask(String),

    /// The `tokenizers` crate failed (training, encoding, decoding, (de)serialising).
    #[error("tokenizer: {0}")]
    Tokenizer(#[source] tokenizers::Error),

    /// A loaded tokenizer does not have the special tokens at the ids the models rely on.
    #[error("special token {name:?} should have id {expected}, found {found:?}")]
    SpecialToken {
        /// The token's text, e.g. `"[MASK]"`.
        name: &'static str,
        /// The id the project relies on.
        expected: u32,
        /// The id found in the tokenizer, if any.
        found: Option<u32>,
    },

    /// A sequence does not fit the length it has to fit.
    #[error("{what} is {len} tokens, more than the {max} allowed")]
    TooLong {
        /// What was being encoded.
        what: &'static str,
        /// Its length in tokens.
        len: usize,
        /// The limit.
        max: usize,
    },

    /// An argument outside its valid range.
    #[error("invalid argument: {0}")]
    InvalidArgument(String),

    /// Training failed (diverged, bad batch, unreadable checkpoint).
    #[error("training: {0}")]
    Train(String),

    /// Evaluation failed (decoding error).
    #[error("evaluation: {0}")]
    Eval(String),

    /// A model operation failed.
    #[error(transparent)]
    Model(#[from] dllm_models::Error),

    /// candle failed.
    #[error(transparent)]
    Candle(#[from] candle_core::Error),

    /// Reading or writing a file failed.
    #[error("{path}: {source}")]
    Io {
        /// The file involved.
        path: String,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },
}

impl From<tokenizers::Error> for Error {
    fn from(e: tokenizers::Error) -> Self {
        Error::Tokenizer(e)
    }
}

/// `Result` with this crate's [`enum@Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;
