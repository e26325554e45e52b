//! The kernels-cpu GEMMs (the default CPU path: weights packed once at load) against the path
//! they replaced (candle's f32 gemm over compute-dtype tensors and `QMatMul` over GGUF blocks,
//! still selectable as `CpuLinears::Candle`): the same logits up to summation order, and the
//! same greedy tokens, on the shipped model (f16 safetensors, kept f16 by the packed path, and
//! GGUF Q8_0 / Q4_0 made from it) and on the synthetic GGUF fixtures (F32, F16, BF16, Q8_0, Q4_0).
//! The K-quants need 256-wide rows no shipped model has; on random 256-wide models they are held
//! to accuracy against the f64 reference and to candle's logits (see that test for why not to
//! tokens), alone and in the mixes llama-quantize writes.
//!
//! Logit tolerances: dense weights differ by summation order only (1e-5; measured 4-6e-7). With
//! quantized activations, an f32 difference of one ulp moves some activation across a rounding
//! boundary of the next layer's 8-bit quantization, so two correct implementations drift by up to
//! the activation quantization error itself: 3e-2, the level both paths sit at against the exact
//! product (`gguf.rs` measures 1.1e-2 vs the dequantized reference; measured here 5e-8 to 1e-2,
//! where each quantized tensor alone agrees to 4e-7). The tokens must not change.
//!
//! Also: the packed layouts are the ones the NPU backend builds (kernels-cpu's Q4_0 tiles and
//! fp16 HMX tiles are byte for byte candle-hexagon's).

use std::path::{Path, PathBuf};

use candle_core::quantized::{GgmlDType, QTensor};
use candle_core::{DType, Device, Tensor};
use dllm_decode::{generate, DecodeParams, Strategy};
use dllm_models::synthetic::{tiny_dream, tiny_llada};
use dllm_models::{CpuLinears, LoadOptions, TransformerConfig};
use dllm_tasks::eval::{evaluate, questions};
use dllm_tasks::TaskKind;
use llada_tests::checkpoint::Checkpoint;
use llada_tests::fixtures::{
    argmax_agreement, full_logits, ids, load_path, rel_err, write_model, TempDir,
};
use llada_tests::gguf_fixture::{write_gguf, write_gguf_with};
use llada_tests::reference::{RefConfig, Reference};

/// Packed vs candle logits with quantized activations (see the module docs).
const QUANT_TOL: f64 = 3e-2;

fn opts(which: CpuLinears) -> LoadOptions {
    LoadOptions {
        cpu_linears: which,
        ..Default::default()
    }
}

/// Greedy tokens of one generation.
fn tokens(path: &Path, which: CpuLinears, prompt: &[u32], p: &DecodeParams) -> Vec<u32> {
    let mut m = load_path(path, &opts(which)).unwrap().model;
    generate(&mut m, prompt, p, &mut ())
        .unwrap()
        .generated()
        .to_vec()
}

fn params(gen: usize) -> DecodeParams {
    DecodeParams {
        gen_length: gen,
        block_length: gen / 2,
        steps: gen,
        strategy: Strategy::Vanilla,
        ..Default::default()
    }
}

/// Packed vs candle on one checkpoint: logits within `tol`, identical greedy tokens.
fn compare(path: &Path, what: &str, vocab: u32, mask: u32, tol: f64) {
    let x = ids(48, vocab, mask, 3);
    let mut packed = load_path(path, &opts(CpuLinears::Packed)).unwrap().model;
    let mut candle = load_path(path, &opts(CpuLinears::Candle)).unwrap().model;
    let e = rel_err(
        &full_logits(&mut packed, &x).unwrap(),
        &full_logits(&mut candle, &x).unwrap(),
    );
    println!("{what}: packed vs candle logits rel {e:.2e}");
    assert!(
        e <= tol,
        "{what}: packed vs candle logits rel {e:.2e} > {tol:.0e}"
    );
    let prompt: Vec<u32> = ids(24, vocab, vocab, 8)
        .into_iter()
        .map(|t| t % (vocab - 3))
        .collect();
    let p = params(32);
    let a = tokens(path, CpuLinears::Packed, &prompt, &p);
    let b = tokens(path, CpuLinears::Candle, &prompt, &p);
    assert_eq!(a, b, "{what}: greedy tokens differ");
}

fn shipped(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../models")
        .join(name)
}

