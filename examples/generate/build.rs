//! Embed the project's default model (`models/tiny-llada`) when it is present, so `generate` works
//! with no `--model` from any directory.

use std::path::Path;

fn main() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../models/tiny-llada");
    println!("cargo::rustc-check-cfg=cfg(embedded_model)");
    for f in [
        "config.json",
        "model.safetensors",
        "tokenizer.json",
        "generation_config.json",
    ] {
        println!("cargo::rerun-if-changed={}", dir.join(f).display());
    }
    let complete = [
        "config.json",
        "model.safetensors",
        "tokenizer.json",
        "generation_config.json",
    ]
    .iter()
    .all(|f| dir.join(f).is_file());
    if complete {
        println!("cargo::rustc-cfg=embedded_model");
        println!("cargo::rustc-env=LLADA_RS_EMBEDDED_DIR={}", dir.display());
    }
}
