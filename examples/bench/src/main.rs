//! `bench`: the paper's evaluation (§5) on this project's models, by one command.
//!
//! ```text
//! cargo run --release -p bench -- --out bench-out            # the long-answer model, 10 prompts/task
//! cargo run --release -p bench -- --out /tmp/b --quick       # two prompts, a smoke run
//! ```
//!
//! Writes `table6.md` (the ablation: CPU / NPU, prefix cache, SOMR, MBSD, STS, SLS, verification),
//! `table5.md` (accuracy per task), `sweeps.md` (Figure 13 a/b/c analogs), `results.json` (every
//! number, with the counter names of `generate --json`) and SVG plots into `--out`. Wall times are
//! measured on this machine (the `hexagon` rows on the emulated DSP); phone latencies are
//! **projected** from the paper's Table 2 by replaying each run's forwards ([`projection`]).
//! With `--pareto`, the speed/quality picture instead ([`pareto`]).

mod energy;
mod pareto;
mod plot;
mod projection;
mod report;
mod rows;
mod stats;

use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{anyhow, bail, Context, Result};
use candle_core::{DType, Device};
use candle_hexagon::{HexagonConfig, HexagonDevice};
use clap::Parser;
use dllm_decode::{Decide, DecodeParams, MbsdParams, Requested, Staged, Strategy, Verify};
use dllm_models::{load, Backend, DiffusionLm, LoadOptions, LoadedModel, ModelSource};
use dllm_tasks::eval::QuestionSet;
use dllm_tasks::Example;

use rows::{Dev, RowResult, RowSpec};

/// Reproduce the paper's evaluation tables, sweeps and plots on a task-suite model.
#[derive(Parser, Debug)]
#[command(version, about, long_about = None)]
struct Args {
    /// Output directory (created if needed).
    #[arg(long, default_value = "bench-out")]
    out: PathBuf,
    /// Model directory, GGUF file or hub id with a task-suite tokenizer [default: the shipped
    /// long-answer model, models/tiny-llada-long].
    #[arg(long)]
    model: Option<String>,
    /// A smoke run: two prompts, the ablation rows and two points per sweep.
    #[arg(long)]
    quick: bool,
    /// Held-out prompts per task (ignored with --quick).
    #[arg(long, default_value_t = 10)]
    prompts: usize,
    /// Generated positions.
    #[arg(long, default_value_t = 128)]
    gen_length: usize,
    /// Block length of the configurations with blocks (mbsd with a span, LLaDA's default, decodes
    /// the answer as one block).
    #[arg(long, default_value_t = 32)]
    block_length: usize,
    /// Threads for the CPU kernels (default: one per core).
    #[arg(long)]
    threads: Option<usize>,
    /// Hexagon: DSP worker threads.
    #[arg(long, default_value_t = candle_hexagon::device::DEFAULT_WORKERS)]
    hexagon_workers: usize,
    /// Hexagon: NPU address window in MiB for the NPU rows [default: the device's].
    #[arg(long)]
    hexagon_window: Option<u64>,
    /// Confidence at which a prediction becomes visible context (STS rows).
    #[arg(long, default_value_t = dllm_decode::params::DEFAULT_THETA_VISIBLE)]
    theta_visible: f32,
    /// Confidence at which a token becomes final (STS rows).
    #[arg(long, default_value_t = dllm_decode::params::DEFAULT_THETA_STABLE)]
    theta_stable: f32,
    /// Skip the sensitivity sweeps.
    #[arg(long)]
    no_sweeps: bool,
    /// Instead of the tables, draw the speed/quality picture: every decoding configuration on
    /// the long-math question sets (CPU, decisions as on the NPU), accuracy with Wilson intervals
    /// and McNemar tests against vanilla, projected SM8750 latency and CPU wall time, frontiers,
    /// forwards per strategy, mechanism contributions (pareto.md, pareto.svg, pareto.json).
    #[arg(long)]
    pareto: bool,
    /// --pareto: the question sets, comma-separated: `tuning` (held-out long-math 1-100),
    /// `confirmation` (the confirmation generator's 1-300, held-out 101-400), `fresh` (the
    /// confirmation generator's 301-600, held-out 401-700), `fresh2` (its 601-900, held-out
    /// 701-1000), `fresh3` (its 901-1200, held-out 1001-1300), `fresh4` (its 1201-1500,
    /// held-out 1301-1600), `fresh5` (its 1501-1800, held-out 1601-1900), `fresh6` (its
    /// 1801-2100, held-out 1901-2200), `fresh7` (its 2101-2400, held-out 2201-2500), `fresh8`
    /// (its 2401-2700, held-out 2501-2800) and `fresh9` (its 2701-3000, held-out 2801-3100)
    /// [default: all but fresh4 to fresh9].
    #[arg(long, value_delimiter = ',', value_parser = parse_set)]
    sets: Vec<QuestionSet>,
    /// --pareto: ask only the first N questions of each set (a smoke run) [default: all].
    #[arg(long)]
    pareto_questions: Option<usize>,
    /// --pareto: only the configurations with exactly this label, or else whose label contains it
    /// (repeat the flag for several; labels contain commas, so one value is one pattern).
    #[arg(long)]
    only: Vec<String>,
    /// Add the oracle-revision rows: Visible tokens that differ from the reference answer are
    /// replaced by it (what any revision could recover at most).
    #[arg(long)]
    oracle_revision: bool,
    /// Projection: the NPU forward's speed while the CPU computes beside it, in (0, 1] (the paper
    /// measured 0.98x for its refresh; nothing runs beside the NPU in these decoders).
    #[arg(long, default_value_t = projection::DEFAULT_CONTENTION)]
    contention: f64,
    /// Projection: where an NPU run's logits rows are priced: `cpu` (the LM head does not fit the
    /// NPU: HEAD_SHARE of a CPU token per row, serially after the forward) or `npu` (inside the
    /// NPU table's latency, as the paper's table reports it).
    #[arg(long, default_value = "cpu", value_parser = parse_logits_on)]
    logits_on: projection::LogitsOn,
}

