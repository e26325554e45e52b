//! [`DiffusionTransformer`]: shared weights ([`TransformerWeights`], behind an `Arc`) plus the state
//! of one sequence (its KV cache, the pending K/V of the last forward, and its token: sequence id
//! and epoch), implementing
//! [`DiffusionLm`].
//!
//! LLaDA and Dream are the same block (pre-RMSNorm, RoPE attention, SwiGLU MLP); they differ in
//! tensor names, q/k/v biases, GQA and the logit shift, all captured by [`TransformerConfig`].
//!
//! ## State and epochs
//!
//! The cache changes only through `commit`, `apply_refresh`, `truncate_cache` and `clear_cache`;
//! each bumps the sequence's *epoch*. A forward does not change the cache (its K/V wait in the free
//! rows after it), so a sparse refresh computed against epoch `e` can run beside it and is merged
//! only if the cache is still at `e` — otherwise [`Error::StaleRefresh`]. Every sequence has a
//! process-unique id and every model ([`TransformerWeights::id`]) one too; a refresh carries all
//! three ([`SequenceToken`]), so one computed for another sequence or by another model is rejected
//! ([`Error::RefreshFromOtherSequence`], [`Error::RefreshFromOtherModel`]). `apply_refresh` checks
//! the token and the refresh's contents (positions sorted, unique and cached; one K/V row per
//! position in every layer, of the cache's shape: [`Error::MalformedRefresh`]) before it writes a
//! byte, so a rejected refresh leaves the cache untouched. The dual path of the paper
//! is [`DiffusionLm::forward_with_refresh`]: the refresh runs on a second thread while this thread
//! runs the window, both reading the same cached rows, and the caller merges at the step boundary.

use std::ops::Range;
use std::sync::Arc;
use std::time::Instant;

use candle_core::{DType, Device, Tensor};
use half::{bf16, f16};

pub use crate::config::{ConfigNames, TransformerConfig};
use crate::error::{CanvasDefect, PositionDefect, RefreshDefect, WindowDefect};
#[cfg(not(feature = "hexagon"))]
use crate::hexagon_off::DeviceKv;
use crate::kv_cache::{self, KvCache, KvElem, KvRows, Pending};
use crate::layers::{Backend, OpMode};
use crate::linear::CpuOptions;
use crate::lm::{
    DiffusionLm, DualPathTiming, ModelInfo, Refresh, RefreshRequest, Rows, SequenceToken,
    SpecialTokens,
};
#[cfg(feature = "hexagon")]
use crate::npu_seq;
#[cfg(not(feature = "hexagon"))]
use crate::npu_seq_off as npu_seq;
use crate::weights::WeightSource;
pub use crate::weights_model::{CpuLinearBytes, TransformerWeights};
use crate::{Error, Result};
#[cfg(feature = "hexagon")]
use candle_hexagon::DeviceKv;

mod many;

/// LLaDA / Dream: shared weights plus one sequence's KV cache, with a windowed forward.
#[derive(Debug)]
pub struct DiffusionTransformer {
    weights: Arc<TransformerWeights>,
    /// The sequence's KV cache: host or device, never both.
    kv: SeqKv,
    pending: Option<Pending>,
    /// The model's id, this sequence's id and the cache's epoch.
    token: SequenceToken,
    last_dual: Option<DualPathTiming>,
    /// The threads of the last CPU dual path: (the window forward's, the refresh's).
    last_dual_threads: Option<(std::thread::ThreadId, std::thread::ThreadId)>,
}

/// One sequence's KV cache: in host memory (the CPU path, and the per-op NPU path), or in device
/// memory when the weights run on the NPU's block-level module — created at the first forward,
/// when the batch is known. The CPU refresh of an NPU-held model reads the device cache in place.
#[derive(Debug)]
enum SeqKv {
    Host(KvCache),
    Device(Option<DeviceKv>),
}

impl SeqKv {
    fn len(&self) -> usize {
        match self {
            SeqKv::Host(c) => c.len(),
            SeqKv::Device(Some(kv)) => kv.len(),
            SeqKv::Device(None) => 0,
        }
    }

    fn batch(&self) -> usize {
        match self {
            SeqKv::Host(c) => c.batch(),
            SeqKv::Device(Some(kv)) => kv.batch(),
            SeqKv::Device(None) => 0,
        }
    }

