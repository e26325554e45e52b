//! The evaluation harness: run the held-out suite through any decoding strategy and score it.
//!
//! Mirrors the paper's protocol (200 samples per dataset, temperature 0, accuracy per task) on the
//! synthetic suite, and also reports what decoding cost: forwards per answer and tokens committed
//! per forward. For worked answers (the long suite) it scores every step (line) of the answer,
//! and for every answer it records the step at which each generated position was committed —
//! the commit frontier of the paper's Figure 8 — from the decoder's [`StepObserver`] events.
//!
//! [`StepObserver`]: dllm_decode::StepObserver

use std::time::{Duration, Instant};

use dllm_decode::{generate, Control, DecodeParams, Outcome, StepEvent};
use dllm_models::DiffusionLm;
use serde::Serialize;
use tokenizers::Tokenizer;

use crate::first_wrong::{first_wrong, FirstWrong};
use crate::oracle::OracleDecisions;
pub use crate::sets::QuestionSet;
use crate::tasks::long::{check_steps, StepScore};
use crate::tasks::{check, test_set, Example, TaskKind};
use crate::tokenizer::{decode_response, encode_prompt};
use crate::{Error, Result};

/// Scores of one task.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct TaskScore {
    /// The task.
    pub task: TaskKind,
    /// Questions asked.
    pub n: usize,
    /// Responses equal to the reference (rationale included).
    pub exact: usize,
    /// Responses whose final answer is right.
    pub final_answer: usize,
    /// Model forward calls.
    pub forwards: usize,
    /// Tokens the decoder unmasked.
    pub tokens: usize,
    /// Steps of worked answers reproduced (0 for tasks without worked answers).
    pub steps_right: usize,
    /// Steps in the worked reference answers (0 for tasks without worked answers).
    pub steps_total: usize,
    /// Tentative tokens verification sent back to the mask.
    pub remasks: usize,
    /// Remasked tokens that were wrong against the reference (the remasks that helped).
    pub remasks_wrong: usize,
    /// The shown guesses and their verdicts.
    pub guesses: Guesses,
    /// Verification (shadow) rows computed.
    pub verified: usize,
    /// Lookahead drafts accepted.
    pub drafts_taken: usize,
    /// Accepted drafts that were wrong against the reference.
    pub drafts_wrong: usize,
    /// Wall time.
    #[serde(serialize_with = "ser_ms")]
    pub elapsed: Duration,
}

fn ser_ms<S: serde::Serializer>(d: &Duration, s: S) -> std::result::Result<S::Ok, S::Error> {
    s.serialize_f64(d.as_secs_f64() * 1e3)
}

impl TaskScore {
    /// Final-answer accuracy in [0, 1].
    pub fn accuracy(&self) -> f64 {
        self.final_answer as f64 / self.n.max(1) as f64
    }
    /// Exact-match accuracy in [0, 1].
    pub fn exact_accuracy(&self) -> f64 {
        self.exact as f64 / self.n.max(1) as f64
    }
    /// Forwards per answer.
    pub fn forwards_per_answer(&self) -> f64 {
        self.forwards as f64 / self.n.max(1) as f64
    }
    /// Tokens committed per forward.
    pub fn tokens_per_forward(&self) -> f64 {
        self.tokens as f64 / self.forwards.max(1) as f64
    }
    /// Per-step accuracy of worked answers in [0, 1] (`None` for tasks without them).
    pub fn step_accuracy(&self) -> Option<f64> {
        (self.steps_total > 0).then(|| self.steps_right as f64 / self.steps_total as f64)
    }
    /// Forwards per step of the worked reference answers (`None` for tasks without them): on
    /// long-math each step is a line whose operand is the previous line's result, so an answer
    /// is a chain of dependent steps, and a decoder below 1.0 here decides some results before
    /// the line they depend on is known.
    pub fn forwards_per_step(&self) -> Option<f64> {
        (self.steps_total > 0).then(|| self.forwards as f64 / self.steps_total as f64)
    }
    /// Revision precision: the fraction of remasks whose token was wrong against the reference
    /// (`None` without remasks).
    pub fn revision_precision(&self) -> Option<f64> {
        (self.remasks > 0).then(|| self.remasks_wrong as f64 / self.remasks as f64)
    }
}

