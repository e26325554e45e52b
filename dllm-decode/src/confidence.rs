//! Turning one row of logits into a predicted token and a confidence score.
//!
//! Two conventions exist and both are kept exactly:
//! * LLaDA / Fast-dLLM ([`LladaScorer`]): the token is `argmax(exp(logits) / (-ln u)^T)` (Gumbel
//!   trick in f64; plain argmax at `T = 0`), the confidence is scored on the *untempered* softmax.
//! * Dream ([`DreamSampler`]): logits are divided by `T`, filtered by top-p / top-k, the token is
//!   sampled from (or, at `T = 0`, the argmax of) that distribution, and the confidence is taken
//!   from the same filtered distribution.
//!
//! Ties in argmax resolve to the lowest token id (as `torch.argmax` does).

use crate::params::{DreamAlg, Remasking};
use crate::rng::Rng;

/// A scored prediction for one position.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Scored {
    /// Predicted token.
    pub token: u32,
    /// Higher is more confident.
    pub confidence: f64,
}

fn argmax(v: impl Iterator<Item = f64>) -> usize {
    let mut best = (0usize, f64::NEG_INFINITY);
    for (i, x) in v.enumerate() {
        if x > best.1 || (i == 0 && x.is_nan()) {
            best = (i, x);
        }
    }
    best.0
}

/// Softmax in f64 (entries at -inf get probability 0).
pub(crate) fn softmax(row: &[f32]) -> Vec<f64> {
    let m = row.iter().copied().fold(f32::NEG_INFINITY, f32::max) as f64;
    let mut p: Vec<f64> = row.iter().map(|&x| ((x as f64) - m).exp()).collect();
    let s: f64 = p.iter().sum();
    if s > 0.0 && s.is_finite() {
        p.iter_mut().for_each(|x| *x /= s);
    }
    p
}

fn score_from_probs(p: &[f64], token: usize, remasking: Remasking) -> f64 {
    match remasking {
        Remasking::LowConfidence | Remasking::Random => p[token],
        Remasking::Margin => {
            let (mut a, mut b) = (0.0f64, 0.0f64);
            for &x in p {
                if x > a {
                    b = a;
                    a = x;
                } else if x > b {
                    b = x;
                }
            }
            a - b
        }
        Remasking::Entropy => p.iter().map(|&x| x * (x + 1e-10).ln()).sum(),
    }
}

/// LLaDA's scoring (`generate.py` / Fast-dLLM `get_transfer_index`).
#[derive(Debug, Clone, Copy)]
pub struct LladaScorer {
    /// Confidence function.
    pub remasking: Remasking,
    /// Gumbel temperature.
    pub temperature: f32,
    /// Set EOS logits to -inf before predicting.
    pub logits_eos_inf: bool,
    /// Score EOS/EoT predictions with probability 0 (their logits are removed from the confidence
    /// softmax), which ranks them after every other candidate. LLaDA's `confidence_eos_eot_inf`
    /// line writes `-inf` into the EoT logit before its confidence softmax; this applies the same to
    /// EOS, the evident intent of the option's name.
    pub confidence_eos_eot_inf: bool,
    /// EOS id.
    pub eos: u32,
    /// EoT id, if any.
    pub eot: Option<u32>,
    /// The mask id: never a prediction (its logit is set to -inf first). A trained model never
    /// predicts it; a corrupted or untrained one must not leave a decided position masked.
    pub mask: u32,
}

/// Remove the mask id from the candidates of a prediction.
fn forbid_mask(row: &mut [f32], mask: u32) {
    if let Some(x) = row.get_mut(mask as usize) {
        *x = f32::NEG_INFINITY;
    }
}

