//! The rows of the evaluation: each a configuration of device, memory policy and decoding switches
//! (the paper's Table 6 ablation, and the points of the sensitivity sweeps), run over the same
//! held-out prompts, with every counter the decoders and the device report.

use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use dllm_decode::{DecodeParams, Decoder, ForwardTrace, Outcome};
use dllm_models::LoadedModel;
use dllm_tasks::{Example, TaskKind};
use serde_json::{Map, Value};

use crate::energy::{self, Energy};
use crate::projection::{PhoneModel, Projection, Target};

/// Where a row's dense forwards run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dev {
    /// The CPU backend (kernels-cpu).
    Cpu,
    /// The hexagon device (emulated DSP here) under a memory policy (`naive`, `paging`, `somr`).
    Npu(&'static str),
}

impl Dev {
    /// The projection target of the row.
    pub fn target(self) -> Target {
        match self {
            Dev::Cpu => Target::Cpu,
            Dev::Npu(_) => Target::Npu,
        }
    }
}

/// One configuration.
#[derive(Debug, Clone)]
pub struct RowSpec {
    /// The label printed in the tables.
    pub label: String,
    /// Device and memory policy.
    pub dev: Dev,
    /// What the projection prices the run's forwards as (the sweeps decode on the CPU, whose
    /// decisions equal the NPU's, and project to the NPU as the paper's Figure 13 does).
    pub project_to: Target,
    /// Decoding parameters.
    pub params: DecodeParams,
    /// Revise with the reference answer instead of re-scoring (the oracle row,
    /// [`dllm_decode::Decoder::oracle_revision`]).
    pub oracle: bool,
}

impl RowSpec {
    /// The switches of the row, as `results.json` reports them.
    pub fn switches(&self) -> Value {
        let p = &self.params;
        let m = p.strategy.mbsd();
        let staged = p.decide.staged();
        let verify = staged.and_then(|s| s.verify);
        serde_json::json!({
            "device": match self.dev { Dev::Cpu => "cpu", Dev::Npu(_) => "hexagon" },
            "memory_policy": match self.dev { Dev::Cpu => None, Dev::Npu(m) => Some(m) },
            "strategy": p.strategy.name(),
            "gen_length": p.gen_length,
            "block_length": p.block_length,
            "steps": p.steps,
            "sliding": m.map(|m| m.sliding),
            "lookahead": m.is_some_and(|m| m.lookahead),
            "lookahead_trigger": m.map(|m| m.trigger),
            "threshold": p.decide.threshold(),
            "sts": staged.is_some(),
            "sls": p.sls,
            "verify": verify.is_some(),
            "oracle_revision": self.oracle,
            "theta_visible": staged.map(|s| s.visible),
            "theta_stable": staged.map(|s| s.stable),
            "tau_back": verify.map(|v| v.tau_back),
            "no_adjacent": staged.map(|s| s.no_adjacent),
            "wait_left": staged.map(|s| s.wait_left),
            "wait_near": staged.map(|s| s.near_wait.map_or(0, |n| n.within)),
            "wait_near_below": staged.and_then(|s| s.near_wait).map(|n| n.below),
        })
    }
}

/// The outcome of one answer.
#[derive(Debug, Clone)]
pub struct AnswerRecord {
    /// Task.
    pub task: TaskKind,
    /// Final answer right.
    pub correct: bool,
    /// Worked steps right / total (tasks with worked answers).
    pub steps: Option<(usize, usize)>,
    /// The decoding step at which each generated position was committed.
    pub commit_step: Vec<Option<usize>>,
    /// Every forward of the generation.
    pub trace: Vec<ForwardTrace>,
    /// Wall time of the generation.
    pub wall: Duration,
    /// Projected phone time of the generation's forwards.
    pub projected: Projection,
    /// Against the reference answer (see [`against_reference`]).
    pub reference: ReferenceCounts,
}

pub use dllm_tasks::eval::{against_reference, reference_ids, ReferenceCounts};

/// One row's results over all prompts.
#[derive(Debug, Clone)]
pub struct RowResult {
    /// The configuration.
    pub spec: RowSpec,
    /// Every answer, in prompt order.
    pub answers: Vec<AnswerRecord>,
    /// Decoder counters summed over the answers (the names of `generate --json`).
    pub counters: Map<String, Value>,
    /// Device counters summed over the answers (`dsp_batches`, `bytes_staged`, ...), NPU rows.
    pub device: Map<String, Value>,
    /// Projected SM8750 time, summed over the answers.
    pub projected: Projection,
    /// Counts against the reference answers, summed over the answers.
    pub reference: ReferenceCounts,
    /// Energy of the whole row.
    pub energy: Energy,
    /// The error that stopped the row, if one did (e.g. a window too small for the policy).
    pub failed: Option<String>,
}

