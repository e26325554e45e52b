//! The model-level comparison with llama.cpp: one forward over a 160-token canvas of the 100M
//! LLaDA, per GGUF type, llama.cpp's `llama-bench` and llada-rs alternated in one run.
//!
//! F32 and F16 files come from the project's GGUF writer, Q8_0 and Q4_0 from llama.cpp's own
//! `llama-quantize` run on the F32 file (so Q4_0 has the Q6_K `output.weight` llama-quantize
//! writes). llama.cpp is never built here: the caller passes the paths of its binaries.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, Context, Result};
use candle_core::quantized::GgmlDType;
use dllm_models::{CpuLinears, DiffusionLm, Rows};

use crate::model::{canvas, load_gguf, median_ms, write_gguf};

/// What to compare.
pub struct Plan {
    /// `llama-bench`.
    pub llama_bench: PathBuf,
    /// `llama-quantize`.
    pub llama_quantize: PathBuf,
    /// Where the GGUF files go.
    pub dir: PathBuf,
    /// GGUF types (`f32`, `f16`, `q8_0`, `q4_0`).
    pub types: Vec<String>,
    /// Alternated rounds.
    pub rounds: usize,
    /// Repetitions per side per round.
    pub reps: usize,
    /// Canvas length.
    pub tokens: usize,
    /// Threads for both sides.
    pub threads: usize,
}

fn run_ok(cmd: &mut Command) -> Result<String> {
    let out = cmd.output().with_context(|| format!("running {cmd:?}"))?;
    if !out.status.success() {
        bail!(
            "{cmd:?} failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Make `<dir>/<ty>.gguf`.
fn make(plan: &Plan, ty: &str) -> Result<PathBuf> {
    let path = plan.dir.join(format!("bench100m-{ty}.gguf"));
    if path.is_file() {
        return Ok(path);
    }
    match ty {
        "f32" => write_gguf(&path, GgmlDType::F32)?,
        "f16" => write_gguf(&path, GgmlDType::F16)?,
        "q8_0" | "q4_0" => {
            let src = make(plan, "f32")?;
            run_ok(
                Command::new(&plan.llama_quantize)
                    .arg(&src)
                    .arg(&path)
                    .arg(ty.to_uppercase()),
            )?;
        }
        other => bail!("--types: `{other}` (expected f32, f16, q8_0 or q4_0)"),
    }
    Ok(path)
}

/// One `llama-bench` prompt-processing measurement: mean ms per forward.
fn llama_ms(plan: &Plan, model: &Path) -> Result<f64> {
    let out = run_ok(
        Command::new(&plan.llama_bench)
            .arg("-m")
            .arg(model)
            .args(["-p", &plan.tokens.to_string(), "-n", "0"])
            .args(["-t", &plan.threads.to_string()])
            .args(["-r", &plan.reps.to_string(), "-o", "json"]),
    )?;
    let v: serde_json::Value =
        serde_json::from_str(&out).context("parsing llama-bench's JSON output")?;
    let ns = v
        .as_array()
        .and_then(|a| a.first())
        .and_then(|r| r.get("avg_ns"))
        .and_then(|n| n.as_f64())
        .context("llama-bench output has no avg_ns")?;
    Ok(ns / 1e6)
}

fn range(v: &[f64]) -> String {
    let lo = v.iter().copied().fold(f64::INFINITY, f64::min);
    let hi = v.iter().copied().fold(0.0, f64::max);
    if (hi - lo) < 0.05 {
        format!("{lo:.1}")
    } else {
        format!("{lo:.1}-{hi:.1}")
    }
}

/// Run the comparison and print the table.
pub fn run(plan: &Plan) -> Result<()> {
    std::fs::create_dir_all(&plan.dir)
        .with_context(|| format!("creating {}", plan.dir.display()))?;
    println!(
        "| GGUF | llama.cpp ms | llada-rs ms (logits for all {t} rows) | ratio | llada-rs ms (logits for the last row, as llama-bench) | ratio |",
        t = plan.tokens
    );
    println!("|---|---:|---:|---:|---:|---:|");
    for ty in &plan.types {
        let path = make(plan, ty)?;
        let mut m = load_gguf(&path, CpuLinears::Packed)?;
        let x = canvas(plan.tokens, m.info().vocab_size)?;
        let last = [plan.tokens - 1];
        let (mut llama, mut all, mut one) = (vec![], vec![], vec![]);
        for _ in 0..plan.rounds {
            llama.push(llama_ms(plan, &path)?);
            all.push(median_ms(plan.reps, || {
                m.forward_full(&x, Rows::All)?;
                Ok(())
            })?);
            one.push(median_ms(plan.reps, || {
                m.forward_full(&x, Rows::Positions(&last))?;
                Ok(())
            })?);
        }
        let mid = |v: &[f64]| {
            let mut s = v.to_vec();
            s.sort_by(|a, b| a.total_cmp(b));
            s[s.len() / 2]
        };
        println!(
            "| {} | {} | {} | {:.2}x | {} | {:.2}x |",
            ty.to_uppercase(),
            range(&llama),
            range(&all),
            mid(&llama) / mid(&all),
            range(&one),
            mid(&llama) / mid(&one)
        );
    }
    Ok(())
}
