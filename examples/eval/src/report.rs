//! The evaluation's output: the table (with `--calibration`'s bands and `--first-errors`'
//! classes) or the `--json` object.

use std::time::Instant;

use dllm_decode::{DecodeParams, Staged};
use dllm_models::{Arch, ModelInfo};
use dllm_tasks::eval::{calibration, calibration_table, table, Answered, QuestionSet, TaskScore};
use dllm_tasks::first_wrong::{first_errors, first_errors_table};
use dllm_tasks::{Suite, TaskKind};
use serde_json::Value;

use crate::Args;

/// How the run decoded, as the output names it.
pub struct Decoding {
    /// Dream's own algorithm ran (the vanilla strategy on a Dream model): no blocks and no
    /// remasking rule.
    dream_alg: bool,
    /// The staged-decision parameters, none when Dream's algorithm ran.
    staged: Option<Staged>,
    /// The strategy, with Dream's algorithm or a remasking rule other than low_confidence.
    label: String,
}

impl Decoding {
    /// How `params` decode on a model of `arch`, named with the `args` flags.
    pub fn new(args: &Args, arch: Arch, params: &DecodeParams) -> Self {
        // Dream's own algorithm runs for the vanilla strategy: it has no blocks and no remasking rule.
        let dream_alg = dllm_decode::uses_dream_algorithm(arch, params);
        let staged = params.decide.staged().filter(|_| !dream_alg);
        let label = if dream_alg {
            format!("{} (Dream {})", args.decode.strategy, args.decode.alg)
        } else if args.decode.remasking != "low_confidence" {
            format!("{} ({})", args.decode.strategy, args.decode.remasking)
        } else {
            args.decode.strategy.clone()
        };
        Self {
            dream_alg,
            staged,
            label,
        }
    }
}

/// One evaluation's results and the settings they were obtained with, ready to print.
pub struct Report<'a> {
    /// The command line.
    pub args: &'a Args,
    /// The model, as loaded (for messages).
    pub model: &'a str,
    /// The model's static facts.
    pub info: &'a ModelInfo,
    /// The task suite.
    pub suite: Suite,
    /// The long-math question set, if `--set` chose one.
    pub set: Option<QuestionSet>,
    /// The decoding parameters.
    pub params: &'a DecodeParams,
    /// Questions asked.
    pub questions: usize,
    /// Scores per task.
    pub scores: &'a [TaskScore],
    /// Every answer, in question order.
    pub answers: &'a [Answered],
    /// When the evaluation started (for the JSON's total `elapsed_ms`).
    pub started: Instant,
}

