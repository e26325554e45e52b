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
//! A shadow sees the forward's other rows, tentative tokens included, so two tentative tokens
//! can vouch for each other (a result digit and the next line's copy of it). A forward whose
//! verification sends a token back (with `hold_on_remask`) therefore makes nothing final: its
//! other shadows saw the token that went back and are looked at again by the next forward, and
//! the one decision it takes is tentative; nor does a shadow after a shown guess that its own
//! shadow rejected make anything final.
//!
//! A shadow sees the forward's rows, so two tentative tokens can also agree on a wrong value (a
//! result and the next line's copy of it, both decided in one step, each confirming the other).
//! A look at a token therefore leaves out its *partners* (`dllm_models::Ask::verify_hidden`):
//! the tentative tokens after it, at most `partners_within` positions away, that were decided in
//! the same step as it or later (they may rest on it: a copy of a result comes after it). It
//! still sees the tentative tokens before it — its operands: hiding them too (the first version of
//! the rule) made a look at a right result miss its operand and send it back, 1734 remasks
//! instead of 1144 on six question sets, for no answer.
//!
//! Guards: of the decisions the last step made, verification sends back at most all but one
//! (every step keeps at least one decision: the generation always progresses); a token the guard
//! keeps is looked at again first (nothing waits for it), and that look sends it back if it
//! still disagrees. A position is
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
    /// Per position: kept by the guard against its look's verdict (looked at again first, but
    /// nothing waits for it).
    again: Vec<bool>,
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
            again: vec![false; len],
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
        self.again[pos] = false;
        self.conf[pos] = confidence;
        if self.remasked_token[pos] == Some(token) {
            self.flip_flops += 1;
        }
    }

    /// The partners a look at `p` leaves out (see the module docs): tentative positions after
    /// `p`, at most `partners_within` away, decided in the same step as `p` or later, that the
    /// forward can hide (`visible`: cached or in its window).
    pub fn partners(
        &self,
        p: usize,
        states: &[TokenState],
        visible: impl Fn(usize) -> bool,
    ) -> Vec<usize> {
        let d = self.cfg.partners_within;
        let hi = (p + d + 1).min(states.len());
        (p + 1..hi)
            .filter(|&q| states[q] == TokenState::Visible && self.origin[q] >= self.origin[p])
            .filter(|&q| visible(q))
            .collect()
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
    /// prices within the bucket's free rows plus `allowance` — each shadow's rows and the
    /// `partners(p)` rows of the positions it hides; all of them with `all`.
    pub fn shadows(
        &self,
        states: &[TokenState],
        (window, rows, cached): (usize, usize, usize),
        all: bool,
        partners: &dyn Fn(usize) -> usize,
    ) -> Vec<usize> {
        let mut cands: Vec<usize> = self.tentative(states).collect();
        cands.sort_by(|&a, &b| {
            let first = |p: usize| self.unlooked[p] || self.again[p];
            first(b)
                .cmp(&first(a))
                .then(self.conf[a].total_cmp(&self.conf[b]))
                .then(a.cmp(&b))
        });
        if !all {
            let base = self.npu.cost_ms(window, rows, cached);
            let allowed = base * self.cfg.allowance;
            let (mut n, mut extra) = (0, 0);
            while n < cands.len() {
                extra += self.group_rows + partners(cands[n]);
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

    /// Apply the shadows' verdicts: `rows[i]` are the logits of the shadow of `looked[i]`, in the
    /// forward after `now - 1` others (the last step's decisions were made by forward `now - 1`).
    /// Remasked positions hold `mask` after; the lowest probabilities go back first, as long as
    /// the last step keeps one of its decisions (a token kept by that guard is looked at again
    /// first; nothing waits for that look). No position at or after `unsure_from` (a
    /// rejected guess's position: the shadows saw it) becomes Stable, and none at all when a token goes back
    /// and `hold_on_remask` is set; those stay tentative, waiting for their fresh look.
    pub fn judge(
        &mut self,
        looked: &[usize],
        rows: &[Vec<f32>],
        canvas: &mut [u32],
        states: &mut [TokenState],
        (mask, now): (u32, usize),
        unsure_from: Option<usize>,
    ) -> Result<Verdicts> {
        let mut v = Verdicts::default();
        let mut low = Vec::new();
        let mut next = Vec::with_capacity(looked.len());
        for (&pos, row) in looked.iter().zip(rows) {
            let p = softmax(row)
                .get(canvas[pos] as usize)
                .copied()
                .unwrap_or(0.0);
            self.conf[pos] = p;
            v.looked.push((pos, p));
            let n = transition(states[pos], TokenEvent::Rescored(p), self.thresholds)?;
            if n != TokenState::Stable
                && p < self.cfg.tau_back as f64
                && self.remasks[pos] < self.cfg.max_remasks
            {
                low.push((pos, p));
            }
            next.push((pos, n));
        }
        low.sort_by(|a, b| a.1.total_cmp(&b.1).then(a.0.cmp(&b.0)));
        let (mut back, mut kept_back) = (Vec::new(), Vec::new());
        for &(pos, _) in &low {
            let origin = self.origin[pos];
            let kept = self.standing.entry(origin).or_insert(0);
            if *kept <= 1 && origin + 1 >= now {
                kept_back.push(pos);
                continue;
            }
            *kept = kept.saturating_sub(1);
            back.push(pos);
        }
        let held = !back.is_empty() && self.cfg.hold_on_remask;
        for (pos, n) in next {
            if n == TokenState::Stable && (held || unsure_from.is_some_and(|g| pos >= g)) {
                // Its shadow saw a token sent back (or a rejected guess): not a fresh look.
                continue;
            }
            self.unlooked[pos] = false;
            self.again[pos] = false;
            states[pos] = n;
            if n == TokenState::Stable {
                v.stabilized.push(pos);
            }
        }
        // The guard kept it, not the verdict: it is looked at again first.
        for pos in kept_back {
            self.again[pos] = true;
        }
        for pos in back {
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

#[cfg(test)]
mod tests {
    use super::*;

    const MASK: u32 = 9;

    /// A verifier with positions 2, 4 and 6 decided Visible by forward 0 (tokens 1, 2, 3) in an
    /// 8-position canvas.
    struct Fixture {
        v: Verifier,
        canvas: Vec<u32>,
        states: Vec<TokenState>,
    }

    impl Fixture {
        fn new(hold: bool) -> Self {
            let cfg = Verify {
                hold_on_remask: hold,
                ..Verify::default()
            };
            let th = Thresholds {
                visible: 0.7,
                stable: 0.9,
            };
            let npu = Arc::new(crate::latency::sm8750_npu());
            let mut v = Verifier::new(cfg, th, 1, npu, 8, false);
            let mut canvas = vec![MASK; 8];
            let mut states = vec![TokenState::Invisible; 8];
            for (pos, tok) in [(2, 1), (4, 2), (6, 3)] {
                canvas[pos] = tok;
                states[pos] = TokenState::Visible;
                v.counted(pos, 0);
                v.decided(pos, tok, 0.8);
            }
            Fixture { v, canvas, states }
        }

        fn judge(
            &mut self,
            looked: &[usize],
            rows: &[Vec<f32>],
            unsure_from: Option<usize>,
        ) -> Verdicts {
            let (c, s) = (&mut self.canvas, &mut self.states);
            self.v
                .judge(looked, rows, c, s, (MASK, 1), unsure_from)
                .unwrap()
        }

        fn unlooked(&self, p: usize) -> bool {
            self.v.is_unlooked(p, &self.states)
        }
    }

    /// A logits row (vocabulary 10) giving `tok` probability `p`, the rest spread evenly.
    fn row(tok: u32, p: f64) -> Vec<f32> {
        let rest = (1.0 - p) / 9.0;
        (0..10)
            .map(|t| if t == tok { p.ln() } else { rest.ln() } as f32)
            .collect()
    }

    #[test]
    fn a_forward_that_sends_a_token_back_makes_nothing_final() {
        // Position 2's shadow rejects its token; 4's and 6's would confirm theirs, but they saw
        // position 2's token as context.
        let rows = [row(1, 0.01), row(2, 0.99), row(3, 0.99)];
        let mut f = Fixture::new(true);
        let d = f.judge(&[2, 4, 6], &rows, None);
        assert_eq!(d.remasked, vec![(2, 1)]);
        assert!(d.stabilized.is_empty());
        assert_eq!(f.canvas[2], MASK);
        assert_eq!(f.states[4], TokenState::Visible);
        assert!(f.unlooked(4) && f.unlooked(6));
        assert_eq!(d.looked.len(), 3);
        // The next forward's shadows, with position 2 undecided, do make them final.
        let d = f.judge(&[4, 6], &rows[1..], None);
        assert_eq!(d.stabilized, vec![4, 6]);
        assert_eq!(f.states[6], TokenState::Stable);

        // Without the hold, the same verdicts make 4 and 6 final at once.
        let mut f = Fixture::new(false);
        let d = f.judge(&[2, 4, 6], &rows, None);
        assert_eq!(d.remasked, vec![(2, 1)]);
        assert_eq!(d.stabilized, vec![4, 6]);
    }

    #[test]
    fn shadows_after_a_rejected_guess_make_nothing_final() {
        let rows = [row(1, 0.99), row(2, 0.99), row(3, 0.99)];
        let mut f = Fixture::new(true);
        // A guess at position 3 was rejected: 4 and 6 saw it.
        let d = f.judge(&[2, 4, 6], &rows, Some(3));
        assert_eq!(d.stabilized, vec![2]);
        assert!(d.remasked.is_empty());
        assert_eq!(f.states[2], TokenState::Stable);
        assert_eq!(f.states[4], TokenState::Visible);
        assert!(f.unlooked(6));
        // Low verdicts after the guess still send a token back.
        let d = f.judge(&[4, 6], &[row(2, 0.01), row(3, 0.99)], Some(3));
        assert_eq!(d.remasked, vec![(4, 2)]);
        assert_eq!(f.states[6], TokenState::Visible);
    }

    #[test]
    fn the_guard_keeps_one_decision_of_the_last_step_only_and_looks_again() {
        let mut f = Fixture::new(true);
        // Forward 0 decided 2, 4 and 6; the next forward's shadows reject all three: two go back,
        // the step keeps one (its most confident), which is looked at again first (nothing
        // waits for it: it is not unlooked).
        let d = f.judge(
            &[2, 4, 6],
            &[row(1, 0.01), row(2, 0.02), row(3, 0.03)],
            None,
        );
        assert_eq!(d.remasked, vec![(2, 1), (4, 2)]);
        assert_eq!(f.states[6], TokenState::Visible);
        assert!(f.v.again[6] && !f.unlooked(6));
        // A later forward's look sends it back: the guard protects only the last step.
        let (c, s) = (&mut f.canvas, &mut f.states);
        let d =
            f.v.judge(&[6], &[row(3, 0.03)], c, s, (MASK, 3), None)
                .unwrap();
        assert_eq!(d.remasked, vec![(6, 3)]);
        assert_eq!(f.canvas[6], MASK);
    }

    #[test]
    fn a_look_leaves_out_the_tentative_tokens_after_it_decided_with_or_after_it() {
        let mut f = Fixture::new(true);
        // Forward 1 decided position 7 (after 2, 4 and 6 by forward 0).
        f.canvas[7] = 4;
        f.states[7] = TokenState::Visible;
        f.v.counted(7, 1);
        let all = |_| true;
        // 2's look: 4 and 6 (same step) and 7 (later) within 8; never a token before the one
        // looked at (its operands), so 6 hides only 7, and 7 nothing.
        assert_eq!(f.v.partners(2, &f.states, all), vec![4, 6, 7]);
        assert_eq!(f.v.partners(4, &f.states, all), vec![6, 7]);
        assert_eq!(f.v.partners(6, &f.states, all), vec![7]);
        assert!(f.v.partners(7, &f.states, all).is_empty());
        // Only positions the forward can hide.
        assert_eq!(f.v.partners(2, &f.states, |q| q != 6), vec![4, 7]);
        // A token decided before it is not a partner: 7's forward came after 2's, not before.
        f.v.origin[2] = 1;
        assert_eq!(f.v.partners(2, &f.states, all), vec![7]);
        f.v.origin[2] = 0;
        // Within the distance only; 0 turns it off.
        f.v.cfg.partners_within = 2;
        assert_eq!(f.v.partners(4, &f.states, all), vec![6]);
        assert_eq!(f.v.partners(2, &f.states, all), vec![4]);
        f.v.cfg.partners_within = 0;
        assert!(f.v.partners(2, &f.states, all).is_empty());
    }

    #[test]
    fn the_rows_of_hidden_partners_are_priced_with_their_shadow() {
        let f = Fixture::new(true);
        // A window of 29 rows leaves 3 free rows in the 32-row bucket: three shadows fit...
        let none = f.v.shadows(&f.states, (29, 8, 64), false, &|_| 0);
        assert_eq!(none, vec![2, 4, 6]);
        // ... but not when each also hides two partners (three rows a shadow).
        let two = f.v.shadows(&f.states, (29, 8, 64), false, &|_| 2);
        assert!(two.len() < 3, "{two:?}");
        // With `all` nothing is priced.
        assert_eq!(
            f.v.shadows(&f.states, (29, 8, 64), true, &|_| 2),
            vec![2, 4, 6]
        );
    }
}
