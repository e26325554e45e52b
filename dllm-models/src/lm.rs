//! The one small trait every diffusion LM implements and every decoder uses.
//!
//! ## Positions, windows and the KV cache
//!
//! A decoder owns the *canvas*: a `(batch, L)` `u32` tensor of token ids (prompt, generated tokens,
//! `[MASK]`s). The model owns a per-layer K/V cache that is valid for canvas positions `[0, cache_len)`.
//!
//! * [`DiffusionLm::forward`] runs the positions of a contiguous *window* `[s, e)` of the canvas.
//!   The window's queries attend to the window itself **plus every cached position outside the
//!   window** (`[0, s)` and `[e, cache_len)`); the cache is not modified. With an empty cache and
//!   `window = 0..L` this is the plain full-canvas forward of the reference implementations. The
//!   window may extend past the current block (speculative windows) and past `cache_len`, but it must
//!   not leave a hole: `s <= cache_len` is required.
//! * The window's fresh K/V are kept as *pending*; [`DiffusionLm::commit`] copies a sub-range of them
//!   into the cache (prefix cache: commit the finished prefix; dual cache: commit everything).
//! * [`DiffusionLm::compute_refresh`] recomputes the K/V of an arbitrary sparse set of cached positions
//!   (attending to the cache, with those positions' own entries replaced layer by layer) without
//!   touching the cache; [`DiffusionLm::apply_refresh`] merges the result.
//!   [`DiffusionLm::forward_with_refresh`] computes a refresh beside a window forward (on two threads
//!   in this crate's model) and returns it for a merge at the step boundary. Every change of the
//!   cache bumps the [epoch](DiffusionLm::epoch); a refresh carries the [token](SequenceToken)
//!   (model, sequence, epoch) it was computed against, and one from another model, another sequence
//!   or an older epoch is rejected, never merged silently.
//! * [`DiffusionLm::cache_len`] / [`DiffusionLm::truncate_cache`] snapshot and roll back.
//!
//! ## Logits
//!
//! Logits are requested per canvas position ([`Rows`]); the returned tensor is `(batch, rows, vocab)`
//! in `f32`, rows in the requested order. Positions not asked for never reach the LM head (for real
//! vocabularies it is the most expensive matmul), and in the last layer only the requested rows run
//! attention and the MLP. Models whose raw outputs are shifted (Dream: the prediction for position `i`
//! is the raw output at `i - 1`, position 0 keeps its own) apply the shift internally, so decoders
//! always see "the distribution for the token at position `i`".

use std::ops::Range;
use std::time::Instant;

use candle_core::{DType, Device, Tensor};

use crate::Result;

/// Which positions of a forward window need logits.
#[derive(Debug, Clone, Copy)]
pub enum Rows<'a> {
    /// Every position of the window, in order.
    All,
    /// These absolute canvas positions (each inside the window), in this order.
    Positions(&'a [usize]),
    /// No logits (e.g. a forward that only fills the cache); the result has zero rows.
    None,
}

/// The model family, which fixes the checkpoint layout and the logit convention.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Arch {
    /// LLaDA (GSAI-ML/LLaDA-8B-*): OLMo-style names, MHA, no biases, unshifted logits.
    Llada,
    /// Dream (Dream-org/Dream-v0-*-7B): Qwen2 layout, GQA, q/k/v biases, shifted logits.
    Dream,
}

impl std::fmt::Display for Arch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Arch::Llada => "llada",
            Arch::Dream => "dream",
        })
    }
}

/// Special token ids the decoders need.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SpecialTokens {
    /// The `[MASK]` id that marks positions still to be generated.
    pub mask: u32,
    /// End of sequence.
    pub eos: u32,
    /// End of turn (`<|eot_id|>`, `<|im_end|>`), when the tokenizer has one.
    pub eot: Option<u32>,
    /// Beginning of sequence, when defined.
    pub bos: Option<u32>,
    /// Padding, when defined.
    pub pad: Option<u32>,
}

