//! The window policy a generation uses ([`Strategy`]) and multi-block speculative decoding's
//! parameters ([`MbsdParams`]), re-exported by `params`.

use crate::decide::{Decide, Staged};
use crate::error::{DecodeError, Result};

/// Multi-block speculative decoding: look ahead once the current block has at most this many
/// undecided positions (the paper's operating point, §5.5).
pub const DEFAULT_LOOKAHEAD_TRIGGER: usize = 4;
/// Multi-block speculative decoding: lookahead may add at most this fraction of the window's own
/// latency (per the latency table).
pub const DEFAULT_LOOKAHEAD_ALLOWANCE: f64 = 0.1;
/// Multi-block speculative decoding: memory the lookahead positions may add (K/V and activations), MiB.
pub const DEFAULT_LOOKAHEAD_BUDGET_MIB: f64 = 64.0;
/// Multi-block speculative decoding on a model with shifted logits (Dream): the threshold of its
/// default decision rule ([`Strategy::default_decide`]).
pub const DEFAULT_MBSD_DREAM_THRESHOLD: f32 = 0.9;
/// Multi-block speculative decoding on a model without shifted logits (LLaDA): the span the
/// tools use when none is asked for ([`MbsdParams::default_span`]).
pub const DEFAULT_SPAN: usize = 16;

/// How the canvas is recomputed between steps (the window policy), with the parameters only that
/// policy reads. Parsed from its command-line spelling (`mbsd` with its default parameters):
///
/// ```
/// use dllm_decode::{MbsdParams, Strategy};
///
/// let s: Strategy = "mbsd".parse()?;
/// assert_eq!((s, s.name()), (Strategy::Mbsd(MbsdParams::default()), "mbsd"));
/// assert!("fastest".parse::<Strategy>().unwrap_err().to_string().contains("strategy"));
/// # Ok::<(), dllm_decode::DecodeError>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Strategy {
    /// The model family's reference algorithm: every step forwards the whole canvas (LLaDA's
    /// semi-autoregressive `generate`; for Dream models, Dream's `diffusion_generate`).
    Vanilla,
    /// Fast-dLLM prefix cache: a full forward at each block start caches the prompt and finished
    /// blocks; later steps forward the current block and everything after it.
    PrefixCache,
    /// Fast-dLLM dual cache: the full forward at block start caches prefix *and* suffix; later steps
    /// forward only the current block.
    DualCache,
    /// Multi-block speculative decoding (paper §3.2): one whole-canvas forward, then a decoding
    /// window that slides along the commit frontier into future blocks and looks ahead when the
    /// block is nearly done (see [`MbsdParams`] and `window::MbsdWindow`).
    Mbsd(MbsdParams),
}

impl Strategy {
    /// The command-line spelling.
    pub fn name(self) -> &'static str {
        match self {
            Strategy::Vanilla => "vanilla",
            Strategy::PrefixCache => "prefix-cache",
            Strategy::DualCache => "dual-cache",
            Strategy::Mbsd(_) => "mbsd",
        }
    }

    /// Multi-block speculative decoding's parameters, for that strategy.
    pub fn mbsd(self) -> Option<MbsdParams> {
        match self {
            Strategy::Mbsd(m) => Some(m),
            _ => None,
        }
    }

    /// Whether this is multi-block speculative decoding.
    pub fn is_mbsd(self) -> bool {
        matches!(self, Strategy::Mbsd(_))
    }

    /// The decision rule the tools use with this strategy when none is asked for, for a model
    /// with (`shift_logits`, Dream) or without shifted logits (LLaDA): for mbsd, staged
    /// decisions at their defaults on LLaDA models and the threshold rule at
    /// [`DEFAULT_MBSD_DREAM_THRESHOLD`] on Dream models (chosen per family on the tuning and
    /// confirmation sets; README, *Default decoding*); else the schedule (a checkpoint's
    /// recommended threshold replaces it, see [`crate::DecodeParams::resolve`]).
    ///
    /// ```
    /// use dllm_decode::{Decide, Staged, Strategy};
    ///
    /// let mbsd: Strategy = "mbsd".parse()?;
    /// assert_eq!(mbsd.default_decide(false), Decide::Staged(Staged::default()));
    /// assert_eq!(mbsd.default_decide(true), Decide::Threshold(0.9));
    /// assert_eq!(Strategy::DualCache.default_decide(true), Decide::Schedule);
    /// # Ok::<(), dllm_decode::DecodeError>(())
    /// ```
    pub fn default_decide(self, shift_logits: bool) -> Decide {
        match self {
            Strategy::Mbsd(_) if shift_logits => Decide::Threshold(DEFAULT_MBSD_DREAM_THRESHOLD),
            Strategy::Mbsd(_) => Decide::Staged(Staged::default()),
            _ => Decide::Schedule,
        }
    }
}

