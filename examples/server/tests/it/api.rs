//! The HTTP API on the embedded model: completions, chat, streaming (final text only, the canvas
//! stream), stop strings, errors naming the field, limits, and cancellation on disconnect.

use crate::common;

use std::io::{BufRead, BufReader, Write};

use common::{connect, request_head, Server, TOM, TOM_ANSWER};
use serde_json::{json, Value};

fn text_of(v: &Value) -> String {
    let c = &v["choices"][0];
    c["text"]
        .as_str()
        .or_else(|| c["message"]["content"].as_str())
        .unwrap_or_else(|| panic!("no text in {v}"))
        .to_string()
}

#[test]
fn completions_chat_models_and_health() {
    let s = Server::start(&[]);
    let m = s.get("/v1/models").json();
    assert_eq!(m["data"][0]["id"], "tiny-llada");
    let r = s.post(
        "/v1/completions",
        &json!({"model": "tiny-llada", "prompt": TOM}).to_string(),
    );
    assert_eq!(r.status, 200, "{}", r.body);
    let v = r.json();
    assert_eq!(text_of(&v), TOM_ANSWER);
    assert_eq!(v["object"], "text_completion");
    assert_eq!(v["choices"][0]["finish_reason"], "stop");
    let u = &v["usage"];
    assert!(u["prompt_tokens"].as_u64().unwrap() > 10);
    assert_eq!(
        u["total_tokens"].as_u64(),
        Some(u["prompt_tokens"].as_u64().unwrap() + u["completion_tokens"].as_u64().unwrap())
    );
    // generate's defaults: the checkpoint's 24 positions, strategy mbsd with LLaDA's span of 16,
    // so one block.
    assert_eq!(v["diffusion"]["gen_length"], 24);
    assert_eq!(v["diffusion"]["block_length"], 24);
    assert_eq!(v["diffusion"]["strategy"], "mbsd");

    // max_tokens is rounded up to whole blocks, and the response says so.
    let v = s
        .post(
            "/v1/completions",
            &json!({"prompt": TOM, "max_tokens": 10, "strategy": "prefix-cache"}).to_string(),
        )
        .json();
    assert_eq!(v["diffusion"]["max_tokens_requested"], 10);
    assert_eq!(v["diffusion"]["gen_length"], 16);
    assert_eq!(v["diffusion"]["block_length"], 8);
    assert_eq!(v["diffusion"]["strategy"], "prefix-cache");
    // One block takes any length: max_tokens is the generation length as asked.
    let v = s
        .post(
            "/v1/completions",
            &json!({"prompt": TOM, "max_tokens": 10}).to_string(),
        )
        .json();
    assert_eq!(
        (
            &v["diffusion"]["gen_length"],
            &v["diffusion"]["block_length"]
        ),
        (&json!(10), &json!(10)),
        "{v}"
    );

    // Chat: the tiny model has no chat template, so a single user turn is the prompt as written.
    let r = s.post(
        "/v1/chat/completions",
        &json!({"messages": [{"role": "user", "content": TOM}]}).to_string(),
    );
    assert_eq!(r.status, 200, "{}", r.body);
    let v = r.json();
    assert_eq!(v["object"], "chat.completion");
    assert_eq!(v["choices"][0]["message"]["role"], "assistant");
    assert_eq!(text_of(&v), TOM_ANSWER);

    // Token ids as the prompt give the same answer as the text they encode.
    let tok = dllm_models::TextTokenizer::from_file(
        &common::model_dir("tiny-llada").join("tokenizer.json"),
    )
    .expect("the embedded model's tokenizer");
    let ids = tok.encode_prompt(TOM, false).expect("encode");
    let v = s
        .post("/v1/completions", &json!({"prompt": ids}).to_string())
        .json();
    assert_eq!(text_of(&v), TOM_ANSWER, "{v}");

    // A generation cut short by max_tokens ends with finish_reason "length".
    let v = s
        .post(
            "/v1/completions",
            &json!({"prompt": TOM, "max_tokens": 8}).to_string(),
        )
        .json();
    assert_eq!(v["choices"][0]["finish_reason"], "length", "{v}");

    let h = s.health();
    assert_eq!(h["status"], "ok");
    assert_eq!(h["live_sequences"], 0);
    assert_eq!(h["running_sequences"], 0);
    assert_eq!(h["requests_completed"], 6);
    assert!(s.get("/").body.contains("id=\"canvas\""));
    assert_eq!(s.get("/nope").status, 404);
}

