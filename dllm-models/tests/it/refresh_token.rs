//! A refresh belongs to one sequence of one model at one cache epoch (its `SequenceToken`), and
//! `apply_refresh` checks that and the refresh's contents before it writes anything: a rejected
//! refresh leaves the cache exactly as it was.

use std::sync::Arc;

use candle_core::{DType, Device, Tensor};
use dllm_models::recorder::LogitsRecorder;
use dllm_models::synthetic::{random_weights, tiny_dream, tiny_llada};
use dllm_models::weights::HfWeights;
use dllm_models::{
    DiffusionLm, DiffusionTransformer, Error, OpMode, Refresh, RefreshDefect, Rows,
    TransformerConfig, TransformerWeights,
};

fn weights(cfg: TransformerConfig, seed: u64) -> Arc<TransformerWeights> {
    let w = random_weights(&cfg, seed).unwrap();
    let src = HfWeights::from_tensors(w, cfg.arch, DType::F32, &Device::Cpu);
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

/// Every bit of the cache, its length and its epoch.
type State = (Vec<(Vec<u32>, Vec<u32>)>, usize, u64);

fn state(m: &DiffusionTransformer) -> State {
    let snap = m
        .cache_snapshot()
        .unwrap()
        .iter()
        .map(|(k, v)| (bits(k), bits(v)))
        .collect();
    (snap, m.cache_len(), m.epoch())
}

fn base() -> Vec<u32> {
    (0..64u32).map(|i| (i * 31 + 7) % 200).collect()
}

/// A sequence with `[0, 48)` of `base()` cached.
fn primed(w: &Arc<TransformerWeights>) -> DiffusionTransformer {
    let mut m = DiffusionTransformer::from_weights(w.clone()).unwrap();
    m.forward(&canvas(&base()), 0..48, Rows::None).unwrap();
    m.commit(0..48).unwrap();
    m
}

/// `base()` with some cached ids changed: a refresh against it really changes the cache.
fn revised() -> Tensor {
    let mut ids = base();
    for p in [3usize, 6, 9, 21, 42] {
        ids[p] = (ids[p] + 17) % 200;
    }
    canvas(&ids)
}

/// Applies `r` to `m`, expects an error, and checks the cache did not change.
fn rejected(m: &mut DiffusionTransformer, r: &Refresh) -> Error {
    let before = state(m);
    let e = m
        .apply_refresh(r)
        .expect_err("the refresh must be rejected");
    assert!(
        state(m) == before,
        "a rejected refresh changed the cache ({e})"
    );
    e
}

#[test]
fn the_snapshot_sees_a_merged_refresh() {
    // The control of every test below: a valid refresh changes what `state` reports.
    let w = weights(tiny_llada(), 11);
    let mut a = primed(&w);
    let r = a.compute_refresh(&revised(), &[3, 6, 9], None).unwrap();
    let before = state(&a);
    a.apply_refresh(&r).unwrap();
    let after = state(&a);
    assert_eq!(after.1, before.1);
    assert_eq!(after.2, before.2 + 1);
    assert!(after.0 != before.0, "the merge wrote nothing");
    assert_eq!(before.0.len(), tiny_llada().num_layers);
}

#[test]
fn a_refresh_from_another_sequence_is_rejected() {
    let w = weights(tiny_llada(), 11);
    // Two sequences of one model in the same state: same cache length, same epoch.
    let a = primed(&w);
    let mut b = primed(&w);
    assert_eq!(a.epoch(), b.epoch());
    assert_eq!(a.token().model, b.token().model);
    assert_ne!(a.token().sequence, b.token().sequence);
    let r = a.compute_refresh(&revised(), &[3, 6, 9], None).unwrap();
    assert_eq!(r.token, a.token());
    match rejected(&mut b, &r) {
        Error::RefreshFromOtherSequence { computed, current } => {
            assert_eq!(computed, a.token().sequence);
            assert_eq!(current, b.token().sequence);
        }
        e => panic!("expected RefreshFromOtherSequence, got {e:?}"),
    }
    // `new_sequence` gives a new id too.
    let mut c = a.new_sequence().unwrap();
    c.forward(&canvas(&base()), 0..48, Rows::None).unwrap();
    c.commit(0..48).unwrap();
    assert!(matches!(
        rejected(&mut c, &r),
        Error::RefreshFromOtherSequence { .. }
    ));
}

#[test]
fn a_refresh_from_another_model_is_rejected() {
    let (w1, w2) = (weights(tiny_llada(), 11), weights(tiny_llada(), 12));
    // Identical weights loaded twice are two models as well.
    let w3 = weights(tiny_llada(), 11);
    assert_ne!(w1.id(), w2.id());
    assert_ne!(w1.id(), w3.id());
    let a = primed(&w1);
    let r = a.compute_refresh(&revised(), &[3, 6, 9], None).unwrap();
    for w in [&w2, &w3] {
        let mut b = primed(w);
        match rejected(&mut b, &r) {
            Error::RefreshFromOtherModel { computed, current } => {
                assert_eq!(computed, w1.id());
                assert_eq!(current, w.id());
            }
            e => panic!("expected RefreshFromOtherModel, got {e:?}"),
        }
    }
}

#[test]
fn a_refresh_from_before_a_reset_is_rejected() {
    let w = weights(tiny_dream(), 5);
    let mut m = primed(&w);
    let r = m.compute_refresh(&revised(), &[3, 6, 9], None).unwrap();
    // Emptied and filled again to the same length: the positions are cached again, but by
    // another cache state.
    m.clear_cache().unwrap();
    assert_eq!(m.cache_len(), 0);
    m.forward(&canvas(&base()), 0..48, Rows::None).unwrap();
    m.commit(0..48).unwrap();
    assert_eq!(m.cache_len(), 48);
    match rejected(&mut m, &r) {
        Error::StaleRefresh { computed, current } => {
            assert_eq!(computed, r.token.epoch);
            assert!(current > computed);
        }
        e => panic!("expected StaleRefresh, got {e:?}"),
    }
    // Emptied and left empty: still stale (not "position not cached").
    let r = m.compute_refresh(&revised(), &[3], None).unwrap();
    m.truncate_cache(0).unwrap();
    assert!(matches!(rejected(&mut m, &r), Error::StaleRefresh { .. }));
}

fn defect(e: Error) -> RefreshDefect {
    match e {
        Error::MalformedRefresh(d) => d,
        e => panic!("expected MalformedRefresh, got {e:?}"),
    }
}

#[test]
fn a_refresh_with_more_rows_than_positions_is_rejected() {
    let w = weights(tiny_llada(), 11);
    let mut m = primed(&w);
    let c = revised();
    let three = m.compute_refresh(&c, &[3, 6, 9], None).unwrap();
    let wide: Vec<usize> = (0..22).collect();
    let twenty_two = m.compute_refresh(&c, &wide, None).unwrap();
    // 3 positions, 22 K/V rows in every layer.
    let mut r = three.clone();
    r.keys = twenty_two.keys.clone();
    r.values = twenty_two.values.clone();
    assert_eq!(
        defect(rejected(&mut m, &r)),
        RefreshDefect::RowCount {
            layer: 0,
            tensor: "keys",
            rows: 22,
            positions: 3
        }
    );
    // Only the last layer's values are wrong: nothing is written to the layers before it either.
    let last = tiny_llada().num_layers - 1;
    let mut r = three.clone();
    r.values[last] = twenty_two.values[last].clone();
    let e = rejected(&mut m, &r);
    let msg = e.to_string();
    assert_eq!(
        defect(e),
        RefreshDefect::RowCount {
            layer: last,
            tensor: "values",
            rows: 22,
            positions: 3
        }
    );
    assert!(msg.contains("22 rows for 3 positions"), "{msg}");
    // Fewer rows than positions.
    let mut r = twenty_two.clone();
    r.keys = three.keys.clone();
    assert!(matches!(
        defect(rejected(&mut m, &r)),
        RefreshDefect::RowCount {
            rows: 3,
            positions: 22,
            ..
        }
    ));
    // The refresh itself was fine.
    m.apply_refresh(&three).unwrap();
}

#[test]
fn unsorted_duplicate_and_uncached_positions_are_rejected() {
    let w = weights(tiny_llada(), 11);
    let mut m = primed(&w);
    let good = m.compute_refresh(&revised(), &[3, 6, 9], None).unwrap();
    let with = |positions: &[usize]| Refresh {
        positions: positions.to_vec(),
        ..good.clone()
    };
    assert_eq!(
        defect(rejected(&mut m, &with(&[9, 3, 6]))),
        RefreshDefect::UnsortedPositions {
            index: 1,
            position: 3,
            previous: 9
        }
    );
    assert_eq!(
        defect(rejected(&mut m, &with(&[3, 6, 6]))),
        RefreshDefect::DuplicatePosition {
            index: 2,
            position: 6
        }
    );
    assert_eq!(
        defect(rejected(&mut m, &with(&[3, 6, 48]))),
        RefreshDefect::PositionNotCached {
            position: 48,
            cache_len: 48
        }
    );
    // Layers missing, and a shape that is not the cache's.
    let mut r = good.clone();
    r.keys.pop();
    assert_eq!(
        defect(rejected(&mut m, &r)),
        RefreshDefect::LayerCount {
            tensor: "keys",
            got: tiny_llada().num_layers - 1,
            expected: tiny_llada().num_layers
        }
    );
    let mut r = good.clone();
    let hd = r.values[1].dim(3).unwrap();
    r.values[1] = r.values[1].narrow(3, 0, hd - 1).unwrap();
    assert!(matches!(
        defect(rejected(&mut m, &r)),
        RefreshDefect::Shape {
            layer: 1,
            tensor: "values",
            ..
        }
    ));
    m.apply_refresh(&good).unwrap();
}

#[test]
fn wrappers_reject_what_the_model_rejects() {
    let w = weights(tiny_llada(), 11);
    let a = primed(&w);
    let mut b = primed(&w);
    let b_token = b.token();
    let r = a.compute_refresh(&revised(), &[3, 6], None).unwrap();
    let before = state(&b);
    {
        let mut rec = LogitsRecorder::new(&mut b);
        assert_eq!(rec.token(), b_token);
        assert!(matches!(
            rec.apply_refresh(&r),
            Err(Error::RefreshFromOtherSequence { .. })
        ));
    }
    assert!(state(&b) == before);
}
