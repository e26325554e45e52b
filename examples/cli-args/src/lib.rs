//! Command-line arguments shared by `generate`, `eval`, `latency-profile` and the benchmarks:
//! decoding ([`DecodeArgs`]) and the device ([`DeviceArgs`]), flattened into each binary's clap
//! `Args`, so that every tool spells the flags the same way and resolves them with the same rules
//! (the lengths and schedule through [`dllm_decode::DecodeParams::resolve`]).

use std::path::PathBuf;
use std::sync::Arc;

use anyhow::{anyhow, bail, Context, Result};
use candle_hexagon::{HexagonConfig, HexagonDevice, OpKind, TransportConfig};
use dllm_decode::latency::LatencyTable;
use dllm_decode::{
    DecodeParams, Decoder, DreamParams, Generation, MbsdParams, Requested, RevisionParams,
};
use dllm_models::source::DecodeDefaults;
use dllm_models::Backend;

/// Decoding flags.
#[derive(clap::Args, Debug, Clone)]
pub struct DecodeArgs {
    /// Generated positions [default: the checkpoint's recommendation, else 128].
    #[arg(long)]
    pub gen_length: Option<usize>,
    /// Block length [default: the checkpoint's if it divides gen-length, else 32 if it does, else
    /// gen-length].
    #[arg(long)]
    pub block_length: Option<usize>,
    /// Total denoising steps [default: gen-length when --gen-length is given (one token per step),
    /// else the checkpoint's recommendation, else gen-length].
    #[arg(long)]
    pub steps: Option<usize>,
    /// vanilla (the model's reference algorithm), prefix-cache, dual-cache (Fast-dLLM) or mbsd
    /// (multi-block speculative decoding with dual-path progressive revision).
    #[arg(long, default_value = "vanilla")]
    pub strategy: String,
    /// Parallel decoding: unmask every masked token of the block with confidence >= this
    /// [default: the checkpoint's unless --steps is given].
    #[arg(long)]
    pub threshold: Option<f32>,
    /// Confidence: low_confidence, random, topk_margin or entropy.
    #[arg(long, default_value = "low_confidence")]
    pub remasking: String,
    /// Sampling temperature (0 = greedy, deterministic).
    #[arg(long, default_value_t = 0.0)]
    pub temperature: f32,
    /// Seed for sampling and random remasking.
    #[arg(long, default_value_t = dllm_decode::params::DEFAULT_SEED)]
    pub seed: u64,
    /// Classifier-free guidance scale (vanilla only).
    #[arg(long, default_value_t = 0.0)]
    pub cfg_scale: f32,
    /// Never predict EOS (LLaDA logits_eos_inf).
    #[arg(long)]
    pub logits_eos_inf: bool,
    /// Rank EOS/EoT predictions last (LLaDA confidence_eos_eot_inf).
    #[arg(long)]
    pub confidence_eos_eot_inf: bool,
    /// Decode every block even after one ends in EOS.
    #[arg(long)]
    pub no_early_stop: bool,
    /// Dream: origin, maskgit_plus, topk_margin or entropy.
    #[arg(long, default_value = "maskgit_plus")]
    pub alg: String,
    /// Dream: final timestep.
    #[arg(long, default_value_t = dllm_decode::params::DEFAULT_DREAM_EPS)]
    pub eps: f64,
    /// Dream: temperature of the position-selection softmax.
    #[arg(long)]
    pub alg_temp: Option<f32>,
    /// Dream: nucleus sampling.
    #[arg(long)]
    pub top_p: Option<f32>,
    /// Dream: top-k sampling.
    #[arg(long)]
    pub top_k: Option<usize>,
    /// mbsd: keep the window on the current block (no sliding into future blocks).
    #[arg(long)]
    pub no_sliding: bool,
    /// mbsd: never extend the window late in a block.
    #[arg(long)]
    pub no_lookahead: bool,
    /// mbsd: look ahead once the current block has at most this many undecided positions.
    #[arg(long, default_value_t = dllm_decode::params::DEFAULT_LOOKAHEAD_TRIGGER)]
    pub lookahead_trigger: usize,
    /// mbsd: extra latency lookahead may add, as a fraction of the window's (per the latency table).
    #[arg(long, default_value_t = dllm_decode::params::DEFAULT_LOOKAHEAD_ALLOWANCE)]
    pub lookahead_allowance: f64,
    /// mbsd: extra memory lookahead may add (K/V and activations), MiB.
    #[arg(long, default_value_t = dllm_decode::params::DEFAULT_LOOKAHEAD_BUDGET_MIB)]
    pub lookahead_budget: f64,
    /// mbsd: the latency table pricing lookahead (written by latency-profile) [default: the
    /// SM8750 NPU profile derived from the paper's Table 2, not measured].
    #[arg(long)]
    pub latency_table: Option<PathBuf>,
    /// mbsd: show drafts at least this confident to later forwards instead of the mask.
    #[arg(long)]
    pub draft_context: Option<f32>,
    /// mbsd: no staged token stabilization (decisions are final at once).
    #[arg(long)]
    pub no_sts: bool,
    /// mbsd: no sparse cache refresh of visible prefix tokens beside the window forward.
    #[arg(long)]
    pub no_scr: bool,
    /// No selective logits skipping (every window row goes through the LM head, as the reference
    /// implementations do; the output is the same).
    #[arg(long)]
    pub no_sls: bool,
    /// mbsd: revise a visible token when its re-score prefers another token by at least this
    /// much probability.
    #[arg(long, default_value_t = dllm_decode::params::DEFAULT_REVISION_MARGIN)]
    pub revision_margin: f32,
    /// mbsd: the refresh's CPU time may be this fraction of the step's NPU forward time (both
    /// priced by the latency tables).
    #[arg(long, default_value_t = dllm_decode::params::DEFAULT_REFRESH_BUDGET)]
    pub refresh_budget: f64,
    /// mbsd: the CPU latency table pricing the refresh (written by latency-profile) [default: the
    /// SM8750 CPU profile derived from the paper's Table 2, not measured].
    #[arg(long)]
    pub cpu_latency_table: Option<PathBuf>,
    /// mbsd: confidence at which a prediction becomes visible context.
    #[arg(long, default_value_t = dllm_decode::params::DEFAULT_THETA_VISIBLE)]
    pub theta_visible: f32,
    /// mbsd: confidence at which a token becomes final.
    #[arg(long, default_value_t = dllm_decode::params::DEFAULT_THETA_STABLE)]
    pub theta_stable: f32,
}

