//! The block module's state and routing: what the device refuses is a counted decision with its
//! reason; host access to the resident KV cache beside a forward in flight is allowed when it
//! does not conflict and refused (Error::Busy) when it does; the host row API round-trips; the
//! counters give batches and bytes per forward; one HexTransformer serves two sequences on two
//! threads at once.

use crate::common;

use candle_core::quantized::{GgmlDType, QTensor};
use candle_core::{DType, Device, Tensor};
use candle_hexagon::Decision;
use candle_hexagon::{
    Error, ForwardOutput, HexTransformer, HexagonConfig, HexagonDevice, OpKind, Placed, Reason,
    Tier, WeightRef,
};
use common::block_ref::{Model, Spec};
use common::*;

fn small(kv_heads: usize, q4: bool) -> Spec {
    Spec {
        hidden: 64,
        heads: 4,
        kv_heads,
        head_dim: 16,
        ffn: 64,
        vocab: 40,
        layers: 2,
        bias: false,
        head: true,
        dtype: DType::F32,
        q4,
    }
}

fn npu(dev: &HexagonDevice, m: &Model) -> HexTransformer {
    match HexTransformer::new(dev, &m.config(128), &m.weights()).unwrap() {
        Placed::Npu(t) => t,
        Placed::Cpu(r) => panic!("refused: {r}"),
    }
}

#[test]
fn refusals_are_counted_decisions_with_their_reason() {
    let m = Model::random(&small(2, false), 1);
    // Deny-list.
    let dev = HexagonDevice::open(HexagonConfig {
        deny: vec![OpKind::Block],
        va_window_bytes: 64 << 20,
        ..Default::default()
    })
    .unwrap();
    assert!(matches!(
        HexTransformer::new(&dev, &m.config(64), &m.weights()).unwrap(),
        Placed::Cpu(Reason::Denied)
    ));
    assert_eq!(dev.stats().cpu_placements(OpKind::Block), 1);

    let dev = emulated();
    // A ggml type without a kernel, and a fused group mixing formats.
    let q8 = QTensor::quantize(&m.layers[0].down.dense.clone().unwrap(), GgmlDType::Q8_0).unwrap();
    let q4 = QTensor::quantize(&m.layers[0].k.dense.clone().unwrap(), GgmlDType::Q4_0).unwrap();
    let mut w = m.weights();
    w.layers[0].matrices[3].parts[0].1.weight = WeightRef::Quant(&q8);
    match HexTransformer::new(&dev, &m.config(64), &w).unwrap() {
        Placed::Cpu(Reason::Dtype(s)) => assert!(s.contains("q8_0"), "{s}"),
        p => panic!("{p:?}"),
    }
    let mut w = m.weights();
    w.layers[1].matrices[0].parts[1].1.weight = WeightRef::Quant(&q4);
    match HexTransformer::new(&dev, &m.config(64), &w).unwrap() {
        Placed::Cpu(Reason::Dtype(s)) => assert!(s.contains("block 1 q/k/v"), "{s}"),
        p => panic!("{p:?}"),
    }
    // Shapes the kernels do not take: 3 query heads over 2 kv heads.
    let mut sp = small(2, false);
    sp.heads = 3;
    sp.hidden = 48;
    let odd = Model::random(&sp, 2);
    assert!(matches!(
        HexTransformer::new(&dev, &odd.config(64), &odd.weights()).unwrap(),
        Placed::Cpu(Reason::Shape(_))
    ));
    assert_eq!(dev.stats().cpu_placements(OpKind::Block), 3);

    // A head without a kernel stays on the CPU; the blocks still run and return hidden rows.
    let head_q8 = QTensor::quantize(
        &m.head.as_ref().unwrap().dense.clone().unwrap(),
        GgmlDType::Q8_0,
    )
    .unwrap();
    let mut w = m.weights();
    w.tail.matrices[0].parts[0].1.weight = WeightRef::Quant(&head_q8);
    let Placed::Npu(t) = HexTransformer::new(&dev, &m.config(64), &w).unwrap() else {
        panic!("the stack should run without its head")
    };
    assert_eq!(t.output(), ForwardOutput::BeforeTailNode(1));
    assert!(matches!(t.tail_reason(), Some(Reason::Dtype(_))));
    assert_eq!(dev.stats().cpu_placements(OpKind::LinearQuant), 1);
    assert_eq!(
        dev.stats().npu_placements(OpKind::Block),
        1,
        "one stack placed"
    );

    // Malformed input is an error, not a routing decision.
    let mut w = m.weights();
    w.layers[0].matrices[0].parts[0].1.weight = m.head.as_ref().unwrap().r();
    let e = HexTransformer::new(&dev, &m.config(64), &w)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("block 0 q/k/v: its parts have 104 output rows (block 0 q 40 + block 0 k 32"),
        "{e}"
    );
    let mut cfg = m.config(64);
    cfg.heads = 0;
    let e = HexTransformer::new(&dev, &cfg, &m.weights())
        .unwrap_err()
        .to_string();
    assert!(e.contains("`heads` is 0"), "{e}");
    let mut w = m.weights();
    let bad = Tensor::ones(63, DType::F32, &Device::Cpu).unwrap();
    w.tail.vectors[0].1 = &bad;
    let e = HexTransformer::new(&dev, &m.config(64), &w)
        .unwrap_err()
        .to_string();
    assert!(e.contains("final norm is [63], expected [64]"), "{e}");

    let report = dev.routing_report().to_string();
    assert!(report.contains("| block | npu (hmx) | 1 |"), "{report}");
    assert!(report.contains("| block | cpu (dtype) | 2 |"), "{report}");
}