impl SpecialTokens {
    /// Ids that end a generation (EOS and, if any, EoT).
    pub fn stop_ids(&self) -> Vec<u32> {
        let mut v = vec![self.eos];
        if let Some(e) = self.eot {
            if e != self.eos {
                v.push(e);
            }
        }
        v
    }
}

/// Static facts about a loaded model.
#[derive(Debug, Clone)]
pub struct ModelInfo {
    /// Model family.
    pub arch: Arch,
    /// Width of the logits (rows of the LM head).
    pub vocab_size: usize,
    /// Hidden size.
    pub hidden_size: usize,
    /// Number of transformer blocks.
    pub num_layers: usize,
    /// Query heads.
    pub num_heads: usize,
    /// Key/value heads (== `num_heads` without GQA).
    pub num_kv_heads: usize,
    /// Head dimension.
    pub head_dim: usize,
    /// MLP hidden size.
    pub intermediate_size: usize,
    /// Longest canvas the model accepts.
    pub max_seq_len: usize,
    /// Whether raw logits are shifted by one position (applied inside the model; informational).
    pub shift_logits: bool,
    /// Special tokens.
    pub special: SpecialTokens,
    /// Compute dtype of activations.
    pub dtype: DType,
    /// Parameter count.
    pub num_params: usize,
}

/// Wall-clock intervals of a [`DiffusionLm::forward_with_refresh`]: what the refresh cost and
/// how much of it overlapped the forward.
#[derive(Debug, Clone, Copy)]
pub struct DualPathTiming {
    /// When the forward (this thread) started and ended.
    pub forward: (Instant, Instant),
    /// When the refresh (its own thread) started and ended.
    pub refresh: (Instant, Instant),
}

impl DualPathTiming {
    /// Seconds both were running.
    pub fn overlap_secs(&self) -> f64 {
        let start = self.forward.0.max(self.refresh.0);
        let end = self.forward.1.min(self.refresh.1);
        end.saturating_duration_since(start).as_secs_f64()
    }

    /// Seconds the forward's caller waited for the refresh after the forward was done (the time the
    /// refresh added to the critical path).
    pub fn wait_secs(&self) -> f64 {
        self.refresh
            .1
            .saturating_duration_since(self.forward.1)
            .as_secs_f64()
    }

    /// Seconds the refresh ran.
    pub fn refresh_secs(&self) -> f64 {
        (self.refresh.1 - self.refresh.0).as_secs_f64()
    }
}

/// What a sparse refresh should recompute: cached `positions` (their K/V), and logits for the
/// `logits` positions.
#[derive(Debug, Clone, Copy)]
pub struct RefreshRequest<'a> {
    /// Cached canvas positions whose K/V to recompute from their current ids (may be empty when
    /// the request only re-scores).
    pub positions: &'a [usize],
    /// Positions whose logits to return.
    pub logits: Option<&'a [usize]>,
    /// Re-score the `logits` positions as a masked-diffusion model scores a prediction: each
    /// position masked **alone**, every other position as the canvas holds it
    /// ([`DiffusionLm::rescore`]); they need not be among `positions`. Without it the logits come
    /// from the K/V pass over the tokens themselves (and must be a subset of `positions`).
    pub score_masked: bool,
}

impl RefreshRequest<'_> {
    /// Run this request against one cache state: `kv(canvas, positions, logits)` is a
    /// `compute_refresh`, `rescore(canvas, positions)` a [`DiffusionLm::rescore`]. With
    /// `score_masked` the logits come from `rescore` and the K/V pass runs without logits.
    pub fn run_with(
        &self,
        canvas: &Tensor,
        kv: impl Fn(&Tensor, &[usize], Option<&[usize]>) -> Result<Refresh>,
        rescore: impl Fn(&Tensor, &[usize]) -> Result<Tensor>,
    ) -> Result<Refresh> {
        match (self.score_masked, self.logits) {
            (true, Some(want)) if !want.is_empty() => {
                let logits = rescore(canvas, want)?;
                let mut r = kv(canvas, self.positions, None)?;
                r.logits = Some(logits);
                r.scored = want.to_vec();
                Ok(r)
            }
            _ => {
                let mut r = kv(canvas, self.positions, self.logits)?;
                r.scored = self.logits.map(<[usize]>::to_vec).unwrap_or_default();
                Ok(r)
            }
        }
    }
}

