//! Conformance suite (in the spirit of ggml's test-backend-ops): every routed op runs on the
//! emulated NPU and on the CPU over a table of shapes (non-multiples of 32 included), and is
//! compared with a slow f64 reference by NMSE = sum (y - ref)^2 / sum ref^2, with a tolerance per
//! op that follows from the kernels' arithmetic:
//!
//! | op | what differs from f64 | NMSE tolerance |
//! |---|---|---|
//! | linear_f16 | weights and activations rounded to fp16 (rel. 2^-11), f32 accumulation | 1e-5 |
//! | linear_q4_0 | activations quantized to Q8_0 (step amax/127) | 2e-4 (vs the dequantized weights) |
//! | flash_attn | K and V rounded to fp16 | 1e-5 |
//! | rms_norm, swiglu, rope (f32) | f32 rounding only | 1e-10 |
//! | any op with f16/bf16 tensors | output rounded to the dtype (bf16: 2^-8) | 1e-5 / 1e-4 |
//!
//! Cases the device does not take are listed as UNSUPPORTED with their reason (and checked to
//! fall back to the CPU path bit for bit), never silently passed.

use crate::common;

use std::io::Write;

use candle_core::quantized::{GgmlDType, QMatMul, QTensor};
use candle_core::{DType, Module, Tensor};
use candle_hexagon::ops::{attention, elementwise, linear, norm};
use candle_hexagon::{ops, HexLinear, HexagonDevice, OpDesc, OpKind, Placed, Reason, Support};
use common::*;

struct Report {
    op: &'static str,
    rows: Vec<String>,
}

impl Report {
    fn new(op: &'static str) -> Self {
        Report { op, rows: vec![] }
    }

    /// Checks the NPU result against the reference within `tol` and records the row (with the
    /// NPU-vs-CPU and CPU-vs-reference errors for context).
    fn ok(&mut self, case: String, npu: &Tensor, cpu: &Tensor, reference: &Tensor, tol: f64) {
        let (vs_ref, vs_cpu, cpu_vs_ref) =
            (nmse(npu, reference), nmse(npu, cpu), nmse(cpu, reference));
        assert!(
            vs_ref <= tol,
            "{} {case}: NMSE vs reference {vs_ref:.3e} exceeds {tol:.0e}",
            self.op
        );
        self.rows.push(format!(
            "| {} | {case} | {vs_ref:.2e} | {vs_cpu:.2e} | {cpu_vs_ref:.2e} | {tol:.0e} | ok |",
            self.op
        ));
    }

    fn unsupported(&mut self, case: String, reason: &Reason) {
        self.rows.push(format!(
            "| {} | {case} | - | - | - | - | UNSUPPORTED: {reason} |",
            self.op
        ));
    }

    fn print(&self) {
        // Straight to stderr so the table shows without --nocapture.
        let mut e = std::io::stderr().lock();
        let _ = writeln!(e, "\nconformance: {}", self.op);
        let _ = writeln!(
            e,
            "| op | case | NMSE npu vs ref | NMSE npu vs cpu | NMSE cpu vs ref | tolerance | result |"
        );
        let _ = writeln!(e, "|---|---|---:|---:|---:|---:|---|");
        for r in &self.rows {
            let _ = writeln!(e, "{r}");
        }
    }
}

fn tol_for(dt: DType, f32_tol: f64) -> f64 {
    match dt {
        DType::F32 => f32_tol,
        DType::F16 => f32_tol.max(1e-5),
        _ => f32_tol.max(1e-4),
    }
}

/// Runs `f` and checks that exactly one NPU call of `kind` was counted.
fn on_npu<T>(dev: &HexagonDevice, kind: OpKind, f: impl FnOnce() -> T) -> T {
    let before = dev.stats().npu_calls(kind);
    let out = f();
    assert_eq!(
        dev.stats().npu_calls(kind),
        before + 1,
        "{kind} did not run on the NPU"
    );
    out
}