    /// The rows the window protocol runs over (none before a device cache's first forward).
    fn rows_mut(&mut self) -> Option<&mut dyn KvRows> {
        match self {
            SeqKv::Host(c) => Some(c),
            SeqKv::Device(Some(kv)) => Some(kv),
            SeqKv::Device(None) => None,
        }
    }

    /// The device cache with rows in it, for a refresh or re-score (`what`).
    fn device_rows(&self, what: &'static str, positions: &[usize]) -> Result<&DeviceKv> {
        match self {
            SeqKv::Device(Some(kv)) if !kv.is_empty() => Ok(kv),
            _ => Err(empty_cache(what, positions)),
        }
    }
}

impl DiffusionTransformer {
    /// Build from a validated config and a weight source (CPU backend).
    pub fn new(cfg: TransformerConfig, w: &dyn WeightSource, mode: OpMode) -> Result<Self> {
        Self::new_on(cfg, w, mode, &Backend::Cpu)
    }

    /// Build on `backend`: with [`Backend::Hexagon`] the linear layers' weights are packed into
    /// NPU memory (where the device takes them) and the fused ops run on the NPU. The model code
    /// is the same as on the CPU; only the layers' backend differs.
    pub fn new_on(
        cfg: TransformerConfig,
        w: &dyn WeightSource,
        mode: OpMode,
        backend: &Backend,
    ) -> Result<Self> {
        Self::new_with(cfg, w, mode, backend, CpuOptions::default())
    }

    /// [`new_on`](Self::new_on) with explicit [`CpuOptions`] (what runs the linear layers, the
    /// model's own thread pool), held by this model's weights only.
    pub fn new_with(
        cfg: TransformerConfig,
        w: &dyn WeightSource,
        mode: OpMode,
        backend: &Backend,
        cpu: CpuOptions,
    ) -> Result<Self> {
        Self::from_weights(Arc::new(TransformerWeights::new_with(
            cfg, w, mode, backend, cpu,
        )?))
    }

    /// A new sequence (empty cache, a fresh sequence id, epoch 0) over shared weights.
    pub fn from_weights(weights: Arc<TransformerWeights>) -> Result<Self> {
        let c = &weights.cfg;
        let kv = if weights.hex.is_some() {
            SeqKv::Device(None)
        } else {
            SeqKv::Host(KvCache::new(
                c.num_layers,
                c.num_kv_heads,
                c.head_dim(),
                weights.cpu_options().kv_dtype.unwrap_or(weights.info.dtype),
            )?)
        };
        Ok(Self {
            token: SequenceToken::new_sequence(weights.id()),
            weights,
            kv,
            pending: None,
            last_dual: None,
            last_dual_threads: None,
        })
    }

    /// Another sequence over the same weights (no copy of the weights; its own empty cache).
    /// Sequences are independent: two run on two threads at once.
    ///
    /// ```
    /// use dllm_models::candle_core::{Device, Tensor};
    /// use dllm_models::{load, DiffusionLm, LoadOptions, ModelSource, Rows};
    ///
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../models/tiny-llada");
    /// let loaded = load(&ModelSource::parse(dir)?, &LoadOptions::default())?;
    /// let (mut a, mut b) = (loaded.model.new_sequence()?, loaded.model.new_sequence()?);
    /// let canvas = Tensor::new(&[[2u32, 10, 11, 5, 5]], &Device::Cpu)?;
    /// let (la, lb) = std::thread::scope(|s| {
    ///     let ha = s.spawn(|| a.forward_full(&canvas, Rows::All));
    ///     let hb = s.spawn(|| b.forward_full(&canvas, Rows::All));
    ///     (ha.join().unwrap(), hb.join().unwrap())
    /// });
    /// assert_eq!(la?.to_vec3::<f32>()?, lb?.to_vec3::<f32>()?);
    /// # Ok(())
    /// # }
    /// ```
    pub fn new_sequence(&self) -> Result<Self> {
        Self::from_weights(self.weights.clone())
    }

    /// The shared weights.
    pub fn weights(&self) -> &Arc<TransformerWeights> {
        &self.weights
    }

    /// The normalised config.
    pub fn config(&self) -> &TransformerConfig {
        &self.weights.cfg
    }

