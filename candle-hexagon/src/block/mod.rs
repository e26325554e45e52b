//! Block-level NPU execution: a weight-owning transformer module that runs each transformer
//! block as **one DSP batch** over its weights, a resident fp16 KV cache and planned
//! intermediates in the NPU address window.
//!
//! An NPU pays per round trip, so at this grain the module *is* the op: a whole block per
//! message, not one message per matmul. [`HexTransformer`] packs a stack of llama-style
//! bidirectional blocks at load time — fused QKV (+ bias) and fused gate/up as fp16 HMX tiles or
//! Q4_0 tiles, kept in host memory for the memory runtime ([`crate::runtime`]) to place
//! (resident, or streamed through staging slots when the window is too small); RMSNorm weights,
//! biases and NeoX RoPE tables as pinned f32 in one mapping — plus the final norm and the LM
//! head. A forward over a window of `n` rows starting at canvas position `ws`, against a
//! [`DeviceKv`] holding `len` cached rows:
//!
//! 1. the host writes the embedded input `(b, n, hidden)` (as f32), the positions and the row
//!    selection into an activation buffer (offsets planned once per shape: `plan.rs`; under the
//!    `somr` policy, regions never live together share bytes);
//! 2. one batch per block is queued (more when the runtime cuts a block into stages around
//!    streamed weights: `forward.rs`): RMSNorm → fused QKV matmul (+ bias) → RoPE on q (in place)
//!    and on k (written as f16 straight into KV rows `[len, len + n)`) → V copied as f16 into
//!    the same rows → FlashAttention over rows `[0, len + n)` skipping the stale cached rows
//!    `[ws, min(ws + n, len))` → o matmul + residual → RMSNorm → fused gate/up matmul → SwiGLU
//!    over the two halves (strided views) → down matmul + residual. The last block gathers the
//!    requested rows (`GET_ROWS`) before attention and ends with the final norm and the LM head
//!    (or returns the normalised hidden rows when the head is not on the NPU);
//! 3. [`HexTransformer::submit`] returns a [`ForwardHandle`] holding the fences: the caller does
//!    CPU work, then [`ForwardHandle::wait`] returns `(b, rows, vocab)` f32 logits. Block `i + 1`
//!    is queued before block `i` runs (the DSP queue runs in order); nothing is copied through
//!    the host between blocks except streamed weights into their slots.
//!
//! Every submitted batch leases the bytes it touches (see [`crate::memory`]), so host reads of
//! cached rows (a CPU refresh) proceed while the NPU appends new rows, and conflicting host
//! access is refused until the fences complete.
//!
//! What cannot run on the device (deny-list `block`, weight dtypes, shapes, a window that cannot
//! take the pinned vectors) is a routing decision: the constructor returns [`Placed::Cpu`] with
//! the reason, counted under [`OpKind::Block`], and the caller keeps its per-op or CPU path.

mod forward;
mod handle;
mod kv;
mod packed;
mod plan;

use std::sync::{Arc, Mutex};

use candle_core::quantized::QTensor;
use candle_core::Tensor;

pub use handle::{ForwardHandle, ForwardOutput};
pub use kv::{DeviceKv, KvStats};

use crate::device::HexagonDevice;
use crate::error::{Error, Result};
use crate::memory::WeightSlot;
use crate::ops::linear::{PackedFormat, Placed};
use crate::routing::{Decision, OpDesc, OpKind, Reason, Support, Tier, WeightFormat};
use crate::runtime::{HostWeights, MemoryPlan, Runtime};
use packed::{group_format, rope_tables, PackedLinear, Pinned};
pub use packed::{PackedBlockWeights, PackedWeight};

/// Hyper-parameters of the block stack.
#[derive(Debug, Clone, PartialEq)]
pub struct HexTransformerConfig {
    /// Hidden size.
    pub hidden: usize,
    /// Query heads.
    pub heads: usize,
    /// Key/value heads (divides `heads`).
    pub kv_heads: usize,
    /// Head dimension (even, at most 256).
    pub head_dim: usize,
    /// MLP hidden size.
    pub ffn: usize,
    /// Vocabulary (rows of the LM head).
    pub vocab: usize,
    /// RoPE base.
    pub rope_theta: f64,
    /// RMSNorm epsilon.
    pub rms_eps: f32,
    /// Positions the resident RoPE tables cover (the longest canvas).
    pub max_positions: usize,
}

