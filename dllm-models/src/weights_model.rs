//! The immutable half of a model: [`TransformerWeights`], shared between sequences (and between the
//! dense forward and the sparse refresh of one sequence) behind an `Arc`.
//!
//! Everything here takes the sequence's KV cache as borrowed slices: a window forward reads the cached
//! rows and writes its fresh K/V into the free rows after them; a refresh reads the cached rows only.
//! Both can therefore run at the same time on two threads (see [`crate::DiffusionTransformer`]).

use std::ops::Range;
use std::sync::Arc;

use candle_core::{DType, Device, Tensor};
use kernels_cpu::attention::Skip;

use crate::block::Block;
use crate::config::TransformerConfig;
#[cfg(not(feature = "hexagon"))]
use crate::hexagon_off::HexTransformer;
use crate::kv_cache::{scatter_rows, CachedRows, FreeRows, KvElem, Pending};
use crate::layers::{attention_on, Backend, Embedding, Linear, OpMode, RmsNorm, Rope};
use crate::linear::CpuOptions;
use crate::lm::{ModelId, ModelInfo, Refresh, Rows, SequenceToken};

mod cpu_ops;
mod load;
mod rescore;
mod segment;
use crate::block_def;
use crate::weights::WeightSource;
use crate::{Error, PositionDefect, Result, WindowDefect};
#[cfg(feature = "hexagon")]
use candle_hexagon::HexTransformer;
use cpu_ops::{Act, CpuBlock, CpuHead};
use segment::{materialize, segment_attention, segment_attention_fresh, KvGeom};

/// [`TransformerWeights::cpu_linear_bytes`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CpuLinearBytes {
    /// Bytes the CPU layers hold themselves.
    pub owned: usize,
    /// Bytes the CPU layers read in place from the NPU module's packed weights.
    pub shared_with_npu: usize,
}

/// The weights of a LLaDA / Dream model and everything derived from them at load time: immutable,
/// `Send + Sync`, shared by any number of sequences.
#[derive(Debug)]
pub struct TransformerWeights {
    /// This model's process-unique identity (stamped on every refresh it computes).
    id: ModelId,
    /// How its CPU work runs (linear layers, threads).
    cpu: CpuOptions,
    /// Its own thread pool (`cpu.threads`), when it has one.
    pool: Option<Arc<rayon::ThreadPool>>,
    pub(crate) cfg: TransformerConfig,
    pub(crate) info: ModelInfo,
    pub(crate) device: Device,
    pub(crate) mode: OpMode,
    pub(crate) backend: Backend,
    /// Where the per-op paths run (the layers below, the refresh): the backend, except when the
    /// block-level module holds the model on the NPU — then the layers are CPU kernels over the NPU
    /// module's own packed bytes (no second copy of the matrices).
    ops_backend: Backend,
    /// The whole stack on the NPU, one DSP batch per block (when the device took it).
    pub(crate) hex: Option<HexTransformer>,
    embed: Embedding,
    blocks: Vec<Block>,
    norm: RmsNorm,
    head: Linear,
    rope: Rope,
}

/// How the attention of one block gets its keys: the closure receives the block's `q`
/// `(b, nq, heads, d)` and fresh `k`, `v` `(b, n, kv_heads, d)` and returns `(b, nq, heads * d)`.
type Attend<'a> = dyn FnMut(&Tensor, &Tensor, &Tensor) -> Result<Tensor> + 'a;

impl TransformerWeights {
    /// Build on `backend`: with [`Backend::Hexagon`] the linear layers' weights are packed into
    /// NPU memory (where the device takes them) and the fused ops run on the NPU. CPU options
    /// are the defaults (packed linear layers, the caller's rayon pool).
    pub fn new(
        cfg: TransformerConfig,
        w: &dyn WeightSource,
        mode: OpMode,
        backend: &Backend,
    ) -> Result<Self> {
        Self::new_with(cfg, w, mode, backend, CpuOptions::default())
    }

    /// The normalised config.
    pub fn config(&self) -> &TransformerConfig {
        &self.cfg
    }

    /// The CPU options the model was built with.
    pub fn cpu_options(&self) -> CpuOptions {
        self.cpu
    }

    /// Run `f` on this model's thread pool (on the caller's thread, in the caller's current rayon
    /// pool, when the model has none): every forward, refresh and re-score of the model runs its
    /// CPU work inside it. `f` must not block on work that needs another thread of the same pool.
    pub fn install<R: Send>(&self, f: impl FnOnce() -> R + Send) -> R {
        match &self.pool {
            Some(p) => p.install(f),
            None => f(),
        }
    }

