//! Decoding behaviour on tiny random models: schedules, block confinement, caches, thresholds,
//! determinism, early stop, observers and parameter errors.

use candle_core::{DType, Device};
use dllm_decode::{
    generate, Control, Decide, DecodeParams, Remasking, StepEvent, StopReason, Strategy,
};
use dllm_models::synthetic::{random_weights, tiny_dream, tiny_llada};
use dllm_models::weights::HfWeights;
use dllm_models::{DiffusionTransformer, OpMode, TransformerConfig};

fn model(cfg: TransformerConfig) -> DiffusionTransformer {
    let w = random_weights(&cfg, 11).unwrap();
    let src = HfWeights::from_tensors(w, cfg.arch, DType::F32, &Device::Cpu);
    DiffusionTransformer::new(cfg, &src, OpMode::Fused).unwrap()
}

const PROMPT: &[u32] = &[10, 20, 30, 40, 50];
const MASK: u32 = 255;

fn params(strategy: Strategy) -> DecodeParams {
    DecodeParams {
        gen_length: 16,
        block_length: 8,
        steps: 8,
        strategy,
        early_stop: false,
        ..Default::default()
    }
}

#[test]
fn schedule_counts_and_block_confinement() {
    let mut m = model(tiny_llada());
    let p = DecodeParams {
        steps: 6,
        ..params(Strategy::Vanilla)
    }; // 3 steps per block of 8: 3,3,2
    let mut per_step = Vec::new();
    let mut obs = |e: &StepEvent<'_>| {
        let block = e.prompt_len + e.block * 8..e.prompt_len + (e.block + 1) * 8;
        assert!(
            e.unmasked.iter().all(|p| block.contains(p)),
            "step {} unmasked {:?} outside {block:?}",
            e.step,
            e.unmasked
        );
        // Later blocks stay fully masked while an earlier block is decoded.
        assert!(e.canvas[block.end..].iter().all(|&t| t == MASK));
        per_step.push(e.unmasked.len());
        Control::Continue
    };
    let g = generate(&mut m, PROMPT, &p, &mut obs).unwrap();
    assert_eq!(per_step, vec![3, 3, 2, 3, 3, 2]);
    assert_eq!((g.forwards, g.steps, g.tokens_decoded), (6, 6, 16));
    assert_eq!(&g.canvas[..5], PROMPT);
    assert!(g.generated().iter().all(|&t| t != MASK));
    assert_eq!(g.stop, StopReason::Completed);
}

#[test]
fn deterministic_at_temperature_zero_and_seeded_otherwise() {
    for strategy in [
        Strategy::Vanilla,
        Strategy::PrefixCache,
        Strategy::DualCache,
    ] {
        let a = generate(&mut model(tiny_llada()), PROMPT, &params(strategy), &mut ()).unwrap();
        let b = generate(&mut model(tiny_llada()), PROMPT, &params(strategy), &mut ()).unwrap();
        assert_eq!(a, b, "{strategy:?}");
    }
    let hot = |seed| DecodeParams {
        temperature: 1.0,
        seed,
        ..params(Strategy::Vanilla)
    };
    let a = generate(&mut model(tiny_llada()), PROMPT, &hot(1), &mut ()).unwrap();
    let b = generate(&mut model(tiny_llada()), PROMPT, &hot(1), &mut ()).unwrap();
    let c = generate(&mut model(tiny_llada()), PROMPT, &hot(2), &mut ()).unwrap();
    assert_eq!(a, b);
    assert_ne!(
        a.canvas, c.canvas,
        "different seeds should sample differently on a random model"
    );
}

#[test]
fn one_token_per_step_caches_match_vanilla_on_the_first_step_of_each_block() {
    // With one block, the first step of every strategy is the same full forward.
    let p = |s| DecodeParams {
        gen_length: 8,
        block_length: 8,
        steps: 8,
        strategy: s,
        early_stop: false,
        ..Default::default()
    };
    let mut firsts = Vec::new();
    for s in [
        Strategy::Vanilla,
        Strategy::PrefixCache,
        Strategy::DualCache,
    ] {
        let mut first = None;
        let mut obs = |e: &StepEvent<'_>| {
            if e.step == 0 {
                first = Some(e.unmasked.to_vec());
            }
            Control::Continue
        };
        let g = generate(&mut model(tiny_llada()), PROMPT, &p(s), &mut obs).unwrap();
        assert_eq!(g.forwards, 8);
        firsts.push(first.unwrap());
    }
    assert!(firsts.windows(2).all(|w| w[0] == w[1]));
}

