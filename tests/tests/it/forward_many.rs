//! The model answers many: eight generations of different prompt lengths and strategies run in
//! lockstep twice, once each sequence alone (`DiffusionLm::answer`) and once all together
//! (`DiffusionTransformer::forward_many`); at every step each sequence's logits and verification
//! logits from the batched call equal its solo ones bit for bit (on the CPU, and on the Hexagon
//! device). Then the shadow rows' semantics: a verification row's logits equal a leave-one-out
//! forward on the committed cache.

use std::path::PathBuf;

use candle_core::Tensor;
use candle_hexagon::{HexagonConfig, HexagonDevice};
use dllm_decode::{
    Decide, DecodeParams, Decoder, Generation, MbsdParams, Staged, Strategy, Verify,
};
use dllm_models::{
    load, Answer, Ask, Backend, DiffusionLm, DiffusionTransformer, LoadOptions, ModelSource, Rows,
};
use dllm_tasks::eval::questions;
use dllm_tasks::TaskKind;

fn model(backend: Backend) -> dllm_models::LoadedModel {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../models/tiny-llada-long");
    load(
        &ModelSource::parse(dir.to_str().unwrap()).unwrap(),
        &LoadOptions {
            backend,
            ..Default::default()
        },
    )
    .unwrap()
}

fn bits(t: &Tensor) -> Vec<u32> {
    t.flatten_all()
        .unwrap()
        .to_vec1::<f32>()
        .unwrap()
        .iter()
        .map(|x| x.to_bits())
        .collect()
}

/// Eight decoders: every strategy, staged decisions with and without verification, two lengths.
fn params() -> Vec<DecodeParams> {
    let base = |strategy, decide, gen| DecodeParams {
        gen_length: gen,
        block_length: 32,
        steps: gen,
        strategy,
        decide,
        ..Default::default()
    };
    let mbsd = Strategy::Mbsd(MbsdParams::default());
    let staged = |visible, verify: Option<Verify>| {
        Decide::Staged(Staged {
            visible,
            stable: 0.9,
            no_adjacent: false,
            wait_left: 0,
            near_wait: None,
            verify,
        })
    };
    vec![
        base(Strategy::Vanilla, Decide::Threshold(0.9), 64),
        base(Strategy::PrefixCache, Decide::Threshold(0.8), 128),
        base(Strategy::DualCache, Decide::Threshold(0.9), 96),
        base(mbsd, staged(0.9, Some(Verify::default())), 128),
        base(mbsd, staged(0.6, Some(Verify::default())), 128),
        base(mbsd, staged(0.7, None), 64),
        base(mbsd, Decide::Threshold(0.9), 128),
        base(
            Strategy::Mbsd(MbsdParams {
                lookahead: false,
                ..Default::default()
            }),
            staged(0.5, Some(Verify::default())),
            96,
        ),
    ]
}

