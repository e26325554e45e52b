//! dllm-decode's prefix-cache and dual-cache strategies against the independent oracle of
//! Fast-dLLM's cached loops ([`llada_tests::fast_dllm`], written from `llada/generate.py` over the
//! f64 reference with an explicit KV cache), token for token and forward for forward, with the
//! step schedule and with a confidence threshold.
//!
//! The project's deliberate deviation (issue 17: the mask id is never a prediction) is applied to
//! the oracle's logits through its `post` hook.

use anyhow::Result;
use dllm_decode::{generate, Decide, DecodeParams, Strategy};
use dllm_models::synthetic::tiny_llada;
use dllm_models::LoadOptions;
use llada_tests::fast_dllm::{fast_dllm_generate, Cache, FastParams};
use llada_tests::fixtures::{load_path, tiny_dir};
use llada_tests::reference::Reference;

/// (seed, prompt, gen_length, block_length, steps, threshold)
type Case = (u64, &'static [u32], usize, usize, usize, Option<f64>);

#[test]
fn cached_strategies_match_fast_dllm() -> Result<()> {
    let cfg = tiny_llada();
    let mask = cfg.special.mask;
    let cases: &[Case] = &[
        (701, &[3, 14, 15, 92, 65], 16, 8, 16, None),
        (702, &[7, 7, 7], 24, 8, 12, None),
        (703, &[1, 2, 3, 4, 5, 6, 7, 8], 16, 4, 16, Some(0.05)),
        (704, &[200, 31], 16, 8, 16, Some(0.02)),
        (705, &[11, 12], 32, 16, 32, Some(0.9)),
    ];
    let post = |row: &mut Vec<f64>| row[mask as usize] = f64::NEG_INFINITY;
    for &(seed, prompt, gen, block, steps, threshold) in cases {
        let dir = tiny_dir("oracle-fast", &cfg, seed)?;
        let reference = Reference::load(dir.path())?;
        for (cache, strategy) in [
            (Cache::Prefix, Strategy::PrefixCache),
            (Cache::Dual, Strategy::DualCache),
        ] {
            let p = FastParams {
                steps,
                gen_length: gen,
                block_length: block,
                threshold,
                mask_id: mask,
            };
            let want = fast_dllm_generate(&reference, prompt, &p, cache, &post)?;
            let mut m = load_path(dir.path(), &LoadOptions::default())?;
            let params = DecodeParams {
                gen_length: gen,
                block_length: block,
                steps,
                strategy,
                decide: threshold.map_or(Decide::Schedule, |t| Decide::Threshold(t as f32)),
                early_stop: false,
                ..Default::default()
            };
            let got = generate(&mut m.model, prompt, &params, &mut ())?;
            let label = format!("seed {seed} {cache:?} threshold {threshold:?}");
            println!(
                "{label}: {} forwards, {:?}",
                want.forwards,
                &want.canvas[prompt.len()..]
            );
            assert_eq!(
                got.canvas, want.canvas,
                "{label}: tokens differ from Fast-dLLM"
            );
            assert_eq!(got.forwards, want.forwards, "{label}: forward count");
        }
    }
    Ok(())
}