#[test]
fn linear_f16() {
    let dev = emulated();
    let mut rep = Report::new("linear_f16");
    let shapes = [
        (1, 64, 64),
        (7, 33, 31),
        (40, 100, 70),
        (96, 160, 64),
        (300, 64, 160),
    ];
    for (i, &(m, n, k)) in shapes.iter().enumerate() {
        for dt in [DType::F32, DType::F16, DType::BF16] {
            for with_bias in [false, true] {
                let seed = (i * 10) as u64;
                let w = tensor(&[n, k], seed, 0.2, DType::F32);
                let b = with_bias.then(|| tensor(&[n], seed + 1, 0.5, DType::F32));
                let x = tensor(&[m, k], seed + 2, 1.0, dt);
                let Placed::Npu(lin) = HexLinear::from_dense(&dev, &w, b.as_ref()).unwrap() else {
                    panic!("placement refused")
                };
                let y = on_npu(&dev, OpKind::LinearF16, || lin.forward(&x).unwrap());
                assert_eq!((y.dims(), y.dtype()), (&[m, n][..], dt));
                // The CPU model computes with the f32 checkpoint; the slow reference with exact
                // f32 inputs.
                let cpu = x
                    .to_dtype(DType::F32)
                    .unwrap()
                    .matmul(&w.t().unwrap())
                    .unwrap();
                let cpu = match &b {
                    Some(b) => cpu.broadcast_add(b).unwrap(),
                    None => cpu,
                }
                .to_dtype(dt)
                .unwrap();
                let reference = linear::linear_slow(&x, &w, b.as_ref()).unwrap();
                rep.ok(
                    format!("m {m} n {n} k {k} {dt:?} bias {with_bias}"),
                    &y,
                    &cpu,
                    &reference,
                    tol_for(dt, 1e-5),
                );
                // The fallback computes with the weights unpacked from the NPU copy.
                let fb = lin.forward_cpu(&x).unwrap();
                assert!(nmse(&fb, &y) < tol_for(dt, 1e-5), "fallback vs npu");
            }
        }
    }
    // Unsupported: an integer weight.
    let wi = Tensor::zeros((8, 8), DType::U32, &candle_core::Device::Cpu).unwrap();
    match HexLinear::from_dense(&dev, &wi, None).unwrap() {
        Placed::Cpu(r) => {
            assert_eq!(r.key(), "dtype");
            rep.unsupported("u32 weights".into(), &r);
        }
        Placed::Npu(_) => panic!("u32 weights accepted"),
    }
    rep.print();
}

#[test]
fn linear_q4_0() {
    let dev = emulated();
    let mut rep = Report::new("linear_q4_0");
    let shapes = [(1, 32, 32), (5, 33, 64), (70, 100, 96), (300, 64, 160)];
    for (i, &(m, n, k)) in shapes.iter().enumerate() {
        for with_bias in [false, true] {
            let seed = 100 + (i * 10) as u64;
            let w = tensor(&[n, k], seed, 0.3, DType::F32);
            let q = QTensor::quantize(&w, GgmlDType::Q4_0).unwrap();
            let wq = q.dequantize(&candle_core::Device::Cpu).unwrap();
            let b = with_bias.then(|| tensor(&[n], seed + 1, 0.5, DType::F32));
            let x = tensor(&[m, k], seed + 2, 1.0, DType::F32);
            let Placed::Npu(lin) = HexLinear::from_qtensor(&dev, &q, b.as_ref()).unwrap() else {
                panic!("placement refused")
            };
            // Exact round trip of the ggml blocks through the Q4_0 tiles in NPU memory.
            assert_eq!(lin.q4_0_blocks().unwrap(), q.data().unwrap().to_vec());
            let y = on_npu(&dev, OpKind::LinearQ4_0, || lin.forward(&x).unwrap());
            let cpu = QMatMul::from_qtensor(q).unwrap().forward(&x).unwrap();
            let cpu = match &b {
                Some(b) => cpu.broadcast_add(b).unwrap(),
                None => cpu,
            };
            let reference = linear::linear_slow(&x, &wq, b.as_ref()).unwrap();
            rep.ok(
                format!("m {m} n {n} k {k} bias {with_bias}"),
                &y,
                &cpu,
                &reference,
                2e-4,
            );
        }
    }
    // Unsupported: Q8_0 weights (no kernel) stay on the CPU.
    let q8 = QTensor::quantize(&tensor(&[32, 64], 5, 1.0, DType::F32), GgmlDType::Q8_0).unwrap();
    match HexLinear::from_qtensor(&dev, &q8, None).unwrap() {
        Placed::Cpu(r) => {
            assert_eq!(r.key(), "dtype");
            rep.unsupported("q8_0 weights 32x64".into(), &r);
        }
        Placed::Npu(_) => panic!("q8_0 accepted"),
    }
    // Unsupported: Q4_0 rows that are not whole blocks (checked on the descriptor).
    let desc = OpDesc::Linear {
        weights: candle_hexagon::WeightFormat::Q4_0,
        n: 8,
        k: 48,
        rows: 0,
        dtype: DType::F32,
    };
    match dev.supports(&desc) {
        Support::No(r) => {
            assert_eq!(r.key(), "alignment");
            rep.unsupported("k 48".into(), &r);
        }
        s => panic!("{s:?}"),
    }
    rep.print();
}

