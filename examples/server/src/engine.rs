//! The scheduler: one set of weights, one sequence per request, one forward at a time.
//!
//! Every request decodes on its own thread with the library's decoder, against a [`SeqLm`]: a
//! `DiffusionLm` that owns the request's sequence (`DiffusionTransformer::from_weights` over the
//! shared weights: its own KV cache, nothing copied) and asks the [`Engine`] before any compute.
//! The engine serves those asks first come, first served; a sequence has at most one ask
//! outstanding (its decoder is waiting for it), so concurrent sequences advance in round robin, one
//! forward each per round, and a long generation cannot starve a short one.
//!
//! **Batching.** A sequence whose every forward is a whole-canvas forward from an empty cache with
//! nothing ever committed (the `vanilla` strategy without classifier-free guidance, and Dream's own
//! algorithm) asks for a *batchable* forward: its canvas and the rows it needs. When the engine
//! serves one, it takes every other batchable ask in the queue with the same canvas length (up to
//! `max_batch`), stacks the canvases into one `(batch, len)` forward on the engine's own sequence,
//! and hands each its rows. Other forwards (prefix/dual cache, mbsd: windows against a per-sequence
//! cache) run one at a time on their own sequence ("a turn"). Canvases of different lengths are
//! not padded: without an attention mask over padding the model would see the pad tokens.

use std::collections::{HashMap, VecDeque};
use std::ops::Range;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, AtomicUsize, Ordering};
use std::sync::mpsc::{sync_channel, Receiver, SyncSender};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use candle_core::{Device, Tensor};
use dllm_models::{
    DiffusionLm, DiffusionTransformer, ModelInfo, Refresh, RefreshRequest, Rows, TransformerWeights,
};

/// Why a sequence was cancelled.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum CancelReason {
    /// The client went away.
    Disconnected = 1,
    /// The per-request timeout ran out.
    Timeout = 2,
    /// The text reached one of the request's stop strings: nothing more is needed.
    StopString = 3,
}

/// A request's cancellation flag, shared by the HTTP side and the decoding thread.
#[derive(Debug, Default)]
pub struct Cancel {
    flag: AtomicBool,
    reason: AtomicU8,
}

impl Cancel {
    /// Cancel (the first reason wins).
    pub fn set(&self, reason: CancelReason) {
        if self
            .reason
            .compare_exchange(0, reason as u8, Ordering::SeqCst, Ordering::SeqCst)
            .is_ok()
        {
            self.flag.store(true, Ordering::SeqCst);
        }
    }

    pub fn is_set(&self) -> bool {
        self.flag.load(Ordering::SeqCst)
    }

    pub fn reason(&self) -> Option<CancelReason> {
        match self.reason.load(Ordering::SeqCst) {
            1 => Some(CancelReason::Disconnected),
            2 => Some(CancelReason::Timeout),
            3 => Some(CancelReason::StopString),
            _ => None,
        }
    }
}

/// Counters of the engine (reported by `GET /health`).
#[derive(Debug, Default)]
pub struct EngineStats {
    /// Model forward calls (a batched forward counts once).
    pub forwards: AtomicU64,
    /// Batched forwards that carried two or more sequences.
    pub batched_forwards: AtomicU64,
    /// Sequences carried by those batched forwards (summed).
    pub batched_sequences: AtomicU64,
    /// Sequences alive (a [`SeqLm`] not yet dropped): their KV caches are allocated.
    pub live_sequences: AtomicUsize,
}

enum Work {
    /// Run on your own sequence now; tell the engine you are done by dropping the sender.
    Turn { done: Receiver<()> },
    /// A whole-canvas forward the engine may batch: the canvas and the rows wanted.
    Batch { canvas: Vec<u32>, rows: Vec<usize> },
}

enum Reply {
    Go,
    Logits(Result<Tensor, Arc<dllm_models::Error>>),
    Cancelled,
}

struct Job {
    cancel: Arc<Cancel>,
    work: Work,
    reply: SyncSender<Reply>,
}

