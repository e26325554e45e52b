//! The `generate` binary: `--json` prints exactly one object with the documented fields, its tokens
//! are the library's (which `llada-tests` checks against LLaDA's official algorithm), and bad input
//! exits non-zero with a message naming the problem.

use std::path::PathBuf;
use std::process::Command;

use candle_core::DType;
use dllm_decode::{DecodeParams, Strategy};
use dllm_models::synthetic::{random_weights, tiny_llada, write_hf};
use dllm_models::{load, LoadOptions, ModelSource};

fn model_dir(tag: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("generate-cli-{tag}-{}", std::process::id()));
    let cfg = tiny_llada();
    write_hf(
        &dir,
        &cfg,
        &random_weights(&cfg, 99).unwrap(),
        DType::F32,
        1,
    )
    .unwrap();
    dir
}

fn run(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_generate"))
        .args(args)
        .output()
        .expect("run generate")
}

/// A short `--json` run of the model in `dir`: 16 positions in blocks of 8 after 4 prompt ids.
fn short_run(dir: &str) -> Vec<&str> {
    vec![
        "--model",
        dir,
        "--prompt-ids",
        "5,6,7,8",
        "--gen-length",
        "16",
        "--block-length",
        "8",
        "--json",
    ]
}

/// `generate` with `base` then `extra` arguments, which must succeed: its `--json` object.
fn run_json(base: &[&str], extra: &[&str]) -> serde_json::Value {
    let out = run(&[base, extra].concat());
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

/// `base` with `extra` must fail, naming `flag`.
fn refused(base: &[&str], extra: &[&str], flag: &str) {
    let out = run(&[base, extra].concat());
    assert!(!out.status.success(), "{extra:?} was accepted");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains(flag), "{extra:?}: {err}");
}