fn parse_set(s: &str) -> std::result::Result<QuestionSet, String> {
    s.trim()
        .parse()
        .map_err(|e: dllm_tasks::Error| e.to_string())
}

fn parse_logits_on(s: &str) -> std::result::Result<projection::LogitsOn, String> {
    s.parse()
}

fn default_model() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../models/tiny-llada-long")
}

/// The loaded model of one device configuration.
struct Loaded {
    model: LoadedModel,
    hex: Option<HexagonDevice>,
}

fn load_for(
    source: &ModelSource,
    dev: Dev,
    workers: usize,
    window: Option<u64>,
    threads: Option<usize>,
) -> Result<Loaded> {
    let (backend, hex) = match dev {
        Dev::Cpu => (Backend::Cpu, None),
        Dev::Npu(policy) => {
            let base = HexagonConfig {
                workers,
                ..Default::default()
            };
            let window = window.unwrap_or(base.va_window_bytes / (1024 * 1024));
            let cfg = base
                .with_memory_names(policy, window)
                .map_err(|e| anyhow!("--hexagon-window / memory policy {policy}: {e}"))?;
            let d = HexagonDevice::open(cfg).context("opening the hexagon device")?;
            (Backend::Hexagon(d.clone()), Some(d))
        }
    };
    let opts = LoadOptions {
        dtype: DType::F32,
        device: Device::Cpu,
        backend,
        threads,
        ..Default::default()
    };
    let model = load(source, &opts).with_context(|| format!("loading {source}"))?;
    Ok(Loaded { model, hex })
}