/// What the engine's lock guards: the asks, and how many batchable sequences of each canvas
/// length are alive (the ones a batch may wait for).
#[derive(Default)]
struct Queue {
    jobs: VecDeque<Job>,
    batchable: HashMap<usize, usize>,
}

/// The engine: a queue of asks and the thread that serves them.
pub struct Engine {
    queue: Mutex<Queue>,
    wake: Condvar,
    max_batch: usize,
    batch_wait: Duration,
    pub stats: EngineStats,
}

impl Engine {
    /// Start the engine's thread over `weights`; `max_batch` sequences at most per batched forward
    /// (1: no batching); a batch waits at most `batch_wait` for the other live sequences of its
    /// canvas length to ask.
    pub fn start(
        weights: Arc<TransformerWeights>,
        max_batch: usize,
        batch_wait: Duration,
    ) -> anyhow::Result<Arc<Self>> {
        let engine = Arc::new(Self {
            queue: Mutex::new(Queue::default()),
            wake: Condvar::new(),
            max_batch: max_batch.max(1),
            batch_wait,
            stats: EngineStats::default(),
        });
        let mut batch_model = DiffusionTransformer::from_weights(weights)?;
        let e = engine.clone();
        std::thread::Builder::new()
            .name("llada-engine".into())
            .spawn(move || e.serve(&mut batch_model))?;
        Ok(engine)
    }

    fn serve(&self, model: &mut DiffusionTransformer) {
        loop {
            let job = {
                let mut q = self.queue.lock().unwrap_or_else(|p| p.into_inner());
                loop {
                    if let Some(j) = q.jobs.pop_front() {
                        break j;
                    }
                    q = self.wake.wait(q).unwrap_or_else(|p| p.into_inner());
                }
            };
            if job.cancel.is_set() {
                let _ = job.reply.send(Reply::Cancelled);
                continue;
            }
            match job.work {
                Work::Turn { done } => {
                    self.stats.forwards.fetch_add(1, Ordering::Relaxed);
                    if job.reply.send(Reply::Go).is_ok() {
                        // Returns when the sequence drops its end (done, failed or panicked).
                        let _ = done.recv();
                    }
                }
                Work::Batch { canvas, rows } => {
                    let mut group = vec![(job.reply, canvas, rows)];
                    let len = group[0].1.len();
                    if self.max_batch > 1 {
                        // Take every ask of this canvas length; while some live sequences of
                        // that length have not asked yet (they are between two forwards, on
                        // their own threads), wait for them a little: without it, two
                        // sequences stay out of phase, each asking while the other's forward
                        // runs, and never share one.
                        let deadline = Instant::now() + self.batch_wait;
                        let mut q = self.queue.lock().unwrap_or_else(|p| p.into_inner());
                        loop {
                            let mut i = 0;
                            while i < q.jobs.len() && group.len() < self.max_batch {
                                let fits = matches!(&q.jobs[i].work, Work::Batch { canvas, .. } if canvas.len() == len)
                                    && !q.jobs[i].cancel.is_set();
                                if fits {
                                    let Some(j) = q.jobs.remove(i) else { break };
                                    if let Work::Batch { canvas, rows } = j.work {
                                        group.push((j.reply, canvas, rows));
                                    }
                                } else {
                                    i += 1;
                                }
                            }
                            let live = q.batchable.get(&len).copied().unwrap_or(0);
                            let now = Instant::now();
                            if group.len() >= live.min(self.max_batch) || now >= deadline {
                                break;
                            }
                            q = self
                                .wake
                                .wait_timeout(q, deadline - now)
                                .unwrap_or_else(|p| p.into_inner())
                                .0;
                        }
                    }
                    self.stats.forwards.fetch_add(1, Ordering::Relaxed);
                    if group.len() > 1 {
                        self.stats.batched_forwards.fetch_add(1, Ordering::Relaxed);
                        self.stats
                            .batched_sequences
                            .fetch_add(group.len() as u64, Ordering::Relaxed);
                    }
                    let asks: Vec<(&[u32], &[usize])> =
                        group.iter().map(|(_, c, r)| (&c[..], &r[..])).collect();
                    match batched_forward(model, &asks) {
                        Ok(per) => {
                            for ((reply, _, _), l) in group.iter().zip(per) {
                                let _ = reply.send(Reply::Logits(Ok(l)));
                            }
                        }
                        Err(e) => {
                            let e = Arc::new(e);
                            for (reply, _, _) in &group {
                                let _ = reply.send(Reply::Logits(Err(Arc::clone(&e))));
                            }
                        }
                    }
                }
            }
        }
    }

