//! # dllm-decode
//!
//! Decoding for masked-diffusion language models, against the [`DiffusionLm`] trait only:
//!
//! * [`Strategy::Vanilla`] — the model family's reference algorithm: LLaDA's semi-autoregressive
//!   `generate` (blocks, per-block token-count schedule, `low_confidence`/`random` remasking,
//!   Gumbel temperature, classifier-free guidance, `logits_eos_inf`, `confidence_eos_eot_inf`),
//!   or, for Dream models, Dream's `diffusion_generate` (`origin`, `maskgit_plus`, `topk_margin`,
//!   `entropy`; `eps`, `alg_temp`, `top_p`, `top_k`, temperature);
//! * [`Strategy::PrefixCache`] / [`Strategy::DualCache`] — Fast-dLLM's block-wise KV caching;
//! * threshold parallel decoding (`DecodeParams::threshold`) with any block strategy.
//!
//! Decoding stops early when a completed block ends in EOS/EoT (`early_stop`), and reports every
//! step to a [`StepObserver`] (progress bars, streaming, visualisation). Invalid parameters are
//! errors naming the parameter; at temperature 0 results are bit-for-bit deterministic.
//!
//! This crate never touches FFI or model internals.

#![warn(missing_docs)]

mod blockwise;
pub mod confidence;
mod dream;
mod error;
pub mod generation;
pub mod latency;
pub mod observer;
pub mod params;
pub mod rng;
pub mod select;

use dllm_models::{Arch, DiffusionLm};

pub use error::{DecodeError, Result};
pub use generation::{Generation, StopReason};
pub use latency::{LatencyTable, LatencyPoint};
pub use observer::{Control, StepEvent, StepObserver};
pub use params::{DecodeParams, DreamAlg, DreamParams, Remasking, Strategy};

/// Check the prompt against the model and build `prompt ++ [MASK] * gen_length`.
pub fn prepare_canvas(
    model: &dyn DiffusionLm,
    prompt: &[u32],
    p: &DecodeParams,
) -> Result<Vec<u32>> {
    let info = model.info();
    let mask = info.special.mask;
    if let Some(i) = prompt.iter().position(|&t| t == mask) {
        return Err(DecodeError::InvalidPrompt(format!(
            "position {i} holds the mask token id {mask}"
        )));
    }
    if let Some((i, &t)) = prompt
        .iter()
        .enumerate()
        .find(|(_, &t)| t as usize >= info.vocab_size)
    {
        return Err(DecodeError::InvalidPrompt(format!(
            "token id {t} at position {i} is outside the vocabulary ({} ids)",
            info.vocab_size
        )));
    }
    let total = prompt.len() + p.gen_length;
    if total > info.max_seq_len {
        return Err(DecodeError::param(
            "gen-length",
            format!(
                "prompt ({}) + gen-length ({}) = {total} exceeds the model's maximum sequence length {}",
                prompt.len(),
                p.gen_length,
                info.max_seq_len
            ),
        ));
    }
    let mut canvas = prompt.to_vec();
    canvas.resize(total, mask);
    Ok(canvas)
}

/// Generate `p.gen_length` tokens after `prompt`.
pub fn generate(
    model: &mut dyn DiffusionLm,
    prompt: &[u32],
    p: &DecodeParams,
    observer: &mut dyn StepObserver,
) -> Result<Generation> {
    p.validate()?;
    let arch = model.info().arch;
    check_options_apply(arch, p)?;
    let canvas = prepare_canvas(model, prompt, p)?;
    if uses_dream_algorithm(arch, p) {
        dream::run(model, canvas, prompt.len(), p, observer)
    } else {
        blockwise::run(model, canvas, prompt.len(), p, observer)
    }
}

/// Whether `generate` runs Dream's own `diffusion_generate` (a Dream model with the vanilla
/// strategy) rather than the block-wise decoder.
pub fn uses_dream_algorithm(arch: Arch, p: &DecodeParams) -> bool {
    arch == Arch::Dream && p.strategy == Strategy::Vanilla
}

/// Options the chosen decoder would ignore are errors, not silent no-ops.
fn check_options_apply(arch: Arch, p: &DecodeParams) -> Result<()> {
    let unused = |name: &'static str, why: &str| Err(DecodeError::param(name, why.to_string()));
    if uses_dream_algorithm(arch, p) {
        let why = "Dream's own algorithm (a Dream model with --strategy vanilla) does not use it; \
                   the block-wise strategies (prefix-cache, dual-cache) do";
        if p.threshold.is_some() {
            return unused("threshold", why);
        }
        if p.cfg_scale > 0.0 {
            return unused("cfg-scale", why);
        }
        if p.remasking != Remasking::LowConfidence {
            return unused(
                "remasking",
                "Dream's algorithm chooses positions with --alg",
            );
        }
        if p.logits_eos_inf {
            return unused("logits-eos-inf", why);
        }
        if p.confidence_eos_eot_inf {
            return unused("confidence-eos-eot-inf", why);
        }
    } else {
        let why = "only Dream's own algorithm (a Dream model with --strategy vanilla) uses it";
        let (d, default) = (p.dream, DreamParams::default());
        if d.alg != default.alg {
            return unused("alg", why);
        }
        if d.eps != default.eps {
            return unused("eps", why);
        }
        if d.alg_temp.is_some() {
            return unused("alg-temp", why);
        }
        if d.top_p.is_some() {
            return unused("top-p", why);
        }
        if d.top_k.is_some() {
            return unused("top-k", why);
        }
    }
    Ok(())
}
