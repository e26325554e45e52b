//! The server's counters and gauges, shared by the engine thread and the HTTP handlers, and their
//! Prometheus text exposition (`GET /metrics`).
//!
//! `/metrics` carries exactly the quantities of the serving loop: sequences waiting and running,
//! forwards, rows per batched forward, completion tokens per second and time to first token.
//! `/health` reports the request counters beside them.

use std::collections::VecDeque;
use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// The window `llada_tokens_per_second` averages over.
pub const TOKENS_WINDOW: Duration = Duration::from_secs(10);

/// Bucket bounds of rows per batched forward.
const ROW_BUCKETS: &[f64] = &[
    16.0, 32.0, 64.0, 128.0, 256.0, 512.0, 1024.0, 2048.0, 4096.0, 8192.0,
];
/// Bucket bounds of the time to first token, seconds.
const TTFT_BUCKETS: &[f64] = &[
    0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
];

/// A Prometheus histogram: counts per bucket (not cumulative), the sum and the count.
#[derive(Debug)]
struct Histogram {
    bounds: &'static [f64],
    counts: Vec<u64>,
    sum: f64,
    count: u64,
}

impl Histogram {
    fn new(bounds: &'static [f64]) -> Self {
        Self {
            bounds,
            counts: vec![0; bounds.len()],
            sum: 0.0,
            count: 0,
        }
    }

    fn observe(&mut self, v: f64) {
        if let Some(i) = self.bounds.iter().position(|&b| v <= b) {
            self.counts[i] += 1;
        }
        self.sum += v;
        self.count += 1;
    }

    fn render(&self, out: &mut String, name: &str) {
        let mut cumulative = 0;
        for (b, c) in self.bounds.iter().zip(&self.counts) {
            cumulative += c;
            let _ = writeln!(out, "{name}_bucket{{le=\"{b}\"}} {cumulative}");
        }
        let _ = writeln!(out, "{name}_bucket{{le=\"+Inf\"}} {}", self.count);
        let _ = writeln!(out, "{name}_sum {}", self.sum);
        let _ = writeln!(out, "{name}_count {}", self.count);
    }
}

/// Completion tokens of the last [`TOKENS_WINDOW`], as `(when, tokens)`.
#[derive(Debug, Default)]
struct TokenWindow {
    events: VecDeque<(Instant, u64)>,
}

impl TokenWindow {
    fn prune(&mut self, now: Instant) {
        while self
            .events
            .front()
            .is_some_and(|(t, _)| now.duration_since(*t) > TOKENS_WINDOW)
        {
            self.events.pop_front();
        }
    }
}

/// Everything the server counts. Gauges are kept by the engine thread (the one owner of the
/// sequence table); the handlers read them and count what they refuse.
#[derive(Debug)]
pub struct Stats {
    started_at: Instant,
    /// Requests in the engine's table (waiting or running): what admission compares with
    /// `--max-sequences` + `--max-queue`.
    pub admitted: AtomicUsize,
    /// Requests waiting for a sequence slot (no KV cache yet).
    pub waiting: AtomicUsize,
    /// Sequences decoding.
    pub running: AtomicUsize,
    /// Sequences whose KV cache is allocated (running, or being torn down): 0 when all are freed.
    pub live: AtomicUsize,
    /// Requests handed to the engine.
    pub started: AtomicU64,
    pub completed: AtomicU64,
    /// Ended by a disconnect or the timeout.
    pub cancelled: AtomicU64,
    pub failed: AtomicU64,
    pub rejected_queue_full: AtomicU64,
    /// Model forwards (`forward_many` calls: one multi-sequence forward counts once).
    pub forwards: AtomicU64,
    /// Forwards that carried two or more sequences.
    pub batched_forwards: AtomicU64,
    /// Sequences carried by all forwards (summed): over `forwards`, the mean batch.
    pub forward_sequences: AtomicU64,
    rows: Mutex<Histogram>,
    ttft: Mutex<Histogram>,
    tokens: Mutex<TokenWindow>,
}

impl Default for Stats {
    fn default() -> Self {
        Self {
            started_at: Instant::now(),
            admitted: AtomicUsize::new(0),
            waiting: AtomicUsize::new(0),
            running: AtomicUsize::new(0),
            live: AtomicUsize::new(0),
            started: AtomicU64::new(0),
            completed: AtomicU64::new(0),
            cancelled: AtomicU64::new(0),
            failed: AtomicU64::new(0),
            rejected_queue_full: AtomicU64::new(0),
            forwards: AtomicU64::new(0),
            batched_forwards: AtomicU64::new(0),
            forward_sequences: AtomicU64::new(0),
            rows: Mutex::new(Histogram::new(ROW_BUCKETS)),
            ttft: Mutex::new(Histogram::new(TTFT_BUCKETS)),
            tokens: Mutex::new(TokenWindow::default()),
        }
    }
}

