//! The memory runtime under its three policies (`naive`, `paging`, `somr`) on a block stack
//! larger than the NPU window: who completes and who fails (with the window's own error), that
//! every policy computes the same bits, that `somr` streams through its slots without mapping
//! anything in steady state, that a slot is never refilled while a batch still reads it, and
//! that a larger activation buffer makes `somr` release its residents and re-plan.

use crate::common;

use candle_core::{DType, Tensor};
use candle_hexagon::{
    DeviceCounters, HexTransformer, HexagonConfig, HexagonDevice, MemoryPolicy, Placed,
};
use common::block_ref::{self, compare, values_of, Model, RefKv, Spec};
use common::*;

const MIB: u64 = 1 << 20;

fn device(policy: MemoryPolicy, window: u64, cap: Option<u64>) -> HexagonDevice {
    HexagonDevice::open(HexagonConfig {
        va_window_bytes: window,
        memory_policy: policy,
        resident_weight_bytes: cap,
        ..Default::default()
    })
    .unwrap()
}

fn npu(dev: &HexagonDevice, m: &Model) -> HexTransformer {
    match HexTransformer::new(dev, &m.config(128), &m.weights()).unwrap() {
        Placed::Npu(t) => t,
        Placed::Cpu(r) => panic!("refused: {r}"),
    }
}

fn x(n: usize, seed: u64) -> Tensor {
    tensor(&[1, n, 256], seed, 1.0, DType::F32)
}

/// The forwards every policy runs: a prefill, windows after and inside the cache, a row
/// selection; long enough for `somr` to profile, plan and reach its steady state.
fn script() -> Vec<(usize, usize, Option<Vec<usize>>, bool)> {
    // (window start, rows, selection, commit)
    let mut s = vec![(0, 16, None, true)];
    for k in 0..3 {
        s.push((16 + 4 * k, 4, None, true));
        s.push((10, 8, Some(vec![1, 3]), false));
    }
    s
}

/// Run the script; the logits of every forward, or the first error.
fn run(dev: &HexagonDevice, m: &Model) -> candle_hexagon::Result<Vec<Tensor>> {
    let t = npu(dev, m);
    let mut kv = t.new_kv(1, 64)?;
    let mut out = Vec::new();
    for (i, (ws, n, sel, commit)) in script().into_iter().enumerate() {
        let base = kv.len();
        out.push(t.forward(&mut kv, &x(n, 100 + i as u64), ws, sel.as_deref())?);
        if commit {
            commit_rows(&mut kv, (ws, base), ws..ws + n)?;
        }
    }
    if let Some(p) = t.memory_plan() {
        eprintln!("{p}\n");
    }
    Ok(out)
}

fn same(a: &[Tensor], b: &[Tensor]) -> bool {
    a.len() == b.len() && a.iter().zip(b).all(|(x, y)| identical(x, y))
}

#[test]
fn every_policy_computes_the_same_bits_and_the_reference() {
    let m = Model::random(&Spec::three_blocks(), 7);
    let want = run(&device(MemoryPolicy::Naive, 256 * MIB, None), &m).unwrap();
    // The reference for the first forward (the prefill).
    let mut rkv = RefKv::new(3, 1);
    let all: Vec<usize> = (0..16).collect();
    let r = block_ref::forward(&m, &mut rkv, &values_of(&x(16, 100)), 1, 0, &all);
    let (err, _) = compare(&want[0], &r);
    assert!(err < 1e-4, "NMSE {err:.2e} against the f64 reference");
    for (what, policy, window, cap) in [
        (
            "paging, large window",
            MemoryPolicy::Paging,
            256 * MIB,
            None,
        ),
        (
            "somr, large window: all resident",
            MemoryPolicy::Somr,
            256 * MIB,
            None,
        ),
        (
            "somr, no resident weights",
            MemoryPolicy::Somr,
            256 * MIB,
            Some(0),
        ),
        (
            "somr, 1 MiB of resident weights",
            MemoryPolicy::Somr,
            256 * MIB,
            Some(MIB),
        ),
        ("somr, 2 MiB window", MemoryPolicy::Somr, 2 * MIB, None),
        ("paging, 3 MiB window", MemoryPolicy::Paging, 3 * MIB, None),
    ] {
        let got = run(&device(policy, window, cap), &m).unwrap();
        assert!(same(&got, &want), "{what}: not bit-identical to naive");
    }
}