#[test]
fn cached_windows_are_what_fast_dllm_forwards() {
    for (s, want) in [(Strategy::PrefixCache, 5..21), (Strategy::DualCache, 5..13)] {
        let mut windows = Vec::new();
        let mut obs = |e: &StepEvent<'_>| {
            windows.push(e.window.clone());
            Control::Continue
        };
        generate(&mut model(tiny_llada()), PROMPT, &params(s), &mut obs).unwrap();
        assert_eq!(windows[0], 0..21, "{s:?}: block start is a full forward");
        assert_eq!(windows[1], want, "{s:?}");
        assert_eq!(
            windows[4],
            0..21,
            "{s:?}: second block starts with a full forward"
        );
    }
}

#[test]
fn threshold_decoding_takes_at_least_one_per_step() {
    let p = DecodeParams {
        decide: Decide::Threshold(0.9),
        ..params(Strategy::DualCache)
    };
    let mut counts = Vec::new();
    let mut obs = |e: &StepEvent<'_>| {
        counts.push(e.unmasked.len());
        Control::Continue
    };
    let g = generate(&mut model(tiny_llada()), PROMPT, &p, &mut obs).unwrap();
    assert!(counts.iter().all(|&c| c >= 1));
    assert_eq!(counts.iter().sum::<usize>(), 16);
    assert!(g.generated().iter().all(|&t| t != MASK));
    // A threshold of (almost) zero unmasks a whole block per step.
    let p = DecodeParams {
        decide: Decide::Threshold(1e-9),
        ..params(Strategy::Vanilla)
    };
    let g = generate(&mut model(tiny_llada()), PROMPT, &p, &mut ()).unwrap();
    assert_eq!(g.forwards, 2);
}

#[test]
fn dream_algorithms_fill_the_canvas() {
    for alg in ["origin", "maskgit_plus", "topk_margin", "entropy"] {
        let mut p = params(Strategy::Vanilla);
        p.dream.alg = alg.parse().unwrap();
        let g = generate(&mut model(tiny_dream()), PROMPT, &p, &mut ()).unwrap();
        assert!(g.generated().iter().all(|&t| t != MASK), "{alg}");
        assert!(g.forwards <= 8, "{alg}");
        assert_eq!(&g.canvas[..5], PROMPT);
    }
    let mut p = params(Strategy::Vanilla);
    p.dream.alg_temp = Some(0.5);
    p.temperature = 0.7;
    p.dream.top_p = Some(0.9);
    p.dream.top_k = Some(20);
    let a = generate(&mut model(tiny_dream()), PROMPT, &p, &mut ()).unwrap();
    let b = generate(&mut model(tiny_dream()), PROMPT, &p, &mut ()).unwrap();
    assert_eq!(a, b);
    // Block strategies also run on Dream (shifted logits handled by the model).
    let g = generate(
        &mut model(tiny_dream()),
        PROMPT,
        &params(Strategy::DualCache),
        &mut (),
    )
    .unwrap();
    assert!(g.generated().iter().all(|&t| t != MASK));
}

#[test]
fn cfg_and_eos_options_run() {
    let p = DecodeParams {
        cfg_scale: 1.5,
        logits_eos_inf: true,
        confidence_eos_eot_inf: true,
        ..params(Strategy::Vanilla)
    };
    let g = generate(&mut model(tiny_llada()), PROMPT, &p, &mut ()).unwrap();
    assert!(!g.generated().contains(&254), "logits_eos_inf forbids EOS");
    let p = DecodeParams {
        remasking: Remasking::Random,
        seed: 3,
        ..params(Strategy::Vanilla)
    };
    assert!(generate(&mut model(tiny_llada()), PROMPT, &p, &mut ()).is_ok());
}

#[test]
fn observer_can_stop() {
    let mut obs = |e: &StepEvent<'_>| {
        if e.step == 2 {
            Control::Stop
        } else {
            Control::Continue
        }
    };
    let g = generate(
        &mut model(tiny_llada()),
        PROMPT,
        &params(Strategy::Vanilla),
        &mut obs,
    )
    .unwrap();
    assert_eq!((g.stop, g.steps), (StopReason::Observer, 3));
    assert!(g.generated().contains(&MASK));
}

