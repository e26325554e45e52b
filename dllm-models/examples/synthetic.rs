//! Write a random checkpoint (for trying the CLI and benchmarks without downloading weights):
//!
//! - `cargo run --release -p dllm-models --example synthetic -- <preset> <dir> [seed]`: the exact
//!   HF layout (f32 safetensors), for presets `tiny-llada`, `tiny-dream` and `llada-100m`;
//! - `... -- <preset> <file.gguf> [seed] --gguf q4_0|q8_0|f16|f32`: a llama.cpp GGUF with a
//!   placeholder vocabulary, written tensor by tensor (a few tens of MB of memory whatever the
//!   model's size), for those presets and the full-size `llada-8b` (LLaDA-8B's shapes, 32
//!   layers: 4.5 GB as Q4_0, 8.5 GB as Q8_0) and `dream-7b` (Dream-v0-7B's shapes, 28 layers).

use candle_core::quantized::GgmlDType;
use candle_core::DType;
use dllm_models::gguf_write::{placeholder_vocab, write_random_gguf, RandomGguf};
use dllm_models::synthetic::{
    bench_llada_100m, dream_7b, llada_8b, random_weights, tiny_dream, tiny_llada, write_hf,
};

const USAGE: &str = "usage: synthetic <tiny-llada|tiny-dream|llada-100m|llada-8b|dream-7b> <out> [seed] [--gguf q4_0|q8_0|f16|f32]";

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args: Vec<String> = std::env::args().skip(1).collect();
    let gguf = match args.iter().position(|a| a == "--gguf") {
        Some(i) if i + 1 < args.len() => {
            let t = args.remove(i + 1);
            args.remove(i);
            Some(match t.as_str() {
                "q4_0" => GgmlDType::Q4_0,
                "q8_0" => GgmlDType::Q8_0,
                "f16" => GgmlDType::F16,
                "f32" => GgmlDType::F32,
                other => return Err(format!("--gguf: unknown type `{other}`\n{USAGE}").into()),
            })
        }
        Some(_) => return Err(format!("--gguf needs a type\n{USAGE}").into()),
        None => None,
    };
    if args.len() < 2 {
        return Err(USAGE.into());
    }
    let cfg = match args[0].as_str() {
        "tiny-llada" => tiny_llada(),
        "tiny-dream" => tiny_dream(),
        "llada-100m" => bench_llada_100m(),
        "llada-8b" => llada_8b(),
        "dream-7b" => dream_7b(),
        p => return Err(format!("unknown preset `{p}`\n{USAGE}").into()),
    };
    let seed = args.get(2).map(|s| s.parse()).transpose()?.unwrap_or(0);
    let out = std::path::Path::new(&args[1]);
    match gguf {
        Some(dtype) => {
            let how = RandomGguf {
                extra: placeholder_vocab(cfg.vocab_size),
                ..RandomGguf::new(dtype, seed)
            };
            let bytes = write_random_gguf(out, &cfg, &how)?;
            eprintln!("wrote {} ({bytes} bytes)", out.display());
        }
        None if cfg.num_layers > 12 => {
            return Err(format!("{}: write it as a GGUF (--gguf q4_0)", args[0]).into())
        }
        None => {
            let w = random_weights(&cfg, seed)?;
            write_hf(out, &cfg, &w, DType::F32, 1)?;
            eprintln!("wrote {} ({} tensors)", out.display(), w.len());
        }
    }
    Ok(())
}