/// Multi-block speculative decoding's switches ([`Strategy::Mbsd`]).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct MbsdParams {
    /// Slide the window along the commit frontier into future blocks (`None`: the model family's
    /// default, see [`MbsdParams::resolved`]).
    pub sliding: Option<bool>,
    /// Extend the window late in a block while the latency table says it is nearly free (off by
    /// default: with the LM head's logits priced on the phone's CPU, the drafts' logits rows cost
    /// more than they save on the tuning set; see the README).
    pub lookahead: bool,
    /// Fit the window to the latency table's bucket: on a table in tile buckets (step
    /// interpolation), a window a few positions wider than a bucket edge is cut back to the edge
    /// (the block's last undecided positions wait for the next forward) instead of paying for the
    /// next bucket (`None`: the model family's default, see [`MbsdParams::fits_bucket`]).
    pub fit_bucket: Option<bool>,
    /// Count the shown guess's shadow rows in the forward the bucket fit fits to a bucket: the
    /// window gives up its last positions so that the guess's rows fit the bucket instead of
    /// starting the next one (`None`: the model family's default, see
    /// [`MbsdParams::fits_guess`]). Needs the bucket fit and the shown guess (an error when asked
    /// for without them).
    pub fit_guess: Option<bool>,
    /// Cover at most this many positions from the commit frontier in a window (after the stale
    /// positions before it; `None`: up to the block's end). With a span,
    /// [`crate::DecodeParams::resolve`] makes the answer one block unless a block length is
    /// asked for: the window slides across the whole answer instead of stopping at block ends, a
    /// forward can decide positions on both sides of what would have been a block end, and each
    /// forward's window and logits rows stay small. The tools' default on LLaDA models
    /// ([`MbsdParams::default_span`], which gives the numbers). At least 1 (an error otherwise).
    pub span: Option<usize>,
    /// Leave decided positions out of the window's left when its forward would pass a bucket
    /// edge of the latency table: positions before the frontier whose cached K/V are current
    /// (computed from the token they hold), which the window would only recompute. The forward
    /// counted is every row the model computes — the window, the row before it for a model with
    /// shifted logits, the verification rows and the shown guess's shadow — and the trim is all
    /// or nothing (a partial one costs the same bucket); never at a block start's refresh. It
    /// delays no decision; on a sliding window (LLaDA) the window already starts at the frontier
    /// or at a stale position, so it applies to windows that keep the block (Dream).
    pub trim_left: bool,
    /// Look ahead once the current block has at most this many undecided positions.
    pub trigger: usize,
    /// The extra latency lookahead may add, as a fraction of the window's own latency.
    pub allowance: f64,
    /// The extra memory lookahead may add (K/V and activations of the added positions), MiB.
    pub budget_mib: f64,
    /// Show drafts at least this confident to later forwards instead of the mask (`None`: drafts
    /// stay masked until their block decides them).
    pub draft_context: Option<f32>,
    /// Start each block's first window at the canvas's start: the block begins on K/V of the
    /// prompt and of everything generated before it recomputed with every decision so far
    /// (Fast-dLLM dual cache's block-start refresh without the masked suffix). `None`: the model
    /// family's default, see [`MbsdParams::resolved`].
    pub refresh: Option<bool>,
    /// Show a guess (`None`: the model family's default, see [`MbsdParams::shows_guess`]): each
    /// forward writes the previous forward's prediction for the window's first undecided
    /// position into its canvas and checks it with a shadow row (input MASK there, every other
    /// row as the forward computes it). When the shadow predicts the guessed token at the final
    /// threshold, the position is decided and every other row — which saw the guess — counts;
    /// otherwise only the shadow's prediction does (the step decides nothing after the guess).
    /// A dependent token (a line's result after its operand) can then be decided in the forward
    /// that decides what it depends on. Needs a confidence rule (a threshold or staged
    /// decisions); one extra row per forward.
    pub show_guess: Option<bool>,
    /// Under the threshold rule, what a shown guess's shadow below the threshold decides (on
    /// by default; staged decisions ignore it, their guess's position stays tentative). When the
    /// shadow still predicts the guessed token, it *agrees*: the position takes the guess — the
    /// threshold rule's fallback, deciding the guess's position alone, gives it that token
    /// anyway — and every other row of the forward, which saw that token there, counts. When it
    /// predicts another token below the threshold, the step decides nothing: the shadow saw the
    /// guess through every other row (they attended to it), so its doubt is no fresh look, and
    /// the next forward shows no guess and decides by the threshold rule on a canvas without
    /// it. Off, the step decides the guess's position by the shadow's prediction and nothing
    /// after it (the behaviour before 2026-12-07). On by default since it was chosen on
    /// tiny-dream-long's ten read question sets and judged on fresh9 (582 of 600 in 10.13
    /// forwards per answer, off 575 in 10.45; `examples/bench/defaults.md`, *A guess's shadow
    /// that does not confirm it*).
    pub guess_agreement: bool,
}

