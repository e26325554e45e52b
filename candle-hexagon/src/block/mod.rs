//! Layer-level NPU execution: a weight-owning module that runs a caller's [`Program`] — one
//! layer of ops, repeated over a stack of layers, then a tail — as **one DSP batch per layer**
//! over its weights, a resident fp16 KV cache and planned intermediates in the NPU address
//! window. It knows ops, not models: the model crate writes its block once as a program.
//!
//! An NPU pays per round trip, so at this grain the module *is* the op: a whole layer per
//! message, not one message per matmul. [`HexTransformer`] packs the program's matrices at load
//! time — each a group of checkpoint matrices stacked along the output dimension (a fused
//! projection), as fp16 HMX tiles or Q4_0 tiles, with a fused bias — into one shared weight
//! file for the memory runtime ([`crate::runtime`]) to place (resident, or streamed through
//! staging slots when the window is too small); vectors (norm weights), biases and the NeoX
//! rotary tables the caller computed go pinned as f32 in one mapping. A forward over a window
//! of `n` rows starting at position `ws`, against a [`DeviceKv`] holding `len` cached
//! rows:
//!
//! 1. the host writes the input `(b, n, width)` (as f32), the positions and the row selection
//!    into an activation buffer (offsets planned once per shape bucket: `plan.rs`; under the
//!    `somr` policy, regions never live together share bytes);
//! 2. one batch per layer is queued (more when the runtime cuts a layer into stages around
//!    streamed weights: `forward.rs`), its ops lowered from the program's nodes
//!    (`program.rs`): cache nodes write the window's K/V as f16 straight into KV rows
//!    `[len, len + n)`, attention reads rows `[0, len + n)` skipping the stale cached rows
//!    `[ws, min(ws + n, len))`, the last layer gathers the requested rows (`GET_ROWS`) where
//!    the program selects and ends with the tail;
//! 3. [`HexTransformer::submit`] returns a [`ForwardHandle`] holding the fences: the caller does
//!    CPU work, then [`ForwardHandle::wait`] returns the `(b, rows, width)` f32 output. Layer
//!    `i + 1` is queued before layer `i` runs (the DSP queue runs in order); nothing is copied
//!    through the host between layers except streamed weights into their slots.
//!
//! Every submitted batch leases the bytes it touches (see [`crate::memory`]), so host reads of
//! cached rows (a CPU refresh) proceed while the NPU appends new rows, and conflicting host
//! access is refused until the fences complete.
//!
//! What cannot run on the device (deny-list `block`, weight dtypes, shapes, a window that cannot
//! take the pinned vectors) is a routing decision: the constructor returns [`Placed::Cpu`] with
//! the reason, counted under [`OpKind::Block`], and the caller keeps its CPU path. A tail matrix
//! the device does not take cuts the tail there: the caller runs the rest on the CPU.

mod build;
mod emit;
mod forward;
mod handle;
mod kv;
mod packed;
mod plan;
mod program;

use std::sync::{Arc, Mutex};

use candle_core::quantized::QTensor;
use candle_core::Tensor;

pub use build::{HexTransformerBuilder, MatrixShape, StackShape};
pub use handle::{ForwardHandle, ForwardOutput};
pub use kv::{DeviceKv, KvStats};
use program::{Checked, Heads};
pub use program::{Cols, Node, Program};

use crate::device::HexagonDevice;
use crate::error::{Error, InputProblem, Result};
use crate::memory::WeightSlot;
use crate::ops::linear::Placed;
use crate::routing::{Decision, OpDesc, OpKind, Reason, Tier};
use crate::runtime::{MemoryPlan, Runtime};
use packed::PackedLinear;
pub use packed::PackedWeight;

/// The stack's geometry and the program it runs.
#[derive(Debug, Clone, PartialEq)]
pub struct HexTransformerConfig {
    /// What each layer and the tail compute.
    pub program: Program,
    /// Query heads of the program's attention.
    pub heads: usize,
    /// Key/value heads (divides `heads`): the cache's width.
    pub kv_heads: usize,
    /// Head dimension (even, at most 256).
    pub head_dim: usize,
    /// Positions the rotary tables cover (the longest sequence).
    pub max_positions: usize,
}

