//! The decision rule of a generation: which positions a step decides ([`Decide`]), staged
//! decisions ([`Staged`]) and verification before final ([`Verify`]), with their defaults.
//! Re-exported by `params`, which holds them in [`crate::params::DecodeParams`].

use crate::error::{DecodeError, Result};
use crate::joint::Joint;

/// Staged decisions: the confidence at which a prediction becomes visible (tentative) context.
/// Chosen on the tuning and confirmation sets together (700 long-math questions, see the
/// README's *Default decoding*): the most accurate mbsd configuration faster (projected) than
/// dual-cache with threshold 0.9; judged on the fresh set, then on fresh2 and, with the left wait,
/// on fresh3, which nothing read before (99.8% there, vanilla 99.3%, threshold 0.9 97.2%). With
/// the shown guess (`MbsdParams::show_guess`, LLaDA) θ_visible changed no answer where it was
/// measured (θ 0.7, 0.8 and 0.85 / 0.9 gave the same answers on six sets, `examples/bench/defaults.md`).
pub const DEFAULT_THETA_VISIBLE: f32 = 0.9;
/// Staged decisions: the confidence at which a token becomes final. 0.9 since the near wait
/// ([`DEFAULT_NEAR_WAIT`]) holds back the decisions between 0.9 and 0.975 whose left neighbours
/// were undecided (chosen with it on the tuning and confirmation sets, judged on fresh6; before it
/// 0.95).
pub const DEFAULT_THETA_STABLE: f32 = 0.9;
/// Verification: a tentative token whose shadow row gives it less than this probability goes
/// back to the mask.
pub const DEFAULT_TAU_BACK: f32 = 0.95;
/// Staged decisions: keep decisions below the stable threshold apart (never two adjacent in one
/// step).
pub const DEFAULT_NO_ADJACENT: bool = true;
/// Staged decisions: a candidate below the stable threshold waits while an undecided position lies
/// at most this many positions before it (see [`Staged::wait_left`]).
pub const DEFAULT_WAIT_LEFT: usize = 8;
/// Staged decisions: the near wait (see [`NearWait`]): below 0.975, a candidate waits while an
/// undecided position lies at most 8 positions before it (chosen with the span,
/// [`crate::MbsdParams::default_span`]; 2 before it). Without the span, in blocks of 32, it
/// took tiny-llada-long's tuning + confirmation sets to 699 of 700 in 9.24 forwards per answer
/// (2 positions: 699 in 9.04; the span: 698 in 8.39).
pub const DEFAULT_NEAR_WAIT: NearWait = NearWait {
    within: 8,
    below: 0.975,
};
/// Verification: a position is remasked at most this many times.
pub const DEFAULT_MAX_REMASKS: usize = 2;
/// Verification: shadow rows beyond the free rows of the window's latency bucket may add at most
/// this fraction of the forward's own latency (per the latency table).
pub const DEFAULT_SHADOW_ALLOWANCE: f64 = 0.1;
/// Verification: a look at a token leaves out the tentative tokens after it, at most this many
/// positions away, decided in the same step or later (0: it sees them).
pub const DEFAULT_PARTNERS_WITHIN: usize = 8;

/// Which positions a step decides, and whether decisions are final at once.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Decide {
    /// LLaDA's schedule: `steps / num_blocks` steps per block, each unmasking its share of the
    /// block's positions, most confident first. Decisions are final.
    Schedule,
    /// Fast-dLLM's threshold rule: every undecided position of the block at this confidence or
    /// above (at least one per step). Decisions are final.
    Threshold(f32),
    /// Staged decisions (paper §3.3) with verification: see [`Staged`]. Needs
    /// [`Strategy::Mbsd`](crate::params::Strategy::Mbsd), whose window keeps the cache current.
    Staged(Staged),
}

impl Decide {
    /// The threshold of [`Decide::Threshold`].
    pub fn threshold(self) -> Option<f32> {
        match self {
            Decide::Threshold(t) => Some(t),
            _ => None,
        }
    }

    /// The confidence at which a decision is final: the threshold, or the stable threshold of
    /// staged decisions (`None` for the schedule, whose decisions have no threshold).
    pub fn final_confidence(self) -> Option<f32> {
        match self {
            Decide::Schedule => None,
            Decide::Threshold(t) => Some(t),
            Decide::Staged(s) => Some(s.stable),
        }
    }

    /// The parameters of [`Decide::Staged`].
    pub fn staged(self) -> Option<Staged> {
        match self {
            Decide::Staged(s) => Some(s),
            _ => None,
        }
    }
}

/// Staged decisions: a prediction at `visible` or above (or the most confident one of a step)
/// becomes a Visible token — context for later forwards, not final — and one at `stable` or above
/// a Stable (final) one. Lookahead drafts always enter Visible. With `verify`, every Visible token
/// is tentative until a later forward has looked at it with fresh context (see [`Verify`]).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Staged {
    /// Confidence at which a prediction becomes Visible.
    pub visible: f32,
    /// Confidence at which a token becomes Stable.
    pub stable: f32,
    /// Below `stable`, never decide two adjacent positions in the same step (two neighbours
    /// decided together each predicted the other as a mask).
    pub no_adjacent: bool,
    /// Below `stable`, a candidate waits while an undecided position of its block lies at most
    /// this many positions before it (0: never): it was predicted without its left context, and
    /// the step's fallback decision is the most confident candidate that does not wait.
    pub wait_left: usize,
    /// The near wait, at any threshold (`None`: off; see [`NearWait`]).
    pub near_wait: Option<NearWait>,
    /// Verification of tentative tokens (`None`: Visible tokens are never looked at again).
    pub verify: Option<Verify>,
}