impl RowResult {
    /// Wall seconds per answer.
    pub fn wall_per_answer(&self) -> f64 {
        let n = self.answers.len().max(1) as f64;
        self.answers
            .iter()
            .map(|a| a.wall.as_secs_f64())
            .sum::<f64>()
            / n
    }

    /// Projected seconds per answer.
    pub fn projected_per_answer(&self) -> f64 {
        self.projected.s / self.answers.len().max(1) as f64
    }

    /// Whether each answer's final answer was right, in question order.
    pub fn correct(&self) -> Vec<bool> {
        self.answers.iter().map(|a| a.correct).collect()
    }

    /// A counter as a number (0 when absent).
    pub fn counter(&self, name: &str) -> f64 {
        self.counters
            .get(name)
            .or_else(|| self.device.get(name))
            .and_then(Value::as_f64)
            .unwrap_or(0.0)
    }

    /// Forwards per answer.
    pub fn forwards_per_answer(&self) -> f64 {
        self.counter("forwards") / self.answers.len().max(1) as f64
    }

    /// Final-answer accuracy of `task` (None when the row has no answer of it).
    pub fn accuracy(&self, task: TaskKind) -> Option<f64> {
        let v: Vec<bool> = self
            .answers
            .iter()
            .filter(|a| a.task == task)
            .map(|a| a.correct)
            .collect();
        (!v.is_empty()).then(|| v.iter().filter(|&&c| c).count() as f64 / v.len() as f64)
    }

    /// Accuracy over every answer.
    pub fn accuracy_all(&self) -> f64 {
        let n = self.answers.len().max(1) as f64;
        self.answers.iter().filter(|a| a.correct).count() as f64 / n
    }

    /// Per-step accuracy of `task`'s worked answers.
    pub fn step_accuracy(&self, task: TaskKind) -> Option<f64> {
        let (r, t) = self
            .answers
            .iter()
            .filter(|a| a.task == task)
            .filter_map(|a| a.steps)
            .fold((0, 0), |(r, t), (a, b)| (r + a, t + b));
        (t > 0).then(|| r as f64 / t as f64)
    }
}

fn add_counters(total: &mut Map<String, Value>, add: &Map<String, Value>) {
    for (k, v) in add {
        let Some(x) = v.as_f64() else { continue };
        let cur = total.get(k).and_then(Value::as_f64).unwrap_or(0.0);
        let sum = cur + x;
        let value = if v.is_u64() && sum.fract() == 0.0 {
            Value::from(sum as u64)
        } else {
            Value::from(sum)
        };
        total.insert(k.clone(), value);
    }
}

/// Run `spec` over `examples` with `model` (loaded on the row's device).
#[allow(clippy::too_many_arguments)]
pub fn run_row(
    spec: &RowSpec,
    model: &mut LoadedModel,
    hex: Option<&candle_hexagon::HexagonDevice>,
    tok: &tokenizers::Tokenizer,
    examples: &[Example],
    phone: &PhoneModel,
    power: Option<&energy::PowerSource>,
    mut progress: impl FnMut(usize),
) -> Result<RowResult> {
    let before = hex.map(|d| d.counters());
    // The idle baseline is taken just before the row, with nothing of ours running.
    let idle = power
        .and_then(|p| energy::idle_watts(p, Duration::from_millis(500), Duration::from_millis(50)));
    let sampler = power.map(|p| energy::Sampler::start(p.clone(), Duration::from_millis(50)));
    let mut answers = Vec::with_capacity(examples.len());
    let mut counters = Map::new();
    let mut active_positions = 0usize;
    let mut window_positions = 0usize;
    let mut projected = Projection::default();
    let mut reference = ReferenceCounts::default();
    let mut failed = None;
    for (i, ex) in examples.iter().enumerate() {
        match answer(spec, model, tok, ex, phone) {
            Ok((rec, g)) => {
                add_counters(&mut counters, &llada_cli::counters(&g));
                active_positions += g.active_positions;
                window_positions += g.trace.iter().map(|f| f.end - f.start).sum::<usize>();
                projected += rec.projected;
                reference += rec.reference;
                answers.push(rec);
            }
            Err(e) => {
                failed = Some(format!("{e:#}"));
                break;
            }
        }
        progress(i + 1);
    }
    // Means are recomputed from the totals (a sum of means means nothing).
    let forwards = counters
        .get("forwards")
        .and_then(Value::as_f64)
        .unwrap_or(0.0);
    let decoded = counters
        .get("tokens_decoded")
        .and_then(Value::as_f64)
        .unwrap_or(0.0);
    counters.insert(
        "mean_active_per_forward".into(),
        Value::from(active_positions as f64 / forwards.max(1.0)),
    );
    counters.insert(
        "mean_window_per_forward".into(),
        Value::from(window_positions as f64 / forwards.max(1.0)),
    );
    counters.insert(
        "tokens_per_forward".into(),
        Value::from(decoded / forwards.max(1.0)),
    );
    let device = match (hex, &before) {
        (Some(d), Some(b)) => llada_cli::device_counters(b, &d.counters()),
        _ => Map::new(),
    };
    let energy = match sampler {
        Some(s) => s.finish(idle.unwrap_or(0.0)),
        None => Energy::Unavailable,
    };
    Ok(RowResult {
        spec: spec.clone(),
        answers,
        counters,
        device,
        projected,
        reference,
        energy,
        failed,
    })
}

