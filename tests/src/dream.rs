//! Dream's `diffusion_generate` (Dream-org/Dream, `generation_utils.py`: `_sample`,
//! `sample_tokens`, `top_p_logits`, `top_k_logits`) as a test oracle, written from the published
//! Python, not from `dllm-decode`.
//!
//! Followed line by line, for batch size 1 and no attention mask:
//! * `x` is the prompt padded with `mask_token_id` to `max_length`; `timesteps =
//!   torch.linspace(1, eps, steps + 1)` in **float32** (PyTorch's default dtype, computed as its
//!   CPU kernel does: from the start for the first half, from the end for the second);
//! * every step forwards the whole canvas and shifts the logits right by one
//!   (`torch.cat([logits[:, :1], logits[:, :-1]], dim=1)`), then looks only at masked positions;
//! * `origin`: `p_transfer = 1 - s / t` (1 at the last step), a uniform per masked position
//!   (`torch.rand`), and the positions below it get `sample_tokens`' token;
//! * `maskgit_plus` / `topk_margin` / `entropy`: `sample_tokens` with the matching confidence,
//!   `number_transfer_tokens = int(num_mask_token * (1 - s / t))` in float32 (all at the last
//!   step), and the `topk` of the confidences (`alg_temp` sampling is not supported here);
//! * `sample_tokens`: logits divided by the temperature when it is > 0, `top_p_logits`, then
//!   `top_k_logits` (filtered logits set to a very negative value), softmax, the argmax (T = 0) or a
//!   categorical sample (T > 0, from the supplied uniforms), and the confidence from the same
//!   probabilities.
//!
//! Where PyTorch leaves the order unspecified: `argmax` takes the lowest id among equal maxima and
//! `topk` the lowest position among equal confidences (as the LLaDA oracle, [`crate::generate`]).
//! Random numbers (`torch.rand`, `Categorical.sample`) come from a caller-supplied stream of
//! uniforms, so a run can be replayed with another implementation's generator.

use anyhow::{ensure, Result};

use crate::generate::argmax;
use crate::reference::softmax;

/// Dream's unmasking algorithms (`alg`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Alg {
    /// `origin`.
    Origin,
    /// `maskgit_plus`.
    MaskgitPlus,
    /// `topk_margin`.
    TopkMargin,
    /// `entropy`.
    Entropy,
}

/// The `generation_config` fields `_sample` reads.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct DreamParams {
    /// `steps`.
    pub steps: usize,
    /// `eps`.
    pub eps: f64,
    /// `alg`.
    pub alg: Alg,
    /// `temperature`.
    pub temperature: f64,
    /// `top_p` (`None`: off).
    pub top_p: Option<f64>,
    /// `top_k` (`None`: off).
    pub top_k: Option<usize>,
    /// `mask_token_id`.
    pub mask_id: u32,
}

/// `torch.linspace(start, end, n)` in float32, as PyTorch's CPU kernel computes it.
pub fn linspace_f32(start: f32, end: f32, n: usize) -> Vec<f32> {
    if n == 1 {
        return vec![start];
    }
    let step = (end - start) / (n - 1) as f32;
    let halfway = n / 2;
    (0..n)
        .map(|i| {
            if i < halfway {
                start + step * i as f32
            } else {
                end - step * (n - i - 1) as f32
            }
        })
        .collect()
}

/// `top_p_logits`: drop tokens once the cumulative probability (descending) exceeds `top_p`,
/// always keeping the first.
fn top_p_logits(logits: &mut [f64], top_p: f64) {
    let probs = softmax(logits);
    let mut order: Vec<usize> = (0..logits.len()).collect();
    order.sort_by(|&a, &b| logits[b].total_cmp(&logits[a]).then(a.cmp(&b)));
    let mut cum = 0.0;
    // sorted_indices_to_remove shifted right by one: the k-th sorted token is removed when the
    // cumulative probability up to token k-1 exceeds top_p.
    let mut remove_next = false;
    for &i in &order {
        let remove = remove_next;
        cum += probs[i];
        remove_next = cum > top_p;
        if remove {
            logits[i] = f64::MIN;
        }
    }
}

/// `top_k_logits`: drop tokens whose logit is below the k-th largest.
fn top_k_logits(logits: &mut [f64], top_k: usize) {
    let k = top_k.min(logits.len()).max(1);
    let mut sorted = logits.to_vec();
    sorted.sort_by(|a, b| b.total_cmp(a));
    let kth = sorted[k - 1];
    for x in logits.iter_mut() {
        if *x < kth {
            *x = f64::MIN;
        }
    }
}

