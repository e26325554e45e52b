//! mbsd across its option space: combinations of its switches and of the decision rules drawn at
//! random (a fixed seed), on the shipped long-answer LLaDA and Dream models and on long-math
//! questions. The hand-written tests pin one mechanism each; this one asks what none of them
//! does, that every combination either is refused with an error naming a parameter before any
//! forward, or decodes every position and keeps the decoder's bookkeeping consistent:
//! - no panic, and no error but a parameter error (a policy, state or sequence error is a bug);
//! - the prompt untouched, no mask left in the answer, one step per forward, a trace entry per
//!   forward, no forward computing fewer rows than its window, no window reaching more than
//!   `span` positions past the frontier;
//! - guesses confirmed <= guesses shown <= forwards; remasks <= verification rows; flip-flops <=
//!   remasks; no position remasked more often than `max_remasks`; without staged decisions with
//!   verification, no verification row and no remask; without lookahead, no draft;
//! - the same tokens and forwards again on a second run, and with selective logits switched
//!   the other way (the decisions do not depend on which rows' logits are computed).

use std::collections::HashMap;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Arc;

use dllm_decode::latency::{Interpolation, LatencyPoint, LatencyTable, ModelDesc};
use dllm_decode::rng::Rng;
use dllm_decode::{
    Control, Decide, DecodeError, DecodeParams, Decoder, Joint, JointRule, MbsdParams, NearWait,
    Outcome, Remasking, Staged, StepEvent, Strategy, Verify,
};
use dllm_models::{Backend, DiffusionLm, LoadedModel};
use dllm_tasks::eval::questions;
use dllm_tasks::TaskKind;
use llada_tests::fixtures::{hexagon, shipped};

fn coin(r: &mut Rng) -> bool {
    r.below(2) == 1
}

fn maybe<T>(r: &mut Rng, f: impl FnOnce(&mut Rng) -> T) -> Option<T> {
    coin(r).then(|| f(r))
}

/// A confidence in [lo, 1], sometimes exactly 1 or exactly `lo`.
fn conf(r: &mut Rng, lo: f64) -> f32 {
    match r.below(8) {
        0 => 1.0,
        1 => lo as f32,
        _ => (lo + (1.0 - lo) * r.f64()) as f32,
    }
}

/// A step-shaped latency table in buckets of `bucket` rows (what the bucket fit and the
/// lookahead read).
fn table(bucket: usize) -> LatencyTable {
    LatencyTable {
        version: 1,
        device: "sweep".into(),
        model: ModelDesc::default(),
        provenance: "measured".into(),
        interpolation: Interpolation::Step,
        threads: None,
        runs: 1,
        points: (1..=4)
            .map(|k| LatencyPoint {
                window: k * bucket,
                rows: k * bucket,
                cached: 0,
                ms: 100.0 * k as f64,
                min_ms: None,
                max_ms: None,
            })
            .collect(),
    }
}

