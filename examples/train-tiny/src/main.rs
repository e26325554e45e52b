//! `train-tiny`: trains a LLaDA-architecture (or, with `--arch dream`, Dream-layout) masked
//! diffusion model on the synthetic task suite with LLaDA's SFT objective, on CPU, and writes a
//! checkpoint in the exact Hugging Face layout the loaders read.
//!
//! ```text
//! cargo run --release -p train-tiny -- --out models/tiny-llada
//! ```
//!
//! Every argument is checked (ranges, memory) before anything is written; checkpoints and the
//! model directory are each replaced as one unit, an existing model (and its run) only with
//! `--overwrite` and only once the new model exists; SIGINT and SIGTERM stop at the next step
//! boundary with a checkpoint (see [`output`]).

mod checks;
mod output;
mod setup;
mod train_loop;

use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use candle_core::DType;
use candle_nn::VarMap;
use clap::Parser;
use dllm_decode::{DecodeParams, Strategy};
use dllm_models::TransformerConfig;
use dllm_tasks::tasks::{Suite, TaskKind};
use dllm_tasks::tokenizer::{self as tk, BOS_ID, EOS_ID, PAD_ID};
use dllm_tasks::train::inference_copy;
use output::{OutDir, RunDir, Staging};
use serde::{Deserialize, Serialize};
use setup::Resolved;
use train_loop::Training;

#[derive(Parser, Debug, Clone, Serialize, Deserialize)]
#[command(about = "Train a small masked-diffusion LM on the synthetic task suite (CPU).")]
struct Args {
    /// Output directory (HF layout: config.json, model.safetensors, tokenizer.json).
    #[arg(long)]
    out: PathBuf,
    /// Architecture: llada or dream (GQA, q/k/v biases, shifted logits).
    #[arg(long, default_value = "llada")]
    arch: String,
    /// Task suite: short (the tiny-* models) or long (worked answers of 64-128 tokens; use
    /// --gen-len 128 --block-length 32). Each suite has its own tokenizer.
    #[arg(long, default_value = "short")]
    #[serde(default = "default_suite")]
    suite: String,
    /// Hidden size.
    #[arg(long, default_value_t = 128)]
    hidden: usize,
    /// Transformer blocks.
    #[arg(long, default_value_t = 4)]
    layers: usize,
    /// Attention heads.
    #[arg(long, default_value_t = 4)]
    heads: usize,
    /// Key/value heads (default: heads for llada, heads/2 for dream).
    #[arg(long)]
    kv_heads: Option<usize>,
    /// MLP hidden size (default: 3 * hidden).
    #[arg(long)]
    ffn: Option<usize>,
    /// Response region per row (answer + EOS padding); match the eval's --gen-length.
    #[arg(long, default_value_t = 24)]
    gen_len: usize,
    /// Long suite: fraction of examples drawn as small training-only instances (fewer steps,
    /// facts, options or people), trained on --small-gen-len canvases.
    #[arg(long, default_value_t = 0.0)]
    #[serde(default)]
    small_fraction: f64,
    /// Response region of the small instances' rows.
    #[arg(long, default_value_t = 64)]
    #[serde(default = "default_small_gen_len")]
    small_gen_len: usize,
    /// Block length recommended in generation_config.json (the decoders' default).
    #[arg(long, default_value_t = 8)]
    block_length: usize,
    /// Fraction of rows masked block by block (the state of a semi-autoregressive decoder on
    /// block k: earlier blocks clean, block k masked at ratio t, later positions masked), the
    /// rest masked uniformly as in LLaDA's SFT. Blocks are --block-length long.
    #[arg(long, default_value_t = 0.0)]
    #[serde(default)]
    block_masking: f64,
    /// Rows per batch.
    #[arg(long, default_value_t = 64)]
    batch: usize,
    /// Optimizer steps (the cosine schedule spans them).
    #[arg(long, default_value_t = 16000)]
    steps: usize,
    /// Stop (and save) after this many minutes even if steps remain.
    #[arg(long)]
    minutes: Option<f64>,
    /// Peak learning rate.
    #[arg(long, default_value_t = 2e-3)]
    lr: f64,
    /// Warmup steps.
    #[arg(long, default_value_t = 200)]
    warmup: usize,
    /// Final learning rate as a fraction of the peak.
    #[arg(long, default_value_t = 0.1)]
    min_lr_ratio: f64,
    /// AdamW weight decay (matrices only).
    #[arg(long, default_value_t = 0.1)]
    weight_decay: f64,
    /// Gradient clipping (global norm).
    #[arg(long, default_value_t = 1.0)]
    clip: f64,
    /// Relative task frequencies math,yesno,choice,completion (e.g. 1,2,1,1 doubles yes/no).
    #[arg(long, value_delimiter = ',', default_value = "1,2,1,1")]
    task_weights: Vec<u32>,
    /// Seed (weights, data stream, masking).
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// CPU threads.
    #[arg(long, default_value_t = 1)]
    threads: usize,
    /// Quick eval every N steps (0: never).
    #[arg(long, default_value_t = 500)]
    eval_every: usize,
    /// Held-out questions per task in the quick eval.
    #[arg(long, default_value_t = 25)]
    eval_limit: usize,
    /// Save a resumable checkpoint every N steps.
    #[arg(long, default_value_t = 250)]
    checkpoint_every: usize,
    /// Warm start: initialise from this HF checkpoint (same shape; every token of its tokenizer in
    /// the suite's, embedding rows matched by token string, e.g. models/tiny-llada for the long
    /// suite) instead of at random.
    #[arg(long)]
    #[serde(default)]
    init_from: Option<PathBuf>,
    /// Continue from `<out>/checkpoint` (or `<out>.next/checkpoint`, an interrupted --overwrite
    /// run; an error when there is none).
    #[arg(long)]
    resume: bool,
    /// Replace the model or run already in `--out` (without it, an existing one is an error). The
    /// new run trains in `<out>.next` and replaces `--out` when it ends.
    #[arg(long)]
    #[serde(default)]
    overwrite: bool,
    /// Dtype of the final model.safetensors (f16, bf16, f32).
    #[arg(long, default_value = "f16")]
    save_dtype: String,
}