/// The ablation rows of the paper's Table 6, each adding one switch to the row above.
fn ablation(base: &DecodeParams, thetas: (f32, f32), oracle: bool) -> Vec<RowSpec> {
    // Each row computes what its algorithm computes: logits for every window row until `+ SLS`.
    let mut base = *base;
    base.sls = false;
    let base = &base;
    let with = |strategy: Strategy| DecodeParams { strategy, ..*base };
    // The paper's MBSD, lookahead included (the decoder's default leaves it off: see the README).
    let paper_mbsd = MbsdParams {
        lookahead: true,
        ..MbsdParams::default()
    };
    let mbsd = |sts: bool, sls: bool, verify: bool| {
        let mut p = with(Strategy::Mbsd(paper_mbsd));
        if sts {
            p.decide = staged(thetas, verify);
        }
        p.sls = sls;
        p
    };
    let row = |label: &str, dev: Dev, params: DecodeParams| RowSpec {
        label: label.to_string(),
        dev,
        project_to: dev.target(),
        params,
        oracle: false,
    };
    vec![
        row("CPU", Dev::Cpu, with(Strategy::Vanilla)),
        row(
            "CPU + prefix KV cache",
            Dev::Cpu,
            with(Strategy::PrefixCache),
        ),
        row("NPU", Dev::Npu("paging"), with(Strategy::Vanilla)),
        row(
            "NPU + prefix KV cache",
            Dev::Npu("paging"),
            with(Strategy::PrefixCache),
        ),
        row("+ SOMR", Dev::Npu("somr"), with(Strategy::PrefixCache)),
        row("+ MBSD", Dev::Npu("somr"), mbsd(false, false, false)),
        row("+ STS", Dev::Npu("somr"), mbsd(true, false, false)),
        row("+ SLS", Dev::Npu("somr"), mbsd(true, true, false)),
        row("+ verification", Dev::Npu("somr"), mbsd(true, true, true)),
    ]
    .into_iter()
    .chain(oracle.then(|| RowSpec {
        oracle: true,
        ..row(
            "+ verification, oracle revision",
            Dev::Npu("somr"),
            mbsd(true, true, true),
        )
    }))
    .collect()
}

/// Staged decisions at `thetas`, with the default verification when `verify`.
fn staged((visible, stable): (f32, f32), verify: bool) -> Decide {
    Decide::Staged(Staged {
        visible,
        stable,
        verify: verify.then(Verify::default),
        ..Staged::default()
    })
}

/// The full configuration: mbsd with staged decisions at `thetas` and verification.
fn full(base: &DecodeParams, thetas: (f32, f32), mbsd: MbsdParams) -> DecodeParams {
    DecodeParams {
        strategy: Strategy::Mbsd(mbsd),
        decide: staged(thetas, true),
        ..*base
    }
}

/// Figure 13a: the lookahead trigger; Figure 13b: the visibility / stability thresholds. Both on
/// the full configuration, decoded on the CPU (the decisions do not depend on the device).
fn sweeps(base: &DecodeParams, thetas: (f32, f32), quick: bool) -> (Vec<RowSpec>, Vec<RowSpec>) {
    let triggers: &[usize] = if quick { &[0, 4] } else { &[0, 1, 2, 4, 8, 16] };
    let a = triggers
        .iter()
        .map(|&t| {
            let p = full(
                base,
                thetas,
                MbsdParams {
                    trigger: t,
                    lookahead: true,
                    ..Default::default()
                },
            );
            RowSpec {
                label: format!("trigger {t}"),
                dev: Dev::Cpu,
                project_to: projection::Target::Npu,
                params: p,
                oracle: false,
            }
        })
        .collect();
    let grid: &[(f32, f32)] = if quick {
        &[(0.7, 0.9), (0.5, 0.8)]
    } else {
        &[
            (0.5, 0.8),
            (0.5, 0.9),
            (0.5, 0.95),
            (0.7, 0.8),
            (0.7, 0.9),
            (0.7, 0.95),
            (0.9, 0.9),
            (0.9, 0.95),
        ]
    };
    let b = grid
        .iter()
        .map(|&(v, s)| {
            let p = full(base, (v, s), MbsdParams::default());
            RowSpec {
                label: format!("visible {v} / stable {s}"),
                dev: Dev::Cpu,
                project_to: projection::Target::Npu,
                params: p,
                oracle: false,
            }
        })
        .collect();
    (a, b)
}

/// Figure 13c: the NPU window shrinking under SOMR, full configuration.
fn window_sweep(
    base: &DecodeParams,
    thetas: (f32, f32),
    weight_mib: u64,
    quick: bool,
) -> Vec<(u64, RowSpec)> {
    let full = full(base, thetas, MbsdParams::default());
    let fractions: &[f64] = if quick {
        &[4.0, 0.5]
    } else {
        &[4.0, 1.0, 0.75, 0.5, 0.25]
    };
    let mut seen = Vec::new();
    fractions
        .iter()
        .filter_map(|f| {
            let mib = ((weight_mib as f64 * f).ceil() as u64).max(1);
            if seen.contains(&mib) {
                return None;
            }
            seen.push(mib);
            Some((
                mib,
                RowSpec {
                    label: format!("window {mib} MiB ({:.0}% of weights)", f * 100.0),
                    dev: Dev::Npu("somr"),
                    project_to: projection::Target::Npu,
                    params: full,
                    oracle: false,
                },
            ))
        })
        .collect()
}