/// One drawn combination: the parameters and the latency table's bucket (`None`: no table).
fn draw(r: &mut Rng) -> (DecodeParams, Option<usize>) {
    let (gen_length, block_length) =
        [(32, 8), (32, 16), (64, 32), (48, 16), (32, 32), (64, 64)][r.index(6)];
    let m = MbsdParams {
        sliding: maybe(r, coin),
        lookahead: r.below(4) == 0,
        fit_bucket: maybe(r, coin),
        fit_guess: match r.below(4) {
            0 => Some(true),
            1 => Some(false),
            _ => None,
        },
        span: maybe(r, |r| r.index(20)),
        trim_left: coin(r),
        trigger: r.index(9),
        allowance: [0.0, 0.25, 1.0][r.index(3)],
        budget_mib: [0.0, 64.0][r.index(2)],
        draft_context: maybe(r, |r| conf(r, 0.5)),
        refresh: maybe(r, coin),
        show_guess: maybe(r, coin),
        guess_agreement: coin(r),
    };
    let decide = match r.below(5) {
        0 => Decide::Threshold(conf(r, 0.3)),
        1 => Decide::Schedule,
        _ => {
            let stable = conf(r, 0.5);
            Decide::Staged(Staged {
                // Sometimes above theta_stable: an impossible pair, which must be refused.
                visible: if r.below(8) == 0 {
                    (stable + 0.05).min(1.0)
                } else {
                    stable - (stable - 0.4) * r.f64() as f32
                },
                stable,
                no_adjacent: coin(r),
                wait_left: [0, 2, 8][r.index(3)],
                near_wait: maybe(r, |r| NearWait {
                    within: r.index(4),
                    below: conf(r, 0.5),
                }),
                verify: maybe(r, |r| Verify {
                    tau_back: conf(r, 0.0),
                    max_remasks: r.index(4),
                    suspect_dependents: r.below(4) == 0,
                    hold_on_remask: coin(r),
                    allowance: [0.0, 0.5, 2.0][r.index(3)],
                    joint: match r.below(3) {
                        0 => Joint::Auto,
                        1 => Joint::Off,
                        _ => Joint::On(JointRule {
                            within: r.index(9),
                            unless_above: conf(r, 0.9),
                        }),
                    },
                    partners_within: r.index(9),
                }),
            })
        }
    };
    let p = DecodeParams {
        gen_length,
        block_length,
        steps: gen_length,
        strategy: Strategy::Mbsd(m),
        decide,
        remasking: [Remasking::LowConfidence, Remasking::Margin][r.index(2)],
        early_stop: coin(r),
        sls: coin(r),
        confidence_eos_eot_inf: r.below(4) == 0,
        ..Default::default()
    };
    (p, maybe(r, |r| [8, 16, 32][r.index(3)]))
}

/// Decode under `catch_unwind`; also, after each step the observer saw, the first undecided
/// position of the canvas (the commit frontier the next forward starts from).
fn decode(
    m: &mut LoadedModel,
    p: DecodeParams,
    bucket: Option<usize>,
    prompt: &[u32],
) -> (
    std::thread::Result<Result<Outcome, DecodeError>>,
    Vec<usize>,
) {
    let mut d = Decoder::new(p);
    if let Some(b) = bucket {
        d = d.latency_table(Arc::new(table(b)));
    }
    let mask = m.model.info().special.mask;
    let mut frontiers = Vec::new();
    let mut count = |e: &StepEvent<'_>| {
        let f = (prompt.len()..e.canvas.len()).find(|&q| e.canvas[q] == mask);
        frontiers.push(f.unwrap_or(e.canvas.len()));
        Control::Continue
    };
    let r = catch_unwind(AssertUnwindSafe(|| d.run(&mut m.model, prompt, &mut count)));
    (r, frontiers)
}

/// What two runs must share: the tokens, every forward's window, verification rows and lookahead
/// positions, and the remask count.
type Shape = (Vec<u32>, Vec<(usize, usize, usize, usize)>, usize);

fn shape(g: &Outcome) -> Shape {
    let fw = g
        .trace
        .iter()
        .map(|t| (t.start, t.end, t.shadows, t.lookahead))
        .collect();
    (g.canvas.clone(), fw, g.remasked.len())
}

fn check(g: &Outcome, p: &DecodeParams, prompt: &[u32], mask: u32, what: &str) {
    assert_eq!(
        &g.canvas[..prompt.len()],
        prompt,
        "{what}: the prompt changed"
    );
    assert_eq!(g.canvas.len(), prompt.len() + p.gen_length, "{what}");
    assert!(
        !g.generated().contains(&mask),
        "{what}: a mask is left in the answer: {:?}",
        g.generated()
    );
    assert_eq!(g.steps, g.forwards, "{what}: one step per forward");
    assert_eq!(
        g.trace.len(),
        g.forwards,
        "{what}: a trace entry per forward"
    );
    for t in &g.trace {
        assert!(
            t.computed >= t.end - t.start,
            "{what}: {t:?} computes fewer rows than its window"
        );
    }
    assert!(
        g.guesses_confirmed <= g.guesses_shown && g.guesses_shown <= g.forwards,
        "{what}"
    );
    assert!(
        g.remasked.len() <= g.verified,
        "{what}: a remask without a look"
    );
    assert!(g.flip_flops <= g.remasked.len(), "{what}");
    let verify = p.decide.staged().and_then(|s| s.verify);
    match verify {
        Some(v) => {
            let mut per: HashMap<usize, usize> = HashMap::new();
            for &(q, _) in &g.remasked {
                *per.entry(q).or_default() += 1;
            }
            assert!(
                per.values().all(|&n| n <= v.max_remasks),
                "{what}: a position remasked more than {} times: {per:?}",
                v.max_remasks
            );
        }
        None => assert!(
            g.verified == 0 && g.remasked.is_empty(),
            "{what}: verification without staged decisions that verify"
        ),
    }
    let Strategy::Mbsd(m) = p.strategy else {
        unreachable!()
    };
    if !m.lookahead {
        assert!(
            g.draft_predictions == 0 && g.drafts == 0 && g.lookahead_positions == 0,
            "{what}: drafts without lookahead"
        );
    }
}

