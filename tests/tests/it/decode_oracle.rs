//! dllm-decode's vanilla strategy reproduces LLaDA's official `generate` (the independent oracle in
//! `llada_tests::generate`, running on the independent f64 reference forward) token for token, on
//! safetensors and on the llama.cpp-layout GGUF of the same weights, with classifier-free
//! guidance, and with random remasking (the random draw replayed as an input).

use anyhow::Result;
use candle_core::quantized::GgmlDType;
use dllm_decode::{generate, Control, DecodeParams, Remasking, StepEvent, Strategy};
use dllm_models::synthetic::tiny_llada;
use dllm_models::LoadOptions;
use llada_tests::fixtures::{load_path, tiny_dir, TempDir};
use llada_tests::generate::{
    llada_generate, llada_generate_random, llada_generate_with, GenerateParams,
};
use llada_tests::gguf_fixture::write_gguf;
use llada_tests::reference::Reference;

fn ours(
    path: &std::path::Path,
    prompt: &[u32],
    gen: usize,
    block: usize,
    steps: usize,
) -> Result<dllm_decode::Outcome> {
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

/// The reference's logits with the mask id made a non-candidate: dllm-decode never predicts it
/// (issue 17). A very negative finite value rather than -inf keeps guidance's
/// `un + (s + 1) * (cond - un)` finite, and ranks it last all the same.
fn reference_logits(r: &Reference, mask: u32) -> impl FnMut(&[u32]) -> Result<Vec<Vec<f64>>> + '_ {
    move |x| {
        let mut rows = r.forward(x)?;
        rows.iter_mut().for_each(|row| row[mask as usize] = -1e30);
        Ok(rows)
    }
}

/// (seed, prompt, gen_length, block_length, steps, cfg_scale)
type Case = (u64, &'static [u32], usize, usize, usize, f64);

/// Classifier-free guidance (`cfg_scale > 0`): dllm-decode against `generate.py`'s guidance.
#[test]
fn classifier_free_guidance_matches_the_official_algorithm() -> Result<()> {
    let cfg = tiny_llada();
    let cases: &[Case] = &[
        (501, &[3, 14, 15, 92, 65], 16, 16, 16, 1.0),
        (502, &[7, 7, 7], 16, 8, 8, 0.5),
        (503, &[1, 2, 3, 4, 5, 6], 24, 8, 12, 3.0),
    ];
    for &(seed, prompt, gen, block, steps, scale) in cases {
        let dir = tiny_dir("oracle-cfg", &cfg, seed)?;
        let reference = Reference::load(dir.path())?;
        let p = GenerateParams {
            steps,
            gen_length: gen,
            block_length: block,
            cfg_scale: scale,
            mask_id: cfg.special.mask,
        };
        let want = llada_generate_with(reference_logits(&reference, cfg.special.mask), prompt, &p)?;
        let mut m = load_path(dir.path(), &LoadOptions::default())?;
        let params = DecodeParams {
            gen_length: gen,
            block_length: block,
            steps,
            cfg_scale: scale as f32,
            early_stop: false,
            ..Default::default()
        };
        let got = generate(&mut m.model, prompt, &params, &mut ())?;
        assert_eq!(
            got.canvas, want.canvas,
            "seed {seed} cfg {scale}: tokens differ"
        );
        assert_eq!(got.forwards, want.forwards, "seed {seed}: forward count");
        // Guidance changes the answer on these models (the test would not notice it missing).
        let plain = llada_generate_with(
            reference_logits(&reference, cfg.special.mask),
            prompt,
            &GenerateParams {
                cfg_scale: 0.0,
                ..p
            },
        )?;
        assert_ne!(
            plain.canvas, want.canvas,
            "seed {seed}: guidance made no difference"
        );
    }
    Ok(())
}

/// Random remasking: `torch.rand`'s draw is replaced by dllm-decode's choice at each step (high
/// for the positions it committed, low elsewhere); the oracle then decides the count, the block,
/// the eligible positions and the tokens, and must end at dllm-decode's canvas.
#[test]
fn random_remasking_matches_the_official_algorithm() -> Result<()> {
    let cfg = tiny_llada();
    let cases: &[Case] = &[
        (601, &[3, 14, 15, 92, 65], 16, 16, 16, 0.0),
        (602, &[7, 7, 7], 24, 8, 12, 0.0),
        (603, &[1, 2, 3], 16, 8, 8, 1.0),
    ];
    for &(seed, prompt, gen, block, steps, scale) in cases {
        let dir = tiny_dir("oracle-random", &cfg, seed)?;
        let reference = Reference::load(dir.path())?;
        let mut m = load_path(dir.path(), &LoadOptions::default())?;
        let params = DecodeParams {
            gen_length: gen,
            block_length: block,
            steps,
            cfg_scale: scale as f32,
            remasking: Remasking::Random,
            seed,
            early_stop: false,
            ..Default::default()
        };
        let mut chosen: Vec<Vec<usize>> = Vec::new();
        let mut record = |e: &StepEvent<'_>| {
            chosen.push(e.unmasked.to_vec());
            Control::Continue
        };
        let got = generate(&mut m.model, prompt, &params, &mut record)?;
        let p = GenerateParams {
            steps,
            gen_length: gen,
            block_length: block,
            cfg_scale: scale,
            mask_id: cfg.special.mask,
        };
        let mut draw = |step: usize, len: usize| -> Vec<f64> {
            let picked = chosen.get(step).cloned().unwrap_or_default();
            (0..len)
                .map(|pos| if picked.contains(&pos) { 0.9 } else { 0.1 })
                .collect()
        };
        let want = llada_generate_random(
            reference_logits(&reference, cfg.special.mask),
            prompt,
            &p,
            &mut draw,
        )?;
        assert_eq!(got.canvas, want.canvas, "seed {seed}: tokens differ");
        assert_eq!(got.forwards, want.forwards, "seed {seed}: forward count");
        // The draw really was random: not the low-confidence order.
        let greedy =
            llada_generate_with(reference_logits(&reference, cfg.special.mask), prompt, &p)?;
        assert_ne!(
            greedy.canvas, want.canvas,
            "seed {seed}: random remasking = low confidence"
        );
    }
    Ok(())
}
