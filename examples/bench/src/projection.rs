//! Projected phone latency: a run's real sequence of forwards (window sizes, logits rows,
//! verification rows) replayed through a device model of LLaDA-8B Q4_0 on the Snapdragon 8 Elite
//! (SM8750) built from the paper's Table 2 — **projected, not measured**: no phone is involved.
//!
//! The model:
//! - **Measured points and extrapolations.** The paper's Table 2 measured forwards of 32, 64 and
//!   128 active tokens ([`MEASURED_WINDOWS`]): NPU 478.1 / 861.6 / 1531.6 ms, CPU 4239.6 / 7728.4
//!   / 14758.7 ms. The NPU table (`dllm_decode::latency::sm8750_npu`) prices a forward in flat
//!   32-token buckets: 96 is interpolated between two measured points, and 160..256 are
//!   **extrapolated** with the 64 -> 128 slope; the CPU table is linear between its points and
//!   extrapolates its last segment above 128. A forward whose rows (window plus verification
//!   rows) exceed [`LARGEST_MEASURED_WINDOW`] is *extrapolated*: [`Projection::extrapolated_s`]
//!   counts its time, and the reports label every configuration where that time is not zero.
//! - **The NPU forward.** A forward of `w` window positions carrying `v` verification (shadow)
//!   rows costs the NPU table's latency of `w + v` rows: shadow rows are rows of the same
//!   forward, free inside the bucket's unused rows and a bucket's price when they spill over.
//!   Attention over cached positions is not priced separately (for LLaDA-8B a token's attention to
//!   a few hundred cached keys is under 1% of its projection and MLP work).
//! - **The logits on the CPU** ([`LogitsOn::Cpu`], the default). The LM head of a
//!   126464-vocabulary model does not fit the NPU (ggml-hexagon keeps weights with more than
//!   32,768 output rows on the CPU), so the NPU computes the forward without its head —
//!   `(1 - HEAD_SHARE)` of the table's latency, [`HEAD_SHARE`] = the head's 126464 x 4096 against
//!   32 blocks of 4 x 4096^2 + 3 x 4096 x 12288 multiply-adds, 6.9% — and then, **serially** (the
//!   next step's decisions need them), the CPU computes each requested logits row (window rows
//!   that need logits, plus one per shadow row) at `HEAD_SHARE x` the CPU table's cost per
//!   position ([`LatencyTable::per_position_ms`]: 4239.6 / 32 = 132.5 ms per token, so 9.2 ms per
//!   logits row). [`LogitsOn::Npu`] prices the head as the NPU table has it (a skipped row saves
//!   `HEAD_SHARE` of its row's share of the forward): the table as the paper measured it.
//! - **CPU work beside the NPU** is priced with a contention factor ([`PhoneModel::contention`],
//!   0.98 by default: the NPU forward runs at 0.98x speed while the CPU computes beside it — the
//!   paper measured 0.98x for its refresh), and only the part of the CPU work longer than the
//!   slowed forward adds ([`PhoneModel::overlapped_ms`]). **Nothing runs beside the NPU forward
//!   today**: the logits are serial and the decoders have no CPU refresh, so the factor changes no
//!   projection of this bench; it is kept for the work that will overlap.
//! - On the phone's CPU ([`Target::Cpu`]) a forward costs the CPU table's latency of its window,
//!   and rows whose logits are skipped save the head's share of their token.

use dllm_decode::latency::{sm8750_cpu, sm8750_npu, LatencyTable};
use dllm_decode::ForwardTrace;

/// The LM head's share of one token's forward work in LLaDA-8B.
pub const HEAD_SHARE: f64 = 126464.0 * 4096.0
    / (32.0 * (4.0 * 4096.0 * 4096.0 + 3.0 * 4096.0 * 12288.0) + 126464.0 * 4096.0);
// The share is 6.9%: checked when the crate compiles.
const _: () = assert!(HEAD_SHARE > 0.05 && HEAD_SHARE < 0.1);

/// The forward sizes (active tokens) the paper's Table 2 measured, on the NPU and the CPU.
pub const MEASURED_WINDOWS: [usize; 3] = [32, 64, 128];
/// The largest measured forward: a forward with more rows is priced by extrapolation.
pub const LARGEST_MEASURED_WINDOW: usize = 128;

