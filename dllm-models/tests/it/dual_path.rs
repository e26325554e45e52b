//! The execution model: shared weights, per-sequence state, a refresh beside a forward, epochs.

use std::sync::Arc;

use candle_core::{DType, Device, Tensor};
use dllm_models::synthetic::{random_weights, tiny_dream, tiny_llada};
use dllm_models::weights::HfWeights;
use dllm_models::{
    DiffusionLm, DiffusionTransformer, Error, OpMode, RefreshRequest, Rows, TransformerConfig,
    TransformerWeights,
};

fn weights(cfg: TransformerConfig, dtype: DType) -> Arc<TransformerWeights> {
    let w = random_weights(&cfg, 11).unwrap();
    let src = HfWeights::from_tensors(w, cfg.arch, dtype, &Device::Cpu);
    Arc::new(TransformerWeights::new(cfg, &src, OpMode::Fused, &Default::default()).unwrap())
}

fn canvas(ids: &[u32]) -> Tensor {
    Tensor::from_slice(ids, (1, ids.len()), &Device::Cpu).unwrap()
}

fn bits(t: &Tensor) -> Vec<u32> {
    t.to_dtype(DType::F32)
        .unwrap()
        .flatten_all()
        .unwrap()
        .to_vec1::<f32>()
        .unwrap()
        .into_iter()
        .map(f32::to_bits)
        .collect()
}

/// A sequence with `[0, 48)` cached, then some cached ids changed (the revision a refresh repairs).
fn primed(w: &Arc<TransformerWeights>, ids: &mut [u32]) -> DiffusionTransformer {
    let mut m = DiffusionTransformer::from_weights(w.clone()).unwrap();
    m.forward(&canvas(ids), 0..48, Rows::None).unwrap();
    m.commit(0..48).unwrap();
    for p in [6usize, 21, 42] {
        ids[p] = (ids[p] + 17) % 200;
    }
    m
}

fn dual_path_equals_sequential(cfg: TransformerConfig, dtype: DType) {
    // Wide enough that each path takes milliseconds (so the overlap is not a scheduling accident).
    let cfg = TransformerConfig {
        hidden_size: 256,
        intermediate_size: 768,
        num_layers: 4,
        ..cfg
    };
    let w = weights(cfg, dtype);
    let base: Vec<u32> = (0..64u32).map(|i| (i * 31 + 7) % 200).collect();
    let refresh: Vec<usize> = (0..48).filter(|p| p % 3 == 0).collect();
    let want_logits = [6usize, 21, 42];
    let rows: Vec<usize> = (48..64).collect();

    // Sequential: compute the refresh, forward the window, merge, commit, forward again.
    let mut ids = base.clone();
    let mut a = primed(&w, &mut ids);
    let c = canvas(&ids);
    let ra = a.compute_refresh(&c, &refresh, Some(&want_logits)).unwrap();
    let la = a.forward(&c, 48..64, Rows::Positions(&rows)).unwrap();
    a.apply_refresh(&ra).unwrap();
    a.commit(48..56).unwrap();
    let next_a = a.forward(&c, 56..64, Rows::All).unwrap();

    // Dual path on a second sequence sharing the same weights: the refresh runs on its own thread.
    let mut ids = base.clone();
    let mut b = primed(&w, &mut ids);
    let (lb, rb) = b
        .forward_with_refresh(
            &c,
            48..64,
            Rows::Positions(&rows),
            RefreshRequest {
                positions: &refresh,
                logits: Some(&want_logits),
                score_masked: false,
            },
        )
        .unwrap();
    // The timing is recorded for both paths. How much they overlap depends on the scheduler (on a
    // loaded 2-core machine the refresh thread may start only after the forward), so it is
    // reported by the benchmarks (`refresh_ms`, `merge_wait_ms`), not asserted here; what must
    // hold whatever the timing is that the result equals the sequential one, checked below, and
    // that the window forward ran on this thread and the refresh on another.
    b.last_dual_path()
        .expect("forward_with_refresh records the timing of both paths");
    let (forward_thread, refresh_thread) = b
        .last_dual_path_threads()
        .expect("forward_with_refresh records the threads of both paths");
    assert_eq!(forward_thread, std::thread::current().id());
    assert_ne!(
        refresh_thread, forward_thread,
        "the refresh ran on its own thread"
    );
    b.apply_refresh(&rb).unwrap();
    b.commit(48..56).unwrap();
    let next_b = b.forward(&c, 56..64, Rows::All).unwrap();

    assert_eq!(bits(&la), bits(&lb), "window logits");
    assert_eq!(ra.positions, rb.positions);
    // Same model and epoch; each refresh belongs to its own sequence.
    assert_eq!(
        (ra.token.model, ra.token.epoch),
        (rb.token.model, rb.token.epoch)
    );
    assert_eq!(ra.token.sequence, a.token().sequence);
    assert_eq!(rb.token.sequence, b.token().sequence);
    for l in 0..ra.keys.len() {
        assert_eq!(
            bits(&ra.keys[l]),
            bits(&rb.keys[l]),
            "refreshed keys, layer {l}"
        );
        assert_eq!(
            bits(&ra.values[l]),
            bits(&rb.values[l]),
            "refreshed values, layer {l}"
        );
    }
    assert_eq!(
        bits(ra.logits.as_ref().unwrap()),
        bits(rb.logits.as_ref().unwrap()),
        "refresh logits"
    );
    assert_eq!(bits(&next_a), bits(&next_b), "the forward after the merge");
    assert_eq!(a.epoch(), b.epoch());

    // The refresh really changed the cache: without it the next forward differs.
    let mut ids2 = base.clone();
    let mut no = primed(&w, &mut ids2);
    no.forward(&c, 48..64, Rows::None).unwrap();
    no.commit(48..56).unwrap();
    let next_no = no.forward(&c, 56..64, Rows::All).unwrap();
    assert_ne!(bits(&next_no), bits(&next_a), "the refresh had no effect");
}

