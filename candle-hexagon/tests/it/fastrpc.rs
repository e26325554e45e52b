//! The FastRPC transport end to end against the host shim (`libkdsp_fastrpc_shim.so`, built by
//! this crate's build script): dlopen, unsigned-PD session control, remote_handle64_open of the
//! kdsp skel, rpcmem buffers mapped with fastrpc_mmap and registered by fd, batches through
//! remote_handle64_invoke. Every routed op must give bit-identical results to the in-process
//! emulated DSP (same kernels, different transport), the VA budget must hold, and everything
//! must be unmapped and freed when the device goes away.
//!
//! One test function: the shim is a process-wide library with global counters.
#![cfg(feature = "fastrpc")]

use crate::common;

use std::path::PathBuf;

use candle_core::quantized::{GgmlDType, QTensor};
use candle_core::{DType, Module, Tensor};
use candle_hexagon::transport::fastrpc::shim_stats;
use candle_hexagon::{
    ops, Error, HexLinear, HexTransformer, HexagonConfig, HexagonDevice, OpKind, Placed,
    TransportConfig,
};
use common::block_ref::{Model, Spec};
use common::*;

fn shim() -> PathBuf {
    candle_hexagon::shim_library_path()
        .expect("the build script builds the FastRPC shim on Linux hosts with feature `fastrpc`")
}

fn fastrpc_device(window: u64) -> HexagonDevice {
    HexagonDevice::open(HexagonConfig {
        transport: TransportConfig::FastRpc { library: shim() },
        va_window_bytes: window,
        weight_chunk_bytes: 4 << 20,
        ..Default::default()
    })
    .unwrap()
}

/// Every routed op once, returning the outputs.
fn run_all(dev: &HexagonDevice) -> Vec<Tensor> {
    let mut out = Vec::new();
    let w = tensor(&[70, 100], 1, 0.1, DType::F32);
    let b = tensor(&[70], 2, 0.5, DType::F32);
    let x = tensor(&[37, 100], 3, 1.0, DType::F32);
    let Placed::Npu(lin) = HexLinear::from_dense(dev, &w, Some(&b)).unwrap() else {
        panic!("fp16 placement refused")
    };
    out.push(lin.forward(&x).unwrap());
    let q = QTensor::quantize(&tensor(&[40, 96], 4, 0.3, DType::F32), GgmlDType::Q4_0).unwrap();
    let Placed::Npu(ql) = HexLinear::from_qtensor(dev, &q, None).unwrap() else {
        panic!("q4_0 placement refused")
    };
    out.push(ql.forward(&tensor(&[9, 96], 5, 1.0, DType::F32)).unwrap());
    let qa = tensor(&[1, 12, 4, 32], 6, 1.0, DType::F32);
    let ka = tensor(&[1, 40, 2, 32], 7, 1.0, DType::F32);
    let va = tensor(&[1, 40, 2, 32], 8, 1.0, DType::F32);
    out.push(ops::flash_attn(dev, &qa, &ka, &va, 0.17).unwrap());
    let xn = tensor(&[3, 5, 64], 9, 2.0, DType::F16);
    let wn = tensor(&[64], 10, 1.0, DType::F16);
    out.push(ops::rms_norm(dev, &xn, &wn, 1e-6).unwrap());
    out.push(
        ops::swiglu(
            dev,
            &tensor(&[333], 11, 3.0, DType::F32),
            &tensor(&[333], 12, 1.0, DType::F32),
        )
        .unwrap(),
    );
    let cos = tensor(&[5, 8], 13, 1.0, DType::F32);
    let sin = tensor(&[5, 8], 14, 1.0, DType::F32);
    out.push(
        ops::rope(
            dev,
            &tensor(&[2, 5, 3, 16], 15, 1.0, DType::F32),
            &cos,
            &sin,
        )
        .unwrap(),
    );
    // The block module: one batch per block over the resident KV cache (grown once), a window
    // inside the cache (key-exclusion range), row selection, a commit that moves rows.
    let spec = Spec {
        hidden: 64,
        heads: 4,
        kv_heads: 2,
        head_dim: 16,
        ffn: 80,
        vocab: 33,
        layers: 2,
        bias: true,
        head: true,
        dtype: DType::F16,
        q4: false,
    };
    let m = Model::random(&spec, 9);
    let Placed::Npu(t) = HexTransformer::new(dev, &m.config(64), &m.weights()).unwrap() else {
        panic!("block placement refused")
    };
    let mut kv = t.new_kv(1, 8).unwrap();
    let before = dev.counters();
    out.push(
        t.forward(&mut kv, &tensor(&[1, 10, 64], 16, 1.0, DType::F32), 0, None)
            .unwrap(),
    );
    commit_rows(&mut kv, (0, 0), 0..10).unwrap();
    out.push(
        t.forward(
            &mut kv,
            &tensor(&[1, 6, 64], 17, 1.0, DType::F32),
            7,
            Some(&[0, 4]),
        )
        .unwrap(),
    );
    commit_rows(&mut kv, (7, 10), 7..13).unwrap();
    assert_eq!(
        dev.counters().since(&before).dsp_batches,
        4,
        "2 forwards x 2 blocks"
    );
    assert_eq!(kv.stats().grows, 1);
    out.push(kv.read_rows(1, 0..13).unwrap().0);
    for k in [
        OpKind::LinearF16,
        OpKind::LinearQ4_0,
        OpKind::FlashAttn,
        OpKind::RmsNorm,
        OpKind::Swiglu,
        OpKind::Rope,
    ] {
        assert_eq!(
            dev.stats().npu_calls(k),
            1,
            "{k} on {}",
            dev.transport_name()
        );
    }
    out
}