/// A checkpoint weight `(out, in)`: a dense tensor (f32/f16/bf16) or a ggml tensor.
#[derive(Debug, Clone, Copy)]
pub enum WeightRef<'a> {
    /// Dense weights (packed to fp16 HMX tiles).
    Dense(&'a Tensor),
    /// ggml weights (Q4_0 is packed to Q4_0 tiles; other types are a routing decision).
    Quant(&'a QTensor),
    /// ggml weights as raw row-major blocks in the caller's memory (e.g. a mapped GGUF file:
    /// packed straight from it, no copy on the way): `n` rows of `k` values of `dtype`.
    Ggml {
        /// The ggml type of the blocks.
        dtype: candle_core::quantized::GgmlDType,
        /// Rows.
        n: usize,
        /// Values per row.
        k: usize,
        /// The blocks (`n * k / block_size * type_size` bytes).
        bytes: &'a [u8],
    },
}

/// One checkpoint matrix of a fused group, with its optional bias.
#[derive(Debug, Clone, Copy)]
pub struct Part<'a> {
    /// `(rows, in)`.
    pub weight: WeightRef<'a>,
    /// `(rows)`.
    pub bias: Option<&'a Tensor>,
}

/// A program matrix: checkpoint matrices stacked along the output dimension (one matmul).
#[derive(Debug, Clone)]
pub struct Matrix<'a> {
    /// Its name in reports and errors (e.g. `block 3 q/k/v`).
    pub name: String,
    /// The parts, in output order, with their names.
    pub parts: Vec<(String, Part<'a>)>,
}

/// The weights one run of a node list reads, by the indices its nodes use.
#[derive(Debug, Clone, Default)]
pub struct LayerWeights<'a> {
    /// Vectors (RMSNorm weights), with their names.
    pub vectors: Vec<(String, &'a Tensor)>,
    /// Matrices.
    pub matrices: Vec<Matrix<'a>>,
}

/// The checkpoint tensors of the whole stack.
#[derive(Debug, Clone)]
pub struct TransformerWeights<'a> {
    /// Each layer's weights, in order.
    pub layers: Vec<LayerWeights<'a>>,
    /// The tail's weights. A tail matrix the device does not take stays on the CPU: the forward
    /// then stops before the first node that reads it ([`ForwardOutput::BeforeTailNode`]).
    pub tail: LayerWeights<'a>,
    /// Rotary cosines `(positions, head_dim / 2)` (at least `max_positions` rows; the first
    /// `max_positions` are kept).
    pub rope_cos: &'a Tensor,
    /// Rotary sines, same shape.
    pub rope_sin: &'a Tensor,
}

/// One run's weights: pinned vectors by index into `Inner::pinned`, matrices as runtime
/// weights (`None`: a tail matrix left on the CPU).
#[derive(Debug)]
pub(crate) struct PackedLayer {
    pub(crate) vectors: Vec<usize>,
    pub(crate) matrices: Vec<Option<PackedLinear>>,
}

pub(crate) struct Inner {
    pub(crate) dev: HexagonDevice,
    pub(crate) cfg: HexTransformerConfig,
    pub(crate) program: Checked,
    pub(crate) layers: Vec<PackedLayer>,
    pub(crate) tail: PackedLayer,
    /// The tail node the NPU stops before, and why.
    pub(crate) tail_cut: Option<(usize, Reason)>,
    pub(crate) cos: usize,
    pub(crate) sin: usize,
    /// Norm weights, biases and rotary tables, resident in one mapping.
    pub(crate) pinned: Vec<WeightSlot>,
    /// The packed linear weights and where they live (the memory runtime).
    pub(crate) runtime: Arc<Runtime>,
    pub(crate) tier: Tier,
    pub(crate) plans: Mutex<plan::PlanCache>,
}

impl Inner {
    pub(crate) fn heads(&self) -> Heads {
        Heads {
            heads: self.cfg.heads,
            kv_heads: self.cfg.kv_heads,
            head_dim: self.cfg.head_dim,
        }
    }

    /// Tail nodes the NPU runs.
    pub(crate) fn tail_len(&self) -> usize {
        self.tail_cut
            .as_ref()
            .map_or(self.program.program.tail.len(), |c| c.0)
    }

    /// The columns a forward returns and what they are.
    pub(crate) fn result_cols(&self) -> (Cols, ForwardOutput) {
        let p = &self.program.program;
        match &self.tail_cut {
            None => (p.output, ForwardOutput::Complete),
            Some((j, _)) => match p.tail[*j] {
                Node::MatMul { x, .. } => (x, ForwardOutput::BeforeTailNode(*j)),
                _ => unreachable!("the tail is cut before a matmul only"),
            },
        }
    }
}

/// A stack of identical layers (plus a tail) resident on the NPU, running a caller's
/// [`Program`], one batch per layer. Weights are immutable and shared: clone it (an `Arc`) or
/// share it across threads; the per-sequence state is the [`DeviceKv`] each forward takes.
#[derive(Clone)]
pub struct HexTransformer {
    pub(crate) inner: Arc<Inner>,
}

impl std::fmt::Debug for HexTransformer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "HexTransformer({} layers, {} nodes per layer, {} tail nodes on the NPU)",
            self.inner.layers.len(),
            self.inner.program.program.layer.len(),
            self.inner.tail_len(),
        )
    }
}

