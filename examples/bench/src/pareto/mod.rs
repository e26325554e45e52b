//! The speed/quality picture: every decoding configuration as one point per question set —
//! final-answer accuracy (with its Wilson interval and McNemar tests against the vanilla
//! baselines) against the projected SM8750 latency per answer and against the CPU wall time per
//! answer measured here — with the frontier of configurations no other one beats on both axes,
//! the fewest forwards per strategy at the baseline's accuracy, and what each mechanism
//! contributes to the headline configurations. Written as `pareto.md`, `pareto.svg` and
//! `pareto.json` ([`report`], [`plot`]); the configurations are [`specs`], the mechanism
//! ablations of the headlines [`contrib`].

pub mod contrib;
mod plot;
pub mod report;

use std::path::Path;
use std::time::Instant;

use anyhow::{bail, Result};
use dllm_decode::params::DEFAULT_NEAR_WAIT;
use dllm_decode::{Decide, DecodeParams, Joint, MbsdParams, NearWait, Staged, Strategy, Verify};
use dllm_tasks::eval::QuestionSet;
use dllm_tasks::Example;

use crate::projection::Target;
use crate::rows::{Dev, RowResult, RowSpec};

/// The label of the vanilla baseline (the McNemar reference and the accuracy bar of the
/// per-strategy table).
pub const VANILLA: &str = "vanilla";
/// The label of the vanilla baseline at threshold 0.9 (the second McNemar reference).
pub const VANILLA_T09: &str = "vanilla, threshold 0.9";
/// The label of mbsd at the decoder's defaults (a headline of the contributions table).
pub const DEFAULTS: &str = "mbsd (defaults)";

/// A strategy family of the per-strategy table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Family {
    /// The vanilla strategy, by schedule and at thresholds.
    Vanilla,
    /// The prefix cache.
    PrefixCache,
    /// The dual cache, by schedule and at thresholds.
    DualCache,
    /// mbsd with staged decisions and verification.
    MbsdVerify,
    /// mbsd without verification (staged without it, or final decisions at a threshold).
    MbsdNoVerify,
}

impl Family {
    /// Every family, in table order.
    pub const ALL: [Family; 5] = [
        Family::Vanilla,
        Family::PrefixCache,
        Family::DualCache,
        Family::MbsdVerify,
        Family::MbsdNoVerify,
    ];

    /// The family of a configuration (`None` for oracle rows: instruments, not decoders).
    pub fn of(spec: &RowSpec) -> Option<Family> {
        if spec.oracle {
            return None;
        }
        Some(match spec.params.strategy {
            Strategy::Vanilla => Family::Vanilla,
            Strategy::PrefixCache => Family::PrefixCache,
            Strategy::DualCache => Family::DualCache,
            Strategy::Mbsd(_) if verifies(&spec.params) => Family::MbsdVerify,
            Strategy::Mbsd(_) => Family::MbsdNoVerify,
        })
    }

    /// The name in the tables.
    pub fn name(self) -> &'static str {
        match self {
            Family::Vanilla => "vanilla (+ thresholds)",
            Family::PrefixCache => "prefix-cache",
            Family::DualCache => "dual-cache (+ thresholds)",
            Family::MbsdVerify => "mbsd, verification on",
            Family::MbsdNoVerify => "mbsd, verification off",
        }
    }
}

/// Whether a configuration verifies its tentative tokens.
pub fn verifies(p: &DecodeParams) -> bool {
    p.decide.staged().is_some_and(|s| s.verify.is_some())
}

/// One configuration of the picture: a label and how it decodes (on the CPU, whose decisions
/// equal the NPU's, projected to the NPU).
fn spec(label: impl Into<String>, params: DecodeParams, oracle: bool) -> RowSpec {
    RowSpec {
        label: label.into(),
        dev: Dev::Cpu,
        project_to: Target::Npu,
        params,
        oracle,
    }
}

/// The configurations of the picture, and the labels of grid points that equal another
/// configuration (each run once, under the first label).
#[derive(Debug, Clone)]
pub struct Specs {
    /// The configurations, in run order (the McNemar references first).
    pub rows: Vec<RowSpec>,
    /// `(label not run, the label it equals)`.
    pub same: Vec<(String, String)>,
    /// The model has shifted logits (Dream): the family whose defaults the configurations'
    /// mbsd settings are pinned to.
    pub shift_logits: bool,
}