impl LladaScorer {
    /// Predict and score one row (modified in place by the EOS options).
    pub fn score(&self, row: &mut [f32], rng: &mut Rng) -> Scored {
        forbid_mask(row, self.mask);
        let eos = self.eos as usize;
        if self.logits_eos_inf && eos < row.len() {
            row[eos] = f32::NEG_INFINITY;
        }
        let token = if self.temperature == 0.0 {
            argmax(row.iter().map(|&x| x as f64))
        } else {
            let t = self.temperature as f64;
            argmax(
                row.iter()
                    .map(|&x| (x as f64).exp() / (-rng.f64_open().ln()).powf(t)),
            )
        };
        if self.remasking == Remasking::Random {
            return Scored {
                token: token as u32,
                confidence: rng.f64(),
            };
        }
        if self.confidence_eos_eot_inf {
            for id in std::iter::once(self.eos).chain(self.eot) {
                if let Some(x) = row.get_mut(id as usize) {
                    *x = f32::NEG_INFINITY;
                }
            }
        }
        let p = softmax(row);
        Scored {
            token: token as u32,
            confidence: score_from_probs(&p, token, self.remasking),
        }
    }
}

/// Dream's `sample_tokens`.
#[derive(Debug, Clone, Copy)]
pub struct DreamSampler {
    /// Algorithm (decides the confidence function).
    pub alg: DreamAlg,
    /// Sampling temperature.
    pub temperature: f32,
    /// Nucleus filter.
    pub top_p: Option<f32>,
    /// Top-k filter.
    pub top_k: Option<usize>,
    /// The mask id: never a prediction.
    pub mask: u32,
}

impl DreamSampler {
    /// Sample/predict and score one row (modified in place by temperature and filters).
    pub fn score(&self, row: &mut [f32], rng: &mut Rng) -> Scored {
        forbid_mask(row, self.mask);
        if self.temperature > 0.0 {
            row.iter_mut().for_each(|x| *x /= self.temperature);
        }
        if let Some(tp) = self.top_p.filter(|&p| p < 1.0) {
            top_p_filter(row, tp);
        }
        if let Some(k) = self.top_k {
            top_k_filter(row, k);
        }
        let p = softmax(row);
        let token = if self.temperature > 0.0 {
            let u = rng.f64();
            let mut acc = 0.0;
            let mut pick = argmax(p.iter().copied());
            for (i, &x) in p.iter().enumerate() {
                acc += x;
                if u < acc && x > 0.0 {
                    pick = i;
                    break;
                }
            }
            pick
        } else {
            argmax(p.iter().copied())
        };
        let remasking = match self.alg {
            DreamAlg::Origin | DreamAlg::MaskgitPlus => Remasking::LowConfidence,
            DreamAlg::TopkMargin => Remasking::Margin,
            DreamAlg::Entropy => Remasking::Entropy,
        };
        Scored {
            token: token as u32,
            confidence: score_from_probs(&p, token, remasking),
        }
    }
}

/// Keep the smallest set of tokens whose cumulative probability exceeds `top_p` (the first token
/// always stays); the rest get -inf.
fn top_p_filter(row: &mut [f32], top_p: f32) {
    let p = softmax(row);
    let mut order: Vec<usize> = (0..row.len()).collect();
    order.sort_by(|&a, &b| p[b].total_cmp(&p[a]).then(a.cmp(&b)));
    let mut cum = 0.0;
    let mut remove = false;
    for &i in &order {
        if remove {
            row[i] = f32::NEG_INFINITY;
        }
        cum += p[i];
        // A token is removed when the cumulative mass *before* it already exceeds top_p.
        if cum > top_p as f64 {
            remove = true;
        }
    }
}

