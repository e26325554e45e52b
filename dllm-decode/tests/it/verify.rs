//! Staged decisions with verification: tentative tokens are looked at by shadow rows of a later
//! forward, sent back to the mask (never replaced) below `tau_back`, made final at the stable
//! threshold; the guards bound remasks; drafts enter Visible; nothing unlooked is final when the
//! generation ends; determinism on the real model; skipped logits rows are never requested.

use std::ops::Range;
use std::path::PathBuf;

use candle_core::{DType, Device, Tensor};
use dllm_decode::params::JointRule;
use dllm_decode::states::TokenState;
use dllm_decode::{
    generate, Control, Decide, DecodeParams, Joint, MbsdParams, Outcome, Staged, StepEvent,
    Strategy, Verify,
};
use dllm_models::{
    load, Answer, Ask, DiffusionLm, LoadOptions, ModelId, ModelInfo, ModelSource, Refresh, Rows,
    SequenceToken,
};

use crate::scripted::{info, logits, row, MASK, PROMPT, VOCAB};

/// A scripted model: a masked position `p` is predicted as `p % 5` with confidence 0.95 when `p`
/// is even, 0.5 when `p % 4 == 3` (promoted one per step) and 0.8 otherwise. A shadow row of `p`
/// gives its token probability 0.1 when `p % 3 == 0` (a wrong token) and 0.95 otherwise. Nothing
/// depends on attention, so every decision of the decoder is known in advance.
struct Scripted {
    info: ModelInfo,
    cache_len: usize,
    id: SequenceToken,
    /// Every ask, in order.
    asks: Vec<Ask>,
}

impl Scripted {
    fn new() -> Self {
        let info = info();
        Self {
            info,
            cache_len: 0,
            id: SequenceToken::new_sequence(ModelId::fresh()),
            asks: vec![],
        }
    }

    fn predict(p: usize) -> Vec<f32> {
        let conf = match p {
            _ if p.is_multiple_of(2) => 0.95,
            _ if p % 4 == 3 => 0.5,
            _ => 0.8,
        };
        row(p % 5, conf)
    }
}

impl DiffusionLm for Scripted {
    fn info(&self) -> &ModelInfo {
        &self.info
    }
    fn device(&self) -> &Device {
        &Device::Cpu
    }
    fn forward(
        &mut self,
        _: &Tensor,
        w: Range<usize>,
        rows: Rows<'_>,
    ) -> dllm_models::Result<Tensor> {
        let pos: Vec<usize> = match rows {
            Rows::All => w.collect(),
            Rows::Positions(p) => p.to_vec(),
            Rows::None => vec![],
        };
        Ok(logits(
            &pos.iter().map(|&p| Self::predict(p)).collect::<Vec<_>>(),
        ))
    }
    fn commit(&mut self, r: Range<usize>) -> dllm_models::Result<()> {
        self.cache_len = self.cache_len.max(r.end);
        Ok(())
    }
    fn cache_len(&self) -> usize {
        self.cache_len
    }
    fn truncate_cache(&mut self, len: usize) -> dllm_models::Result<()> {
        self.cache_len = len;
        Ok(())
    }
    fn token(&self) -> SequenceToken {
        self.id
    }
    fn compute_refresh(
        &self,
        _: &Tensor,
        _: &[usize],
        _: Option<&[usize]>,
    ) -> dllm_models::Result<Refresh> {
        Err(dllm_models::Error::Internal {
            what: "the decoder asked for a CPU refresh",
        })
    }
    fn apply_refresh(&mut self, _: &Refresh) -> dllm_models::Result<()> {
        Err(dllm_models::Error::Internal {
            what: "the decoder merged a CPU refresh",
        })
    }
    fn answer(&mut self, ask: &Ask) -> dllm_models::Result<Answer> {
        assert!(
            ask.window.start <= self.cache_len || ask.clear_cache,
            "window {:?} after the cache {}",
            ask.window,
            self.cache_len
        );
        if ask.clear_cache {
            self.cache_len = 0;
        }
        let canvas = &ask.canvas[0];
        for &p in &ask.verify {
            assert_ne!(canvas[p], MASK, "a shadow of an undecided position {p}");
        }
        for &p in &ask.rows {
            assert!(
                ask.window.contains(&p),
                "logits row {p} outside {:?}",
                ask.window
            );
        }
        let l: Vec<Vec<f32>> = ask.rows.iter().map(|&p| Self::predict(p)).collect();
        let v: Vec<Vec<f32>> = ask
            .verify
            .iter()
            .map(|&p| row(canvas[p] as usize, if p % 3 == 0 { 0.1 } else { 0.95 }))
            .collect();
        if let Some(c) = &ask.commit {
            self.cache_len = self.cache_len.max(c.end);
        }
        self.asks.push(ask.clone());
        Ok(Answer {
            logits: logits(&l),
            verify_logits: if v.is_empty() {
                Tensor::zeros((1, 0, VOCAB), DType::F32, &Device::Cpu)?
            } else {
                logits(&v)
            },
        })
    }
}

