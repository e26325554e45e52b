//! `candle_hexagon::nn` as a candle user meets it: one small model (RMSNorm, a causal GQA
//! attention block, RMSNorm, a 2-layer MLP, residuals) built from one `VarBuilder` twice — with
//! candle-nn layers and plain candle attention, and with `candle_hexagon::nn` layers — and the
//! outputs compared, with the routing report showing what ran on the device.
//!
//! Tolerance: the NPU path rounds the six linear layers' weights and activations to fp16
//! (relative 2^-11 per value) and attention's K/V to fp16, with f32 accumulation; over this block
//! that is a normalised squared error of order 1e-8 (3e-8 measured, printed), so the check is
//! NMSE <= 1e-5 — loose enough for fp16 rounding, far below what any wrong mask, head mapping or
//! transpose produces (order 1e-2 to 1).

use crate::common;

use std::collections::HashMap;

use candle_core::{DType, Device, Module, Tensor};
use candle_hexagon::nn::{self, AttnOptions};
use candle_hexagon::{HexagonConfig, HexagonDevice, OpKind, Reason};
use candle_nn::VarBuilder;
use common::*;

const HIDDEN: usize = 64;
const HEADS: usize = 4;
const KV_HEADS: usize = 2;
const HEAD_DIM: usize = 16;
const FFN: usize = 96;
const EPS: f64 = 1e-5;

/// Random weights under candle-nn's names (`norm1.weight`, `q.weight`, `fc1.bias`, ...).
fn var_builder() -> VarBuilder<'static> {
    let mut t = HashMap::new();
    let mut seed = 1000;
    let mut put = |name: &str, shape: &[usize], scale: f32, offset: f32| {
        seed += 1;
        let w = (tensor(shape, seed, scale, DType::F32) + offset as f64).unwrap();
        t.insert(name.to_string(), w);
    };
    let s = 1.0 / (HIDDEN as f32).sqrt();
    put("norm1.weight", &[HIDDEN], 0.2, 1.0);
    put("norm2.weight", &[HIDDEN], 0.2, 1.0);
    put("q.weight", &[HEADS * HEAD_DIM, HIDDEN], s, 0.0);
    put("k.weight", &[KV_HEADS * HEAD_DIM, HIDDEN], s, 0.0);
    put("v.weight", &[KV_HEADS * HEAD_DIM, HIDDEN], s, 0.0);
    put("o.weight", &[HIDDEN, HEADS * HEAD_DIM], s, 0.0);
    put("fc1.weight", &[FFN, HIDDEN], s, 0.0);
    put("fc1.bias", &[FFN], 0.1, 0.0);
    put("fc2.weight", &[HIDDEN, FFN], 1.0 / (FFN as f32).sqrt(), 0.0);
    put("fc2.bias", &[HIDDEN], 0.1, 0.0);
    VarBuilder::from_tensors(t, DType::F32, &Device::Cpu)
}

type Attn = Box<dyn Fn(&Tensor, &Tensor, &Tensor) -> candle_core::Result<Tensor>>;

/// The block, generic over where its layers run.
struct Block {
    norm1: Box<dyn Module>,
    q: Box<dyn Module>,
    k: Box<dyn Module>,
    v: Box<dyn Module>,
    o: Box<dyn Module>,
    norm2: Box<dyn Module>,
    fc1: Box<dyn Module>,
    fc2: Box<dyn Module>,
    /// `(b, h, s, d)` q/k/v -> `(b, h, s, d)`, causal.
    attn: Attn,
}