/// Chunks of a streamed request (the `data:` payloads before `[DONE]`, parsed).
fn chunks(s: &Server, path: &str, body: Value) -> Vec<Value> {
    let r = s.post(path, &body.to_string());
    assert_eq!(r.status, 200, "{}", r.body);
    assert!(
        r.header("content-type")
            .is_some_and(|c| c.starts_with("text/event-stream")),
        "{:?}",
        r.headers
    );
    let data = r.sse();
    assert_eq!(data.last().map(String::as_str), Some("[DONE]"), "{data:?}");
    data[..data.len() - 1]
        .iter()
        .map(|d| serde_json::from_str(d).unwrap_or_else(|e| panic!("{e}: {d}")))
        .collect()
}

/// The plain stream and the canvas stream of `prompt` under `strategy` (`positions` generated
/// positions) against the non-streamed answer; `must_see` lists the states the canvas must show.
fn check_streams(s: &Server, body: Value, positions: usize, must_see: &[&str]) {
    let strategy = body["strategy"].as_str().unwrap().to_string();
    let with = |extra: Value| {
        let mut b = body.clone();
        for (k, v) in extra.as_object().unwrap() {
            b[k] = v.clone();
        }
        b
    };
    let plain = s.post("/v1/completions", &body.to_string()).json();
    let whole = text_of(&plain);
    assert!(!whole.is_empty(), "{plain}");
    // Plain stream: text chunks whose concatenation is the answer; the last chunk carries the
    // finish reason, then the usage chunk.
    let c = chunks(
        s,
        "/v1/completions",
        with(json!({"stream": true, "stream_options": {"include_usage": true}})),
    );
    let text: String = c
        .iter()
        .filter_map(|v| v["choices"][0]["text"].as_str())
        .collect();
    assert_eq!(text, whole, "{strategy}");
    let last = &c[c.len() - 2];
    assert_eq!(
        last["choices"][0]["finish_reason"],
        plain["choices"][0]["finish_reason"]
    );
    assert_eq!(
        c.last().unwrap()["choices"].as_array().map(Vec::len),
        Some(0)
    );
    assert_eq!(
        c.last().unwrap()["usage"]["completion_tokens"],
        plain["usage"]["completion_tokens"]
    );
    assert!(c.iter().all(|v| v.get("canvas").is_none()));

    // Canvas stream: one chunk per step with every position's state; the text shown so far is
    // always a prefix of the answer (never revised), and covers only stable positions.
    let c = chunks(
        s,
        "/v1/completions",
        with(json!({"stream": true, "stream_options": {"canvas": true}})),
    );
    let mut shown = String::new();
    let mut seen = std::collections::BTreeSet::new();
    let mut canvases = 0;
    for v in &c {
        shown.push_str(v["choices"][0]["text"].as_str().unwrap_or(""));
        assert!(
            whole.starts_with(&shown),
            "{strategy}: {shown:?} vs {whole:?}"
        );
        if let Some(cv) = v.get("canvas") {
            canvases += 1;
            let states: Vec<&str> = cv["states"]
                .as_array()
                .unwrap()
                .iter()
                .map(|s| s.as_str().unwrap())
                .collect();
            assert_eq!(states.len(), positions);
            assert_eq!(cv["tokens"].as_array().unwrap().len(), positions);
            let fl = cv["final_len"].as_u64().unwrap() as usize;
            assert!(states[..fl].iter().all(|&s| s == "stable"), "{states:?}");
            if fl < positions {
                assert_ne!(states[fl], "stable");
            }
            for (st, tok) in states.iter().zip(cv["tokens"].as_array().unwrap()) {
                assert_eq!(*st == "masked", tok == "", "{states:?} {:?}", cv["tokens"]);
            }
            seen.extend(states);
        }
    }
    assert_eq!(shown, whole, "{strategy}");
    assert!(canvases >= 3, "{strategy}: {canvases} canvases");
    for st in must_see {
        assert!(seen.contains(st), "{strategy}: {st} never seen in {seen:?}");
    }
    assert!(seen
        .iter()
        .all(|s| ["masked", "invisible", "visible", "stable"].contains(s)));
}

#[test]
fn streams_carry_only_final_text_and_the_canvas_on_request() {
    let s = Server::start(&[]);
    check_streams(
        &s,
        json!({"prompt": TOM, "strategy": "vanilla"}),
        24,
        &["masked", "invisible", "stable"],
    );

    // Chat chunks: the role first, then content deltas.
    let c = chunks(
        &s,
        "/v1/chat/completions",
        json!({"messages": [{"role": "user", "content": TOM}], "stream": true}),
    );
    assert_eq!(c[0]["object"], "chat.completion.chunk");
    assert_eq!(c[0]["choices"][0]["delta"]["role"], "assistant");
    let text: String = c
        .iter()
        .filter_map(|v| v["choices"][0]["delta"]["content"].as_str())
        .collect();
    assert_eq!(text, TOM_ANSWER);
    drop(s);

    // mbsd revises text it has shown as context (visible) before making it final: on the long
    // model (the embedded one is so sure of itself that mbsd stabilizes a block per step) the
    // canvas shows all four states, and the streamed text is still only ever final text.
    let long = common::model_dir("tiny-llada-long");
    let s = Server::start(&["--model", long.to_str().unwrap()]);
    check_streams(
        &s,
        json!({"prompt": LONG_MATH, "strategy": "mbsd"}),
        128,
        &["masked", "invisible", "visible", "stable"],
    );
}

