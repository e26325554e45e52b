//! The immutable half of a model: [`TransformerWeights`], shared between sequences (and between the
//! dense forward and the sparse refresh of one sequence) behind an `Arc`.
//!
//! Everything here takes the sequence's KV cache as borrowed slices: a window forward reads the cached
//! rows and writes its fresh K/V into the free rows after them; a refresh reads the cached rows only.
//! Both can therefore run at the same time on two threads (see [`crate::DiffusionTransformer`]).

use std::ops::Range;
use std::sync::Arc;

use candle_core::{DType, Device, Tensor};

use crate::block::{Block, GateUp, Qkv};
use crate::config::{MatrixDims, TransformerConfig};
#[cfg(not(feature = "hexagon"))]
use crate::hexagon_off::HexTransformer;
use crate::kv_cache::{CachedRows, FreeRows, KvElem, Pending};
use crate::layers::{Backend, Embedding, Linear, OpMode, RmsNorm, Rope};
use crate::linear::{dense, CpuLinear, CpuLinears, CpuOptions};
use crate::lm::{ModelId, ModelInfo, Refresh, Rows, SequenceToken};
#[cfg(feature = "hexagon")]
use crate::npu_load::{place_blocks, shared_block, shared_head};
#[cfg(not(feature = "hexagon"))]
use crate::npu_load_off::{place_blocks, shared_block, shared_head};

mod cpu_ops;
pub(crate) mod parts;
mod segment;
mod stack;
use crate::block_def;
use crate::role::Role;
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