impl Report<'_> {
    /// Print the `--json` object, or else the table.
    pub fn print(&self) {
        let decoding = Decoding::new(self.args, self.info.arch, self.params);
        if self.args.json {
            let out = self.json(&decoding);
            println!("{out}");
        } else {
            self.print_table(&decoding);
        }
    }

    /// The `--json` object: the settings, the scores per task and every answer.
    fn json(&self, d: &Decoding) -> Value {
        let (a, params, staged) = (self.args, self.params, d.staged);
        let mbsd = params
            .strategy
            .mbsd()
            .map(|m| m.pinned(self.info.shift_logits, params.decide));
        serde_json::json!({
            "model": self.model,
            "suite": self.suite.name(),
            "params": {
                "set": self.set.map(QuestionSet::name),
                "strategy": a.decode.strategy, "gen_length": params.gen_length, "block_length": params.block_length,
                "steps": params.steps, "threshold": params.decide.threshold().map(f32_as_written), "remasking": a.decode.remasking,
                "dream_alg": d.dream_alg.then_some(&a.decode.alg),
                "theta_visible": staged.map(|s| f32_as_written(s.visible)),
                "theta_stable": staged.map(|s| f32_as_written(s.stable)),
                "tau_back": staged.and_then(|s| s.verify).map(|v| f32_as_written(v.tau_back)),
                // The near wait's positions (0: off) and confidence, staged decisions only.
                "wait_near": staged.map(|s| s.near_wait.map_or(0, |n| n.within)),
                "wait_near_below": staged.and_then(|s| s.near_wait).map(|n| f32_as_written(n.below)),
                "oracle_decisions": a.oracle_decisions,
                // mbsd's switches as they ran on this model's family, else null.
                "show_guess": mbsd.map(|m| m.show_guess),
                "guess_agreement": mbsd.map(|m| m.guess_agreement),
                "fit_bucket": mbsd.map(|m| m.fit_bucket),
                "fit_guess": mbsd.map(|m| m.fit_guess),
                "span": mbsd.map(|m| m.span),
                "trim_left": mbsd.map(|m| m.trim_left),
                "sliding": mbsd.map(|m| m.sliding),
                "refresh": mbsd.map(|m| m.refresh),
            },
            "tasks": self.scores.iter().map(|s| self.task_json(s)).collect::<Vec<_>>(),
            // Every answer, in question order, with the step that committed each generated
            // position (null: filled with EOS after an early stop, never decoded).
            "answers": self.answers.iter().map(answer_json).collect::<Vec<_>>(),
            "elapsed_ms": self.started.elapsed().as_secs_f64() * 1e3,
        })
    }

    /// One task's entry of the `--json` object (with its calibration under `--calibration`, its
    /// wrong answers' first wrong tokens under `--first-errors`).
    fn task_json(&self, s: &TaskScore) -> Value {
        serde_json::json!({
            "task": s.task.name(), "paper_dataset": s.task.paper_dataset(), "n": s.n,
            "final_answer_accuracy": s.accuracy(), "exact_accuracy": s.exact_accuracy(),
            "forwards_per_answer": s.forwards_per_answer(), "tokens_per_forward": s.tokens_per_forward(),
            "step_accuracy": s.step_accuracy(), "forwards_per_worked_step": s.forwards_per_step(),
            "remasks": s.remasks, "verified": s.verified, "guesses_shown": s.guesses.shown, "guesses_confirmed": s.guesses.confirmed, "guesses_agreed": s.guesses.agreed, "guesses_waited": s.guesses.waited,
            "revision_precision": s.revision_precision(), "drafts_wrong": s.drafts_wrong,
            "elapsed_ms": s.elapsed.as_secs_f64() * 1e3,
            "calibration": self.args.calibration.then(|| calibration(&self.answers_of(s.task))),
            "first_errors": self.args.first_errors.then(|| first_errors(&self.answers_of(s.task))),
        })
    }

    /// The table: a line of settings, the scores per task, then (with `--calibration`) each
    /// task's committed tokens per confidence band and (with `--first-errors`) its wrong answers
    /// by their first wrong token.
    fn print_table(&self, d: &Decoding) {
        println!("{}\n", self.settings_line(d));
        print!("{}", table(self.scores));
        if self.args.calibration {
            for s in self.scores {
                let mine = self.answers_of(s.task);
                println!(
                    "\n{}: committed tokens per confidence band\n",
                    s.task.name()
                );
                print!("{}", calibration_table(&calibration(&mine)));
            }
        }
        if self.args.first_errors {
            for s in self.scores {
                let rows = first_errors(&self.answers_of(s.task));
                println!(
                    "\n{}: wrong answers by their first wrong token\n",
                    s.task.name()
                );
                print!("{}", first_errors_table(&rows));
            }
        }
    }

    /// The table's first line: the model, the decoding settings and the number of questions.
    fn settings_line(&self, d: &Decoding) -> String {
        let params = self.params;
        format!(
            "{} ({}, {:.2}M parameters) · {}{} · gen {}{} steps {}{} · {} questions",
            self.model,
            self.info.arch,
            self.info.num_params as f64 / 1e6,
            d.label,
            if self.args.oracle_decisions {
                " with oracle decisions (a bound, not a decoder)"
            } else {
                ""
            },
            params.gen_length,
            if d.dream_alg {
                String::new()
            } else {
                format!(" block {}", params.block_length)
            },
            params.steps,
            match (params.decide.threshold(), d.staged) {
                (Some(t), _) => format!(" threshold {t}"),
                (None, Some(s)) => format!(
                    " theta {} / {}{}",
                    s.visible,
                    s.stable,
                    match s.verify {
                        Some(v) => format!(", verified (tau_back {})", v.tau_back),
                        None => ", not verified".into(),
                    }
                ),
                (None, None) => String::new(),
            },
            self.questions
        )
    }

    /// The answers to `task`'s questions, in question order.
    fn answers_of(&self, task: TaskKind) -> Vec<Answered> {
        self.answers
            .iter()
            .filter(|x| x.task == task)
            .cloned()
            .collect()
    }
}

/// One answer's entry of the `--json` object, with the step that committed each generated
/// position.
fn answer_json(ans: &Answered) -> Value {
    serde_json::json!({
        "task": ans.task.name(), "final_answer": ans.final_answer, "exact": ans.exact,
        "steps_right": ans.steps.map(|s| s.right), "steps_total": ans.steps.map(|s| s.total),
        "forwards": ans.forwards, "tokens": ans.tokens, "response": ans.response,
        "remasks": ans.remasks, "remasks_wrong": ans.remasks_wrong, "verified": ans.verified,
        "drafts_taken": ans.drafts_taken, "drafts_wrong": ans.drafts_wrong,
        "commit_step": ans.commit_step,
    })
}

/// An f32 as the f64 of its shortest decimal form (0.9f32 prints as 0.9 in JSON, not 0.8999999761581421).
fn f32_as_written(x: f32) -> f64 {
    x.to_string().parse().unwrap_or(x as f64)
}