#[test]
fn refresh_beside_forward_is_bit_identical_to_sequential_llada_f32() {
    dual_path_equals_sequential(tiny_llada(), DType::F32);
}

#[test]
fn refresh_beside_forward_is_bit_identical_to_sequential_dream_f16() {
    dual_path_equals_sequential(tiny_dream(), DType::F16);
}

#[test]
fn stale_refresh_is_rejected() {
    let w = weights(tiny_llada(), DType::F32);
    let mut ids: Vec<u32> = (0..64u32).map(|i| i % 200).collect();
    let mut m = primed(&w, &mut ids);
    let c = canvas(&ids);
    let r = m.compute_refresh(&c, &[3, 6], None).unwrap();
    assert_eq!(r.token, m.token());
    // The cache changes (a commit) before the merge: the refresh is stale.
    m.forward(&c, 48..56, Rows::None).unwrap();
    m.commit(48..56).unwrap();
    match m.apply_refresh(&r) {
        Err(Error::StaleRefresh { computed, current }) => {
            assert_eq!(computed, r.token.epoch);
            assert_eq!(current, m.epoch());
            assert!(current > computed);
        }
        other => panic!("expected a stale-refresh error, got {other:?}"),
    }
    // A forward alone does not change the cache, so a refresh stays valid across it.
    let r = m.compute_refresh(&c, &[3, 4], None).unwrap();
    m.forward(&c, 56..64, Rows::All).unwrap();
    m.apply_refresh(&r).unwrap();
    // Truncation bumps the epoch too.
    let r = m.compute_refresh(&c, &[3], None).unwrap();
    m.truncate_cache(50).unwrap();
    assert!(matches!(
        m.apply_refresh(&r),
        Err(Error::StaleRefresh { .. })
    ));
}

#[test]
fn sequences_share_weights_and_keep_their_own_caches() {
    let w = weights(tiny_llada(), DType::F32);
    let ids: Vec<u32> = (0..32u32).map(|i| (i * 13 + 1) % 200).collect();
    let c = canvas(&ids);
    let mut a = DiffusionTransformer::from_weights(w.clone()).unwrap();
    let mut b = a.new_sequence().unwrap();
    assert!(Arc::ptr_eq(a.weights(), b.weights()));
    a.forward_full(&c, Rows::None).unwrap();
    a.commit(0..16).unwrap();
    assert_eq!((a.cache_len(), b.cache_len()), (16, 0));
    // Two sequences on two threads at once.
    let (la, lb) = std::thread::scope(|s| {
        let ha = s.spawn(|| a.forward(&c, 16..32, Rows::All).unwrap());
        let hb = s.spawn(|| b.forward_full(&c, Rows::All).unwrap());
        (ha.join().unwrap(), hb.join().unwrap())
    });
    let d = (la - lb.narrow(1, 16, 16).unwrap())
        .unwrap()
        .abs()
        .unwrap()
        .flatten_all()
        .unwrap()
        .max(0)
        .unwrap()
        .to_scalar::<f32>()
        .unwrap();
    assert!(d < 1e-4, "{d}");
    fn send_sync<T: Send + Sync>() {}
    send_sync::<TransformerWeights>();
}

