//! `latency-profile`: how long one forward of an `n`-token window against a cached prefix takes,
//! for `n` in 1..256, on the CPU or on the Hexagon backend. The JSON table it writes is the input
//! the speculative-window policy (a later issue) will read (`{"device", "model", "points": [{"tokens", "ms"}, ...]}`).
//!
//! ```text
//! latency-profile --device cpu --out cpu.json
//! latency-profile --device hexagon --out hexagon.json        # emulated DSP
//! latency-profile --model ./my-llada --device hexagon --hexagon-transport fastrpc
//! ```
//!
//! The emulated DSP runs the kernels' portable C on host threads: its numbers describe this
//! machine, not a phone.

use std::path::PathBuf;
use std::time::Instant;

use anyhow::{anyhow, bail, Context, Result};
use candle_core::{DType, Device, Tensor};
use candle_hexagon::{HexagonConfig, HexagonDevice, TransportConfig};
use clap::Parser;
use dllm_models::synthetic::{bench_llada_100m, random_weights, tiny_llada};
use dllm_models::weights::HfWeights;
use dllm_models::{
    Backend, DiffusionLm, DiffusionTransformer, LoadOptions, ModelSource, OpMode, Rows,
};

/// Forward latency per window size.
#[derive(Parser, Debug)]
#[command(version, about, long_about = None)]
struct Args {
    /// A model directory, .gguf file or hub id [default: a random synthetic model, see --synthetic].
    #[arg(long, visible_alias = "model-id")]
    model: Option<String>,
    /// Synthetic model when --model is absent: tiny (64-d, 2 layers) or 100m (97.5M parameters).
    #[arg(long, default_value = "100m")]
    synthetic: String,
    /// cpu or hexagon.
    #[arg(long, default_value = "cpu")]
    device: String,
    /// Hexagon: DSP worker threads.
    #[arg(long, default_value_t = candle_hexagon::device::DEFAULT_WORKERS)]
    hexagon_workers: usize,
    /// Hexagon: emulated or fastrpc.
    #[arg(long, default_value = "emulated")]
    hexagon_transport: String,
    /// Hexagon/FastRPC: library to dlopen, or `shim` for the host shim.
    #[arg(long, default_value = candle_hexagon::device::DEFAULT_FASTRPC_LIBRARY)]
    fastrpc_lib: String,
    /// Window sizes (tokens forwarded per call).
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "1,2,4,8,16,32,48,64,96,128,160,192,224,256"
    )]
    tokens: Vec<usize>,
    /// Cached prefix the window attends to.
    #[arg(long, default_value_t = 64)]
    prefix: usize,
    /// Timed runs per point (the median is reported; one warm-up run is not timed).
    #[arg(long, default_value_t = 5)]
    runs: usize,
    /// Threads for every CPU kernel, 1..=256 (default: one per core).
    #[arg(long)]
    threads: Option<usize>,
    /// Write the table as JSON here.
    #[arg(long)]
    out: Option<PathBuf>,
}

fn backend(a: &Args) -> Result<Backend> {
    match a.device.as_str() {
        "cpu" => Ok(Backend::Cpu),
        "hexagon" => {
            let transport = TransportConfig::from_names(&a.hexagon_transport, &a.fastrpc_lib)
                .map_err(|e| anyhow!("--hexagon-transport: {e}"))?;
            Ok(Backend::Hexagon(
                HexagonDevice::open(HexagonConfig {
                    workers: a.hexagon_workers,
                    transport,
                    ..Default::default()
                })
                .context("--device hexagon")?,
            ))
        }
        d => bail!("--device: `{d}` (expected cpu or hexagon)"),
    }
}

fn model(a: &Args, backend: &Backend) -> Result<(DiffusionTransformer, String)> {
    if let Some(spec) = &a.model {
        let opts = LoadOptions {
            backend: backend.clone(),
            ..Default::default()
        };
        let source = ModelSource::parse(spec)?;
        let loaded =
            dllm_models::load(&source, &opts).with_context(|| format!("loading {source}"))?;
        return Ok((loaded.model, loaded.source));
    }
    let cfg = match a.synthetic.as_str() {
        "tiny" => tiny_llada(),
        "100m" => bench_llada_100m(),
        s => bail!("--synthetic: `{s}` (expected tiny or 100m)"),
    };
    let w = HfWeights::from_tensors(random_weights(&cfg, 0)?, cfg.arch, DType::F32, &Device::Cpu);
    let m = DiffusionTransformer::new_on(cfg, &w, OpMode::Fused, backend)?;
    Ok((m, format!("synthetic {} (random weights)", a.synthetic)))
}

