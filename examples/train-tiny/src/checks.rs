//! Argument checks made before anything is written or trained: every number in its range (no
//! NaN, no negative learning rate or time budget, task weights whose sum fits), and the memory
//! training would need against what the machine has.

use anyhow::{bail, Result};
use dllm_models::TransformerConfig;

use crate::Args;

/// Largest `--batch` accepted whatever the memory: beyond it one step takes hours on a CPU.
pub const MAX_BATCH: usize = 1 << 16;

fn positive(flag: &str, v: f64) -> Result<()> {
    if !(v.is_finite() && v > 0.0) {
        bail!("{flag} {v}: must be a finite value > 0");
    }
    Ok(())
}

fn fraction(flag: &str, v: f64) -> Result<()> {
    if !(0.0..=1.0).contains(&v) {
        bail!("{flag} {v}: must be in [0, 1]");
    }
    Ok(())
}

/// The numeric arguments clap cannot range-check.
pub fn ranges(a: &Args) -> Result<()> {
    positive("--lr", a.lr)?;
    positive("--clip", a.clip)?;
    if let Some(m) = a.minutes {
        positive("--minutes", m)?;
    }
    fraction("--min-lr-ratio", a.min_lr_ratio)?;
    fraction("--small-fraction", a.small_fraction)?;
    if !(a.weight_decay.is_finite() && a.weight_decay >= 0.0) {
        bail!(
            "--weight-decay {}: must be a finite value >= 0",
            a.weight_decay
        );
    }
    if a.batch > MAX_BATCH {
        bail!("--batch {}: at most {MAX_BATCH} rows per step", a.batch);
    }
    let sum: u64 = a.task_weights.iter().map(|&w| w as u64).sum();
    if sum > u32::MAX as u64 {
        bail!(
            "--task-weights {:?}: their sum {sum} exceeds {}",
            a.task_weights,
            u32::MAX
        );
    }
    Ok(())
}

/// Bytes a training run needs, estimated from above: f32 weights, gradients and the two AdamW
/// moments (16 bytes per parameter), plus the activations the backward pass keeps per layer
/// (about 16 hidden-sized and 3 MLP-sized vectors per position, and the attention scores), and
/// the logits.
pub fn training_bytes(cfg: &TransformerConfig, batch: usize, seq: usize) -> u64 {
    let p = cfg.param_count().unwrap_or(u64::MAX);
    let (b, s) = (batch as u64, seq as u64);
    let h = cfg.hidden_size as u64;
    let per_pos_layer = h
        .saturating_mul(16)
        .saturating_add((cfg.intermediate_size as u64).saturating_mul(3))
        .saturating_add((cfg.num_heads as u64).saturating_mul(s).saturating_mul(2));
    let act = b
        .saturating_mul(s)
        .saturating_mul(per_pos_layer)
        .saturating_mul(cfg.num_layers as u64)
        .saturating_add(
            b.saturating_mul(s)
                .saturating_mul(cfg.vocab_size as u64)
                .saturating_mul(3),
        );
    p.saturating_mul(16).saturating_add(act.saturating_mul(4))
}

/// Error unless a run of `cfg` with `batch` rows of `seq` positions fits in memory.
pub fn memory(cfg: &TransformerConfig, batch: usize, seq: usize) -> Result<()> {
    dllm_models::limits::check_memory(
        &format!(
            "training this model (d {}, {} layers, batch {batch} x {seq} positions: weights, gradients, AdamW moments and activations)",
            cfg.hidden_size, cfg.num_layers
        ),
        training_bytes(cfg, batch, seq),
    )?;
    Ok(())
}
