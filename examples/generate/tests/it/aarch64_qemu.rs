//! The phone's CPU ISA under emulation: kernels-cpu's tests and `generate` cross-built for
//! `aarch64-unknown-linux-gnu` and run under `qemu-aarch64` (Android's own target needs the NDK,
//! which cannot be fetched here; the instruction set is the same).
//!
//! Only what the ISA changes is run here: kernels-cpu's SIMD paths and one end-to-end check. The
//! architecture-independent suites (dllm-models', dllm-decode's) run on x86 only. Built with
//! Debian's `cargo`/`rustc` 1.96 (their prebuilt arm64 standard library; rustup's compiler rejects
//! it) and `aarch64-linux-gnu-gcc` as linker and C compiler (kernels-dsp's host build), only the
//! packages run (`-p kernels-cpu --tests`, `-p generate --bin generate`), then:
//! - kernels-cpu's tests on three CPU models, one per kernel path: `cortex-a53` (NEON),
//!   `cortex-a76` (NEON + dotprod) and `max` (NEON + dotprod + i8mm). Each must report exactly
//!   its paths (`tests/it/paths.rs` under `KERNELS_CPU_EXPECT_PATHS`), and the bits of a set of
//!   fixed kernel calls on its best path must equal this x86 machine's (`fingerprint.rs`);
//! - `generate` on `max`, greedy, one strategy per shipped LLaDA model (`models/tiny-llada` with
//!   `vanilla`: full-canvas forwards; `models/tiny-llada-long` with `dual-cache`: forwards of a
//!   window against the KV cache): the same tokens as the x86 build of `generate`.
//!
//! Missing tools skip the test with a message, or fail it under `CI=true`
//! (`.ci/install-test-deps` installs them). Overrides: `LLADA_AARCH64_CARGO`,
//! `LLADA_AARCH64_RUSTC` (default `/usr/bin/cargo`, `/usr/bin/rustc`), `LLADA_QEMU_AARCH64`
//! (default `qemu-aarch64`), `LLADA_AARCH64_TARGET_DIR` (default: `aarch64` under cargo's
//! per-target temporary directory). Nothing here measures ARM speed: qemu translates the code.

// The shared module allows its own dead code (`#![allow(dead_code)]` inside it).
#[path = "../../../../kernels-cpu/tests/common/mod.rs"]
mod kernels_common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use serde_json::Value;

const TARGET: &str = "aarch64-unknown-linux-gnu";
const LINKER: &str = "aarch64-linux-gnu-gcc";
const INSTALL: &str = "dpkg --add-architecture arm64 && apt-get update && apt-get install \
     --no-install-recommends rustc-web cargo-web libstd-rust-web-dev:arm64 gcc-aarch64-linux-gnu \
     libc6-dev-arm64-cross qemu-user";
/// Each kernel path's CPU model, and the paths kernels-cpu must report on it.
const CPUS: [(&str, &str); 3] = [
    ("cortex-a53", "portable,neon"),
    ("cortex-a76", "portable,neon,neon-dotprod"),
    ("max", "portable,neon,neon-dotprod,neon-i8mm"),
];
/// The CPU model of the `generate` runs: the best kernel path (the other two are the kernel tests').
const GENERATE_CPU: &str = "max";
/// `generate`'s runs: model, strategy, prompt.
const RUNS: [(&str, &str, &str); 2] = [
    (
        "tiny-llada",
        "vanilla",
        "Tom has 23 apples. He buys 5 more. How many apples does Tom have now?",
    ),
    (
        "tiny-llada-long",
        "dual-cache",
        "Cara has 4 stickers. In January she buys 2 more. In February she sells 6. In March she \
         triples them. In April she wins 4 more. In May she gives away 2. In June she sells 2. \
         In July she buys 1 more. In August she buys 3 more. In September she loses 4. In \
         October she wins 2 more. How many stickers does Cara have at the end?",
    ),
];

fn in_ci() -> bool {
    std::env::var("CI").map(|v| v == "true").unwrap_or(false)
}

fn announce(msg: &str) {
    kernels_common::announce(msg)
}

/// Skip (or, under `CI=true`, fail) for a missing tool.
fn skip_or_fail(test: &str, missing: &str) {
    let why =
        format!("{missing}. Install it with `{INSTALL}` (on Debian 12: `.ci/install-test-deps`)");
    if in_ci() {
        panic!("{test}: FAILED because CI=true and {why}");
    }
    announce(&format!("{test}: SKIPPED: {why}"));
}

