//! Routing: which ops run on the NPU, why the others do not, and how often each happened.
//!
//! [`crate::HexagonDevice::supports`] is the one entry point (ggml's `supports_op`): it takes an
//! [`OpDesc`] and returns [`Support::Yes`] with the hardware [`Tier`] the kernel targets, or
//! [`Support::No`] with a [`Reason`]. Every decision — at load time (where a weight lives) and per
//! call (where an op runs) — is counted in [`RoutingStats`], which prints as a table.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use candle_core::DType;

use crate::error::{fmt_bytes, Error};
use crate::kinds::{MemoryPolicy, SwapSnapshot};
pub use crate::kinds::{OpKind, WeightFormat};
use crate::memory::MemoryStats;

/// A description of one op call (or, with `rows == 0`, of a weight placement at load time).
#[derive(Debug, Clone, PartialEq)]
pub enum OpDesc {
    /// `y = x W^T (+ b)`, `W` of shape `(n, k)`.
    Linear {
        /// Weight storage.
        weights: WeightFormat,
        /// Output features.
        n: usize,
        /// Input features.
        k: usize,
        /// Activation rows (0 at load time).
        rows: usize,
        /// Activation dtype.
        dtype: DType,
    },
    /// Attention of `q (b, q_len, q_heads, head_dim)` over `k, v (b, kv_len, kv_heads, head_dim)`.
    FlashAttn {
        /// Batch.
        batch: usize,
        /// Queries per item.
        q_len: usize,
        /// Keys per item.
        kv_len: usize,
        /// Query heads.
        q_heads: usize,
        /// Key/value heads.
        kv_heads: usize,
        /// Head dimension.
        head_dim: usize,
        /// Dtype of q (and of the output).
        dtype: DType,
    },
    /// RMSNorm over the last dimension.
    RmsNorm {
        /// Rows.
        rows: usize,
        /// Normalised dimension.
        hidden: usize,
        /// Dtype.
        dtype: DType,
    },
    /// Elementwise `silu(gate) * up`.
    Swiglu {
        /// Elements.
        elems: usize,
        /// Dtype.
        dtype: DType,
    },
    /// A stack of transformer blocks as one batch per block ([`crate::block::HexTransformer`]);
    /// weight formats are checked per fused group by the module.
    Block {
        /// Query heads.
        heads: usize,
        /// Key/value heads.
        kv_heads: usize,
        /// Head dimension.
        head_dim: usize,
        /// The widest dimension any of its ops sees (the widest activation of its program, or
        /// the rotary tables' positions).
        widest: usize,
    },
    /// NeoX RoPE of `x (b, n, heads, head_dim)` with per-row tables.
    Rope {
        /// `b * n`.
        rows: usize,
        /// Heads.
        heads: usize,
        /// Head dimension.
        head_dim: usize,
        /// Dtype.
        dtype: DType,
    },
}

impl OpDesc {
    /// The op kind this call is counted under.
    pub fn kind(&self) -> OpKind {
        match self {
            OpDesc::Linear { weights, .. } => match weights {
                WeightFormat::Dense(_) => OpKind::LinearF16,
                WeightFormat::Q4_0 => OpKind::LinearQ4_0,
                WeightFormat::OtherQuant(_) => OpKind::LinearQuant,
            },
            OpDesc::FlashAttn { .. } => OpKind::FlashAttn,
            OpDesc::RmsNorm { .. } => OpKind::RmsNorm,
            OpDesc::Swiglu { .. } => OpKind::Swiglu,
            OpDesc::Rope { .. } => OpKind::Rope,
            OpDesc::Block { .. } => OpKind::Block,
        }
    }

    /// The activation dtype.
    pub fn dtype(&self) -> DType {
        match self {
            OpDesc::Linear { dtype, .. }
            | OpDesc::FlashAttn { dtype, .. }
            | OpDesc::RmsNorm { dtype, .. }
            | OpDesc::Swiglu { dtype, .. }
            | OpDesc::Rope { dtype, .. } => *dtype,
            // activations stay f32 between the block's ops
            OpDesc::Block { .. } => DType::F32,
        }
    }
}

/// The hardware unit a routed kernel is written for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Tier {
    /// HMX (fp16 32x32 tile multiply-accumulate).
    Hmx,
    /// HVX (128-byte vectors: integer Q4_0 dots, FlashAttention, norms, elementwise).
    Hvx,
}

