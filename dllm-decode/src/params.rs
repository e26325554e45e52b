//! Decoding parameters: one struct with named defaults, validated before any forward runs.

use crate::error::{DecodeError, Result};

/// Default number of generated positions (LLaDA's `generate.py`).
pub const DEFAULT_GEN_LENGTH: usize = 128;
/// Default block length (LLaDA's `generate.py`; the paper's block size).
pub const DEFAULT_BLOCK_LENGTH: usize = 32;
/// Total denoising steps at [`DEFAULT_GEN_LENGTH`] (one token per step; [`DecodeParams::resolve`]
/// gives `gen_length` steps when neither the user nor the checkpoint chooses).
pub const DEFAULT_STEPS: usize = 128;
/// Fast-dLLM's parallel-decoding confidence threshold.
pub const DEFAULT_THRESHOLD: f32 = 0.9;
/// Dream's final timestep.
pub const DEFAULT_DREAM_EPS: f64 = 1e-3;
/// Default seed for sampled decoding.
pub const DEFAULT_SEED: u64 = 0;
/// Multi-block speculative decoding: look ahead once the current block has at most this many
/// undecided positions (the paper's operating point, §5.5).
pub const DEFAULT_LOOKAHEAD_TRIGGER: usize = 4;
/// Multi-block speculative decoding: lookahead may add at most this fraction of the window's own
/// latency (per the latency table).
pub const DEFAULT_LOOKAHEAD_ALLOWANCE: f64 = 0.1;
/// Multi-block speculative decoding: memory the lookahead positions may add (K/V and activations), MiB.
pub const DEFAULT_LOOKAHEAD_BUDGET_MIB: f64 = 64.0;

/// The lengths and schedule a user asked for explicitly (`None`: not given). See
/// [`DecodeParams::resolve`].
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Requested {
    /// `--gen-length`.
    pub gen_length: Option<usize>,
    /// `--block-length`.
    pub block_length: Option<usize>,
    /// `--steps`.
    pub steps: Option<usize>,
    /// `--threshold`.
    pub threshold: Option<f32>,
}

/// How the canvas is recomputed between steps. Parsed from its command-line spelling:
///
/// ```
/// use dllm_decode::Strategy;
///
/// let s: Strategy = "mbsd".parse()?;
/// assert_eq!((s, s.name()), (Strategy::Mbsd, "mbsd"));
/// assert!("fastest".parse::<Strategy>().unwrap_err().to_string().contains("strategy"));
/// # Ok::<(), dllm_decode::DecodeError>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
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
    /// Multi-block speculative decoding (paper §3.2): the dual cache with a decoding window that
    /// slides along the commit frontier into future blocks and looks ahead when the block is
    /// nearly done (see [`MbsdParams`] and `window::MbsdWindow`).
    Mbsd,
}

impl Strategy {
    /// The command-line spelling.
    pub fn name(self) -> &'static str {
        match self {
            Strategy::Vanilla => "vanilla",
            Strategy::PrefixCache => "prefix-cache",
            Strategy::DualCache => "dual-cache",
            Strategy::Mbsd => "mbsd",
        }
    }
}

/// Staged token stabilization: the confidence at which a prediction becomes visible context.
pub const DEFAULT_THETA_VISIBLE: f32 = 0.9;
/// Staged token stabilization: the confidence at which a token becomes final.
pub const DEFAULT_THETA_STABLE: f32 = 0.9;

/// Largest accepted sampling temperature: LLaDA's Gumbel noise divides by `(-ln u)^t`, which
/// leaves f64's range (and turns every candidate into a tie at 0 or infinity) around t = 18.
pub const MAX_TEMPERATURE: f32 = 10.0;

/// Largest accepted classifier-free guidance scale (guided logits are
/// `uncond + (scale + 1) * (cond - uncond)`).
pub const MAX_CFG_SCALE: f32 = 100.0;

/// Revision: revise a Visible token when its re-score prefers another token by at least this
/// much probability.
pub const DEFAULT_REVISION_MARGIN: f32 = 0.0;
/// Revision: the CPU path may take this fraction of the step's NPU forward time (both from the
/// latency tables).
pub const DEFAULT_REFRESH_BUDGET: f64 = 1.0;

