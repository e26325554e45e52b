//! Semi-autoregressive block decoding: LLaDA's reference `generate` (whole canvas every step) and
//! Fast-dLLM's prefix- and dual-cache variants, with either the step schedule or threshold parallel
//! decoding.
//!
//! Per block, the candidates of a step are the still-masked positions of the current block only
//! (LLaDA sets the confidence of later positions to -inf and of unmasked ones to -inf), so only
//! their logits are requested from the model.

use std::ops::Range;

use candle_core::Tensor;
use dllm_models::{DiffusionLm, Rows};

use crate::confidence::LladaScorer;
use crate::error::Result;
use crate::generation::{Generation, StopReason};
use crate::observer::{Control, StepEvent, StepObserver};
use crate::params::{DecodeParams, Strategy};
use crate::rng::Rng;
use crate::select::{above_threshold, top_n, transfer_counts};

/// Logits rows as `Vec<f32>` per requested position (batch item 0).
pub(crate) fn rows_of(logits: &Tensor) -> Result<Vec<Vec<f32>>> {
    logits.dims3()?;
    Ok(logits.get(0)?.to_vec2()?)
}

pub(crate) fn canvas_tensor(ids: &[u32], model: &dyn DiffusionLm) -> Result<Tensor> {
    Ok(Tensor::from_slice(ids, (1, ids.len()), model.device())?)
}

/// The forward of one step: the window it computes and the logits of `rows`.
fn step_logits(
    model: &mut dyn DiffusionLm,
    p: &DecodeParams,
    canvas: &[u32],
    prompt_len: usize,
    block: Range<usize>,
    first_step_of_block: bool,
    rows: &[usize],
) -> Result<(Range<usize>, Tensor)> {
    let len = canvas.len();
    let t = canvas_tensor(canvas, model)?;
    match p.strategy {
        Strategy::Vanilla if p.cfg_scale > 0.0 => {
            let mask = model.info().special.mask;
            let mut uncond = canvas.to_vec();
            uncond[..prompt_len].iter_mut().for_each(|x| *x = mask);
            let both = Tensor::cat(&[&t, &canvas_tensor(&uncond, model)?], 0)?;
            let l = model.forward_full(&both, Rows::Positions(rows))?;
            let (c, u) = (l.narrow(0, 0, 1)?, l.narrow(0, 1, 1)?);
            let guided = (&u + ((c - &u)? * (p.cfg_scale as f64 + 1.0))?)?;
            Ok((0..len, guided))
        }
        Strategy::Vanilla => Ok((0..len, model.forward_full(&t, Rows::Positions(rows))?)),
        Strategy::PrefixCache | Strategy::DualCache if first_step_of_block => {
            model.clear_cache()?;
            let l = model.forward_full(&t, Rows::Positions(rows))?;
            let keep = if p.strategy == Strategy::PrefixCache {
                0..block.start
            } else {
                0..len
            };
            model.commit(keep)?;
            Ok((0..len, l))
        }
        Strategy::PrefixCache => {
            let w = block.start..len;
            Ok((w.clone(), model.forward(&t, w, Rows::Positions(rows))?))
        }
        Strategy::DualCache => {
            let w = block.clone();
            Ok((w.clone(), model.forward(&t, w, Rows::Positions(rows))?))
        }
    }
}

/// Run block decoding from a prepared canvas (`prompt ++ [MASK] * gen_length`).
pub(crate) fn run(
    model: &mut dyn DiffusionLm,
    mut canvas: Vec<u32>,
    prompt_len: usize,
    p: &DecodeParams,
    observer: &mut dyn StepObserver,
) -> Result<Generation> {
    let special = model.info().special.clone();
    let (mask, stop_ids) = (special.mask, special.stop_ids());
    let scorer = LladaScorer {
        remasking: p.remasking,
        temperature: p.temperature,
        logits_eos_inf: p.logits_eos_inf,
        confidence_eos_eot_inf: p.confidence_eos_eot_inf,
        eos: special.eos,
        eot: special.eot,
    };
    let mut rng = Rng::new(p.seed);
    let (num_blocks, spb) = (p.num_blocks(), p.steps_per_block());
    let mut gen = Generation::start(prompt_len);
    model.clear_cache()?;
    for b in 0..num_blocks {
        let block = prompt_len + b * p.block_length..prompt_len + (b + 1) * p.block_length;
        let masked_in =
            |c: &[u32]| -> Vec<usize> { block.clone().filter(|&i| c[i] == mask).collect() };
        let counts = transfer_counts(masked_in(&canvas).len(), spb);
        let mut i = 0;
        loop {
            let cands = masked_in(&canvas);
            if cands.is_empty() {
                break;
            }
            let (window, logits) =
                step_logits(model, p, &canvas, prompt_len, block.clone(), i == 0, &cands)?;
            gen.forwards += 1;
            let scored: Vec<_> = rows_of(&logits)?
                .iter_mut()
                .map(|row| scorer.score(row, &mut rng))
                .collect();
            let conf: Vec<(usize, f64)> = cands
                .iter()
                .zip(&scored)
                .map(|(&pos, s)| (pos, s.confidence))
                .collect();
            let chosen = match p.threshold {
                Some(t) => above_threshold(&conf, t as f64),
                None => top_n(&conf, counts.get(i).copied().unwrap_or(cands.len())),
            };
            for &pos in &chosen {
                let k = cands.binary_search(&pos).expect("chosen among candidates");
                canvas[pos] = scored[k].token;
            }
            gen.tokens_decoded += chosen.len();
            gen.steps += 1;
            i += 1;
            let event = StepEvent {
                step: gen.steps - 1,
                block: b,
                num_blocks,
                forwards: gen.forwards,
                canvas: &canvas,
                prompt_len,
                unmasked: &chosen,
                window,
                masked_left: canvas[prompt_len..].iter().filter(|&&t| t == mask).count(),
                mask_id: mask,
            };
            if observer.on_step(&event) == Control::Stop {
                gen.stop = StopReason::Observer;
                gen.canvas = canvas;
                return Ok(gen);
            }
        }
        if p.early_stop && b + 1 < num_blocks && stop_ids.contains(&canvas[block.end - 1]) {
            canvas[block.end..]
                .iter_mut()
                .for_each(|t| *t = special.eos);
            gen.stop = StopReason::EndOfSequence;
            break;
        }
    }
    gen.canvas = canvas;
    Ok(gen)
}