/// What one decoding step did, in generated positions (0 = the first generated position).
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct StepLog {
    /// The step.
    pub step: usize,
    /// The forward's window.
    pub window: (usize, usize),
    /// Positions decided, with their confidence.
    pub decided: Vec<(usize, f64)>,
    /// Positions verification looked at, with the shadow's probability of their token.
    pub verified: Vec<(usize, f64)>,
    /// Positions sent back to the mask.
    pub remasked: Vec<usize>,
    /// The position whose guess the forward showed (it saw the guessed token there, not the
    /// mask), and whether the guess was confirmed.
    pub guess: Option<(usize, bool)>,
}

/// One question's outcome (`eval --dump` writes one per line).
#[derive(Debug, Clone, Serialize)]
pub struct Answered {
    /// Task.
    pub task: TaskKind,
    /// The prompt.
    pub prompt: String,
    /// Reference response.
    pub reference: String,
    /// Model response (cut at EOS).
    pub response: String,
    /// Whole response right.
    pub exact: bool,
    /// Final answer right.
    pub final_answer: bool,
    /// Forwards used.
    pub forwards: usize,
    /// Tokens the decoder unmasked.
    pub tokens: usize,
    /// Steps of the worked answer that are right (`None` for tasks without worked answers).
    pub steps: Option<StepScore>,
    /// For each generated position, the decoding step (0-based, as in [`StepEvent::step`]) at
    /// which it was committed; `None` for positions no step unmasked (EOS filled in after an
    /// early stop).
    pub commit_step: Vec<Option<usize>>,
    /// For each generated position, the confidence it was committed at (`None` where
    /// `commit_step` is `None`).
    pub commit_confidence: Vec<Option<f64>>,
    /// For each generated position, whether the generated token equals the reference answer's
    /// token there (the reference padded with EOS, compared position by position).
    pub token_right: Vec<bool>,
    /// Tentative tokens verification sent back to the mask.
    pub remasks: usize,
    /// Remasked tokens that were wrong against the reference.
    pub remasks_wrong: usize,
    /// The shown guesses and their verdicts.
    pub guesses: Guesses,
    /// Verification (shadow) rows computed.
    pub verified: usize,
    /// Lookahead drafts accepted.
    pub drafts_taken: usize,
    /// Accepted drafts wrong against the reference.
    pub drafts_wrong: usize,
    /// Every step, in order.
    pub log: Vec<StepLog>,
    /// Where the answer first differs from the reference, read against `log` (`None` when it
    /// never does): see [`crate::first_wrong`].
    pub first_wrong: Option<FirstWrong>,
}

/// Token-level calibration: committed tokens whose confidence fell in `[lo, hi)` (the last band
/// includes 1), and how many equal the reference token at their position.
#[derive(Debug, Clone, Copy, Serialize, PartialEq)]
pub struct Band {
    /// Lower bound.
    pub lo: f64,
    /// Upper bound (exclusive, except 1 for the last band).
    pub hi: f64,
    /// Committed tokens in the band.
    pub tokens: usize,
    /// Of them, equal to the reference.
    pub right: usize,
}

impl Band {
    /// Accuracy of the band's tokens (`None` when empty).
    pub fn accuracy(&self) -> Option<f64> {
        (self.tokens > 0).then(|| self.right as f64 / self.tokens as f64)
    }
}

/// The confidence bands of [`calibration`].
pub const BANDS: [(f64, f64); 4] = [(0.0, 0.5), (0.5, 0.7), (0.7, 0.9), (0.9, 1.0)];

/// Accuracy of committed tokens per confidence band ([`BANDS`]) over `answers`: how far a
/// decoder can trust a confidence. Position-wise comparison is exact for answers whose lines keep
/// the reference's token lengths (long-math's are fixed); elsewhere an early wrong token shifts
/// the rest of its line, which then counts as wrong too.
pub fn calibration(answers: &[Answered]) -> Vec<Band> {
    let mut bands: Vec<Band> = BANDS
        .iter()
        .map(|&(lo, hi)| Band {
            lo,
            hi,
            tokens: 0,
            right: 0,
        })
        .collect();
    for a in answers {
        for (c, &right) in a.commit_confidence.iter().zip(&a.token_right) {
            let Some(c) = *c else { continue };
            let i = BANDS
                .iter()
                .position(|&(lo, hi)| c >= lo && (c < hi || hi >= 1.0))
                .unwrap_or(0);
            bands[i].tokens += 1;
            bands[i].right += usize::from(right);
        }
    }
    bands
}

