//! Dream's `diffusion_generate` (`generation_utils.py`): the whole canvas is denoised at once over
//! `steps` steps with timesteps `linspace(1, eps, steps + 1)`; at step `i` (from `t` to `s`),
//! `origin` reveals each masked position with probability `1 - s/t`, the other algorithms unmask the
//! `floor(masked * (1 - s/t))` most confident positions (all at the last step), or sample them with
//! `alg_temp`. The logit shift is applied by the model.

use dllm_models::{DiffusionLm, Rows};

use crate::blockwise::{canvas_tensor, rows_of};
use crate::confidence::DreamSampler;
use crate::error::Result;
use crate::generation::{ForwardTrace, Generation, StopReason};
use crate::observer::{final_prefix, Control, StepEvent, StepObserver};
use crate::params::{DecodeParams, DreamAlg};
use crate::rng::Rng;
use crate::select::{dream_count, dream_timesteps, sample_without_replacement, top_n};
use crate::states::TokenState;

/// Run Dream's algorithm from a prepared canvas.
pub(crate) fn run(
    model: &mut dyn DiffusionLm,
    mut canvas: Vec<u32>,
    prompt_len: usize,
    p: &DecodeParams,
    observer: &mut dyn StepObserver,
) -> Result<Generation> {
    let mask = model.info().special.mask;
    let d = p.dream;
    let sampler = DreamSampler {
        alg: d.alg,
        temperature: p.temperature,
        top_p: d.top_p,
        top_k: d.top_k,
        mask,
    };
    let ts = dream_timesteps(p.steps, d.eps);
    let mut rng = Rng::new(p.seed);
    let mut gen = Generation::start(prompt_len);
    model.clear_cache()?;
    let len = canvas.len();
    for i in 0..p.steps {
        let masked: Vec<usize> = (0..len).filter(|&k| canvas[k] == mask).collect();
        if masked.is_empty() {
            break;
        }
        // Logits for the masked positions only (selective logits skipping), or for every
        // position as the reference computes them.
        let all: Vec<usize>;
        let wanted: &[usize] = if p.revision.sls {
            &masked
        } else {
            all = (0..len).collect();
            &all
        };
        let logits =
            model.forward_full(&canvas_tensor(&canvas, model)?, Rows::Positions(wanted))?;
        gen.forwards += 1;
        gen.active_positions += masked.len();
        gen.logits_rows_skipped += len - wanted.len();
        gen.trace.push(ForwardTrace {
            step: i,
            start: 0,
            end: len,
            rows: wanted.len(),
            cached: 0,
            active: masked.len(),
            refreshed: 0,
            rescored: 0,
            lookahead: 0,
        });
        let mut rows = rows_of(&logits)?;
        if !p.revision.sls {
            rows = masked
                .iter()
                .map(|&k| std::mem::take(&mut rows[k]))
                .collect();
        }
        let mut chosen_conf = Vec::new();
        // Predictions of masked positions left undecided (the origin algorithm samples only
        // the positions it reveals, so it has none).
        let mut tentative = Vec::new();
        let chosen: Vec<usize> = if d.alg == DreamAlg::Origin {
            let p_transfer = if i + 1 < p.steps {
                1.0 - ts[i + 1] / ts[i]
            } else {
                1.0
            };
            // All transfer draws first, then the token samples (as `torch.rand` over the masked
            // positions precedes `sample_tokens` in `_sample`), so a seeded run replays the
            // reference's order of random numbers.
            let draws: Vec<f64> = masked.iter().map(|_| rng.f64()).collect();
            let mut chosen = Vec::new();
            for (k, &pos) in masked.iter().enumerate() {
                if draws[k] < p_transfer {
                    let s = sampler.score(&mut rows[k], &mut rng);
                    canvas[pos] = s.token;
                    chosen.push(pos);
                    chosen_conf.push(s.confidence);
                }
            }
            chosen
        } else {
            let scored: Vec<_> = rows
                .iter_mut()
                .map(|r| sampler.score(r, &mut rng))
                .collect();
            let conf: Vec<(usize, f64)> = masked
                .iter()
                .zip(&scored)
                .map(|(&pos, s)| (pos, s.confidence))
                .collect();
            let n = dream_count(masked.len(), i, p.steps, &ts).min(masked.len());
            let chosen = match d.alg_temp.filter(|&t| t > 0.0) {
                None => top_n(&conf, n),
                Some(t) => sample_without_replacement(&conf, n, t as f64, &mut rng),
            };
            for &pos in &chosen {
                let k = masked.binary_search(&pos).expect("chosen among masked");
                canvas[pos] = scored[k].token;
                chosen_conf.push(scored[k].confidence);
            }
            tentative = masked
                .iter()
                .zip(&scored)
                .filter(|(&pos, _)| canvas[pos] == mask)
                .map(|(&pos, s)| (pos, s.token))
                .collect();
            chosen
        };
        gen.tokens_decoded += chosen.len();
        gen.steps += 1;
        // Dream's decisions are final at once.
        let states: Vec<TokenState> = canvas
            .iter()
            .enumerate()
            .map(|(k, &t)| {
                if k < prompt_len || t != mask {
                    TokenState::Stable
                } else {
                    TokenState::Invisible
                }
            })
            .collect();
        let event = StepEvent {
            step: i,
            block: 0,
            num_blocks: 1,
            forwards: gen.forwards,
            canvas: &canvas,
            prompt_len,
            unmasked: &chosen,
            confidences: &chosen_conf,
            revised: &[],
            window: 0..len,
            masked_left: masked.len() - chosen.len(),
            mask_id: mask,
            final_len: final_prefix(&states, prompt_len),
            states: &states,
            tentative: &tentative,
        };
        if observer.on_step(&event) == Control::Stop {
            gen.stop = StopReason::Observer;
            break;
        }
    }
    gen.canvas = canvas;
    Ok(gen)
}
