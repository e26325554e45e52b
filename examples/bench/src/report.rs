//! The written results: `table6.md`, `table5.md`, `sweeps.md` and `results.json`.

use std::fmt::Write as _;
use std::path::Path;

use anyhow::{Context as _, Result};
use dllm_decode::DecodeParams;
use dllm_tasks::{Suite, TaskKind};
use serde_json::{json, Map, Value};

use crate::energy::Energy;
use crate::projection::{self, PhoneModel};
use crate::rows::RowResult;

/// What the run was.
pub struct Context {
    /// The model's source.
    pub model: String,
    /// Its architecture.
    pub arch: String,
    /// Its parameter count.
    pub params: usize,
    /// Its task suite.
    pub suite: Suite,
    /// The suite's tasks, in column order.
    pub tasks: Vec<TaskKind>,
    /// Prompts per row.
    pub prompts: usize,
    /// The common decoding parameters.
    pub base: DecodeParams,
    /// Whether a battery power reading exists.
    pub power: bool,
    /// Wall time of the whole bench so far.
    pub wall_s: f64,
    /// The projection's device model.
    pub phone: PhoneModel,
}

/// The machine: CPU model and available cores.
pub fn machine() -> String {
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split(':').nth(1))
                .map(|s| s.trim().to_string())
        })
        .unwrap_or_else(|| std::env::consts::ARCH.to_string());
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    format!("{cpu}, {cores} cores available")
}

fn pct(x: Option<f64>) -> String {
    x.map_or("-".into(), |v| format!("{:.1}", 100.0 * v))
}

fn gain(prev: f64, cur: f64) -> String {
    if prev > 0.0 && cur > 0.0 {
        format!("{:.2}x", prev / cur)
    } else {
        "-".into()
    }
}

fn energy_cell(e: &Energy) -> String {
    match e {
        Energy::Unavailable => "unavailable".into(),
        Energy::Measured { joules, .. } => format!("{joules:.1} J"),
    }
}

fn energy_json(e: &Energy) -> Value {
    match e {
        Energy::Unavailable => json!("unavailable"),
        Energy::Measured {
            mean_watts,
            idle_watts,
            joules,
            samples,
        } => {
            json!({"mean_watts": mean_watts, "idle_watts": idle_watts, "joules": joules, "samples": samples})
        }
    }
}

fn header(ctx: &Context) -> String {
    format!(
        "Model: `{}` ({}, {:.2}M parameters, {} suite); {} held-out prompts per row; gen length {}, \
         block {}, greedy. Machine: {}. Bench wall time {:.0} s.\n",
        ctx.model,
        ctx.arch,
        ctx.params as f64 / 1e6,
        ctx.suite.name(),
        ctx.prompts,
        ctx.base.gen_length,
        ctx.base.block_length,
        machine(),
        ctx.wall_s
    )
}

/// `table6.md`: the ablation.
pub fn table6(ctx: &Context, rows: &[RowResult]) -> String {
    let mut s =
        String::from("# Table 6 analog: the ablation, measured here and projected to SM8750\n\n");
    s += &header(ctx);
    s += "\nMeasured: wall time per answer on this machine (`NPU` rows run on the emulated DSP — the \
          kernels' host build on their own threads — so their wall time says nothing about Hexagon \
          speed). Projected: this run's own sequence of forwards replayed through the paper's Table 2 \
          latencies for LLaDA-8B Q4_0 on SM8750 (see `examples/bench/src/projection.rs`); the \
          projection does not price staging, so `+ SOMR` projects like the row above it.\n\n";
    s += "| Method | forwards/answer | mean window/forward | mean active/forward | measured ms/answer | rel. | tot. | \
          projected s/answer (SM8750) | rel. | tot. | accuracy % | verified | logits rows skipped | \
          bytes staged | maps / streamed | energy |\n";
    s += "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|\n";
    let first = rows.first();
    for (i, r) in rows.iter().enumerate() {
        // Gains are relative to the nearest earlier row that completed.
        let prev = rows[..i]
            .iter()
            .rev()
            .find(|p| p.failed.is_none())
            .unwrap_or(r);
        let wall = r.wall_per_answer() * 1e3;
        let proj = r.projected_per_answer();
        let staged = r
            .device
            .get("bytes_staged")
            .and_then(Value::as_u64)
            .map_or("-".into(), |b| format!("{:.1} MB", b as f64 / 1e6));
        let maps = match r.device.get("maps").and_then(Value::as_u64) {
            Some(m) => format!("{m} / {:.1} MB", r.counter("bytes_streamed") / 1e6),
            None => "-".into(),
        };
        if let Some(e) = &r.failed {
            let _ = writeln!(
                s,
                "| {} | failed: {} |||||||||||||| |",
                r.spec.label,
                e.replace('|', "/")
            );
            continue;
        }
        let _ = writeln!(
            s,
            "| {} | {:.1} | {:.1} | {:.1} | {:.1} | {} | {} | {:.1} | {} | {} | {} | {} | {} | {} | {} | {} |",
            r.spec.label,
            r.forwards_per_answer(),
            r.counter("mean_window_per_forward"),
            r.counter("mean_active_per_forward"),
            wall,
            gain(prev.wall_per_answer(), r.wall_per_answer()),
            gain(first.map_or(0.0, |f| f.wall_per_answer()), r.wall_per_answer()),
            proj,
            gain(prev.projected_per_answer(), proj),
            gain(first.map_or(0.0, |f| f.projected_per_answer()), proj),
            pct(Some(r.accuracy_all())),
            r.counter("verified") as u64,
            r.counter("logits_rows_skipped") as u64,
            staged,
            maps,
            energy_cell(&r.energy),
        );
    }
    let _ = writeln!(s, "\n{}", projection::paper_check_text(&ctx.phone, 79));
    if !ctx.power {
        s += "Energy: no battery power reading on this machine (`/sys/class/power_supply`), so it is \
              reported as unavailable rather than estimated.\n";
    }
    s
}

