//! LLaDA's supervised fine-tuning objective (Nie et al. 2025, Appendix B; `GSAI-ML/LLaDA`
//! `GUIDELINES.md`): per row draw `t ~ U(0, 1)`, mask each *response* position (EOS padding
//! included) independently with probability `p = (1 - eps) t + eps`, and minimise the cross-entropy
//! on masked positions weighted by `1 / p`, normalised by the response length and the batch size.
//!
//! [`sft_loss_with`] can also draw a fraction of the rows with *block-structured* masking
//! ([`BlockMasking`]), the state a semi-autoregressive decoder is in while it works on block `k`:
//! every response position before block `k` clean, block `k` masked with probability `p`, every
//! later position masked. The same `1 / p` weighting applies (a later position is masked with
//! probability 1, so its weight is 1). Under uniform masking a line's result is seldom masked
//! while its operands are visible; under block masking that is the common case, the one decoding
//! meets on every line.

use candle_core::{DType, Device, Tensor, D};
use dllm_models::DiffusionTransformer;

use crate::rng::Rng;
use crate::{Error, Result};

/// LLaDA's minimum masking probability.
pub const MASK_EPS: f64 = 1e-3;

/// The loss of one batch, plus what it was computed on.
#[derive(Debug)]
pub struct SftLoss {
    /// Scalar loss (differentiable).
    pub loss: Tensor,
    /// Masked positions in the batch.
    pub masked: usize,
}

/// Block-structured masking for a fraction of the rows (see the module docs).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct BlockMasking {
    /// Fraction of rows drawn with block-structured masking (0..=1); the rest are uniform.
    pub fraction: f64,
    /// Block length of the decoder the rows imitate (response positions per block).
    pub block_length: usize,
}

/// LLaDA SFT loss of `rows` (each `prompt ++ response ++ EOS...`, all the same length) whose
/// responses start at `prompt_lens[b]`.
pub fn sft_loss(
    model: &DiffusionTransformer,
    rows: &[Vec<u32>],
    prompt_lens: &[usize],
    mask_id: u32,
    rng: &mut Rng,
    device: &Device,
) -> Result<SftLoss> {
    sft_loss_with(model, rows, prompt_lens, mask_id, rng, device, None)
}

/// [`sft_loss`] with a fraction of the rows masked block by block (`block`; `None` is
/// [`sft_loss`]).
pub fn sft_loss_with(
    model: &DiffusionTransformer,
    rows: &[Vec<u32>],
    prompt_lens: &[usize],
    mask_id: u32,
    rng: &mut Rng,
    device: &Device,
    block: Option<BlockMasking>,
) -> Result<SftLoss> {
    if let Some(bm) = block {
        if !(0.0..=1.0).contains(&bm.fraction) || bm.block_length == 0 {
            return Err(Error::Train(format!(
                "block masking needs a fraction in [0, 1] and a positive block length, got {} and {}",
                bm.fraction, bm.block_length
            )));
        }
    }
    let b = rows.len();
    let t_len = rows.first().map(|r| r.len()).unwrap_or(0);
    if b == 0 || t_len == 0 || rows.iter().any(|r| r.len() != t_len) || prompt_lens.len() != b {
        return Err(Error::Train(
            "sft_loss needs a non-empty batch of equal-length rows".into(),
        ));
    }
    let mut noisy = Vec::with_capacity(b * t_len);
    let mut weights = vec![0f32; b * t_len];
    let mut masked = 0;
    for (i, (row, &pl)) in rows.iter().zip(prompt_lens).enumerate() {
        let answer_len = (t_len - pl) as f64;
        for (j, (&tok, m)) in row.iter().zip(mask_row(t_len, pl, rng, block)).enumerate() {
            match m {
                Some(pj) => {
                    noisy.push(mask_id);
                    weights[i * t_len + j] = (1.0 / (pj * answer_len * b as f64)) as f32;
                    masked += 1;
                }
                None => noisy.push(tok),
            }
        }
    }
    // Prompt positions are never masked, so their logits carry no loss: the log-softmax (and
    // its backward) runs over the response region only, from the shortest prompt on.
    let start = prompt_lens
        .iter()
        .copied()
        .min()
        .unwrap_or(0)
        .min(t_len - 1);
    let span = t_len - start;
    let targets: Vec<u32> = rows
        .iter()
        .flat_map(|r| r[start..].iter().copied())
        .collect();
    let weights: Vec<f32> = weights
        .chunks(t_len)
        .flat_map(|w| w[start..].iter().copied())
        .collect();
    let noisy = Tensor::from_vec(noisy, (b, t_len), device)?;
    let targets = Tensor::from_vec(targets, (b, span, 1), device)?;
    let weights = Tensor::from_vec(weights, (b, span), device)?;
    let logits = model
        .forward_train(&noisy)?
        .narrow(1, start, span)?
        .to_dtype(DType::F32)?;
    let logp = candle_nn::ops::log_softmax(&logits, D::Minus1)?;
    let picked = logp.gather(&targets, D::Minus1)?.squeeze(D::Minus1)?;
    let loss = (picked * weights)?.sum_all()?.neg()?;
    Ok(SftLoss { loss, masked })
}

/// Draws which positions of one `t_len`-long row (response from `prompt_len` on) are masked:
/// `Some(p)` for a masked position, `p` the probability it was masked with (its loss weight is
/// `1 / p`), `None` for a clean one. Uniform rows draw `t ~ U(0, 1)` and mask every response
/// position with `p = (1 - eps) t + eps`; block rows (a `block.fraction` of them) pick a block `k`
/// of the response uniformly, keep the positions before it clean, mask the block's with `p` and
/// every later one with probability 1.
pub fn mask_row(
    t_len: usize,
    prompt_len: usize,
    rng: &mut Rng,
    block: Option<BlockMasking>,
) -> Vec<Option<f64>> {
    let pl = prompt_len.min(t_len);
    let p = (1.0 - MASK_EPS) * rng.f64() + MASK_EPS;
    let (lo, hi) = match block {
        Some(bm) if bm.fraction > 0.0 && bm.block_length > 0 && rng.f64() < bm.fraction => {
            let blocks = (t_len - pl).div_ceil(bm.block_length).max(1);
            let lo = pl + rng.index(blocks) * bm.block_length;
            (lo, (lo + bm.block_length).min(t_len))
        }
        _ => (pl, t_len),
    };
    (0..t_len)
        .map(|j| {
            if j < lo {
                None
            } else if j >= hi {
                Some(1.0)
            } else if rng.f64() < p {
                Some(p)
            } else {
                None
            }
        })
        .collect()
}
