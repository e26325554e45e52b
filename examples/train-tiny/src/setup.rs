//! What a run settles before it writes anything: every argument checked and resolved into the
//! values training uses, and a `--resume` checked against the checkpoint it continues.

use anyhow::{bail, Context, Result};
use candle_core::DType;
use dllm_models::lm::Arch;
use dllm_models::{dream, llada, TransformerConfig};
use dllm_tasks::tasks::{suite_train_stream, Suite};
use dllm_tasks::tokenizer as tk;
use dllm_tasks::train::{suite_config, BlockMasking, ModelShape};

use crate::output::{self, RunDir};
use crate::{checks, read_state, Args, State};

/// The arguments resolved into the values the run trains and saves with.
pub struct Resolved {
    /// The task suite (its data stream and tokenizer).
    pub suite: Suite,
    /// Dtype of the final model.safetensors.
    pub save_dtype: DType,
    /// The rows masked block by block, and the block length.
    pub block_masking: BlockMasking,
    /// Relative task frequencies math, yesno, choice, completion.
    pub weights: [u32; 4],
    /// The suite's tokenizer.
    pub tok: tokenizers::Tokenizer,
    /// Its vocabulary size (added tokens included).
    pub vocab: usize,
    /// The model's configuration.
    pub cfg: TransformerConfig,
}

/// Check every argument, in a fixed order (the first failing check is the error), and resolve
/// them; also checks that training this model fits in memory.
pub fn resolve(a: &Args) -> Result<Resolved> {
    checks::ranges(a)?;
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
    check_sizes(a)?;
    let block_masking = BlockMasking {
        fraction: a.block_masking,
        block_length: a.block_length,
    };
    let weights = task_weights(a, suite)?;
    check_gen_lens(a, suite)?;
    let tok = tk::build_tokenizer(suite)?;
    let vocab = tok.get_vocab_size(true);
    let cfg = model_config(a, arch, vocab)?;
    checks::memory(&cfg, a.batch, tk::max_prompt_tokens(suite) + a.gen_len)?;
    Ok(Resolved {
        suite,
        save_dtype,
        block_masking,
        weights,
        tok,
        vocab,
        cfg,
    })
}

/// The counts that must be positive, `--block-length` dividing `--gen-len`, and
/// `--block-masking` a fraction.
fn check_sizes(a: &Args) -> Result<()> {
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
    Ok(())
}

/// The four `--task-weights`, checked (with `--small-fraction`) by the suite's data stream.
fn task_weights(a: &Args, suite: Suite) -> Result<[u32; 4]> {
    let weights: [u32; 4] = a.task_weights.clone().try_into().map_err(|_| {
        anyhow::anyhow!("--task-weights needs 4 values (math,yesno,choice,completion)")
    })?;
    suite_train_stream(suite, a.seed)
        .with_weights(weights)
        .context("--task-weights")?
        .with_small_fraction(a.small_fraction)
        .context("--small-fraction")?;
    Ok(weights)
}

/// The response regions: `--small-gen-len` and `--gen-len` hold their longest answers + EOS,
/// and the suite's longest prompt plus `--gen-len` fits the model's positions.
fn check_gen_lens(a: &Args, suite: Suite) -> Result<()> {
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
    Ok(())
}

/// The configuration of the model the shape arguments describe (`--kv-heads` defaults to
/// `--heads` for llada and half of it for dream, `--ffn` to 3 * `--hidden`).
fn model_config(a: &Args, arch: Arch, vocab: usize) -> Result<TransformerConfig> {
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
    Ok(suite_config(shape, vocab)?)
}

/// The model's `config.json`, in its architecture's Hugging Face layout.
pub fn config_json(cfg: &TransformerConfig) -> serde_json::Value {
    match cfg.arch {
        Arch::Llada => llada::config_to_json(cfg),
        Arch::Dream => dream::config_to_json(cfg),
    }
}

/// The state of the checkpoint a `--resume` run continues, once checked: the model it holds has
/// this run's shape (`config_json`), and its weights and optimizer moments are regular files.
pub fn check_resume(run: &RunDir, config_json: &serde_json::Value) -> Result<State> {
    let ckpt = run.checkpoint();
    // The model being continued must have this run's shape (a resume with another --hidden
    // or --arch is an error, not a directory whose config and weights disagree). The
    // checkpoint records it (checkpoints written before it did: the model's config.json).
    let existing = [ckpt.join("config.json"), run.dir.join("config.json")]
        .into_iter()
        .find(|p| p.is_file());
    if let Some(existing) = existing {
        let old: serde_json::Value = serde_json::from_str(&output::read_regular(&existing)?)
            .with_context(|| format!("parsing {}", existing.display()))?;
        if old != *config_json {
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
    read_state(&ckpt.join("state.json"))
}
