//! The crate's one error type.
//!
//! Variants are structured so callers (and tests) can tell *what* was wrong, and every message names
//! the offending file, field, tensor or parameter.

use std::ops::Range;
use std::path::PathBuf;

use candle_core::DType;

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
    /// Well-formed GGUF tokenizer metadata this crate cannot turn into a tokenizer (a vocabulary
    /// other than byte-level BPE, a pre-tokenizer it does not know). The loader then loads the
    /// model without a tokenizer and says why in `LoadedModel::warnings`.
    #[error("`{field}`: {reason}")]
    UnsupportedTokenizer {
        /// The metadata key.
        field: String,
        /// What is not supported, and what to do instead.
        reason: String,
    },
    /// A canvas the model cannot run (see [`CanvasDefect`]); nothing was computed.
    #[error("invalid canvas: {0}")]
    InvalidCanvas(CanvasDefect),
    /// A forward window, commit range or cache length the sequence's KV cache cannot take (see
    /// [`WindowDefect`]); the cache is unchanged.
    #[error("invalid window: {0}")]
    InvalidWindow(WindowDefect),
    /// Positions asked of a refresh, a re-score or a cache write that it cannot serve (see
    /// [`PositionDefect`]).
    #[error("invalid positions: {0}")]
    InvalidPositions(PositionDefect),
    /// The KV cache's buffers cannot serve a request (see [`KvCacheDefect`]).
    #[error("KV cache: {0}")]
    KvCache(KvCacheDefect),
    /// A tensor handed to the model (a bias, cached keys or values, an NPU-packed matrix) of
    /// another shape than the model needs.
    #[error("{what} has shape {got:?}, expected {expected:?}")]
    Shape {
        /// The tensor.
        what: String,
        /// The shape the model needs.
        expected: Vec<usize>,
        /// The shape given.
        got: Vec<usize>,
    },
    /// A compute or storage dtype an op does not take.
    #[error("{what} in {dtype:?} is not supported (use f32, f16 or bf16)")]
    UnsupportedDtype {
        /// The op or buffer (`"attention"`, `"the KV cache"`).
        what: &'static str,
        /// The dtype asked for.
        dtype: DType,
    },
    /// A `config.json` text (or value) that is not a JSON object.
    #[error("invalid JSON: {reason}")]
    InvalidJson {
        /// What is wrong (the parser's message, or "config is not a JSON object").
        reason: String,
    },
    /// A safetensors loader given an empty list of files.
    #[error("no safetensors files {purpose}")]
    NoWeightFiles {
        /// What the files were for (`"to load"`, `"for the VarBuilder"`).
        purpose: &'static str,
    },
    /// A quantized parameter that cannot be dequantized (where a dense tensor is needed).
    #[error("cannot dequantize {tensor}: {reason}")]
    Dequantize {
        /// The parameter (its role).
        tensor: String,
        /// candle's error.
        reason: String,
    },
    /// The Hexagon backend asked for another op mode than [`OpMode::Fused`](crate::OpMode): its
    /// ops run inference only.
    #[error("the Hexagon backend runs inference only (OpMode::Fused): its ops have no backward pass (asked for {mode})")]
    HexagonNeedsFused {
        /// The op mode asked for.
        mode: String,
    },
    /// A q/k weight whose rows do not split into `heads` heads of an even size, so llama.cpp's
    /// rotary permutation cannot be applied or undone.
    #[error("cannot (un)permute {rows} rows over {heads} heads: the rows must split into heads of an even size")]
    HeadSplit {
        /// Rows of the weight.
        rows: usize,
        /// Heads asked for.
        heads: usize,
    },
    /// A change that needs the weights to be owned by one sequence, asked while several share them.
    #[error("{what} cannot change once the weights are shared by several sequences")]
    SharedWeights {
        /// What was to change.
        what: &'static str,
    },
    /// The NPU's block-level module holds fewer blocks than a block asked of it.
    #[error("the NPU module has {blocks} blocks, block {block} was asked for")]
    NpuBlock {
        /// The block asked for.
        block: usize,
        /// Blocks the module holds.
        blocks: usize,
    },
    /// The thread computing a sparse refresh beside the forward panicked.
    #[error("the refresh thread panicked")]
    RefreshThreadPanicked,
    /// An internal invariant that does not hold: a bug, not a bad call.
    #[error("internal error (a bug, not a bad call): {what}")]
    Internal {
        /// The invariant.
        what: &'static str,
    },
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
    /// An [`Ask`](crate::Ask) the model cannot answer (see [`AskDefect`]); nothing was computed.
    #[error("invalid ask: {0}")]
    InvalidAsk(AskDefect),
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