impl DecodeArgs {
    /// The defaults of every decoding flag (what a tool runs with when given none of them).
    pub fn defaults() -> Self {
        #[derive(clap::Parser)]
        struct Only {
            #[command(flatten)]
            decode: DecodeArgs,
        }
        <Only as clap::Parser>::try_parse_from(["defaults"])
            .expect("every decoding flag has a default")
            .decode
    }

    /// The decoding parameters: these flags over the checkpoint's recommendations.
    pub fn params(&self, checkpoint: &DecodeDefaults) -> Result<DecodeParams> {
        let p = self.resolve(checkpoint).map_err(cli_error)?;
        if self.latency_table.is_some() && p.strategy != dllm_decode::Strategy::Mbsd {
            bail!("invalid parameter `--latency-table`: only --strategy mbsd uses it");
        }
        if self.cpu_latency_table.is_some()
            && !(p.strategy == dllm_decode::Strategy::Mbsd && p.revision.sts && p.revision.scr)
        {
            bail!(
                "invalid parameter `--cpu-latency-table`: only the refresh of --strategy mbsd (without --no-sts or --no-scr) uses it"
            );
        }
        Ok(p)
    }

    /// The decoding parameters, resolved and validated, with the library's error (naming the
    /// [`DecodeParams`] field) for callers that spell fields their own way (the server's JSON).
    pub fn resolve(
        &self,
        checkpoint: &DecodeDefaults,
    ) -> std::result::Result<DecodeParams, dllm_decode::DecodeError> {
        let base = DecodeParams {
            strategy: self.strategy.parse()?,
            remasking: self.remasking.parse()?,
            temperature: self.temperature,
            seed: self.seed,
            cfg_scale: self.cfg_scale,
            logits_eos_inf: self.logits_eos_inf,
            confidence_eos_eot_inf: self.confidence_eos_eot_inf,
            early_stop: !self.no_early_stop,
            dream: DreamParams {
                alg: self.alg.parse()?,
                eps: self.eps,
                alg_temp: self.alg_temp,
                top_p: self.top_p,
                top_k: self.top_k,
            },
            mbsd: MbsdParams {
                sliding: !self.no_sliding,
                lookahead: !self.no_lookahead,
                trigger: self.lookahead_trigger,
                allowance: self.lookahead_allowance,
                budget_mib: self.lookahead_budget,
                draft_context: self.draft_context,
            },
            revision: RevisionParams {
                sts: !self.no_sts,
                scr: !self.no_scr,
                sls: !self.no_sls,
                theta_visible: self.theta_visible,
                theta_stable: self.theta_stable,
                margin: self.revision_margin,
                refresh_budget: self.refresh_budget,
            },
            ..Default::default()
        };
        let asked = Requested {
            gen_length: self.gen_length,
            block_length: self.block_length,
            steps: self.steps,
            threshold: self.threshold,
        };
        let p = base.resolve(asked, checkpoint);
        p.validate()?;
        Ok(p)
    }

