//! A forward's answer: what the cache now holds, the scores of the candidates and drafts, the
//! verdicts of the verification rows, the step's decisions, and the event that reports them.

use std::collections::HashMap;

use candle_core::Tensor;
use dllm_models::Answer;

use super::{Blocks, Planned, Report};
use crate::confidence::Scored;
use crate::error::{DecodeError, Result};
use crate::generation::ForwardTrace;
use crate::observer::{final_prefix, StepEvent};
use crate::states::{transition, TokenEvent, TokenState};

/// What a shown guess's shadow decided ([`Blocks::check_guess`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Verdict {
    /// The forward showed no guess.
    NoGuess,
    /// The shadow predicted the guessed token at the final threshold.
    Confirmed,
    /// Guess agreement: the shadow predicted the guessed token below the threshold; the
    /// position takes it and every row counts.
    Agreed(usize),
    /// The step decides up to the guess only, its position by the shadow's prediction.
    Rejected(usize),
    /// Guess agreement: the shadow predicted another token below the threshold; the step
    /// decides nothing.
    Waits(usize),
}

/// Positions a verification looked at, with the shadow's probability of each one's token.
type Looked = Vec<(usize, f64)>;

/// Logits rows as `Vec<f32>` per requested position (batch item 0).
pub(crate) fn rows_of(logits: &Tensor) -> Result<Vec<Vec<f32>>> {
    logits.dims3()?;
    Ok(logits.get(0)?.to_vec2()?)
}

