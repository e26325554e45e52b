//! The serving engine: concurrent requests of mixed prompt lengths and strategies share forwards
//! and each gets exactly its solo answer (`dllm_decode::generate` on the same prompt and
//! parameters); `/metrics` is Prometheus text; `--max-batch-rows 1` runs one sequence per forward;
//! clients that hang up mid-stream free their sequences and disturb no one else.

use crate::common;

use std::collections::{BTreeMap, HashMap};
use std::io::{BufRead, BufReader, Write};
use std::sync::Arc;

use clap::Parser;
use common::{connect, request_head, Server};
use dllm_decode::{Control, StepEvent};
use dllm_models::{load, DiffusionLm, LoadOptions, ModelSource, TextTokenizer};
use dllm_tasks::tasks::{test_set, TaskKind};
use serde_json::{json, Value};

/// The server's decoding flags, parsed as the server parses them.
#[derive(Parser)]
struct Flags {
    #[command(flatten)]
    decode: llada_cli::DecodeArgs,
}

/// One request of a workload: a prompt and the request fields that set its decoding.
#[derive(Clone, Debug)]
struct Case {
    prompt: String,
    /// `None`: the server's default strategy (mbsd).
    strategy: Option<&'static str>,
    threshold: Option<f32>,
}

impl Case {
    fn body(&self, stream: bool) -> Value {
        let mut b = json!({"prompt": self.prompt, "stream": stream});
        if let Some(s) = self.strategy {
            b["strategy"] = json!(s);
        }
        if let Some(t) = self.threshold {
            b["threshold"] = json!(t);
        }
        b
    }
}

/// What the library gives a case alone: the text, the forwards and the steps, decoded as the
/// server decodes (the defaults of the server's flags over the checkpoint's, the request's
/// fields over them; stopped as soon as the final prefix holds a stop id).
struct Solo {
    text: String,
    forwards: u64,
    steps: u64,
}

fn solo_answers(model: &str, cases: &[Case]) -> Vec<Solo> {
    let loaded =
        load(&ModelSource::parse(model).unwrap(), &LoadOptions::default()).expect("the model");
    let tok = loaded.tokenizer.clone().expect("a tokenizer");
    let stop = loaded.model.info().special.stop_ids();
    cases
        .iter()
        .map(|c| {
            let mut a = Flags::parse_from(["server"]).decode;
            if let Some(s) = c.strategy {
                a.strategy = s.to_string();
            }
            a.threshold = c.threshold;
            let p = a
                .resolve(&loaded.defaults, loaded.model.info().shift_logits)
                .expect("parameters");
            let ids = tok.encode_prompt(&c.prompt, false).unwrap();
            let mut model = loaded.model.new_sequence().unwrap();
            let mut until_stop = |e: &StepEvent<'_>| {
                let fin = &e.canvas[e.prompt_len..e.prompt_len + e.final_len];
                if fin.iter().any(|t| stop.contains(t)) {
                    Control::Stop
                } else {
                    Control::Continue
                }
            };
            let g = dllm_decode::generate(&mut model, &ids, &p, &mut until_stop).unwrap();
            Solo {
                text: tok.decode(g.answer(&stop), true).unwrap(),
                forwards: g.forwards as u64,
                steps: g.steps as u64,
            }
        })
        .collect()
}

/// The text of a response (non-streamed, or the concatenated chunks of a stream) and its
/// `diffusion` object.
fn answer(addr: &str, body: &Value) -> (String, Value) {
    let r = common::request(addr, "POST", "/v1/completions", body.to_string().as_bytes());
    assert_eq!(r.status, 200, "{body}: {}", r.body);
    if body["stream"] == true {
        let mut text = String::new();
        let mut diffusion = Value::Null;
        for d in r.sse().iter().filter(|d| *d != "[DONE]") {
            let v: Value = serde_json::from_str(d).unwrap();
            assert!(v.get("error").is_none(), "{body}: {v}");
            text.push_str(v["choices"][0]["text"].as_str().unwrap_or(""));
            if let Some(x) = v.get("diffusion") {
                diffusion = x.clone();
            }
        }
        (text, diffusion)
    } else {
        let v = r.json();
        (
            v["choices"][0]["text"].as_str().unwrap().to_string(),
            v["diffusion"].clone(),
        )
    }
}