fn env_or(var: &str, default: &str) -> String {
    std::env::var(var).unwrap_or_else(|_| default.to_owned())
}

fn runs(cmd: &str, arg: &str) -> Option<String> {
    let o = Command::new(cmd).arg(arg).output().ok()?;
    o.status
        .success()
        .then(|| String::from_utf8_lossy(&o.stdout).trim().to_owned())
}

/// The first missing tool, if any.
fn missing_tool(cargo: &str, rustc: &str, qemu: &str) -> Option<String> {
    if runs(cargo, "--version").is_none() {
        return Some(format!("no Debian cargo at {cargo}"));
    }
    if runs(rustc, "--version").is_none() {
        return Some(format!("no Debian rustc at {rustc}"));
    }
    let libdir = Command::new(rustc)
        .args(["--print", "target-libdir", "--target", TARGET])
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| PathBuf::from(String::from_utf8_lossy(&o.stdout).trim()));
    let has_std = libdir
        .as_deref()
        .and_then(|d| std::fs::read_dir(d).ok())
        .is_some_and(|mut it| {
            it.any(|e| e.is_ok_and(|e| e.file_name().to_string_lossy().starts_with("libstd-")))
        });
    if !has_std {
        return Some(format!("{rustc} has no {TARGET} standard library"));
    }
    if runs(LINKER, "--version").is_none() {
        return Some(format!("no {LINKER}"));
    }
    if runs(qemu, "--version").is_none() {
        return Some(format!("no {qemu}"));
    }
    None
}

/// A cross `cargo` command: Debian's toolchain, its own target directory, nothing inherited that
/// belongs to the host build.
fn cross_cargo(cargo: &str, rustc: &str, root: &Path, target_dir: &Path) -> Command {
    let mut c = Command::new(cargo);
    let rustdoc = Path::new(rustc).with_file_name("rustdoc");
    c.current_dir(root)
        .env("RUSTC", rustc)
        .env("RUSTDOC", rustdoc)
        .env("CARGO_TARGET_DIR", target_dir)
        .env("CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_LINKER", LINKER)
        .env("CC_aarch64_unknown_linux_gnu", LINKER)
        .env("CARGO_TERM_COLOR", "never");
    for v in [
        "RUSTFLAGS",
        "CARGO_ENCODED_RUSTFLAGS",
        "CARGO_BUILD_RUSTFLAGS",
        "RUSTC_WRAPPER",
        "RUSTC_WORKSPACE_WRAPPER",
        "CARGO_BUILD_TARGET",
        "RUSTUP_TOOLCHAIN",
    ] {
        c.env_remove(v);
    }
    c
}

/// A built executable: package, its directory, target name and kind (`lib`, `test`, `bin`,
/// `example`), and whether it is a test harness.
#[derive(Debug, Clone)]
struct Exe {
    package: String,
    dir: PathBuf,
    name: String,
    kind: String,
    test: bool,
    path: PathBuf,
}

/// The package name in a cargo package id (`path+file:///dir/name#1.0` or `...#name@1.0`).
fn package_name(id: &str) -> String {
    let (path, frag) = id.rsplit_once('#').unwrap_or((id, ""));
    match frag.split_once('@') {
        Some((name, _)) => name.to_owned(),
        None => path.rsplit('/').next().unwrap_or_default().to_owned(),
    }
}

/// Run a cross cargo build with JSON messages; returns the executables it produced.
fn build(mut cmd: Command, what: &str) -> Vec<Exe> {
    cmd.args(["--message-format=json-render-diagnostics"]);
    let out = cmd.output().unwrap_or_else(|e| panic!("{what}: {e}"));
    assert!(
        out.status.success(),
        "{what} failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let mut exes = Vec::new();
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        let Ok(v) = serde_json::from_str::<Value>(line) else {
            continue;
        };
        if v["reason"] != "compiler-artifact" {
            continue;
        }
        if let Some(path) = v["executable"].as_str() {
            let manifest = PathBuf::from(v["manifest_path"].as_str().unwrap_or_default());
            exes.push(Exe {
                package: package_name(v["package_id"].as_str().unwrap_or_default()),
                dir: manifest.parent().map(Path::to_path_buf).unwrap_or_default(),
                name: v["target"]["name"].as_str().unwrap_or_default().to_owned(),
                test: v["profile"]["test"].as_bool().unwrap_or(false),
                kind: v["target"]["kind"][0]
                    .as_str()
                    .unwrap_or_default()
                    .to_owned(),
                path: PathBuf::from(path),
            });
        }
    }
    exes
}