    /// This model's process-unique identity: every sequence over these weights carries it in its
    /// [`SequenceToken`], so a refresh computed by another model is rejected.
    pub fn id(&self) -> ModelId {
        self.id
    }

    /// Static facts about the model.
    pub fn info(&self) -> &ModelInfo {
        &self.info
    }

    /// The backend the model was built on.
    pub fn backend(&self) -> &Backend {
        &self.backend
    }

    /// Host bytes of the linear layers' weights (blocks and LM head) that the CPU paths read:
    /// `owned` is what the model holds for them itself, `shared_with_npu` what they read in place
    /// from the NPU module's packed tiles (when the NPU holds the stack, the sparse refresh runs
    /// on those bytes and `owned` counts only what the NPU did not take).
    pub fn cpu_linear_bytes(&self) -> CpuLinearBytes {
        let mut out = CpuLinearBytes::default();
        let layers = self.blocks.iter().flat_map(|b| b.linears());
        for l in layers.chain(std::iter::once(&self.head)) {
            let (owned, shared) = l.weight_bytes();
            out.owned += owned;
            out.shared_with_npu += shared;
        }
        out
    }

    /// The raw-output row that predicts position `p`.
    pub(crate) fn source_row(&self, p: usize) -> usize {
        if self.cfg.shift_logits {
            p.saturating_sub(1)
        } else {
            p
        }
    }

    fn idx(&self, v: impl IntoIterator<Item = usize>) -> Result<Tensor> {
        let v: Vec<u32> = v.into_iter().map(|x| x as u32).collect();
        Ok(Tensor::new(v, &self.device)?)
    }

    /// One block (the definition in `block_def.rs`, interpreted on the CPU). `q_rows`
    /// restricts queries (and the block's output) to those rows of `x`; `attend` runs the
    /// attention of the block's queries over whatever keys it chooses. Returns the block's
    /// output and its fresh K/V.
    fn block(
        &self,
        blk: &Block,
        x: &Tensor,
        rope: (&Tensor, &Tensor),
        q_rows: Option<&Tensor>,
        attend: &mut Attend<'_>,
    ) -> Result<(Tensor, Tensor, Tensor)> {
        let mut ops = CpuBlock {
            w: self,
            blk,
            rope,
            q_rows,
            attend,
            kv: None,
        };
        let x = block_def::block(&mut ops, Act::all(x.clone()))?;
        let (k, v) = ops.kv.ok_or(Error::Internal {
            what: "a block that cached no K/V",
        })?;
        Ok((x.t, k, v))
    }

    /// The LM head alone over rows that are already normalised (the NPU stack's hidden output).
    #[cfg_attr(not(feature = "hexagon"), allow(dead_code))]
    pub(crate) fn head_only(&self, x: &Tensor) -> Result<Tensor> {
        self.finite_logits(
            self.head
                .forward(&x.to_dtype(self.info.dtype)?)?
                .to_dtype(DType::F32)?,
        )
    }

    /// Token embeddings of `ids` `(b, n)`.
    #[cfg_attr(not(feature = "hexagon"), allow(dead_code))]
    pub(crate) fn embed(&self, ids: &Tensor) -> Result<Tensor> {
        self.embed.forward(ids)
    }

    pub(crate) fn logits(&self, x: &Tensor) -> Result<Tensor> {
        let (b, n, _) = x.dims3()?;
        if n == 0 {
            return Ok(Tensor::zeros(
                (b, 0, self.cfg.vocab_size),
                DType::F32,
                &self.device,
            )?);
        }
        let logits = block_def::head(&mut CpuHead { w: self }, x)?;
        self.finite_logits(logits.to_dtype(DType::F32)?)
    }

    /// `logits` unchanged when every value is finite; else an error naming the first bad one. A
    /// decoder cannot rank NaN, and a model with NaN or infinite weights produces them: report it
    /// instead of decoding garbage. (Inference only: the scan is one pass over rows x vocab, small
    /// beside the LM head's matmul.)
    fn finite_logits(&self, logits: Tensor) -> Result<Tensor> {
        if self.mode == OpMode::Fused {
            if let Some((i, v)) = crate::limits::first_non_finite(&logits)? {
                let vocab = self.cfg.vocab_size.max(1);
                return Err(Error::NonFinite {
                    what:
                        "the model's logits (its weights hold NaN or infinite values, or overflow)"
                            .into(),
                    detail: format!("requested row {}, token id {}: {v}", i / vocab, i % vocab),
                });
            }
        }
        Ok(logits)
    }

