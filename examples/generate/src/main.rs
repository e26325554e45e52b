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
use clap::Parser;
use dllm_decode::StepObserver;
use dllm_models::{load, DiffusionLm, LoadOptions, ModelSource};
use llada_cli::{DecodeArgs, DeviceArgs};

/// Generate text with a masked-diffusion language model.
#[derive(Parser, Debug)]
#[command(version, about, long_about = None)]
struct Args {
    /// Model: a Hugging Face model directory, a .gguf file, or a hub id (owner/name, optionally @revision)
    /// [default: the embedded tiny LLaDA trained on the task suite].
    #[arg(long, visible_alias = "model-id")]
    model: Option<String>,
    /// A tokenizer.json to use instead of the model's own (the tokenizer.json next to the
    /// weights, else a GGUF file's tokenizer metadata).
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
    #[command(flatten)]
    decode: DecodeArgs,
    /// Compute dtype: f32, f16 or bf16.
    #[arg(long, default_value = "f32")]
    dtype: String,
    /// Element type of the K/V cache: f32, f16 or bf16 [default: --dtype]. f16 halves the
    /// cache's memory (llama.cpp's default cache type); with --device hexagon the NPU keeps its
    /// cache in fp16, so only f16 applies there.
    #[arg(long, value_name = "DTYPE")]
    kv_dtype: Option<String>,
    /// Threads for every CPU kernel, 1..=256 (default: one per core).
    #[arg(long)]
    threads: Option<usize>,
    #[command(flatten)]
    device: DeviceArgs,
    /// Print exactly one JSON object on stdout (and nothing else).
    #[arg(long)]
    json: bool,
    /// Do not animate the canvas on a terminal.
    #[arg(long)]
    no_live: bool,
}

fn parse_dtype(flag: &str, s: &str) -> Result<DType> {
    match s {
        "f32" => Ok(DType::F32),
        "f16" => Ok(DType::F16),
        "bf16" => Ok(DType::BF16),
        _ => bail!("{flag}: `{s}` (expected f32, f16 or bf16)"),
    }
}

