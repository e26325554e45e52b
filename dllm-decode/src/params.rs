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

/// Largest accepted sampling temperature: LLaDA's Gumbel noise divides by `(-ln u)^t`, which
/// leaves f64's range (and turns every candidate into a tie at 0 or infinity) around t = 18.
pub const MAX_TEMPERATURE: f32 = 10.0;

/// Largest accepted classifier-free guidance scale (guided logits are
/// `uncond + (scale + 1) * (cond - uncond)`).
pub const MAX_CFG_SCALE: f32 = 100.0;

pub use crate::decide::{
    Decide, NearWait, Staged, Verify, DEFAULT_MAX_REMASKS, DEFAULT_NEAR_WAIT, DEFAULT_NO_ADJACENT,
    DEFAULT_PARTNERS_WITHIN, DEFAULT_SHADOW_ALLOWANCE, DEFAULT_TAU_BACK, DEFAULT_THETA_STABLE,
    DEFAULT_THETA_VISIBLE, DEFAULT_WAIT_LEFT,
};
pub use crate::joint::{Joint, JointRule, DEFAULT_JOINT_UNLESS_ABOVE, DEFAULT_JOINT_WITHIN};
pub use crate::strategy::{
    MbsdParams, Strategy, DEFAULT_LOOKAHEAD_ALLOWANCE, DEFAULT_LOOKAHEAD_BUDGET_MIB,
    DEFAULT_LOOKAHEAD_TRIGGER, DEFAULT_MBSD_DREAM_THRESHOLD, DEFAULT_SPAN,
};

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
///
/// Options that only one decoder reads live in that decoder's variant ([`Strategy::Mbsd`]'s
/// [`MbsdParams`], [`Decide::Staged`]'s [`Staged`]), so they cannot be set where nothing reads
/// them. Two combinations remain checked by [`validate`](Self::validate): staged decisions need
/// the mbsd strategy, and classifier-free guidance the vanilla one.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct DecodeParams {
    /// Generated positions after the prompt.
    pub gen_length: usize,
    /// Positions per block (`gen_length` must be a multiple).
    pub block_length: usize,
    /// Total denoising steps (a multiple of the number of blocks): the schedule of
    /// [`Decide::Schedule`], and a bound on the steps of the other rules.
    pub steps: usize,
    /// Canvas recomputation strategy (the window policy) and its parameters.
    pub strategy: Strategy,
    /// Which positions a step decides, and whether decisions are final at once.
    pub decide: Decide,
    /// Confidence scoring.
    pub remasking: Remasking,
    /// Sampling temperature (0 = greedy, bit-for-bit deterministic).
    pub temperature: f32,
    /// Seed for Gumbel noise, random remasking and Dream sampling.
    pub seed: u64,
    /// Classifier-free guidance scale (0 disables; needs an unconditional pass per step; vanilla
    /// strategy only).
    pub cfg_scale: f32,
    /// Forbid EOS in the prediction (LLaDA `logits_eos_inf`).
    pub logits_eos_inf: bool,
    /// Rank EOS/EoT predictions last (LLaDA `confidence_eos_eot_inf`; see `confidence`).
    pub confidence_eos_eot_inf: bool,
    /// Stop when a completed block ends in EOS/EoT (the rest is filled with EOS).
    pub early_stop: bool,
    /// Selective logits skipping, for every strategy: logits only for positions a decision needs
    /// (off: every window row goes through the LM head, as the reference implementations and a
    /// naive NPU graph do; the decisions are the same either way).
    pub sls: bool,
    /// Dream's algorithm parameters (Dream's own algorithm: a Dream model with the vanilla
    /// strategy).
    pub dream: DreamParams,
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
            decide: Decide::Schedule,
            remasking: Remasking::LowConfidence,
            temperature: 0.0,
            seed: DEFAULT_SEED,
            cfg_scale: 0.0,
            logits_eos_inf: false,
            confidence_eos_eot_inf: false,
            early_stop: true,
            sls: true,
            dream: DreamParams::default(),
        }
    }
}

