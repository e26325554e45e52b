//! The block algorithm as a value: semi-autoregressive decoding over blocks, with the window policy
//! and the selector as plug-in roles ([`crate::roles`]). LLaDA's reference `generate` (vanilla),
//! Fast-dLLM's prefix and dual cache and multi-block speculative decoding are all this algorithm
//! with different policies; staged decisions add verification ([`crate::verify`]).
//!
//! Per block, the candidates of a step are the still-undecided positions up to the current
//! block's end (LLaDA sets the confidence of later positions and of decided ones to -inf), so only
//! their logits are requested — plus, when the policy asks for them, the undecided positions of
//! the window beyond the block, whose predictions are kept as drafts.
//!
//! The algorithm runs in phases, one file each: [`plan`] (what the next forward computes: the
//! window, its rows, its verification rows, what enters the cache), [`step`] (the answer: scores,
//! drafts, verdicts, selection, the event) and [`advance`] (closing a block, early stop, and the
//! drafts the next block accepts when it becomes current).

mod advance;
mod plan;
mod step;

pub(crate) use step::rows_of;

use std::ops::Range;
use std::sync::Arc;

use dllm_models::{Answer, Ask, ModelInfo};

use crate::confidence::{LladaScorer, Scored};
use crate::generation::{Algorithm, Outcome, StopReason};
use crate::latency::LatencyTable;
use crate::observer::StepEvent;
use crate::params::DecodeParams;
use crate::rng::Rng;
use crate::roles::{Selector, WindowPlan, WindowPolicy};
use crate::states::{Thresholds, TokenState};
use crate::verify::Verifier;
use crate::{DecodeError, Result};

/// What the decoder set up for one generation's block algorithm.
pub(crate) struct Setup<'a> {
    pub params: DecodeParams,
    pub info: ModelInfo,
    pub canvas: Vec<u32>,
    pub prompt_len: usize,
    pub policy: Box<dyn WindowPolicy + 'a>,
    pub selector: Box<dyn Selector + 'a>,
    /// The NPU latency table (prices verification rows).
    pub npu: Arc<LatencyTable>,
    /// Reference ids of the generated positions (the oracle instrument), if any.
    pub oracle: Option<Vec<u32>>,
}

/// The forward the algorithm asked for, kept until its answer arrives.
#[derive(Debug, Clone)]
struct Planned {
    plan: WindowPlan,
    /// Undecided positions the step decides among (inside the window).
    cands: Vec<usize>,
    /// Undecided positions beyond the block whose predictions become drafts.
    draft_rows: Vec<usize>,
    /// Logits rows requested, window positions (cands then drafts, or every window row).
    rows: Vec<usize>,
    /// The canvas the forward saw (decided tokens, and drafts shown as context).
    seen: Vec<u32>,
    /// Positions verified by shadow rows.
    shadows: Vec<usize>,
    /// The range of the window committed into the cache.
    commit: Option<Range<usize>>,
    /// Positions the lookahead added beyond the block.
    lookahead: usize,
    /// Whether the window held a tentative token no forward had looked at yet.
    unlooked_in_window: bool,
    /// The guess written into the forward's canvas, `(position, token)`; its shadow is the
    /// last verification row.
    shown: Option<(usize, u32)>,
    /// Rows the model computes for the ask (per batch item): see [`crate::ForwardTrace::computed`].
    computed: usize,
}

/// The lists of the last step, borrowed by its event.
#[derive(Debug, Clone, Default)]
struct Report {
    block: usize,
    window: Range<usize>,
    unmasked: Vec<usize>,
    confidences: Vec<f64>,
    revised: Vec<usize>,
    remasked: Vec<usize>,
    verified: Vec<(usize, f64)>,
    tentative: Vec<(usize, u32)>,
    guess: Option<(usize, bool)>,
}

/// The block algorithm's state.
pub(crate) struct Blocks<'a> {
    p: DecodeParams,
    info: ModelInfo,
    prompt_len: usize,
    canvas: Vec<u32>,
    states: Vec<TokenState>,
    /// Predictions for undecided positions beyond the current block, with the index of the
    /// forward that made them.
    drafts: Vec<Option<(Scored, usize)>>,
    /// Whether each forward shows a guess ([`crate::MbsdParams::show_guess`]).
    show_guess: bool,
    /// Whether a shown guess's shadow below the threshold agrees or waits
    /// ([`crate::MbsdParams::guess_agreement`], under the threshold rule only).
    guess_agreement: bool,
    /// The last forward's prediction for each position it left undecided (the guesses).
    guessed: Vec<Option<u32>>,
    /// The input each position's cached K/V were computed from (`None`: not cached).
    kv_input: Vec<Option<u32>>,
    /// Rows of the model's cache (the algorithm asks for every change of it).
    cache_len: usize,
    policy: Box<dyn WindowPolicy + 'a>,
    selector: Box<dyn Selector + 'a>,
    thresholds: Option<Thresholds>,
    verifier: Option<Verifier>,
    oracle: Option<Vec<Option<u32>>>,
    scorer: LladaScorer,
    rng: Rng,
    block: usize,
    step_in_block: usize,
    out: Outcome,
    planned: Option<Planned>,
    report: Report,
    done: bool,
}

