//! The bench on a random long-suite model with two prompts: every file is written, and each
//! ablation row's switch changes what runs (the device, the windows, drafts, stabilization,
//! skipped logits, refreshes), not only its label.

use std::path::Path;
use std::process::Command;

use candle_core::DType;
use dllm_models::lm::Arch;
use dllm_models::synthetic::{random_weights, write_hf};
use dllm_tasks::train::{suite_config, ModelShape};
use serde_json::Value;

fn random_long_model(dir: &Path) {
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
    write_hf(dir, &cfg, &random_weights(&cfg, 7).unwrap(), DType::F32, 1).unwrap();
    dllm_tasks::tokenizer::save(&tok, dir.join("tokenizer.json")).unwrap();
}

fn num(row: &Value, key: &str) -> f64 {
    row[key]
        .as_f64()
        .unwrap_or_else(|| panic!("{}: no counter `{key}` in {row}", row["label"]))
}

#[test]
fn quick_run_writes_every_file_and_each_switch_changes_the_run() {
    let base = std::env::temp_dir().join(format!("bench-quick-{}", std::process::id()));
    let model = base.join("model");
    let out = base.join("out");
    random_long_model(&model);
    let o = Command::new(env!("CARGO_BIN_EXE_bench"))
        .args([
            "--quick",
            "--model",
            model.to_str().unwrap(),
            "--out",
            out.to_str().unwrap(),
        ])
        .args([
            "--gen-length",
            "64",
            "--block-length",
            "32",
            "--threads",
            "1",
        ])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{stderr}");
    for f in [
        "table6.md",
        "table5.md",
        "sweeps.md",
        "results.json",
        "active_per_forward.svg",
        "commit_frontier.svg",
        "latency.svg",
    ] {
        let text = std::fs::read_to_string(out.join(f)).unwrap_or_else(|e| panic!("{f}: {e}"));
        assert!(text.len() > 200, "{f} is nearly empty");
        if f.ends_with(".svg") {
            assert!(text.contains("<svg"), "{f} is not an SVG");
        }
    }
    let r: Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("results.json")).unwrap()).unwrap();
    let rows = r["rows"].as_array().unwrap();
    let labels: Vec<&str> = rows.iter().map(|x| x["label"].as_str().unwrap()).collect();
    assert_eq!(
        labels,
        [
            "CPU",
            "CPU + prefix KV cache",
            "NPU",
            "NPU + prefix KV cache",
            "+ SOMR",
            "+ MBSD",
            "+ STS",
            "+ SLS",
            "+ verification"
        ]
    );
    let row = |l: &str| &rows[labels.iter().position(|x| *x == l).unwrap()];
    for x in rows {
        assert_eq!(num(x, "answers"), 2.0, "{}", x["label"]);
        assert!(num(x, "forwards") > 0.0);
        assert!(x["failed"].is_null(), "{}", x["failed"]);
        assert_eq!(x["energy"], "unavailable", "no battery on a build machine");
    }
    // The device switch: CPU rows report no DSP work, NPU rows do.
    for l in ["CPU", "CPU + prefix KV cache"] {
        assert!(row(l).get("dsp_batches").is_none(), "{l}");
    }
    for l in ["NPU", "NPU + prefix KV cache", "+ SOMR", "+ verification"] {
        assert!(num(row(l), "dsp_batches") > 0.0, "{l}");
        assert!(num(row(l), "bytes_staged") > 0.0, "{l}");
    }
    assert_eq!(row("NPU")["switches"]["memory_policy"], "paging");
    assert_eq!(row("+ SOMR")["switches"]["memory_policy"], "somr");
    // The prefix cache shrinks the forwarded window.
    for (v, p) in [
        ("CPU", "CPU + prefix KV cache"),
        ("NPU", "NPU + prefix KV cache"),
    ] {
        assert!(
            num(row(p), "mean_window_per_forward") < num(row(v), "mean_window_per_forward"),
            "{p} vs {v}"
        );
    }
    // MBSD predicts draft tokens in future blocks; the prefix-cache decoder never does.
    assert_eq!(num(row("+ SOMR"), "draft_predictions"), 0.0);
    assert!(num(row("+ MBSD"), "draft_predictions") > 0.0);
    // STS leaves a random model's low-confidence tokens visible but unstable at block ends.
    assert_eq!(num(row("+ MBSD"), "unstable_at_block_end"), 0.0);
    assert!(num(row("+ STS"), "unstable_at_block_end") > 0.0);
    // Each row computes what its algorithm computes: logits for every window row until `+ SLS`.
    for l in &labels[..7] {
        assert_eq!(num(row(l), "logits_rows_skipped"), 0.0, "{l}");
        assert_eq!(row(l)["switches"]["sls"], false, "{l}");
    }
    assert!(num(row("+ SLS"), "logits_rows_skipped") > 0.0);
    // MBSD's window looks ahead late in a block (the positions are counted).
    assert!(num(row("+ MBSD"), "lookahead_positions") > 0.0);
    assert_eq!(num(row("+ SOMR"), "lookahead_positions"), 0.0);
    // Verification looks at tentative tokens with shadow rows.
    assert_eq!(num(row("+ SLS"), "verified"), 0.0);
    assert!(num(row("+ verification"), "verified") > 0.0);
    // The sweeps ran their points.
    assert_eq!(
        r["sweeps"]["lookahead_trigger"].as_array().unwrap().len(),
        2
    );
    assert_eq!(r["sweeps"]["thresholds"].as_array().unwrap().len(), 2);
    assert!(!r["sweeps"]["npu_window"].as_array().unwrap().is_empty());
    let _ = std::fs::remove_dir_all(&base);
}

