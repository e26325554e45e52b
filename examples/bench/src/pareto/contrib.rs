//! What each mechanism contributes to a headline configuration: the headline with lookahead,
//! the span (one block), sliding, the shown guess and guess agreement, bucket fit, the left trim (windows that keep the block), the adjacency rule, the joint check, verification, staged decisions (`--no-sts`: final decisions at threshold
//! 0.9) and selective logits skipping switched off in turn, each as a configuration of its own —
//! taken from the run where it is one of the picture's configurations, run for the table
//! otherwise.
//!
//! The headlines: `mbsd (defaults)`, and the most accurate verification-on configuration on the
//! projected frontier of the fresh set (else the confirmation set, else the first set run; ties:
//! the faster).

use anyhow::Result;
use dllm_decode::{Decide, DecodeParams, Strategy};
use dllm_tasks::eval::QuestionSet;
use dllm_tasks::Example;

use super::{frontier_of, verifies, SetRun, DEFAULTS};
use crate::rows::{RowResult, RowSpec};

/// The mechanisms a configuration has on, each switched off: `(mechanism, label suffix,
/// configuration)`. A mechanism already off (or absent: no mbsd, no staged decisions) is not
/// listed.
pub fn switched_off(p: &DecodeParams) -> Vec<(String, DecodeParams)> {
    named_off(p).into_iter().map(|(_, l, q)| (l, q)).collect()
}

