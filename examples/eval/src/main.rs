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
use dllm_decode::DecodeParams;
use dllm_models::{load, DecodeDefaults, DiffusionLm, LoadOptions, ModelSource};
use dllm_tasks::eval::{evaluate_with, questions, Answered, Decisions, QuestionSet, TaskScore};
use dllm_tasks::{Example, Suite, TaskKind};
use indicatif::{ProgressBar, ProgressStyle};

mod report;

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
    /// 401-700), fresh2 (its 601-900 and held-out 701-1000), fresh3 (its 901-1200 and held-out
    /// 1001-1300), fresh4 (its 1201-1500 and held-out 1301-1600), fresh5 (its 1501-1800 and
    /// held-out 1601-1900), fresh6 (its 1801-2100 and held-out 1901-2200), fresh7 (its 2101-2400
    /// and held-out 2201-2500), fresh8 (its 2401-2700 and held-out 2501-2800) or fresh9 (its
    /// 2701-3000 and held-out 2801-3100); defaults and options are chosen on the earlier sets
    /// and judged on the next (README,
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
    /// Also print where the wrong answers first go wrong: each one's first token that differs
    /// from the reference, by how the forward deciding it saw the 8 positions before it (masked
    /// or decided) and its confidence, with what verification did with it, per task
    /// (`examples/bench/defaults.md`, *What the default still gets wrong*; `--dump` holds each answer's `first_wrong`).
    #[arg(long)]
    first_errors: bool,
    /// Diagnostic, not a decoder: the decision rule sees every prediction that already equals the
    /// reference answer's token as certain and every other one as uncertain, so each forward
    /// decides exactly what the model already predicts right; its forwards per answer bound what
    /// any decision rule could reach with this model (`examples/bench/defaults.md`, *The forwards frontier*).
    #[arg(long)]
    oracle_decisions: bool,
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

/// The task flags, parsed and checked before the model is loaded.
struct Asked {
    /// `--suite`.
    suite: Option<Suite>,
    /// `--tasks`, each task once.
    tasks: Option<Vec<TaskKind>>,
    /// `--set`.
    set: Option<QuestionSet>,
}

/// What `evaluate` returned, with when it started.
struct Evaluated {
    /// Scores per task.
    scores: Vec<TaskScore>,
    /// Every answer, in question order.
    answers: Vec<Answered>,
    /// When the evaluation started.
    started: Instant,
}

/// Check the flags, load the model, then run the probe or evaluate the questions and print
/// the results (writing `--dump`'s answers first).
fn run(a: Args) -> Result<()> {
    let asked = check_flags(&a)?;
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
    let (suite, kinds) = resolve_tasks(&a, asked.suite, asked.tasks, tok.inner())?;
    let shift_logits = loaded.model.info().shift_logits;
    let params = decode_params(&a.decode, loaded.defaults, suite, shift_logits)?;
    if a.probe {
        return run_probe(&a, &mut loaded.model, tok.inner(), suite, params.gen_length);
    }
    let qs = select_questions(asked.set, &kinds, a.limit);
    let decisions = if a.oracle_decisions {
        Decisions::Oracle
    } else {
        Decisions::Rule
    };
    let done = evaluate_with_progress(
        &mut loaded.model,
        tok.inner(),
        &qs,
        (&params, decisions),
        a.json,
    )?;
    if let Some(dump) = dump {
        write_dump(dump, &done.answers)?;
    }
    report::Report {
        args: &a,
        model: &loaded.source,
        info: loaded.model.info(),
        suite,
        set: asked.set,
        params: &params,
        questions: qs.len(),
        scores: &done.scores,
        answers: &done.answers,
        started: done.started,
    }
    .print();
    Ok(())
}

/// Check every flag that can be checked before the model is loaded: `--threads`, the task
/// flags, `--limit`, the decoding flags, `--set` and `--tokenizer`, in that order.
fn check_flags(a: &Args) -> Result<Asked> {
    if let Some(t) = a.threads {
        // The model's own pool (LoadOptions::threads), where its CPU kernels run: checked now,
        // before anything is loaded.
        dllm_models::threads::pool(t).context("--threads")?;
    }
    let suite: Option<Suite> = a
        .suite
        .as_deref()
        .map(|s| s.parse().map_err(|e| anyhow!("--suite: {e}")))
        .transpose()?;
    let tasks = parse_tasks(a.tasks.as_deref())?;
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
    if a.oracle_decisions && a.probe {
        bail!("--oracle-decisions changes how answers are decoded; --probe decodes nothing");
    }
    if (a.calibration || a.first_errors) && a.probe {
        bail!("--calibration and --first-errors read decoded answers; --probe decodes nothing");
    }
    if let Some(t) = &a.tokenizer {
        dllm_models::files::open_regular(t, "tokenizer").context("--tokenizer")?;
    }
    Ok(Asked { suite, tasks, set })
}

