//! The crate's one error type.
//!
//! Variants are structured so callers (and tests) can tell *what* was wrong, and every message names
//! the offending file, field, tensor or parameter.

use std::path::PathBuf;

use crate::lm::{ModelId, SequenceId};

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
    /// The checkpoint holds a different number of transformer blocks than the config declares.
    #[error("{source_desc}: config field `{field}` declares {config} layers, the checkpoint holds {checkpoint}")]
    LayerCount {
        /// The config field (`n_layers`, `num_hidden_layers`, `{arch}.block_count`).
        field: String,
        /// Layers the config declares.
        config: usize,
        /// Layers found in the checkpoint (one past the highest block index).
        checkpoint: usize,
        /// The checkpoint.
        source_desc: String,
    },
    /// The checkpoint holds tensors the config has no place for (a checkpoint of another shape,
    /// or an LM head while the config ties it to the embedding).
    #[error("{source_desc}: {count} tensor(s) the config has no place for: {}{}", names.join(", "), hint)]
    UnexpectedTensors {
        /// The first few such tensors.
        names: Vec<String>,
        /// How many there are.
        count: usize,
        /// The checkpoint.
        source_desc: String,
        /// What the likely cause is (may be empty).
        hint: String,
    },
    /// Loading (or running) would need more memory than the machine has available.
    #[error("{what} needs {} but only {} is available (MemAvailable + SwapFree in /proc/meminfo)", crate::limits::human_bytes(*need), crate::limits::human_bytes(*available))]
    TooLarge {
        /// What needs the memory.
        what: String,
        /// Bytes needed.
        need: u64,
        /// Bytes available.
        available: u64,
    },
    /// NaN or infinite values where only finite ones make sense (weights, logits).
    #[error("non-finite values (NaN or infinity) in {what}: {detail}")]
    NonFinite {
        /// The tensor or output.
        what: String,
        /// Where (index, value).
        detail: String,
    },
    /// A tokenizer that cannot belong to the model (its ids do not cover the model's special
    /// tokens, or it produces ids the model has no embedding for).
    #[error("tokenizer {tokenizer}: {reason}")]
    TokenizerMismatch {
        /// The tokenizer (file, or "embedded").
        tokenizer: String,
        /// What does not match.
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
    /// A refresh computed by another model's weights (its K/V mean nothing in this cache).
    #[error(
        "refresh from another model: computed by {computed}, this sequence belongs to {current}"
    )]
    RefreshFromOtherModel {
        /// The model that computed the refresh.
        computed: ModelId,
        /// The model of the sequence it was merged into.
        current: ModelId,
    },
    /// A refresh computed against another sequence's cache.
    #[error("refresh from another sequence: computed for {computed}, merged into {current}")]
    RefreshFromOtherSequence {
        /// The sequence the refresh was computed for.
        computed: SequenceId,
        /// The sequence it was merged into.
        current: SequenceId,
    },
    /// A refresh whose contents do not fit the cache (see [`RefreshDefect`]); nothing was written.
    #[error("malformed refresh: {0}")]
    MalformedRefresh(RefreshDefect),
    /// An error from a CPU kernel (a shape it cannot take, a weight type or shape it cannot pack,
    /// a thread count).
    #[error(transparent)]
    Kernel(#[from] kernels_cpu::Error),
    /// An error from candle.
    #[error(transparent)]
    Candle(#[from] candle_core::Error),
    /// An error from the Hexagon NPU backend. Its message is part of this one (not a separate
    /// `source`), so an error chain printed with `{:#}` says it once.
    #[cfg(feature = "hexagon")]
    #[error("hexagon: {0}")]
    Hexagon(candle_hexagon::Error),
}

/// What is wrong with a [`Refresh`](crate::Refresh) that `apply_refresh` rejects
/// ([`Error::MalformedRefresh`]).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RefreshDefect {
    /// Positions out of order: they must be sorted ascending.
    #[error(
        "positions[{index}] = {position} follows {previous}: positions must be sorted ascending"
    )]
    UnsortedPositions {
        /// Index of the first position smaller than its predecessor.
        index: usize,
        /// The position.
        position: usize,
        /// Its predecessor.
        previous: usize,
    },
    /// A position listed twice.
    #[error("position {position} is listed twice (at indices {} and {index})", index - 1)]
    DuplicatePosition {
        /// Index of the second occurrence.
        index: usize,
        /// The position.
        position: usize,
    },
    /// A position the cache does not hold.
    #[error("position {position} is not cached (the cache covers [0, {cache_len}))")]
    PositionNotCached {
        /// The position.
        position: usize,
        /// Positions cached.
        cache_len: usize,
    },
    /// Keys or values for another number of layers than the model has.
    #[error("{tensor} for {got} layers, the model has {expected}")]
    LayerCount {
        /// `"keys"` or `"values"`.
        tensor: &'static str,
        /// Layers in the refresh.
        got: usize,
        /// Layers of the model.
        expected: usize,
    },
    /// A layer's keys or values with another number of rows than there are positions.
    #[error("layer {layer} {tensor} hold {rows} rows for {positions} positions")]
    RowCount {
        /// The layer.
        layer: usize,
        /// `"keys"` or `"values"`.
        tensor: &'static str,
        /// Rows (dimension 1) of the tensor.
        rows: usize,
        /// Positions of the refresh.
        positions: usize,
    },
    /// A layer's keys or values of another shape than the cache's rows `(batch, positions,
    /// kv_heads, head_dim)`.
    #[error("layer {layer} {tensor} have shape {got:?}, the cache needs {expected:?}")]
    Shape {
        /// The layer.
        layer: usize,
        /// `"keys"` or `"values"`.
        tensor: &'static str,
        /// Shape of the tensor.
        got: Vec<usize>,
        /// `(batch, positions, kv_heads, head_dim)` of the cache.
        expected: Vec<usize>,
    },
}

impl From<RefreshDefect> for Error {
    fn from(d: RefreshDefect) -> Self {
        Error::MalformedRefresh(d)
    }
}

#[cfg(feature = "hexagon")]
impl From<candle_hexagon::Error> for Error {
    fn from(e: candle_hexagon::Error) -> Self {
        Error::Hexagon(e)
    }
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