    /// Replace the special tokens (e.g. with ids found in the tokenizer). Only possible while the
    /// weights are not shared with another sequence.
    pub fn set_special_tokens(&mut self, special: SpecialTokens) -> Result<()> {
        let w = Arc::get_mut(&mut self.weights).ok_or(Error::SharedWeights {
            what: "special tokens",
        })?;
        w.info.special = special.clone();
        w.cfg.special = special;
        Ok(())
    }

    /// The backend the model was built on.
    pub fn backend(&self) -> &Backend {
        &self.weights.backend
    }

    /// Bytes held by the KV cache buffers (host or device).
    pub fn cache_bytes(&self) -> usize {
        match &self.kv {
            SeqKv::Device(Some(kv)) => {
                2 * kv.layers() * kv.capacity() * kv.batch() * kv.kv_heads() * kv.head_dim() * 2
            }
            SeqKv::Device(None) => 0,
            SeqKv::Host(c) => c.bytes(),
        }
    }

    /// Whether forwards run on the NPU's block-level module (one DSP batch per block).
    pub fn runs_blocks_on_npu(&self) -> bool {
        self.weights.hex.is_some()
    }

    fn len(&self) -> usize {
        self.kv.len()
    }

    /// The timing of the last [`DiffusionLm::forward_with_refresh`] (None before the first).
    pub fn last_dual_path(&self) -> Option<DualPathTiming> {
        self.last_dual
    }

    /// The threads of the last CPU [`DiffusionLm::forward_with_refresh`]: the window forward's
    /// (the caller's) and the refresh's, which is its own (None before the first, and on the NPU,
    /// where the DSP runs the forward and the caller the refresh). These are the threads that run
    /// each path; with a pool of its own (`CpuOptions::threads`) the model runs both paths'
    /// kernels on the pool's workers.
    pub fn last_dual_path_threads(&self) -> Option<(std::thread::ThreadId, std::thread::ThreadId)> {
        self.last_dual_threads
    }

    /// Full training forward (see [`TransformerWeights::forward_train`]).
    pub fn forward_train(&self, ids: &Tensor) -> Result<Tensor> {
        self.weights.forward_train(ids)
    }

    fn check_canvas(&self, canvas: &Tensor) -> Result<(usize, usize)> {
        let (b, l) = canvas.dims2().map_err(|_| {
            Error::from(CanvasDefect::Shape {
                dims: canvas.dims().to_vec(),
            })
        })?;
        if canvas.dtype() != DType::U32 {
            return Err(CanvasDefect::Dtype {
                dtype: canvas.dtype(),
            }
            .into());
        }
        let max = self.weights.cfg.max_seq_len;
        if l > max {
            return Err(CanvasDefect::TooLong { len: l, max }.into());
        }
        if b == 0 || l == 0 {
            return Err(CanvasDefect::Empty { batch: b, len: l }.into());
        }
        match &self.kv {
            SeqKv::Host(c) => c.check_batch(b)?,
            SeqKv::Device(Some(kv)) if !kv.is_empty() && kv.batch() != b => {
                return Err(CanvasDefect::BatchMismatch {
                    batch: b,
                    cached: kv.batch(),
                }
                .into());
            }
            SeqKv::Device(_) => {}
        }
        Ok((b, l))
    }

    fn check_window(&self, canvas: &Tensor, window: &Range<usize>) -> Result<usize> {
        let (b, l) = self.check_canvas(canvas)?;
        if window.start >= window.end || window.end > l {
            return Err(WindowDefect::OutsideCanvas {
                window: window.clone(),
                canvas_len: l,
            }
            .into());
        }
        if window.start > self.len() {
            return Err(WindowDefect::PastCache {
                start: window.start,
                cache_len: self.len(),
            }
            .into());
        }
        Ok(b)
    }

    fn bump(&mut self) {
        self.token.epoch += 1;
    }