/// A long-suite arithmetic question (the long model's task).
const LONG_MATH: &str =
    "Tom has 3 apples. In January he buys 4 more. In February he doubles them. \
                         In March he eats 2. How many apples does Tom have at the end?";

#[test]
fn stop_strings_end_the_text_before_them() {
    let s = Server::start(&[]);
    let v = s
        .post(
            "/v1/completions",
            &json!({"prompt": TOM, "stop": [" Answer", "zzz"]}).to_string(),
        )
        .json();
    assert_eq!(text_of(&v), "23 + 5 = 28.");
    assert_eq!(v["choices"][0]["finish_reason"], "stop");
    let c = chunks(
        &s,
        "/v1/completions",
        json!({"prompt": TOM, "stop": "= 28", "stream": true}),
    );
    let text: String = c
        .iter()
        .filter_map(|v| v["choices"][0]["text"].as_str())
        .collect();
    assert_eq!(text, "23 + 5 ");
}

#[test]
fn bad_requests_get_openai_errors_naming_the_field() {
    let s = Server::start(&["--max-body-bytes", "4096", "--max-tokens-limit", "64"]);
    let long_prompt = "apples ".repeat(300);
    let table: Vec<(&str, String, u16, Option<&str>)> = vec![
        ("/v1/completions", "{\"prompt\": ".into(), 400, None),
        ("/v1/completions", "[]".into(), 400, None),
        ("/v1/completions", json!({"prompt": 3}).to_string(), 400, Some("prompt")),
        ("/v1/completions", json!({"prompt": "a", "max_tokens": "8"}).to_string(), 400, Some("max_tokens")),
        ("/v1/completions", json!({"prompt": "a", "max_tokens": -8}).to_string(), 400, Some("max_tokens")),
        ("/v1/completions", json!({"prompt": "a", "max_tokens": 1_000_000_000_000u64}).to_string(), 400, Some("max_tokens")),
        ("/v1/completions", json!({"prompt": "a", "max_tokens": 65}).to_string(), 400, Some("max_tokens")),
        ("/v1/completions", json!({"prompt": "a", "strategy": "fastest"}).to_string(), 400, Some("strategy")),
        ("/v1/completions", json!({"prompt": "a", "steps": 1000}).to_string(), 400, Some("steps")),
        ("/v1/completions", json!({"prompt": "a", "steps": 5}).to_string(), 400, Some("steps")),
        ("/v1/completions", json!({"prompt": "a", "threshold": 2}).to_string(), 400, Some("threshold")),
        ("/v1/completions", json!({"prompt": "a", "temperature": -1}).to_string(), 400, Some("temperature")),
        // top_p is Dream's: on a LLaDA model the decoder refuses it (after admission, still a 400).
        ("/v1/completions", json!({"prompt": "a", "top_p": 0.5}).to_string(), 400, Some("top_p")),
        ("/v1/completions", json!({"prompt": "a", "n": 3}).to_string(), 400, Some("n")),
        ("/v1/completions", json!({"prompt": "a", "colour": "red"}).to_string(), 400, Some("colour")),
        ("/v1/completions", json!({"prompt": "a", "model": "gpt-4"}).to_string(), 404, Some("model")),
        ("/v1/completions", json!({"prompt": long_prompt}).to_string(), 400, Some("prompt")),
        ("/v1/completions", json!({"prompt": [5, 6]}).to_string(), 400, Some("prompt")),
        ("/v1/completions", json!({"prompt": [1, 99999]}).to_string(), 400, Some("prompt")),
        ("/v1/completions", json!({"prompt": "x".repeat(5000)}).to_string(), 413, None),
        ("/v1/chat/completions", json!({"messages": [{"role": "robot", "content": "a"}]}).to_string(), 400, Some("messages[0].role")),
        ("/v1/chat/completions", json!({"prompt": "a"}).to_string(), 400, Some("prompt")),
        ("/v1/chat/completions", json!({"messages": [{"role": "user", "content": "a"}], "stream": true, "strategy": "x"}).to_string(), 400, Some("strategy")),
    ];
    for (path, body, status, param) in &table {
        let r = s.post(path, body);
        let short = &body[..body.len().min(80)];
        assert_eq!(r.status, *status, "{short}: {}", r.body);
        let v = r.json();
        let e = &v["error"];
        assert!(e["message"].as_str().is_some_and(|m| !m.is_empty()), "{v}");
        assert!(e["type"].is_string(), "{v}");
        assert_eq!(e["param"].as_str(), *param, "{short}: {v}");
        if let Some(p) = param {
            assert!(e["message"].as_str().unwrap().contains(p), "{v}");
        }
    }
    // The server is still there, and nothing leaked.
    let h = s.health();
    assert_eq!(h["live_sequences"], 0);
    assert_eq!(h["running_sequences"], 0);
}