#[test]
fn commits_in_place_and_moved() {
    let w = weights(tiny_llada(), DType::F32);
    let ids: Vec<u32> = (0..40u32).map(|i| (i * 7 + 3) % 200).collect();
    let c = canvas(&ids);
    let mut full = DiffusionTransformer::from_weights(w.clone()).unwrap();
    let want = full.forward_full(&c, Rows::All).unwrap();
    let close = |a: &Tensor, b: &Tensor| {
        let d = (a - b)
            .unwrap()
            .abs()
            .unwrap()
            .flatten_all()
            .unwrap()
            .max(0)
            .unwrap();
        d.to_scalar::<f32>().unwrap() < 1e-4
    };
    // Dual cache: everything cached, then an inner window is forwarded and committed (a move).
    let mut m = DiffusionTransformer::from_weights(w.clone()).unwrap();
    m.forward_full(&c, Rows::None).unwrap();
    m.commit(0..40).unwrap();
    m.forward(&c, 8..16, Rows::None).unwrap();
    m.commit(8..16).unwrap();
    let l = m.forward(&c, 24..32, Rows::All).unwrap();
    assert!(close(&l, &want.narrow(1, 24, 8).unwrap()));
    // A window that starts inside the cache: pending rows sit after the cache and commits move them.
    let mut m = DiffusionTransformer::from_weights(w).unwrap();
    m.forward_full(&c, Rows::None).unwrap();
    m.commit(0..20).unwrap();
    m.forward(&c, 10..40, Rows::None).unwrap(); // positions 10..40 pending in rows [20, 50)
    m.commit(15..25).unwrap(); // rows [25, 35) -> [15, 25): overwrites the pending rows of 10..15
    let e = m.commit(10..15).unwrap_err().to_string();
    assert!(e.contains("without a preceding forward"), "{e}");
    // Moves that do not overwrite other pending rows keep the window committable.
    m.forward(&c, 25..40, Rows::None).unwrap(); // rows [25, 40): in place
    m.commit(25..30).unwrap();
    m.commit(30..40).unwrap();
    assert_eq!(m.cache_len(), 40);
    let l = m.forward(&c, 32..40, Rows::All).unwrap();
    assert!(close(&l, &want.narrow(1, 32, 8).unwrap()));
}

/// The logits of `pos`, each scored by its own masked refresh (the definition of a re-score).
fn one_at_a_time(m: &DiffusionTransformer, ids: &[u32], pos: &[usize]) -> Vec<f32> {
    let mask = m.info().special.mask;
    let mut out = Vec::new();
    for &p in pos {
        let mut masked = ids.to_vec();
        masked[p] = mask;
        let r = m
            .compute_refresh(&canvas(&masked), &[p], Some(&[p]))
            .unwrap();
        out.extend(
            r.logits
                .unwrap()
                .flatten_all()
                .unwrap()
                .to_vec1::<f32>()
                .unwrap(),
        );
    }
    out
}

#[test]
fn masked_scoring_refresh_scores_each_position_alone_and_keeps_real_kv() {
    for cfg in [tiny_llada(), tiny_dream()] {
        let name = format!("{:?}", cfg.arch);
        let w = weights(cfg, DType::F32);
        let mut ids: Vec<u32> = (0..64u32).map(|i| (i * 5 + 2) % 200).collect();
        let mut m = primed(&w, &mut ids);
        let c = canvas(&ids);
        // 20 and 21 are neighbours: scored jointly, each would be predicted without the other.
        let (pos, kv_pos) = ([5usize, 20, 21, 41], [7usize, 30]);
        let (_, r) = m
            .forward_with_refresh(
                &c,
                48..64,
                Rows::None,
                RefreshRequest {
                    positions: &kv_pos,
                    logits: Some(&pos),
                    score_masked: true,
                },
            )
            .unwrap();
        assert_eq!(r.scored, pos);
        let got: Vec<f32> = r
            .logits
            .as_ref()
            .unwrap()
            .flatten_all()
            .unwrap()
            .to_vec1()
            .unwrap();
        let want = one_at_a_time(&m, &ids, &pos);
        let err = got
            .iter()
            .zip(&want)
            .map(|(a, b)| (a - b).abs())
            .fold(0f32, f32::max);
        assert!(
            err < 1e-4,
            "{name}: one pass vs one refresh per position: max error {err}"
        );
        // The K/V come from the real tokens of the K/V positions.
        let want_kv = m.compute_refresh(&c, &kv_pos, None).unwrap();
        assert_eq!(r.positions, kv_pos);
        for l in 0..r.keys.len() {
            assert_eq!(bits(&r.keys[l]), bits(&want_kv.keys[l]), "{name}");
            assert_eq!(bits(&r.values[l]), bits(&want_kv.values[l]), "{name}");
        }
        // Masking all scored positions jointly predicts something else.
        let mask = m.info().special.mask;
        let mut joint = ids.clone();
        pos.iter().for_each(|&p| joint[p] = mask);
        let j = m
            .compute_refresh(&canvas(&joint), &pos, Some(&pos))
            .unwrap();
        let jv: Vec<f32> = j.logits.unwrap().flatten_all().unwrap().to_vec1().unwrap();
        let diff = jv
            .iter()
            .zip(&want)
            .map(|(a, b)| (a - b).abs())
            .fold(0f32, f32::max);
        assert!(diff > 1e-3, "{name}: joint masking should differ ({diff})");
        // A request that only re-scores recomputes no K/V and merges as a no-op.
        let e0 = m.epoch();
        let (_, r) = m
            .forward_with_refresh(
                &c,
                48..64,
                Rows::None,
                RefreshRequest {
                    positions: &[],
                    logits: Some(&pos),
                    score_masked: true,
                },
            )
            .unwrap();
        assert!(r.positions.is_empty() && r.keys.is_empty());
        m.apply_refresh(&r).unwrap();
        assert_eq!(m.epoch(), e0);
        // Repeated or uncached positions are errors naming them.
        let e = m.rescore(&c, &[5, 5]).unwrap_err().to_string();
        assert!(e.contains("repeat"), "{e}");
        let e = m.rescore(&c, &[60]).unwrap_err().to_string();
        assert!(e.contains("60"), "{e}");
    }
}
