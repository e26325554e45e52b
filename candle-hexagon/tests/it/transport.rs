//! The emulated transport: submission returns a fence at once and the DSP works while the CPU
//! does (shown deterministically by holding the queue, then polling the completion flag without
//! waiting), kernel failures are errors naming the op,
//! and the Rust weight packings equal the kernels' own PACK ops byte for byte.

use crate::common;

use candle_core::quantized::{GgmlDType, QTensor};
use candle_core::{DType, Device};
use candle_hexagon::abi::*;
use candle_hexagon::transport::Batch;
use candle_hexagon::{layout, Error, HexagonDevice};
use common::*;

fn rows_f32(id: u32, off: u64, ne0: u32, ne1: u32) -> kdsp_tensor {
    kdsp_tensor {
        buffer_id: id,
        dtype: KDSP_DTYPE_F32,
        layout: KDSP_LAYOUT_ROW_MAJOR,
        offset: off,
        ne: [ne0, ne1, 1, 1],
        nb: [
            4,
            4 * ne0 as u64,
            4 * (ne0 * ne1) as u64,
            4 * (ne0 * ne1) as u64,
        ],
        ..Default::default()
    }
}

fn f32_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

fn from_bytes(b: &[u8]) -> Vec<f32> {
    b.chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

fn rms_norm_op(id: u32, n: u32, rows: u32) -> kdsp_op {
    let x = rows_f32(id, 0, n, rows);
    let w = rows_f32(id, 4096, n, 1);
    let mut o = kdsp_op {
        opcode: KDSP_OP_RMS_NORM,
        n_src: 2,
        dst: x,
        ..Default::default()
    };
    o.src[0] = x;
    o.src[1] = w;
    o.params.norm.eps = 1e-6;
    o
}

#[test]
fn submission_returns_before_the_dsp_runs_and_cpu_work_overlaps() {
    let dev = emulated();
    let buf = dev.map_buffer(8192).unwrap();
    let x = uniform(256, 1);
    buf.write(0, &f32_bytes(&x)).unwrap();
    buf.write(4096, &f32_bytes(&[1.0; 64])).unwrap();
    let mut batch = Batch::new();
    batch.push("rms_norm", rms_norm_op(buf.id(), 64, 4));

    dev.pause_queue();
    let fence = dev.submit(&batch).unwrap();
    // The DSP is held: nothing ran, and the host is free to work. (Results are collected before
    // asserting: a failed assertion with the queue held would leave the buffer undroppable.)
    let held = !fence.is_signaled();
    let weights_untouched = buf.read(4096, 256).map(|b| from_bytes(&b));
    let still_held = !fence.is_signaled();
    dev.resume_queue();
    assert!(held && still_held);
    assert_eq!(weights_untouched.unwrap(), vec![1.0; 64]);
    let statuses = fence.wait().unwrap();
    assert_eq!(statuses, vec![KDSP_STATUS_OK]);
    let y = from_bytes(&buf.read(0, 1024).unwrap());
    for (r, row) in y.chunks(64).enumerate() {
        let xr = &x[r * 64..(r + 1) * 64];
        let rs = 1.0 / ((xr.iter().map(|v| (v * v) as f64).sum::<f64>() / 64.0) + 1e-6).sqrt();
        for (a, b) in row.iter().zip(xr) {
            assert!((*a as f64 - *b as f64 * rs).abs() < 1e-5);
        }
    }

    // The DSP works on its own while the host does: the batch is submitted while the queue is
    // held (so it cannot have run yet), the queue is released, and the host computes in small
    // chunks, polling the completion flag between them and never waiting on the fence. The batch
    // completes during that loop. A transport that ran batches inside `submit` is ruled out
    // above; one that ran them only inside `wait` would never complete here (the poll count is
    // bounded, so it fails instead of hanging). No clock is read.
    let mut batch = Batch::new();
    for _ in 0..4 {
        batch.push("rms_norm", rms_norm_op(buf.id(), 64, 4));
    }
    dev.pause_queue();
    let fence = dev.submit(&batch).unwrap();
    let done = fence.completion();
    let ran_early = done.is_done();
    dev.resume_queue();
    assert!(!ran_early, "the batch ran while the queue was held");
    const MAX_POLLS: u64 = 10_000_000;
    let mut chunks = 0u64;
    let mut acc = 0f64;
    while !done.is_done() && chunks < MAX_POLLS {
        acc += (0..1_000).map(|i| (i as f64).sqrt()).sum::<f64>();
        chunks += 1;
        std::thread::yield_now();
    }
    assert!(
        done.is_done(),
        "the DSP made no progress while the host computed {chunks} chunks (checksum {acc:.3e})"
    );
    assert_eq!(fence.wait().unwrap(), vec![KDSP_STATUS_OK; 4]);
}

#[test]
fn host_access_that_conflicts_with_a_held_batch_is_refused_until_it_completes() {
    let dev = emulated();
    let buf = dev.map_buffer(8192).unwrap();
    let x = uniform(256, 2);
    buf.write(0, &f32_bytes(&x)).unwrap();
    buf.write(4096, &f32_bytes(&[2.0; 64])).unwrap();
    let mut batch = Batch::new();
    // writes [0, 1024) (x, in place), reads [0, 1024) and [4096, 4352) (the norm weight)
    batch.push("rms_norm", rms_norm_op(buf.id(), 64, 4));

    dev.pause_queue();
    let fence = dev.submit(&batch).unwrap();
    let write_output = buf.write(512, &[0; 16]);
    let read_output = buf.read(0, 16);
    let write_weight = buf.write(4096, &[0; 4]);
    let read_weight = buf.read(4096, 256);
    let disjoint_write = buf.write(6000, &[7; 8]);
    let disjoint_read = buf.read(1024, 64);
    let idle_while_held = buf.is_idle();
    dev.resume_queue();
    for (what, r) in [
        ("write of the output", write_output.map(|_| ())),
        ("read of the output", read_output.map(|_| ())),
        ("write of the weight", write_weight.map(|_| ())),
    ] {
        match r {
            Err(Error::Busy { buffer, op, .. }) => {
                assert_eq!((buffer, op), (buf.id(), "rms_norm"), "{what}")
            }
            r => panic!("{what}: expected Busy, got {r:?}"),
        }
    }
    assert_eq!(
        from_bytes(&read_weight.unwrap()),
        vec![2.0; 64],
        "read vs read"
    );
    disjoint_write.unwrap();
    disjoint_read.unwrap();
    assert!(!idle_while_held);
    // The lease ends with the batch, whether or not anybody waits on the fence.
    let completion = fence.completion();
    drop(fence);
    while !completion.is_done() {
        std::thread::yield_now();
    }
    assert!(buf.is_idle());
    buf.write(512, &[0; 16]).unwrap();
    let e = Error::Busy {
        buffer: 3,
        host: "write",
        start: 0,
        end: 8,
        dsp: "reads",
        op: "flash_attn",
        dsp_start: 4,
        dsp_end: 64,
    }
    .to_string();
    assert!(
        e.contains("host write of bytes [0, 8) of NPU buffer 3")
            && e.contains("reads [4, 64) (op `flash_attn`)"),
        "{e}"
    );
}

#[test]
fn kernel_failures_name_the_op_and_leave_the_device_usable() {
    let dev = emulated();
    let buf = dev.map_buffer(8192).unwrap();
    let mut batch = Batch::new();
    batch.push("good norm", rms_norm_op(buf.id(), 64, 4));
    // Buffer id 4000 was never registered.
    batch.push("bad norm", rms_norm_op(4000, 64, 4));
    batch.push("never run", rms_norm_op(buf.id(), 64, 4));
    let statuses = dev.submit(&batch).unwrap().wait().unwrap();
    assert_eq!(
        statuses,
        vec![
            KDSP_STATUS_OK,
            KDSP_STATUS_INVALID_PARAMS,
            KDSP_STATUS_NOT_RUN
        ]
    );
    let e = dev.execute(&batch).unwrap_err();
    assert!(
        matches!(
            e,
            Error::Kernel {
                op: "bad norm",
                index: 1,
                ..
            }
        ),
        "{e}"
    );
    assert!(e.to_string().contains("INVALID_PARAMS (2)"), "{e}");
    // check() validates without running; the device still works.
    let c = dev.check(&rms_norm_op(buf.id(), 64, 4)).unwrap();
    assert_eq!(c.status, KDSP_STATUS_OK);
    assert!(c.scratch > 0);
    assert_eq!(
        dev.check(&rms_norm_op(4000, 64, 4)).unwrap().status,
        KDSP_STATUS_INVALID_PARAMS
    );
    let mut ok = Batch::new();
    ok.push("norm", rms_norm_op(buf.id(), 64, 4));
    dev.execute(&ok).unwrap();
}

fn run_pack(
    dev: &HexagonDevice,
    src: &[u8],
    src_t: kdsp_tensor,
    dst_t: kdsp_tensor,
    opcode: u32,
    out_len: usize,
) -> Vec<u8> {
    let s = dev.map_buffer(src.len()).unwrap();
    let d = dev.map_buffer(out_len).unwrap();
    s.write(0, src).unwrap();
    let mut o = kdsp_op {
        opcode,
        n_src: 1,
        dst: kdsp_tensor {
            buffer_id: d.id(),
            ..dst_t
        },
        ..Default::default()
    };
    o.src[0] = kdsp_tensor {
        buffer_id: s.id(),
        ..src_t
    };
    let mut b = Batch::new();
    b.push("pack", o);
    dev.execute(&b).unwrap();
    d.read(0, out_len).unwrap()
}

#[test]
fn rust_packings_equal_the_kernels_pack_ops_and_invert_exactly() {
    let dev = emulated();
    for &(n, k) in &[(1usize, 1usize), (33, 31), (64, 96), (70, 100)] {
        let w = tensor(&[n, k], (n * k) as u64, 1.0, DType::F32);
        let w32: Vec<f32> = w.flatten_all().unwrap().to_vec1().unwrap();
        let w16: Vec<half::f16> = w32.iter().map(|&x| half::f16::from_f32(x)).collect();
        let ours = layout::pack_f16_tiles(&w16, n, k).unwrap();
        let theirs = run_pack(
            &dev,
            &f32_bytes(&w32),
            rows_f32(0, 0, k as u32, n as u32),
            kdsp_tensor {
                dtype: KDSP_DTYPE_F16,
                layout: KDSP_LAYOUT_HMX_WEIGHT_TILES,
                ne: [k as u32, n as u32, 1, 1],
                ..Default::default()
            },
            KDSP_OP_PACK_WEIGHT_F16,
            ours.len(),
        );
        assert_eq!(ours, theirs, "fp16 tiles {n}x{k}");
        let back = layout::unpack_f16_tiles(&ours, n, k).unwrap();
        assert!(back
            .iter()
            .zip(&w16)
            .all(|(a, b)| a.to_bits() == b.to_bits()));
    }
    for &(n, k) in &[(1usize, 32usize), (33, 64), (70, 96)] {
        let w = tensor(&[n, k], 77 + n as u64, 1.0, DType::F32);
        let q = QTensor::quantize(&w, GgmlDType::Q4_0).unwrap();
        let blocks = q.data().unwrap().to_vec();
        let ours = layout::pack_q4_0_tiles(&blocks, n, k).unwrap();
        let src_t = kdsp_tensor {
            dtype: KDSP_DTYPE_Q4_0,
            layout: KDSP_LAYOUT_ROW_MAJOR,
            ne: [k as u32, n as u32, 1, 1],
            nb: [
                18,
                (k / 32 * 18) as u64,
                (n * k / 32 * 18) as u64,
                (n * k / 32 * 18) as u64,
            ],
            ..Default::default()
        };
        let tile_t = kdsp_tensor {
            dtype: KDSP_DTYPE_Q4_0,
            layout: KDSP_LAYOUT_Q4_0_TILES,
            ne: [k as u32, n as u32, 1, 1],
            ..Default::default()
        };
        let theirs = run_pack(&dev, &blocks, src_t, tile_t, KDSP_OP_PACK_Q4_0, ours.len());
        assert_eq!(ours, theirs, "Q4_0 tiles {n}x{k}");
        assert_eq!(layout::unpack_q4_0_tiles(&ours, n, k).unwrap(), blocks);
        // The kernels' dequantization of our tiles equals ggml's dequantization of the blocks.
        let deq = from_bytes(&run_pack(
            &dev,
            &ours,
            tile_t,
            rows_f32(0, 0, k as u32, n as u32),
            KDSP_OP_DEQUANT_Q4_0,
            n * k * 4,
        ));
        let want: Vec<f32> = q
            .dequantize(&Device::Cpu)
            .unwrap()
            .flatten_all()
            .unwrap()
            .to_vec1()
            .unwrap();
        assert_eq!(deq, want, "dequantized {n}x{k}");
    }
}

#[test]
fn concurrent_routed_ops_do_not_wait_for_each_others_staging() {
    // Two threads run routed ops while the DSP is held. With one device-wide staging lock the
    // second op could not even stage its inputs until the first one's batch had run; with
    // pooled staging buffers both batches are submitted (and the threads wait on their own
    // fences).
    let dev = emulated();
    let (g, u) = (
        tensor(&[5, 300], 1, 3.0, DType::F32),
        tensor(&[5, 300], 2, 1.0, DType::F32),
    );
    let want = candle_hexagon::ops::elementwise::swiglu_cpu(&g, &u).unwrap();
    // Mapping a buffer is itself a DSP round trip (registration), which a held queue would
    // block: map the two staging buffers first.
    dev.prewarm_pool(2, 64 << 10).unwrap();
    assert_eq!(dev.pooled_buffers(), 2);
    let before = dev.counters().dsp_batches;
    dev.pause_queue();
    let outs = std::thread::scope(|s| {
        let run = || candle_hexagon::ops::swiglu(&dev, &g, &u);
        let a = s.spawn(run);
        let b = s.spawn(run);
        // Both staged and submitted while the DSP is held (no clock: a bounded number of polls,
        // so a second op stuck behind a device-wide staging lock fails instead of hanging).
        let mut polls = 0u64;
        while dev.counters().dsp_batches < before + 2 && polls < 10_000_000 {
            polls += 1;
            std::thread::yield_now();
        }
        let submitted = dev.counters().dsp_batches - before;
        dev.resume_queue();
        (submitted, a.join().unwrap(), b.join().unwrap())
    });
    assert_eq!(
        outs.0, 2,
        "both batches were submitted while the DSP was held"
    );
    for y in [outs.1.unwrap(), outs.2.unwrap()] {
        assert!(nmse(&y, &want) < 1e-10);
    }
    assert!(
        dev.pooled_buffers() >= 2,
        "each call had its own staging buffer"
    );
}