/// The shipped model's answers to a few held-out questions per task.
fn answers(path: &Path, tokenizer: &Path, which: CpuLinears) -> Vec<(String, usize)> {
    let m = load_path(
        path,
        &LoadOptions {
            tokenizer: Some(tokenizer.to_path_buf()),
            ..opts(which)
        },
    )
    .unwrap();
    let mut model = m.model;
    let tok = m.tokenizer.unwrap();
    let qs = questions(&TaskKind::ALL, Some(3));
    let p = DecodeParams {
        gen_length: 32,
        block_length: 32,
        steps: 32,
        ..Default::default()
    };
    evaluate(&mut model, tok.inner(), &qs, &p, |_, _, _| {})
        .unwrap()
        .1
        .into_iter()
        .map(|a| (a.response, a.forwards))
        .collect()
}

#[test]
fn shipped_model_answers_unchanged() {
    // The trained model is confident, so its greedy answers are a sharp test: the f16
    // checkpoint (kept f16 by the packed path, widened to f32 by candle's) and GGUF files made
    // from it.
    let dir = shipped("tiny-llada");
    let tok = dir.join("tokenizer.json");
    let cfg = dllm_models::source::read_config(&dir.join("config.json")).unwrap();
    let (v, mask) = (cfg.vocab_size as u32, cfg.special.mask);
    let tmp = TempDir::new("cpu-kernels-shipped").unwrap();
    let mut paths = vec![(dir.clone(), "f16 safetensors", 1e-5)];
    for ty in [GgmlDType::Q8_0, GgmlDType::Q4_0] {
        let path = tmp.join(&format!("{ty:?}.gguf"));
        write_gguf(&dir, &path, ty).unwrap();
        paths.push((
            path,
            if ty == GgmlDType::Q8_0 {
                "q8_0 gguf"
            } else {
                "q4_0 gguf"
            },
            QUANT_TOL,
        ));
    }
    for (path, what, tol) in paths {
        let a = answers(&path, &tok, CpuLinears::Packed);
        let b = answers(&path, &tok, CpuLinears::Candle);
        assert!(!a.is_empty());
        assert_eq!(a, b, "tiny-llada {what}: answers changed");
        compare(&path, &format!("tiny-llada {what}"), v, mask, tol);
    }
}

/// Write `dir`'s checkpoint as a GGUF with 2-D weights in `ty`, except the tensors `over`
/// re-quantizes (name suffix -> type), as llama-quantize's mixes do.
fn gguf(dir: &Path, ty: GgmlDType, over: &[(&str, GgmlDType)]) -> PathBuf {
    let path = dir.join(format!("{ty:?}-{}.gguf", over.len()));
    let cfg = RefConfig::read(dir).unwrap();
    let ck = Checkpoint::read_dir(dir).unwrap();
    write_gguf_with(&cfg, &ck, &path, ty, |_, tensors| {
        for (name, t) in tensors.iter_mut() {
            if let Some((_, to)) = over.iter().find(|(s, _)| name.ends_with(s)) {
                let w = t.dequantize(&Device::Cpu).unwrap();
                *t = QTensor::quantize(&w, *to).unwrap();
            }
        }
    })
    .unwrap();
    path
}

#[test]
fn synthetic_gguf_models_unchanged() {
    for cfg in [tiny_llada(), tiny_dream()] {
        let dir = TempDir::new("cpu-kernels").unwrap();
        write_model(dir.path(), &cfg, 5, DType::F32, 1).unwrap();
        let (v, mask) = (cfg.vocab_size as u32, cfg.special.mask);
        for (ty, tol) in [
            (GgmlDType::F32, 1e-5),
            (GgmlDType::F16, 1e-5),
            (GgmlDType::BF16, 1e-5),
            (GgmlDType::Q8_0, QUANT_TOL),
            (GgmlDType::Q4_0, QUANT_TOL),
        ] {
            let path = gguf(dir.path(), ty, &[]);
            compare(&path, &format!("{:?} {ty:?}", cfg.arch), v, mask, tol);
        }
        // Q4_0 body with a Q6_K head, as llama-quantize writes Q4_0 (the head's width, 64, is
        // not a Q6_K super-block here, so it stays Q8_0: the mix is exercised below).
        let path = gguf(
            dir.path(),
            GgmlDType::Q4_0,
            &[("output.weight", GgmlDType::Q8_0)],
        );
        compare(
            &path,
            &format!("{:?} Q4_0 + Q8_0 head", cfg.arch),
            v,
            mask,
            QUANT_TOL,
        );
    }
}

/// Widths that are whole K-quant super-blocks.
fn kquant_size(base: TransformerConfig) -> TransformerConfig {
    TransformerConfig {
        hidden_size: 256,
        num_heads: 4,
        num_kv_heads: if base.num_kv_heads == base.num_heads {
            4
        } else {
            2
        },
        intermediate_size: 512,
        vocab_size: 512,
        num_layers: 2,
        ..base
    }
}

