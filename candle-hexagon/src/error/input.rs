//! What is wrong with an op's arguments: [`InputProblem`] (dtypes, shapes, ranges, weights) and
//! its part for the resident KV cache, [`CacheProblem`]. Each variant carries the facts (dims,
//! dtypes, counts, names); the message is written once, here.

use std::ops::Range;

use candle_core::{DType, DeviceLocation};

use super::program::{ProgramProblem, ProgramSite};

/// `f32, f16 or bf16` for a list of dtypes.
fn dtype_list(d: &[DType]) -> String {
    one_of(&d.iter().map(|d| d.as_str()).collect::<Vec<_>>())
}

/// `a, b or c` for a list of names.
pub(crate) fn one_of(names: &[&str]) -> String {
    match names {
        [] => String::new(),
        [one] => (*one).to_string(),
        [rest @ .., last] => format!("{} or {last}", rest.join(", ")),
    }
}

/// `a 40 + b 32` for the rows of a matrix's parts.
fn parts_list(parts: &[(String, usize)]) -> String {
    let p: Vec<String> = parts.iter().map(|(n, r)| format!("{n} {r}")).collect();
    p.join(" + ")
}

/// `layer 3`, or `the tail` for `None`.
fn layer_name(layer: Option<usize>) -> String {
    match layer {
        Some(i) => format!("layer {i}"),
        None => "the tail".to_string(),
    }
}

