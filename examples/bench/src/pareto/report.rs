//! `pareto.md` and `pareto.json`: per question set, every configuration with its accuracy and
//! Wilson interval, McNemar against the vanilla baselines, forwards, projected latency (and how
//! much of it is extrapolated), CPU wall time, frontiers and the verification counters; the
//! fewest forwards per strategy at the baseline's accuracy; the contributions of each mechanism
//! to the headlines.

use std::fmt::Write as _;
use std::path::Path;

use anyhow::{Context as _, Result};
use dllm_decode::{Decide, DecodeParams, MbsdParams, Strategy};
use serde_json::{json, Value};

use super::contrib::{Contribution, Numbers};
use super::{frontier_by, placed, verify_label, Family, Picture, SetRun, VANILLA, VANILLA_T09};
use crate::projection::{self, PhoneModel, HEAD_SHARE, LARGEST_MEASURED_WINDOW};
use crate::rows::RowResult;
use crate::stats::{discordant, mcnemar_exact, wilson, Z95};

/// The sentence every picture carries.
pub const CHOSEN_ON_TUNING: &str =
    "defaults are chosen on the tuning and confirmation sets (a first choice on the tuning set \
     alone fell below threshold-0.9 decoding on the confirmation set); the fresh set judged them, \
     and again the joint check chosen after its first verdict; the fresh2 set judged that, and the \
     left wait was chosen on all four sets after; the fresh3 set chose nothing. The shown guess \
     (LLaDA) was chosen after all of that on the tuning and confirmation sets alone, and judged on \
     fresh, fresh2 and fresh3; Dream's default (the threshold rule with the guess and the left \
     trim) was chosen on the tuning and confirmation sets once its forwards were priced as the \
     model computes them, and judged on fresh, fresh2 and fresh3. The fresh4 set (2026-12-06) \
     judged all of these and verification's step-boundary rules; its wrong answers were read \
     after that verdict (the partner rule came from them), and the fresh5 set judged the rule. \
     LLaDA's near wait and theta_stable 0.9 came from the wrong answers of the sets up to fresh4, \
     were chosen on the tuning and confirmation sets, and the fresh6 set judged them. mbsd's window \
     sliding across one block (a span of 16, the near wait reaching 8 positions) was chosen \
     on the tuning and confirmation sets, and the fresh7 set judged it (LLaDA's default since); \
     the fresh8 set judged the bucket fit counting the guess's row beside it. Dream's guess \
     agreement came from reading its wrong answers on fresh7 and fresh8, was chosen on all ten \
     sets up to fresh8, and the fresh9 set judged it (Dream's default since)";

/// What the run was.
pub struct Context {
    /// The run's header line (model, lengths, threads, machine, wall time).
    pub header: String,
    /// The common decoding parameters.
    pub base: DecodeParams,
    /// The projection's device model.
    pub phone: PhoneModel,
}

/// A McNemar comparison against a reference: discordant `(b, c)` and the exact p-value.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct McNemar {
    /// Questions the reference got right and this configuration wrong.
    pub b: usize,
    /// Questions this configuration got right and the reference wrong.
    pub c: usize,
    /// Exact two-sided p-value.
    pub p: f64,
}

/// A placed row's statistics on its set.
#[derive(Debug, Clone, PartialEq)]
pub struct Stats {
    /// Right final answers.
    pub right: usize,
    /// Questions answered.
    pub n: usize,
    /// Wilson 95% interval of the accuracy.
    pub wilson: (f64, f64),
    /// Against [`VANILLA`] and [`VANILLA_T09`] (`None`: the reference is not in the run).
    pub vs: [Option<McNemar>; 2],
    /// Forwards per 128 generated positions.
    pub forwards_per_128: f64,
    /// On the projected frontier.
    pub frontier_projected: bool,
    /// On the CPU wall-time frontier.
    pub frontier_cpu: bool,
}

