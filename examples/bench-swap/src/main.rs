//! `bench-swap`: the swap-optimized memory runtime (`candle-hexagon`'s `runtime`) on the emulated
//! DSP, with the ~100M-parameter synthetic LLaDA (`dllm_models::synthetic::bench_llada_100m`,
//! 174 MiB of fp16 weights on the NPU) built through `dllm-models`.
//!
//! - **Table 7 analog** (`--only table7`): generation of `--budgets` tokens (dual cache, greedy)
//!   in an NPU window of `--window-mib` (smaller than weights + KV cache + activations) under each
//!   `--policies` memory policy: whether it completes or fails (with the window's own mapping
//!   error), the tokens produced, whether they equal the CPU's at temperature 0, and the
//!   runtime's counters (maps, unmaps, bytes streamed, synchronous stall, overlapped staging).
//! - **Figure 13c analog** (`--only fig13c`): `somr` in a window that holds everything, the
//!   staging budget fixed at `--staging-mib`, the resident-weight budget capped from all weights
//!   down to 0 (`--resident-mib`): synchronous staging time per forward of a dual-cache step
//!   (`--fig-window` rows against `--fig-cached` cached rows).
//!
//! Everything runs on the emulated DSP (the kernels' host build on x86 threads) and an emulated
//! address window and mapper table: the tables show which policy fits the window and how staging
//! overlaps compute *here*; they say nothing about Hexagon speed.

mod agree;

use std::time::Instant;

use anyhow::{anyhow, bail, Context, Result};
use candle_core::{DType, Device, Tensor};
use candle_hexagon::{DeviceCounters, HexagonConfig, HexagonDevice};
use clap::Parser;
use dllm_decode::{DecodeError, DecodeParams, Strategy};
use dllm_models::synthetic::{bench_llada_100m, random_weights};
use dllm_models::weights::HfWeights;
use dllm_models::{Backend, DiffusionLm, DiffusionTransformer, OpMode, Rows, TransformerConfig};

#[derive(Parser, Debug)]
#[command(
    about = "The memory runtime's policies in a small NPU window, and staging time vs resident budget."
)]
struct Args {
    /// Which tables: table7, fig13c or both.
    #[arg(long, default_value = "both")]
    only: String,
    /// Transformer layers (of the 97.5M bench model's shape).
    #[arg(long, default_value_t = 12)]
    layers: usize,
    /// DSP worker threads.
    #[arg(long, default_value_t = candle_hexagon::device::DEFAULT_WORKERS)]
    workers: usize,
    /// Table 7: the NPU window in MiB.
    #[arg(long, default_value_t = 96)]
    window_mib: u64,
    /// Table 7: generated-token budgets.
    #[arg(long, value_delimiter = ',', default_value = "256,512")]
    budgets: Vec<usize>,
    /// Table 7: memory policies.
    #[arg(long, value_delimiter = ',', default_value = "naive,paging,somr")]
    policies: Vec<String>,
    /// Table 7: prompt length (random ids).
    #[arg(long, default_value_t = 16)]
    prompt_len: usize,
    /// Table 7: block length.
    #[arg(long, default_value_t = 32)]
    block: usize,
    /// Table 7: tokens unmasked per step (steps = budget / this).
    #[arg(long, default_value_t = 4)]
    tokens_per_step: usize,
    /// Table 7: do not run the CPU for the token comparison.
    #[arg(long)]
    no_cpu: bool,
    /// Figure 13c: staging budget in MiB (two slots of half each).
    #[arg(long, default_value_t = 32)]
    staging_mib: u64,
    /// Figure 13c: resident-weight budgets in MiB (`all` = no cap).
    #[arg(long, value_delimiter = ',', default_value = "all,128,96,64,32,16,0")]
    resident_mib: Vec<String>,
    /// Figure 13c: cached rows the window attends to.
    #[arg(long, default_value_t = 256)]
    fig_cached: usize,
    /// Figure 13c: window rows per forward.
    #[arg(long, default_value_t = 32)]
    fig_window: usize,
    /// Figure 13c: timed forwards per budget (after the profiling and first planned forward).
    #[arg(long, default_value_t = 8)]
    fig_forwards: usize,
    /// Figure 13c: also project the stall for an NPU this many times faster than the emulated
    /// DSP's profile (a simulation from the profile, labelled as such).
    #[arg(long, default_value_t = 20.0)]
    project_speedup: f64,
    /// Print the memory plan of every somr run.
    #[arg(long)]
    print_plan: bool,
}

const MIB: f64 = (1u64 << 20) as f64;

fn model(cfg: &TransformerConfig, backend: &Backend) -> Result<DiffusionTransformer> {
    let w = random_weights(cfg, 0)?;
    Ok(DiffusionTransformer::new_on(
        cfg.clone(),
        &HfWeights::from_tensors(w, cfg.arch, DType::F32, &Device::Cpu),
        OpMode::Fused,
        backend,
    )?)
}

