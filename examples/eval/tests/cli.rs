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

/// The shipped long-answer model's directory.
fn long_model() -> String {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../models/tiny-llada-long");
    dir.to_str().unwrap().to_string()
}

/// `eval --json` of tiny-llada-long on the tuning set's first 20 long-math questions, one thread,
/// with `extra` flags; it must succeed.
fn tuning20(extra: &[&str]) -> serde_json::Value {
    tuning20_on(&long_model(), extra)
}

/// [`tuning20`] on model `m`.
fn tuning20_on(m: &str, extra: &[&str]) -> serde_json::Value {
    let mut args = vec![
        "--model",
        m,
        "--set",
        "tuning",
        "--limit",
        "20",
        "--threads",
        "1",
        "--json",
    ];
    args.extend_from_slice(extra);
    let out = run(&args);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
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
    // mbsd's span (LLaDA's default) makes the answer one block: the checkpoint's block length
    // (8) is for block-by-block decoding.
    assert_eq!(v["params"]["block_length"], 24, "one block");
    assert_eq!(v["params"]["span"], 16);
    // The default strategy is mbsd; `--threshold T` there commits at T (both thetas T).
    assert_eq!(v["params"]["strategy"], "mbsd");
    assert_eq!(v["params"]["threshold"], serde_json::Value::Null);
    assert_eq!(v["params"]["theta_visible"], 0.9);
    assert_eq!(v["params"]["theta_stable"], 0.9);
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
        "--strategy",
        "vanilla",
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
    // `--dump` never writes over a model file (issue 17: `--dump <model>/config.json` used to
    // overwrite the config).
    let config = format!("{m}/config.json");
    let weights = format!("{m}/model.safetensors");
    let readme = format!("{m}/README.md");
    let elsewhere_config = format!("{}/config.json", std::env::temp_dir().display());
    let dump_cases: &[(&[&str], &str)] = &[
        (&["--model", &m, "--dump", &config], "--dump"),
        (&["--model", &m, "--dump", &weights], "--dump"),
        (&["--model", &m, "--dump", &readme], "model's directory"),
        (&["--model", &m, "--dump", &elsewhere_config], "model file"),
    ];
    let before = std::fs::read(format!("{m}/config.json")).unwrap();
    let cases = [cases, dump_cases].concat();
    for (args, word) in &cases {
        let out = run(args);
        assert!(!out.status.success(), "{args:?} should fail");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            err.contains(word),
            "{args:?}: stderr should name `{word}`: {err}"
        );
        assert!(!err.contains("panicked"), "{args:?} panicked: {err}");
    }
    assert_eq!(std::fs::read(format!("{m}/config.json")).unwrap(), before);
    let _ = std::fs::remove_dir_all(&dir);
}

/// A random model with the long suite's tokenizer: the suite is detected, every long task is
/// run, and `--json` carries per-step accuracy and the commit step of every position.
fn random_long_model(name: &str) -> PathBuf {
    use dllm_models::lm::Arch;
    use dllm_tasks::train::{suite_config, ModelShape};
    let dir = std::env::temp_dir().join(format!("eval-cli-long-{}-{name}", std::process::id()));
    let tok = dllm_tasks::tokenizer::build_long_suite_tokenizer().unwrap();
    let shape = ModelShape {
        arch: Arch::Llada,
        hidden: 32,
        layers: 1,
        heads: 2,
        kv_heads: 2,
        ffn: 64,
    };
    let cfg = suite_config(shape, tok.get_vocab_size(true)).unwrap();
    write_hf(&dir, &cfg, &random_weights(&cfg, 3).unwrap(), DType::F32, 1).unwrap();
    dllm_tasks::tokenizer::save(&tok, dir.join("tokenizer.json")).unwrap();
    dir
}

