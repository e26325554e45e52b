//! `server-bench`: aggregate throughput and latency of `llada-server` at several numbers of
//! concurrent clients, with batching on and off, on loopback. Prints a markdown table.
//!
//! ```text
//! cargo run --release -p server --bin server-bench -- --model models/tiny-llada-long
//! ```
//!
//! It starts two `llada-server`s (the binary next to this one) on 127.0.0.1 with ephemeral ports,
//! one with `--max-batch 16` and one with `--max-batch 1`, and for each number of clients runs that
//! many client threads against one, then the other, the `--requests` non-streamed completions of a
//! measurement shared evenly by its clients (each sends its share one after another). Prompts: the
//! held-out long-math questions of the task suite, all of them in order (`mixed`) or those of the
//! most common token count (`same-length`: canvases of one length, the case batching serves).
//! Every loop is bounded; nothing leaves the machine.

#[path = "../../tests/common/http.rs"]
mod http;

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::Instant;

use anyhow::{bail, Context, Result};
use clap::Parser;
use dllm_models::TextTokenizer;
use dllm_tasks::tasks::{test_set, TaskKind};
use serde_json::{json, Value};

#[derive(Parser, Debug)]
#[command(about = "Throughput and latency of llada-server under concurrent clients")]
struct Args {
    /// The model the server loads (as its --model; a directory with a tokenizer.json).
    #[arg(long, default_value = "models/tiny-llada-long")]
    model: String,
    /// Numbers of concurrent clients, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "1,4,16")]
    clients: Vec<usize>,
    /// Requests per measurement, shared evenly by its clients (each sends its share one after
    /// another): every row has the same number of latency samples.
    #[arg(long, default_value_t = 16)]
    requests: usize,
    /// Prompts: `same-length` (the long-math questions whose prompts have the most common token
    /// count: canvases of one length, which batch) and/or `mixed` (the questions in order, of
    /// every length), comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "same-length,mixed")]
    workloads: Vec<String>,
    /// Decoding strategy of every request.
    #[arg(long, default_value = "vanilla")]
    strategy: String,
    /// Threads of the server's CPU kernels (--threads).
    #[arg(long)]
    threads: Option<usize>,
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

fn start(a: &Args, max_batch: usize) -> Result<Server> {
    let exe = std::env::current_exe()?
        .parent()
        .context("the binary's directory")?
        .join("llada-server");
    let mut cmd = Command::new(&exe);
    cmd.args(["--host", "127.0.0.1", "--port", "0", "--model", &a.model])
        .args([
            "--max-sequences",
            "16",
            "--max-batch",
            &max_batch.to_string(),
        ])
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
        bail!("llada-server did not start: {line:?}");
    };
    Ok(Server {
        addr: addr.to_string(),
        child,
    })
}

struct Sample {
    latency_s: f64,
    tokens: u64,
}

fn one(addr: &str, prompt: &str, strategy: &str) -> Result<Sample> {
    let body = json!({"prompt": prompt, "strategy": strategy}).to_string();
    let t = Instant::now();
    let r = http::request_within(
        addr,
        "POST",
        "/v1/completions",
        body.as_bytes(),
        std::time::Duration::from_secs(3600),
    );
    let latency_s = t.elapsed().as_secs_f64();
    if r.status != 200 {
        bail!("status {}: {}", r.status, r.body);
    }
    let v = r.json();
    Ok(Sample {
        latency_s,
        tokens: v["usage"]["completion_tokens"].as_u64().unwrap_or(0),
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
    forwards: u64,
    batched_forwards: u64,
    batched_sequences: u64,
}

fn measure(
    s: &Server,
    a: &Args,
    prompts: &Arc<Vec<String>>,
    c: usize,
    workload: &str,
) -> Result<Row> {
    let before: Value = http::request(&s.addr, "GET", "/health", b"").json();
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
    let after: Value = http::request(&s.addr, "GET", "/health", b"").json();
    let d = |k: &str| after[k].as_u64().unwrap_or(0) - before[k].as_u64().unwrap_or(0);
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
        forwards: d("forwards"),
        batched_forwards: d("batched_forwards"),
        batched_sequences: d("batched_sequences"),
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
        other => bail!("--workloads: `{other}` (expected same-length or mixed)"),
    }
}

fn main() -> Result<()> {
    let a = Args::parse();
    if a.clients.is_empty() || a.clients.contains(&0) || a.requests == 0 {
        bail!("--clients and --requests must be positive");
    }
    let workloads: Vec<(String, Arc<Vec<String>>)> = a
        .workloads
        .iter()
        .map(|w| Ok((w.clone(), Arc::new(workload_prompts(&a, w)?))))
        .collect::<Result<_>>()?;
    // Both servers up at once; each measurement runs on one, then at once on the other, so the
    // two configurations share the machine's conditions.
    let servers = [
        ("on (max 16)", start(&a, 16)?),
        ("off (1 sequence per forward)", start(&a, 1)?),
    ];
    for (_, s) in &servers {
        // Warm-up: the first forwards size the buffers.
        one(&s.addr, &workloads[0].1[0], &a.strategy)?;
    }
    let mut rows: Vec<(usize, Row)> = Vec::new();
    for (w, prompts) in &workloads {
        for &c in &a.clients {
            for (i, (label, s)) in servers.iter().enumerate() {
                let r = measure(s, &a, prompts, c, w)?;
                eprintln!(
                    "{w}, {c} clients, batching {label}: {} requests, {:.1} tok/s, p50 {:.3} s, \
                     p95 {:.3} s, {} forwards ({} batched)",
                    r.requests,
                    r.tokens as f64 / r.wall,
                    r.p50,
                    r.p95,
                    r.forwards,
                    r.batched_forwards
                );
                rows.push((i, r));
            }
        }
    }
    println!(
        "| prompts | clients | batching | requests | completion tokens | wall s | aggregate tok/s | p50 latency s | p95 latency s | forwards | batched forwards | mean batch |"
    );
    println!("|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    for (i, r) in &rows {
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
            r.batched_forwards,
            if r.batched_forwards > 0 {
                format!(
                    "{:.1}",
                    r.batched_sequences as f64 / r.batched_forwards as f64
                )
            } else {
                "-".into()
            },
        );
    }
    println!();
    println!(
        "| prompts | clients | batching gain: aggregate tok/s (on / off) | p50 latency (off / on) | p95 latency (off / on) |"
    );
    println!("|---|---:|---:|---:|---:|");
    for (w, _) in &workloads {
        for &c in &a.clients {
            let get = |i: usize| {
                rows.iter()
                    .find(|(j, r)| *j == i && r.clients == c && &r.workload == w)
                    .map(|(_, r)| r)
            };
            if let (Some(on), Some(off)) = (get(0), get(1)) {
                println!(
                    "| {w} | {c} | {:.2}x | {:.2}x | {:.2}x |",
                    (on.tokens as f64 / on.wall) / (off.tokens as f64 / off.wall),
                    off.p50 / on.p50,
                    off.p95 / on.p95,
                );
            }
        }
    }
    Ok(())
}