#[test]
fn naive_fails_with_the_window_error_where_paging_and_somr_complete() {
    let m = Model::random(&Spec::three_blocks(), 8);
    // 2 MiB: naive cannot keep the weights, which its placement sees from the shapes before
    // anything is packed or mapped (the numbers in the error); paging's placement fits (one
    // block's weights) but its forward cannot hold a block's weights beside the pool's activation
    // buffer (a 1 MiB minimum mapping); somr plans around both.
    let dev = device(MemoryPolicy::Naive, 2 * MIB, None);
    let e = HexTransformer::new(&dev, &m.config(128), &m.weights()).unwrap_err();
    // What naive would map: the packed stack (its weights and pinned vectors), 3.9 MiB.
    let weights = npu(&device(MemoryPolicy::Naive, 256 * MIB, None), &m).packed_bytes() as u64;
    match &e {
        candle_hexagon::Error::WontFit {
            policy,
            need,
            window,
            ..
        } => {
            assert_eq!((*policy, *window), ("naive", 2 * MIB), "{e}");
            // The estimate leaves out the biases' pinned bytes (unknown before reading).
            assert!(
                *need + 64 * 1024 >= weights && *need < weights + MIB,
                "{weights}: {e}"
            );
        }
        other => panic!("not WontFit: {other}"),
    }
    assert!(e.to_string().contains("`naive` memory policy"), "{e}");
    assert_eq!(dev.memory_stats().va.maps, 0, "nothing was mapped");
    let e = run(&device(MemoryPolicy::Paging, 2 * MIB, None), &m).unwrap_err();
    assert!(e.is_resource_exhausted(), "paging: {e}");
    assert!(e.to_string().contains("NPU address space exhausted"), "{e}");

    // Per forward once steady: somr maps nothing and streams through its slots; paging maps
    // and unmaps weights every forward.
    let steady = |policy, window| {
        let dev = device(policy, window, None);
        let t = npu(&dev, &m);
        let mut kv = t.new_kv(1, 64).unwrap();
        t.forward(&mut kv, &x(16, 1), 0, None).unwrap();
        commit_rows(&mut kv, (0, 0), 0..16).unwrap();
        let mut per: Vec<DeviceCounters> = Vec::new();
        for i in 0..4 {
            let before = dev.counters();
            t.forward(&mut kv, &x(8, 2 + i), 16, None).unwrap();
            per.push(dev.counters().since(&before));
        }
        (per, t.memory_plan(), dev)
    };
    let (somr, plan, dev) = steady(MemoryPolicy::Somr, 2 * MIB);
    let plan = plan.expect("somr made a plan");
    eprintln!("{plan}");
    assert!(plan.streamed() > 0 && plan.slot_bytes > 0);
    assert!(
        plan.act_bytes < plan.act_unpacked_bytes,
        "activations share offsets"
    );
    for c in &somr[1..] {
        assert_eq!(
            (c.maps, c.unmaps),
            (0, 0),
            "steady somr forwards map nothing: {c:?}"
        );
        assert!(c.bytes_streamed > 0 && c.forwards == 1, "{c:?}");
        assert!(c.dsp_batches as usize >= t_blocks(&plan), "{c:?}");
    }
    let s = dev.swap_counters();
    assert_eq!(s.plans, 1, "{s:?}");
    let report = dev.routing_report().to_string();
    assert!(report.contains("memory runtime (somr)"), "{report}");

    // Paging maps and unmaps every forward, each weight's range of the weight file in place:
    // nothing is copied and no second copy of a weight is held.
    let (paging, _, dev) = steady(MemoryPolicy::Paging, 3 * MIB);
    for c in &paging[1..] {
        assert!(c.maps > 0 && c.unmaps > 0, "{c:?}");
        assert_eq!(c.bytes_streamed, 0, "{c:?}");
    }
    assert_eq!(dev.memory_stats().npu_weight_bytes, 0, "no NPU-side copies");
}

fn t_blocks(plan: &candle_hexagon::MemoryPlan) -> usize {
    plan.blocks
}

#[test]
fn a_slot_is_never_overwritten_while_a_batch_reads_it() {
    let m = Model::random(&Spec::three_blocks(), 9);
    let dev = device(MemoryPolicy::Somr, 256 * MIB, Some(0));
    let t = npu(&dev, &m);
    let mut kv = t.new_kv(1, 64).unwrap();
    // Profiling forward, then two planned ones: slots warm, the first stage prefetched.
    let mut want = Vec::new();
    for i in 0..4 {
        want.push(t.forward(&mut kv, &x(8, 50 + i), 0, None).unwrap());
    }
    let plan = t.memory_plan().unwrap();
    assert_eq!(plan.streamed(), plan.rows.len(), "nothing resident");
    assert!(plan.stages >= 3, "{plan}");

    // Hold the DSP: the forward submits the stages whose slots are free, then waits for the
    // stage reading the slot it needs next instead of overwriting it. No clock: the test waits
    // for the runtime's own event (`slot_waits`, counted before the forward blocks), or for the
    // forward to get past the point where it should have waited (more batches, or done).
    let mut kv2 = t.new_kv(1, 64).unwrap();
    dev.pause_queue();
    let before = dev.counters();
    let waits_before = dev.swap_counters().slot_waits;
    let (finished_while_held, held, waited, got) = std::thread::scope(|s| {
        let h = s.spawn(|| t.forward(&mut kv2, &x(8, 50), 0, None));
        loop {
            let waited = dev.swap_counters().slot_waits > waits_before;
            if waited || h.is_finished() || dev.counters().since(&before).dsp_batches > 2 {
                break;
            }
            std::thread::yield_now();
        }
        // The forward is blocked on slot 0's reader (or past it, which fails below): the
        // counters are stable while the DSP is held.
        let held = dev.counters().since(&before);
        let waited = dev.swap_counters().slot_waits - waits_before;
        let finished = h.is_finished();
        dev.resume_queue();
        (finished, held, waited, h.join().unwrap())
    });
    assert!(!finished_while_held, "the forward waits for its slot");
    assert_eq!(waited, 1, "it waited once, for slot 0's reader");
    assert_eq!(
        held.dsp_batches, 2,
        "two stages queued (slots 0 and 1), the third waits for slot 0's reader"
    );
    assert!(identical(&got.unwrap(), &want[0]), "same bits as before");
}