    /// The latency table of `--latency-table`, if given.
    pub fn latency_table(&self) -> Result<Option<Arc<LatencyTable>>> {
        self.latency_table
            .as_ref()
            .map(|p| Ok(Arc::new(LatencyTable::load(p).context("--latency-table")?)))
            .transpose()
    }

    /// The CPU latency table of `--cpu-latency-table`, if given.
    pub fn cpu_latency_table(&self) -> Result<Option<Arc<LatencyTable>>> {
        self.cpu_latency_table
            .as_ref()
            .map(|p| {
                Ok(Arc::new(
                    LatencyTable::load(p).context("--cpu-latency-table")?,
                ))
            })
            .transpose()
    }

    /// A decoder for `params` with the latency tables of these flags.
    pub fn decoder(&self, params: DecodeParams) -> Result<Decoder<'static>> {
        let mut d = Decoder::new(params);
        if let Some(t) = self.latency_table()? {
            d = d.latency_table(t);
        }
        if let Some(t) = self.cpu_latency_table()? {
            d = d.cpu_latency_table(t);
        }
        Ok(d)
    }
}

/// Where the model runs.
#[derive(clap::Args, Debug, Clone)]
pub struct DeviceArgs {
    /// cpu, or hexagon (the Hexagon NPU backend: the whole transformer as one DSP batch per block
    /// when the device takes it, else per-op with CPU fallback).
    #[arg(long, default_value = "cpu")]
    pub device: String,
    /// Hexagon: DSP worker threads.
    #[arg(long, default_value_t = candle_hexagon::device::DEFAULT_WORKERS)]
    pub hexagon_workers: usize,
    /// Hexagon: transport, emulated (a DSP thread running the kernels' host build) or fastrpc.
    #[arg(long, default_value = "emulated")]
    pub hexagon_transport: String,
    /// Hexagon/FastRPC: the library to dlopen, or `shim` for the host shim built with this binary.
    #[arg(long, default_value = candle_hexagon::device::DEFAULT_FASTRPC_LIBRARY)]
    pub fastrpc_lib: String,
    /// Hexagon: ops forced onto the CPU, comma-separated (block, linear, linear_f16, linear_q4_0,
    /// linear_quant, flash_attn, rms_norm, swiglu, rope).
    #[arg(long, default_value = "")]
    pub hexagon_deny: String,
    /// Hexagon: how the model's weights share the NPU window: naive, paging or somr.
    #[arg(long, default_value = candle_hexagon::device::DEFAULT_MEMORY_POLICY.name())]
    pub memory_policy: String,
    /// Hexagon: the NPU address window in MiB.
    #[arg(long, value_name = "MIB", default_value_t = candle_hexagon::device::DEFAULT_VA_WINDOW_MIB)]
    pub hexagon_window: u64,
}