#[test]
fn host_access_beside_a_forward_in_flight_follows_the_leases() {
    let dev = emulated();
    let m = Model::random(&small(2, false), 3);
    let t = npu(&dev, &m);
    let mut kv = t.new_kv(1, 64).unwrap();
    let x = |seed| tensor(&[1, 8, 64], seed, 1.0, DType::F32);
    // Warm-up: plans the shape and leaves the activation buffer in the pool, so the held forward
    // below needs no DSP round trip before its batches.
    t.forward(&mut kv, &x(1), 0, None).unwrap();
    commit_rows(&mut kv, (0, 0), 0..8).unwrap();
    let (k0, v0) = kv.read_rows(0, 0..8).unwrap();

    dev.pause_queue();
    // A window inside the cache: appends rows [8, 16) for positions [4, 12).
    let handle = t.submit(&mut kv, &x(2), 4, None);
    let refresh_read = kv.read_rows(0, 0..8); // the CPU refresh path reads cached rows
    let gather = kv.read_positions(1, &[7, 2, 3]);
    let merge = kv.write_rows(
        0,
        2,
        &k0.narrow(1, 0, 2).unwrap(),
        &v0.narrow(1, 0, 2).unwrap(),
    );
    let moving_commit = commit_rows(&mut kv, (4, 8), 4..12); // a memmove from the rows the NPU writes
    let done_while_held = handle
        .as_ref()
        .map(|h| h.is_done())
        .map_err(|e| e.to_string());
    dev.resume_queue();

    let handle = handle.unwrap();
    assert_eq!(handle.batches(), 2);
    assert!(!done_while_held.unwrap());
    let (k, v) = refresh_read.unwrap();
    assert!(
        identical(&k, &k0) && identical(&v, &v0),
        "cached rows read beside the forward"
    );
    assert_eq!(gather.unwrap().0.dims(), &[1, 3, 2, 16]);
    for (what, r) in [("merge", merge), ("commit", moving_commit)] {
        assert!(matches!(r, Err(Error::Busy { .. })), "{what}: {r:?}");
    }
    handle.wait().unwrap();
    commit_rows(&mut kv, (4, 8), 4..12).unwrap();
    assert_eq!(kv.len(), 12);
    kv.write_rows(
        0,
        2,
        &k0.narrow(1, 0, 2).unwrap(),
        &v0.narrow(1, 0, 2).unwrap(),
    )
    .unwrap();
    assert_eq!(
        (kv.len(), kv.filled()),
        (12, 16),
        "a write of cached rows keeps the rows after them"
    );
    // A new window writes rows [12, 20); a host write over those rows makes them cached.
    t.forward(&mut kv, &x(3), 12, None).unwrap();
    assert_eq!((kv.len(), kv.filled()), (12, 20));
    let (k8, v8) = kv.read_rows(0, 4..12).unwrap();
    kv.write_rows(0, 12, &k8, &v8).unwrap();
    assert_eq!((kv.len(), kv.filled()), (20, 20));
    assert!(identical(&kv.read_rows(0, 12..20).unwrap().0, &k8));
}

