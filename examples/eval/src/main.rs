//! `eval`: run the held-out task suite (200 questions per task, or `--limit N`) through any decoding
//! strategy and print, per task, exact and final-answer accuracy, per-step accuracy of worked
//! answers, forwards per answer, tokens committed per forward and wall time — the paper's accuracy
//! protocol on the synthetic suite. `--json` adds every answer with the decoding step at which
//! each generated position was committed (the commit frontier).
//!
//! ```text
//! eval --model models/tiny-llada --strategy vanilla            # one token per step
//! eval --model models/tiny-llada --strategy dual-cache --threshold 0.9 --json
//! eval --model models/tiny-llada-long                           # the long suite (detected)
//! ```

use std::path::PathBuf;
use std::time::Instant;

use anyhow::{anyhow, bail, Context, Result};
use clap::Parser;
use dllm_models::{load, DiffusionLm, LoadOptions, ModelSource};
use dllm_tasks::eval::{calibration, calibration_table, evaluate, questions, table, QuestionSet};
use dllm_tasks::{Suite, TaskKind};
use indicatif::{ProgressBar, ProgressStyle};

/// Evaluate a task-suite model on the held-out set.
#[derive(Parser, Debug)]
#[command(version, about)]
struct Args {
    /// Model directory, GGUF file or hub id; it must use the task-suite tokenizer.
    #[arg(long, visible_alias = "model-id")]
    model: String,
    /// A tokenizer.json to use instead of the one next to the weights.
    #[arg(long)]
    tokenizer: Option<PathBuf>,
    /// Questions per task (default: all 200).
    #[arg(long)]
    limit: Option<usize>,
    /// Task suite: short or long [default: the one whose tokenizer the model has].
    #[arg(long)]
    suite: Option<String>,
    /// Tasks to run (comma-separated: math, yesno, choice, completion, long-math, long-yesno,
    /// long-choice, long-story) [default: every task of the suite].
    #[arg(long, value_delimiter = ',')]
    tasks: Option<Vec<String>>,
    /// The long-math question set: tuning (held-out questions 1-100), confirmation (a separately
    /// written generator's 300 and held-out 101-400), fresh (that generator's 301-600 and held-out
    /// 401-700), fresh2 (its 601-900 and held-out 701-1000) or fresh3 (its 901-1200 and held-out
    /// 1001-1300); defaults are chosen on the earlier sets and judged on the next (README,
    /// *Default decoding*) [default: the held-out test sets of the tasks].
    #[arg(long)]
    set: Option<String>,
    /// Decoding: `generate`'s flags (its defaults; the generated length defaults to the
    /// checkpoint's recommendation, else 24 for the short suite and 128 for the long one).
    #[command(flatten)]
    decode: llada_cli::DecodeArgs,
    /// Threads for every CPU kernel, 1..=256 (default: one per core).
    #[arg(long)]
    threads: Option<usize>,
    /// Print one JSON object (scores per task and settings) instead of the table.
    #[arg(long)]
    json: bool,
    /// Also write every question's outcome as JSON lines here.
    #[arg(long)]
    dump: Option<PathBuf>,
    /// Instead of decoding, run the teacher-forced skill probe on long-math (copy, lookup and
    /// arithmetic accuracy of the worked lines; see `dllm_tasks::probe`).
    #[arg(long)]
    probe: bool,
    /// Also print the calibration of the committed tokens: their accuracy (against the reference
    /// answer, position by position) per confidence band, per task.
    #[arg(long)]
    calibration: bool,
}

/// Names a model is made of: `--dump` never replaces one.
const MODEL_FILE_NAMES: [&str; 5] = [
    "config.json",
    "generation_config.json",
    "tokenizer.json",
    "model.safetensors.index.json",
    "train_args.json",
];

/// `--dump` writes answers, never over a model: not a file named like a model file or with a
/// weights extension, and not an existing file of the evaluated model's directory (or the
/// evaluated GGUF itself). Checked before the evaluation runs.
fn check_dump_target(path: &std::path::Path, source: &ModelSource) -> Result<()> {
    let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
    let ext = path.extension().and_then(|e| e.to_str()).unwrap_or("");
    if MODEL_FILE_NAMES.contains(&name) || matches!(ext, "safetensors" | "gguf" | "bin" | "pt") {
        bail!(
            "--dump {}: refusing to write answers to a model file name",
            path.display()
        );
    }
    if path.is_dir() {
        bail!("--dump {}: is a directory", path.display());
    }
    let canon = |p: &std::path::Path| std::fs::canonicalize(p).ok();
    if let Some(target) = canon(path) {
        let model_dir = match source {
            ModelSource::Dir(d) => canon(d),
            ModelSource::Gguf(f) => {
                if canon(f).as_ref() == Some(&target) {
                    bail!("--dump {}: is the model being evaluated", path.display());
                }
                f.parent().and_then(canon)
            }
            ModelSource::Hub { .. } => None,
        };
        if model_dir.is_some() && target.parent() == model_dir.as_deref() {
            bail!(
                "--dump {}: refusing to overwrite a file of the model's directory",
                path.display()
            );
        }
    }
    Ok(())
}