fn invalid(problem: InputProblem) -> Error {
    Error::input("HexTransformer", problem)
}

fn check_vec(weight: &str, bias: bool, t: &Tensor, n: usize) -> Result<()> {
    if t.dims() != [n] {
        return Err(invalid(InputProblem::WeightShape {
            weight: weight.to_string(),
            bias,
            expected: vec![n],
            found: t.dims().to_vec(),
        }));
    }
    Ok(())
}

/// Check one run's weights (of layer `layer`, `None` for the tail) against the sizes its nodes
/// need.
fn check_layer(
    layer: Option<usize>,
    w: &LayerWeights<'_>,
    vecs: &[usize],
    mats: &[(usize, usize)],
) -> Result<()> {
    if w.vectors.len() != vecs.len() || w.matrices.len() != mats.len() {
        return Err(invalid(InputProblem::WeightCounts {
            layer,
            vectors: w.vectors.len(),
            matrices: w.matrices.len(),
            program_vectors: vecs.len(),
            program_matrices: mats.len(),
        }));
    }
    for ((name, t), &n) in w.vectors.iter().zip(vecs) {
        check_vec(name, false, t, n)?;
    }
    for (m, &(n, k)) in w.matrices.iter().zip(mats) {
        if m.parts.is_empty() {
            return Err(invalid(InputProblem::NoParts {
                matrix: m.name.clone(),
            }));
        }
        let mut rows = Vec::with_capacity(m.parts.len());
        for (name, p) in &m.parts {
            let (r, c) = packed::dims_of(&p.weight)?;
            if c != k {
                return Err(invalid(InputProblem::WeightColumns {
                    weight: name.clone(),
                    rows: r,
                    expected: k,
                    found: c,
                }));
            }
            if let Some(b) = p.bias {
                check_vec(name, true, b, r)?;
            }
            rows.push(r);
        }
        if rows.iter().sum::<usize>() != n {
            return Err(invalid(InputProblem::PartRows {
                matrix: m.name.clone(),
                parts: m
                    .parts
                    .iter()
                    .map(|(name, _)| name.clone())
                    .zip(rows)
                    .collect(),
                expected: n,
            }));
        }
    }
    Ok(())
}

impl HexTransformerConfig {
    /// Bad values (zero sizes, a malformed program) are errors; shapes the kernels do not take
    /// are the routing entry point's business ([`HexagonDevice::supports`] on
    /// [`OpDesc::Block`]).
    fn check(&self) -> Result<Checked> {
        let c = self;
        for (name, v) in [
            ("heads", c.heads),
            ("kv_heads", c.kv_heads),
            ("head_dim", c.head_dim),
            ("max_positions", c.max_positions),
        ] {
            if v == 0 {
                return Err(invalid(InputProblem::ZeroConfig { field: name }));
            }
        }
        self.program.check(Heads {
            heads: c.heads,
            kv_heads: c.kv_heads,
            head_dim: c.head_dim,
        })
    }

    /// The stack as the routing entry point sees it.
    fn desc(&self) -> OpDesc {
        OpDesc::Block {
            heads: self.heads,
            kv_heads: self.kv_heads,
            head_dim: self.head_dim,
            widest: self.program.widest().max(self.max_positions),
        }
    }
}

impl HexTransformer {
    /// Pack `w` for `cfg` on `dev` (the [`Self::builder`] of `w`'s shape, every layer pushed).
    /// Malformed input (a program that does not check, weights that contradict it) is an error;
    /// anything the device cannot run is `Placed::Cpu(reason)`, counted as a placement of
    /// [`OpKind::Block`]. Tail matrices are placed like linear layers: one the device does not
    /// take (e.g. Q6_K weights) stays on the CPU, the module still runs and
    /// [`ForwardHandle::wait`] returns the input of the tail node that reads it.
    pub fn new(
        dev: &HexagonDevice,
        cfg: &HexTransformerConfig,
        w: &TransformerWeights<'_>,
    ) -> Result<Placed<Self>> {
        let checked = cfg.check()?;
        if w.layers.is_empty() {
            return Err(invalid(InputProblem::NoLayers));
        }
        for (i, l) in w.layers.iter().enumerate() {
            check_layer(Some(i), l, &checked.layer_vecs, &checked.layer_mats)?;
        }
        check_layer(None, &w.tail, &checked.tail_vecs, &checked.tail_mats)?;
        let mut b = match Self::builder(dev, cfg, &StackShape::of(w)?)? {
            Placed::Npu(b) => b,
            Placed::Cpu(r) => return Ok(Placed::Cpu(r)),
        };
        let built = w
            .layers
            .iter()
            .try_for_each(|l| b.push_layer(l))
            .and_then(|()| b.finish(&w.tail, w.rope_cos, w.rope_sin));
        match built {
            Ok(t) => Ok(Placed::Npu(t)),
            Err(e) => match Reason::from_error(&e) {
                Some(r) => {
                    dev.stats()
                        .record_placement(OpKind::Block, Decision::Cpu(r.key()), 0);
                    Ok(Placed::Cpu(r))
                }
                None => Err(e),
            },
        }
    }