#[test]
fn the_host_row_api_round_trips() {
    let dev = emulated();
    let m = Model::random(&small(2, false), 4);
    let t = npu(&dev, &m);
    let mut kv = t.new_kv(2, 4).unwrap();
    assert_eq!(
        (kv.layers(), kv.batch(), kv.kv_heads(), kv.head_dim()),
        (2, 2, 2, 16)
    );
    assert_eq!(kv.dtype(), DType::F16);
    let rows = |seed, n| tensor(&[2, n, 2, 16], seed, 1.0, DType::F32);
    let (k, v) = (rows(1, 6), rows(2, 6));
    kv.write_rows(1, 0, &k, &v).unwrap(); // grows past capacity 4
    assert_eq!((kv.len(), kv.stats().grows), (6, 1));
    let (rk, rv) = kv.read_rows(1, 0..6).unwrap();
    let f16 = |t: &Tensor| t.to_dtype(DType::F16).unwrap();
    assert!(identical(&rk, &f16(&k)) && identical(&rv, &f16(&v)));
    // Sparse write and gather.
    let (k2, v2) = (rows(3, 3), rows(4, 3));
    kv.write_positions(1, &[5, 1, 2], &k2, &v2).unwrap();
    let (gk, _) = kv.read_positions(1, &[5, 1, 2]).unwrap();
    assert!(identical(&gk, &f16(&k2)));
    // Copy rows [1, 3) to [6, 8): extends the cache.
    kv.copy_rows(1..3, 6).unwrap();
    assert_eq!(kv.len(), 8);
    let (a, _) = kv.read_rows(1, 6..8).unwrap();
    assert!(identical(&a, &f16(&k2).narrow(1, 1, 2).unwrap()));
    for (what, e) in [
        (
            "not inside the cached [0, 8)",
            kv.read_rows(0, 0..9).unwrap_err(),
        ),
        ("layer 2 of a 2-layer", kv.read_rows(2, 0..1).unwrap_err()),
        ("hole", kv.write_rows(0, 9, &k, &v).unwrap_err()),
        (
            "do not match",
            kv.write_rows(0, 0, &k.narrow(0, 0, 1).unwrap(), &v)
                .unwrap_err(),
        ),
        (
            "3 positions for 6 rows",
            kv.write_positions(0, &[0, 1, 2], &k, &v).unwrap_err(),
        ),
    ] {
        assert!(e.to_string().contains(what), "{what}: {e}");
    }
    let e = candle_hexagon::DeviceKv::new(&dev, 2, 0, 2, 16, 8).unwrap_err();
    assert!(e.to_string().contains("must be positive"), "{e}");
}

