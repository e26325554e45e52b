//! The shown guess (`MbsdParams::show_guess`), driven by hand: the test plays the model,
//! answering each ask with chosen logits for its rows and for the guess's shadow row. The rows
//! after a guess count only when its shadow confirms it, or, with guess agreement under the
//! threshold rule, still predicts it below the threshold; its own row (which saw the guess as
//! input) never does.

use candle_core::{DType, Device, Tensor};
use dllm_decode::{Decide, DecodeParams, Decoder, Generation, MbsdParams, Staged, Strategy};
use dllm_models::{Answer, Ask};

use crate::scripted::{info, logits, row, MASK, PROMPT, VOCAB};

fn params(decide: Decide, show_guess: Option<bool>) -> DecodeParams {
    DecodeParams {
        gen_length: 8,
        block_length: 8,
        steps: 8,
        strategy: Strategy::Mbsd(MbsdParams {
            show_guess,
            ..Default::default()
        }),
        decide,
        ..Default::default()
    }
}

/// Rows for `positions`, each `(token, confidence)` from `script` (others: token 4 at 0.3).
fn rows(positions: &[usize], script: &[(usize, usize, f64)]) -> Tensor {
    if positions.is_empty() {
        return Tensor::zeros((1, 0, VOCAB), DType::F32, &Device::Cpu).unwrap();
    }
    let r: Vec<Vec<f32>> = positions
        .iter()
        .map(|&p| match script.iter().find(|x| x.0 == p) {
            Some(&(_, t, c)) => row(t, c),
            None => row(4, 0.3),
        })
        .collect();
    logits(&r)
}

fn answer(ask: &Ask, main: &[(usize, usize, f64)], shadows: &[(usize, usize, f64)]) -> Answer {
    Answer {
        logits: rows(&ask.rows, main),
        verify_logits: rows(&ask.verify, shadows),
    }
}

fn start(p: DecodeParams) -> Generation<'static> {
    Decoder::new(p).start(&info(), PROMPT).unwrap()
}

/// Generated position `i` on the canvas.
fn at(i: usize) -> usize {
    PROMPT.len() + i
}

#[test]
fn the_rows_after_a_guess_count_only_when_its_shadow_confirms_it() {
    let mut g = start(params(Decide::Threshold(0.9), Some(true)));
    // Forward 1: nothing to guess yet. Position 0 is decided; 1 and 2 are predicted.
    let ask = g.next().unwrap().unwrap();
    assert!(ask.verify.is_empty());
    let a = answer(
        &ask,
        &[(at(0), 0, 0.95), (at(1), 1, 0.6), (at(2), 2, 0.5)],
        &[],
    );
    let e = g.absorb(a).unwrap();
    assert_eq!(e.unmasked, &[at(0)]);
    assert_eq!(e.guess, None, "nothing was shown");
    // Forward 2 shows forward 1's prediction for the first undecided position and checks it.
    let ask = g.next().unwrap().unwrap();
    assert_eq!(ask.canvas[0][at(1)], 1, "the guess is written in");
    assert_eq!(ask.canvas[0][at(2)], MASK);
    assert_eq!(ask.verify, vec![at(1)]);
    assert!(
        !ask.rows.contains(&at(1)),
        "the guess's own row repeats its input: not asked"
    );
    // The shadow confirms it: position 1 is decided by the shadow (its own row, which only
    // copies its input, is not read), and position 2, predicted with the guess in view, too.
    let a = answer(
        &ask,
        &[(at(1), 5, 0.99), (at(2), 2, 0.97), (at(3), 3, 0.5)],
        &[(at(1), 1, 0.95)],
    );
    let e = g.absorb(a).unwrap();
    let mut decided = e.unmasked.to_vec();
    decided.sort_unstable();
    assert_eq!(decided, vec![at(1), at(2)]);
    assert_eq!((e.canvas[at(1)], e.canvas[at(2)]), (1, 2));
    assert_eq!(
        e.guess,
        Some((at(1), true)),
        "the event names the confirmed guess"
    );
    assert_eq!(
        (g.progress().guesses_shown, g.progress().guesses_confirmed),
        (1, 1)
    );
    // Forward 3 shows 3 at position 3; the shadow predicts 2 there: rejected. The step decides
    // only up to the guess (position 3 by the shadow's prediction); position 4's 0.99 was
    // predicted with the wrong guess in view and is not taken.
    let ask = g.next().unwrap().unwrap();
    assert_eq!((ask.canvas[0][at(3)], ask.verify.clone()), (3, vec![at(3)]));
    let a = answer(&ask, &[(at(4), 1, 0.99)], &[(at(3), 2, 0.95)]);
    let e = g.absorb(a).unwrap();
    assert_eq!(e.unmasked, &[at(3)]);
    assert_eq!((e.canvas[at(3)], e.canvas[at(4)]), (2, MASK));
    assert_eq!(e.guess, Some((at(3), false)), "and the rejected one");
    assert_eq!(
        (g.progress().guesses_shown, g.progress().guesses_confirmed),
        (2, 1)
    );
    // A rejected step keeps no prediction after the guess: forward 4 has nothing to show.
    let ask = g.next().unwrap().unwrap();
    assert!(ask.verify.is_empty());
    assert_eq!(ask.canvas[0][at(4)], MASK);
    assert_eq!(
        g.progress().verified,
        0,
        "a guess's shadow is not a verification"
    );
}

