//! A bad call returns a typed error variant that names the offending value and its bound, so a
//! caller can tell what was wrong without parsing the message.

use std::ops::Range;

use candle_core::{DType, Device, Tensor};
use dllm_models::synthetic::{random_weights, tiny_llada};
use dllm_models::weights::HfWeights;
use dllm_models::{
    CanvasDefect, DiffusionLm, DiffusionTransformer, Error, OpMode, PositionDefect, Rows,
    WindowDefect,
};

fn model() -> DiffusionTransformer {
    let cfg = tiny_llada();
    let w = random_weights(&cfg, 7).unwrap();
    let src = HfWeights::from_tensors(w, cfg.arch, DType::F32, &Device::Cpu);
    DiffusionTransformer::new(cfg, &src, OpMode::Fused).unwrap()
}

fn canvas(ids: &[u32]) -> Tensor {
    Tensor::from_slice(ids, (1, ids.len()), &Device::Cpu).unwrap()
}

#[test]
fn window_requests_out_of_range_are_typed() {
    let mut m = model();
    let c = canvas(&[1, 2, 3, 4, 5, 6, 7, 8]);
    // A window past the end of the canvas.
    match m.forward(&c, 4..12, Rows::All) {
        Err(Error::InvalidWindow(WindowDefect::OutsideCanvas { window, canvas_len })) => {
            assert_eq!((window, canvas_len), (4..12, 8));
        }
        other => panic!("expected OutsideCanvas, got {other:?}"),
    }
    // A window that starts after the (empty) cache.
    match m.forward(&c, 3..8, Rows::All) {
        Err(Error::InvalidWindow(WindowDefect::PastCache { start, cache_len })) => {
            assert_eq!((start, cache_len), (3, 0));
        }
        other => panic!("expected PastCache, got {other:?}"),
    }
    // Logits asked for a row outside the window.
    let e = m.forward(&c, 0..4, Rows::Positions(&[7])).unwrap_err();
    let want: Range<usize> = 0..4;
    assert!(
        matches!(
            &e,
            Error::InvalidWindow(WindowDefect::RowOutsideWindow { position: 7, window }) if *window == want
        ),
        "{e:?}"
    );
    // A commit with no forward before it, then one outside the last window.
    let mut m = model();
    assert!(matches!(
        m.commit(0..4),
        Err(Error::InvalidWindow(WindowDefect::CommitWithoutForward))
    ));
    m.forward(&c, 0..4, Rows::None).unwrap();
    match m.commit(0..6) {
        Err(Error::InvalidWindow(WindowDefect::CommitOutsideWindow { range, window })) => {
            assert_eq!((range, window), (0..6, 0..4));
        }
        other => panic!("expected CommitOutsideWindow, got {other:?}"),
    }
    m.commit(0..4).unwrap();
    assert!(matches!(
        m.truncate_cache(9),
        Err(Error::InvalidWindow(WindowDefect::RollForward {
            from: 4,
            to: 9
        }))
    ));
}

#[test]
fn bad_canvases_and_positions_are_typed() {
    let mut m = model();
    let vocab = m.info().vocab_size;
    let bad = vocab as u32 + 3;
    match m.forward_full(&canvas(&[1, bad, 2]), Rows::All) {
        Err(Error::InvalidCanvas(CanvasDefect::TokenOutOfRange { token, rows })) => {
            assert_eq!(token, bad);
            assert!(rows >= vocab);
        }
        other => panic!("expected TokenOutOfRange, got {other:?}"),
    }
    let f = Tensor::zeros((1, 4), DType::F32, &Device::Cpu).unwrap();
    assert!(matches!(
        m.forward_full(&f, Rows::All),
        Err(Error::InvalidCanvas(CanvasDefect::Dtype {
            dtype: DType::F32
        }))
    ));
    // A refresh of a position the cache does not hold.
    let c = canvas(&[1, 2, 3, 4, 5, 6]);
    m.forward_full(&c, Rows::None).unwrap();
    m.commit(0..4).unwrap();
    match m.compute_refresh(&c, &[1, 5], None) {
        Err(Error::InvalidPositions(PositionDefect::NotCached {
            position,
            cache_len,
            ..
        })) => assert_eq!((position, cache_len), (5, 4)),
        other => panic!("expected NotCached, got {:?}", other.map(|_| ())),
    }
    // The message still names the position and the cached range.
    let e = m.compute_refresh(&c, &[5], None).map(|_| ()).unwrap_err();
    assert!(e.to_string().contains("position 5 is not cached"), "{e}");
    assert!(e.to_string().contains("[0, 4)"), "{e}");
}