/// Keep logits at least as large as the `k`-th largest (ties with it are kept, as in Dream).
fn top_k_filter(row: &mut [f32], k: usize) {
    if k >= row.len() {
        return;
    }
    let mut sorted: Vec<f32> = row.to_vec();
    sorted.sort_by(|a, b| b.total_cmp(a));
    let kth = sorted[k - 1];
    row.iter_mut()
        .filter(|x| **x < kth)
        .for_each(|x| *x = f32::NEG_INFINITY);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scorer(remasking: Remasking) -> LladaScorer {
        LladaScorer {
            remasking,
            temperature: 0.0,
            logits_eos_inf: false,
            confidence_eos_eot_inf: false,
            eos: 3,
            eot: Some(4),
            mask: 99,
        }
    }

    #[test]
    fn greedy_probability() {
        let mut rng = Rng::new(0);
        let mut row = vec![0.0, 2.0, 1.0, 0.5, 0.0];
        let s = scorer(Remasking::LowConfidence).score(&mut row, &mut rng);
        assert_eq!(s.token, 1);
        let p = softmax(&[0.0, 2.0, 1.0, 0.5, 0.0]);
        assert!((s.confidence - p[1]).abs() < 1e-12);
    }

    #[test]
    fn the_mask_id_is_never_predicted() {
        let mut rng = Rng::new(0);
        let mut sc = scorer(Remasking::LowConfidence);
        sc.mask = 2;
        let s = sc.score(&mut [0.0, 1.0, 50.0, 0.5], &mut rng);
        assert_eq!(s.token, 1);
        let d = DreamSampler {
            alg: DreamAlg::MaskgitPlus,
            temperature: 0.0,
            top_p: None,
            top_k: None,
            mask: 0,
        };
        assert_eq!(d.score(&mut [9.0, 1.0, 2.0], &mut rng).token, 2);
    }

    #[test]
    fn argmax_ties_take_lowest_id() {
        let mut rng = Rng::new(0);
        let mut row = vec![1.0, 3.0, 3.0];
        assert_eq!(
            scorer(Remasking::LowConfidence)
                .score(&mut row, &mut rng)
                .token,
            1
        );
    }

    #[test]
    fn eos_options() {
        let mut rng = Rng::new(0);
        let mut sc = scorer(Remasking::LowConfidence);
        sc.logits_eos_inf = true;
        let mut row = vec![0.0, 0.0, 0.0, 9.0, 1.0];
        assert_eq!(sc.score(&mut row, &mut rng).token, 4);
        let mut sc = scorer(Remasking::LowConfidence);
        sc.confidence_eos_eot_inf = true;
        let mut row = vec![0.0, 0.0, 0.0, 9.0, 1.0];
        let s = sc.score(&mut row, &mut rng);
        assert_eq!((s.token, s.confidence), (3, 0.0));
    }

    #[test]
    fn margin_and_entropy() {
        let mut rng = Rng::new(0);
        let p = softmax(&[1.0, 2.0, 0.0]);
        let s = scorer(Remasking::Margin).score(&mut [1.0, 2.0, 0.0], &mut rng);
        assert!((s.confidence - (p[1] - p[0])).abs() < 1e-12);
        let s = scorer(Remasking::Entropy).score(&mut [1.0, 2.0, 0.0], &mut rng);
        let e: f64 = p.iter().map(|x| x * (x + 1e-10).ln()).sum();
        assert!((s.confidence - e).abs() < 1e-12 && s.confidence < 0.0);
    }

    #[test]
    fn gumbel_sampling_is_seeded_and_follows_the_distribution() {
        let mut sc = scorer(Remasking::LowConfidence);
        sc.temperature = 1.0;
        let row = [0.0f32, (3.0f32).ln()]; // p = [0.25, 0.75]
        let mut rng = Rng::new(5);
        let n = 20_000;
        let ones = (0..n)
            .filter(|_| sc.score(&mut row.clone(), &mut rng).token == 1)
            .count();
        let frac = ones as f64 / n as f64;
        assert!((frac - 0.75).abs() < 0.02, "{frac}");
        let a: Vec<u32> = {
            let mut r = Rng::new(9);
            (0..50)
                .map(|_| sc.score(&mut row.clone(), &mut r).token)
                .collect()
        };
        let b: Vec<u32> = {
            let mut r = Rng::new(9);
            (0..50)
                .map(|_| sc.score(&mut row.clone(), &mut r).token)
                .collect()
        };
        assert_eq!(a, b);
    }

    #[test]
    fn filters() {
        let mut row = vec![1.0, 3.0, 2.0, 0.0];
        top_k_filter(&mut row, 2);
        assert_eq!(row, vec![f32::NEG_INFINITY, 3.0, 2.0, f32::NEG_INFINITY]);
        // p ~ [0.665, 0.245, 0.09]: top_p 0.5 keeps only the first, 0.8 keeps two.
        let mut row = vec![2.0, 1.0, 0.0];
        top_p_filter(&mut row, 0.5);
        assert_eq!(row[1], f32::NEG_INFINITY);
        let mut row = vec![2.0, 1.0, 0.0];
        top_p_filter(&mut row, 0.8);
        assert_eq!((row[1], row[2]), (1.0, f32::NEG_INFINITY));
    }
}
