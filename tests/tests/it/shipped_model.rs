//! The models shipped in `models/` (trained by `train-tiny`; tiny-llada is embedded in
//! `generate`): on a fixed subset of the held-out suite they reach a stated accuracy floor per task
//! decoding one token per step, and (tiny-llada) threshold parallel decoding reaches the same
//! accuracy with at most a quarter of the forwards.
//!
//! The floors sit below the full held-out accuracy measured in each model card (200 questions per
//! task) by a margin that covers the subset's sampling noise; a retrained model that falls under
//! them is a regression.

use std::path::PathBuf;

use dllm_decode::{Decide, DecodeParams, MbsdParams, Staged, Strategy};
use dllm_models::{load, LoadOptions, ModelSource};
use dllm_tasks::eval::{evaluate, questions, TaskScore};
use dllm_tasks::TaskKind;

/// Questions per task in the subset (the first of each held-out set).
const SUBSET: usize = 50;

fn model_dir(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../models")
        .join(name)
}

fn run(name: &str, params: &DecodeParams) -> Vec<TaskScore> {
    let dir = model_dir(name);
    let mut m = load(
        &ModelSource::parse(dir.to_str().unwrap()).unwrap(),
        &LoadOptions::default(),
    )
    .unwrap_or_else(|e| panic!("{name} must be in the repository: {e}"));
    let tok = m
        .tokenizer
        .clone()
        .expect("shipped models carry their tokenizer");
    let qs = questions(&TaskKind::ALL, Some(SUBSET));
    evaluate(&mut m.model, tok.inner(), &qs, params, |_, _, _| {})
        .unwrap()
        .0
}

fn one_token_per_step(gen: usize) -> DecodeParams {
    DecodeParams {
        gen_length: gen,
        block_length: gen,
        steps: gen,
        strategy: Strategy::Vanilla,
        ..Default::default()
    }
}

fn check_floors(name: &str, scores: &[TaskScore], floors: &[(TaskKind, f64)]) {
    for (kind, floor) in floors {
        let s = scores.iter().find(|s| s.task == *kind).unwrap();
        eprintln!(
            "{name} {}: {:.1}% (floor {:.0}%)",
            kind.name(),
            100.0 * s.accuracy(),
            100.0 * floor
        );
        assert!(
            s.accuracy() >= *floor,
            "{name} {}: {:.1}% is under the floor {:.0}%",
            kind.name(),
            100.0 * s.accuracy(),
            100.0 * floor
        );
    }
}

#[test]
fn tiny_llada_meets_its_floors_and_threshold_decoding_saves_forwards() {
    let base = run("tiny-llada", &one_token_per_step(24));
    check_floors(
        "tiny-llada",
        &base,
        &[
            (TaskKind::Math, FLOOR_LLADA[0]),
            (TaskKind::YesNo, FLOOR_LLADA[1]),
            (TaskKind::Choice, FLOOR_LLADA[2]),
            (TaskKind::Completion, FLOOR_LLADA[3]),
        ],
    );
    let fast = run(
        "tiny-llada",
        &DecodeParams {
            decide: Decide::Threshold(0.9),
            ..one_token_per_step(24)
        },
    );
    let total = |s: &[TaskScore], f: fn(&TaskScore) -> usize| s.iter().map(f).sum::<usize>();
    let (base_fw, fast_fw) = (total(&base, |s| s.forwards), total(&fast, |s| s.forwards));
    let (base_ok, fast_ok) = (
        total(&base, |s| s.final_answer),
        total(&fast, |s| s.final_answer),
    );
    eprintln!(
        "threshold 0.9: {fast_fw} forwards vs {base_fw}; {fast_ok} vs {base_ok} right of {}",
        4 * SUBSET
    );
    assert!(
        4 * fast_fw <= base_fw,
        "threshold decoding used {fast_fw} forwards, more than a quarter of {base_fw}"
    );
    // Equal accuracy: at most one question of the subset lost.
    assert!(
        fast_ok + 1 >= base_ok,
        "threshold decoding answered {fast_ok} right, one token per step {base_ok}"
    );
}

#[test]
fn tiny_dream_meets_its_floors() {
    // Dream's own algorithm (maskgit_plus, the default) over the whole canvas, one token per step.
    let scores = run("tiny-dream", &one_token_per_step(24));
    let floors: Vec<(TaskKind, f64)> = TaskKind::ALL.iter().map(|&k| (k, FLOOR_DREAM)).collect();
    check_floors("tiny-dream", &scores, &floors);
}

/// Floor per task for tiny-dream on the same subset (its card measures 100% on all 200 per task).
const FLOOR_DREAM: f64 = 0.9;

/// Floors (math, yesno, choice, completion) for tiny-llada on the first 50 held-out questions per
/// task. The model card measures 100% on all 200 per task; 90% leaves room for a retrained model's
/// noise while staying above the targets (90% completion, 70% on the others).
const FLOOR_LLADA: [f64; 4] = [0.9, 0.9, 0.9, 0.9];

