//! Small shared vocabulary types (op kinds, weight formats, memory policies, swap snapshots),
//! kept below `config`, `layout`, `routing` and `runtime` so those modules can share them without
//! importing each other. Each is re-exported from its public path (`crate::routing`,
//! `crate::runtime`, the crate root).

use std::fmt;

use candle_core::DType;

use crate::error::{ConfigProblem, Error, Result};

/// The ops the backend routes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum OpKind {
    /// Linear layer over fp16 HMX weight tiles (dense checkpoints).
    LinearF16,
    /// Linear layer over Q4_0 tiles (GGUF Q4_0 weights).
    LinearQ4_0,
    /// Linear layer over another ggml quantization (no kernel: always CPU).
    LinearQuant,
    /// Bidirectional FlashAttention with GQA.
    FlashAttn,
    /// RMSNorm.
    RmsNorm,
    /// `silu(gate) * up`.
    Swiglu,
    /// NeoX rotary embedding.
    Rope,
    /// A whole transformer block as one DSP batch ([`crate::block::HexTransformer`]).
    Block,
}

impl OpKind {
    /// Every op kind.
    pub const ALL: [OpKind; 8] = [
        OpKind::LinearF16,
        OpKind::LinearQ4_0,
        OpKind::LinearQuant,
        OpKind::FlashAttn,
        OpKind::RmsNorm,
        OpKind::Swiglu,
        OpKind::Rope,
        OpKind::Block,
    ];

    /// The names a deny-list takes: `linear` (both linear kinds), then each kind's
    /// [`OpKind::name`].
    pub const DENY_NAMES: &'static [&'static str] = &[
        "linear",
        "linear_f16",
        "linear_q4_0",
        "linear_quant",
        "flash_attn",
        "rms_norm",
        "swiglu",
        "rope",
        "block",
    ];

    /// The name used in deny-lists and reports.
    pub fn name(self) -> &'static str {
        match self {
            OpKind::LinearF16 => "linear_f16",
            OpKind::LinearQ4_0 => "linear_q4_0",
            OpKind::LinearQuant => "linear_quant",
            OpKind::FlashAttn => "flash_attn",
            OpKind::RmsNorm => "rms_norm",
            OpKind::Swiglu => "swiglu",
            OpKind::Rope => "rope",
            OpKind::Block => "block",
        }
    }

    /// Parse a comma-separated deny-list (`linear` means both linear kinds). Unknown names are an
    /// error naming the valid ones.
    pub fn parse_list(s: &str) -> Result<Vec<OpKind>> {
        let mut out = Vec::new();
        for name in s.split(',').map(str::trim).filter(|n| !n.is_empty()) {
            if name == "linear" {
                out.extend([OpKind::LinearF16, OpKind::LinearQ4_0]);
                continue;
            }
            match OpKind::ALL.iter().find(|k| k.name() == name) {
                Some(k) => out.push(*k),
                None => {
                    return Err(Error::config(
                        "deny",
                        ConfigProblem::Unknown {
                            value: name.to_string(),
                            expected: OpKind::DENY_NAMES,
                        },
                    ))
                }
            }
        }
        out.sort();
        out.dedup();
        Ok(out)
    }
}

impl fmt::Display for OpKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// How a linear layer's weights are stored in the checkpoint.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WeightFormat {
    /// A dense tensor (converted to fp16 HMX tiles at load).
    Dense(DType),
    /// ggml Q4_0 blocks (repacked to Q4_0 tiles at load).
    Q4_0,
    /// Another ggml quantization, by name (`q8_0`, `q4k`, ...).
    OtherQuant(String),
}

/// How a weight-owning module shares the NPU address window (see the crate README's memory runtime section).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum MemoryPolicy {
    /// Map every weight when first used and keep it mapped.
    Naive,
    /// On-demand map/unmap with LRU replacement; no plan, no prefetch.
    Paging,
    /// Graph-guided placement, lifetime packing and pipelined staging.
    #[default]
    Somr,
}

impl MemoryPolicy {
    /// Every policy.
    pub const ALL: [MemoryPolicy; 3] = [
        MemoryPolicy::Naive,
        MemoryPolicy::Paging,
        MemoryPolicy::Somr,
    ];

    /// The command-line spelling.
    pub fn name(self) -> &'static str {
        match self {
            MemoryPolicy::Naive => "naive",
            MemoryPolicy::Paging => "paging",
            MemoryPolicy::Somr => "somr",
        }
    }

    /// From the command-line spelling (`naive`, `paging`, `somr`).
    pub fn from_name(s: &str) -> Result<Self> {
        Self::ALL
            .into_iter()
            .find(|p| p.name() == s)
            .ok_or_else(|| {
                Error::config(
                    "memory_policy",
                    ConfigProblem::Unknown {
                        value: s.to_string(),
                        expected: &["naive", "paging", "somr"],
                    },
                )
            })
    }
}

impl std::fmt::Display for MemoryPolicy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// A snapshot of [`SwapStats`](crate::SwapStats).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SwapSnapshot {
    /// Forwards run by weight-owning modules under the runtime.
    pub forwards: u64,
    /// Bytes the host copied into staging slots or on-demand weight mappings.
    pub bytes_streamed: u64,
    /// Synchronous stall: time the DSP had no work because weights were still being staged.
    pub stall_ns: u64,
    /// Staging time hidden behind DSP work.
    pub overlapped_ns: u64,
    /// Placement plans made (`somr`; a re-plan after the window filled up counts again).
    pub plans: u64,
    /// Activation layouts built by weight-owning modules, one per shape bucket (a window's rows
    /// rounded up to whole 32-row tiles) while it stays in the module's bounded cache.
    pub shape_plans: u64,
    /// Activation layouts evicted from a module's bounded cache.
    pub shape_plan_evictions: u64,
    /// Weight mappings evicted to make room (`paging`, and `somr` demoting its residents).
    pub evictions: u64,
    /// Times staging waited for the batch still reading a slot before overwriting it (`somr`;
    /// counted before the wait begins).
    pub slot_waits: u64,
}

impl SwapSnapshot {
    /// The share of staging time hidden behind DSP work: `overlapped / (overlapped + stall)`
    /// (`None` when nothing was staged).
    pub fn overlapped_fraction(&self) -> Option<f64> {
        let total = self.overlapped_ns + self.stall_ns;
        (total > 0).then(|| self.overlapped_ns as f64 / total as f64)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::ConfigProblem;

    #[test]
    fn the_deny_names_are_linear_and_every_kind() {
        let mut names = vec!["linear"];
        names.extend(OpKind::ALL.map(OpKind::name));
        assert_eq!(OpKind::DENY_NAMES, names.as_slice());
        let e = OpKind::parse_list("rope, flash").unwrap_err();
        assert!(matches!(
            &e,
            Error::Config {
                field: "deny",
                problem: ConfigProblem::Unknown { value, .. },
            } if value == "flash"
        ));
        assert!(e.to_string().contains("`flash`"), "{e}");
    }
}
