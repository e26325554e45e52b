//! Weights held once (issue 29): a module's packed weights live in one shared allocation that
//! the host reads in place (`PackedWeight::bytes`, what the CPU refresh runs on) and that the NPU
//! window maps in place when the weights are resident: no second copy. Checked from outside,
//! through `/proc/self/maps`: the resident weights' window mapping is the same file, at the same
//! offset, as the host bytes, so the test fails if resident weights were copied again.

use crate::common;

use candle_core::{DType, Tensor};
use candle_hexagon::{
    HexTransformer, HexagonConfig, HexagonDevice, MemoryPolicy, Placed, TransportConfig,
};
use common::block_ref::{Model, Spec};
use common::*;

const MIB: u64 = 1 << 20;

/// One line of `/proc/self/maps`: `[start, end)`, file offset, inode.
#[derive(Debug, Clone, Copy)]
struct Map {
    start: usize,
    end: usize,
    offset: usize,
    inode: u64,
}

fn maps() -> Vec<Map> {
    std::fs::read_to_string("/proc/self/maps")
        .unwrap()
        .lines()
        .map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            let (s, e) = f[0].split_once('-').unwrap();
            Map {
                start: usize::from_str_radix(s, 16).unwrap(),
                end: usize::from_str_radix(e, 16).unwrap(),
                offset: usize::from_str_radix(f[2], 16).unwrap(),
                inode: f[4].parse().unwrap(),
            }
        })
        .collect()
}

/// `(inode, file offset)` of the host bytes `b`.
fn file_of(all: &[Map], b: &[u8]) -> (u64, usize) {
    let p = b.as_ptr() as usize;
    let m = all
        .iter()
        .find(|m| (m.start..m.end).contains(&p))
        .expect("host bytes are mapped");
    assert_ne!(
        m.inode, 0,
        "the host bytes are a file mapping (shared memory), not heap"
    );
    (m.inode, m.offset + (p - m.start))
}

/// The other mappings of `(inode, [off, off + len))`: where the NPU window shows the bytes.
fn other_views(all: &[Map], b: &[u8]) -> Vec<usize> {
    let (inode, off) = file_of(all, b);
    let host = b.as_ptr() as usize;
    all.iter()
        .filter(|m| m.inode == inode && !(m.start..m.end).contains(&host))
        .filter(|m| m.offset <= off && off + b.len() <= m.offset + (m.end - m.start))
        .map(|m| m.start + (off - m.offset))
        .collect()
}

fn run(policy: MemoryPolicy, window: u64) -> (HexagonDevice, HexTransformer) {
    run_on(policy, window, TransportConfig::Emulated)
}

fn run_on(
    policy: MemoryPolicy,
    window: u64,
    transport: TransportConfig,
) -> (HexagonDevice, HexTransformer) {
    let m = Model::random(&Spec::three_blocks(), 3);
    let dev = HexagonDevice::open(HexagonConfig {
        va_window_bytes: window,
        memory_policy: policy,
        transport,
        ..Default::default()
    })
    .unwrap();
    let t = match HexTransformer::new(&dev, &m.config(128), &m.weights()).unwrap() {
        Placed::Npu(t) => t,
        Placed::Cpu(r) => panic!("refused: {r}"),
    };
    let mut kv = t.new_kv(1, 64).unwrap();
    for i in 0..3 {
        let x: Tensor = tensor(&[1, 8, 256], 10 + i, 1.0, DType::F32);
        t.forward(&mut kv, &x, 0, None).unwrap();
    }
    (dev, t)
}

fn policy_of(label: &str) -> MemoryPolicy {
    match label.split(' ').next() {
        Some("naive") => MemoryPolicy::Naive,
        Some("paging") => MemoryPolicy::Paging,
        _ => MemoryPolicy::Somr,
    }
}

/// Every packed weight of `t`: the blocks' four groups and the head.
fn weights(t: &HexTransformer) -> Vec<candle_hexagon::PackedWeight> {
    let mut out = Vec::new();
    for i in 0..t.num_blocks() {
        out.extend((0..4).map(|j| t.packed_matrix(i, j).unwrap()));
    }
    out.extend(t.packed_tail_matrix(0));
    out
}

#[test]
fn resident_weights_are_mapped_from_the_host_bytes_not_copied() {
    // paging too: its on-demand mappings are the weight file's ranges, not copies. And on the
    // phone's path: the FastRPC transport (through the host shim, whose fastrpc_mmap maps the
    // rpcmem fd's range into its DSP window) maps each resident range by fd and offset.
    let shim = || TransportConfig::FastRpc {
        library: candle_hexagon::shim_library_path().expect("this build has the FastRPC shim"),
    };
    for (policy, transport) in [
        (MemoryPolicy::Somr, TransportConfig::Emulated),
        (MemoryPolicy::Naive, TransportConfig::Emulated),
        (MemoryPolicy::Paging, TransportConfig::Emulated),
        (MemoryPolicy::Somr, shim()),
        (MemoryPolicy::Naive, shim()),
        (MemoryPolicy::Paging, shim()),
    ] {
        let policy = format!("{policy} on {transport:?}");
        let (dev, t) = run_on(policy_of(&policy), 256 * MIB, transport);
        let all = maps();
        let ws = weights(&t);
        let total: usize = ws.iter().map(|w| w.bytes.len()).sum();
        for w in &ws {
            let views = other_views(&all, &w.bytes);
            // Exactly one other view: the NPU window's mapping of the same pages.
            assert_eq!(views.len(), 1, "{policy}: {:?} views {views:x?}", w.bytes);
            // SAFETY: the view is a live read-only mapping of `len` bytes (the module holds it).
            let seen = unsafe { std::slice::from_raw_parts(views[0] as *const u8, w.bytes.len()) };
            assert!(
                seen == &*w.bytes,
                "{policy}: the window shows the host bytes"
            );
        }
        let c = dev.counters();
        assert_eq!(
            (
                c.host_weight_bytes,
                c.shared_weight_bytes,
                c.npu_weight_bytes
            ),
            (0, total as u64, 0),
            "{policy}: {c:?}"
        );
    }
}

#[test]
fn a_copy_is_counted_where_weights_are_still_copied() {
    // somr in a window too small for every weight: the residents are mapped in place, the
    // streamed ones go through the two staging slots (copies, counted at the slots' capacity).
    let (dev, t) = run(MemoryPolicy::Somr, 2 * MIB);
    let plan = t.memory_plan().expect("somr planned");
    assert!(plan.streamed() > 0 && plan.slot_bytes > 0, "{plan}");
    let c = dev.counters();
    assert_eq!(c.npu_weight_bytes, 2 * plan.slot_bytes, "{c:?}\n{plan}");
    let all = maps();
    let ws = weights(&t);
    let in_place = ws
        .iter()
        .filter(|w| !other_views(&all, &w.bytes).is_empty())
        .count();
    assert!(
        in_place > 0 && in_place < ws.len(),
        "{in_place} of {}",
        ws.len()
    );
    drop(t);
    let c = dev.counters();
    assert_eq!(c.npu_weight_bytes, 0, "the slots go with the module: {c:?}");
    assert!(
        c.shared_weight_bytes > 0,
        "host views keep the weights: {c:?}"
    );
    drop(ws);
    let c = dev.counters();
    assert_eq!(c.shared_weight_bytes, 0, "the last view frees them: {c:?}");
}