/// The statistics of each row of a set (`None` for rows that failed).
pub fn stats(set: &SetRun, gen_length: usize) -> Vec<Option<Stats>> {
    let fp = frontier_by(&set.rows, RowResult::projected_per_answer);
    let fw = frontier_by(&set.rows, RowResult::wall_per_answer);
    let reference = |label: &str| {
        set.rows
            .iter()
            .find(|r| r.spec.label == label && placed(r))
            .map(RowResult::correct)
    };
    let refs = [reference(VANILLA), reference(VANILLA_T09)];
    set.rows
        .iter()
        .enumerate()
        .map(|(i, r)| {
            if !placed(r) {
                return None;
            }
            let correct = r.correct();
            let right = correct.iter().filter(|&&c| c).count();
            let vs = refs.each_ref().map(|rf| {
                let (b, c) = discordant(rf.as_deref()?, &correct)?;
                Some(McNemar {
                    b,
                    c,
                    p: mcnemar_exact(b, c),
                })
            });
            Some(Stats {
                right,
                n: correct.len(),
                wilson: wilson(right, correct.len(), Z95)?,
                vs,
                forwards_per_128: r.forwards_per_answer() * 128.0 / gen_length.max(1) as f64,
                frontier_projected: fp.contains(&i),
                frontier_cpu: fw.contains(&i),
            })
        })
        .collect()
}

/// Per strategy family: the row with the fewest forwards per 128 positions among the family's
/// configurations whose accuracy is within 1 point of vanilla's on the set (ties: the faster
/// projection). `None` as a whole when vanilla is not in the run.
pub fn per_strategy(set: &SetRun, st: &[Option<Stats>]) -> Option<Vec<(Family, Option<usize>)>> {
    let v = set
        .rows
        .iter()
        .position(|r| r.spec.label == VANILLA && placed(r))?;
    let bar = set.rows[v].accuracy_all() - 0.01 - 1e-12;
    Some(
        Family::ALL
            .iter()
            .map(|&f| {
                let best = (0..set.rows.len())
                    .filter(|&i| {
                        Family::of(&set.rows[i].spec) == Some(f)
                            && st[i].is_some()
                            && set.rows[i].accuracy_all() >= bar
                    })
                    .min_by(|&a, &b| {
                        let fa = st[a].as_ref().map_or(f64::INFINITY, |s| s.forwards_per_128);
                        let fb = st[b].as_ref().map_or(f64::INFINITY, |s| s.forwards_per_128);
                        fa.total_cmp(&fb).then(
                            set.rows[a]
                                .projected_per_answer()
                                .total_cmp(&set.rows[b].projected_per_answer()),
                        )
                    });
                (f, best)
            })
            .collect(),
    )
}

fn opt_pct(x: Option<f64>) -> String {
    x.map_or("-".into(), |v| format!("{:.0}", 100.0 * v))
}

fn mcnemar_cell(m: Option<McNemar>, own: bool) -> String {
    match (m, own) {
        (_, true) => "(reference)".into(),
        (None, _) => "-".into(),
        (Some(m), _) => format!("{} / {}, p {:.3}", m.b, m.c, m.p),
    }
}

/// The text on the projection: what is measured, what is extrapolated, what is priced how.
fn projection_text(ctx: &Context) -> String {
    let ph = &ctx.phone;
    let logits = match ph.logits_on {
        projection::LogitsOn::Cpu => format!(
            "**Logits on the CPU** (`--logits-on cpu`): the LM head (126464 x 4096) does not fit \
             the NPU (ggml-hexagon keeps weights with more than 32,768 output rows on the CPU), so \
             an NPU forward is priced at (1 - HEAD_SHARE) = {:.3} of the NPU table's latency for \
             its rows, and then each logits row it requests (window rows a decision needs, plus \
             one per verification row) costs HEAD_SHARE x the CPU table's cost per token = \
             {HEAD_SHARE:.4} x {:.1} ms = {:.2} ms, serially after the forward (the next step's \
             decisions need them).",
            1.0 - HEAD_SHARE,
            ph.cpu_token_ms(),
            ph.cpu_logits_row_ms()
        ),
        projection::LogitsOn::Npu => "**Logits as the NPU table prices them** (`--logits-on \
             npu`): a skipped logits row saves HEAD_SHARE of its row's share of the forward."
            .into(),
    };
    format!(
        "**Projected, not measured.** The projected column replays each answer's own forwards \
         through the paper's Table 2 latencies for LLaDA-8B Q4_0 on SM8750 (`src/projection.rs`). \
         **Measured points**: forwards of 32, 64 and 128 rows (NPU 478.1 / 861.6 / 1531.6 ms), \
         priced in flat 32-row buckets (96 is interpolated between measured points). \
         **Extrapolations**: a forward with more than {LARGEST_MEASURED_WINDOW} rows (window \
         plus verification rows) is priced from the 64 -> 128 slope; the column *extrapolated %* \
         is the share of a configuration's projected time from such forwards, and its projected \
         number is marked † when that share is not zero (with 128 generated positions every \
         full-canvas forward — prompt and answer — is past 128: the vanilla, prefix- and \
         dual-cache baselines and mbsd's first forward rest on extrapolation). Verification (shadow) rows are rows of the same NPU forward: free in \
         the bucket's unused rows, a bucket's price when they spill over. {logits} **CPU work \
         beside the NPU** would slow the NPU forward by the contention factor (`--contention`, \
         {:.2}: the paper measured 0.98x for its refresh); nothing runs beside the NPU forward \
         in these decoders (the logits are serial, there is no CPU refresh), so the factor \
         changes no number here.\n\n{}\n",
        ph.contention,
        projection::paper_check_text(ph, 79)
    )
}