/// `table5.md`: accuracy per task.
pub fn table5(ctx: &Context, rows: &[RowResult]) -> String {
    let mut s = String::from("# Table 5 analog: quality per task (final-answer accuracy, %)\n\n");
    s += &header(ctx);
    s += "\nThe paper's lower block maps to the rows `CPU`, `NPU`, `+ MBSD` (NPU + MBSD) and \
          `+ verification` (NPU + MBSD with its tentative tokens verified: this project's revision). \
          Per-step accuracy of worked answers in parentheses.\n\n| Setting |";
    for t in &ctx.tasks {
        let _ = write!(s, " {t} |");
    }
    s += " all |\n|---|";
    for _ in &ctx.tasks {
        s += "---:|";
    }
    s += "---:|\n";
    for r in rows {
        let _ = write!(s, "| {} |", r.spec.label);
        for &t in &ctx.tasks {
            let step = r
                .step_accuracy(t)
                .map(|x| format!(" ({:.1})", 100.0 * x))
                .unwrap_or_default();
            let _ = write!(s, " {}{step} |", pct(r.accuracy(t)));
        }
        let all = (!r.answers.is_empty()).then(|| r.accuracy_all());
        let _ = writeln!(s, " {} |", pct(all));
    }
    s
}

/// `sweeps.md`: the Figure 13 analogs.
pub fn sweeps(ctx: &Context, a: &[RowResult], b: &[RowResult], c: &[(u64, RowResult)]) -> String {
    let mut s = String::from("# Sensitivity sweeps (Figure 13 analogs)\n\n");
    s += &header(ctx);
    s += "\n## 13a: lookahead trigger (full configuration, decoded on the CPU; projected to the SM8750 NPU)\n\n";
    s += "| trigger | forwards/answer | mean active/forward | drafts accepted | drafts rejected | projected s/answer | accuracy % |\n|---:|---:|---:|---:|---:|---:|---:|\n";
    for r in a {
        let _ = writeln!(
            s,
            "| {} | {:.1} | {:.1} | {} | {} | {:.1} | {} |",
            r.spec.params.strategy.mbsd().map_or(0, |m| m.trigger),
            r.forwards_per_answer(),
            r.counter("mean_active_per_forward"),
            r.counter("drafts_accepted") as u64,
            r.counter("drafts_rejected") as u64,
            r.projected_per_answer(),
            pct(Some(r.accuracy_all()))
        );
    }
    s += "\n## 13b: visibility / stability thresholds (full configuration, decoded on the CPU; projected to the SM8750 NPU)\n\n";
    s += "| theta_visible | theta_stable | forwards/answer | remasks | verified | unstable at block end | projected s/answer | accuracy % |\n|---:|---:|---:|---:|---:|---:|---:|---:|\n";
    for r in b {
        let _ = writeln!(
            s,
            "| {} | {} | {:.1} | {} | {} | {} | {:.1} | {} |",
            r.spec.params.decide.staged().map_or(0.0, |s| s.visible),
            r.spec.params.decide.staged().map_or(0.0, |s| s.stable),
            r.forwards_per_answer(),
            r.counter("remasks") as u64,
            r.counter("verified") as u64,
            r.counter("unstable_at_block_end") as u64,
            r.projected_per_answer(),
            pct(Some(r.accuracy_all()))
        );
    }
    s += "\n## 13c: NPU address window under SOMR (full configuration, emulated DSP)\n\n";
    s += "| window MiB | completed | bytes staged/answer | DSP batches/answer | measured ms/answer | accuracy % |\n|---:|---|---:|---:|---:|---:|\n";
    for (mib, r) in c {
        let n = r.answers.len().max(1) as f64;
        if let Some(e) = &r.failed {
            let _ = writeln!(s, "| {mib} | no: {} | - | - | - | - |", e.replace('|', "/"));
            continue;
        }
        let _ = writeln!(
            s,
            "| {mib} | yes | {:.2} MB | {:.0} | {:.1} | {} |",
            r.counter("bytes_staged") / n / 1e6,
            r.counter("dsp_batches") / n,
            r.wall_per_answer() * 1e3,
            pct(Some(r.accuracy_all()))
        );
    }
    s
}

