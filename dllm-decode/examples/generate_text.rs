//! Generate text with a strategy: `cargo run --release -p dllm-decode --example generate_text --
//! <model dir, .gguf or hub id> "<prompt>" [vanilla|prefix-cache|dual-cache|mbsd]`.

use dllm_decode::prelude::*;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let (Some(model), Some(prompt)) = (args.next(), args.next()) else {
        return Err("usage: generate_text <model> <prompt> [strategy]".into());
    };
    let mut loaded = load(&ModelSource::parse(&model)?, &LoadOptions::default())?;
    let mut params = loaded.decode_params();
    if let Some(s) = args.next() {
        params.strategy = s.parse()?;
    }
    let text = loaded.generate_text(&prompt, false, &params)?;
    println!("{text}");
    Ok(())
}
