//! The fused CPU RMSNorm (kernels-cpu's, eight rows' sums at a time) gives candle's `rms_norm`
//! bits, for row counts that leave every remainder and on pools of one to three threads.

use candle_core::{DType, Device, Tensor};
use dllm_models::layers::RmsNorm;
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
