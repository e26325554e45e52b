//! The `eval` binary: `--json` on the shipped model reports every task with the documented fields
//! and the model card's accuracy, the table names the settings, and bad input is a named error.

use std::path::PathBuf;
use std::process::{Command, Output};

use candle_core::DType;
use dllm_models::synthetic::{random_weights, tiny_llada, write_hf};

fn shipped() -> String {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../models/tiny-llada");
    dir.to_str().unwrap().to_string()
}

fn run(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_eval"))
        .args(args)
        .output()
        .expect("run eval")
}

#[test]
fn json_reports_every_task_of_the_shipped_model() {
    let m = shipped();
    let out = run(&[
        "--model",
        &m,
        "--limit",
        "4",
        "--threshold",
        "0.9",
        "--json",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("one JSON object");
    assert_eq!(v["params"]["gen_length"], 24);
    assert_eq!(
        v["params"]["block_length"], 8,
        "the checkpoint's recommendation"
    );
    assert_eq!(v["params"]["threshold"], 0.9);
    let tasks = v["tasks"].as_array().unwrap();
    let names: Vec<&str> = tasks.iter().map(|t| t["task"].as_str().unwrap()).collect();
    assert_eq!(names, ["math", "yesno", "choice", "completion"]);
    for t in tasks {
        assert_eq!(t["n"], 4);
        let acc = t["final_answer_accuracy"].as_f64().unwrap();
        assert!(acc >= 0.75, "{t}");
        let fw = t["forwards_per_answer"].as_f64().unwrap();
        let tpf = t["tokens_per_forward"].as_f64().unwrap();
        assert!((1.0..=24.0).contains(&fw) && tpf >= 1.0, "{t}");
    }
}

#[test]
fn table_names_the_settings_and_tasks() {
    let m = shipped();
    let out = run(&[
        "--model",
        &m,
        "--limit",
        "2",
        "--tasks",
        "completion",
        "--block-length",
        "24",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let s = String::from_utf8(out.stdout).unwrap();
    assert!(
        s.contains("vanilla · gen 24 block 24 steps 24 · 2 questions"),
        "{s}"
    );
    assert!(s.contains("| completion | HellaSwag | 2 | 100.0% |"), "{s}");
    assert!(!s.contains("| math |"), "{s}");
}

#[test]
fn bad_input_is_a_named_error() {
    let m = shipped();
    let dir = std::env::temp_dir().join(format!("eval-cli-{}", std::process::id()));
    let cfg = tiny_llada();
    write_hf(&dir, &cfg, &random_weights(&cfg, 5).unwrap(), DType::F32, 1).unwrap();
    let foreign = dir.to_str().unwrap();
    let cases: &[(&[&str], &str)] = &[
        (&["--model", &m, "--tasks", "poetry"], "poetry"),
        (&["--model", &m, "--limit", "0"], "--limit"),
        (&["--model", &m, "--block-length", "7"], "block"),
        (&["--model", &m, "--strategy", "fastest"], "fastest"),
        (&["--model", foreign], "tokenizer"),
        (&["--model", "/no/such/model"], "/no/such/model"),
    ];
    for (args, word) in cases {
        let out = run(args);
        assert!(!out.status.success(), "{args:?} should fail");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            err.contains(word),
            "{args:?}: stderr should name `{word}`: {err}"
        );
        assert!(!err.contains("panicked"), "{args:?} panicked: {err}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}