impl Specs {
    /// Add `s` unless a configuration with the same decoding (and oracle switch) is there; its
    /// mbsd settings left to the model family are pinned first ([`MbsdParams::pinned`]), so two
    /// spellings of one decoder are one configuration and a report reads what runs.
    fn push(&mut self, mut s: RowSpec) {
        s.params = pin(s.params, self.shift_logits);
        // mbsd with a span decodes the answer as one block (`DecodeParams::resolve`'s rule).
        if s.params.one_block() {
            s.params.block_length = s.params.gen_length;
        }
        match self
            .rows
            .iter()
            .find(|r| r.params == s.params && r.oracle == s.oracle)
        {
            Some(r) => self.same.push((s.label, r.label.clone())),
            None => self.rows.push(s),
        }
    }
}

/// `p` with its mbsd settings left to the model family pinned for a model with
/// (`shift_logits`) or without shifted logits.
pub fn pin(p: DecodeParams, shift_logits: bool) -> DecodeParams {
    match p.strategy {
        Strategy::Mbsd(m) => DecodeParams {
            strategy: Strategy::Mbsd(m.pinned(shift_logits, p.decide)),
            ..p
        },
        _ => p,
    }
}

/// The verification part of a label: `verify tau 0.5` (with `, hold` / `, suspect dependents` /
/// other non-default settings), or `no verification`.
pub fn verify_label(v: Option<Verify>) -> String {
    match v {
        None => "no verification".into(),
        Some(v) => {
            let d = Verify::default();
            let mut s = format!("verify tau {}", v.tau_back);
            if v.hold_on_remask {
                s += ", hold";
            }
            if v.suspect_dependents {
                s += ", suspect dependents";
            }
            match v.joint {
                Joint::Auto => s += ", joint check auto",
                Joint::Off => s += ", no joint check",
                Joint::On(_) => s += ", joint check",
            }
            if v.max_remasks != d.max_remasks {
                s += &format!(", max remasks {}", v.max_remasks);
            }
            if v.allowance != d.allowance {
                s += &format!(", shadow allowance {}", v.allowance);
            }
            s
        }
    }
}

/// The label of a staged configuration.
pub fn staged_label(s: &Staged) -> String {
    format!(
        "mbsd, theta {} / {}, {}{}{}{}",
        s.visible,
        s.stable,
        verify_label(s.verify),
        if s.no_adjacent {
            ", adjacent apart"
        } else {
            ""
        },
        if s.wait_left > 0 {
            format!(", wait left {}", s.wait_left)
        } else {
            String::new()
        },
        s.near_wait.map_or(String::new(), |n| format!(
            ", wait near {} below {}",
            n.within, n.below
        )),
    )
}