#[test]
fn early_stop_fills_with_eos() {
    // Find a prompt whose first block ends in EOS under logits that favour EOS: force it by making
    // EOS the model's EOS and checking the rule on the generation it produces.
    let mut m = model(tiny_llada());
    let g = generate(
        &mut m,
        PROMPT,
        &DecodeParams {
            early_stop: true,
            ..params(Strategy::Vanilla)
        },
        &mut (),
    )
    .unwrap();
    let first_block_end = g.canvas[5 + 7];
    if first_block_end == 254 {
        assert_eq!(g.stop, StopReason::EndOfSequence);
        assert!(g.canvas[13..].iter().all(|&t| t == 254));
    } else {
        assert_eq!(g.stop, StopReason::Completed);
    }
    // Make EOS the only sensible token by declaring the last-decoded token of block 1 as EOS.
    let mut cfg = tiny_llada();
    cfg.special.eos = first_block_end;
    let mut m2 = model(cfg);
    let g2 = generate(
        &mut m2,
        PROMPT,
        &DecodeParams {
            early_stop: true,
            ..params(Strategy::Vanilla)
        },
        &mut (),
    )
    .unwrap();
    assert_eq!(g2.stop, StopReason::EndOfSequence);
    assert_eq!(g2.forwards, 4, "only the first block (4 steps) is decoded");
    assert!(g2.canvas[13..].iter().all(|&t| t == first_block_end));
}

#[test]
fn bad_parameters_are_errors_naming_them() {
    let mut m = model(tiny_llada());
    let cases: Vec<(DecodeParams, &str)> = vec![
        (
            DecodeParams {
                gen_length: 10,
                block_length: 4,
                ..params(Strategy::Vanilla)
            },
            "gen_length",
        ),
        (
            DecodeParams {
                steps: 3,
                ..params(Strategy::Vanilla)
            },
            "steps",
        ),
        (
            DecodeParams {
                steps: 0,
                ..params(Strategy::Vanilla)
            },
            "steps",
        ),
        (
            DecodeParams {
                block_length: 0,
                ..params(Strategy::Vanilla)
            },
            "block_length",
        ),
        (
            DecodeParams {
                decide: Decide::Threshold(1.5),
                ..params(Strategy::Vanilla)
            },
            "threshold",
        ),
        (
            DecodeParams {
                temperature: -1.0,
                ..params(Strategy::Vanilla)
            },
            "temperature",
        ),
        (
            DecodeParams {
                temperature: f32::NAN,
                ..params(Strategy::Vanilla)
            },
            "temperature",
        ),
        (
            DecodeParams {
                cfg_scale: 1.0,
                ..params(Strategy::PrefixCache)
            },
            "cfg_scale",
        ),
        (
            DecodeParams {
                gen_length: 1024,
                block_length: 32,
                steps: 32,
                ..params(Strategy::Vanilla)
            },
            "maximum sequence length",
        ),
    ];
    for (p, word) in cases {
        let e = generate(&mut m, PROMPT, &p, &mut ())
            .unwrap_err()
            .to_string();
        assert!(e.contains(word), "{e:?} should name {word}");
    }
    let e = generate(&mut m, &[1, MASK, 2], &params(Strategy::Vanilla), &mut ())
        .unwrap_err()
        .to_string();
    assert!(e.contains("mask token"), "{e}");
    let e = generate(&mut m, &[1, 999], &params(Strategy::Vanilla), &mut ())
        .unwrap_err()
        .to_string();
    assert!(e.contains("outside the vocabulary"), "{e}");
    // Options the chosen decoder would ignore are errors naming them.
    let mut dream = model(tiny_dream());
    let dream_only: Vec<(DecodeParams, &str)> = vec![
        (
            DecodeParams {
                decide: Decide::Threshold(0.9),
                ..params(Strategy::Vanilla)
            },
            "threshold",
        ),
        (
            DecodeParams {
                cfg_scale: 1.0,
                ..params(Strategy::Vanilla)
            },
            "cfg_scale",
        ),
        (
            DecodeParams {
                remasking: Remasking::Random,
                ..params(Strategy::Vanilla)
            },
            "remasking",
        ),
        (
            DecodeParams {
                logits_eos_inf: true,
                ..params(Strategy::Vanilla)
            },
            "logits_eos_inf",
        ),
    ];
    for (p, word) in dream_only {
        let e = generate(&mut dream, PROMPT, &p, &mut ())
            .unwrap_err()
            .to_string();
        assert!(e.contains(word), "{e:?} should name {word}");
    }
    let mut p = params(Strategy::PrefixCache);
    p.dream.top_k = Some(5);
    let e = generate(&mut dream, PROMPT, &p, &mut ())
        .unwrap_err()
        .to_string();
    assert!(e.contains("dream.top_k"), "{e}");
    let mut p = params(Strategy::Vanilla);
    p.dream.alg = "origin".parse().unwrap();
    let e = generate(&mut m, PROMPT, &p, &mut ())
        .unwrap_err()
        .to_string();
    assert!(e.contains("alg"), "{e}");
    assert!("bogus"
        .parse::<Strategy>()
        .unwrap_err()
        .to_string()
        .contains("strategy"));
}