/// `sample_tokens` for one row: `(confidence, token)`.
fn sample_tokens(row: &[f64], p: &DreamParams, uniform: &mut dyn FnMut() -> f64) -> (f64, usize) {
    let mut logits = row.to_vec();
    if p.temperature > 0.0 {
        logits.iter_mut().for_each(|x| *x /= p.temperature);
    }
    if let Some(tp) = p.top_p.filter(|&tp| tp < 1.0) {
        top_p_logits(&mut logits, tp);
    }
    if let Some(k) = p.top_k {
        top_k_logits(&mut logits, k);
    }
    let probs = softmax(&logits);
    let x0 = if p.temperature > 0.0 {
        // Categorical(probs).sample(): inverse CDF of one uniform.
        let u = uniform();
        let mut acc = 0.0;
        let mut pick = argmax(&probs);
        for (i, &q) in probs.iter().enumerate() {
            acc += q;
            if u < acc && q > 0.0 {
                pick = i;
                break;
            }
        }
        pick
    } else {
        argmax(&probs)
    };
    let confidence = match p.alg {
        Alg::Origin | Alg::MaskgitPlus => probs[x0],
        Alg::TopkMargin => {
            let mut sorted = probs.clone();
            sorted.sort_by(|a, b| b.total_cmp(a));
            sorted[0] - sorted.get(1).copied().unwrap_or(0.0)
        }
        Alg::Entropy => probs.iter().map(|&q| q * (q + 1e-10).ln()).sum(),
    };
    (confidence, x0)
}

/// The result of [`diffusion_generate`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DreamGeneration {
    /// Prompt followed by the generated positions.
    pub canvas: Vec<u32>,
    /// Forwards run (one per step while masks remain; Dream's loop runs every step, a forward of a
    /// canvas without masks changes nothing, so those are not counted).
    pub forwards: usize,
}

/// Dream `diffusion_generate` over `raw_logits(canvas)` (the model's unshifted outputs, one row
/// per position), `uniform()` standing for `torch.rand` / `Categorical.sample`.
pub fn diffusion_generate(
    mut raw_logits: impl FnMut(&[u32]) -> Result<Vec<Vec<f64>>>,
    prompt: &[u32],
    max_new_tokens: usize,
    p: &DreamParams,
    uniform: &mut dyn FnMut() -> f64,
) -> Result<DreamGeneration> {
    ensure!(p.steps > 0, "steps must be positive");
    let mut x = prompt.to_vec();
    x.extend(std::iter::repeat_n(p.mask_id, max_new_tokens));
    let timesteps = linspace_f32(1.0, p.eps as f32, p.steps + 1);
    let mut forwards = 0;
    for i in 0..p.steps {
        let mask_index: Vec<usize> = (0..x.len()).filter(|&k| x[k] == p.mask_id).collect();
        if mask_index.is_empty() {
            break;
        }
        let raw = raw_logits(&x)?;
        forwards += 1;
        ensure!(raw.len() == x.len(), "logits rows != canvas length");
        // logits = cat([logits[:, :1], logits[:, :-1]])
        let logits: Vec<&Vec<f64>> = (0..raw.len()).map(|k| &raw[k.saturating_sub(1)]).collect();
        let (t, s) = (timesteps[i], timesteps[i + 1]);
        if p.alg == Alg::Origin {
            let p_transfer = if i < p.steps - 1 { 1.0 - s / t } else { 1.0 };
            let rand: Vec<f64> = mask_index.iter().map(|_| uniform()).collect();
            for (j, &pos) in mask_index.iter().enumerate() {
                if rand[j] < p_transfer as f64 {
                    x[pos] = sample_tokens(logits[pos], p, uniform).1 as u32;
                }
            }
        } else {
            let scored: Vec<(f64, usize)> = mask_index
                .iter()
                .map(|&pos| sample_tokens(logits[pos], p, uniform))
                .collect();
            let num_mask_token = mask_index.len() as f32;
            let n = if i < p.steps - 1 {
                (num_mask_token * (1.0 - s / t)) as usize
            } else {
                num_mask_token as usize
            };
            // full_confidence: -inf outside the masked positions; topk, lowest position first
            // among equals.
            let mut order: Vec<usize> = (0..mask_index.len()).collect();
            order.sort_by(|&a, &b| scored[b].0.total_cmp(&scored[a].0).then(a.cmp(&b)));
            for &j in order.iter().take(n) {
                x[mask_index[j]] = scored[j].1 as u32;
            }
        }
    }
    Ok(DreamGeneration {
        canvas: x,
        forwards,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn linspace_matches_torch() {
        // torch.linspace(1, 1e-3, 5): [1.0, 0.75025, 0.5005, 0.25075, 0.001]
        let v = linspace_f32(1.0, 1e-3, 5);
        let want = [1.0f32, 0.75025, 0.5005, 0.25075, 0.001];
        for (a, b) in v.iter().zip(want) {
            assert!((a - b).abs() < 1e-6, "{v:?}");
        }
        assert_eq!(*v.last().unwrap(), 1e-3f32);
    }

    #[test]
    fn filters() {
        let mut l = vec![3.0, 2.0, 1.0, 0.0];
        top_k_logits(&mut l, 2);
        assert_eq!(&l[..2], &[3.0, 2.0]);
        assert!(l[2] == f64::MIN && l[3] == f64::MIN);
        // probabilities ~ [0.64, 0.24, 0.09, 0.03]: top_p 0.5 keeps the first only, 0.7 two.
        let mut l = vec![3.0, 2.0, 1.0, 0.0];
        top_p_logits(&mut l, 0.5);
        assert_eq!(l[0], 3.0);
        assert!(l[1..].iter().all(|&x| x == f64::MIN));
        let mut l = vec![3.0, 2.0, 1.0, 0.0];
        top_p_logits(&mut l, 0.7);
        assert_eq!(&l[..2], &[3.0, 2.0]);
        assert!(l[2..].iter().all(|&x| x == f64::MIN));
    }
}