#[test]
fn flash_attn() {
    let dev = emulated();
    let mut rep = Report::new("flash_attn");
    // (batch, q_len, kv_len, heads, kv_heads, head_dim): single rows, windows against a longer
    // cached key set (q_len < kv_len), GQA 2:1 and 4:1, head dims up to the kernel's 256.
    let cases = [
        (1, 1, 1, 1, 1, 8),
        (1, 5, 37, 4, 4, 16),
        (1, 33, 70, 4, 2, 32),
        (2, 16, 48, 8, 2, 64),
        (1, 32, 96, 4, 4, 64),
        (1, 7, 300, 2, 1, 128),
        (1, 3, 20, 2, 2, 256),
    ];
    for (i, &(b, nq, nk, h, hkv, d)) in cases.iter().enumerate() {
        for dt in [DType::F32, DType::F16] {
            let seed = 200 + (i * 10) as u64;
            let q = tensor(&[b, nq, h, d], seed, 1.0, dt);
            let k = tensor(&[b, nk, hkv, d], seed + 1, 1.0, dt);
            let v = tensor(&[b, nk, hkv, d], seed + 2, 1.0, dt);
            let scale = 1.0 / (d as f32).sqrt();
            let y = on_npu(&dev, OpKind::FlashAttn, || {
                ops::flash_attn(&dev, &q, &k, &v, scale).unwrap()
            });
            assert_eq!((y.dims(), y.dtype()), (&[b, nq, h, d][..], dt));
            let cpu = attention::flash_attn_cpu(&q, &k, &v, scale).unwrap();
            let reference = attention::attention_slow(&q, &k, &v, scale).unwrap();
            rep.ok(
                format!("b {b} q {nq} kv {nk} h {h}/{hkv} d {d} {dt:?}"),
                &y,
                &cpu,
                &reference,
                tol_for(dt, 1e-5),
            );
        }
    }
    // Unsupported shapes fall back to the CPU path, bit for bit.
    for (b, nq, nk, h, hkv, d, what) in [
        (1, 4, 8, 2, 2, 320, "head dim 320 > 256"),
        (1, 4, 8, 3, 2, 16, "3 query heads over 2 kv heads"),
    ] {
        let q = tensor(&[b, nq, h, d], 1, 1.0, DType::F32);
        let k = tensor(&[b, nk, hkv, d], 2, 1.0, DType::F32);
        let v = tensor(&[b, nk, hkv, d], 3, 1.0, DType::F32);
        let desc = OpDesc::FlashAttn {
            batch: b,
            q_len: nq,
            kv_len: nk,
            q_heads: h,
            kv_heads: hkv,
            head_dim: d,
            dtype: DType::F32,
        };
        let Support::No(r) = dev.supports(&desc) else {
            panic!("{what} accepted")
        };
        assert_eq!(r.key(), "shape");
        if h % hkv == 0 {
            let y = ops::flash_attn(&dev, &q, &k, &v, 0.1).unwrap();
            assert!(identical(
                &y,
                &attention::flash_attn_cpu(&q, &k, &v, 0.1).unwrap()
            ));
        }
        rep.unsupported(what.into(), &r);
    }
    assert_eq!(dev.stats().cpu_calls(OpKind::FlashAttn), 1);
    rep.print();
}

