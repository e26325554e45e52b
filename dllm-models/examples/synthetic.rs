//! Write a random checkpoint in the exact HF layout (for trying the CLI and benchmarks without
//! downloading weights): `cargo run --release -p dllm-models --example synthetic -- <preset> <dir> [seed]`
//! with preset `tiny-llada`, `tiny-dream` or `llada-100m`.

use candle_core::DType;
use dllm_models::synthetic::{bench_llada_100m, random_weights, tiny_dream, tiny_llada, write_hf};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    if args.len() < 3 {
        return Err("usage: synthetic <tiny-llada|tiny-dream|llada-100m> <dir> [seed]".into());
    }
    let cfg = match args[1].as_str() {
        "tiny-llada" => tiny_llada(),
        "tiny-dream" => tiny_dream(),
        "llada-100m" => bench_llada_100m(),
        p => return Err(format!("unknown preset `{p}`").into()),
    };
    let seed = args.get(3).map(|s| s.parse()).transpose()?.unwrap_or(0);
    let w = random_weights(&cfg, seed)?;
    write_hf(std::path::Path::new(&args[2]), &cfg, &w, DType::F32, 1)?;
    eprintln!("wrote {} ({} tensors)", args[2], w.len());
    Ok(())
}
