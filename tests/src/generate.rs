//! LLaDA's official `generate` (GSAI-ML/LLaDA `generate.py`; REFERENCE §3) as a test oracle.
//!
//! Supported: `temperature = 0` (Gumbel noise is then the identity), `remasking =
//! "low_confidence"` or `"random"` ([`llada_generate_random`]: `torch.rand`'s draw is an input),
//! classifier-free guidance (`cfg_scale >= 0`: the unconditional canvas masks the prompt, and
//! `logits = un + (cfg + 1) * (cond - un)`), no `logits_eos_inf` / `confidence_eos_eot_inf`.
//! Anything else is an error rather than a silently different algorithm.
//!
//! Two points where PyTorch leaves the order unspecified are fixed here:
//! * `argmax` over the vocabulary: the **lowest token id** among equal maxima (what `torch.argmax`
//!   does on CPU in practice);
//! * `topk` over confidences: equal confidences are taken **lowest position first**.
//!
//! Everything else follows the Python line by line, including its corner cases: the masked
//! positions that compete are *all* `[MASK]`s of the canvas (also any inside the prompt), positions
//! after the current block get `-inf`, and `topk` still picks exactly `n[i]` entries even when fewer
//! are finite (the extra picks then write `x0`, which for unmasked positions is the token itself).

use anyhow::{bail, ensure, Result};

use crate::reference::{softmax, Reference};

/// Parameters of [`llada_generate`], named as in `generate.py`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct GenerateParams {
    /// Total denoising steps over all blocks (`steps`).
    pub steps: usize,
    /// Tokens to generate (`gen_length`).
    pub gen_length: usize,
    /// Block size of the semi-autoregressive schedule (`block_length`).
    pub block_length: usize,
    /// Classifier-free guidance scale (`0.0`: off).
    pub cfg_scale: f64,
    /// The `[MASK]` id (`mask_id`).
    pub mask_id: u32,
}

/// The result of [`llada_generate`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Generation {
    /// The full final canvas: prompt followed by `gen_length` tokens.
    pub canvas: Vec<u32>,
    /// Model forwards performed: one full-canvas forward per step (with guidance, the conditional
    /// and unconditional canvases of a step count as one batched forward, as in `generate.py`).
    pub forwards: usize,
}

/// `get_num_transfer_tokens`: how many tokens each of `steps` steps unmasks when `masked` are
/// masked at block start: `masked / steps`, plus one for the first `masked % steps` steps.
pub fn num_transfer_tokens(masked: usize, steps: usize) -> Vec<usize> {
    (0..steps)
        .map(|i| masked / steps + usize::from(i < masked % steps))
        .collect()
}

/// Index of the maximum, lowest index among ties.
pub fn argmax(row: &[f64]) -> usize {
    let mut best = 0;
    for (i, &v) in row.iter().enumerate() {
        if v > row[best] {
            best = i;
        }
    }
    best
}

/// LLaDA `generate` with the [`Reference`] model's predictions as `model(x).logits`.
pub fn llada_generate(
    model: &Reference,
    prompt: &[u32],
    params: &GenerateParams,
) -> Result<Generation> {
    llada_generate_with(|canvas| model.forward(canvas), prompt, params)
}

/// LLaDA `generate` over any logits function: `logits(canvas)` returns one row of `vocab` logits
/// per canvas position (the model's full-canvas forward, already shifted for shifted models).
///
/// Errors (instead of the Python `assert`s) when `gen_length % block_length != 0`, when `steps` is
/// not a multiple of the number of blocks, for empty lengths, and for a negative or non-finite
/// `cfg_scale`.
pub fn llada_generate_with(
    logits: impl FnMut(&[u32]) -> Result<Vec<Vec<f64>>>,
    prompt: &[u32],
    p: &GenerateParams,
) -> Result<Generation> {
    generate_core(logits, prompt, p, &mut |_, _| None)
}

/// LLaDA `generate` with `remasking = "random"`: `x0_p = torch.rand((1, L))` is the input
/// `rand(step, canvas_len)` (one value in `[0, 1)` per canvas position, `step` counting from 0 over
/// the whole run), so a run can be replayed against another implementation's draw.
pub fn llada_generate_random(
    logits: impl FnMut(&[u32]) -> Result<Vec<Vec<f64>>>,
    prompt: &[u32],
    p: &GenerateParams,
    rand: &mut dyn FnMut(usize, usize) -> Vec<f64>,
) -> Result<Generation> {
    generate_core(logits, prompt, p, &mut |step, len| Some(rand(step, len)))
}

