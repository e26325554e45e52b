//! The run loop: pick a seed checkpoint, mutate one or two of its files, write them to a work
//! directory, load, decode, restore — under `catch_unwind`, a watchdog and the leak check.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use dllm_decode::{generate, Decide, DecodeParams, DreamAlg, Remasking, Strategy};
use dllm_models::{DiffusionLm, LoadOptions, ModelSource};

use crate::corpus::{seeds, Layout, Seed};
use crate::mutate::{self, Rng};

/// What to run.
#[derive(Debug, Clone)]
pub struct Config {
    /// Number of inputs.
    pub inputs: u64,
    /// Seed of the mutation stream.
    pub seed: u64,
    /// An input running longer than this is a hang.
    pub per_input: Duration,
    /// Allowed growth of live heap bytes between the end of the warm-up (the first 2% of the
    /// inputs, at least 500) and the end of the run.
    pub leak_bytes: i64,
    /// Work directory (created, and removed at the end).
    pub work: PathBuf,
}

impl Config {
    /// From `LLADA_FUZZ_INPUTS` (default `default_inputs`), `LLADA_FUZZ_SEED` (default 17) and
    /// `LLADA_FUZZ_BOUND_SECS` (default 20).
    pub fn from_env(default_inputs: u64) -> Result<Self> {
        let num = |k: &str, d: u64| -> Result<u64> {
            match std::env::var(k) {
                Ok(v) => v
                    .trim()
                    .parse()
                    .with_context(|| format!("{k}={v}: not a whole number")),
                Err(_) => Ok(d),
            }
        };
        Ok(Self {
            inputs: num("LLADA_FUZZ_INPUTS", default_inputs)?,
            seed: num("LLADA_FUZZ_SEED", 17)?,
            per_input: Duration::from_secs(num("LLADA_FUZZ_BOUND_SECS", 20)?.max(1)),
            leak_bytes: 16 << 20,
            // Every input rewrites a few files: on tmpfs where there is one.
            work: if Path::new("/dev/shm").is_dir() {
                PathBuf::from("/dev/shm")
            } else {
                std::env::temp_dir()
            }
            .join(format!("llada-fuzz-{}", std::process::id())),
        })
    }
}

/// What a run found.
#[derive(Debug, Default)]
pub struct Report {
    /// Inputs run.
    pub inputs: u64,
    /// Inputs that loaded (and were decoded).
    pub loaded: u64,
    /// Inputs rejected with an error.
    pub rejected: u64,
    /// Panics: (input index, seed name, mutation, message).
    pub panics: Vec<(u64, String, String, String)>,
    /// Live heap growth after the warm-up (None without the counting allocator).
    pub leaked: Option<i64>,
    /// Wall time.
    pub elapsed: Duration,
    /// Distinct error messages' first words, counted (what the mutants ran into).
    pub errors: std::collections::BTreeMap<String, u64>,
    /// One full message per entry of `errors`.
    pub samples: std::collections::BTreeMap<String, String>,
}

/// The input currently running, for the watchdog.
struct Current {
    started_ms: AtomicU64,
    what: Mutex<String>,
}

fn watchdog(cur: Arc<Current>, bound: Duration, done: Arc<AtomicBool>, t0: Instant) {
    std::thread::spawn(move || {
        while !done.load(Ordering::Relaxed) {
            std::thread::sleep(Duration::from_millis(100));
            let s = cur.started_ms.load(Ordering::Relaxed);
            if s == 0 {
                continue;
            }
            let now = t0.elapsed().as_millis() as u64;
            if now.saturating_sub(s) > bound.as_millis() as u64 {
                let what = cur.what.lock().map(|w| w.clone()).unwrap_or_default();
                eprintln!("llada-fuzz: HANG: input ran longer than {bound:?}: {what}");
                std::process::exit(3);
            }
        }
    });
}

/// Decode parameters drawn from small valid values and a few invalid ones (the decode-parameter
/// rows of issue 17 have their own tests; here the decoder meets mutated models).
fn params(rng: &mut Rng, dream: bool, valid: bool) -> DecodeParams {
    let block = *rng.pick(&[1usize, 2, 4]);
    let blocks = 1 + rng.below(2);
    let gen = block * blocks;
    let per_block = 1 + rng.below(block);
    let strategy = *rng.pick(&[
        Strategy::Vanilla,
        Strategy::PrefixCache,
        Strategy::DualCache,
    ]);
    // Dream's own algorithm (Dream, vanilla) has no threshold or remasking option.
    let dream_alg = dream && strategy == Strategy::Vanilla;
    let mut p = DecodeParams {
        gen_length: gen,
        block_length: block,
        steps: per_block * blocks,
        strategy,
        decide: if !dream_alg && rng.one_in(4) {
            Decide::Threshold(0.5)
        } else {
            Decide::Schedule
        },
        remasking: if dream_alg {
            Remasking::LowConfidence
        } else {
            *rng.pick(&[Remasking::LowConfidence, Remasking::Random])
        },
        temperature: *rng.pick(&[0.0f32, 0.0, 0.7]),
        seed: rng.next_u64(),
        early_stop: rng.one_in(2),
        ..Default::default()
    };
    if dream_alg {
        p.dream.alg = *rng.pick(&[
            DreamAlg::Origin,
            DreamAlg::MaskgitPlus,
            DreamAlg::TopkMargin,
            DreamAlg::Entropy,
        ]);
    }
    if !valid && rng.one_in(16) {
        p.steps = *rng.pick(&[0usize, usize::MAX, gen + 1]);
    }
    p
}