/// A markdown table of [`calibration`] bands.
pub fn calibration_table(bands: &[Band]) -> String {
    let mut s = String::from("| confidence | committed tokens | accuracy |\n|---|---:|---:|\n");
    for b in bands {
        let close = if b.hi >= 1.0 { "]" } else { ")" };
        s += &format!(
            "| [{:.1}, {:.1}{close} | {} | {} |\n",
            b.lo,
            b.hi,
            b.tokens,
            b.accuracy()
                .map_or("-".to_string(), |a| format!("{:.1}%", 100.0 * a))
        );
    }
    s
}

/// The held-out questions of `kinds`, the first `limit` of each.
pub fn questions(kinds: &[TaskKind], limit: Option<usize>) -> Vec<Example> {
    kinds
        .iter()
        .flat_map(|&k| {
            let mut v = test_set(k);
            v.truncate(limit.unwrap_or(usize::MAX));
            v
        })
        .collect()
}

/// A generation's tentative tokens checked against the question's reference answer: the
/// reference response tokenized as `dllm_tasks::encode_response` does, padded with EOS to the
/// generated length, compared position by position — the counts [`answer`]
/// reports (`remasks_wrong`, `drafts_wrong`), computed the same way by both.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ReferenceCounts {
    /// Tentative tokens verification sent back to the mask.
    pub remasks: usize,
    /// Of them, tokens that were wrong against the reference (the remasks that helped).
    pub remasks_wrong: usize,
    /// Verification (shadow) rows computed.
    pub verified: usize,
    /// Lookahead drafts accepted.
    pub drafts_taken: usize,
    /// Of them, drafts wrong against the reference.
    pub drafts_wrong: usize,
}

impl std::ops::AddAssign for ReferenceCounts {
    fn add_assign(&mut self, o: Self) {
        self.remasks += o.remasks;
        self.remasks_wrong += o.remasks_wrong;
        self.verified += o.verified;
        self.drafts_taken += o.drafts_taken;
        self.drafts_wrong += o.drafts_wrong;
    }
}

impl ReferenceCounts {
    /// Revision precision: remasks whose token was wrong, over remasks (`None` without remasks).
    pub fn revision_precision(&self) -> Option<f64> {
        (self.remasks > 0).then(|| self.remasks_wrong as f64 / self.remasks as f64)
    }
}

/// The reference answer's ids for `gen_length` generated positions, as [`answer`] builds them:
/// the response tokenized, padded with EOS to at least `gen_length`.
pub fn reference_ids(tok: &Tokenizer, ex: &Example, gen_length: usize) -> Result<Vec<u32>> {
    let mut reference = crate::tokenizer::encode_response(tok, &ex.response)?;
    reference.resize(gen_length.max(reference.len()), crate::tokenizer::EOS_ID);
    Ok(reference)
}

/// `g`'s remasks and accepted drafts checked against `reference` ([`reference_ids`]).
pub fn against_reference(g: &Outcome, reference: &[u32]) -> ReferenceCounts {
    let wrong = |list: &[(usize, u32)]| {
        list.iter()
            .filter(|&&(pos, tok)| {
                pos.checked_sub(g.prompt_len)
                    .and_then(|i| reference.get(i))
                    .is_some_and(|&r| r != tok)
            })
            .count()
    };
    ReferenceCounts {
        remasks: g.remasks(),
        remasks_wrong: wrong(&g.remasked),
        verified: g.verified,
        drafts_taken: g.drafts_taken.len(),
        drafts_wrong: wrong(&g.drafts_taken),
    }
}

/// Forwards that showed a guess (`MbsdParams::show_guess`), and what their shadows said: the
/// guessed token at the final threshold (confirmed) or below it (agreed, with guess agreement),
/// or another token below it (waited, with guess agreement).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct Guesses {
    /// Forwards that showed a guess.
    pub shown: usize,
    /// Guesses their shadow confirmed.
    pub confirmed: usize,
    /// Guesses taken by guess agreement below the threshold.
    pub agreed: usize,
    /// Guesses whose step waited.
    pub waited: usize,
}