impl Block {
    /// candle-nn layers and candle's usual attention: repeat the KV heads, `q k^T`, a causal
    /// mask, softmax, `@ v`.
    fn candle_nn(vb: &VarBuilder) -> candle_core::Result<Self> {
        use candle_nn::{linear, linear_no_bias, rms_norm};
        let attn: Attn = Box::new(|q, k, v| {
            let rep = |t: &Tensor| -> candle_core::Result<Tensor> {
                let (b, hkv, s, d) = t.dims4()?;
                t.unsqueeze(2)?
                    .expand((b, hkv, HEADS / KV_HEADS, s, d))?
                    .reshape((b, HEADS, s, d))
            };
            let (q, k, v) = (
                q.contiguous()?,
                rep(k)?.contiguous()?,
                rep(v)?.contiguous()?,
            );
            let s = q.dim(2)?;
            let mask: Vec<f32> = (0..s * s)
                .map(|i| {
                    if i % s > i / s {
                        f32::NEG_INFINITY
                    } else {
                        0.0
                    }
                })
                .collect();
            let mask = Tensor::from_vec(mask, (s, s), q.device())?;
            let scores = (q.matmul(&k.t()?)? / (HEAD_DIM as f64).sqrt())?.broadcast_add(&mask)?;
            candle_nn::ops::softmax_last_dim(&scores)?.matmul(&v)
        });
        Ok(Block {
            norm1: Box::new(rms_norm(HIDDEN, EPS, vb.pp("norm1"))?),
            q: Box::new(linear_no_bias(HIDDEN, HEADS * HEAD_DIM, vb.pp("q"))?),
            k: Box::new(linear_no_bias(HIDDEN, KV_HEADS * HEAD_DIM, vb.pp("k"))?),
            v: Box::new(linear_no_bias(HIDDEN, KV_HEADS * HEAD_DIM, vb.pp("v"))?),
            o: Box::new(linear_no_bias(HEADS * HEAD_DIM, HIDDEN, vb.pp("o"))?),
            norm2: Box::new(rms_norm(HIDDEN, EPS, vb.pp("norm2"))?),
            fc1: Box::new(linear(HIDDEN, FFN, vb.pp("fc1"))?),
            fc2: Box::new(linear(FFN, HIDDEN, vb.pp("fc2"))?),
            attn,
        })
    }

    /// The same names with `candle_hexagon::nn` and the device as the last argument.
    fn hexagon(vb: &VarBuilder, dev: &HexagonDevice) -> candle_hexagon::Result<Self> {
        use candle_hexagon::nn::{linear, linear_no_bias, rms_norm};
        let d = dev.clone();
        let attn: Attn = Box::new(move |q, k, v| {
            let opts = AttnOptions::for_head_dim(HEAD_DIM).with_causal(true);
            Ok(nn::flash_attn_bhsd(&d, q, k, v, &opts)?)
        });
        Ok(Block {
            norm1: Box::new(rms_norm(HIDDEN, EPS, vb.pp("norm1"), dev)?),
            q: Box::new(linear_no_bias(HIDDEN, HEADS * HEAD_DIM, vb.pp("q"), dev)?),
            k: Box::new(linear_no_bias(
                HIDDEN,
                KV_HEADS * HEAD_DIM,
                vb.pp("k"),
                dev,
            )?),
            v: Box::new(linear_no_bias(
                HIDDEN,
                KV_HEADS * HEAD_DIM,
                vb.pp("v"),
                dev,
            )?),
            o: Box::new(linear_no_bias(HEADS * HEAD_DIM, HIDDEN, vb.pp("o"), dev)?),
            norm2: Box::new(rms_norm(HIDDEN, EPS, vb.pp("norm2"), dev)?),
            fc1: Box::new(linear(HIDDEN, FFN, vb.pp("fc1"), dev)?),
            fc2: Box::new(linear(FFN, HIDDEN, vb.pp("fc2"), dev)?),
            attn,
        })
    }

    fn forward(&self, x: &Tensor) -> candle_core::Result<Tensor> {
        let (b, s, _) = x.dims3()?;
        let h = self.norm1.forward(x)?;
        let heads = |t: Tensor, n: usize| t.reshape((b, s, n, HEAD_DIM))?.transpose(1, 2);
        let q = heads(self.q.forward(&h)?, HEADS)?;
        let k = heads(self.k.forward(&h)?, KV_HEADS)?;
        let v = heads(self.v.forward(&h)?, KV_HEADS)?;
        let a = (self.attn)(&q, &k, &v)?
            .transpose(1, 2)?
            .reshape((b, s, HEADS * HEAD_DIM))?;
        let x = (x + self.o.forward(&a)?)?;
        let m = self.norm2.forward(&x)?;
        let m = self.fc2.forward(&self.fc1.forward(&m)?.gelu()?)?;
        x + m
    }
}

