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
    assert_eq!(model_bytes(&dir), before, "a refused run changed the model");
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
    std::thread::sleep(std::time::Duration::from_millis(1500));
    child.kill().unwrap();
    child.wait().unwrap();
    assert_eq!(model_bytes(&dir), before, "a killed run changed the model");
    loads(&dir);

    // --overwrite replaces it, with a model of the new shape.
    let out = run(&dir, &["--steps", "2", "--overwrite", "--hidden", "64"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_ne!(model_bytes(&dir), before);
    let cfg: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.join("config.json")).unwrap()).unwrap();
    assert_eq!(cfg["d_model"], 64);
    loads(&dir);
    let leftovers: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.contains(".partial-"))
        .collect();
    assert!(leftovers.is_empty(), "temporary files left: {leftovers:?}");
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