impl DecodeParams {
    /// The one rule that turns what a user asked for and what a checkpoint recommends
    /// (`generation_config.json`, see `dllm_models::source::DecodeDefaults`) into lengths and a
    /// decision rule; `generate`, `eval` and library users all go through it. Other fields come
    /// from `self`.
    ///
    /// * `gen_length`: asked, else the checkpoint's, else [`DEFAULT_GEN_LENGTH`].
    /// * `block_length`: asked; else `gen_length` (one block) for mbsd with a span
    ///   ([`MbsdParams::span`]: the span bounds the window, which then slides across the whole
    ///   answer; a checkpoint's block length is a recommendation for block-by-block decoding);
    ///   else the checkpoint's if it divides `gen_length`, else [`DEFAULT_BLOCK_LENGTH`] if it
    ///   divides `gen_length`, else `gen_length` (one block).
    /// * `steps`: asked; else, when `gen_length` was asked, `gen_length` (one token per step: the
    ///   checkpoint's step count belongs to its own length); else the checkpoint's; else
    ///   `gen_length`.
    /// * `decide`: an asked threshold; else `self.decide` when it is staged; else the schedule
    ///   when `steps` was asked (a step count means the schedule); else the checkpoint's
    ///   threshold; else `self.decide`.
    pub fn resolve(
        self,
        asked: Requested,
        checkpoint: &dllm_models::source::DecodeDefaults,
    ) -> DecodeParams {
        let gen_length = asked
            .gen_length
            .or(checkpoint.gen_length)
            .unwrap_or(DEFAULT_GEN_LENGTH);
        let block_length = asked
            .block_length
            .or(self.one_block().then_some(gen_length))
            .unwrap_or_else(|| Self::blocks_for(gen_length, checkpoint.block_length));
        let steps = match (asked.steps, asked.gen_length) {
            (Some(s), _) => s,
            (None, Some(_)) => gen_length,
            (None, None) => checkpoint.steps.unwrap_or(gen_length),
        };
        let decide = match (asked.threshold, self.decide) {
            (Some(t), _) => Decide::Threshold(t),
            (None, d @ Decide::Staged(_)) => d,
            (None, _) if asked.steps.is_some() => Decide::Schedule,
            (None, d) => checkpoint
                .threshold
                .map(|t| Decide::Threshold(t as f32))
                .unwrap_or(d),
        };
        DecodeParams {
            gen_length,
            block_length,
            steps,
            decide,
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

    /// The block length [`DecodeParams::resolve`] gives `gen_length` positions decoded in
    /// blocks, none asked for: the `recommended` (a checkpoint's) if it divides `gen_length`,
    /// else [`DEFAULT_BLOCK_LENGTH`] if it does, else `gen_length` (one block).
    ///
    /// ```
    /// use dllm_decode::DecodeParams;
    ///
    /// assert_eq!(DecodeParams::blocks_for(24, Some(8)), 8);
    /// assert_eq!(DecodeParams::blocks_for(128, Some(24)), 32);
    /// assert_eq!(DecodeParams::blocks_for(40, None), 40);
    /// ```
    pub fn blocks_for(gen_length: usize, recommended: Option<usize>) -> usize {
        let divides = |b: &usize| *b > 0 && gen_length.is_multiple_of(*b);
        recommended
            .filter(divides)
            .or(Some(DEFAULT_BLOCK_LENGTH).filter(divides))
            .unwrap_or(gen_length)
    }

    /// Whether [`DecodeParams::resolve`] makes the answer one block when no block length is
    /// asked for: mbsd with a span ([`MbsdParams::span`]).
    ///
    /// ```
    /// use dllm_decode::{DecodeParams, MbsdParams, Strategy};
    ///
    /// let span = MbsdParams { span: Some(16), ..Default::default() };
    /// let p = DecodeParams { strategy: Strategy::Mbsd(span), ..Default::default() };
    /// assert!(p.one_block());
    /// assert!(!DecodeParams { strategy: "mbsd".parse()?, ..p }.one_block());
    /// # Ok::<(), dllm_decode::DecodeError>(())
    /// ```
    pub fn one_block(&self) -> bool {
        self.strategy.mbsd().is_some_and(|m| m.span.is_some())
    }

    /// Number of blocks.
    pub fn num_blocks(&self) -> usize {
        self.gen_length / self.block_length.max(1)
    }

    /// Steps per block.
    pub fn steps_per_block(&self) -> usize {
        self.steps / self.num_blocks().max(1)
    }

    /// Check every parameter's range (and the two combinations the types allow); the error names
    /// the first bad parameter.
    pub fn validate(&self) -> Result<()> {
        self.check_lengths()?;
        let p = |name: &'static str, reason: String| Err(DecodeError::param(name, reason));
        let unit = |name: &'static str, t: f32| {
            if t > 0.0 && t <= 1.0 {
                Ok(())
            } else {
                p(name, format!("{t} is not in (0, 1]"))
            }
        };
        if !(self.temperature >= 0.0 && self.temperature <= MAX_TEMPERATURE) {
            return p(
                "temperature",
                format!(
                    "{:?} is not in [0, {MAX_TEMPERATURE}] (beyond it LLaDA's Gumbel noise \
                     (-ln u)^temperature leaves the range of f64 and every token ties)",
                    self.temperature
                ),
            );
        }
        if !(self.cfg_scale >= 0.0 && self.cfg_scale <= MAX_CFG_SCALE) {
            return p(
                "cfg_scale",
                format!(
                    "{:?} is not in [0, {MAX_CFG_SCALE}] (guided logits are uncond + (scale + 1) \
                     * (cond - uncond): large scales overflow f32)",
                    self.cfg_scale
                ),
            );
        }
        if self.cfg_scale > 0.0 && self.strategy != Strategy::Vanilla {
            return p(
                "cfg_scale",
                "classifier-free guidance is only supported with the vanilla strategy".into(),
            );
        }
        self.dream.check()?;
        if let Some(m) = self.strategy.mbsd() {
            m.check()?;
            if m.show_guess == Some(true) && self.decide == Decide::Schedule {
                return p(
                    "mbsd.show_guess",
                    "a shown guess needs a confidence rule (a threshold or staged decisions): it \
                     counts only when its shadow reaches the final threshold, and the schedule has \
                     none"
                        .into(),
                );
            }
        }
        match self.decide {
            Decide::Schedule => Ok(()),
            Decide::Threshold(t) => unit("threshold", t),
            Decide::Staged(s) => {
                if !self.strategy.is_mbsd() {
                    return p(
                        "decide",
                        "staged decisions (theta_visible / theta_stable, verification) need the \
                         mbsd strategy, whose window keeps every position's cached K/V current"
                            .into(),
                    );
                }
                unit("theta_visible", s.visible)?;
                unit("theta_stable", s.stable)?;
                if s.visible > s.stable {
                    return p(
                        "theta_visible",
                        format!(
                            "{} is above theta_stable {}: a token cannot be final before it is visible",
                            s.visible, s.stable
                        ),
                    );
                }
                s.near_wait.map_or(Ok(()), crate::decide::NearWait::check)?;
                s.verify.map_or(Ok(()), Verify::check)
            }
        }
    }

    fn check_lengths(&self) -> Result<()> {
        let p = |name: &'static str, reason: String| Err(DecodeError::param(name, reason));
        let unset = "is 0, not chosen: DecodeParams::default() leaves gen_length, block_length \
                     and steps to the model (take a checkpoint's recommendation with \
                     `loaded.decode_params()` / `DecodeParams::for_model(&loaded)`, or set all \
                     three)";
        if self.gen_length == 0 {
            return p("gen_length", unset.into());
        }
        if self.block_length == 0 {
            return p("block_length", unset.into());
        }
        if !self.gen_length.is_multiple_of(self.block_length) {
            return p(
                "gen_length",
                format!(
                    "{} is not a multiple of block_length {}",
                    self.gen_length, self.block_length
                ),
            );
        }
        if self.steps == 0 {
            return p("steps", unset.into());
        }
        if self.steps > self.gen_length {
            return p(
                "steps",
                format!(
                    "{} exceeds gen_length {}: a step that decides no position is a wasted forward",
                    self.steps, self.gen_length
                ),
            );
        }
        if !self.steps.is_multiple_of(self.num_blocks()) {
            return p(
                "steps",
                format!(
                    "{} is not a multiple of the number of blocks {} (gen_length / block_length)",
                    self.steps,
                    self.num_blocks()
                ),
            );
        }
        Ok(())
    }
}

impl DreamParams {
    fn check(&self) -> Result<()> {
        let p = |name: &'static str, reason: String| Err(DecodeError::param(name, reason));
        if !(self.eps > 0.0 && self.eps < 1.0) {
            return p("dream.eps", format!("{} is not in (0, 1)", self.eps));
        }
        if let Some(t) = self.alg_temp {
            if !(t >= 0.0 && t.is_finite()) {
                return p("dream.alg_temp", format!("{t} must be a finite value >= 0"));
            }
        }
        if let Some(tp) = self.top_p {
            if !(tp > 0.0 && tp <= 1.0) {
                return p("dream.top_p", format!("{tp} is not in (0, 1]"));
            }
        }
        if self.top_k == Some(0) {
            return p("dream.top_k", "must be positive".into());
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use dllm_models::source::DecodeDefaults;

    #[test]
    fn the_joint_check_resolves_per_family_and_is_checked() {
        assert_eq!(
            Joint::Auto.resolve(false, false),
            Some(JointRule::default())
        );
        assert_eq!(Joint::Auto.resolve(true, false), None);
        assert_eq!(Joint::Auto.resolve(false, true), None);
        assert_eq!(Joint::Off.resolve(false, false), None);
        let r = JointRule {
            within: 3,
            unless_above: 0.5,
        };
        assert_eq!(Joint::On(r).resolve(true, true), Some(r));
        assert_eq!(
            "on".parse::<Joint>().unwrap(),
            Joint::On(JointRule::default())
        );
        assert_eq!(" off ".parse::<Joint>().unwrap(), Joint::Off);
        assert!("maybe"
            .parse::<Joint>()
            .unwrap_err()
            .to_string()
            .contains("joint"));
        for (within, unless_above, field) in [
            (0, 0.9, "within"),
            (2, 0.0, "unless_above"),
            (2, 1.5, "unless_above"),
        ] {
            let v = Verify {
                joint: Joint::On(JointRule {
                    within,
                    unless_above,
                }),
                ..Verify::default()
            };
            let e = v.check().unwrap_err().to_string();
            assert!(e.contains(field), "{e}");
        }
        assert!(Verify::default().check().is_ok());
    }

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
                (p.gen_length, p.block_length, p.steps, p.decide.threshold()),
                *want,
                "{asked:?} with {ckpt:?}"
            );
            p.validate().unwrap();
        }
        // mbsd with a span: one block, whatever the checkpoint recommends, unless one is asked.
        let span = DecodeParams {
            strategy: Strategy::Mbsd(MbsdParams {
                span: Some(16),
                ..MbsdParams::default()
            }),
            ..DecodeParams::default()
        };
        let blocks = |p: DecodeParams, a: Requested, ck: &DecodeDefaults| {
            let r = p.resolve(a, ck);
            (r.gen_length, r.block_length)
        };
        assert_eq!(blocks(span, ask(None, None, None, None), &ck), (24, 24));
        assert_eq!(blocks(span, ask(Some(20), None, None, None), &ck), (20, 20));
        assert_eq!(blocks(span, ask(None, None, None, None), &none), (128, 128));
        assert_eq!(blocks(span, ask(None, Some(8), None, None), &ck), (24, 8));
        // Without the span, mbsd keeps the blocks.
        let blocked = DecodeParams {
            strategy: Strategy::Mbsd(MbsdParams::default()),
            ..span
        };
        assert_eq!(blocks(blocked, ask(None, None, None, None), &ck), (24, 8));
    }
}
