//! `server-bench`: what the engine's batching gains, on loopback. Prints markdown tables.
//!
//! ```text
//! cargo build --release -p server --bins
//! target/release/server-bench --model models/tiny-llada-long                  # throughput table
//! target/release/server-bench --lone 20 --baseline /path/to/older/llada-server # a lone request
//! target/release/server-bench --churn 200                                     # RSS over disconnects
//! ```
//!
//! **Throughput** (the default): two `llada-server`s (the binary next to this one, or `--server`)
//! on 127.0.0.1 with ephemeral ports — the batching engine (`--max-batch-rows`, the server's
//! default unless `--batch-rows`) and the one-sequence-at-a-time engine (`--max-batch-rows 1`) —
//! and for each number of clients that many client threads against one server, then the other, the
//! `--requests` non-streamed completions of a measurement shared evenly by its clients (each
//! sends its share one after another). Rows: aggregate completion tokens/s, p50/p95 latency,
//! forwards, mean sequences and rows per forward (from `/health` and `/metrics`). Prompts: the
//! held-out long-math questions of the task suite in order (`mixed`: every prompt length) or
//! those of the most common token count (`same-length`). Strategy: the server's default unless
//! `--strategy`.
//!
//! With `--baseline <binary>` a third server (another build, e.g. the previous one, started with
//! no engine flag) is measured in every row too.
//!
//! **Lone request** (`--lone N`): one client, N requests one after another, against this server
//! and, with `--baseline <binary>`, another build of llada-server, alternating request by request
//! so both see the same machine; prints mean, p50 and p95 latency.
//!
//! **Churn** (`--churn N`): N requests from 16 clients of which every fifth is a stream that hangs
//! up after its first chunk, twice — a warm-up round, the server's RSS, the measured round, and
//! (once `/metrics` shows no sequence running) the RSS again and the counters (`cancelled` counts
//! both rounds' hang-ups).
//!
//! Every loop is bounded; nothing leaves the machine.

#[path = "../../tests/common/http.rs"]
mod http;

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Write};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use clap::Parser;
use dllm_models::TextTokenizer;
use dllm_tasks::tasks::{test_set, TaskKind};
use serde_json::{json, Value};

#[derive(Parser, Debug)]
#[command(about = "Throughput, latency and memory of llada-server under concurrent clients")]
struct Args {
    /// The model the servers load (as their --model; a directory with a tokenizer.json).
    #[arg(long, default_value = "models/tiny-llada-long")]
    model: String,
    /// Numbers of concurrent clients, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "1,4,16")]
    clients: Vec<usize>,
    /// Requests per measurement, shared evenly by its clients (each sends its share one after
    /// another): every row has the same number of latency samples.
    #[arg(long, default_value_t = 16)]
    requests: usize,
    /// Prompts: `mixed` (the long-math questions in order, of every length) and/or `same-length`
    /// (those of the most common token count), comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "mixed")]
    workloads: Vec<String>,
    /// Decoding strategy of every request [default: the server's, mbsd].
    #[arg(long)]
    strategy: Option<String>,
    /// --max-batch-rows of the batching server [default: the server's default].
    #[arg(long)]
    batch_rows: Option<usize>,
    /// Threads of the servers' CPU kernels (--threads).
    #[arg(long)]
    threads: Option<usize>,
    /// The llada-server binary [default: the one next to this binary].
    #[arg(long)]
    server: Option<PathBuf>,
    /// Measure a lone request instead: this many requests, one after another.
    #[arg(long)]
    lone: Option<usize>,
    /// Another llada-server binary (e.g. an older build) measured alongside, started with no
    /// engine flag: a third row per number of clients, or with --lone a second server.
    #[arg(long)]
    baseline: Option<PathBuf>,
    /// Measure memory over this many streamed requests of which every fifth hangs up mid-stream.
    #[arg(long)]
    churn: Option<usize>,
}