fn qemu_run(qemu: &str, cpu: &str, exe: &Path, args: &[&str], dir: &Path) -> Output {
    Command::new(qemu)
        .args(["-cpu", cpu])
        .arg(exe)
        .args(args)
        .current_dir(dir)
        .output()
        .unwrap_or_else(|e| panic!("{qemu} -cpu {cpu} {}: {e}", exe.display()))
}

/// Run `jobs` on as many threads as this machine has cores (each job starts a qemu process,
/// mostly one busy thread: two at once keep both cores of a CI machine busy), results in order.
fn par_map<T: Sync, R: Send>(jobs: &[T], f: impl Fn(&T) -> R + Sync) -> Vec<R> {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Mutex;
    let workers = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1)
        .min(jobs.len().max(1));
    let next = AtomicUsize::new(0);
    let out: Mutex<Vec<Option<R>>> = Mutex::new((0..jobs.len()).map(|_| None).collect());
    std::thread::scope(|s| {
        for _ in 0..workers {
            s.spawn(|| loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                let Some(job) = jobs.get(i) else { break };
                let r = f(job);
                out.lock().unwrap()[i] = Some(r);
            });
        }
    });
    out.into_inner()
        .unwrap()
        .into_iter()
        .map(|r| r.expect("every job ran"))
        .collect()
}

fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// `generate --json` on `model`: the generated ids (and the whole object for messages).
fn tokens(o: &Output, what: &str) -> (Vec<u64>, String) {
    assert!(o.status.success(), "{what}: {}", text(o));
    let s = String::from_utf8_lossy(&o.stdout);
    let v: Value = serde_json::from_str(s.trim()).unwrap_or_else(|e| panic!("{what}: {e}: {s}"));
    let ids = v["generated_ids"]
        .as_array()
        .unwrap_or_else(|| panic!("{what}: no generated_ids in {s}"))
        .iter()
        .map(|x| x.as_u64().unwrap())
        .collect();
    (ids, v["text"].as_str().unwrap_or_default().to_owned())
}

