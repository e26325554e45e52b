//! A generation as a value: [`Generation`] says what its next forward must compute
//! ([`Generation::next`] → an [`Ask`]) and takes the model's answer ([`Generation::absorb`] → a
//! [`StepEvent`]); whoever holds it owns the loop, and can batch, interleave or cancel
//! generations between steps. [`Outcome`] is what a finished (or stopped) generation produced.
//!
//! ```
//! use dllm_decode::prelude::*;
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! # let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../models/tiny-llada");
//! let mut loaded = load(&ModelSource::parse(dir)?, &LoadOptions::default())?;
//! let tok = loaded.tokenizer.clone().ok_or("no tokenizer.json")?;
//! let prompt = tok.encode_prompt("Tom has 23 apples. He buys 5 more. How many apples does Tom have now?", false)?;
//! let mut g = Decoder::new(loaded.decode_params()).start(loaded.model.info(), &prompt)?;
//! while let Some(ask) = g.next()? {
//!     let answer = loaded.model.answer(&ask)?; // or many sequences' asks in one forward_many
//!     let event = g.absorb(answer)?;
//!     assert!(event.forwards > 0);
//! }
//! let out = g.finish();
//! let stop = loaded.model.info().special.stop_ids();
//! assert_eq!(tok.decode(out.answer(&stop), true)?, "23 + 5 = 28. Answer: 28");
//! # Ok(())
//! # }
//! ```

use dllm_models::{Answer, Ask};

use crate::observer::StepEvent;
use crate::Result;

/// Why decoding ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StopReason {
    /// Every position was decoded.
    Completed,
    /// A completed block ended in EOS/EoT; the positions after it were filled with EOS.
    EndOfSequence,
    /// The holder stopped it ([`Generation::stop`], e.g. a step observer); undecoded positions are
    /// still `[MASK]`.
    Observer,
}

/// One model forward of a generation, as the decoder asked for it (the input of latency
/// projections and of the paper's activity plots).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ForwardTrace {
    /// Step index (0-based) the forward belongs to.
    pub step: usize,
    /// First canvas position forwarded.
    pub start: usize,
    /// One past the last.
    pub end: usize,
    /// Logits rows requested (window rows; verification rows are counted in `shadows`).
    pub rows: usize,
    /// Positions in the KV cache the window attended to (0 for a forward from an empty cache).
    pub cached: usize,
    /// Undecided generated positions in the window (its useful work).
    pub active: usize,
    /// Verification (shadow) rows the forward carried, one per verified position.
    pub shadows: usize,
    /// Rows the model computes in this forward: the window's positions (one more, the row
    /// before its start, for a model with shifted logits: Dream predicts a position from the
    /// row before it) plus each shadow's rows (two with shifted logits: the row before the
    /// position and the masked position). What a phone's forward pays for
    /// ([`dllm_models::Ask::rows_count`] per batch item).
    pub computed: usize,
    /// Positions this forward computes beyond the current block because the adaptive lookahead
    /// extended the window (their predictions are drafts).
    pub lookahead: usize,
}

/// A finished (or stopped) generation: the canvas and what it took.
#[derive(Debug, Clone, PartialEq)]
pub struct Outcome {
    /// The whole canvas: prompt then `gen_length` positions.
    pub canvas: Vec<u32>,
    /// Prompt length.
    pub prompt_len: usize,
    /// Model forward calls (a classifier-free-guidance pair counts as one batched call).
    pub forwards: usize,
    /// Denoising steps run (one per forward).
    pub steps: usize,
    /// Decisions made (a position decided again after a remask counts again; excludes EOS
    /// filled in after an early stop).
    pub tokens_decoded: usize,
    /// Sum over forwards of the undecided generated positions in the forward's window (the useful
    /// work of each forward); see [`Outcome::mean_active_per_forward`].
    pub active_positions: usize,
    /// Draft predictions made (undecided positions beyond the current block that a forward scored).
    pub draft_predictions: usize,
    /// Positions that held a draft when their block became current (accepted + rejected).
    pub drafts: usize,
    /// Drafts accepted when their block became current.
    pub drafts_accepted: usize,
    /// Drafts that did not meet the acceptance criterion when their block became current.
    pub drafts_rejected: usize,
    /// The accepted drafts, `(position, token)`, in order.
    pub drafts_taken: Vec<(usize, u32)>,
    /// Visible tokens the oracle replaced (an evaluation instrument).
    pub revised: usize,
    /// Verification rows computed (one per look at a tentative token), summed over forwards.
    pub verified: usize,
    /// Tentative tokens verification sent back to the mask, `(position, token it held)`, in order.
    pub remasked: Vec<(usize, u32)>,
    /// Positions decided again with the token they were remasked from.
    pub flip_flops: usize,
    /// Positions the adaptive lookahead added to windows beyond the current block (drafts),
    /// summed over forwards.
    pub lookahead_positions: usize,
    /// Window rows whose logits were not computed because no decision needed them.
    pub logits_rows_skipped: usize,
    /// Positions still Visible (below the stable threshold) when their block completed.
    pub unstable_at_block_end: usize,
    /// Forwards that showed a guess ([`crate::MbsdParams::show_guess`]; its shadow row is in
    /// the trace's `shadows`, not in `verified`).
    pub guesses_shown: usize,
    /// Shown guesses their shadow confirmed (predicted the guessed token at the final
    /// threshold).
    pub guesses_confirmed: usize,
    /// Shown guesses their shadow predicted below the threshold, taken by guess agreement
    /// ([`crate::MbsdParams::guess_agreement`]).
    pub guesses_agreed: usize,
    /// Shown guesses whose shadow predicted another token below the threshold: with guess
    /// agreement, their steps decided nothing.
    pub guesses_waited: usize,
    /// Every forward, in order.
    pub trace: Vec<ForwardTrace>,
    /// Why decoding ended.
    pub stop: StopReason,
}

