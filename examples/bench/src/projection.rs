//! Projected phone latency: a run's real sequence of forwards (window sizes, logits rows, refresh
//! work) replayed through a device model of LLaDA-8B Q4_0 on the Snapdragon 8 Elite (SM8750)
//! built from the paper's Table 2 — **projected, not measured**: no phone is involved.
//!
//! The model:
//! - one forward of `w` positions costs the Table 2 latency of `w` active tokens: on the NPU in
//!   stepwise 32-token buckets (`dllm_decode::latency::sm8750_npu`), on the CPU linearly
//!   (`sm8750_cpu`); attention over cached positions is not priced separately (for LLaDA-8B a
//!   token's attention to a few hundred cached keys is under 1% of its projection and MLP work);
//! - rows whose logits are skipped save the LM head's share of a token's work, [`HEAD_SHARE`]
//!   (126464 x 4096 against 32 blocks of 4 x 4096^2 + 3 x 4096 x 12288 multiply-adds);
//! - a sparse refresh runs on the CPU beside the NPU forward: it re-scores some positions (each
//!   masked alone, one pass) and recomputes the K/V of others; each position costs the CPU
//!   profile's cost per position at its smallest measured forward ([`LatencyTable::per_position_ms`]:
//!   4239.6 ms / 32 = 132.5 ms for LLaDA-8B Q4_0 on the SM8750 CPU), with no fixed part: a linear
//!   fit through the profile's three points would charge every refresh its 751 ms intercept, an
//!   artefact of extrapolating below the smallest measurement. Only what exceeds the forward adds to
//!   the critical path; on a CPU-only run it adds in full.

use dllm_decode::latency::{sm8750_cpu, sm8750_npu, LatencyTable};
use dllm_decode::ForwardTrace;

/// The LM head's share of one token's forward work in LLaDA-8B.
pub const HEAD_SHARE: f64 = 126464.0 * 4096.0
    / (32.0 * (4.0 * 4096.0 * 4096.0 + 3.0 * 4096.0 * 12288.0) + 126464.0 * 4096.0);
// The share is 7.3%: checked when the crate compiles.
const _: () = assert!(HEAD_SHARE > 0.05 && HEAD_SHARE < 0.1);

/// The paper's Table 6 rows the projection is checked against (128 tokens, GSM8K, SM8750).
pub const PAPER_CPU_VANILLA_S: f64 = 2996.2;
/// NPU vanilla row of Table 6.
pub const PAPER_NPU_VANILLA_S: f64 = 341.2;

/// Where the dense forwards run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Target {
    /// The phone's CPU.
    Cpu,
    /// The phone's NPU (refreshes on its CPU).
    Npu,
}

/// The device model.
#[derive(Debug, Clone)]
pub struct PhoneModel {
    npu: LatencyTable,
    cpu: LatencyTable,
}

impl Default for PhoneModel {
    fn default() -> Self {
        Self {
            npu: sm8750_npu(),
            cpu: sm8750_cpu(),
        }
    }
}

impl PhoneModel {
    /// Milliseconds of one forward of `window` positions with `rows` logits rows.
    pub fn forward_ms(&self, target: Target, window: usize, rows: usize) -> f64 {
        let table = match target {
            Target::Cpu => &self.cpu,
            Target::Npu => &self.npu,
        };
        let full = table.cost_ms(window, window, 0);
        let skipped = window.saturating_sub(rows) as f64 / window.max(1) as f64;
        full * (1.0 - HEAD_SHARE * skipped)
    }

    /// Projected seconds of a generation's forwards on `target`.
    pub fn project(&self, target: Target, trace: &[ForwardTrace]) -> f64 {
        let ms: f64 = trace
            .iter()
            .map(|f| {
                // Verification (shadow) rows are rows of the same forward.
                self.forward_ms(target, f.end - f.start + f.shadows, f.rows + f.shadows)
            })
            .sum();
        ms / 1e3
    }
}

/// The forwards of the paper's vanilla baseline: `gen` full-canvas forwards of `prompt + gen`
/// positions with logits for every position (the baselines compute them all; skipping them is a
/// later row of Table 6).
pub fn vanilla_trace(prompt: usize, gen: usize) -> Vec<ForwardTrace> {
    let len = prompt + gen;
    (0..gen)
        .map(|step| ForwardTrace {
            step,
            start: 0,
            end: len,
            rows: len,
            cached: 0,
            active: gen - step,
            shadows: 0,
            lookahead: 0,
        })
        .collect()
}

/// The calibration check: the projected CPU and NPU vanilla rows of Table 6 for a prompt of
/// `prompt` tokens, beside the paper's measured 2996.2 s and 341.2 s.
pub fn paper_check(m: &PhoneModel, prompt: usize) -> (f64, f64) {
    let t = vanilla_trace(prompt, 128);
    (m.project(Target::Cpu, &t), m.project(Target::Npu, &t))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_paper_rows_are_reproduced_at_a_gsm8k_prompt_length() {
        let m = PhoneModel::default();
        // A GSM8K question in LLaDA's chat template is ~70-90 tokens.
        let (cpu, npu) = paper_check(&m, 79);
        assert!(
            (cpu / PAPER_CPU_VANILLA_S - 1.0).abs() < 0.05,
            "CPU {cpu:.0} s"
        );
        assert!(
            (npu / PAPER_NPU_VANILLA_S - 1.0).abs() < 0.1,
            "NPU {npu:.0} s"
        );
    }

    #[test]
    fn skipping_rows_and_shadow_rows_price_as_stated() {
        let m = PhoneModel::default();
        let all = m.forward_ms(Target::Npu, 32, 32);
        assert_eq!(all, 478.1);
        let few = m.forward_ms(Target::Npu, 32, 4);
        assert!((all - few - all * HEAD_SHARE * 28.0 / 32.0).abs() < 1e-9);
        let f = |end, shadows| ForwardTrace {
            step: 0,
            start: 100,
            end,
            rows: end - 100,
            cached: 100,
            active: end - 100,
            shadows,
            lookahead: 0,
        };
        // Shadows in the bucket's free rows cost nothing on the NPU; past the edge a bucket.
        assert_eq!(m.project(Target::Npu, &[f(120, 12)]), all / 1e3);
        assert!(m.project(Target::Npu, &[f(120, 13)]) > all / 1e3);
    }
}
