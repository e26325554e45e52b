//! The left trim (`MbsdParams::trim_left`), driven by hand on a scripted model with shifted
//! logits (Dream's family: a window that keeps the block, the threshold rule, the shown guess,
//! no bucket fit) under the default latency table (32-row buckets): a forward whose rows would
//! pass the bucket edge leaves decided positions with current K/V out of its window's left.

use dllm_decode::{Decide, DecodeParams, Decoder, Generation, MbsdParams, Strategy};
use dllm_models::{Answer, Ask, ModelInfo};

use candle_core::{DType, Device, Tensor};

use crate::scripted::{info, logits, row, MASK, PROMPT, VOCAB};

fn dream() -> ModelInfo {
    ModelInfo {
        shift_logits: true,
        ..info()
    }
}

fn start(trim_left: bool) -> Generation<'static> {
    let p = DecodeParams {
        gen_length: 32,
        block_length: 32,
        steps: 32,
        strategy: Strategy::Mbsd(MbsdParams {
            trim_left,
            ..Default::default()
        }),
        decide: Decide::Threshold(0.9),
        ..Default::default()
    };
    Decoder::new(p).start(&dream(), PROMPT).unwrap()
}

/// Generated position `i` on the canvas.
fn at(i: usize) -> usize {
    PROMPT.len() + i
}

/// Every row predicts token 1: positions `0..decided` at 0.99, the others at 0.5; every shadow
/// at 0.99 (a shown guess is confirmed).
fn answer(ask: &Ask, decided: usize) -> Answer {
    let main: Vec<Vec<f32>> = (ask.rows.iter())
        .map(|&p| row(1, if p < at(decided) { 0.99 } else { 0.5 }))
        .collect();
    let shadows: Vec<Vec<f32>> = ask.verify.iter().map(|_| row(1, 0.99)).collect();
    let t = |rows: &[Vec<f32>]| {
        if rows.is_empty() {
            Tensor::zeros((1, 0, VOCAB), DType::F32, &Device::Cpu).unwrap()
        } else {
            logits(rows)
        }
    };
    Answer {
        logits: t(&main),
        verify_logits: t(&shadows),
    }
}

/// The windows of the first three forwards, and the rows the third computes: the first decides
/// generated positions 0..4 and predicts 4 unsure, the second shows that prediction as a guess
/// and confirms it, the third shows a guess at position 5.
fn three_forwards(trim_left: bool, decided: usize) -> (Vec<std::ops::Range<usize>>, usize) {
    let mut g = start(trim_left);
    let mut windows = Vec::new();
    let mut rows = 0;
    for k in 0..3 {
        let ask = g.next().unwrap().unwrap();
        windows.push(ask.window.clone());
        rows = ask.rows_count(true);
        if k == 2 {
            assert_eq!(ask.canvas[0][at(decided + 1)], 1, "the guess is shown");
            assert_eq!(ask.canvas[0][at(decided + 2)], MASK);
        }
        g.absorb(answer(&ask, decided)).unwrap();
        // The trace records what the forward computed (what a latency projection prices).
        assert_eq!(g.progress().trace[k].computed, rows);
    }
    (windows, rows)
}

#[test]
fn a_window_that_keeps_the_block_leaves_decided_current_positions_out_to_fit_its_bucket() {
    let (w, rows) = three_forwards(true, 4);
    // Forward 1 is the whole canvas. Forward 2 keeps the block: the positions forward 1 decided
    // were computed as masks (their K/V are stale), so it recomputes them.
    assert_eq!(w[0].start, 0);
    assert_eq!(w[1], at(0)..at(32));
    // Forward 3: the block (32 positions), the row before it and the guess's two-row shadow are
    // 35 rows; three decided positions with current K/V leave the window's left instead.
    assert_eq!(w[2], at(3)..at(32));
    assert_eq!(rows, 32, "the forward fits the 32-row bucket");
    // Without the trim the window recomputes them and the forward passes the edge.
    let (w, rows) = three_forwards(false, 4);
    assert_eq!(w[2], at(0)..at(32));
    assert_eq!(rows, 35);
}

#[test]
fn the_trim_is_all_or_nothing_and_never_reaches_the_frontier() {
    // Two decided positions before the frontier: three rows over the edge cannot be left out,
    // and two of them buy nothing on a bucketed table.
    let (w, rows) = three_forwards(true, 1);
    assert_eq!(w[2], at(0)..at(32));
    assert_eq!(rows, 35);
}
