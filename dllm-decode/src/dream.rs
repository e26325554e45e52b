//! Dream's `diffusion_generate` (`generation_utils.py`): the whole canvas is denoised at once over
//! `steps` steps with timesteps `linspace(1, eps, steps + 1)`; at step `i` (from `t` to `s`),
//! `origin` reveals each masked position with probability `1 - s/t`, the other algorithms unmask the
//! `floor(masked * (1 - s/t))` most confident positions (all at the last step), or sample them with
//! `alg_temp`. The logit shift is applied by the model. This is the second implementation of the
//! generation interface ([`crate::Generation`]) beside the block algorithm.

use dllm_models::{Answer, Ask};

use crate::blocks::rows_of;
use crate::confidence::DreamSampler;
use crate::error::{DecodeError, Result};
use crate::generation::{Algorithm, ForwardTrace, Outcome, StopReason};
use crate::observer::{final_prefix, StepEvent};
use crate::params::{DecodeParams, DreamAlg};
use crate::rng::Rng;
use crate::select::{dream_count, dream_timesteps, sample_without_replacement, top_n};
use crate::states::TokenState;

/// Dream's algorithm as a generation value: every step asks for a whole-canvas forward.
pub(crate) struct Dream {
    p: DecodeParams,
    mask: u32,
    sampler: DreamSampler,
    ts: Vec<f64>,
    rng: Rng,
    canvas: Vec<u32>,
    prompt_len: usize,
    out: Outcome,
    /// Masked positions of the asked forward, and the rows it asked for.
    asked: Option<(Vec<usize>, Vec<usize>)>,
    states: Vec<TokenState>,
    chosen: Vec<usize>,
    chosen_conf: Vec<f64>,
    tentative: Vec<(usize, u32)>,
    masked_left: usize,
    done: bool,
}

impl Dream {
    pub(crate) fn new(p: DecodeParams, mask: u32, canvas: Vec<u32>, prompt_len: usize) -> Self {
        let d = p.dream;
        let states = canvas
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
        Self {
            sampler: DreamSampler {
                alg: d.alg,
                temperature: p.temperature,
                top_p: d.top_p,
                top_k: d.top_k,
                mask,
            },
            ts: dream_timesteps(p.steps, d.eps),
            rng: Rng::new(p.seed),
            out: Outcome::start(prompt_len),
            p,
            mask,
            canvas,
            prompt_len,
            asked: None,
            states,
            chosen: Vec::new(),
            chosen_conf: Vec::new(),
            tentative: Vec::new(),
            masked_left: 0,
            done: false,
        }
    }

    /// Unmask this step's positions from the rows of the masked positions; returns the chosen
    /// positions and their confidences, and fills `tentative` with the predictions left undecided.
    fn decide(&mut self, masked: &[usize], mut rows: Vec<Vec<f32>>) -> Vec<usize> {
        let (i, steps) = (self.out.steps, self.p.steps);
        self.chosen_conf.clear();
        self.tentative.clear();
        if self.p.dream.alg == DreamAlg::Origin {
            let p_transfer = if i + 1 < steps {
                1.0 - self.ts[i + 1] / self.ts[i]
            } else {
                1.0
            };
            // All transfer draws first, then the token samples (as `torch.rand` over the masked
            // positions precedes `sample_tokens` in `_sample`), so a seeded run replays the
            // reference's order of random numbers.
            let draws: Vec<f64> = masked.iter().map(|_| self.rng.f64()).collect();
            let mut chosen = Vec::new();
            for (k, &pos) in masked.iter().enumerate() {
                if draws[k] < p_transfer {
                    let s = self.sampler.score(&mut rows[k], &mut self.rng);
                    self.canvas[pos] = s.token;
                    chosen.push(pos);
                    self.chosen_conf.push(s.confidence);
                }
            }
            return chosen;
        }
        let scored: Vec<_> = rows
            .iter_mut()
            .map(|r| self.sampler.score(r, &mut self.rng))
            .collect();
        let conf: Vec<(usize, f64)> = masked
            .iter()
            .zip(&scored)
            .map(|(&pos, s)| (pos, s.confidence))
            .collect();
        let n = dream_count(masked.len(), i, steps, &self.ts).min(masked.len());
        let chosen = match self.p.dream.alg_temp.filter(|&t| t > 0.0) {
            None => top_n(&conf, n),
            Some(t) => sample_without_replacement(&conf, n, t as f64, &mut self.rng),
        };
        for &pos in &chosen {
            if let Ok(k) = masked.binary_search(&pos) {
                self.canvas[pos] = scored[k].token;
                self.chosen_conf.push(scored[k].confidence);
            }
        }
        self.tentative = masked
            .iter()
            .zip(&scored)
            .filter(|(&pos, _)| self.canvas[pos] == self.mask)
            .map(|(&pos, s)| (pos, s.token))
            .collect();
        chosen
    }
}