/// A checkpoint weight `(out, in)`: a dense tensor (f32/f16/bf16) or a ggml tensor.
#[derive(Debug, Clone, Copy)]
pub enum WeightRef<'a> {
    /// Dense weights (packed to fp16 HMX tiles).
    Dense(&'a Tensor),
    /// ggml weights (Q4_0 is packed to Q4_0 tiles; other types are a routing decision).
    Quant(&'a QTensor),
}

/// The checkpoint tensors of one block.
#[derive(Debug, Clone, Copy)]
pub struct BlockWeights<'a> {
    /// Pre-attention RMSNorm weight `(hidden)`.
    pub attn_norm: &'a Tensor,
    /// `(heads * head_dim, hidden)`.
    pub q: WeightRef<'a>,
    /// `(kv_heads * head_dim, hidden)`.
    pub k: WeightRef<'a>,
    /// `(kv_heads * head_dim, hidden)`.
    pub v: WeightRef<'a>,
    /// Optional q/k/v biases.
    pub q_bias: Option<&'a Tensor>,
    /// Optional k bias.
    pub k_bias: Option<&'a Tensor>,
    /// Optional v bias.
    pub v_bias: Option<&'a Tensor>,
    /// `(hidden, heads * head_dim)`.
    pub o: WeightRef<'a>,
    /// Pre-MLP RMSNorm weight `(hidden)`.
    pub ffn_norm: &'a Tensor,
    /// `(ffn, hidden)`.
    pub gate: WeightRef<'a>,
    /// `(ffn, hidden)`.
    pub up: WeightRef<'a>,
    /// `(hidden, ffn)`.
    pub down: WeightRef<'a>,
}

/// The checkpoint tensors of the whole stack.
#[derive(Debug, Clone)]
pub struct TransformerWeights<'a> {
    /// The blocks, in order.
    pub blocks: Vec<BlockWeights<'a>>,
    /// Final RMSNorm weight `(hidden)`.
    pub final_norm: &'a Tensor,
    /// LM head `(vocab, hidden)` (for tied embeddings, the embedding table); `None` keeps the
    /// head on the CPU.
    pub lm_head: Option<WeightRef<'a>>,
}

/// One block's tensors: pinned vectors by index into `Inner::pinned`, linear layers as runtime
/// weights.
#[derive(Debug)]
pub(crate) struct PackedBlock {
    pub(crate) attn_norm: usize,
    pub(crate) qkv: PackedLinear,
    pub(crate) o: PackedLinear,
    pub(crate) ffn_norm: usize,
    pub(crate) gate_up: PackedLinear,
    pub(crate) down: PackedLinear,
}

pub(crate) struct Inner {
    pub(crate) dev: HexagonDevice,
    pub(crate) cfg: HexTransformerConfig,
    pub(crate) blocks: Vec<PackedBlock>,
    pub(crate) final_norm: usize,
    pub(crate) head: Option<PackedLinear>,
    pub(crate) head_reason: Option<Reason>,
    pub(crate) cos: usize,
    pub(crate) sin: usize,
    /// Norm weights, biases and RoPE tables, resident in one mapping.
    pub(crate) pinned: Vec<WeightSlot>,
    /// The packed linear weights and where they live (the memory runtime).
    pub(crate) runtime: Arc<Runtime>,
    pub(crate) tier: Tier,
    pub(crate) plans: Mutex<plan::PlanCache>,
}

/// A stack of transformer blocks (plus final norm and LM head) resident on the NPU, run one
/// batch per block. Weights are immutable and shared: clone it (an `Arc`) or share it across
/// threads; the per-sequence state is the [`DeviceKv`] each forward takes.
#[derive(Clone)]
pub struct HexTransformer {
    pub(crate) inner: Arc<Inner>,
}

impl std::fmt::Debug for HexTransformer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "HexTransformer({} blocks, {:?}, head on {})",
            self.inner.blocks.len(),
            self.inner.cfg,
            if self.inner.head.is_some() {
                "npu"
            } else {
                "cpu"
            }
        )
    }
}

fn invalid(detail: String) -> Error {
    Error::InvalidInput {
        op: "HexTransformer",
        detail,
    }
}

fn check_dims(what: &str, got: (usize, usize), want: (usize, usize)) -> Result<()> {
    if got != want {
        return Err(invalid(format!("{what} is {got:?}, expected {want:?}")));
    }
    Ok(())
}