/// The default contention factor: the NPU forward's speed while the CPU computes beside it.
pub const DEFAULT_CONTENTION: f64 = 0.98;

/// The paper's Table 6 rows the projection is checked against (128 tokens, GSM8K, SM8750).
pub const PAPER_CPU_VANILLA_S: f64 = 2996.2;
/// NPU vanilla row of Table 6.
pub const PAPER_NPU_VANILLA_S: f64 = 341.2;

/// Where the dense forwards run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Target {
    /// The phone's CPU.
    Cpu,
    /// The phone's NPU (the LM head per [`LogitsOn`]).
    Npu,
}

/// Where an NPU run's LM head (its logits rows) is priced.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogitsOn {
    /// On the CPU, serially after the NPU forward (the head does not fit the NPU).
    Cpu,
    /// Inside the NPU table's latency, as the paper's table reports it.
    Npu,
}

impl std::str::FromStr for LogitsOn {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "cpu" => Ok(LogitsOn::Cpu),
            "npu" => Ok(LogitsOn::Npu),
            _ => Err(format!("`{s}` (expected cpu or npu)")),
        }
    }
}

impl LogitsOn {
    /// `cpu` or `npu`.
    pub fn name(self) -> &'static str {
        match self {
            LogitsOn::Cpu => "cpu",
            LogitsOn::Npu => "npu",
        }
    }
}

/// What one forward costs.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ForwardCost {
    /// The dense forward on its device (the NPU, or the CPU on a CPU run).
    pub device_ms: f64,
    /// CPU work beside the NPU forward (none today).
    pub beside_ms: f64,
    /// CPU work after the forward: the logits rows of an NPU forward ([`LogitsOn::Cpu`]).
    pub serial_ms: f64,
    /// On the critical path: the forward and the work beside it overlapped, then the serial work.
    pub total_ms: f64,
    /// The forward has more rows than the largest measured window.
    pub extrapolated: bool,
}

/// A run's projected time.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Projection {
    /// Seconds.
    pub s: f64,
    /// Of them, seconds of extrapolated forwards.
    pub extrapolated_s: f64,
}

impl std::ops::AddAssign for Projection {
    fn add_assign(&mut self, o: Self) {
        self.s += o.s;
        self.extrapolated_s += o.extrapolated_s;
    }
}

impl Projection {
    /// The fraction of the time that rests on extrapolated forwards (0 without time).
    pub fn extrapolated_fraction(&self) -> f64 {
        if self.s > 0.0 {
            self.extrapolated_s / self.s
        } else {
            0.0
        }
    }
}

/// The device model.
#[derive(Debug, Clone)]
pub struct PhoneModel {
    npu: LatencyTable,
    cpu: LatencyTable,
    /// The NPU forward's speed while the CPU computes beside it, in (0, 1].
    pub contention: f64,
    /// Where an NPU run's logits are priced.
    pub logits_on: LogitsOn,
}

impl Default for PhoneModel {
    fn default() -> Self {
        Self {
            npu: sm8750_npu(),
            cpu: sm8750_cpu(),
            contention: DEFAULT_CONTENTION,
            logits_on: LogitsOn::Cpu,
        }
    }
}

impl PhoneModel {
    /// The model with a contention factor (checked: in (0, 1]) and a logits placement.
    pub fn new(contention: f64, logits_on: LogitsOn) -> Result<Self, String> {
        if !(contention > 0.0 && contention <= 1.0) {
            return Err(format!(
                "{contention} is not in (0, 1] (the NPU forward's speed while the CPU computes \
                 beside it)"
            ));
        }
        Ok(Self {
            contention,
            logits_on,
            ..Self::default()
        })
    }

    /// Milliseconds of one token's forward on the phone's CPU: the CPU table's cost per position
    /// at its smallest measured forward (4239.6 / 32 = 132.5 ms).
    pub fn cpu_token_ms(&self) -> f64 {
        self.cpu.per_position_ms()
    }

    /// Milliseconds of one logits row on the phone's CPU: [`HEAD_SHARE`] of a CPU token
    /// ([`Self::cpu_token_ms`]).
    pub fn cpu_logits_row_ms(&self) -> f64 {
        HEAD_SHARE * self.cpu_token_ms()
    }

