//! The NPU address window and shared buffers: exhaustion is a clear, structured error (never a
//! crash), routed ops fall back to the CPU when staging cannot be mapped, and the device keeps
//! working once memory is released. Also: ops too large for the scratch arena are split.

use crate::common;

use candle_core::{DType, Module};
use candle_hexagon::ops::{linear, norm};
use candle_hexagon::{ops, Error, HexLinear, HexagonConfig, HexagonDevice, OpKind, Placed, Reason};
use common::*;

const MIB: usize = 1 << 20;

fn tiny_window() -> HexagonDevice {
    HexagonDevice::open(HexagonConfig {
        va_window_bytes: 64 << 20,
        mapper_entries: 8,
        weight_chunk_bytes: 4 << 20,
        ..Default::default()
    })
    .unwrap()
}

#[test]
fn va_exhaustion_is_a_named_error_and_the_device_recovers() {
    let dev = tiny_window();
    let mut held = Vec::new();
    let err = loop {
        match dev.map_buffer(12 * MIB) {
            Ok(b) => held.push(b),
            Err(e) => break e,
        }
        assert!(held.len() < 100, "a 64 MiB window never filled");
    };
    // 5 x 12 MiB fit in 64 MiB; the 6th needs 12 MiB and finds the 4 MiB tail.
    assert_eq!(held.len(), 5);
    let msg = err.to_string();
    eprintln!("VA exhaustion: {msg}");
    match err {
        Error::VaBudget {
            need,
            have,
            window,
            in_use,
        } => {
            assert_eq!(need, 12 * MIB as u64);
            assert_eq!(have, 4 * MIB as u64);
            assert_eq!((window, in_use), (64 * MIB as u64, 60 * MIB as u64));
        }
        e => panic!("expected VaBudget, got {e}"),
    }
    assert!(msg.contains("need 12582912 bytes (12.0 MiB)"), "{msg}");
    assert!(msg.contains("have 4194304 bytes (4.0 MiB)"), "{msg}");

    // With the window full a routed op cannot stage: it runs on the CPU, counted as va_budget.
    let x = tensor(&[4, 6 * MIB / 16], 1, 1.0, DType::F32); // 6 MiB of activations
    let w = tensor(&[6 * MIB / 16], 2, 1.0, DType::F32);
    let y = ops::rms_norm(&dev, &x, &w, 1e-5).unwrap();
    assert!(identical(&y, &norm::rms_norm_cpu(&x, &w, 1e-5).unwrap()));
    assert_eq!(
        dev.stats()
            .calls(OpKind::RmsNorm, candle_hexagon::Decision::Cpu("va_budget")),
        1
    );
    // Weights that do not fit stay on the CPU with the reason.
    let big = tensor(&[2048, 2048], 3, 0.1, DType::F32); // 8 MiB of fp16 tiles
    match HexLinear::from_dense(&dev, &big, None).unwrap() {
        Placed::Cpu(Reason::VaBudget { need, have }) => {
            assert!(need >= 8 * MIB as u64 && have < need, "{need} {have}")
        }
        p => panic!("expected a VA-budget fallback, got {p:?}"),
    }

    // Release everything: the same op now runs on the NPU and matches the CPU.
    drop(held);
    let s = dev.memory_stats().va;
    assert_eq!((s.maps, s.unmaps, s.entries), (5, 5, 0));
    assert!(s.refused >= 1);
    assert_eq!(s.peak_mapped_bytes, 60 * MIB as u64);
    let y = ops::rms_norm(&dev, &x, &w, 1e-5).unwrap();
    assert!(nmse(&y, &norm::rms_norm_slow(&x, &w, 1e-5).unwrap()) < 1e-10);
    assert_eq!(dev.stats().npu_calls(OpKind::RmsNorm), 1);
    let Placed::Npu(lin) = HexLinear::from_dense(&dev, &big, None).unwrap() else {
        panic!("placement refused after the window was freed")
    };
    let xs = tensor(&[3, 2048], 4, 1.0, DType::F32);
    let ys = lin.forward(&xs).unwrap();
    assert!(nmse(&ys, &linear::linear_slow(&xs, &big, None).unwrap()) < 1e-5);
}

#[test]
fn mapper_entries_are_bounded() {
    let dev = tiny_window();
    let mut held = Vec::new();
    let err = loop {
        match dev.map_buffer(4096) {
            Ok(b) => held.push(b),
            Err(e) => break e,
        }
        assert!(held.len() <= 8);
    };
    assert_eq!(held.len(), 8);
    let msg = err.to_string();
    assert!(matches!(err, Error::MapperEntries { limit: 8 }), "{msg}");
    assert!(msg.contains("need 1 more mapping, have 0 of 8"), "{msg}");
    held.pop();
    let b = dev.map_buffer(4096).unwrap();
    assert!(b.id() < 8);
}

#[test]
fn buffers_are_page_aligned_shared_and_released() {
    let dev = tiny_window();
    let a = dev.map_buffer(1).unwrap();
    let b = dev.map_buffer(5000).unwrap();
    let page = candle_hexagon::page_size() as usize;
    assert_eq!(a.len(), page);
    assert_eq!(b.len(), 2 * page);
    assert_eq!(b.window_offset() % page as u64, 0);
    assert_ne!(a.id(), b.id());
    b.write(100, &[1, 2, 3]).unwrap();
    assert_eq!(b.read(100, 3).unwrap(), vec![1, 2, 3]);
    assert!(b.write(2 * page - 1, &[0, 0]).is_err());
    drop((a, b));
    let s = dev.memory_stats().va;
    assert_eq!((s.entries, s.mapped_bytes), (0, 0));
}

#[test]
fn large_matmuls_are_split_to_fit_the_scratch_arena() {
    // The smallest scratch the config allows for 2 workers (1.625 MiB): a 512 x 1024 f32
    // activation packs into 1 MiB of tiles plus per-worker buffers, more than fits.
    let dev = HexagonDevice::open(HexagonConfig {
        scratch_bytes: 2 * (320 << 10) + (1 << 20),
        va_window_bytes: 256 << 20,
        weight_chunk_bytes: 4 << 20,
        ..Default::default()
    })
    .unwrap();
    let (m, n, k) = (1024, 96, 1024);
    let w = tensor(&[n, k], 5, 0.05, DType::F32);
    let x = tensor(&[m, k], 6, 1.0, DType::F32);
    let Placed::Npu(lin) = HexLinear::from_dense(&dev, &w, None).unwrap() else {
        panic!("placement refused")
    };
    let y = lin.forward(&x).unwrap();
    assert!(nmse(&y, &linear::linear_slow(&x, &w, None).unwrap()) < 1e-5);
    let ops_used = dev.stats().dsp_ops();
    assert!(
        ops_used > 1,
        "{m} rows should need several matmul ops, got {ops_used}"
    );
    // The plan is remembered: the same shape again costs the same number of ops.
    let _ = lin.forward(&x).unwrap();
    assert_eq!(dev.stats().dsp_ops(), 2 * ops_used);
    eprintln!("{m}x{k} activations split into {ops_used} matmul ops");
}