/// mbsd without lookahead, staged at the paper's 0.7 / 0.9 with verification.
fn params(verify: Option<Verify>) -> DecodeParams {
    DecodeParams {
        gen_length: 24,
        block_length: 8,
        steps: 24,
        // Verification rows alone (the shown guess's shadow is tested in `guesses`).
        strategy: Strategy::Mbsd(MbsdParams {
            lookahead: false,
            show_guess: Some(false),
            ..Default::default()
        }),
        decide: Decide::Staged(Staged {
            visible: 0.7,
            stable: 0.9,
            no_adjacent: false,
            wait_left: 0,
            near_wait: None,
            verify,
        }),
        early_stop: false,
        ..Default::default()
    }
}

/// Verification with room for every shadow (no latency price), tau_back 0.5.
fn verify() -> Verify {
    Verify {
        tau_back: 0.5,
        max_remasks: 2,
        suspect_dependents: false,
        hold_on_remask: false,
        allowance: 1e9,
        joint: Joint::Off,
        // The scripted tests below look at one mechanism at a time (one test hides partners).
        partners_within: 0,
    }
}

struct Seen {
    remasked: Vec<(usize, usize)>,
    stable_at: Vec<Option<usize>>,
    decided_at: Vec<Vec<usize>>,
}

fn run(p: &DecodeParams) -> (Outcome, Scripted, Seen) {
    let mut m = Scripted::new();
    let len = PROMPT.len() + p.gen_length;
    let mut seen = Seen {
        remasked: vec![],
        stable_at: vec![None; len],
        decided_at: vec![vec![]; len],
    };
    let mut obs = |e: &StepEvent<'_>| {
        for &q in e.remasked {
            assert_eq!(e.canvas[q], MASK, "a remasked position holds a token");
            assert_eq!(e.states[q], TokenState::Invisible);
            seen.remasked.push((e.step, q));
        }
        for &q in e.unmasked {
            seen.decided_at[q].push(e.step);
        }
        for (q, s) in e.states.iter().enumerate() {
            if *s == TokenState::Stable && seen.stable_at[q].is_none() {
                seen.stable_at[q] = Some(e.step);
            }
        }
        Control::Continue
    };
    let g = generate(&mut m, PROMPT, p, &mut obs).unwrap();
    (g, m, seen)
}

