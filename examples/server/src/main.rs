//! `llada-server`: an OpenAI-compatible HTTP server for diffusion LLMs (LLaDA, Dream).
//!
//! ```text
//! llada-server --port 8080                              # the embedded tiny LLaDA
//! llada-server --model models/tiny-llada-long --port 8080 --strategy prefix-cache
//! ```
//!
//! `POST /v1/completions`, `POST /v1/chat/completions` (the model's chat template),
//! `GET /v1/models`, `GET /health`, `GET /metrics` (Prometheus), and at `/` a page that shows the
//! canvas denoise. One engine thread (`engine`) owns the weights and every sequence, and batches
//! every running sequence's next step into one multi-sequence forward. The decoding
//! flags are `generate`'s (shared through `llada-cli`): they set the server's defaults, and a
//! request's `strategy`, `steps`, `block_length`, `threshold`, `temperature`, `top_p`, `seed` and
//! `max_tokens` override them with the same checks. Requests are checked before any route runs
//! (`guard`: Host, Origin, `--api-key`), connections are bounded (`conn`: header and idle
//! timeouts, `--max-connections`). See `examples/server/README.md`.

mod conn;
#[path = "../../generate/src/embedded.rs"]
mod embedded;
mod engine;
mod error;
mod guard;
mod metrics;
mod request;
mod routes;
mod session;

use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{bail, Context, Result};
use candle_core::{DType, Device};
use clap::Parser;
use dllm_models::{load, DiffusionLm, LoadOptions, LoadedModel, ModelSource};
use llada_cli::{DecodeArgs, DeviceArgs};

use crate::metrics::Stats;
use crate::session::{Limits, Shared};

/// Serve a masked-diffusion language model over an OpenAI-compatible HTTP API.
#[derive(Parser, Debug)]
#[command(version, about, long_about = None)]
struct Args {
    /// Model: a Hugging Face model directory, a .gguf file, or a hub id (`owner/name[@revision]`)
    /// [default: the embedded tiny LLaDA trained on the task suite].
    #[arg(long, visible_alias = "model-id")]
    model: Option<String>,
    /// A tokenizer.json to use instead of the one next to the weights.
    #[arg(long)]
    tokenizer: Option<std::path::PathBuf>,
    /// Address to listen on (loopback by default). Any other address needs --api-key.
    #[arg(long, default_value = "127.0.0.1")]
    host: String,
    /// Port to listen on (0: any free port; the address is printed on stdout).
    #[arg(long, default_value_t = 8080)]
    port: u16,
    /// Sequences decoded at once (each holds its own KV cache); more requests wait in the queue.
    #[arg(long, default_value_t = 16)]
    max_sequences: usize,
    /// Rows at most in one forward: the engine batches the running sequences' next steps first
    /// come, first served while their rows (window + verification rows, times the batch) fit. The
    /// first always goes in, so 1 means one sequence per forward (one at a time).
    #[arg(long, default_value_t = 2048)]
    max_batch_rows: usize,
    /// Requests that may wait for a sequence slot; beyond that a request is refused with 429.
    #[arg(long, default_value_t = 64)]
    max_queue: usize,
    /// Largest request body, bytes (413 beyond).
    #[arg(long, default_value_t = 1 << 20)]
    max_body_bytes: usize,
    /// Largest `max_tokens` a request may ask for [default: the model's context length].
    #[arg(long)]
    max_tokens_limit: Option<usize>,
    /// Per-request timeout, seconds (queueing included); the sequence is cancelled at the
    /// deadline and the request answered 504 (or ended with an error chunk when streaming).
    #[arg(long, default_value_t = 600.0)]
    timeout: f64,
    /// Bearer token every request must carry (`Authorization: Bearer <key>`; 401 otherwise),
    /// except `GET /health` and the page at `/`. Required when --host is not loopback.
    #[arg(long)]
    api_key: Option<String>,
    /// An origin (`scheme://host[:port]`) whose web pages may call the API (CORS); repeatable.
    /// Requests from any other page's origin are refused (403); requests without Origin pass.
    #[arg(long)]
    allow_origin: Vec<String>,
    /// Seconds a client has to send a request's head, from the connection's start or the
    /// request's first byte (and again its body, from the head); then the connection is closed.
    #[arg(long, default_value_t = 10.0)]
    header_timeout: f64,
    /// Seconds a keep-alive connection may wait for its next request; then it is closed.
    #[arg(long, default_value_t = 60.0)]
    idle_timeout: f64,
    /// Connections open at once; one beyond that is answered 503 and closed at once.
    #[arg(long, default_value_t = 256)]
    max_connections: usize,
    #[command(flatten)]
    decode: DecodeArgs,
    /// Compute dtype: f32, f16 or bf16.
    #[arg(long, default_value = "f32")]
    dtype: String,
    /// Threads for every CPU kernel, 1..=256 (default: one per core).
    #[arg(long)]
    threads: Option<usize>,
    #[command(flatten)]
    device: DeviceArgs,
}