impl std::ops::Add for Guesses {
    type Output = Guesses;
    fn add(self, o: Guesses) -> Guesses {
        Guesses {
            shown: self.shown + o.shown,
            confirmed: self.confirmed + o.confirmed,
            agreed: self.agreed + o.agreed,
            waited: self.waited + o.waited,
        }
    }
}

impl std::ops::AddAssign for Guesses {
    fn add_assign(&mut self, o: Guesses) {
        *self = *self + o;
    }
}

/// Who decides which predictions a step takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Decisions {
    /// The decoder's rule, on the model's own confidences.
    #[default]
    Rule,
    /// The same rule on confidences that reveal which predictions are right
    /// ([`crate::oracle::OracleDecisions`]): a bound on any rule's forwards, not a decoder.
    Oracle,
}

/// Answer one question.
pub fn answer(
    model: &mut dyn DiffusionLm,
    tok: &Tokenizer,
    ex: &Example,
    params: &DecodeParams,
) -> Result<Answered> {
    answer_with(model, tok, ex, params, Decisions::Rule)
}

/// Answer one question, its steps decided as `decisions` says.
pub fn answer_with(
    model: &mut dyn DiffusionLm,
    tok: &Tokenizer,
    ex: &Example,
    params: &DecodeParams,
    decisions: Decisions,
) -> Result<Answered> {
    let prompt = encode_prompt(tok, &ex.prompt)?;
    let mut commit_step = vec![None; params.gen_length];
    let mut commit_confidence = vec![None; params.gen_length];
    let mut log = Vec::new();
    let mut record = |e: &StepEvent<'_>| {
        let at = |p: usize| p.saturating_sub(e.prompt_len);
        log.push(StepLog {
            step: e.step,
            window: (at(e.window.start), at(e.window.end)),
            decided: e
                .unmasked
                .iter()
                .zip(e.confidences)
                .map(|(&p, &c)| (at(p), c))
                .collect(),
            verified: e.verified.iter().map(|&(p, c)| (at(p), c)).collect(),
            remasked: e.remasked.iter().map(|&p| at(p)).collect(),
            guess: e.guess.map(|(p, confirmed)| (at(p), confirmed)),
        });
        for (k, &p) in e.unmasked.iter().enumerate() {
            if let Some(i) = p
                .checked_sub(e.prompt_len)
                .filter(|&i| i < commit_step.len())
            {
                commit_step[i] = Some(e.step);
                commit_confidence[i] = e.confidences.get(k).copied();
            }
        }
        Control::Continue
    };
    let reference = reference_ids(tok, ex, params.gen_length)?;
    let g = match decisions {
        Decisions::Rule => generate(model, &prompt, params, &mut record),
        Decisions::Oracle => {
            let mut oracle = OracleDecisions::new(model, &reference, prompt.len());
            generate(&mut oracle, &prompt, params, &mut record)
        }
    }
    .map_err(|e| Error::Eval(e.to_string()))?;
    let response = decode_response(tok, g.generated())?;
    let v = check(ex, &response);
    let steps = check_steps(ex, &response);
    let counts = against_reference(&g, &reference);
    let token_right: Vec<bool> = g
        .generated()
        .iter()
        .zip(&reference)
        .map(|(a, b)| a == b)
        .collect();
    let first_wrong = first_wrong(&token_right, &commit_step, &commit_confidence, &log, |p| {
        (tok.decode(&reference[p..=p], false))
            .map_err(|e| Error::Eval(format!("decoding reference token {}: {e}", reference[p])))
    })?;
    Ok(Answered {
        task: ex.kind,
        prompt: ex.prompt.clone(),
        reference: ex.response.clone(),
        response,
        exact: v.exact,
        final_answer: v.final_answer,
        forwards: g.forwards,
        tokens: g.tokens_decoded,
        steps,
        commit_step,
        commit_confidence,
        token_right,
        remasks: counts.remasks,
        remasks_wrong: counts.remasks_wrong,
        guesses: Guesses {
            shown: g.guesses_shown,
            confirmed: g.guesses_confirmed,
            agreed: g.guesses_agreed,
            waited: g.guesses_waited,
        },
        verified: counts.verified,
        drafts_taken: counts.drafts_taken,
        drafts_wrong: counts.drafts_wrong,
        log,
        first_wrong,
    })
}