fn check_vec(what: &str, t: &Tensor, n: usize) -> Result<()> {
    if t.dims() != [n] {
        return Err(invalid(format!("{what} is {:?}, expected [{n}]", t.dims())));
    }
    Ok(())
}

impl HexTransformerConfig {
    /// Bad values (zero sizes, non-finite eps/theta) are errors; shapes the kernels do not take
    /// are the routing entry point's business ([`HexagonDevice::supports`] on
    /// [`OpDesc::Block`]).
    fn check(&self) -> Result<()> {
        let c = self;
        for (name, v) in [
            ("hidden", c.hidden),
            ("heads", c.heads),
            ("kv_heads", c.kv_heads),
            ("head_dim", c.head_dim),
            ("ffn", c.ffn),
            ("vocab", c.vocab),
            ("max_positions", c.max_positions),
        ] {
            if v == 0 {
                return Err(invalid(format!("config `{name}` is 0")));
            }
        }
        if !(c.rms_eps.is_finite() && c.rms_eps >= 0.0) {
            return Err(invalid(format!(
                "config `rms_eps` = {} is not finite and >= 0",
                c.rms_eps
            )));
        }
        if !(c.rope_theta.is_finite() && c.rope_theta > 0.0) {
            return Err(invalid(format!(
                "config `rope_theta` = {} is not finite and > 0",
                c.rope_theta
            )));
        }
        Ok(())
    }

    /// The block stack as the routing entry point sees it.
    fn desc(&self) -> OpDesc {
        let c = self;
        let widest = [
            c.hidden,
            (c.heads + 2 * c.kv_heads).saturating_mul(c.head_dim),
            c.ffn.saturating_mul(2),
            c.vocab,
            c.max_positions,
        ];
        OpDesc::Block {
            heads: c.heads,
            kv_heads: c.kv_heads,
            head_dim: c.head_dim,
            widest: widest.into_iter().max().unwrap_or(0),
        }
    }
}

impl HexTransformer {
    /// Pack `w` for `cfg` on `dev`. Malformed input (shapes that contradict the config) is an
    /// error; anything the device cannot run is `Placed::Cpu(reason)`, counted as a placement
    /// of [`OpKind::Block`]. The LM head, when given, is placed like a linear layer: if the
    /// device does not take it (e.g. Q6_K weights), the module still runs and
    /// [`ForwardHandle::wait`] returns normalised hidden rows for a CPU head.
    pub fn new(
        dev: &HexagonDevice,
        cfg: &HexTransformerConfig,
        w: &TransformerWeights<'_>,
    ) -> Result<Placed<Self>> {
        let (h, hd) = (cfg.hidden, cfg.head_dim);
        let (nq, nkv, ff) = (cfg.heads * hd, cfg.kv_heads * hd, cfg.ffn);
        cfg.check()?;
        if w.blocks.is_empty() {
            return Err(invalid("no blocks".into()));
        }
        check_vec("final norm", w.final_norm, h)?;
        let mut formats = Vec::with_capacity(w.blocks.len());
        for (i, b) in w.blocks.iter().enumerate() {
            let d = |x: &WeightRef<'_>| packed::dims_of(x);
            check_vec(&format!("block {i} attn norm"), b.attn_norm, h)?;
            check_vec(&format!("block {i} ffn norm"), b.ffn_norm, h)?;
            check_dims(&format!("block {i} q"), d(&b.q)?, (nq, h))?;
            check_dims(&format!("block {i} k"), d(&b.k)?, (nkv, h))?;
            check_dims(&format!("block {i} v"), d(&b.v)?, (nkv, h))?;
            check_dims(&format!("block {i} o"), d(&b.o)?, (h, nq))?;
            check_dims(&format!("block {i} gate"), d(&b.gate)?, (ff, h))?;
            check_dims(&format!("block {i} up"), d(&b.up)?, (ff, h))?;
            check_dims(&format!("block {i} down"), d(&b.down)?, (h, ff))?;
            for (what, bias, n) in [
                ("q", b.q_bias, nq),
                ("k", b.k_bias, nkv),
                ("v", b.v_bias, nkv),
            ] {
                if let Some(t) = bias {
                    check_vec(&format!("block {i} {what} bias"), t, n)?;
                }
            }
            formats.push((
                group_format(&format!("block {i} q/k/v"), &[b.q, b.k, b.v], h),
                group_format(&format!("block {i} o"), &[b.o], nq),
                group_format(&format!("block {i} gate/up"), &[b.gate, b.up], h),
                group_format(&format!("block {i} down"), &[b.down], ff),
            ));
        }
        if let Some(hw) = &w.lm_head {
            check_dims("lm head", packed::dims_of(hw)?, (cfg.vocab, h))?;
        }
        let stats = dev.stats();
        let refuse = |r: Reason| {
            stats.record_placement(OpKind::Block, Decision::Cpu(r.key()), 0);
            Ok(Placed::Cpu(r))
        };
        // Deny-list and shapes: the one routing entry point.
        if let Support::No(r) = dev.supports(&cfg.desc()) {
            return refuse(r);
        }
        let mut chosen = Vec::with_capacity(formats.len());
        for (qkv, o, gu, down) in formats {
            match (qkv, o, gu, down) {
                (Ok(a), Ok(b), Ok(c), Ok(d)) => chosen.push([a, b, c, d]),
                (Err(r), ..) | (_, Err(r), ..) | (.., Err(r), _) | (.., Err(r)) => {
                    return refuse(r)
                }
            }
        }
        let tier = if chosen
            .iter()
            .flatten()
            .all(|&f| f == PackedFormat::F16Tiles)
        {
            Tier::Hmx
        } else {
            Tier::Hvx
        };
        match Self::pack(dev, cfg, w, &chosen, tier) {
            Ok(t) => {
                let bytes = t.packed_bytes();
                stats.record_placement(OpKind::Block, Decision::Npu(tier), bytes as u64);
                Ok(Placed::Npu(t))
            }
            Err(e) => match Reason::from_error(&e) {
                Some(r) => refuse(r),
                None => Err(e),
            },
        }
    }