/// The server of the cancellation tests: one sequence slot, and EOS never generated
/// (`--logits-eos-inf`), so a generation of `LONG` positions runs all of its steps unless cancelled.
fn one_slot_server(max_queue: &str) -> Server {
    Server::start(&[
        "--max-sequences",
        "1",
        "--max-queue",
        max_queue,
        "--logits-eos-inf",
    ])
}

/// A canvas stream of 200 positions, one step each (vanilla; no EOS: see [`one_slot_server`]).
fn long_stream_body() -> String {
    json!({"prompt": TOM, "max_tokens": 200, "strategy": "vanilla", "stream": true,
           "stream_options": {"canvas": true}})
    .to_string()
}

/// Start a canvas stream of a long generation, read its first chunk and hang up.
fn start_and_hang_up(s: &Server) {
    let body = long_stream_body();
    let mut c = connect(&s.addr);
    c.write_all(request_head("POST", "/v1/completions", &s.addr, body.len()).as_bytes())
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
    // Dropping the reader closes the connection.
}

#[test]
fn a_client_that_hangs_up_cancels_its_sequence() {
    // One sequence slot: the second request can only run once the first has let go of it.
    let s = one_slot_server("4");
    start_and_hang_up(&s);
    let r = s.post(
        "/v1/completions",
        &json!({"prompt": TOM, "strategy": "vanilla"}).to_string(),
    );
    assert_eq!(r.status, 200, "{}", r.body);
    // Without EOS every position is text, and the generation runs to its length.
    let v = r.json();
    assert_eq!(v["choices"][0]["finish_reason"], "length", "{v}");
    assert!(text_of(&v).starts_with("23 + 5 = 28"), "{v}");
    let h = s.health();
    assert_eq!(h["requests_cancelled"], 1, "{h}");
    assert_eq!(h["requests_completed"], 1, "{h}");
    assert_eq!(h["live_sequences"], 0, "{h}");
}

#[test]
fn a_full_queue_is_refused_with_429() {
    // No queue at all: while a long stream holds the only slot, another request is refused.
    let s = one_slot_server("0");
    let body = long_stream_body();
    let mut c = connect(&s.addr);
    c.write_all(request_head("POST", "/v1/completions", &s.addr, body.len()).as_bytes())
        .unwrap();
    c.write_all(body.as_bytes()).unwrap();
    let mut r = BufReader::new(c);
    let mut line = String::new();
    while !line.starts_with("data:") {
        line.clear();
        assert!(r.read_line(&mut line).unwrap() > 0);
    }
    // The stream is running (its first step arrived), so its slot is taken.
    let refused = s.post("/v1/completions", &json!({"prompt": TOM}).to_string());
    assert_eq!(refused.status, 429, "{}", refused.body);
    assert_eq!(refused.json()["error"]["code"], "queue_full");
    drop(r);
    let h = s.health();
    assert_eq!(h["requests_rejected_queue_full"], 1);
}

#[test]
fn a_request_over_the_timeout_gets_504_and_its_sequence_is_cancelled() {
    // 200 one-token steps with no EOS (see `one_slot_server`) cannot finish in 50 ms.
    let s = Server::start(&["--timeout", "0.05", "--logits-eos-inf"]);
    let r = s.post(
        "/v1/completions",
        &json!({"prompt": TOM, "max_tokens": 200, "strategy": "vanilla"}).to_string(),
    );
    assert_eq!(r.status, 504, "{}", r.body);
    let v = r.json();
    assert_eq!(v["error"]["type"], "timeout_error", "{v}");
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .contains("--timeout"),
        "{v}"
    );
    // The decoding thread counted the cancellation and dropped its sequence before it sent the
    // failure the 504 was made from.
    let h = s.health();
    assert_eq!(h["status"], "ok", "{h}");
    assert_eq!(h["requests_cancelled"], 1, "{h}");
    assert_eq!(h["requests_completed"], 0, "{h}");
    assert_eq!(h["live_sequences"], 0, "{h}");
}