/// Run `examples` and aggregate per task (in `TaskKind::ALL` order);
/// `progress(done, total, answer)` is called after each question.
pub fn evaluate(
    model: &mut dyn DiffusionLm,
    tok: &Tokenizer,
    examples: &[Example],
    params: &DecodeParams,
    progress: impl FnMut(usize, usize, &Answered),
) -> Result<(Vec<TaskScore>, Vec<Answered>)> {
    evaluate_with(model, tok, examples, params, Decisions::Rule, progress)
}

/// [`evaluate`], the steps decided as `decisions` says.
pub fn evaluate_with(
    model: &mut dyn DiffusionLm,
    tok: &Tokenizer,
    examples: &[Example],
    params: &DecodeParams,
    decisions: Decisions,
    mut progress: impl FnMut(usize, usize, &Answered),
) -> Result<(Vec<TaskScore>, Vec<Answered>)> {
    let mut scores: Vec<TaskScore> = Vec::new();
    let mut answers = Vec::with_capacity(examples.len());
    for (i, ex) in examples.iter().enumerate() {
        let t0 = Instant::now();
        let a = answer_with(model, tok, ex, params, decisions)?;
        let elapsed = t0.elapsed();
        let idx = match scores.iter().position(|s| s.task == ex.kind) {
            Some(i) => i,
            None => {
                scores.push(TaskScore {
                    task: ex.kind,
                    n: 0,
                    exact: 0,
                    final_answer: 0,
                    forwards: 0,
                    tokens: 0,
                    steps_right: 0,
                    steps_total: 0,
                    remasks: 0,
                    remasks_wrong: 0,
                    guesses: Guesses::default(),
                    verified: 0,
                    drafts_taken: 0,
                    drafts_wrong: 0,
                    elapsed: Duration::ZERO,
                });
                scores.len() - 1
            }
        };
        let s = &mut scores[idx];
        s.n += 1;
        s.exact += usize::from(a.exact);
        s.final_answer += usize::from(a.final_answer);
        s.forwards += a.forwards;
        s.tokens += a.tokens;
        s.remasks += a.remasks;
        s.remasks_wrong += a.remasks_wrong;
        s.guesses += a.guesses;
        s.verified += a.verified;
        s.drafts_taken += a.drafts_taken;
        s.drafts_wrong += a.drafts_wrong;
        if let Some(st) = a.steps {
            s.steps_right += st.right;
            s.steps_total += st.total;
        }
        s.elapsed += elapsed;
        progress(i + 1, examples.len(), &a);
        answers.push(a);
    }
    scores.sort_by_key(|s| s.task.index());
    Ok((scores, answers))
}

