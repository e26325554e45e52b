//! Writes a suite model (an HF directory written by `train-tiny`) as a llama.cpp GGUF file with
//! its tokenizer, in F32, F16, Q8_0 or Q4_0.
//!
//! ```text
//! cargo run --release -p dllm-tasks --example export_gguf -- MODEL_DIR OUT.gguf [f16|q4_0|q8_0|f32]
//! ```

use std::path::PathBuf;

use dllm_tasks::export::{export_gguf, parse_gguf_type};

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let run = || -> Result<(), Box<dyn std::error::Error>> {
        let (dir, out) = match args.as_slice() {
            [dir, out] | [dir, out, _] => (PathBuf::from(dir), PathBuf::from(out)),
            _ => return Err("usage: export_gguf MODEL_DIR OUT.gguf [f16|q4_0|q8_0|f32]".into()),
        };
        let dtype = parse_gguf_type(args.get(2).map_or("f16", String::as_str))?;
        export_gguf(&dir, &out, dtype)?;
        println!("wrote {} ({dtype:?})", out.display());
        Ok(())
    };
    if let Err(e) = run() {
        eprintln!("error: {e}");
        std::process::exit(1);
    }
}
