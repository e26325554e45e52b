//! Command-line arguments shared by `generate`, `eval`, `latency-profile` and the benchmarks:
//! decoding ([`DecodeArgs`]) and the device ([`DeviceArgs`]), flattened into each binary's clap
//! `Args`, so that every tool spells the flags the same way and resolves them with the same rules
//! (the lengths and schedule through [`dllm_decode::DecodeParams::resolve`]).

use std::path::PathBuf;
use std::sync::Arc;

use anyhow::{bail, Context, Result};
use dllm_decode::latency::LatencyTable;
use dllm_decode::params::{
    DEFAULT_MAX_REMASKS, DEFAULT_NEAR_WAIT, DEFAULT_PARTNERS_WITHIN, DEFAULT_SHADOW_ALLOWANCE,
    DEFAULT_TAU_BACK, DEFAULT_THETA_STABLE, DEFAULT_THETA_VISIBLE, DEFAULT_WAIT_LEFT,
};
use dllm_decode::{
    Decide, DecodeParams, Decoder, DreamParams, Joint, MbsdParams, NearWait, Outcome, Requested,
    Staged, Strategy, Verify,
};
use dllm_models::source::DecodeDefaults;

mod device;
mod flags;

pub use device::{device_counters, DeviceArgs};
pub use flags::{cli_error, flag_of};

