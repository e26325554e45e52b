//! GGUF files in llama.cpp's converter layout ([`llada_tests::gguf_fixture`]), loaded through
//! `ModelSource::parse(path)` + `load`, against the same weights loaded from safetensors.
//!
//! Metric: `rel = max |gguf - safetensors| / max |safetensors|` over the full canvas. Tolerances,
//! with the values measured on the tiny models (`--nocapture` prints them) in parentheses:
//! * F32: 1e-5 (0: bit-identical logits);
//! * F16: 2e-3 (5e-4) — weights rounded to 11 bits; argmax agreement >= 95% (100%);
//! * Q8_0: 3e-2 (1.4-1.5e-2) — weight quantization plus candle's `QMatMul`, which quantizes the
//!   activations to Q8_0; argmax agreement >= 90% (100%);
//! * Q4_0: 3e-1 (1.6-1.9e-1); argmax agreement >= 60% (80-85%).
//!
//! A second comparison isolates the activation quantization: the f64 reference run on the
//! *dequantized* stored weights — F32/F16 1e-5 (4e-7), Q8_0/Q4_0 2.5e-2 (1.1-1.4e-2).

use candle_core::quantized::GgmlDType;
use dllm_models::synthetic::{tiny_dream, tiny_llada};
use dllm_models::{Arch, DiffusionLm, ModelSource};
use llada_tests::fixtures::{
    argmax_agreement, full_logits, ids, load_default, rel_err, tiny_dir, TempDir,
};
use llada_tests::gguf_fixture::{llama_permute, write_gguf};
use llada_tests::reference::{RefConfig, Reference};

struct Case {
    ty: GgmlDType,
    /// vs the safetensors model.
    tol: f64,
    /// vs the reference on the dequantized stored weights.
    deq_tol: f64,
    /// Minimum fraction of positions whose argmax agrees with the safetensors model.
    min_argmax: f64,
}

const CASES: [Case; 4] = [
    Case {
        ty: GgmlDType::F32,
        tol: 1e-5,
        deq_tol: 1e-5,
        min_argmax: 1.0,
    },
    Case {
        ty: GgmlDType::F16,
        tol: 2e-3,
        deq_tol: 1e-5,
        min_argmax: 0.95,
    },
    Case {
        ty: GgmlDType::Q8_0,
        tol: 3e-2,
        deq_tol: 2.5e-2,
        min_argmax: 0.9,
    },
    Case {
        ty: GgmlDType::Q4_0,
        tol: 3e-1,
        deq_tol: 2.5e-2,
        min_argmax: 0.6,
    },
];

#[test]
fn permute_matches_the_converters_reshape() {
    // rows = 8, n_head = 2 (head_dim 4): reshape(2, 2, 2, cols).swapaxes(1, 2) interleaves the
    // two halves of each head: [0 1 | 2 3] -> [0 2 1 3].
    let w: Vec<f32> = (0..8).map(|r| r as f32).collect();
    assert_eq!(
        llama_permute(&w, 8, 1, 2),
        vec![0., 2., 1., 3., 4., 6., 5., 7.]
    );
    // One head of 8 rows, two columns: rows 0..4 go to even slots, rows 4..8 to odd ones.
    let w: Vec<f32> = (0..16).map(|i| i as f32).collect();
    let p = llama_permute(&w, 8, 2, 1);
    let rows: Vec<f32> = p.chunks(2).map(|r| r[0] / 2.0).collect();
    assert_eq!(rows, vec![0., 4., 1., 5., 2., 6., 3., 7.]);
}