/// [`switched_off`] with the mechanism's name.
fn named_off(p: &DecodeParams) -> Vec<(&'static str, String, DecodeParams)> {
    let mut v = Vec::new();
    let Strategy::Mbsd(m) = p.strategy else {
        return v;
    };
    let with_m = |f: &dyn Fn(&mut dllm_decode::MbsdParams)| {
        let mut m = m;
        f(&mut m);
        DecodeParams {
            strategy: Strategy::Mbsd(m),
            ..*p
        }
    };
    if m.lookahead {
        v.push((
            "lookahead",
            "no lookahead".into(),
            with_m(&|m| m.lookahead = false),
        ));
    } else {
        // Off in the headline: its contribution is what switching it on does.
        v.push((
            "lookahead (switched on)",
            "with lookahead (--lookahead)".into(),
            with_m(&|m| m.lookahead = true),
        ));
    }
    if m.span.is_some() {
        // Without the span the answer goes back to blocks (`DecodeParams::resolve`'s rule
        // without a checkpoint).
        let block_length = DecodeParams::blocks_for(p.gen_length, None);
        v.push((
            "span",
            format!("no span, blocks of {block_length} (--no-span)"),
            DecodeParams {
                block_length,
                ..with_m(&|m| m.span = None)
            },
        ));
    }
    if m.sliding != Some(false) {
        v.push((
            "sliding",
            "no sliding".into(),
            with_m(&|m| m.sliding = Some(false)),
        ));
    }
    // The guess's rows in the bucket need the guess and the bucket fit: switching either off
    // leaves them to the family (off without it).
    if m.show_guess != Some(false) {
        v.push((
            "shown guess",
            "no shown guess (--no-show-guess)".into(),
            with_m(&|m| {
                m.show_guess = Some(false);
                m.fit_guess = None
            }),
        ));
    }
    // Guess agreement acts under the threshold rule, beside a shown guess.
    if m.guess_agreement && m.show_guess != Some(false) && matches!(p.decide, Decide::Threshold(_))
    {
        v.push((
            "guess agreement",
            "no guess agreement (--no-guess-agreement)".into(),
            with_m(&|m| m.guess_agreement = false),
        ));
    }
    if m.fit_guess == Some(true) {
        v.push((
            "guess's rows in the bucket",
            "no guess's rows in the bucket (--no-fit-guess)".into(),
            with_m(&|m| m.fit_guess = Some(false)),
        ));
    }
    if m.fit_bucket != Some(false) {
        v.push((
            "bucket fit",
            "no bucket fit (--no-bucket-fit)".into(),
            with_m(&|m| {
                m.fit_bucket = Some(false);
                m.fit_guess = None
            }),
        ));
    } else {
        // Off in the headline (Dream's default): what switching it on does.
        v.push((
            "bucket fit (switched on)",
            "with bucket fit (--bucket-fit)".into(),
            with_m(&|m| m.fit_bucket = Some(true)),
        ));
    }
    // The left trim only moves a window that keeps the block (a sliding window starts at the
    // frontier already).
    if m.trim_left && m.sliding == Some(false) {
        v.push((
            "left trim",
            "no left trim (--no-trim-left)".into(),
            with_m(&|m| m.trim_left = false),
        ));
    }
    if let Decide::Staged(s) = p.decide {
        if s.no_adjacent {
            let mut q = *p;
            q.decide = Decide::Staged(dllm_decode::Staged {
                no_adjacent: false,
                ..s
            });
            v.push((
                "adjacency rule",
                "adjacent allowed (--allow-adjacent)".into(),
                q,
            ));
        }
        if s.wait_left > 0 {
            let mut q = *p;
            q.decide = Decide::Staged(dllm_decode::Staged { wait_left: 0, ..s });
            v.push(("left wait", "no left wait (--wait-left 0)".into(), q));
        }
        if s.near_wait.is_some() {
            let mut q = *p;
            q.decide = Decide::Staged(dllm_decode::Staged {
                near_wait: None,
                ..s
            });
            v.push(("near wait", "no near wait (--wait-near 0)".into(), q));
        }
        if let Some(on) = s.verify.filter(|v| v.joint != dllm_decode::Joint::Off) {
            let mut q = *p;
            let verify = Some(dllm_decode::Verify {
                joint: dllm_decode::Joint::Off,
                ..on
            });
            q.decide = Decide::Staged(dllm_decode::Staged { verify, ..s });
            v.push((
                "joint check",
                "no joint check (--joint-check off)".into(),
                q,
            ));
        }
        if s.verify.is_some() {
            let mut q = *p;
            q.decide = Decide::Staged(dllm_decode::Staged { verify: None, ..s });
            v.push(("verification", "no verification (--no-verify)".into(), q));
        }
        let mut q = *p;
        q.decide = Decide::Threshold(0.9);
        v.push(("staged decisions", "no STS, threshold 0.9".into(), q));
    } else if let Decide::Threshold(_) = p.decide {
        // Off in a threshold-rule headline: what switching them on at their defaults does.
        let mut q = *p;
        q.decide = Decide::Staged(dllm_decode::Staged::default());
        // The one switch: the guess stays as the headline has it (`--sts` alone would also
        // take the family's guess setting under staged decisions).
        let guess = match m.show_guess {
            Some(true) => " --show-guess",
            Some(false) => " --no-show-guess",
            None => "",
        };
        v.push((
            "staged decisions (switched on)",
            format!("staged decisions (--sts{guess})"),
            q,
        ));
    }
    if p.sls {
        let mut q = *p;
        q.sls = false;
        v.push((
            "selective logits skipping",
            "no selective logits (--no-sls)".into(),
            q,
        ));
    }
    v
}

/// A configuration's numbers on one set.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Numbers {
    /// Final-answer accuracy.
    pub accuracy: f64,
    /// Projected SM8750 seconds per answer.
    pub projected_s: f64,
    /// Fraction of the projected time from extrapolated forwards.
    pub extrapolated: f64,
}

impl Numbers {
    /// The numbers of a row that completed.
    pub fn of(r: &RowResult) -> Option<Numbers> {
        (r.failed.is_none() && !r.answers.is_empty()).then(|| Numbers {
            accuracy: r.accuracy_all(),
            projected_s: r.projected_per_answer(),
            extrapolated: r.projected.extrapolated_fraction(),
        })
    }
}

/// One mechanism switched off.
#[derive(Debug, Clone)]
pub struct Off {
    /// The mechanism.
    pub mechanism: &'static str,
    /// The configuration that has it off.
    pub label: String,
    /// Run for this table (not one of the picture's configurations).
    pub added: bool,
    /// Its numbers per set (in the picture's set order; `None`: it failed).
    pub numbers: Vec<Option<Numbers>>,
}

