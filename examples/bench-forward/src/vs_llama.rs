//! The model-level comparison with llama.cpp: one forward over a 160-token canvas of each model
//! (`--models`), per GGUF type, llama.cpp's `llama-bench` and llada-rs alternated in one run.
//!
//! F32 and F16 files come from the project's GGUF writer, Q8_0 and Q4_0 from llama.cpp's own
//! `llama-quantize` run on the F32 file (so Q4_0 has the Q6_K `output.weight` llama-quantize
//! writes). llama.cpp is never built here: the caller passes the paths of its binaries.

use std::io::Read;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use anyhow::{bail, Context, Result};
use candle_core::quantized::GgmlDType;
use dllm_models::{CpuLinears, DiffusionLm, Rows};

use crate::model::{canvas, load_gguf, write_model_gguf, BenchModel};

/// The K/V cache type of both sides: llama.cpp's default (`-ctk f16 -ctv f16`, passed
/// explicitly), and llada-rs's `kv_dtype` option.
const KV_DTYPE: candle_core::DType = candle_core::DType::F16;

/// What to compare.
pub struct Plan {
    /// `llama-bench`.
    pub llama_bench: PathBuf,
    /// `llama-quantize`.
    pub llama_quantize: PathBuf,
    /// Where the GGUF files go.
    pub dir: PathBuf,
    /// The models (each at every type and thread count).
    pub models: Vec<BenchModel>,
    /// GGUF types (`f32`, `f16`, `q8_0`, `q4_0`).
    pub types: Vec<String>,
    /// Alternated rounds.
    pub rounds: usize,
    /// Repetitions per side per round.
    pub reps: usize,
    /// Canvas length.
    pub tokens: usize,
    /// Thread counts, each for both sides.
    pub threads: Vec<usize>,
}

