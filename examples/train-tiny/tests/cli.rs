//! The `train-tiny` binary on a toy budget: it writes a checkpoint the loaders read (HF layout,
//! decoding defaults), `--resume` continues the same run with one continuous log, bad arguments
//! are errors naming the flag, raised before anything is written, and an existing model survives
//! everything but `--overwrite` (a second run, a failed resume, a killed run).

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use dllm_models::{load, DiffusionLm, LoadOptions, ModelSource};

fn run(out: &Path, extra: &[&str]) -> Output {
    let mut args = vec!["--out", out.to_str().unwrap()];
    // Toy defaults, unless the case sets the flag itself.
    for (flag, v) in [
        ("--hidden", "32"),
        ("--layers", "1"),
        ("--heads", "2"),
        ("--batch", "4"),
        ("--eval-every", "0"),
        ("--checkpoint-every", "2"),
    ] {
        if !extra.contains(&flag) {
            args.extend([flag, v]);
        }
    }
    args.extend_from_slice(extra);
    Command::new(env!("CARGO_BIN_EXE_train-tiny"))
        .args(&args)
        .output()
        .expect("run train-tiny")
}

fn tmp(tag: &str) -> PathBuf {
    std::env::temp_dir().join(format!("train-tiny-cli-{tag}-{}", std::process::id()))
}

fn logged_steps(dir: &Path) -> Vec<u64> {
    std::fs::read_to_string(dir.join("training_log.jsonl"))
        .unwrap()
        .lines()
        .map(|l| {
            serde_json::from_str::<serde_json::Value>(l).unwrap()["step"]
                .as_u64()
                .unwrap()
        })
        .collect()
}

#[test]
fn writes_a_loadable_checkpoint_and_resumes() {
    for arch in ["llada", "dream"] {
        let dir = tmp(arch);
        let _ = std::fs::remove_dir_all(&dir);
        let out = run(&dir, &["--arch", arch, "--steps", "3"]);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let gen: serde_json::Value =
            serde_json::from_slice(&std::fs::read(dir.join("generation_config.json")).unwrap())
                .unwrap();
        assert_eq!(
            (gen["gen_length"].as_u64(), gen["block_length"].as_u64()),
            (Some(24), Some(8))
        );
        let m = load(
            &ModelSource::parse(dir.to_str().unwrap()).unwrap(),
            &LoadOptions::default(),
        )
        .unwrap();
        assert_eq!(m.model.info().arch.to_string(), arch);
        assert_eq!(m.defaults.block_length, Some(8));
        assert!(m.tokenizer.is_some());
        assert_eq!(logged_steps(&dir), [1, 2, 3]);

        // Pretend the run died after step 3's log line but before its checkpoint: the log keeps
        // what the step-2 checkpoint covers and the resumed run continues from there.
        std::fs::remove_file(dir.join("checkpoint/state.json")).unwrap();
        let state = serde_json::json!({"step": 2, "stream": [1, 2, 3, 4], "mask_rng": [5, 6, 7, 8], "elapsed_s": 1.0, "examples": 8});
        std::fs::write(dir.join("checkpoint/state.json"), state.to_string()).unwrap();
        let out = run(&dir, &["--arch", arch, "--steps", "5", "--resume"]);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{err}");
        assert!(err.contains("resumed at step 2"), "{err}");
        assert_eq!(logged_steps(&dir), [1, 2, 3, 4, 5]);
        let _ = std::fs::remove_dir_all(&dir);
    }
}