/// Long-math questions in the long models' subset (the first of the held-out set): threshold
/// decoding takes ~10 forwards per answer, so 40 answers stay a few seconds.
const LONG_SUBSET: usize = 40;

fn long_math(name: &str, params: &DecodeParams) -> TaskScore {
    let dir = model_dir(name);
    let mut m = load(
        &ModelSource::parse(dir.to_str().unwrap()).unwrap(),
        &LoadOptions::default(),
    )
    .unwrap_or_else(|e| panic!("{name} must be in the repository: {e}"));
    let tok = m
        .tokenizer
        .clone()
        .expect("shipped models carry their tokenizer");
    let qs = questions(&[TaskKind::LongMath], Some(LONG_SUBSET));
    let mut scores = evaluate(&mut m.model, tok.inner(), &qs, params, |_, _, _| {})
        .unwrap()
        .0;
    scores.remove(0)
}

fn long_params(strategy: Strategy, decide: Decide) -> DecodeParams {
    DecodeParams {
        gen_length: 128,
        block_length: 32,
        steps: 128,
        strategy,
        decide,
        ..Default::default()
    }
}

/// tiny-llada-long on its first 40 held-out long-math questions, with threshold-0.9 decoding and
/// with mbsd at its defaults (the CLI's default decoder): floors below its card's 100-question
/// numbers by the subset's noise.
#[test]
fn tiny_llada_long_meets_its_floors() {
    for (label, params, floor) in [
        (
            "threshold 0.9",
            long_params(Strategy::Vanilla, Decide::Threshold(0.9)),
            FLOOR_LLADA_LONG_THR09,
        ),
        (
            "mbsd",
            long_params(
                Strategy::Mbsd(MbsdParams::default()),
                Decide::Staged(Staged::default()),
            ),
            FLOOR_LLADA_LONG_MBSD,
        ),
    ] {
        let s = long_math("tiny-llada-long", &params);
        check_floors(
            &format!("tiny-llada-long ({label})"),
            std::slice::from_ref(&s),
            &[(TaskKind::LongMath, floor)],
        );
    }
}

/// Floors for tiny-llada-long's first 40 long-math questions; its card measures 98% with
/// threshold 0.9 and 99% with mbsd at its defaults on 100.
const FLOOR_LLADA_LONG_THR09: f64 = 0.9;
/// See [`FLOOR_LLADA_LONG_THR09`].
const FLOOR_LLADA_LONG_MBSD: f64 = 0.9;

/// tiny-dream-long (its card: 95% of 100 long-math questions with dual-cache + threshold 0.9,
/// 97.5% on the first 40, which the floor is held to).
#[test]
fn tiny_dream_long_meets_its_floor() {
    let s = long_math(
        "tiny-dream-long",
        &long_params(Strategy::DualCache, Decide::Threshold(0.9)),
    );
    check_floors(
        "tiny-dream-long (dual-cache, threshold 0.9)",
        std::slice::from_ref(&s),
        &[(TaskKind::LongMath, FLOOR_DREAM_LONG)],
    );
}

/// See [`tiny_dream_long_meets_its_floor`].
const FLOOR_DREAM_LONG: f64 = 0.9;

/// mbsd with sliding off keeps its window on the block, but verification can send a token of a
/// finished block back to the mask (its first look comes from the next block's forward); the
/// window must reach back for it. Tuning questions 51-60 include one where this happens
/// (before the fix: "window [131, 163) holds none of the current block's undecided positions
/// [129]").
#[test]
fn mbsd_without_sliding_decides_again_what_verification_sends_back_in_a_past_block() {
    let dir = model_dir("tiny-llada-long");
    let mut m = load(
        &ModelSource::parse(dir.to_str().unwrap()).unwrap(),
        &LoadOptions::default(),
    )
    .unwrap();
    let tok = m
        .tokenizer
        .clone()
        .expect("shipped models carry their tokenizer");
    let qs = dllm_tasks::eval::QuestionSet::Tuning.questions()[50..60].to_vec();
    let params = long_params(
        Strategy::Mbsd(MbsdParams {
            sliding: Some(false),
            show_guess: Some(false),
            ..Default::default()
        }),
        // The staged decisions under which the fault showed (the defaults of the time).
        Decide::Staged(Staged {
            visible: 0.8,
            stable: 0.9,
            wait_left: 0,
            near_wait: None,
            verify: Some(dllm_decode::Verify {
                tau_back: 0.9,
                joint: dllm_decode::Joint::Off,
                ..Default::default()
            }),
            ..Staged::default()
        }),
    );
    let (scores, answered) = evaluate(&mut m.model, tok.inner(), &qs, &params, |_, _, _| {})
        .unwrap_or_else(|e| panic!("mbsd without sliding: {e}"));
    assert_eq!(scores[0].n, 10);
    assert!(
        answered.iter().any(|a| a.remasks > 0),
        "no remask in these questions"
    );
}