/// Outcome of one input.
enum Outcome {
    Loaded,
    Rejected(String),
}

fn one(entry: &Path, rng: &mut Rng, valid: bool) -> Outcome {
    let spec = entry.to_string_lossy().into_owned();
    let loaded = match ModelSource::parse(&spec)
        .and_then(|s| dllm_models::load(&s, &LoadOptions::default()))
    {
        Ok(l) => l,
        Err(e) => return Outcome::Rejected(e.to_string()),
    };
    let mut model = loaded.model;
    if let Some(tok) = &loaded.tokenizer {
        if let Ok(ids) = tok.encode("w1 w2 w3", true) {
            let _ = tok.decode(&ids, false);
        }
    }
    let vocab = model.info().vocab_size.min(29) as u32;
    let prompt: Vec<u32> = (0..3).map(|i| (i * 7 + 1) % vocab.max(1)).collect();
    let dream = model.info().arch == dllm_models::Arch::Dream;
    match generate(&mut model, &prompt, &params(rng, dream, valid), &mut ()) {
        Ok(g) => {
            if let Some(tok) = &loaded.tokenizer {
                let _ = tok.decode(&g.canvas, true);
            }
            Outcome::Loaded
        }
        Err(e) => Outcome::Rejected(e.to_string()),
    }
}