/// Forwards 1 and 2 of a generation whose first forward decides position 0 and predicts 1 at
/// 0.6 and 2 at 0.5; forward 2 shows 1 at position 1. Returns the generation and forward 2's ask.
fn guess_at_one(agreement: bool) -> (Generation<'static>, Ask) {
    let mut p = params(Decide::Threshold(0.9), Some(true));
    if let Strategy::Mbsd(m) = &mut p.strategy {
        m.guess_agreement = agreement;
    }
    let mut g = start(p);
    let ask = g.next().unwrap().unwrap();
    g.absorb(answer(
        &ask,
        &[(at(0), 0, 0.95), (at(1), 1, 0.6), (at(2), 2, 0.5)],
        &[],
    ))
    .unwrap();
    let ask = g.next().unwrap().unwrap();
    assert_eq!((ask.canvas[0][at(1)], ask.verify.clone()), (1, vec![at(1)]));
    (g, ask)
}

#[test]
fn without_agreement_a_shadow_below_the_threshold_rejects_the_guess() {
    let (mut g, ask) = guess_at_one(false);
    // The guessed token, but at 0.8: not confirmed; the fallback decides the guess's position
    // with the shadow's prediction (the most confident candidate left), nothing after it.
    let a = answer(&ask, &[(at(2), 2, 0.99)], &[(at(1), 1, 0.8)]);
    let e = g.absorb(a).unwrap();
    assert_eq!(e.unmasked, &[at(1)]);
    assert_eq!(e.canvas[at(2)], MASK);
    assert_eq!(e.guess, Some((at(1), false)));
    let p = g.progress();
    assert_eq!(
        (p.guesses_confirmed, p.guesses_agreed, p.guesses_waited),
        (0, 0, 0)
    );
    // Another token below the threshold: decided all the same.
    let (mut g, ask) = guess_at_one(false);
    let e = g
        .absorb(answer(&ask, &[(at(2), 2, 0.99)], &[(at(1), 3, 0.8)]))
        .unwrap();
    assert_eq!((e.unmasked.to_vec(), e.canvas[at(1)]), (vec![at(1)], 3));
}

#[test]
fn with_agreement_a_shadow_that_still_predicts_the_guess_lets_every_row_count() {
    let (mut g, ask) = guess_at_one(true);
    // The guessed token at 0.8: the position takes it (as the fallback would), and position 2,
    // predicted at 0.99 with that token in view, is decided with it.
    let a = answer(
        &ask,
        &[(at(2), 2, 0.99), (at(3), 3, 0.5)],
        &[(at(1), 1, 0.8)],
    );
    let e = g.absorb(a).unwrap();
    let mut decided = e.unmasked.to_vec();
    decided.sort_unstable();
    assert_eq!(decided, vec![at(1), at(2)]);
    assert_eq!(
        (e.canvas[at(1)], e.canvas[at(2)], e.canvas[at(3)]),
        (1, 2, MASK)
    );
    assert_eq!(
        e.guess,
        Some((at(1), true)),
        "taken, as a confirmed guess is"
    );
    let p = g.progress();
    assert_eq!(
        (
            p.guesses_shown,
            p.guesses_confirmed,
            p.guesses_agreed,
            p.guesses_waited
        ),
        (1, 0, 1, 0)
    );
    // The next forward shows the next guess (position 3, predicted with the agreed one).
    let ask = g.next().unwrap().unwrap();
    assert_eq!((ask.canvas[0][at(3)], ask.verify.clone()), (3, vec![at(3)]));
}