/// Decoding flags.
#[derive(clap::Args, Debug, Clone)]
pub struct DecodeArgs {
    /// Generated positions [default: the checkpoint's recommendation, else 128].
    #[arg(long)]
    pub gen_length: Option<usize>,
    /// Block length [default: gen-length (one block) for mbsd with a span (LLaDA models' default,
    /// see --span); else the checkpoint's if it divides gen-length, else 32 if it does, else
    /// gen-length].
    #[arg(long)]
    pub block_length: Option<usize>,
    /// Total denoising steps [default: gen-length when --gen-length is given (one token per step),
    /// else the checkpoint's recommendation, else gen-length].
    #[arg(long)]
    pub steps: Option<usize>,
    /// mbsd (multi-block speculative decoding with staged decisions, verification and, on LLaDA
    /// models, a window of 16 positions sliding across the answer as one block, its bucket fit
    /// counting the shown guess's row, a shown guess and the near wait: on 600 long-math
    /// questions nothing was chosen on (fresh8), tiny-llada-long 599 right vs threshold-0.9's 571
    /// and vanilla's 598, in 8.32 forwards vs threshold 0.9's 8.99, projected 7.14 s vs
    /// dual-cache + threshold 0.9's 12.03 s; `--no-span --wait-near 2` is the default before the
    /// span, on fresh7 598 in 9.13 forwards against 598 in 8.43 with it; Dream models decide by
    /// the threshold rule at 0.9 with a refresh at each block start instead of sliding, the
    /// shown guess with guess agreement and no bucket fit: on fresh9, which chose nothing,
    /// tiny-dream-long 582 of 600 in 10.13 forwards vs threshold 0.9's 577 in 10.80 and
    /// vanilla's 567; see the README), vanilla (the model's reference
    /// algorithm, one token per step by default), prefix-cache or dual-cache (Fast-dLLM).
    #[arg(long, default_value = "mbsd")]
    pub strategy: String,
    /// Parallel decoding: unmask every masked token of the block with confidence >= this
    /// [default: the checkpoint's unless --steps is given; 0.9 for mbsd on Dream models]. With
    /// mbsd's staged decisions (LLaDA models) it sets --theta-visible and --theta-stable to the
    /// same value.
    #[arg(long)]
    pub threshold: Option<f32>,
    /// Confidence: low_confidence, random, topk_margin or entropy.
    #[arg(long, default_value = "low_confidence")]
    pub remasking: String,
    /// Sampling temperature (0 = greedy, deterministic).
    #[arg(long, default_value_t = 0.0)]
    pub temperature: f32,
    /// Seed for sampling and random remasking.
    #[arg(long, default_value_t = dllm_decode::params::DEFAULT_SEED)]
    pub seed: u64,
    /// Classifier-free guidance scale (vanilla only).
    #[arg(long, default_value_t = 0.0)]
    pub cfg_scale: f32,
    /// Never predict EOS (LLaDA logits_eos_inf).
    #[arg(long)]
    pub logits_eos_inf: bool,
    /// Rank EOS/EoT predictions last (LLaDA confidence_eos_eot_inf).
    #[arg(long)]
    pub confidence_eos_eot_inf: bool,
    /// Decode every block even after one ends in EOS.
    #[arg(long)]
    pub no_early_stop: bool,
    /// Dream: origin, maskgit_plus, topk_margin or entropy.
    #[arg(long, default_value = "maskgit_plus")]
    pub alg: String,
    /// Dream: final timestep.
    #[arg(long, default_value_t = dllm_decode::params::DEFAULT_DREAM_EPS)]
    pub eps: f64,
    /// Dream: temperature of the position-selection softmax.
    #[arg(long)]
    pub alg_temp: Option<f32>,
    /// Dream: nucleus sampling.
    #[arg(long)]
    pub top_p: Option<f32>,
    /// Dream: top-k sampling.
    #[arg(long)]
    pub top_k: Option<usize>,
    /// mbsd: keep the window on the current block (no sliding into future blocks; the default
    /// for Dream models, which refresh at each block start instead).
    #[arg(long, conflicts_with = "sliding")]
    pub no_sliding: bool,
    /// mbsd: slide the window along the commit frontier into future blocks (the default for LLaDA
    /// models).
    #[arg(long)]
    pub sliding: bool,
    /// mbsd: extend the window into the next block late in a block while the latency table says
    /// it is nearly free (off by default: see the README's speed/quality picture).
    #[arg(long, conflicts_with = "no_lookahead")]
    pub lookahead: bool,
    /// mbsd: never extend the window late in a block (the default; kept for scripts).
    #[arg(long)]
    pub no_lookahead: bool,
    /// mbsd: never cut the window back to the latency table's bucket edge (the default for Dream
    /// models).
    #[arg(long, conflicts_with = "bucket_fit")]
    pub no_bucket_fit: bool,
    /// mbsd: cut a window a few positions past a bucket edge of the latency table back to the
    /// edge (the default for LLaDA models).
    #[arg(long)]
    pub bucket_fit: bool,
    /// mbsd: count the shown guess's shadow rows in the forward the bucket fit fits to a bucket
    /// (the window gives up its last positions for them) [default: on for LLaDA models with a
    /// span, off otherwise]; needs the bucket fit and the shown guess (the README's `generate`
    /// reference).
    #[arg(long, conflicts_with_all = ["no_bucket_fit", "no_fit_guess"])]
    pub fit_guess: bool,
    /// mbsd: never count the shown guess's rows in the bucket fit (without a span it is off
    /// anyway).
    #[arg(long)]
    pub no_fit_guess: bool,
    /// mbsd: a window covers at most N positions from the commit frontier, and the answer is one
    /// block unless --block-length is given, so the window slides across the whole answer
    /// [default: 16 on LLaDA models; none on Dream models, whose window keeps the block] (the
    /// README's `generate` reference)
    #[arg(long, value_name = "N", conflicts_with = "no_span")]
    pub span: Option<usize>,
    /// mbsd: no span: a window reaches the end of its block, and the blocks are the
    /// checkpoint's or 32 positions (the LLaDA default before the span, with --wait-near 2).
    #[arg(long)]
    pub no_span: bool,
    /// mbsd: never leave decided positions out of the window's left to fit a bucket edge (by
    /// default a window whose rows — with the row before it on Dream, the verification rows and
    /// the shown guess's shadow — would pass a bucket edge leaves out decided positions before
    /// the frontier whose cached K/V are current).
    #[arg(long)]
    pub no_trim_left: bool,
    /// mbsd: look ahead once the current block has at most this many undecided positions.
    #[arg(long, default_value_t = dllm_decode::params::DEFAULT_LOOKAHEAD_TRIGGER)]
    pub lookahead_trigger: usize,
    /// mbsd: extra latency lookahead may add, as a fraction of the window's (per the latency table).
    #[arg(long, default_value_t = dllm_decode::params::DEFAULT_LOOKAHEAD_ALLOWANCE)]
    pub lookahead_allowance: f64,
    /// mbsd: extra memory lookahead may add (K/V and activations), MiB.
    #[arg(long, default_value_t = dllm_decode::params::DEFAULT_LOOKAHEAD_BUDGET_MIB)]
    pub lookahead_budget: f64,
    /// mbsd: the latency table pricing lookahead and verification rows (written by
    /// latency-profile) [default: the SM8750 NPU profile derived from the paper's Table 2, not
    /// measured].
    #[arg(long)]
    pub latency_table: Option<PathBuf>,
    /// mbsd: show drafts at least this confident to later forwards instead of the mask.
    #[arg(long)]
    pub draft_context: Option<f32>,
    /// mbsd: start each block's first window at the canvas's start, recomputing the K/V of the
    /// prompt and of everything generated before the block (dual cache's block-start refresh
    /// without the masked suffix; the default for Dream models, see the README's *Default
    /// decoding*).
    #[arg(long, conflicts_with = "no_refresh")]
    pub refresh: bool,
    /// mbsd: never refresh at a block start (the default for LLaDA models).
    #[arg(long)]
    pub no_refresh: bool,
    /// mbsd: show a guess — each forward writes the previous forward's prediction for the
    /// window's first undecided position into its canvas and checks it with a shadow row; when
    /// confirmed, what depends on it can be decided in the same forward (one extra row per
    /// forward; the default for LLaDA models, and for Dream models deciding by the threshold rule)
    #[arg(long, conflicts_with = "no_show_guess")]
    pub show_guess: bool,
    /// mbsd: never show a guess (the default for Dream models with staged decisions, `--sts`)
    #[arg(long)]
    pub no_show_guess: bool,
    /// mbsd, threshold rule: a shown guess whose shadow is below the threshold takes its old
    /// course — the step decides the guess's position by the shadow's prediction and nothing
    /// after it — instead of guess agreement (the default: a shadow that still predicts the
    /// guessed token agrees and every row counts; one that predicts another token decides
    /// nothing, and the next forward shows no guess)
    #[arg(long)]
    pub no_guess_agreement: bool,
    /// mbsd: no staged decisions (decisions are final at once, by --threshold or the schedule;
    /// the default for Dream models, at threshold 0.9).
    #[arg(long, conflicts_with = "sts")]
    pub no_sts: bool,
    /// mbsd: staged decisions (visible at --theta-visible, final at --theta-stable, with
    /// verification; the default for LLaDA models, and on Dream models whenever a flag of
    /// staged decisions is given).
    #[arg(long)]
    pub sts: bool,
    /// No selective logits skipping (every window row goes through the LM head, as the reference
    /// implementations do; the output is the same).
    #[arg(long)]
    pub no_sls: bool,
    /// mbsd: confidence at which a prediction becomes visible (tentative) context [default: 0.9].
    #[arg(long)]
    pub theta_visible: Option<f32>,
    /// mbsd: confidence at which a token becomes final [default: 0.9; 0.95 before the near
    /// wait].
    #[arg(long)]
    pub theta_stable: Option<f32>,
    /// mbsd: no verification of tentative tokens (Visible tokens are never looked at again).
    #[arg(long)]
    pub no_verify: bool,
    /// mbsd verification: a tentative token whose shadow row gives it less than this probability
    /// goes back to the mask.
    #[arg(long, default_value_t = DEFAULT_TAU_BACK)]
    pub tau_back: f32,
    /// mbsd verification: remasks per position at most.
    #[arg(long, default_value_t = DEFAULT_MAX_REMASKS)]
    pub max_remasks: usize,
    /// mbsd verification: a decision taken while its window holds a tentative token not yet
    /// looked at is tentative too.
    #[arg(long)]
    pub suspect_dependents: bool,
    /// mbsd verification: a token decided in the same step as another decision at most 8
    /// positions away waits for a fresh look (a shadow row) before it is final, unless decided at
    /// least 0.9999 confident: `on`, `off`, or `auto` (on for LLaDA unless the window shows a
    /// guess, off for Dream, as chosen on the tuning and confirmation sets) [default: auto].
    #[arg(long)]
    pub joint_check: Option<String>,
    /// mbsd verification: a step that sends a token back still takes all its other decisions and
    /// lets its other verification rows make tokens final (by default it takes only its most
    /// confident candidate, tentatively, and makes nothing final: the others saw the rejected
    /// token).
    #[arg(long)]
    pub no_hold: bool,
    /// mbsd staged decisions: allow two adjacent positions to be decided in one step below
    /// --theta-stable (by default they are kept apart).
    #[arg(long)]
    pub allow_adjacent: bool,
    /// mbsd staged decisions: a candidate below --theta-stable waits while an undecided position
    /// lies at most this many positions before it (it was predicted without its left context: a
    /// result digit before its operand); 0 never waits.
    #[arg(long, default_value_t = DEFAULT_WAIT_LEFT)]
    pub wait_left: usize,
    /// mbsd staged decisions, the near wait: a candidate below --wait-near-below, at any
    /// threshold, waits while an undecided position lies at most this many positions before it
    /// (a result digit decided in the forward that decides its operand saw it masked); 0 never
    /// waits.
    #[arg(long, default_value_t = DEFAULT_NEAR_WAIT.within)]
    pub wait_near: usize,
    /// mbsd staged decisions: the confidence at which the near wait (--wait-near) lets a
    /// candidate go.
    #[arg(long, default_value_t = DEFAULT_NEAR_WAIT.below)]
    pub wait_near_below: f32,
    /// mbsd verification: a token's verification row leaves out (sees masked) the tentative
    /// tokens after it, at most this many positions away, that were decided in the same step or
    /// later — they may rest on it, and two unverified tokens must not confirm each other (the
    /// tokens before it, its operands, stay in view); 0 shows them.
    #[arg(long, default_value_t = DEFAULT_PARTNERS_WITHIN)]
    pub partners_within: usize,
    /// mbsd verification: shadow rows beyond the latency bucket's free rows may add this fraction
    /// of the forward's latency.
    #[arg(long, default_value_t = DEFAULT_SHADOW_ALLOWANCE)]
    pub verify_allowance: f64,
    /// Retired (the CPU re-score path was replaced by verification: see --no-verify).
    #[arg(long, hide = true)]
    pub no_scr: bool,
    /// Retired (the CPU re-score path was replaced by verification: see --tau-back).
    #[arg(long, hide = true)]
    pub revision_margin: Option<f32>,
    /// Retired (the CPU re-score path was replaced by verification: see --verify-allowance).
    #[arg(long, hide = true)]
    pub refresh_budget: Option<f64>,
    /// Retired (the CPU re-score path was replaced by verification).
    #[arg(long, hide = true)]
    pub cpu_latency_table: Option<PathBuf>,
}

