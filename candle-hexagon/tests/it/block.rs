//! The block-level module (`HexTransformer` + `DeviceKv`) on the emulated DSP against an
//! independent f64 reference (tests/common/block_ref.rs) over random tiny checkpoints: windows
//! with and without a cached prefix, windows inside the cache (a key-exclusion range), windows
//! that straddle its end (commits that move rows, run as a model crate's cache protocol does
//! with the row store's moves: `common::commit_rows`), row selection, batch 2, GQA with biases,
//! Q4_0 weights, a CPU head. Every forward is one DSP batch per block.
//!
//! Tolerances: dense weights are compared with the reference on the same fp16 weights; what
//! remains is the kernels' fp16 rounding of matmul activations and of K/V (relative 2^-11 per
//! rounding), observed NMSE ~1e-7..1e-6 over a stack: asserted <= 1e-4. Q4_0 adds the Q8_0
//! quantization of activations in every matmul (conformance: <= 2e-4 per op): asserted <= 3e-3.

use crate::common;

use candle_core::{DType, Device, Tensor};
use candle_hexagon::{DeviceKv, HexTransformer, HexagonDevice, Placed};
use common::block_ref::{self, compare, values_of, Model, RefKv, Spec};
use common::*;

struct Run<'a> {
    dev: HexagonDevice,
    model: &'a Model,
    t: HexTransformer,
    kv: DeviceKv,
    rkv: RefKv,
    batch: usize,
    tol: f64,
    seed: u64,
    /// `(window start, first row)` of the last forward.
    window: (usize, usize),
}

impl<'a> Run<'a> {
    fn new(dev: &HexagonDevice, model: &'a Model, batch: usize, capacity: usize, tol: f64) -> Self {
        let t = match HexTransformer::new(dev, &model.config(256), &model.weights()).unwrap() {
            Placed::Npu(t) => t,
            Placed::Cpu(r) => panic!("block stack refused: {r}"),
        };
        let kv = t.new_kv(batch, capacity).unwrap();
        Run {
            dev: dev.clone(),
            model,
            t,
            kv,
            rkv: RefKv::new(model.spec.layers, batch),
            batch,
            tol,
            seed: 1,
            window: (0, 0),
        }
    }

    /// One forward of a random window `[ws, ws + n)`; compares with the reference.
    fn step(&mut self, ws: usize, n: usize, rows: Option<&[usize]>, dtype: DType) -> f64 {
        self.seed += 1;
        let h = self.model.spec.hidden;
        let x = tensor(&[self.batch, n, h], 777 + self.seed, 1.0, dtype);
        let before = self.dev.counters();
        let base = self.kv.len();
        let got = self.t.forward(&mut self.kv, &x, ws, rows).unwrap();
        self.window = (ws, base);
        let used = self.dev.counters().since(&before);
        let all: Vec<usize> = (0..n).collect();
        let want = block_ref::forward(
            self.model,
            &mut self.rkv,
            &values_of(&x),
            self.batch,
            ws,
            rows.unwrap_or(&all),
        );
        let (err, max) = compare(&got, &want);
        eprintln!(
            "window [{ws}, {}) rows {rows:?} over {} cached: NMSE {err:.2e}, max |err| {max:.2e}, \
             {} batches, {} B staged",
            ws + n,
            self.kv.len(),
            used.dsp_batches,
            used.bytes_staged()
        );
        assert!(err <= self.tol, "NMSE {err:.3e} exceeds {:.0e}", self.tol);
        assert_eq!(
            used.dsp_batches,
            self.t.num_blocks() as u64,
            "one batch per block per forward"
        );
        assert_eq!(
            self.kv.filled(),
            base + n,
            "the window's rows follow the cache"
        );
        assert_eq!(
            self.kv.len(),
            base,
            "a forward leaves the cached rows alone"
        );
        err
    }

    fn commit(&mut self, range: std::ops::Range<usize>) {
        commit_rows(&mut self.kv, self.window, range.clone()).unwrap();
        self.rkv.commit(range);
        assert_eq!(self.kv.len(), self.rkv.len());
        // The device cache holds the reference K/V to fp16 precision, row for row.
        for li in 0..self.model.spec.layers {
            let (k, v) = self.kv.read_rows(li, 0..self.kv.len()).unwrap();
            for (got, want) in [(k, &self.rkv.k[li]), (v, &self.rkv.v[li])] {
                let want: Vec<f64> = want.iter().flatten().flatten().copied().collect();
                let (err, _) = compare(&got, &want);
                // fp16 storage of K/V (and, for Q4_0, Q8_0 activations in the projections)
                let tol = if self.tol > 1e-4 { self.tol } else { 1e-5 };
                assert!(err < tol, "layer {li}: cached rows NMSE {err:.2e}");
            }
        }
    }
}