#[test]
fn pareto_writes_both_sets_with_statistics_counters_strategies_and_contributions() {
    let base = std::env::temp_dir().join(format!("bench-pareto-{}", std::process::id()));
    let model = base.join("model");
    let out = base.join("out");
    random_long_model(&model);
    let o = Command::new(env!("CARGO_BIN_EXE_bench"))
        .args(["--pareto", "--quick", "--oracle-revision", "--threads", "1"])
        .args([
            "--model",
            model.to_str().unwrap(),
            "--out",
            out.to_str().unwrap(),
        ])
        .args(["--gen-length", "64", "--block-length", "32"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{stderr}");
    assert!(stderr.contains("answers"), "no estimate printed: {stderr}");
    let md = std::fs::read_to_string(out.join("pareto.md")).unwrap();
    for want in [
        "the fresh3 set chose nothing",
        "## The tuning set",
        "## The confirmation set",
        "## The fresh2 set",
        "## The fresh3 set",
        "| mbsd (defaults) |",
        "Wilson 95%",
        "vs vanilla: b / c, p",
        "### Forwards per 128 tokens at ≤ 1 point loss, per strategy",
        "| mbsd, verification on |",
        "## What each mechanism contributes to the headlines",
        "| selective logits skipping |",
        "extrapolated %",
        " †",
        "Projection check",
    ] {
        assert!(md.contains(want), "pareto.md lacks `{want}`:\n{md}");
    }
    let svg = std::fs::read_to_string(out.join("pareto.svg")).unwrap();
    for want in [
        "<svg",
        "frontier",
        "verification on",
        "verification off",
        "extrapolated",
        "confirmation set",
        "tuning set",
    ] {
        assert!(svg.contains(want), "pareto.svg lacks `{want}`");
    }
    let j: Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("pareto.json")).unwrap()).unwrap();
    assert!(j["note"]
        .as_str()
        .unwrap()
        .contains("the fresh3 set chose nothing"));
    assert_eq!(j["projection"]["logits_on"], "cpu");
    assert_eq!(j["projection"]["contention"], 0.98);
    for set in ["tuning", "confirmation", "fresh", "fresh2", "fresh3"] {
        let s = &j["sets"][set];
        assert_eq!(s["questions"], 2, "{set}");
        let pts = s["points"]
            .as_array()
            .unwrap_or_else(|| panic!("{set}: {j}"));
        assert_eq!(pts.len(), 6, "{set}: {s}");
        let point = |l: &str| {
            pts.iter()
                .find(|p| p["label"] == l)
                .unwrap_or_else(|| panic!("{set}: no {l}"))
        };
        for p in pts {
            let acc = num(p, "accuracy");
            let w = p["wilson_95"].as_array().unwrap();
            let (lo, hi) = (w[0].as_f64().unwrap(), w[1].as_f64().unwrap());
            assert!(
                0.0 <= lo && lo <= acc && acc <= hi && hi <= 1.0 && lo < hi,
                "{set} {}: {lo} {acc} {hi}",
                p["label"]
            );
            for reference in ["vanilla", "vanilla, threshold 0.9"] {
                let m = &p["mcnemar"][reference];
                let pv = num(m, "p");
                assert!((0.0..=1.0).contains(&pv), "{m}");
                assert!(num(m, "b") + num(m, "c") <= num(p, "answers"), "{m}");
            }
            // The verification counters, checked against the reference.
            assert!(num(p, "remasks_wrong") <= num(p, "remasks"));
            assert!(num(p, "drafts_wrong") <= num(p, "drafts_taken"));
            assert!(p.get("revision_precision").is_some() && p.get("verified").is_some());
            match p["revision_precision"].as_f64() {
                Some(r) => assert!((0.0..=1.0).contains(&r) && num(p, "remasks") > 0.0),
                None => assert_eq!(num(p, "remasks"), 0.0),
            }
            assert_eq!(p["correct"].as_array().unwrap().len(), 2);
            let ex = num(p, "extrapolated_fraction");
            assert!((0.0..=1.0).contains(&ex));
            assert!(
                num(p, "projected_s_per_answer") > 0.0 && num(p, "cpu_wall_ms_per_answer") > 0.0
            );
        }
        // A reference against itself has no discordant question.
        let v = &point("vanilla")["mcnemar"]["vanilla"];
        assert_eq!((num(v, "b"), num(v, "c"), num(v, "p")), (0.0, 0.0, 1.0));
        // Every vanilla forward holds prompt + 64 positions, past the measured 128.
        assert_eq!(num(point("vanilla"), "extrapolated_fraction"), 1.0);
        // Verification looks at tentative tokens; without it nothing is verified.
        assert!(num(point("mbsd (defaults)"), "verified") > 0.0, "{set}");
        assert_eq!(
            num(point("mbsd, no verification (--no-verify)"), "verified"),
            0.0
        );
        assert_eq!(
            num(point("mbsd, no verification (--no-verify)"), "remasks"),
            0.0
        );
        let oracle: Vec<&Value> = pts
            .iter()
            .filter(|p| p["switches"]["oracle_revision"] == true)
            .collect();
        assert_eq!(oracle.len(), 1);
        assert_eq!(
            oracle[0]["frontier_projected"], false,
            "an oracle is never on the frontier"
        );
        assert!(oracle[0]["family"].is_null());
        assert!(pts.iter().any(|p| p["frontier_projected"] == true));
        let strategies = s["per_strategy"].as_array().unwrap();
        let names: Vec<&str> = strategies
            .iter()
            .map(|x| x["strategy"].as_str().unwrap())
            .collect();
        assert_eq!(
            names,
            [
                "vanilla (+ thresholds)",
                "prefix-cache",
                "dual-cache (+ thresholds)",
                "mbsd, verification on",
                "mbsd, verification off"
            ]
        );
        // The vanilla family always qualifies (vanilla is its own bar); prefix-cache is not run.
        assert!(num(&strategies[0], "forwards_per_128_tokens") > 0.0);
        assert!(strategies[1]["label"].is_null());
    }
    let c = j["contributions"].as_array().unwrap();
    assert!(!c.is_empty());
    assert_eq!(c[0]["headline"], "mbsd (defaults)");
    let off: Vec<&str> = c[0]["off"]
        .as_array()
        .unwrap()
        .iter()
        .map(|o| o["mechanism"].as_str().unwrap())
        .collect();
    assert_eq!(
        off,
        [
            "lookahead (switched on)",
            "span",
            "sliding",
            "shown guess",
            "guess's rows in the bucket",
            "bucket fit",
            "adjacency rule",
            "left wait",
            "near wait",
            "joint check",
            "verification",
            "staged decisions",
            "selective logits skipping"
        ]
    );
    for o in c[0]["off"].as_array().unwrap() {
        // Verification off is one of the run's configurations; the rest were run for the table.
        assert_eq!(
            o["added_for_this_table"],
            o["mechanism"] != "verification",
            "{o}"
        );
        for set in ["tuning", "confirmation", "fresh", "fresh2", "fresh3"] {
            assert!(
                num(&o["numbers"][set], "projected_s_per_answer") > 0.0,
                "{o}"
            );
        }
    }
    // Without selective logits every window row's logits are priced on the CPU: slower.
    let sls = &c[0]["off"]
        .as_array()
        .unwrap()
        .iter()
        .find(|o| o["mechanism"] == "selective logits skipping")
        .unwrap()["numbers"]["tuning"];
    assert!(
        num(sls, "projected_s_per_answer")
            > num(&c[0]["numbers"]["tuning"], "projected_s_per_answer")
    );
    // A filter that matches nothing is an error, not an empty picture.
    let o = Command::new(env!("CARGO_BIN_EXE_bench"))
        .args([
            "--pareto",
            "--quick",
            "--only",
            "no such row",
            "--threads",
            "1",
        ])
        .args([
            "--model",
            model.to_str().unwrap(),
            "--out",
            out.to_str().unwrap(),
        ])
        .output()
        .unwrap();
    assert!(!o.status.success());
    assert!(String::from_utf8_lossy(&o.stderr).contains("--only"));
    // One set, one exact label (which contains commas): one point, no contributions.
    let one = base.join("one");
    let o = Command::new(env!("CARGO_BIN_EXE_bench"))
        .args([
            "--pareto",
            "--quick",
            "--threads",
            "1",
            "--sets",
            "confirmation",
        ])
        .args(["--only", "vanilla, threshold 0.9"])
        .args([
            "--model",
            model.to_str().unwrap(),
            "--out",
            one.to_str().unwrap(),
        ])
        .args(["--gen-length", "64", "--block-length", "32"])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let j: Value =
        serde_json::from_str(&std::fs::read_to_string(one.join("pareto.json")).unwrap()).unwrap();
    assert!(j["sets"].get("tuning").is_none());
    let pts = j["sets"]["confirmation"]["points"].as_array().unwrap();
    assert_eq!(pts.len(), 1);
    assert_eq!(pts[0]["label"], "vanilla, threshold 0.9");
    assert!(
        pts[0]["mcnemar"]["vanilla"].is_null(),
        "vanilla did not run"
    );
    assert!(j["sets"]["confirmation"]["per_strategy"].is_null());
    assert!(j["contributions"].as_array().unwrap().is_empty());
    let _ = std::fs::remove_dir_all(&base);
}