    fn pack(
        dev: &HexagonDevice,
        cfg: &HexTransformerConfig,
        w: &TransformerWeights<'_>,
        formats: &[[PackedFormat; 4]],
        tier: Tier,
    ) -> Result<Self> {
        let (h, nq, ff) = (cfg.hidden, cfg.heads * cfg.head_dim, cfg.ffn);
        // The weight file's room: every block's four packed groups and the head (if it ends up
        // on the CPU its room is never written and costs nothing).
        let mut lens = Vec::with_capacity(4 * w.blocks.len() + 1);
        for (b, f) in w.blocks.iter().zip(formats) {
            lens.push(packed::packed_len(f[0], &[b.q, b.k, b.v], h)?);
            lens.push(packed::packed_len(f[1], &[b.o], nq)?);
            lens.push(packed::packed_len(f[2], &[b.gate, b.up], h)?);
            lens.push(packed::packed_len(f[3], &[b.down], ff)?);
        }
        if let Some(hw) = &w.lm_head {
            if let Ok(f) = packed::format_of(hw) {
                lens.push(packed::packed_len(f, &[*hw], cfg.hidden)?);
            }
        }
        let mut host = HostWeights::new(dev, lens)?;
        let mut pinned = Pinned::default();
        let mut blocks = Vec::with_capacity(w.blocks.len());
        for (i, (b, f)) in w.blocks.iter().zip(formats).enumerate() {
            let attn_norm = pinned.push(crate::ops::to_f32_vec(b.attn_norm)?);
            let qkv = PackedLinear::pack(
                format!("block {i} q/k/v"),
                &[b.q, b.k, b.v],
                &[b.q_bias, b.k_bias, b.v_bias],
                f[0],
                h,
                &mut host,
                &mut pinned,
            )?;
            let o = PackedLinear::pack(
                format!("block {i} o"),
                &[b.o],
                &[],
                f[1],
                nq,
                &mut host,
                &mut pinned,
            )?;
            let ffn_norm = pinned.push(crate::ops::to_f32_vec(b.ffn_norm)?);
            let gate_up = PackedLinear::pack(
                format!("block {i} gate/up"),
                &[b.gate, b.up],
                &[],
                f[2],
                h,
                &mut host,
                &mut pinned,
            )?;
            let down = PackedLinear::pack(
                format!("block {i} down"),
                &[b.down],
                &[],
                f[3],
                ff,
                &mut host,
                &mut pinned,
            )?;
            blocks.push(PackedBlock {
                attn_norm,
                qkv,
                o,
                ffn_norm,
                gate_up,
                down,
            });
        }
        let final_norm = pinned.push(crate::ops::to_f32_vec(w.final_norm)?);
        let (cos, sin) = rope_tables(cfg.rope_theta, cfg.head_dim, cfg.max_positions);
        let (cos, sin) = (pinned.push(cos), pinned.push(sin));
        let (head, head_reason) = match &w.lm_head {
            None => (None, None),
            Some(hw) => Self::place_head(dev, cfg, hw, &mut host, &mut pinned)?,
        };
        // Only the pinned vectors are mapped now; the runtime places the weights.
        let pinned = pinned.map(dev)?;
        Ok(HexTransformer {
            inner: Arc::new(Inner {
                dev: dev.clone(),
                cfg: cfg.clone(),
                blocks,
                final_norm,
                head,
                head_reason,
                cos,
                sin,
                pinned,
                runtime: Runtime::new(dev, host.seal(dev)),
                tier,
                plans: Mutex::new(plan::PlanCache::default()),
            }),
        })
    }