/// A parsed Prometheus text exposition: every sample by name (with its labels), and the type of
/// every family. Fails on a sample without `# HELP` and `# TYPE` before it, or a value that is not
/// a number.
fn parse_metrics(text: &str) -> (BTreeMap<String, f64>, HashMap<String, String>) {
    let mut help = HashMap::new();
    let mut types = HashMap::new();
    let mut samples = BTreeMap::new();
    for line in text.lines().filter(|l| !l.is_empty()) {
        if let Some(rest) = line.strip_prefix("# HELP ") {
            let (name, h) = rest.split_once(' ').expect("HELP name text");
            assert!(!h.is_empty(), "{line}");
            help.insert(name.to_string(), h.to_string());
        } else if let Some(rest) = line.strip_prefix("# TYPE ") {
            let (name, t) = rest.split_once(' ').expect("TYPE name type");
            assert!(
                ["counter", "gauge", "histogram"].contains(&t),
                "{line}: unknown type"
            );
            types.insert(name.to_string(), t.to_string());
        } else {
            let (name, value) = line.rsplit_once(' ').expect("name value");
            let base = name.split('{').next().unwrap();
            let family = ["_bucket", "_sum", "_count"]
                .iter()
                .find_map(|s| {
                    base.strip_suffix(s)
                        .filter(|f| types.get(*f).is_some_and(|t| t == "histogram"))
                })
                .unwrap_or(base);
            assert!(help.contains_key(family), "{line}: no # HELP {family}");
            assert!(types.contains_key(family), "{line}: no # TYPE {family}");
            let v: f64 = value
                .parse()
                .unwrap_or_else(|_| panic!("{line}: not a number"));
            samples.insert(name.to_string(), v);
        }
    }
    (samples, types)
}

/// `/metrics`, parsed and checked: exactly the engine's families, histograms cumulative.
fn metrics(s: &Server) -> BTreeMap<String, f64> {
    let r = s.get("/metrics");
    assert_eq!(r.status, 200, "{}", r.body);
    assert!(
        r.header("content-type")
            .is_some_and(|c| c.starts_with("text/plain; version=0.0.4")),
        "{:?}",
        r.headers
    );
    let (m, types) = parse_metrics(&r.body);
    let expected = [
        ("llada_waiting_sequences", "gauge"),
        ("llada_running_sequences", "gauge"),
        ("llada_forwards_total", "counter"),
        ("llada_tokens_per_second", "gauge"),
        ("llada_batch_rows", "histogram"),
        ("llada_time_to_first_token_seconds", "histogram"),
    ];
    let mut names: Vec<_> = types
        .iter()
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect();
    names.sort();
    let mut want = expected.to_vec();
    want.sort();
    assert_eq!(names, want, "{}", r.body);
    for h in ["llada_batch_rows", "llada_time_to_first_token_seconds"] {
        let prefix = format!("{h}_bucket{{le=\"");
        let mut buckets: Vec<(f64, f64)> = m
            .iter()
            .filter_map(|(k, v)| {
                let le = k.strip_prefix(&prefix)?.strip_suffix("\"}")?;
                let le = if le == "+Inf" {
                    f64::INFINITY
                } else {
                    le.parse().unwrap_or_else(|_| panic!("{k}: le"))
                };
                Some((le, *v))
            })
            .collect();
        buckets.sort_by(|a, b| a.0.total_cmp(&b.0));
        assert!(buckets.len() > 2, "{h}: {}", r.body);
        assert!(
            buckets.windows(2).all(|w| w[0].1 <= w[1].1),
            "{h} not cumulative: {}",
            r.body
        );
        let inf = buckets.last().unwrap();
        assert_eq!(inf.0, f64::INFINITY, "{h}: no +Inf bucket");
        assert_eq!(inf.1, m[&format!("{h}_count")], "{}", r.body);
        assert!(m.contains_key(&format!("{h}_sum")), "{}", r.body);
    }
    m
}

/// Long-math questions of distinct prompt lengths (in tokens), shortest first.
fn prompts_of_distinct_lengths(model: &str, n: usize) -> Vec<String> {
    let tok = TextTokenizer::from_file(&std::path::Path::new(model).join("tokenizer.json"))
        .expect("tokenizer");
    let mut by_len = BTreeMap::new();
    for e in test_set(TaskKind::LongMath) {
        let len = tok.encode_prompt(&e.prompt, false).unwrap().len();
        by_len.entry(len).or_insert(e.prompt);
    }
    assert!(by_len.len() >= n, "only {} distinct lengths", by_len.len());
    by_len.into_values().take(n).collect()
}