impl Algorithm for Dream {
    fn next(&mut self) -> Result<Option<Ask>> {
        let len = self.canvas.len();
        let masked: Vec<usize> = (0..len).filter(|&k| self.canvas[k] == self.mask).collect();
        if self.done || self.out.steps >= self.p.steps || masked.is_empty() {
            self.done = true;
            return Ok(None);
        }
        // Logits for the masked positions only (selective logits skipping), or for every
        // position as the reference computes them.
        let rows = if self.p.sls {
            masked.clone()
        } else {
            (0..len).collect()
        };
        let ask = Ask {
            canvas: vec![self.canvas.clone()],
            clear_cache: true,
            window: 0..len,
            rows: rows.clone(),
            verify: Vec::new(),
            verify_hidden: Vec::new(),
            commit: None,
        };
        self.asked = Some((masked, rows));
        Ok(Some(ask))
    }

    fn absorb(&mut self, answer: Answer) -> Result<StepEvent<'_>> {
        let (masked, wanted) = self.asked.take().ok_or(DecodeError::Sequence(
            "an answer arrived for no planned forward",
        ))?;
        let len = self.canvas.len();
        self.out.forwards += 1;
        self.out.active_positions += masked.len();
        self.out.logits_rows_skipped += len - wanted.len();
        self.out.trace.push(ForwardTrace {
            step: self.out.steps,
            start: 0,
            end: len,
            rows: wanted.len(),
            cached: 0,
            active: masked.len(),
            shadows: 0,
            computed: len,
            lookahead: 0,
        });
        let mut rows = rows_of(&answer.logits)?;
        if !self.p.sls {
            rows = masked
                .iter()
                .map(|&k| std::mem::take(&mut rows[k]))
                .collect();
        }
        self.chosen = self.decide(&masked, rows);
        self.out.tokens_decoded += self.chosen.len();
        self.out.steps += 1;
        // Dream's decisions are final at once.
        for &pos in &self.chosen {
            self.states[pos] = TokenState::Stable;
        }
        self.masked_left = masked.len() - self.chosen.len();
        Ok(StepEvent {
            step: self.out.steps - 1,
            block: 0,
            num_blocks: 1,
            forwards: self.out.forwards,
            canvas: &self.canvas,
            prompt_len: self.prompt_len,
            unmasked: &self.chosen,
            confidences: &self.chosen_conf,
            revised: &[],
            remasked: &[],
            verified: &[],
            window: 0..len,
            masked_left: self.masked_left,
            mask_id: self.mask,
            final_len: final_prefix(&self.states, self.prompt_len),
            states: &self.states,
            tentative: &self.tentative,
            guess: None,
        })
    }

    fn stop(&mut self) {
        self.out.stop = StopReason::Observer;
        self.asked = None;
        self.done = true;
    }

    fn outcome(&self) -> &Outcome {
        &self.out
    }

    fn finish(self: Box<Self>) -> Outcome {
        let mut out = self.out;
        out.canvas = self.canvas;
        out
    }
}