impl Default for MbsdParams {
    fn default() -> Self {
        Self {
            sliding: None,
            lookahead: false,
            fit_bucket: None,
            fit_guess: None,
            span: None,
            trim_left: true,
            trigger: DEFAULT_LOOKAHEAD_TRIGGER,
            allowance: DEFAULT_LOOKAHEAD_ALLOWANCE,
            budget_mib: DEFAULT_LOOKAHEAD_BUDGET_MIB,
            draft_context: None,
            refresh: None,
            show_guess: None,
            guess_agreement: true,
        }
    }
}

impl std::str::FromStr for Strategy {
    type Err = DecodeError;
    fn from_str(s: &str) -> Result<Self> {
        match s {
            "vanilla" => Ok(Strategy::Vanilla),
            "prefix-cache" => Ok(Strategy::PrefixCache),
            "dual-cache" => Ok(Strategy::DualCache),
            "mbsd" => Ok(Strategy::Mbsd(MbsdParams::default())),
            _ => Err(DecodeError::param(
                "strategy",
                format!("`{s}` (expected vanilla, prefix-cache, dual-cache or mbsd)"),
            )),
        }
    }
}

impl MbsdParams {
    /// The span the tools (`generate`, `eval`, the server, the benchmarks) use when none is
    /// asked for, for a model with (`shift_logits`, Dream) or without shifted logits (LLaDA):
    /// [`DEFAULT_SPAN`] positions on LLaDA models, which then decode the answer as one block
    /// ([`crate::DecodeParams::resolve`]); none on Dream models, whose window keeps the block.
    /// `MbsdParams::default()` itself has no span. Chosen on tuning + confirmation for LLaDA
    /// (698 of 700 in 8.39 forwards per answer against 699 in 9.04 for the blocks of 32 before
    /// it), judged on fresh7, which chose nothing (598 of 600 in 8.43 against 598 in 9.13,
    /// projected 7.53 s against 8.40 s); on Dream one block with a span of 16 or 32 lost 3 and 8
    /// answers of 700 (`examples/bench/defaults.md`, *One block, a window of 16*).
    ///
    /// ```
    /// use dllm_decode::MbsdParams;
    ///
    /// assert_eq!(MbsdParams::default_span(false), Some(16));
    /// assert_eq!(MbsdParams::default_span(true), None);
    /// assert_eq!(MbsdParams::default().span, None);
    /// ```
    pub fn default_span(shift_logits: bool) -> Option<usize> {
        (!shift_logits).then_some(DEFAULT_SPAN)
    }

    /// The settings the tools run for a model with (`shift_logits`, Dream) or without shifted
    /// logits when no mbsd flag is given: the defaults with the family's span
    /// ([`Self::default_span`]). Resolve the lengths with [`crate::DecodeParams::resolve`], which
    /// makes an answer with a span one block.
    pub fn for_family(shift_logits: bool) -> MbsdParams {
        MbsdParams {
            span: Self::default_span(shift_logits),
            ..MbsdParams::default()
        }
    }

    /// Sliding and the block-start refresh for a model with (`true`) or without shifted logits,
    /// where the parameters leave them to the family: a model without shifted logits (LLaDA)
    /// slides and does not refresh; a model with them (Dream) refreshes at each block start and
    /// does not slide (chosen per family on the tuning, confirmation, fresh and fresh2 sets: on
    /// tiny-dream-long sliding cost accuracy, and the refresh is what dual cache has that the
    /// sliding window lacks; on tiny-llada-long the refresh bought nothing; `examples/bench/defaults.md`,
    /// *Dream*).
    pub fn resolved(self, shift_logits: bool) -> (bool, bool) {
        (
            self.sliding.unwrap_or(!shift_logits),
            self.refresh.unwrap_or(shift_logits),
        )
    }

    /// Whether the window shows a guess for a model with (`true`) or without shifted logits
    /// under `decide`, where the parameters leave it to the family: a model without shifted
    /// logits (LLaDA) shows one whenever the decisions have a final threshold; a model with them
    /// (Dream) shows one under the threshold rule (its default), not under staged decisions
    /// (chosen on the tuning and confirmation sets: on tiny-dream-long the guess with the
    /// threshold rule at 0.9 took 674 of 700 in 10.3 forwards per answer against 672 in 10.7
    /// without; with staged decisions at their defaults it cost 13 right answers;
    /// `examples/bench/defaults.md`, *The shown guess*).
    pub fn shows_guess(self, shift_logits: bool, decide: crate::Decide) -> bool {
        self.show_guess.unwrap_or(if shift_logits {
            matches!(decide, crate::Decide::Threshold(_))
        } else {
            decide.final_confidence().is_some()
        })
    }