#[test]
fn fastrpc_transport_end_to_end_against_the_shim() {
    let lib = shim();
    let base = shim_stats(&lib).expect("the shim exports kdsp_shim_stats");

    {
        let dev = fastrpc_device(256 << 20);
        assert_eq!(dev.transport_name(), "fastrpc");
        let d = dev.description();
        assert!(
            d.contains("FastRPC via")
                && d.contains(&format!(
                    "kernels-dsp abi={}",
                    candle_hexagon::abi::KDSP_ABI_VERSION
                )),
            "{d}"
        );
        let s = shim_stats(&lib).unwrap();
        assert_eq!(s[5], 1, "unsigned PD requested before remote_handle64_open");

        let remote = run_all(&dev);
        let local = run_all(&emulated());
        for (i, (a, b)) in remote.iter().zip(&local).enumerate() {
            assert!(
                identical(a, b),
                "op {i}: FastRPC and emulated results differ"
            );
        }
        let s = shim_stats(&lib).unwrap();
        // Weight chunks and the pooled staging/activation buffers are mapped on the DSP.
        let live = dev.memory_stats().va.entries as u64;
        assert!(live >= 2);
        assert_eq!(
            s[1] - base[1],
            live,
            "live DSP mappings = live window entries"
        );
        assert_eq!(s[0] - base[0], live, "one rpcmem buffer per mapping");
        assert!(
            s[4] > base[4] + 6,
            "invocations went through remote_handle64_invoke"
        );
        eprintln!("{}", dev.routing_report());
    }
    let s = shim_stats(&lib).unwrap();
    assert_eq!(
        (s[0], s[1]),
        (base[0], base[1]),
        "everything unmapped and freed"
    );
    assert_eq!(
        s[2] - base[2],
        s[3] - base[3],
        "every fastrpc_mmap has its fastrpc_munmap"
    );

    // The address budget holds on this transport too.
    {
        let dev = fastrpc_device(64 << 20);
        let mut held = Vec::new();
        let err = loop {
            match dev.map_buffer(24 << 20) {
                Ok(b) => held.push(b),
                Err(e) => break e,
            }
            assert!(held.len() < 10);
        };
        assert_eq!(held.len(), 2);
        assert!(
            matches!(err, Error::VaBudget { need, have, .. } if need == 24 << 20 && have == 16 << 20),
            "{err}"
        );
        drop(held);
        let x = tensor(&[4, 64], 1, 1.0, DType::F32);
        let w = tensor(&[64], 2, 1.0, DType::F32);
        let y = ops::rms_norm(&dev, &x, &w, 1e-5).unwrap();
        assert!(
            nmse(
                &y,
                &candle_hexagon::ops::norm::rms_norm_slow(&x, &w, 1e-5).unwrap()
            ) < 1e-10
        );
    }
    let s = shim_stats(&lib).unwrap();
    assert_eq!((s[0], s[1]), (base[0], base[1]));

    // A library without the FastRPC API is a named error, not a crash.
    let e = HexagonDevice::open(HexagonConfig {
        transport: TransportConfig::FastRpc {
            library: "libm.so.6".into(),
        },
        ..Default::default()
    })
    .unwrap_err()
    .to_string();
    assert!(
        e.contains("libm.so.6") && e.contains("missing symbol `rpcmem_alloc`"),
        "{e}"
    );
}
