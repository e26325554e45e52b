//! A bounded load test on loopback: a warm-up round of 16 clients x 1 request (every sequence slot
//! in use at once), then 16 clients x 5 requests. Every answer must be the answer its own prompt
//! gets alone (no mixing between concurrent sequences, batched or not), none may be lost, the
//! server's memory must stay flat over the second round, and every sequence must be freed at the
//! end.

use crate::common;

use std::sync::Arc;

use common::Server;
use serde_json::json;

const CLIENTS: usize = 16;
const PER_CLIENT: usize = 5;
const WARM_UP: usize = 1;

/// Prompts of the embedded model's tasks, of several lengths.
fn prompts() -> Vec<String> {
    let mut p = Vec::new();
    for (name, a, b) in [
        ("Tom", 23, 5),
        ("Mia", 33, 3),
        ("Ann", 41, 7),
        ("Bob", 12, 9),
    ] {
        p.push(format!(
            "{name} has {a} apples. He buys {b} more. How many apples does {name} have now?"
        ));
    }
    p.push("The dog is cold. The fox is old. Is the fox young?".into());
    p.push("Which of these is a tool? A. drum B. copper C. drill D. red".into());
    p.push("On Sunday, it was very cold, so Tina put on her".into());
    p.push("The cat is wet. The owl is big. Is the owl big?".into());
    p
}

fn complete(addr: &str, prompt: &str, strategy: &str, stream: bool) -> String {
    let body = json!({"prompt": prompt, "strategy": strategy, "stream": stream}).to_string();
    let r = common::request(addr, "POST", "/v1/completions", body.as_bytes());
    assert_eq!(r.status, 200, "{prompt}: {}", r.body);
    if stream {
        r.sse()
            .iter()
            .filter(|d| *d != "[DONE]")
            .map(|d| {
                let v: serde_json::Value = serde_json::from_str(d).unwrap();
                v["choices"][0]["text"].as_str().unwrap_or("").to_string()
            })
            .collect()
    } else {
        r.json()["choices"][0]["text"]
            .as_str()
            .expect("text")
            .to_string()
    }
}

/// One round: every client sends `per_client` requests one after another; returns how many
/// answers were checked.
fn round(
    s: &Server,
    prompts: &Arc<Vec<String>>,
    reference: &Arc<Vec<Vec<String>>>,
    per_client: usize,
) -> usize {
    let strategies = ["vanilla", "prefix-cache"];
    let handles: Vec<_> = (0..CLIENTS)
        .map(|c| {
            let (addr, prompts, reference) = (s.addr.clone(), prompts.clone(), reference.clone());
            std::thread::spawn(move || {
                let mut checked = 0;
                for r in 0..per_client {
                    let k = (c * per_client + r) % prompts.len();
                    // Most requests are vanilla; every third runs the prefix cache: both strategies
                    // share forwards, each sequence on its own cache.
                    let si = usize::from((c + r) % 3 == 0);
                    let got = complete(&addr, &prompts[k], strategies[si], r % 2 == 1);
                    assert_eq!(
                        got, reference[si][k],
                        "client {c}, request {r}: the answer of prompt {k} ({}) was {got:?}",
                        prompts[k]
                    );
                    checked += 1;
                }
                checked
            })
        })
        .collect();
    handles.into_iter().map(|h| h.join().expect("client")).sum()
}

#[test]
fn concurrent_clients_get_their_own_answers_and_memory_stays_flat() {
    let s = Server::start(&["--max-sequences", "16", "--max-queue", "64"]);
    let prompts = Arc::new(prompts());
    // The reference: each prompt alone, one request at a time.
    let reference: Vec<Vec<String>> = ["vanilla", "prefix-cache"]
        .iter()
        .map(|st| {
            prompts
                .iter()
                .map(|p| complete(&s.addr, p, st, false))
                .collect()
        })
        .collect();
    assert_eq!(
        reference[0][0], "23 + 5 = 28. Answer: 28",
        "the embedded model's worked example"
    );
    let reference = Arc::new(reference);
    let n1 = round(&s, &prompts, &reference, WARM_UP);
    let rss1 = s.rss_kib();
    let n2 = round(&s, &prompts, &reference, PER_CLIENT);
    let rss2 = s.rss_kib();
    assert_eq!(n1 + n2, CLIENTS * (WARM_UP + PER_CLIENT), "answers lost");
    let h = s.health();
    let sent = (CLIENTS * (WARM_UP + PER_CLIENT) + 2 * prompts.len()) as u64;
    assert_eq!(h["requests_completed"].as_u64(), Some(sent), "{h}");
    assert_eq!(h["requests_failed"], 0, "{h}");
    assert_eq!(h["live_sequences"], 0, "{h}");
    assert_eq!(h["running_sequences"], 0, "{h}");
    // Concurrent sequences shared forwards.
    assert!(h["batched_forwards"].as_u64().unwrap() > 0, "{h}");
    // Flat: the second round (five times the first, at the same concurrency) adds no more than
    // 16 MiB.
    eprintln!("RSS after round 1: {rss1} KiB, after round 2: {rss2} KiB; {h}");
    assert!(
        rss2 <= rss1 + 16 * 1024,
        "RSS grew from {rss1} KiB to {rss2} KiB over a round of {} requests",
        CLIENTS * PER_CLIENT
    );
}