/// What is wrong with a canvas ([`Error::InvalidCanvas`]).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CanvasDefect {
    /// Not a `(batch, len)` tensor.
    #[error("canvas must be (batch, len), got shape {dims:?}")]
    Shape {
        /// Dimensions of the tensor.
        dims: Vec<usize>,
    },
    /// Not `u32` token ids.
    #[error("canvas must hold u32 ids, got {dtype:?}")]
    Dtype {
        /// Dtype of the tensor.
        dtype: DType,
    },
    /// Longer than the model's positions.
    #[error("canvas of {len} positions exceeds the model's maximum sequence length {max}")]
    TooLong {
        /// Positions of the canvas.
        len: usize,
        /// The model's maximum sequence length.
        max: usize,
    },
    /// No batch items or no positions.
    #[error("empty canvas ({batch} x {len})")]
    Empty {
        /// Batch items.
        batch: usize,
        /// Positions.
        len: usize,
    },
    /// Another batch size than the KV cache holds.
    #[error("canvas batch {batch} does not match the cached batch {cached}")]
    BatchMismatch {
        /// Batch of the canvas.
        batch: usize,
        /// Batch of the cached rows.
        cached: usize,
    },
    /// A token id the embedding table has no row for.
    #[error("token id {token} is outside the embedding table of {rows} rows")]
    TokenOutOfRange {
        /// The first such id.
        token: u32,
        /// Rows of the embedding table.
        rows: usize,
    },
}

/// What is wrong with a forward window, commit range or cache length ([`Error::InvalidWindow`]).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum WindowDefect {
    /// A window that is empty or reaches past the canvas.
    #[error("forward window {window:?} is empty or outside the canvas of {canvas_len} positions")]
    OutsideCanvas {
        /// The window.
        window: Range<usize>,
        /// Positions of the canvas.
        canvas_len: usize,
    },
    /// A window starting after the cached positions (those in between would be invisible).
    #[error("forward window starts at {start} but the KV cache covers only [0, {cache_len}): positions in between would be invisible")]
    PastCache {
        /// First position of the window.
        start: usize,
        /// Positions cached.
        cache_len: usize,
    },
    /// Logits asked for a position outside the forward window.
    #[error("logits requested for position {position}, outside the forward window {window:?}")]
    RowOutsideWindow {
        /// The first such position.
        position: usize,
        /// The window.
        window: Range<usize>,
    },
    /// A commit with no forward before it (or after the cache dropped its pending window).
    #[error("commit without a preceding forward")]
    CommitWithoutForward,
    /// A commit range not inside the last forward window.
    #[error("commit range {range:?} is not inside the last forward window {window:?}")]
    CommitOutsideWindow {
        /// The range.
        range: Range<usize>,
        /// The last forward window.
        window: Range<usize>,
    },
    /// A commit range starting after the cached positions.
    #[error("commit range {range:?} would leave a hole after the cached [0, {cache_len})")]
    CommitLeavesHole {
        /// The range.
        range: Range<usize>,
        /// Positions cached.
        cache_len: usize,
    },
    /// A pending window whose rows the cache's buffers no longer hold (they were reallocated).
    #[error("the pending window {window:?} no longer fits the KV cache buffers")]
    PendingLost {
        /// The pending window.
        window: Range<usize>,
    },
    /// A truncation to more positions than are cached.
    #[error("cannot roll the KV cache forward from {from} to {to} positions")]
    RollForward {
        /// Positions cached.
        from: usize,
        /// Length asked for.
        to: usize,
    },
}

/// What is wrong with the positions of a refresh, re-score or cache write
/// ([`Error::InvalidPositions`]).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PositionDefect {
    /// A position the cache does not hold.
    #[error("{what} position {position} is not cached ({})", covers(*cache_len))]
    NotCached {
        /// What asked (`"refresh"`, `"re-score"`, `"write"`).
        what: &'static str,
        /// The first such position.
        position: usize,
        /// Positions cached.
        cache_len: usize,
    },
    /// A re-score position the cache or canvas does not hold (or position 0 of a model that
    /// shifts its logits).
    #[error("re-score position {position} is not cached (cache covers [0, {cache_len}), canvas {canvas_len})")]
    NotRescorable {
        /// The first such position.
        position: usize,
        /// Positions cached.
        cache_len: usize,
        /// Positions of the canvas.
        canvas_len: usize,
    },
    /// A position listed twice.
    #[error("{what} positions {positions:?} repeat position {position}")]
    Repeated {
        /// What asked.
        what: &'static str,
        /// The positions as given.
        positions: Vec<usize>,
        /// The first repeated position.
        position: usize,
    },
    /// Logits asked for a position the refresh does not recompute.
    #[error("logits asked for position {position}, which is not refreshed")]
    NotRefreshed {
        /// The first such position.
        position: usize,
    },
}

fn covers(cache_len: usize) -> String {
    if cache_len == 0 {
        "the cache is empty".into()
    } else {
        format!("the cache covers [0, {cache_len})")
    }
}