fn answer(
    spec: &RowSpec,
    model: &mut LoadedModel,
    tok: &tokenizers::Tokenizer,
    ex: &Example,
    phone: &PhoneModel,
) -> Result<(AnswerRecord, Outcome)> {
    let prompt = dllm_tasks::encode_prompt(tok, &ex.prompt)?;
    let p = &spec.params;
    let mut commit_step = vec![None; p.gen_length];
    let mut record = |e: &dllm_decode::StepEvent<'_>| {
        for &pos in e.unmasked {
            if let Some(slot) = pos
                .checked_sub(e.prompt_len)
                .and_then(|i| commit_step.get_mut(i))
            {
                *slot = Some(e.step);
            }
        }
        dllm_decode::Control::Continue
    };
    let reference = reference_ids(tok, ex, p.gen_length)?;
    let mut decoder = Decoder::new(*p);
    if spec.oracle {
        // The reference answer for the generated positions (cut at gen_length if longer).
        decoder = decoder.oracle_revision(reference[..p.gen_length].to_vec());
    }
    let t0 = Instant::now();
    let g = decoder
        .run(&mut model.model, &prompt, &mut record)
        .with_context(|| format!("{}: {}", spec.label, ex.kind))?;
    let wall = t0.elapsed();
    let response = dllm_tasks::tokenizer::decode_response(tok, g.generated())?;
    let v = dllm_tasks::check(ex, &response);
    let steps = dllm_tasks::check_steps(ex, &response).map(|s| (s.right, s.total));
    Ok((
        AnswerRecord {
            task: ex.kind,
            correct: v.final_answer,
            steps,
            commit_step,
            trace: g.trace.clone(),
            wall,
            projected: phone.project(spec.project_to, &g.trace),
            reference: against_reference(&g, &reference),
        },
        g,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use dllm_decode::{Decide, MbsdParams, Requested, Staged, Strategy, Verify};
    use dllm_models::{load, LoadOptions, ModelSource};
    use dllm_tasks::eval::QuestionSet;

    /// The bench checks remasks and drafts against the reference exactly as `dllm_tasks::eval`
    /// does, answer by answer, on the shipped long model at a low visibility threshold (where
    /// verification remasks both right and wrong tokens and drafts are taken).
    #[test]
    fn reference_counts_equal_eval_answers() {
        let dir =
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../models/tiny-llada-long");
        let mut loaded = load(&ModelSource::Dir(dir), &LoadOptions::default()).unwrap();
        let tok = loaded.tokenizer.as_ref().unwrap().inner().clone();
        let asked = Requested {
            gen_length: Some(128),
            block_length: Some(32),
            ..Default::default()
        };
        let params = DecodeParams {
            strategy: Strategy::Mbsd(MbsdParams {
                lookahead: true,
                ..MbsdParams::default()
            }),
            decide: Decide::Staged(Staged {
                visible: 0.5,
                stable: 0.9,
                no_adjacent: false,
                wait_left: 0,
                near_wait: None,
                verify: Some(Verify::default()),
            }),
            ..DecodeParams::default().resolve(asked, &loaded.defaults)
        };
        let spec = RowSpec {
            label: "check".into(),
            dev: Dev::Cpu,
            project_to: Target::Npu,
            params,
            oracle: false,
        };
        let phone = PhoneModel::default();
        let mut total = ReferenceCounts::default();
        for ex in QuestionSet::Tuning.questions().iter().take(8) {
            let (rec, _) = answer(&spec, &mut loaded, &tok, ex, &phone).unwrap();
            let e = dllm_tasks::eval::answer(&mut loaded.model, &tok, ex, &params).unwrap();
            let r = rec.reference;
            assert_eq!(
                (
                    r.remasks,
                    r.remasks_wrong,
                    r.verified,
                    r.drafts_taken,
                    r.drafts_wrong
                ),
                (
                    e.remasks,
                    e.remasks_wrong,
                    e.verified,
                    e.drafts_taken,
                    e.drafts_wrong
                ),
                "{}",
                ex.prompt
            );
            assert_eq!(rec.correct, e.final_answer);
            assert!(rec.projected.s > 0.0);
            total += r;
        }
        // The comparison means something: right and wrong remasks, right and wrong drafts.
        assert!(
            total.remasks_wrong > 0 && total.remasks_wrong < total.remasks,
            "{total:?}"
        );
        assert!(
            total.drafts_wrong > 0 && total.drafts_wrong < total.drafts_taken,
            "{total:?}"
        );
        let p = total.revision_precision().unwrap();
        assert!(p > 0.0 && p < 1.0);
    }
}
