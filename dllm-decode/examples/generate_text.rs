//! Generate text with a strategy: `cargo run --release -p dllm-decode --example generate_text --
//! <model dir, .gguf or hub id> "<prompt>" [vanilla|prefix-cache|dual-cache|mbsd]`.

use dllm_decode::{generate_text, DecodeParams};
use dllm_models::{load, LoadOptions, ModelSource};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let (Some(model), Some(prompt)) = (args.next(), args.next()) else {
        return Err("usage: generate_text <model> <prompt> [strategy]".into());
    };
    let mut loaded = load(&ModelSource::parse(&model)?, &LoadOptions::default())?;
    let mut params = DecodeParams::for_model(&loaded);
    if let Some(s) = args.next() {
        params.strategy = s.parse()?;
    }
    let text = generate_text(&mut loaded, &prompt, false, &params)?;
    println!("{text}");
    Ok(())
}