    /// The critical path of an NPU forward of `npu_ms` with `beside_ms` of CPU work overlapping
    /// it: the forward slowed by the contention factor, or the CPU work if longer. Without CPU
    /// work beside it the forward runs at full speed.
    pub fn overlapped_ms(&self, npu_ms: f64, beside_ms: f64) -> f64 {
        if beside_ms > 0.0 {
            (npu_ms / self.contention).max(beside_ms)
        } else {
            npu_ms
        }
    }

    /// One forward of `window` positions (window rows plus verification rows) with `rows` logits
    /// rows (at most `window`).
    pub fn forward(&self, target: Target, window: usize, rows: usize) -> ForwardCost {
        let rows = rows.min(window);
        let skipped = window.saturating_sub(rows) as f64 / window.max(1) as f64;
        let (device_ms, serial_ms) = match (target, self.logits_on) {
            (Target::Cpu, _) => (
                self.cpu.cost_ms(window, window, 0) * (1.0 - HEAD_SHARE * skipped),
                0.0,
            ),
            (Target::Npu, LogitsOn::Npu) => (
                self.npu.cost_ms(window, window, 0) * (1.0 - HEAD_SHARE * skipped),
                0.0,
            ),
            (Target::Npu, LogitsOn::Cpu) => (
                self.npu.cost_ms(window, window, 0) * (1.0 - HEAD_SHARE),
                rows as f64 * self.cpu_logits_row_ms(),
            ),
        };
        let beside_ms = 0.0;
        ForwardCost {
            device_ms,
            beside_ms,
            serial_ms,
            total_ms: self.overlapped_ms(device_ms, beside_ms) + serial_ms,
            extrapolated: window > LARGEST_MEASURED_WINDOW,
        }
    }

    /// The cost of one traced forward: the rows the model computes (its window and its
    /// verification (shadow) rows, which are rows of the same forward; with shifted logits also
    /// the row before the window and the row before each shadow, [`ForwardTrace::computed`]),
    /// and a logits row per requested position and per shadow.
    pub fn traced(&self, target: Target, f: &ForwardTrace) -> ForwardCost {
        self.forward(target, f.computed, f.rows + f.shadows)
    }

    /// Projected time of a generation's forwards on `target`.
    pub fn project(&self, target: Target, trace: &[ForwardTrace]) -> Projection {
        let mut p = Projection::default();
        for f in trace {
            let c = self.traced(target, f);
            p.s += c.total_ms / 1e3;
            if c.extrapolated {
                p.extrapolated_s += c.total_ms / 1e3;
            }
        }
        p
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
            computed: len,
            lookahead: 0,
        })
        .collect()
}

/// The calibration check against the paper's vanilla rows of Table 6 for a prompt of `prompt`
/// tokens (the paper measured 2996.2 s on the CPU and 341.2 s on the NPU).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PaperCheck {
    /// Projected CPU vanilla seconds.
    pub cpu_s: f64,
    /// Projected NPU vanilla seconds with the logits as the NPU table prices them.
    pub npu_table_s: f64,
    /// Projected NPU vanilla seconds with this model's logits placement.
    pub npu_s: f64,
    /// The fraction of the NPU projection that rests on extrapolated forwards (a 207-token
    /// canvas is past the largest measured window: the check calibrates the extrapolation).
    pub npu_extrapolated: f64,
}

/// The calibration check for a prompt of `prompt` tokens and 128 generated ones.
pub fn paper_check(m: &PhoneModel, prompt: usize) -> PaperCheck {
    let t = vanilla_trace(prompt, 128);
    let table = PhoneModel {
        logits_on: LogitsOn::Npu,
        ..m.clone()
    };
    let npu = m.project(Target::Npu, &t);
    PaperCheck {
        cpu_s: m.project(Target::Cpu, &t).s,
        npu_table_s: table.project(Target::Npu, &t).s,
        npu_s: npu.s,
        npu_extrapolated: npu.extrapolated_fraction(),
    }
}

