//! Where the model runs: the device flags ([`DeviceArgs`]) and the device counters of a run.

use anyhow::{anyhow, bail, Context, Result};
use candle_hexagon::{HexagonConfig, HexagonDevice, OpKind, TransportConfig};
use dllm_models::Backend;

/// Where the model runs.
#[derive(clap::Args, Debug, Clone)]
pub struct DeviceArgs {
    /// cpu, or hexagon (the Hexagon NPU backend: the whole transformer as one DSP batch per block
    /// when the device takes it, else per-op with CPU fallback).
    #[arg(long, default_value = "cpu")]
    pub device: String,
    /// Hexagon: DSP worker threads [default: 2].
    #[arg(long)]
    pub hexagon_workers: Option<usize>,
    /// Hexagon: transport, emulated (a DSP thread running the kernels' host build) or fastrpc
    /// [default: emulated].
    #[arg(long)]
    pub hexagon_transport: Option<String>,
    /// Hexagon/FastRPC: the library to dlopen, or `shim` for the host shim built with this binary
    /// [default: libcdsprpc.so].
    #[arg(long)]
    pub fastrpc_lib: Option<String>,
    /// Hexagon: ops forced onto the CPU, comma-separated (block, linear, linear_f16, linear_q4_0,
    /// linear_quant, flash_attn, rms_norm, swiglu, rope).
    #[arg(long)]
    pub hexagon_deny: Option<String>,
    /// Hexagon: how the model's weights share the NPU window: naive, paging or somr [default:
    /// somr].
    #[arg(long)]
    pub memory_policy: Option<String>,
    /// Hexagon: the NPU address window in MiB [default: 3072].
    #[arg(long, value_name = "MIB")]
    pub hexagon_window: Option<u64>,
}

impl DeviceArgs {
    /// The Hexagon flags given, by name.
    fn npu_flags(&self) -> Vec<&'static str> {
        [
            ("--hexagon-workers", self.hexagon_workers.is_some()),
            ("--hexagon-transport", self.hexagon_transport.is_some()),
            ("--fastrpc-lib", self.fastrpc_lib.is_some()),
            ("--hexagon-deny", self.hexagon_deny.is_some()),
            ("--memory-policy", self.memory_policy.is_some()),
            ("--hexagon-window", self.hexagon_window.is_some()),
        ]
        .into_iter()
        .filter_map(|(f, given)| given.then_some(f))
        .collect()
    }

    /// The device configuration of these flags, checked (nothing is opened).
    fn hexagon_config(&self) -> Result<HexagonConfig> {
        let transport = TransportConfig::from_names(
            self.hexagon_transport.as_deref().unwrap_or("emulated"),
            self.fastrpc_lib
                .as_deref()
                .unwrap_or(candle_hexagon::device::DEFAULT_FASTRPC_LIBRARY),
        )
        .map_err(|e| anyhow!("--hexagon-transport / --fastrpc-lib: {e}"))?;
        let workers = self
            .hexagon_workers
            .unwrap_or(candle_hexagon::device::DEFAULT_WORKERS);
        let cfg = HexagonConfig {
            workers,
            deny: OpKind::parse_list(self.hexagon_deny.as_deref().unwrap_or(""))
                .map_err(|e| anyhow!("--hexagon-deny: {e}"))?,
            transport,
            ..Default::default()
        };
        let policy = self
            .memory_policy
            .as_deref()
            .unwrap_or(candle_hexagon::device::DEFAULT_MEMORY_POLICY.name());
        let window = self
            .hexagon_window
            .unwrap_or(candle_hexagon::device::DEFAULT_VA_WINDOW_MIB);
        let cfg = cfg
            .with_memory_names(policy, window)
            .map_err(|e| anyhow!("--memory-policy / --hexagon-window: {e}"))?;
        cfg.validate().map_err(|e| {
            let flag = match &e {
                candle_hexagon::Error::Config {
                    field: "workers", ..
                } => "--hexagon-workers",
                candle_hexagon::Error::Config {
                    field: "va_window_bytes",
                    ..
                } => "--hexagon-window",
                _ => "--device hexagon",
            };
            anyhow!("{flag}: {e}")
        })?;
        Ok(cfg)
    }

    /// Every device flag checked before any work, with the compute dtype of `--dtype`: the
    /// Hexagon flags apply to `--device hexagon` only, and there the NPU computes in fp16 (the
    /// `--dtype` of the CPU path does not apply: anything but the default f32 is an error).
    pub fn check(&self, dtype: &str) -> Result<()> {
        match self.device.as_str() {
            "cpu" => {
                let given = self.npu_flags();
                if !given.is_empty() {
                    bail!(
                        "{} only appl{} to --device hexagon (this run is on --device cpu)",
                        given.join(", "),
                        if given.len() == 1 { "ies" } else { "y" }
                    );
                }
                Ok(())
            }
            "hexagon" => {
                if dtype != "f32" {
                    bail!(
                        "--dtype {dtype}: with --device hexagon the NPU computes in fp16 (weights, \
                         activations, K/V; accumulation in f32) whatever --dtype says, and the CPU \
                         layers beside it in f32: drop --dtype, or use --device cpu --dtype {dtype}"
                    );
                }
                self.hexagon_config().map(|_| ())
            }
            d => bail!("--device: `{d}` (expected cpu or hexagon)"),
        }
    }

    /// What the NPU computes in, for reports (`None` on the CPU).
    pub fn npu_dtype(&self) -> Option<&'static str> {
        (self.device == "hexagon").then_some("f16")
    }

    /// The backend `--device` asks for (opening the Hexagon session if needed).
    pub fn backend(&self) -> Result<Backend> {
        match self.device.as_str() {
            "cpu" => Ok(Backend::Cpu),
            "hexagon" => {
                let dev =
                    HexagonDevice::open(self.hexagon_config()?).context("--device hexagon")?;
                Ok(Backend::Hexagon(dev))
            }
            d => bail!("--device: `{d}` (expected cpu or hexagon)"),
        }
    }
}

/// The device counters of a run (`dsp_batches`, `bytes_staged`, the memory runtime's `maps`,
/// `bytes_streamed`, `stall_ms`, ...), from two snapshots; the weight-bytes gauges
/// (`host_weight_bytes`, `shared_weight_bytes`, `npu_weight_bytes`) are `after`'s.
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
        "plans_built": d.plans_built,
        "shape_plans_built": d.shape_plans_built,
        // Gauges at the end of the run (weights held once: host + npu stays near 0 and the
        // shared bytes are the one copy).
        "host_weight_bytes": d.host_weight_bytes,
        "shared_weight_bytes": d.shared_weight_bytes,
        "npu_weight_bytes": d.npu_weight_bytes,
    });
    match v {
        serde_json::Value::Object(m) => m,
        _ => unreachable!("a JSON object literal"),
    }
}