/// Dual-path progressive revision switches (paper §3.3; used with [`Strategy::Mbsd`], all on by
/// default there; `sls` applies to every strategy).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RevisionParams {
    /// Staged token stabilization: decisions are Visible (context, revisable) at `theta_visible` and
    /// Stable (final) at `theta_stable`, instead of final at once.
    pub sts: bool,
    /// Sparse cache refresh: Visible tokens in the cached prefix are re-scored (each masked
    /// alone) on a second (CPU) path beside each window forward, lowest confidence first within
    /// `refresh_budget`; a token the re-score prefers another token to by `margin` is revised and
    /// its K/V recomputed; merged at step boundaries.
    pub scr: bool,
    /// Selective logits skipping, for every strategy: logits only for undecided positions (off:
    /// every window row goes through the LM head, as the reference implementations and a naive NPU
    /// graph do; the decisions are the same either way).
    pub sls: bool,
    /// Confidence at which a prediction becomes Visible.
    pub theta_visible: f32,
    /// Confidence at which a token becomes Stable.
    pub theta_stable: f32,
    /// Revise a Visible token when its re-score gives another token at least this much more
    /// probability than the current one (0..1).
    pub margin: f32,
    /// Fraction of the step's NPU forward time the CPU path may take (priced with the latency
    /// tables; 0 re-scores nothing).
    pub refresh_budget: f64,
}

impl Default for RevisionParams {
    fn default() -> Self {
        Self {
            sts: true,
            scr: true,
            sls: true,
            theta_visible: DEFAULT_THETA_VISIBLE,
            theta_stable: DEFAULT_THETA_STABLE,
            margin: DEFAULT_REVISION_MARGIN,
            refresh_budget: DEFAULT_REFRESH_BUDGET,
        }
    }
}

/// Multi-block speculative decoding switches (used with [`Strategy::Mbsd`]).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct MbsdParams {
    /// Slide the window along the commit frontier into future blocks.
    pub sliding: bool,
    /// Extend the window late in a block while the latency table says it is nearly free.
    pub lookahead: bool,
    /// Fit the window to the latency table's bucket: on a table in tile buckets (step
    /// interpolation), a window a few positions wider than a bucket edge is cut back to the edge
    /// (the block's last undecided positions wait for the next forward) instead of paying for the
    /// next bucket.
    pub fit_bucket: bool,
    /// Look ahead once the current block has at most this many undecided positions.
    pub trigger: usize,
    /// The extra latency lookahead may add, as a fraction of the window's own latency.
    pub allowance: f64,
    /// The extra memory lookahead may add (K/V and activations of the added positions), MiB.
    pub budget_mib: f64,
    /// Show drafts at least this confident to later forwards instead of the mask (`None`: drafts
    /// stay masked until their block decides them).
    pub draft_context: Option<f32>,
}

impl Default for MbsdParams {
    fn default() -> Self {
        Self {
            sliding: true,
            lookahead: true,
            fit_bucket: true,
            trigger: DEFAULT_LOOKAHEAD_TRIGGER,
            allowance: DEFAULT_LOOKAHEAD_ALLOWANCE,
            budget_mib: DEFAULT_LOOKAHEAD_BUDGET_MIB,
            draft_context: None,
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
            "mbsd" => Ok(Strategy::Mbsd),
            _ => Err(DecodeError::param(
                "strategy",
                format!("`{s}` (expected vanilla, prefix-cache, dual-cache or mbsd)"),
            )),
        }
    }
}

/// How a masked position's confidence is scored.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Remasking {
    /// Probability of the predicted token (LLaDA `low_confidence`, Dream `maskgit_plus`).
    LowConfidence,
    /// Uniform random scores (LLaDA `random`).
    Random,
    /// Top-1 minus top-2 probability (Dream `topk_margin`).
    Margin,
    /// Negative entropy of the distribution (Dream `entropy`).
    Entropy,
}

impl std::str::FromStr for Remasking {
    type Err = DecodeError;
    fn from_str(s: &str) -> Result<Self> {
        match s {
            "low_confidence" | "maskgit_plus" => Ok(Remasking::LowConfidence),
            "random" => Ok(Remasking::Random),
            "margin" | "topk_margin" => Ok(Remasking::Margin),
            "entropy" => Ok(Remasking::Entropy),
            _ => Err(DecodeError::param(
                "remasking",
                format!("`{s}` (expected low_confidence, random, topk_margin or entropy)"),
            )),
        }
    }
}