/// `--threshold T` under staged decisions (`--strategy mbsd` without `--no-sts`, the default)
/// means "commit at confidence T": `theta_visible = theta_stable = T` (no visible-but-unstable
/// stage), and no threshold of its own. Given with `--theta-visible` or `--theta-stable` it is an
/// error (two rules for one decision). Returns the threshold left for the schedule.
///
/// `--steps` there is an error too: staged decisions go by confidence, not by a step schedule (a
/// step count would be silently ignored).
pub fn staged_threshold(
    p: &mut DecodeParams,
    threshold: Option<f32>,
    thetas_given: bool,
    steps: Option<usize>,
) -> Result<Option<f32>> {
    let Decide::Staged(mut staged) = p.decide else {
        return Ok(threshold);
    };
    if steps.is_some() {
        bail!(
            "invalid parameter `--steps`: with staged decisions (strategy mbsd, the default) decisions follow --theta-visible / --theta-stable, not a step schedule; pass --strategy vanilla (or another strategy, or --no-sts) for a step count"
        );
    }
    match threshold {
        Some(t) => {
            if !(t > 0.0 && t <= 1.0) {
                bail!("invalid parameter `--threshold`: {t} is not in (0, 1]");
            }
            if thetas_given {
                bail!(
                    "invalid parameter `--threshold`: with staged decisions (strategy mbsd) --threshold T sets --theta-visible and --theta-stable to T; give either --threshold or the thetas"
                );
            }
            staged.visible = t;
            staged.stable = t;
            p.decide = Decide::Staged(staged);
            Ok(None)
        }
        None => Ok(None),
    }
}