    /// A copy of every layer's cached K/V, each `(batch, cache_len, kv_heads, head_dim)` in the
    /// cache's dtype (f16 on the NPU), keys with RoPE applied; empty when nothing is cached. For
    /// tests and debugging (it copies the whole cache).
    pub fn cache_snapshot(&self) -> Result<Vec<(Tensor, Tensor)>> {
        let len = self.len();
        if len == 0 {
            return Ok(Vec::new());
        }
        let layers = self.weights.cfg.num_layers;
        match &self.kv {
            SeqKv::Device(Some(kv)) => (0..layers)
                .map(|li| Ok(kv.read_rows(li, 0..len)?))
                .collect(),
            SeqKv::Device(None) => Ok(Vec::new()),
            SeqKv::Host(c) => (0..layers)
                .map(|li| {
                    let (k, v) = c.layer_tensors(li, &self.weights.device)?;
                    Ok((k.contiguous()?, v.contiguous()?))
                })
                .collect(),
        }
    }

    /// Everything [`DiffusionLm::apply_refresh`] checks before it writes: the token, then the
    /// positions, then every layer's key and value shapes against the cache.
    fn check_refresh(&self, r: &Refresh) -> Result<()> {
        let (got, me) = (r.token, self.token);
        if got.model != me.model {
            return Err(Error::RefreshFromOtherModel {
                computed: got.model,
                current: me.model,
            });
        }
        if got.sequence != me.sequence {
            return Err(Error::RefreshFromOtherSequence {
                computed: got.sequence,
                current: me.sequence,
            });
        }
        if got.epoch != me.epoch {
            return Err(Error::StaleRefresh {
                computed: got.epoch,
                current: me.epoch,
            });
        }
        if r.positions.is_empty() && r.keys.is_empty() && r.values.is_empty() {
            // A refresh that only re-scored: nothing to merge.
            return Ok(());
        }
        for (index, pair) in r.positions.windows(2).enumerate() {
            let (previous, position) = (pair[0], pair[1]);
            if position == previous {
                return Err(RefreshDefect::DuplicatePosition {
                    index: index + 1,
                    position,
                }
                .into());
            }
            if position < previous {
                return Err(RefreshDefect::UnsortedPositions {
                    index: index + 1,
                    position,
                    previous,
                }
                .into());
            }
        }
        let cache_len = self.len();
        if let Some(&position) = r.positions.last().filter(|&&p| p >= cache_len) {
            return Err(RefreshDefect::PositionNotCached {
                position,
                cache_len,
            }
            .into());
        }
        let c = &self.weights.cfg;
        let layers = c.num_layers;
        let batch = self.kv.batch();
        let n = r.positions.len();
        let expected = vec![batch, n, c.num_kv_heads, c.head_dim()];
        for (tensor, ts) in [("keys", &r.keys), ("values", &r.values)] {
            if ts.len() != layers {
                return Err(RefreshDefect::LayerCount {
                    tensor,
                    got: ts.len(),
                    expected: layers,
                }
                .into());
            }
            for (layer, t) in ts.iter().enumerate() {
                let got = t.dims();
                if got.len() == 4 && got[1] != n {
                    return Err(RefreshDefect::RowCount {
                        layer,
                        tensor,
                        rows: got[1],
                        positions: n,
                    }
                    .into());
                }
                if got != expected.as_slice() {
                    return Err(RefreshDefect::Shape {
                        layer,
                        tensor,
                        got: got.to_vec(),
                        expected,
                    }
                    .into());
                }
            }
        }
        Ok(())
    }

