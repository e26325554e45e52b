//! `server-bench`: aggregate throughput and latency of `llada-server` at several numbers of
//! concurrent clients, with batching on and off, on loopback. Prints a markdown table.
//!
//! ```text
//! cargo run --release -p server --bin server-bench -- --model models/tiny-llada-long
//! ```
//!
//! It starts `llada-server` (the binary next to this one) on 127.0.0.1 with an ephemeral port, once
//! with `--max-batch 16` and once with `--max-batch 1`, and for each number of clients runs that
//! many client threads, each sending `--requests` non-streamed completions one after another
//! (prompts: the held-out long-math questions of the task suite, in order). Every loop is bounded;
//! nothing leaves the machine.

#[path = "../../tests/common/http.rs"]
mod http;

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::Instant;

use anyhow::{bail, Context, Result};
use clap::Parser;
use dllm_tasks::tasks::{test_set, TaskKind};
use serde_json::{json, Value};

#[derive(Parser, Debug)]
#[command(about = "Throughput and latency of llada-server under concurrent clients")]
struct Args {
    /// The model the server loads (as its --model).
    #[arg(long, default_value = "models/tiny-llada-long")]
    model: String,
    /// Numbers of concurrent clients, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "1,4,16")]
    clients: Vec<usize>,
    /// Requests each client sends, one after another.
    #[arg(long, default_value_t = 4)]
    requests: usize,
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
    let r = http::request(addr, "POST", "/v1/completions", body.as_bytes());
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

fn main() -> Result<()> {
    let a = Args::parse();
    let prompts: Arc<Vec<String>> = Arc::new(
        test_set(TaskKind::LongMath)
            .into_iter()
            .map(|e| e.prompt)
            .collect(),
    );
    println!(
        "| clients | batching | requests | completion tokens | wall s | aggregate tok/s | p50 latency s | p95 latency s | forwards | batched forwards | mean batch |"
    );
    println!("|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    for (label, max_batch) in [("on (max 16)", 16), ("off", 1)] {
        let s = start(&a, max_batch)?;
        // Warm-up: the first forwards size the buffers.
        one(&s.addr, &prompts[0], &a.strategy)?;
        for &c in &a.clients {
            let before: Value = http::request(&s.addr, "GET", "/health", b"").json();
            let t0 = Instant::now();
            let handles: Vec<_> = (0..c)
                .map(|k| {
                    let (addr, prompts, strategy, n) = (
                        s.addr.clone(),
                        prompts.clone(),
                        a.strategy.clone(),
                        a.requests,
                    );
                    std::thread::spawn(move || -> Result<Vec<Sample>> {
                        (0..n)
                            .map(|r| one(&addr, &prompts[(k * n + r) % prompts.len()], &strategy))
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
            let tokens: u64 = samples.iter().map(|s| s.tokens).sum();
            let (bf, bs) = (d("batched_forwards"), d("batched_sequences"));
            println!(
                "| {c} | {label} | {} | {tokens} | {wall:.2} | {:.1} | {:.3} | {:.3} | {} | {bf} | {} |",
                samples.len(),
                tokens as f64 / wall,
                percentile(&lat, 0.5),
                percentile(&lat, 0.95),
                d("forwards"),
                if bf > 0 {
                    format!("{:.1}", bs as f64 / bf as f64)
                } else {
                    "-".into()
                },
            );
        }
    }
    Ok(())
}
