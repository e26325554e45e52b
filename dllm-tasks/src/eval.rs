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

use dllm_decode::{generate, Control, DecodeParams, StepEvent};
use dllm_models::DiffusionLm;
use serde::Serialize;
use tokenizers::Tokenizer;

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

/// Answer one question.
pub fn answer(
    model: &mut dyn DiffusionLm,
    tok: &Tokenizer,
    ex: &Example,
    params: &DecodeParams,
) -> Result<Answered> {
    let prompt = encode_prompt(tok, &ex.prompt)?;
    let mut commit_step = vec![None; params.gen_length];
    let mut record = |e: &StepEvent<'_>| {
        for &p in e.unmasked {
            if let Some(slot) = p
                .checked_sub(e.prompt_len)
                .and_then(|i| commit_step.get_mut(i))
            {
                *slot = Some(e.step);
            }
        }
        Control::Continue
    };
    let g =
        generate(model, &prompt, params, &mut record).map_err(|e| Error::Eval(e.to_string()))?;
    let response = decode_response(tok, g.generated())?;
    let v = check(ex, &response);
    let steps = check_steps(ex, &response);
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
    })
}

/// Run `examples` and aggregate per task (in `TaskKind::ALL` order);
/// `progress(done, total, answer)` is called after each question.
pub fn evaluate(
    model: &mut dyn DiffusionLm,
    tok: &Tokenizer,
    examples: &[Example],
    params: &DecodeParams,
    mut progress: impl FnMut(usize, usize, &Answered),
) -> Result<(Vec<TaskScore>, Vec<Answered>)> {
    let mut scores: Vec<TaskScore> = Vec::new();
    let mut answers = Vec::with_capacity(examples.len());
    for (i, ex) in examples.iter().enumerate() {
        let t0 = Instant::now();
        let a = answer(model, tok, ex, params)?;
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
        "| task | paper analogue | n | final-answer acc | exact acc | step acc | forwards/answer | tokens/forward | wall s |\n|---|---|---:|---:|---:|---:|---:|---:|---:|\n",
    );
    let pct = |a: usize, b: usize| format!("{:.1}%", 100.0 * a as f64 / b.max(1) as f64);
    let row = |name: &str, analogue: &str, t: &TaskScore| {
        let steps = if t.steps_total > 0 {
            pct(t.steps_right, t.steps_total)
        } else {
            "-".to_string()
        };
        format!(
            "| {name} | {analogue} | {} | {} | {} | {steps} | {:.2} | {:.2} | {:.1} |\n",
            t.n,
            pct(t.final_answer, t.n),
            pct(t.exact, t.n),
            t.forwards_per_answer(),
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
        elapsed: scores.iter().map(|t| t.elapsed).sum(),
    };
    s += &row("all", "", &all);
    s
}