struct Runner<'a> {
    args: &'a Args,
    source: ModelSource,
    tok: tokenizers::Tokenizer,
    phone: projection::PhoneModel,
    power: Option<energy::PowerSource>,
    loaded: Vec<(Dev, Option<u64>, Loaded)>,
}

impl Runner<'_> {
    fn run(
        &mut self,
        spec: &RowSpec,
        window: Option<u64>,
        examples: &[Example],
    ) -> Result<RowResult> {
        let key = (spec.dev, window);
        let idx = match self.loaded.iter().position(|(d, w, _)| (*d, *w) == key) {
            Some(i) => i,
            None => {
                let w = window.or(self.args.hexagon_window);
                let l = load_for(
                    &self.source,
                    spec.dev,
                    self.args.hexagon_workers,
                    w,
                    self.args.threads,
                )?;
                self.loaded.push((spec.dev, window, l));
                self.loaded.len() - 1
            }
        };
        let l = &mut self.loaded[idx].2;
        let n = examples.len();
        let tty = std::io::stderr().is_terminal();
        let t0 = Instant::now();
        let r = rows::run_row(
            spec,
            &mut l.model,
            l.hex.as_ref(),
            &self.tok,
            examples,
            &self.phone,
            self.power.as_ref(),
            |done| {
                if tty {
                    eprint!("\r  {:<34} {done}/{n}", spec.label)
                }
            },
        )?;
        eprintln!(
            "{}  {:<34} {n}/{n} in {:.1}s{}",
            if tty { "\r" } else { "" },
            spec.label,
            t0.elapsed().as_secs_f64(),
            r.failed
                .as_deref()
                .map(|e| format!(" — FAILED: {e}"))
                .unwrap_or_default()
        );
        Ok(r)
    }
}

/// Every flag checked before any work (the rows take minutes): errors name the flag.
fn check_args(a: &Args) -> Result<()> {
    if a.prompts == 0 {
        bail!("--prompts must be positive (held-out prompts per task)");
    }
    if a.pareto_questions == Some(0) {
        bail!("--pareto-questions must be positive");
    }
    if !a.pareto
        && (!a.only.is_empty()
            || a.oracle_revision
            || !a.sets.is_empty()
            || a.pareto_questions.is_some())
    {
        bail!("--only, --oracle-revision, --sets and --pareto-questions apply to --pareto only");
    }
    for (i, s) in a.sets.iter().enumerate() {
        if a.sets[..i].contains(s) {
            bail!("--sets lists `{}` twice", s.name());
        }
    }
    projection::PhoneModel::new(a.contention, a.logits_on)
        .map_err(|e| anyhow!("--contention {e}"))?;
    if a.hexagon_workers == 0 {
        bail!("--hexagon-workers must be positive");
    }
    if let Some(w) = a.hexagon_window {
        HexagonConfig::default()
            .with_memory_names("somr", w)
            .map_err(|e| anyhow!("--hexagon-window {w}: {e}"))?;
    }
    // The decoding of every row, as far as the flags decide it: the ablation's mbsd rows carry
    // the thresholds, and the lengths are the flags' (the checkpoint adds nothing but steps).
    let p = full(
        &DecodeParams::default(),
        (a.theta_visible, a.theta_stable),
        MbsdParams::default(),
    );
    llada_cli::check_before_load(
        p,
        Requested {
            gen_length: Some(a.gen_length),
            block_length: Some(a.block_length),
            steps: None,
            threshold: None,
        },
    )
}