/// Runs the eight generations in lockstep, solo and batched; returns the number of batched calls
/// and the most sequences one of them held.
fn lockstep(backend: Backend) -> (usize, usize) {
    let m = model(backend);
    let tok = m.tokenizer.clone().unwrap();
    let info = m.model.info().clone();
    let qs = questions(&[TaskKind::LongMath], Some(8));
    let mut solo: Vec<DiffusionTransformer> =
        (0..8).map(|_| m.model.new_sequence().unwrap()).collect();
    let mut many: Vec<DiffusionTransformer> =
        (0..8).map(|_| m.model.new_sequence().unwrap()).collect();
    let mut gens: Vec<(Generation<'static>, Generation<'static>)> = params()
        .into_iter()
        .zip(&qs)
        .map(|(p, q)| {
            // Prompts of different lengths: cut some.
            let mut prompt = tok.encode_prompt(&q.prompt, false).unwrap();
            prompt.truncate(prompt.len() - 3 * (p.gen_length % 3));
            (
                Decoder::new(p).start(&info, &prompt).unwrap(),
                Decoder::new(p).start(&info, &prompt).unwrap(),
            )
        })
        .collect();
    let (mut calls, mut widest) = (0, 0);
    loop {
        let mut asks: Vec<(usize, Ask)> = Vec::new();
        for (i, (a, b)) in gens.iter_mut().enumerate() {
            let (x, y) = (a.next().unwrap(), b.next().unwrap());
            assert_eq!(x, y, "sequence {i}: the twin generations diverged");
            if let Some(x) = x {
                asks.push((i, x));
            }
        }
        if asks.is_empty() {
            break;
        }
        let alone: Vec<Answer> = asks
            .iter()
            .map(|(i, a)| solo[*i].answer(a).unwrap())
            .collect();
        let mut seqs: Vec<(&mut DiffusionTransformer, &Ask)> = Vec::new();
        for (k, s) in many.iter_mut().enumerate() {
            if let Some((_, a)) = asks.iter().find(|(i, _)| *i == k) {
                seqs.push((s, a));
            }
        }
        let together = DiffusionTransformer::forward_many(&mut seqs).unwrap();
        calls += 1;
        widest = widest.max(asks.len());
        for (((i, _), a), b) in asks.iter().zip(alone).zip(together) {
            assert_eq!(bits(&a.logits), bits(&b.logits), "sequence {i}: logits");
            assert_eq!(
                bits(&a.verify_logits),
                bits(&b.verify_logits),
                "sequence {i}: verification logits"
            );
            let (ga, gb) = &mut gens[*i];
            ga.absorb(a).unwrap();
            gb.absorb(b).unwrap();
        }
    }
    for (a, b) in gens {
        let (a, b) = (a.finish(), b.finish());
        assert_eq!(a.canvas, b.canvas);
        assert_eq!(a.trace, b.trace);
    }
    (calls, widest)
}

#[test]
fn eight_sequences_batched_equal_their_solo_forwards_bit_for_bit_on_the_cpu() {
    let (calls, widest) = lockstep(Backend::Cpu);
    assert_eq!(widest, 8, "every sequence was in the first batched call");
    assert!(calls > 8, "{calls}");
}

#[test]
fn eight_sequences_batched_equal_their_solo_forwards_on_the_hexagon_device() {
    let dev = HexagonDevice::open(HexagonConfig {
        va_window_bytes: 256 << 20,
        ..Default::default()
    })
    .unwrap();
    let (calls, widest) = lockstep(Backend::Hexagon(dev));
    assert_eq!(widest, 8);
    assert!(calls > 8, "{calls}");
}

/// A window forward with shadow rows, then the leave-one-out forward of each shadow position on
/// the committed cache: position masked, a one-position window (for the shadow that hides its
/// neighbour, both masked, a two-position window).
fn shadows_match_leave_one_out(backend: Backend, tol: f32) {
    let m = model(backend);
    let tok = m.tokenizer.clone().unwrap();
    let q = &questions(&[TaskKind::LongMath], Some(1))[0];
    let prompt = tok.encode_prompt(&q.prompt, false).unwrap();
    let mut reference = dllm_tasks::tokenizer::encode_response(tok.inner(), &q.response).unwrap();
    reference.truncate(40);
    let mask = m.model.info().special.mask;
    let (p, n) = (prompt.len(), reference.len());
    let mut canvas = prompt.clone();
    canvas.extend(&reference);
    canvas.extend(std::iter::repeat_n(mask, 24));
    let len = canvas.len();
    let mut seq = m.model.new_sequence().unwrap();
    // A first forward fills the cache with the answer's first half decided.
    seq.answer(&Ask {
        canvas: vec![canvas.clone()],
        clear_cache: true,
        window: 0..len,
        rows: vec![],
        verify: vec![],
        verify_hidden: vec![],
        commit: Some(0..len),
    })
    .unwrap();
    // A window over the second part, verifying cached and window positions; one shadow also
    // hides the position after it (a leave-two-out forward).
    let verify = vec![p + 3, p + 10, p + n - 2, p + n - 1];
    let hidden = vec![vec![], vec![], vec![p + n - 1], vec![]];
    let window = p + n - 6..len;
    let ans = seq
        .answer(&Ask {
            canvas: vec![canvas.clone()],
            clear_cache: false,
            window: window.clone(),
            rows: vec![len - 1],
            verify: verify.clone(),
            verify_hidden: hidden.clone(),
            commit: Some(window),
        })
        .unwrap();
    let shadows = ans.verify_logits.to_dtype(candle_core::DType::F32).unwrap();
    for (k, &pos) in verify.iter().enumerate() {
        let mut masked = canvas.clone();
        let last = hidden[k].last().copied().unwrap_or(pos);
        masked[pos..=last].fill(mask);
        let t = Tensor::from_vec(masked, (1, len), m.model.device()).unwrap();
        let loo = seq
            .forward(&t, pos..last + 1, Rows::Positions(&[pos]))
            .unwrap();
        let a: Vec<f32> = shadows
            .narrow(1, k, 1)
            .unwrap()
            .flatten_all()
            .unwrap()
            .to_vec1()
            .unwrap();
        let b: Vec<f32> = loo.flatten_all().unwrap().to_vec1().unwrap();
        let diff = a
            .iter()
            .zip(&b)
            .map(|(x, y)| (x - y).abs())
            .fold(0f32, f32::max);
        assert!(
            diff <= tol,
            "position {pos}: shadow vs leave-one-out differ by {diff}"
        );
    }
}