/// The configuration `mbsd (defaults)` stands for on a model with (`shift_logits`, Dream) or
/// without shifted logits (LLaDA): the decoder's defaults for that family.
fn defaults_text(shift_logits: bool) -> String {
    let decide = Strategy::Mbsd(MbsdParams::default()).default_decide(shift_logits);
    let m = MbsdParams::for_family(shift_logits).pinned(shift_logits, decide);
    let on_off = |b: Option<bool>| if b == Some(true) { "on" } else { "off" };
    let rule = match decide {
        Decide::Staged(s) => format!(
            "staged decisions, theta {} / {}, {}; decisions below theta_stable {}, waiting for \
             their left context within {} positions{}",
            s.visible,
            s.stable,
            verify_label(s.verify),
            if s.no_adjacent {
                "never adjacent in one step"
            } else {
                "may be adjacent"
            },
            s.wait_left,
            s.near_wait.map_or(String::new(), |n| format!(
                "; decisions below {} waiting within {} positions (the near wait)",
                n.below, n.within
            )),
        ),
        Decide::Threshold(t) => {
            format!("the threshold rule at {t} (decisions final at once, no staged decisions)")
        }
        Decide::Schedule => "the step schedule".to_string(),
    };
    format!(
        "`mbsd (defaults)` is mbsd at the decoder's defaults for {}: {rule}; {}; sliding {}, a \
         refresh at each block start {}; a shown guess {}; lookahead {} (trigger {}), bucket fit \
         {}, a left trim {}, selective logits on.",
        if shift_logits {
            "a Dream model (shifted logits)"
        } else {
            "a LLaDA model"
        },
        match m.span {
            Some(n) => format!("one block, the window at most {n} positions from the frontier"),
            None => "blocks, the window up to the block's end".into(),
        },
        on_off(m.sliding),
        on_off(m.refresh),
        match (m.show_guess, decide) {
            (Some(true), Decide::Staged(_)) => "on (the joint check's auto is then off)",
            (Some(true), _) => "on",
            _ => "off",
        },
        on_off(Some(m.lookahead)),
        m.trigger,
        match (m.fit_bucket, m.fit_guess) {
            (Some(true), Some(true)) => "on (counting the guess's rows)",
            (Some(true), _) => "on",
            _ => "off",
        },
        if m.trim_left && m.sliding == Some(false) {
            "on"
        } else if m.trim_left {
            "on (a sliding window starts at the frontier: nothing to trim)"
        } else {
            "off"
        },
    )
}

fn set_title(set: &SetRun) -> String {
    format!(
        "{} set ({}; {} asked)",
        set.set.name(),
        set.set.describe(),
        set.questions
    )
}