#[test]
fn concurrent_mixed_requests_share_forwards_and_equal_their_solo_answers() {
    let dir = common::model_dir("tiny-llada-long");
    let model = dir.to_str().unwrap();
    let strategies: [(Option<&str>, Option<f32>); 3] = [
        (None, None),
        (Some("vanilla"), None),
        (Some("dual-cache"), Some(0.9)),
    ];
    // Every prompt of its own length: the old server batched only vanilla canvases of one
    // length, so none of these could share a forward there.
    let cases: Vec<Case> = prompts_of_distinct_lengths(model, 9)
        .into_iter()
        .enumerate()
        .map(|(i, prompt)| Case {
            prompt,
            strategy: strategies[i % 3].0,
            threshold: strategies[i % 3].1,
        })
        .collect();
    let solo = solo_answers(model, &cases);
    assert!(
        solo.iter().any(|s| s.text.contains("Answer")),
        "a worked answer"
    );

    let s = Server::start(&["--model", model]);
    let m0 = metrics(&s);
    assert_eq!(m0["llada_running_sequences"], 0.0);
    assert_eq!(m0["llada_forwards_total"], 0.0);
    let cases = Arc::new(cases);
    let handles: Vec<_> = (0..cases.len())
        .map(|i| {
            let (addr, cases) = (s.addr.clone(), cases.clone());
            // Half of them streamed: the streams' final text is the same answer.
            std::thread::spawn(move || answer(&addr, &cases[i].body(i % 2 == 1)))
        })
        .collect();
    let mut forwards_of_requests = 0;
    for (i, h) in handles.into_iter().enumerate() {
        let (text, d) = h.join().expect("client");
        let c = &cases[i];
        assert_eq!(text, solo[i].text, "{c:?}");
        assert_eq!(d["forwards"].as_u64(), Some(solo[i].forwards), "{c:?}: {d}");
        assert_eq!(d["steps_run"].as_u64(), Some(solo[i].steps), "{c:?}: {d}");
        forwards_of_requests += solo[i].forwards;
    }
    let m = metrics(&s);
    let h = s.health();
    assert_eq!(m["llada_running_sequences"], 0.0, "{h}");
    assert_eq!(m["llada_waiting_sequences"], 0.0, "{h}");
    assert_eq!(h["live_sequences"], 0, "{h}");
    assert_eq!(h["requests_completed"], cases.len() as u64, "{h}");
    let forwards = m["llada_forwards_total"];
    assert_eq!(forwards, h["forwards"].as_u64().unwrap() as f64);
    assert_eq!(m["llada_batch_rows_count"], forwards);
    // Sequences of different strategies and prompt lengths shared forwards: the engine ran fewer
    // forwards than the requests asked for.
    assert!(
        forwards < forwards_of_requests as f64,
        "{forwards} forwards for requests that asked {forwards_of_requests}: nothing was batched"
    );
    assert!(h["batched_forwards"].as_u64().unwrap() > 0, "{h}");
    assert_eq!(
        h["forward_sequences"].as_u64(),
        Some(forwards_of_requests),
        "{h}"
    );
    // Every request got a first token.
    assert_eq!(
        m["llada_time_to_first_token_seconds_count"],
        cases.len() as f64
    );
    assert!(m["llada_tokens_per_second"] > 0.0);
}

#[test]
fn one_row_per_forward_runs_one_sequence_at_a_time() {
    let s = Server::start(&["--max-batch-rows", "1"]);
    let prompts = [
        common::TOM,
        "Mia has 33 eggs. She buys 3 more. How many eggs does Mia have now?",
        "The dog is cold. The fox is old. Is the fox young?",
        "On Sunday, it was very cold, so Tina put on her",
    ];
    let reference: Vec<String> = prompts
        .iter()
        .map(|p| answer(&s.addr, &json!({"prompt": p})).0)
        .collect();
    assert_eq!(reference[0], common::TOM_ANSWER);
    let handles: Vec<_> = prompts
        .iter()
        .map(|p| {
            let (addr, p) = (s.addr.clone(), p.to_string());
            std::thread::spawn(move || answer(&addr, &json!({"prompt": p, "stream": true})).0)
        })
        .collect();
    for (h, want) in handles.into_iter().zip(&reference) {
        assert_eq!(&h.join().unwrap(), want);
    }
    let h = s.health();
    assert_eq!(h["batched_forwards"], 0, "{h}");
    assert_eq!(h["forward_sequences"], h["forwards"], "{h}");
    assert_eq!(h["limits"]["max_batch_rows"], 1, "{h}");
}

