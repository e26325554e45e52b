//! What `generate` prints once decoding is done: the answer and a summary line (with the Hexagon
//! routing report under `--device hexagon`), or the one `--json` object.

use std::time::Duration;

use candle_hexagon::DeviceCounters;
use dllm_decode::{DecodeParams, Outcome};
use dllm_models::{Backend, DiffusionLm, LoadedModel};

use crate::Args;

/// One finished generation and everything its report describes.
pub struct Report<'a> {
    /// The command line.
    pub args: &'a Args,
    /// The model that generated.
    pub loaded: &'a LoadedModel,
    /// The decoding parameters used.
    pub params: &'a DecodeParams,
    /// The backend the model ran on.
    pub backend: &'a Backend,
    /// The prompt's token ids.
    pub prompt_ids: &'a [u32],
    /// The decoder's outcome.
    pub outcome: &'a Outcome,
    /// The generated tokens up to the first stop token.
    pub answer: &'a [u32],
    /// The answer as text, when the model has a tokenizer.
    pub text: Option<&'a str>,
    /// Wall time of the decode.
    pub elapsed: Duration,
    /// The Hexagon device's counters just before the decode (`None` on the CPU).
    pub before: Option<DeviceCounters>,
}

impl Report<'_> {
    /// Tokens of the answer per second of decoding (EOS padding after it is not counted).
    fn tokens_per_second(&self) -> f64 {
        self.answer.len() as f64 / self.elapsed.as_secs_f64().max(1e-9)
    }

    /// Print the `--json` object on stdout.
    pub fn print_json(&self) {
        let (a, params, g) = (self.args, self.params, self.outcome);
        let mbsd = params
            .strategy
            .mbsd()
            .map(|m| m.pinned(self.loaded.model.info().shift_logits, params.decide));
        let mut out = serde_json::json!({
            "prompt_ids": self.prompt_ids,
            "generated_ids": g.generated(),
            "text": self.text,
            "elapsed_ms": self.elapsed.as_secs_f64() * 1e3,
            "answer_tokens": self.answer.len(),
            "tokens_per_second": self.tokens_per_second(),
            "stop_reason": format!("{:?}", g.stop),
            "model": self.loaded.source,
            "strategy": params.strategy.name(),
            "device": a.device.device,
            // What the CPU computes in; the NPU (--device hexagon) computes in fp16.
            "dtype": a.dtype,
            "npu_dtype": a.device.npu_dtype(),
            // The K/V cache's element type (the NPU's cache is fp16).
            "kv_dtype": a.kv_dtype.as_deref().or(a.device.npu_dtype()).unwrap_or(&a.dtype),
            "gen_length": params.gen_length,
            "block_length": params.block_length,
            "steps_requested": params.steps,
            "threshold": params.decide.threshold().map(as_written),
            // Staged decisions' thresholds (mbsd without --no-sts), else null.
            "theta_visible": params.decide.staged().map(|s| as_written(s.visible)),
            "theta_stable": params.decide.staged().map(|s| as_written(s.stable)),
            // Verification of tentative tokens (staged decisions without --no-verify), else null.
            "tau_back": params
                .decide
                .staged()
                .and_then(|s| s.verify)
                .map(|v| as_written(v.tau_back)),
            // The near wait's positions (0: off) and confidence (staged decisions), else null.
            "wait_near": params
                .decide
                .staged()
                .map(|s| s.near_wait.map_or(0, |n| n.within)),
            "wait_near_below": params
                .decide
                .staged()
                .and_then(|s| s.near_wait)
                .map(|n| as_written(n.below)),
            // mbsd's switches as they ran on this model's family, else null.
            "show_guess": mbsd.map(|m| m.show_guess),
            "guess_agreement": mbsd.map(|m| m.guess_agreement),
            "fit_bucket": mbsd.map(|m| m.fit_bucket),
            "fit_guess": mbsd.map(|m| m.fit_guess),
            "span": mbsd.map(|m| m.span),
            "trim_left": mbsd.map(|m| m.trim_left),
            "sliding": mbsd.map(|m| m.sliding),
            "refresh": mbsd.map(|m| m.refresh),
        });
        let map = out.as_object_mut().expect("an object");
        map.extend(llada_cli::counters(g));
        let cpu = self.loaded.model.weights().cpu_linear_bytes();
        map.insert("cpu_linear_bytes_owned".into(), cpu.owned.into());
        map.insert(
            "cpu_linear_bytes_shared_with_npu".into(),
            cpu.shared_with_npu.into(),
        );
        if let (Some(dev), Some(b)) = (self.backend.hexagon(), &self.before) {
            map.extend(llada_cli::device_counters(b, &dev.counters()));
        }
        // The process's peak resident set (VmHWM: loading and generating), null where the
        // system does not report it.
        map.insert("peak_rss_bytes".into(), peak_rss_bytes().into());
        println!("{out}");
    }

    /// Print the answer on stdout (its token ids without a tokenizer), then the summary line and,
    /// under `--device hexagon`, the routing report and memory use on stderr.
    pub fn print_text(&self) {
        let g = self.outcome;
        match self.text {
            Some(t) => println!("{t}"),
            None => println!("{:?}", self.answer),
        }
        eprintln!(
            "{} forwards, {} steps, {} answer tokens in {:.2}s ({:.1} tok/s, {:.2} tokens/forward), stop: {:?}",
            g.forwards,
            g.steps,
            self.answer.len(),
            self.elapsed.as_secs_f64(),
            self.tokens_per_second(),
            g.tokens_per_forward(),
            g.stop
        );
        if let Some(dev) = self.backend.hexagon() {
            eprintln!("\n{}", dev.routing_report());
            if let Some(plan) = dev.last_memory_plan() {
                eprintln!("\n{plan}");
            }
            let cpu = self.loaded.model.weights().cpu_linear_bytes();
            eprintln!(
                "CPU linear layers (refresh path, fallbacks): {:.2} MiB of their own weights, \
                 {:.2} MiB read in place from the NPU module's packed tiles",
                cpu.owned as f64 / 1048576.0,
                cpu.shared_with_npu as f64 / 1048576.0
            );
        }
    }
}

/// An f32 flag value as the user wrote it (0.97, not 0.9700000286102295) for the JSON.
fn as_written(x: f32) -> f64 {
    x.to_string().parse().unwrap_or(x as f64)
}

/// The process's peak resident set size in bytes (`VmHWM` of `/proc/self/status`; `None` where
/// there is no such file).
fn peak_rss_bytes() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}