#[test]
fn tentative_tokens_are_verified_later_remasked_never_replaced_and_stabilised() {
    let (g, m, seen) = run(&params(Some(verify())));
    assert!(g.remasks() > 0 && g.verified > 0, "{g:?}");
    // Only the positions whose shadow rejects their token go back to the mask, and the token is
    // decided again from a forward (never replaced by the shadow's preference).
    for &(pos, tok) in &g.remasked {
        assert_eq!(pos % 3, 0, "position {pos} should not have been remasked");
        assert_eq!(tok as usize, pos % 5);
    }
    for &(step, pos) in &seen.remasked {
        assert!(
            seen.decided_at[pos].iter().any(|&s| s > step) || step + 1 == g.steps,
            "position {pos} remasked at step {step} was never decided again"
        );
    }
    // Every shadow is asked of a forward after the one whose logits decided its token.
    for (k, ask) in m.asks.iter().enumerate() {
        for &p in &ask.verify {
            let decided_before = m.asks[..k].iter().any(|a| a.rows.contains(&p));
            assert!(
                decided_before,
                "forward {k} verifies {p} before it was decided"
            );
        }
    }
    // At most two remasks per position, flip-flops counted (the script re-decides the same token).
    for pos in 0..24 + PROMPT.len() {
        let n = g.remasked.iter().filter(|r| r.0 == pos).count();
        assert!(n <= 2, "position {pos} remasked {n} times");
    }
    assert!(g.flip_flops > 0 && g.flip_flops <= g.remasks());
    // Tokens confirmed by their shadow became Stable; nothing is masked at the end.
    let confirmed = (PROMPT.len()..PROMPT.len() + 24)
        .filter(|p| p % 2 == 1 && p % 3 != 0 && seen.stable_at[*p].is_some())
        .count();
    assert!(confirmed > 0);
    assert!(!g.generated().contains(&MASK));
}

#[test]
fn the_last_step_keeps_at_least_one_of_its_decisions() {
    let mut m = Scripted::new();
    let mut standing = std::collections::HashMap::<usize, usize>::new();
    let mut origin = vec![usize::MAX; 64];
    let mut remasks = 0;
    let mut obs = |e: &StepEvent<'_>| {
        // This step's remasks first (they are judged before its decisions).
        // The guard protects the last step's decisions; older ones may all go back.
        for &q in e.remasked {
            let kept = standing.get_mut(&origin[q]).unwrap();
            *kept -= 1;
            assert!(
                *kept >= 1 || origin[q] + 1 < e.step,
                "step {} took back every decision of step {}",
                e.step,
                origin[q]
            );
            remasks += 1;
        }
        for &q in e.unmasked {
            origin[q] = e.step;
            *standing.entry(e.step).or_insert(0) += 1;
        }
        Control::Continue
    };
    let g = generate(&mut m, PROMPT, &params(Some(verify())), &mut obs).unwrap();
    assert!(remasks > 0 && remasks == g.remasks());
    assert_eq!(m.asks.len(), g.forwards);
}

#[test]
fn without_verification_visible_tokens_are_never_looked_at() {
    let (g, m, _) = run(&params(None));
    assert_eq!((g.verified, g.remasks()), (0, 0));
    assert!(m.asks.iter().all(|a| a.verify.is_empty()));
    assert!(g.unstable_at_block_end > 0);
}

#[test]
fn the_generation_ends_only_after_every_tentative_token_had_a_look() {
    let (g, m, _) = run(&params(Some(verify())));
    // The last forward verifies: it decides nothing and looks at what the last step decided.
    let last = m.asks.last().unwrap();
    assert!(last.rows.is_empty() && !last.verify.is_empty(), "{last:?}");
    assert_eq!(g.trace.last().unwrap().active, 0);
}

#[test]
fn shadows_fit_the_free_rows_of_the_latency_bucket() {
    // The default verification prices shadows: within the bucket's free rows (10% allowance on
    // the SM8750 table's flat 32-token buckets).
    let mut v = verify();
    v.allowance = dllm_decode::params::DEFAULT_SHADOW_ALLOWANCE;
    let (_, m, _) = run(&params(Some(v)));
    let mut some = false;
    for a in &m.asks {
        if a.rows.is_empty() {
            continue; // the final verification forward takes every shadow
        }
        let w = a.window.len();
        let bucket = w.div_ceil(32) * 32;
        assert!(
            w + a.verify.len() <= bucket,
            "window {w} + {} shadows spill past the {bucket} bucket",
            a.verify.len()
        );
        some |= !a.verify.is_empty();
    }
    assert!(some, "no forward carried a shadow");
}