/// A flag that only one decoder reads, given where it does not apply.
/// A setting given on the command line as `--x` / `--no-x` (clap refuses both), else `None`: the
/// decoder's per-family default.
fn flag_pair(on: bool, off: bool) -> Option<bool> {
    (on || off).then_some(on)
}

fn only(flag: &str, who: &str) -> dllm_decode::DecodeError {
    dllm_decode::DecodeError::InvalidParam {
        name: "strategy",
        reason: format!("{flag} applies to {who} only"),
    }
}

impl DecodeArgs {
    /// The defaults of every decoding flag (what a tool runs with when given none of them).
    pub fn defaults() -> Self {
        #[derive(clap::Parser)]
        struct Only {
            #[command(flatten)]
            decode: DecodeArgs,
        }
        <Only as clap::Parser>::try_parse_from(["defaults"])
            .expect("every decoding flag has a default")
            .decode
    }

    /// Every decoding flag checked before any work (loading a model takes seconds): everything
    /// but what depends on the checkpoint's recommended lengths. Lengths a flag leaves to the
    /// checkpoint are given values that make the flags that are set valid when any checkpoint
    /// could, so this never rejects what [`Self::params`] would accept; [`Self::params`] checks
    /// the rest once the checkpoint is known. The model family is not known yet either (some
    /// defaults are per family: [`Self::params`]), so the flags pass when they are valid for
    /// either family. The latency table is read here too.
    pub fn check(&self) -> Result<()> {
        let before_load = |shift_logits: bool| -> Result<()> {
            let (base, threshold) = self.base(shift_logits)?;
            check_before_load(
                base,
                Requested {
                    gen_length: self.gen_length,
                    block_length: self.block_length,
                    steps: self.steps,
                    threshold,
                },
            )
        };
        before_load(false).or_else(|e| before_load(true).map_err(|_| e))?;
        self.latency_table()?;
        Ok(())
    }