/// The main table of one set.
fn set_table(s: &mut String, set: &SetRun, st: &[Option<Stats>]) {
    s.push_str(
        "| configuration | accuracy % [Wilson 95%] | vs vanilla: b / c, p | vs vanilla, threshold \
         0.9: b / c, p | forwards/answer | forwards/128 tokens | projected s/answer (SM8750) | \
         extrapolated % | frontier (projected) | CPU wall ms/answer | frontier (CPU) | worked \
         lines % | drafts accepted | drafts wrong | lookahead positions | verified | remasks | \
         revision precision % |\n",
    );
    s.push_str("|---|---:|---:|---:|---:|---:|---:|---:|:-:|---:|:-:|---:|---:|---:|---:|---:|---:|---:|\n");
    let yes = |b: bool| if b { "yes" } else { "" };
    for (r, x) in set.rows.iter().zip(st) {
        let Some(x) = x else {
            let _ = writeln!(
                s,
                "| {} | failed: {} |||||||||||||||||",
                r.spec.label,
                r.failed.as_deref().unwrap_or("no answer").replace('|', "/")
            );
            continue;
        };
        let ex = r.projected.extrapolated_fraction();
        let _ = writeln!(
            s,
            "| {} | {:.1} [{:.1}, {:.1}] | {} | {} | {:.1} | {:.1} | {:.2}{} | {} | {} | {:.0} | {} | {} | {} | {} | {} | {} | {} | {} |",
            r.spec.label,
            100.0 * r.accuracy_all(),
            100.0 * x.wilson.0,
            100.0 * x.wilson.1,
            mcnemar_cell(x.vs[0], r.spec.label == VANILLA),
            mcnemar_cell(x.vs[1], r.spec.label == VANILLA_T09),
            r.forwards_per_answer(),
            x.forwards_per_128,
            r.projected_per_answer(),
            if ex > 0.0 { " †" } else { "" },
            if ex > 0.0 { format!("{:.0}", 100.0 * ex) } else { "0".into() },
            yes(x.frontier_projected),
            r.wall_per_answer() * 1e3,
            yes(x.frontier_cpu),
            opt_pct(r.step_accuracy(r.answers[0].task)),
            r.counter("drafts_accepted"),
            r.reference.drafts_wrong,
            r.counter("lookahead_positions"),
            r.reference.verified,
            r.reference.remasks,
            opt_pct(r.reference.revision_precision()),
        );
    }
}

/// The per-strategy table of one set.
fn strategy_table(s: &mut String, set: &SetRun, st: &[Option<Stats>]) {
    let Some(best) = per_strategy(set, st) else {
        s.push_str("`vanilla` is not in this run: no accuracy bar.\n\n");
        return;
    };
    let v = set.rows.iter().find(|r| r.spec.label == VANILLA).unwrap();
    let _ = writeln!(
        s,
        "Vanilla's accuracy on this set: {:.1}%; the bar is {:.1}%.\n",
        100.0 * v.accuracy_all(),
        100.0 * (v.accuracy_all() - 0.01).max(0.0)
    );
    s.push_str("| strategy | fewest forwards / 128 tokens | configuration | accuracy % | projected s/answer |\n|---|---:|---|---:|---:|\n");
    for (f, i) in best {
        match i {
            Some(i) => {
                let r = &set.rows[i];
                let _ = writeln!(
                    s,
                    "| {} | {:.1} | {} | {:.1} | {:.2} |",
                    f.name(),
                    st[i].as_ref().map_or(0.0, |x| x.forwards_per_128),
                    r.spec.label,
                    100.0 * r.accuracy_all(),
                    r.projected_per_answer()
                );
            }
            None => {
                let _ = writeln!(s, "| {} | none | | | |", f.name());
            }
        }
    }
    s.push('\n');
}

fn num_cells(n: Option<Numbers>, head: Option<Numbers>, is_head: bool) -> String {
    match (n, head) {
        (None, _) => "failed | | | ".into(),
        (Some(n), Some(h)) if !is_head => format!(
            "{:.1} | {:+.1} | {:.2}{} | {:+.2}",
            100.0 * n.accuracy,
            100.0 * (n.accuracy - h.accuracy),
            n.projected_s,
            if n.extrapolated > 0.0 { " †" } else { "" },
            n.projected_s - h.projected_s
        ),
        (Some(n), _) => format!(
            "{:.1} | | {:.2}{} | ",
            100.0 * n.accuracy,
            n.projected_s,
            if n.extrapolated > 0.0 { " †" } else { "" }
        ),
    }
}

/// The contributions tables.
fn contributions(s: &mut String, pic: &Picture) {
    s.push_str("## What each mechanism contributes to the headlines\n\n");
    if pic.contributions.is_empty() {
        s.push_str("No headline configuration (`mbsd (defaults)` or a verification-on mbsd row) is in this run.\n\n");
        return;
    }
    s.push_str(
        "Each mechanism switched off in turn, the rest as in the headline; Δ is the difference to \
         the headline (accuracy in points, projected seconds per answer). Rows marked * were run \
         for this table (they are not among the configurations above).\n\n",
    );
    for c in &pic.contributions {
        let _ = writeln!(s, "### {} ({})\n", c.headline, c.why);
        s.push_str("| mechanism off | configuration |");
        for set in &pic.sets {
            let n = set.set.name();
            let _ = write!(s, " {n} accuracy % | Δ | {n} projected s | Δ |");
        }
        s.push_str("\n|---|---|");
        for _ in &pic.sets {
            s.push_str("---:|---:|---:|---:|");
        }
        s.push('\n');
        let _ = write!(s, "| (none: the headline) | {} |", c.headline);
        for n in &c.numbers {
            let _ = write!(s, " {} |", num_cells(*n, *n, true));
        }
        s.push('\n');
        for o in &c.off {
            let _ = write!(
                s,
                "| {} | {}{} |",
                o.mechanism,
                o.label,
                if o.added { " *" } else { "" }
            );
            for (n, h) in o.numbers.iter().zip(&c.numbers) {
                let _ = write!(s, " {} |", num_cells(*n, *h, false));
            }
            s.push('\n');
        }
        s.push('\n');
    }
}