#[test]
fn long_suite_json_has_steps_and_commit_frontier() {
    let dir = random_long_model("json");
    let m = dir.to_str().unwrap();
    let out = run(&[
        "--model",
        m,
        "--limit",
        "2",
        "--gen-length",
        "64",
        "--block-length",
        "32",
        "--no-early-stop",
        "--json",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("one JSON object");
    assert_eq!(v["suite"], "long");
    let names: Vec<&str> = v["tasks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["task"].as_str().unwrap())
        .collect();
    assert_eq!(
        names,
        ["long-math", "long-yesno", "long-choice", "long-story"]
    );
    for t in v["tasks"].as_array().unwrap() {
        let st = t["step_accuracy"]
            .as_f64()
            .expect("worked answers have a step accuracy");
        assert!((0.0..=1.0).contains(&st), "{t}");
        let fs = t["forwards_per_worked_step"]
            .as_f64()
            .expect("worked answers have forwards per step");
        assert!(fs > 0.0 && fs.is_finite(), "{t}");
    }
    let answers = v["answers"].as_array().unwrap();
    assert_eq!(answers.len(), 8);
    for a in answers {
        assert!(a["steps_total"].as_u64().unwrap() >= 6, "{a}");
        let steps: Vec<u64> = a["commit_step"]
            .as_array()
            .unwrap()
            .iter()
            .map(|s| {
                s.as_u64()
                    .expect("no early stop: every position is decoded")
            })
            .collect();
        assert_eq!(steps.len(), 64);
        // One token per step (random weights: nothing reaches a threshold): every position's
        // last commit step is its own, within the answer's forwards.
        let mut sorted = steps.clone();
        sorted.sort();
        sorted.dedup();
        assert_eq!(sorted.len(), 64, "{steps:?}");
        assert!(
            steps.iter().all(|&s| s < a["forwards"].as_u64().unwrap()),
            "{a}"
        );
        // Without remasks the steps are a permutation of the 64 steps and the first block is
        // finished before the second starts (verification may send a token of the first block
        // back during the second: its commit step is then the later one).
        if a["remasks"].as_u64().unwrap() == 0 {
            assert_eq!(sorted, (0..64).collect::<Vec<u64>>());
            assert!(steps[..32].iter().all(|&s| s < 32), "{steps:?}");
        }
    }
    // With threshold decoding several positions share a step, and the early stop leaves
    // positions no step decoded (null) when a block ends in EOS.
    let out = run(&[
        "--model",
        m,
        "--limit",
        "1",
        "--tasks",
        "long-story",
        "--threshold",
        "0.5",
        "--json",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["params"]["gen_length"], 128, "the long suite's default");
    assert_eq!(
        v["answers"][0]["commit_step"].as_array().unwrap().len(),
        128
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn suites_and_tasks_must_match_the_tokenizer() {
    let m = shipped();
    let out = run(&["--model", &m, "--tasks", "long-math"]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("long-math") && err.contains("short suite's tokenizer"),
        "{err}"
    );
    let out = run(&["--model", &m, "--suite", "long"]);
    assert!(String::from_utf8_lossy(&out.stderr).contains("--suite"));
    let out = run(&["--model", &m, "--suite", "medium"]);
    assert!(String::from_utf8_lossy(&out.stderr).contains("medium"));
}

/// The shipped long-suite model: detected as long, decoded with its recommendation (128
/// positions, blocks of 32), and its answers are worked solutions in the suite's format (one
/// `Month: a?b=c` line per month in order, then `Answer: N`) with worked lines that are right:
/// the card measures 85% of lines right on 100 questions (here 8 of 18 on the first two, whose
/// chains break early); the floor only rules out a model that writes the format with wrong numbers
/// (the stage-2 weights this replaced had 0 right lines).
#[test]
fn shipped_long_model_writes_worked_answers() {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../models/tiny-llada-long");
    let out = run(&[
        "--model",
        dir.to_str().unwrap(),
        "--tasks",
        "long-math",
        "--limit",
        "2",
        "--strategy",
        "vanilla",
        "--json",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["suite"], "long");
    assert_eq!(v["params"]["gen_length"], 128);
    assert_eq!(v["params"]["block_length"], 32);
    for a in v["answers"].as_array().unwrap() {
        let response = a["response"].as_str().unwrap();
        let lines: Vec<&str> = response.lines().collect();
        assert!(lines.len() >= 9, "{response}");
        let (last, steps) = lines.split_last().unwrap();
        assert!(last.starts_with("Answer: "), "{response}");
        for (line, month) in steps.iter().zip(dllm_tasks::tasks::long::math::MONTHS) {
            assert!(line.starts_with(&format!("{month}: ")), "{response}");
        }
        // The answer spans several 32-position blocks (one forward per position, early stop
        // after the block that ends in EOS).
        assert!(a["forwards"].as_u64().unwrap() >= 64, "{a}");
        assert_eq!(a["commit_step"].as_array().unwrap().len(), 128);
    }
    let right: u64 = v["answers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a["steps_right"].as_u64().unwrap())
        .sum();
    assert!(right >= 4, "{right} worked lines right in two answers");
}

/// `--oracle-decisions` takes exactly the predictions that are already right: on the tuning
/// set's first 20 long-math questions it answers every one, in fewer forwards than threshold 0.9
/// with the same window, and says in the settings that it ran; it refuses `--probe`.
#[test]
fn oracle_decisions_bound_the_forwards_and_are_labelled() {
    let m = &long_model();
    let eval = |oracle: bool| {
        let mut args = vec!["--strategy", "dual-cache", "--threshold", "0.9"];
        if oracle {
            args.push("--oracle-decisions");
        }
        tuning20(&args)
    };
    let (rule, oracle) = (eval(false), eval(true));
    assert_eq!(rule["params"]["oracle_decisions"], false);
    assert_eq!(oracle["params"]["oracle_decisions"], true);
    let t = |v: &serde_json::Value, k: &str| v["tasks"][0][k].as_f64().unwrap();
    assert_eq!(
        t(&oracle, "final_answer_accuracy"),
        1.0,
        "{}",
        oracle["tasks"]
    );
    assert!(
        t(&oracle, "forwards_per_answer") < t(&rule, "forwards_per_answer") - 1.0,
        "oracle {} vs rule {}",
        oracle["tasks"],
        rule["tasks"]
    );
    let out = run(&["--model", m, "--probe", "--oracle-decisions"]);
    assert!(!out.status.success());
    let e = String::from_utf8_lossy(&out.stderr);
    assert!(
        e.contains("--oracle-decisions") && e.contains("--probe"),
        "{e}"
    );
}

/// D9/D10: `--dump` was checked for writability only after the whole evaluation, decoding flags
/// only after the model was loaded, and `--tasks long-math,long-math` counted every question twice;
/// `--tasks foo` listed only the short suite's tasks. Each is now an error before any work (here
/// with a model directory whose config cannot load: the flag's error comes first).
#[test]
fn flags_and_dump_are_checked_before_any_work() {
    let dir = std::env::temp_dir().join(format!("eval-cli-early-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("config.json"), "{ not json").unwrap();
    let broken = dir.to_str().unwrap();
    let nowhere = dir.join("no/such/dir/answers.jsonl");
    let cases: &[(&[&str], &str)] = &[
        (&["--steps", "0"], "--steps"),
        (
            &["--gen-length", "10", "--block-length", "4"],
            "--gen-length",
        ),
        (&["--strategy", "fastest"], "--strategy"),
        (&["--dump", nowhere.to_str().unwrap()], "--dump"),
        (&["--dump", "/dev/null"], "character device"),
        (&["--tasks", "long-math,long-gsm8k"], "same task"),
        (&["--tasks", "math,math"], "same task"),
        (&["--tokenizer", "/dev/zero"], "character device"),
    ];
    for (args, word) in cases {
        let mut all = vec!["--model", broken];
        all.extend_from_slice(args);
        let out = run(&all);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{args:?} should fail");
        assert!(
            err.contains(word),
            "{args:?}: stderr should name `{word}`: {err}"
        );
        assert!(
            !err.contains("JSON"),
            "{args:?}: checked after loading: {err}"
        );
    }
    let out = run(&["--model", &shipped(), "--tasks", "poetry"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("long-math") && err.contains("math"), "{err}");
    // A dump is written whole, under its name only once the evaluation is done.
    let dump = dir.join("answers.jsonl");
    let out = run(&[
        "--model",
        &shipped(),
        "--tasks",
        "math",
        "--limit",
        "2",
        "--dump",
        dump.to_str().unwrap(),
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(std::fs::read_to_string(&dump).unwrap().lines().count(), 2);
    let leftovers: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.contains(".partial-"))
        .collect();
    assert!(leftovers.is_empty(), "{leftovers:?}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// The shown guess (the LLaDA default): on the tuning set's first 20 long-math questions the
/// default shows guesses, confirms most of them and takes fewer forwards than `--no-show-guess`
/// (the previous default) without losing an answer; the counters say so in `--json`, and a
/// schedule with `--show-guess` is refused by name.
#[test]
fn the_shown_guess_saves_forwards_and_is_counted() {
    let m = &long_model();
    let (on, off) = (tuning20(&[]), tuning20(&["--no-show-guess"]));
    let t = |v: &serde_json::Value, k: &str| v["tasks"][0][k].as_f64().unwrap();
    assert!(t(&on, "guesses_shown") > 20.0, "{}", on["tasks"]);
    assert!(t(&on, "guesses_confirmed") > t(&on, "guesses_shown") / 2.0);
    assert_eq!(t(&off, "guesses_shown"), 0.0);
    assert!(t(&on, "final_answer_accuracy") >= t(&off, "final_answer_accuracy"));
    assert!(
        t(&on, "forwards_per_answer") < t(&off, "forwards_per_answer") - 1.0,
        "{} vs {}",
        t(&on, "forwards_per_answer"),
        t(&off, "forwards_per_answer")
    );
    let out = run(&[
        "--model",
        m,
        "--set",
        "tuning",
        "--limit",
        "1",
        "--no-sts",
        "--steps",
        "128",
        "--show-guess",
    ]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("show_guess") && err.contains("confidence rule"),
        "{err}"
    );
}

#[test]
fn dream_models_decode_with_their_family_defaults() {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../models/tiny-dream-long");
    let m = dir.to_str().unwrap();
    let t = |v: &serde_json::Value, k: &str| v["tasks"][0][k].as_f64().unwrap();
    // No flag: the refresh window, the threshold rule at 0.9, no bucket fit, the shown guess.
    let def = tuning20_on(m, &[]);
    let p = &def["params"];
    assert_eq!(p["threshold"], 0.9, "{p}");
    assert!(
        p["theta_stable"].is_null() && p["tau_back"].is_null(),
        "{p}"
    );
    assert_eq!(
        (
            &p["show_guess"],
            &p["fit_bucket"],
            &p["sliding"],
            &p["refresh"]
        ),
        (
            &serde_json::json!(true),
            &serde_json::json!(false),
            &serde_json::json!(false),
            &serde_json::json!(true)
        ),
        "{p}"
    );
    assert!(t(&def, "guesses_shown") > 20.0, "{}", def["tasks"]);
    // Dream's previous default, spelled out: staged decisions (at the thresholds and without
    // the near wait of the time), bucket fit, no guess.
    let old = tuning20_on(
        m,
        &[
            "--sts",
            "--bucket-fit",
            "--no-show-guess",
            "--theta-stable",
            "0.95",
            "--wait-near",
            "0",
        ],
    );
    let q = &old["params"];
    assert_eq!(
        (&q["theta_stable"], &q["threshold"]),
        (&serde_json::json!(0.95), &serde_json::Value::Null),
        "{q}"
    );
    assert_eq!(
        (&q["show_guess"], &q["fit_bucket"], &q["wait_near"]),
        (
            &serde_json::json!(false),
            &serde_json::json!(true),
            &serde_json::json!(0)
        ),
        "{q}"
    );
    // Dream's default decides by the threshold rule: no near wait.
    assert!(def["params"]["wait_near"].is_null(), "{}", def["params"]);
    assert!(
        t(&def, "forwards_per_answer") < t(&old, "forwards_per_answer") - 1.0,
        "{} vs {}",
        t(&def, "forwards_per_answer"),
        t(&old, "forwards_per_answer")
    );
    // --threshold sets the family rule's threshold; a staged flag asks for staged decisions.
    let thr = tuning20_on(m, &["--threshold", "0.95"]);
    assert_eq!(thr["params"]["threshold"], 0.95, "{}", thr["params"]);
    assert!(thr["params"]["theta_stable"].is_null());
    let staged = tuning20_on(m, &["--theta-stable", "0.97"]);
    assert_eq!(
        staged["params"]["theta_stable"], 0.97,
        "{}",
        staged["params"]
    );
    assert!(staged["params"]["threshold"].is_null());
    // Contradictions are refused by name.
    let out = run(&["--model", m, "--limit", "1", "--sts", "--no-sts"]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("--no-sts"));
}

#[test]
fn first_errors_class_every_wrong_answer() {
    // At threshold 0.5 without the near wait tiny-llada-long decides results beside their
    // masked operands: most of its wrong answers first go wrong there, below 0.9.
    let v = tuning20(&["--threshold", "0.5", "--wait-near", "0", "--first-errors"]);
    let t = &v["tasks"][0];
    let n = t["n"].as_u64().unwrap();
    let wrong = n - (t["final_answer_accuracy"].as_f64().unwrap() * n as f64).round() as u64;
    assert!(
        wrong >= 5,
        "threshold 0.5 should lose answers: {wrong} wrong"
    );
    let rows = t["first_errors"].as_array().expect("first_errors rows");
    assert_eq!(rows.len(), 5);
    let count = |r: &serde_json::Value, k: &str| r[k].as_u64().unwrap();
    let total: u64 = rows.iter().map(|r| count(r, "answers")).sum();
    assert_eq!(total, wrong, "every wrong answer in one class: {rows:?}");
    let masked_low = &rows[1];
    assert_eq!(
        masked_low["class"],
        "left context masked, decided below 0.9"
    );
    assert!(count(masked_low, "answers") * 2 > wrong, "{rows:?}");
    for r in rows {
        assert!(count(r, "after_equals") <= count(r, "answers"));
    }
    // Without the flag the field is null; with --probe the flag is refused.
    let d = tuning20(&[]);
    assert!(d["tasks"][0]["first_errors"].is_null());
    // The defaults as they ran: LLaDA's near wait (8 positions, below 0.975) at theta 0.9 / 0.9,
    // the answer one block with a window of 16.
    let p = &d["params"];
    assert_eq!(
        (&p["span"], &p["block_length"]),
        (&16.into(), &128.into()),
        "{p}"
    );
    assert_eq!(
        (&p["wait_near"], &p["wait_near_below"], &p["theta_stable"]),
        (
            &serde_json::json!(8),
            &serde_json::json!(0.975),
            &serde_json::json!(0.9)
        ),
        "{p}"
    );
    let out = run(&["--model", &long_model(), "--probe", "--first-errors"]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("--probe decodes nothing"));
}
