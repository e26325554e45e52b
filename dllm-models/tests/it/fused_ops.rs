//! The fused CPU ops that promise candle's bits keep them: the rotary embedding (kernels-cpu's,
//! vectorised) gives `rope_thd`'s for one batch and several, tables shared by the batch or one
//! per batch element; RMSNorm (kernels-cpu's, eight rows' sums at a time) gives `rms_norm`'s for
//! row counts that leave every remainder and on pools of one to three threads.

use candle_core::{DType, Device, Tensor};
use dllm_models::layers::{RmsNorm, Rope};
use dllm_models::OpMode;

fn bits(t: &Tensor) -> Vec<u32> {
    t.flatten_all()
        .unwrap()
        .to_vec1::<f32>()
        .unwrap()
        .iter()
        .map(|v| v.to_bits())
        .collect()
}

#[test]
fn fused_rope_is_candles_rope_thd_bit_for_bit() {
    let dev = Device::Cpu;
    let (heads, d) = (6, 64);
    let rope = Rope::new(10_000.0, d, 64, DType::F32, &dev).unwrap();
    for (b, t) in [(1, 160), (2, 37), (1, 1)] {
        let x = Tensor::randn(0f32, 1.0, (b, t, heads, d), &dev).unwrap();
        let (cos, sin) = rope.range(5, t).unwrap();
        let got = Rope::apply(&x, &cos, &sin, OpMode::Fused).unwrap();
        let want = candle_nn::rotary_emb::rope_thd(&x, &cos, &sin).unwrap();
        assert_eq!(bits(&got), bits(&want), "b {b} t {t}");
        // The training form computes the same rotation (its own rounding).
        let slow = Rope::apply(&x, &cos, &sin, OpMode::Differentiable).unwrap();
        let diff = (slow - &got)
            .unwrap()
            .abs()
            .unwrap()
            .max_all()
            .unwrap()
            .to_scalar::<f32>()
            .unwrap();
        assert!(diff < 1e-5, "b {b} t {t}: {diff}");
    }
    // Tables per batch element: (b, t, d / 2).
    let (b, t) = (2, 9);
    let x = Tensor::randn(0f32, 1.0, (b, t, heads, d), &dev).unwrap();
    let (c0, s0) = rope.range(0, t).unwrap();
    let (c1, s1) = rope.range(20, t).unwrap();
    let cos = Tensor::stack(&[&c0, &c1], 0).unwrap();
    let sin = Tensor::stack(&[&s0, &s1], 0).unwrap();
    let got = Rope::apply(&x, &cos, &sin, OpMode::Fused).unwrap();
    let want = candle_nn::rotary_emb::rope_thd(&x, &cos, &sin).unwrap();
    assert_eq!(bits(&got), bits(&want));
    // Tables of the wrong length are an error, not a silent rotation by other positions.
    let (short_c, short_s) = rope.range(0, t - 1).unwrap();
    assert!(Rope::apply(&x, &short_c, &short_s, OpMode::Fused).is_err());
}

#[test]
fn fused_rms_norm_is_candles_bit_for_bit() {
    let dev = Device::Cpu;
    let hidden = 96;
    let w = (Tensor::randn(0f32, 1.0, hidden, &dev).unwrap() + 1.0).unwrap();
    let norm = RmsNorm::new(w.clone(), 1e-5);
    for (b, t) in [(1, 160), (2, 37), (1, 1), (3, 400)] {
        let x = (Tensor::randn(0f32, 1.0, (b, t, hidden), &dev).unwrap() * 3.0).unwrap();
        let want = candle_nn::ops::rms_norm(&x, &w, 1e-5).unwrap();
        for threads in [1, 2, 3] {
            let pool = rayon::ThreadPoolBuilder::new()
                .num_threads(threads)
                .build()
                .unwrap();
            let got = pool.install(|| norm.forward(&x, OpMode::Fused)).unwrap();
            assert_eq!(bits(&got), bits(&want), "b {b} t {t}, {threads} threads");
        }
        // A view that is not contiguous is made so first; f16 goes to candle's op.
        let xt = x.transpose(0, 1).unwrap();
        let got = norm.forward(&xt, OpMode::Fused).unwrap();
        let want_t = candle_nn::ops::rms_norm(&xt.contiguous().unwrap(), &w, 1e-5).unwrap();
        assert_eq!(bits(&got), bits(&want_t));
    }
    let half = RmsNorm::new(w.to_dtype(DType::F16).unwrap(), 1e-5);
    let x16 = Tensor::randn(0f32, 1.0, (1, 5, hidden), &dev)
        .unwrap()
        .to_dtype(DType::F16)
        .unwrap();
    let got = half.forward(&x16, OpMode::Fused).unwrap();
    assert_eq!(got.dtype(), DType::F16);
}
