//! Verification before final (the decision half): which tentative tokens a window forward
//! verifies with shadow rows, and what a shadow's verdict does.
//!
//! A token decided on incomplete context — below the stable threshold, or accepted from a
//! lookahead draft — is **tentative**: Visible (context for later forwards) but not final. A
//! later window forward carries a *shadow row* for it (input MASK at its position, attending to
//! the cache and to the forward's rows except its own; see `dllm_models::Ask::verify`): the
//! model's prediction for the position with everything around it as it now stands. The verdict,
//! on the shadow's probability `p` of the current token:
//! * `p >= theta_stable`: the token becomes Stable (final);
//! * `p < tau_back`: the token goes back to the mask (never replaced by another token: the next
//!   step decides the position again, with the window's fresh context) — within the guards below;
//! * otherwise it stays Visible; it has had its fresh look, and is looked at again as rows allow.
//!
//! Guards: of the decisions a forward's answer made, verification sends back at most all but one
//! (every step keeps at least one decision: the generation always progresses), a position is
//! remasked at most `max_remasks` times, and a position remasked and then decided again with the
//! same token counts as a flip-flop.
//!
//! Shadows are placed lowest confidence first, tokens without a fresh look before the others, in
//! the rows the window's latency bucket leaves free and beyond them while the latency table says
//! the extra rows cost at most `allowance` of the forward; the window does not look ahead while a
//! token waits for its first look (the shadows have priority over new drafts).

use std::collections::HashMap;
use std::sync::Arc;

use crate::confidence::softmax;
use crate::latency::LatencyTable;
use crate::params::Verify;
use crate::states::{transition, Thresholds, TokenEvent, TokenState};
use crate::Result;

/// What verification did in one step.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct Verdicts {
    /// Positions sent back to the mask, with the token they held.
    pub remasked: Vec<(usize, u32)>,
    /// Positions that became Stable.
    pub stabilized: Vec<usize>,
    /// Positions looked at (every shadow), with the shadow's probability of the token.
    pub looked: Vec<(usize, f64)>,
}

/// The verification state of one generation.
#[derive(Debug, Clone)]
pub(crate) struct Verifier {
    pub cfg: Verify,
    /// The staged thresholds.
    pub thresholds: Thresholds,
    /// Rows per shadow (2 for a model with shifted logits).
    pub group_rows: usize,
    pub npu: Arc<LatencyTable>,
    /// Per position: remasks so far.
    remasks: Vec<usize>,
    /// Per position: the token it held when last remasked.
    remasked_token: Vec<Option<u32>>,
    /// Per position: a decision that has not had its fresh look yet.
    unlooked: Vec<bool>,
    /// Per position: last known confidence (the priority of a shadow).
    conf: Vec<f64>,
    /// Per position: the forward whose answer made its current decision.
    origin: Vec<usize>,
    /// Per forward: its decisions still standing (decided, not sent back).
    standing: HashMap<usize, usize>,
    /// Flip-flops: positions decided again with the token they were remasked from.
    pub flip_flops: usize,
    /// The joint check for this model (resolved from `cfg.joint`).
    pub joint: Option<crate::params::JointRule>,
}

impl Verifier {
    pub fn new(
        cfg: Verify,
        thresholds: Thresholds,
        group_rows: usize,
        npu: Arc<LatencyTable>,
        len: usize,
        shows_guess: bool,
    ) -> Self {
        Self {
            cfg,
            thresholds,
            group_rows,
            npu,
            remasks: vec![0; len],
            remasked_token: vec![None; len],
            unlooked: vec![false; len],
            conf: vec![1.0; len],
            origin: vec![0; len],
            standing: HashMap::new(),
            flip_flops: 0,
            // Two rows per shadow: the model shifts its logits (Dream).
            joint: cfg.joint.resolve(group_rows > 1, shows_guess),
        }
    }

    /// A position was decided by the answer to forward `forward` (Stable or Visible: every
    /// decision counts towards what that step keeps).
    pub fn counted(&mut self, pos: usize, forward: usize) {
        self.origin[pos] = forward;
        *self.standing.entry(forward).or_insert(0) += 1;
    }