    /// The parameters these flags set for a model with (`shift_logits`) or without shifted
    /// logits, lengths and schedule aside, and the threshold left for the schedule
    /// ([`staged_threshold`]).
    fn base(&self, shift_logits: bool) -> Result<(DecodeParams, Option<f32>)> {
        let mut p = self.flags_params(shift_logits).map_err(cli_error)?;
        let thetas_given = self.theta_visible.is_some() || self.theta_stable.is_some();
        let threshold = staged_threshold(&mut p, self.threshold, thetas_given, self.steps)?;
        Ok((p, threshold))
    }

    /// Flags of the retired CPU re-score path: an error saying what replaced them.
    fn retired(&self) -> std::result::Result<(), dllm_decode::DecodeError> {
        let given = [
            ("--no-scr", self.no_scr),
            ("--revision-margin", self.revision_margin.is_some()),
            ("--refresh-budget", self.refresh_budget.is_some()),
            ("--cpu-latency-table", self.cpu_latency_table.is_some()),
        ];
        match given.iter().find(|g| g.1) {
            Some((flag, _)) => Err(dllm_decode::DecodeError::InvalidParam {
                name: "strategy",
                reason: format!(
                    "{flag} belonged to the CPU re-score path, which was retired (it re-scored \
                     a token against the cache of the very forward that decided it, so it always \
                     agreed); verification replaces it: --no-verify, --tau-back, \
                     --verify-allowance"
                ),
            }),
            None => Ok(()),
        }
    }