/// Mutate `seed` into `dir` (every file written), returning a description.
fn materialise(
    rng: &mut Rng,
    seed: &Seed,
    gguf_fields: &[(usize, &'static str)],
    dir: &Path,
) -> Result<String> {
    let mut what = seed.name.clone();
    let edits = 1 + usize::from(rng.one_in(5));
    let mut files = seed.files.clone();
    for _ in 0..edits {
        let i = rng.below(files.len());
        let (name, data) = &mut files[i];
        what.push_str(&format!(" | {name}:"));
        let is_json = name.ends_with(".json");
        let is_st = name.ends_with(".safetensors");
        let is_gguf = name.ends_with(".gguf");
        match rng.below(4) {
            0 | 1 if is_json => {
                if let Some(d) = mutate::json(rng, data, &mut what) {
                    *data = d;
                }
            }
            0 | 1 if is_st => {
                if let Some(d) = mutate::safetensors_header(rng, data, &mut what) {
                    *data = d;
                }
            }
            0 | 1 if is_gguf => mutate::gguf(rng, data, gguf_fields, &mut what),
            2 if rng.one_in(8) => {
                data.clear();
                what.push_str(" emptied");
            }
            _ => mutate::bytes(rng, data, &mut what),
        }
    }
    // Occasionally a file is missing altogether.
    if rng.one_in(40) {
        let i = rng.below(files.len());
        what.push_str(&format!(" | removed {}", files[i].0));
        files.remove(i);
    }
    let _ = std::fs::remove_dir_all(dir);
    std::fs::create_dir_all(dir)?;
    for (name, data) in &files {
        std::fs::write(dir.join(name), data)?;
    }
    Ok(what)
}

/// Run the harness.
pub fn run(cfg: &Config) -> Result<Report> {
    std::fs::create_dir_all(&cfg.work)?;
    let seeds = seeds(&cfg.work)?;
    let fields: Vec<Vec<(usize, &'static str)>> = seeds
        .iter()
        .map(|s| match s.layout {
            Layout::Gguf => s
                .files
                .iter()
                .find(|(n, _)| n.ends_with(".gguf"))
                .map(|(_, d)| mutate::gguf_fields(d))
                .unwrap_or_default(),
            _ => Vec::new(),
        })
        .collect();
    let dir = cfg.work.join("input");
    // Every seed must load and decode unmutated, or the mutants test nothing.
    let mut check = Rng(cfg.seed);
    for seed in &seeds {
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir)?;
        for (name, data) in &seed.files {
            std::fs::write(dir.join(name), data)?;
        }
        let entry = seed.entry(&dir);
        let spec = entry.to_string_lossy().into_owned();
        let loaded = ModelSource::parse(&spec)
            .and_then(|s| dllm_models::load(&s, &LoadOptions::default()))
            .with_context(|| format!("seed {} does not load", seed.name))?;
        drop(loaded);
        if let Outcome::Rejected(e) = one(&entry, &mut check, true) {
            anyhow::bail!("seed {} does not decode: {e}", seed.name);
        }
    }
    let t0 = Instant::now();
    let cur = Arc::new(Current {
        started_ms: AtomicU64::new(0),
        what: Mutex::new(String::new()),
    });
    let done = Arc::new(AtomicBool::new(false));
    watchdog(cur.clone(), cfg.per_input, done.clone(), t0);
    // Panics are counted, not printed: the hook records the message for the report.
    let last_panic = Arc::new(Mutex::new(String::new()));
    let lp = last_panic.clone();
    let in_input = cur.clone();
    let prev_hook = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        // Outside an input the panic is the harness's own: print it.
        if in_input.started_ms.load(Ordering::Relaxed) == 0 {
            eprintln!("llada-fuzz: harness panic: {info}");
        }
        if let Ok(mut m) = lp.lock() {
            *m = info.to_string();
        }
    }));
    let mut report = Report::default();
    let mut rng = Rng(cfg.seed);
    let warmup = (cfg.inputs / 50).max(500).min(cfg.inputs);
    let mut baseline = None;
    for i in 0..cfg.inputs {
        if i == warmup {
            baseline = crate::alloc::live_bytes();
        }
        let s = rng.below(seeds.len());
        let seed = &seeds[s];
        let what = materialise(&mut rng, seed, &fields[s], &dir)?;
        if let Ok(mut w) = cur.what.lock() {
            *w = format!("input {i} (seed {}): {what}", cfg.seed);
        }
        cur.started_ms
            .store(t0.elapsed().as_millis().max(1) as u64, Ordering::Relaxed);
        let mut input_rng = Rng(rng.next_u64());
        let r = catch_unwind(AssertUnwindSafe(|| {
            one(&seed.entry(&dir), &mut input_rng, false)
        }));
        cur.started_ms.store(0, Ordering::Relaxed);
        report.inputs += 1;
        match r {
            Ok(Outcome::Loaded) => report.loaded += 1,
            Ok(Outcome::Rejected(msg)) => {
                report.rejected += 1;
                let key: String = msg
                    .split_once(": ")
                    .map(|(_, r)| r)
                    .unwrap_or(&msg)
                    .trim_start_matches("not a valid GGUF file: ")
                    .split_whitespace()
                    .take(4)
                    .collect::<Vec<_>>()
                    .join(" ");
                *report.errors.entry(key.clone()).or_default() += 1;
                report.samples.entry(key).or_insert(msg);
            }
            Err(_) => {
                let msg = last_panic.lock().map(|m| m.clone()).unwrap_or_default();
                report.panics.push((i, seed.name.clone(), what, msg));
            }
        }
    }
    done.store(true, Ordering::Relaxed);
    std::panic::set_hook(prev_hook);
    report.elapsed = t0.elapsed();
    report.leaked = match (baseline, crate::alloc::live_bytes()) {
        (Some(b), Some(e)) => Some(e - b),
        _ => None,
    };
    let _ = std::fs::remove_dir_all(&cfg.work);
    Ok(report)
}

impl Report {
    /// A one-screen summary: counts, the most common rejections, and every failure.
    pub fn summary(&self) -> String {
        let mut s = format!(
            "{} inputs in {:.1}s ({:.0}/s): {} loaded and decoded, {} rejected with an error, {} panics, heap growth after warm-up {}\n",
            self.inputs,
            self.elapsed.as_secs_f64(),
            self.inputs as f64 / self.elapsed.as_secs_f64().max(1e-9),
            self.loaded,
            self.rejected,
            self.panics.len(),
            self.leaked.map_or("not measured".to_string(), |b| format!("{b} bytes")),
        );
        let mut top: Vec<_> = self.errors.iter().collect();
        top.sort_by(|a, b| b.1.cmp(a.1));
        for (k, n) in top
            .iter()
            .take(if std::env::var_os("LLADA_FUZZ_VERBOSE").is_some() {
                usize::MAX
            } else {
                12
            })
        {
            s.push_str(&format!("  {n:>7}  {k}\n"));
            if std::env::var_os("LLADA_FUZZ_VERBOSE").is_some() {
                s.push_str(&format!("           e.g. {}\n", self.samples[*k]));
            }
        }
        for (i, seed, what, msg) in self.panics.iter().take(20) {
            s.push_str(&format!("PANIC input {i} ({seed}): {what}\n    {msg}\n"));
        }
        s
    }

    /// Whether the run found nothing: no panic and no leak beyond `leak_bytes`.
    pub fn clean(&self, leak_bytes: i64) -> bool {
        self.panics.is_empty() && self.leaked.is_none_or(|b| b <= leak_bytes)
    }
}
