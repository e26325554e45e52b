//! The engine: one thread owns the model's weights and every sequence, and runs the serving loop.
//!
//! Sequences are data: a request becomes a [`dllm_decode::Generation`] (a value that says what its
//! next forward must compute and takes the answer) beside its [`Session`] (the text stream and the
//! channel to its handler). The engine keeps them in a table — *waiting* (no KV cache yet: more
//! than `--max-sequences` are running) and *running* (each with its own KV cache, a
//! `DiffusionTransformer` over the shared weights) — and loops:
//!
//! 1. admit the requests the handlers sent (their parameters are checked here: a request the
//!    decoder refuses ends at once with that error);
//! 2. drop the sequences whose client went away or whose `--timeout` ran out, freeing their caches
//!    at once; start waiting ones while fewer than `--max-sequences` run;
//! 3. ask every running sequence without a pending ask for its next step ([`Generation::next`]; a
//!    generation with none left finishes);
//! 4. pick the group: pending asks first come, first served (an ask comes when its sequence's
//!    previous step was answered, so sequences advance in round robin) while their rows
//!    ([`Ask::rows_count`]: window, verification rows, batch) fit in `--max-batch-rows` — the
//!    first ask always goes in, so `--max-batch-rows 1` runs one sequence per forward;
//! 5. run the group's asks in one [`DiffusionTransformer::forward_many`] (any strategy, any prompt
//!    length: each sequence's answer is bit for bit its solo answer), give each its answer
//!    ([`Generation::absorb`]) and send each its events.
//!
//! New requests join between two steps (continuous batching). An error from a sequence's
//! `next`/`absorb` fails that request; when a batched forward fails, each sequence of the group is
//! retried alone, so one bad request never fails the others. A panic in one sequence's work is
//! caught and fails that request only.

use std::collections::VecDeque;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{channel, Receiver, Sender};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use dllm_decode::latency::LatencyTable;
use dllm_decode::{Answer, Ask, Decoder, Generation};
use dllm_models::{DiffusionTransformer, ModelInfo, TransformerWeights};

use crate::error::ApiError;
use crate::metrics::Stats;
use crate::session::{decode_error, Event, Session};

/// A request's disconnect flag, set by its HTTP handler when the client goes away.
#[derive(Debug, Default)]
pub struct Cancel(AtomicBool);

impl Cancel {
    pub fn set(&self) {
        self.0.store(true, Ordering::SeqCst);
    }

    pub fn is_set(&self) -> bool {
        self.0.load(Ordering::SeqCst)
    }
}

/// A request handed to the engine.
pub struct Request {
    pub session: Session,
    pub cancel: Arc<Cancel>,
    /// When the handler submitted it (time to first token counts from here).
    pub arrived: Instant,
    /// `--timeout` from `arrived` (`None`: later than an `Instant` can say).
    pub deadline: Option<Instant>,
}

/// The engine's settings.
#[derive(Clone)]
pub struct Config {
    /// Sequences running at once (`--max-sequences`).
    pub max_sequences: usize,
    /// Requests that may wait beyond them (`--max-queue`).
    pub max_queue: usize,
    /// Rows at most in one forward (`--max-batch-rows`; the first ask always goes in).
    pub max_batch_rows: usize,
    /// `--timeout`, for the messages.
    pub timeout_secs: f64,
    /// The latency table of mbsd's lookahead and verification (`--latency-table`).
    pub latency: Option<Arc<LatencyTable>>,
}

/// The handlers' side of the engine.
pub struct Engine {
    inbox: Mutex<Sender<Request>>,
    stats: Arc<Stats>,
    config: Config,
}

impl Engine {
    /// Start the engine's thread over `weights` (the thread owns them and every sequence).
    pub fn start(
        weights: Arc<TransformerWeights>,
        info: ModelInfo,
        config: Config,
        stats: Arc<Stats>,
    ) -> anyhow::Result<Arc<Self>> {
        let (tx, rx) = channel();
        let (c, st) = (config.clone(), stats.clone());
        // Generations are not `Send`: the table is built on the engine thread and never leaves it.
        std::thread::Builder::new()
            .name("llada-engine".into())
            .spawn(move || {
                Loop {
                    inbox: rx,
                    weights,
                    info,
                    config: c,
                    stats: st,
                    waiting: VecDeque::new(),
                    running: Vec::new(),
                    tickets: 0,
                }
                .run()
            })?;
        Ok(Arc::new(Self {
            inbox: Mutex::new(tx),
            stats,
            config,
        }))
    }

