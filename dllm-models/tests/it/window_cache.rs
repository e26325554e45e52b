//! The windowed forward, commits, refreshes and row selection agree with the full-canvas forward.

use candle_core::{DType, Device, Tensor};
use dllm_models::synthetic::{random_weights, tiny_dream, tiny_llada};
use dllm_models::weights::HfWeights;
use dllm_models::{DiffusionLm, DiffusionTransformer, OpMode, Rows, TransformerConfig};

fn model(cfg: TransformerConfig) -> DiffusionTransformer {
    let w = random_weights(&cfg, 7).unwrap();
    let src = HfWeights::from_tensors(w, cfg.arch, DType::F32, &Device::Cpu);
    DiffusionTransformer::new(cfg, &src, OpMode::Fused).unwrap()
}

fn canvas(len: usize, vocab: u32) -> Tensor {
    let ids: Vec<u32> = (0..len as u32).map(|i| (i * 37 + 11) % vocab).collect();
    Tensor::from_vec(ids, (1, len), &Device::Cpu).unwrap()
}

fn max_abs_diff(a: &Tensor, b: &Tensor) -> f32 {
    (a - b)
        .unwrap()
        .abs()
        .unwrap()
        .flatten_all()
        .unwrap()
        .max(0)
        .unwrap()
        .to_scalar::<f32>()
        .unwrap()
}

fn check_window_equals_full(cfg: TransformerConfig) {
    let mut m = model(cfg);
    let c = canvas(40, 250);
    let full = m.forward_full(&c, Rows::All).unwrap();
    assert_eq!(full.dims(), &[1, 40, 256]);
    // Prefix cache: commit [0, 16) from the full forward, then forward [16, 40) alone.
    m.commit(0..16).unwrap();
    assert_eq!(m.cache_len(), 16);
    let win = m.forward(&c, 16..40, Rows::All).unwrap();
    let d = max_abs_diff(&win, &full.narrow(1, 16, 24).unwrap());
    assert!(
        d < 1e-4,
        "prefix-cache window differs from full forward by {d}"
    );
    // Dual cache: cache everything, forward an inner window [16, 24).
    m.truncate_cache(0).unwrap();
    m.forward_full(&c, Rows::None).unwrap();
    m.commit(0..40).unwrap();
    let inner = m.forward(&c, 16..24, Rows::All).unwrap();
    let d = max_abs_diff(&inner, &full.narrow(1, 16, 8).unwrap());
    assert!(
        d < 1e-4,
        "dual-cache window differs from full forward by {d}"
    );
    // Selected rows, in the requested order.
    let sel = m.forward(&c, 16..24, Rows::Positions(&[23, 16])).unwrap();
    assert!(
        max_abs_diff(
            &sel.narrow(1, 0, 1).unwrap(),
            &full.narrow(1, 23, 1).unwrap()
        ) < 1e-4
    );
    assert!(
        max_abs_diff(
            &sel.narrow(1, 1, 1).unwrap(),
            &full.narrow(1, 16, 1).unwrap()
        ) < 1e-4
    );
    // Refreshing cached positions with unchanged ids reproduces the cached state and logits.
    let logits = m
        .refresh(&c, &[3, 9, 10, 30], Some(&[9, 30]))
        .unwrap()
        .unwrap();
    assert!(
        max_abs_diff(
            &logits.narrow(1, 0, 1).unwrap(),
            &full.narrow(1, 9, 1).unwrap()
        ) < 1e-4
    );
    assert!(
        max_abs_diff(
            &logits.narrow(1, 1, 1).unwrap(),
            &full.narrow(1, 30, 1).unwrap()
        ) < 1e-4
    );
    let again = m.forward(&c, 16..24, Rows::All).unwrap();
    assert!(max_abs_diff(&again, &inner) < 1e-4);
}

#[test]
fn llada_window_equals_full() {
    check_window_equals_full(tiny_llada());
}

#[test]
fn dream_window_equals_full() {
    check_window_equals_full(tiny_dream());
}

#[test]
fn bad_calls_are_errors() {
    let mut m = model(tiny_llada());
    let c = canvas(20, 250);
    assert!(m
        .forward(&c, 5..10, Rows::All)
        .unwrap_err()
        .to_string()
        .contains("cache covers only"));
    assert!(m.forward(&c, 0..30, Rows::All).is_err());
    assert!(m
        .commit(0..4)
        .unwrap_err()
        .to_string()
        .contains("without a preceding forward"));
    m.forward_full(&c, Rows::None).unwrap();
    assert!(m.commit(4..8).unwrap_err().to_string().contains("hole"));
    assert!(m.forward_full(&c, Rows::Positions(&[25])).is_err());
    assert!(m
        .refresh(&c, &[1], None)
        .unwrap_err()
        .to_string()
        .contains("not cached"));
    assert!(m.truncate_cache(3).is_err());
    let f = Tensor::zeros((1, 4), DType::F32, &Device::Cpu).unwrap();
    assert!(m
        .forward_full(&f, Rows::All)
        .unwrap_err()
        .to_string()
        .contains("u32"));
}