/// The rows that failed, as an error naming each (the reports are written first).
fn failed_rows<'a>(rows: impl IntoIterator<Item = &'a RowResult>) -> Result<()> {
    let failed: Vec<String> = rows
        .into_iter()
        .filter_map(|r| {
            r.failed
                .as_ref()
                .map(|e| format!("`{}`: {e}", r.spec.label))
        })
        .collect();
    if failed.is_empty() {
        return Ok(());
    }
    bail!("{} row(s) failed:\n  {}", failed.len(), failed.join("\n  "))
}

fn run(a: Args) -> Result<()> {
    check_args(&a)?;
    if let Some(t) = a.threads {
        // Every row's model gets its own pool of this size (LoadOptions::threads).
        dllm_models::threads::pool(t).context("--threads")?;
    }
    let source = match &a.model {
        Some(s) => ModelSource::parse(s)?,
        None => {
            let p = default_model();
            if !p.join("config.json").exists() {
                bail!(
                    "the default model {} is missing: pass --model <dir|gguf|hub id>",
                    p.display()
                );
            }
            ModelSource::Dir(p)
        }
    };
    std::fs::create_dir_all(&a.out).with_context(|| format!("--out {}", a.out.display()))?;
    let t_all = Instant::now();
    let cpu = load_for(&source, Dev::Cpu, a.hexagon_workers, None, a.threads)?;
    let text_tok = cpu
        .model
        .tokenizer
        .as_ref()
        .ok_or_else(|| anyhow!("{} has no tokenizer.json", cpu.model.source))?;
    let tok = text_tok.inner().clone();
    let suite = dllm_tasks::tokenizer::suite_of(&tok)
        .context("the model's tokenizer is not a task-suite tokenizer")?;
    let per_task = if a.quick { 1 } else { a.prompts };
    let mut examples = dllm_tasks::eval::questions(&suite.tasks(), Some(per_task));
    if a.quick {
        examples.truncate(2);
    }
    if a.pareto && !suite.tasks().contains(&dllm_tasks::TaskKind::LongMath) {
        bail!(
            "--pareto asks long-math questions: {} has the {} suite's tokenizer",
            cpu.model.source,
            suite.name()
        );
    }
    let asked = Requested {
        gen_length: Some(a.gen_length),
        block_length: Some(a.block_length),
        steps: None,
        threshold: None,
    };
    let base = DecodeParams::default().resolve(asked, &cpu.model.defaults);
    base.validate().map_err(llada_cli::cli_error)?;
    let thetas = (a.theta_visible, a.theta_stable);
    let info = cpu.model.model.info().clone();
    eprintln!(
        "bench: {} ({}, {:.2}M parameters, {} suite), {} prompts per row, gen {} block {}",
        cpu.model.source,
        info.arch,
        info.num_params as f64 / 1e6,
        suite.name(),
        if a.pareto { 0 } else { examples.len() },
        base.gen_length,
        base.block_length
    );
    let power = energy::PowerSource::find(Path::new("/sys/class/power_supply"));
    let mut runner = Runner {
        args: &a,
        source: source.clone(),
        tok,
        phone: projection::PhoneModel::new(a.contention, a.logits_on)
            .map_err(|e| anyhow!("--contention {e}"))?,
        power,
        loaded: vec![(Dev::Cpu, None, cpu)],
    };

    if a.pareto {
        return run_pareto(&a, &mut runner, &base, info.shift_logits, t_all);
    }
    eprintln!("Table 6 / Table 5 rows:");
    let mut table = Vec::new();
    for spec in ablation(&base, thetas, a.oracle_revision) {
        table.push(runner.run(&spec, None, &examples)?);
    }
    let mut sweep_a = Vec::new();
    let mut sweep_b = Vec::new();
    let mut sweep_c = Vec::new();
    if !a.no_sweeps {
        let (sa, sb) = sweeps(&base, thetas, a.quick);
        eprintln!("Figure 13a (lookahead trigger):");
        for s in sa {
            sweep_a.push(runner.run(&s, None, &examples)?);
        }
        eprintln!("Figure 13b (thresholds):");
        for s in sb {
            sweep_b.push(runner.run(&s, None, &examples)?);
        }
        // The weights as the NPU holds them (fp16), rounded up to whole MiB.
        let weight_mib = (info.num_params as u64 * 2).div_ceil(1024 * 1024).max(1);
        eprintln!("Figure 13c (NPU window, SOMR):");
        for (mib, s) in window_sweep(&base, thetas, weight_mib, a.quick) {
            sweep_c.push((mib, runner.run(&s, Some(mib), &examples)?));
        }
    }
    let ctx = report::Context {
        model: runner.loaded[0].2.model.source.clone(),
        arch: info.arch.to_string(),
        params: info.num_params,
        suite,
        tasks: suite.tasks().to_vec(),
        prompts: examples.len(),
        base,
        power: runner.power.is_some(),
        wall_s: t_all.elapsed().as_secs_f64(),
        phone: runner.phone.clone(),
    };
    let all = || {
        table
            .iter()
            .chain(&sweep_a)
            .chain(&sweep_b)
            .chain(sweep_c.iter().map(|(_, r)| r))
    };
    if all().all(|r| r.failed.is_some()) {
        // Nothing measured: no report to write.
        return failed_rows(all());
    }
    report::write_all(&a.out, &ctx, &table, &sweep_a, &sweep_b, &sweep_c)?;
    plot::write_all(&a.out, &table)?;
    eprintln!("wrote {}", a.out.display());
    print!("{}", std::fs::read_to_string(a.out.join("table6.md"))?);
    failed_rows(all())
}