    /// Admit a request into the engine's table, or refuse it (429) when `--max-sequences` run and
    /// `--max-queue` wait.
    pub fn submit(&self, req: Request) -> Result<(), ApiError> {
        let s = &self.stats;
        let c = &self.config;
        if s.admitted.fetch_add(1, Ordering::SeqCst) >= c.max_sequences + c.max_queue {
            s.admitted.fetch_sub(1, Ordering::SeqCst);
            s.rejected_queue_full.fetch_add(1, Ordering::Relaxed);
            return Err(ApiError::overloaded(format!(
                "{} sequences are running and {} requests are queued (--max-sequences, \
                 --max-queue); retry later",
                c.max_sequences, c.max_queue
            )));
        }
        s.started.fetch_add(1, Ordering::Relaxed);
        s.waiting.fetch_add(1, Ordering::SeqCst);
        let sent = self
            .inbox
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .send(req);
        if sent.is_err() {
            s.waiting.fetch_sub(1, Ordering::SeqCst);
            s.admitted.fetch_sub(1, Ordering::SeqCst);
            s.failed.fetch_add(1, Ordering::Relaxed);
            return Err(ApiError::server("the engine has stopped"));
        }
        Ok(())
    }
}

/// A sequence's KV cache; dropping it frees the cache (and counts it freed).
struct Cache {
    model: DiffusionTransformer,
    stats: Arc<Stats>,
}

impl Cache {
    fn new(weights: Arc<TransformerWeights>, stats: Arc<Stats>) -> dllm_models::Result<Self> {
        let model = DiffusionTransformer::from_weights(weights)?;
        stats.live.fetch_add(1, Ordering::SeqCst);
        Ok(Self { model, stats })
    }
}

impl Drop for Cache {
    fn drop(&mut self) {
        self.stats.live.fetch_sub(1, Ordering::SeqCst);
    }
}

/// A request in the table.
struct Seq {
    req: Request,
    gen: Generation<'static>,
    /// Its first completion token was counted (time to first token).
    first_token: bool,
}

/// A running sequence: its cache, and the ask it waits to have answered (with its ticket: the
/// order asks came in).
struct Running {
    seq: Seq,
    cache: Cache,
    ask: Option<(u64, Ask)>,
}

/// How a sequence leaves the table.
enum End {
    /// The generation ended (no step left, or its session said the answer is complete).
    Done,
    Failed(ApiError),
    Disconnected,
    Timeout,
}

/// The engine thread's state.
struct Loop {
    inbox: Receiver<Request>,
    weights: Arc<TransformerWeights>,
    info: ModelInfo,
    config: Config,
    stats: Arc<Stats>,
    waiting: VecDeque<Seq>,
    running: Vec<Running>,
    /// The next ask's ticket.
    tickets: u64,
}

/// Run `f`, turning a panic into a server error naming `what`.
fn guarded<T>(what: &str, f: impl FnOnce() -> T) -> Result<T, ApiError> {
    catch_unwind(AssertUnwindSafe(f)).map_err(|p| {
        let msg = p
            .downcast_ref::<&str>()
            .map(|s| s.to_string())
            .or_else(|| p.downcast_ref::<String>().cloned())
            .unwrap_or_default();
        ApiError::server(format!("{what} panicked (a bug in the server): {msg}"))
    })
}

impl Loop {
    fn run(mut self) {
        loop {
            if self.waiting.is_empty() && self.running.is_empty() {
                match self.inbox.recv() {
                    Ok(r) => self.admit(r),
                    // Every handler is gone: the server is shutting down.
                    Err(_) => return,
                }
            }
            while let Ok(r) = self.inbox.try_recv() {
                self.admit(r);
            }
            self.reap();
            self.start_waiting();
            self.ask_all();
            self.step();
        }
    }

