//! `latency-profile`: how long one forward takes as a function of the window size (positions
//! forwarded), the logits rows requested (the masked positions a decoder asks about) and the cached
//! length the window attends to, on the CPU or on the Hexagon backend. It writes the typed
//! [`dllm_decode::LatencyTable`] that decoding policies read (`--latency-table` of `generate`).
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
use dllm_decode::latency::{Interpolation, LatencyPoint, LatencyTable, ModelDesc};
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
    /// Hexagon: how the model's weights share the NPU window: naive, paging or somr.
    #[arg(long, default_value = candle_hexagon::device::DEFAULT_MEMORY_POLICY.name())]
    memory_policy: String,
    /// Hexagon: the NPU address window in MiB.
    #[arg(long, value_name = "MIB", default_value_t = candle_hexagon::device::DEFAULT_VA_WINDOW_MIB)]
    hexagon_window: u64,
    /// Window sizes (tokens forwarded per call).
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "1,2,4,8,16,32,48,64,96,128,160,192,224,256"
    )]
    tokens: Vec<usize>,
    /// Logits rows requested per forward (`all` = the whole window); each window is measured with
    /// every listed count below its size, plus the whole window.
    #[arg(long, value_delimiter = ',', default_value = "1,8,32,all")]
    rows: Vec<String>,
    /// Cached lengths the window attends to (ascending).
    #[arg(
        long,
        visible_alias = "prefix",
        value_delimiter = ',',
        default_value = "64,512"
    )]
    cached: Vec<usize>,
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
                HexagonDevice::open(
                    HexagonConfig {
                        workers: a.hexagon_workers,
                        transport,
                        ..Default::default()
                    }
                    .with_memory_names(&a.memory_policy, a.hexagon_window)
                    .map_err(|e| anyhow!("--memory-policy / --hexagon-window: {e}"))?,
                )
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
            threads: a.threads,
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
    let cpu = dllm_models::CpuOptions {
        threads: a.threads,
        ..Default::default()
    };
    let m = DiffusionTransformer::new_with(cfg, &w, OpMode::Fused, backend, cpu)?;
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

/// The row counts to measure for a window of `w` positions.
fn rows_for(spec: &[RowsSpec], w: usize) -> Vec<usize> {
    let mut v: Vec<usize> = spec
        .iter()
        .map(|r| match r {
            RowsSpec::All => w,
            RowsSpec::N(n) => (*n).min(w),
        })
        .collect();
    v.sort_unstable();
    v.dedup();
    v
}

#[derive(Debug, Clone, Copy)]
enum RowsSpec {
    All,
    N(usize),
}

fn parse_rows(v: &[String]) -> Result<Vec<RowsSpec>> {
    if v.is_empty() {
        bail!("--rows must list at least one count (or `all`)");
    }
    v.iter()
        .map(|s| match s.trim() {
            "all" => Ok(RowsSpec::All),
            n => match n.parse::<usize>() {
                Ok(x) if x > 0 => Ok(RowsSpec::N(x)),
                _ => bail!("--rows: `{n}` (expected a positive count or `all`)"),
            },
        })
        .collect()
}

fn run(a: Args) -> Result<()> {
    if a.runs == 0 {
        bail!("--runs must be positive");
    }
    if a.tokens.is_empty() || a.tokens.contains(&0) {
        bail!("--tokens must be a non-empty list of positive counts");
    }
    if a.cached.is_empty() || a.cached.windows(2).any(|w| w[0] >= w[1]) {
        bail!("--cached must be a non-empty ascending list");
    }
    let rows_spec = parse_rows(&a.rows)?;
    if let Some(t) = a.threads {
        // The model's own pool (its CPU kernels run there): checked before anything is built.
        dllm_models::threads::pool(t).context("--threads")?;
    }
    let backend = backend(&a)?;
    let (mut m, source) = model(&a, &backend)?;
    let info = m.info().clone();
    let max_n = *a.tokens.iter().max().expect("non-empty");
    let max_cached = *a.cached.last().expect("non-empty");
    let len = max_cached
        .checked_add(max_n)
        .filter(|&l| l <= info.max_seq_len)
        .ok_or_else(|| {
            anyhow!(
                "--cached {max_cached} + {max_n} tokens exceeds the model's {} positions",
                info.max_seq_len
            )
        })?;
    let vocab = u32::try_from(info.vocab_size)
        .ok()
        .filter(|&v| v > 0)
        .ok_or_else(|| anyhow!("vocabulary of {} ids", info.vocab_size))?;
    let ids: Vec<u32> = (0..len as u32).map(|i| (i * 7919 + 13) % vocab).collect();
    let canvas = Tensor::from_vec(ids, (1, len), &Device::Cpu)?;
    let device = match &backend {
        Backend::Cpu => "cpu".to_string(),
        Backend::Hexagon(d) => format!("hexagon: {}", d.description()),
    };
    eprintln!(
        "{source}: {:.1}M parameters, {} layers, d {}, vocab {}; device {device}; median of {}",
        info.num_params as f64 / 1e6,
        info.num_layers,
        info.hidden_size,
        info.vocab_size,
        a.runs
    );
    let mut points = Vec::new();
    println!("| window | rows | cached | ms (median) | min | max | ms/position |");
    println!("|---:|---:|---:|---:|---:|---:|---:|");
    m.clear_cache()?;
    let mut filled = 0;
    for &cached in &a.cached {
        // Extend the cache in chunks, each attending to what is already cached.
        while filled < cached {
            let end = (filled + 256).min(cached);
            m.forward(&canvas, filled..end, Rows::None)?;
            m.commit(filled..end)?;
            filled = end;
        }
        for &n in &a.tokens {
            let w = cached..cached + n;
            for r in rows_for(&rows_spec, n) {
                // Requested rows spread over the window, as a decoder's masked positions are.
                let pos: Vec<usize> = (0..r).map(|i| cached + i * n / r).collect();
                let (ms, lo, hi) = median_ms(a.runs, || {
                    m.forward(&canvas, w.clone(), Rows::Positions(&pos))?;
                    Ok(())
                })?;
                println!(
                    "| {n} | {r} | {cached} | {ms:.2} | {lo:.2} | {hi:.2} | {:.3} |",
                    ms / n as f64
                );
                points.push(LatencyPoint {
                    window: n,
                    rows: r,
                    cached,
                    ms,
                    min_ms: Some(lo),
                    max_ms: Some(hi),
                });
            }
        }
    }
    if let Backend::Hexagon(d) = &backend {
        eprintln!("\n{}", d.routing_report());
    }
    if let Some(out) = &a.out {
        let table = LatencyTable {
            version: dllm_decode::latency::LATENCY_TABLE_VERSION,
            device,
            model: ModelDesc {
                source,
                arch: info.arch.to_string(),
                params: info.num_params,
                layers: info.num_layers,
                hidden: info.hidden_size,
                vocab: info.vocab_size,
            },
            provenance: "measured".into(),
            interpolation: Interpolation::Linear,
            threads: a.threads,
            runs: a.runs,
            points,
        };
        table
            .save(out)
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