    /// The window policy these flags ask for, and an error for mbsd flags without mbsd.
    fn strategy(&self) -> std::result::Result<Strategy, dllm_decode::DecodeError> {
        let m = MbsdParams {
            sliding: flag_pair(self.sliding, self.no_sliding),
            lookahead: self.lookahead,
            fit_bucket: flag_pair(self.bucket_fit, self.no_bucket_fit),
            fit_guess: flag_pair(self.fit_guess, self.no_fit_guess),
            span: self.span,
            trim_left: !self.no_trim_left,
            trigger: self.lookahead_trigger,
            allowance: self.lookahead_allowance,
            budget_mib: self.lookahead_budget,
            draft_context: self.draft_context,
            refresh: flag_pair(self.refresh, self.no_refresh),
            show_guess: flag_pair(self.show_guess, self.no_show_guess),
            guess_agreement: !self.no_guess_agreement,
        };
        let strategy: Strategy = self.strategy.parse()?;
        if strategy.is_mbsd() {
            return Ok(Strategy::Mbsd(m));
        }
        let d = MbsdParams::default();
        let given = [
            ("--no-sliding", self.no_sliding),
            ("--sliding", self.sliding),
            ("--lookahead", self.lookahead),
            ("--no-lookahead", self.no_lookahead),
            ("--no-bucket-fit", self.no_bucket_fit),
            ("--bucket-fit", self.bucket_fit),
            ("--fit-guess", self.fit_guess),
            ("--no-fit-guess", self.no_fit_guess),
            ("--span", self.span.is_some()),
            ("--no-span", self.no_span),
            ("--no-trim-left", self.no_trim_left),
            ("--lookahead-trigger", m.trigger != d.trigger),
            ("--lookahead-allowance", m.allowance != d.allowance),
            ("--lookahead-budget", m.budget_mib != d.budget_mib),
            ("--draft-context", m.draft_context.is_some()),
            ("--refresh", self.refresh),
            ("--show-guess", self.show_guess),
            ("--no-show-guess", self.no_show_guess),
            ("--no-guess-agreement", self.no_guess_agreement),
            ("--no-refresh", self.no_refresh),
            ("--latency-table", self.latency_table.is_some()),
            ("--no-sts", self.no_sts),
            ("--sts", self.sts),
        ];
        match given.iter().find(|g| g.1) {
            Some((flag, _)) => Err(only(flag, "--strategy mbsd")),
            None => Ok(strategy),
        }
    }

    /// The decision rule these flags ask for on a model with (`shift_logits`, Dream) or without
    /// shifted logits: for mbsd without --no-sts, staged decisions when the model family's
    /// default is staged (LLaDA) or a flag of staged decisions is given (--sts, the thetas,
    /// verification's flags), else the family's default rule ([`Strategy::default_decide`]:
    /// the threshold rule at 0.9 on Dream models; --threshold sets its threshold); elsewhere left
    /// to the threshold / schedule of [`DecodeParams::resolve`], and an error for staged flags.
    fn decide(
        &self,
        strategy: Strategy,
        shift_logits: bool,
    ) -> std::result::Result<Decide, dllm_decode::DecodeError> {
        let verify = Verify {
            tau_back: self.tau_back,
            max_remasks: self.max_remasks,
            suspect_dependents: self.suspect_dependents,
            hold_on_remask: !self.no_hold,
            allowance: self.verify_allowance,
            joint: match &self.joint_check {
                Some(j) => j.parse()?,
                None => Joint::Auto,
            },
            partners_within: self.partners_within,
        };
        let d = Verify::default();
        let given = [
            ("--theta-visible", self.theta_visible.is_some()),
            ("--theta-stable", self.theta_stable.is_some()),
            ("--no-verify", self.no_verify),
            ("--tau-back", verify.tau_back != d.tau_back),
            ("--max-remasks", verify.max_remasks != d.max_remasks),
            ("--suspect-dependents", self.suspect_dependents),
            ("--joint-check", self.joint_check.is_some()),
            ("--no-hold", self.no_hold),
            ("--allow-adjacent", self.allow_adjacent),
            ("--wait-left", self.wait_left != DEFAULT_WAIT_LEFT),
            ("--wait-near", self.wait_near != DEFAULT_NEAR_WAIT.within),
            (
                "--wait-near-below",
                self.wait_near_below != DEFAULT_NEAR_WAIT.below,
            ),
            ("--verify-allowance", verify.allowance != d.allowance),
            (
                "--partners-within",
                verify.partners_within != d.partners_within,
            ),
        ];
        if self.wait_near == 0 && self.wait_near_below != DEFAULT_NEAR_WAIT.below {
            return Err(dllm_decode::DecodeError::InvalidParam {
                name: "near_wait.below",
                reason: "--wait-near-below sets the near wait's confidence, and --wait-near 0 \
                         turns the near wait off"
                    .into(),
            });
        }
        let staged_asked = self.sts || given.iter().any(|g| g.1);
        if strategy.is_mbsd() && !self.no_sts {
            let family = strategy.default_decide(shift_logits);
            if staged_asked || matches!(family, Decide::Staged(_)) {
                return Ok(Decide::Staged(Staged {
                    visible: self.theta_visible.unwrap_or(DEFAULT_THETA_VISIBLE),
                    stable: self.theta_stable.unwrap_or(DEFAULT_THETA_STABLE),
                    no_adjacent: !self.allow_adjacent,
                    wait_left: self.wait_left,
                    near_wait: (self.wait_near > 0).then_some(NearWait {
                        within: self.wait_near,
                        below: self.wait_near_below,
                    }),
                    verify: (!self.no_verify).then_some(verify),
                }));
            }
            return Ok(family);
        }
        match given.iter().find(|g| g.1) {
            Some((flag, _)) => Err(only(
                flag,
                "staged decisions (--strategy mbsd without --no-sts)",
            )),
            None => Ok(Decide::Schedule),
        }
    }