/// The configurations not run because they equal one that ran under another label.
fn same_in_run(pic: &Picture) -> Vec<(String, String)> {
    pic.specs
        .same
        .iter()
        .filter(|(a, b)| a != b && pic.specs.rows.iter().any(|r| &r.label == b))
        .cloned()
        .collect()
}

/// `pareto.md`.
pub fn markdown(pic: &Picture, ctx: &Context) -> String {
    let mut s = String::from("# Speed / quality\n\n");
    s += &ctx.header;
    let _ = write!(
        s,
        "\n\n**Note: {CHOSEN_ON_TUNING}.** Every configuration runs on every set below, the \
         same questions in the same order, so two configurations are compared question by \
         question.\n\n{}\n\n",
        defaults_text(pic.specs.shift_logits)
    );
    s += "One point per configuration and set: final-answer accuracy (with its Wilson 95% \
          interval) against the **projected** latency per answer of LLaDA-8B Q4_0 on an SM8750 \
          phone and against the CPU wall time per answer measured on this machine. *Frontier*: no \
          other configuration is at least as accurate and cheaper. *vs vanilla*: McNemar's exact \
          test question by question, b = questions the reference got right and this configuration \
          wrong, c = the reverse, p = the two-sided binomial p-value on b + c. *Drafts wrong*: \
          accepted lookahead drafts that differ from the reference answer's token; *verified*: \
          verification (shadow) rows; *remasks*: tentative tokens sent back to the mask; \
          *revision precision*: remasks whose token was wrong against the reference, over \
          remasks (the reference is the reference response tokenized, padded with EOS). Oracle \
          rows revise with the reference answer: they bound what revision can recover and are \
          not decoders.\n\n";
    s += &projection_text(ctx);
    let same = same_in_run(pic);
    if !same.is_empty() {
        s += "\nConfigurations that equal another run once, under the first label: ";
        let v: Vec<String> = same.iter().map(|(a, b)| format!("`{a}` = `{b}`")).collect();
        s += &v.join("; ");
        s += ".\n";
    }
    for set in &pic.sets {
        let st = stats(set, ctx.base.gen_length);
        let _ = writeln!(s, "\n## The {}\n", set_title(set));
        set_table(&mut s, set, &st);
        s += "\n### Forwards per 128 tokens at ≤ 1 point loss, per strategy\n\n";
        strategy_table(&mut s, set, &st);
    }
    contributions(&mut s, pic);
    s
}

fn numbers_json(n: &Option<Numbers>) -> Value {
    match n {
        Some(n) => json!({"accuracy": n.accuracy, "projected_s_per_answer": n.projected_s,
                          "extrapolated_fraction": n.extrapolated}),
        None => Value::Null,
    }
}

fn mcnemar_json(m: Option<McNemar>) -> Value {
    m.map_or(Value::Null, |m| json!({"b": m.b, "c": m.c, "p": m.p}))
}

fn point_json(r: &RowResult, x: &Stats) -> Value {
    json!({
        "label": r.spec.label,
        "family": Family::of(&r.spec).map(Family::name),
        "switches": r.spec.switches(),
        "answers": x.n,
        "right": x.right,
        "accuracy": r.accuracy_all(),
        "wilson_95": [x.wilson.0, x.wilson.1],
        "mcnemar": { VANILLA: mcnemar_json(x.vs[0]), VANILLA_T09: mcnemar_json(x.vs[1]) },
        "step_accuracy": r.step_accuracy(r.answers[0].task),
        "forwards_per_answer": r.forwards_per_answer(),
        "forwards_per_128_tokens": x.forwards_per_128,
        "projected_s_per_answer": r.projected_per_answer(),
        "extrapolated_fraction": r.projected.extrapolated_fraction(),
        "cpu_wall_ms_per_answer": r.wall_per_answer() * 1e3,
        "frontier_projected": x.frontier_projected,
        "frontier_cpu": x.frontier_cpu,
        "remasks": r.reference.remasks,
        "remasks_wrong": r.reference.remasks_wrong,
        "verified": r.reference.verified,
        "revision_precision": r.reference.revision_precision(),
        "drafts_taken": r.reference.drafts_taken,
        "drafts_wrong": r.reference.drafts_wrong,
        "correct": r.correct(),
        "counters": r.counters,
    })
}