    /// A new request: its generation (the decoder checks the parameters and the prompt here).
    fn admit(&mut self, req: Request) {
        let job = &req.session.job;
        let mut d = Decoder::new(job.params);
        if let Some(t) = &self.config.latency {
            d = d.latency_table(t.clone());
        }
        let endpoint = job.endpoint;
        let started = guarded("starting the generation", || {
            d.start(&self.info, &req.session.job.prompt_ids)
        });
        match started {
            Ok(Ok(gen)) => self.waiting.push_back(Seq {
                req,
                gen,
                first_token: false,
            }),
            Ok(Err(e)) => self.end_new(req, decode_error(e, endpoint)),
            Err(e) => self.end_new(req, e),
        }
    }

    /// Drop the sequences whose client went away or whose deadline passed.
    fn reap(&mut self) {
        let now = Instant::now();
        let why = |r: &Request| {
            if r.cancel.is_set() || r.session.gone() {
                Some(End::Disconnected)
            } else if r.deadline.is_some_and(|d| now >= d) {
                Some(End::Timeout)
            } else {
                None
            }
        };
        let mut i = 0;
        while i < self.waiting.len() {
            match why(&self.waiting[i].req) {
                Some(end) => {
                    if let Some(s) = self.waiting.remove(i) {
                        self.end(s, None, end);
                    }
                }
                None => i += 1,
            }
        }
        let mut i = 0;
        while i < self.running.len() {
            match why(&self.running[i].seq.req) {
                Some(end) => {
                    let r = self.running.remove(i);
                    self.end(r.seq, Some(r.cache), end);
                }
                None => i += 1,
            }
        }
    }

    /// Give waiting sequences a cache while fewer than `--max-sequences` run.
    fn start_waiting(&mut self) {
        while self.running.len() < self.config.max_sequences {
            let Some(mut seq) = self.waiting.pop_front() else {
                return;
            };
            let (w, st) = (self.weights.clone(), self.stats.clone());
            match guarded("a new sequence", || Cache::new(w, st)) {
                Ok(Ok(cache)) => {
                    self.stats.waiting.fetch_sub(1, Ordering::SeqCst);
                    self.stats.running.fetch_add(1, Ordering::SeqCst);
                    seq.req.session.start_clock();
                    self.running.push(Running {
                        seq,
                        cache,
                        ask: None,
                    });
                }
                Ok(Err(e)) => {
                    let e = ApiError::server(format!("a new sequence: {e}"));
                    self.end(seq, None, End::Failed(e));
                }
                Err(e) => self.end(seq, None, End::Failed(e)),
            }
        }
    }

    /// Every running sequence without a pending ask asks for its next step.
    fn ask_all(&mut self) {
        let mut i = 0;
        while i < self.running.len() {
            let r = &mut self.running[i];
            if r.ask.is_some() {
                i += 1;
                continue;
            }
            let endpoint = r.seq.req.session.job.endpoint;
            let end = match guarded("the decoder", || r.seq.gen.next()) {
                Ok(Ok(Some(ask))) => {
                    r.ask = Some((self.tickets, ask));
                    self.tickets += 1;
                    i += 1;
                    continue;
                }
                Ok(Ok(None)) => End::Done,
                Ok(Err(e)) => End::Failed(decode_error(e, endpoint)),
                Err(e) => End::Failed(e),
            };
            let r = self.running.remove(i);
            self.end(r.seq, Some(r.cache), end);
        }
    }

    /// The group of this iteration: indices into `running`, ascending, and their rows.
    fn group(&self) -> (Vec<usize>, usize) {
        let shifted = self.info.shift_logits;
        let mut order: Vec<(u64, usize, usize)> = self
            .running
            .iter()
            .enumerate()
            .filter_map(|(i, r)| r.ask.as_ref().map(|(t, a)| (*t, i, a.rows_count(shifted))))
            .collect();
        order.sort_unstable();
        let mut group = Vec::new();
        let mut rows = 0;
        for (_, i, n) in order {
            if !group.is_empty() && rows + n > self.config.max_batch_rows {
                break;
            }
            group.push(i);
            rows += n;
        }
        group.sort_unstable();
        (group, rows)
    }