impl fmt::Display for Tier {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Tier::Hmx => "hmx",
            Tier::Hvx => "hvx",
        })
    }
}

/// Why an op stays on the CPU.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reason {
    /// The op is on the config's deny-list.
    Denied,
    /// An activation or weight dtype the kernels do not take.
    Dtype(String),
    /// A shape outside the kernels' limits.
    Shape(String),
    /// Data not aligned the way the kernel layout needs (e.g. Q4_0 rows not whole blocks).
    Alignment(String),
    /// The NPU address window cannot hold what the op needs.
    VaBudget {
        /// Bytes needed.
        need: u64,
        /// Largest free range.
        have: u64,
    },
    /// Every mapper entry of the session is in use.
    MapperEntries {
        /// Entries of the session.
        limit: usize,
    },
}

impl Reason {
    /// The short key decisions are counted under.
    pub fn key(&self) -> &'static str {
        match self {
            Reason::Denied => "denied",
            Reason::Dtype(_) => "dtype",
            Reason::Shape(_) => "shape",
            Reason::Alignment(_) => "alignment",
            Reason::VaBudget { .. } => "va_budget",
            Reason::MapperEntries { .. } => "mapper_entries",
        }
    }

    /// The reason for a resource error, if it is one.
    pub fn from_error(e: &Error) -> Option<Reason> {
        match e {
            Error::VaBudget { need, have, .. } => Some(Reason::VaBudget {
                need: *need,
                have: *have,
            }),
            Error::MapperEntries { limit } => Some(Reason::MapperEntries { limit: *limit }),
            _ => None,
        }
    }
}

impl fmt::Display for Reason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Reason::Denied => f.write_str("denied by the config's deny-list"),
            Reason::Dtype(s) => write!(f, "dtype: {s}"),
            Reason::Shape(s) => write!(f, "shape: {s}"),
            Reason::Alignment(s) => write!(f, "alignment: {s}"),
            Reason::VaBudget { need, have } => write!(
                f,
                "NPU address space: need {}, have {}",
                fmt_bytes(*need),
                fmt_bytes(*have)
            ),
            Reason::MapperEntries { limit } => {
                write!(f, "all {limit} NPU mapper entries in use")
            }
        }
    }
}

/// The answer of [`crate::HexagonDevice::supports`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Support {
    /// The NPU runs it, on this unit.
    Yes(Tier),
    /// The CPU runs it, for this reason.
    No(Reason),
}

/// Where a decision sent an op.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Decision {
    /// NPU, on this unit.
    Npu(Tier),
    /// CPU, for the reason with this key.
    Cpu(&'static str),
}

impl fmt::Display for Decision {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Decision::Npu(t) => write!(f, "npu ({t})"),
            Decision::Cpu(r) => write!(f, "cpu ({r})"),
        }
    }
}

impl From<&Support> for Decision {
    fn from(s: &Support) -> Self {
        match s {
            Support::Yes(t) => Decision::Npu(*t),
            Support::No(r) => Decision::Cpu(r.key()),
        }
    }
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct Count {
    n: u64,
    bytes: u64,
    ns: u64,
}

/// Decision counters: per call (where ops ran) and per weight placement (where weights live).
#[derive(Debug, Default)]
pub struct RoutingStats {
    calls: Mutex<BTreeMap<(OpKind, Decision), Count>>,
    placements: Mutex<BTreeMap<(OpKind, Decision), Count>>,
    batches: AtomicU64,
    dsp_ops: AtomicU64,
}

impl RoutingStats {
    /// Count one submitted batch of `ops` DSP ops.
    pub fn record_batch(&self, ops: usize) {
        self.batches.fetch_add(1, Ordering::Relaxed);
        self.dsp_ops.fetch_add(ops as u64, Ordering::Relaxed);
    }

    /// Batches submitted to the DSP.
    pub fn batches(&self) -> u64 {
        self.batches.load(Ordering::Relaxed)
    }

    /// DSP ops submitted (a routed call is one or more ops, e.g. a linear split by rows).
    pub fn dsp_ops(&self) -> u64 {
        self.dsp_ops.load(Ordering::Relaxed)
    }