#[test]
fn a_larger_activation_buffer_demotes_residents_and_replans() {
    let m = Model::random(&Spec::three_blocks(), 10);
    let reference = {
        let dev = device(MemoryPolicy::Naive, 256 * MIB, None);
        let t = npu(&dev, &m);
        let mut kv = t.new_kv(1, 64).unwrap();
        let a = t.forward(&mut kv, &x(4, 1), 0, None).unwrap();
        let b = t.forward(&mut kv, &x(4, 2), 0, None).unwrap();
        let c = t.forward(&mut kv, &x(48, 3), 0, None).unwrap();
        [a, b, c]
    };
    let dev = device(MemoryPolicy::Somr, 2 * MIB, None);
    let t = npu(&dev, &m);
    let mut kv = t.new_kv(1, 64).unwrap();
    let a = t.forward(&mut kv, &x(4, 1), 0, None).unwrap();
    let b = t.forward(&mut kv, &x(4, 2), 0, None).unwrap();
    let first = t.memory_plan().unwrap();
    let c = t.forward(&mut kv, &x(48, 3), 0, None).unwrap();
    let second = t.memory_plan().unwrap();
    for (got, want) in [a, b, c].iter().zip(&reference) {
        assert!(identical(got, want));
    }
    let s = dev.swap_counters();
    assert!(s.plans >= 2 && s.evictions > 0, "{s:?}");
    assert!(second.act_bytes > first.act_bytes);
    assert!(
        second.resident_bytes < first.resident_bytes,
        "{first}\n{second}"
    );
}

/// `somr` plans from the graph before its first forward: no forward, the first included, streams
/// more than the weights that are not resident (each streamed weight once), and each forward is
/// the plan's stages (no profiling forward of one batch per segment).
#[test]
fn somr_plans_before_its_first_forward_and_streams_each_weight_once() {
    let m = Model::random(&Spec::three_blocks(), 10);
    for (window, cap) in [
        (2 * MIB, None),
        (256 * MIB, Some(0)),
        (256 * MIB, Some(MIB)),
    ] {
        let dev = device(MemoryPolicy::Somr, window, cap);
        let t = npu(&dev, &m);
        let weights = t.packed_bytes() as u64;
        let mut kv = t.new_kv(1, 64).unwrap();
        for (i, (ws, n)) in [(0, 16), (16, 4), (20, 8)].into_iter().enumerate() {
            let before = dev.counters();
            let base = kv.len();
            t.forward(&mut kv, &x(n, 70 + i as u64), ws, None).unwrap();
            commit_rows(&mut kv, (ws, base), ws..ws + n).unwrap();
            let c = dev.counters().since(&before);
            let plan = t.memory_plan().expect("a plan");
            let streamed_weights: u64 = plan
                .rows
                .iter()
                .filter(|r| !r.resident)
                .map(|r| r.bytes)
                .sum();
            assert!(plan.streamed() > 0, "{plan}");
            assert!(streamed_weights <= weights - plan.resident_bytes.min(weights));
            // Forward i stages its own streamed stages (its first one prefetched by forward
            // i - 1, or by itself when it is the first), and while it ends prefetches forward
            // i + 1's first stage: the streamed weights once, plus one stage ahead.
            let first_stage = plan
                .stage_plan
                .iter()
                .find(|s| s.slot.is_some())
                .map_or(0, |s| s.streamed_bytes);
            assert!(
                c.bytes_streamed <= streamed_weights + first_stage,
                "forward {i} ({window} B window, cap {cap:?}): streamed {} of {streamed_weights} streamed bytes\n{plan}",
                c.bytes_streamed
            );
            assert_eq!(c.dsp_batches as usize, plan.stages, "forward {i}\n{plan}");
        }
        assert_eq!(dev.swap_counters().plans, 1);
    }
}