/// A headline and its mechanisms switched off.
#[derive(Debug, Clone)]
pub struct Contribution {
    /// The headline's label.
    pub headline: String,
    /// Why it is a headline.
    pub why: String,
    /// Its numbers per set.
    pub numbers: Vec<Option<Numbers>>,
    /// Each mechanism off.
    pub off: Vec<Off>,
}

/// The headline configurations: indices into `specs` with why each is one.
pub fn headlines(specs: &[RowSpec], sets: &[SetRun]) -> Vec<(usize, String)> {
    let mut v = Vec::new();
    if let Some(i) = specs.iter().position(|s| s.label == DEFAULTS) {
        v.push((i, "the decoder's defaults".to_string()));
    }
    let Some(pick) = sets
        .iter()
        .filter(|s| s.set != QuestionSet::Tuning)
        // The newest set: the one that chose nothing.
        .max_by_key(|s| s.set)
        .or(sets.first())
    else {
        return v;
    };
    let best = frontier_of(&pick.rows)
        .into_iter()
        .filter(|&i| verifies(&specs[i].params))
        .max_by(|&a, &b| {
            let (ra, rb) = (&pick.rows[a], &pick.rows[b]);
            ra.accuracy_all().total_cmp(&rb.accuracy_all()).then(
                rb.projected_per_answer()
                    .total_cmp(&ra.projected_per_answer()),
            )
        });
    if let Some(b) = best.filter(|b| !v.iter().any(|(i, _)| i == b)) {
        v.push((
            b,
            format!(
                "the most accurate verification-on configuration on the {} set's projected \
                 frontier",
                pick.set.name()
            ),
        ));
    }
    v
}

/// Build the contributions of the headlines of a finished run, running (on every set) each
/// switched-off configuration that is not one of `specs`.
pub fn run(
    specs: &[RowSpec],
    out: &[SetRun],
    sets: &[(QuestionSet, Vec<Example>)],
    run_row: &mut impl FnMut(&RowSpec, &[Example]) -> Result<RowResult>,
) -> Result<Vec<Contribution>> {
    let numbers_at = |j: usize| -> Vec<Option<Numbers>> {
        out.iter().map(|s| Numbers::of(&s.rows[j])).collect()
    };
    let mut added: Vec<(DecodeParams, Vec<Option<Numbers>>)> = Vec::new();
    let mut v = Vec::new();
    for (h, why) in headlines(specs, out) {
        let head = &specs[h];
        let mut off = Vec::new();
        for (mechanism, suffix, p) in named_off(&head.params) {
            let label = format!("{}, {suffix}", head.label);
            if let Some(j) = specs.iter().position(|s| s.params == p && !s.oracle) {
                off.push(Off {
                    mechanism,
                    label: specs[j].label.clone(),
                    added: false,
                    numbers: numbers_at(j),
                });
                continue;
            }
            let numbers = match added.iter().find(|a| a.0 == p) {
                Some(a) => a.1.clone(),
                None => {
                    eprintln!("  (for the contributions table) {label}:");
                    let spec = RowSpec {
                        label: label.clone(),
                        params: p,
                        ..head.clone()
                    };
                    let mut n = Vec::new();
                    for (_, q) in sets {
                        n.push(Numbers::of(&run_row(&spec, q)?));
                    }
                    added.push((p, n.clone()));
                    n
                }
            };
            off.push(Off {
                mechanism,
                label,
                added: true,
                numbers,
            });
        }
        v.push(Contribution {
            headline: head.label.clone(),
            why,
            numbers: numbers_at(h),
            off,
        });
    }
    Ok(v)
}

#[cfg(test)]
mod tests {
    use super::*;
    use dllm_decode::{MbsdParams, Staged};