#[test]
fn json_output_matches_the_library() {
    let dir = model_dir("json");
    let d = dir.to_str().unwrap();
    for strategy in ["vanilla", "prefix-cache", "dual-cache", "mbsd"] {
        let mut args = short_run(d);
        args.extend(["--strategy", strategy, "--no-early-stop"]);
        // A step count is a schedule; mbsd's staged stabilization decides by confidence and
        // rejects one (its steps resolve to gen-length, as the library's below).
        if strategy != "mbsd" {
            args.extend(["--steps", "16"]);
        }
        let out = run(&args);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let stdout = String::from_utf8(out.stdout).unwrap();
        assert_eq!(
            stdout.trim().lines().count(),
            1,
            "exactly one line on stdout: {stdout}"
        );
        let v: serde_json::Value = serde_json::from_str(stdout.trim()).unwrap();
        for key in [
            "prompt_ids",
            "generated_ids",
            "text",
            "forwards",
            "steps",
            "elapsed_ms",
            "mean_active_per_forward",
            "drafts",
            "drafts_accepted",
            "drafts_rejected",
            "revised",
            "verified",
            "remasks",
            "flip_flops",
            "logits_rows_skipped",
        ] {
            assert!(v.get(key).is_some(), "missing `{key}` in {v}");
        }
        assert_eq!(v["prompt_ids"], serde_json::json!([5, 6, 7, 8]));
        // The process's peak RSS: at least the weights it loaded, far below the machine.
        let rss = v["peak_rss_bytes"]
            .as_u64()
            .expect("peak_rss_bytes on Linux");
        assert!(rss > 1 << 20 && rss < 1 << 34, "peak_rss_bytes {rss}");
        let ids: Vec<u32> = serde_json::from_value(v["generated_ids"].clone()).unwrap();
        assert_eq!(ids.len(), 16);

        let mut m = load(&ModelSource::parse(d).unwrap(), &LoadOptions::default()).unwrap();
        let p = DecodeParams {
            gen_length: 16,
            block_length: 8,
            steps: 16,
            strategy: strategy.parse::<Strategy>().unwrap(),
            // What the CLI decides with when given no decision flag on a LLaDA model (mbsd:
            // staged decisions).
            decide: strategy.parse::<Strategy>().unwrap().default_decide(false),
            early_stop: false,
            ..Default::default()
        };
        let g = dllm_decode::generate(&mut m.model, &[5, 6, 7, 8], &p, &mut ()).unwrap();
        assert_eq!(ids, g.generated(), "{strategy}");
        assert_eq!(
            v["forwards"].as_u64().unwrap() as usize,
            g.forwards,
            "{strategy}"
        );
        assert_eq!(
            v["drafts"].as_u64().unwrap() as usize,
            g.drafts,
            "{strategy}"
        );
        assert_eq!(
            v["verified"].as_u64().unwrap() as usize,
            g.verified,
            "{strategy}"
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn bad_input_exits_with_a_named_error() {
    let dir = model_dir("bad");
    let d = dir.to_str().unwrap();
    let cases: &[(&[&str], &str)] = &[
        (
            &[
                "--model",
                d,
                "--prompt-ids",
                "1,2",
                "--gen-length",
                "10",
                "--block-length",
                "4",
            ],
            "gen-length",
        ),
        (
            &[
                "--model",
                d,
                "--prompt-ids",
                "1,2",
                "--gen-length",
                "16",
                "--block-length",
                "8",
                "--steps",
                "3",
            ],
            "steps",
        ),
        (
            &["--model", d, "--prompt-ids", "1,2", "--strategy", "fastest"],
            "strategy",
        ),
        (
            &["--model", d, "--prompt-ids", "1,2", "--remasking", "lowest"],
            "remasking",
        ),
        (
            &["--model", d, "--prompt-ids", "1,2", "--threshold", "2"],
            "threshold",
        ),
        (
            &["--model", d, "--prompt-ids", "1,2", "--dtype", "f64"],
            "dtype",
        ),
        (
            &["--model", d, "--prompt-ids", "1,2", "--threads", "0"],
            "threads",
        ),
        (
            &["--model", d, "--prompt-ids", "1,2", "--threads", "10000"],
            "thread count 10000 is outside 1..=256",
        ),
        (&["--model", d, "--prompt", "hello"], "tokenizer"),
        (&["--model", d, "--prompt-ids", "1,255"], "mask token"),
        (&["--model", d], "prompt"),
        (
            &["--model", "/definitely/not/here", "--prompt-ids", "1"],
            "not/here",
        ),
        (
            &["--model-id", "/definitely/not/there", "--prompt-ids", "1"],
            "not/there",
        ),
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

#[test]
fn thread_counts_give_the_same_tokens() {
    // The shipped (embedded) model, which runs the packed f16 kernels; each count in its own
    // process, since thread pools are sized once per process.
    let args = |t: &'static str| {
        [
            "--prompt-ids",
            "10,11,12,13,14,15",
            "--gen-length",
            "32",
            "--block-length",
            "16",
            "--steps",
            "32",
            "--strategy",
            "vanilla",
            "--threads",
            t,
            "--json",
        ]
    };
    let one = generated_ids(&args("1"));
    assert_eq!(one.len(), 32);
    assert_eq!(one, generated_ids(&args("2")));
    assert_eq!(one, generated_ids(&args("3")));
}

fn generated_ids(args: &[&str]) -> Vec<u32> {
    let out = run(args);
    assert!(
        out.status.success(),
        "{args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    serde_json::from_value(v["generated_ids"].clone()).unwrap()
}

#[test]
fn hexagon_json_reports_the_placement_plans_built() {
    let dir = model_dir("plans");
    let d = dir.to_str().unwrap();
    let base = [
        short_run(d),
        vec!["--strategy", "dual-cache", "--no-early-stop"],
    ]
    .concat();
    let json = |extra: &[&str]| run_json(&base, extra);
    // somr (the default): the whole model fits the window, so one plan places every weight
    // resident and stays in force for every forward of every window shape.
    let v = json(&["--device", "hexagon"]);
    assert!(v["forwards"].as_u64().unwrap() > 1, "{v}");
    assert_eq!(v["plans_built"].as_u64(), Some(1), "{v}");
    // Every window here (the 20-position canvas, then blocks of 8 with or without selected
    // rows) fits one 32-row bucket: at most two activation layouts (all rows / selected rows),
    // not one per window size.
    let shape_plans = v["shape_plans_built"].as_u64().unwrap();
    assert!((1..=2).contains(&shape_plans), "{v}");
    // The naive policy maps weights as they come: it builds no plan.
    let v = json(&["--device", "hexagon", "--memory-policy", "naive"]);
    assert_eq!(v["plans_built"].as_u64(), Some(0), "{v}");
    // A CPU run has no device counters at all.
    let v = json(&[]);
    assert!(v.get("plans_built").is_none(), "{v}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// Bytes of the tensors in a safetensors file, from its header (`data_offsets` of each tensor).
fn checkpoint_weight_bytes(path: &std::path::Path) -> u64 {
    let data = std::fs::read(path).unwrap();
    let n = u64::from_le_bytes(data[..8].try_into().unwrap()) as usize;
    let header: serde_json::Value = serde_json::from_slice(&data[8..8 + n]).unwrap();
    header
        .as_object()
        .unwrap()
        .iter()
        .filter(|(k, _)| *k != "__metadata__")
        .map(|(_, t)| {
            let o = t["data_offsets"].as_array().unwrap();
            o[1].as_u64().unwrap() - o[0].as_u64().unwrap()
        })
        .sum()
}

#[test]
fn hexagon_holds_the_weights_once() {
    let model = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../models/tiny-llada-long");
    let ckpt = checkpoint_weight_bytes(&model.join("model.safetensors"));
    let limit = ckpt as f64 * 1.05;
    let base = [
        "--model",
        model.to_str().unwrap(),
        "--prompt",
        "Cara has 4 stickers. In January she buys 2 more. How many stickers does Cara have at the end?",
        "--gen-length",
        "16",
        "--block-length",
        "8",
        "--json",
    ];
    let json = |extra: &[&str]| run_json(&base, extra);
    let field =
        |v: &serde_json::Value, k: &str| v[k].as_u64().unwrap_or_else(|| panic!("{k}: {v}"));
    for policy in ["somr", "naive", "paging"] {
        let v = json(&["--device", "hexagon", "--memory-policy", policy]);
        let (host, shared, npu) = (
            field(&v, "host_weight_bytes"),
            field(&v, "shared_weight_bytes"),
            field(&v, "npu_weight_bytes"),
        );
        // The NPU module holds the blocks and the head: most of the checkpoint.
        assert!(shared as f64 > 0.5 * ckpt as f64, "{policy}: {v}");
        assert!((host + npu) as f64 <= limit, "{policy}: {v}");
        assert_eq!(
            host, 0,
            "{policy}: the emulated DSP maps shared memory: {v}"
        );
        // Every weight mapped in place (paging's on-demand mappings too: each miss maps the
        // weight's range of the weight file, no copy): everything held is held once.
        assert_eq!(npu, 0, "{policy}: {v}");
        assert!((host + shared + npu) as f64 <= limit, "{policy}: {v}");
    }
    // A CPU run has no device counters at all.
    let v = json(&[]);
    assert!(v.get("shared_weight_bytes").is_none(), "{v}");
    assert!(v.get("npu_weight_bytes").is_none(), "{v}");
}

#[test]
fn hexagon_device_gives_the_cpu_tokens_and_prints_the_routing_report() {
    let dir = model_dir("hexagon");
    let d = dir.to_str().unwrap();
    let base = [
        "--model",
        d,
        "--prompt-ids",
        "5,6,7,8",
        "--gen-length",
        "16",
        "--block-length",
        "8",
        "--steps",
        "16",
        "--strategy",
        "prefix-cache",
        "--no-early-stop",
    ];
    let with = |extra: &[&'static str]| -> Vec<&str> {
        base.iter().copied().chain(extra.iter().copied()).collect()
    };
    let cpu = generated_ids(&with(&["--json"]));
    let hex = generated_ids(&with(&["--device", "hexagon", "--json"]));
    // fp16 weights on the NPU move logits by ~3e-3 on this model; no decision of this run is that
    // close (the near-tie rule itself is tested in tests/tests/it/hexagon.rs).
    assert_eq!(cpu, hex);
    let shim = generated_ids(&with(&[
        "--device",
        "hexagon",
        "--hexagon-transport",
        "fastrpc",
        "--fastrpc-lib",
        "shim",
        "--json",
    ]));
    assert_eq!(
        shim, hex,
        "FastRPC shim and emulated DSP run the same kernels"
    );

    let out = run(&with(&["--device", "hexagon", "--no-live"]));
    assert!(out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("Hexagon routing report"), "{err}");
    // The whole transformer as one module, one DSP batch per block.
    assert!(err.contains("| block | npu (hmx) |"), "{err}");
    let json = run(&with(&["--device", "hexagon", "--json"]));
    let v: serde_json::Value =
        serde_json::from_str(String::from_utf8_lossy(&json.stdout).trim()).unwrap();
    let (batches, forwards) = (
        v["dsp_batches"].as_u64().unwrap(),
        v["forwards"].as_u64().unwrap(),
    );
    // The model has 2 blocks: at most one batch per block per forward.
    assert_eq!(batches, 2 * forwards, "{v}");
    // The NPU computes in fp16, the CPU layers in --dtype's f32: both reported.
    assert_eq!(
        (&v["dtype"], &v["npu_dtype"]),
        (&"f32".into(), &"f16".into())
    );
    assert!(v["bytes_staged"].as_u64().unwrap() > 0);
    // The per-op path when the block module is denied.
    let out = run(&with(&[
        "--device",
        "hexagon",
        "--hexagon-deny",
        "block",
        "--no-live",
    ]));
    assert!(out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("| block | cpu (denied) |"), "{err}");
    assert!(err.contains("| flash_attn | npu (hvx) |"), "{err}");
    assert!(err.contains("| linear_f16 | npu (hmx) |"), "{err}");

    for (args, word) in [
        (with(&["--device", "gpu"]), "--device"),
        (
            with(&["--device", "hexagon", "--hexagon-deny", "matmul"]),
            "--hexagon-deny",
        ),
        (
            with(&["--device", "hexagon", "--hexagon-workers", "0"]),
            "workers",
        ),
        (
            with(&[
                "--device",
                "hexagon",
                "--hexagon-transport",
                "fastrpc",
                "--fastrpc-lib",
                "/no/libcdsprpc.so",
            ]),
            "/no/libcdsprpc.so",
        ),
    ] {
        let out = run(&args);
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

/// With no `--model`, the embedded tiny-llada answers held-out task-suite questions in real text.
#[test]
fn embedded_model_answers_held_out_questions() {
    use dllm_tasks::eval::questions;
    use dllm_tasks::tasks::check;
    use dllm_tasks::TaskKind;
    for ex in questions(&TaskKind::ALL, Some(2)) {
        let out = run(&["--prompt", &ex.prompt, "--json"]);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        let text = v["text"].as_str().unwrap();
        assert!(
            check(&ex, text).final_answer,
            "{}: `{}` answered `{text}` (expected `{}`)",
            ex.kind.name(),
            ex.prompt,
            ex.response
        );
    }
}

/// D9/D10: every flag is checked before anything is opened or loaded (with a model that does not
/// exist, the error is still the flag's), and settings that used to be accepted and ignored or
/// overflow are errors naming the flag.
#[test]
fn flags_are_checked_first_and_ignored_settings_are_errors() {
    let nowhere = "/definitely/not/a/model";
    let cases: &[(&[&str], &str)] = &[
        (&["--steps", "0"], "--steps"),
        (
            &["--gen-length", "10", "--block-length", "4"],
            "--gen-length",
        ),
        (&["--temperature", "1e38"], "--temperature"),
        (&["--cfg-scale", "1e38"], "--cfg-scale"),
        (&["--memory-policy", "paging"], "--memory-policy"),
        (&["--hexagon-window", "64"], "--hexagon-window"),
        (&["--device", "hexagon", "--dtype", "bf16"], "fp16"),
        (
            &["--device", "hexagon", "--hexagon-window", "0"],
            "--hexagon-window",
        ),
        (
            &[
                "--strategy",
                "mbsd",
                "--threshold",
                "0.9",
                "--theta-visible",
                "0.8",
            ],
            "give either --threshold or the thetas",
        ),
        (&["--threshold", "1.5"], "`--threshold`: 1.5"),
        // Staged decisions are the default on LLaDA models only (known once the model loads):
        // asked for, they are checked first.
        (
            &["--sts", "--steps", "24"],
            "`--steps`: with staged decisions",
        ),
        (&["--latency-table", "/dev/zero"], "--latency-table"),
        (
            &["--strategy", "mbsd", "--latency-table", "/dev/zero"],
            "character device",
        ),
        (&["--tokenizer", "/dev/zero"], "character device"),
        (&["--kv-dtype", "q8_0"], "--kv-dtype: `q8_0`"),
        (
            &["--device", "hexagon", "--kv-dtype", "f32"],
            "--kv-dtype f32",
        ),
    ];
    for (args, word) in cases {
        let mut all = vec!["--model", nowhere, "--prompt", "hello"];
        all.extend_from_slice(args);
        let out = run(&all);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{args:?} should fail");
        assert!(
            err.contains(word),
            "{args:?}: stderr should name `{word}`: {err}"
        );
        assert!(
            !err.contains("definitely"),
            "{args:?}: checked after the model: {err}"
        );
        assert!(!err.contains("turn --no-sts off"), "{err}");
    }
}

/// Messages that misled: a device, a FIFO or a symlink loop as `--model` was "no such directory
/// or file"; a large latency table is refused by size, not read into memory.
#[test]
fn model_paths_say_what_they_are() {
    let dir = std::env::temp_dir().join(format!("generate-cli-paths-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let looped = dir.join("loop");
    std::os::unix::fs::symlink(&looped, &looped).unwrap();
    let fifo = dir.join("fifo");
    let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
    // SAFETY: a NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o644) }, 0);
    let big = dir.join("big.json");
    std::fs::File::create(&big)
        .unwrap()
        .set_len(1 << 30)
        .unwrap();
    for (args, word) in [
        (vec!["--model", "/dev/zero"], "character device"),
        (vec!["--model", looped.to_str().unwrap()], "symlink loop"),
        (vec!["--model", fifo.to_str().unwrap()], "FIFO"),
        (
            vec![
                "--strategy",
                "mbsd",
                "--latency-table",
                fifo.to_str().unwrap(),
            ],
            "FIFO",
        ),
        (
            vec![
                "--strategy",
                "mbsd",
                "--latency-table",
                big.to_str().unwrap(),
            ],
            "byte limit",
        ),
    ] {
        let mut all = vec!["--prompt-ids", "1,2"];
        all.extend_from_slice(&args);
        let out = run(&all);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{args:?} should fail");
        assert!(
            err.contains(word),
            "{args:?}: stderr should name `{word}`: {err}"
        );
        assert!(!err.contains("no such directory"), "{args:?}: {err}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// Special-token text typed in a prompt (`[MASK]`, `<eos>`, `<sep>`) is text, never the control
/// ids: `[MASK]` used to make generation fail. The embedded model's tokenizer adds exactly one
/// BOS and one SEP around the prompt, and no mask or EOS id comes from the user's text.
#[test]
fn special_token_text_in_a_prompt_is_text() {
    use dllm_tasks::tokenizer::{BOS_ID, EOS_ID, MASK_ID, SEP_ID};
    let out = run(&[
        "--prompt",
        "Tom has [MASK] apples. <eos> He buys 5 more. <sep> How many apples does Tom have now?",
        "--json",
    ]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let ids: Vec<u32> = serde_json::from_value(v["prompt_ids"].clone()).unwrap();
    let count = |id: u32| ids.iter().filter(|&&x| x == id).count();
    assert_eq!(
        (count(BOS_ID), count(SEP_ID), count(MASK_ID), count(EOS_ID)),
        (1, 1, 0, 0),
        "{ids:?}"
    );
    assert_eq!(v["dtype"], "f32");
    assert!(v["npu_dtype"].is_null());
}

#[test]
fn the_kv_cache_dtype_is_a_flag_and_reported() {
    let dir = model_dir("kvdtype");
    let d = dir.to_str().unwrap();
    let base = short_run(d);
    let v = run_json(&base, &[]);
    assert_eq!(v["kv_dtype"], "f32", "{v}");
    let v = run_json(&base, &["--kv-dtype", "f16"]);
    assert_eq!(v["kv_dtype"], "f16", "{v}");
    assert_eq!(v["dtype"], "f32", "{v}");
    let v = run_json(&base, &["--device", "hexagon"]);
    assert_eq!(v["kv_dtype"], "f16", "the NPU's cache: {v}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn json_reports_the_guess_fitted_in_the_bucket_and_refuses_it_without_a_guess() {
    let dir = model_dir("fit-guess");
    let d = dir.to_str().unwrap();
    let base = short_run(d);
    // On by default with LLaDA's span; off without a span or when asked.
    let v = run_json(&base, &[]);
    assert_eq!(
        (&v["fit_guess"], &v["fit_bucket"]),
        (&serde_json::json!(true), &serde_json::json!(true)),
        "{v}"
    );
    for off in [
        &["--no-span"][..],
        &["--no-fit-guess"][..],
        &["--no-show-guess"][..],
    ] {
        let v = run_json(&base, off);
        assert_eq!(v["fit_guess"], false, "{off:?}: {v}");
    }
    let v = run_json(&base, &["--no-span", "--fit-guess"]);
    assert_eq!(v["fit_guess"], true, "{v}");
    // Without the guess or the bucket fit there is nothing to fit: refused by the flag's name.
    for bad in [
        &["--fit-guess", "--no-show-guess"][..],
        &["--fit-guess", "--no-bucket-fit"][..],
        &["--fit-guess", "--strategy", "dual-cache"][..],
    ] {
        refused(&base, bad, "--fit-guess");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn json_reports_the_span_and_refuses_zero_or_another_strategy() {
    let dir = model_dir("span");
    let d = dir.to_str().unwrap();
    let base = short_run(d);
    // LLaDA's default is a span of 16; without --block-length the answer is then one block.
    let v = run_json(&base, &[]);
    assert_eq!(v["span"], 16, "{v}");
    assert_eq!(v["block_length"], 8, "asked for: {v}");
    let unblocked: Vec<&str> = base
        .iter()
        .copied()
        .filter(|a| !["--block-length", "8"].contains(a))
        .map(|a| if a == "16" { "64" } else { a })
        .collect();
    let v = run_json(&unblocked, &[]);
    assert_eq!(
        (&v["span"], &v["block_length"]),
        (&16.into(), &64.into()),
        "{v}"
    );
    let v = run_json(&unblocked, &["--no-span"]);
    assert_eq!(v["span"], serde_json::Value::Null, "{v}");
    assert_eq!(v["block_length"], 32, "blocks of 32 without the span: {v}");
    let v = run_json(&base, &["--span", "4"]);
    assert_eq!(v["span"], 4, "{v}");
    for (bad, flag) in [
        (&["--span", "0"][..], "--span"),
        (&["--span", "4", "--strategy", "dual-cache"][..], "--span"),
        (&["--no-span", "--strategy", "dual-cache"][..], "--no-span"),
        (&["--span", "4", "--no-span"][..], "--no-span"),
    ] {
        refused(&base, bad, flag);
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn json_reports_the_near_wait_and_refuses_a_contradiction() {
    let dir = model_dir("near-wait");
    let d = dir.to_str().unwrap();
    let base = short_run(d);
    // LLaDA's default: staged decisions at theta 0.9 / 0.9 with the near wait.
    let v = run_json(&base, &[]);
    assert_eq!(
        (&v["wait_near"], &v["wait_near_below"], &v["theta_stable"]),
        (
            &serde_json::json!(8),
            &serde_json::json!(0.975),
            &serde_json::json!(0.9)
        ),
        "{v}"
    );
    let v = run_json(&base, &["--wait-near", "3", "--wait-near-below", "0.99"]);
    assert_eq!(
        (&v["wait_near"], &v["wait_near_below"]),
        (&serde_json::json!(3), &serde_json::json!(0.99)),
        "{v}"
    );
    let v = run_json(&base, &["--wait-near", "0"]);
    assert_eq!(v["wait_near"], 0, "{v}");
    assert!(v["wait_near_below"].is_null(), "{v}");
    // A confidence for a wait that is off, or out of range, is refused by its flag's name.
    for bad in [
        &["--wait-near", "0", "--wait-near-below", "0.9"][..],
        &["--wait-near-below", "1.5"][..],
    ] {
        refused(&base, bad, "--wait-near-below");
    }
    let _ = std::fs::remove_dir_all(&dir);
}