    fn submit(&self, cancel: &Arc<Cancel>, work: Work) -> Receiver<Reply> {
        let (reply, rx) = sync_channel(1);
        let job = Job {
            cancel: cancel.clone(),
            work,
            reply,
        };
        self.queue
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .jobs
            .push_back(job);
        self.wake.notify_one();
        rx
    }

    /// A batchable sequence of canvas length `len` starts (`+1`) or ends (`-1`).
    fn count_batchable(&self, len: usize, starts: bool) {
        let mut q = self.queue.lock().unwrap_or_else(|p| p.into_inner());
        let n = q.batchable.entry(len).or_insert(0);
        if starts {
            *n += 1;
        } else {
            *n = n.saturating_sub(1);
            if *n == 0 {
                q.batchable.remove(&len);
            }
        }
        drop(q);
        // A batch waiting for this sequence need not wait any more.
        self.wake.notify_one();
    }

    /// Wait for this sequence's turn; compute while the returned guard lives.
    fn turn(&self, cancel: &Arc<Cancel>) -> dllm_models::Result<Turn> {
        let (done_tx, done_rx) = sync_channel(0);
        match self.submit(cancel, Work::Turn { done: done_rx }).recv() {
            Ok(Reply::Go) => Ok(Turn { _done: done_tx }),
            _ => Err(cancelled()),
        }
    }

    /// A batchable whole-canvas forward: `(1, rows, vocab)` logits.
    fn batch(
        &self,
        cancel: &Arc<Cancel>,
        canvas: Vec<u32>,
        rows: Vec<usize>,
    ) -> dllm_models::Result<Tensor> {
        match self.submit(cancel, Work::Batch { canvas, rows }).recv() {
            Ok(Reply::Logits(Ok(t))) => Ok(t),
            Ok(Reply::Logits(Err(e))) => Err(dllm_models::Error::BatchedForward(e)),
            _ => Err(cancelled()),
        }
    }
}

fn cancelled() -> dllm_models::Error {
    dllm_models::Error::Cancelled
}

/// While alive, the sequence holding it computes; dropping it hands the engine back.
struct Turn {
    _done: SyncSender<()>,
}

/// One forward of several canvases of the same length stacked as a batch, from an empty cache;
/// each ask gets `(1, rows, vocab)` logits of its own rows.
fn batched_forward(
    model: &mut DiffusionTransformer,
    asks: &[(&[u32], &[usize])],
) -> dllm_models::Result<Vec<Tensor>> {
    let len = asks[0].0.len();
    let mut ids = Vec::with_capacity(asks.len() * len);
    for (c, _) in asks {
        ids.extend_from_slice(c);
    }
    let mut union: Vec<usize> = asks.iter().flat_map(|(_, r)| r.iter().copied()).collect();
    union.sort_unstable();
    union.dedup();
    let dev = model.device().clone();
    let t = Tensor::from_vec(ids, (asks.len(), len), &dev)?;
    model.clear_cache()?;
    let logits = model.forward(&t, 0..len, Rows::Positions(&union))?;
    let mut out = Vec::with_capacity(asks.len());
    for (i, (_, rows)) in asks.iter().enumerate() {
        let idx: Vec<u32> = rows
            .iter()
            .map(|r| union.binary_search(r).map(|k| k as u32))
            .collect::<Result<_, _>>()
            .map_err(|_| dllm_models::Error::Internal {
                what: "a row outside the union of the batch's rows",
            })?;
        let idx = Tensor::from_vec(idx, rows.len(), &dev)?;
        out.push(logits.get(i)?.index_select(&idx, 0)?.unsqueeze(0)?);
    }
    // Drop the pending window (batch-sized K/V): the next batch clears it anyway.
    model.clear_cache()?;
    Ok(out)
}