    /// One iteration's forward: the group's asks answered, absorbed and streamed.
    fn step(&mut self) {
        let (group, rows) = self.group();
        if group.is_empty() {
            return;
        }
        let answers = self.forward(&group, rows);
        let mut ended = Vec::new();
        for (i, answer) in group.into_iter().zip(answers) {
            let r = &mut self.running[i];
            r.ask = None;
            let outcome = match answer {
                Ok(a) => guarded("a step", || absorb(&mut r.seq, a, &self.stats)),
                Err(e) => Err(e),
            };
            match outcome {
                Ok(Ok(false)) => {}
                Ok(Ok(true)) => ended.push((i, End::Done)),
                Ok(Err(e)) | Err(e) => ended.push((i, End::Failed(e))),
            }
        }
        for (i, end) in ended.into_iter().rev() {
            let r = self.running.remove(i);
            self.end(r.seq, Some(r.cache), end);
        }
    }

    /// The group's asks through one forward (answers in the group's order).
    fn forward(&mut self, group: &[usize], rows: usize) -> Vec<Result<Answer, ApiError>> {
        let mut pairs: Vec<(&mut DiffusionTransformer, &Ask)> = self
            .running
            .iter_mut()
            .enumerate()
            .filter(|(i, _)| group.binary_search(i).is_ok())
            .filter_map(|(_, r)| Some((&mut r.cache.model, &r.ask.as_ref()?.1)))
            .collect();
        answer_all(&mut pairs, rows, self.info.shift_logits, &self.stats)
    }

    /// A request that never entered the table (the decoder refused it).
    fn end_new(&mut self, mut req: Request, e: ApiError) {
        let s = &self.stats;
        s.waiting.fetch_sub(1, Ordering::SeqCst);
        s.admitted.fetch_sub(1, Ordering::SeqCst);
        s.failed.fetch_add(1, Ordering::Relaxed);
        req.session.send(Event::Failed(e));
    }

    /// A sequence leaves the table: its cache is freed and the gauges updated before its handler
    /// hears the end (so a client that then asks `/health` sees it gone).
    fn end(&mut self, seq: Seq, cache: Option<Cache>, end: End) {
        let was_running = cache.is_some();
        drop(cache);
        let Seq {
            mut req,
            gen,
            mut first_token,
        } = seq;
        let event = match end {
            End::Done => {
                let before = req.session.tokens();
                let done = guarded("the end of a generation", || {
                    req.session.finish(&gen.finish())
                });
                match done {
                    Ok(Ok(ev)) => {
                        let arrived = req.arrived;
                        count_tokens(&req.session, before, arrived, &mut first_token, &self.stats);
                        self.stats.completed.fetch_add(1, Ordering::Relaxed);
                        ev
                    }
                    Ok(Err(e)) | Err(e) => {
                        self.stats.failed.fetch_add(1, Ordering::Relaxed);
                        Event::Failed(e)
                    }
                }
            }
            End::Failed(e) => {
                self.stats.failed.fetch_add(1, Ordering::Relaxed);
                Event::Failed(e)
            }
            End::Disconnected => {
                self.stats.cancelled.fetch_add(1, Ordering::Relaxed);
                Event::Failed(ApiError::request("the client disconnected"))
            }
            End::Timeout => {
                self.stats.cancelled.fetch_add(1, Ordering::Relaxed);
                Event::Failed(ApiError::timeout(self.config.timeout_secs))
            }
        };
        let gauge = if was_running {
            &self.stats.running
        } else {
            &self.stats.waiting
        };
        gauge.fetch_sub(1, Ordering::SeqCst);
        self.stats.admitted.fetch_sub(1, Ordering::SeqCst);
        req.session.send(event);
    }
}