impl Blocks<'_> {
    /// Apply the answer to the planned forward.
    pub(super) fn take_answer(&mut self, answer: Answer) -> Result<()> {
        let pl = self.planned.take().ok_or(DecodeError::Sequence(
            "an answer arrived for no planned forward",
        ))?;
        self.record_forward(&pl);
        let mut rows = self.logit_rows(&answer.logits)?;
        if rows.len() != pl.rows.len() {
            return Err(DecodeError::Sequence(
                "the answer holds another number of logits rows than the ask",
            ));
        }
        let index: HashMap<usize, usize> =
            pl.rows.iter().enumerate().map(|(k, &p)| (p, k)).collect();
        let mut pl = pl;
        let mut scored: Vec<Scored> = Vec::with_capacity(pl.cands.len() + pl.draft_rows.len());
        for pos in pl.cands.iter().chain(&pl.draft_rows) {
            match index.get(pos) {
                Some(&k) => scored.push(self.scorer.score(&mut rows[k], &mut self.rng)),
                // The shown guess has no row of its own: `check_guess` scores its shadow.
                None => scored.push(Scored {
                    token: self.mask(),
                    confidence: f64::NAN,
                }),
            }
        }
        let draft_scores = scored.split_off(pl.cands.len());
        for (&pos, s) in pl.draft_rows.iter().zip(&draft_scores) {
            self.drafts[pos] = Some((*s, self.out.forwards - 1));
        }
        self.out.draft_predictions += pl.draft_rows.len();
        let revised = self.oracle_step();
        self.out.revised += revised.len();
        let verdict = self.check_guess(&mut pl, &mut scored, &answer)?;
        let rejected = match verdict {
            Verdict::Rejected(pos) | Verdict::Waits(pos) => Some(pos),
            Verdict::NoGuess | Verdict::Confirmed | Verdict::Agreed(_) => None,
        };
        let agreed = match verdict {
            Verdict::Agreed(pos) => Some(pos),
            _ => None,
        };
        // A rejected guess was seen by every verification row after it: none of them makes a
        // token final.
        let (remasked, verified) = self.verdicts(&pl, &answer, rejected)?;
        let hold =
            !remasked.is_empty() && self.verifier.as_ref().is_some_and(|v| v.cfg.hold_on_remask);
        let confirmed = pl.shown.filter(|_| rejected.is_none()).map(|(pos, _)| pos);
        self.selector.guess_confirmed(confirmed);
        let (unmasked, confidences) = self.select(&pl, &scored, hold, agreed)?;
        if self.show_guess {
            self.keep_guesses(&pl, &scored, &draft_scores);
        }
        self.out.steps += 1;
        self.step_in_block += 1;
        let mask = self.mask();
        // The predictions this step left undecided, for observers that show them.
        let tentative = pl
            .cands
            .iter()
            .zip(&scored)
            .chain(pl.draft_rows.iter().zip(&draft_scores))
            .filter(|(&pos, _)| self.canvas[pos] == mask)
            .map(|(&pos, s)| (pos, s.token))
            .collect();
        self.report = Report {
            block: self.block,
            window: pl.plan.start..pl.plan.end,
            unmasked,
            confidences,
            revised,
            remasked,
            verified,
            tentative,
            guess: pl.shown.map(|(pos, _)| (pos, rejected.is_none())),
        };
        self.advance()
    }

    /// Counters, trace and what the cache holds after the forward and its commit.
    fn record_forward(&mut self, pl: &Planned) {
        let (start, end) = (pl.plan.start, pl.plan.end);
        let cleared = pl.plan.fresh_cache || self.out.forwards == 0;
        let mask = self.mask();
        let active = (start..end)
            .filter(|&k| k >= self.prompt_len && self.canvas[k] == mask)
            .count();
        let cached = if cleared { 0 } else { self.cache_len };
        self.out.trace.push(ForwardTrace {
            step: self.out.steps,
            start,
            end,
            rows: pl.rows.len(),
            cached,
            active,
            shadows: pl.shadows.len(),
            computed: pl.computed,
            lookahead: pl.lookahead,
        });
        self.out.forwards += 1;
        self.out.active_positions += active;
        self.out.lookahead_positions += pl.lookahead;
        self.out.logits_rows_skipped += (end - start) - pl.rows.len();
        self.out.verified += pl.shadows.len() - usize::from(pl.shown.is_some());
        if cleared {
            self.kv_input.iter_mut().for_each(|k| *k = None);
            self.cache_len = 0;
        }
        if let Some(c) = &pl.commit {
            for k in c.clone() {
                self.kv_input[k] = Some(pl.seen[k]);
            }
            self.cache_len = self.cache_len.max(c.end);
        }
    }

    /// Batch item 0's logits rows; with classifier-free guidance the guided rows
    /// `uncond + (scale + 1) * (cond - uncond)`.
    fn logit_rows(&self, logits: &Tensor) -> Result<Vec<Vec<f32>>> {
        if self.p.cfg_scale > 0.0 {
            let (c, u) = (logits.narrow(0, 0, 1)?, logits.narrow(0, 1, 1)?);
            let guided = (&u + ((c - &u)? * (self.p.cfg_scale as f64 + 1.0))?)?;
            return rows_of(&guided);
        }
        rows_of(logits)
    }

    /// The oracle's revision at a step boundary: Visible tokens that differ from the reference
    /// become the reference (their cached K/V are then stale: the window recomputes them).
    fn oracle_step(&mut self) -> Vec<usize> {
        let Some(reference) = &self.oracle else {
            return Vec::new();
        };
        let mut revised = Vec::new();
        for p in self.prompt_len..self.canvas.len() {
            if self.states[p] != TokenState::Visible {
                continue;
            }
            if let Some(want) = reference.get(p).copied().flatten() {
                if self.canvas[p] != want {
                    self.canvas[p] = want;
                    revised.push(p);
                }
            }
        }
        revised
    }

    /// The verification rows' verdicts: the positions remasked, and every position looked at
    /// with its shadow's probability.
    fn verdicts(
        &mut self,
        pl: &Planned,
        answer: &Answer,
        unsure_from: Option<usize>,
    ) -> Result<(Vec<usize>, Looked)> {
        let Some(v) = self.verifier.as_mut() else {
            return Ok(Default::default());
        };
        if pl.shadows.is_empty() {
            return Ok(Default::default());
        }
        let rows = rows_of(&answer.verify_logits)?;
        if rows.len() != pl.shadows.len() {
            return Err(DecodeError::Sequence(
                "the answer holds another number of verification rows than the ask",
            ));
        }
        // The shown guess's shadow, if any, is the last row: it is not a verification.
        let n = pl.shadows.len() - usize::from(pl.shown.is_some());
        let mask = self.info.special.mask;
        let verdicts = v.judge(
            &pl.shadows[..n],
            &rows[..n],
            &mut self.canvas,
            &mut self.states,
            (mask, self.out.forwards),
            unsure_from,
        )?;
        let remasked: Vec<usize> = verdicts.remasked.iter().map(|r| r.0).collect();
        self.out.remasked.extend(verdicts.remasked);
        Ok((remasked, verdicts.looked))
    }

    /// The shown guess's verdict ([`crate::MbsdParams::show_guess`]): its shadow row (the last
    /// verification row) replaces its own row's score, which only saw the guess. Confirmed — the
    /// shadow predicts the guessed token at the final threshold — every other row counts: the
    /// guess is decided by the selector with them, and they saw it as the token it becomes.
    /// Rejected, the candidates after it saw a wrong or unsure token: the step decides among the
    /// candidates up to the guess only (its position by the shadow's own prediction), and the
    /// forward's drafts are dropped. With guess agreement ([`crate::MbsdParams::guess_agreement`])
    /// a shadow below the threshold that still predicts the guessed token agrees (every row
    /// counts, the position takes the guess), and one that predicts another token decides
    /// nothing: the step waits.
    fn check_guess(
        &mut self,
        pl: &mut Planned,
        scored: &mut Vec<Scored>,
        answer: &Answer,
    ) -> Result<Verdict> {
        let Some((pos, token)) = pl.shown else {
            return Ok(Verdict::NoGuess);
        };
        let n = answer.verify_logits.dims3()?.1;
        let (Some(last), Ok(k)) = (n.checked_sub(1), pl.cands.binary_search(&pos)) else {
            return Err(DecodeError::Sequence(
                "the answer lacks the shown guess's verification row",
            ));
        };
        // Only its row: the other verification rows are the verifier's.
        let mut row: Vec<f32> = answer.verify_logits.get(0)?.get(last)?.to_vec1()?;
        let s = self.scorer.score(&mut row, &mut self.rng);
        scored[k] = s;
        self.out.guesses_shown += 1;
        let sure = s.confidence >= self.final_threshold();
        let verdict = match (s.token == token, sure, self.guess_agreement) {
            (true, true, _) => Verdict::Confirmed,
            (true, false, true) => Verdict::Agreed(pos),
            (false, false, true) => Verdict::Waits(pos),
            _ => Verdict::Rejected(pos),
        };
        // What the step keeps of its candidates: up to the guess when rejected, none before it
        // when waiting (not even the guess's position).
        let keep = match verdict {
            Verdict::NoGuess => return Ok(verdict),
            Verdict::Confirmed => {
                self.out.guesses_confirmed += 1;
                return Ok(verdict);
            }
            Verdict::Agreed(_) => {
                self.out.guesses_agreed += 1;
                return Ok(verdict);
            }
            Verdict::Rejected(_) => k + 1,
            Verdict::Waits(_) => {
                self.out.guesses_waited += 1;
                k
            }
        };
        pl.cands.truncate(keep);
        scored.truncate(keep);
        // The drafts beyond the block saw the rejected guess too: none of them is kept.
        for &p in &pl.draft_rows {
            self.drafts[p] = None;
        }
        pl.draft_rows.clear();
        Ok(verdict)
    }

    /// The confidence at which a decision is final ([`crate::Decide::final_confidence`]; never
    /// reached under the schedule, which has none).
    fn final_threshold(&self) -> f64 {
        (self.p.decide.final_confidence()).map_or(f64::INFINITY, f64::from)
    }

    /// The next forward's guesses: this forward's prediction of every position it left
    /// undecided (the candidates it counted, and the drafts beyond the block).
    fn keep_guesses(&mut self, pl: &Planned, scored: &[Scored], draft_scores: &[Scored]) {
        let mask = self.mask();
        self.guessed.iter_mut().for_each(|g| *g = None);
        let rows = pl
            .cands
            .iter()
            .zip(scored)
            .chain(pl.draft_rows.iter().zip(draft_scores));
        for (&pos, s) in rows {
            if self.canvas[pos] == mask {
                self.guessed[pos] = Some(s.token);
            }
        }
    }

    /// The selector's decisions among the step's candidates.
    fn select(
        &mut self,
        pl: &Planned,
        scored: &[Scored],
        hold: bool,
        agreed: Option<usize>,
    ) -> Result<(Vec<usize>, Vec<f64>)> {
        // An agreed guess counts as decided at the final threshold: its position takes the
        // guess whatever else the step decides.
        let theta = self.final_threshold();
        let conf: Vec<(usize, f64)> = pl
            .cands
            .iter()
            .zip(scored)
            .map(|(&pos, s)| match Some(pos) == agreed {
                true => (pos, s.confidence.max(theta)),
                false => (pos, s.confidence),
            })
            .collect();
        let mut chosen = self.selector.select(&conf, self.step_in_block);
        if hold {
            // Verification rejected a token this forward saw: keep only the most confident.
            chosen.sort_by(|&a, &b| {
                let c = |p: usize| conf.iter().find(|x| x.0 == p).map_or(0.0, |x| x.1);
                c(b).total_cmp(&c(a)).then(a.cmp(&b))
            });
            chosen.truncate(1);
        }
        // A step may decide nothing (LLaDA's schedule with more steps than positions runs such
        // forwards), but a block cannot take more steps than this: every step after the schedule
        // decides something, so only a broken selector gets here.
        let remasks = self.verifier.as_ref().map_or(0, |v| v.cfg.max_remasks);
        let bound = (self.p.steps_per_block().max(self.p.block_length) + 1) * (1 + remasks);
        if chosen.is_empty() && self.step_in_block >= bound && !pl.cands.is_empty() {
            return Err(DecodeError::Policy {
                policy: "selector".into(),
                reason: format!(
                    "block {} made no progress in {} steps ({} positions undecided)",
                    self.block,
                    self.step_in_block + 1,
                    pl.cands.len()
                ),
            });
        }
        let mut confidences = Vec::with_capacity(chosen.len());
        for &pos in &chosen {
            let k = pl
                .cands
                .binary_search(&pos)
                .map_err(|_| DecodeError::Policy {
                    policy: "selector".into(),
                    reason: format!("chose position {pos}, which is not a candidate"),
                })?;
            let s = scored[k];
            self.canvas[pos] = s.token;
            self.states[pos] = self.decided_state(s.confidence)?;
            let suspect = self
                .verifier
                .as_ref()
                .is_some_and(|v| v.cfg.suspect_dependents && pl.unlooked_in_window);
            // Decided beside another decision of this step: each saw the other masked.
            let joint = self
                .verifier
                .as_ref()
                .and_then(|v| v.joint)
                .is_some_and(|r| {
                    s.confidence < f64::from(r.unless_above)
                        && chosen
                            .iter()
                            .any(|&q| q != pos && q.abs_diff(pos) <= r.within)
                });
            // `hold`: it saw a token this forward's verification sent back.
            if (suspect || joint || hold) && self.states[pos] == TokenState::Stable {
                // It may rest on a token nobody has checked: tentative until looked at.
                self.states[pos] = TokenState::Visible;
            }
            let forward = self.out.forwards;
            if let Some(v) = self.verifier.as_mut() {
                v.counted(pos, forward);
                if self.states[pos] == TokenState::Visible {
                    v.decided(pos, s.token, s.confidence);
                }
            }
            confidences.push(s.confidence);
        }
        self.out.tokens_decoded += chosen.len();
        Ok((chosen, confidences))
    }

    /// The state a decision puts a position in: through the state machine under staged
    /// decisions, final at once otherwise.
    fn decided_state(&self, confidence: f64) -> Result<TokenState> {
        let Some(t) = self.thresholds else {
            return Ok(TokenState::Stable);
        };
        let event = if confidence >= t.visible {
            TokenEvent::Predicted(confidence)
        } else {
            TokenEvent::Promoted
        };
        Ok(transition(TokenState::Invisible, event, t)?)
    }

    /// The event of the last step.
    pub(super) fn event(&self) -> StepEvent<'_> {
        let r = &self.report;
        let mask = self.mask();
        StepEvent {
            step: self.out.steps.saturating_sub(1),
            block: r.block,
            num_blocks: self.p.num_blocks(),
            forwards: self.out.forwards,
            canvas: &self.canvas,
            prompt_len: self.prompt_len,
            unmasked: &r.unmasked,
            confidences: &r.confidences,
            revised: &r.revised,
            remasked: &r.remasked,
            verified: &r.verified,
            window: r.window.clone(),
            masked_left: self.canvas[self.prompt_len..]
                .iter()
                .filter(|&&t| t == mask)
                .count(),
            mask_id: mask,
            states: &self.states,
            final_len: final_prefix(&self.states, self.prompt_len),
            tentative: &r.tentative,
            guess: r.guess,
        }
    }
}
