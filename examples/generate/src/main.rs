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
mod report;

use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};
use candle_core::{DType, Device};
use clap::Parser;
use dllm_decode::{Decoder, Outcome, StepObserver};
use dllm_models::{
    load, DiffusionLm, LoadOptions, LoadedModel, ModelInfo, ModelSource, TextTokenizer,
};
use llada_cli::{DecodeArgs, DeviceArgs};

use report::Report;

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

/// Check the flags, load the model, generate, and print the answer with its summary, or the
/// `--json` object.
fn run(a: Args) -> Result<()> {
    let (dtype, kv_dtype) = check_flags(&a)?;
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
    let mut loaded = load_model(&a, &opts)?;
    let info = loaded.model.info().clone();
    let params = a.decode.params(&loaded.defaults, info.shift_logits)?;
    let decoder = a.decode.decoder(params)?;
    let prompt_ids = prompt_ids(&a, &loaded, &info)?;
    let observer = observer(&a, loaded.tokenizer.clone(), params.gen_length, &info);
    let before = backend.hexagon().map(|d| d.counters());
    let (outcome, elapsed) = decode(decoder, &mut loaded.model, &prompt_ids, observer)?;
    let stop_ids = info.special.stop_ids();
    let answer = outcome.answer(&stop_ids);
    let text = match &loaded.tokenizer {
        Some(t) => Some(t.decode(answer, true)?),
        None => None,
    };
    let report = Report {
        args: &a,
        loaded: &loaded,
        params: &params,
        backend: &backend,
        prompt_ids: &prompt_ids,
        outcome: &outcome,
        answer,
        text: text.as_deref(),
        elapsed,
        before,
    };
    if a.json {
        report.print_json();
    } else {
        report.print_text();
    }
    Ok(())
}

/// Check every flag before anything is opened or loaded; the compute dtype, and the K/V cache's
/// when `--kv-dtype` gives one.
fn check_flags(a: &Args) -> Result<(DType, Option<DType>)> {
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
    Ok((dtype, kv_dtype))
}

/// Load `--model` (or the embedded model) with `opts`, printing its warnings and, without
/// `--json`, a line naming what was loaded and how long it took.
fn load_model(a: &Args, opts: &LoadOptions) -> Result<LoadedModel> {
    let t_load = Instant::now();
    let loaded = match &a.model {
        Some(spec) => {
            let source = ModelSource::parse(spec)?;
            load(&source, opts).with_context(|| format!("loading {source}"))?
        }
        None => embedded::load(opts)?,
    };
    let info = loaded.model.info();
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
    Ok(loaded)
}

/// The prompt's token ids: `--prompt-ids` as given, or `--prompt` encoded by the model's
/// tokenizer (in the chat template with `--chat`), refused if it spells the mask token.
fn prompt_ids(a: &Args, loaded: &LoadedModel, info: &ModelInfo) -> Result<Vec<u32>> {
    match (&a.prompt_ids, &a.prompt) {
        (Some(ids), _) => Ok(ids.clone()),
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
            Ok(ids)
        }
        (None, None) => unreachable!("checked by check_flags"),
    }
}

/// What shows the decode on stderr: the live canvas on a terminal (unless `--no-live`), else a
/// progress bar; nothing with `--json`.
fn observer(
    a: &Args,
    tok: Option<TextTokenizer>,
    gen_length: usize,
    info: &ModelInfo,
) -> Box<dyn StepObserver> {
    let live = !a.json && !a.no_live && console::Term::stderr().is_term();
    if live {
        Box::new(live::LiveCanvas::new(
            tok,
            gen_length,
            info.special.stop_ids(),
        ))
    } else if !a.json {
        Box::new(live::Progress::new(gen_length))
    } else {
        Box::new(())
    }
}

/// Run `decoder` on `prompt_ids`, showing each step through `observer`, which is dropped (its
/// display cleared) before returning; the outcome and the decode's wall time.
fn decode(
    decoder: Decoder<'static>,
    model: &mut dyn DiffusionLm,
    prompt_ids: &[u32],
    mut observer: Box<dyn StepObserver>,
) -> Result<(Outcome, Duration)> {
    let t0 = Instant::now();
    let g = decoder
        .run(model, prompt_ids, observer.as_mut())
        .map_err(llada_cli::cli_error)?;
    let elapsed = t0.elapsed();
    drop(observer);
    Ok((g, elapsed))
}

fn main() {
    let args = Args::parse();
    if let Err(e) = run(args) {
        eprintln!("error: {e:#}");
        std::process::exit(1);
    }
}