impl DeviceArgs {
    /// The backend `--device` asks for (opening the Hexagon session if needed).
    pub fn backend(&self) -> Result<Backend> {
        match self.device.as_str() {
            "cpu" => Ok(Backend::Cpu),
            "hexagon" => {
                let transport =
                    TransportConfig::from_names(&self.hexagon_transport, &self.fastrpc_lib)
                        .map_err(|e| anyhow!("--hexagon-transport: {e}"))?;
                let cfg = HexagonConfig {
                    workers: self.hexagon_workers,
                    deny: OpKind::parse_list(&self.hexagon_deny)
                        .map_err(|e| anyhow!("--hexagon-deny: {e}"))?,
                    transport,
                    ..Default::default()
                }
                .with_memory_names(&self.memory_policy, self.hexagon_window)
                .map_err(|e| anyhow!("--memory-policy / --hexagon-window: {e}"))?;
                let dev = HexagonDevice::open(cfg).context("--device hexagon")?;
                Ok(Backend::Hexagon(dev))
            }
            d => bail!("--device: `{d}` (expected cpu or hexagon)"),
        }
    }
}

/// The counters of a generation, under the names every tool reports them (`generate --json`, the
/// bench's `results.json`).
pub fn counters(g: &Generation) -> serde_json::Map<String, serde_json::Value> {
    let v = serde_json::json!({
        "forwards": g.forwards,
        "steps": g.steps,
        "tokens_decoded": g.tokens_decoded,
        "mean_active_per_forward": g.mean_active_per_forward(),
        "tokens_per_forward": g.tokens_per_forward(),
        "draft_predictions": g.draft_predictions,
        "drafts": g.drafts,
        "drafts_accepted": g.drafts_accepted,
        "drafts_rejected": g.drafts_rejected,
        "lookahead_positions": g.lookahead_positions,
        "revised": g.revised,
        "rescored": g.rescored,
        "refreshes": g.refreshes,
        "refresh_ms": g.refresh_ms,
        "merge_wait_ms": g.merge_wait_ms,
        "logits_rows_skipped": g.logits_rows_skipped,
        "unstable_at_block_end": g.unstable_at_block_end,
    });
    match v {
        serde_json::Value::Object(m) => m,
        _ => unreachable!("a JSON object literal"),
    }
}

/// The device counters of a run (`dsp_batches`, `bytes_staged`, the memory runtime's `maps`,
/// `bytes_streamed`, `stall_ms`, ...), from two snapshots.
pub fn device_counters(
    before: &candle_hexagon::DeviceCounters,
    after: &candle_hexagon::DeviceCounters,
) -> serde_json::Map<String, serde_json::Value> {
    let d = after.since(before);
    let v = serde_json::json!({
        "dsp_batches": d.dsp_batches,
        "dsp_ops": d.dsp_ops,
        "bytes_staged": d.bytes_staged_in + d.bytes_staged_out,
        "bytes_staged_in": d.bytes_staged_in,
        "bytes_staged_out": d.bytes_staged_out,
        "maps": d.maps,
        "unmaps": d.unmaps,
        "bytes_streamed": d.bytes_streamed,
        "stall_ms": d.stall_ns as f64 / 1e6,
        "overlapped_ms": d.overlapped_ns as f64 / 1e6,
    });
    match v {
        serde_json::Value::Object(m) => m,
        _ => unreachable!("a JSON object literal"),
    }
}