/// Dream `diffusion_generate` algorithms.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DreamAlg {
    /// Reveal each masked position with probability `1 - s/t`, sampled independently.
    Origin,
    /// Top-k by the predicted token's probability.
    MaskgitPlus,
    /// Top-k by top-1 minus top-2 probability.
    TopkMargin,
    /// Top-k by negative entropy.
    Entropy,
}

impl std::str::FromStr for DreamAlg {
    type Err = DecodeError;
    fn from_str(s: &str) -> Result<Self> {
        match s {
            "origin" => Ok(DreamAlg::Origin),
            "maskgit_plus" => Ok(DreamAlg::MaskgitPlus),
            "topk_margin" => Ok(DreamAlg::TopkMargin),
            "entropy" => Ok(DreamAlg::Entropy),
            _ => Err(DecodeError::param(
                "alg",
                format!("`{s}` (expected origin, maskgit_plus, topk_margin or entropy)"),
            )),
        }
    }
}

/// Dream-specific parameters (used by [`Strategy::Vanilla`] on Dream models).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct DreamParams {
    /// Unmasking algorithm.
    pub alg: DreamAlg,
    /// Final timestep of `linspace(1, eps, steps + 1)`.
    pub eps: f64,
    /// Temperature of the position-selection softmax (`None`/0: deterministic top-k).
    pub alg_temp: Option<f32>,
    /// Nucleus filter for token sampling.
    pub top_p: Option<f32>,
    /// Top-k filter for token sampling.
    pub top_k: Option<usize>,
}

impl Default for DreamParams {
    fn default() -> Self {
        Self {
            alg: DreamAlg::MaskgitPlus,
            eps: DEFAULT_DREAM_EPS,
            alg_temp: None,
            top_p: None,
            top_k: None,
        }
    }
}

/// Everything a decoder needs besides the model and the prompt. The lengths depend on the model:
/// [`DecodeParams::for_model`] takes a checkpoint's; `DecodeParams::default()` leaves them unset
/// (an error if decoded with, see [its docs](#impl-Default-for-DecodeParams)).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct DecodeParams {
    /// Generated positions after the prompt.
    pub gen_length: usize,
    /// Positions per block (`gen_length` must be a multiple).
    pub block_length: usize,
    /// Total denoising steps (a multiple of the number of blocks). With a threshold the schedule
    /// is not used: threshold decoding steps until the block is filled.
    pub steps: usize,
    /// Canvas recomputation strategy.
    pub strategy: Strategy,
    /// Parallel decoding: unmask every masked position of the block whose confidence is at least
    /// this (and at least one per step) instead of following the step schedule.
    pub threshold: Option<f32>,
    /// Confidence scoring.
    pub remasking: Remasking,
    /// Sampling temperature (0 = greedy, bit-for-bit deterministic).
    pub temperature: f32,
    /// Seed for Gumbel noise, random remasking and Dream sampling.
    pub seed: u64,
    /// Classifier-free guidance scale (0 disables; needs an unconditional pass per step).
    pub cfg_scale: f32,
    /// Forbid EOS in the prediction (LLaDA `logits_eos_inf`).
    pub logits_eos_inf: bool,
    /// Rank EOS/EoT predictions last (LLaDA `confidence_eos_eot_inf`; see `confidence`).
    pub confidence_eos_eot_inf: bool,
    /// Stop when a completed block ends in EOS/EoT (the rest is filled with EOS).
    pub early_stop: bool,
    /// Dream's algorithm parameters.
    pub dream: DreamParams,
    /// Multi-block speculative decoding switches ([`Strategy::Mbsd`]).
    pub mbsd: MbsdParams,
    /// Dual-path progressive revision switches ([`Strategy::Mbsd`]).
    pub revision: RevisionParams,
}

/// Every parameter at its default **except the lengths**, which belong to the model:
/// `gen_length`, `block_length` and `steps` are 0, "not chosen", and decoding with them is an
/// error naming `gen_length` (never a silent run at lengths the checkpoint was not made for).
/// Take a checkpoint's recommendation with [`DecodeParams::for_model`] (or
/// `loaded.decode_params()`, [`crate::LoadedModelExt`]), or set the three:
///
/// ```
/// use dllm_decode::{DecodeParams, Strategy};
///
/// let unset = DecodeParams::default();
/// let e = unset.validate().unwrap_err().to_string();
/// assert!(e.contains("gen_length") && e.contains("decode_params"), "{e}");
///
/// let p = DecodeParams { gen_length: 24, block_length: 8, steps: 24, strategy: Strategy::DualCache, ..Default::default() };
/// p.validate()?;
/// # Ok::<(), dllm_decode::DecodeError>(())
/// ```
impl Default for DecodeParams {
    fn default() -> Self {
        Self {
            gen_length: 0,
            block_length: 0,
            steps: 0,
            strategy: Strategy::Vanilla,
            threshold: None,
            remasking: Remasking::LowConfidence,
            temperature: 0.0,
            seed: DEFAULT_SEED,
            cfg_scale: 0.0,
            logits_eos_inf: false,
            confidence_eos_eot_inf: false,
            early_stop: true,
            dream: DreamParams::default(),
            mbsd: MbsdParams::default(),
            revision: RevisionParams::default(),
        }
    }
}