fn parse_dtype(s: &str) -> Result<DType> {
    match s {
        "f32" => Ok(DType::F32),
        "f16" => Ok(DType::F16),
        "bf16" => Ok(DType::BF16),
        _ => bail!("--dtype: `{s}` (expected f32, f16 or bf16)"),
    }
}

/// The id `/v1/models` lists: the embedded model's name, a directory's or file's name, a hub id.
fn model_id(spec: Option<&str>) -> String {
    match spec {
        None => "tiny-llada".to_string(),
        Some(s) => {
            let p = std::path::Path::new(s.trim_end_matches('/'));
            if p.exists() {
                p.file_stem()
                    .map(|n| n.to_string_lossy().into_owned())
                    .unwrap_or_else(|| s.to_string())
            } else {
                s.to_string()
            }
        }
    }
}

fn no_key(host: &str) -> String {
    format!(
        "--host {host} is not a loopback address: anyone who can reach it could use the server, \
         so it needs --api-key <key> (clients then send `Authorization: Bearer <key>`); or listen \
         on 127.0.0.1"
    )
}

/// Check the flags, load the model, start the engine, and serve until Ctrl-C.
fn run(a: Args) -> Result<()> {
    check_flags(&a)?;
    let access = Arc::new(guard::Access::new(&a.allow_origin, a.api_key.clone())?);
    if access.api_key.is_none() && !guard::is_loopback_host(&a.host) {
        bail!("{}", no_key(&a.host));
    }
    let t_load = Instant::now();
    let loaded = load_model(&a)?;
    let info = loaded.model.info().clone();
    // The server's defaults must be valid on their own (the same checks as generate's flags).
    let defaults = a.decode.params(&loaded.defaults, info.shift_logits)?;
    let shared = start_engine(&a, loaded)?;
    let loaded_line = format!(
        "loaded {} ({}, {:.1}M parameters) in {:.2}s; default strategy {}, {} positions in blocks of {}",
        shared.model_id,
        info.arch,
        info.num_params as f64 / 1e6,
        t_load.elapsed().as_secs_f64(),
        defaults.strategy.name(),
        defaults.gen_length,
        defaults.block_length,
    );
    serve(&a, shared, access, loaded_line)
}

/// The limits' flags, checked before the model is read.
fn check_flags(a: &Args) -> Result<()> {
    if let Some(t) = a.threads {
        // The model's own pool (LoadOptions::threads), where its CPU kernels run: checked now,
        // before the model is read.
        dllm_models::threads::pool(t).context("--threads")?;
    }
    for (name, v) in [
        ("--max-sequences", a.max_sequences),
        ("--max-batch-rows", a.max_batch_rows),
        ("--max-body-bytes", a.max_body_bytes),
    ] {
        if v == 0 {
            bail!("{name} must be positive");
        }
    }
    for (name, v) in [
        ("--timeout", a.timeout),
        ("--header-timeout", a.header_timeout),
        ("--idle-timeout", a.idle_timeout),
    ] {
        if !(v.is_finite() && v > 0.0 && v < 1e9) {
            bail!("{name} must be a positive number of seconds, got {v}");
        }
    }
    if !(1..=1_000_000).contains(&a.max_connections) {
        bail!(
            "--max-connections must be in [1, 1000000], got {}",
            a.max_connections
        );
    }
    Ok(())
}