fn median_ms(runs: usize, mut f: impl FnMut() -> Result<()>) -> Result<(f64, f64, f64)> {
    f()?; // warm-up: staging buffers, plans, caches
    let mut v = Vec::with_capacity(runs);
    for _ in 0..runs {
        let t = Instant::now();
        f()?;
        v.push(t.elapsed().as_secs_f64() * 1e3);
    }
    v.sort_by(|a, b| a.total_cmp(b));
    Ok((v[v.len() / 2], v[0], v[v.len() - 1]))
}

fn run(a: Args) -> Result<()> {
    if a.runs == 0 {
        bail!("--runs must be positive");
    }
    if a.tokens.is_empty() || a.tokens.contains(&0) {
        bail!("--tokens must be a non-empty list of positive counts");
    }
    if let Some(t) = a.threads {
        // Every CPU kernel (kernels-cpu's GEMMs, candle's ops) uses this many threads; set it
        // before any tensor work, when the pools start.
        dllm_models::threads::configure(t).context("--threads")?;
    }
    let backend = backend(&a)?;
    let (mut m, source) = model(&a, &backend)?;
    let info = m.info().clone();
    let max_n = *a.tokens.iter().max().expect("non-empty");
    let len = a.prefix + max_n;
    if len > info.max_seq_len {
        bail!(
            "--prefix {} + {} tokens exceeds the model's {} positions",
            a.prefix,
            max_n,
            info.max_seq_len
        );
    }
    let ids: Vec<u32> = (0..len as u32)
        .map(|i| (i * 7919 + 13) % (info.vocab_size as u32 - 3))
        .collect();
    let canvas = Tensor::from_vec(ids, (1, len), &Device::Cpu)?;
    if a.prefix > 0 {
        m.forward(&canvas, 0..a.prefix, Rows::None)?;
        m.commit(0..a.prefix)?;
    }
    let device = match &backend {
        Backend::Cpu => "cpu".to_string(),
        Backend::Hexagon(d) => format!("hexagon: {}", d.description()),
    };
    eprintln!(
        "{source}: {:.1}M parameters, {} layers, d {}, vocab {}; device {device}; prefix {} cached; median of {}",
        info.num_params as f64 / 1e6,
        info.num_layers,
        info.hidden_size,
        info.vocab_size,
        a.prefix,
        a.runs
    );
    let mut points = Vec::new();
    println!("| tokens | ms (median) | min | max | ms/token |");
    println!("|---:|---:|---:|---:|---:|");
    for &n in &a.tokens {
        let w = a.prefix..a.prefix + n;
        let (ms, lo, hi) = median_ms(a.runs, || {
            m.forward(&canvas, w.clone(), Rows::All)?;
            Ok(())
        })?;
        println!(
            "| {n} | {ms:.2} | {lo:.2} | {hi:.2} | {:.3} |",
            ms / n as f64
        );
        points.push(serde_json::json!({ "tokens": n, "ms": ms, "min_ms": lo, "max_ms": hi }));
    }
    if let Backend::Hexagon(d) = &backend {
        eprintln!("\n{}", d.routing_report());
    }
    if let Some(out) = &a.out {
        let table = serde_json::json!({
            "device": device,
            "model": {
                "source": source,
                "arch": info.arch.to_string(),
                "params": info.num_params,
                "layers": info.num_layers,
                "hidden": info.hidden_size,
                "vocab": info.vocab_size,
            },
            "prefix": a.prefix,
            "runs": a.runs,
            "threads": a.threads,
            "points": points,
        });
        std::fs::write(out, serde_json::to_string_pretty(&table)? + "\n")
            .with_context(|| format!("writing {}", out.display()))?;
        eprintln!("wrote {}", out.display());
    }
    Ok(())
}

fn main() {
    if let Err(e) = run(Args::parse()) {
        eprintln!("error: {e:#}");
        std::process::exit(1);
    }
}