/// An additive mask of `shape` with finite biases in [-1, 1) and about a fifth of the entries
/// `-inf` (some rows may lose every key: they must come out as zeros on every path).
fn random_mask(shape: &[usize], seed: u64, dt: DType) -> Tensor {
    let n = shape.iter().product();
    let v: Vec<f32> = uniform(n, seed)
        .into_iter()
        .map(|x| if x < -0.6 { f32::NEG_INFINITY } else { x })
        .collect();
    Tensor::from_vec(v, shape, &candle_core::Device::Cpu)
        .unwrap()
        .to_dtype(dt)
        .unwrap()
}

#[test]
fn flash_attn_masked() {
    use candle_hexagon::ops::AttnOptions;
    let dev = emulated();
    let mut rep = Report::new("flash_attn masked");
    // (batch, q_len, kv_len, heads, kv_heads, head_dim, mask shape (None: causal only), causal)
    type Case = (
        usize,
        usize,
        usize,
        usize,
        usize,
        usize,
        Option<&'static [usize]>,
        bool,
    );
    let cases: [Case; 7] = [
        (1, 9, 9, 4, 2, 16, None, true),
        (2, 5, 37, 4, 1, 32, None, true),
        (1, 6, 20, 4, 2, 16, Some(&[6, 20]), false),
        (2, 7, 30, 4, 2, 16, Some(&[2, 4, 7, 30]), false),
        (2, 8, 24, 4, 4, 32, Some(&[1, 1, 8, 24]), true),
        (2, 3, 40, 6, 2, 64, Some(&[2, 1, 3, 40]), true),
        (1, 1, 17, 2, 1, 16, Some(&[1, 2, 1, 17]), false),
    ];
    for (i, &(b, nq, nk, h, hkv, d, mask, causal)) in cases.iter().enumerate() {
        for dt in [DType::F32, DType::F16] {
            let seed = 700 + (i * 10) as u64;
            let q = tensor(&[b, nq, h, d], seed, 1.0, dt);
            let k = tensor(&[b, nk, hkv, d], seed + 1, 1.0, dt);
            let v = tensor(&[b, nk, hkv, d], seed + 2, 1.0, dt);
            let mut opts = AttnOptions::for_head_dim(d).with_causal(causal);
            if let Some(shape) = mask {
                opts = opts.with_mask(random_mask(shape, seed + 3, dt));
            }
            let y = on_npu(&dev, OpKind::FlashAttn, || {
                ops::flash_attn_with(&dev, &q, &k, &v, &opts).unwrap()
            });
            assert_eq!((y.dims(), y.dtype()), (&[b, nq, h, d][..], dt));
            let cpu = attention::flash_attn_cpu_with(&q, &k, &v, &opts).unwrap();
            let reference = attention::attention_slow_with(&q, &k, &v, &opts).unwrap();
            // The mask must matter: the unmasked result is far from the masked one.
            let unmasked = attention::attention_slow(&q, &k, &v, opts.scale).unwrap();
            assert!(
                nmse(&unmasked, &reference) > 1e-3,
                "case {i}: mask had no effect"
            );
            let tol = tol_for(dt, 1e-5);
            assert!(
                nmse(&cpu, &reference) <= tol,
                "case {i} {dt:?}: CPU fallback vs reference {:.3e}",
                nmse(&cpu, &reference)
            );
            let mut what = mask.map_or(String::new(), |s| format!(" mask {s:?}"));
            if causal {
                what += " causal";
            }
            rep.ok(
                format!("b {b} q {nq} kv {nk} h {h}/{hkv} d {d}{what} {dt:?}"),
                &y,
                &cpu,
                &reference,
                tol,
            );
        }
    }
    rep.print();
}

