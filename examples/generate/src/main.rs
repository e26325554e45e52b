//! `generate`: text generation with a diffusion LLM (LLaDA, Dream) — from a model directory, a GGUF
//! file or a Hugging Face model id — with live denoising output, a progress summary and `--json`.
//!
//! ```text
//! generate --model GSAI-ML/LLaDA-8B-Instruct --chat --prompt "What is 12 * 7?"
//! generate --model ./tiny --prompt-ids 1,2,3 --strategy vanilla --json
//! generate --model ./tiny --prompt-ids 1,2,3 --device hexagon      # emulated Hexagon NPU
//! ```
//!
//! With `--device hexagon` the model's linear layers, attention, norms, RoPE and SwiGLU run on the
//! Hexagon backend (`candle-hexagon`: the emulated DSP by default, or FastRPC), and the routing
//! report (which ops ran where, bytes staged, NPU address-space use) is printed at the end.

mod embedded;
mod live;

use std::path::PathBuf;
use std::time::Instant;

use anyhow::{anyhow, bail, Context, Result};
use candle_core::{DType, Device};
use candle_hexagon::{HexagonConfig, HexagonDevice, OpKind, TransportConfig};
use clap::Parser;
use dllm_decode::{generate, DecodeParams, DreamParams, StepObserver};
use dllm_models::{load, Backend, DiffusionLm, LoadOptions, LoadedModel, ModelSource};

/// Generate text with a masked-diffusion language model.
#[derive(Parser, Debug)]
#[command(version, about, long_about = None)]
struct Args {
    /// Model: a Hugging Face model directory, a .gguf file, or a hub id (owner/name[@revision])
    /// [default: the embedded tiny LLaDA trained on the task suite].
    #[arg(long, visible_alias = "model-id")]
    model: Option<String>,
    /// A tokenizer.json to use instead of the one next to the weights.
    #[arg(long)]
    tokenizer: Option<PathBuf>,
    /// Prompt text.
    #[arg(long, conflicts_with = "prompt_ids")]
    prompt: Option<String>,
    /// Prompt as comma-separated token ids (bypasses the tokenizer).
    #[arg(long, value_delimiter = ',')]
    prompt_ids: Option<Vec<u32>>,
    /// Wrap the prompt in the model's chat template (user turn + assistant header).
    #[arg(long)]
    chat: bool,
    /// Generated positions [default: the checkpoint's recommendation, else 128].
    #[arg(long)]
    gen_length: Option<usize>,
    /// Block length [default: the checkpoint's recommendation, else 32].
    #[arg(long)]
    block_length: Option<usize>,
    /// Total denoising steps [default: the checkpoint's recommendation, else gen-length].
    #[arg(long)]
    steps: Option<usize>,
    /// vanilla (the model's reference algorithm), prefix-cache or dual-cache (Fast-dLLM).
    #[arg(long, default_value = "vanilla")]
    strategy: String,
    /// Parallel decoding: unmask every masked token of the block with confidence >= this.
    #[arg(long)]
    threshold: Option<f32>,
    /// Confidence: low_confidence, random, topk_margin or entropy.
    #[arg(long, default_value = "low_confidence")]
    remasking: String,
    /// Sampling temperature (0 = greedy, deterministic).
    #[arg(long, default_value_t = 0.0)]
    temperature: f32,
    /// Seed for sampling and random remasking.
    #[arg(long, default_value_t = dllm_decode::params::DEFAULT_SEED)]
    seed: u64,
    /// Classifier-free guidance scale (vanilla only).
    #[arg(long, default_value_t = 0.0)]
    cfg_scale: f32,
    /// Never predict EOS (LLaDA logits_eos_inf).
    #[arg(long)]
    logits_eos_inf: bool,
    /// Rank EOS/EoT predictions last (LLaDA confidence_eos_eot_inf).
    #[arg(long)]
    confidence_eos_eot_inf: bool,
    /// Decode every block even after one ends in EOS.
    #[arg(long)]
    no_early_stop: bool,
    /// Dream: origin, maskgit_plus, topk_margin or entropy.
    #[arg(long, default_value = "maskgit_plus")]
    alg: String,
    /// Dream: final timestep.
    #[arg(long, default_value_t = dllm_decode::params::DEFAULT_DREAM_EPS)]
    eps: f64,
    /// Dream: temperature of the position-selection softmax.
    #[arg(long)]
    alg_temp: Option<f32>,
    /// Dream: nucleus sampling.
    #[arg(long)]
    top_p: Option<f32>,
    /// Dream: top-k sampling.
    #[arg(long)]
    top_k: Option<usize>,
    /// Compute dtype: f32, f16 or bf16.
    #[arg(long, default_value = "f32")]
    dtype: String,
    /// Threads for every CPU kernel, 1..=256 (default: one per core).
    #[arg(long)]
    threads: Option<usize>,
    /// Where the model runs: cpu, or hexagon (the Hexagon NPU backend, CPU fallback per op).
    #[arg(long, default_value = "cpu")]
    device: String,
    /// Hexagon: DSP worker threads.
    #[arg(long, default_value_t = candle_hexagon::device::DEFAULT_WORKERS)]
    hexagon_workers: usize,
    /// Hexagon: transport, emulated (a DSP thread running the kernels' host build) or fastrpc.
    #[arg(long, default_value = "emulated")]
    hexagon_transport: String,
    /// Hexagon/FastRPC: the library to dlopen, or `shim` for the host shim built with this binary.
    #[arg(long, default_value = candle_hexagon::device::DEFAULT_FASTRPC_LIBRARY)]
    fastrpc_lib: String,
    /// Hexagon: ops forced onto the CPU, comma-separated (linear, linear_f16, linear_q4_0,
    /// linear_quant, flash_attn, rms_norm, swiglu, rope).
    #[arg(long, default_value = "")]
    hexagon_deny: String,
    /// Print exactly one JSON object on stdout (and nothing else).
    #[arg(long)]
    json: bool,
    /// Do not animate the canvas on a terminal.
    #[arg(long)]
    no_live: bool,
}