impl DecodeParams {
    /// The one rule that turns what a user asked for and what a checkpoint recommends
    /// (`generation_config.json`, see `dllm_models::source::DecodeDefaults`) into lengths and a
    /// schedule; `generate`, `eval` and library users all go through it. Other fields come from
    /// `self`.
    ///
    /// * `gen_length`: asked, else the checkpoint's, else [`DEFAULT_GEN_LENGTH`].
    /// * `block_length`: asked, else the checkpoint's if it divides `gen_length`, else
    ///   [`DEFAULT_BLOCK_LENGTH`] if it divides `gen_length`, else `gen_length` (one block).
    /// * `steps`: asked; else, when `gen_length` was asked, `gen_length` (one token per step: the
    ///   checkpoint's step count belongs to its own length); else the checkpoint's; else
    ///   `gen_length`.
    /// * `threshold`: asked; else the checkpoint's unless `steps` was asked (a step count means the
    ///   schedule) or the strategy decides by staged stabilization (`mbsd` without `--no-sts`: its
    ///   thresholds are `revision.theta_visible` / `theta_stable`); else none.
    pub fn resolve(
        self,
        asked: Requested,
        checkpoint: &dllm_models::source::DecodeDefaults,
    ) -> DecodeParams {
        let gen_length = asked
            .gen_length
            .or(checkpoint.gen_length)
            .unwrap_or(DEFAULT_GEN_LENGTH);
        let divides = |b: &usize| *b > 0 && gen_length.is_multiple_of(*b);
        let block_length = asked
            .block_length
            .or(checkpoint.block_length.filter(divides))
            .or(Some(DEFAULT_BLOCK_LENGTH).filter(divides))
            .unwrap_or(gen_length);
        let steps = match (asked.steps, asked.gen_length) {
            (Some(s), _) => s,
            (None, Some(_)) => gen_length,
            (None, None) => checkpoint.steps.unwrap_or(gen_length),
        };
        let staged = self.strategy == Strategy::Mbsd && self.revision.sts;
        let threshold = asked.threshold.or(if asked.steps.is_none() && !staged {
            checkpoint.threshold.map(|t| t as f32)
        } else {
            None
        });
        DecodeParams {
            gen_length,
            block_length,
            steps,
            threshold,
            ..self
        }
    }

    /// The checkpoint's recommended lengths and schedule (`generation_config.json`) over the
    /// defaults: what `generate` runs when given no flags (lengths the checkpoint does not name
    /// follow [`DecodeParams::resolve`]). Other fields keep their defaults. Also
    /// `loaded.decode_params()` ([`crate::LoadedModelExt`]).
    ///
    /// ```
    /// use dllm_decode::DecodeParams;
    /// use dllm_models::{load, LoadOptions, ModelSource};
    ///
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../models/tiny-llada");
    /// let loaded = load(&ModelSource::parse(dir)?, &LoadOptions::default())?;
    /// let p = DecodeParams::for_model(&loaded); // tiny-llada's generation_config.json
    /// assert_eq!((p.gen_length, p.block_length, p.steps), (24, 8, 24));
    /// # Ok(())
    /// # }
    /// ```
    pub fn for_model(loaded: &dllm_models::LoadedModel) -> DecodeParams {
        DecodeParams::default().resolve(Requested::default(), &loaded.defaults)
    }

    /// Number of blocks.
    pub fn num_blocks(&self) -> usize {
        self.gen_length / self.block_length.max(1)
    }

    /// Steps per block.
    pub fn steps_per_block(&self) -> usize {
        self.steps / self.num_blocks().max(1)
    }