/// The configurations: the baselines (vanilla at thresholds 0.9 / 0.8 / 0.7, dual-cache at
/// thresholds 0.99 / 0.98 / 0.95 / 0.9 / 0.8 / 0.7, prefix-cache, dual-cache), mbsd at its
/// defaults and with each mechanism off, mbsd's window at thresholds 0.95 / 0.98 / 0.99, mbsd reduced to
/// a block-start refresh at threshold 0.9 (no sliding, no bucket fit), and a grid of
/// staged decisions: theta_visible 0.6..0.9 at theta_stable 0.9, each without verification and
/// adjacency rule (the decoder before verification), with the adjacency rule alone, with
/// verification (tau_back 0.5; tau_back 0.9 holding a step's other decisions when it remasks),
/// with suspect dependents at two points, theta_stable 0.95 at two points; and the oracle rows.
/// `quick` keeps a handful.
pub fn specs(base: &DecodeParams, quick: bool, shift_logits: bool) -> Specs {
    let with = |strategy: Strategy, decide: Decide| DecodeParams {
        strategy,
        decide,
        ..*base
    };
    // The tools' mbsd settings for this family: with the span on LLaDA (one block).
    let mbsd_with = |f: &dyn Fn(&mut MbsdParams), decide: Decide| {
        let mut m = MbsdParams::for_family(shift_logits);
        f(&mut m);
        with(Strategy::Mbsd(m), decide)
    };
    // The decoder's defaults for this model's family (staged decisions on LLaDA, the threshold
    // rule on Dream), every setting the family decides pinned.
    let d = Strategy::Mbsd(MbsdParams::default()).default_decide(shift_logits);
    let ds = Staged::default();
    let mbsd = pin(mbsd_with(&|_| {}, d), shift_logits);
    let mut v = Specs {
        rows: Vec::new(),
        same: Vec::new(),
        shift_logits,
    };
    v.push(spec(
        VANILLA,
        with(Strategy::Vanilla, Decide::Schedule),
        false,
    ));
    // Vanilla with a threshold is LLaDA's `generate` with Fast-dLLM's rule; a Dream model's
    // vanilla is Dream's own algorithm, which has no threshold (an error, not a row).
    let thresholds: &[f32] = if shift_logits { &[] } else { &[0.9, 0.8, 0.7] };
    if thresholds.contains(&0.9) {
        v.push(spec(
            VANILLA_T09,
            with(Strategy::Vanilla, Decide::Threshold(0.9)),
            false,
        ));
    }
    let no_verify = mbsd_with(&|_| {}, Decide::Staged(Staged { verify: None, ..ds }));
    if quick {
        v.push(spec(
            "dual-cache, threshold 0.9",
            with(Strategy::DualCache, Decide::Threshold(0.9)),
            false,
        ));
        v.push(spec(DEFAULTS, mbsd, false));
        v.push(spec(
            "mbsd, no verification (--no-verify)",
            no_verify,
            false,
        ));
        v.push(spec("mbsd, oracle revision", mbsd, true));
        return v;
    }
    for &t in thresholds.iter().filter(|&&t| t < 0.9) {
        v.push(spec(
            format!("vanilla, threshold {t}"),
            with(Strategy::Vanilla, Decide::Threshold(t)),
            false,
        ));
    }
    v.push(spec(
        "prefix-cache",
        with(Strategy::PrefixCache, Decide::Schedule),
        false,
    ));
    v.push(spec(
        "dual-cache",
        with(Strategy::DualCache, Decide::Schedule),
        false,
    ));
    // Above 0.9 the threshold rule trades forwards for accuracy: the forwards frontier every
    // other decoder is measured against (README, *Default decoding*).
    for t in [0.99f32, 0.98, 0.95, 0.9, 0.8, 0.7] {
        v.push(spec(
            format!("dual-cache, threshold {t}"),
            with(Strategy::DualCache, Decide::Threshold(t)),
            false,
        ));
    }
    v.push(spec(DEFAULTS, mbsd, false));
    // The shown guess at a higher stable threshold, and without the bucket fit (the choice of
    // the defaults' numbers, README, *Default decoding*).
    let stable = |t: f32| Decide::Staged(Staged { stable: t, ..ds });
    v.push(spec(
        "mbsd, theta_stable 0.96 (--theta-stable 0.96)",
        mbsd_with(&|_| {}, stable(0.96)),
        false,
    ));
    v.push(spec(
        "mbsd, theta_stable 0.96, no bucket fit (--theta-stable 0.96 --no-bucket-fit)",
        mbsd_with(&|m| m.fit_bucket = Some(false), stable(0.96)),
        false,
    ));
    // The staged decisions before the near wait (2026-12-06's fourth session), LLaDA's default
    // then (blocks, no span).
    let before_near = Staged {
        stable: 0.95,
        near_wait: None,
        ..ds
    };
    if !shift_logits {
        let no_span = |f: &dyn Fn(&mut MbsdParams), decide: Decide| {
            mbsd_with(
                &|m| {
                    m.span = None;
                    f(m)
                },
                decide,
            )
        };
        // LLaDA's default before the span: blocks, the near wait reaching 2 positions.
        let near2 = NearWait {
            within: 2,
            ..DEFAULT_NEAR_WAIT
        };
        v.push(spec(
            "mbsd, the default before the span (--no-span --wait-near 2)",
            no_span(
                &|_| {},
                Decide::Staged(Staged {
                    near_wait: Some(near2),
                    ..ds
                }),
            ),
            false,
        ));
        v.push(spec(
            "mbsd, the default before the near wait (--no-span --theta-stable 0.95 --wait-near 0)",
            no_span(&|_| {}, Decide::Staged(before_near)),
            false,
        ));
    }
    v.push(spec(
        "mbsd, no shown guess, no joint check (--no-show-guess --joint-check off)",
        mbsd_with(
            &|m| m.show_guess = Some(false),
            Decide::Staged(Staged {
                verify: Some(Verify {
                    joint: Joint::Off,
                    ..Verify::default()
                }),
                ..ds
            }),
        ),
        false,
    ));
    for (label, p) in contrib::switched_off(&mbsd) {
        v.push(spec(format!("mbsd, {label}"), p, false));
    }
    // Dream's default before the shown guess (the LLaDA default before the shown guess and the
    // near wait, on LLaDA).
    v.push(spec(
        "mbsd, staged decisions, bucket fit, no shown guess (--sts --bucket-fit --no-show-guess \
         --theta-stable 0.95 --wait-near 0 --no-span)",
        mbsd_with(
            &|m| {
                m.fit_bucket = Some(true);
                m.show_guess = Some(false);
                m.span = None
            },
            Decide::Staged(before_near),
        ),
        false,
    ));
    // mbsd's window with the threshold rule above 0.9 (its own forwards frontier).
    for t in [0.95f32, 0.98, 0.99] {
        v.push(spec(
            format!("mbsd, no STS, threshold {t}"),
            mbsd_with(&|_| {}, Decide::Threshold(t)),
            false,
        ));
    }
    v.push(spec(
        "mbsd, no sliding, no lookahead",
        mbsd_with(
            &|m| {
                m.sliding = Some(false);
                m.lookahead = false
            },
            d,
        ),
        false,
    ));
    // The paper's thetas with everything else at the defaults (staged decisions: on Dream the
    // shown guess is then off), with and without verification: the verification bar.
    let paper = Staged {
        visible: 0.7,
        stable: 0.9,
        ..ds
    };
    v.push(spec(
        "mbsd, theta 0.7 / 0.9, the rest at the defaults (--theta-visible 0.7 --theta-stable 0.9)",
        mbsd_with(&|_| {}, Decide::Staged(paper)),
        false,
    ));
    v.push(spec(
        "mbsd, theta 0.7 / 0.9, the rest at the defaults, no verification (--theta-visible 0.7 --theta-stable 0.9 --no-verify)",
        mbsd_with(
            &|_| {},
            Decide::Staged(Staged {
                verify: None,
                ..paper
            }),
        ),
        false,
    ));
    // Dual cache's block-start refresh without its suffix rows, decisions at threshold 0.9: what
    // closes Dream's gap to dual-cache (`examples/bench/defaults.md`, *Where the forwards go*).
    v.push(spec(
        "mbsd, no sliding, refresh (--refresh), threshold 0.9, no bucket fit",
        mbsd_with(
            &|m| {
                m.sliding = Some(false);
                m.lookahead = false;
                m.fit_bucket = Some(false);
                m.refresh = Some(true)
            },
            Decide::Threshold(0.9),
        ),
        false,
    ));
    // The defaults with each family's window: the block-start refresh in place of sliding
    // (Dream's default), and sliding without it (LLaDA's).
    for (label, sliding) in [
        ("mbsd, no sliding, refresh (--no-sliding --refresh)", false),
        ("mbsd, sliding, no refresh (--sliding --no-refresh)", true),
    ] {
        let window = |m: &mut MbsdParams| {
            m.sliding = Some(sliding);
            m.refresh = Some(!sliding)
        };
        v.push(spec(label, mbsd_with(&window, d), false));
    }
    let point = |s: Staged| {
        spec(
            staged_label(&s),
            mbsd_with(&|_| {}, Decide::Staged(s)),
            false,
        )
    };
    let tau = |tau_back: f32, hold: bool, suspect: bool| Verify {
        tau_back,
        hold_on_remask: hold,
        suspect_dependents: suspect,
        // The grid is the mechanisms before the joint check (the defaults' rows have it).
        joint: Joint::Off,
        ..Verify::default()
    };
    // The grid is the decisions before the left wait too (a row below adds it).
    let at = |visible: f32, stable: f32, no_adjacent: bool, verify: Option<Verify>| Staged {
        visible,
        stable,
        no_adjacent,
        wait_left: 0,
        near_wait: None,
        verify,
    };
    for tv in [0.6f32, 0.7, 0.8, 0.85, 0.9] {
        v.push(point(at(tv, 0.9, false, None)));
        v.push(point(at(tv, 0.9, true, None)));
        v.push(point(at(tv, 0.9, true, Some(tau(0.5, false, false)))));
        v.push(point(at(tv, 0.9, true, Some(tau(0.9, true, false)))));
    }
    v.push(point(at(0.8, 0.9, true, Some(tau(0.8, true, false)))));
    for tv in [0.7f32, 0.8] {
        v.push(point(at(tv, 0.9, false, Some(tau(0.9, true, false)))));
        v.push(point(at(tv, 0.9, true, Some(tau(0.9, true, true)))));
    }
    // The joint check at the paper's thresholds (the defaults' rows have it on LLaDA).
    let joint = Verify {
        joint: Joint::On(dllm_decode::JointRule::default()),
        ..tau(0.9, true, false)
    };
    v.push(point(at(0.7, 0.9, true, Some(joint))));
    // ... and with the left wait (both in the defaults).
    v.push(point(Staged {
        wait_left: ds.wait_left,
        ..at(0.7, 0.9, true, Some(joint))
    }));
    // ... and with the near wait (the three in the defaults).
    v.push(point(Staged {
        wait_left: ds.wait_left,
        near_wait: ds.near_wait,
        ..at(0.7, 0.9, true, Some(joint))
    }));
    for tv in [0.8f32, 0.9] {
        v.push(point(at(tv, 0.95, true, Some(tau(0.95, true, false)))));
        v.push(point(at(tv, 0.95, false, None)));
    }
    // With lookahead (off by default: its drafts cost logits rows on the CPU).
    for tv in [0.8f32, 0.85, 0.9] {
        for verify in [None, Some(tau(0.9, true, false))] {
            let s = at(tv, 0.9, true, verify);
            v.push(spec(
                format!("{}, with lookahead", staged_label(&s)),
                mbsd_with(&|m| m.lookahead = true, Decide::Staged(s)),
                false,
            ));
        }
    }
    v.push(spec("mbsd, oracle revision", mbsd, true));
    for tv in [0.5f32, 0.7, 0.8] {
        v.push(spec(
            format!("mbsd, theta {tv} / 0.9, no verification, oracle revision"),
            mbsd_with(&|_| {}, Decide::Staged(at(tv, 0.9, false, None))),
            true,
        ));
    }
    v
}