    /// Count one call: `bytes` of staging it used (0 on the CPU) and its wall time in ns
    /// (staging, DSP work and copies for the NPU; the CPU op otherwise).
    pub fn record_call(&self, kind: OpKind, d: Decision, bytes: u64, ns: u64) {
        let mut m = self.calls.lock().expect("stats lock");
        let c = m.entry((kind, d)).or_default();
        c.n += 1;
        c.bytes += bytes;
        c.ns += ns;
    }

    /// Count one weight placement of `bytes` (packed size on the NPU, 0 on the CPU).
    pub fn record_placement(&self, kind: OpKind, d: Decision, bytes: u64) {
        let mut m = self.placements.lock().expect("stats lock");
        let c = m.entry((kind, d)).or_default();
        c.n += 1;
        c.bytes += bytes;
    }

    /// Calls counted for `(kind, decision)`.
    pub fn calls(&self, kind: OpKind, d: Decision) -> u64 {
        self.calls
            .lock()
            .expect("stats lock")
            .get(&(kind, d))
            .map(|c| c.n)
            .unwrap_or(0)
    }

    /// Calls of `kind` that ran on the NPU (any tier).
    pub fn npu_calls(&self, kind: OpKind) -> u64 {
        self.sum(&self.calls, kind, true)
    }

    /// Calls of `kind` that ran on the CPU (any reason).
    pub fn cpu_calls(&self, kind: OpKind) -> u64 {
        self.sum(&self.calls, kind, false)
    }

    /// Weights of `kind` placed on the NPU.
    pub fn npu_placements(&self, kind: OpKind) -> u64 {
        self.sum(&self.placements, kind, true)
    }

    /// Weights of `kind` kept on the CPU.
    pub fn cpu_placements(&self, kind: OpKind) -> u64 {
        self.sum(&self.placements, kind, false)
    }

    fn sum(&self, m: &Mutex<BTreeMap<(OpKind, Decision), Count>>, kind: OpKind, npu: bool) -> u64 {
        m.lock()
            .expect("stats lock")
            .iter()
            .filter(|((k, d), _)| *k == kind && matches!(d, Decision::Npu(_)) == npu)
            .map(|(_, c)| c.n)
            .sum()
    }

    /// Forget all counts.
    pub fn reset(&self) {
        self.calls.lock().expect("stats lock").clear();
        self.placements.lock().expect("stats lock").clear();
        self.batches.store(0, Ordering::Relaxed);
        self.dsp_ops.store(0, Ordering::Relaxed);
    }

