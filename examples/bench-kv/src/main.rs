//! `bench-kv`: what reading the KV cache costs. A window of `--window` positions is forwarded against a
//! cached prefix of 256..4096 positions on a random LLaDA with the 97.5M model's layer shape (d 768,
//! 12 heads, MLP 2048, vocabulary 8192; `--layers` of them), CPU, in f32 and f16.
//!
//! The window's own work (projections, MLP, LM head) does not depend on the cached length; attention
//! does, linearly. Any cost beyond that linear attention work is the price of reading the cache (for
//! example copying it into a new tensor per layer per step). The table prints the forward time, its
//! growth over the smallest cached length, and the attention FLOPs, so the two slopes can be compared.

use std::time::Instant;

use anyhow::{bail, Result};
use candle_core::{DType, Device, Tensor};
use clap::Parser;
use dllm_models::synthetic::{bench_llada_100m, random_weights};
use dllm_models::weights::HfWeights;
use dllm_models::{DiffusionLm, DiffusionTransformer, OpMode, Rows};

#[derive(Parser, Debug)]
#[command(about = "Window forward cost vs cached prefix length (the KV-cache read), CPU.")]
struct Args {
    /// Cached prefix lengths, ascending.
    #[arg(long, value_delimiter = ',', default_value = "256,512,1024,2048,4096")]
    cached: Vec<usize>,
    /// Window size (positions forwarded against the cache).
    #[arg(long, default_value_t = 32)]
    window: usize,
    /// Transformer layers of the model (layer shape of the 97.5M bench model).
    #[arg(long, default_value_t = 4)]
    layers: usize,
    /// Compute dtypes to measure.
    #[arg(long, value_delimiter = ',', default_value = "f32,f16")]
    dtypes: Vec<String>,
    /// Timed repetitions per measurement (the median is reported).
    #[arg(long, default_value_t = 5)]
    iters: usize,
    /// CPU threads.
    #[arg(long, default_value_t = 1)]
    threads: usize,
}

fn median_ms(iters: usize, mut f: impl FnMut() -> Result<()>) -> Result<f64> {
    f()?; // warm-up
    let mut v = Vec::with_capacity(iters);
    for _ in 0..iters {
        let t = Instant::now();
        f()?;
        v.push(t.elapsed().as_secs_f64() * 1e3);
    }
    v.sort_by(|a, b| a.total_cmp(b));
    Ok(v[v.len() / 2])
}

fn dtype(name: &str) -> Result<DType> {
    Ok(match name {
        "f32" => DType::F32,
        "f16" => DType::F16,
        "bf16" => DType::BF16,
        _ => bail!("--dtypes: `{name}` (expected f32, f16 or bf16)"),
    })
}

fn main() -> Result<()> {
    let a = Args::parse();
    if a.cached.is_empty() || a.cached.windows(2).any(|w| w[0] >= w[1]) || a.window == 0 {
        bail!("--cached must be ascending and --window positive");
    }
    if a.threads == 0 || a.iters == 0 || a.layers == 0 {
        bail!("--threads, --iters and --layers must be positive");
    }
    std::env::set_var("RAYON_NUM_THREADS", a.threads.to_string());
    let mut cfg = bench_llada_100m();
    cfg.num_layers = a.layers;
    let max = a.cached.last().copied().unwrap_or(0) + a.window;
    cfg.max_seq_len = cfg.max_seq_len.max(max);
    let w = random_weights(&cfg, 0)?;
    let (h, hd) = (cfg.num_heads, cfg.head_dim());
    println!(
        "LLaDA layer shape (d {}, {} heads, MLP {}, vocab {}), {} layers; window {} against a cached prefix; \
         {} thread(s), median of {}\n",
        cfg.hidden_size, h, cfg.intermediate_size, cfg.vocab_size, cfg.num_layers, a.window, a.threads, a.iters
    );
    println!("| dtype | cached | forward ms | growth over {} cached (ms) | attention GFLOP | growth ms / attention GFLOP |", a.cached[0]);
    println!("|---|---:|---:|---:|---:|---:|");
    let ids: Vec<u32> = (0..max as u32)
        .map(|i| (i * 7919 + 13) % (cfg.vocab_size as u32 - 3))
        .collect();
    let canvas = Tensor::from_vec(ids, (1, max), &Device::Cpu)?;
    for name in &a.dtypes {
        let dt = dtype(name)?;
        let mut m = DiffusionTransformer::new(
            cfg.clone(),
            &HfWeights::from_tensors(w.clone(), cfg.arch, dt, &Device::Cpu),
            OpMode::Fused,
        )?;
        m.clear_cache()?;
        let mut filled = 0;
        let mut base: Option<(f64, f64)> = None;
        for &len in &a.cached {
            // Extend the cache to `len` in chunks (each chunk attends to what is already cached).
            while filled < len {
                let end = (filled + 512).min(len);
                m.forward(&canvas, filled..end, Rows::None)?;
                m.commit(filled..end)?;
                filled = end;
            }
            let win = len..len + a.window;
            let ms = median_ms(a.iters, || {
                m.forward(&canvas, win.clone(), Rows::All)?;
                Ok(())
            })?;
            // QK^T and PV over (cached + window) keys, 2 flops per multiply-add.
            let gflop =
                |n: usize| (cfg.num_layers * h * a.window * (n + a.window) * hd * 4) as f64 / 1e9;
            let (b_ms, b_gf) = *base.get_or_insert((ms, gflop(len)));
            let (dms, dgf) = (ms - b_ms, gflop(len) - b_gf);
            let slope = if dgf > 0.0 {
                format!("{:.1}", dms / dgf)
            } else {
                "—".into()
            };
            println!(
                "| {name} | {len} | {ms:.1} | {dms:.1} | {:.2} | {slope} |",
                gflop(len)
            );
        }
    }
    Ok(())
}
