//! The crate's one error type.
//!
//! Variants are structured so callers (and tests) can tell *what* was wrong, and every message names
//! the offending file, field, tensor or parameter.

use std::path::PathBuf;

/// Errors from loading or running a diffusion language model.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A required `config.json` / GGUF metadata field is missing.
    #[error("config: missing required field `{field}`")]
    MissingField {
        /// The field name, as spelled in the file.
        field: String,
    },
    /// A config field is present but unusable (wrong type, inconsistent with another field, unsupported).
    #[error("config: field `{field}`: {reason}")]
    InvalidField {
        /// The field name, as spelled in the file.
        field: String,
        /// What is wrong with it.
        reason: String,
    },
    /// A checkpoint tensor is missing.
    #[error("weights: tensor `{name}` not found in {source_desc}")]
    MissingTensor {
        /// Checkpoint name of the tensor.
        name: String,
        /// The files searched.
        source_desc: String,
    },
    /// A checkpoint tensor has the wrong shape for the config.
    #[error("weights: tensor `{name}` has shape {got:?}, the config implies {expected:?}")]
    TensorShape {
        /// Checkpoint name of the tensor.
        name: String,
        /// Shape implied by the config.
        expected: Vec<usize>,
        /// Shape found in the file.
        got: Vec<usize>,
    },
    /// A checkpoint tensor has a dtype this loader does not handle.
    #[error("weights: tensor `{name}` has unsupported dtype {dtype}")]
    TensorDtype {
        /// Checkpoint name of the tensor.
        name: String,
        /// The dtype found.
        dtype: String,
    },
    /// A file could not be read or parsed.
    #[error("{path}: {reason}")]
    File {
        /// The file.
        path: PathBuf,
        /// What went wrong.
        reason: String,
    },
    /// A model source (directory, GGUF file, hub id) could not be resolved.
    #[error("model source `{source_desc}`: {reason}")]
    Source {
        /// The source as given by the user.
        source_desc: String,
        /// What went wrong.
        reason: String,
    },
    /// Tokenizer or chat-template failure.
    #[error("tokenizer: {0}")]
    Tokenizer(String),
    /// A call with impossible arguments (window out of range, cache hole, batch mismatch, ...).
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    /// A sparse refresh computed against an older state of the KV cache than the current one
    /// (the cache changed between `compute_refresh` and `apply_refresh`); merging it would silently
    /// overwrite newer entries with K/V computed from stale context.
    #[error("stale refresh: computed against KV-cache epoch {computed}, the cache is now at epoch {current}")]
    StaleRefresh {
        /// Epoch the refresh was computed against.
        computed: u64,
        /// Epoch of the cache now.
        current: u64,
    },
    /// An error from a CPU kernel (a shape it cannot take, a weight type or shape it cannot pack,
    /// a thread count).
    #[error(transparent)]
    Kernel(#[from] kernels_cpu::Error),
    /// An error from candle.
    #[error(transparent)]
    Candle(#[from] candle_core::Error),
    /// An error from the Hexagon NPU backend.
    #[error("hexagon: {0}")]
    Hexagon(#[from] candle_hexagon::Error),
}

impl Error {
    pub(crate) fn invalid(field: &str, reason: impl Into<String>) -> Self {
        Error::InvalidField {
            field: field.to_string(),
            reason: reason.into(),
        }
    }
    pub(crate) fn file(path: impl Into<PathBuf>, reason: impl std::fmt::Display) -> Self {
        Error::File {
            path: path.into(),
            reason: reason.to_string(),
        }
    }
}

impl From<Error> for candle_core::Error {
    fn from(e: Error) -> Self {
        match e {
            Error::Candle(e) => e,
            other => candle_core::Error::Msg(other.to_string()),
        }
    }
}

/// Result alias for this crate.
pub type Result<T> = std::result::Result<T, Error>;