#[test]
fn k_quant_gguf_models_match_candle_and_the_reference() {
    // Random weights make flat distributions whose near-ties flip with any change of summation
    // order once activations are quantized, so the K-quants (whose super-blocks need widths no
    // shipped model has) are held to accuracy instead of tokens: as close to the f64 reference
    // on the stored weights as candle's path is, close to candle's logits, and the same argmax
    // almost everywhere.
    for base in [tiny_llada(), tiny_dream()] {
        let cfg = kquant_size(base);
        let dir = TempDir::new("cpu-kernels-k").unwrap();
        write_model(dir.path(), &cfg, 6, DType::F32, 1).unwrap();
        let rcfg = RefConfig::read(dir.path()).unwrap();
        let x = ids(48, cfg.vocab_size as u32, cfg.special.mask, 3);
        for ty in [GgmlDType::Q4K, GgmlDType::Q6K] {
            let path = dir.join(&format!("{ty:?}.gguf"));
            let fx = write_gguf(dir.path(), &path, ty).unwrap();
            let want = Reference::new(rcfg.clone(), fx.effective)
                .unwrap()
                .forward(&x)
                .unwrap();
            let mut packed = load_path(&path, &opts(CpuLinears::Packed)).unwrap().model;
            let mut candle = load_path(&path, &opts(CpuLinears::Candle)).unwrap().model;
            let (p, c) = (
                full_logits(&mut packed, &x).unwrap(),
                full_logits(&mut candle, &x).unwrap(),
            );
            let (ep, ec, d) = (rel_err(&p, &want), rel_err(&c, &want), rel_err(&p, &c));
            let agree = argmax_agreement(&p, &c);
            println!(
                "{:?} {ty:?}: vs reference packed {ep:.2e} candle {ec:.2e}; packed vs candle {d:.2e}, argmax {agree:.3}",
                cfg.arch
            );
            assert!(
                ep <= 2.5e-2 && ep <= 1.5 * ec + 1e-3,
                "{:?} {ty:?}: {ep:.2e} vs reference",
                cfg.arch
            );
            assert!(
                d <= QUANT_TOL,
                "{:?} {ty:?}: packed vs candle {d:.2e}",
                cfg.arch
            );
            assert!(
                agree >= 0.9,
                "{:?} {ty:?}: argmax agreement {agree:.3}",
                cfg.arch
            );
        }
        // The mixes llama-quantize writes: Q4_K_M-like (Q6_K head and value projections) and
        // Q4_0 (Q6_K head).
        let mixes: [(GgmlDType, &[(&str, GgmlDType)]); 2] = [
            (
                GgmlDType::Q4K,
                &[
                    ("output.weight", GgmlDType::Q6K),
                    ("attn_v.weight", GgmlDType::Q6K),
                ],
            ),
            (GgmlDType::Q4_0, &[("output.weight", GgmlDType::Q6K)]),
        ];
        for (ty, over) in mixes {
            let path = gguf(dir.path(), ty, over);
            let mut packed = load_path(&path, &opts(CpuLinears::Packed)).unwrap().model;
            let mut candle = load_path(&path, &opts(CpuLinears::Candle)).unwrap().model;
            let (p, c) = (
                full_logits(&mut packed, &x).unwrap(),
                full_logits(&mut candle, &x).unwrap(),
            );
            let (d, agree) = (rel_err(&p, &c), argmax_agreement(&p, &c));
            println!(
                "{:?} {ty:?} mix: packed vs candle {d:.2e}, argmax {agree:.3}",
                cfg.arch
            );
            assert!(
                d <= QUANT_TOL && agree >= 0.9,
                "{:?} {ty:?} mix: {d:.2e}, {agree:.3}",
                cfg.arch
            );
        }
    }
}

#[test]
fn packed_layouts_are_the_npu_layouts() {
    let (n, k) = (70, 96);
    let w = Tensor::randn(0f32, 1.0, (n, k), &Device::Cpu).unwrap();
    let q = QTensor::quantize(&w, GgmlDType::Q4_0).unwrap();
    let blocks = q.data().unwrap();
    let ours =
        kernels_cpu::QuantMatrix::from_ggml(kernels_cpu::GgmlType::Q4_0, n, k, &blocks).unwrap();
    let npu = candle_hexagon::layout::pack_q4_0_tiles(&blocks, n, k).unwrap();
    assert_eq!(ours.view().bytes(), &npu[..], "Q4_0 tiles");
    let h: Vec<half::f16> = w
        .to_dtype(DType::F16)
        .unwrap()
        .flatten_all()
        .unwrap()
        .to_vec1()
        .unwrap();
    let ours = kernels_cpu::DenseMatrix::from_f16(&h, n, k).unwrap();
    let npu = candle_hexagon::layout::pack_f16_tiles(&h, n, k).unwrap();
    assert_eq!(ours.view().bytes(), &npu[..], "fp16 HMX tiles");
}