    /// How many of the mechanisms differ between `p` and `q`.
    fn switches(p: &DecodeParams, q: &DecodeParams) -> usize {
        let (m, pm) = (q.strategy.mbsd().unwrap(), p.strategy.mbsd().unwrap());
        let (s, ps) = (q.decide.staged(), p.decide.staged());
        let diffs = [
            m.lookahead != pm.lookahead,
            m.sliding != pm.sliding,
            m.show_guess != pm.show_guess,
            m.guess_agreement != pm.guess_agreement,
            m.fit_bucket != pm.fit_bucket,
            // Left to the family where the guess or the bucket fit is switched off.
            m.fit_guess != pm.fit_guess && m.fit_guess.is_some(),
            m.span != pm.span || q.block_length != p.block_length,
            m.trim_left != pm.trim_left,
            s.is_some() != ps.is_some(),
            s.zip(ps)
                .is_some_and(|(a, b)| a.no_adjacent != b.no_adjacent),
            s.zip(ps).is_some_and(|(a, b)| a.wait_left != b.wait_left),
            s.zip(ps).is_some_and(|(a, b)| a.near_wait != b.near_wait),
            s.zip(ps)
                .and_then(|(a, b)| a.verify.zip(b.verify))
                .is_some_and(|(a, b)| a.joint != b.joint),
            s.zip(ps)
                .is_some_and(|(a, b)| a.verify.is_some() != b.verify.is_some()),
            q.sls != p.sls,
        ];
        diffs.iter().filter(|&&d| d).count()
    }

    /// The decoder's defaults with lengths, as `specs` would build them (for `shift_logits`,
    /// the family's settings pinned).
    fn defaults(shift_logits: bool) -> DecodeParams {
        let s = Strategy::Mbsd(MbsdParams::for_family(shift_logits));
        let p = DecodeParams {
            gen_length: 128,
            block_length: if shift_logits { 32 } else { 128 },
            steps: 128,
            strategy: s,
            decide: s.default_decide(shift_logits),
            sls: true,
            ..Default::default()
        };
        crate::pareto::pin(p, shift_logits)
    }

    /// The mechanisms [`named_off`] lists for `p`, each checked to be exactly one switch away.
    fn one_switch_each(p: &DecodeParams) -> Vec<&'static str> {
        let off = named_off(p);
        for (name, _, q) in &off {
            assert_eq!(switches(p, q), 1, "{name}");
        }
        off.iter().map(|o| o.0).collect()
    }

    #[test]
    fn a_dream_headline_lists_what_its_family_runs() {
        // No sliding on Dream: nothing to switch off; the threshold rule and no bucket fit, so
        // switching staged decisions and the fit on are rows.
        assert_eq!(
            one_switch_each(&defaults(true)),
            [
                "lookahead (switched on)",
                "shown guess",
                "guess agreement",
                "bucket fit (switched on)",
                "left trim",
                "staged decisions (switched on)",
                "selective logits skipping"
            ]
        );
        let p = defaults(true);
        for (name, label, _) in &named_off(&p) {
            if *name == "staged decisions (switched on)" {
                assert_eq!(label, "staged decisions (--sts --show-guess)");
            }
        }
    }

    #[test]
    fn each_mechanism_that_is_on_is_switched_off_alone() {
        let p = defaults(false);
        assert_eq!(
            one_switch_each(&p),
            [
                "lookahead (switched on)",
                "span",
                "sliding",
                "shown guess",
                "guess's rows in the bucket",
                "bucket fit",
                "adjacency rule",
                "left wait",
                "near wait",
                "joint check",
                "verification",
                "staged decisions",
                "selective logits skipping"
            ]
        );
        // Mechanisms already off are not listed; a baseline has none.
        let q = DecodeParams {
            decide: Decide::Staged(Staged {
                verify: None,
                ..Staged::default()
            }),
            sls: false,
            ..p
        };
        let names: Vec<&str> = named_off(&q).iter().map(|o| o.0).collect();
        assert!(!names.contains(&"verification") && !names.contains(&"selective logits skipping"));
        assert!(named_off(&DecodeParams {
            strategy: Strategy::DualCache,
            ..p
        })
        .is_empty());
    }
}