#[test]
fn bad_arguments_name_the_flag() {
    let dir = tmp("bad");
    for (extra, word) in [
        (&["--arch", "gpt"][..], "--arch"),
        (&["--block-length", "5"][..], "--block-length"),
        (&["--checkpoint-every", "0"][..], "--checkpoint-every"),
        (&["--task-weights", "1,2"][..], "--task-weights"),
        (&["--save-dtype", "f8", "--steps", "1"][..], "--save-dtype"),
        (&["--task-weights", "0,0,0,0"][..], "--task-weights"),
        (&["--steps", "0"][..], "--steps"),
        (&["--heads", "3"][..], "head"),
        // Issue 17's rows: each used to panic, abort, hang or train silently on nonsense.
        (&["--lr=-1"][..], "--lr"),
        (&["--clip", "NaN"][..], "--clip"),
        (&["--minutes=-1"][..], "--minutes"),
        (
            &["--gen-len", "1000", "--block-length", "8"][..],
            "--gen-len",
        ),
        (
            &["--task-weights", "4294967295,1,0,0"][..],
            "--task-weights",
        ),
        (&["--hidden", "1000000000"][..], "needs"),
        (&["--layers", "1000000000"][..], "needs"),
        (&["--batch", "1000000000"][..], "--batch"),
        (&["--threads", "10000"][..], "--threads"),
        (&["--weight-decay", "NaN"][..], "--weight-decay"),
        (&["--resume"][..], "--resume"),
    ] {
        let out = run(&dir, extra);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{extra:?} should fail");
        assert!(
            err.contains(word),
            "{extra:?}: stderr should name `{word}`: {err}"
        );
        assert!(!err.contains("panicked"), "{extra:?} panicked: {err}");
        assert!(
            !dir.exists(),
            "{extra:?}: nothing may be written before the arguments are checked"
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}

fn model_bytes(dir: &Path) -> Vec<Vec<u8>> {
    [
        "config.json",
        "model.safetensors",
        "tokenizer.json",
        "generation_config.json",
    ]
    .iter()
    .map(|f| std::fs::read(dir.join(f)).unwrap())
    .collect()
}

fn loads(dir: &Path) {
    load(
        &ModelSource::parse(dir.to_str().unwrap()).unwrap(),
        &LoadOptions::default(),
    )
    .unwrap();
}

#[test]
fn an_existing_model_is_replaced_only_with_overwrite_and_survives_failures() {
    let dir = tmp("keep");
    let _ = std::fs::remove_dir_all(&dir);
    let out = run(&dir, &["--steps", "2"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let before = model_bytes(&dir);

    // A second run into the same directory.
    let out = run(&dir, &["--steps", "2"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && err.contains("--overwrite"),
        "{err}"
    );
    // A resume with another shape.
    let out = run(&dir, &["--steps", "4", "--resume", "--hidden", "64"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains("--resume"), "{err}");
    // A resume from a state whose elapsed time is negative (NaN cannot be spelt in JSON).
    let state = dir.join("checkpoint/state.json");
    let good_state = std::fs::read(&state).unwrap();
    let mut st: serde_json::Value = serde_json::from_slice(&good_state).unwrap();
    st["elapsed_s"] = serde_json::json!(-1.0);
    std::fs::write(&state, st.to_string()).unwrap();
    let out = run(&dir, &["--steps", "4", "--resume"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && err.contains("state.json") && err.contains("elapsed_s"),
        "{err}"
    );
    std::fs::write(&state, "{ not json").unwrap();
    let out = run(&dir, &["--steps", "4", "--resume"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains("state.json"), "{err}");
    assert!(!err.contains("panicked"), "{err}");
    std::fs::write(&state, &good_state).unwrap();
    assert!(
        model_bytes(&dir) == before,
        "a refused run changed the model"
    );
    loads(&dir);

    // A run killed mid-training (with --overwrite: it would replace the model at its end).
    let mut child = Command::new(env!("CARGO_BIN_EXE_train-tiny"))
        .args([
            "--out",
            dir.to_str().unwrap(),
            "--overwrite",
            "--hidden",
            "64",
            "--layers",
            "1",
            "--heads",
            "2",
            "--batch",
            "4",
            "--eval-every",
            "0",
            "--steps",
            "1000000",
        ])
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    // Killed once it has trained a step (its log, in `<out>.next`, has a line).
    wait_for_log_line(&[sibling(&dir, ".next"), dir.clone()], &mut child);
    child.kill().unwrap();
    child.wait().unwrap();
    assert!(
        model_bytes(&dir) == before,
        "a killed run changed the model"
    );
    loads(&dir);

    // --overwrite replaces it, with a model of the new shape.
    let out = run(&dir, &["--steps", "2", "--overwrite", "--hidden", "64"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        model_bytes(&dir) != before,
        "--overwrite left the old model"
    );
    let cfg: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.join("config.json")).unwrap()).unwrap();
    assert_eq!(cfg["d_model"], 64);
    loads(&dir);
    assert_no_leftovers(&dir);
    let _ = std::fs::remove_dir_all(&dir);
}

/// The long suite's quick eval logs final-answer and per-step accuracy and the long-math skill
/// probe (`skills`), every value a fraction.
#[test]
fn long_suite_quick_eval_logs_the_skill_probe() {
    let dir = tmp("long-skills");
    let _ = std::fs::remove_dir_all(&dir);
    let out = run(
        &dir,
        &[
            "--suite",
            "long",
            "--gen-len",
            "128",
            "--block-length",
            "32",
            "--steps",
            "2",
            "--eval-every",
            "2",
            "--eval-limit",
            "1",
        ],
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let log = std::fs::read_to_string(dir.join("training_log.jsonl")).unwrap();
    let last: serde_json::Value = serde_json::from_str(log.lines().last().unwrap()).unwrap();
    assert_eq!(last["step"], 2);
    assert!(last["eval"]["long-math"].is_f64(), "{last}");
    for skill in ["copy", "lookup", "arithmetic"] {
        let v = last["skills"][skill].as_f64().unwrap_or(-1.0);
        assert!((0.0..=1.0).contains(&v), "{skill}: {last}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// `<dir><suffix>`, beside `dir`.
fn sibling(dir: &Path, suffix: &str) -> PathBuf {
    let mut n = dir.file_name().unwrap().to_os_string();
    n.push(suffix);
    dir.with_file_name(n)
}

/// Temporary names (`*.partial-<pid>`) in `dir`, its checkpoint, and `.<dir>.partial-*` beside it.
fn leftovers(dir: &Path) -> Vec<String> {
    let hidden = format!(".{}.partial-", dir.file_name().unwrap().to_string_lossy());
    let mut found = Vec::new();
    for (d, prefix) in [
        (dir.to_path_buf(), ""),
        (dir.join("checkpoint"), ""),
        (dir.parent().unwrap().to_path_buf(), hidden.as_str()),
    ] {
        for e in std::fs::read_dir(&d).into_iter().flatten().flatten() {
            let n = e.file_name().to_string_lossy().into_owned();
            if n.contains(".partial-") && n.starts_with(prefix) {
                found.push(format!("{}/{n}", d.display()));
            }
        }
    }
    found
}

fn assert_no_leftovers(dir: &Path) {
    let l = leftovers(dir);
    assert!(l.is_empty(), "temporary files left: {l:?}");
}

/// Block (without sleeping) until the training log in one of `dirs` has a line: the child has
/// trained a step. Fails if the child exits first.
fn wait_for_log_line(dirs: &[PathBuf], child: &mut std::process::Child) {
    let logged = |d: &PathBuf| {
        std::fs::read_to_string(d.join("training_log.jsonl")).is_ok_and(|t| t.contains('\n'))
    };
    loop {
        if dirs.iter().any(logged) {
            return;
        }
        if let Some(st) = child.try_wait().unwrap() {
            panic!("train-tiny exited ({st}) before logging a step");
        }
        std::thread::yield_now();
    }
}

fn json(path: &Path) -> serde_json::Value {
    serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap()
}

fn ok(out: &Output) -> String {
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "{err}");
    err
}

/// D2: `--overwrite` over a sharded model used to write `model.safetensors` beside the stale
/// `model.safetensors.index.json` and shards, and the loader (which prefers the index) served the
/// old weights. The directory is now replaced as a whole.
#[test]
fn overwriting_a_sharded_model_leaves_no_stale_index_or_shard() {
    let dir = tmp("sharded");
    let _ = std::fs::remove_dir_all(&dir);
    ok(&run(&dir, &["--steps", "2"]));
    // Make it a sharded checkpoint of the same weights: one shard plus an index listing it.
    let single = dir.join("model.safetensors");
    let bytes = std::fs::read(&single).unwrap();
    let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let header: serde_json::Value = serde_json::from_slice(&bytes[8..8 + n]).unwrap();
    let shard = "model-00001-of-00001.safetensors";
    let map: serde_json::Map<String, serde_json::Value> = header
        .as_object()
        .unwrap()
        .keys()
        .filter(|k| *k != "__metadata__")
        .map(|k| (k.clone(), serde_json::json!(shard)))
        .collect();
    std::fs::rename(&single, dir.join(shard)).unwrap();
    std::fs::write(
        dir.join("model.safetensors.index.json"),
        serde_json::json!({"metadata": {}, "weight_map": map}).to_string(),
    )
    .unwrap();
    loads(&dir);

    ok(&run(
        &dir,
        &["--steps", "2", "--overwrite", "--hidden", "64"],
    ));
    for stale in ["model.safetensors.index.json", shard] {
        assert!(!dir.join(stale).exists(), "{stale} survived --overwrite");
    }
    let m = load(
        &ModelSource::parse(dir.to_str().unwrap()).unwrap(),
        &LoadOptions::default(),
    )
    .unwrap();
    assert_eq!(m.model.info().hidden_size, 64, "the new weights are served");
    assert_no_leftovers(&dir);
    let _ = std::fs::remove_dir_all(&dir);
}

/// `--out` with a pre-existing entry named like one of the run's files, as a non-empty
/// directory: renaming the new file onto it fails. Today's code renamed file by file, so the
/// failure left a mix (a new `config.json` beside the old `train_args.json`; a checkpoint with new
/// weights and the old state).
fn obstruct(path: &Path) {
    let _ = std::fs::remove_file(path);
    std::fs::create_dir_all(path.join("obstacle")).unwrap();
}

/// D3: the model directory and the checkpoint are each replaced as one unit: whatever stands in
/// the old directory, the new one is installed whole, and a run killed at any point leaves the
/// old model or the new one, never a mix.
#[test]
fn the_model_and_the_checkpoint_are_each_replaced_as_one_unit() {
    let dir = tmp("unit");
    let _ = std::fs::remove_dir_all(&dir);
    ok(&run(&dir, &["--steps", "2"]));
    obstruct(&dir.join("generation_config.json"));
    obstruct(&dir.join("checkpoint/state.json"));
    let out = run(&dir, &["--steps", "4", "--overwrite", "--hidden", "64"]);
    let err = String::from_utf8_lossy(&out.stderr);
    // Consistent whatever happened: the config, the arguments and the checkpoint of one run.
    let cfg = json(&dir.join("config.json"));
    let args = json(&dir.join("train_args.json"));
    assert_eq!(
        cfg["d_model"], args["hidden"],
        "config and train_args of two runs: {err}"
    );
    assert!(
        dir.join("checkpoint/state.json").is_file(),
        "a checkpoint without its state: {err}"
    );
    let state = json(&dir.join("checkpoint/state.json"));
    assert_eq!(
        json(&dir.join("checkpoint/config.json"))["d_model"],
        cfg["d_model"],
        "{err}"
    );
    assert_eq!(state["step"], args["steps"], "{err}");
    assert!(out.status.success(), "{err}");
    assert!(!dir.join("generation_config.json/obstacle").exists());
    loads(&dir);

    // Killed (abort, nothing cleaned up) with the new directory complete but not yet swapped in:
    // the old model stays, and --resume finishes the interrupted run from `<out>.next`.
    let before = model_bytes(&dir);
    let abort = |point: &str, extra: &[&str]| {
        let mut args = vec!["--out", dir.to_str().unwrap()];
        args.extend_from_slice(&[
            "--hidden",
            "32",
            "--layers",
            "1",
            "--heads",
            "2",
            "--batch",
            "4",
            "--eval-every",
            "0",
            "--checkpoint-every",
            "2",
        ]);
        args.extend_from_slice(extra);
        let out = Command::new(env!("CARGO_BIN_EXE_train-tiny"))
            .args(&args)
            .env("TRAIN_TINY_TEST_ABORT", point)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr).into_owned();
        assert!(
            !out.status.success() && err.contains(&format!("aborting at {point}")),
            "{point}: {err}"
        );
    };
    abort("model-staged", &["--steps", "2", "--overwrite"]);
    assert!(model_bytes(&dir) == before, "the old model is intact");
    loads(&dir);
    assert!(
        !leftovers(&dir).is_empty(),
        "the abort left its temporary directory"
    );
    // Killed while swapping a checkpoint in: the previous checkpoint, whole.
    abort("checkpoint-staged", &["--steps", "4", "--resume"]);
    let next = sibling(&dir, ".next");
    assert_eq!(json(&next.join("checkpoint/state.json"))["step"], 2);
    let err = ok(&run(&dir, &["--steps", "4", "--resume"]));
    assert!(err.contains("resumed at step 2"), "{err}");
    assert!(err.contains("left by an interrupted run"), "{err}");
    assert_eq!(json(&dir.join("config.json"))["d_model"], 32);
    assert_eq!(json(&dir.join("checkpoint/state.json"))["step"], 4);
    assert!(
        !next.exists(),
        "<out>.next is removed once the model is installed"
    );
    assert_no_leftovers(&dir);
    loads(&dir);
    let _ = std::fs::remove_dir_all(&dir);
}

/// Run `train-tiny` with writes beyond `limit` bytes per file failing (`RLIMIT_FSIZE`, with
/// SIGXFSZ ignored: `write` returns EFBIG, as a full disk returns ENOSPC).
fn run_with_file_limit(out: &Path, extra: &[&str], limit: u64) -> Output {
    use std::os::unix::process::CommandExt;
    let mut args = vec![
        "--out",
        out.to_str().unwrap(),
        "--layers",
        "1",
        "--heads",
        "2",
    ];
    args.extend_from_slice(&["--batch", "4", "--eval-every", "0"]);
    args.extend_from_slice(extra);
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_train-tiny"));
    cmd.args(&args);
    // SAFETY: only async-signal-safe calls between fork and exec.
    unsafe {
        cmd.pre_exec(move || {
            libc::signal(libc::SIGXFSZ, libc::SIG_IGN);
            let lim = libc::rlimit {
                rlim_cur: limit,
                rlim_max: limit,
            };
            if libc::setrlimit(libc::RLIMIT_FSIZE, &lim) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    cmd.output().unwrap()
}

fn run_bytes(dir: &Path) -> Vec<Vec<u8>> {
    [
        "training_log.jsonl",
        "checkpoint/model.safetensors",
        "checkpoint/optimizer.safetensors",
        "checkpoint/state.json",
    ]
    .iter()
    .map(|f| std::fs::read(dir.join(f)).unwrap())
    .collect()
}

/// D4: `--overwrite` used to truncate the old run's log and overwrite its checkpoint at once,
/// before the new model existed — also when the new run then failed (here: files beyond 1 MiB
/// cannot be written, as on a full disk). The old run now stays until the new model replaces it.
#[test]
fn overwrite_keeps_the_old_run_until_the_new_model_exists() {
    let dir = tmp("keep-run");
    let _ = std::fs::remove_dir_all(&dir);
    ok(&run(&dir, &["--steps", "2"]));
    let (model, old_run) = (model_bytes(&dir), run_bytes(&dir));
    // d 128: the checkpoint's f32 weights (> 1 MiB) cannot be written.
    let out = run_with_file_limit(
        &dir,
        &[
            "--overwrite",
            "--hidden",
            "128",
            "--steps",
            "4",
            "--checkpoint-every",
            "2",
        ],
        1 << 20,
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "the run should fail: {err}");
    assert!(!err.contains("panicked"), "{err}");
    assert!(model_bytes(&dir) == model, "the old model is intact");
    assert!(
        run_bytes(&dir) == old_run,
        "the old log and checkpoint changed"
    );
    assert!(
        !sibling(&dir, ".next").exists(),
        "a run that failed before its first checkpoint leaves nothing"
    );
    assert_no_leftovers(&dir);
    loads(&dir);
    let _ = std::fs::remove_dir_all(&dir);
}

/// `.<dir>.partial-<pid>`, beside `dir`.
fn hidden_partial(dir: &Path, pid: u32) -> PathBuf {
    dir.with_file_name(format!(
        ".{}.partial-{pid}",
        dir.file_name().unwrap().to_string_lossy()
    ))
}

fn dead_pid() -> u32 {
    // Above the kernel's largest pid: never a running process.
    std::fs::read_to_string("/proc/sys/kernel/pid_max")
        .ok()
        .and_then(|s| s.trim().parse::<u32>().ok())
        .unwrap_or(4_194_304)
        + 1
}

/// D5: interrupted runs left `.partial-<pid>` files (up to 81 MB) that no later run removed. A run
/// now removes those of processes that no longer run (and only those); SIGINT and SIGTERM stop at
/// a step boundary with a checkpoint and leave no temporary file.
#[test]
fn stale_partial_files_are_removed_and_signals_stop_cleanly() {
    let dir = tmp("stale");
    let _ = std::fs::remove_dir_all(&dir);
    ok(&run(&dir, &["--steps", "2"]));
    let dead = dead_pid();
    let live = std::process::id();
    let stale = [
        dir.join(format!("model.safetensors.partial-{dead}")),
        dir.join(format!("checkpoint/optimizer.safetensors.partial-{dead}")),
        hidden_partial(&dir, dead),
    ];
    for p in &stale {
        std::fs::write(p, b"left by a killed run").unwrap();
    }
    let alive = hidden_partial(&dir, live);
    std::fs::write(&alive, b"a running writer's").unwrap();
    ok(&run(&dir, &["--steps", "4", "--resume"]));
    for p in &stale {
        assert!(!p.exists(), "{} was not removed", p.display());
    }
    assert!(
        alive.exists(),
        "a live process's temporary file was removed"
    );
    std::fs::remove_file(&alive).unwrap();

    for (sig, code) in [(libc::SIGINT, 130), (libc::SIGTERM, 143)] {
        let d = tmp(&format!("signal-{sig}"));
        let _ = std::fs::remove_dir_all(&d);
        let mut child = Command::new(env!("CARGO_BIN_EXE_train-tiny"))
            .args([
                "--out",
                d.to_str().unwrap(),
                "--hidden",
                "32",
                "--layers",
                "1",
            ])
            .args(["--heads", "2", "--batch", "4", "--eval-every", "0"])
            .args(["--checkpoint-every", "1000000", "--steps", "1000000"])
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        wait_for_log_line(std::slice::from_ref(&d), &mut child);
        // SAFETY: signalling our own child.
        unsafe { libc::kill(child.id() as libc::pid_t, sig) };
        let out = child.wait_with_output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(code), "{err}");
        assert!(err.contains("--resume"), "{err}");
        assert_no_leftovers(&d);
        let step = json(&d.join("checkpoint/state.json"))["step"]
            .as_u64()
            .unwrap();
        assert!(step >= 1);
        assert_eq!(
            logged_steps(&d).last(),
            Some(&step),
            "the log ends at the checkpoint"
        );
        let err = ok(&run(&d, &["--steps", &(step + 1).to_string(), "--resume"]));
        assert!(err.contains(&format!("resumed at step {step}")), "{err}");
        loads(&d);
        let _ = std::fs::remove_dir_all(&d);
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// D6: a symlinked `training_log.jsonl` had its target truncated, and a FIFO there hung the run.
/// Outputs are now created only in fresh directories and never follow a symlink or open a FIFO;
/// a resumed run's log must be a regular file.
#[test]
fn outputs_never_follow_symlinks_or_open_fifos() {
    let dir = tmp("links");
    let victim = tmp("links-victim");
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::write(&victim, b"precious\n").unwrap();
    std::fs::create_dir_all(&dir).unwrap();
    std::os::unix::fs::symlink(&victim, dir.join("training_log.jsonl")).unwrap();
    let out = run(&dir, &["--steps", "2"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && err.contains("--overwrite"),
        "{err}"
    );
    ok(&run(&dir, &["--steps", "2", "--overwrite"]));
    assert_eq!(std::fs::read(&victim).unwrap(), b"precious\n");
    assert!(std::fs::symlink_metadata(dir.join("training_log.jsonl"))
        .unwrap()
        .is_file());

    // A FIFO as the log of a fresh run (a reader holds it open, so opening it for writing
    // would not block): the run is refused, and --overwrite replaces it with a regular log.
    let fifo = dir.join("training_log.jsonl");
    std::fs::remove_dir_all(&dir).unwrap();
    std::fs::create_dir_all(&dir).unwrap();
    let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
    // SAFETY: a NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o644) }, 0);
    let _reader = {
        use std::os::unix::fs::OpenOptionsExt;
        std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NONBLOCK)
            .open(&fifo)
            .unwrap()
    };
    ok(&run(&dir, &["--steps", "2", "--overwrite"]));
    assert!(std::fs::symlink_metadata(&fifo).unwrap().is_file());

    // A resumed run whose log is a symlink or a FIFO: an error naming it, nothing followed.
    std::fs::remove_file(&fifo).unwrap();
    std::os::unix::fs::symlink(&victim, &fifo).unwrap();
    let out = run(&dir, &["--steps", "3", "--resume"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains("symlink"), "{err}");
    assert_eq!(std::fs::read(&victim).unwrap(), b"precious\n");
    std::fs::remove_file(&fifo).unwrap();
    // SAFETY: as above.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o644) }, 0);
    let out = run(&dir, &["--steps", "3", "--resume"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains("FIFO"), "{err}");

    // --out itself a symlink: refused (the directory is replaced as a whole).
    let link = tmp("links-out");
    let _ = std::fs::remove_file(&link);
    std::os::unix::fs::symlink(&dir, &link).unwrap();
    let out = run(&link, &["--steps", "2", "--overwrite"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains("symlink"), "{err}");
    let _ = std::fs::remove_file(&link);
    let _ = std::fs::remove_file(&victim);
    let _ = std::fs::remove_dir_all(&dir);
}

/// Every file of a model and of its checkpoint has the same mode (the safetensors writer used
/// to leave 0600 beside 0644), and a checkpoint written before checkpoints recorded their
/// config (today's layout: `checkpoint/{model.safetensors,optimizer.safetensors,state.json}`)
/// still resumes.
#[test]
fn consistent_modes_and_old_checkpoints_resume() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tmp("modes");
    let _ = std::fs::remove_dir_all(&dir);
    ok(&run(&dir, &["--steps", "2"]));
    let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
    let want = mode(&dir.join("config.json"));
    for f in [
        "model.safetensors",
        "tokenizer.json",
        "training_log.jsonl",
        "checkpoint/model.safetensors",
        "checkpoint/optimizer.safetensors",
        "checkpoint/state.json",
    ] {
        assert_eq!(mode(&dir.join(f)), want, "{f}");
    }
    std::fs::remove_file(dir.join("checkpoint/config.json")).unwrap();
    let err = ok(&run(&dir, &["--steps", "4", "--resume"]));
    assert!(err.contains("resumed at step 2"), "{err}");
    let _ = std::fs::remove_dir_all(&dir);
}