/// `--tasks`' names as tasks, refusing a task named twice (under the same or another name).
fn parse_tasks(names: Option<&[String]>) -> Result<Option<Vec<TaskKind>>> {
    let Some(names) = names else {
        return Ok(None);
    };
    let kinds = names
        .iter()
        .map(|s| s.parse::<TaskKind>().map_err(|e| anyhow!("--tasks: {e}")))
        .collect::<Result<Vec<_>>>()?;
    for (i, k) in kinds.iter().enumerate() {
        if let Some(j) = kinds[..i].iter().position(|x| x == k) {
            bail!(
                "--tasks: `{}` and `{}` are the same task ({k}): each task is evaluated once",
                names[j],
                names[i]
            );
        }
    }
    Ok(Some(kinds))
}

/// The suite and tasks to run: the asked ones, else the suite of the model's tokenizer and all
/// its tasks; every task must belong to that tokenizer's suite.
fn resolve_tasks(
    a: &Args,
    asked_suite: Option<Suite>,
    asked_tasks: Option<Vec<TaskKind>>,
    tok: &tokenizers::Tokenizer,
) -> Result<(Suite, Vec<TaskKind>)> {
    let tok_suite = dllm_tasks::tokenizer::suite_of(tok)
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
    Ok((suite, kinds))
}

/// The decoding parameters: `decode`'s flags resolved against the checkpoint's `defaults`, the
/// suite and the model family (`shift_logits`: Dream).
fn decode_params(
    decode: &llada_cli::DecodeArgs,
    defaults: DecodeDefaults,
    suite: Suite,
    shift_logits: bool,
) -> Result<DecodeParams> {
    // The one defaults rule every tool shares (DecodeParams::resolve): flags over the checkpoint's
    // generation_config.json, with the suite's answer length when the checkpoint names none.
    let mut d = defaults;
    d.gen_length = d.gen_length.or(Some(match suite {
        Suite::Short => 24,
        Suite::Long => dllm_tasks::LONG_GEN_LENGTH,
    }));
    decode.params(&d, shift_logits)
}

/// The questions to ask: `--set`'s (the first `limit` of them), else `limit` of each task's
/// held-out test set.
fn select_questions(
    set: Option<QuestionSet>,
    kinds: &[TaskKind],
    limit: Option<usize>,
) -> Vec<Example> {
    let mut qs = match set {
        Some(set) => set.questions(),
        None => questions(kinds, limit),
    };
    if set.is_some() {
        qs.truncate(limit.unwrap_or(usize::MAX));
    }
    qs
}

/// Evaluate `qs` with `params`, showing a progress bar with the share of right final answers
/// (hidden when `hidden`, as under `--json`).
fn evaluate_with_progress(
    model: &mut dyn DiffusionLm,
    tok: &tokenizers::Tokenizer,
    qs: &[Example],
    (params, decisions): (&DecodeParams, Decisions),
    hidden: bool,
) -> Result<Evaluated> {
    let pb = if hidden {
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
    let started = Instant::now();
    let (scores, answers) = evaluate_with(model, tok, qs, params, decisions, |done, _, ans| {
        right += usize::from(ans.final_answer);
        pb.set_position(done as u64);
        pb.set_message(format!("{:.1}% right", 100.0 * right as f64 / done as f64));
    })?;
    pb.finish_and_clear();
    Ok(Evaluated {
        scores,
        answers,
        started,
    })
}

/// Write every answer to `--dump`'s file, one JSON line each.
fn write_dump(dump: DumpFile, answers: &[Answered]) -> Result<()> {
    let mut lines = String::new();
    for ans in answers {
        lines.push_str(&serde_json::to_string(ans)?);
        lines.push('\n');
    }
    dump.finish(lines.as_bytes())
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