/// The check as a sentence for the reports.
pub fn paper_check_text(m: &PhoneModel, prompt: usize) -> String {
    let c = paper_check(m, prompt);
    let logits = match m.logits_on {
        LogitsOn::Cpu => format!(
            "; with every logits row priced on the CPU ({:.1} ms a row, serial) as this \
             projection does, {:.0} s: the table's 32..128-token points include the logits of \
             every row, so the paper's row is reproduced only with the head where the table has it",
            m.cpu_logits_row_ms(),
            c.npu_s
        ),
        LogitsOn::Npu => String::new(),
    };
    format!(
        "Projection check (the paper's Table 6 vanilla rows, a {prompt}-token GSM8K prompt, 128 \
         tokens): CPU {:.0} s (paper {PAPER_CPU_VANILLA_S}); NPU {:.0} s with the logits as the NPU \
         table prices them (paper {PAPER_NPU_VANILLA_S}){logits}. Every forward of this check has \
         {} rows, past the largest measured window ({LARGEST_MEASURED_WINDOW}): it checks the \
         table's extrapolation.",
        c.cpu_s,
        c.npu_table_s,
        prompt + 128,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn trace(start: usize, end: usize, rows: usize, shadows: usize) -> ForwardTrace {
        ForwardTrace {
            step: 0,
            start,
            end,
            rows,
            cached: start,
            active: end - start,
            shadows,
            computed: end - start + shadows,
            lookahead: 0,
        }
    }

    #[test]
    fn a_forward_is_priced_by_the_rows_the_model_computes() {
        // A Dream window of 32 positions computes the row before it too: 33 rows, the 64-row
        // bucket of the NPU table (priced by its positions it would fit the 32-row one).
        let m = PhoneModel::new(1.0, LogitsOn::Npu).unwrap();
        let mut dream = trace(100, 132, 32, 0);
        dream.computed = 33;
        let llada = trace(100, 132, 32, 0);
        let (d, l) = (
            m.traced(Target::Npu, &dream).device_ms,
            m.traced(Target::Npu, &llada).device_ms,
        );
        assert!(d > 1.5 * l, "{d} vs {l}");
    }

    #[test]
    fn the_paper_rows_are_reproduced_at_a_gsm8k_prompt_length() {
        let m = PhoneModel::default();
        // A GSM8K question in LLaDA's chat template is ~70-90 tokens.
        let c = paper_check(&m, 79);
        assert!(
            (c.cpu_s / PAPER_CPU_VANILLA_S - 1.0).abs() < 0.05,
            "CPU {:.0} s",
            c.cpu_s
        );
        assert!(
            (c.npu_table_s / PAPER_NPU_VANILLA_S - 1.0).abs() < 0.1,
            "NPU {:.0} s",
            c.npu_table_s
        );
        // The CPU logits: (1 - HEAD_SHARE) of each 224-bucket forward, then 207 logits rows.
        let per = 2536.6 * (1.0 - HEAD_SHARE) + 207.0 * m.cpu_logits_row_ms();
        assert!((c.npu_s - 128.0 * per / 1e3).abs() < 1e-6, "{}", c.npu_s);
        assert!(c.npu_s > c.npu_table_s);
        assert_eq!(c.npu_extrapolated, 1.0, "207 rows are past 128");
        let text = paper_check_text(&m, 79);
        assert!(
            text.contains("extrapolation") && text.contains("341.2"),
            "{text}"
        );
    }

    #[test]
    fn logits_rows_are_priced_on_the_cpu_serially_after_the_npu_forward() {
        let m = PhoneModel::default();
        // HEAD_SHARE of a CPU token at the table's smallest measured forward (4239.6 / 32 ms).
        let row = m.cpu_logits_row_ms();
        assert!((row - HEAD_SHARE * 4239.6 / 32.0).abs() < 1e-12);
        assert!(row > 9.0 && row < 9.5, "{row}");
        let c = m.forward(Target::Npu, 32, 4);
        assert!((c.device_ms - 478.1 * (1.0 - HEAD_SHARE)).abs() < 1e-9);
        assert!((c.serial_ms - 4.0 * row).abs() < 1e-12);
        assert_eq!(c.beside_ms, 0.0);
        // Nothing beside the forward: the contention factor does not slow it.
        assert!((c.total_ms - c.device_ms - c.serial_ms).abs() < 1e-12);
        // Each skipped logits row saves a whole CPU row.
        let all = m.forward(Target::Npu, 32, 32);
        assert!((all.total_ms - c.total_ms - 28.0 * row).abs() < 1e-9);
        // With the head where the NPU table has it: the old pricing.
        let t = PhoneModel::new(0.98, LogitsOn::Npu).unwrap();
        assert_eq!(t.forward(Target::Npu, 32, 32).total_ms, 478.1);
        let few = t.forward(Target::Npu, 32, 4).total_ms;
        assert!((478.1 - few - 478.1 * HEAD_SHARE * 28.0 / 32.0).abs() < 1e-9);
        // A CPU run computes its own head.
        let cpu = m.forward(Target::Cpu, 32, 32);
        assert_eq!((cpu.total_ms, cpu.serial_ms), (4239.6, 0.0));
    }

    #[test]
    fn cpu_work_beside_the_npu_pays_the_contention_factor() {
        let m = PhoneModel::new(0.98, LogitsOn::Cpu).unwrap();
        assert_eq!(m.overlapped_ms(490.0, 0.0), 490.0);
        assert!((m.overlapped_ms(490.0, 100.0) - 500.0).abs() < 1e-9);
        // CPU work longer than the slowed forward is the critical path.
        assert_eq!(m.overlapped_ms(490.0, 700.0), 700.0);
        for bad in [0.0, -0.5, 1.01, f64::NAN] {
            let e = PhoneModel::new(bad, LogitsOn::Cpu).unwrap_err();
            assert!(e.contains("(0, 1]"), "{e}");
        }
    }

    #[test]
    fn shadow_rows_fill_the_bucket_for_free_and_cost_a_bucket_when_they_spill() {
        let m = PhoneModel::new(0.98, LogitsOn::Npu).unwrap();
        let all = m.forward(Target::Npu, 32, 32).total_ms;
        // 20 window rows + 12 shadows fill the 32-row bucket; one more shadow spills into 64.
        assert_eq!(
            m.project(Target::Npu, &[trace(100, 120, 20, 12)]).s,
            all / 1e3
        );
        assert_eq!(
            m.project(Target::Npu, &[trace(100, 120, 20, 13)]).s,
            861.6 / 1e3
        );
        // With the logits on the CPU a shadow row is still free on the NPU inside the bucket,
        // but its logits row is paid.
        let c = PhoneModel::default();
        let a = c.project(Target::Npu, &[trace(100, 120, 20, 0)]).s;
        let b = c.project(Target::Npu, &[trace(100, 120, 20, 12)]).s;
        assert!((b - a - 12.0 * c.cpu_logits_row_ms() / 1e3).abs() < 1e-12);
    }

    #[test]
    fn forwards_past_the_largest_measured_window_are_labelled_extrapolated() {
        let m = PhoneModel::default();
        // 128 rows is the largest measured point; 120 window rows + 9 shadows are 129.
        assert!(!m.traced(Target::Npu, &trace(0, 128, 128, 0)).extrapolated);
        assert!(!m.traced(Target::Npu, &trace(0, 120, 120, 8)).extrapolated);
        assert!(m.traced(Target::Npu, &trace(0, 120, 120, 9)).extrapolated);
        assert!(m.traced(Target::Cpu, &trace(0, 200, 200, 0)).extrapolated);
        // A run with one whole-canvas forward of 200 rows and three 32-row windows: the
        // fraction of its time that rests on the extrapolated forward.
        let run = [
            trace(0, 200, 128, 0),
            trace(100, 132, 8, 0),
            trace(108, 140, 8, 4),
            trace(116, 148, 8, 0),
        ];
        let p = m.project(Target::Npu, &run);
        let big = m.traced(Target::Npu, &run[0]).total_ms / 1e3;
        assert!((p.extrapolated_s - big).abs() < 1e-12);
        assert!(p.extrapolated_fraction() > 0.0 && p.extrapolated_fraction() < 1.0);
        let measured = m.project(Target::Npu, &run[1..]);
        assert_eq!(measured.extrapolated_s, 0.0);
        assert_eq!(measured.extrapolated_fraction(), 0.0);
    }
}