#[test]
fn a_shadow_row_is_a_leave_one_out_forward_on_the_committed_cache_cpu() {
    shadows_match_leave_one_out(Backend::Cpu, 1e-4);
}

#[test]
fn a_shadow_row_is_a_leave_one_out_forward_on_the_committed_cache_hexagon() {
    let dev = HexagonDevice::open(HexagonConfig {
        va_window_bytes: 256 << 20,
        ..Default::default()
    })
    .unwrap();
    shadows_match_leave_one_out(Backend::Hexagon(dev), 1e-4);
}

/// Why the first revision design's CPU re-score was retired: a token re-scored against the cache
/// of the very forward that decided it (age 1, as that design always did first) gets that
/// forward's own prediction back — its siblings decided in the same step are still masks in the
/// cache — so the re-score can only agree.
#[test]
fn a_rescore_of_age_one_replays_the_row_that_decided_the_token() {
    let m = model(Backend::Cpu);
    let tok = m.tokenizer.clone().unwrap();
    let q = &questions(&[TaskKind::LongMath], Some(2))[1];
    let prompt = tok.encode_prompt(&q.prompt, false).unwrap();
    let mask = m.model.info().special.mask;
    let mut canvas = prompt.clone();
    canvas.extend(std::iter::repeat_n(mask, 64));
    let len = canvas.len();
    let mut seq = m.model.new_sequence().unwrap();
    let rows: Vec<usize> = (prompt.len()..len).collect();
    let t = Tensor::from_vec(canvas.clone(), (1, len), m.model.device()).unwrap();
    let deciding = seq.forward(&t, 0..len, Rows::Positions(&rows)).unwrap();
    seq.commit(0..len).unwrap();
    // Decide the step's positions (every masked position takes its argmax).
    let top: Vec<u32> = deciding
        .get(0)
        .unwrap()
        .argmax(1)
        .unwrap()
        .to_vec1::<u32>()
        .unwrap();
    for (k, &pos) in rows.iter().enumerate() {
        canvas[pos] = top[k];
    }
    let t = Tensor::from_vec(canvas, (1, len), m.model.device()).unwrap();
    let picks = [rows[0], rows[5], rows[20]];
    let again = seq.rescore(&t, &picks).unwrap();
    for (k, &pos) in picks.iter().enumerate() {
        let i = rows.iter().position(|&r| r == pos).unwrap();
        let a: Vec<f32> = again.get(0).unwrap().get(k).unwrap().to_vec1().unwrap();
        let b: Vec<f32> = deciding.get(0).unwrap().get(i).unwrap().to_vec1().unwrap();
        let diff = a
            .iter()
            .zip(&b)
            .map(|(x, y)| (x - y).abs())
            .fold(0f32, f32::max);
        assert!(
            diff <= 1e-4,
            "position {pos}: the age-1 re-score moved by {diff}"
        );
    }
}