fn parse_dtype(s: &str) -> Result<DType> {
    match s {
        "f32" => Ok(DType::F32),
        "f16" => Ok(DType::F16),
        "bf16" => Ok(DType::BF16),
        _ => bail!("--dtype: `{s}` (expected f32, f16 or bf16)"),
    }
}

/// The backend `--device` asks for (opening the Hexagon session if needed).
fn backend(a: &Args) -> Result<Backend> {
    match a.device.as_str() {
        "cpu" => Ok(Backend::Cpu),
        "hexagon" => {
            let transport = TransportConfig::from_names(&a.hexagon_transport, &a.fastrpc_lib)
                .map_err(|e| anyhow!("--hexagon-transport: {e}"))?;
            let cfg = HexagonConfig {
                workers: a.hexagon_workers,
                deny: OpKind::parse_list(&a.hexagon_deny)
                    .map_err(|e| anyhow!("--hexagon-deny: {e}"))?,
                transport,
                ..Default::default()
            };
            let dev = HexagonDevice::open(cfg).context("--device hexagon")?;
            Ok(Backend::Hexagon(dev))
        }
        d => bail!("--device: `{d}` (expected cpu or hexagon)"),
    }
}

fn decode_params(a: &Args, loaded: &LoadedModel) -> Result<DecodeParams> {
    let d = loaded.defaults;
    let gen_length = a
        .gen_length
        .or(d.gen_length)
        .unwrap_or(dllm_decode::params::DEFAULT_GEN_LENGTH);
    let block_length = a
        .block_length
        .or(d.block_length)
        .unwrap_or(dllm_decode::params::DEFAULT_BLOCK_LENGTH.min(gen_length));
    let steps = a.steps.or(d.steps).unwrap_or(gen_length);
    let threshold = a.threshold.or(if a.steps.is_none() {
        d.threshold.map(|t| t as f32)
    } else {
        None
    });
    Ok(DecodeParams {
        gen_length,
        block_length,
        steps,
        strategy: a.strategy.parse()?,
        threshold,
        remasking: a.remasking.parse()?,
        temperature: a.temperature,
        seed: a.seed,
        cfg_scale: a.cfg_scale,
        logits_eos_inf: a.logits_eos_inf,
        confidence_eos_eot_inf: a.confidence_eos_eot_inf,
        early_stop: !a.no_early_stop,
        dream: DreamParams {
            alg: a.alg.parse()?,
            eps: a.eps,
            alg_temp: a.alg_temp,
            top_p: a.top_p,
            top_k: a.top_k,
        },
        // Multi-block speculative decoding and revision keep their defaults (no flags yet).
        ..Default::default()
    })
}