/// What the KV cache's buffers cannot serve ([`Error::KvCache`]).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum KvCacheDefect {
    /// A capacity whose size in elements overflows `usize`.
    #[error("a KV cache of {rows} rows x {row_elems} elements is too large to address")]
    Overflow {
        /// Rows asked for.
        rows: usize,
        /// Elements of one row.
        row_elems: usize,
    },
    /// No buffers of the element type asked for (nothing allocated yet, or another dtype).
    #[error(
        "no {dtype:?} buffers (the cache stores {stored:?} and has allocated {allocated} rows)"
    )]
    NoBuffers {
        /// Element type asked for.
        dtype: DType,
        /// The cache's dtype.
        stored: DType,
        /// Rows allocated.
        allocated: usize,
    },
    /// A layer the cache does not have.
    #[error("no layer {layer} (the cache has {layers})")]
    NoLayer {
        /// The layer asked for.
        layer: usize,
        /// Layers of the cache.
        layers: usize,
    },
    /// Keys or values not in CPU memory.
    #[error("K/V must be on the CPU, got a tensor on {device}")]
    NotOnCpu {
        /// The device of the tensor.
        device: String,
    },
    /// A row past the buffer.
    #[error("row {row} is outside the KV buffer of {rows} rows")]
    RowOutsideBuffer {
        /// The row.
        row: usize,
        /// Rows of the buffer.
        rows: usize,
    },
}

/// What is wrong with an [`Ask`](crate::Ask) ([`Error::InvalidAsk`]).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AskDefect {
    /// The canvas rows (batch items) have different lengths.
    #[error("the canvas rows have different lengths {lengths:?}")]
    RaggedCanvas {
        /// Length of each row.
        lengths: Vec<usize>,
    },
    /// A verification position listed twice.
    #[error("verification position {position} is listed twice")]
    RepeatedVerify {
        /// The position.
        position: usize,
    },
    /// A verification position outside the canvas (or 0 for a model with shifted logits, whose
    /// prediction for a position comes from the one before it).
    #[error("verification position {position} is outside the canvas of {canvas_len} (or is position 0 of a model with shifted logits)")]
    VerifyOutside {
        /// The position.
        position: usize,
        /// Canvas length.
        canvas_len: usize,
    },
    /// A verification position neither cached nor in the window.
    #[error("verification position {position} is neither cached (cache [0, {cache_len})) nor in the window {window:?}")]
    VerifyUnseen {
        /// The position.
        position: usize,
        /// Cached rows.
        cache_len: usize,
        /// The window.
        window: std::ops::Range<usize>,
    },
    /// A model that verifies after the commit found the position outside the committed cache.
    #[error("verification position {position} is not in the cache after the commit ([0, {cache_len})): this model verifies against the committed cache, so the commit must cover the window")]
    VerifyNotCommitted {
        /// The position.
        position: usize,
        /// Cached rows after the commit.
        cache_len: usize,
    },
    /// [`crate::Ask::verify_hidden`] holds another number of lists than there are shadows.
    #[error("{lists} lists of hidden positions for {shadows} verification positions (give one per shadow, or none)")]
    HiddenLists {
        /// Lists given.
        lists: usize,
        /// Verification positions.
        shadows: usize,
    },
    /// A position a shadow hides is outside the canvas, listed twice, or one of the shadow's own
    /// rows.
    #[error("shadow {shadow} cannot hide position {position}: outside the canvas, listed twice, or one of the shadow's own rows")]
    HiddenInvalid {
        /// The hidden position.
        position: usize,
        /// The shadow's position.
        shadow: usize,
    },
    /// An ask that empties the cache must forward from position 0.
    #[error("an ask that empties the cache must start its window at 0, not {start}")]
    ClearedWindowStart {
        /// The window's start.
        start: usize,
    },
    /// Sequences batched into one call must share the weights.
    #[error(
        "sequence {index} of a batched forward belongs to {other}, the call's weights are {model}"
    )]
    OtherModel {
        /// Index of the sequence in the call.
        index: usize,
        /// Its model.
        other: crate::ModelId,
        /// The call's model.
        model: crate::ModelId,
    },
}

impl From<AskDefect> for Error {
    fn from(d: AskDefect) -> Self {
        Error::InvalidAsk(d)
    }
}

impl From<CanvasDefect> for Error {
    fn from(d: CanvasDefect) -> Self {
        Error::InvalidCanvas(d)
    }
}

impl From<WindowDefect> for Error {
    fn from(d: WindowDefect) -> Self {
        Error::InvalidWindow(d)
    }
}

impl From<PositionDefect> for Error {
    fn from(d: PositionDefect) -> Self {
        Error::InvalidPositions(d)
    }
}

impl From<KvCacheDefect> for Error {
    fn from(d: KvCacheDefect) -> Self {
        Error::KvCache(d)
    }
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