impl Outcome {
    /// An empty outcome for a prompt of `prompt_len` tokens.
    pub(crate) fn start(prompt_len: usize) -> Self {
        Self {
            canvas: Vec::new(),
            prompt_len,
            forwards: 0,
            steps: 0,
            tokens_decoded: 0,
            active_positions: 0,
            draft_predictions: 0,
            drafts: 0,
            drafts_accepted: 0,
            drafts_rejected: 0,
            drafts_taken: Vec::new(),
            revised: 0,
            verified: 0,
            remasked: Vec::new(),
            flip_flops: 0,
            lookahead_positions: 0,
            logits_rows_skipped: 0,
            unstable_at_block_end: 0,
            guesses_shown: 0,
            guesses_confirmed: 0,
            guesses_agreed: 0,
            guesses_waited: 0,
            trace: Vec::new(),
            stop: StopReason::Completed,
        }
    }

    /// The generated positions, as produced (EOS included).
    pub fn generated(&self) -> &[u32] {
        &self.canvas[self.prompt_len..]
    }

    /// The generated ids up to (excluding) the first of `stop_ids`.
    pub fn answer(&self, stop_ids: &[u32]) -> &[u32] {
        let g = self.generated();
        let end = g
            .iter()
            .position(|t| stop_ids.contains(t))
            .unwrap_or(g.len());
        &g[..end]
    }

    /// Tokens verification sent back to the mask.
    pub fn remasks(&self) -> usize {
        self.remasked.len()
    }

    /// Mean undecided generated positions per forward window.
    pub fn mean_active_per_forward(&self) -> f64 {
        if self.forwards == 0 {
            0.0
        } else {
            self.active_positions as f64 / self.forwards as f64
        }
    }

    /// Decoded tokens per forward call.
    pub fn tokens_per_forward(&self) -> f64 {
        if self.forwards == 0 {
            0.0
        } else {
            self.tokens_decoded as f64 / self.forwards as f64
        }
    }
}

/// One decoding algorithm as a value (the block loop, Dream's whole-canvas algorithm).
pub(crate) trait Algorithm {
    /// What the next forward must compute; `None` once the generation is done.
    fn next(&mut self) -> Result<Option<Ask>>;
    /// Apply the answer to the last ask; what the step did.
    fn absorb(&mut self, answer: Answer) -> Result<StepEvent<'_>>;
    /// Stop now (the holder's decision).
    fn stop(&mut self);
    /// The outcome so far.
    fn outcome(&self) -> &Outcome;
    /// The outcome, with the canvas.
    fn finish(self: Box<Self>) -> Outcome;
}

/// A generation in progress (see the module docs). Built by [`crate::Decoder::start`].
pub struct Generation<'a> {
    alg: Box<dyn Algorithm + 'a>,
    asked: bool,
}

impl std::fmt::Debug for Generation<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Generation")
            .field("forwards", &self.alg.outcome().forwards)
            .field("asked", &self.asked)
            .finish()
    }
}

impl<'a> Generation<'a> {
    pub(crate) fn new(alg: Box<dyn Algorithm + 'a>) -> Self {
        Self { alg, asked: false }
    }

    /// What the next forward must compute, or `None` when the generation is done. Asking twice
    /// without an answer in between is an error (the first ask is still unanswered).
    // Not an `Iterator`: each ask must be answered (`absorb`) before the next, and asking can fail.
    #[allow(clippy::should_implement_trait)]
    pub fn next(&mut self) -> Result<Option<Ask>> {
        if self.asked {
            return Err(crate::DecodeError::Sequence(
                "next() called again before the last ask was answered (absorb)",
            ));
        }
        let ask = self.alg.next()?;
        self.asked = ask.is_some();
        Ok(ask)
    }

    /// Apply the model's answer to the last ask; returns what the step did (for observers,
    /// streaming and progress).
    pub fn absorb(&mut self, answer: Answer) -> Result<StepEvent<'_>> {
        if !self.asked {
            return Err(crate::DecodeError::Sequence(
                "absorb() called without an outstanding ask (next)",
            ));
        }
        self.asked = false;
        self.alg.absorb(answer)
    }

    /// Stop between steps (undecided positions stay masked; [`Outcome::stop`] says so).
    pub fn stop(&mut self) {
        self.asked = false;
        self.alg.stop();
    }

    /// The counters so far.
    pub fn progress(&self) -> &Outcome {
        self.alg.outcome()
    }

    /// The outcome (call after `next()` returned `None`, or after [`Generation::stop`]).
    pub fn finish(self) -> Outcome {
        self.alg.finish()
    }
}