struct Server {
    child: Child,
    addr: String,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Server {
    fn rss_kib(&self) -> Result<u64> {
        let s = std::fs::read_to_string(format!("/proc/{}/status", self.child.id()))?;
        s.lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
            .context("VmRSS")
    }

    fn get(&self, path: &str) -> Result<http::Response> {
        let r = http::request(&self.addr, "GET", path, b"");
        if r.status != 200 {
            bail!("GET {path}: status {}: {}", r.status, r.body);
        }
        Ok(r)
    }

    /// `/metrics` samples by name (labels included); empty from a server without `/metrics`.
    fn metrics(&self) -> Result<BTreeMap<String, f64>> {
        let r = http::request(&self.addr, "GET", "/metrics", b"");
        if r.status == 404 {
            return Ok(BTreeMap::new());
        }
        if r.status != 200 {
            bail!("GET /metrics: status {}: {}", r.status, r.body);
        }
        Ok(r.body
            .lines()
            .filter(|l| !l.starts_with('#'))
            .filter_map(|l| l.rsplit_once(' '))
            .filter_map(|(k, v)| Some((k.to_string(), v.parse().ok()?)))
            .collect())
    }
}

fn server_binary(a: &Args) -> Result<PathBuf> {
    match &a.server {
        Some(p) => Ok(p.clone()),
        None => Ok(std::env::current_exe()?
            .parent()
            .context("the binary's directory")?
            .join("llada-server")),
    }
}

fn start(exe: &PathBuf, a: &Args, extra: &[String]) -> Result<Server> {
    let mut cmd = Command::new(exe);
    cmd.args(["--host", "127.0.0.1", "--port", "0", "--model", &a.model])
        .args(extra)
        .stdout(Stdio::piped())
        .stderr(Stdio::null());
    if let Some(t) = a.threads {
        cmd.args(["--threads", &t.to_string()]);
    }
    let mut child = cmd.spawn().with_context(|| {
        format!(
            "starting {} (build it: cargo build --release -p server)",
            exe.display()
        )
    })?;
    let mut line = String::new();
    BufReader::new(child.stdout.take().context("stdout")?).read_line(&mut line)?;
    let Some(addr) = line.trim().strip_prefix("listening on http://") else {
        bail!("{} did not start: {line:?}", exe.display());
    };
    Ok(Server {
        addr: addr.to_string(),
        child,
    })
}

fn body(prompt: &str, strategy: &Option<String>, stream: bool) -> Value {
    let mut b = json!({"prompt": prompt, "stream": stream});
    if let Some(s) = strategy {
        b["strategy"] = json!(s);
    }
    b
}

struct Sample {
    latency_s: f64,
    tokens: u64,
}

fn one(addr: &str, prompt: &str, strategy: &Option<String>) -> Result<Sample> {
    let b = body(prompt, strategy, false).to_string();
    let t = Instant::now();
    let r = http::request_within(
        addr,
        "POST",
        "/v1/completions",
        b.as_bytes(),
        Duration::from_secs(3600),
    );
    let latency_s = t.elapsed().as_secs_f64();
    if r.status != 200 {
        bail!("status {}: {}", r.status, r.body);
    }
    Ok(Sample {
        latency_s,
        tokens: r.json()["usage"]["completion_tokens"].as_u64().unwrap_or(0),
    })
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

/// One measurement: `c` clients against `s`.
struct Row {
    workload: String,
    clients: usize,
    requests: usize,
    tokens: u64,
    wall: f64,
    p50: f64,
    p95: f64,
    forwards: f64,
    sequences: f64,
    rows: f64,
}

fn measure(
    s: &Server,
    a: &Args,
    prompts: &Arc<Vec<String>>,
    c: usize,
    workload: &str,
) -> Result<Row> {
    let (h0, m0) = (s.get("/health")?.json(), s.metrics()?);
    let per = a.requests.div_ceil(c);
    let t0 = Instant::now();
    let handles: Vec<_> = (0..c)
        .map(|k| {
            let (addr, prompts, strategy) = (s.addr.clone(), prompts.clone(), a.strategy.clone());
            std::thread::spawn(move || -> Result<Vec<Sample>> {
                (0..per)
                    .map(|r| one(&addr, &prompts[(k * per + r) % prompts.len()], &strategy))
                    .collect()
            })
        })
        .collect();
    let mut samples = Vec::new();
    for h in handles {
        samples.extend(
            h.join()
                .map_err(|_| anyhow::anyhow!("a client panicked"))??,
        );
    }
    let wall = t0.elapsed().as_secs_f64();
    let (h1, m1) = (s.get("/health")?.json(), s.metrics()?);
    let dh = |k: &str| h1[k].as_f64().unwrap_or(0.0) - h0[k].as_f64().unwrap_or(0.0);
    let dm = |k: &str| m1.get(k).unwrap_or(&0.0) - m0.get(k).unwrap_or(&0.0);
    let mut lat: Vec<f64> = samples.iter().map(|s| s.latency_s).collect();
    lat.sort_by(f64::total_cmp);
    Ok(Row {
        workload: workload.to_string(),
        clients: c,
        requests: samples.len(),
        tokens: samples.iter().map(|s| s.tokens).sum(),
        wall,
        p50: percentile(&lat, 0.5),
        p95: percentile(&lat, 0.95),
        forwards: dh("forwards"),
        sequences: dh("forward_sequences"),
        rows: dm("llada_batch_rows_sum"),
    })
}

/// The prompts of a workload.
fn workload_prompts(a: &Args, name: &str) -> Result<Vec<String>> {
    let all: Vec<String> = test_set(TaskKind::LongMath)
        .into_iter()
        .map(|e| e.prompt)
        .collect();
    match name {
        "mixed" => Ok(all),
        "same-length" => {
            let path = std::path::Path::new(&a.model).join("tokenizer.json");
            let tok = TextTokenizer::from_file(&path)
                .with_context(|| format!("--model: reading {}", path.display()))?;
            let mut by_len: BTreeMap<usize, Vec<String>> = BTreeMap::new();
            for p in all {
                // As the server encodes a text prompt.
                let n = tok.encode_prompt(&p, false)?.len();
                by_len.entry(n).or_default().push(p);
            }
            let (n, group) = by_len
                .into_iter()
                .max_by_key(|(n, g)| (g.len(), *n))
                .context("no prompts")?;
            eprintln!("same-length: {} prompts of {n} tokens", group.len());
            Ok(group)
        }
        other => bail!("--workloads: `{other}` (expected mixed or same-length)"),
    }
}

fn throughput(a: &Args) -> Result<()> {
    if a.clients.is_empty() || a.clients.contains(&0) || a.requests == 0 {
        bail!("--clients and --requests must be positive");
    }
    let workloads: Vec<(String, Arc<Vec<String>>)> = a
        .workloads
        .iter()
        .map(|w| Ok((w.clone(), Arc::new(workload_prompts(a, w)?))))
        .collect::<Result<_>>()?;
    let exe = server_binary(a)?;
    let batched: Vec<String> = match a.batch_rows {
        Some(n) => vec!["--max-batch-rows".into(), n.to_string()],
        None => vec![],
    };
    let one_at_a_time = vec!["--max-batch-rows".to_string(), "1".to_string()];
    // Both servers up at once; each measurement runs on one, then at once on the other, so the
    // two engines share the machine's conditions.
    let mut servers = vec![
        ("batched", start(&exe, a, &batched)?),
        ("one at a time", start(&exe, a, &one_at_a_time)?),
    ];
    if let Some(b) = &a.baseline {
        servers.push(("baseline", start(b, a, &[])?));
    }
    for (_, s) in &servers {
        // Warm-up: the first forwards size the buffers.
        one(&s.addr, &workloads[0].1[0], &a.strategy)?;
    }
    let mut rows: Vec<(usize, Row)> = Vec::new();
    for (w, prompts) in &workloads {
        for &c in &a.clients {
            for (i, (label, s)) in servers.iter().enumerate() {
                let r = measure(s, a, prompts, c, w)?;
                eprintln!(
                    "{w}, {c} clients, {label}: {} requests, {:.1} tok/s, p50 {:.3} s, \
                     p95 {:.3} s, {} forwards",
                    r.requests,
                    r.tokens as f64 / r.wall,
                    r.p50,
                    r.p95,
                    r.forwards,
                );
                rows.push((i, r));
            }
        }
    }
    println!(
        "| prompts | clients | engine | requests | completion tokens | wall s | aggregate tok/s | p50 latency s | p95 latency s | forwards | sequences per forward | rows per forward |"
    );
    println!("|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    for (i, r) in &rows {
        // A server without these counters (an older build) shows "-".
        let per = |x: f64, digits: usize| {
            if r.forwards > 0.0 && x > 0.0 {
                format!("{:.*}", digits, x / r.forwards)
            } else {
                "-".to_string()
            }
        };
        println!(
            "| {} | {} | {} | {} | {} | {:.2} | {:.1} | {:.3} | {:.3} | {} | {} | {} |",
            r.workload,
            r.clients,
            servers[*i].0,
            r.requests,
            r.tokens,
            r.wall,
            r.tokens as f64 / r.wall,
            r.p50,
            r.p95,
            r.forwards,
            per(r.sequences, 1),
            per(r.rows, 0),
        );
    }
    println!();
    println!(
        "| prompts | clients | versus | aggregate tok/s (batched / it) | p50 latency (it / batched) | p95 latency (it / batched) |"
    );
    println!("|---|---:|---|---:|---:|---:|");
    for (w, _) in &workloads {
        for &c in &a.clients {
            let get = |i: usize| {
                rows.iter()
                    .find(|(j, r)| *j == i && r.clients == c && &r.workload == w)
                    .map(|(_, r)| r)
            };
            for (i, (label, _)) in servers.iter().enumerate().skip(1) {
                if let (Some(on), Some(off)) = (get(0), get(i)) {
                    println!(
                        "| {w} | {c} | {label} | {:.2}x | {:.2}x | {:.2}x |",
                        (on.tokens as f64 / on.wall) / (off.tokens as f64 / off.wall),
                        off.p50 / on.p50,
                        off.p95 / on.p95,
                    );
                }
            }
        }
    }
    Ok(())
}

fn lone(a: &Args, n: usize) -> Result<()> {
    if n == 0 {
        bail!("--lone must be positive");
    }
    let prompts = workload_prompts(a, "mixed")?;
    let mut servers = vec![("this build", start(&server_binary(a)?, a, &[])?)];
    if let Some(b) = &a.baseline {
        servers.push(("baseline", start(b, a, &[])?));
    }
    for (_, s) in &servers {
        one(&s.addr, &prompts[0], &a.strategy)?;
    }
    let mut lat = vec![Vec::new(); servers.len()];
    for k in 0..n {
        for (i, (_, s)) in servers.iter().enumerate() {
            lat[i].push(one(&s.addr, &prompts[k % prompts.len()], &a.strategy)?.latency_s);
        }
    }
    println!("| server | requests | mean latency s | p50 latency s | p95 latency s |");
    println!("|---|---:|---:|---:|---:|");
    for ((label, _), l) in servers.iter().zip(&mut lat) {
        let mean = l.iter().sum::<f64>() / l.len() as f64;
        l.sort_by(f64::total_cmp);
        println!(
            "| {label} | {n} | {mean:.4} | {:.4} | {:.4} |",
            percentile(l, 0.5),
            percentile(l, 0.95)
        );
    }
    if lat.len() == 2 {
        let mean = |l: &[f64]| l.iter().sum::<f64>() / l.len() as f64;
        println!(
            "\nthis build / baseline: mean {:.3}x, p50 {:.3}x",
            mean(&lat[0]) / mean(&lat[1]),
            percentile(&lat[0], 0.5) / percentile(&lat[1], 0.5)
        );
    }
    Ok(())
}

/// A streamed request that hangs up after its first chunk.
fn hang_up(addr: &str, b: &Value) -> Result<()> {
    let b = b.to_string();
    let mut c = http::connect(addr);
    c.write_all(http::request_head("POST", "/v1/completions", addr, b.len()).as_bytes())?;
    c.write_all(b.as_bytes())?;
    let mut r = BufReader::new(c);
    let mut line = String::new();
    while !line.starts_with("data:") {
        line.clear();
        if r.read_line(&mut line)? == 0 {
            bail!("the stream ended before its first chunk");
        }
    }
    Ok(())
}

/// One round of the churn: `n` requests from 16 clients, every fifth a stream that hangs up after
/// its first chunk; returns (hung up, completed). Waits (bounded) until no sequence runs.
fn churn_round(s: &Server, a: &Args, prompts: &Arc<Vec<String>>, n: usize) -> Result<(u64, u64)> {
    const CLIENTS: usize = 16;
    let clients: Vec<_> = (0..CLIENTS)
        .map(|c| {
            let (addr, p, st) = (s.addr.clone(), prompts.clone(), a.strategy.clone());
            std::thread::spawn(move || -> Result<(u64, u64)> {
                let (mut dropped, mut ok) = (0, 0);
                for k in (c..n).step_by(CLIENTS) {
                    let prompt = &p[k % p.len()];
                    if k % 5 == 4 {
                        let mut b = body(prompt, &st, true);
                        b["stream_options"] = json!({"canvas": true});
                        hang_up(&addr, &b)?;
                        dropped += 1;
                    } else {
                        one(&addr, prompt, &st)?;
                        ok += 1;
                    }
                }
                Ok((dropped, ok))
            })
        })
        .collect();
    let (mut dropped, mut ok) = (0, 0);
    for h in clients {
        let (d, o) = h
            .join()
            .map_err(|_| anyhow::anyhow!("a client panicked"))??;
        dropped += d;
        ok += o;
    }
    let deadline = Instant::now() + Duration::from_secs(300);
    loop {
        let m = s.metrics()?;
        if m.get("llada_running_sequences") == Some(&0.0)
            && m.get("llada_waiting_sequences") == Some(&0.0)
        {
            return Ok((dropped, ok));
        }
        if Instant::now() > deadline {
            bail!("sequences still running 300 s after the last client: {m:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn churn(a: &Args, n: usize) -> Result<()> {
    let prompts = Arc::new(workload_prompts(a, "mixed")?);
    let s = start(&server_binary(a)?, a, &[])?;
    let rss0 = s.rss_kib()?;
    // Warm-up: a round of the same traffic (buffers, allocator arenas and caches reach their
    // working size), then the measured round.
    churn_round(&s, a, &prompts, n)?;
    let rss1 = s.rss_kib()?;
    let t0 = Instant::now();
    let (dropped, ok) = churn_round(&s, a, &prompts, n)?;
    let wall = t0.elapsed().as_secs_f64();
    let rss2 = s.rss_kib()?;
    let h = s.get("/health")?.json();
    println!(
        "| requests | hung up | completed | wall s | RSS at start MiB | RSS after warm-up MiB | RSS after the churn MiB | change MiB | running | live caches | failed | cancelled |"
    );
    println!("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    let mib = |k: u64| k as f64 / 1024.0;
    println!(
        "| {n} | {dropped} | {ok} | {wall:.1} | {:.1} | {:.1} | {:.1} | {:+.1} | {} | {} | {} | {} |",
        mib(rss0),
        mib(rss1),
        mib(rss2),
        mib(rss2) - mib(rss1),
        h["running_sequences"],
        h["live_sequences"],
        h["requests_failed"],
        h["requests_cancelled"],
    );
    Ok(())
}

fn main() -> Result<()> {
    let a = Args::parse();
    match (a.lone, a.churn) {
        (Some(_), Some(_)) => bail!("--lone and --churn are separate measurements: pick one"),
        (Some(n), None) => lone(&a, n),
        (None, Some(n)) => churn(&a, n),
        (None, None) => throughput(&a),
    }
}