#[test]
fn candle_nn_and_hexagon_nn_agree_with_the_work_on_the_device() {
    let dev = emulated();
    let vb = var_builder();
    let cpu = Block::candle_nn(&vb).unwrap();
    let hex = Block::hexagon(&vb, &dev).unwrap();
    let x = tensor(&[2, 11, HIDDEN], 7, 1.0, DType::F32);
    let want = cpu.forward(&x).unwrap();
    let got = hex.forward(&x).unwrap();
    assert_eq!(got.dims(), want.dims());
    let (e, worst) = (nmse(&got, &want), max_abs(&got, &want));
    eprintln!("nn block: NMSE {e:.2e}, max |diff| {worst:.2e} (hexagon nn vs candle-nn)");
    assert!(e <= 1e-5, "NMSE {e:.3e}");
    // fp16 rounding happened (the device path is not secretly the CPU one) ...
    assert!(e > 0.0);
    // ... and the routing report shows every layer on the device.
    let st = dev.stats();
    assert_eq!(st.npu_placements(OpKind::LinearF16), 6);
    assert_eq!(st.npu_calls(OpKind::LinearF16), 6);
    assert_eq!(st.npu_calls(OpKind::RmsNorm), 2);
    assert_eq!(st.npu_calls(OpKind::FlashAttn), 1);
    for kind in [OpKind::LinearF16, OpKind::RmsNorm, OpKind::FlashAttn] {
        assert_eq!(st.cpu_calls(kind), 0, "{kind} ran on the CPU");
    }
    let report = dev.routing_report().to_string();
    eprintln!("{report}");
    assert!(
        report.contains("| flash_attn | npu (hvx) | 1 |"),
        "{report}"
    );
    assert!(report.contains("| rms_norm | npu (hvx) | 2 |"), "{report}");
}

#[test]
fn a_denied_linear_keeps_the_candle_nn_layer_and_its_reason() {
    let dev = HexagonDevice::open(HexagonConfig {
        va_window_bytes: 64 << 20,
        deny: vec![OpKind::LinearF16],
        ..Default::default()
    })
    .unwrap();
    let vb = var_builder();
    let lin = nn::linear(HIDDEN, FFN, vb.pp("fc1"), &dev).unwrap();
    assert!(!lin.is_on_npu() && lin.npu().is_none());
    let (layer, reason) = lin.cpu().expect("kept on the CPU");
    assert_eq!(reason, &Reason::Denied);
    let x = tensor(&[3, 5, HIDDEN], 9, 1.0, DType::F32);
    let want = candle_nn::linear(HIDDEN, FFN, vb.pp("fc1"))
        .unwrap()
        .forward(&x)
        .unwrap();
    // The CPU layer is candle-nn's own: bit for bit, and no NPU work.
    assert!(identical(&lin.forward(&x).unwrap(), &want));
    assert!(identical(&layer.forward(&x).unwrap(), &want));
    assert_eq!(dev.stats().cpu_placements(OpKind::LinearF16), 1);
    assert_eq!(dev.stats().npu_calls(OpKind::LinearF16), 0);
    assert!(dev.routing_report().to_string().contains("denied"));
}

#[test]
fn bad_input_is_an_error_naming_it() {
    let dev = emulated();
    let vb = var_builder();
    // A weight of the wrong shape in the VarBuilder.
    let e = nn::linear_no_bias(HIDDEN + 1, FFN, vb.pp("fc1"), &dev).unwrap_err();
    assert!(e.to_string().contains("fc1.weight"), "{e}");
    let e = nn::rms_norm(HIDDEN, -1.0, vb.pp("norm1"), &dev).unwrap_err();
    assert!(e.to_string().contains("eps -1"), "{e}");
    let norm = nn::rms_norm(HIDDEN, EPS, vb.pp("norm1"), &dev).unwrap();
    let e = norm.forward(&tensor(&[2, HIDDEN + 3], 1, 1.0, DType::F32));
    assert!(e.unwrap_err().to_string().contains("hidden size 67"));
    // (b, h, s, d) attention with mismatched head dims.
    let q = tensor(&[1, 4, 3, 16], 1, 1.0, DType::F32);
    let k = tensor(&[1, 2, 3, 8], 2, 1.0, DType::F32);
    let e = nn::flash_attn_bhsd(&dev, &q, &k, &k, &AttnOptions::for_head_dim(16)).unwrap_err();
    assert!(e.to_string().contains("flash_attn"), "{e}");
}