    /// The config.
    pub fn config(&self) -> &HexTransformerConfig {
        &self.inner.cfg
    }

    /// Number of layers (= DSP batches per forward).
    pub fn num_blocks(&self) -> usize {
        self.inner.layers.len()
    }

    /// What [`ForwardHandle::wait`] returns: the program's output, or the input of the tail
    /// node the NPU stops before.
    pub fn output(&self) -> ForwardOutput {
        self.inner.result_cols().1
    }

    /// Matrix `j` of layer `i` as the host holds it (shared bytes, no copy): what a CPU path
    /// running beside the NPU reads instead of a second copy of the model (the sparse refresh
    /// of `dllm-models`). `None` past the last layer or matrix.
    pub fn packed_matrix(&self, i: usize, j: usize) -> Option<PackedWeight> {
        let host = &self.inner.runtime.weights;
        self.inner
            .layers
            .get(i)
            .and_then(|l| l.matrices.get(j))
            .and_then(|m| m.as_ref().map(|m| m.shared(host)))
    }

    /// Tail matrix `j` when it is on the NPU (shared bytes).
    pub fn packed_tail_matrix(&self, j: usize) -> Option<PackedWeight> {
        let host = &self.inner.runtime.weights;
        self.inner
            .tail
            .matrices
            .get(j)
            .and_then(|m| m.as_ref().map(|m| m.shared(host)))
    }

    /// Why the tail stops early on the NPU (`None` when it runs whole).
    pub fn tail_reason(&self) -> Option<&Reason> {
        self.inner.tail_cut.as_ref().map(|c| &c.1)
    }

    /// Bytes of packed weights, norms and tables of this module (where they live is the memory
    /// runtime's business: see [`Self::memory_plan`]).
    pub fn packed_bytes(&self) -> usize {
        let i = &self.inner;
        let weights: usize = i.runtime.weights.iter().map(|w| w.bytes.len()).sum();
        weights + i.pinned.iter().map(|p| p.len).sum::<usize>()
    }

    /// Activation layouts held (one per shape bucket: rows rounded up to whole 32-row tiles;
    /// at most 64, least recently used evicted). [`HexagonDevice::counters`]'s
    /// `shape_plans_built` counts how many were built.
    pub fn shape_plans_held(&self) -> usize {
        self.inner.plans.lock().expect("plan lock").len()
    }

    /// The memory plan in force (policy `somr`, after the first forward).
    pub fn memory_plan(&self) -> Option<MemoryPlan> {
        self.inner.runtime.plan()
    }

    /// An empty KV cache for this stack: `batch` sequences, room for `capacity` rows (grown on
    /// demand).
    pub fn new_kv(&self, batch: usize, capacity: usize) -> Result<DeviceKv> {
        let c = &self.inner.cfg;
        let rt = &self.inner.runtime;
        let mut st = rt.lock();
        rt.reclaiming(&mut st, || {
            DeviceKv::new(
                &self.inner.dev,
                self.num_blocks(),
                batch,
                c.kv_heads,
                c.head_dim,
                capacity,
            )
        })
    }

    /// Queue a forward of the embedded window `x (b, n, hidden)` at positions
    /// `[window_start, window_start + n)` against `kv` (`window_start <= kv.len()`); returns at
    /// once. The window's K/V are written to `kv`'s rows `[len, len + n)`, after the cached rows
    /// (`len` is unchanged; see [`DeviceKv::move_rows`] and [`DeviceKv::set_len`]).
    /// `rows` selects which window rows (`0..n`, any order, repeats allowed) reach the last
    /// block's attention, MLP and head; `None` means all.
    ///
    /// A full address window (activations, KV growth) is an error for which
    /// [`Error::is_resource_exhausted`] holds, counted as a CPU decision: run the forward on
    /// the CPU path.
    pub fn submit(
        &self,
        kv: &mut DeviceKv,
        x: &Tensor,
        window_start: usize,
        rows: Option<&[usize]>,
    ) -> Result<ForwardHandle> {
        forward::submit(self, kv, x, window_start, rows)
    }

    /// [`Self::submit`] and wait.
    pub fn forward(
        &self,
        kv: &mut DeviceKv,
        x: &Tensor,
        window_start: usize,
        rows: Option<&[usize]>,
    ) -> Result<Tensor> {
        self.submit(kv, x, window_start, rows)?.wait()
    }
}