    /// The head is routed like a linear layer (deny-list, dtype, alignment); the runtime
    /// places its weights with the others, so the load-time window check does not apply.
    fn place_head(
        dev: &HexagonDevice,
        cfg: &HexTransformerConfig,
        hw: &WeightRef<'_>,
        host: &mut HostWeights,
        pinned: &mut Pinned,
    ) -> Result<(Option<PackedLinear>, Option<Reason>)> {
        let weights = match hw {
            WeightRef::Dense(t) => WeightFormat::Dense(t.dtype()),
            WeightRef::Quant(q) => match q.dtype() {
                candle_core::quantized::GgmlDType::Q4_0 => WeightFormat::Q4_0,
                other => WeightFormat::OtherQuant(format!("{other:?}").to_lowercase()),
            },
        };
        let desc = OpDesc::Linear {
            weights,
            n: cfg.vocab,
            k: cfg.hidden,
            rows: 1,
            dtype: candle_core::DType::F32,
        };
        let kind = desc.kind();
        match dev.supports(&desc) {
            Support::Yes(tier) => {
                let format = packed::format_of(hw).map_err(|r| invalid(r.to_string()))?;
                let p = PackedLinear::pack(
                    "lm head".into(),
                    &[*hw],
                    &[],
                    format,
                    cfg.hidden,
                    host,
                    pinned,
                )?;
                let bytes = host.len_of(p.w) as u64;
                dev.stats()
                    .record_placement(kind, Decision::Npu(tier), bytes);
                Ok((Some(p), None))
            }
            Support::No(reason) => {
                dev.stats()
                    .record_placement(kind, Decision::Cpu(reason.key()), 0);
                Ok((None, Some(reason)))
            }
        }
    }

    /// The config.
    pub fn config(&self) -> &HexTransformerConfig {
        &self.inner.cfg
    }

    /// Number of blocks (= DSP batches per forward).
    pub fn num_blocks(&self) -> usize {
        self.inner.blocks.len()
    }

    /// What [`ForwardHandle::wait`] returns: logits when the LM head is on the NPU, else the
    /// normalised hidden rows.
    pub fn output(&self) -> ForwardOutput {
        if self.inner.head.is_some() {
            ForwardOutput::Logits
        } else {
            ForwardOutput::Hidden
        }
    }

    /// Block `i`'s packed linear weights as the host holds them (shared bytes, no copy): what a
    /// CPU path running beside the NPU reads instead of a second copy of the model (the sparse
    /// refresh of `dllm-models`). `None` past the last block.
    pub fn packed_block(&self, i: usize) -> Option<PackedBlockWeights> {
        let host = &self.inner.runtime.weights;
        self.inner.blocks.get(i).map(|b| PackedBlockWeights {
            qkv: b.qkv.shared(host),
            o: b.o.shared(host),
            gate_up: b.gate_up.shared(host),
            down: b.down.shared(host),
        })
    }

    /// The LM head's packed weight when the head is on the NPU (shared bytes).
    pub fn packed_head(&self) -> Option<PackedWeight> {
        let host = &self.inner.runtime.weights;
        self.inner.head.as_ref().map(|h| h.shared(host))
    }

    /// Why the LM head stayed on the CPU (`None` when it is on the NPU or was not given).
    pub fn head_reason(&self) -> Option<&Reason> {
        self.inner.head_reason.as_ref()
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

    /// Queue a forward of the embedded window `x (b, n, hidden)` at canvas positions
    /// `[window_start, window_start + n)` against `kv` (`window_start <= kv.len()`); returns at
    /// once. The window's K/V are appended to `kv` as pending rows (see [`DeviceKv::commit`]).
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
