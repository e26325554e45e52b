//! The evaluation harness: run the held-out suite through any decoding strategy and score it.
//!
//! Mirrors the paper's protocol (200 samples per dataset, temperature 0, accuracy per task) on the
//! synthetic suite, and also reports what decoding cost: forwards per answer and tokens committed
//! per forward.

use std::time::{Duration, Instant};

use dllm_decode::{generate, DecodeParams};
use dllm_models::DiffusionLm;
use serde::Serialize;
use tokenizers::Tokenizer;

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
    let g = generate(model, &prompt, params, &mut ()).map_err(|e| Error::Eval(e.to_string()))?;
    let response = decode_response(tok, g.generated())?;
    let v = check(ex, &response);
    Ok(Answered {
        task: ex.kind,
        prompt: ex.prompt.clone(),
        reference: ex.response.clone(),
        response,
        exact: v.exact,
        final_answer: v.final_answer,
        forwards: g.forwards,
        tokens: g.tokens_decoded,
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
        s.elapsed += elapsed;
        progress(i + 1, examples.len(), &a);
        answers.push(a);
    }
    scores.sort_by_key(|s| s.task.index());
    Ok((scores, answers))
}

/// A markdown table of scores (plus an "all" row).
pub fn table(scores: &[TaskScore]) -> String {
    let mut s = String::from(
        "| task | paper analogue | n | final-answer acc | exact acc | forwards/answer | tokens/forward | wall s |\n|---|---|---:|---:|---:|---:|---:|---:|\n",
    );
    let row = |name: &str,
               analogue: &str,
               n: usize,
               fa: usize,
               ex: usize,
               fw: usize,
               tk: usize,
               el: Duration| {
        format!(
            "| {name} | {analogue} | {n} | {:.1}% | {:.1}% | {:.2} | {:.2} | {:.1} |\n",
            100.0 * fa as f64 / n.max(1) as f64,
            100.0 * ex as f64 / n.max(1) as f64,
            fw as f64 / n.max(1) as f64,
            tk as f64 / fw.max(1) as f64,
            el.as_secs_f64()
        )
    };
    for t in scores {
        s += &row(
            t.task.name(),
            t.task.paper_dataset(),
            t.n,
            t.final_answer,
            t.exact,
            t.forwards,
            t.tokens,
            t.elapsed,
        );
    }
    let sum = |f: fn(&TaskScore) -> usize| scores.iter().map(f).sum::<usize>();
    s += &row(
        "all",
        "",
        sum(|t| t.n),
        sum(|t| t.final_answer),
        sum(|t| t.exact),
        sum(|t| t.forwards),
        sum(|t| t.tokens),
        scores.iter().map(|t| t.elapsed).sum(),
    );
    s
}