    /// Forward (and, with `refresh`, a concurrent refresh) with the cache in element type `T`.
    fn run<T: KvElem>(
        &mut self,
        canvas: &Tensor,
        window: Range<usize>,
        rows: Rows<'_>,
        refresh: Option<RefreshRequest<'_>>,
    ) -> Result<(Tensor, Option<Refresh>)> {
        let SeqKv::Host(cache) = &mut self.kv else {
            return Err(Error::Internal {
                what: "a CPU forward of a sequence whose cache is on the device",
            });
        };
        let len = cache.len();
        let token = self.token;
        let w = &*self.weights;
        let (cached, mut free) = cache.split::<T>().ok_or(Error::Internal {
            what: "the KV cache's buffers are not of the dtype it stores",
        })?;
        let fwd = |free: &mut [crate::kv_cache::FreeRows<'_, T>]| {
            w.forward_window(&cached, free, len, canvas, window.clone(), rows)
        };
        let mut timing = None;
        let mut threads = None;
        let (logits, pending, refreshed) = match refresh {
            None => {
                let (l, p) = w.install(|| fwd(&mut free))?;
                (l, p, None)
            }
            Some(r) => {
                // The dual path: the refresh reads the cached rows on its own thread while this
                // thread runs the window (which reads the same rows and writes only free rows).
                let cached_ref = &cached;
                std::thread::scope(|s| -> Result<_> {
                    let (started, is_running) = std::sync::mpsc::channel();
                    let h = s.spawn(move || {
                        let t0 = Instant::now();
                        let _ = started.send(());
                        let r = w.install(|| {
                            r.run_with(
                                canvas,
                                |c, p, l| w.refresh(cached_ref, len, token, c, p, l),
                                |c, p| w.rescore(cached_ref, len, c, p),
                            )
                        });
                        (r, (t0, Instant::now()), std::thread::current().id())
                    });
                    // Start the forward once the refresh is running, so the two really overlap.
                    let _ = is_running.recv();
                    let t0 = Instant::now();
                    let f = w.install(|| fwd(&mut free));
                    let forward = (t0, Instant::now());
                    let (rf, refresh, refresh_thread) =
                        h.join().map_err(|_| Error::RefreshThreadPanicked)?;
                    timing = Some(DualPathTiming { forward, refresh });
                    threads = Some((std::thread::current().id(), refresh_thread));
                    let (l, p) = f?;
                    let mut rf = rf?;
                    rf.timing = timing;
                    Ok((l, p, Some(rf)))
                })?
            }
        };
        self.pending = Some(pending);
        if timing.is_some() {
            self.last_dual = timing;
            self.last_dual_threads = threads;
        }
        Ok((logits, refreshed))
    }

    fn dispatch(
        &mut self,
        canvas: &Tensor,
        window: Range<usize>,
        rows: Rows<'_>,
        refresh: Option<RefreshRequest<'_>>,
    ) -> Result<(Tensor, Option<Refresh>)> {
        let b = self.check_window(canvas, &window)?;
        // Room for the window's K/V after the cache (a shifted model forwards one more row).
        let n = self.weights.shift().window_rows(window.len());
        let len = self.len();
        if let (Some(hex), SeqKv::Device(kv)) = (self.weights.hex.clone(), &mut self.kv) {
            let (window_start, window_end) = (window.start, window.end);
            self.pending = None;
            let kv = npu_seq::ensure_kv(&hex, kv, b, len + n)?;
            let (w, token) = (&*self.weights, self.token);
            let r =
                w.install(|| npu_seq::forward(w, &hex, kv, token, canvas, window, rows, refresh))?;
            if let Some(t) = r.1.as_ref().and_then(|r| r.timing) {
                self.last_dual = Some(t);
            }
            let start = self.weights.shift().window_start(window_start);
            self.pending = Some(Pending {
                start,
                end: window_end,
                at: len,
                batch: b,
            });
            return Ok(r);
        }
        let SeqKv::Host(cache) = &mut self.kv else {
            return Err(Error::Internal {
                what: "an NPU-held sequence without its module",
            });
        };
        cache.reserve(b, len + n)?;
        self.pending = None;
        match cache.dtype() {
            DType::F32 => self.run::<f32>(canvas, window, rows, refresh),
            DType::F16 => self.run::<f16>(canvas, window, rows, refresh),
            _ => self.run::<bf16>(canvas, window, rows, refresh),
        }
    }
}

impl DiffusionLm for DiffusionTransformer {
    fn info(&self) -> &ModelInfo {
        &self.weights.info
    }

    fn answer(&mut self, ask: &crate::Ask) -> Result<crate::Answer> {
        let mut one = [(self, ask)];
        Ok(Self::forward_many(&mut one)?.remove(0))
    }

    fn device(&self) -> &Device {
        &self.weights.device
    }

    fn forward(&mut self, canvas: &Tensor, window: Range<usize>, rows: Rows<'_>) -> Result<Tensor> {
        Ok(self.dispatch(canvas, window, rows, None)?.0)
    }

    fn forward_with_refresh(
        &mut self,
        canvas: &Tensor,
        window: Range<usize>,
        rows: Rows<'_>,
        refresh: RefreshRequest<'_>,
    ) -> Result<(Tensor, Refresh)> {
        let (l, r) = self.dispatch(canvas, window, rows, Some(refresh))?;
        let r = r.ok_or(Error::Internal {
            what: "a forward with a refresh request returned no refresh",
        })?;
        Ok((l, r))
    }