/// Give the pages of the load's freed transient copies back to the system. Each tensor is read
/// and packed through a few buffers of its size; glibc keeps freed blocks of that size in its
/// heap, where later packed matrices and reads interleave with them, so without this the resident
/// size after loading grew by about a third of the weights (F32 GGUF of 97.5M parameters: 488 MiB
/// resident for 372 MiB of weights; glibc's `malloc_trim` hands the free pages inside the heap
/// back). Other allocators return large blocks themselves.
fn release_freed_pages() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: `malloc_trim` only releases free memory of glibc's allocator; it takes no pointers.
    unsafe {
        libc::malloc_trim(0);
    }
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

    /// [`new`](Self::new) with explicit [`CpuOptions`]: what runs the linear layers, and the
    /// model's own pool of `threads` threads (an error naming the count outside
    /// `1..=MAX_THREADS`). The options belong to this model only.
    pub fn new_with(
        cfg: TransformerConfig,
        w: &dyn WeightSource,
        mode: OpMode,
        backend: &Backend,
        cpu: CpuOptions,
    ) -> Result<Self> {
        let pool = cpu.threads.map(crate::threads::pool).transpose()?;
        match cpu.kv_dtype {
            None | Some(DType::F32 | DType::F16 | DType::BF16) => {}
            Some(dtype) => {
                return Err(Error::UnsupportedDtype {
                    what: "the KV cache",
                    dtype,
                })
            }
        }
        let which = cpu.linears;
        if backend.hexagon().is_some() && mode != OpMode::Fused {
            return Err(Error::HexagonNeedsFused {
                mode: format!("{mode:?}"),
            });
        }
        // Everything the config implies is checked against the checkpoint's tensor list (names,
        // shapes, layer count) and the machine's memory before anything is read or allocated.
        w.check_layout(&cfg)?;
        crate::limits::check_memory("the model's parameters", w.resident_bytes(&cfg))?;
        // The block-level module first: when the device takes the whole stack, the layers built
        // below (refresh path) run kernels-cpu over the module's packed host bytes.
        let hex = match backend.hexagon() {
            Some(dev) if mode == OpMode::Fused => place_blocks(dev, &cfg, w)?,
            _ => None,
        };
        if let (Some(_), Some(dtype)) = (&hex, cpu.kv_dtype) {
            if dtype != DType::F16 {
                return Err(Error::UnsupportedDtype {
                    what: "the K/V cache of a model on the NPU (it keeps its cache in fp16)",
                    dtype,
                });
            }
        }
        let ops_backend = if hex.is_some() {
            Backend::Cpu
        } else {
            backend.clone()
        };
        let user_backend = backend.clone();
        let backend_for_layers = ops_backend.clone();
        let backend = &backend_for_layers;
        let (h, hd) = (cfg.hidden_size, cfg.head_dim());
        let MatrixDims {
            nq,
            nkv,
            ff,
            vocab: v,
        } = cfg.matrix_dims();
        let dtype = w.dtype();
        let device = w.device().clone();
        let eps = cfg.rms_norm_eps as f32;
        let norm = |role: Role| -> Result<RmsNorm> {
            Ok(RmsNorm::on_backend(
                dense(w.get(role, &[h])?, role)?,
                eps,
                backend,
            ))
        };
        let bias = |role: Role, n: usize| -> Result<Option<Tensor>> {
            if cfg.qkv_bias {
                Ok(Some(dense(w.get(role, &[n])?, role)?))
            } else {
                Ok(None)
            }
        };
        let prepare = |l: Linear| -> Result<Linear> {
            match mode {
                OpMode::Fused => l.for_inference(which),
                OpMode::Differentiable => Ok(l),
            }
        };
        // Inference on the CPU over packed GEMMs: a source that can stream a matrix from its
        // file into the packed tiles does so (no whole copy of it in another layout on the way).
        let stream =
            matches!(backend, Backend::Cpu) && mode == OpMode::Fused && which == CpuLinears::Packed;
        let packed = |role: Role, out: usize, inp: usize| -> Result<Option<CpuLinear>> {
            if stream {
                w.get_packed(role, &[out, inp])
            } else {
                Ok(None)
            }
        };
        let lin = |role: Role, out: usize, inp: usize, b: Option<Tensor>| -> Result<Linear> {
            if let Some(c) = packed(role, out, inp)? {
                return Ok(Linear::Cpu(c.with_bias(b.as_ref())?));
            }
            prepare(Linear::on_backend(
                w.get(role, &[out, inp])?,
                b,
                backend,
                which,
            )?)
        };
        // The embedding and the head first: they are the largest tensors, and the copies a read
        // and a pack make of them (where the source cannot stream them into tiles) pass while
        // little else is resident (peak memory of a load is the resident weights plus the
        // transient copies of the tensor being read).
        let npu_head = match &hex {
            Some(hex) => shared_head(hex, &cfg)?,
            None => None,
        };
        let (embed, head) = match packed(Role::Embed, v, h)? {
            // A tied head and the embedding gather read the same tiles.
            Some(table) => {
                let head = match npu_head {
                    Some(head) => head,
                    None if cfg.tie_word_embeddings => Linear::Cpu(table.clone()),
                    None => lin(Role::Head, v, h, None)?,
                };
                (Embedding::packed(table, dtype), head)
            }
            None => {
                let embed_p = w.get(Role::Embed, &[v, h])?;
                let head = match npu_head {
                    Some(head) => head,
                    None if cfg.tie_word_embeddings => {
                        prepare(Linear::on_backend(embed_p.clone(), None, backend, which)?)?
                    }
                    None => lin(Role::Head, v, h, None)?,
                };
                (Embedding::new(embed_p, dtype), head)
            }
        };
        release_freed_pages();
        let mut blocks = Vec::with_capacity(cfg.num_layers);
        for i in 0..cfg.num_layers {
            let (attn_norm, ffn_norm) = (norm(Role::AttnNorm(i))?, norm(Role::FfnNorm(i))?);
            let (qb, kb, vb) = (
                bias(Role::QBias(i), nq)?,
                bias(Role::KBias(i), nkv)?,
                bias(Role::VBias(i), nkv)?,
            );
            blocks.push(match &hex {
                // The NPU holds the stack: the CPU layers (the refresh path) read its packed
                // bytes in place instead of packing a second copy.
                Some(hex) => {
                    let fused_bias = match (qb, kb, vb) {
                        (Some(q), Some(k), Some(v)) => Some(Tensor::cat(&[q, k, v], 0)?),
                        _ => None,
                    };
                    let (qkv, o, gate_up, down) = shared_block(hex, i, &cfg, fused_bias.as_ref())?;
                    Block {
                        attn_norm,
                        qkv,
                        o,
                        ffn_norm,
                        gate_up,
                        down,
                    }
                }
                None => Block {
                    attn_norm,
                    qkv: Qkv::Split {
                        q: lin(Role::Q(i), nq, h, qb)?,
                        k: lin(Role::K(i), nkv, h, kb)?,
                        v: lin(Role::V(i), nkv, h, vb)?,
                    },
                    o: lin(Role::O(i), h, nq, None)?,
                    ffn_norm,
                    gate_up: GateUp::Split {
                        gate: lin(Role::Gate(i), ff, h, None)?,
                        up: lin(Role::Up(i), ff, h, None)?,
                    },
                    down: lin(Role::Down(i), h, ff, None)?,
                },
            });
            release_freed_pages();
        }
        let norm_f = norm(Role::FinalNorm)?;
        let rope = Rope::new(
            cfg.rope_theta,
            hd,
            cfg.max_seq_len.min(4096),
            dtype,
            &device,
        )?;
        let num_params = cfg.param_count().unwrap_or(u64::MAX) as usize;
        let info = ModelInfo {
            arch: cfg.arch,
            vocab_size: v,
            hidden_size: h,
            num_layers: cfg.num_layers,
            num_heads: cfg.num_heads,
            num_kv_heads: cfg.num_kv_heads,
            head_dim: hd,
            intermediate_size: ff,
            max_seq_len: cfg.max_seq_len,
            shift_logits: cfg.shift_logits,
            special: cfg.special.clone(),
            dtype,
            num_params,
        };
        Ok(Self {
            id: ModelId::fresh(),
            cpu,
            pool,
            cfg,
            info,
            device,
            mode,
            backend: user_backend,
            ops_backend,
            hex,
            embed,
            blocks,
            norm: norm_f,
            head,
            rope,
        })
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
    /// writing the window's K/V into `free`, with a verification group per `verify` position.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn window_part<'a, T: KvElem>(
        &self,
        cached: Vec<CachedRows<'a, T>>,
        free: Vec<FreeRows<'a, T>>,
        len: usize,
        canvas: Vec<Vec<u32>>,
        window: Range<usize>,
        rows: Rows<'_>,
        verify: &[usize],
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
            groups: verify.iter().map(|&p| Group::of(p, shift)).collect(),
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
            self.window_part(cached.to_vec(), free, len, ids, window, rows, &[])?;
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