fn device(
    a: &Args,
    f: impl FnOnce(HexagonConfig) -> Result<HexagonConfig>,
) -> Result<HexagonDevice> {
    let cfg = f(HexagonConfig {
        workers: a.workers,
        ..Default::default()
    })?;
    Ok(HexagonDevice::open(cfg)?)
}

/// The backend error of a failed generation, when the NPU window or mapper table ran out.
fn window_error(e: &DecodeError) -> Option<&candle_hexagon::Error> {
    match e {
        DecodeError::Model(dllm_models::Error::Hexagon(h)) if h.is_resource_exhausted() => Some(h),
        _ => None,
    }
}

fn counters_cells(c: &DeviceCounters) -> String {
    format!(
        "{} | {} | {:.1} | {:.1} | {:.1}",
        c.maps,
        c.unmaps,
        c.bytes_streamed as f64 / MIB,
        c.stall_ns as f64 / 1e6,
        c.overlapped_ns as f64 / 1e6
    )
}

fn table7(a: &Args, cfg: &TransformerConfig) -> Result<()> {
    println!(
        "## Table 7 analog: {} layers ({:.0} MiB of fp16 weights), NPU window {} MiB, dual cache, block {}, {} \
         tokens per step, greedy\n",
        cfg.num_layers,
        weight_mib(cfg),
        a.window_mib,
        a.block,
        a.tokens_per_step
    );
    println!(
        "| policy | window MiB | token budget | outcome | tokens | forwards | maps | unmaps | streamed MiB | \
         stall ms | overlapped ms | peak VA MiB | wall s | vs the CPU | vs somr, window holding everything |"
    );
    println!("|---|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---|");
    let mask = cfg.special.mask;
    let mut failures = Vec::new();
    for &budget in &a.budgets {
        if budget % a.block != 0 || budget % a.tokens_per_step != 0 {
            bail!("--budgets: {budget} is not a multiple of --block and --tokens-per-step");
        }
        let prompt: Vec<u32> = (0..a.prompt_len as u32)
            .map(|i| 100 + i * 37 % 7000)
            .collect();
        let params = DecodeParams {
            gen_length: budget,
            block_length: a.block,
            steps: budget / a.tokens_per_step,
            strategy: Strategy::DualCache,
            early_stop: false,
            ..Default::default()
        };
        let cpu = if a.no_cpu {
            None
        } else {
            let mut m = model(cfg, &Backend::Cpu)?;
            Some(agree::record(&mut m, &prompt, &params)?)
        };
        // The reference on the NPU: somr in a window that holds everything (nothing streamed).
        let mut runs: Vec<(String, u64)> =
            vec![("somr".into(), candle_hexagon::device::DEFAULT_VA_WINDOW_MIB)];
        runs.extend(a.policies.iter().map(|p| (p.clone(), a.window_mib)));
        let mut resident: Option<agree::Run> = None;
        for (policy, window) in runs {
            let dev = device(a, |c| Ok(c.with_memory_names(&policy, window)?))?;
            let start = Instant::now();
            let mut m = model(cfg, &Backend::Hexagon(dev.clone()))?;
            if !m.runs_blocks_on_npu() {
                println!("| {policy} | {window} | {budget} | block module refused |");
                continue;
            }
            let before = dev.counters();
            let r = agree::record(&mut m, &prompt, &params);
            let c = dev.counters().since(&before);
            let peak = dev.memory_stats().va.peak_mapped_bytes as f64 / MIB;
            let wall = start.elapsed().as_secs_f64();
            match r {
                Ok(run) => {
                    let vs_cpu = match &cpu {
                        Some(r) => agree::verdict(r, &run, mask)?,
                        None => "-".into(),
                    };
                    let vs_resident = match &resident {
                        Some(r) => agree::verdict(r, &run, mask)?,
                        None => "(this row)".into(),
                    };
                    println!(
                        "| {policy} | {window} | {budget} | completed | {} | {} | {} | {peak:.1} | {wall:.1} | \
                         {vs_cpu} | {vs_resident} |",
                        run.decoded,
                        run.forwards,
                        counters_cells(&c)
                    );
                    if policy == "somr" && window == a.window_mib && a.print_plan {
                        if let Some(p) = dev.last_memory_plan() {
                            println!("\n```\n{p}\n```\n");
                        }
                    }
                    if resident.is_none() {
                        resident = Some(run);
                    }
                }
                Err(e) => {
                    let why = match window_error(&e) {
                        Some(h) => h.to_string(),
                        None => format!("NOT a window error: {e}"),
                    };
                    println!(
                        "| {policy} | {window} | {budget} | failed | - | {} | {} | {peak:.1} | {wall:.1} | - | - |",
                        c.forwards,
                        counters_cells(&c)
                    );
                    failures.push(format!("{policy} at {budget}: {why}"));
                }
            }
        }
    }
    if !failures.is_empty() {
        println!(
            "\nFailures (each the window's own error, raised by the mapping that did not fit):\n"
        );
        for f in failures {
            println!("- {f}");
        }
    }
    println!();
    Ok(())
}

