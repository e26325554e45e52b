//! The LLaDA `generate` oracle ([`llada_tests::generate`]) itself: its schedule, its order of
//! unmasking on scripted logits (including the Python corner cases it reproduces), its parameter
//! errors, and one end-to-end run on a tiny LLaDA where the candle model driving the same algorithm
//! must produce exactly the reference's canvas.

use std::cell::RefCell;

use anyhow::Result;
use dllm_models::synthetic::tiny_llada;
use llada_tests::fixtures::{full_logits, load_default, tiny_dir};
use llada_tests::generate::{
    llada_generate, llada_generate_with, num_transfer_tokens, GenerateParams,
};
use llada_tests::reference::Reference;

const MASK: u32 = 3;

#[test]
fn transfer_schedule() {
    let table: [(usize, usize, &[usize]); 5] = [
        (10, 4, &[3, 3, 2, 2]),
        (8, 4, &[2, 2, 2, 2]),
        (3, 5, &[1, 1, 1, 0, 0]),
        (0, 2, &[0, 0]),
        (7, 1, &[7]),
    ];
    for (masked, steps, want) in table {
        assert_eq!(
            num_transfer_tokens(masked, steps),
            want,
            "M={masked} S={steps}"
        );
    }
}

type Logits<'a> = Box<dyn FnMut(&[u32]) -> Result<Vec<Vec<f64>>> + 'a>;

/// Logits over a 4-token vocabulary (`3` = mask): position `p` predicts token `tok(p)` with logit
/// `conf[p]`, every other token 0 — so confidence grows with `conf[p]`. Canvases seen are
/// recorded in `seen`.
fn scripted(conf: Vec<f64>, tok: fn(usize) -> usize, seen: &RefCell<Vec<Vec<u32>>>) -> Logits<'_> {
    Box::new(move |x: &[u32]| {
        seen.borrow_mut().push(x.to_vec());
        Ok((0..x.len())
            .map(|p| {
                let mut row = vec![0.0; 4];
                row[tok(p)] = conf[p];
                row
            })
            .collect())
    })
}

fn mod3(p: usize) -> usize {
    p % 3
}

/// Every position predicts token 0, so equal `conf` values give bit-equal confidences.
fn zero(_: usize) -> usize {
    0
}

fn params(steps: usize, gen_length: usize, block_length: usize) -> GenerateParams {
    GenerateParams {
        steps,
        gen_length,
        block_length,
        cfg_scale: 0.0,
        mask_id: MASK,
    }
}

#[test]
fn unmasking_order_follows_confidence_within_the_block() {
    // Confidence rising with position: inside each block the last positions go first.
    let seen = RefCell::new(Vec::new());
    let conf: Vec<f64> = (0..10).map(|p| 1.0 + p as f64).collect();
    let g = llada_generate_with(scripted(conf, mod3, &seen), &[0, 1], &params(4, 8, 4)).unwrap();
    assert_eq!(g.forwards, 4);
    assert_eq!(g.canvas, vec![0, 1, 2, 0, 1, 2, 0, 1, 2, 0]);
    let m = MASK;
    let seen = seen.into_inner();
    assert_eq!(
        seen,
        vec![
            vec![0, 1, m, m, m, m, m, m, m, m],
            vec![0, 1, m, m, 1, 2, m, m, m, m], // block 0 step 1: positions 5 and 4
            vec![0, 1, 2, 0, 1, 2, m, m, m, m], // then 3 and 2; block 1 untouched so far
            vec![0, 1, 2, 0, 1, 2, m, m, 2, 0], // block 1 step 1: 9 and 8
        ]
    );
}

#[test]
fn equal_confidences_go_lowest_position_first() {
    let seen = RefCell::new(Vec::new());
    let g =
        llada_generate_with(scripted(vec![2.0; 7], zero, &seen), &[1], &params(3, 6, 6)).unwrap();
    let m = MASK;
    assert_eq!(g.forwards, 3);
    assert_eq!(
        seen.into_inner()[1..],
        [vec![1, 0, 0, m, m, m, m], vec![1, 0, 0, 0, 0, m, m]]
    );
    assert_eq!(g.canvas, vec![1, 0, 0, 0, 0, 0, 0]);
}

#[test]
fn a_mask_inside_the_prompt_competes_as_in_the_python() {
    // generate.py computes `mask_index = (x == mask_id)` over the whole canvas, so a [MASK] in the
    // prompt takes one of the block's slots (ties: lowest position first) and a generated position
    // is left masked at the end.
    let seen = RefCell::new(Vec::new());
    let g = llada_generate_with(
        scripted(vec![2.0; 6], zero, &seen),
        &[MASK, 1],
        &params(2, 4, 4),
    )
    .unwrap();
    assert_eq!(g.canvas, vec![0, 1, 0, 0, 0, MASK]);
}

#[test]
fn invalid_parameters_are_errors() {
    let seen = RefCell::new(Vec::new());
    let cases: [(GenerateParams, &str); 5] = [
        (params(4, 10, 4), "multiple of block_length"),
        (params(3, 8, 4), "multiple of the 2 blocks"),
        (params(4, 0, 4), "positive"),
        (params(0, 8, 4), "multiple of the 2 blocks"),
        (
            GenerateParams {
                cfg_scale: -1.5,
                ..params(4, 8, 4)
            },
            "cfg_scale",
        ),
    ];
    for (p, key) in cases {
        let err = llada_generate_with(scripted(vec![1.0; 20], mod3, &seen), &[0], &p)
            .unwrap_err()
            .to_string();
        assert!(err.contains(key), "{p:?}: {err}");
    }
    assert!(
        seen.borrow().is_empty(),
        "no forward before the parameters are checked"
    );
}

#[test]
fn candle_model_reproduces_the_reference_generation() {
    let cfg = tiny_llada();
    let dir = tiny_dir("gen", &cfg, 17).unwrap();
    let reference = Reference::load(dir.path()).unwrap();
    let mut model = load_default(dir.path()).unwrap().model;
    let prompt: Vec<u32> = vec![253, 17, 92, 140, 7, 66];
    let p = GenerateParams {
        steps: 8,
        gen_length: 16,
        block_length: 8,
        cfg_scale: 0.0,
        mask_id: cfg.special.mask,
    };
    let want = llada_generate(&reference, &prompt, &p).unwrap();
    assert_eq!(want.forwards, 8);
    assert_eq!(want.canvas.len(), prompt.len() + 16);
    assert_eq!(&want.canvas[..prompt.len()], &prompt[..]);
    assert!(!want.canvas.contains(&cfg.special.mask));
    let got = llada_generate_with(|x| full_logits(&mut model, x), &prompt, &p).unwrap();
    assert_eq!(got, want);
}