/// `--model`, or the embedded model, on `--device`; its warnings printed.
fn load_model(a: &Args) -> Result<LoadedModel> {
    let backend = a.device.backend()?;
    let opts = LoadOptions {
        dtype: parse_dtype(&a.dtype)?,
        device: Device::Cpu,
        tokenizer: a.tokenizer.clone(),
        backend,
        threads: a.threads,
        ..Default::default()
    };
    let loaded = match &a.model {
        Some(spec) => {
            let source = ModelSource::parse(spec)?;
            load(&source, &opts).with_context(|| format!("loading {source}"))?
        }
        None => embedded::load(&opts)?,
    };
    for w in &loaded.warnings {
        eprintln!("warning: {w}");
    }
    Ok(loaded)
}

/// Start the serving engine on the model's weights, and the state every handler shares.
fn start_engine(a: &Args, loaded: LoadedModel) -> Result<Arc<Shared>> {
    let info = loaded.model.info().clone();
    let max_tokens = a.max_tokens_limit.unwrap_or(info.max_seq_len);
    if max_tokens == 0 {
        bail!("--max-tokens-limit must be positive");
    }
    let stats = Arc::new(Stats::default());
    let engine = engine::Engine::start(
        loaded.model.weights().clone(),
        info.clone(),
        engine::Config {
            max_sequences: a.max_sequences,
            max_queue: a.max_queue,
            max_batch_rows: a.max_batch_rows,
            timeout_secs: a.timeout,
            latency: a.decode.latency_table()?,
        },
        stats.clone(),
    )?;
    Ok(Arc::new(Shared {
        model_id: model_id(a.model.as_deref()),
        info,
        tokenizer: loaded.tokenizer.clone().map(Arc::new),
        checkpoint: loaded.defaults,
        decode: a.decode.clone(),
        engine,
        stats,
        limits: Limits {
            max_sequences: a.max_sequences,
            max_queue: a.max_queue,
            max_batch_rows: a.max_batch_rows,
            max_body_bytes: a.max_body_bytes,
            max_tokens,
            timeout_secs: a.timeout,
        },
        created: SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0),
    }))
}

/// Bind `--host:--port`, print `loaded_line` and the address, and serve until Ctrl-C.
fn serve(
    a: &Args,
    shared: Arc<Shared>,
    access: Arc<guard::Access>,
    loaded_line: String,
) -> Result<()> {
    let app = routes::App {
        shared,
        body_timeout: Duration::from_secs_f64(a.header_timeout),
    };
    let limits = conn::ConnLimits {
        header_timeout: Duration::from_secs_f64(a.header_timeout),
        idle_timeout: Duration::from_secs_f64(a.idle_timeout),
        max_connections: a.max_connections,
    };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    rt.block_on(async move {
        let listener = tokio::net::TcpListener::bind((a.host.as_str(), a.port))
            .await
            .with_context(|| format!("binding {}:{}", a.host, a.port))?;
        let addr = listener.local_addr()?;
        if access.api_key.is_none() && !addr.ip().to_canonical().is_loopback() {
            bail!("{}", no_key(&addr.ip().to_string()));
        }
        eprintln!("{loaded_line}");
        // The one line on stdout: tests and scripts read the address from it.
        println!("listening on http://{addr}");
        use std::io::Write;
        std::io::stdout().flush()?;
        let shutdown = async {
            let _ = tokio::signal::ctrl_c().await;
        };
        conn::serve(listener, routes::router(app, access), limits, shutdown).await?;
        Ok(())
    })
}

fn main() {
    let args = Args::parse();
    if let Err(e) = run(args) {
        eprintln!("error: {e:#}");
        std::process::exit(1);
    }
}