/// A request's sequence, as the decoder sees it: its own cache over the shared weights, with every
/// compute call served by the [`Engine`].
pub struct SeqLm {
    own: DiffusionTransformer,
    engine: Arc<Engine>,
    cancel: Arc<Cancel>,
    /// `Some(canvas length)`: every forward is a whole-canvas forward of that length from an
    /// empty cache and nothing is committed (the caller's strategy guarantees it): forwards may be
    /// batched with other sequences'.
    batchable: Option<usize>,
}

impl SeqLm {
    pub fn new(
        weights: Arc<TransformerWeights>,
        engine: Arc<Engine>,
        cancel: Arc<Cancel>,
        batchable: Option<usize>,
    ) -> dllm_models::Result<Self> {
        let own = DiffusionTransformer::from_weights(weights)?;
        engine.stats.live_sequences.fetch_add(1, Ordering::SeqCst);
        if let Some(len) = batchable {
            engine.count_batchable(len, true);
        }
        Ok(Self {
            own,
            engine,
            cancel,
            batchable,
        })
    }
}

impl Drop for SeqLm {
    fn drop(&mut self) {
        if let Some(len) = self.batchable {
            self.engine.count_batchable(len, false);
        }
        self.engine
            .stats
            .live_sequences
            .fetch_sub(1, Ordering::SeqCst);
    }
}

impl DiffusionLm for SeqLm {
    fn token(&self) -> dllm_models::SequenceToken {
        self.own.token()
    }

    fn epoch(&self) -> u64 {
        self.own.epoch()
    }

    fn info(&self) -> &ModelInfo {
        self.own.info()
    }

    fn device(&self) -> &Device {
        self.own.device()
    }

    fn forward(
        &mut self,
        canvas: &Tensor,
        window: Range<usize>,
        rows: Rows<'_>,
    ) -> dllm_models::Result<Tensor> {
        if self.cancel.is_set() {
            return Err(cancelled());
        }
        let (b, len) = canvas.dims2()?;
        if self.batchable.is_some() && b == 1 && window == (0..len) && self.own.cache_len() == 0 {
            let ids: Vec<u32> = canvas.flatten_all()?.to_vec1()?;
            let rows = match rows {
                Rows::All => (0..len).collect(),
                Rows::Positions(p) => p.to_vec(),
                Rows::None => Vec::new(),
            };
            return self.engine.batch(&self.cancel, ids, rows);
        }
        let _turn = self.engine.turn(&self.cancel)?;
        self.own.forward(canvas, window, rows)
    }

    fn commit(&mut self, range: Range<usize>) -> dllm_models::Result<()> {
        self.own.commit(range)
    }

    fn cache_len(&self) -> usize {
        self.own.cache_len()
    }

    fn truncate_cache(&mut self, len: usize) -> dllm_models::Result<()> {
        self.own.truncate_cache(len)
    }

    fn compute_refresh(
        &self,
        canvas: &Tensor,
        positions: &[usize],
        logits: Option<&[usize]>,
    ) -> dllm_models::Result<Refresh> {
        let _turn = self.engine.turn(&self.cancel)?;
        self.own.compute_refresh(canvas, positions, logits)
    }

    fn apply_refresh(&mut self, refresh: &Refresh) -> dllm_models::Result<()> {
        self.own.apply_refresh(refresh)
    }

    fn rescore(&self, canvas: &Tensor, positions: &[usize]) -> dllm_models::Result<Tensor> {
        let _turn = self.engine.turn(&self.cancel)?;
        self.own.rescore(canvas, positions)
    }

    fn forward_with_refresh(
        &mut self,
        canvas: &Tensor,
        window: Range<usize>,
        rows: Rows<'_>,
        refresh: RefreshRequest<'_>,
    ) -> dllm_models::Result<(Tensor, Refresh)> {
        let _turn = self.engine.turn(&self.cancel)?;
        self.own.forward_with_refresh(canvas, window, rows, refresh)
    }
}