fn row_json(ctx: &Context, r: &RowResult) -> Value {
    let mut m = Map::new();
    m.insert("label".into(), json!(r.spec.label));
    m.insert("switches".into(), r.spec.switches());
    m.insert("answers".into(), json!(r.answers.len()));
    m.extend(r.counters.clone());
    m.extend(r.device.clone());
    m.insert("forwards_per_answer".into(), json!(r.forwards_per_answer()));
    m.insert(
        "wall_ms_per_answer".into(),
        json!(r.wall_per_answer() * 1e3),
    );
    m.insert(
        "projected_sm8750_s_per_answer".into(),
        json!(r.projected_per_answer()),
    );
    let acc: Map<String, Value> = ctx
        .tasks
        .iter()
        .map(|t| (t.to_string(), json!(r.accuracy(*t))))
        .collect();
    m.insert("accuracy".into(), Value::Object(acc));
    m.insert("accuracy_all".into(), json!(r.accuracy_all()));
    let steps: Map<String, Value> = ctx
        .tasks
        .iter()
        .filter_map(|t| r.step_accuracy(*t).map(|a| (t.to_string(), json!(a))))
        .collect();
    m.insert("step_accuracy".into(), Value::Object(steps));
    m.insert("energy".into(), energy_json(&r.energy));
    m.insert("failed".into(), json!(r.failed));
    // The first answer's per-forward activity and commit steps (Figures 5a and 8).
    if let Some(a) = r.answers.first() {
        m.insert(
            "first_answer".into(),
            json!({
                "task": a.task.to_string(),
                "active_per_forward": a.trace.iter().map(|f| f.active).collect::<Vec<_>>(),
                "window_per_forward": a.trace.iter().map(|f| [f.start, f.end]).collect::<Vec<_>>(),
                "commit_step": a.commit_step,
            }),
        );
    }
    Value::Object(m)
}

/// Write every file.
pub fn write_all(
    out: &Path,
    ctx: &Context,
    rows: &[RowResult],
    a: &[RowResult],
    b: &[RowResult],
    c: &[(u64, RowResult)],
) -> Result<()> {
    let w = |name: &str, text: String| {
        std::fs::write(out.join(name), text).with_context(|| format!("writing {name}"))
    };
    w("table6.md", table6(ctx, rows))?;
    w("table5.md", table5(ctx, rows))?;
    w("sweeps.md", sweeps(ctx, a, b, c))?;
    let check = projection::paper_check(&ctx.phone, 79);
    let results = json!({
        "model": ctx.model,
        "arch": ctx.arch,
        "parameters": ctx.params,
        "suite": ctx.suite.name(),
        "machine": machine(),
        "prompts_per_row": ctx.prompts,
        "gen_length": ctx.base.gen_length,
        "block_length": ctx.base.block_length,
        "projection_check": {
            "prompt_tokens": 79,
            "cpu_s": check.cpu_s, "paper_cpu_s": projection::PAPER_CPU_VANILLA_S,
            "npu_table_s": check.npu_table_s, "npu_s": check.npu_s,
            "paper_npu_s": projection::PAPER_NPU_VANILLA_S,
            "logits_on": ctx.phone.logits_on.name(),
        },
        "rows": rows.iter().map(|r| row_json(ctx, r)).collect::<Vec<_>>(),
        "sweeps": {
            "lookahead_trigger": a.iter().map(|r| row_json(ctx, r)).collect::<Vec<_>>(),
            "thresholds": b.iter().map(|r| row_json(ctx, r)).collect::<Vec<_>>(),
            "npu_window": c.iter().map(|(mib, r)| {
                let mut v = row_json(ctx, r);
                v["window_mib"] = json!(mib);
                v
            }).collect::<Vec<_>>(),
        },
    });
    w("results.json", serde_json::to_string_pretty(&results)?)?;
    Ok(())
}