/// The configurations `--only` picks: for each pattern, the configuration with exactly that label
/// if there is one, else every configuration whose label contains it. Empty `only`: all.
pub fn select(rows: &[RowSpec], only: &[String]) -> Vec<RowSpec> {
    if only.is_empty() {
        return rows.to_vec();
    }
    rows.iter()
        .filter(|s| {
            only.iter().any(|o| {
                let o = o.trim();
                if rows.iter().any(|r| r.label == o) {
                    s.label == o
                } else {
                    s.label.contains(o)
                }
            })
        })
        .cloned()
        .collect()
}

/// Indices of the rows on the frontier of (cost, accuracy): no other row is at least as accurate
/// and strictly cheaper, or strictly more accurate and at most as expensive. Oracle rows are
/// instruments, not decoders: they are never on the frontier.
pub fn frontier(points: &[(f64, f64, bool)]) -> Vec<usize> {
    let mut on: Vec<usize> = (0..points.len())
        .filter(|&i| {
            let (c, a, oracle) = points[i];
            !oracle
                && !points
                    .iter()
                    .any(|&(c2, a2, o2)| !o2 && ((a2 >= a && c2 < c) || (a2 > a && c2 <= c)))
        })
        .collect();
    on.sort_by(|&x, &y| points[x].0.total_cmp(&points[y].0));
    on
}