fn spec(layers: usize, kv_heads: usize, ffn: usize, bias: bool, dtype: DType) -> Spec {
    Spec {
        hidden: 64,
        heads: 4,
        kv_heads,
        head_dim: 16,
        ffn,
        vocab: 50,
        layers,
        bias,
        head: true,
        dtype,
        q4: false,
    }
}

#[test]
fn llada_like_windows_match_the_f64_reference() {
    let dev = emulated();
    let m = Model::random(&spec(2, 4, 96, false, DType::F32), 1);
    let mut r = Run::new(&dev, &m, 1, 64, 1e-4);
    r.step(0, 12, None, DType::F32); // empty cache, all rows
    r.commit(0..12);
    r.step(12, 8, Some(&[1, 5, 7, 5]), DType::F32); // prefix cache, selected rows (a repeat)
    r.commit(12..20);
    r.step(4, 6, None, DType::F16); // window inside the cache: cached [4, 10) skipped
    r.commit(4..10); // rows move from [20, 26) to [4, 10)
    r.step(18, 6, Some(&[0, 5]), DType::F32); // straddles the end: [18, 20) skipped
    r.commit(18..24); // overlapping move [20, 26) -> [18, 24)
    assert_eq!(r.kv.len(), 24);
    r.step(24, 3, Some(&[]), DType::F32); // no row asked for: K/V only
    r.commit(24..27);
    let s = r.kv.stats();
    assert_eq!(s.grows, 0);
    assert!(s.moved_bytes > 0);
}

#[test]
fn dream_like_gqa_with_biases_and_two_sequences() {
    let dev = emulated();
    let mut sp = spec(3, 2, 80, true, DType::F16);
    sp.vocab = 37;
    let m = Model::random(&sp, 2);
    let mut r = Run::new(&dev, &m, 2, 32, 1e-4);
    r.step(0, 9, None, DType::F16);
    r.commit(0..9);
    // A shifted model extends the window one position left of the cache end.
    r.step(8, 5, Some(&[1, 2, 3, 4]), DType::F16);
    r.commit(8..13);
    r.step(13, 4, None, DType::BF16);
    r.commit(13..15); // part of the window; the rest stays pending
    r.commit(15..17); // ... committed later
    assert_eq!(r.kv.len(), 17);
}

#[test]
fn q4_0_weights_match_the_dequantized_reference() {
    let dev = emulated();
    let mut sp = spec(2, 2, 64, true, DType::F32);
    sp.q4 = true;
    sp.vocab = 40;
    let m = Model::random(&sp, 3);
    let mut r = Run::new(&dev, &m, 1, 32, 3e-3);
    r.step(0, 10, None, DType::F32);
    r.commit(0..10);
    r.step(10, 6, Some(&[0, 3]), DType::F32);
}

#[test]
fn without_a_head_the_normalised_hidden_rows_come_back() {
    let dev = emulated();
    let mut sp = spec(1, 4, 64, false, DType::BF16);
    sp.head = false;
    let m = Model::random(&sp, 4);
    let mut r = Run::new(&dev, &m, 1, 16, 1e-4);
    assert_eq!(r.t.output(), candle_hexagon::ForwardOutput::Complete);
    r.step(0, 7, Some(&[6, 0]), DType::BF16);
}