/// Answer every ask in one `forward_many` of `rows` rows; when it fails, each ask alone, so that
/// only the sequence at fault gets an error. Answers in the order of `pairs`.
fn answer_all(
    pairs: &mut [(&mut DiffusionTransformer, &Ask)],
    rows: usize,
    shifted: bool,
    stats: &Stats,
) -> Vec<Result<Answer, ApiError>> {
    let n = pairs.len();
    stats.forward(n, rows);
    match guarded("a forward", || DiffusionTransformer::forward_many(pairs)) {
        Ok(Ok(answers)) if answers.len() == n => return answers.into_iter().map(Ok).collect(),
        Ok(Err(e)) if n == 1 => return vec![Err(ApiError::server(format!("forward: {e}")))],
        Err(e) if n == 1 => return vec![Err(e)],
        _ => {}
    }
    (0..n)
        .map(|k| {
            let one = &mut pairs[k..k + 1];
            stats.forward(1, one[0].1.rows_count(shifted));
            match guarded("a forward", || DiffusionTransformer::forward_many(one)) {
                Ok(Ok(mut a)) if a.len() == 1 => Ok(a.remove(0)),
                Ok(Ok(_)) => Err(ApiError::server("forward: no answer for the ask")),
                Ok(Err(e)) => Err(ApiError::server(format!("forward: {e}"))),
                Err(e) => Err(e),
            }
        })
        .collect()
}

/// Count the completion tokens that became final since `before` (tokens/s), and the request's
/// first one (time to first token, from `arrived`).
fn count_tokens(
    session: &Session,
    before: usize,
    arrived: Instant,
    first_token: &mut bool,
    stats: &Stats,
) {
    let now = session.tokens();
    stats.tokens(now.saturating_sub(before));
    if now > 0 && !*first_token {
        *first_token = true;
        stats.first_token(arrived.elapsed().as_secs_f64());
    }
}

/// Give a sequence its answer and stream the step; `true` when its answer is complete.
fn absorb(seq: &mut Seq, answer: Answer, stats: &Stats) -> Result<bool, ApiError> {
    let before = seq.req.session.tokens();
    let endpoint = seq.req.session.job.endpoint;
    let event = seq
        .gen
        .absorb(answer)
        .map_err(|e| decode_error(e, endpoint))?;
    let complete = seq.req.session.step(&event)?;
    count_tokens(
        &seq.req.session,
        before,
        seq.req.arrived,
        &mut seq.first_token,
        stats,
    );
    if complete {
        seq.gen.stop();
    }
    Ok(complete)
}

#[cfg(test)]
mod tests {
    use super::*;
    use dllm_models::{load, DiffusionLm, LoadOptions, ModelSource};

    fn ask(canvas: Vec<u32>, verify: Vec<usize>) -> Ask {
        Ask {
            window: 0..canvas.len(),
            rows: vec![canvas.len() - 1],
            canvas: vec![canvas],
            clear_cache: true,
            verify,
            verify_hidden: vec![],
            commit: None,
        }
    }

    #[test]
    fn a_bad_ask_fails_alone_and_the_others_get_their_solo_answers() {
        let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../../models/tiny-llada");
        let loaded = load(&ModelSource::parse(dir).unwrap(), &LoadOptions::default()).unwrap();
        let good = [
            ask(vec![2, 10, 11, 5], vec![]),
            ask(vec![2, 10, 11, 12, 13, 5], vec![]),
        ];
        // A verification position listed twice: the model refuses the ask.
        let bad = ask(vec![2, 10, 11, 12, 5], vec![2, 2]);
        let mut seqs: Vec<DiffusionTransformer> = (0..3)
            .map(|_| loaded.model.new_sequence().unwrap())
            .collect();
        let stats = Stats::default();
        let [a, b, c] = &mut seqs[..] else {
            unreachable!()
        };
        let mut pairs = vec![(a, &good[0]), (b, &bad), (c, &good[1])];
        let rows = good[0].rows_count(false) + bad.rows_count(false) + good[1].rows_count(false);
        let got = answer_all(&mut pairs, rows, false, &stats);
        assert_eq!(got.len(), 3);
        let e = got[1].as_ref().unwrap_err();
        assert!(e.message.contains("listed twice"), "{}", e.message);
        for (k, g) in [(0, &good[0]), (2, &good[1])] {
            let alone = loaded.model.new_sequence().unwrap().answer(g).unwrap();
            let batched = got[k].as_ref().unwrap();
            assert_eq!(
                batched.logits.to_vec3::<f32>().unwrap(),
                alone.logits.to_vec3::<f32>().unwrap()
            );
        }
        // The failed batched forward, then each of the three alone.
        assert_eq!(stats.forwards.load(Ordering::Relaxed), 4);
        assert_eq!(stats.batched_forwards.load(Ordering::Relaxed), 1);
    }
}