/// `(blocks, steps per block)` of the official semi-autoregressive schedule: `gen_length` a
/// positive multiple of `block_length`, `steps` a positive multiple of the block count (the
/// assertions of `generate.py`, shared by the Fast-dLLM oracle).
pub fn block_schedule(
    gen_length: usize,
    block_length: usize,
    steps: usize,
) -> Result<(usize, usize)> {
    ensure!(
        gen_length > 0 && block_length > 0,
        "gen_length and block_length must be positive"
    );
    ensure!(
        gen_length.is_multiple_of(block_length),
        "gen_length {gen_length} is not a multiple of block_length {block_length}"
    );
    let num_blocks = gen_length / block_length;
    ensure!(
        steps > 0 && steps.is_multiple_of(num_blocks),
        "steps {steps} is not a positive multiple of the {num_blocks} blocks"
    );
    Ok((num_blocks, steps / num_blocks))
}

fn generate_core(
    mut logits: impl FnMut(&[u32]) -> Result<Vec<Vec<f64>>>,
    prompt: &[u32],
    p: &GenerateParams,
    random: &mut dyn FnMut(usize, usize) -> Option<Vec<f64>>,
) -> Result<Generation> {
    ensure!(
        p.cfg_scale >= 0.0 && p.cfg_scale.is_finite(),
        "cfg_scale {} must be a finite value >= 0",
        p.cfg_scale
    );
    let (num_blocks, steps) = block_schedule(p.gen_length, p.block_length, p.steps)?;
    let pl = prompt.len();
    let mut x: Vec<u32> = prompt.to_vec();
    x.extend(std::iter::repeat_n(p.mask_id, p.gen_length));
    let mut forwards = 0;
    let mut step = 0;
    for b in 0..num_blocks {
        let (bs, be) = (pl + b * p.block_length, pl + (b + 1) * p.block_length);
        let masked = x[bs..be].iter().filter(|&&t| t == p.mask_id).count();
        let schedule = num_transfer_tokens(masked, steps);
        for &k in &schedule {
            let mask_index: Vec<bool> = x.iter().map(|&t| t == p.mask_id).collect();
            let rows = if p.cfg_scale > 0.0 {
                // un_x = x.clone(); un_x[prompt_index] = mask_id
                let mut un_x = x.clone();
                un_x[..pl].iter_mut().for_each(|t| *t = p.mask_id);
                let cond = logits(&x)?;
                let un = logits(&un_x)?;
                cond.iter()
                    .zip(&un)
                    .map(|(c, u)| {
                        c.iter()
                            .zip(u)
                            .map(|(c, u)| u + (p.cfg_scale + 1.0) * (c - u))
                            .collect()
                    })
                    .collect::<Vec<Vec<f64>>>()
            } else {
                logits(&x)?
            };
            forwards += 1;
            let x0_p = random(step, x.len());
            step += 1;
            if let Some(r) = &x0_p {
                ensure!(
                    r.len() == x.len(),
                    "rand gave {} values for {} positions",
                    r.len(),
                    x.len()
                );
            }
            if rows.len() != x.len() {
                bail!(
                    "logits have {} rows for a canvas of {}",
                    rows.len(),
                    x.len()
                );
            }
            let mut x0 = Vec::with_capacity(x.len());
            let mut confidence = Vec::with_capacity(x.len());
            for (pos, row) in rows.iter().enumerate() {
                let tok = argmax(row);
                let mut conf = match &x0_p {
                    Some(r) => r[pos],
                    None => softmax(row)[tok],
                };
                if pos >= be {
                    conf = f64::NEG_INFINITY;
                }
                if mask_index[pos] {
                    x0.push(tok as u32);
                    confidence.push(conf);
                } else {
                    x0.push(x[pos]);
                    confidence.push(f64::NEG_INFINITY);
                }
            }
            let mut order: Vec<usize> = (0..x.len()).collect();
            // Descending confidence, lower position first among equals (stable sort).
            order.sort_by(|&a, &b| confidence[b].total_cmp(&confidence[a]));
            for &pos in order.iter().take(k) {
                x[pos] = x0[pos];
            }
        }
    }
    Ok(Generation {
        canvas: x,
        forwards,
    })
}