    /// A position was decided Visible with `token` at `confidence` (tentative, awaiting a look).
    pub fn decided(&mut self, pos: usize, token: u32, confidence: f64) {
        self.unlooked[pos] = true;
        self.conf[pos] = confidence;
        if self.remasked_token[pos] == Some(token) {
            self.flip_flops += 1;
        }
    }

    /// Whether `p` is tentative and waits for its first fresh look.
    pub fn is_unlooked(&self, p: usize, states: &[TokenState]) -> bool {
        states[p] == TokenState::Visible && self.unlooked[p]
    }

    /// Tentative positions still waiting for their first fresh look.
    pub fn waiting(&self, states: &[TokenState]) -> usize {
        self.tentative(states).filter(|&p| self.unlooked[p]).count()
    }

    fn tentative<'a>(&'a self, states: &'a [TokenState]) -> impl Iterator<Item = usize> + 'a {
        (0..states.len()).filter(move |&p| states[p] == TokenState::Visible)
    }

    /// The shadows of a forward of `window` rows (`rows` logits rows, `cached` cache rows):
    /// tentative positions, unlooked first, lowest confidence first, as many as the latency table
    /// prices within the bucket's free rows plus `allowance`; all of them with `all`.
    pub fn shadows(
        &self,
        states: &[TokenState],
        (window, rows, cached): (usize, usize, usize),
        all: bool,
    ) -> Vec<usize> {
        let mut cands: Vec<usize> = self.tentative(states).collect();
        cands.sort_by(|&a, &b| {
            self.unlooked[b]
                .cmp(&self.unlooked[a])
                .then(self.conf[a].total_cmp(&self.conf[b]))
                .then(a.cmp(&b))
        });
        if !all {
            let base = self.npu.cost_ms(window, rows, cached);
            let allowed = base * self.cfg.allowance;
            let mut n = 0;
            while n < cands.len() {
                let extra = (n + 1) * self.group_rows;
                let cost = self.npu.cost_ms(window + extra, rows + n + 1, cached) - base;
                if cost > allowed + 1e-9 {
                    break;
                }
                n += 1;
            }
            cands.truncate(n);
        }
        cands.sort_unstable();
        cands
    }

    /// Apply the shadows' verdicts: `rows[i]` are the logits of the shadow of `looked[i]`.
    /// Remasked positions hold `mask` after; the lowest probabilities go back first, as long as
    /// the step that decided each keeps one decision.
    pub fn judge(
        &mut self,
        looked: &[usize],
        rows: &[Vec<f32>],
        canvas: &mut [u32],
        states: &mut [TokenState],
        mask: u32,
    ) -> Result<Verdicts> {
        let mut v = Verdicts::default();
        let mut low = Vec::new();
        for (&pos, row) in looked.iter().zip(rows) {
            let p = softmax(row)
                .get(canvas[pos] as usize)
                .copied()
                .unwrap_or(0.0);
            self.unlooked[pos] = false;
            self.conf[pos] = p;
            v.looked.push((pos, p));
            states[pos] = transition(states[pos], TokenEvent::Rescored(p), self.thresholds)?;
            if states[pos] == TokenState::Stable {
                v.stabilized.push(pos);
            } else if p < self.cfg.tau_back as f64 && self.remasks[pos] < self.cfg.max_remasks {
                low.push((pos, p));
            }
        }
        low.sort_by(|a, b| a.1.total_cmp(&b.1).then(a.0.cmp(&b.0)));
        for &(pos, _) in &low {
            let kept = self.standing.entry(self.origin[pos]).or_insert(0);
            if *kept <= 1 {
                continue;
            }
            *kept -= 1;
            self.remasks[pos] += 1;
            self.remasked_token[pos] = Some(canvas[pos]);
            v.remasked.push((pos, canvas[pos]));
            canvas[pos] = mask;
            states[pos] = transition(states[pos], TokenEvent::Remasked, self.thresholds)?;
        }
        v.remasked.sort_unstable();
        Ok(v)
    }
}
