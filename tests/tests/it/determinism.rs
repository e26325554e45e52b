//! Temperature-0 decoding must be bit-for-bit reproducible, so the forward must be: across loads,
//! across repeated calls on one model (no state leaking through the cache or rope tables), and
//! across CPU thread counts.
//!
//! Thread counts: candle 0.11 takes its CPU parallelism from the environment —
//! `RAYON_NUM_THREADS` (read on every matmul for gemm's parallelism, and by rayon's global pool,
//! which the flash-attention kernel uses) and `CANDLE_NUM_THREADS` (its barrier pool for quantized
//! matmuls, sized once per process). Installing a `rayon::ThreadPool` around a forward would not
//! change the gemm or barrier-pool settings, so the honest control is a child process per setting:
//! `llada-tests-logits` is run under 1 and 2 threads and its output bits compared.

use candle_core::quantized::GgmlDType;
use candle_core::DType;
use dllm_models::synthetic::{tiny_dream, tiny_llada};
use dllm_models::{DiffusionLm, Rows, TransformerConfig};
use llada_tests::fixtures::{canvas, ids, load_default, tiny_dir, write_model, TempDir};
use llada_tests::gguf_fixture::write_gguf;

fn bits(m: &mut dyn DiffusionLm, x: &[u32]) -> Vec<u32> {
    let t = m.forward_full(&canvas(x), Rows::All).unwrap();
    t.flatten_all()
        .unwrap()
        .to_vec1::<f32>()
        .unwrap()
        .iter()
        .map(|v| v.to_bits())
        .collect()
}

#[test]
fn two_loads_give_identical_bits() {
    for cfg in [tiny_llada(), tiny_dream()] {
        let dir = tiny_dir("det", &cfg, 4).unwrap();
        let x = ids(48, 250, cfg.special.mask, 10);
        let mut a = load_default(dir.path()).unwrap().model;
        let mut b = load_default(dir.path()).unwrap().model;
        let first = bits(&mut a, &x);
        assert_eq!(first, bits(&mut b, &x), "{:?}: two loads differ", cfg.arch);
        // Repeat on the same model, after a cache round trip and a longer canvas (which grows the
        // rope tables): nothing may leak into the next full forward.
        a.forward_full(&canvas(&x), Rows::None).unwrap();
        a.commit(0..20).unwrap();
        a.forward(&canvas(&x), 20..48, Rows::All).unwrap();
        a.clear_cache().unwrap();
        let long = ids(300, 250, cfg.special.mask, 11);
        a.forward_full(&canvas(&long), Rows::Positions(&[299]))
            .unwrap();
        assert_eq!(
            first,
            bits(&mut a, &x),
            "{:?}: repeated forward differs",
            cfg.arch
        );
    }
}

/// Big enough that gemm and the attention kernel actually split work across threads.
fn mid_size(base: TransformerConfig) -> TransformerConfig {
    TransformerConfig {
        hidden_size: 256,
        num_heads: 8,
        num_kv_heads: if base.num_kv_heads == base.num_heads {
            8
        } else {
            4
        },
        intermediate_size: 704,
        vocab_size: 2048,
        ..base
    }
}

fn run(path: &std::path::Path, x: &[u32], threads: usize) -> (Vec<u8>, usize) {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_llada-tests-logits"))
        .arg(path)
        .args(x.iter().map(|v| v.to_string()))
        .env("RAYON_NUM_THREADS", threads.to_string())
        .env("CANDLE_NUM_THREADS", threads.to_string())
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr).to_string();
    assert!(out.status.success(), "{err}");
    let n = err
        .lines()
        .find_map(|l| l.strip_prefix("Threads:"))
        .and_then(|v| v.trim().parse().ok())
        .expect("child reports its thread count");
    (out.stdout, n)
}

#[test]
fn one_and_two_threads_give_identical_bits() {
    for base in [tiny_llada(), tiny_dream()] {
        let cfg = mid_size(base);
        let dir = TempDir::new("threads").unwrap();
        write_model(dir.path(), &cfg, 2, DType::F32, 1).unwrap();
        let gguf = dir.join("model.gguf");
        write_gguf(dir.path(), &gguf, GgmlDType::Q4_0).unwrap();
        let x = ids(160, 2000, cfg.special.mask, 12);
        for path in [dir.path(), gguf.as_path()] {
            let (one, n1) = run(path, &x, 1);
            let (two, n2) = run(path, &x, 2);
            println!(
                "{:?} {}: {n1} OS threads with 1, {n2} with 2",
                cfg.arch,
                path.display()
            );
            assert!(
                n2 > n1,
                "the thread setting did not reach candle ({n1} vs {n2} OS threads)"
            );
            assert_eq!(one.split(|&b| b == b'\n').count(), x.len() + 1);
            assert!(
                one == two,
                "{:?} {}: logits differ between 1 and 2 threads",
                cfg.arch,
                path.display()
            );
        }
    }
}