#[test]
fn staged_decisions_without_mbsd_and_bad_thetas_are_named_errors() {
    let p = DecodeParams {
        strategy: Strategy::DualCache,
        ..params(Some(verify()))
    };
    let e = generate(&mut Scripted::new(), PROMPT, &p, &mut ())
        .unwrap_err()
        .to_string();
    assert!(e.contains("`decide`") && e.contains("mbsd"), "{e}");
    let p = DecodeParams {
        decide: Decide::Staged(Staged {
            visible: 0.9,
            stable: 0.8,
            no_adjacent: false,
            wait_left: 0,
            near_wait: None,
            verify: None,
        }),
        ..params(None)
    };
    let e = generate(&mut Scripted::new(), PROMPT, &p, &mut ())
        .unwrap_err()
        .to_string();
    assert!(e.contains("theta_visible"), "{e}");
    let mut bad = verify();
    bad.tau_back = 1.5;
    let e = generate(&mut Scripted::new(), PROMPT, &params(Some(bad)), &mut ())
        .unwrap_err()
        .to_string();
    assert!(e.contains("tau_back"), "{e}");
}

#[test]
fn skipped_logits_rows_are_never_requested_and_switching_off_works() {
    let (g, m, _) = run(&params(Some(verify())));
    assert!(g.logits_rows_skipped > 0);
    for a in &m.asks {
        assert!(
            a.rows.iter().all(|&p| a.canvas[0][p] == MASK),
            "logits asked for a decided position"
        );
    }
    let mut p = params(Some(verify()));
    p.sls = false;
    let (g2, _, _) = run(&p);
    assert_eq!(g2.logits_rows_skipped, 0);
    assert_eq!(g2.canvas, g.canvas);
}

fn shipped() -> dllm_models::DiffusionTransformer {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../models/tiny-llada");
    load(
        &ModelSource::parse(dir.to_str().unwrap()).unwrap(),
        &LoadOptions::default(),
    )
    .unwrap()
    .model
}

#[test]
fn deterministic_over_runs_and_thread_counts_with_verification() {
    // Low thresholds leave tentative tokens to verify on the real model.
    let p = DecodeParams {
        decide: Decide::Staged(Staged {
            visible: 0.3,
            stable: 0.99,
            no_adjacent: true,
            wait_left: 0,
            near_wait: None,
            verify: Some(verify()),
        }),
        ..params(None)
    };
    let prompt: &[u32] = &[2, 40, 41, 42, 43, 44, 45, 46, 4];
    let run = |threads: usize| -> Outcome {
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .build()
            .unwrap();
        pool.install(|| generate(&mut shipped(), prompt, &p, &mut ()).unwrap())
    };
    let first = run(1);
    assert!(first.verified > 0, "{first:?}");
    for k in 0..6 {
        let t = 1 + k % 3;
        let g = run(t);
        assert_eq!(g.canvas, first.canvas, "run {k} with {t} threads");
        assert_eq!(
            (g.forwards, g.verified, &g.remasked),
            (first.forwards, first.verified, &first.remasked)
        );
    }
}