    /// Whether the window is fitted to the latency table's bucket for a model with (`true`) or
    /// without shifted logits, where the parameters leave it to the family: fitted on LLaDA
    /// models, not on Dream models (chosen on the tuning and confirmation sets: on
    /// tiny-dream-long, with Dream's default decisions and the left trim, cutting the tail took
    /// 11.73 forwards per answer against 10.28 without, more than dual-cache + threshold 0.9's
    /// 10.69, for 2 fewer right answers of 700; `examples/bench/defaults.md`, *Dream*). The left trim
    /// ([`Self::trim_left`]) fits Dream's windows without delaying a decision.
    pub fn fits_bucket(self, shift_logits: bool) -> bool {
        self.fit_bucket.unwrap_or(!shift_logits)
    }

    /// Whether the bucket fit counts the shown guess's rows, for a model with (`true`) or without
    /// shifted logits under `decide`, where the parameters leave it to the family: on LLaDA
    /// models with a span, whenever the bucket fit and the shown guess are on; else off. With the
    /// span (on tiny-llada-long, tuning + confirmation) it gave the same answers in the same
    /// forwards (698 of 700 in 8.40 per answer), projected 7.19 s against 7.52 s on confirmation;
    /// judged on fresh8, which chose nothing (`examples/bench/defaults.md`, *The guess's rows in
    /// the bucket*). In blocks of 32 without the span it cost forwards (the same 699 in 9.95
    /// against 9.04), so it stays off there.
    pub fn fits_guess(self, shift_logits: bool, decide: crate::Decide) -> bool {
        self.fit_guess.unwrap_or(
            self.guess_fit_by_family(shift_logits)
                && self.fits_bucket(shift_logits)
                && self.shows_guess(shift_logits, decide),
        )
    }

    /// The family part of [`Self::fits_guess`]'s default (what the window reads: without the
    /// bucket fit or a shown guess it has no guess's rows to count).
    pub(crate) fn guess_fit_by_family(self, shift_logits: bool) -> bool {
        !shift_logits && self.span.is_some()
    }

    /// These parameters with every setting left to the model family ([`Self::resolved`],
    /// [`Self::shows_guess`], [`Self::fits_bucket`], [`Self::fits_guess`]) pinned to its value
    /// for a model with (`shift_logits`) or without shifted logits under `decide`: the same
    /// decoder, spelled out (what a report of a configuration's switches reads).
    ///
    /// ```
    /// use dllm_decode::{MbsdParams, Strategy};
    ///
    /// let m = MbsdParams::default();
    /// let dream = m.pinned(true, Strategy::Mbsd(m).default_decide(true));
    /// assert_eq!(
    ///     (dream.sliding, dream.refresh, dream.show_guess, dream.fit_bucket),
    ///     (Some(false), Some(true), Some(true), Some(false))
    /// );
    /// ```
    pub fn pinned(self, shift_logits: bool, decide: crate::Decide) -> MbsdParams {
        let (sliding, refresh) = self.resolved(shift_logits);
        MbsdParams {
            sliding: Some(sliding),
            refresh: Some(refresh),
            show_guess: Some(self.shows_guess(shift_logits, decide)),
            fit_bucket: Some(self.fits_bucket(shift_logits)),
            fit_guess: Some(self.fits_guess(shift_logits, decide)),
            ..self
        }
    }

    pub(crate) fn check(&self) -> Result<()> {
        let p = |name: &'static str, reason: String| Err(DecodeError::param(name, reason));
        if !(self.allowance.is_finite() && self.allowance >= 0.0) {
            return p(
                "mbsd.allowance",
                format!("{} must be a finite fraction >= 0", self.allowance),
            );
        }
        if !(self.budget_mib.is_finite() && self.budget_mib >= 0.0) {
            return p(
                "mbsd.budget_mib",
                format!("{} MiB must be a finite value >= 0", self.budget_mib),
            );
        }
        if let Some(t) = self.draft_context {
            if !(t > 0.0 && t <= 1.0) {
                return p("mbsd.draft_context", format!("{t} is not in (0, 1]"));
            }
        }
        if self.span == Some(0) {
            return p(
                "mbsd.span",
                "0 positions hold no undecided position: a window must cover at least 1".into(),
            );
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_family_has_its_window_unless_the_parameters_say_otherwise() {
        let d = MbsdParams::default();
        // LLaDA slides; Dream refreshes at each block start instead.
        assert_eq!(d.resolved(false), (true, false));
        assert_eq!(d.resolved(true), (false, true));
        let given = MbsdParams {
            sliding: Some(true),
            refresh: Some(false),
            ..d
        };
        assert_eq!(given.resolved(true), (true, false));
        let given = MbsdParams {
            sliding: Some(false),
            ..d
        };
        assert_eq!(given.resolved(false), (false, false));
    }
}