#[test]
fn flash_attn_mask_edges() {
    use candle_hexagon::ops::AttnOptions;
    let dev = emulated();
    let (q, k, v) = (
        tensor(&[1, 3, 2, 8], 1, 1.0, DType::F32),
        tensor(&[1, 5, 2, 8], 2, 1.0, DType::F32),
        tensor(&[1, 5, 2, 8], 3, 1.0, DType::F32),
    );
    // Row 1 loses every key: zeros on the NPU, on the CPU fallback and in the reference.
    let mut m = vec![0f32; 15];
    m[5..10].fill(f32::NEG_INFINITY);
    let mask = Tensor::from_vec(m, (3, 5), &candle_core::Device::Cpu).unwrap();
    let opts = AttnOptions::new(0.3).with_mask(mask);
    let y = ops::flash_attn_with(&dev, &q, &k, &v, &opts).unwrap();
    let cpu = attention::flash_attn_cpu_with(&q, &k, &v, &opts).unwrap();
    let reference = attention::attention_slow_with(&q, &k, &v, &opts).unwrap();
    for t in [&y, &cpu, &reference] {
        let row = t.narrow(1, 1, 1).unwrap();
        assert_eq!(values(&row), vec![0.0; 16]);
        assert!(values(&t.narrow(1, 0, 1).unwrap())
            .iter()
            .any(|x| *x != 0.0));
    }
    // The causal triangle is bottom-right aligned: with q_len = kv_len - 2, query 0 sees keys 0..=2.
    let c = attention::causal_mask(3, 5, DType::F32).unwrap();
    let inf = f64::NEG_INFINITY;
    assert_eq!(values(&c)[..5], [0.0, 0.0, 0.0, inf, inf]);
    // Bad input is an error naming what is wrong, on every entry point.
    let bad = |opts: &AttnOptions| {
        let npu = ops::flash_attn_with(&dev, &q, &k, &v, opts)
            .unwrap_err()
            .to_string();
        let cpu = attention::flash_attn_cpu_with(&q, &k, &v, opts)
            .unwrap_err()
            .to_string();
        let slow = attention::attention_slow_with(&q, &k, &v, opts)
            .unwrap_err()
            .to_string();
        (npu, cpu, slow)
    };
    let wrong = tensor(&[5, 3], 4, 1.0, DType::F32);
    let (a, b, c) = bad(&AttnOptions::new(0.3).with_mask(wrong));
    for e in [a, b, c] {
        assert!(e.contains("mask [5, 3]") && e.contains("(3, 5)"), "{e}");
    }
    let heads3 = tensor(&[1, 3, 3, 5], 4, 1.0, DType::F32);
    let (a, _, _) = bad(&AttnOptions::new(0.3).with_mask(heads3));
    assert!(a.contains("heads = 2"), "{a}");
    let ints = Tensor::zeros((3, 5), DType::U32, &candle_core::Device::Cpu).unwrap();
    let (a, b, c) = bad(&AttnOptions::new(0.3).with_mask(ints));
    for e in [a, b, c] {
        assert!(e.contains("mask dtype U32"), "{e}");
    }
    // More queries than keys cannot be causal.
    let long = AttnOptions::new(0.3).with_causal(true);
    let e = ops::flash_attn_with(&dev, &k, &q, &q, &long)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("kv_len >= q_len") && e.contains("q_len 5, kv_len 3"),
        "{e}"
    );
    assert!(attention::causal_mask(4, 2, DType::F32).is_err());
}

#[test]
fn rms_norm() {
    let dev = emulated();
    let mut rep = Report::new("rms_norm");
    for (i, &(rows, hidden)) in [(1, 1), (3, 31), (17, 64), (2, 100), (100, 4096)]
        .iter()
        .enumerate()
    {
        for dt in [DType::F32, DType::F16, DType::BF16] {
            let seed = 300 + (i * 10) as u64;
            let x = tensor(&[1, rows, hidden], seed, 2.0, dt);
            let w = (tensor(&[hidden], seed + 1, 0.2, DType::F32) + 1.0)
                .unwrap()
                .to_dtype(dt)
                .unwrap();
            let eps = 1e-5;
            let y = on_npu(&dev, OpKind::RmsNorm, || {
                ops::rms_norm(&dev, &x, &w, eps).unwrap()
            });
            let cpu = norm::rms_norm_cpu(&x, &w, eps).unwrap();
            let reference = norm::rms_norm_slow(&x, &w, eps).unwrap();
            rep.ok(
                format!("rows {rows} hidden {hidden} {dt:?}"),
                &y,
                &cpu,
                &reference,
                tol_for(dt, 1e-10),
            );
        }
    }
    rep.print();
}

