//! The `train-tiny` binary on a toy budget: it writes a checkpoint the loaders read (HF layout,
//! decoding defaults), `--resume` continues the same run with one continuous log, and bad
//! arguments are errors naming the flag, raised before anything is written.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use dllm_models::{load, DiffusionLm, LoadOptions, ModelSource};

fn run(out: &Path, extra: &[&str]) -> Output {
    let mut args = vec![
        "--out",
        out.to_str().unwrap(),
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
    ];
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