#[test]
fn the_joint_check_holds_back_confident_tokens_decided_beside_each_other() {
    // The script decides every even position at 0.95 (>= theta_stable 0.9): two positions apart,
    // several in one step.
    let on = Verify {
        joint: Joint::On(JointRule {
            within: 2,
            unless_above: 0.99,
        }),
        ..verify()
    };
    let looked = |m: &Scripted| -> Vec<usize> {
        let mut v: Vec<usize> = m.asks.iter().flat_map(|a| a.verify.clone()).collect();
        v.sort_unstable();
        v.dedup();
        v
    };
    let (g_off, m_off, seen_off) = run(&params(Some(verify())));
    let (g_on, m_on, seen_on) = run(&params(Some(on)));
    let gen = PROMPT.len()..PROMPT.len() + 24;
    // Off: an even position is final the step it is decided, and never looked at.
    for p in gen.clone().filter(|p| p % 2 == 0) {
        if let Some(&first) = seen_off.decided_at[p].first() {
            assert_eq!(seen_off.stable_at[p], Some(first), "position {p}");
        }
    }
    assert!(
        looked(&m_off).iter().all(|p| p % 2 == 1),
        "{:?}",
        looked(&m_off)
    );
    // On: the even positions decided together wait for a shadow row; those whose shadow rejects
    // their token (p % 3 == 0) go back to the mask.
    let even_looked: Vec<usize> = looked(&m_on).into_iter().filter(|p| p % 2 == 0).collect();
    assert!(!even_looked.is_empty(), "{:?}", looked(&m_on));
    for &p in &even_looked {
        let first = seen_on.decided_at[p][0];
        assert!(
            seen_on.stable_at[p].is_none_or(|s| s > first),
            "position {p} was final the step it was decided"
        );
    }
    assert!(
        g_on.remasked.iter().any(|r| r.0 % 2 == 0 && r.0 % 3 == 0),
        "{:?}",
        g_on.remasked
    );
    assert!(g_on.verified > g_off.verified);
    assert!(!g_on.generated().contains(&MASK));
    // A decision at or above `unless_above` is exempt: at 0.9 every even position is exempt.
    let exempt = Verify {
        joint: Joint::On(JointRule {
            within: 2,
            unless_above: 0.9,
        }),
        ..verify()
    };
    let (g_ex, _, _) = run(&params(Some(exempt)));
    assert_eq!(g_ex.generated(), g_off.generated());
    assert_eq!(g_ex.verified, g_off.verified);
}

#[test]
fn a_look_hides_the_tentative_tokens_after_its_token_decided_with_or_after_it() {
    let partners = Verify {
        partners_within: 4,
        ..verify()
    };
    let (g, m, _) = run(&params(Some(partners)));
    let mut hidden = 0;
    for a in &m.asks {
        if a.verify_hidden.is_empty() {
            continue;
        }
        assert_eq!(a.verify_hidden.len(), a.verify.len());
        let canvas = &a.canvas[0];
        for (&p, list) in a.verify.iter().zip(&a.verify_hidden) {
            for &q in list {
                // Never a token before it (its operands), at most 4 after it.
                assert!(q > p && q - p <= 4, "shadow {p} hides {q}");
                assert_ne!(canvas[q], MASK, "shadow {p} hides the undecided {q}");
                hidden += 1;
            }
        }
    }
    assert!(hidden > 0);
    // The scripted model ignores attention: hiding changes no decision.
    let (g0, m0, _) = run(&params(Some(verify())));
    assert!(m0.asks.iter().all(|a| a.verify_hidden.is_empty()));
    assert_eq!(g.generated(), g0.generated());
}

#[test]
fn a_step_that_sends_a_token_back_decides_one_token_tentatively() {
    let hold = Verify {
        hold_on_remask: true,
        ..verify()
    };
    let mut m = Scripted::new();
    let mut held = 0;
    let mut obs = |e: &StepEvent<'_>| {
        if !e.remasked.is_empty() {
            // Its rows saw the token that went back: one decision, not final.
            assert!(e.unmasked.len() <= 1, "step {}: {:?}", e.step, e.unmasked);
            for &q in e.unmasked {
                assert_eq!(
                    e.states[q],
                    TokenState::Visible,
                    "step {} position {q}",
                    e.step
                );
                held += 1;
            }
        }
        Control::Continue
    };
    let g = generate(&mut m, PROMPT, &params(Some(hold)), &mut obs).unwrap();
    assert!(held > 0 && g.remasks() > 0);
}
