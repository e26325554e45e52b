//! The printable plan of the `somr` policy: how the window is split, where each weight lives,
//! how the forward is cut into stages and the stall the planner predicts (from the latency
//! estimates of `cost.rs`).

use std::fmt;

use super::placement::{self, Stage};
use crate::error::fmt_bytes;

/// One weight of the plan.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PlanRow {
    /// The weight's name.
    pub tensor: String,
    /// Packed bytes.
    pub bytes: u64,
    /// Resident across forwards (else streamed through a slot).
    pub resident: bool,
    /// Where it lives: `mapping 0 +4.0 MiB`, `slot 1 +0 B`.
    pub place: String,
    /// The stage (DSP batch of a forward) that consumes it, when the planned forward does.
    pub stage: Option<usize>,
}

/// The plan in force for one module (see `HexTransformer::memory_plan`).
#[derive(Debug, Clone, PartialEq)]
pub struct MemoryPlan {
    /// Window size.
    pub window_bytes: u64,
    /// Bytes mapped when the plan was made, before its own mappings.
    pub mapped_before: u64,
    /// KV cache bytes (resident, updated in place).
    pub kv_bytes: u64,
    /// The forward's activation buffer (offsets shared by live range).
    pub act_bytes: u64,
    /// The same activations without sharing (one region each).
    pub act_unpacked_bytes: u64,
    /// Norm weights, biases and RoPE tables (always resident).
    pub pinned_bytes: u64,
    /// Kept free for what the plan cannot see.
    pub headroom_bytes: u64,
    /// Resident weights plus the two slots could use this much.
    pub budget_bytes: u64,
    /// Resident weight bytes.
    pub resident_bytes: u64,
    /// Mappings holding the residents (bytes each).
    pub mappings: Vec<u64>,
    /// Bytes of each of the two staging slots (0: none).
    pub slot_bytes: u64,
    /// Blocks of the forward.
    pub blocks: usize,
    /// Stages (DSP batches) per forward.
    pub stages: usize,
    /// Expected synchronous stall per forward, ns (from the latency estimates).
    pub expected_stall_ns: u64,
    /// Expected bytes streamed per forward.
    pub expected_streamed_bytes: u64,
    /// The weights, in consumption order.
    pub rows: Vec<PlanRow>,
    /// The stages of a forward with their estimated NPU and staging times.
    pub stage_plan: Vec<Stage>,
}

impl MemoryPlan {
    /// The expected stall per forward if the NPU ran `speedup` times faster than estimated
    /// (staging times unchanged): a projection, not a measurement.
    pub fn projected_stall_ns(&self, speedup: f64) -> u64 {
        let faster: Vec<Stage> = self
            .stage_plan
            .iter()
            .map(|s| Stage {
                compute_ns: (s.compute_ns as f64 / speedup.max(1e-9)) as u64,
                ..s.clone()
            })
            .collect();
        placement::simulate(&faster).0
    }

    /// Weights streamed through the slots.
    pub fn streamed(&self) -> usize {
        self.rows.iter().filter(|r| !r.resident).count()
    }
}

impl fmt::Display for MemoryPlan {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let b = |x: u64| fmt_bytes(x);
        let other = self
            .mapped_before
            .saturating_sub(self.kv_bytes + self.act_bytes + self.pinned_bytes);
        writeln!(
            f,
            "memory plan (somr): window {} = KV {} + activations {} ({} unshared) + norms/tables {} + \
             other {} + plan {}",
            b(self.window_bytes),
            b(self.kv_bytes),
            b(self.act_bytes),
            b(self.act_unpacked_bytes),
            b(self.pinned_bytes),
            b(other),
            b(self.window_bytes.saturating_sub(self.mapped_before)),
        )?;
        writeln!(
            f,
            "  plan: headroom {}; budget {} for residents and 2 slots: {} resident in {} mapping(s), \
             2 slots of {}",
            b(self.headroom_bytes),
            b(self.budget_bytes),
            b(self.resident_bytes),
            self.mappings.len(),
            b(self.slot_bytes),
        )?;
        writeln!(
            f,
            "  forward: {} blocks in {} stages (DSP batches); {} of {} weights streamed; expected \
             {} streamed and {:.2} ms stall per forward",
            self.blocks,
            self.stages,
            self.streamed(),
            self.rows.len(),
            b(self.expected_streamed_bytes),
            self.expected_stall_ns as f64 / 1e6,
        )?;
        writeln!(f)?;
        writeln!(f, "| weight | bytes | placement | where | stage |")?;
        write!(f, "|---|---:|---|---|---:|")?;
        for r in &self.rows {
            write!(
                f,
                "\n| {} | {} | {} | {} | {} |",
                r.tensor,
                b(r.bytes),
                if r.resident { "resident" } else { "streamed" },
                r.place,
                r.stage.map_or("-".into(), |s| s.to_string())
            )?;
        }
        Ok(())
    }
}
