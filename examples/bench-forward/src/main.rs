//! `bench-forward`: how much a windowed forward costs relative to the full-canvas forward, on a
//! ~100M-parameter random LLaDA (d 768, 12 layers, vocabulary 8192), CPU, f32.
//!
//! For each window size `w` the first `L - w` positions are cached (prefix cache) and the last `w`
//! positions are forwarded against them; the ideal cost ratio is `w / L`. `--write-gguf` also writes
//! the same weights as a llama.cpp GGUF (with a placeholder vocabulary) to time llama.cpp's CPU
//! forward over the same canvas with `llama-bench -p <L> -n 0`.

use std::time::Instant;

use anyhow::Result;
use candle_core::quantized::gguf_file::Value;
use candle_core::quantized::GgmlDType;
use candle_core::{DType, Device, Tensor};
use clap::Parser;
use dllm_models::synthetic::{bench_llada_100m, random_weights};
use dllm_models::weights::HfWeights;
use dllm_models::{DiffusionLm, DiffusionTransformer, OpMode, Rows};

#[derive(Parser, Debug)]
#[command(about = "Windowed vs full-canvas forward on a ~100M random LLaDA.")]
struct Args {
    /// Canvas length.
    #[arg(long, default_value_t = 160)]
    canvas: usize,
    /// Window sizes.
    #[arg(long, value_delimiter = ',', default_value = "8,16,32,64,128")]
    windows: Vec<usize>,
    /// Timed repetitions per measurement (the median is reported).
    #[arg(long, default_value_t = 5)]
    iters: usize,
    /// CPU threads.
    #[arg(long, default_value_t = 1)]
    threads: usize,
    /// Also write the weights as a llama.cpp GGUF (F32) here.
    #[arg(long)]
    write_gguf: Option<std::path::PathBuf>,
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

/// A SentencePiece-style placeholder vocabulary so llama.cpp can load a checkpoint that has none.
fn placeholder_vocab(n: usize) -> Vec<(String, Value)> {
    let tokens = (0..n)
        .map(|i| {
            Value::String(match i {
                0 => "<unk>".into(),
                1 => "<s>".into(),
                2 => "</s>".into(),
                _ => format!("tok{i}"),
            })
        })
        .collect();
    let types = (0..n)
        .map(|i| {
            Value::I32(match i {
                0 => 2,
                1 | 2 => 3,
                _ => 1,
            })
        })
        .collect();
    vec![
        ("tokenizer.ggml.model".into(), Value::String("llama".into())),
        ("tokenizer.ggml.tokens".into(), Value::Array(tokens)),
        (
            "tokenizer.ggml.scores".into(),
            Value::Array((0..n).map(|_| Value::F32(0.0)).collect()),
        ),
        ("tokenizer.ggml.token_type".into(), Value::Array(types)),
    ]
}

fn main() -> Result<()> {
    let a = Args::parse();
    std::env::set_var("RAYON_NUM_THREADS", a.threads.to_string());
    let cfg = bench_llada_100m();
    let w = random_weights(&cfg, 0)?;
    if let Some(path) = &a.write_gguf {
        dllm_models::gguf_write::write_gguf(
            path,
            &cfg,
            &w,
            GgmlDType::F32,
            &placeholder_vocab(cfg.vocab_size),
        )?;
        eprintln!(
            "wrote {}; time llama.cpp with: llama-bench -m {} -p {} -n 0 -t {} -r {}",
            path.display(),
            path.display(),
            a.canvas,
            a.threads,
            a.iters
        );
    }
    let mut m = DiffusionTransformer::new(
        cfg.clone(),
        &HfWeights::from_tensors(w, cfg.arch, DType::F32, &Device::Cpu),
        OpMode::Fused,
    )?;
    let l = a.canvas;
    let ids: Vec<u32> = (0..l as u32)
        .map(|i| (i * 7919 + 13) % (cfg.vocab_size as u32 - 3))
        .collect();
    let canvas = Tensor::from_vec(ids, (1, l), &Device::Cpu)?;
    println!(
        "LLaDA-shaped random model: {:.1}M parameters (d {}, {} layers, vocab {}), canvas {l}, f32, {} thread(s), median of {}\n",
        m.info().num_params as f64 / 1e6, cfg.hidden_size, cfg.num_layers, cfg.vocab_size, a.threads, a.iters
    );
    m.clear_cache()?;
    let full = median_ms(a.iters, || {
        m.forward_full(&canvas, Rows::All)?;
        Ok(())
    })?;
    let last32: Vec<usize> = (l.saturating_sub(32)..l).collect();
    let full_rows = median_ms(a.iters, || {
        m.forward_full(&canvas, Rows::Positions(&last32))?;
        Ok(())
    })?;
    println!("| forward | rows computed | logits rows | ms | vs full | ideal (rows / {l}) |");
    println!("|---|---:|---:|---:|---:|---:|");
    println!("| full canvas | {l} | {l} | {full:.1} | 1.00 | 1.00 |");
    println!(
        "| full canvas, logits for 32 rows | {l} | 32 | {full_rows:.1} | {:.2} | — |",
        full_rows / full
    );
    for &win in &a.windows {
        if win >= l {
            continue;
        }
        m.clear_cache()?;
        m.forward_full(&canvas, Rows::None)?;
        m.commit(0..l - win)?;
        let t = median_ms(a.iters, || {
            m.forward(&canvas, l - win..l, Rows::All)?;
            Ok(())
        })?;
        println!(
            "| window, prefix cached | {win} | {win} | {t:.1} | {:.2} | {:.2} |",
            t / full,
            win as f64 / l as f64
        );
    }
    Ok(())
}
