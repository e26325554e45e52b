//! The planner's latency table: the NPU time of an op estimated from its descriptor (the graph
//! the forward is about to submit), and the host time to stage a weight into a slot estimated
//! from its size. `somr` plans from these before its first forward instead of profiling one
//! (a profiling forward ran every segment as its own batch and streamed the whole model once).
//!
//! The rates are assumptions, not measurements of any DSP; what the placement needs from them
//! is the ratio between an op's compute and the copy of its weight (with a few hundred rows a
//! matmul's compute hides its weight's copy many times over; with one row it does not). They
//! are of the order of the emulated DSP on this project's x86 host.

use kernels_dsp::*;

/// Assumed matmul throughput of the NPU, flop per ns (20 GFLOP/s).
pub const MATMUL_FLOP_PER_NS: f64 = 20.0;
/// Assumed throughput of the vector ops (norms, attention's softmax side, adds), bytes per ns.
pub const VECTOR_BYTES_PER_NS: f64 = 4.0;
/// Assumed host copy rate into a staging slot, bytes per ns (5 GB/s).
pub const COPY_BYTES_PER_NS: f64 = 5.0;

fn elems(t: &kdsp_tensor) -> f64 {
    t.ne.iter().map(|&x| x.max(1) as f64).product()
}

/// Estimated NPU time of `op`, ns.
pub(crate) fn op_ns(op: &kdsp_op) -> u64 {
    let ns = match op.opcode {
        KDSP_OP_MATMUL_F16 | KDSP_OP_MATMUL_Q4_0 => {
            let (a, y) = (&op.src[1], &op.dst);
            let (k, n, m) = (a.ne[0] as f64, y.ne[0] as f64, y.ne[1].max(1) as f64);
            2.0 * m * n * k / MATMUL_FLOP_PER_NS
        }
        KDSP_OP_FLASH_ATTN => {
            // q (d, rows, heads) against keys (d, positions, kv heads): two products per pair.
            let (q, k) = (&op.src[0], &op.src[1]);
            let (d, rows, heads) = (q.ne[0] as f64, q.ne[1].max(1) as f64, q.ne[2].max(1) as f64);
            4.0 * d * rows * heads * k.ne[1].max(1) as f64 / MATMUL_FLOP_PER_NS
        }
        _ => 4.0 * 3.0 * elems(&op.dst) / VECTOR_BYTES_PER_NS,
    };
    ns as u64
}

/// Estimated host time to copy `bytes` of a weight into a staging slot, ns.
pub(crate) fn stage_ns(bytes: u64) -> u64 {
    (bytes as f64 / COPY_BYTES_PER_NS) as u64
}