#[test]
fn counters_give_batches_and_bytes_per_forward() {
    let dev = emulated();
    let m = Model::random(&small(4, false), 5);
    let t = npu(&dev, &m);
    let mut kv = t.new_kv(1, 32).unwrap();
    let x = tensor(&[1, 10, 64], 9, 1.0, DType::F32);
    for rows in [None, Some(&[2usize, 4][..])] {
        let before = dev.counters();
        let y = t.forward(&mut kv, &x, 0, rows).unwrap();
        let c = dev.counters().since(&before);
        let r = rows.map_or(10, |r| r.len());
        assert_eq!(y.dims(), &[1, r, 40]);
        assert_eq!(c.dsp_batches, 2);
        // in: the input rows (f32) and their positions (i32), plus the row selection
        let sel = rows.map_or(0, |r| 4 * r.len()) as u64;
        assert_eq!(c.bytes_staged_in, 10 * 64 * 4 + 10 * 4 + sel);
        assert_eq!(c.bytes_staged_out, (r * 40 * 4) as u64);
    }
    let s = dev.stats();
    assert_eq!(
        s.calls(OpKind::Block, Decision::Npu(Tier::Hmx)),
        4,
        "2 forwards x 2 blocks"
    );
}

#[test]
fn one_stack_serves_two_sequences_on_two_threads() {
    let dev = emulated();
    let m = Model::random(&small(2, false), 6);
    let t = npu(&dev, &m);
    let xs = [
        tensor(&[1, 9, 64], 21, 1.0, DType::F32),
        tensor(&[1, 9, 64], 22, 1.0, DType::F32),
    ];
    let run = |x: &Tensor| {
        let mut kv = t.new_kv(1, 16).unwrap();
        let a = t.forward(&mut kv, x, 0, None).unwrap();
        commit_rows(&mut kv, (0, 0), 0..9).unwrap();
        let b = t
            .forward(&mut kv, &x.narrow(1, 0, 3).unwrap(), 9, None)
            .unwrap();
        (a, b)
    };
    let serial: Vec<_> = xs.iter().map(run).collect();
    let parallel: Vec<_> = std::thread::scope(|s| {
        let hs: Vec<_> = xs.iter().map(|x| s.spawn(move || run(x))).collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    for ((a, b), (c, d)) in serial.iter().zip(&parallel) {
        assert!(
            identical(a, c) && identical(b, d),
            "bit-identical on two threads"
        );
    }
}

#[test]
fn the_shared_and_per_sequence_types_cross_threads() {
    fn send_sync<T: Send + Sync>() {}
    fn send<T: Send>() {}
    send_sync::<HexTransformer>();
    send_sync::<candle_hexagon::DeviceKv>();
    send::<candle_hexagon::ForwardHandle>();
}

/// A malformed program is an error naming the node and what is wrong, never a panic or a
/// forward that reads garbage.
#[test]
fn malformed_programs_are_errors_naming_the_node() {
    use candle_hexagon::{Cols, Node};
    let dev = emulated();
    let m = Model::random(&small(2, false), 3);
    let w = m.weights();
    let err = |edit: &dyn Fn(&mut candle_hexagon::Program)| -> String {
        let mut cfg = m.config(64);
        edit(&mut cfg.program);
        HexTransformer::new(&dev, &cfg, &w).unwrap_err().to_string()
    };
    let act = |cfg: &candle_hexagon::Program, name: &str| -> usize {
        cfg.acts.iter().position(|a| a.0 == name).unwrap()
    };
    // Attention reading an activation nothing wrote.
    let e = err(&|p| {
        let att = act(p, "att");
        for n in &mut p.layer {
            if let Node::Attention { q, .. } = n {
                *q = Cols::all(att, q.len);
            }
        }
    });
    assert!(
        e.contains("layer node 7 (flash_attn)") && e.contains("`att` is read before it is written"),
        "{e}"
    );
    // A layer whose output is not where the next layer reads.
    let e = err(&|p| p.layer_output = Cols::all(act(p, "h"), 64));
    assert!(
        e.contains("the layer output `h` is not the input `x`"),
        "{e}"
    );
    // A matmul over part of an activation.
    let e = err(&|p| {
        if let Node::MatMul { x, .. } = &mut p.layer[1] {
            *x = x.sub(0, 32);
        }
    });
    assert!(
        e.contains("a matmul reads and writes whole activations"),
        "{e}"
    );
    // Columns outside the activation.
    let e = err(&|p| {
        if let Node::Rope { x } = &mut p.layer[4] {
            x.start = 1000;
        }
    });
    assert!(
        e.contains("layer node 4 (rope): columns [1000, 1064)"),
        "{e}"
    );
    // One matrix used with two shapes.
    let e = err(&|p| {
        if let Node::MatMul { weight, .. } = &mut p.layer[8] {
            *weight = 0;
        }
    });
    assert!(e.contains("matrix 0 used as"), "{e}");
    // The weights must match what the program reads.
    let mut w2 = m.weights();
    w2.layers[1].vectors.pop();
    let e = HexTransformer::new(&dev, &m.config(64), &w2)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("layer 1 has 1 vectors and 4 matrices, its program reads 2 and 4"),
        "{e}"
    );
    // Rows asked of a program that never selects rows.
    let mut cfg = m.config(64);
    cfg.program
        .layer
        .retain(|n| !matches!(n, Node::SelectRows { .. }));
    let (q, x) = (act(&cfg.program, "qkv"), act(&cfg.program, "x"));
    for n in &mut cfg.program.layer {
        match n {
            Node::Attention { q: qq, .. } => *qq = Cols::all(q, 64),
            Node::Add { acc, .. } | Node::RmsNorm { x: acc, .. }
                if acc.act == act(&m.config(64).program, "x rows") =>
            {
                *acc = Cols::all(x, 64)
            }
            _ => {}
        }
    }
    cfg.program.layer_output = Cols::all(x, 64);
    for n in &mut cfg.program.tail {
        if let Node::RmsNorm { x: xx, .. } = n {
            *xx = Cols::all(x, 64);
        }
    }
    let Placed::Npu(t) = HexTransformer::new(&dev, &cfg, &w).unwrap() else {
        panic!("a program without selection still runs")
    };
    let mut kv = t.new_kv(1, 16).unwrap();
    let xin = tensor(&[1, 4, 64], 9, 1.0, DType::F32);
    let e = t
        .forward(&mut kv, &xin, 0, Some(&[1]))
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("rows requested from a program without a row selection"),
        "{e}"
    );
    assert_eq!(
        t.forward(&mut kv, &xin, 0, None).unwrap().dims(),
        &[1, 4, 40]
    );
}