    /// Check every parameter; the error names the first bad one.
    pub fn validate(&self) -> Result<()> {
        let p = |name: &'static str, reason: String| DecodeError::param(name, reason);
        let unset = "is 0, not chosen: DecodeParams::default() leaves gen_length, block_length \
                     and steps to the model (take a checkpoint's recommendation with \
                     `loaded.decode_params()` / `DecodeParams::for_model(&loaded)`, or set all \
                     three)";
        if self.gen_length == 0 {
            return Err(p("gen_length", unset.into()));
        }
        if self.block_length == 0 {
            return Err(p("block_length", unset.into()));
        }
        if !self.gen_length.is_multiple_of(self.block_length) {
            return Err(p(
                "gen_length",
                format!(
                    "{} is not a multiple of block_length {}",
                    self.gen_length, self.block_length
                ),
            ));
        }
        if self.steps == 0 {
            return Err(p("steps", unset.into()));
        }
        if self.steps > self.gen_length {
            return Err(p(
                "steps",
                format!(
                    "{} exceeds gen_length {}: a step that decides no position is a wasted forward",
                    self.steps, self.gen_length
                ),
            ));
        }
        if !self.steps.is_multiple_of(self.num_blocks()) {
            return Err(p(
                "steps",
                format!(
                    "{} is not a multiple of the number of blocks {} (gen_length / block_length)",
                    self.steps,
                    self.num_blocks()
                ),
            ));
        }
        if let Some(t) = self.threshold {
            if !(t > 0.0 && t <= 1.0) {
                return Err(p("threshold", format!("{t} is not in (0, 1]")));
            }
        }
        if !(self.temperature >= 0.0 && self.temperature <= MAX_TEMPERATURE) {
            return Err(p(
                "temperature",
                format!(
                    "{:?} is not in [0, {MAX_TEMPERATURE}] (beyond it LLaDA's Gumbel noise \
                     (-ln u)^temperature leaves the range of f64 and every token ties)",
                    self.temperature
                ),
            ));
        }
        if !(self.cfg_scale >= 0.0 && self.cfg_scale <= MAX_CFG_SCALE) {
            return Err(p(
                "cfg_scale",
                format!(
                    "{:?} is not in [0, {MAX_CFG_SCALE}] (guided logits are uncond + (scale + 1) \
                     * (cond - uncond): large scales overflow f32)",
                    self.cfg_scale
                ),
            ));
        }
        if self.cfg_scale > 0.0 && self.strategy != Strategy::Vanilla {
            return Err(p(
                "cfg_scale",
                "classifier-free guidance is only supported with the vanilla strategy".into(),
            ));
        }
        let d = &self.dream;
        if !(d.eps > 0.0 && d.eps < 1.0) {
            return Err(p("dream.eps", format!("{} is not in (0, 1)", d.eps)));
        }
        if let Some(t) = d.alg_temp {
            if !(t >= 0.0 && t.is_finite()) {
                return Err(p(
                    "dream.alg_temp",
                    format!("{t} must be a finite value >= 0"),
                ));
            }
        }
        if let Some(tp) = d.top_p {
            if !(tp > 0.0 && tp <= 1.0) {
                return Err(p("dream.top_p", format!("{tp} is not in (0, 1]")));
            }
        }
        if d.top_k == Some(0) {
            return Err(p("dream.top_k", "must be positive".into()));
        }
        let m = &self.mbsd;
        if !(m.allowance.is_finite() && m.allowance >= 0.0) {
            return Err(p(
                "mbsd.allowance",
                format!("{} must be a finite fraction >= 0", m.allowance),
            ));
        }
        if !(m.budget_mib.is_finite() && m.budget_mib >= 0.0) {
            return Err(p(
                "mbsd.budget_mib",
                format!("{} MiB must be a finite value >= 0", m.budget_mib),
            ));
        }
        if let Some(t) = m.draft_context {
            if !(t > 0.0 && t <= 1.0) {
                return Err(p("mbsd.draft_context", format!("{t} is not in (0, 1]")));
            }
        }
        let r = &self.revision;
        for (name, t) in [
            ("revision.theta_visible", r.theta_visible),
            ("revision.theta_stable", r.theta_stable),
        ] {
            if !(t > 0.0 && t <= 1.0) {
                return Err(p(name, format!("{t} is not in (0, 1]")));
            }
        }
        if r.theta_visible > r.theta_stable {
            return Err(p(
                "revision.theta_visible",
                format!(
                    "{} is above revision.theta_stable {}: a token cannot be final before it is visible",
                    r.theta_visible, r.theta_stable
                ),
            ));
        }
        if !(r.margin.is_finite() && (0.0..=1.0).contains(&r.margin)) {
            return Err(p(
                "revision.margin",
                format!("{} is not a probability difference in [0, 1]", r.margin),
            ));
        }
        if !(r.refresh_budget.is_finite() && r.refresh_budget >= 0.0) {
            return Err(p(
                "revision.refresh_budget",
                format!("{} must be a finite fraction >= 0", r.refresh_budget),
            ));
        }
        if self.strategy == Strategy::Mbsd && r.sts && self.threshold.is_some() {
            return Err(p(
                "threshold",
                "with staged stabilization (strategy mbsd, revision.sts) decisions follow \
                 revision.theta_visible and revision.theta_stable; turn revision.sts off to decide \
                 by threshold"
                    .into(),
            ));
        }
        if self.strategy != Strategy::Mbsd {
            let d = RevisionParams::default();
            let why = |field: &'static str| Err(p(field, "only the mbsd strategy uses it".into()));
            if r.sts != d.sts {
                return why("revision.sts");
            }
            if r.scr != d.scr {
                return why("revision.scr");
            }
            if r.theta_visible != d.theta_visible {
                return why("revision.theta_visible");
            }
            if r.theta_stable != d.theta_stable {
                return why("revision.theta_stable");
            }
            if r.margin != d.margin {
                return why("revision.margin");
            }
            if r.refresh_budget != d.refresh_budget {
                return why("revision.refresh_budget");
            }
        }
        if self.strategy != Strategy::Mbsd {
            let d = MbsdParams::default();
            let why = |field: &'static str| Err(p(field, "only the mbsd strategy uses it".into()));
            if m.sliding != d.sliding {
                return why("mbsd.sliding");
            }
            if m.lookahead != d.lookahead {
                return why("mbsd.lookahead");
            }
            if m.fit_bucket != d.fit_bucket {
                return why("mbsd.fit_bucket");
            }
            if m.trigger != d.trigger {
                return why("mbsd.trigger");
            }
            if m.allowance != d.allowance {
                return why("mbsd.allowance");
            }
            if m.budget_mib != d.budget_mib {
                return why("mbsd.budget_mib");
            }
            if m.draft_context.is_some() {
                return why("mbsd.draft_context");
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use dllm_models::source::DecodeDefaults;

    #[test]
    fn one_rule_for_asked_and_checkpoint_lengths() {
        let ck = DecodeDefaults {
            gen_length: Some(24),
            block_length: Some(8),
            steps: Some(24),
            threshold: Some(0.9),
        };
        let none = DecodeDefaults::default();
        let ask = |g, b, s, t| Requested {
            gen_length: g,
            block_length: b,
            steps: s,
            threshold: t,
        };
        // (asked, checkpoint) -> (gen, block, steps, threshold)
        type Row<'a> = (
            Requested,
            &'a DecodeDefaults,
            (usize, usize, usize, Option<f32>),
        );
        let table: &[Row<'_>] = &[
            (ask(None, None, None, None), &ck, (24, 8, 24, Some(0.9))),
            (ask(None, None, None, None), &none, (128, 32, 128, None)),
            // An explicit length without steps: one token per step, not the checkpoint's 24.
            (
                ask(Some(128), None, None, None),
                &ck,
                (128, 8, 128, Some(0.9)),
            ),
            (
                ask(Some(224), None, None, None),
                &ck,
                (224, 8, 224, Some(0.9)),
            ),
            // The checkpoint's block does not divide the length: the default 32 does not either.
            (
                ask(Some(20), None, None, None),
                &ck,
                (20, 20, 20, Some(0.9)),
            ),
            (ask(Some(40), None, None, None), &none, (40, 40, 40, None)),
            (ask(Some(64), None, None, None), &none, (64, 32, 64, None)),
            // Explicit steps: the schedule, not the checkpoint's threshold.
            (ask(None, None, Some(12), None), &ck, (24, 8, 12, None)),
            (
                ask(None, Some(24), Some(6), Some(0.5)),
                &ck,
                (24, 24, 6, Some(0.5)),
            ),
        ];
        for (asked, ckpt, want) in table {
            let p = DecodeParams::default().resolve(*asked, ckpt);
            assert_eq!(
                (p.gen_length, p.block_length, p.steps, p.threshold),
                *want,
                "{asked:?} with {ckpt:?}"
            );
            p.validate().unwrap();
        }
    }
}