fn set_json(set: &SetRun, gen_length: usize) -> Value {
    let st = stats(set, gen_length);
    let points: Vec<Value> = set
        .rows
        .iter()
        .zip(&st)
        .filter_map(|(r, x)| x.as_ref().map(|x| point_json(r, x)))
        .collect();
    let failed: Vec<Value> = set
        .rows
        .iter()
        .filter(|r| !placed(r))
        .map(|r| json!({"label": r.spec.label, "failed": r.failed}))
        .collect();
    let strategies = per_strategy(set, &st).map(|v| {
        v.iter()
            .map(|(f, i)| {
                json!({
                    "strategy": f.name(),
                    "forwards_per_128_tokens": i.and_then(|i| st[i].as_ref().map(|x| x.forwards_per_128)),
                    "label": i.map(|i| set.rows[i].spec.label.clone()),
                    "accuracy": i.map(|i| set.rows[i].accuracy_all()),
                    "projected_s_per_answer": i.map(|i| set.rows[i].projected_per_answer()),
                })
            })
            .collect::<Vec<_>>()
    });
    json!({
        "questions": set.questions,
        "points": points,
        "failed": failed,
        "per_strategy": strategies,
    })
}

fn contribution_json(c: &Contribution, pic: &Picture) -> Value {
    let by_set = |ns: &[Option<Numbers>]| -> Value {
        pic.sets
            .iter()
            .zip(ns)
            .map(|(s, n)| (s.set.name().to_string(), numbers_json(n)))
            .collect::<serde_json::Map<_, _>>()
            .into()
    };
    json!({
        "headline": c.headline,
        "why": c.why,
        "numbers": by_set(&c.numbers),
        "off": c.off.iter().map(|o| json!({
            "mechanism": o.mechanism,
            "label": o.label,
            "added_for_this_table": o.added,
            "numbers": by_set(&o.numbers),
        })).collect::<Vec<_>>(),
    })
}

/// `pareto.json`.
pub fn json_value(pic: &Picture, ctx: &Context) -> Value {
    let c = projection::paper_check(&ctx.phone, 79);
    let sets: serde_json::Map<String, Value> = pic
        .sets
        .iter()
        .map(|s| (s.set.name().to_string(), set_json(s, ctx.base.gen_length)))
        .collect();
    json!({
        "header": ctx.header,
        "note": CHOSEN_ON_TUNING,
        "gen_length": ctx.base.gen_length,
        "block_length": ctx.base.block_length,
        "mbsd_defaults": defaults_text(pic.specs.shift_logits),
        "same_configuration": same_in_run(pic),
        "projection": {
            "logits_on": ctx.phone.logits_on.name(),
            "contention": ctx.phone.contention,
            "head_share": HEAD_SHARE,
            "cpu_logits_row_ms": ctx.phone.cpu_logits_row_ms(),
            "largest_measured_window": LARGEST_MEASURED_WINDOW,
            "measured_windows": projection::MEASURED_WINDOWS,
            "check": {
                "prompt_tokens": 79,
                "cpu_s": c.cpu_s, "paper_cpu_s": projection::PAPER_CPU_VANILLA_S,
                "npu_table_s": c.npu_table_s, "npu_s": c.npu_s,
                "paper_npu_s": projection::PAPER_NPU_VANILLA_S,
            },
        },
        "sets": sets,
        "contributions": pic.contributions.iter().map(|c| contribution_json(c, pic)).collect::<Vec<_>>(),
    })
}

/// Write `pareto.md` and `pareto.json`.
pub fn write(out: &Path, pic: &Picture, ctx: &Context) -> Result<()> {
    std::fs::write(out.join("pareto.md"), markdown(pic, ctx)).context("writing pareto.md")?;
    std::fs::write(
        out.join("pareto.json"),
        serde_json::to_string_pretty(&json_value(pic, ctx))?,
    )
    .context("writing pareto.json")
}