    /// The rows a window forward runs and returns: a shifted model (Dream) reads the raw output
    /// one position left of each requested position, so its window starts one row earlier.
    pub(crate) fn window_rows(&self, rows: Rows<'_>, window: Range<usize>) -> Result<WindowRows> {
        let requested = self.requested(rows, window.clone())?;
        let ws = if self.cfg.shift_logits {
            window.start.saturating_sub(1)
        } else {
            window.start
        };
        let n = window.end - ws;
        let hidden: Vec<usize> = requested.iter().map(|&p| self.source_row(p) - ws).collect();
        let identity = hidden.len() == n && hidden.iter().enumerate().all(|(i, &r)| i == r);
        Ok(WindowRows {
            ws,
            n,
            hidden_rows: (!identity).then_some(hidden),
        })
    }

    /// Resolve [`Rows`] to positions and validate them against `allowed`.
    pub(crate) fn requested(&self, rows: Rows<'_>, allowed: Range<usize>) -> Result<Vec<usize>> {
        let v: Vec<usize> = match rows {
            Rows::All => allowed.clone().collect(),
            Rows::None => Vec::new(),
            Rows::Positions(p) => p.to_vec(),
        };
        if let Some(&bad) = v.iter().find(|p| !allowed.contains(p)) {
            return Err(WindowDefect::RowOutsideWindow {
                position: bad,
                window: allowed,
            }
            .into());
        }
        Ok(v)
    }

    /// Full training forward: logits for every position of `ids` (no cache, differentiable when the
    /// model was built with [`OpMode::Differentiable`]).
    pub fn forward_train(&self, ids: &Tensor) -> Result<Tensor> {
        self.install(|| {
            let (_, l) = ids.dims2()?;
            let mut x = self.embed.forward(ids)?;
            let (cos, sin) = self.rope.range(0, l)?;
            let scale = self.scale();
            let (mode, backend) = (self.mode, &self.ops_backend);
            for blk in &self.blocks {
                let mut attend = |q: &Tensor, k: &Tensor, v: &Tensor| {
                    attention_on(q, k, v, scale, mode, backend)
                };
                x = self.block(blk, &x, (&cos, &sin), None, &mut attend)?.0;
            }
            if self.cfg.shift_logits {
                let rows = self.idx((0..l).map(|p| self.source_row(p)))?;
                x = x.index_select(&rows, 1)?;
            }
            block_def::head(&mut CpuHead { w: self }, &x)
        })
    }

    fn scale(&self) -> f32 {
        1.0 / (self.cfg.head_dim() as f32).sqrt()
    }