/// `--dump`'s file while the evaluation runs: created at once under a temporary name in the
/// target's directory (so a missing or read-only directory fails before any work), renamed over
/// the target when the answers are written (never following a symlink there), removed if the
/// evaluation fails.
struct DumpFile {
    tmp: std::path::PathBuf,
    path: std::path::PathBuf,
    file: Option<std::fs::File>,
}

impl DumpFile {
    fn create(path: &std::path::Path) -> Result<Self> {
        if let Some(k) = dllm_models::files::describe(path).filter(|k| *k != "a directory") {
            bail!("--dump {}: is {k}, not a regular file", path.display());
        }
        let mut name = path.file_name().unwrap_or_default().to_os_string();
        name.push(format!(".partial-{}", std::process::id()));
        let tmp = path.with_file_name(name);
        let file = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&tmp)
            .with_context(|| {
                format!("--dump {}: cannot create {}", path.display(), tmp.display())
            })?;
        Ok(Self {
            tmp,
            path: path.to_path_buf(),
            file: Some(file),
        })
    }

    fn finish(mut self, bytes: &[u8]) -> Result<()> {
        use std::io::Write;
        let mut f = self.file.take().expect("written once");
        f.write_all(bytes)
            .and_then(|_| f.sync_all())
            .with_context(|| format!("writing {}", self.tmp.display()))?;
        std::fs::rename(&self.tmp, &self.path)
            .with_context(|| format!("renaming {} to {}", self.tmp.display(), self.path.display()))
    }
}

impl Drop for DumpFile {
    fn drop(&mut self) {
        // Not renamed into place: the evaluation failed (or finish did).
        let _ = std::fs::remove_file(&self.tmp);
    }
}

fn main() {
    if let Err(e) = run(Args::parse()) {
        eprintln!("error: {e:#}");
        std::process::exit(1);
    }
}