    /// [`Self::flags`] with the library's error.
    fn flags_params(
        &self,
        shift_logits: bool,
    ) -> std::result::Result<DecodeParams, dllm_decode::DecodeError> {
        self.retired()?;
        let strategy = match self.strategy()? {
            // The span: asked, else none with --no-span, else the family's.
            Strategy::Mbsd(m) if m.span.is_none() && !self.no_span => Strategy::Mbsd(MbsdParams {
                span: MbsdParams::default_span(shift_logits),
                ..m
            }),
            s => s,
        };
        Ok(DecodeParams {
            strategy,
            decide: self.decide(strategy, shift_logits)?,
            remasking: self.remasking.parse()?,
            temperature: self.temperature,
            seed: self.seed,
            cfg_scale: self.cfg_scale,
            logits_eos_inf: self.logits_eos_inf,
            confidence_eos_eot_inf: self.confidence_eos_eot_inf,
            early_stop: !self.no_early_stop,
            sls: !self.no_sls,
            dream: DreamParams {
                alg: self.alg.parse()?,
                eps: self.eps,
                alg_temp: self.alg_temp,
                top_p: self.top_p,
                top_k: self.top_k,
            },
            ..Default::default()
        })
    }

    /// The decoding parameters: these flags over the checkpoint's recommendations, for a model
    /// with (`shift_logits`, Dream: `info.shift_logits`) or without shifted logits (the decision
    /// rule mbsd uses when none is asked for is per family: [`Strategy::default_decide`]).
    pub fn params(&self, checkpoint: &DecodeDefaults, shift_logits: bool) -> Result<DecodeParams> {
        let (base, threshold) = self.base(shift_logits)?;
        let asked = Requested {
            gen_length: self.gen_length,
            block_length: self.block_length,
            steps: self.steps,
            threshold,
        };
        let p = base.resolve(asked, checkpoint);
        p.validate().map_err(cli_error)?;
        Ok(p)
    }

    /// The decoding parameters, resolved and validated, with the library's error (naming the
    /// [`DecodeParams`] field) for callers that spell fields their own way (the server's JSON).
    pub fn resolve(
        &self,
        checkpoint: &DecodeDefaults,
        shift_logits: bool,
    ) -> std::result::Result<DecodeParams, dllm_decode::DecodeError> {
        let mut p = self.flags_params(shift_logits)?;
        let thetas_given = self.theta_visible.is_some() || self.theta_stable.is_some();
        let threshold = staged_threshold(&mut p, self.threshold, thetas_given, self.steps)
            .map_err(|e| {
                // Its errors name `--steps` or `--threshold`: the field of the same name.
                let e = e.to_string();
                let (name, reason) = ["steps", "threshold"]
                    .into_iter()
                    .find_map(|n| {
                        e.strip_prefix(&format!("invalid parameter `--{n}`: "))
                            .map(|r| (n, r.to_string()))
                    })
                    .unwrap_or(("threshold", e.clone()));
                dllm_decode::DecodeError::InvalidParam { name, reason }
            })?;
        let asked = Requested {
            gen_length: self.gen_length,
            block_length: self.block_length,
            steps: self.steps,
            threshold,
        };
        let p = p.resolve(asked, checkpoint);
        p.validate()?;
        Ok(p)
    }