/// A program whose result is the layer stack's output itself (no tail): without a selection the
/// result is the residual stream in place (a `SelectRows` output aliases its input), with one it
/// is the requested rows — and the same values.
#[test]
fn a_program_without_a_tail_returns_the_stream_in_place() {
    let dev = emulated();
    let m = Model::random(&small(2, false), 6);
    let mut cfg = m.config(64);
    cfg.program.tail.clear();
    cfg.program.output = cfg.program.layer_output;
    let mut w = m.weights();
    w.tail = Default::default();
    let Placed::Npu(t) = HexTransformer::new(&dev, &cfg, &w).unwrap() else {
        panic!("placed")
    };
    let x = tensor(&[1, 6, 64], 11, 1.0, DType::F32);
    let mut kv = t.new_kv(1, 16).unwrap();
    let all = t.forward(&mut kv, &x, 0, None).unwrap();
    assert_eq!(all.dims(), &[1, 6, 64]);
    let mut kv = t.new_kv(1, 16).unwrap();
    let some = t.forward(&mut kv, &x, 0, Some(&[4, 1])).unwrap();
    assert_eq!(some.dims(), &[1, 2, 64]);
    let pick = all
        .index_select(&Tensor::new(&[4u32, 1], &Device::Cpu).unwrap(), 1)
        .unwrap();
    let d = max_abs(&pick, &some);
    assert!(
        d < 1e-3,
        "selected rows differ from the whole stream's by {d}"
    );
}