/// Hands out process-unique ids (model and sequence ids share the counter; a counter of
/// identities, not configuration: nothing reads it but [`ModelId::fresh`] / [`SequenceId::fresh`]).
fn next_id() -> u64 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static NEXT: AtomicU64 = AtomicU64::new(1);
    NEXT.fetch_add(1, Ordering::Relaxed)
}

/// The identity of a model's weights: process-unique, given to every
/// [`TransformerWeights`](crate::TransformerWeights) when it is built (every sequence over the
/// same weights shares it; two loads of one checkpoint are two models).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ModelId(u64);

impl ModelId {
    /// A new id, different from every other [`ModelId`] of this process.
    pub fn fresh() -> Self {
        Self(next_id())
    }
}

impl std::fmt::Display for ModelId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "model #{}", self.0)
    }
}

/// The identity of one sequence's cache: process-unique, given to every sequence when it is
/// created.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SequenceId(u64);

impl SequenceId {
    /// A new id, different from every other [`SequenceId`] of this process.
    pub fn fresh() -> Self {
        Self(next_id())
    }
}

impl std::fmt::Display for SequenceId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "sequence #{}", self.0)
    }
}

/// Which cache state a [`Refresh`] was computed against: the model, the sequence and the
/// sequence's cache epoch ([`DiffusionLm::token`]). A refresh merges only into the same sequence
/// of the same model at the same epoch.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct SequenceToken {
    /// The model whose weights computed the K/V.
    pub model: ModelId,
    /// The sequence whose cache they were computed against.
    pub sequence: SequenceId,
    /// The cache's epoch then (bumped by every change of the cache, emptying it included).
    pub epoch: u64,
}

impl SequenceToken {
    /// The token of a new sequence of `model`: a fresh sequence id, epoch 0.
    pub fn new_sequence(model: ModelId) -> Self {
        Self {
            model,
            sequence: SequenceId::fresh(),
            epoch: 0,
        }
    }
}

/// The result of [`DiffusionLm::compute_refresh`]: new K/V rows for some cached positions.
#[derive(Debug, Clone)]
pub struct Refresh {
    /// The model, sequence and cache epoch ([`DiffusionLm::token`]) the refresh was computed
    /// against; it can only be merged into that sequence while its cache is still at that epoch.
    pub token: SequenceToken,
    /// Sorted, unique canvas positions whose K/V were recomputed.
    pub positions: Vec<usize>,
    /// Per layer, `(batch, positions, kv_heads, head_dim)` keys (RoPE applied).
    pub keys: Vec<Tensor>,
    /// Per layer, `(batch, positions, kv_heads, head_dim)` values.
    pub values: Vec<Tensor>,
    /// Logits `(batch, requested, vocab)` for the requested positions, when asked for.
    pub logits: Option<Tensor>,
    /// The positions of the logits rows, in order (empty without logits).
    pub scored: Vec<usize>,
    /// When computed beside a forward ([`DiffusionLm::forward_with_refresh`]): both intervals.
    pub timing: Option<DualPathTiming>,
}

/// A masked-diffusion language model with a windowed forward and an explicit KV cache.
///
/// See the [module docs](self) for the exact semantics.
// `llada::Model` / `dream::Model` (candle_style.rs) forward every method, provided ones included,
// to `DiffusionTransformer`: a method added here needs its line there.
pub trait DiffusionLm: Send {
    /// The identity of this sequence's cache state: the model, the sequence and the cache's epoch
    /// (a counter bumped by every change of the KV cache: `commit`, `apply_refresh`,
    /// `truncate_cache`, `clear_cache`; forwards do not change it). A [`Refresh`] carries the token
    /// it was computed against, and `apply_refresh` rejects one from another model, another
    /// sequence or another epoch.
    fn token(&self) -> SequenceToken;

    /// The cache's epoch (`self.token().epoch`).
    fn epoch(&self) -> u64 {
        self.token().epoch
    }

    /// Static facts about the model.
    fn info(&self) -> &ModelInfo;