#[test]
fn gguf_logits_match_safetensors() {
    for cfg in [tiny_llada(), tiny_dream()] {
        let dir = tiny_dir("gguf", &cfg, 21).unwrap();
        let rcfg = RefConfig::read(dir.path()).unwrap();
        let hf = load_default(dir.path()).unwrap();
        let mut hf_model = hf.model;
        let x = ids(40, 250, cfg.special.mask, 6);
        let want = full_logits(&mut hf_model, &x).unwrap();
        for case in &CASES {
            let out = TempDir::new("gguf-file").unwrap();
            let path = out.join("model.gguf");
            let fx = write_gguf(dir.path(), &path, case.ty).unwrap();
            let spec = path.to_str().unwrap();
            assert_eq!(
                ModelSource::parse(spec).unwrap(),
                ModelSource::Gguf(path.clone())
            );
            let mut m = load_default(&path)
                .unwrap_or_else(|e| panic!("{:?} {:?}: {e}", cfg.arch, case.ty))
                .model;
            // Metadata carried over the way llama.cpp writes it.
            let (gi, hi) = (m.info().clone(), hf_model.info().clone());
            assert_eq!(gi.arch, cfg.arch);
            assert_eq!(gi.shift_logits, cfg.arch == Arch::Dream);
            assert_eq!(
                (gi.num_heads, gi.num_kv_heads, gi.head_dim, gi.num_layers),
                (hi.num_heads, hi.num_kv_heads, hi.head_dim, hi.num_layers)
            );
            assert_eq!(
                (gi.vocab_size, gi.max_seq_len),
                (hi.vocab_size, hi.max_seq_len)
            );
            assert_eq!(gi.special.mask, hi.special.mask);
            assert_eq!(gi.special.eos, hi.special.eos);
            assert_eq!(gi.special.bos, hi.special.bos);

            let got = full_logits(&mut m, &x).unwrap();
            let e = rel_err(&got, &want);
            let agree = argmax_agreement(&got, &want);
            let reference = Reference::new(rcfg.clone(), fx.effective).unwrap();
            let e_deq = rel_err(&got, &reference.forward(&x).unwrap());
            println!(
                "{:?} {:?}: rel vs safetensors {e:.3e}, vs dequantized reference {e_deq:.3e}, argmax agreement {agree:.3}",
                cfg.arch, case.ty
            );
            assert!(
                e <= case.tol,
                "{:?} {:?}: rel {e:.3e} > {:.0e}",
                cfg.arch,
                case.ty,
                case.tol
            );
            assert!(
                e_deq <= case.deq_tol,
                "{:?} {:?}: rel vs dequantized reference {e_deq:.3e} > {:.0e}",
                cfg.arch,
                case.ty,
                case.deq_tol
            );
            assert!(
                agree >= case.min_argmax,
                "{:?} {:?}: argmax agreement {agree:.3} < {}",
                cfg.arch,
                case.ty,
                case.min_argmax
            );
        }
    }
}

#[test]
fn tied_head_and_minimal_metadata() {
    // No `output.weight` (tied head, as llama.cpp writes tied models) and none of the optional keys
    // (`vocab_size`, `head_count_kv`, BOS): the loader falls back to the embedding table's rows,
    // MHA and no BOS.
    use llada_tests::checkpoint::Checkpoint;
    use llada_tests::gguf_fixture::write_gguf_with;
    for mut cfg in [tiny_llada(), tiny_dream()] {
        cfg.tie_word_embeddings = true;
        if cfg.arch == Arch::Dream {
            cfg.num_kv_heads = cfg.num_heads; // head_count_kv will be dropped
        }
        let dir = tiny_dir("gguf-tied", &cfg, 23).unwrap();
        let rcfg = RefConfig::read(dir.path()).unwrap();
        assert!(rcfg.tied);
        let ck = Checkpoint::read_dir(dir.path()).unwrap();
        let x = ids(32, 250, cfg.special.mask, 9);
        let want = full_logits(&mut load_default(dir.path()).unwrap().model, &x).unwrap();
        for (ty, tol) in [(GgmlDType::F32, 1e-5), (GgmlDType::Q8_0, 3e-2)] {
            let path = dir.join("tied.gguf");
            write_gguf_with(&rcfg, &ck, &path, ty, |meta, tensors| {
                meta.retain(|(k, _)| {
                    !k.ends_with(".vocab_size")
                        && !k.ends_with(".attention.head_count_kv")
                        && k != "tokenizer.ggml.bos_token_id"
                });
                assert!(!tensors.iter().any(|(n, _)| n == "output.weight"));
            })
            .unwrap();
            let mut m = load_default(&path).unwrap().model;
            assert_eq!(m.info().vocab_size, 256);
            assert_eq!(m.info().num_kv_heads, m.info().num_heads);
            assert_eq!(m.info().special.bos, None);
            let e = rel_err(&full_logits(&mut m, &x).unwrap(), &want);
            println!("{:?} tied {ty:?}: rel {e:.3e}", cfg.arch);
            assert!(
                e <= tol,
                "{:?} tied {ty:?}: rel {e:.3e} > {tol:.0e}",
                cfg.arch
            );
        }
    }
}