    /// Whether these flags decode the answer as one block, whatever its length, on a model with
    /// (`shift_logits`) or without shifted logits: no `--block-length` and mbsd with a span
    /// ([`DecodeParams::one_block`]). False for flags that are invalid (their error comes from
    /// [`Self::resolve`]).
    pub fn one_block(&self, shift_logits: bool) -> bool {
        self.block_length.is_none() && self.flags_params(shift_logits).is_ok_and(|p| p.one_block())
    }

    /// The latency table of `--latency-table`, if given.
    pub fn latency_table(&self) -> Result<Option<Arc<LatencyTable>>> {
        self.latency_table
            .as_ref()
            .map(|p| Ok(Arc::new(LatencyTable::load(p).context("--latency-table")?)))
            .transpose()
    }

    /// A decoder for `params` with the latency table of these flags.
    pub fn decoder(&self, params: DecodeParams) -> Result<Decoder<'static>> {
        let mut d = Decoder::new(params);
        if let Some(t) = self.latency_table()? {
            d = d.latency_table(t);
        }
        Ok(d)
    }
}

/// Check decoding parameters before the checkpoint is known: `base` with the lengths and
/// threshold `asked` for. The lengths left to the checkpoint get values that make the asked ones
/// valid whenever some checkpoint could (so nothing accepted later is rejected here); what
/// depends on the checkpoint is checked again by [`DecodeParams::validate`] after loading.
pub fn check_before_load(base: DecodeParams, asked: Requested) -> Result<()> {
    let (g, b, s) = (asked.gen_length, asked.block_length, asked.steps);
    for (v, name) in [(g, "gen_length"), (b, "block_length"), (s, "steps")] {
        if v == Some(0) {
            return Err(cli_error(dllm_decode::DecodeError::InvalidParam {
                name,
                reason: "must be positive".into(),
            }));
        }
    }
    let (gen_length, block_length, steps) = match (g, b, s) {
        (Some(g), b, s) => (g, b.unwrap_or(g), s.unwrap_or(g)),
        (None, Some(b), Some(s)) => (b.saturating_mul(s), b, s),
        (None, Some(b), None) => (b, b, b),
        (None, None, Some(s)) => (s, s, s),
        (None, None, None) => (1, 1, 1),
    };
    let decide = match asked.threshold {
        Some(t) => Decide::Threshold(t),
        None => base.decide,
    };
    DecodeParams {
        gen_length,
        block_length,
        steps,
        decide,
        ..base
    }
    .validate()
    .map_err(cli_error)
}

/// The counters of a generation, under the names every tool reports them (`generate --json`, the
/// bench's `results.json`).
pub fn counters(g: &Outcome) -> serde_json::Map<String, serde_json::Value> {
    let v = serde_json::json!({
        "forwards": g.forwards,
        "steps": g.steps,
        "tokens_decoded": g.tokens_decoded,
        "mean_active_per_forward": g.mean_active_per_forward(),
        "tokens_per_forward": g.tokens_per_forward(),
        "draft_predictions": g.draft_predictions,
        "drafts": g.drafts,
        "drafts_accepted": g.drafts_accepted,
        "drafts_rejected": g.drafts_rejected,
        "lookahead_positions": g.lookahead_positions,
        "revised": g.revised,
        "verified": g.verified,
        "remasks": g.remasks(),
        "flip_flops": g.flip_flops,
        "logits_rows_skipped": g.logits_rows_skipped,
        "unstable_at_block_end": g.unstable_at_block_end,
        "guesses_shown": g.guesses_shown,
        "guesses_confirmed": g.guesses_confirmed,
        "guesses_agreed": g.guesses_agreed,
        "guesses_waited": g.guesses_waited,
    });
    match v {
        serde_json::Value::Object(m) => m,
        _ => unreachable!("a JSON object literal"),
    }
}
