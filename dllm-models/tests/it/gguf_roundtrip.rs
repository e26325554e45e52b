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

/// The streaming writer of full-size random checkpoints, at a small depth: byte for byte the file
/// `write_gguf` writes from `random_weights` (same seed, same placeholder vocabulary), for LLaDA
/// (permuted q/k rows) and Dream (biases, GQA), in chunks smaller than a matrix (so rows cross
/// chunk boundaries), Q4_0 and Q8_0; the 8B-shaped and 7B-shaped configs at 2 layers write
/// files of the size the tensor list implies, which load.
#[test]
fn the_streaming_random_writer_writes_what_write_gguf_writes() {
    use dllm_models::gguf_write::{placeholder_vocab, write_random_gguf, RandomGguf};
    let dir = std::env::temp_dir().join(format!("rand-gguf-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    for (cfg, chunk) in [
        (tiny_llada(), 100),
        (tiny_dream(), 64 * 3),
        (tiny_llada(), 1 << 22),
    ] {
        let w = random_weights(&cfg, 9).unwrap();
        for dt in [GgmlDType::Q4_0, GgmlDType::Q8_0] {
            let vocab = placeholder_vocab(cfg.vocab_size);
            let want = dir.join(format!("want-{}-{dt:?}.gguf", cfg.arch));
            write_gguf(&want, &cfg, &w, dt, &vocab).unwrap();
            let got = dir.join(format!("got-{}-{dt:?}-{chunk}.gguf", cfg.arch));
            let how = RandomGguf {
                extra: vocab,
                chunk_values: chunk,
                ..RandomGguf::new(dt, 9)
            };
            let size = write_random_gguf(&got, &cfg, &how).unwrap();
            let (a, b) = (std::fs::read(&want).unwrap(), std::fs::read(&got).unwrap());
            assert_eq!(size, b.len() as u64);
            assert_eq!(a.len(), b.len(), "{} {dt:?} chunk {chunk}", cfg.arch);
            let first = a.iter().zip(&b).position(|(x, y)| x != y);
            assert_eq!(first, None, "{} {dt:?} chunk {chunk}", cfg.arch);
        }
    }
    for cfg in [
        dllm_models::synthetic::llada_8b(),
        dllm_models::synthetic::dream_7b(),
    ] {
        let cfg = dllm_models::TransformerConfig {
            num_layers: 1,
            vocab_size: 512,
            special: dllm_models::synthetic::tiny_llada().special,
            ..cfg
        };
        let path = dir.join(format!("shaped-{}.gguf", cfg.arch));
        let size = write_random_gguf(&path, &cfg, &RandomGguf::new(GgmlDType::Q4_0, 1)).unwrap();
        let params = cfg.param_count().unwrap();
        // Q4_0: 18 bytes per 32 weights, plus f32 vectors and the header.
        assert!(
            size > params * 18 / 32 && size < params * 18 / 32 + (1 << 20),
            "{size}"
        );
        let m = load(
            &ModelSource::parse(path.to_str().unwrap()).unwrap(),
            &LoadOptions::default(),
        )
        .unwrap();
        assert_eq!(m.model.config().num_layers, 1);
    }
    // A type the writer does not write is a named error.
    let err = write_random_gguf(
        &dir.join("bad.gguf"),
        &tiny_llada(),
        &RandomGguf::new(GgmlDType::Q6K, 0),
    )
    .unwrap_err();
    assert!(err.to_string().contains("Q6K"), "{err}");
    std::fs::remove_dir_all(&dir).ok();
}