/// `--pareto`: every configuration of [`pareto::specs`] on every question set.
fn run_pareto(
    a: &Args,
    runner: &mut Runner<'_>,
    base: &DecodeParams,
    shift_logits: bool,
    t_all: Instant,
) -> Result<()> {
    let mut specs = pareto::specs(base, a.quick, shift_logits);
    specs.rows.retain(|s| a.oracle_revision || !s.oracle);
    specs.rows = pareto::select(&specs.rows, &a.only);
    if specs.rows.is_empty() {
        bail!("--only {:?} matches no configuration", a.only);
    }
    let chosen = if a.sets.is_empty() {
        QuestionSet::PICTURE.to_vec()
    } else {
        a.sets.clone()
    };
    let cap = if a.quick {
        Some(a.pareto_questions.unwrap_or(2).min(2))
    } else {
        a.pareto_questions
    };
    let sets: Vec<(QuestionSet, Vec<Example>)> = chosen
        .iter()
        .map(|&s| (s, pareto::set_questions(s, cap)))
        .collect();
    let pic = pareto::run(specs, &sets, |s, q| runner.run(s, None, q))?;
    let header = format!(
        "Model: `{}`; long-math question sets {}; gen length {}, block {} (one block for mbsd \
         with a span), greedy; CPU wall times with {} on {}. Bench wall time {:.0} s.",
        runner.loaded[0].2.model.source,
        sets.iter()
            .map(|(s, q)| format!("{} ({} questions)", s.name(), q.len()))
            .collect::<Vec<_>>()
            .join(" and "),
        base.gen_length,
        base.block_length,
        a.threads
            .map_or("one thread per core".to_string(), |t| format!(
                "{t} thread(s)"
            )),
        report::machine(),
        t_all.elapsed().as_secs_f64()
    );
    let ctx = pareto::report::Context {
        header,
        base: *base,
        phone: runner.phone.clone(),
    };
    pareto::write_all(&a.out, &pic, &ctx)?;
    eprintln!("wrote {}", a.out.display());
    print!("{}", std::fs::read_to_string(a.out.join("pareto.md"))?);
    let mut failed: Vec<&str> = Vec::new();
    for r in pic.sets.iter().flat_map(|s| &s.rows) {
        if r.failed.is_some() && !failed.contains(&r.spec.label.as_str()) {
            failed.push(&r.spec.label);
        }
    }
    // The rows run for the contributions table fail the run too (their cells say "failed").
    for o in pic.contributions.iter().flat_map(|c| &c.off) {
        if o.numbers.iter().any(Option::is_none) && !failed.contains(&o.label.as_str()) {
            failed.push(&o.label);
        }
    }
    if !failed.is_empty() {
        bail!(
            "{} configuration(s) failed: {}",
            failed.len(),
            failed.join(", ")
        );
    }
    Ok(())
}

fn main() {
    let a = Args::parse();
    if let Err(e) = run(a) {
        eprintln!("error: {e:#}");
        std::process::exit(1);
    }
}