fn bench(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_bench"))
        .args(args)
        .output()
        .unwrap()
}

/// D8: flags used to be checked when a row needed them (`--hexagon-window 0` after the CPU rows,
/// `--theta-visible NaN` after a minute, named `revision.theta_visible`), and `--prompts 0`
/// silently became 1. They are now checked before anything is loaded: with a model that does not
/// exist, the error is still the flag's.
#[test]
fn flags_are_checked_before_any_work() {
    let out = std::env::temp_dir().join(format!("bench-flags-{}", std::process::id()));
    let o = out.to_str().unwrap();
    for (args, word) in [
        (&["--hexagon-window", "0"][..], "--hexagon-window"),
        (&["--theta-visible", "NaN"][..], "--theta-visible"),
        (&["--theta-visible", "0.99"][..], "--theta-visible"),
        (&["--prompts", "0"][..], "--prompts"),
        (&["--hexagon-workers", "0"][..], "--hexagon-workers"),
        (&["--block-length", "7"][..], "--block-length"),
        (&["--pareto", "--contention", "0"][..], "--contention"),
        (&["--pareto", "--contention", "1.5"][..], "--contention"),
        (&["--pareto", "--sets", "tuning,tuning"][..], "--sets"),
        (&["--pareto", "--sets", "training"][..], "--sets"),
        (
            &["--pareto", "--pareto-questions", "0"][..],
            "--pareto-questions",
        ),
        (&["--pareto", "--logits-on", "gpu"][..], "--logits-on"),
        (&["--sets", "tuning"][..], "--pareto"),
    ] {
        let mut all = vec!["--model", "/definitely/not/a/model", "--out", o];
        all.extend_from_slice(args);
        let r = bench(&all);
        let err = String::from_utf8_lossy(&r.stderr);
        assert!(!r.status.success(), "{args:?} should fail");
        assert!(
            err.contains(word),
            "{args:?}: stderr should name `{word}`: {err}"
        );
        assert!(
            !err.contains("definitely"),
            "{args:?}: checked after the model: {err}"
        );
    }
    assert!(
        !out.exists(),
        "nothing is written before the flags are checked"
    );
}

/// D8: a run whose rows all failed used to exit 0 and write `results.json`. Every row failing
/// (prompts longer than the model's context) is now an error naming the rows, with no report.
#[test]
fn failed_rows_fail_the_run_and_are_named() {
    let base = std::env::temp_dir().join(format!("bench-fail-{}", std::process::id()));
    let model = base.join("model");
    let out = base.join("out");
    random_long_model(&model);
    let cfg_path = model.join("config.json");
    let mut cfg: Value = serde_json::from_slice(&std::fs::read(&cfg_path).unwrap()).unwrap();
    cfg["max_sequence_length"] = serde_json::json!(64);
    std::fs::write(&cfg_path, cfg.to_string()).unwrap();
    let o = bench(&[
        "--quick",
        "--no-sweeps",
        "--model",
        model.to_str().unwrap(),
        "--out",
        out.to_str().unwrap(),
        "--gen-length",
        "32",
        "--block-length",
        "32",
        "--threads",
        "1",
    ]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success(), "every row failed, yet exit 0: {err}");
    assert!(
        err.contains("row(s) failed") && err.contains("`CPU`"),
        "{err}"
    );
    assert!(!out.join("results.json").exists(), "a report of nothing");
    let _ = std::fs::remove_dir_all(&base);
}