#[test]
fn swiglu_and_rope() {
    let dev = emulated();
    let mut rep = Report::new("swiglu / rope");
    for (i, &n) in [1usize, 33, 1000, 65536].iter().enumerate() {
        for dt in [DType::F32, DType::F16] {
            let g = tensor(&[n], 400 + i as u64, 4.0, dt);
            let u = tensor(&[n], 450 + i as u64, 1.0, dt);
            let y = on_npu(&dev, OpKind::Swiglu, || ops::swiglu(&dev, &g, &u).unwrap());
            let cpu = elementwise::swiglu_cpu(&g, &u).unwrap();
            let reference = elementwise::swiglu_slow(&g, &u).unwrap();
            rep.ok(
                format!("swiglu {n} {dt:?}"),
                &y,
                &cpu,
                &reference,
                tol_for(dt, 1e-10),
            );
        }
    }
    for (i, &(b, n, h, d)) in [(1, 1, 1, 2), (1, 5, 4, 16), (2, 33, 3, 64), (1, 7, 2, 256)]
        .iter()
        .enumerate()
    {
        for dt in [DType::F32, DType::F16] {
            let x = tensor(&[b, n, h, d], 500 + i as u64, 1.0, dt);
            // Real tables: angles p * theta^(-2i/d).
            let half = d / 2;
            let (mut c, mut s) = (vec![], vec![]);
            for p in 0..n {
                for j in 0..half {
                    let a = p as f64 * 10_000f64.powf(-(2.0 * j as f64) / d as f64);
                    c.push(a.cos() as f32);
                    s.push(a.sin() as f32);
                }
            }
            let dev0 = candle_core::Device::Cpu;
            let cos = Tensor::from_vec(c, (n, half), &dev0)
                .unwrap()
                .to_dtype(dt)
                .unwrap();
            let sin = Tensor::from_vec(s, (n, half), &dev0)
                .unwrap()
                .to_dtype(dt)
                .unwrap();
            let y = on_npu(&dev, OpKind::Rope, || {
                ops::rope(&dev, &x, &cos, &sin).unwrap()
            });
            let cpu = elementwise::rope_cpu(&x, &cos, &sin).unwrap();
            let reference = elementwise::rope_slow(&x, &cos, &sin).unwrap();
            rep.ok(
                format!("rope b {b} n {n} h {h} d {d} {dt:?}"),
                &y,
                &cpu,
                &reference,
                tol_for(dt, 1e-10),
            );
        }
    }
    rep.print();
}

#[test]
fn denied_ops_fall_back_bit_for_bit_and_are_counted() {
    let dev = HexagonDevice::open(candle_hexagon::HexagonConfig {
        deny: OpKind::parse_list("rms_norm,linear").unwrap(),
        va_window_bytes: 64 << 20,
        weight_chunk_bytes: 1 << 20,
        ..Default::default()
    })
    .unwrap();
    let x = tensor(&[2, 5, 48], 1, 1.0, DType::F32);
    let w = tensor(&[48], 2, 1.0, DType::F32);
    let y = ops::rms_norm(&dev, &x, &w, 1e-6).unwrap();
    assert!(identical(&y, &norm::rms_norm_cpu(&x, &w, 1e-6).unwrap()));
    let lw = tensor(&[16, 48], 3, 1.0, DType::F32);
    assert!(matches!(
        HexLinear::from_dense(&dev, &lw, None).unwrap(),
        Placed::Cpu(Reason::Denied)
    ));
    let s = dev.stats();
    assert_eq!(s.cpu_calls(OpKind::RmsNorm), 1);
    assert_eq!(s.npu_calls(OpKind::RmsNorm), 0);
    assert_eq!(s.cpu_placements(OpKind::LinearF16), 1);
    let report = dev.routing_report().to_string();
    assert!(
        report.contains("| rms_norm | cpu (denied) | 1 |"),
        "{report}"
    );
    assert!(
        report.contains("| linear_f16 | cpu (denied) | 1 |"),
        "{report}"
    );
}