fn run(a: Args) -> Result<()> {
    if let Some(t) = a.threads {
        // The model's own pool (LoadOptions::threads), where its CPU kernels run: checked now,
        // before anything is loaded.
        dllm_models::threads::pool(t).context("--threads")?;
    }
    // Every flag is checked before anything is opened or loaded.
    let dtype = parse_dtype("--dtype", &a.dtype)?;
    a.device.check(&a.dtype)?;
    let kv_dtype = a
        .kv_dtype
        .as_deref()
        .map(|s| parse_dtype("--kv-dtype", s))
        .transpose()?;
    if let (Some(npu), Some(kv)) = (a.device.npu_dtype(), a.kv_dtype.as_deref()) {
        if kv != npu {
            bail!(
                "--kv-dtype {kv}: with --device hexagon the NPU keeps its K/V cache in {npu}; \
                 drop --kv-dtype, or use --device cpu --kv-dtype {kv}"
            );
        }
    }
    a.decode.check()?;
    match (&a.prompt_ids, &a.prompt) {
        (Some(_), _) if a.chat => {
            bail!("--chat wraps a text prompt in the chat template: it does not apply to --prompt-ids")
        }
        (None, None) => bail!("give a prompt with --prompt \"...\" or --prompt-ids 1,2,3"),
        _ => {}
    }
    if let Some(t) = &a.tokenizer {
        dllm_models::files::open_regular(t, "tokenizer").context("--tokenizer")?;
    }
    let backend = a.device.backend()?;
    let opts = LoadOptions {
        dtype,
        kv_dtype,
        device: Device::Cpu,
        tokenizer: a.tokenizer.clone(),
        backend: backend.clone(),
        threads: a.threads,
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
    // Printed even with --json (on stderr): a mismatched tokenizer explains odd output.
    for w in &loaded.warnings {
        eprintln!("warning: {w}");
    }
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
    let params = a.decode.params(&loaded.defaults)?;
    let decoder = a.decode.decoder(params)?;
    let prompt_ids: Vec<u32> = match (&a.prompt_ids, &a.prompt) {
        (Some(ids), _) => ids.clone(),
        (None, Some(text)) => {
            let tok = loaded.tokenizer.as_ref().ok_or_else(|| {
                anyhow!(
                    "{} has no tokenizer (no tokenizer.json beside it, and no tokenizer metadata \
                     in a GGUF): pass --tokenizer <file> or give the prompt as --prompt-ids",
                    loaded.source
                )
            })?;
            if a.chat && !tok.has_chat_template() {
                bail!(
                    "--chat: the tokenizer of {} has no chat template (neither LLaDA's nor Qwen2's \
                     special tokens); drop --chat to use the prompt as written",
                    loaded.source
                );
            }
            // Special-token text the user typed (`[MASK]`, `<eos>`) is encoded as text.
            let ids = tok.encode_prompt(text, a.chat)?;
            if ids.contains(&info.special.mask) {
                bail!(
                    "--prompt: the tokenizer of {} spells part of the prompt as the mask token \
                     (id {}), which would be decoded as a position to fill: reword the prompt",
                    loaded.source,
                    info.special.mask
                );
            }
            ids
        }
        (None, None) => unreachable!("checked above"),
    };
    let tok = loaded.tokenizer.clone();
    let live = !a.json && !a.no_live && console::Term::stderr().is_term();
    let mut observer: Box<dyn StepObserver> = if live {
        Box::new(live::LiveCanvas::new(
            tok.clone(),
            params.gen_length,
            info.special.stop_ids(),
        ))
    } else if !a.json {
        Box::new(live::Progress::new(params.gen_length))
    } else {
        Box::new(())
    };
    let before = backend.hexagon().map(|d| d.counters());
    let t0 = Instant::now();
    let g = decoder
        .run(&mut loaded.model, &prompt_ids, observer.as_mut())
        .map_err(llada_cli::cli_error)?;
    let elapsed = t0.elapsed();
    drop(observer);
    let stop_ids = info.special.stop_ids();
    let answer = g.answer(&stop_ids);
    let text = match &tok {
        Some(t) => Some(t.decode(answer, true)?),
        None => None,
    };
    // Tokens of the answer (EOS padding after it is not counted).
    let tps = answer.len() as f64 / elapsed.as_secs_f64().max(1e-9);
    if a.json {
        let mut out = serde_json::json!({
            "prompt_ids": prompt_ids,
            "generated_ids": g.generated(),
            "text": text,
            "elapsed_ms": elapsed.as_secs_f64() * 1e3,
            "answer_tokens": answer.len(),
            "tokens_per_second": tps,
            "stop_reason": format!("{:?}", g.stop),
            "model": loaded.source,
            "strategy": params.strategy.name(),
            "device": a.device.device,
            // What the CPU computes in; the NPU (--device hexagon) computes in fp16.
            "dtype": a.dtype,
            "npu_dtype": a.device.npu_dtype(),
            // The K/V cache's element type (the NPU's cache is fp16).
            "kv_dtype": a.kv_dtype.as_deref().or(a.device.npu_dtype()).unwrap_or(&a.dtype),
            "gen_length": params.gen_length,
            "block_length": params.block_length,
            "steps_requested": params.steps,
            "threshold": params.decide.threshold().map(as_written),
            // Staged decisions' thresholds (mbsd without --no-sts), else null.
            "theta_visible": params.decide.staged().map(|s| as_written(s.visible)),
            "theta_stable": params.decide.staged().map(|s| as_written(s.stable)),
            // Verification of tentative tokens (staged decisions without --no-verify), else null.
            "tau_back": params
                .decide
                .staged()
                .and_then(|s| s.verify)
                .map(|v| as_written(v.tau_back)),
        });
        let map = out.as_object_mut().expect("an object");
        map.extend(llada_cli::counters(&g));
        let cpu = loaded.model.weights().cpu_linear_bytes();
        map.insert("cpu_linear_bytes_owned".into(), cpu.owned.into());
        map.insert(
            "cpu_linear_bytes_shared_with_npu".into(),
            cpu.shared_with_npu.into(),
        );
        if let (Some(dev), Some(b)) = (backend.hexagon(), before) {
            map.extend(llada_cli::device_counters(&b, &dev.counters()));
        }
        // The process's peak resident set (VmHWM: loading and generating), null where the
        // system does not report it.
        map.insert("peak_rss_bytes".into(), peak_rss_bytes().into());
        println!("{out}");
    } else {
        match &text {
            Some(t) => println!("{t}"),
            None => println!("{:?}", answer),
        }
        eprintln!(
            "{} forwards, {} steps, {} answer tokens in {:.2}s ({:.1} tok/s, {:.2} tokens/forward), stop: {:?}",
            g.forwards,
            g.steps,
            answer.len(),
            elapsed.as_secs_f64(),
            tps,
            g.tokens_per_forward(),
            g.stop
        );
        if let Some(dev) = backend.hexagon() {
            eprintln!("\n{}", dev.routing_report());
            if let Some(plan) = dev.last_memory_plan() {
                eprintln!("\n{plan}");
            }
            let cpu = loaded.model.weights().cpu_linear_bytes();
            eprintln!(
                "CPU linear layers (refresh path, fallbacks): {:.2} MiB of their own weights, \
                 {:.2} MiB read in place from the NPU module's packed tiles",
                cpu.owned as f64 / 1048576.0,
                cpu.shared_with_npu as f64 / 1048576.0
            );
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

/// An f32 flag value as the user wrote it (0.97, not 0.9700000286102295) for the JSON.
fn as_written(x: f32) -> f64 {
    x.to_string().parse().unwrap_or(x as f64)
}

/// The process's peak resident set size in bytes (`VmHWM` of `/proc/self/status`; `None` where
/// there is no such file).
fn peak_rss_bytes() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}