/// The near wait: a candidate below `below` confidence — final threshold or not — waits while
/// an undecided position lies at most `within` positions before it (the shown guess its forward
/// confirmed is decided context, not undecided). A line's result digit decided in the forward
/// that also decides its operands was predicted with them masked; such decisions, 0.96 to 0.99
/// confident and above the stable threshold, were about half of the default's wrong answers
/// before the near wait (`examples/bench/defaults.md`, *What the default still gets wrong*). The left wait
/// ([`Staged::wait_left`]) does the same for decisions below the stable threshold and further
/// away.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct NearWait {
    /// Positions before the candidate that must be decided (at least 1).
    pub within: usize,
    /// Confidence at which a candidate no longer waits, in (0, 1].
    pub below: f32,
}

impl NearWait {
    pub(crate) fn check(self) -> Result<()> {
        let p = |name: &'static str, reason: String| Err(DecodeError::param(name, reason));
        if self.within == 0 {
            return p(
                "near_wait.within",
                "0 waits for nothing: no position lies 0 positions before a candidate (turn the \
                 near wait off instead)"
                    .into(),
            );
        }
        if !(self.below > 0.0 && self.below <= 1.0) {
            return p(
                "near_wait.below",
                format!("{} is not in (0, 1]", self.below),
            );
        }
        Ok(())
    }
}

impl Default for Staged {
    fn default() -> Self {
        Self {
            visible: DEFAULT_THETA_VISIBLE,
            stable: DEFAULT_THETA_STABLE,
            no_adjacent: DEFAULT_NO_ADJACENT,
            wait_left: DEFAULT_WAIT_LEFT,
            near_wait: Some(DEFAULT_NEAR_WAIT),
            verify: Some(Verify::default()),
        }
    }
}

/// Verification before final (WINO-style): each tentative token gets a *shadow row* in a later
/// window forward — input MASK at its position, attending to the cache and to that forward's rows
/// except its own — lowest confidence first, in the free rows of the forward's latency bucket
/// (and beyond them within `allowance`), before any new lookahead draft. If the shadow gives the
/// token less than `tau_back` probability the token goes back to the mask (never replaced by
/// another token); at the stable threshold it becomes final.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Verify {
    /// Remask below this shadow probability.
    pub tau_back: f32,
    /// Remasks per position at most (then the token stays as it is).
    pub max_remasks: usize,
    /// A decision taken by a forward whose window holds a tentative token no forward has looked at
    /// yet is tentative too, whatever its confidence (it may rest on that token).
    pub suspect_dependents: bool,
    /// A step whose verification sends a token back decides only its most confident candidate,
    /// tentatively, and makes no token final by verification (the rows and shadows saw the
    /// rejected token as context: they are looked at again).
    pub hold_on_remask: bool,
    /// Shadow rows beyond the bucket's free rows may add at most this fraction of the forward's
    /// latency (the latency table's price).
    pub allowance: f64,
    /// The joint check (see [`Joint`]).
    pub joint: Joint,
    /// A look leaves out the tentative tokens after its token, at most this many positions away,
    /// that were decided in the same step as its token or later (they may rest on it: two
    /// unverified tokens must not confirm each other; the tokens before it stay in view); 0
    /// shows them.
    pub partners_within: usize,
}

impl Default for Verify {
    fn default() -> Self {
        Self {
            tau_back: DEFAULT_TAU_BACK,
            max_remasks: DEFAULT_MAX_REMASKS,
            suspect_dependents: false,
            hold_on_remask: true,
            allowance: DEFAULT_SHADOW_ALLOWANCE,
            joint: Joint::Auto,
            partners_within: DEFAULT_PARTNERS_WITHIN,
        }
    }
}

impl Verify {
    pub(crate) fn check(self) -> Result<()> {
        let p = |name: &'static str, reason: String| Err(DecodeError::param(name, reason));
        if !(self.tau_back >= 0.0 && self.tau_back <= 1.0) {
            return p("tau_back", format!("{} is not in [0, 1]", self.tau_back));
        }
        if !(self.allowance.is_finite() && self.allowance >= 0.0) {
            return p(
                "verify.allowance",
                format!("{} must be a finite fraction >= 0", self.allowance),
            );
        }
        if let Joint::On(r) = self.joint {
            if r.within == 0 {
                return p(
                    "joint.within",
                    "0 holds nothing back: no other decision is 0 positions away".into(),
                );
            }
            if !(r.unless_above > 0.0 && r.unless_above <= 1.0) {
                return p(
                    "joint.unless_above",
                    format!("{} is not in (0, 1]", r.unless_above),
                );
            }
        }
        Ok(())
    }
}