    /// The device activations live on.
    fn device(&self) -> &Device;

    /// Forward the canvas positions `window`, attending to the window plus the cached positions
    /// outside it; returns `(batch, rows, vocab)` f32 logits for `rows`.
    fn forward(&mut self, canvas: &Tensor, window: Range<usize>, rows: Rows<'_>) -> Result<Tensor>;

    /// Copy the K/V of `range` (inside the last forward's window, `range.start <= cache_len`) into
    /// the cache; the cache then covers `[0, max(cache_len, range.end))`.
    fn commit(&mut self, range: Range<usize>) -> Result<()>;

    /// Number of canvas positions `[0, n)` with cached K/V.
    fn cache_len(&self) -> usize;

    /// Roll the cache back to `[0, len)` (`len <= cache_len`). Also drops the pending window.
    fn truncate_cache(&mut self, len: usize) -> Result<()>;

    /// Recompute the cached K/V of `positions` (each `< cache_len`) from their current ids in
    /// `canvas`, without modifying the cache. With `logits = Some(rows)`, also return the logits of
    /// those positions (which must be a subset of `positions`).
    fn compute_refresh(
        &self,
        canvas: &Tensor,
        positions: &[usize],
        logits: Option<&[usize]>,
    ) -> Result<Refresh>;

    /// Overwrite cached K/V with a [`Refresh`]. Everything is checked before anything is written,
    /// so a rejected refresh leaves the cache as it was: the refresh's token must be this
    /// sequence's (`Error::RefreshFromOtherModel`, `Error::RefreshFromOtherSequence`,
    /// `Error::StaleRefresh` otherwise), and its positions must be sorted, unique and cached, with
    /// one K/V row per position in every layer (`Error::MalformedRefresh` naming the defect).
    fn apply_refresh(&mut self, refresh: &Refresh) -> Result<()>;

    /// Logits `(batch, positions, vocab)` of each of `positions` (cached, unique) predicted with
    /// that position alone masked and every other position as `canvas` holds it, against the
    /// current cache: the re-score of a decided token. Scoring several positions with all of them
    /// masked at once would predict each without its neighbours; each is scored on its own.
    ///
    /// The default runs one masked [`compute_refresh`](Self::compute_refresh) per position; the
    /// model of this crate scores them all in one pass with a per-position attention mask.
    fn rescore(&self, canvas: &Tensor, positions: &[usize]) -> Result<Tensor> {
        let (b, l) = canvas.dims2()?;
        let mask = self.info().special.mask;
        let ids: Vec<u32> = canvas.flatten_all()?.to_vec1()?;
        let mut rows = Vec::with_capacity(positions.len());
        for &p in positions {
            let mut m = ids.clone();
            for bi in 0..b {
                if p < l {
                    m[bi * l + p] = mask;
                }
            }
            let masked = Tensor::from_vec(m, (b, l), canvas.device())?;
            let r = self.compute_refresh(&masked, &[p], Some(&[p]))?;
            rows.push(r.logits.ok_or(crate::Error::Internal {
                what: "compute_refresh returned no logits",
            })?);
        }
        if rows.is_empty() {
            let v = self.info().vocab_size;
            return Ok(Tensor::zeros(
                (b, 0, v),
                candle_core::DType::F32,
                canvas.device(),
            )?);
        }
        Ok(Tensor::cat(&rows, 1)?)
    }

    /// A window forward and a sparse refresh of cached positions, computed against the same cache
    /// state; the refresh is returned, not merged (merge it with [`apply_refresh`](Self::apply_refresh)
    /// at the step boundary). Implementations may run the two at the same time on two threads (the
    /// model of this crate does); the results are the same as running them one after the other.
    fn forward_with_refresh(
        &mut self,
        canvas: &Tensor,
        window: Range<usize>,
        rows: Rows<'_>,
        refresh: RefreshRequest<'_>,
    ) -> Result<(Tensor, Refresh)> {
        let t0 = Instant::now();
        let mut r = refresh.run_with(
            canvas,
            |c, p, l| self.compute_refresh(c, p, l),
            |c, p| self.rescore(c, p),
        )?;
        let t1 = Instant::now();
        let out = self.forward(canvas, window, rows)?;
        r.timing = Some(DualPathTiming {
            forward: (t1, Instant::now()),
            refresh: (t0, t1),
        });
        Ok((out, r))
    }

    /// Run one step a decoder asked for ([`crate::Ask`]): empty the cache when asked, the window
    /// forward with its verification (shadow) rows, then the commit. The default composes the other
    /// methods ([`crate::answer_with`]: shadows as single-position forwards against the committed
    /// cache); [`crate::DiffusionTransformer`] computes the shadow rows inside the forward and can
    /// answer many sequences at once ([`crate::DiffusionTransformer::forward_many`]).
    fn answer(&mut self, ask: &crate::Ask) -> Result<crate::Answer> {
        answer_with(self, ask)
    }

    /// Full-canvas forward: `forward(canvas, 0..L, rows)` (the cache is attended to only where it
    /// extends past `L`, which a decoder never does).
    fn forward_full(&mut self, canvas: &Tensor, rows: Rows<'_>) -> Result<Tensor> {
        let len = canvas.dim(1)?;
        self.forward(canvas, 0..len, rows)
    }

    /// Empty the cache.
    fn clear_cache(&mut self) -> Result<()> {
        self.truncate_cache(0)
    }

    /// Recompute and immediately merge: [`compute_refresh`](Self::compute_refresh) then
    /// [`apply_refresh`](Self::apply_refresh).
    fn refresh(
        &mut self,
        canvas: &Tensor,
        positions: &[usize],
        logits: Option<&[usize]>,
    ) -> Result<Option<Tensor>> {
        let r = self.compute_refresh(canvas, positions, logits)?;
        self.apply_refresh(&r)?;
        Ok(r.logits)
    }
}

/// [`DiffusionLm::answer`] for any model, through its other methods: the forward, then the
/// commit, then one single-position window forward per shadow (the position masked) against the
/// committed cache — the same logits as the shadow rows of a model that computes them inside the
/// forward, when the commit covers the window. A shadow that hides positions
/// ([`crate::Ask::verify_hidden`]) is a window forward from the first to the last of its
/// positions, all of them masked: the same logits when they are adjacent; with positions between
/// them, those are recomputed seeing the masks too (inside the forward they see the tokens).
pub fn answer_with<M: DiffusionLm + ?Sized>(
    model: &mut M,
    ask: &crate::Ask,
) -> Result<crate::Answer> {
    let info = model.info().clone();
    ask.check(crate::shift::Shift::new(info.shift_logits))?;
    let canvas = ask.canvas_tensor(model.device())?;
    if ask.clear_cache {
        model.clear_cache()?;
    }
    let logits = model.forward(&canvas, ask.window.clone(), Rows::Positions(&ask.rows))?;
    if let Some(c) = &ask.commit {
        model.commit(c.clone())?;
    }
    let mut rows = Vec::with_capacity(ask.verify.len());
    for (k, &p) in ask.verify.iter().enumerate() {
        let hidden = ask.hidden_of(k);
        let all = || std::iter::once(p).chain(hidden.iter().copied());
        if let Some(q) = all().find(|&q| q >= model.cache_len()) {
            return Err(crate::AskDefect::VerifyNotCommitted {
                position: q,
                cache_len: model.cache_len(),
            }
            .into());
        }
        let mut masked = ask.clone();
        for row in &mut masked.canvas {
            all().for_each(|q| row[q] = info.special.mask);
        }
        let (lo, hi) = (all().min().unwrap_or(p), all().max().unwrap_or(p));
        let t = masked.canvas_tensor(model.device())?;
        rows.push(model.forward(&t, lo..hi + 1, Rows::Positions(&[p]))?);
    }
    let verify_logits = if rows.is_empty() {
        Tensor::zeros(
            (ask.canvas.len(), 0, info.vocab_size),
            candle_core::DType::F32,
            model.device(),
        )?
    } else {
        Tensor::cat(&rows, 1)?
    };
    Ok(crate::Answer {
        logits,
        verify_logits,
    })
}
