//! `bench-forward`: what one forward of a ~100M-parameter random LLaDA costs on the CPU.
//!
//! - The windows table: a window of `w` positions forwarded against a cached prefix vs the
//!   full-canvas forward (ideal ratio `w / L`), for the in-memory f32 model or a GGUF of any type
//!   (`--weights q4_0` writes one with the project's writer; `--gguf PATH` loads a given file).
//! - `--llama-bench PATH --llama-quantize PATH`: the side-by-side table with llama.cpp (one forward
//!   over a 160-token canvas per GGUF type, alternated), see `vs_llama`.
//!
//! `--linears candle` runs candle's previous CPU path instead of the kernels-cpu GEMMs.

mod model;
mod vs_llama;
mod windows;

use std::path::PathBuf;

use anyhow::{bail, Context, Result};
use candle_core::quantized::GgmlDType;
use clap::Parser;
use dllm_models::{CpuLinears, DiffusionLm};

#[derive(Parser, Debug)]
#[command(
    about = "Windowed vs full-canvas forwards of a ~100M random LLaDA, and llada-rs vs llama.cpp."
)]
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
    /// Threads for every kernel (kernels-cpu, candle, llama.cpp); the side-by-side table takes a
    /// list (e.g. `1,2`: every type at each count), the windows table one count.
    #[arg(long, value_delimiter = ',', default_value = "1")]
    threads: Vec<usize>,
    /// Weights of the windows table: f32 (in memory) or a GGUF type written by the project's
    /// writer (f16, bf16, q8_0, q4_0, q4_k, q6_k).
    #[arg(long, default_value = "f32")]
    weights: String,
    /// Load this GGUF for the windows table instead.
    #[arg(long)]
    gguf: Option<PathBuf>,
    /// Linear layers: packed (kernels-cpu) or candle (the previous path).
    #[arg(long, default_value = "packed")]
    linears: String,
    /// Also write the f32 weights as a llama.cpp GGUF here.
    #[arg(long)]
    write_gguf: Option<PathBuf>,
    /// llama.cpp's `llama-bench`: print the side-by-side table instead of the windows table.
    #[arg(long, requires = "llama_quantize")]
    llama_bench: Option<PathBuf>,
    /// llama.cpp's `llama-quantize` (makes the Q8_0 and Q4_0 files).
    #[arg(long, requires = "llama_bench")]
    llama_quantize: Option<PathBuf>,
    /// Models of the side-by-side table: `100m` (the ~100M random LLaDA), `shipped` (the
    /// shipped 1.1M `models/tiny-llada`) and `8b` (LLaDA-8B's shapes with 2 layers, random:
    /// 5.9 GB as F32; most of the run's time), each at every type and thread count; `8b-full`
    /// (LLaDA-8B's shapes at full depth, 32 layers, random, written Q8_0 / Q4_0 by the project's
    /// streaming writer: pass `--types q8_0,q4_0`; not in the default list).
    #[arg(long, value_delimiter = ',', default_value = "100m,shipped,8b")]
    models: Vec<String>,
    /// GGUF types of the side-by-side table.
    #[arg(long, value_delimiter = ',', default_value = "f32,f16,q8_0,q4_0")]
    types: Vec<String>,
    /// Alternated rounds of the side-by-side table.
    #[arg(long, default_value_t = 2)]
    rounds: usize,
    /// Where the side-by-side table's GGUF files go (reused if present).
    #[arg(long, default_value = "/tmp/llada-bench-forward")]
    dir: PathBuf,
    /// Internal: the side-by-side table's memory probe. Load this GGUF and run the table's
    /// forwards at each `--threads` count (the table starts one probe per count) in a fresh
    /// process, whose peak RSS the parent reads (as it reads llama-bench's).
    #[arg(long, hide = true)]
    rss_probe: Option<PathBuf>,
}

fn ggml(name: &str) -> Result<GgmlDType> {
    Ok(match name {
        "f32" => GgmlDType::F32,
        "f16" => GgmlDType::F16,
        "bf16" => GgmlDType::BF16,
        "q8_0" => GgmlDType::Q8_0,
        "q4_0" => GgmlDType::Q4_0,
        "q4_k" => GgmlDType::Q4K,
        "q6_k" => GgmlDType::Q6K,
        other => bail!("--weights: unknown type `{other}`"),
    })
}

fn main() -> Result<()> {
    let a = Args::parse();
    if a.iters == 0 || a.rounds == 0 {
        bail!("--iters and --rounds must be positive");
    }
    if let Some(t) = a
        .threads
        .iter()
        .find(|&&t| t == 0 || t > dllm_models::threads::MAX_THREADS)
    {
        bail!(
            "--threads: {t} is outside 1..={}",
            dllm_models::threads::MAX_THREADS
        );
    }
    if let Some(path) = &a.rss_probe {
        return vs_llama::rss_probe(path, a.canvas, a.iters, &a.threads);
    }
    if let (Some(lb), Some(lq)) = (&a.llama_bench, &a.llama_quantize) {
        let list: Vec<String> = a.threads.iter().map(|t| t.to_string()).collect();
        println!(
            "LLaDA models, one forward over {} tokens, {} thread(s); llama-bench -p {} -n 0 -r {} -ctk f16 -ctv f16 vs llada-rs with an f16 K/V cache (median of {}), alternated, {} rounds (ranges over rounds)\n",
            a.canvas,
            list.join(", "),
            a.canvas,
            a.iters,
            a.iters,
            a.rounds
        );
        return vs_llama::run(&vs_llama::Plan {
            llama_bench: lb.clone(),
            llama_quantize: lq.clone(),
            dir: a.dir.clone(),
            models: a
                .models
                .iter()
                .map(|m| model::BenchModel::parse(m))
                .collect::<Result<_>>()?,
            types: a.types.clone(),
            rounds: a.rounds,
            reps: a.iters,
            tokens: a.canvas,
            threads: a.threads.clone(),
        });
    }
    let [threads] = a.threads[..] else {
        bail!("--threads: the windows table takes one count");
    };
    dllm_models::threads::configure(threads).context("--threads")?;
    let which = match a.linears.as_str() {
        "packed" => CpuLinears::Packed,
        "candle" => CpuLinears::Candle,
        other => bail!("--linears: `{other}` (expected packed or candle)"),
    };
    if let Some(path) = &a.write_gguf {
        model::write_gguf(path, GgmlDType::F32)?;
        eprintln!(
            "wrote {}; time llama.cpp with: llama-bench -m {} -p {} -n 0 -t {} -r {}",
            path.display(),
            path.display(),
            a.canvas,
            threads,
            a.iters
        );
    }
    let (mut m, what) = match (&a.gguf, a.weights.as_str()) {
        (Some(p), _) => (model::load_gguf(p, which, None)?, p.display().to_string()),
        (None, "f32") => (model::in_memory(which)?, "f32 (in memory)".to_string()),
        (None, ty) => {
            std::fs::create_dir_all(&a.dir)?;
            let p = a.dir.join(format!("bench100m-writer-{ty}.gguf"));
            if !p.is_file() {
                model::write_gguf(&p, ggml(ty)?)?;
            }
            (
                model::load_gguf(&p, which, None)?,
                format!("{ty} GGUF (project writer)"),
            )
        }
    };
    println!(
        "LLaDA-shaped random model: {:.1}M parameters, weights {what}, linears {}, canvas {}, {} thread(s), median of {}\n",
        m.info().num_params as f64 / 1e6,
        a.linears,
        a.canvas,
        threads,
        a.iters
    );
    windows::table(&mut m, a.canvas, &a.windows, a.iters)
}