#[test]
fn the_workspace_on_aarch64_under_qemu() {
    const NAME: &str = "the_workspace_on_aarch64_under_qemu";
    let cargo = env_or("LLADA_AARCH64_CARGO", "/usr/bin/cargo");
    let rustc = env_or("LLADA_AARCH64_RUSTC", "/usr/bin/rustc");
    let qemu = env_or("LLADA_QEMU_AARCH64", "qemu-aarch64");
    if let Some(missing) = missing_tool(&cargo, &rustc, &qemu) {
        skip_or_fail(NAME, &missing);
        return;
    }
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let root = root.canonicalize().unwrap();
    let target_dir = std::env::var_os("LLADA_AARCH64_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_TARGET_TMPDIR")).join("aarch64"));

    // Only the packages run here: kernels-cpu's test harnesses (its unit tests, `it` and
    // `alloc`; no examples) and generate's binary (not its tests, whose dev-dependencies would
    // pull in dllm-tasks).
    let mut c = cross_cargo(&cargo, &rustc, &root, &target_dir);
    c.args(["build", "--release", "--locked", "--target", TARGET]);
    c.args(["-p", "generate", "--bin", "generate"]);
    let generate = build(c, "cross-building generate")
        .into_iter()
        .find(|e| e.name == "generate" && e.kind == "bin" && !e.test)
        .expect("the generate executable");
    let mut c = cross_cargo(&cargo, &rustc, &root, &target_dir);
    c.args([
        "test",
        "--release",
        "--locked",
        "--no-run",
        "--target",
        TARGET,
    ]);
    c.args(["-p", "kernels-cpu", "--tests"]);
    let tests = build(c, "cross-building kernels-cpu's tests");
    let kernel_tests: Vec<&Exe> = tests
        .iter()
        .filter(|e| e.package == "kernels-cpu" && e.test)
        .collect();
    let names: Vec<&str> = kernel_tests.iter().map(|e| e.name.as_str()).collect();
    assert!(
        ["kernels_cpu", "it", "alloc"]
            .iter()
            .all(|n| names.contains(n)),
        "kernels-cpu test executables: {kernel_tests:?}"
    );

    // kernels-cpu on each CPU model.
    let x86_best = kernels_cpu::Isa::best();
    let x86_print = kernels_common::fingerprint::fingerprint(x86_best);
    let mut prints = BTreeMap::new();
    let kernel_jobs: Vec<(&str, &str, &Exe)> = CPUS
        .iter()
        .flat_map(|&(cpu, paths)| kernel_tests.iter().map(move |&e| (cpu, paths, e)))
        .collect();
    let kernel_runs = par_map(&kernel_jobs, |&(cpu, paths, exe)| {
        Command::new(&qemu)
            .args(["-cpu", cpu])
            .arg(&exe.path)
            .current_dir(&exe.dir)
            .env("KERNELS_CPU_EXPECT_PATHS", paths)
            .output()
            .unwrap()
    });
    for (&(cpu, paths, exe), o) in kernel_jobs.iter().zip(&kernel_runs) {
        let t = text(o);
        assert!(
            o.status.success(),
            "kernels-cpu {} on qemu-aarch64 -cpu {cpu}:\n{t}",
            exe.name
        );
        if exe.name == "it" {
            let line = t
                .lines()
                .find(|l| l.starts_with("kernels-cpu paths on aarch64:"))
                .unwrap_or_else(|| panic!("no path report on {cpu}:\n{t}"));
            assert!(line.contains(&format!(": {paths} (")), "{cpu}: {line}");
            let print = line.rsplit(' ').next().unwrap().to_owned();
            prints.insert(cpu, (line.to_owned(), print));
        }
    }
    let x86_hex = format!("{x86_print:016x}");
    let first = &prints["max"].1;
    for (cpu, (line, print)) in &prints {
        assert_eq!(print, first, "{cpu} and max compute different bits: {line}");
        // The x86 SIMD paths fuse multiply-adds as the NEON ones do; portable does not.
        if x86_best != kernels_cpu::Isa::Portable {
            assert_eq!(
                print, &x86_hex,
                "{cpu}: kernel bits differ from x86 ({x86_best}): {line}"
            );
        }
    }

    // generate: the same tokens as x86. One thread per run (the kernels give the same bits at
    // every thread count, tested on both sides); the runs themselves go two at a time.
    let mut runs: Vec<(&str, &str, Vec<String>)> = Vec::new();
    for (model, strategy, prompt) in RUNS {
        let dir = root.join("models").join(model);
        let mut args: Vec<String> = [
            "--model",
            dir.to_str().unwrap(),
            "--prompt",
            prompt,
            "--strategy",
            strategy,
            "--threads",
            "1",
            "--json",
            "--no-live",
        ]
        .map(String::from)
        .to_vec();
        // The long model's one-token-per-step schedule is 110 forwards of ~240 positions:
        // under qemu, four tokens per step (32 steps) keeps the suite's time down and still
        // runs every kernel the schedule does.
        if model == "tiny-llada-long" {
            args.extend(["--steps", "32"].map(String::from));
        }
        runs.push((model, strategy, args));
    }
    let x86 = par_map(&runs, |(model, strategy, args)| {
        let o = Command::new(env!("CARGO_BIN_EXE_generate"))
            .args(args)
            .output()
            .unwrap();
        tokens(&o, &format!("x86 generate {model} {strategy}"))
    });
    let qemu_jobs: Vec<(usize, &str)> = (0..runs.len()).map(|i| (i, GENERATE_CPU)).collect();
    let arm = par_map(&qemu_jobs, |&(i, cpu)| {
        let (model, strategy, args) = &runs[i];
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let what = format!("aarch64 generate -cpu {cpu} {model} {strategy}");
        let o = qemu_run(&qemu, cpu, &generate.path, &args, &root);
        let got = tokens(&o, &what);
        (what, got)
    });
    for (&(i, _), (what, (got, got_text))) in qemu_jobs.iter().zip(&arm) {
        let (want, want_text) = &x86[i];
        assert_eq!(
            got, want,
            "{what}: tokens differ from x86\naarch64: {got_text:?}\nx86: {want_text:?}"
        );
    }
    let runs_done = arm.len();

    announce(&format!(
        "aarch64-qemu: kernels-cpu's {} test executables passed on {}; paths {}; kernel \
         fingerprint {} ({}) on every model, x86 {x86_best} {x86_hex}; generate gave x86's tokens \
         in {runs_done} runs on {GENERATE_CPU} ({})",
        kernel_tests.len(),
        CPUS.map(|c| c.0).join(", "),
        CPUS.map(|c| format!("{}=[{}]", c.0, c.1)).join(" "),
        prints.values().next().map(|p| p.1.as_str()).unwrap_or("?"),
        if x86_best == kernels_cpu::Isa::Portable {
            "x86 runs portable only: not compared"
        } else {
            "equal to x86"
        },
        RUNS.map(|r| format!("{} {}", r.0, r.1)).join(", "),
    ));
}