    /// The window forward of [`crate::DiffusionLm::forward`] over a cache of `len` rows
    /// (`cached`), writing the window's K/V into `free`. Returns the logits and where the pending
    /// K/V are.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn forward_window<T: KvElem>(
        &self,
        cached: &[CachedRows<'_, T>],
        free: &mut [FreeRows<'_, T>],
        len: usize,
        canvas: &Tensor,
        window: Range<usize>,
        rows: Rows<'_>,
    ) -> Result<(Tensor, Pending)> {
        let (b, _) = canvas.dims2()?;
        let WindowRows { ws, n, hidden_rows } = self.window_rows(rows, window.clone())?;
        let we = window.end;
        let last_rows = hidden_rows.map(|r| self.idx(r)).transpose()?;
        let mut x = self.embed.forward(&canvas.narrow(1, ws, n)?)?;
        let (cos, sin) = self.rope.range(ws, n)?;
        let last = self.blocks.len() - 1;
        // Cached rows of the window's own positions are stale: the window brings fresh ones.
        let skip = Skip::Range {
            start: ws.min(len),
            end: we.min(len),
        };
        let kv = KvGeom::of(self, b);
        for (li, blk) in self.blocks.iter().enumerate() {
            let q_rows = if li == last { last_rows.as_ref() } else { None };
            let c = cached[li];
            let f = &mut free[li];
            let mut attend = |q: &Tensor, k: &Tensor, v: &Tensor| -> Result<Tensor> {
                scatter_rows(k, f.k, 0..n, b, kv.heads, kv.hd)?;
                scatter_rows(v, f.v, 0..n, b, kv.heads, kv.hd)?;
                if q.dim(1)? == 0 {
                    return Ok(q.clone());
                }
                match (&self.ops_backend, self.mode) {
                    (Backend::Cpu, OpMode::Fused) => {
                        let pend = CachedRows { k: &*f.k, v: &*f.v };
                        segment_attention(
                            q,
                            &[(c, len, skip), (pend, n, Skip::None)],
                            kv,
                            self.scale(),
                        )
                    }
                    _ => {
                        let (kk, vv) = materialize(&[(c, len, skip)], k, v, kv, &self.device)?;
                        attention_on(q, &kk, &vv, self.scale(), self.mode, &self.ops_backend)
                    }
                }
            };
            x = self.block(blk, &x, (&cos, &sin), q_rows, &mut attend)?.0;
        }
        let pending = Pending {
            start: ws,
            end: we,
            at: len,
            batch: b,
        };
        Ok((self.logits(&x)?, pending))
    }

    /// The sparse refresh of [`crate::DiffusionLm::compute_refresh`] against `len` cached rows.
    /// The returned [`Refresh`] carries `token`.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn refresh<T: KvElem>(
        &self,
        cached: &[CachedRows<'_, T>],
        len: usize,
        token: SequenceToken,
        canvas: &Tensor,
        positions: &[usize],
        logits: Option<&[usize]>,
    ) -> Result<Refresh> {
        let (b, _) = canvas.dims2()?;
        let mut pos: Vec<usize> = positions.to_vec();
        pos.sort_unstable();
        pos.dedup();
        if pos.is_empty() && logits.is_none_or(<[usize]>::is_empty) {
            // Nothing to recompute (a request that only re-scores).
            return Ok(Refresh {
                positions: Vec::new(),
                keys: Vec::new(),
                values: Vec::new(),
                logits: None,
                scored: Vec::new(),
                token,
                timing: None,
            });
        }
        if let Some(&bad) = pos.iter().find(|&&p| p >= len) {
            return Err(PositionDefect::NotCached {
                what: "refresh",
                position: bad,
                cache_len: len,
            }
            .into());
        }
        let want: Vec<usize> = logits.map(|l| l.to_vec()).unwrap_or_default();
        if let Some(&bad) = want.iter().find(|p| pos.binary_search(p).is_err()) {
            return Err(PositionDefect::NotRefreshed { position: bad }.into());
        }
        if self.cfg.shift_logits {
            pos.extend(want.iter().map(|&p| self.source_row(p)));
            pos.sort_unstable();
            pos.dedup();
        }
        let hidden_rows: Vec<usize> = want
            .iter()
            .map(|&p| {
                pos.binary_search(&self.source_row(p))
                    .expect("source row added above")
            })
            .collect();
        let ids = canvas.index_select(&self.idx(pos.iter().copied())?, 1)?;
        let mut x = self.embed.forward(&ids)?;
        let (cos, sin) = self.rope.gather(&pos)?;
        let last_rows = self.idx(hidden_rows)?;
        let mut keys = Vec::with_capacity(self.blocks.len());
        let mut values = Vec::with_capacity(self.blocks.len());
        let last = self.blocks.len() - 1;
        let kv = KvGeom::of(self, b);
        let skip = Skip::Sorted(&pos);
        for (li, blk) in self.blocks.iter().enumerate() {
            let q_rows = if li == last { Some(&last_rows) } else { None };
            let c = cached[li];
            let mut attend = |q: &Tensor, k: &Tensor, v: &Tensor| -> Result<Tensor> {
                if q.dim(1)? == 0 {
                    return Ok(q.clone());
                }
                match (&self.ops_backend, self.mode) {
                    (Backend::Cpu, OpMode::Fused) => {
                        segment_attention_fresh(q, &[(c, len, skip)], k, v, kv, self.scale())
                    }
                    _ => {
                        let (kk, vv) = materialize(&[(c, len, skip)], k, v, kv, &self.device)?;
                        attention_on(q, &kk, &vv, self.scale(), self.mode, &self.ops_backend)
                    }
                }
            };
            let (nx, k, v) = self.block(blk, &x, (&cos, &sin), q_rows, &mut attend)?;
            x = nx;
            keys.push(k);
            values.push(v);
        }
        let logits = if logits.is_some() {
            Some(self.logits(&x)?)
        } else {
            None
        };
        Ok(Refresh {
            positions: pos,
            keys,
            values,
            logits,
            scored: want,
            token,
            timing: None,
        })
    }
}

/// [`TransformerWeights::window_rows`]: the window's first row `ws` and row count `n`, and the
/// rows (of `0..n`) the logits come from, in request order (`None`: all, in order).
pub(crate) struct WindowRows {
    pub(crate) ws: usize,
    pub(crate) n: usize,
    pub(crate) hidden_rows: Option<Vec<usize>>,
}