fn run(a: Args) -> Result<()> {
    if let Some(t) = a.threads {
        // The model's own pool (LoadOptions::threads), where its CPU kernels run: checked now,
        // before anything is loaded.
        dllm_models::threads::pool(t).context("--threads")?;
    }
    let asked_suite: Option<Suite> = a
        .suite
        .as_deref()
        .map(|s| s.parse().map_err(|e| anyhow!("--suite: {e}")))
        .transpose()?;
    let asked_tasks: Option<Vec<TaskKind>> = a
        .tasks
        .as_ref()
        .map(|v| {
            v.iter()
                .map(|s| s.parse::<TaskKind>().map_err(|e| anyhow!("--tasks: {e}")))
                .collect::<Result<_>>()
        })
        .transpose()?;
    if let (Some(kinds), Some(names)) = (&asked_tasks, &a.tasks) {
        for (i, k) in kinds.iter().enumerate() {
            if let Some(j) = kinds[..i].iter().position(|x| x == k) {
                bail!(
                    "--tasks: `{}` and `{}` are the same task ({k}): each task is evaluated once",
                    names[j],
                    names[i]
                );
            }
        }
    }
    if a.limit == Some(0) {
        bail!("--limit must be positive");
    }
    // The decoding flags, checked before the model is loaded (as far as they go without the
    // checkpoint's recommended lengths).
    a.decode.check()?;
    let set: Option<QuestionSet> = a
        .set
        .as_deref()
        .map(|s| s.parse().map_err(|e| anyhow!("--set: {e}")))
        .transpose()?;
    if set.is_some() && (a.tasks.is_some() || a.suite.is_some() || a.probe) {
        bail!("--set is long-math's question sets: it goes without --tasks, --suite and --probe");
    }
    if let Some(t) = &a.tokenizer {
        dllm_models::files::open_regular(t, "tokenizer").context("--tokenizer")?;
    }
    let opts = LoadOptions {
        tokenizer: a.tokenizer.clone(),
        threads: a.threads,
        ..Default::default()
    };
    let source = ModelSource::parse(&a.model)?;
    // Where the answers go, created now (a temporary name beside it, renamed when the evaluation
    // is done): an unwritable --dump fails before the evaluation, not after it.
    let dump = match &a.dump {
        Some(path) => {
            check_dump_target(path, &source)?;
            Some(DumpFile::create(path)?)
        }
        None => None,
    };
    let mut loaded = load(&source, &opts).with_context(|| format!("loading {source}"))?;
    let tok = loaded
        .tokenizer
        .clone()
        .ok_or_else(|| anyhow!("{} has no tokenizer.json (pass --tokenizer)", loaded.source))?;
    let tok_suite = dllm_tasks::tokenizer::suite_of(tok.inner())
        .context("the model's tokenizer is not a task-suite tokenizer")?;
    let suite = asked_suite.unwrap_or(tok_suite);
    let kinds = asked_tasks.unwrap_or_else(|| suite.tasks().to_vec());
    if let Some(k) = kinds.iter().find(|k| k.suite() != tok_suite) {
        bail!(
            "{}: task {k} belongs to the {} suite, but the model has the {tok_suite} suite's tokenizer",
            if a.tasks.is_some() { "--tasks" } else { "--suite" },
            k.suite()
        );
    }
    // The one defaults rule every tool shares (DecodeParams::resolve): flags over the checkpoint's
    // generation_config.json, with the suite's answer length when the checkpoint names none.
    let mut d = loaded.defaults;
    d.gen_length = d.gen_length.or(Some(match suite {
        Suite::Short => 24,
        Suite::Long => dllm_tasks::LONG_GEN_LENGTH,
    }));
    let params = a.decode.params(&d)?;
    if a.probe {
        return run_probe(&a, &mut loaded.model, tok.inner(), suite, params.gen_length);
    }
    let mut qs = match set {
        Some(set) => set.questions(),
        None => questions(&kinds, a.limit),
    };
    if set.is_some() {
        qs.truncate(a.limit.unwrap_or(usize::MAX));
    }
    let pb = if a.json {
        ProgressBar::hidden()
    } else {
        ProgressBar::new(qs.len() as u64)
    };
    pb.set_style(
        ProgressStyle::with_template(
            "{bar:30} {pos}/{len} [{elapsed_precise}<{eta_precise}] {msg}",
        )
        .expect("template"),
    );
    let mut right = 0usize;
    let t0 = Instant::now();
    let (scores, answers) = evaluate(
        &mut loaded.model,
        tok.inner(),
        &qs,
        &params,
        |done, _, ans| {
            right += usize::from(ans.final_answer);
            pb.set_position(done as u64);
            pb.set_message(format!("{:.1}% right", 100.0 * right as f64 / done as f64));
        },
    )?;
    pb.finish_and_clear();
    if let Some(dump) = dump {
        let mut lines = String::new();
        for ans in &answers {
            lines.push_str(&serde_json::to_string(ans)?);
            lines.push('\n');
        }
        dump.finish(lines.as_bytes())?;
    }
    let info = loaded.model.info();
    // Dream's own algorithm runs for the vanilla strategy: it has no blocks and no remasking rule.
    let dream_alg = dllm_decode::uses_dream_algorithm(info.arch, &params);
    let staged = params.decide.staged().filter(|_| !dream_alg);
    let decoding = if dream_alg {
        format!("{} (Dream {})", a.decode.strategy, a.decode.alg)
    } else if a.decode.remasking != "low_confidence" {
        format!("{} ({})", a.decode.strategy, a.decode.remasking)
    } else {
        a.decode.strategy.clone()
    };
    if a.json {
        let out = serde_json::json!({
            "model": loaded.source,
            "suite": suite.name(),
            "params": {
                "set": set.map(QuestionSet::name),
                "strategy": a.decode.strategy, "gen_length": params.gen_length, "block_length": params.block_length,
                "steps": params.steps, "threshold": params.decide.threshold().map(f32_as_written), "remasking": a.decode.remasking,
                "dream_alg": dream_alg.then_some(&a.decode.alg),
                "theta_visible": staged.map(|s| f32_as_written(s.visible)),
                "theta_stable": staged.map(|s| f32_as_written(s.stable)),
                "tau_back": staged.and_then(|s| s.verify).map(|v| f32_as_written(v.tau_back)),
            },
            "tasks": scores.iter().map(|s| serde_json::json!({
                "task": s.task.name(), "paper_dataset": s.task.paper_dataset(), "n": s.n,
                "final_answer_accuracy": s.accuracy(), "exact_accuracy": s.exact_accuracy(),
                "forwards_per_answer": s.forwards_per_answer(), "tokens_per_forward": s.tokens_per_forward(),
                "step_accuracy": s.step_accuracy(), "forwards_per_worked_step": s.forwards_per_step(),
                "remasks": s.remasks, "verified": s.verified,
                "revision_precision": s.revision_precision(), "drafts_wrong": s.drafts_wrong,
                "elapsed_ms": s.elapsed.as_secs_f64() * 1e3,
                "calibration": a.calibration.then(|| calibration(
                    &answers.iter().filter(|x| x.task == s.task).cloned().collect::<Vec<_>>())),
            })).collect::<Vec<_>>(),
            // Every answer, in question order, with the step that committed each generated
            // position (null: filled with EOS after an early stop, never decoded).
            "answers": answers.iter().map(|ans| serde_json::json!({
                "task": ans.task.name(), "final_answer": ans.final_answer, "exact": ans.exact,
                "steps_right": ans.steps.map(|s| s.right), "steps_total": ans.steps.map(|s| s.total),
                "forwards": ans.forwards, "tokens": ans.tokens, "response": ans.response,
                "remasks": ans.remasks, "remasks_wrong": ans.remasks_wrong, "verified": ans.verified,
                "drafts_taken": ans.drafts_taken, "drafts_wrong": ans.drafts_wrong,
                "commit_step": ans.commit_step,
            })).collect::<Vec<_>>(),
            "elapsed_ms": t0.elapsed().as_secs_f64() * 1e3,
        });
        println!("{out}");
    } else {
        println!(
            "{} ({}, {:.2}M parameters) · {} · gen {}{} steps {}{} · {} questions\n",
            loaded.source,
            info.arch,
            info.num_params as f64 / 1e6,
            decoding,
            params.gen_length,
            if dream_alg {
                String::new()
            } else {
                format!(" block {}", params.block_length)
            },
            params.steps,
            match (params.decide.threshold(), staged) {
                (Some(t), _) => format!(" threshold {t}"),
                (None, Some(s)) => format!(
                    " theta {} / {}{}",
                    s.visible,
                    s.stable,
                    match s.verify {
                        Some(v) => format!(", verified (tau_back {})", v.tau_back),
                        None => ", not verified".into(),
                    }
                ),
                (None, None) => String::new(),
            },
            qs.len()
        );
        print!("{}", table(&scores));
        if a.calibration {
            for s in &scores {
                let mine: Vec<_> = answers
                    .iter()
                    .filter(|x| x.task == s.task)
                    .cloned()
                    .collect();
                println!(
                    "\n{}: committed tokens per confidence band\n",
                    s.task.name()
                );
                print!("{}", calibration_table(&calibration(&mine)));
            }
        }
    }
    Ok(())
}

