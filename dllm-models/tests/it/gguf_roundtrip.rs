//! `gguf_write::write_gguf` produces files the GGUF loader reads back to the same model
//! (exactly for F32; the independent llama.cpp-layout fixture lives in `llada-tests`).

use candle_core::quantized::GgmlDType;
use candle_core::{DType, Device, Tensor};
use dllm_models::gguf_write::write_gguf;
use dllm_models::synthetic::{random_weights, tiny_dream, tiny_llada};
use dllm_models::weights::HfWeights;
use dllm_models::{
    load, DiffusionLm, DiffusionTransformer, LoadOptions, ModelSource, OpMode, Rows,
};

#[test]
fn f32_round_trip_is_exact_and_q8_is_close() {
    for cfg in [tiny_llada(), tiny_dream()] {
        let w = random_weights(&cfg, 5).unwrap();
        let mut direct = DiffusionTransformer::new(
            cfg.clone(),
            &HfWeights::from_tensors(w.clone(), cfg.arch, DType::F32, &Device::Cpu),
            OpMode::Fused,
        )
        .unwrap();
        let ids: Vec<u32> = (0..24u32).map(|i| (i * 13 + 1) % 250).collect();
        let canvas = Tensor::from_vec(ids, (1, 24), &Device::Cpu).unwrap();
        let want = direct.forward_full(&canvas, Rows::All).unwrap();
        for (dt, tol) in [(GgmlDType::F32, 0.0f32), (GgmlDType::Q8_0, 0.05)] {
            let path = std::env::temp_dir().join(format!(
                "rt-{}-{dt:?}-{}.gguf",
                cfg.arch,
                std::process::id()
            ));
            write_gguf(&path, &cfg, &w, dt, &[]).unwrap();
            let mut m = load(
                &ModelSource::parse(path.to_str().unwrap()).unwrap(),
                &LoadOptions::default(),
            )
            .unwrap();
            // GGUF stores epsilon as f32, like llama.cpp's converter.
            let mut got_cfg = m.model.config().clone();
            assert!((got_cfg.rms_norm_eps - cfg.rms_norm_eps).abs() < 1e-9);
            got_cfg.rms_norm_eps = cfg.rms_norm_eps;
            assert_eq!(got_cfg, cfg);
            let got = m.model.forward_full(&canvas, Rows::All).unwrap();
            let d: f32 = (&got - &want)
                .unwrap()
                .abs()
                .unwrap()
                .flatten_all()
                .unwrap()
                .max(0)
                .unwrap()
                .to_scalar()
                .unwrap();
            let scale: f32 = want
                .abs()
                .unwrap()
                .flatten_all()
                .unwrap()
                .max(0)
                .unwrap()
                .to_scalar()
                .unwrap();
            assert!(
                d <= tol * scale,
                "{} {dt:?}: max diff {d} (scale {scale})",
                cfg.arch
            );
            let _ = std::fs::remove_file(&path);
        }
    }
}