    fn snapshot(&self) -> (Vec<Row>, Vec<Row>) {
        let rows = |m: &Mutex<BTreeMap<(OpKind, Decision), Count>>| {
            m.lock()
                .expect("stats lock")
                .iter()
                .map(|(&(kind, decision), c)| Row {
                    kind,
                    decision,
                    n: c.n,
                    bytes: c.bytes,
                    ms: c.ns as f64 / 1e6,
                })
                .collect()
        };
        (rows(&self.placements), rows(&self.calls))
    }
}

#[derive(Debug, Clone, PartialEq)]
struct Row {
    kind: OpKind,
    decision: Decision,
    n: u64,
    bytes: u64,
    ms: f64,
}

/// A printable snapshot of routing decisions and memory counters.
#[derive(Debug, Clone)]
pub struct RoutingReport {
    header: String,
    placements: Vec<Row>,
    calls: Vec<Row>,
    batches: u64,
    dsp_ops: u64,
    memory: MemoryStats,
    swap: (MemoryPolicy, SwapSnapshot),
}

impl RoutingReport {
    pub(crate) fn new(
        header: String,
        stats: &RoutingStats,
        memory: MemoryStats,
        swap: (MemoryPolicy, SwapSnapshot),
    ) -> Self {
        let (placements, calls) = stats.snapshot();
        RoutingReport {
            header,
            placements,
            calls,
            batches: stats.batches(),
            dsp_ops: stats.dsp_ops(),
            memory,
            swap,
        }
    }
}

/// A byte count for a table cell (`-` for none).
fn bytes_cell(bytes: u64) -> String {
    if bytes > 0 {
        fmt_bytes(bytes)
    } else {
        "-".into()
    }
}

impl fmt::Display for RoutingReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "{}", self.header)?;
        writeln!(f)?;
        if !self.placements.is_empty() {
            writeln!(f, "| weights | placed on | tensors | packed bytes |")?;
            writeln!(f, "|---|---|---:|---:|")?;
            for r in &self.placements {
                writeln!(
                    f,
                    "| {} | {} | {} | {} |",
                    r.kind,
                    r.decision,
                    r.n,
                    bytes_cell(r.bytes)
                )?;
            }
            writeln!(f)?;
        }
        writeln!(f, "| op | ran on | calls | staging bytes | wall time |")?;
        writeln!(f, "|---|---|---:|---:|---:|")?;
        if self.calls.is_empty() {
            writeln!(f, "| (none) | | 0 | | |")?;
        }
        for r in &self.calls {
            writeln!(
                f,
                "| {} | {} | {} | {} | {:.1} ms |",
                r.kind,
                r.decision,
                r.n,
                bytes_cell(r.bytes),
                r.ms
            )?;
        }
        let m = &self.memory;
        writeln!(f)?;
        writeln!(
            f,
            "DSP: {} batches, {} ops submitted",
            self.batches, self.dsp_ops
        )?;
        write!(
            f,
            "memory: {} maps, {} unmaps, {} refused; peak VA {} of a {} window; peak {} of {} \
             mapper entries; weights {}; staged {} in / {} out",
            m.va.maps,
            m.va.unmaps,
            m.va.refused,
            fmt_bytes(m.va.peak_mapped_bytes),
            fmt_bytes(m.va.window_bytes),
            m.va.peak_entries,
            m.va.entry_limit,
            fmt_bytes(m.weight_bytes),
            fmt_bytes(m.staged_in),
            fmt_bytes(m.staged_out)
        )?;
        if m.release_failures > 0 {
            write!(f, "; {} buffer releases FAILED", m.release_failures)?;
        }
        let (policy, s) = self.swap;
        if s.forwards > 0 {
            write!(
                f,
                "\nmemory runtime ({policy}): {} forwards; {} streamed; stall {:.1} ms, overlapped \
                 {:.1} ms ({:.0}% of staging overlapped); {} plans, {} evictions",
                s.forwards,
                fmt_bytes(s.bytes_streamed),
                s.stall_ns as f64 / 1e6,
                s.overlapped_ns as f64 / 1e6,
                100.0 * s.overlapped_fraction().unwrap_or(0.0),
                s.plans,
                s.evictions
            )?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deny_lists_parse_and_reject_unknown_names() {
        assert_eq!(
            OpKind::parse_list("rope, linear,rope").unwrap(),
            vec![OpKind::LinearF16, OpKind::LinearQ4_0, OpKind::Rope]
        );
        assert!(OpKind::parse_list("").unwrap().is_empty());
        let e = OpKind::parse_list("flash").unwrap_err().to_string();
        assert!(e.contains("`flash`") && e.contains("flash_attn"), "{e}");
    }

    #[test]
    fn stats_count_and_print() {
        let s = RoutingStats::default();
        s.record_call(OpKind::RmsNorm, Decision::Npu(Tier::Hvx), 100, 1_000_000);
        s.record_call(OpKind::RmsNorm, Decision::Npu(Tier::Hvx), 100, 500_000);
        s.record_call(OpKind::RmsNorm, Decision::Cpu("denied"), 0, 0);
        s.record_placement(OpKind::LinearQuant, Decision::Cpu("dtype"), 0);
        assert_eq!(s.npu_calls(OpKind::RmsNorm), 2);
        assert_eq!(s.cpu_calls(OpKind::RmsNorm), 1);
        assert_eq!(s.cpu_placements(OpKind::LinearQuant), 1);
        let r = RoutingReport::new(
            "t".into(),
            &s,
            MemoryStats::default(),
            (MemoryPolicy::Somr, SwapSnapshot::default()),
        )
        .to_string();
        assert!(
            r.contains("| rms_norm | npu (hvx) | 2 | 200 B | 1.5 ms |"),
            "{r}"
        );
        assert!(
            r.contains("| rms_norm | cpu (denied) | 1 | - | 0.0 ms |"),
            "{r}"
        );
        assert!(r.contains("| linear_quant | cpu (dtype) | 1 | - |"), "{r}");
        s.reset();
        assert_eq!(s.npu_calls(OpKind::RmsNorm), 0);
    }
}