fn default_suite() -> String {
    "short".into()
}

fn default_small_gen_len() -> usize {
    64
}

#[derive(Serialize, Deserialize)]
struct State {
    step: usize,
    stream: [u64; 4],
    mask_rng: [u64; 4],
    elapsed_s: f64,
    examples: usize,
}

fn tune_malloc() {
    // candle allocates per op; glibc's default trimming hands memory back to the OS after every
    // step and re-faults it in. Keeping freed memory measured +40-50% training throughput.
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    unsafe {
        libc::mallopt(libc::M_TRIM_THRESHOLD, 1 << 30);
        libc::mallopt(libc::M_MMAP_THRESHOLD, 1 << 30);
    }
}

/// The signal (SIGINT, SIGTERM) that asked the run to stop, 0 while none did.
static INTERRUPTED: std::sync::atomic::AtomicI32 = std::sync::atomic::AtomicI32::new(0);

extern "C" fn on_signal(sig: libc::c_int) {
    INTERRUPTED.store(sig, std::sync::atomic::Ordering::SeqCst);
}

/// SIGINT and SIGTERM ask the run to stop at the next step boundary (with a checkpoint); the
/// handler resets itself, so a second signal stops the process at once.
fn catch_signals() {
    #[cfg(unix)]
    for sig in [libc::SIGINT, libc::SIGTERM] {
        // SAFETY: the handler only stores into an atomic, which is async-signal-safe.
        unsafe {
            let mut sa: libc::sigaction = std::mem::zeroed();
            sa.sa_sigaction = on_signal as extern "C" fn(libc::c_int) as usize;
            sa.sa_flags = libc::SA_RESETHAND;
            libc::sigemptyset(&mut sa.sa_mask);
            libc::sigaction(sig, &sa, std::ptr::null_mut());
        }
    }
}