    fn commit(&mut self, range: Range<usize>) -> Result<()> {
        let p = self.pending.ok_or(WindowDefect::CommitWithoutForward)?;
        let rows = self
            .kv
            .rows_mut()
            .ok_or(WindowDefect::CommitWithoutForward)?;
        let empty = range.is_empty();
        if kv_cache::commit_window(rows, &p, range)? {
            // The move overwrote pending rows of other positions: they can no longer be
            // committed.
            self.pending = None;
        }
        if !empty {
            self.bump();
        }
        Ok(())
    }

    fn cache_len(&self) -> usize {
        self.len()
    }

    fn truncate_cache(&mut self, len: usize) -> Result<()> {
        self.pending = None;
        match self.kv.rows_mut() {
            Some(rows) => kv_cache::truncate_rows(rows, len)?,
            None if len == 0 => {}
            None => return Err(WindowDefect::RollForward { from: 0, to: len }.into()),
        }
        self.bump();
        Ok(())
    }

    fn token(&self) -> SequenceToken {
        self.token
    }

    fn compute_refresh(
        &self,
        canvas: &Tensor,
        positions: &[usize],
        logits: Option<&[usize]>,
    ) -> Result<Refresh> {
        self.weights.install(|| {
            self.check_canvas(canvas)?;
            let w = &*self.weights;
            let cache = match &self.kv {
                SeqKv::Host(c) => c,
                SeqKv::Device(_) => {
                    let kv = self.kv.device_rows("refresh", positions)?;
                    return npu_seq::refresh_on_cpu(w, kv, self.token, canvas, positions, logits);
                }
            };
            let len = cache.len();
            macro_rules! go {
                ($t:ty) => {{
                    let cached = cache
                        .cached::<$t>()
                        .ok_or_else(|| empty_cache("refresh", positions))?;
                    w.refresh::<$t>(&cached, len, self.token, canvas, positions, logits)
                }};
            }
            match cache.dtype() {
                DType::F32 => go!(f32),
                DType::F16 => go!(f16),
                _ => go!(bf16),
            }
        })
    }

    fn rescore(&self, canvas: &Tensor, positions: &[usize]) -> Result<Tensor> {
        self.weights.install(|| {
            self.check_canvas(canvas)?;
            let w = &*self.weights;
            let cache = match &self.kv {
                SeqKv::Host(c) => c,
                SeqKv::Device(_) => {
                    let kv = self.kv.device_rows("re-score", positions)?;
                    return npu_seq::rescore_on_cpu(w, kv, canvas, positions);
                }
            };
            let len = cache.len();
            macro_rules! go {
                ($t:ty) => {{
                    let cached = cache
                        .cached::<$t>()
                        .ok_or_else(|| empty_cache("re-score", positions))?;
                    w.rescore::<$t>(&cached, len, canvas, positions)
                }};
            }
            match cache.dtype() {
                DType::F32 => go!(f32),
                DType::F16 => go!(f16),
                _ => go!(bf16),
            }
        })
    }

    fn apply_refresh(&mut self, r: &Refresh) -> Result<()> {
        // Everything is checked before anything is written: a rejected refresh leaves the cache
        // (and the epoch) as they were.
        self.check_refresh(r)?;
        if r.positions.is_empty() {
            // A refresh that only re-scored: nothing to merge.
            return Ok(());
        }
        let layers = self.weights.cfg.num_layers;
        match &mut self.kv {
            SeqKv::Device(Some(kv)) => npu_seq::apply(kv, r)?,
            // check_refresh found the positions cached: an empty device cache has none.
            SeqKv::Device(None) => {}
            SeqKv::Host(cache) => {
                for li in 0..layers {
                    cache.write_rows(li, &r.positions, &r.keys[li], &r.values[li])?;
                }
            }
        }
        self.bump();
        Ok(())
    }
}

/// The error of a refresh or re-score asked of an empty cache.
fn empty_cache(what: &'static str, positions: &[usize]) -> Error {
    PositionDefect::NotCached {
        what,
        position: positions.first().copied().unwrap_or(0),
        cache_len: 0,
    }
    .into()
}