/// Start a canvas stream, read its first chunk and hang up.
fn start_and_hang_up(addr: &str, body: &Value) {
    let body = body.to_string();
    let mut c = connect(addr);
    c.write_all(request_head("POST", "/v1/completions", addr, body.len()).as_bytes())
        .unwrap();
    c.write_all(body.as_bytes()).unwrap();
    let mut r = BufReader::new(c);
    let mut line = String::new();
    while !line.starts_with("data:") {
        line.clear();
        assert!(
            r.read_line(&mut line).unwrap() > 0,
            "the stream ended early"
        );
    }
    assert!(!line.contains("\"error\""), "{line}");
    // Dropping the reader closes the connection.
}

#[test]
fn clients_that_hang_up_mid_stream_free_their_sequences_and_disturb_no_one() {
    // No EOS: a dropped request (200 positions) runs until the server notices the hang-up.
    let s = Server::start(&["--logits-eos-inf", "--max-sequences", "16"]);
    const REQUESTS: usize = 200;
    const CLIENTS: usize = 16;
    let prompts: Arc<Vec<String>> = Arc::new(
        [
            common::TOM,
            "Mia has 33 eggs. She buys 3 more. How many eggs does Mia have now?",
            "The dog is cold. The fox is old. Is the fox young?",
            "Which of these is a tool? A. drum B. copper C. drill D. red",
            "On Sunday, it was very cold, so Tina put on her",
        ]
        .iter()
        .map(|p| p.to_string())
        .collect(),
    );
    // Each kept request's answer alone, before the churn.
    let reference: Arc<Vec<String>> = Arc::new(
        prompts
            .iter()
            .map(|p| answer(&s.addr, &json!({"prompt": p})).0)
            .collect(),
    );
    let handles: Vec<_> = (0..CLIENTS)
        .map(|c| {
            let (addr, prompts, reference) = (s.addr.clone(), prompts.clone(), reference.clone());
            std::thread::spawn(move || {
                let mut dropped = 0;
                for k in (c..REQUESTS).step_by(CLIENTS) {
                    let p = &prompts[k % prompts.len()];
                    if k % 5 == 4 {
                        start_and_hang_up(
                            &addr,
                            &json!({"prompt": p, "max_tokens": 200, "strategy": "vanilla",
                                    "stream": true, "stream_options": {"canvas": true}}),
                        );
                        dropped += 1;
                    } else {
                        let stream = k % 2 == 0;
                        let (text, _) = answer(&addr, &json!({"prompt": p, "stream": stream}));
                        assert_eq!(&text, &reference[k % prompts.len()], "request {k}");
                    }
                }
                dropped
            })
        })
        .collect();
    let dropped: u64 = handles.into_iter().map(|h| h.join().unwrap()).sum();
    assert_eq!(dropped, REQUESTS as u64 / 5);
    // The server notices a hang-up at its next write; wait for the last ones, bounded by the
    // engine's own progress rather than a clock: a sequence still live after the engine ran
    // enough forwards to finish every one of them from scratch (200 tokens, vanilla: one
    // forward a token) was never cancelled; an engine that runs no forward while sequences live
    // is stuck (it decides a step in milliseconds; a poll is a round trip to the server).
    const STALL_POLLS: usize = 100_000;
    let first = metrics(&s);
    let live = first["llada_running_sequences"] + first["llada_waiting_sequences"];
    let limit = first["llada_forwards_total"] + 200.0 * live;
    let (mut last, mut idle_polls) = (first["llada_forwards_total"], 0);
    loop {
        let m = metrics(&s);
        if m["llada_running_sequences"] == 0.0 && m["llada_waiting_sequences"] == 0.0 {
            break;
        }
        let forwards = m["llada_forwards_total"];
        assert!(
            forwards <= limit,
            "sequences still running after {} forwards, enough to finish them all: {m:?}",
            forwards - first["llada_forwards_total"]
        );
        idle_polls = if forwards > last { 0 } else { idle_polls + 1 };
        last = forwards;
        assert!(
            idle_polls < STALL_POLLS,
            "live sequences but no forward in {STALL_POLLS} polls: {m:?}"
        );
    }
    let h = s.health();
    assert_eq!(h["running_sequences"], 0, "{h}");
    assert_eq!(h["waiting_sequences"], 0, "{h}");
    assert_eq!(h["live_sequences"], 0, "{h}");
    assert_eq!(h["requests_failed"], 0, "{h}");
    assert_eq!(h["requests_cancelled"], dropped, "{h}");
    assert_eq!(
        h["requests_completed"],
        (REQUESTS as u64 - dropped) + prompts.len() as u64,
        "{h}"
    );
}