/// Whether a row can be placed in the picture (it completed and answered).
pub fn placed(r: &RowResult) -> bool {
    r.failed.is_none() && !r.answers.is_empty()
}

/// Indices of `rows` on the frontier of (`cost`, accuracy); rows that failed are not placed.
pub fn frontier_by(rows: &[RowResult], cost: impl Fn(&RowResult) -> f64) -> Vec<usize> {
    let pts: Vec<(f64, f64, bool)> = rows
        .iter()
        .map(|r| {
            if placed(r) {
                (cost(r), r.accuracy_all(), r.spec.oracle)
            } else {
                (f64::INFINITY, 0.0, true)
            }
        })
        .collect();
    frontier(&pts)
}

/// Indices of `rows` on the projected frontier.
pub fn frontier_of(rows: &[RowResult]) -> Vec<usize> {
    frontier_by(rows, RowResult::projected_per_answer)
}

/// One question set's results: one row per configuration, in the configurations' order.
#[derive(Debug, Clone)]
pub struct SetRun {
    /// The set.
    pub set: QuestionSet,
    /// Questions asked per configuration.
    pub questions: usize,
    /// The rows.
    pub rows: Vec<RowResult>,
}

/// The questions of `set`, the first `cap` of them when capped.
pub fn set_questions(set: QuestionSet, cap: Option<usize>) -> Vec<Example> {
    let mut q = set.questions();
    q.truncate(cap.unwrap_or(usize::MAX));
    q
}