#[test]
fn the_cache_grows_on_demand_and_bad_requests_are_named_errors() {
    let dev = emulated();
    let m = Model::random(&spec(2, 2, 64, false, DType::F32), 5);
    let mut r = Run::new(&dev, &m, 1, 4, 1e-4);
    r.step(0, 10, None, DType::F32); // 10 rows into a capacity of 4
    r.commit(0..10);
    let s = r.kv.stats();
    assert_eq!(s.grows, 1);
    assert!(r.kv.capacity() >= 10);
    r.step(10, 4, None, DType::F32); // and the grown cache keeps working
    r.commit(10..14);

    let x = |n: usize, h: usize| Tensor::zeros((1, n, h), DType::F32, &Device::Cpu).unwrap();
    let t = r.t.clone();
    let kv = &mut r.kv;
    let cases: Vec<(&str, candle_hexagon::Result<Tensor>)> = vec![
        ("starts at 20", t.forward(kv, &x(2, 64), 20, None)),
        (
            "[1, 2, 63] is not (batch >= 1, rows >= 1, 64)",
            t.forward(kv, &x(2, 63), 0, None),
        ),
        ("row 2 requested", t.forward(kv, &x(2, 64), 0, Some(&[2]))),
        (
            "exceeds the 256 positions",
            t.forward(kv, &x(4, 64), 254, None),
        ),
        (
            "batch 2 does not match",
            t.forward(
                kv,
                &Tensor::zeros((2, 3, 64), DType::F32, &Device::Cpu).unwrap(),
                0,
                None,
            ),
        ),
        (
            "input dtype U32",
            t.forward(
                kv,
                &Tensor::zeros((1, 3, 64), DType::U32, &Device::Cpu).unwrap(),
                0,
                None,
            ),
        ),
    ];
    for (want, got) in cases {
        let e = got.unwrap_err().to_string();
        assert!(e.contains(want), "expected `{want}` in: {e}");
    }
    assert_eq!(kv.len(), 14, "failed forwards leave the cache alone");
    // The errors are structured: the variant carries the facts the message names.
    use candle_hexagon::{CacheProblem, InputProblem};
    let u32_input = Tensor::zeros((1, 3, 64), DType::U32, &Device::Cpu).unwrap();
    let e = t.forward(kv, &u32_input, 0, None).unwrap_err();
    assert!(
        matches!(
            e.input_problem(),
            Some(InputProblem::DType {
                found: DType::U32,
                expected,
                ..
            }) if expected.contains(&DType::F16)
        ),
        "{e:?}"
    );
    assert_eq!(kv.filled(), 14, "failed forwards write no rows");
    let e = kv.move_rows(20, 3, 1).unwrap_err();
    assert!(
        matches!(
            e.input_problem(),
            Some(InputProblem::Cache(CacheProblem::Move { src, dst: 3, filled: 14 }))
                if *src == (20..21)
        ),
        "{e:?}"
    );
    let e = e.to_string();
    assert!(e.contains("move of rows 20..21 to 3"), "{e}");
    let e = kv.set_len(15).unwrap_err().to_string();
    assert!(e.contains("only [0, 14) hold K/V"), "{e}");
    let e = kv.truncate(15).unwrap_err().to_string();
    assert!(e.contains("cannot roll"), "{e}");
    kv.truncate(6).unwrap();
    assert_eq!((kv.len(), kv.filled()), (6, 6));
    let e = kv.move_rows(6, 6, 1).unwrap_err().to_string();
    assert!(e.contains("the filled [0, 6)"), "{e}");
}

#[test]
fn window_sizes_of_one_32_row_bucket_share_one_plan() {
    // A decoder's window changes size every step (mbsd: stale rows + the block's undecided
    // positions + lookahead): each size must not re-plan. Every forward is still checked against
    // the reference, so a layout sized for the bucket but wrong for a smaller window would fail.
    let dev = emulated();
    let m = Model::random(&spec(2, 4, 96, false, DType::F32), 6);
    let mut r = Run::new(&dev, &m, 1, 96, 1e-4);
    let before = dev.counters();
    r.step(0, 20, None, DType::F32);
    r.commit(0..20);
    for n in [1, 5, 17, 31, 32] {
        r.step(20, n, None, DType::F32); // bucket (1, 32, all rows)
    }
    for n in [33, 40, 64] {
        r.step(20, n, None, DType::F32); // bucket (1, 64, all rows)
    }
    r.step(20, 9, Some(&[0, 3, 8]), DType::F32); // bucket (1, 32, 32 selected)
    r.step(20, 30, Some(&[29]), DType::F32); // the same
    r.step(20, 50, Some(&[1, 49]), DType::F32); // bucket (1, 64, 32 selected)
    let used = dev.counters().since(&before);
    assert_eq!(used.shape_plans_built, 4, "one plan per bucket: {used:?}");
    assert_eq!(r.t.shape_plans_held(), 4);
}
