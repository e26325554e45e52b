//! `llada-tests-logits DIR ID...`: load the model in `DIR` through `dllm_models::load`, run one
//! full-canvas forward over the given token ids and print every logit's `f32` bit pattern in hex,
//! one row per line; the process's final OS thread count goes to stderr (`Threads: N`).
//!
//! candle reads its CPU thread count from `RAYON_NUM_THREADS` (and `CANDLE_NUM_THREADS`) when its
//! pools are first built, so the thread-count determinism test runs this binary as a child process
//! under different values and compares the bits.

use anyhow::{Context, Result};
use dllm_models::{DiffusionLm, LoadOptions, ModelSource, Rows};

fn main() -> Result<()> {
    let mut args = std::env::args().skip(1);
    let dir = args.next().context("usage: llada-tests-logits DIR ID...")?;
    let ids: Vec<u32> = args.map(|a| a.parse()).collect::<Result<_, _>>()?;
    let mut m = dllm_models::load(&ModelSource::parse(&dir)?, &LoadOptions::default())?.model;
    let canvas = candle_core::Tensor::from_vec(ids.clone(), (1, ids.len()), m.device())?;
    let rows: Vec<Vec<f32>> = m.forward_full(&canvas, Rows::All)?.squeeze(0)?.to_vec2()?;
    let mut out = String::new();
    for r in rows {
        let line: Vec<String> = r.iter().map(|v| format!("{:08x}", v.to_bits())).collect();
        out.push_str(&line.join(" "));
        out.push('\n');
    }
    print!("{out}");
    // Report how many OS threads the process ended with, so the caller can tell that its thread
    // setting really reached candle's pools.
    if let Ok(status) = std::fs::read_to_string("/proc/self/status") {
        if let Some(l) = status.lines().find(|l| l.starts_with("Threads:")) {
            eprintln!("{l}");
        }
    }
    Ok(())
}