/// What the picture ran: the configurations on each set, and the mechanism ablations of the
/// headline configurations ([`contrib`]).
#[derive(Debug, Clone)]
pub struct Picture {
    /// The configurations.
    pub specs: Specs,
    /// Their results per set.
    pub sets: Vec<SetRun>,
    /// The contributions of each mechanism to the headlines.
    pub contributions: Vec<contrib::Contribution>,
}

/// Run every configuration of `specs` on every set's questions with `run_row`, printing progress
/// and an estimate of the time left; then the configurations the contributions table needs that
/// the run does not have.
pub fn run(
    specs: Specs,
    sets: &[(QuestionSet, Vec<Example>)],
    mut run_row: impl FnMut(&RowSpec, &[Example]) -> Result<RowResult>,
) -> Result<Picture> {
    if specs.rows.is_empty() {
        bail!("no configuration to run");
    }
    let per_config: usize = sets.iter().map(|s| s.1.len()).sum();
    let total = specs.rows.len() * per_config;
    eprintln!(
        "speed/quality picture: {} configurations x {per_config} questions ({}) = {total} answers; \
         on 1 thread the one-token-per-step baselines take 0.15-1 s an answer, the others \
         0.02-0.1 s (every configuration on all five sets: about two hours); the estimate below is updated after \
         each configuration",
        specs.rows.len(),
        sets.iter()
            .map(|(s, q)| format!("{} {}", s.name(), q.len()))
            .collect::<Vec<_>>()
            .join(", ")
    );
    let t0 = Instant::now();
    let mut out: Vec<SetRun> = sets
        .iter()
        .map(|(set, q)| SetRun {
            set: *set,
            questions: q.len(),
            rows: Vec::new(),
        })
        .collect();
    let mut done = 0usize;
    for s in &specs.rows {
        for (k, (_, q)) in sets.iter().enumerate() {
            out[k].rows.push(run_row(s, q)?);
        }
        done += per_config;
        let el = t0.elapsed().as_secs_f64();
        eprintln!(
            "  [{done}/{total} answers, {:.0} s; about {:.0} s left at the mean so far]",
            el,
            el / done as f64 * (total - done) as f64
        );
    }
    let contributions = contrib::run(&specs.rows, &out, sets, &mut run_row)?;
    Ok(Picture {
        specs,
        sets: out,
        contributions,
    })
}

/// Write `pareto.md`, `pareto.svg` and `pareto.json`.
pub fn write_all(out: &Path, pic: &Picture, ctx: &report::Context) -> Result<()> {
    report::write(out, pic, ctx)?;
    plot::write(out, pic)
}

#[cfg(test)]
mod tests;