impl Stats {
    /// One forward of `sequences` sequences and `rows` rows.
    pub fn forward(&self, sequences: usize, rows: usize) {
        self.forwards.fetch_add(1, Ordering::Relaxed);
        self.forward_sequences
            .fetch_add(sequences as u64, Ordering::Relaxed);
        if sequences > 1 {
            self.batched_forwards.fetch_add(1, Ordering::Relaxed);
        }
        lock(&self.rows).observe(rows as f64);
    }

    /// A request's first completion token, `secs` after it reached the engine.
    pub fn first_token(&self, secs: f64) {
        lock(&self.ttft).observe(secs);
    }

    /// `n` completion tokens became final now.
    pub fn tokens(&self, n: usize) {
        if n == 0 {
            return;
        }
        let now = Instant::now();
        let mut w = lock(&self.tokens);
        w.prune(now);
        w.events.push_back((now, n as u64));
    }

    /// Completion tokens per second over the last [`TOKENS_WINDOW`] (or since the start, when the
    /// server is younger).
    pub fn tokens_per_second(&self) -> f64 {
        let now = Instant::now();
        let mut w = lock(&self.tokens);
        w.prune(now);
        let n: u64 = w.events.iter().map(|(_, n)| n).sum();
        let span = now.duration_since(self.started_at).min(TOKENS_WINDOW);
        n as f64 / span.as_secs_f64().max(1e-3)
    }

    /// The Prometheus text exposition format (version 0.0.4).
    pub fn prometheus(&self) -> String {
        let mut out = String::new();
        let mut family = |name: &str, kind: &str, help: &str, value: Option<String>| {
            let _ = writeln!(out, "# HELP {name} {help}");
            let _ = writeln!(out, "# TYPE {name} {kind}");
            if let Some(v) = value {
                let _ = writeln!(out, "{name} {v}");
            }
        };
        family(
            "llada_waiting_sequences",
            "gauge",
            "Requests admitted and waiting for a sequence slot (--max-sequences).",
            Some(self.waiting.load(Ordering::SeqCst).to_string()),
        );
        family(
            "llada_running_sequences",
            "gauge",
            "Sequences decoding, each with its own KV cache.",
            Some(self.running.load(Ordering::SeqCst).to_string()),
        );
        family(
            "llada_forwards_total",
            "counter",
            "Model forwards; one forward of many sequences counts once.",
            Some(self.forwards.load(Ordering::Relaxed).to_string()),
        );
        family(
            "llada_tokens_per_second",
            "gauge",
            "Completion tokens per second over the last 10 seconds, all requests together.",
            Some(format!("{}", self.tokens_per_second())),
        );
        family(
            "llada_batch_rows",
            "histogram",
            "Rows (window and verification rows of every sequence) per batched forward.",
            None,
        );
        lock(&self.rows).render(&mut out, "llada_batch_rows");
        let _ = writeln!(
            out,
            "# HELP llada_time_to_first_token_seconds From a request's arrival at the engine to \
             its first final completion token."
        );
        let _ = writeln!(out, "# TYPE llada_time_to_first_token_seconds histogram");
        lock(&self.ttft).render(&mut out, "llada_time_to_first_token_seconds");
        out
    }
}

/// A poisoned lock still holds valid counts (every update is one whole statement).
fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn histograms_are_cumulative_and_the_exposition_is_complete() {
        let s = Stats::default();
        s.forward(1, 40);
        s.forward(3, 100);
        s.forward(2, 100_000);
        s.first_token(0.2);
        s.tokens(7);
        let text = s.prometheus();
        assert!(text.contains("llada_forwards_total 3\n"), "{text}");
        assert!(
            text.contains("llada_batch_rows_bucket{le=\"32\"} 0\n"),
            "{text}"
        );
        assert!(
            text.contains("llada_batch_rows_bucket{le=\"64\"} 1\n"),
            "{text}"
        );
        assert!(
            text.contains("llada_batch_rows_bucket{le=\"128\"} 2\n"),
            "{text}"
        );
        assert!(
            text.contains("llada_batch_rows_bucket{le=\"8192\"} 2\n"),
            "{text}"
        );
        assert!(
            text.contains("llada_batch_rows_bucket{le=\"+Inf\"} 3\n"),
            "{text}"
        );
        assert!(text.contains("llada_batch_rows_sum 100140\n"), "{text}");
        assert!(text.contains("llada_time_to_first_token_seconds_bucket{le=\"0.1\"} 0\n"));
        assert!(text.contains("llada_time_to_first_token_seconds_bucket{le=\"0.25\"} 1\n"));
        assert!(s.tokens_per_second() > 0.0);
        assert_eq!(s.batched_forwards.load(Ordering::Relaxed), 2);
        for name in [
            "llada_waiting_sequences",
            "llada_running_sequences",
            "llada_forwards_total",
            "llada_tokens_per_second",
            "llada_batch_rows",
            "llada_time_to_first_token_seconds",
        ] {
            assert!(text.contains(&format!("# HELP {name} ")), "{name}");
            assert!(text.contains(&format!("# TYPE {name} ")), "{name}");
        }
    }
}
