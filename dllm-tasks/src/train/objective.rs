//! LLaDA's supervised fine-tuning objective (Nie et al. 2025, Appendix B; `GSAI-ML/LLaDA`
//! `GUIDELINES.md`): per row draw `t ~ U(0, 1)`, mask each *response* position (EOS padding
//! included) independently with probability `p = (1 - eps) t + eps`, and minimise the cross-entropy
//! on masked positions weighted by `1 / p`, normalised by the response length and the batch size.

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
        let p = (1.0 - MASK_EPS) * rng.f64() + MASK_EPS;
        for (j, &tok) in row.iter().enumerate() {
            if j >= pl && rng.f64() < p {
                noisy.push(mask_id);
                weights[i * t_len + j] = (1.0 / (p * answer_len * b as f64)) as f32;
                masked += 1;
            } else {
                noisy.push(tok);
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