impl<'a> Blocks<'a> {
    pub(crate) fn new(s: Setup<'a>) -> Result<Self> {
        let p = s.params;
        let special = &s.info.special;
        let (mask, len) = (special.mask, s.canvas.len());
        let scorer = LladaScorer {
            remasking: p.remasking,
            temperature: p.temperature,
            logits_eos_inf: p.logits_eos_inf,
            confidence_eos_eot_inf: p.confidence_eos_eot_inf,
            eos: special.eos,
            eot: special.eot,
            mask,
        };
        let states = (0..len)
            .map(|k| {
                if k < s.prompt_len || s.canvas[k] != mask {
                    TokenState::Stable
                } else {
                    TokenState::Invisible
                }
            })
            .collect();
        let thresholds = s.selector.thresholds();
        let shift = s.info.shift_logits;
        let show_guess = p
            .strategy
            .mbsd()
            .is_some_and(|m| m.shows_guess(shift, p.decide));
        let guess_agreement = show_guess
            && matches!(p.decide, crate::Decide::Threshold(_))
            && p.strategy.mbsd().is_some_and(|m| m.guess_agreement);
        if let Some(m) = p.strategy.mbsd().filter(|m| m.fit_guess == Some(true)) {
            let missing = match (m.fits_bucket(shift), show_guess) {
                (false, _) => Some(
                    "the bucket fit, which is off here (turned off, or a Dream model, where it is \
                     off by default)",
                ),
                (true, false) => Some(
                    "the shown guess, which is off here (turned off, or staged decisions on a \
                     Dream model)",
                ),
                _ => None,
            };
            if let Some(what) = missing {
                return Err(DecodeError::param(
                    "mbsd.fit_guess",
                    format!("fitting the guess's rows in the bucket needs {what}"),
                ));
            }
        }
        let verifier = match (p.decide.staged().and_then(|st| st.verify), thresholds) {
            (Some(v), Some(t)) => Some(Verifier::new(
                v,
                t,
                1 + usize::from(shift),
                s.npu,
                len,
                show_guess,
            )),
            _ => None,
        };
        let oracle = s.oracle.map(|ids| {
            (0..len)
                .map(|k| {
                    k.checked_sub(s.prompt_len)
                        .and_then(|i| ids.get(i).copied())
                })
                .collect()
        });
        let mut b = Self {
            p,
            info: s.info,
            prompt_len: s.prompt_len,
            canvas: s.canvas,
            states,
            drafts: vec![None; len],
            show_guess,
            guess_agreement,
            guessed: vec![None; len],
            kv_input: vec![None; len],
            cache_len: 0,
            policy: s.policy,
            selector: s.selector,
            thresholds,
            verifier,
            oracle,
            scorer,
            rng: Rng::new(p.seed),
            block: 0,
            step_in_block: 0,
            out: Outcome::start(s.prompt_len),
            planned: None,
            report: Report::default(),
            done: false,
        };
        b.open_block()?;
        Ok(b)
    }

    fn mask(&self) -> u32 {
        self.info.special.mask
    }

    fn block_range(&self, b: usize) -> Range<usize> {
        let bl = self.p.block_length;
        self.prompt_len + b * bl..self.prompt_len + (b + 1) * bl
    }

    /// Undecided positions up to the current block's end.
    fn candidates(&self) -> Vec<usize> {
        let end = self.block_range(self.block).end;
        (self.prompt_len..end)
            .filter(|&i| self.canvas[i] == self.mask())
            .collect()
    }
}

impl Algorithm for Blocks<'_> {
    fn next(&mut self) -> Result<Option<Ask>> {
        if self.done {
            return Ok(None);
        }
        self.plan_next()
    }

    fn absorb(&mut self, answer: Answer) -> Result<StepEvent<'_>> {
        self.take_answer(answer)?;
        Ok(self.event())
    }

    fn stop(&mut self) {
        self.out.stop = StopReason::Observer;
        self.planned = None;
        self.done = true;
    }

    fn outcome(&self) -> &Outcome {
        &self.out
    }

    fn finish(self: Box<Self>) -> Outcome {
        let mut out = self.out;
        out.canvas = self.canvas;
        out.flip_flops = self.verifier.as_ref().map_or(0, |v| v.flip_flops);
        out
    }
}