fn weight_mib(cfg: &TransformerConfig) -> f64 {
    let (h, f, v) = (cfg.hidden_size, cfg.intermediate_size, cfg.vocab_size);
    let kv = cfg.num_kv_heads * cfg.head_dim();
    let per = h * (h + 2 * kv) + h * h + 2 * f * h + f * h;
    ((per * cfg.num_layers + v * h) * 2) as f64 / MIB
}

fn fig13c(a: &Args, cfg: &TransformerConfig) -> Result<()> {
    println!(
        "## Figure 13c analog: somr, staging budget {} MiB (2 slots), window {} rows over {} cached, {} \
         layers ({:.0} MiB of fp16 weights); per forward, median of {}\n",
        a.staging_mib,
        a.fig_window,
        a.fig_cached,
        cfg.num_layers,
        weight_mib(cfg),
        a.fig_forwards
    );
    println!(
        "| resident budget | resident MiB | streamed weights | batches | streamed MiB | staging ms | \
         stall ms | expected stall ms | projected stall ms at {}x | maps | unmaps | ms / forward |",
        a.project_speedup
    );
    println!("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    let len = a.fig_cached + a.fig_window;
    let ids: Vec<u32> = (0..len as u32).map(|i| (i * 7919 + 13) % 8000).collect();
    let canvas = Tensor::from_vec(ids, (1, len), &Device::Cpu)?;
    for cap in &a.resident_mib {
        let cap_bytes = match cap.as_str() {
            "all" => None,
            n => Some(
                n.parse::<u64>()
                    .map_err(|_| anyhow!("--resident-mib: `{n}`"))?
                    << 20,
            ),
        };
        let dev = device(a, |c| {
            Ok(HexagonConfig {
                staging_bytes: a.staging_mib << 20,
                resident_weight_bytes: cap_bytes,
                ..c
            })
        })?;
        let mut m = model(cfg, &Backend::Hexagon(dev.clone()))?;
        if !m.runs_blocks_on_npu() {
            bail!("the block module was refused:\n{}", dev.routing_report());
        }
        // Prefill in windows of the measured shape (the first one is the profiling forward).
        let mut at = 0;
        while at < a.fig_cached {
            let end = (at + a.fig_window).min(a.fig_cached);
            m.forward(&canvas, at..end, Rows::All)?;
            m.commit(at..end)?;
            at = end;
        }
        let win = a.fig_cached..len;
        m.forward(&canvas, win.clone(), Rows::All)?; // slots warm
        let mut per: Vec<(f64, DeviceCounters)> = Vec::new();
        for _ in 0..a.fig_forwards {
            let before = dev.counters();
            let t = Instant::now();
            m.forward(&canvas, win.clone(), Rows::All)?;
            per.push((
                t.elapsed().as_secs_f64() * 1e3,
                dev.counters().since(&before),
            ));
        }
        // Medians per column over the timed forwards.
        let median = |f: &dyn Fn(&(f64, DeviceCounters)) -> f64| {
            let mut v: Vec<f64> = per.iter().map(f).collect();
            v.sort_by(f64::total_cmp);
            v[v.len() / 2]
        };
        let c = per[0].1;
        let staging = median(&|p| (p.1.stall_ns + p.1.overlapped_ns) as f64 / 1e6);
        let stall = median(&|p| p.1.stall_ns as f64 / 1e6);
        let wall = median(&|p| p.0);
        let plan = dev.last_memory_plan().context("somr made no plan")?;
        println!(
            "| {cap} | {:.1} | {} / {} | {} | {:.1} | {:.2} | {:.2} | {:.2} | {:.2} | {} | {} | {:.1} |",
            plan.resident_bytes as f64 / MIB,
            plan.streamed(),
            plan.rows.len(),
            c.dsp_batches,
            c.bytes_streamed as f64 / MIB,
            staging,
            stall,
            plan.expected_stall_ns as f64 / 1e6,
            plan.projected_stall_ns(a.project_speedup) as f64 / 1e6,
            c.maps,
            c.unmaps,
            wall
        );
        if a.print_plan {
            println!("\n```\n{plan}\n```\n");
        }
    }
    println!();
    Ok(())
}

fn main() -> Result<()> {
    let a = Args::parse();
    if a.layers == 0
        || a.tokens_per_step == 0
        || a.block == 0
        || a.fig_forwards == 0
        || a.fig_window == 0
    {
        bail!("--layers, --tokens-per-step, --block, --fig-forwards and --fig-window must be positive");
    }
    let mut cfg = bench_llada_100m();
    cfg.num_layers = a.layers;
    println!(
        "emulated DSP ({} workers): the kernels' host build on x86 threads, an emulated NPU window \
         and mapper table — nothing here is a Hexagon measurement\n",
        a.workers
    );
    match a.only.as_str() {
        "table7" => table7(&a, &cfg),
        "fig13c" => fig13c(&a, &cfg),
        "both" => table7(&a, &cfg).and_then(|_| fig13c(&a, &cfg)),
        o => bail!("--only: `{o}` (expected table7, fig13c or both)"),
    }
}
