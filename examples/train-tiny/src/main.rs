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

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use candle_core::{DType, Device};
use candle_nn::VarMap;
use clap::Parser;
use dllm_decode::{DecodeParams, Strategy};
use dllm_models::lm::Arch;
use dllm_models::{dream, llada, TransformerConfig};
use dllm_tasks::rng::Rng;
use dllm_tasks::tasks::{suite_train_stream, Suite, TaskKind, TrainStream};
use dllm_tasks::tokenizer::{self as tk, BOS_ID, EOS_ID, MASK_ID, PAD_ID};
use dllm_tasks::train::{
    inference_copy, init_from, init_varmap, lr_at, named_vars, sft_loss_with, suite_config,
    trainable, AdamW, AdamWConfig, Batcher, BlockMasking, ModelShape,
};
use indicatif::{ProgressBar, ProgressStyle};
use output::{OutDir, RunDir, Staging};
use serde::{Deserialize, Serialize};

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
    checks::ranges(&a)?;
    // Every argument is checked before anything is written or trained.
    let arch = match a.arch.as_str() {
        "llada" => Arch::Llada,
        "dream" => Arch::Dream,
        other => bail!("--arch: `{other}` (expected llada or dream)"),
    };
    let suite: Suite = a.suite.parse().context("--suite")?;
    let save_dtype = match a.save_dtype.as_str() {
        "f16" => DType::F16,
        "bf16" => DType::BF16,
        "f32" => DType::F32,
        other => bail!("--save-dtype: `{other}` (expected f16, bf16 or f32)"),
    };
    for (flag, v) in [
        ("--batch", a.batch),
        ("--steps", a.steps),
        ("--checkpoint-every", a.checkpoint_every),
        ("--threads", a.threads),
    ] {
        if v == 0 {
            bail!("{flag} must be positive");
        }
    }
    if a.gen_len == 0 || a.block_length == 0 || !a.gen_len.is_multiple_of(a.block_length) {
        bail!(
            "--block-length {} must be positive and divide --gen-len {}",
            a.block_length,
            a.gen_len
        );
    }
    if !(0.0..=1.0).contains(&a.block_masking) {
        bail!(
            "--block-masking {} must be a fraction in [0, 1]",
            a.block_masking
        );
    }
    let block_masking = BlockMasking {
        fraction: a.block_masking,
        block_length: a.block_length,
    };
    let weights: [u32; 4] = a.task_weights.clone().try_into().map_err(|_| {
        anyhow::anyhow!("--task-weights needs 4 values (math,yesno,choice,completion)")
    })?;
    suite_train_stream(suite, a.seed)
        .with_weights(weights)
        .context("--task-weights")?
        .with_small_fraction(a.small_fraction)
        .context("--small-fraction")?;
    if a.small_fraction > 0.0
        && (a.small_gen_len < dllm_tasks::tasks::long::SMALL_MAX_RESPONSE_TOKENS + 1
            || a.small_gen_len > a.gen_len)
    {
        bail!(
            "--small-gen-len {} must hold a small answer + EOS ({} tokens) and not exceed --gen-len {}",
            a.small_gen_len,
            dllm_tasks::tasks::long::SMALL_MAX_RESPONSE_TOKENS + 1,
            a.gen_len
        );
    }
    if a.gen_len < tk::max_response_tokens(suite) + 1 {
        bail!(
            "--gen-len {} is shorter than the {suite} suite's longest answer + EOS ({} tokens)",
            a.gen_len,
            tk::max_response_tokens(suite) + 1
        );
    }
    if tk::max_prompt_tokens(suite) + a.gen_len > dllm_tasks::train::SUITE_MAX_SEQ_LEN {
        bail!(
            "--gen-len {}: the {suite} suite's longest prompt ({} tokens) plus it exceeds the model's {} positions",
            a.gen_len,
            tk::max_prompt_tokens(suite),
            dllm_tasks::train::SUITE_MAX_SEQ_LEN
        );
    }
    let tok = tk::build_tokenizer(suite)?;
    let vocab = tok.get_vocab_size(true);
    let shape = ModelShape {
        arch,
        hidden: a.hidden,
        layers: a.layers,
        heads: a.heads,
        kv_heads: a.kv_heads.unwrap_or(if arch == Arch::Dream {
            (a.heads / 2).max(1)
        } else {
            a.heads
        }),
        ffn: a.ffn.unwrap_or(3 * a.hidden),
    };
    let cfg = suite_config(shape, vocab)?;
    checks::memory(&cfg, a.batch, tk::max_prompt_tokens(suite) + a.gen_len)?;
    let outdir = OutDir::new(&a.out)?;
    let run: RunDir = outdir.plan(a.overwrite, a.resume)?;
    let config_json = match cfg.arch {
        Arch::Llada => llada::config_to_json(&cfg),
        Arch::Dream => dream::config_to_json(&cfg),
    };
    let ckpt = run.checkpoint();
    let resumed = if a.resume {
        // The model being continued must have this run's shape (a resume with another --hidden
        // or --arch is an error, not a directory whose config and weights disagree). The
        // checkpoint records it (checkpoints written before it did: the model's config.json).
        let existing = [ckpt.join("config.json"), run.dir.join("config.json")]
            .into_iter()
            .find(|p| p.is_file());
        if let Some(existing) = existing {
            let old: serde_json::Value = serde_json::from_str(&output::read_regular(&existing)?)
                .with_context(|| format!("parsing {}", existing.display()))?;
            if old != config_json {
                bail!(
                    "--resume: {} describes another model than these arguments (compare --arch, --hidden, --layers, --heads, --ffn, --suite with {})",
                    existing.display(),
                    run.dir.join("train_args.json").display()
                );
            }
        }
        for f in ["model.safetensors", "optimizer.safetensors"] {
            let p = ckpt.join(f);
            if !std::fs::symlink_metadata(&p).is_ok_and(|m| m.is_file()) {
                bail!("--resume: {} is missing or not a regular file", p.display());
            }
        }
        Some(read_state(&ckpt.join("state.json"))?)
    } else {
        None
    };
    // Everything is checked: from here on the run writes.
    outdir.probe_parent()?;
    for p in outdir.remove_stale() {
        eprintln!("removed {}, left by an interrupted run", p.display());
    }
    let created_out = std::fs::symlink_metadata(&outdir.out).is_err();
    run.create(&outdir)?;
    let _cleanup = FreshRunCleanup {
        run: &run,
        outdir: &outdir,
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

    let dev = Device::Cpu;
    let mut varmap = VarMap::new();
    init_varmap(&varmap, &cfg, a.seed)?;
    if let Some(dir) = &a.init_from {
        let w = init_from(&varmap, dir, &tok)
            .with_context(|| format!("--init-from {}", dir.display()))?;
        eprintln!(
            "warm start from {}: {} tensors copied, {} vocabulary matrices mapped by token from {} to {vocab} rows ({} tokens changed id)",
            dir.display(),
            w.copied,
            w.extended,
            w.old_vocab,
            w.moved
        );
    }
    let model = trainable(&varmap, &cfg)?;
    let vars = named_vars(&varmap)?;
    let n_params: usize = vars.iter().map(|(_, v)| v.elem_count()).sum();
    let mut opt = AdamW::new(
        vars,
        AdamWConfig {
            weight_decay: a.weight_decay,
            clip_norm: Some(a.clip),
            ..Default::default()
        },
    )?;

    let mut stream: TrainStream = suite_train_stream(suite, a.seed);
    let mut mask_rng = Rng::new(a.seed ^ 0x5E_ED0F_3A5C);
    let mut step = 0usize;
    let mut prior = Duration::ZERO;
    let mut examples = 0usize;
    if let Some(st) = resumed {
        varmap
            .load(ckpt.join("model.safetensors"))
            .with_context(|| format!("loading {}", ckpt.join("model.safetensors").display()))?;
        opt.load(&ckpt.join("optimizer.safetensors"))?;
        stream = TrainStream::from_suite_rng_state(suite, st.stream);
        mask_rng = Rng::from_state(st.mask_rng);
        step = st.step;
        prior = Duration::from_secs_f64(st.elapsed_s);
        examples = st.examples;
        eprintln!(
            "resumed at step {step} ({:.1} min trained)",
            prior.as_secs_f64() / 60.0
        );
    }
    eprintln!(
        "{} model: {n_params} parameters (d {}, {} layers, {} heads / {} kv, mlp {}), vocab {vocab}, rows {}+{}, batch {}",
        cfg.arch, cfg.hidden_size, cfg.num_layers, cfg.num_heads, cfg.num_kv_heads, cfg.intermediate_size,
        tk::max_prompt_tokens(suite), a.gen_len, a.batch
    );
    let gen_lens = if a.small_fraction > 0.0 {
        vec![a.small_gen_len, a.gen_len]
    } else {
        vec![a.gen_len]
    };
    let mut batcher = Batcher::with_gen_lens(
        stream
            .with_weights(weights)?
            .with_small_fraction(a.small_fraction)?,
        a.batch,
        gen_lens,
    );
    // A resumed run keeps the lines its checkpoint covers; a fresh run starts a new log.
    let mut log = run.open_log(a.resume.then_some(step))?;
    let mut saved_step = a.resume.then_some(step);

    let pb = ProgressBar::new(a.steps as u64).with_position(step as u64);
    pb.set_style(
        ProgressStyle::with_template(
            "{bar:30} {pos}/{len} [{elapsed_precise}<{eta_precise}] {msg}",
        )
        .expect("template"),
    );
    let t0 = Instant::now();
    let mut ema: Option<f64> = None;
    let save_ckpt = |step: usize,
                     opt: &AdamW,
                     batcher: &Batcher,
                     mask_rng: &Rng,
                     elapsed: Duration,
                     examples: usize|
     -> Result<()> {
        // One directory, swapped in as a whole: weights, moments and state of the same step.
        run.save_checkpoint(|staged| {
            stage_weights(staged, &varmap, "model.safetensors", DType::F32)?;
            staged.with("optimizer.safetensors", |tmp| Ok(opt.save(tmp)?))?;
            staged.json("config.json", &config_json)?;
            staged.json(
                "state.json",
                &State {
                    step,
                    stream: batcher.stream_state(),
                    mask_rng: mask_rng.state(),
                    elapsed_s: elapsed.as_secs_f64(),
                    examples,
                },
            )
        })
    };
    let mut stopped_by = None;
    while step < a.steps {
        if let Some(sig) = interrupted() {
            stopped_by = Some(sig);
            break;
        }
        if let Some(m) = a.minutes {
            if (prior + t0.elapsed()).as_secs_f64() > m * 60.0 {
                pb.println(format!("time budget of {m} minutes reached at step {step}"));
                break;
            }
        }
        let batch = batcher.next_batch(&tok)?;
        let lens = vec![batch.prompt_len; batch.rows.len()];
        let out = sft_loss_with(
            &model,
            &batch.rows,
            &lens,
            MASK_ID,
            &mut mask_rng,
            &dev,
            Some(block_masking),
        )?;
        let loss_v = out.loss.to_scalar::<f32>()? as f64;
        let grads = out.loss.backward()?;
        let lr = lr_at(step, a.steps, a.warmup, a.lr, a.min_lr_ratio);
        let gnorm = opt.step(&grads, lr)?;
        step += 1;
        ema = Some(match ema {
            Some(e) => 0.98 * e + 0.02 * loss_v,
            None => loss_v,
        });
        let elapsed = prior + t0.elapsed();
        examples += batch.rows.len();
        pb.set_position(step as u64);
        pb.set_message(format!(
            "loss {:.4} lr {lr:.2e} |g| {gnorm:.2} {:.0} ex/s",
            ema.unwrap_or(loss_v),
            (examples as f64) / elapsed.as_secs_f64()
        ));
        let mut rec = serde_json::json!({"step": step, "loss": loss_v, "loss_ema": ema, "lr": lr, "grad_norm": gnorm, "elapsed_s": elapsed.as_secs_f64(), "examples": examples});
        if a.eval_every > 0
            && (step.is_multiple_of(a.eval_every) || step == a.steps)
            && interrupted().is_none()
        {
            let acc = quick_eval(&varmap, &cfg, &tok, &a, suite)?;
            let txt: Vec<String> = acc
                .iter()
                .map(|(k, v, st)| match st {
                    Some(st) => {
                        format!("{} {:.0}% (steps {:.0}%)", k.name(), 100.0 * v, 100.0 * st)
                    }
                    None => format!("{} {:.0}%", k.name(), 100.0 * v),
                })
                .collect();
            pb.println(format!(
                "step {step}: loss {:.4}, quick eval ({} per task): {}",
                ema.unwrap_or(loss_v),
                a.eval_limit,
                txt.join(", ")
            ));
            rec["eval"] = serde_json::json!(acc
                .iter()
                .map(|(k, v, _)| (k.name(), *v))
                .collect::<std::collections::BTreeMap<_, _>>());
            if suite == Suite::Long {
                rec["eval_steps"] = serde_json::json!(acc
                    .iter()
                    .filter_map(|(k, _, st)| st.map(|st| (k.name(), st)))
                    .collect::<std::collections::BTreeMap<_, _>>());
                // Which part of a worked line is learnt (teacher-forced, dllm_tasks::probe).
                let mut model = inference_copy(&varmap, &cfg)?;
                let qs = dllm_tasks::eval::questions(&[TaskKind::LongMath], Some(a.eval_limit));
                let sk = dllm_tasks::probe::probe_long_math(&mut model, &tok, &qs, a.gen_len)?;
                pb.println(format!(
                    "step {step}: long-math skills: copy {:.0}%, lookup {:.0}%, arithmetic {:.0}%",
                    100.0 * sk.copy.accuracy(),
                    100.0 * sk.lookup.accuracy(),
                    100.0 * sk.arithmetic.accuracy()
                ));
                rec["skills"] = serde_json::json!({
                    "copy": sk.copy.accuracy(), "lookup": sk.lookup.accuracy(),
                    "arithmetic": sk.arithmetic.accuracy(),
                });
            }
        }
        use std::io::Write;
        writeln!(log, "{rec}")?;
        if step.is_multiple_of(a.checkpoint_every) {
            save_ckpt(step, &opt, &batcher, &mask_rng, elapsed, examples)?;
            saved_step = Some(step);
        }
    }
    pb.finish();
    let elapsed = prior + t0.elapsed();
    let nothing_trained = stopped_by.is_some() && step == 0;
    if saved_step != Some(step) && !nothing_trained {
        save_ckpt(step, &opt, &batcher, &mask_rng, elapsed, examples)?;
    }
    log.sync_all()
        .with_context(|| format!("syncing {}", run.dir.join(output::LOG).display()))?;
    drop(log);
    if let Some(sig) = stopped_by {
        if nothing_trained {
            eprintln!("stopped by {} before the first step", signal_name(sig));
        } else {
            eprintln!(
                "stopped by {} at step {step}: checkpoint saved in {}; continue with the same \
                 arguments and --resume",
                signal_name(sig),
                run.checkpoint().display()
            );
        }
        return Ok(Some(sig));
    }
    // The model directory, replaced as one unit (weights, config, tokenizer, log, checkpoint).
    outdir.install(&run, |staged| {
        stage_weights(staged, &varmap, "model.safetensors", save_dtype)?;
        staged.json("config.json", &config_json)?;
        staged.json(
            "generation_config.json",
            &serde_json::json!({
                "bos_token_id": BOS_ID, "eos_token_id": EOS_ID, "pad_token_id": PAD_ID,
                "gen_length": a.gen_len, "block_length": a.block_length, "steps": a.gen_len,
            }),
        )?;
        staged.with("tokenizer.json", |tmp| Ok(tk::save(&tok, tmp)?))?;
        staged.json("train_args.json", &a)
    })?;
    eprintln!(
        "trained {step} steps ({examples} examples) in {:.1} min; wrote {}",
        elapsed.as_secs_f64() / 60.0,
        a.out.display()
    );
    Ok(None)
}