fn interrupted() -> Option<i32> {
    match INTERRUPTED.load(std::sync::atomic::Ordering::SeqCst) {
        0 => None,
        s => Some(s),
    }
}

fn signal_name(sig: i32) -> &'static str {
    match sig {
        libc::SIGINT => "SIGINT",
        libc::SIGTERM => "SIGTERM",
        _ => "a signal",
    }
}

/// A fresh run that ends without a checkpoint (an error, or a signal before the first step)
/// leaves nothing behind: its log, and `X.next` or the `X` it created. A run with a checkpoint
/// stays, for `--resume`.
struct FreshRunCleanup<'a> {
    run: &'a RunDir,
    outdir: &'a OutDir,
    created_out: bool,
}

impl Drop for FreshRunCleanup<'_> {
    fn drop(&mut self) {
        let run = self.run;
        if !run.fresh || run.checkpoint().join("state.json").exists() {
            return;
        }
        let _ = std::fs::remove_file(run.dir.join(output::LOG));
        let _ = std::fs::remove_dir(run.checkpoint());
        if run.dir != self.outdir.out {
            let _ = std::fs::remove_dir_all(&run.dir);
        } else if self.created_out {
            let _ = std::fs::remove_dir(&run.dir);
        }
    }
}

fn stage_weights(staged: &Staging, varmap: &VarMap, name: &str, dtype: DType) -> Result<()> {
    let data = varmap
        .data()
        .lock()
        .map_err(|_| anyhow::anyhow!("the variable map's lock is poisoned"))?;
    let mut map = std::collections::HashMap::new();
    for (k, v) in data.iter() {
        map.insert(k.clone(), v.as_tensor().to_dtype(dtype)?);
    }
    staged.with(name, |tmp| Ok(candle_core::safetensors::save(&map, tmp)?))
}

/// The training state of `<out>/checkpoint/state.json`, checked (errors name the file).
fn read_state(path: &Path) -> Result<State> {
    let text = output::read_regular(path)?;
    let st: State =
        serde_json::from_str(&text).with_context(|| format!("parsing {}", path.display()))?;
    if !(st.elapsed_s.is_finite() && st.elapsed_s >= 0.0) {
        bail!(
            "{}: `elapsed_s` {} is not a finite duration >= 0",
            path.display(),
            st.elapsed_s
        );
    }
    Ok(st)
}

/// Final-answer accuracy per task, and per-step accuracy for worked answers.
type QuickEval = Vec<(TaskKind, f64, Option<f64>)>;

fn quick_eval(
    varmap: &VarMap,
    cfg: &TransformerConfig,
    tok: &tokenizers::Tokenizer,
    a: &Args,
    suite: Suite,
) -> Result<QuickEval> {
    let mut model = inference_copy(varmap, cfg)?;
    // The short suite's quick eval decodes its whole answer as one block (its history in the
    // shipped cards); the long suite uses the recommended block length, whose early stop
    // skips the EOS blocks.
    let block_length = match suite {
        Suite::Short => a.gen_len,
        Suite::Long => a.block_length,
    };
    let params = DecodeParams {
        gen_length: a.gen_len,
        block_length,
        steps: a.gen_len,
        strategy: Strategy::Vanilla,
        ..Default::default()
    };
    let qs = dllm_tasks::eval::questions(&suite.tasks(), Some(a.eval_limit));
    let (scores, _) = dllm_tasks::eval::evaluate(&mut model, tok, &qs, &params, |_, _, _| {})?;
    Ok(scores
        .iter()
        .map(|s| (s.task, s.accuracy(), s.step_accuracy()))
        .collect())
}