/// A markdown table of scores (plus an "all" row). The per-step column is `-` for tasks
/// without worked answers.
pub fn table(scores: &[TaskScore]) -> String {
    let mut s = String::from(
        "| task | paper analogue | n | final-answer acc | exact acc | step acc | forwards/answer | forwards/worked step | tokens/forward | wall s |\n|---|---|---:|---:|---:|---:|---:|---:|---:|---:|\n",
    );
    let pct = |a: usize, b: usize| format!("{:.1}%", 100.0 * a as f64 / b.max(1) as f64);
    let row = |name: &str, analogue: &str, t: &TaskScore| {
        let steps = if t.steps_total > 0 {
            pct(t.steps_right, t.steps_total)
        } else {
            "-".to_string()
        };
        format!(
            "| {name} | {analogue} | {} | {} | {} | {steps} | {:.2} | {} | {:.2} | {:.1} |\n",
            t.n,
            pct(t.final_answer, t.n),
            pct(t.exact, t.n),
            t.forwards_per_answer(),
            t.forwards_per_step()
                .map_or_else(|| "-".to_string(), |f| format!("{f:.2}")),
            t.tokens_per_forward(),
            t.elapsed.as_secs_f64()
        )
    };
    for t in scores {
        s += &row(t.task.name(), t.task.paper_dataset(), t);
    }
    let sum = |f: fn(&TaskScore) -> usize| scores.iter().map(f).sum::<usize>();
    let all = TaskScore {
        task: scores.first().map_or(TaskKind::Math, |t| t.task),
        n: sum(|t| t.n),
        exact: sum(|t| t.exact),
        final_answer: sum(|t| t.final_answer),
        forwards: sum(|t| t.forwards),
        tokens: sum(|t| t.tokens),
        steps_right: sum(|t| t.steps_right),
        steps_total: sum(|t| t.steps_total),
        remasks: sum(|t| t.remasks),
        remasks_wrong: sum(|t| t.remasks_wrong),
        guesses: scores.iter().fold(Guesses::default(), |g, t| g + t.guesses),
        verified: sum(|t| t.verified),
        drafts_taken: sum(|t| t.drafts_taken),
        drafts_wrong: sum(|t| t.drafts_wrong),
        elapsed: scores.iter().map(|t| t.elapsed).sum(),
    };
    s += &row("all", "", &all);
    s
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A wrong long-math answer with this first wrong token (for the tables' tests).
    pub(crate) fn answered_with(first_wrong: Option<FirstWrong>) -> Answered {
        Answered {
            task: TaskKind::LongMath,
            prompt: String::new(),
            reference: String::new(),
            response: String::new(),
            exact: false,
            final_answer: false,
            forwards: 1,
            tokens: 0,
            steps: None,
            commit_step: Vec::new(),
            commit_confidence: Vec::new(),
            token_right: Vec::new(),
            remasks: 0,
            remasks_wrong: 0,
            guesses: Guesses::default(),
            verified: 0,
            drafts_taken: 0,
            drafts_wrong: 0,
            log: Vec::new(),
            first_wrong,
        }
    }

    #[test]
    fn the_table_counts_forwards_per_worked_step() {
        let score = |task, forwards, steps_total| TaskScore {
            task,
            n: 2,
            exact: 1,
            final_answer: 2,
            forwards,
            tokens: 100,
            steps_right: steps_total,
            steps_total,
            remasks: 0,
            remasks_wrong: 0,
            guesses: Guesses::default(),
            verified: 0,
            drafts_taken: 0,
            drafts_wrong: 0,
            elapsed: Duration::ZERO,
        };
        let long = score(TaskKind::LongMath, 18, 20);
        assert_eq!(long.forwards_per_step(), Some(0.9));
        let short = score(TaskKind::Math, 6, 0);
        assert_eq!(short.forwards_per_step(), None);
        let t = table(&[long, short]);
        let rows: Vec<&str> = t.lines().collect();
        assert!(
            rows[0].contains("| forwards/answer | forwards/worked step |"),
            "{t}"
        );
        // long-math: 9 forwards per answer, 0.90 per worked step; math has no worked steps;
        // "all": 24 forwards over 20 steps.
        assert!(rows[2].contains("| 9.00 | 0.90 |"), "{t}");
        assert!(rows[3].contains("| 3.00 | - |"), "{t}");
        assert!(
            rows[4].starts_with("| all |") && rows[4].contains("| 6.00 | 1.20 |"),
            "{t}"
        );
    }

    #[test]
    fn calibration_bands_count_committed_tokens_by_confidence() {
        let a = Answered {
            tokens: 5,
            commit_step: vec![Some(0); 6],
            commit_confidence: vec![Some(0.2), Some(0.5), Some(0.69), Some(0.7), Some(1.0), None],
            token_right: vec![false, true, false, true, true, true],
            ..answered_with(None)
        };
        let b = calibration(&[a]);
        let got: Vec<(usize, usize)> = b.iter().map(|b| (b.tokens, b.right)).collect();
        // The uncommitted last position counts nowhere; 1.0 falls in the last band.
        assert_eq!(got, vec![(1, 0), (2, 1), (1, 1), (1, 1)]);
        assert_eq!(b[1].accuracy(), Some(0.5));
        let t = calibration_table(&b);
        assert!(t.contains("| [0.9, 1.0] | 1 | 100.0% |"), "{t}");
    }
}