/// `--probe`: the teacher-forced skill probe over the long-math held-out questions.
fn run_probe(
    a: &Args,
    model: &mut dyn DiffusionLm,
    tok: &tokenizers::Tokenizer,
    suite: Suite,
    gen_length: usize,
) -> Result<()> {
    if suite != Suite::Long {
        bail!("--probe: the skill probe runs on the long suite's long-math, not the {suite} suite");
    }
    let examples = questions(&[TaskKind::LongMath], a.limit);
    let s = dllm_tasks::probe::probe_long_math(model, tok, &examples, gen_length)?;
    if a.json {
        println!(
            "{}",
            serde_json::json!({
                "model": a.model, "questions": examples.len(),
                "copy": s.copy.accuracy(), "lookup": s.lookup.accuracy(),
                "arithmetic": s.arithmetic.accuracy(), "counts": s,
            })
        );
    } else {
        println!(
            "{}: teacher-forced skill probe, long-math, {} questions\n",
            a.model,
            examples.len()
        );
        println!("| skill | right | probes | accuracy |\n|---|---:|---:|---:|");
        for (name, k) in [
            ("copy (first operand = previous result)", s.copy),
            ("lookup (the month's operator and operand)", s.lookup),
            ("arithmetic (the line's result)", s.arithmetic),
        ] {
            println!(
                "| {name} | {} | {} | {:.1}% |",
                k.right,
                k.total,
                100.0 * k.accuracy()
            );
        }
    }
    Ok(())
}

/// An f32 as the f64 of its shortest decimal form (0.9f32 prints as 0.9 in JSON, not 0.8999999761581421).
fn f32_as_written(x: f32) -> f64 {
    x.to_string().parse().unwrap_or(x as f64)
}