fn sweep(name: &str, backend: Backend, combos: usize, seed: u64) -> (usize, usize) {
    let mut m = shipped(name, backend);
    let mask = m.model.info().special.mask;
    let tok = m
        .tokenizer
        .clone()
        .expect("shipped models carry a tokenizer");
    let qs = questions(&[TaskKind::LongMath], Some(combos));
    let mut r = Rng::new(seed);
    let (mut decoded, mut refused) = (0, 0);
    for i in 0..combos {
        let q = &qs[i % qs.len()];
        let prompt = tok.encode_prompt(&q.prompt, false).unwrap();
        let (p, bucket) = draw(&mut r);
        let what = format!("{name} combination {i}: {p:?}, bucket {bucket:?}");
        let (first, frontiers) = decode(&mut m, p, bucket, &prompt);
        let steps = frontiers.len();
        let g = match first.unwrap_or_else(|_| panic!("{what}: panicked")) {
            Err(DecodeError::InvalidParam {
                name: param,
                reason,
            }) => {
                assert!(!param.is_empty() && !reason.is_empty(), "{what}");
                assert_eq!(steps, 0, "{what}: refused after {steps} steps ({param})");
                refused += 1;
                continue;
            }
            Err(e) => panic!("{what}: an error that is not a parameter's: {e}"),
            Ok(g) => g,
        };
        decoded += 1;
        check(&g, &p, &prompt, mask, &what);
        assert_eq!(
            steps, g.steps,
            "{what}: the observer saw another step count"
        );
        if let Some(span) = p.strategy.mbsd().and_then(|m| m.span) {
            for (t, f) in g.trace.iter().skip(1).zip(&frontiers) {
                assert!(
                    t.end <= f + span,
                    "{what}: window {t:?} past frontier {f} + {span}"
                );
            }
        }
        let again = decode(&mut m, p, bucket, &prompt).0.unwrap().unwrap();
        assert_eq!(shape(&again), shape(&g), "{what}: a second run differs");
        let other = DecodeParams { sls: !p.sls, ..p };
        let flipped = decode(&mut m, other, bucket, &prompt).0.unwrap().unwrap();
        assert_eq!(
            shape(&flipped),
            shape(&g),
            "{what}: selective logits changed a decision"
        );
    }
    (decoded, refused)
}

#[test]
fn every_mbsd_combination_decodes_consistently_or_is_refused() {
    for (name, combos, seed) in [("tiny-llada-long", 40, 11), ("tiny-dream-long", 40, 12)] {
        let (decoded, refused) = sweep(name, Backend::Cpu, combos, seed);
        eprintln!("{name}: {decoded} combinations decoded, {refused} refused");
        // The draw must reach both outcomes, or the sweep tests one side only.
        assert!(
            decoded >= combos / 2 && refused > 0,
            "{name}: {decoded} decoded, {refused} refused"
        );
    }
}

#[test]
fn every_mbsd_combination_decodes_consistently_on_the_hexagon_device() {
    // The emulated DSP: shadow rows, refreshes and windows through its kernels and its bounded
    // address window. Its tokens may differ from the CPU's (fp16 paths); the bookkeeping may not.
    for (name, combos, seed) in [("tiny-llada-long", 12, 13), ("tiny-dream-long", 12, 14)] {
        let (decoded, refused) = sweep(name, hexagon(256 << 20), combos, seed);
        eprintln!("{name} on the hexagon device: {decoded} decoded, {refused} refused");
        assert!(
            decoded >= combos / 2,
            "{name}: {decoded} decoded, {refused} refused"
        );
    }
}