fn run(a: Args) -> Result<()> {
    if let Some(t) = a.threads {
        // Every CPU kernel (kernels-cpu's GEMMs, candle's ops) uses this many threads; set it
        // before any tensor work, when the pools start.
        dllm_models::threads::configure(t).context("--threads")?;
    }
    let backend = backend(&a)?;
    let opts = LoadOptions {
        dtype: parse_dtype(&a.dtype)?,
        device: Device::Cpu,
        tokenizer: a.tokenizer.clone(),
        backend: backend.clone(),
        ..Default::default()
    };
    let t_load = Instant::now();
    let mut loaded = match &a.model {
        Some(spec) => {
            let source = ModelSource::parse(spec)?;
            load(&source, &opts).with_context(|| format!("loading {source}"))?
        }
        None => embedded::load(&opts)?,
    };
    let info = loaded.model.info().clone();
    if !a.json {
        eprintln!(
            "loaded {} ({}, {:.1}M parameters, {} layers) in {:.2}s",
            loaded.source,
            info.arch,
            info.num_params as f64 / 1e6,
            info.num_layers,
            t_load.elapsed().as_secs_f64()
        );
    }
    let params = decode_params(&a, &loaded)?;
    let prompt_ids: Vec<u32> = match (&a.prompt_ids, &a.prompt) {
        (Some(ids), _) => ids.clone(),
        (None, Some(text)) => {
            let tok = loaded.tokenizer.as_ref().ok_or_else(|| {
                anyhow!("{} has no tokenizer.json: pass --tokenizer <file> or give the prompt as --prompt-ids", loaded.source)
            })?;
            tok.encode_prompt(text, a.chat)?
        }
        (None, None) => bail!("give a prompt with --prompt \"...\" or --prompt-ids 1,2,3"),
    };
    let tok = loaded.tokenizer.clone();
    let live = !a.json && !a.no_live && console::Term::stderr().is_term();
    let mut observer: Box<dyn StepObserver> = if live {
        Box::new(live::LiveCanvas::new(tok.clone(), params.gen_length))
    } else if !a.json {
        Box::new(live::Progress::new(params.gen_length))
    } else {
        Box::new(())
    };
    let t0 = Instant::now();
    let g = generate(&mut loaded.model, &prompt_ids, &params, observer.as_mut())?;
    let elapsed = t0.elapsed();
    drop(observer);
    let stop_ids = info.special.stop_ids();
    let text = match &tok {
        Some(t) => Some(t.decode(g.answer(&stop_ids), true)?),
        None => None,
    };
    let tps = g.tokens_decoded as f64 / elapsed.as_secs_f64().max(1e-9);
    if a.json {
        let out = serde_json::json!({
            "prompt_ids": prompt_ids,
            "generated_ids": g.generated(),
            "text": text,
            "forwards": g.forwards,
            "steps": g.steps,
            "elapsed_ms": elapsed.as_secs_f64() * 1e3,
            "tokens_decoded": g.tokens_decoded,
            "tokens_per_second": tps,
            "stop_reason": format!("{:?}", g.stop),
            "model": loaded.source,
            "strategy": a.strategy,
            "device": a.device,
        });
        println!("{out}");
    } else {
        match &text {
            Some(t) => println!("{t}"),
            None => println!("{:?}", g.answer(&stop_ids)),
        }
        eprintln!(
            "{} forwards, {} steps, {} tokens in {:.2}s ({:.1} tok/s, {:.2} tokens/forward), stop: {:?}",
            g.forwards,
            g.steps,
            g.tokens_decoded,
            elapsed.as_secs_f64(),
            tps,
            g.tokens_per_forward(),
            g.stop
        );
        if let Some(dev) = backend.hexagon() {
            eprintln!("\n{}", dev.routing_report());
        }
    }
    Ok(())
}

fn main() {
    let args = Args::parse();
    if let Err(e) = run(args) {
        eprintln!("error: {e:#}");
        std::process::exit(1);
    }
}