fn main() {
    // Before any thread starts (the umask is read by setting it).
    output::init_file_mode();
    let a = Args::parse();
    match run(a) {
        Ok(None) => {}
        Ok(Some(sig)) => std::process::exit(128 + sig),
        Err(e) => {
            eprintln!("error: {e:#}");
            std::process::exit(1);
        }
    }
}

/// Train; `Some(signal)` when a signal stopped the run (a checkpoint saved).
fn run(a: Args) -> Result<Option<i32>> {
    dllm_models::threads::configure(a.threads).context("--threads")?;
    tune_malloc();
    // Every argument is checked before anything is written or trained.
    let res = setup::resolve(&a)?;
    let outdir = OutDir::new(&a.out)?;
    let run: RunDir = outdir.plan(a.overwrite, a.resume)?;
    let config_json = setup::config_json(&res.cfg);
    let resumed = if a.resume {
        Some(setup::check_resume(&run, &config_json)?)
    } else {
        None
    };
    // Everything is checked: from here on the run writes.
    let _cleanup = start_writing(&outdir, &run)?;
    let mut training = Training::start(&a, &res, &run, &config_json, resumed)?;
    let (stopped_by, elapsed) = training.train()?;
    if let Some(sig) = stopped_by {
        report_stop(sig, training.step, &run);
        return Ok(Some(sig));
    }
    install_model(&a, &res, &outdir, &run, &training.varmap, &config_json)?;
    eprintln!(
        "trained {} steps ({} examples) in {:.1} min; wrote {}",
        training.step,
        training.examples,
        elapsed.as_secs_f64() / 60.0,
        a.out.display()
    );
    Ok(None)
}

/// Start writing: remove what interrupted runs left, create the run's directory (cleaned up
/// again if the run ends without a checkpoint) and catch SIGINT and SIGTERM from here on.
fn start_writing<'a>(outdir: &'a OutDir, run: &'a RunDir) -> Result<FreshRunCleanup<'a>> {
    outdir.probe_parent()?;
    for p in outdir.remove_stale() {
        eprintln!("removed {}, left by an interrupted run", p.display());
    }
    let created_out = std::fs::symlink_metadata(&outdir.out).is_err();
    run.create(outdir)?;
    let cleanup = FreshRunCleanup {
        run,
        outdir,
        created_out,
    };
    if run.dir != outdir.out {
        eprintln!(
            "training in {} (it replaces {} when training ends)",
            run.dir.display(),
            outdir.out.display()
        );
    }
    catch_signals();
    Ok(cleanup)
}

/// Report a run that `sig` stopped at `step`: before its first step, or with its checkpoint.
fn report_stop(sig: i32, step: usize, run: &RunDir) {
    if step == 0 {
        eprintln!("stopped by {} before the first step", signal_name(sig));
    } else {
        eprintln!(
            "stopped by {} at step {step}: checkpoint saved in {}; continue with the same \
             arguments and --resume",
            signal_name(sig),
            run.checkpoint().display()
        );
    }
}

/// Replace the model directory with the trained model as one unit: weights (in
/// `--save-dtype`), config, generation config, tokenizer and arguments, with the run's log and
/// checkpoint.
fn install_model(
    a: &Args,
    res: &Resolved,
    outdir: &OutDir,
    run: &RunDir,
    varmap: &VarMap,
    config_json: &serde_json::Value,
) -> Result<()> {
    outdir.install(run, |staged| {
        stage_weights(staged, varmap, "model.safetensors", res.save_dtype)?;
        staged.json("config.json", config_json)?;
        staged.json(
            "generation_config.json",
            &serde_json::json!({
                "bos_token_id": BOS_ID, "eos_token_id": EOS_ID, "pad_token_id": PAD_ID,
                "gen_length": a.gen_len, "block_length": a.block_length, "steps": a.gen_len,
            }),
        )?;
        staged.with("tokenizer.json", |tmp| Ok(tk::save(&res.tok, tmp)?))?;
        staged.json("train_args.json", a)
    })
}
