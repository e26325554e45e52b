//! The immutable half of a model: [`TransformerWeights`], shared between sequences (and between the
//! dense forward and the sparse refresh of one sequence) behind an `Arc`.
//!
//! Everything here takes the sequence's KV cache as borrowed slices: a window forward reads the cached
//! rows and writes its fresh K/V into the free rows after them; a refresh reads the cached rows only.
//! Both can therefore run at the same time on two threads (see [`crate::DiffusionTransformer`]).

use std::ops::Range;
use std::sync::Arc;

use candle_core::{DType, Device, Tensor};

use crate::block::Block;
use crate::config::TransformerConfig;
#[cfg(not(feature = "hexagon"))]
use crate::hexagon_off::HexTransformer;
use crate::kv_cache::{CachedRows, FreeRows, KvElem, Pending};
use crate::layers::{Backend, Embedding, Linear, OpMode, RmsNorm, Rope};
use crate::linear::CpuOptions;
use crate::lm::{ModelId, ModelInfo, Refresh, Rows, SequenceToken};

mod cpu_ops;
mod load;
pub(crate) mod parts;
mod segment;
mod stack;
use crate::block_def;
use crate::weights::WeightSource;
use crate::{Error, PositionDefect, Result, WindowDefect};
#[cfg(feature = "hexagon")]
use candle_hexagon::HexTransformer;
use cpu_ops::CpuHead;
use parts::{Group, Main, Part, Parts};

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

    /// The model's logit shift (the one rule for planning rows).
    pub(crate) fn shift(&self) -> crate::shift::Shift {
        crate::shift::Shift::new(self.cfg.shift_logits)
    }

    /// The raw-output row that predicts position `p`.
    pub(crate) fn source_row(&self, p: usize) -> usize {
        self.shift().source(p)
    }

    fn idx(&self, v: impl IntoIterator<Item = usize>) -> Result<Tensor> {
        let v: Vec<u32> = v.into_iter().map(|x| x as u32).collect();
        Ok(Tensor::new(v, &self.device)?)
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
        let ws = self.shift().window_start(window.start);
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
            let x = self.embed.forward(ids)?;
            let (cos, sin) = self.rope.range(0, l)?;
            let mut src = stack::FreshOnly { w: self, kv: None };
            let mut x = self.stack(x, (&cos, &sin), None, &mut src)?;
            if self.shift().on() {
                let rows = self.idx((0..l).map(|p| self.source_row(p)))?;
                x = x.index_select(&rows, 1)?;
            }
            block_def::head(&mut CpuHead { w: self }, &x)
        })
    }

    fn scale(&self) -> f32 {
        1.0 / (self.cfg.head_dim() as f32).sqrt()
    }

    /// The parts of a window forward of one sequence over a cache of `len` rows (`cached`),
    /// writing the window's K/V into `free`, with a verification group per `verify` position
    /// (its rows, then one masked row per position it hides: `hidden[k]`, none when empty).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn window_part<'a, T: KvElem>(
        &self,
        cached: Vec<CachedRows<'a, T>>,
        free: Vec<FreeRows<'a, T>>,
        len: usize,
        canvas: Vec<Vec<u32>>,
        window: Range<usize>,
        rows: Rows<'_>,
        (verify, hidden): (&[usize], &[Vec<usize>]),
    ) -> Result<(Part<'a, T>, Pending)> {
        let b = canvas.len();
        let WindowRows { ws, n, hidden_rows } = self.window_rows(rows, window.clone())?;
        let pending = Pending {
            start: ws,
            end: window.end,
            at: len,
            batch: b,
        };
        let shift = self.shift();
        let part = Part {
            b,
            len,
            cached,
            main: Main::Window { ws, n, free },
            groups: (verify.iter().enumerate())
                .map(|(k, &p)| Group::hiding(p, shift, hidden.get(k).map_or(&[], Vec::as_slice)))
                .collect(),
            main_out: hidden_rows.unwrap_or_else(|| (0..n).collect()),
            canvas,
        };
        Ok((part, pending))
    }

    /// Run parts (of one or many sequences) through the stack on this model's pool.
    pub(crate) fn run_parts<T: KvElem>(
        &self,
        parts: &mut [Part<'_, T>],
    ) -> Result<Vec<parts::PartLogits>> {
        self.install(|| Parts::run(self, parts))
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
        let free: Vec<FreeRows<'_, T>> = free
            .iter_mut()
            .map(|f| FreeRows {
                k: &mut *f.k,
                v: &mut *f.v,
            })
            .collect();
        let ids = canvas.to_vec2::<u32>()?;
        let (part, pending) =
            self.window_part(cached.to_vec(), free, len, ids, window, rows, (&[], &[]))?;
        let mut out = Parts::run(self, &mut [part])?;
        Ok((out.remove(0).0, pending))
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
        let empty = Refresh {
            positions: Vec::new(),
            keys: Vec::new(),
            values: Vec::new(),
            logits: None,
            scored: Vec::new(),
            token,
            timing: None,
        };
        if pos.is_empty() && logits.is_none_or(<[usize]>::is_empty) {
            // Nothing to recompute (a request that only re-scores).
            return Ok(empty);
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
        if self.shift().on() {
            pos.extend(want.iter().map(|&p| self.source_row(p)));
            pos.sort_unstable();
            pos.dedup();
        }
        let main_out: Vec<usize> = want
            .iter()
            .map(|&p| {
                pos.binary_search(&self.source_row(p))
                    .expect("source row added above")
            })
            .collect();
        let part = Part {
            b,
            len,
            cached: cached.to_vec(),
            main: Main::Refresh {
                pos: pos.clone(),
                keys: Vec::with_capacity(self.blocks.len()),
                values: Vec::with_capacity(self.blocks.len()),
            },
            groups: Vec::new(),
            main_out,
            canvas: canvas.to_vec2::<u32>()?,
        };
        let mut parts = [part];
        let out = Parts::run(self, &mut parts)?.remove(0).0;
        let [part] = parts;
        let Main::Refresh { keys, values, .. } = part.main else {
            return Err(Error::Internal {
                what: "a refresh part that changed kind",
            });
        };
        Ok(Refresh {
            positions: pos,
            keys,
            values,
            logits: logits.is_some().then_some(out),
            scored: want,
            ..empty
        })
    }

    /// Logits `(batch, positions, vocab)` of each of `positions` (cached, unique) predicted with
    /// that position alone masked and every other position as `canvas` holds it, attending to the
    /// cached rows `[0, len)`: one group per position (see [`parts`]).
    pub(crate) fn rescore<T: KvElem>(
        &self,
        cached: &[CachedRows<'_, T>],
        len: usize,
        canvas: &Tensor,
        positions: &[usize],
    ) -> Result<Tensor> {
        let (b, l) = canvas.dims2()?;
        let mut seen = positions.to_vec();
        seen.sort_unstable();
        if let Some(w) = seen.windows(2).find(|w| w[0] == w[1]) {
            return Err(PositionDefect::Repeated {
                what: "re-score",
                positions: positions.to_vec(),
                position: w[0],
            }
            .into());
        }
        let shift = self.shift();
        if let Some(&bad) = positions
            .iter()
            .find(|&&p| p >= len || p >= l || !shift.scorable(p))
        {
            return Err(PositionDefect::NotRescorable {
                position: bad,
                cache_len: len,
                canvas_len: l,
            }
            .into());
        }
        let part = Part {
            b,
            len,
            cached: cached.to_vec(),
            main: Main::Refresh {
                pos: Vec::new(),
                keys: Vec::new(),
                values: Vec::new(),
            },
            groups: positions.iter().map(|&p| Group::of(p, shift)).collect(),
            main_out: Vec::new(),
            canvas: canvas.to_vec2::<u32>()?,
        };
        Ok(Parts::run(self, &mut [part])?.remove(0).1)
    }
}

/// [`TransformerWeights::window_rows`]: the window's first row `ws` and row count `n`, and the
/// rows (of `0..n`) the logits come from, in request order (`None`: all, in order).
pub(crate) struct WindowRows {
    pub(crate) ws: usize,
    pub(crate) n: usize,
    pub(crate) hidden_rows: Option<Vec<usize>>,
}