#[test]
fn with_agreement_a_shadow_that_doubts_the_guess_decides_nothing_and_the_next_forward_shows_none() {
    let (mut g, ask) = guess_at_one(true);
    // Another token at 0.8: nothing is decided, not even the guess's position.
    let a = answer(&ask, &[(at(2), 2, 0.99)], &[(at(1), 3, 0.8)]);
    let e = g.absorb(a).unwrap();
    assert!(e.unmasked.is_empty(), "{:?}", e.unmasked);
    assert_eq!((e.canvas[at(1)], e.canvas[at(2)]), (MASK, MASK));
    assert_eq!(e.guess, Some((at(1), false)));
    assert_eq!(
        (g.progress().guesses_agreed, g.progress().guesses_waited),
        (0, 1)
    );
    // The next forward shows no guess: position 1 is a mask to every row, and the threshold
    // rule decides on that canvas.
    let ask = g.next().unwrap().unwrap();
    assert!(ask.verify.is_empty());
    assert_eq!(ask.canvas[0][at(1)], MASK);
    let e = g
        .absorb(answer(&ask, &[(at(1), 3, 0.95), (at(2), 2, 0.5)], &[]))
        .unwrap();
    assert_eq!((e.unmasked.to_vec(), e.canvas[at(1)]), (vec![at(1)], 3));
    // Another token at or above the threshold is a decision, as without agreement.
    let (mut g, ask) = guess_at_one(true);
    let e = g
        .absorb(answer(&ask, &[(at(2), 2, 0.99)], &[(at(1), 3, 0.95)]))
        .unwrap();
    assert_eq!(
        (e.unmasked.to_vec(), e.canvas[at(1)], e.canvas[at(2)]),
        (vec![at(1)], 3, MASK)
    );
}

#[test]
fn the_family_decides_unless_asked_and_the_schedule_cannot_show_one() {
    let m = MbsdParams::default();
    assert!(m.shows_guess(false, Decide::Threshold(0.9)), "LLaDA");
    assert!(
        m.shows_guess(false, Decide::Staged(Staged::default())),
        "LLaDA, staged"
    );
    // Dream: with the threshold rule (its default), not with staged decisions.
    assert!(m.shows_guess(true, Decide::Threshold(0.9)), "Dream");
    assert!(
        !m.shows_guess(true, Decide::Staged(Staged::default())),
        "Dream, staged"
    );
    assert!(!m.shows_guess(true, Decide::Schedule), "Dream, schedule");
    assert!(
        !m.shows_guess(false, Decide::Schedule),
        "no final threshold"
    );
    let on = MbsdParams {
        show_guess: Some(true),
        ..m
    };
    assert!(on.shows_guess(true, Decide::Staged(Staged::default())));
    let off = MbsdParams {
        show_guess: Some(false),
        ..m
    };
    assert!(!off.shows_guess(true, Decide::Threshold(0.9)));
    let e = params(Decide::Schedule, Some(true))
        .validate()
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("show_guess") && e.contains("confidence rule"),
        "{e}"
    );
    params(Decide::Schedule, None).validate().unwrap();
    // Without a guess, the same decoder shows none.
    let mut g = start(params(Decide::Threshold(0.9), Some(false)));
    let ask = g.next().unwrap().unwrap();
    g.absorb(answer(&ask, &[(at(0), 0, 0.95), (at(1), 1, 0.6)], &[]))
        .unwrap();
    let ask = g.next().unwrap().unwrap();
    assert!(ask.verify.is_empty());
    assert_eq!(ask.canvas[0][at(1)], MASK);
}

#[test]
fn a_rejected_guess_drops_the_lookahead_drafts_that_saw_it() {
    let p = DecodeParams {
        gen_length: 16,
        block_length: 8,
        steps: 16,
        strategy: Strategy::Mbsd(MbsdParams {
            lookahead: true,
            show_guess: Some(true),
            ..Default::default()
        }),
        decide: Decide::Threshold(0.9),
        early_stop: false,
        ..Default::default()
    };
    let run = |shadow_token: usize| {
        let mut g = start(p);
        // Forward 1 decides all of block 0 but position 1.
        let ask = g.next().unwrap().unwrap();
        let sure: Vec<(usize, usize, f64)> = (0..8)
            .filter(|&i| i != 1)
            .map(|i| (at(i), 0, 0.99))
            .chain([(at(1), 1, 0.6)])
            .collect();
        g.absorb(answer(&ask, &sure, &[])).unwrap();
        // Forward 2 shows 1 at position 1 and looks ahead into block 1, whose rows are sure.
        let ask = g.next().unwrap().unwrap();
        assert_eq!(ask.verify, vec![at(1)]);
        assert!(
            ask.rows.iter().any(|&r| r >= at(8)),
            "lookahead rows: {:?}",
            ask.rows
        );
        let ahead: Vec<(usize, usize, f64)> = (8..16).map(|i| (at(i), 2, 0.99)).collect();
        let e = g
            .absorb(answer(&ask, &ahead, &[(at(1), shadow_token, 0.95)]))
            .unwrap();
        // Block 0 completes with the guess's position (then block 1 takes what drafts it accepts).
        assert_eq!(e.unmasked[0], at(1));
        assert!(
            e.unmasked[1..].iter().all(|&q| q >= at(8)),
            "{:?}",
            e.unmasked
        );
        g.progress().drafts_accepted
    };
    // Confirmed, the drafts saw a final token: block 1 accepts them when it becomes current.
    assert_eq!(run(1), 8);
    // Rejected, they saw a wrong one: none is offered.
    assert_eq!(run(3), 0);
}
