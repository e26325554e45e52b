//! The fp16 rounding of the NPU path, measured: `candle_hexagon::nn` layers on the emulated DSP
//! vs the f32 CPU layers (candle-nn) on random inputs, printed as a table (the numbers in the
//! crate README come from this test:
//! `cargo test --release -p candle-hexagon --test it fp16_error -- --nocapture`).
//!
//! Linear layers round weights and activations to fp16 (relative 2^-11 ≈ 4.9e-4 per value) and
//! accumulate in f32; attention rounds K and V to fp16; RMSNorm is f32 throughout. The asserts
//! bound the relative L2 error by 2e-3 (a few fp16 ulps: anything beyond is a bug, not rounding)
//! and check it is non-zero for the fp16 ops (the rounding is real, the path is not the CPU one).

use crate::common;

use std::io::Write;

use candle_core::{DType, Module, Tensor};
use candle_hexagon::nn::{self, AttnOptions};
use candle_hexagon::ops::attention;
use candle_hexagon::OpKind;
use common::*;

struct Errors {
    max_abs: f64,
    mean_abs: f64,
    max_rel: f64,
    rel_l2: f64,
}

/// `max_rel` is the largest difference relative to the largest reference magnitude (element-wise
/// relative error is meaningless near zero outputs).
fn errors(got: &Tensor, want: &Tensor) -> Errors {
    let (g, w) = (values(got), values(want));
    let diff: Vec<f64> = g.iter().zip(&w).map(|(a, b)| (a - b).abs()).collect();
    let max_abs = diff.iter().cloned().fold(0.0, f64::max);
    let scale = w.iter().map(|x| x.abs()).fold(0.0, f64::max);
    let l2 = |v: &[f64]| v.iter().map(|x| x * x).sum::<f64>().sqrt();
    Errors {
        max_abs,
        mean_abs: diff.iter().sum::<f64>() / diff.len() as f64,
        max_rel: max_abs / scale,
        rel_l2: l2(&diff) / l2(&w),
    }
}

#[test]
fn fp16_rounding_error_of_the_npu_path() {
    let dev = emulated();
    let mut rows = Vec::new();
    let mut row = |what: String, e: &Errors, fp16: bool| {
        assert!(
            e.rel_l2 <= 2e-3,
            "{what}: relative L2 error {:.3e}",
            e.rel_l2
        );
        if fp16 {
            assert!(e.rel_l2 > 0.0, "{what}: no rounding at all");
        }
        rows.push(format!(
            "| {what} | {:.2e} | {:.2e} | {:.2e} | {:.2e} |",
            e.max_abs, e.mean_abs, e.max_rel, e.rel_l2
        ));
    };
    // Linear: x uniform in [-1, 1), W uniform scaled by 1/sqrt(in) (unit-variance-ish outputs).
    for (i, &(m, k, n)) in [(16, 64, 64), (32, 512, 256), (8, 2048, 512)]
        .iter()
        .enumerate()
    {
        let seed = 50 + 10 * i as u64;
        let w = tensor(&[n, k], seed, 1.0 / (k as f32).sqrt(), DType::F32);
        let b = tensor(&[n], seed + 1, 0.1, DType::F32);
        let x = tensor(&[m, k], seed + 2, 1.0, DType::F32);
        let cpu = candle_nn::Linear::new(w.clone(), Some(b.clone()));
        let hex = nn::Linear::new(&dev, w, Some(b)).unwrap();
        assert!(hex.is_on_npu());
        let e = errors(&hex.forward(&x).unwrap(), &cpu.forward(&x).unwrap());
        row(format!("linear {m}x{k} -> {n}"), &e, true);
    }
    // Attention, (b, s, h, d) with GQA, with and without the causal flag.
    for (i, &(nq, nk, h, hkv, d, causal)) in [
        (32, 128, 8, 2, 64, false),
        (64, 64, 8, 2, 64, true),
        (16, 256, 4, 4, 128, true),
    ]
    .iter()
    .enumerate()
    {
        let seed = 90 + 10 * i as u64;
        let q = tensor(&[1, nq, h, d], seed, 1.0, DType::F32);
        let k = tensor(&[1, nk, hkv, d], seed + 1, 1.0, DType::F32);
        let v = tensor(&[1, nk, hkv, d], seed + 2, 1.0, DType::F32);
        let opts = AttnOptions::for_head_dim(d).with_causal(causal);
        let got = nn::flash_attn(&dev, &q, &k, &v, &opts).unwrap();
        let want = attention::flash_attn_cpu_with(&q, &k, &v, &opts).unwrap();
        let c = if causal { ", causal" } else { "" };
        row(
            format!("attention q {nq} kv {nk} h {h}/{hkv} d {d}{c}"),
            &errors(&got, &want),
            true,
        );
    }
    // RMSNorm for contrast: f32 on both sides.
    let w = (tensor(&[1024], 5, 0.2, DType::F32) + 1.0).unwrap();
    let x = tensor(&[16, 1024], 6, 2.0, DType::F32);
    let cpu = candle_nn::RmsNorm::new(w.clone(), 1e-5);
    let hex = nn::RmsNorm::new(&dev, w, 1e-5).unwrap();
    let e = errors(&hex.forward(&x).unwrap(), &cpu.forward(&x).unwrap());
    row("rms_norm 16x1024 (f32, no fp16)".into(), &e, false);

    assert_eq!(dev.stats().cpu_calls(OpKind::LinearF16), 0);
    assert_eq!(dev.stats().cpu_calls(OpKind::FlashAttn), 0);
    let mut out = std::io::stderr().lock();
    let _ = writeln!(
        out,
        "\nNPU (emulated) f32-in/f32-out vs f32 CPU, random inputs"
    );
    let _ = writeln!(
        out,
        "| layer | max abs | mean abs | max abs / max abs(ref) | relative L2 |"
    );
    let _ = writeln!(out, "|---|---:|---:|---:|---:|");
    for r in rows {
        let _ = writeln!(out, "{r}");
    }
}
