//! dllm-decode's vanilla strategy reproduces LLaDA's official `generate` (the independent oracle in
//! `llada_tests::generate`, running on the independent f64 reference forward) token for token, on
//! safetensors and on the llama.cpp-layout GGUF of the same weights.

use anyhow::Result;
use candle_core::quantized::GgmlDType;
use dllm_decode::{generate, DecodeParams, Strategy};
use dllm_models::synthetic::tiny_llada;
use dllm_models::LoadOptions;
use llada_tests::fixtures::{load_path, tiny_dir, TempDir};
use llada_tests::generate::{llada_generate, GenerateParams};
use llada_tests::gguf_fixture::write_gguf;
use llada_tests::reference::Reference;

fn ours(
    path: &std::path::Path,
    prompt: &[u32],
    gen: usize,
    block: usize,
    steps: usize,
) -> Result<dllm_decode::Generation> {
    let mut m = load_path(path, &LoadOptions::default())?;
    let p = DecodeParams {
        gen_length: gen,
        block_length: block,
        steps,
        strategy: Strategy::Vanilla,
        early_stop: false,
        ..Default::default()
    };
    Ok(generate(&mut m.model, prompt, &p, &mut ())?)
}

#[test]
fn vanilla_matches_the_official_algorithm() -> Result<()> {
    let cfg = tiny_llada();
    // (seed, prompt, gen_length, block_length, steps)
    let cases: &[(u64, &[u32], usize, usize, usize)] = &[
        (101, &[3, 14, 15, 92, 65], 16, 16, 16),
        (202, &[7, 7, 7], 24, 8, 12),
        (303, &[1, 2, 3, 4, 5, 6, 7, 8, 9], 32, 8, 8),
        (404, &[200], 12, 4, 9),
    ];
    for &(seed, prompt, gen, block, steps) in cases {
        let dir = tiny_dir("oracle", &cfg, seed)?;
        let reference = Reference::load(dir.path())?;
        let want = llada_generate(
            &reference,
            prompt,
            &GenerateParams {
                steps,
                gen_length: gen,
                block_length: block,
                cfg_scale: 0.0,
                mask_id: cfg.special.mask,
            },
        )?;
        let got = ours(dir.path(), prompt, gen, block, steps)?;
        assert_eq!(
            got.canvas, want.canvas,
            "seed {seed}: tokens differ from LLaDA's generate"
        );
        assert_eq!(got.forwards, want.forwards, "seed {seed}: forward count");

        let gguf_dir = TempDir::new("oracle-gguf")?;
        let gguf = gguf_dir.join("model.gguf");
        write_gguf(dir.path(), &gguf, GgmlDType::F32)?;
        let from_gguf = ours(&gguf, prompt, gen, block, steps)?;
        assert_eq!(
            from_gguf.canvas, want.canvas,
            "seed {seed}: the GGUF of the same weights differs"
        );
    }
    Ok(())
}