fn run_ok(cmd: &mut Command) -> Result<String> {
    let out = cmd.output().with_context(|| format!("running {cmd:?}"))?;
    if !out.status.success() {
        bail!(
            "{cmd:?} failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Make `<dir>/<model stem>-<ty>.gguf`.
fn make(plan: &Plan, model: BenchModel, ty: &str) -> Result<PathBuf> {
    let path = plan.dir.join(format!("{}-{ty}.gguf", model.stem()));
    if path.is_file() {
        return Ok(path);
    }
    eprintln!("writing {} ({}, {ty})", path.display(), model.name());
    match ty {
        "q8_0" if model == BenchModel::Full8b => write_model_gguf(model, &path, GgmlDType::Q8_0)?,
        "q4_0" if model == BenchModel::Full8b => write_model_gguf(model, &path, GgmlDType::Q4_0)?,
        _ if model == BenchModel::Full8b => {
            bail!("--models 8b-full: --types q8_0,q4_0 (its F32 file would be 32 GB)")
        }
        "f32" => write_model_gguf(model, &path, GgmlDType::F32)?,
        "f16" => write_model_gguf(model, &path, GgmlDType::F16)?,
        "q8_0" | "q4_0" => {
            let src = make(plan, model, "f32")?;
            run_ok(
                Command::new(&plan.llama_quantize)
                    .arg(&src)
                    .arg(&path)
                    .arg(ty.to_uppercase()),
            )?;
        }
        other => bail!("--types: `{other}` (expected f32, f16, q8_0 or q4_0)"),
    }
    Ok(path)
}

/// Run `cmd` to its end: (stdout, CPU seconds, peak RSS in MB) of the child. CPU time comes from
/// its rusage (`wait4`); the peak RSS from polling its `VmHWM` every 2 ms while it runs, because
/// the rusage's `ru_maxrss` of a spawned child starts at the parent's peak (the kernel carries the
/// spawning process's high-water mark over `exec`), which here is a whole model's.
fn run_measured(cmd: &mut Command) -> Result<(String, f64, f64)> {
    let mut child = cmd
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .with_context(|| format!("running {cmd:?}"))?;
    let pid = child.id();
    let done = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let poll = {
        let done = done.clone();
        // Until the child has called `exec` it shares this process's memory (and name).
        let me = std::fs::read_to_string("/proc/self/status")
            .ok()
            .and_then(|s| status_name(&s));
        std::thread::spawn(move || {
            let path = format!("/proc/{pid}/status");
            let mut peak = 0f64;
            while !done.load(std::sync::atomic::Ordering::Relaxed) {
                if let Ok(s) = std::fs::read_to_string(&path) {
                    if status_name(&s) != me {
                        peak = peak.max(status_kb(&s, "VmHWM:").unwrap_or(0.0));
                    }
                }
                std::thread::sleep(std::time::Duration::from_millis(2));
            }
            peak / 1024.0
        })
    };
    let mut err = child.stderr.take().context("child stderr")?;
    let err_reader = std::thread::spawn(move || {
        let mut e = Vec::new();
        let _ = err.read_to_end(&mut e);
        e
    });
    let mut out = Vec::new();
    child
        .stdout
        .take()
        .context("child stdout")?
        .read_to_end(&mut out)?;
    let mut status = 0;
    // SAFETY: a valid pid of our own child, valid out-pointers; the child is reaped here (and
    // `child` is not waited on again).
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    let waited = unsafe { libc::wait4(pid as libc::pid_t, &mut status, 0, &mut ru) };
    done.store(true, std::sync::atomic::Ordering::Relaxed);
    let peak = poll.join().unwrap_or(0.0);
    if waited < 0 {
        bail!("waiting for {cmd:?}: {}", std::io::Error::last_os_error());
    }
    let err = err_reader.join().unwrap_or_default();
    let status = std::process::ExitStatus::from_raw(status);
    if !status.success() {
        bail!(
            "{cmd:?} failed ({status}): {}",
            String::from_utf8_lossy(&err)
        );
    }
    let t = |tv: libc::timeval| tv.tv_sec as f64 + tv.tv_usec as f64 * 1e-6;
    Ok((
        String::from_utf8_lossy(&out).into_owned(),
        t(ru.ru_utime) + t(ru.ru_stime),
        peak,
    ))
}

/// The `Name:` of a `/proc/PID/status`.
fn status_name(status: &str) -> Option<String> {
    status
        .lines()
        .find_map(|l| l.strip_prefix("Name:"))
        .map(|v| v.trim().to_string())
}

/// The value in kB of the `/proc/PID/status` line starting with `key`.
fn status_kb(status: &str, key: &str) -> Option<f64> {
    status
        .lines()
        .find_map(|l| l.strip_prefix(key))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
}

/// One `llama-bench -r reps` run: (mean wall ms per forward, CPU seconds of the whole run, peak
/// RSS in MB).
fn llama_run(plan: &Plan, model: &Path, reps: usize, threads: usize) -> Result<(f64, f64, f64)> {
    let (out, cpu, rss) = run_measured(
        Command::new(&plan.llama_bench)
            .arg("-m")
            .arg(model)
            .args(["-p", &plan.tokens.to_string(), "-n", "0"])
            .args(["-t", &threads.to_string()])
            .args(["-ctk", "f16", "-ctv", "f16"])
            .args(["-r", &reps.to_string(), "-o", "json"]),
    )?;
    let v: serde_json::Value =
        serde_json::from_str(&out).context("parsing llama-bench's JSON output")?;
    let ns = v
        .as_array()
        .and_then(|a| a.first())
        .and_then(|r| r.get("avg_ns"))
        .and_then(|n| n.as_f64())
        .context("llama-bench output has no avg_ns")?;
    Ok((ns / 1e6, cpu, rss))
}

/// llama.cpp per forward: (wall ms as llama-bench reports it, CPU ms, peak RSS MB). The CPU
/// time is the difference between a run of `1 + reps` forwards and a run of 1, so loading and
/// warm-up cancel out.
fn llama_ms(plan: &Plan, model: &Path, threads: usize) -> Result<(f64, f64, f64)> {
    let (_, one, rss1) = llama_run(plan, model, 1, threads)?;
    let (wall, many, rss) = llama_run(plan, model, 1 + plan.reps, threads)?;
    Ok((wall, (many - one) / plan.reps as f64 * 1e3, rss.max(rss1)))
}

/// The memory probe's process (`bench-forward --rss-probe`): load `path`, run the forwards
/// llama-bench runs (a warm-up and `reps` forwards with the last row's logits) at each thread
/// count and print this process's peak RSS in kB; then run the same number of forwards with
/// every row's logits (what the timed table also runs) and print the peak again. The parent reads
/// them as it reads llama-bench's.
pub fn rss_probe(path: &Path, tokens: usize, reps: usize, threads: &[usize]) -> Result<()> {
    let start = std::time::Instant::now();
    // The first forward (last-row logits) in the probe's first pool: time to first forward.
    let pool = dllm_models::threads::pool(threads[0])?;
    let mut m = pool.install(|| load_gguf(path, CpuLinears::Packed, Some(KV_DTYPE)))?;
    let x = canvas(tokens, m.info().vocab_size)?;
    let last = [tokens - 1];
    pool.install(|| m.forward_full(&x, Rows::Positions(&last)))?;
    let first_ms = start.elapsed().as_secs_f64() * 1e3;
    drop(pool);
    // This process's own high-water mark (a new address space at `exec`: it starts from zero,
    // unlike the rusage peak, and the parent cannot tell this process from itself by name).
    let hwm = || -> Result<f64> {
        let s = std::fs::read_to_string("/proc/self/status")?;
        status_kb(&s, "VmHWM:").context("no VmHWM in /proc/self/status")
    };
    for rows in [Rows::Positions(&last), Rows::All] {
        for &n in threads {
            let pool = dllm_models::threads::pool(n)?;
            pool.install(|| -> Result<()> {
                for _ in 0..=reps {
                    m.forward_full(&x, rows)?;
                }
                Ok(())
            })?;
        }
        println!("{}", hwm()?);
    }
    println!("{first_ms}");
    Ok(())
}

/// llama.cpp's time to its first forward's end: a whole `llama-bench -r 1 --no-warmup` process
/// (start, load, one forward, exit), ms.
fn llama_first_ms(plan: &Plan, model: &Path, threads: usize) -> Result<f64> {
    let t = std::time::Instant::now();
    run_measured(
        Command::new(&plan.llama_bench)
            .arg("-m")
            .arg(model)
            .args(["-p", &plan.tokens.to_string(), "-n", "0"])
            .args(["-t", &threads.to_string()])
            .args(["-ctk", "f16", "-ctv", "f16"])
            .args(["-r", "1", "--no-warmup", "-o", "json"]),
    )?;
    Ok(t.elapsed().as_secs_f64() * 1e3)
}

/// llada-rs's peak RSS in MB on `path`: the memory probe in a process of its own per thread
/// count (as llama.cpp's side runs one llama-bench process per thread count; one process running
/// both kept the first pool's allocator arenas and work buffers through the second's forwards),
/// each reporting its `VmHWM` after the forwards llama-bench runs (last-row logits) and after
/// those with every row's logits; the largest of each. Also each probe's time from its start to
/// the end of its first forward (ms, per thread count).
fn ours_rss(plan: &Plan, path: &Path) -> Result<(f64, f64, Vec<f64>)> {
    let exe = std::env::current_exe().context("finding bench-forward's own path")?;
    let (mut last, mut all, mut first) = (0f64, 0f64, Vec::new());
    for t in &plan.threads {
        let (out, _, _) = run_measured(
            Command::new(&exe)
                .arg("--rss-probe")
                .arg(path)
                .args(["--canvas", &plan.tokens.to_string()])
                .args(["--iters", &plan.reps.to_string()])
                .args(["--threads", &t.to_string()]),
        )?;
        let kb: Vec<f64> = out
            .split_whitespace()
            .map(|w| w.parse::<f64>())
            .collect::<Result<_, _>>()
            .ok()
            .filter(|v: &Vec<f64>| v.len() == 3)
            .with_context(|| format!("the memory probe printed `{}`", out.trim()))?;
        last = last.max(kb[0] / 1024.0);
        all = all.max(kb[1] / 1024.0);
        first.push(kb[2]);
    }
    Ok((last, all, first))
}

/// Read `path` once, to put it in the page cache.
fn warm(path: &Path) -> Result<()> {
    let mut f = std::fs::File::open(path).with_context(|| format!("opening {}", path.display()))?;
    std::io::copy(&mut f, &mut std::io::sink())
        .with_context(|| format!("reading {}", path.display()))?;
    Ok(())
}

/// This process's CPU time, in seconds.
fn self_cpu() -> f64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: a valid clock id and a valid out-pointer.
    unsafe { libc::clock_gettime(libc::CLOCK_PROCESS_CPUTIME_ID, &mut ts) };
    ts.tv_sec as f64 + ts.tv_nsec as f64 * 1e-9
}

/// Our forward: (median wall ms, median CPU ms) over `reps` runs after a warm-up.
fn ours_ms(reps: usize, mut f: impl FnMut() -> Result<()>) -> Result<(f64, f64)> {
    f()?;
    let (mut wall, mut cpu) = (Vec::new(), Vec::new());
    for _ in 0..reps {
        let (t, c) = (std::time::Instant::now(), self_cpu());
        f()?;
        cpu.push((self_cpu() - c) * 1e3);
        wall.push(t.elapsed().as_secs_f64() * 1e3);
    }
    Ok((mid(&wall), mid(&cpu)))
}

fn mid(v: &[f64]) -> f64 {
    let mut s = v.to_vec();
    s.sort_by(|a, b| a.total_cmp(b));
    s[s.len() / 2]
}

fn range(v: &[f64]) -> String {
    let lo = v.iter().copied().fold(f64::INFINITY, f64::min);
    let hi = v.iter().copied().fold(0.0, f64::max);
    if (hi - lo) < 0.05 {
        format!("{lo:.1}")
    } else {
        format!("{lo:.1}-{hi:.1}")
    }
}

/// Run the comparison and print the tables.
pub fn run(plan: &Plan) -> Result<()> {
    std::fs::create_dir_all(&plan.dir)
        .with_context(|| format!("creating {}", plan.dir.display()))?;
    let t = plan.tokens;
    let mut wall_rows = Vec::new();
    let mut cpu_rows = Vec::new();
    let mut rss_rows = Vec::new();
    let mut first_rows = Vec::new();
    let pools = plan
        .threads
        .iter()
        .map(|&n| dllm_models::threads::pool(n))
        .collect::<dllm_models::Result<Vec<_>>>()?;
    for (model, ty) in plan
        .models
        .iter()
        .flat_map(|&m| plan.types.iter().map(move |ty| (m, ty)))
    {
        let path = make(plan, model, ty)?;
        // Both sides' first forwards start from the file in the page cache: without this the
        // side that runs first (ours) read it from disk after the other file's run evicted it,
        // and the second found it cached.
        warm(&path)?;
        let (ours_rss, ours_rss_all, ours_first) = ours_rss(plan, &path)?;
        for (&threads, ours) in plan.threads.iter().zip(&ours_first) {
            let llama = llama_first_ms(plan, &path, threads)?;
            first_rows.push(format!(
                "| {threads} | {} | {} | {:.1} | {:.1} |",
                model.name(),
                ty.to_uppercase(),
                llama / 1e3,
                ours / 1e3
            ));
        }
        let mut m = load_gguf(&path, CpuLinears::Packed, Some(KV_DTYPE))?;
        let x = canvas(t, m.info().vocab_size)?;
        let last = [t - 1];
        let mut llama_rss = 0f64;
        let name = format!("{} | {}", model.name(), ty.to_uppercase());
        for (&threads, pool) in plan.threads.iter().zip(&pools) {
            eprintln!("timing {name} at {threads} thread(s)");
            let (mut lw, mut lc, mut aw, mut ow, mut oc) = (vec![], vec![], vec![], vec![], vec![]);
            for _ in 0..plan.rounds {
                let (w, c, rss) = llama_ms(plan, &path, threads)?;
                lw.push(w);
                lc.push(c);
                llama_rss = llama_rss.max(rss);
                let (w, _) = pool.install(|| {
                    ours_ms(plan.reps, || {
                        m.forward_full(&x, Rows::All)?;
                        Ok(())
                    })
                })?;
                aw.push(w);
                let (w, c) = pool.install(|| {
                    ours_ms(plan.reps, || {
                        m.forward_full(&x, Rows::Positions(&last))?;
                        Ok(())
                    })
                })?;
                ow.push(w);
                oc.push(c);
            }
            wall_rows.push(format!(
                "| {threads} | {name} | {} | {} | {:.2}x | {} | {:.2}x |",
                range(&lw),
                range(&aw),
                mid(&lw) / mid(&aw),
                range(&ow),
                mid(&lw) / mid(&ow)
            ));
            cpu_rows.push(format!(
                "| {threads} | {name} | {} | {} | {:.2}x |",
                range(&lc),
                range(&oc),
                mid(&lc) / mid(&oc)
            ));
        }
        let file_mb = std::fs::metadata(&path)?.len() as f64 / (1 << 20) as f64;
        rss_rows.push(format!(
            "| {name} | {file_mb:.0} | {llama_rss:.0} | {ours_rss:.0} | {:.2}x | {ours_rss_all:.0} |",
            ours_rss / llama_rss
        ));
        drop(m);
        drop(x);
    }
    println!("Wall clock (what llama-bench reports), ms per forward, ranges over rounds; ratio = llama.cpp / llada-rs (medians):\n");
    println!("| threads | model | GGUF | llama.cpp | llada-rs, logits for all {t} rows | ratio | llada-rs, logits for the last row (as llama-bench) | ratio |");
    println!("|---:|---|---|---:|---:|---:|---:|---:|");
    for r in &wall_rows {
        println!("{r}");
    }
    println!("\nCPU time per forward (immune to preemption by other jobs; llama.cpp's threads also count the time they spin waiting for each other), ms; llada-rs with logits for the last row:\n");
    println!("| threads | model | GGUF | llama.cpp | llada-rs | ratio |");
    println!("|---:|---|---|---:|---:|---:|");
    for r in &cpu_rows {
        println!("{r}");
    }
    println!(
        "\nPeak RSS, MB: each side's process on the file alone (llama.cpp: the largest VmHWM of its llama-bench processes, polled every 2 ms; llada-rs: the largest VmHWM of its bench-forward processes, one per thread count as llama-bench's, each loading the file and running the forwards llama-bench runs, logits for the last row, then as many with every row's logits); ratio = llada-rs / llama.cpp on the same work:\n"
    );
    println!("| model | GGUF | file MB | llama.cpp | llada-rs, last-row logits | ratio | llada-rs, then all {t} rows' logits |");
    println!("|---|---|---:|---:|---:|---:|---:|");
    for r in &rss_rows {
        println!("{r}");
    }
    println!("\nTime to first forward, s: from process start to the end of the first {t}-token forward (llama.cpp: a whole `llama-bench -r 1 --no-warmup` process; llada-rs: the memory probe's process, last-row logits); the file is read into the page cache before both:\n");
    println!("| threads | model | GGUF | llama.cpp | llada-rs |");
    println!("|---:|---|---|---:|---:|");
    for r in &first_rows {
        println!("{r}");
    }
    Ok(())
}
