//! What is wrong with a [`crate::Program`]: [`ProgramProblem`], found at a [`ProgramSite`].

use std::fmt;

/// Where in a program a problem was found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProgramSite {
    /// The program as a whole (its activations, outputs and weight uses).
    Program,
    /// A node.
    Node {
        /// `layer` or `tail`.
        part: &'static str,
        /// The node's index in its part.
        index: usize,
        /// The node's op (`rms_norm`, `flash_attn`, ...).
        label: &'static str,
    },
    /// The layer output's columns.
    LayerOutput,
    /// The output's columns.
    Output,
}

/// What is wrong with a program.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ProgramProblem {
    /// The input activation does not exist.
    #[error("input activation {input} of {count}")]
    InputIndex {
        /// The input's index.
        input: usize,
        /// Activations declared.
        count: usize,
    },
    /// An operand names an activation that does not exist.
    #[error("activation {act} of {count}")]
    NoActivation {
        /// The activation's index.
        act: usize,
        /// Activations declared.
        count: usize,
    },
    /// An activation of no columns.
    #[error("activation `{name}` has 0 columns")]
    ZeroColumns {
        /// The activation.
        name: String,
    },
    /// An operand's columns outside its activation (or empty).
    #[error("columns [{start}, {end}) of `{name}` ({width} columns)")]
    Columns {
        /// The activation.
        name: String,
        /// First column.
        start: usize,
        /// One past the last column.
        end: usize,
        /// The activation's columns.
        width: usize,
    },
    /// An activation read before any node writes it.
    #[error("`{name}` is read before it is written")]
    ReadBeforeWrite {
        /// The activation.
        name: String,
    },
    /// A node reading operands of different row sets (window rows and selected rows).
    #[error("operands from different row sets")]
    MixedRowSets,
    /// Two operands that must have as many columns do not.
    #[error("`{a}` has {a_len} columns, `{b}` {b_len}")]
    ColumnCounts {
        /// The first operand's activation.
        a: String,
        /// Its columns.
        a_len: usize,
        /// The second operand's activation.
        b: String,
        /// Its columns.
        b_len: usize,
    },
    /// An RMSNorm epsilon that is negative or not finite.
    #[error("eps {value} is not finite and >= 0")]
    Eps {
        /// The epsilon.
        value: f32,
    },
    /// A matmul over part of an activation.
    #[error("a matmul reads and writes whole activations, not part of `{name}`")]
    PartialMatMul {
        /// The activation.
        name: String,
    },
    /// A vector used with two lengths.
    #[error("vector {index} used as {first} and as {second}")]
    VectorUse {
        /// The vector's index.
        index: usize,
        /// Its first length.
        first: usize,
        /// The other length.
        second: usize,
    },
    /// A matrix used with two shapes.
    #[error("matrix {index} used as {first:?} and as {second:?}")]
    MatrixUse {
        /// The matrix's index.
        index: usize,
        /// Its first `(n, k)`.
        first: (usize, usize),
        /// The other `(n, k)`.
        second: (usize, usize),
    },
    /// Rotary columns that are not whole heads.
    #[error("{columns} columns are not whole heads of {head_dim}")]
    NotWholeHeads {
        /// Columns.
        columns: usize,
        /// Head dim.
        head_dim: usize,
    },
    /// A cache node in the tail or on selected rows.
    #[error("the cache takes the window's rows, in a layer")]
    CacheOutsideWindow,
    /// A cache node of another width than the cache's rows.
    #[error("{columns} columns, the cache rows have {expected}")]
    CacheWidth {
        /// Columns.
        columns: usize,
        /// Columns of a cache row (`kv_heads * head_dim`).
        expected: usize,
    },
    /// A row selection in the tail or of selected rows.
    #[error("rows are selected once, in the layer")]
    SelectOutsideLayer,
    /// A row selection whose output is not a whole activation of its own.
    #[error("the output must be a whole activation of its own, `{name}` is not")]
    SelectionOutput {
        /// The activation.
        name: String,
    },
    /// Attention in the tail.
    #[error("attention reads a layer's cache, not in the tail")]
    AttentionInTail,
    /// Attention queries of another width than the stack's heads.
    #[error("{columns} query columns, the stack has {heads} heads of {head_dim}")]
    QueryWidth {
        /// Columns.
        columns: usize,
        /// Query heads.
        heads: usize,
        /// Head dim.
        head_dim: usize,
    },
    /// A non-finite attention scale.
    #[error("scale {value} is not finite")]
    Scale {
        /// The scale.
        value: f32,
    },
    /// A selection written by another op.
    #[error("`{name}` is a selection and is written by another op")]
    SelectionRewritten {
        /// The activation.
        name: String,
    },
    /// An output no node writes.
    #[error("{what} `{name}` is never written")]
    Unwritten {
        /// `the layer output` or `the output`.
        what: &'static str,
        /// The activation.
        name: String,
    },
    /// A layer output that is not the layer input (or a selection of it).
    #[error(
        "the layer output `{output}` is not the input `{input}` (or a selection of it): the \
         next layer could not read it in place"
    )]
    NotTheInput {
        /// The layer output's activation.
        output: String,
        /// The input's activation.
        input: String,
    },
    /// A layer output that is part of the input's columns.
    #[error("the layer output must be all of the input's columns")]
    PartialLayerOutput,
    /// A weight index no node uses (the indices must be dense).
    #[error("{what} {index} is never used")]
    Unused {
        /// `layer vector`, `tail matrix`, ...
        what: &'static str,
        /// The index.
        index: usize,
    },
}

/// The site as a message prefix: empty for the program as a whole, else `... : `.
impl fmt::Display for ProgramSite {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ProgramSite::Program => Ok(()),
            ProgramSite::Node { part, index, label } => {
                write!(f, "{part} node {index} ({label}): ")
            }
            ProgramSite::LayerOutput => f.write_str("the layer output: "),
            ProgramSite::Output => f.write_str("the output: "),
        }
    }
}
