//! The transformer block and the head, defined once.
//!
//! LLaDA and Dream share one block: pre-RMSNorm, q/k/v projections (optional biases), NeoX
//! rotary embedding, bidirectional attention over the sequence's KV cache, output projection
//! and residual, RMSNorm, SwiGLU MLP and residual; then a final RMSNorm and the LM head. This
//! file is the only place that says so. It is written against [`BlockOps`], which two
//! interpreters implement:
//! - the CPU path (`weights_model.rs`) computes it over candle tensors and kernels-cpu;
//! - the NPU path (`npu_load.rs`) records it as a candle-hexagon `Program`, the graph of ops the
//!   NPU module runs one DSP batch per layer (candle-hexagon knows ops, not models).
//!
//! Rows. Only the requested rows of the last block need its attention, MLP and the head; the
//! definition says where the rows are narrowed ([`BlockOps::select_rows`]) and each interpreter
//! narrows there or earlier (the CPU projects queries for the requested rows only; the NPU
//! projects q/k/v in one fused matmul and gathers the rows after). In every other block the
//! selection is the identity.

use crate::Result;

/// The vector weights of a block and of the head, by role.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum Norm {
    /// Before attention.
    Attn,
    /// Before the MLP.
    Ffn,
    /// Before the LM head.
    Final,
}

/// The matrices of a block and of the head, by role.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum Proj {
    /// Queries, keys and values (one group; see [`BlockOps::attn_inputs`]).
    // Named only by the NPU recorder (`npu_load.rs`, the `hexagon` feature).
    #[cfg_attr(not(feature = "hexagon"), allow(dead_code))]
    Qkv,
    /// Gate and up (one group; see [`BlockOps::mlp_inputs`]).
    #[cfg_attr(not(feature = "hexagon"), allow(dead_code))]
    GateUp,
    /// Attention output.
    O,
    /// MLP down projection.
    Down,
    /// The LM head.
    Head,
}

/// The ops the head is made of.
pub(crate) trait HeadOps {
    /// A matrix of activations: rows by columns.
    type X;
    /// RMSNorm of every row with the `w` weights.
    fn rms_norm(&mut self, x: &Self::X, w: Norm) -> Result<Self::X>;
    /// `x W^T (+ bias)` for matrix `w`.
    fn linear(&mut self, x: &Self::X, w: Proj) -> Result<Self::X>;
}

/// The ops a block is made of (see the module docs for rows).
pub(crate) trait BlockOps: HeadOps {
    /// Queries, keys and values of the normalised `h` (heads of `head_dim` columns; queries
    /// may already be narrowed to the requested rows).
    fn attn_inputs(&mut self, h: &Self::X) -> Result<(Self::X, Self::X, Self::X)>;
    /// NeoX rotary embedding at each row's position.
    fn rope(&mut self, x: Self::X) -> Result<Self::X>;
    /// Make `k` (rotated) and `v` the window's keys and values in the block's cache.
    fn cache_kv(&mut self, k: Self::X, v: Self::X) -> Result<()>;
    /// The requested rows of `x` (the last block; elsewhere `x` itself).
    fn select_rows(&mut self, x: Self::X) -> Result<Self::X>;
    /// Attention of `q` over the block's cache (cached rows and the window's).
    fn attention(&mut self, q: &Self::X) -> Result<Self::X>;
    /// `acc + x`.
    fn add(&mut self, acc: Self::X, x: &Self::X) -> Result<Self::X>;
    /// Gate and up projections of the normalised `h`.
    fn mlp_inputs(&mut self, h: &Self::X) -> Result<(Self::X, Self::X)>;
    /// `silu(gate) * up`.
    fn swiglu(&mut self, gate: &Self::X, up: &Self::X) -> Result<Self::X>;
    /// True when `x` has no rows (nothing was requested: only the cache is written). A
    /// recording interpreter, which sees no row counts, answers false.
    fn no_rows(&self, x: &Self::X) -> Result<bool>;
}

/// One block over the residual stream `x`; returns the new stream (the requested rows of the
/// last block).
pub(crate) fn block<O: BlockOps>(o: &mut O, x: O::X) -> Result<O::X> {
    let h = o.rms_norm(&x, Norm::Attn)?;
    let (q, k, v) = o.attn_inputs(&h)?;
    let k = o.rope(k)?;
    o.cache_kv(k, v)?;
    let q = o.rope(q)?;
    let q = o.select_rows(q)?;
    let x = o.select_rows(x)?;
    let a = o.attention(&q)?;
    if o.no_rows(&x)? {
        return Ok(x);
    }
    let y = o.linear(&a, Proj::O)?;
    let x = o.add(x, &y)?;
    let h = o.rms_norm(&x, Norm::Ffn)?;
    let (gate, up) = o.mlp_inputs(&h)?;
    let act = o.swiglu(&gate, &up)?;
    let y = o.linear(&act, Proj::Down)?;
    o.add(x, &y)
}

/// The head over the last block's output: logits.
pub(crate) fn head<O: HeadOps>(o: &mut O, x: &O::X) -> Result<O::X> {
    let h = o.rms_norm(x, Norm::Final)?;
    o.linear(&h, Proj::Head)
}