/// Bad arguments to an op (the `problem` of [`crate::Error::InvalidInput`]).
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum InputProblem {
    /// A tensor of a dtype the op does not take.
    #[error("{what} dtype {found:?} (use {})", dtype_list(.expected))]
    DType {
        /// The tensor (`input`, `mask`, ...).
        what: &'static str,
        /// The dtypes the op takes.
        expected: &'static [DType],
        /// The tensor's dtype.
        found: DType,
    },
    /// A tensor whose dims are not the expected ones.
    #[error("{what} is {found:?}, expected {expected:?}")]
    Shape {
        /// The tensor (`bias`, `weight`, ...).
        what: &'static str,
        /// The dims it must have.
        expected: Vec<usize>,
        /// Its dims.
        found: Vec<usize>,
    },
    /// A tensor of the wrong rank or layout.
    #[error("{what} {found:?} is not {expected}")]
    Rank {
        /// The tensor.
        what: &'static str,
        /// The layout it must have (`(batch, rows, hidden)`, `1-D`, ...).
        expected: &'static str,
        /// Its dims.
        found: Vec<usize>,
    },
    /// A linear layer's input whose last dim is not the layer's input features.
    #[error("input {found:?} does not end in {features} features")]
    Features {
        /// The input's dims.
        found: Vec<usize>,
        /// The layer's input features.
        features: usize,
    },
    /// A transformer input that is not `(batch >= 1, rows >= 1, width)`.
    #[error("input {found:?} is not (batch >= 1, rows >= 1, {width})")]
    Hidden {
        /// The input's dims.
        found: Vec<usize>,
        /// The model's hidden width.
        width: usize,
    },
    /// An RMSNorm weight that does not match the input's last dim.
    #[error("weight {found:?} does not match hidden size {hidden}")]
    NormWeight {
        /// The weight's dims.
        found: Vec<usize>,
        /// The input's last dim.
        hidden: usize,
    },
    /// SwiGLU's gate and up differ in dims or dtype.
    #[error("gate {gate:?} {gate_dtype:?} and up {up:?} {up_dtype:?} differ")]
    GateUp {
        /// Gate dims.
        gate: Vec<usize>,
        /// Gate dtype.
        gate_dtype: DType,
        /// Up dims.
        up: Vec<usize>,
        /// Up dtype.
        up_dtype: DType,
    },
    /// Rotary tables that do not fit the input.
    #[error("tables {cos:?} / {sin:?} do not fit x {x:?}")]
    RopeTables {
        /// Cosine table dims.
        cos: Vec<usize>,
        /// Sine table dims.
        sin: Vec<usize>,
        /// Input dims.
        x: Vec<usize>,
    },
    /// Attention operands that are not `(b, s, h, d)` with matching b, d and k/v shapes.
    #[error("q {q:?}, k {k:?}, v {v:?} are not (b, s, h, d) with matching b, d and k/v shapes")]
    Qkv {
        /// Query dims.
        q: Vec<usize>,
        /// Key dims.
        k: Vec<usize>,
        /// Value dims.
        v: Vec<usize>,
    },
    /// Query heads that are not a multiple of the key/value heads.
    #[error("{heads} query heads are not a multiple of {kv_heads} key/value heads")]
    Heads {
        /// Query heads.
        heads: usize,
        /// Key/value heads.
        kv_heads: usize,
    },
    /// An attention mask of neither accepted shape.
    #[error(
        "mask {found:?} is neither (q_len, kv_len) = ({q_len}, {kv_len}) nor (b or 1, heads or \
         1, q_len, kv_len) with b = {batch}, heads = {heads}"
    )]
    Mask {
        /// The mask's dims.
        found: Vec<usize>,
        /// Query rows.
        q_len: usize,
        /// Key rows.
        kv_len: usize,
        /// Batch.
        batch: usize,
        /// Query heads.
        heads: usize,
    },
    /// Causal attention with more queries than keys.
    #[error(
        "causal attention needs kv_len >= q_len (the queries are the last q_len of the kv_len \
         positions); got q_len {q_len}, kv_len {kv_len}"
    )]
    CausalTooLong {
        /// Query rows.
        q_len: usize,
        /// Key rows.
        kv_len: usize,
    },
    /// A non-finite attention scale.
    #[error("scale {value} is not finite")]
    Scale {
        /// The scale.
        value: f32,
    },
    /// An RMSNorm epsilon that is negative or not finite.
    #[error("eps {value} must be finite and >= 0")]
    Eps {
        /// The epsilon.
        value: f64,
    },
    /// A tensor on a device other than the CPU where host data was needed.
    #[error("tensor on {location:?}, expected the CPU device")]
    NotOnCpu {
        /// Where the tensor is.
        location: DeviceLocation,
    },
    /// Host bytes that cannot be viewed as whole, aligned elements.
    #[error("{len} bytes at {addr:#x} are not a whole, aligned slice")]
    Unaligned {
        /// Bytes.
        len: usize,
        /// Host address.
        addr: usize,
    },
    /// A non-contiguous input where a contiguous one is needed.
    #[error("input is not contiguous")]
    NotContiguous,
    /// A layout whose range lies outside its storage.
    #[error("layout range {start}..{end} outside a storage of {storage} elements")]
    LayoutRange {
        /// First element.
        start: usize,
        /// One past the last element.
        end: usize,
        /// Elements of the storage.
        storage: usize,
    },
    /// A dtype that cannot be staged as the wire type the op sends.
    #[error("cannot stage {found:?} as {wire}")]
    Stage {
        /// The storage's dtype.
        found: DType,
        /// The wire type (`f32`, `f16`, `i32`).
        wire: &'static str,
    },
    /// A dtype the NPU's results cannot be returned as.
    #[error("cannot return {dtype:?} from the NPU")]
    Unreturnable {
        /// The requested dtype.
        dtype: DType,
    },
    /// A value that is not a multiple of the unit it must be counted in.
    #[error("{what} {value} is not a multiple of the {multiple}-{unit}")]
    NotMultiple {
        /// The value (`k`, `file offset`).
        what: &'static str,
        /// Its value.
        value: u64,
        /// The unit's size.
        multiple: u64,
        /// The unit (`value Q4_0 block`, `byte page`).
        unit: &'static str,
    },
    /// A buffer or weight list of the wrong length.
    #[error("{what}: {found} bytes/elements, expected {expected}")]
    Len {
        /// The buffer.
        what: &'static str,
        /// The length it must have.
        expected: usize,
        /// Its length.
        found: usize,
    },
    /// A byte range outside the object it addresses.
    #[error("{len} bytes at offset {offset} are outside the {size}-byte {what}")]
    OutOfRange {
        /// The object (`weight file`, `buffer`).
        what: &'static str,
        /// First byte.
        offset: u64,
        /// Bytes.
        len: u64,
        /// The object's size.
        size: u64,
    },
    /// A weight file the transport cannot map in place.
    #[error("{len} bytes at offset {offset} of a {size}-byte weight file the transport cannot map in place")]
    NotShared {
        /// First byte.
        offset: u64,
        /// Bytes.
        len: u64,
        /// The file's size.
        size: u64,
    },
    /// A host access outside a device buffer.
    #[error("access of {len} bytes at offset {offset} outside buffer {buffer} of {size} bytes")]
    BufferRange {
        /// The buffer id.
        buffer: u32,
        /// First byte.
        offset: u64,
        /// Bytes.
        len: u64,
        /// The buffer's size.
        size: u64,
    },
    /// A host write to a buffer that maps packed weights in place.
    #[error(
        "buffer {buffer} maps packed weights in place (read-only): the host reads them through \
         their WeightBytes"
    )]
    ReadOnlyWeights {
        /// The buffer id.
        buffer: u32,
    },
    /// A value too large for the argument it is passed in.
    #[error("{what} {value} does not fit {limit}")]
    TooLarge {
        /// The value (`size`, `offset`).
        what: &'static str,
        /// Its value.
        value: u64,
        /// The argument's limit (`off_t`, `rpcmem_alloc's 2 GB limit`).
        limit: &'static str,
    },
    /// A zero-length allocation.
    #[error("zero-length allocation")]
    ZeroLength,
    /// A name that contains a NUL byte.
    #[error("name {name:?} contains a NUL byte")]
    NulInName {
        /// The name given.
        name: String,
    },
    /// A Q4_0-only operation on a layer of another format.
    #[error("not a Q4_0 layer")]
    NotQ4_0,
    /// A fused group whose parts mix dense and quantized weights.
    #[error("a fused group mixes dense and quantized weights")]
    MixedGroup,
    /// A transformer config size that is 0.
    #[error("config `{field}` is 0")]
    ZeroConfig {
        /// The field.
        field: &'static str,
    },
    /// A transformer without layers.
    #[error("no layers")]
    NoLayers,
    /// A weight vector of the wrong shape (a norm weight, or a matrix part's bias).
    #[error("{weight}{} is {found:?}, expected {expected:?}", if *.bias { " bias" } else { "" })]
    WeightShape {
        /// The weight's name.
        weight: String,
        /// Whether it is the bias of that weight.
        bias: bool,
        /// The dims it must have.
        expected: Vec<usize>,
        /// Its dims.
        found: Vec<usize>,
    },
    /// A matrix part that does not read the matmul's columns.
    #[error("{weight} is ({rows}, {found}), expected ({rows}, {expected}) (the matmul reads {expected} columns)")]
    WeightColumns {
        /// The part's name.
        weight: String,
        /// Its rows.
        rows: usize,
        /// The columns the matmul reads.
        expected: usize,
        /// Its columns.
        found: usize,
    },
    /// A matrix without parts.
    #[error("{matrix} has no parts")]
    NoParts {
        /// The matrix's name.
        matrix: String,
    },
    /// A matrix whose parts' rows do not add up to the matmul's outputs.
    #[error(
        "{matrix}: its parts have {} output rows ({}), the matmul writes {expected}",
        .parts.iter().map(|p| p.1).sum::<usize>(),
        parts_list(.parts)
    )]
    PartRows {
        /// The matrix's name.
        matrix: String,
        /// Each part's name and rows.
        parts: Vec<(String, usize)>,
        /// The rows the matmul writes.
        expected: usize,
    },
    /// A layer (or the tail) with another number of weights than its program reads.
    #[error(
        "{} has {vectors} vectors and {matrices} matrices, its program reads {program_vectors} \
         and {program_matrices}",
        layer_name(*.layer)
    )]
    WeightCounts {
        /// The layer (`None`: the tail).
        layer: Option<usize>,
        /// Vectors given.
        vectors: usize,
        /// Matrices given.
        matrices: usize,
        /// Vectors the program reads.
        program_vectors: usize,
        /// Matrices the program reads.
        program_matrices: usize,
    },
    /// A declared matrix shape whose parts' rows do not add up to the matmul's outputs.
    #[error(
        "{}: {matrix} declares {parts} parts of {rows} output rows in all, the matmul writes \
         {expected}",
        layer_name(*.layer)
    )]
    ShapeRows {
        /// The layer (`None`: the tail).
        layer: Option<usize>,
        /// The matrix's name.
        matrix: String,
        /// Parts declared.
        parts: usize,
        /// Their rows in all.
        rows: usize,
        /// The rows the matmul writes.
        expected: usize,
    },
    /// A declared layer shape with another number of matrices than its program reads.
    #[error(
        "{} declares {matrices} matrices, its program reads {program_matrices}",
        layer_name(*.layer)
    )]
    ShapeCount {
        /// The layer (`None`: the tail).
        layer: Option<usize>,
        /// Matrices declared.
        matrices: usize,
        /// Matrices the program reads.
        program_matrices: usize,
    },
    /// A matrix whose parts are not the ones its shape declared.
    #[error(
        "{}: {matrix} has parts {parts:?}, its shape declared {declared:?}",
        layer_name(*.layer)
    )]
    DeclaredParts {
        /// The layer (`None`: the tail).
        layer: Option<usize>,
        /// The matrix's name.
        matrix: String,
        /// `(rows, packed format)` of its parts (`fp16 tiles`, `Q4_0 tiles`, `cpu only`).
        parts: Vec<(usize, &'static str)>,
        /// `(rows, packed format)` its shape declared.
        declared: Vec<(usize, &'static str)>,
    },
    /// A layer pushed past the declared stack.
    #[error("layer {layer} pushed to a stack of {layers} layers")]
    ExtraLayer {
        /// The layer's index.
        layer: usize,
        /// Layers declared.
        layers: usize,
    },
    /// A stack finished before its last layer.
    #[error("finished after {pushed} of {layers} layers")]
    Unfinished {
        /// Layers pushed.
        pushed: usize,
        /// Layers declared.
        layers: usize,
    },
    /// A rotary table of the wrong shape.
    #[error("{what} are {found:?}, expected [at least {positions}, {half}]")]
    RopeTable {
        /// `rotary cosines` or `rotary sines`.
        what: &'static str,
        /// Its dims.
        found: Vec<usize>,
        /// Positions it must cover.
        positions: usize,
        /// `head_dim / 2`.
        half: usize,
    },
    /// A forward window past the rotary tables.
    #[error("window [{start}, {start} + {rows}) exceeds the {max} positions of the RoPE tables")]
    Positions {
        /// First position.
        start: usize,
        /// Rows.
        rows: usize,
        /// Positions of the tables.
        max: usize,
    },
    /// A row requested past the forward's window.
    #[error("row {row} requested from a window of {rows} rows")]
    RowOutsideWindow {
        /// The row.
        row: usize,
        /// Rows of the window.
        rows: usize,
    },
    /// Rows requested from a program that selects none.
    #[error("rows requested from a program without a row selection")]
    NoRowSelection,
    /// A malformed [`crate::Program`].
    #[error("{site}{problem}")]
    Program {
        /// Where in the program.
        site: ProgramSite,
        /// What is wrong.
        problem: ProgramProblem,
    },
    /// A misuse of the resident KV cache.
    #[error(transparent)]
    Cache(#[from] CacheProblem),
}

/// A misuse of the resident KV cache ([`crate::DeviceKv`]).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CacheProblem {
    /// A cache with a zero size.
    #[error(
        "{layers} layers, batch {batch}, {kv_heads} kv heads of {head_dim}, capacity \
         {capacity}: every size must be positive"
    )]
    Sizes {
        /// Layers.
        layers: usize,
        /// Sequences.
        batch: usize,
        /// Key/value heads.
        kv_heads: usize,
        /// Head dim.
        head_dim: usize,
        /// Rows.
        capacity: usize,
    },
    /// A layer the cache does not have.
    #[error("layer {layer} of a {layers}-layer cache")]
    Layer {
        /// The layer.
        layer: usize,
        /// The cache's layers.
        layers: usize,
    },
    /// A capacity whose buffers exceed the 4 GiB window.
    #[error("capacity {rows} rows does not fit 4 GiB")]
    Capacity {
        /// Rows asked for.
        rows: usize,
    },
    /// A cache of another geometry than the model's.
    #[error(
        "cache of {} layers x {} kv heads x {} does not match a model of {} x {} x {}",
        .cache[0], .cache[1], .cache[2], .model[0], .model[1], .model[2]
    )]
    Geometry {
        /// The cache's `[layers, kv_heads, head_dim]`.
        cache: [usize; 3],
        /// The model's `[layers, kv_heads, head_dim]`.
        model: [usize; 3],
    },
    /// A forward of another batch than the cache's.
    #[error("batch {found} does not match the cache's batch {cache}")]
    Batch {
        /// The cache's batch.
        cache: usize,
        /// The forward's batch.
        found: usize,
    },
    /// A forward window that starts past the cached rows.
    #[error(
        "forward window starts at {start} but the cache covers only [0, {cached}): positions \
         in between would be invisible"
    )]
    WindowPastCache {
        /// The window's first position.
        start: usize,
        /// Cached rows.
        cached: usize,
    },
    /// A write that would leave uncached rows before it.
    #[error("write of rows {rows:?} would leave a hole after the cached [0, {cached})")]
    Hole {
        /// The rows.
        rows: Range<usize>,
        /// Cached rows.
        cached: usize,
    },
    /// A row move from outside the filled rows, or to past their end.
    #[error(
        "move of rows {src:?} to {dst}: the source must lie in the filled [0, {filled}) and the \
         destination start at or before its end"
    )]
    Move {
        /// Source rows.
        src: Range<usize>,
        /// Destination row.
        dst: usize,
        /// Filled rows.
        filled: usize,
    },
    /// A length past the filled rows.
    #[error("cannot make {len} rows the cache: only [0, {filled}) hold K/V")]
    Unfilled {
        /// The length asked for.
        len: usize,
        /// Filled rows.
        filled: usize,
    },
    /// A truncate past the cached rows.
    #[error("cannot roll the KV cache forward from {from} to {to} rows")]
    RollForward {
        /// Cached rows.
        from: usize,
        /// Rows asked for.
        to: usize,
    },
    /// A row copy from outside the cache, or to past its end.
    #[error(
        "copy of rows {src:?} to {dst}: the source must lie in the cached [0, {cached}) and \
         the destination start at or before its end"
    )]
    Copy {
        /// Source rows.
        src: Range<usize>,
        /// Destination row.
        dst: usize,
        /// Cached rows.
        cached: usize,
    },
    /// A read of rows outside the cache.
    #[error("rows {rows:?} are not inside the cached [0, {cached})")]
    RowsNotCached {
        /// The rows.
        rows: Range<usize>,
        /// Cached rows.
        cached: usize,
    },
    /// A position that is not cached.
    #[error("position {position} is not cached (the cache covers [0, {cached}))")]
    NotCached {
        /// The position.
        position: usize,
        /// Cached rows.
        cached: usize,
    },
    /// An in-place read of a cache of several sequences.
    #[error("in-place reads need a batch of one sequence (this cache holds {batch})")]
    InPlaceBatch {
        /// The cache's batch.
        batch: usize,
    },
    /// A scattered write with another number of positions than rows.
    #[error("{positions} positions for {rows} rows of K/V")]
    PositionsForRows {
        /// Positions given.
        positions: usize,
        /// Rows of K/V given.
        rows: usize,
    },
    /// K/V rows of another shape than the cache's.
    #[error("k {k:?} / v {v:?} do not match ({batch}, rows, {kv_heads}, {head_dim})")]
    Rows {
        /// K dims.
        k: Vec<usize>,
        /// V dims.
        v: Vec<usize>,
        /// The cache's batch.
        batch: usize,
        /// The cache's key/value heads.
        kv_heads: usize,
        /// The cache's head dim.
        head_dim: usize,
    },
}