/// The command-line flag of a [`DecodeParams`] field: the library's errors name fields
/// (`gen_length`, `revision.theta_visible`), the tools name flags (`--gen-length`, `--theta-visible`).
pub fn flag_of(field: &str) -> Option<&'static str> {
    FLAGS
        .iter()
        .find(|(f, _)| *f == field)
        .map(|(_, flag)| *flag)
}

/// Field paths and their flags (a boolean field's flag is the one that turns it off).
const FLAGS: &[(&str, &str)] = &[
    ("revision.theta_visible", "--theta-visible"),
    ("revision.theta_stable", "--theta-stable"),
    ("revision.sts", "--no-sts"),
    ("revision.scr", "--no-scr"),
    ("revision.sls", "--no-sls"),
    ("revision.margin", "--revision-margin"),
    ("revision.refresh_budget", "--refresh-budget"),
    ("mbsd.draft_context", "--draft-context"),
    ("mbsd.budget_mib", "--lookahead-budget"),
    ("mbsd.allowance", "--lookahead-allowance"),
    ("mbsd.trigger", "--lookahead-trigger"),
    ("mbsd.lookahead", "--no-lookahead"),
    ("mbsd.sliding", "--no-sliding"),
    ("dream.alg_temp", "--alg-temp"),
    ("dream.top_p", "--top-p"),
    ("dream.top_k", "--top-k"),
    ("dream.eps", "--eps"),
    ("dream.alg", "--alg"),
    ("confidence_eos_eot_inf", "--confidence-eos-eot-inf"),
    ("logits_eos_inf", "--logits-eos-inf"),
    ("block_length", "--block-length"),
    ("gen_length", "--gen-length"),
    ("cfg_scale", "--cfg-scale"),
    ("temperature", "--temperature"),
    ("threshold", "--threshold"),
    ("remasking", "--remasking"),
    ("strategy", "--strategy"),
    ("steps", "--steps"),
];

/// A decoding error in command-line spelling: the parameter and any field named in the reason
/// become flags (`invalid parameter `gen_length`` -> `invalid parameter `--gen-length``).
pub fn cli_error(e: dllm_decode::DecodeError) -> anyhow::Error {
    match e {
        dllm_decode::DecodeError::InvalidParam { name, reason } => {
            // Longest field paths first, so `revision.theta_visible` is not cut by `threshold`.
            let mut reason = reason;
            for (field, flag) in FLAGS {
                if field.contains('.') || field.contains('_') {
                    reason = reason.replace(field, flag);
                }
            }
            anyhow!(
                "invalid parameter `{}`: {reason}",
                flag_of(name).unwrap_or(name)
            )
        }
        other => anyhow::Error::new(other),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn library_field_names_become_flags() {
        let bad = DecodeParams {
            gen_length: 10,
            block_length: 4,
            ..Default::default()
        };
        let e = cli_error(bad.validate().unwrap_err()).to_string();
        assert!(
            e.contains("`--gen-length`") && e.contains("--block-length 4"),
            "{e}"
        );
        let mut p = DecodeParams {
            strategy: dllm_decode::Strategy::Mbsd,
            ..Default::default()
        };
        p.revision.theta_visible = 0.95;
        let e = cli_error(p.validate().unwrap_err()).to_string();
        assert!(
            e.contains("`--theta-visible`") && e.contains("--theta-stable"),
            "{e}"
        );
        // Every field the library can name has a flag.
        for f in [
            "steps",
            "mbsd.trigger",
            "revision.sts",
            "dream.top_k",
            "cfg_scale",
        ] {
            assert!(flag_of(f).is_some(), "{f}");
        }
    }
}
